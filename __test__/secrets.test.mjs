// No secret leaves the driver: drives every error path of the fault matrix (and every other
// error code) with a distinctive password, username and key, captures the owner tokens from
// Redis (GET while held, and MONITOR of every script call), then walks every error — message,
// stack, every own field, nested causes, AggregateError members — and every logger call, and
// searches them for the password, the usernames, host:port, `redis://`, a token or a key's
// original value.

import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { after, before, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { inspect } from 'node:util';
import { backend, eventually, freePort, lockKeyOf, uniqueNamespace, within } from './helpers/lock.mjs';
import { startProxy } from './helpers/proxy.mjs';
import { external, startRedis } from './helpers/redis.mjs';
import { holdConnections, makeBusy, makeLoading, makeOom, monitor, replicaLinked, scriptOf } from './faults/support.mjs';

const { createRedisLockDriver, parseRedisLockBackend } = createRequire(import.meta.url)('../index.js');

const skip = external && 'needs throwaway redis-servers and a proxy (REDIS_URL is set)';

const PASSWORD = 'Pw-7Hq2-zX9v-secret';
const WRONG_PASSWORD = 'Wr0ng-Pw-k8s2';
const USER = 'lockuser-Qm4t';
const DENIED_USER = 'denied-Zr8w';
const NOSUB_USER = 'nosub-Lp3e';
const KEY_MARK = 'k3y-S3CR3T';
let keyCounter = 0;
/** A key whose original value must never show; multi-byte every other time. */
const secretKey = () => (++keyCounter % 2 ? `${KEY_MARK}-${keyCounter}` : `clé-${KEY_MARK}-ü-${keyCounter}`);

const errors = []; // [label, error]
const logs = []; // [label, level, fields, message]
const tokens = new Set();
const ports = new Set();

function logger(label) {
  return Object.fromEntries(['debug', 'info', 'warn', 'error'].map((level) => [level, (fields, msg) => {
    logs.push([label, level, fields, msg]);
  }]));
}

/** Runs `work` and records what it throws or rejects with (it must throw or reject). */
async function capture(label, work) {
  try {
    await within(8000, Promise.resolve().then(work), label);
  } catch (err) {
    errors.push([label, err]);
    return err;
  }
  throw new Error(`${label}: expected an error`);
}

const drivers = [];
function driver(label, connection, options = {}, ns = uniqueNamespace('secret')) {
  const d = createRedisLockDriver(connection, backend(ns, { shutdownTimeoutMs: 300, ...options }), logger(label));
  drivers.push([label, d]);
  return d;
}
const fast = (url) => ({ url, commandTimeoutMs: 250, connectTimeoutMs: 300 });

let main; // the lock server, with an ACL user USER / PASSWORD
let proxy; // in front of main
let watch; // MONITOR of main: every token the scripts carried
const urlOf = (port, user = USER, password = PASSWORD) => `redis://${user}:${password}@127.0.0.1:${port}`;

before(async () => {
  if (external) return;
  main = await startRedis({ args: ['--enable-debug-command', 'yes', '--repl-diskless-sync-delay', '0', '--shutdown-timeout', '0'] });
  await main.command('ACL', 'SETUSER', USER, 'on', `>${PASSWORD}`, '~*', '&*', '+@all');
  proxy = await startProxy(main.port);
  watch = await monitor(main.port);
  ports.add(main.port).add(proxy.port);
});
after(async () => {
  watch?.close();
  await proxy?.close();
  await main?.stop();
});

/** The token Redis holds for `key` right now. */
async function tokenOf(server, ns, key) {
  const token = await server.command('GET', lockKeyOf(ns, key));
  assert.equal(typeof token, 'string', 'the key is held');
  tokens.add(token);
  return token;
}

// ------------------------------------------------------------------ the paths ----

test('drive every error path with the secrets in play', { skip, timeout: 60_000 }, async () => {
  const opts = (extra = {}) => backend(uniqueNamespace('secret-opts'), extra);

  // INVALID_OPTIONS: the password, the address and the values are in the input.
  await capture('bad scheme', () => createRedisLockDriver(`http://${USER}:${PASSWORD}@127.0.0.1:${main.port}`, opts()));
  await capture('bad port', () => createRedisLockDriver({ url: `redis://${USER}:${PASSWORD}@127.0.0.1:notaport` }, opts()));
  await capture('bad timeout', () => createRedisLockDriver({ url: urlOf(main.port), commandTimeoutMs: -1 }, opts()));
  await capture('other name', () => createRedisLockDriver({ url: urlOf(main.port), name: `other-${PASSWORD}` }, opts()));
  await capture('tls not PEM', () => createRedisLockDriver({ url: `rediss://${USER}:${PASSWORD}@127.0.0.1:${main.port}`, tls: { ca: PASSWORD } }, opts()));
  await capture('tls on redis://', () => createRedisLockDriver({ url: urlOf(main.port), tls: { ca: `-----BEGIN ${PASSWORD}` } }, opts()));
  // Sentinel URLs: the data nodes' password in the URL, the Sentinels' in sentinelPassword.
  const sentinelUrl = (rest) => `redis-sentinel://${USER}:${PASSWORD}@127.0.0.1:${main.port}${rest}`;
  await capture('sentinel without #masterName', () => createRedisLockDriver(sentinelUrl('/0'), opts()));
  await capture('sentinel bad host', () => createRedisLockDriver(sentinelUrl(`,127.0.0.1:${PASSWORD}#locks`), opts()));
  await capture('sentinel with cluster', () => createRedisLockDriver({ url: sentinelUrl('#locks'), cluster: true }, opts()));
  await capture('sentinelPassword on redis://', () => createRedisLockDriver({ url: urlOf(main.port), sentinelPassword: PASSWORD }, opts()));
  await capture('namespace', () => parseRedisLockBackend({ ...opts(), namespace: `ns {${PASSWORD}}` }));
  await capture('connection name', () => parseRedisLockBackend({ ...opts(), connection: 42 }));
  await capture('driver', () => parseRedisLockBackend({ ...opts(), driver: PASSWORD }));
  const okDriver = driver('ok', fast(urlOf(proxy.port)));
  await capture('acquire options', () => okDriver.acquire(secretKey(), { waitTimeoutMs: PASSWORD }));
  await capture('acquire signal', () => okDriver.acquire(secretKey(), { signal: PASSWORD }));

  // INVALID_KEY: the key is in the input.
  const small = driver('small keys', fast(urlOf(proxy.port)), { maxKeyBytes: 16 });
  await capture('key too long', () => small.acquire(`${KEY_MARK}-too-long-for-sixteen-bytes`));
  await capture('lone surrogate', () => small.acquire(`${KEY_MARK}\uD800`));
  await capture('not a string', () => small.acquire({ key: KEY_MARK }));

  // Lock outcomes: LOCK_BUSY, WAIT_TIMEOUT, QUEUE_FULL, TOO_MANY_LEASES, ABORTED, SHUT_DOWN,
  // LEASE_LOST, LEASE_EXPIRED.
  const ns = uniqueNamespace('secret-outcomes');
  const holder = driver('holder', fast(urlOf(proxy.port)), {}, ns);
  const busyKey = secretKey();
  const held = await holder.acquire(busyKey);
  await tokenOf(main, ns, busyKey);
  const other = driver('other', fast(urlOf(proxy.port)), { maxWaiters: 1, maxTrackedLeases: 1, pollIntervalMs: 20 }, ns);
  await capture('LOCK_BUSY', () => other.acquire(busyKey, { waitTimeoutMs: 0 }));
  await capture('WAIT_TIMEOUT', () => other.acquire(busyKey, { waitTimeoutMs: 100 }));
  const waiting = capture('ABORTED', () => other.acquire(busyKey, { signal: AbortSignal.timeout(150) }));
  await capture('QUEUE_FULL', () => other.acquire(secretKey(), { waitTimeoutMs: 0 }));
  await waiting;
  const one = await other.acquire(secretKey());
  await capture('TOO_MANY_LEASES', () => other.acquire(secretKey()));
  assert.equal(await one.release(), true);
  const lostKey = secretKey();
  const lost = await other.acquire(lostKey);
  await tokenOf(main, ns, lostKey);
  await main.command('DEL', lockKeyOf(ns, lostKey)); // as if it expired and vanished
  await capture('LEASE_LOST', () => lost.renew());
  const short = driver('short', fast(urlOf(proxy.port)), { leaseMs: 40 });
  const expiring = await short.acquire(secretKey());
  await sleep(60); // the lease runs out; nothing to await but time
  await capture('LEASE_EXPIRED', () => expiring.renew());
  assert.equal(await held.release(), true);
  const closed = driver('closed', fast(urlOf(proxy.port)));
  await closed.shutdown();
  await capture('SHUT_DOWN', () => closed.acquire(secretKey()));

  // PROVIDER_FAILED, nothing listening / connections refused.
  const dead = await freePort();
  ports.add(dead);
  await capture('nothing listening', () => driver('dead', fast(urlOf(dead))).acquire(secretKey(), { waitTimeoutMs: 0 }));
  const noSentinel = { ...fast(`redis-sentinel://${USER}:${PASSWORD}@127.0.0.1:${dead}#locks`), sentinelUsername: USER, sentinelPassword: PASSWORD };
  await capture('no Sentinel answers', () => driver('no sentinel', noSentinel).acquire(secretKey(), { waitTimeoutMs: 200 }));
  proxy.refuse();
  await capture('refused', () => driver('refused', fast(urlOf(proxy.port))).acquire(secretKey(), { waitTimeoutMs: 200 }));
  proxy.accept();

  // OUTCOME_UNKNOWN: a stall, a cut mid-reply; renew and release too. Then a connection that died while idle.
  const faulty = driver('faulty', fast(urlOf(proxy.port)), { leaseMs: 5000 }, ns);
  const renewing = await faulty.acquire(secretKey());
  const releasing = await faulty.acquire(secretKey());
  for (const key of await main.command('KEYS', `${ns}:lock:*`)) tokens.add(await main.command('GET', key));
  proxy.stallAfterWrite();
  await capture('stalled acquire', () => faulty.acquire(secretKey()));
  await capture('stalled renew', () => renewing.renew());
  proxy.release();
  // The stalled acquire won in Redis: its late reply makes the driver release it by token in
  // the background, an EVALSHA that the cut below must not meet instead of the acquire's
  // (under load it came first, and the acquire then went through: 1 of 5 soak rounds). Its
  // key gone (released, or expired after leaseMs), only the two held leases are left.
  const settled = async () => (await main.command('KEYS', `${ns}:lock:*`)).length === 2;
  await eventually('the stalled acquire released by token', settled, { timeoutMs: 8000 });
  const cut = proxy.cutMidReply({ after: 'EVALSHA', bytes: 2 });
  await capture('cut acquire', () => faulty.acquire(secretKey()));
  await cut;
  // The same for the cut acquire: its unknown outcome is taken back by token in the background.
  await eventually('the cut acquire released by token', settled, { timeoutMs: 8000 });
  const cutRelease = proxy.cutMidReply({ after: 'EVALSHA', bytes: 1 });
  await capture('cut release', () => releasing.release());
  await cutRelease;
  await (await faulty.acquire(secretKey())).release();
  // The idle connection dies and Redis stays unreachable: the driver sees the close and
  // reports a connect failure (PROVIDER_FAILED) instead of sending on a dead connection.
  proxy.refuse();
  proxy.killAll();
  await capture('dead idle connection', () => faulty.acquire(secretKey(), { waitTimeoutMs: 0 }));
  proxy.accept();

  // Refused credentials and permissions.
  await capture('WRONGPASS', () => driver('wrongpass', fast(urlOf(main.port, USER, WRONG_PASSWORD))).acquire(secretKey(), { waitTimeoutMs: 500 }));
  await main.command('ACL', 'SETUSER', DENIED_USER, 'on', `>${PASSWORD}`, '~*', '&*', '+@all', '-evalsha', '-eval');
  await capture('NOPERM', () => driver('noperm', fast(urlOf(main.port, DENIED_USER))).acquire(secretKey(), { waitTimeoutMs: 500 }));
  const guarded = await startRedis();
  ports.add(guarded.port);
  try {
    await guarded.command('CONFIG', 'SET', 'requirepass', PASSWORD);
    await capture('NOAUTH', () => driver('noauth', fast(`redis://127.0.0.1:${guarded.port}`)).acquire(secretKey(), { waitTimeoutMs: 0 }));
    await capture('WRONGPASS default user', () => driver('wrongpass default', fast(`redis://:${WRONG_PASSWORD}@127.0.0.1:${guarded.port}`)).acquire(secretKey(), { waitTimeoutMs: 0 }));
  } finally {
    await guarded.stop();
  }

  // Server error replies: OOM, READONLY, BUSY, LOADING; and maxclients.
  const onMain = driver('on main', fast(urlOf(main.port)), { pollIntervalMs: 20 });
  await (await onMain.acquire(secretKey())).release();
  const oom = await makeOom(main);
  try {
    await capture('OOM', () => onMain.acquire(secretKey(), { waitTimeoutMs: 100 }));
  } finally {
    await oom.restore();
  }
  const replica = await startRedis({ args: ['--shutdown-timeout', '0', '--replicaof', '127.0.0.1', String(main.port)] });
  ports.add(replica.port);
  try {
    await replicaLinked(replica);
    await replica.command('ACL', 'SETUSER', USER, 'on', `>${PASSWORD}`, '~*', '&*', '+@all');
    await capture('READONLY', () => driver('readonly', fast(urlOf(replica.port))).acquire(secretKey(), { waitTimeoutMs: 100 }));
  } finally {
    await replica.stop();
  }
  const busy = await makeBusy(main);
  try {
    await capture('BUSY', () => onMain.acquire(secretKey(), { waitTimeoutMs: 0 }));
  } finally {
    await busy.kill();
  }
  const loading = await makeLoading(main, { keys: 4000 });
  await capture('LOADING', () => onMain.acquire(secretKey(), { waitTimeoutMs: 0 }));
  await loading.done;
  const crowded = await startRedis({ args: ['--maxclients', '1'] });
  ports.add(crowded.port);
  const hold = await holdConnections(crowded.port, 1);
  try {
    await capture('maxclients', () => driver('maxclients', fast(`redis://:${PASSWORD}@127.0.0.1:${crowded.port}`)).acquire(secretKey(), { waitTimeoutMs: 100 }));
  } finally {
    hold.close();
    await crowded.stop();
  }

  // Shutdown: CLEANUP_TIMEOUT while replies are held, CLEANUP_FAILED (an AggregateError) on refusal.
  const stalledNs = uniqueNamespace('secret-sd');
  const stalled = driver('cleanup timeout', fast(urlOf(proxy.port)), { shutdownTimeoutMs: 300 }, stalledNs);
  const stalledKey = secretKey();
  await stalled.acquire(stalledKey);
  await tokenOf(main, stalledNs, stalledKey);
  proxy.stallAfterWrite();
  await capture('CLEANUP_TIMEOUT', () => stalled.shutdown());
  proxy.release();
  await main.command('ACL', 'SETUSER', 'cleaner-Vb6n', 'on', `>${PASSWORD}`, '~*', '&*', '+@all');
  const refusedNs = uniqueNamespace('secret-refused');
  const refusing = driver('cleanup failed', fast(urlOf(main.port, 'cleaner-Vb6n')), {}, refusedNs);
  const refusedKeys = [secretKey(), secretKey()];
  for (const key of refusedKeys) {
    await refusing.acquire(key);
    await tokenOf(main, refusedNs, key);
  }
  await main.command('ACL', 'SETUSER', 'cleaner-Vb6n', '-evalsha', '-eval');
  const cleanupFailed = await capture('CLEANUP_FAILED', () => refusing.shutdown());
  assert.ok(cleanupFailed.cause instanceof AggregateError, 'the AggregateError path was driven');

  // Log events: REDIS_EVICTION_UNSAFE, LOCK_NOTIFY_UNAVAILABLE unsupported and failed.
  await main.command('CONFIG', 'SET', 'maxmemory-policy', 'allkeys-lru');
  try {
    const evicting = driver('eviction', fast(urlOf(main.port)));
    await (await evicting.acquire(secretKey())).release();
    await eventually('the eviction event', () => logs.some(([, , f]) => f?.code === 'REDIS_EVICTION_UNSAFE'));
  } finally {
    await main.command('CONFIG', 'SET', 'maxmemory-policy', 'noeviction');
  }
  await main.command('ACL', 'SETUSER', NOSUB_USER, 'on', `>${PASSWORD}`, '~*', 'resetchannels', '+@all', '-subscribe');
  const notifyNs = uniqueNamespace('secret-notify');
  const notifyHolder = driver('notify holder', fast(urlOf(main.port)), {}, notifyNs);
  const notifyKey = secretKey();
  const notifyHeld = await notifyHolder.acquire(notifyKey);
  await tokenOf(main, notifyNs, notifyKey);
  const nosub = driver('notify unsupported', fast(urlOf(main.port, NOSUB_USER)), { pollIntervalMs: 20 }, notifyNs);
  const waitingNosub = nosub.acquire(notifyKey, { waitTimeoutMs: 300 }).catch((e) => errors.push(['nosub wait', e]));
  const listening = driver('notify failed', fast(urlOf(main.port)), { pollIntervalMs: 20 }, notifyNs);
  const waitingListening = listening.acquire(notifyKey, { waitTimeoutMs: 1500 }).catch((e) => errors.push(['listening wait', e]));
  await eventually('a subscription', async () => (await main.command('PUBSUB', 'NUMSUB', `${notifyNs}:lock-released`))[1] >= 1);
  await main.command('CLIENT', 'KILL', 'TYPE', 'pubsub');
  await eventually('the failed event', () => logs.some(([, , f]) => f?.code === 'LOCK_NOTIFY_UNAVAILABLE' && f.reason === 'failed'));
  await eventually('the unsupported event', () => logs.some(([, , f]) => f?.code === 'LOCK_NOTIFY_UNAVAILABLE' && f.reason === 'unsupported'));
  await Promise.all([waitingNosub, waitingListening]);
  assert.equal(await notifyHeld.release(), true);

  // Everything else the drivers still have to say.
  for (const [label, d] of drivers) await d.shutdown().catch((err) => errors.push([`shutdown ${label}`, err]));
});

// --------------------------------------------------------------------- search ----

/** Every string reachable from `value`: own fields (enumerable or not), causes, errors. */
function strings(value, out = [], seen = new Set()) {
  if (value === null || value === undefined) return out;
  if (typeof value === 'string') {
    out.push(value);
    return out;
  }
  if (typeof value === 'number' || typeof value === 'boolean' || typeof value === 'bigint') {
    out.push(String(value));
    return out;
  }
  if (typeof value === 'symbol') {
    out.push(String(value.description));
    return out;
  }
  if (typeof value !== 'object' && typeof value !== 'function') return out;
  if (seen.has(value)) return out;
  seen.add(value);
  if (value instanceof Error) out.push(String(value), inspect(value, { depth: Infinity, showHidden: true }));
  for (const name of Reflect.ownKeys(value)) {
    const d = Object.getOwnPropertyDescriptor(value, name);
    out.push(String(typeof name === 'symbol' ? name.description : name));
    if (d && 'value' in d) strings(d.value, out, seen);
  }
  if (Array.isArray(value?.errors)) strings(value.errors, out, seen);
  if ('cause' in Object(value)) strings(value.cause, out, seen);
  return out;
}

test('no error, field, cause or log entry holds a password, a username, an address, a token or a key', { skip }, () => {
  // Every token any script carried to the lock server.
  for (const e of watch.entries) {
    const script = scriptOf(e.name, e.args.slice(1));
    if (script === 'acquire') tokens.add(e.args[5]);
    else if (script === 'release' || script === 'renew') tokens.add(e.args[4]);
  }
  for (const t of [...tokens]) if (!/^[0-9a-f]{16,}$/.test(t ?? '')) tokens.delete(t);

  const codes = new Set(errors.map(([, err]) => err.code));
  for (const code of ['INVALID_OPTIONS', 'INVALID_KEY', 'LOCK_BUSY', 'WAIT_TIMEOUT', 'QUEUE_FULL', 'TOO_MANY_LEASES', 'ABORTED',
    'SHUT_DOWN', 'LEASE_EXPIRED', 'LEASE_LOST', 'PROVIDER_FAILED', 'OUTCOME_UNKNOWN', 'CLEANUP_TIMEOUT', 'CLEANUP_FAILED']) {
    assert.ok(codes.has(code), `no ${code} was collected: the search would be vacuous`);
  }
  const serverCodes = new Set(errors.map(([, err]) => err.cause?.serverCode).filter(Boolean));
  for (const serverCode of ['WRONGPASS', 'NOAUTH', 'NOPERM', 'OOM', 'READONLY', 'BUSY', 'LOADING']) {
    assert.ok(serverCodes.has(serverCode), `no ${serverCode} was collected`);
  }
  assert.ok(tokens.size >= 10, `only ${tokens.size} tokens were captured`);
  assert.ok(logs.some(([, , f]) => f?.cause), 'a log entry with a cause was collected');

  const secrets = [
    PASSWORD, WRONG_PASSWORD, USER, DENIED_USER, NOSUB_USER, 'cleaner-Vb6n', KEY_MARK, '127.0.0.1', 'localhost',
    ...[...ports].map((p) => `:${p}`),
    ...tokens,
  ];
  const searched = [
    ...errors.map(([label, err]) => [`error of ${label}`, strings(err)]),
    ...logs.map(([label, level, fields, msg]) => [`${level} log of ${label}`, strings([fields, msg])]),
  ];
  let checked = 0;
  for (const [where, texts] of searched) {
    for (const text of texts) {
      checked += 1;
      for (const secret of secrets) {
        assert.ok(!text.includes(secret), `${where} holds ${JSON.stringify(secret)}: ${text}`);
      }
      // A URL: a scheme followed by something. A rule naming the schemes ("must start with
      // redis://, rediss://, … or unix://") is allowed: it holds no address.
      assert.doesNotMatch(text, /(?:redis|rediss|unix|redis\+unix):\/\/[^\s,)'"`]/, `${where} holds a URL: ${text}`);
    }
  }
  assert.ok(checked > 500, `only ${checked} strings were searched`);
});
