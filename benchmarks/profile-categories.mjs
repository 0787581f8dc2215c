// Sums a `perf report --no-children -g none --sort dso,sym --stdio` listing of one thread
// into the categories issue 37 asks about (hashing, token generation, bookkeeping, redis-rs,
// allocation, scheduling, …); run by benchmarks/profile-pairs.sh. Reads the listing on stdin,
// prints one JSON object: category → share of the thread's samples (percent).
import { readFileSync } from 'node:fs';

// Matched against `<dso> <symbol>`; first match wins: the more specific patterns come first.
const categories = [
  ['kernel: sleep and wake-up', /\[k\] .*(finish_task_switch|__schedule|schedule\b|pick_next|try_to_wake_up|ttwu|enqueue_task|dequeue_task|switch_mm|__switch_to|psi_|update_curr|update_load|select_task_rq|idle|hrtimer|tick_|nohz)/],
  ['kernel: futex (tokio unpark, mutexes)', /\[k\] .*futex/],
  ['kernel: epoll and eventfd (readiness, uv_async)', /\[k\] .*(ep_|epoll|eventfd|ep_poll)/],
  ['kernel: random (getrandom)', /\[k\] .*(crng|get_random|chacha|getrandom|random)/],
  ['kernel: TCP over loopback', /\[k\] .*(tcp|sock|skb|inet|ip_|ipv4|__dev|netif|net_rx|loopback|napi_|_copy_(to|from)_iter|copy_(to|from)_user|iov|__kfree_skb|kmalloc_reserve|sk_|release_sock|lock_sock|__ip|dst_|nf_|bbr|raw_spin_lock_bh|do_softirq|__local_bh|validate_xmit|qdisc)/],
  ['kernel: syscall entry and other', /\[k\] /],
  ['allocation (mimalloc, malloc)', / (mi_|_mi_|mimalloc|malloc|free|cfree|realloc|__libc_malloc|_int_malloc|_int_free|__rust_alloc|__rust_dealloc|alloc::raw_vec)/],
  ['hashing (SHA-256 of keys, hash maps)', /(sha2::|sip::Hasher|hash::|Hasher|hashbrown|digest)/],
  ['token generation', /(new_token|getrandom|rand::|chacha|ChaCha)/],
  ['redis-rs (commands, parser, multiplexed connection)', /([^_a-z](redis|combine)::|tokio_util::codec|bytes::|itoa::)/],
  ['tokio timers', /(tokio::runtime::time|TimerEntry|tokio::time)/],
  ['tokio channels and notify (oneshot, mpsc, Notify)', /(tokio::sync|tokio_util::sync|futures_channel|atomic_waker|AtomicWaker)/],
  ['tokio scheduling and tasks (spawn, wake, poll, TaskTracker)', /(tokio::runtime|tokio::task|tokio_util::task|tokio::loom|task::raw|waker|tokio::io|mio::|futures_util::future)/],
  ['napi and the settler (promises, threadsafe function)', /(napi|settle|binding::|v8impl|ThreadSafeFunction|CallJs)/],
  ['the driver (wait lines, leases, key names, scripts)', /(dokebi_lock_redis::|hex::|String as core::clone|Arc<T,A>::drop_slow|std::time|unix::time|libm\.so)/],
  ['V8 and Node (promises, GC, JS builtins)', /^(node|\[JIT\]\S*) /],
  ['libc and loader (syscall wrappers, TLS)', /(^(libc\.so|ld-linux|\[vdso\]|libstdc\+\+)|std::os::unix::net)/],
];

const totals = {};
let sum = 0;
for (const line of readFileSync(0, 'utf8').split('\n')) {
  const m = /^\s*([\d.]+)%\s+(\S+(?: \S+)?)\s+\[(.)\]\s+(.*)$/.exec(line);
  if (!m) continue;
  const share = Number(m[1]);
  // `[k]` marks kernel symbols; the dso column may hold a space ("[JIT] tid N").
  const what = m[3] === 'k' ? `[k] ${m[4]}` : `${m[2]} ${m[4]}`;
  const category = categories.find(([, re]) => re.test(what))?.[0] ?? 'other';
  totals[category] = (totals[category] ?? 0) + share;
  sum += share;
}
const out = Object.fromEntries(Object.entries(totals).sort((a, b) => b[1] - a[1]).map(([k, v]) => [k, Number((100 * v / sum).toFixed(1))]));
console.log(JSON.stringify(out, null, 2));
