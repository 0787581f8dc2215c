// One contending process of benchmarks/lock-contention.bench.mjs (forked by it, never run
// by hand). It opens ONE client of the configured library, runs `waiters` concurrent
// acquire → hold → release loops on one key between the parent's start and end times, and
// sends back one record per acquisition, timed with a clock shared by every process:
// performance.timeOrigin + performance.now().
//
// Protocol (IPC): parent → {type:'init', ...}; worker → {type:'ready'} once its client is
// connected and warmed up (scripts loaded) on another key; parent → {type:'go', startAt,
// endAt}; worker → {type:'result', ...} at endAt, then it exits without waiting for the
// acquires still in flight (the parent flushes Redis before the next run).

import { createRequire } from 'node:module';
import { randomUUID } from 'node:crypto';

const require = createRequire(import.meta.url);
const now = () => performance.timeOrigin + performance.now();

// The hold. 'atomics' (default) blocks this process's JS thread for exactly holdMs with
// Atomics.wait: every library holds the lock for the same 2.0x ms, so utilization and
// throughput differences come from the hand-off alone. setTimeout(2) would hold 2 to 3+ ms
// depending on libuv's millisecond timer granularity and on how busy this process's event
// loop is, i.e. differently per library. The cost: the holder's event loop is blocked, as
// in a CPU-bound critical section, so the other waiters of the holder's process run no JS
// for those 2 ms (dokebi's Redis I/O runs on Rust threads and is not blocked; a JS peer's
// retry timer due then fires right after the hold). 'timer' is there to compare.
const sleepCell = new Int32Array(new SharedArrayBuffer(4));
function makeHold(mode, ms) {
  if (mode === 'timer') return () => new Promise((r) => setTimeout(r, ms));
  return () => { Atomics.wait(sleepCell, 0, 0, ms); };
}

// Counts the commands an ioredis client sends inside [startAt, endAt), by name: a
// client-side check of the server-side INFO commandstats split.
function countCommands(client, window, counts) {
  const send = client.sendCommand.bind(client);
  client.sendCommand = (command, stream) => {
    const t = now();
    if (t >= window.startAt && t < window.endAt) {
      const name = String(command.name).toLowerCase();
      counts[name] = (counts[name] ?? 0) + 1;
    }
    return send(command, stream);
  };
}

// Each adapter: { warmup(), acquire() → handle, release(handle) }, acquire waiting up to
// ~30 s rather than failing.
async function makeAdapter(init, window, clientCommands) {
  const { library, url, leaseMs, waitMs } = init;
  if (library === 'dokebi') {
    // DOKEBI_BENCH_PACKAGE (a variant's environment): another build, for A/B in one run.
    const { createRedisLockDriver } = require(process.env.DOKEBI_BENCH_PACKAGE ? `${process.env.DOKEBI_BENCH_PACKAGE}/index.js` : '../index.js');
    const driver = createRedisLockDriver(url, {
      driver: 'redis', connection: 'bench', namespace: 'bench', leaseMs, waitTimeoutMs: waitMs,
      // A configuration's notifications, or a variant's DOKEBI_BENCH_NOTIFICATIONS.
      ...((init.notifications ?? process.env.DOKEBI_BENCH_NOTIFICATIONS) ? { notifications: init.notifications ?? process.env.DOKEBI_BENCH_NOTIFICATIONS } : {}),
    });
    return {
      // driver.stats() (not part of the LockDriver contract): Redis attempts and
      // notifications received by this process, sampled at the window's edges.
      stats: typeof driver.stats === 'function' ? () => driver.stats() : null,
      acquire: (key) => driver.acquire(key, { waitTimeoutMs: waitMs }),
      release: (lease) => lease.release(),
      close: () => driver.shutdown().catch(() => {}),
    };
  }
  if (library === 'js-driver') {
    const { createJsLockDriver } = await import('./baseline/js-driver.mjs');
    const driver = await createJsLockDriver(url, { namespace: 'bench', leaseMs, waitTimeoutMs: waitMs });
    // Its command connection only: SUBSCRIBE goes over the other one.
    countCommands(driver.client, window, clientCommands);
    return {
      acquire: (key) => driver.acquire(key),
      release: (lease) => lease.release(),
      close: () => driver.close(),
    };
  }
  const { default: Redis } = await import('ioredis');
  const client = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 1 });
  client.on('error', () => {});
  await client.connect();
  countCommands(client, window, clientCommands);
  if (library === 'redlock') {
    const { default: Redlock } = await import('redlock');
    const { retryDelay, retryJitter } = init.peer;
    // retryCount: enough retries to wait ~waitMs (redlock has no wait deadline of its own).
    const options = { retryCount: Math.ceil(waitMs / (retryDelay ?? 200)) };
    if (retryDelay !== undefined) options.retryDelay = retryDelay;
    if (retryJitter !== undefined) options.retryJitter = retryJitter;
    const redlock = new Redlock([client], options);
    redlock.on('clientError', () => {});
    return {
      acquire: (key) => redlock.acquire([key], leaseMs),
      release: (lock) => lock.unlock(),
      close: () => client.disconnect(),
    };
  }
  if (library === 'semaphore') {
    const { Mutex } = await import('redis-semaphore');
    const { retryInterval } = init.peer;
    const mutexes = new Map(); // one Mutex (one identifier) per waiter
    return {
      acquire: async (key, waiter) => {
        let m = mutexes.get(`${key}\0${waiter}`);
        if (!m) {
          const options = { lockTimeout: leaseMs, acquireTimeout: waitMs, refreshInterval: 0, identifier: randomUUID() };
          if (retryInterval !== undefined) options.retryInterval = retryInterval;
          m = new Mutex(client, key, options);
          mutexes.set(`${key}\0${waiter}`, m);
        }
        await m.acquire();
        return m;
      },
      release: (m) => m.release(),
      close: () => client.disconnect(),
    };
  }
  throw new Error(`unknown library ${library}`);
}

