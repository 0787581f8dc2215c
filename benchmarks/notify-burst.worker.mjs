// One run of benchmarks/notify-burst.bench.mjs (forked by it, never run by hand): the
// process under test, with two backends on the same throwaway redis-server.
//
// Backend A acquires N distinct keys; backend B starts N concurrent acquires of the same
// keys (waitTimeoutMs longer than the run's bound) and waits on all of them at once; once
// B has asked Redis about every key and its subscription is confirmed (per-key: every key's
// channel, seen by the parent in CLIENT LIST), A releases all N at once. Measured from the
// start of that release burst to the moment every one of B's acquires has settled: the
// hand-over time, this process's CPU (process.cpuUsage: all threads; process.threadCpuUsage:
// the JS thread alone), redis-server's CPU (/proc), errors by code, and what stats() counted.
//
// Protocol (IPC): parent → {type:'init', ...}; worker → {type:'waiting', ...} when B waits
// on every key; parent → {type:'release'} once it saw B's subscriptions; worker →
// {type:'result', ...}, then exits without shutting down (nothing after the burst is
// measured, and a stuck backend must not hold the matrix). A hand-over that has not ended
// after `boundMs` is reported with `timedOut: true` and what had settled by then.

import { createRequire } from 'node:module';

import { jsThreadCpuUs, processBusy } from './lib.mjs';

const require = createRequire(import.meta.url);
const now = () => performance.now();

// CPU of this process's JS thread in µs: process.threadCpuUsage() (Node 23.9+, µs
// resolution), else /proc/self/task (10 ms ticks).
const jsCpuUs = () => {
  if (typeof process.threadCpuUsage === 'function') {
    const u = process.threadCpuUsage();
    return u.user + u.system;
  }
  return jsThreadCpuUs();
};
const allCpuUs = () => {
  const u = process.cpuUsage();
  return u.user + u.system;
};

const codeOf = (err) => err?.code ?? 'NOT_A_LOCK_ERROR';
const count = (map, code) => { map[code] = (map[code] ?? 0) + 1; };

/** Runs `fn(i)` for i < n with at most `width` in flight. */
async function pool(n, width, fn) {
  let next = 0;
  const lane = async () => { while (next < n) await fn(next++); };
  await Promise.all(Array.from({ length: Math.min(width, n) }, lane));
}

function statsDelta(after, before) {
  const errors = {};
  for (const [k, v] of Object.entries(after.errors)) if (v - (before.errors[k] ?? 0) > 0) errors[k] = v - (before.errors[k] ?? 0);
  return {
    redisAttempts: after.redisAttempts - before.redisAttempts,
    notificationsReceived: after.notificationsReceived - before.notificationsReceived,
    errors,
  };
}

