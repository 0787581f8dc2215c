// One measurement of benchmarks/throughput.bench.mjs, in its own process (forked by it,
// never run by hand), so that one configuration's heap, JIT state and RSS never pollute the
// next one.
//
// Protocol (IPC): parent → {type:'init', mode, ...}; worker → {type:'window-start'} and
// {type:'window-end'} around the measured window (the parent samples /proc for redis-server
// and other processes then), optional {type:'progress'}, then {type:'result', ...} and exit.
//
// Modes:
//   pairs   `inflight` loops of acquire → release, for --seconds after a warm-up, with one
//           client of `library` (dokebi | redlock | semaphore | js-driver: this contract
//           driven from JS, benchmarks/baseline/js-driver.mjs), over distinct keys (`keys`
//           'distinct') or each loop cycling over its own `reusedKeys` keys ('reused').
//   evalsha `inflight` loops of raw EVALSHA of the driver's own acquire script from ioredis
//           (auto-pipelining off or on): the ceiling for what a client on Node can do.
//   memory  RSS and heap of an idle driver, then with `leases` tracked leases and `waiters`
//           waiters blocked on held keys (needs --expose-gc).
//   drift   `cycles` acquire/release cycles at `inflight`, RSS at checkpoints (needs --expose-gc).

import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import v8 from 'node:v8';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Samples, root, jsThreadCpuUs } from './lib.mjs';
import { createJsLockDriver } from './baseline/js-driver.mjs';

const require = createRequire(import.meta.url);
const now = () => performance.now();
const LEASE_MS = 10_000;

function send(message) {
  return new Promise((resolve) => process.send(message, resolve));
}

function memory() {
  const m = process.memoryUsage();
  // V8's young generation grows (semi-spaces doubling up to their maximum) with the
  // allocation rate and stays committed: RSS that is not a leak. Reported separately.
  const newSpace = v8.getHeapSpaceStatistics().find((s) => s.space_name === 'new_space')?.space_size ?? 0;
  return { rss: m.rss, heapUsed: m.heapUsed, heapTotal: m.heapTotal, external: m.external, arrayBuffers: m.arrayBuffers, newSpace };
}

function fullGc() {
  if (typeof globalThis.gc !== 'function') throw new Error('run with --expose-gc');
  // Several passes: weak callbacks and finalizers (napi objects) free more on the next one.
  for (let i = 0; i < 4; i++) globalThis.gc();
}

async function settledMemory() {
  fullGc();
  await sleep(100);
  fullGc();
  return memory();
}

// ------------------------------------------------------------------ clients ----

async function ioredisClient(url, extra = {}) {
  const { default: Redis } = await import('ioredis');
  const client = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 1, ...extra });
  client.on('error', () => {});
  await client.connect();
  return client;
}

// DOKEBI_BENCH_PACKAGE: another build of this package (a dir with index.js, binding.js and
// the .node), to compare a variant under the same harness; default: this repository.
const PACKAGE_DIR = process.env.DOKEBI_BENCH_PACKAGE ? path.resolve(process.env.DOKEBI_BENCH_PACKAGE) : root;

function dokebiDriver(url, extra = {}) {
  const { createRedisLockDriver } = require(path.join(PACKAGE_DIR, 'index.js'));
  return createRedisLockDriver(url, {
    driver: 'redis', connection: 'bench', namespace: 'tp', leaseMs: LEASE_MS, maxWaiters: 1024, ...extra,
  });
}