async function main() {
  const init = await new Promise((resolve) => process.once('message', resolve));
  const window = { startAt: Infinity, endAt: Infinity };
  const clientCommands = {};
  const adapter = await makeAdapter(init, window, clientCommands);
  const hold = makeHold(init.holdMode, init.holdMs);
  const holdIsSync = init.holdMode !== 'timer'; // no microtask turn between t1 and the hold

  // Warm up on another key: connection open, scripts loaded (NOSCRIPT → EVAL happens here,
  // before the parent resets the stats). Uncontended, so no subscription either.
  for (let i = 0; i < 2; i++) {
    const h = await adapter.acquire(`${init.key}:warmup:${init.proc}`, 0);
    await adapter.release(h);
  }

  process.send({ type: 'ready' });
  const go = await new Promise((resolve) => process.once('message', resolve));
  window.startAt = go.startAt;
  window.endAt = go.endAt;

  // Per acquisition: waiter, acquire called, acquire resolved, release called, release resolved.
  const records = [];
  const failures = {};
  const pendingSince = new Array(init.waiters).fill(null); // acquire called, not yet resolved
  let finished = false;

  async function waiter(w) {
    while (!finished && now() < window.endAt) {
      const t0 = now();
      pendingSince[w] = t0;
      let handle;
      try {
        handle = await adapter.acquire(init.key, w);
      } catch (err) {
        pendingSince[w] = null;
        const code = err?.code ?? err?.name ?? 'Error';
        failures[code] = (failures[code] ?? 0) + 1;
        continue;
      }
      const t1 = now();
      pendingSince[w] = null;
      if (holdIsSync) hold(); else await hold();
      const t2 = now();
      const rec = [w, t0, t1, t2, NaN];
      records.push(rec);
      try {
        await adapter.release(handle);
      } catch (err) {
        const code = `release:${err?.code ?? err?.name ?? 'Error'}`;
        failures[code] = (failures[code] ?? 0) + 1;
      }
      rec[4] = now();
    }
  }

  await new Promise((r) => setTimeout(r, Math.max(0, window.startAt - now())));
  while (now() < window.startAt) { /* the last < 1 ms */ }
  const statsAtStart = adapter.stats?.();
  for (let w = 0; w < init.waiters; w++) waiter(w);

  await new Promise((r) => setTimeout(r, Math.max(0, window.endAt - now())));
  const statsAtEnd = adapter.stats?.();
  finished = true;
  const endedAt = now();
  const pendingAtEnd = pendingSince.slice();
  // Give releases already called a moment to resolve, so their times are known.
  await new Promise((r) => setTimeout(r, 50));
  process.send({
    type: 'result',
    proc: init.proc,
    endedAt,
    records,
    pending: pendingAtEnd,
    failures,
    clientCommands,
    driverStats: statsAtStart && statsAtEnd ? {
      redisAttempts: statsAtEnd.redisAttempts - statsAtStart.redisAttempts,
      notificationsReceived: statsAtEnd.notificationsReceived - statsAtStart.notificationsReceived,
      subscriptionAtEnd: statsAtEnd.subscription,
      errors: Object.fromEntries(Object.entries(statsAtEnd.errors).filter(([k, v]) => v - (statsAtStart.errors[k] ?? 0) > 0)
        .map(([k, v]) => [k, v - (statsAtStart.errors[k] ?? 0)])),
    } : null,
  }, () => process.exit(0));
}

main().catch((err) => {
  process.send?.({ type: 'error', message: String(err?.stack ?? err) }, () => process.exit(1));
});
