#!/bin/sh
# Instructions per acquire+release pair by thread: callgrind runs of
# benchmarks/callgrind-pairs.mjs with N pairs and with none (after the same warm-up), the
# difference over N. Needs valgrind and redis-server. Usage: callgrind-pairs.sh [N] [inflight]
set -eu
N=${1:-5000}
INFLIGHT=${2:-64}
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
. "$here/throwaway-redis.sh"
start_throwaway_redis "$out"
for n in "$N" 0; do
  valgrind --tool=callgrind --separate-threads=yes --smc-check=all-non-file \
    --callgrind-out-file="$out/cg.$n.%p" \
    node "$here/callgrind-pairs.mjs" --url "redis://127.0.0.1:$port" --pairs "$n" --inflight "$INFLIGHT" 2>"$out/valgrind.$n.log" || { tail -20 "$out/valgrind.$n.log"; exit 1; }
done
# One file per thread: <file>-01 is the JS (main) thread; the addon's tokio thread is the
# busiest of the others; the rest are V8/libuv helpers.
node -e '
const fs = require("fs"), path = require("path");
const [dir, n] = [process.argv[1], Number(process.argv[2])];
function threads(tag) {
  const t = {};
  for (const f of fs.readdirSync(dir).filter((f) => f.startsWith(`cg.${tag}.`) && /-\d+$/.test(f))) {
    const text = fs.readFileSync(path.join(dir, f), "utf8");
    const tid = Number(/-(\d+)$/.exec(f)?.[1] ?? 1);
    t[tid] = Number(/^(?:summary|totals): (\d+)/m.exec(text)[1]);
  }
  return t;
}
// Threads are numbered in creation order, the same in both runs. Thread 1 is the JS thread;
// the tokio thread of the addon is the other thread whose count grows most with the pairs.
const a = threads(n), b = threads(0);
const diff = Object.keys(a).map((tid) => [tid, (a[tid] - (b[tid] ?? 0)) / n]);
const js = diff.find(([t]) => t === "1")[1];
const others = diff.filter(([t]) => t !== "1").sort((x, y) => y[1] - x[1]);
const tokio = others[0][1], helpers = others.slice(1).reduce((s, [, v]) => s + v, 0);
const r = (x) => Math.round(x);
console.log(JSON.stringify({ pairs: n, js: r(js), tokio: r(tokio), helpers: r(helpers), total: r(js + tokio + helpers) }));
' "$out" "$N"