// Each adapter: { acquire(key) → handle, release(handle), close() }.
async function makeAdapter(library, url) {
  if (library === 'dokebi') {
    const driver = dokebiDriver(url);
    return {
      driver,
      acquire: (key) => driver.acquire(key),
      release: (lease) => lease.release(),
      close: () => driver.shutdown(),
    };
  }
  if (library === 'js-driver') {
    const driver = await createJsLockDriver(url, { namespace: 'tp', leaseMs: LEASE_MS, maxWaiters: 1024 });
    return {
      acquire: (key) => driver.acquire(key),
      release: (lease) => lease.release(),
      close: () => driver.close(),
    };
  }
  const client = await ioredisClient(url);
  if (library === 'redlock') {
    const { default: Redlock } = await import('redlock');
    // One client, no retries: an uncontended acquire either succeeds at once or fails.
    const redlock = new Redlock([client], { retryCount: 0 });
    redlock.on('clientError', () => {});
    return {
      acquire: (key) => redlock.lock(key, LEASE_MS),
      release: (lock) => lock.unlock(),
      close: () => client.disconnect(),
    };
  }
  if (library === 'semaphore') {
    const { Mutex } = await import('redis-semaphore');
    return {
      // One Mutex per key (the library's unit). refreshInterval 0: no auto-refresh timer,
      // as this driver has no automatic renewal either.
      acquire: async (key) => {
        const m = new Mutex(client, key, { lockTimeout: LEASE_MS, refreshInterval: 0 });
        await m.acquire();
        return m;
      },
      release: (m) => m.release(),
      close: () => client.disconnect(),
    };
  }
  throw new Error(`unknown library ${library}`);
}

// ------------------------------------------------------------- timed loops ----

/**
 * Runs `inflight` loops of `op(seq, loopIndex) → latencies` for warm-up + window seconds; counts the
 * operations that completed inside the window. `op` returns [firstMs, totalMs].
 */
async function timedLoops({ inflight, warmupS, seconds }, op) {
  const first = new Samples(1 << 17);
  const total = new Samples(1 << 17);
  const failures = {};
  let seq = 0;
  let stop = false;
  let windowStart = Infinity;
  let windowEnd = Infinity;
  let done = 0;

  async function loop(index) {
    while (!stop) {
      const t0 = now();
      let lat;
      try {
        lat = await op(seq++, index);
      } catch (err) {
        const code = String(err?.code ?? err?.name ?? 'Error');
        failures[code] = (failures[code] ?? 0) + 1;
        if (Object.values(failures).reduce((s, v) => s + v, 0) > 1000) throw err;
        continue;
      }
      const t2 = now();
      if (t0 >= windowStart && t2 < windowEnd) {
        done++;
        first.push(lat[0]);
        total.push(lat[1]);
      }
    }
  }

  const loops = Array.from({ length: inflight }, (_, i) => loop(i));
  const failed = Promise.all(loops).then(() => null, (err) => err);
  await Promise.race([sleep(warmupS * 1000), failed]);

  // Window: operations started at or after its start and finished before its end.
  const rssSamples = [];
  const sampler = setInterval(() => rssSamples.push(process.memoryUsage.rss()), 250);
  await send({ type: 'window-start' });
  const cpu0 = process.cpuUsage();
  const js0 = jsThreadCpuUs();
  windowStart = now();
  const started = seq;
  await Promise.race([sleep(seconds * 1000), failed]);
  windowEnd = now();
  const cpu1 = process.cpuUsage(cpu0);
  const jsUs = js0 === null ? null : jsThreadCpuUs() - js0;
  const issued = seq - started;
  const mem = memory();
  clearInterval(sampler);
  await send({ type: 'window-end' });
  stop = true;
  const err = await failed;
  if (err) throw err;

  const windowMs = windowEnd - windowStart;
  const cpuUs = cpu1.user + cpu1.system;
  return {
    windowMs, done, issued, failures,
    opsPerSec: done / (windowMs / 1000),
    cpu: {
      userUs: cpu1.user, systemUs: cpu1.system, perOpUs: done ? cpuUs / done : null, share: cpuUs / 1000 / windowMs,
      // The JS thread apart from the other threads (issue 12, target 1).
      jsThreadUs: jsUs, jsPerOpUs: done && jsUs !== null ? jsUs / done : null, otherThreadsPerOpUs: done && jsUs !== null ? (cpuUs - jsUs) / done : null,
    },
    first: first.summary(), total: total.summary(),
    memory: { ...mem, rssMaxInWindow: Math.max(mem.rss, ...rssSamples) },
  };
}

// --------------------------------------------------------------------- modes ----

// Key names shaped like the driver's (namespace:lock:{64 hex}), so Redis does the same work.
const hex64 = (prefix, n) => `${prefix}{${n.toString(16).padStart(64, '0')}}`;