async function main(init) {
  const { createRedisLockDriver } = require(`${init.packageDir}/index.js`);
  const n = init.size;
  const options = {
    driver: 'redis', connection: 'bench', namespace: init.namespace, leaseMs: init.leaseMs,
    // Every acquire of the burst is in progress at once, and every lease is tracked.
    maxWaiters: n + 16, maxTrackedLeases: n + 16,
  };
  if (init.notifications) options.notifications = init.notifications;
  // The same connection settings for both backends (the parent's --command-timeout-ms).
  const connection = init.commandTimeoutMs ? { url: init.url, commandTimeoutMs: init.commandTimeoutMs } : init.url;
  const a = createRedisLockDriver(connection, options);
  const b = createRedisLockDriver(connection, options);
  const keys = Array.from({ length: n }, (_, i) => `burst:${i}`);

  // Setup: A holds every key (a few hundred acquires in flight: setup is not measured).
  const setupErrors = {};
  const leases = new Array(n);
  const t0Setup = now();
  await pool(n, 256, async (i) => {
    try { leases[i] = await a.acquire(keys[i], { waitTimeoutMs: 0 }); } catch (err) { count(setupErrors, `A.acquire:${codeOf(err)}`); }
  });
  const heldByA = leases.filter(Boolean).length;

  // B waits on every key at once. Each acquire asks Redis once (busy), then sleeps until a
  // notification or its safety poll.
  const b0 = b.stats();
  const settledAt = new Array(n).fill(null);
  const acquireErrors = {};
  const bLeases = [];
  let settled = 0;
  let allSettled;
  const everyoneSettled = new Promise((r) => { allSettled = r; });
  const onSettled = (i) => {
    settledAt[i] = now();
    if (++settled === n) allSettled();
  };
  for (let i = 0; i < n; i++) {
    b.acquire(keys[i], { waitTimeoutMs: init.waitTimeoutMs }).then(
      (lease) => { bLeases.push(lease); onSettled(i); },
      (err) => { count(acquireErrors, codeOf(err)); onSettled(i); },
    );
  }
  // Waiting: every acquire asked Redis and is still pending (a busy reply each).
  const waitUntil = now() + init.setupBoundMs;
  while (now() < waitUntil) {
    const s = b.stats();
    if (s.redisAttempts - b0.redisAttempts >= n && s.subscription === 'live') break;
    await new Promise((r) => setTimeout(r, 20));
  }
  process.send({
    type: 'waiting', setupMs: now() - t0Setup, heldByA, setupErrors, settledEarly: settled,
    bStats: b.stats(),
  });
  await new Promise((resolve) => process.once('message', (m) => m?.type === 'release' && resolve()));
  // Let the "check once more" attempts after the subscription's confirmation finish: the
  // burst starts on a backend whose waiters sleep (they keep their safety poll,
  // notifyPollIntervalMs, as in real life; its attempts during the burst are counted).
  await new Promise((r) => setTimeout(r, init.settleMs));

  // The burst.
  const aBefore = a.stats();
  const bBefore = b.stats();
  const releaseErrors = {};
  let releasedFalse = 0;
  let releasesDone = 0;
  let releasesDoneAt = null;
  const cpu0 = allCpuUs();
  const js0 = jsCpuUs();
  const redis0 = processBusy([init.redisPid]);
  const t0 = now();
  for (const lease of leases) {
    if (!lease) continue;
    lease.release().then((ok) => { if (!ok) releasedFalse++; }, (err) => count(releaseErrors, codeOf(err))).finally(() => {
      if (++releasesDone === heldByA) releasesDoneAt = now();
    });
  }
  const bound = new Promise((r) => setTimeout(() => r('timeout'), init.boundMs));
  const ended = await Promise.race([everyoneSettled.then(() => 'done'), bound]);
  const t1 = now();
  const cpuUs = allCpuUs() - cpu0;
  const jsUs = jsCpuUs() - js0;
  const redisCpuS = processBusy([init.redisPid]) - redis0;
  const aAfter = a.stats();
  const bAfter = b.stats();

  const lat = settledAt.filter((t) => t !== null && t >= t0).map((t) => t - t0).sort((x, y) => x - y);
  const q = (p) => (lat.length ? lat[Math.min(lat.length - 1, Math.ceil((p / 100) * lat.length) - 1)] : null);
  const result = {
    type: 'result',
    size: n,
    timedOut: ended === 'timeout',
    handOverMs: t1 - t0,
    releasesDoneMs: releasesDoneAt === null ? null : releasesDoneAt - t0,
    releases: { called: heldByA, done: releasesDone, false: releasedFalse, errors: releaseErrors },
    acquires: { settled, held: bLeases.length, errors: acquireErrors, settledBeforeBurst: settledAt.filter((t) => t !== null && t < t0).length },
    keyHandedAfterMs: { p50: q(50), p90: q(90), p99: q(99), max: lat.at(-1) ?? null },
    cpu: { processUs: cpuUs, jsThreadUs: jsUs, otherThreadsUs: jsUs === null ? null : cpuUs - jsUs, redisServerS: redisCpuS },
    statsA: statsDelta(aAfter, aBefore),
    statsB: statsDelta(bAfter, bBefore),
    bSubscription: bAfter.subscription,
    setupErrors,
  };
  // Nothing after the burst is measured: the process ends at once (the parent flushes
  // Redis before the next run), also when a stuck backend would never shut down.
  process.send(result, () => process.exit(0));
}

process.once('message', (init) => {
  main(init).catch((err) => {
    process.send?.({ type: 'error', message: String(err?.stack ?? err) }, () => process.exit(1));
  });
});