async function pairs(init) {
  const adapter = await makeAdapter(init.library, init.url);
  const prefix = `tp:${init.library}:${init.keys}:${init.inflight}:${init.rep}:`;
  // Connection open and scripts loaded before the warm-up clock starts.
  await adapter.release(await adapter.acquire(`${prefix}first`));
  let key = (seq) => prefix + seq;
  if (init.keys === 'reused') {
    // Each loop its own keys, so that reusing them never contends; one pass over all of them
    // before the warm-up, so that every fence counter exists when the window opens.
    const keys = Array.from({ length: init.inflight }, (_, l) => Array.from({ length: init.reusedKeys }, (_, k) => `${prefix}${l}:${k}`));
    const next = new Array(init.inflight).fill(0);
    await Promise.all(keys.map(async (own) => {
      for (const k of own) await adapter.release(await adapter.acquire(k));
    }));
    key = (seq, loop) => keys[loop][next[loop]++ % init.reusedKeys];
  } else if (init.keys !== 'distinct') {
    throw new Error(`unknown keys ${init.keys}`);
  }
  const r = await timedLoops(init, async (seq, loop) => {
    const t0 = now();
    const handle = await adapter.acquire(key(seq, loop));
    const t1 = now();
    await adapter.release(handle);
    return [t1 - t0, now() - t0];
  });
  const stats = adapter.driver?.stats();
  await adapter.close();
  return {
    pairsPerSec: r.opsPerSec, pairs: r.done, windowMs: r.windowMs, failures: r.failures,
    acquireMs: r.first, pairMs: r.total,
    cpu: { ...r.cpu, perPairUs: r.cpu.perOpUs, jsPerPairUs: r.cpu.jsPerOpUs, otherThreadsPerPairUs: r.cpu.otherThreadsPerOpUs }, memory: r.memory,
    driverStats: stats && { trackedLeases: stats.trackedLeases, inProgress: stats.inProgress, subscription: stats.subscription, errors: Object.fromEntries(Object.entries(stats.errors).filter(([, v]) => v)) },
  };
}

async function evalsha(init) {
  const client = await ioredisClient(init.url, { enableAutoPipelining: init.autoPipelining });
  const source = readFileSync(path.join(root, 'src/scripts/acquire.lua'), 'utf8');
  const sha = await client.script('LOAD', source);
  const token = 'f'.repeat(32);
  const tag = `${init.autoPipelining ? 'ap' : 'np'}${init.inflight}r${init.rep}`;
  let fencesOk = 0;
  const r = await timedLoops(init, async (seq) => {
    const t0 = now();
    const id = `${tag}-${seq}`;
    const fence = await client.evalsha(sha, 2, hex64('tp:lock:', seq) + id, hex64('tp:lock-fence:', seq) + id, token, LEASE_MS);
    if (typeof fence === 'string') fencesOk++;
    const t = now() - t0;
    return [t, t];
  });
  client.disconnect();
  return {
    opsPerSec: r.opsPerSec, ops: r.done, windowMs: r.windowMs, failures: r.failures, latencyMs: r.total,
    fencesReturned: fencesOk, cpu: r.cpu, memory: r.memory, sha,
  };
}

async function memoryMode(init) {
  const { leases: leaseCount, waiters: waiterCount } = init;
  const baseline = await settledMemory(); // the addon is not loaded yet
  const driver = dokebiDriver(init.url, {
    maxTrackedLeases: leaseCount + waiterCount + 1024, maxWaiters: 256, leaseMs: 120_000, waitTimeoutMs: 60_000,
  });
  const addonLoaded = await settledMemory();
  // Idle but warm: connected, scripts loaded, code paths run, 256 leases taken and given back.
  const warm = [];
  for (let i = 0; i < 256; i++) warm.push(driver.acquire(`warm:${i}`));
  for (const lease of await Promise.all(warm)) await lease.release();
  await sleep(300);
  const idle = await settledMemory();
  const idleStats = driver.stats();

  // leaseCount leases, at most 200 acquires in progress (maxWaiters 256 counts them).
  const held = [];
  for (let i = 0; i < leaseCount; i += 200) {
    const batch = [];
    for (let j = i; j < Math.min(leaseCount, i + 200); j++) batch.push(driver.acquire(`held:${j}`));
    held.push(...(await Promise.all(batch)));
  }
  const withLeases = await settledMemory();

  // waiterCount waiters, each blocked on a key one of those leases holds.
  const waiting = [];
  for (let i = 0; i < waiterCount; i++) waiting.push(driver.acquire(`held:${i}`).then((l) => l, (e) => e));
  const deadline = Date.now() + 10_000;
  while (driver.stats().waiters < waiterCount && Date.now() < deadline) await sleep(20);
  await sleep(500); // first attempts answered busy, subscription opened
  const loaded = await settledMemory();
  const loadedStats = driver.stats();

  // Give everything back: the waiters then acquire (after the release notifications).
  await Promise.all(held.map((l) => l.release()));
  const got = await Promise.all(waiting);
  const failed = got.filter((x) => x instanceof Error).map((e) => e.code);
  await Promise.all(got.filter((x) => !(x instanceof Error)).map((l) => l.release()));
  held.length = 0;
  got.length = 0;
  waiting.length = 0;
  await sleep(300);
  const afterRelease = await settledMemory();
  const afterStats = driver.stats();
  await driver.shutdown();
  const strip = (s) => ({ waiters: s.waiters, lines: s.lines, inProgress: s.inProgress, trackedLeases: s.trackedLeases, subscription: s.subscription });
  return {
    leases: leaseCount, waiters: waiterCount,
    memory: { baseline, addonLoaded, idle, withLeases, loaded, afterRelease },
    stats: { idle: strip(idleStats), loaded: strip(loadedStats), afterRelease: strip(afterStats) },
    waiterFailures: failed,
  };
}

async function drift(init) {
  const { cycles, inflight, checkpoints } = init;
  const driver = dokebiDriver(init.url);
  const points = [];
  const t0 = now();
  let seq = 0;
  let done = 0;
  let next = 0;
  const failures = {};
  const marks = checkpoints.slice(); // cycle counts at which to sample
  async function checkpoint() {
    const raw = memory();
    const gced = await settledMemory();
    const s = driver.stats();
    points.push({ cycles: done, seconds: (now() - t0) / 1000, rss: raw.rss, rssAfterGc: gced.rss, heapUsedAfterGc: gced.heapUsed, heapTotalAfterGc: gced.heapTotal, v8NewSpace: gced.newSpace, externalAfterGc: gced.external, trackedLeases: s.trackedLeases, lines: s.lines, inProgress: s.inProgress });
    process.send({ type: 'progress', cycles: done, rss: gced.rss });
  }
  // Loops pause at every checkpoint, so it is taken with nothing in flight.
  let pause = null;
  async function loop() {
    for (;;) {
      if (pause) await pause;
      if (seq >= cycles) return;
      const id = seq++;
      try {
        const lease = await driver.acquire(`drift:${id}`);
        await lease.release();
      } catch (err) {
        failures[err?.code ?? 'Error'] = (failures[err?.code ?? 'Error'] ?? 0) + 1;
      }
      done++;
      if (marks.length && done >= marks[0] && !pause) {
        marks.shift();
        let resume;
        pause = new Promise((r) => { resume = r; });
        // Wait for the other loops' cycles in flight, then sample.
        (async () => {
          while (done < seq) await sleep(1);
          await checkpoint();
          pause = null;
          resume();
        })();
      }
    }
  }
  await Promise.all(Array.from({ length: inflight }, loop));
  while (pause) await pause;
  if (points.at(-1)?.cycles !== done) await checkpoint();
  const seconds = (now() - t0) / 1000;
  await driver.shutdown();
  return { cycles: done, inflight, seconds, cyclesPerSec: done / seconds, points, failures };
}

// ---------------------------------------------------------------------- main ----

async function main() {
  const init = await new Promise((resolve) => process.once('message', resolve));
  let result;
  if (init.mode === 'pairs') result = await pairs(init);
  else if (init.mode === 'evalsha') result = await evalsha(init);
  else if (init.mode === 'memory') result = await memoryMode(init);
  else if (init.mode === 'drift') result = await drift(init);
  else throw new Error(`unknown mode ${init.mode}`);
  await send({ type: 'result', result });
  process.exit(0);
}

main().catch(async (err) => {
  await send({ type: 'error', message: String(err?.stack ?? err) });
  process.exit(1);
});
