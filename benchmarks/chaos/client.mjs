// One chaos client process: ONE driver (createRedisLockDriver) and several workers that
// contend on a few keys and write through the coordinator's fenced store (over IPC).
// Everything it sees goes to the coordinator as history events stamped on this process's
// clock (CLOCK_MONOTONIC, shared by every process on the host: decision 0056).
//
// Started by run.mjs with fork(); its options come in CHAOS_CLIENT (JSON).

import { setTimeout as sleep } from 'node:timers/promises';
import { createRequire } from 'node:module';
import { now, rng } from './prng.mjs';

const require = createRequire(import.meta.url);
const { createRedisLockDriver } = require('../../index.js');

const cfg = JSON.parse(process.env.CHAOS_CLIENT);
const { proc, incarnation, workers, keys, leaseMs, waitTimeoutMs, seed } = cfg;

let seq = 0;
const send = (ev) => {
  // A killed coordinator, or one that already said stop and left: nothing to report to.
  if (process.connected) process.send({ t: 'ev', ev: { ...ev, p: proc, inc: incarnation } });
};

// The fenced store lives in the coordinator; a write is a round trip over IPC.
// Resolves { ok, storeAt, wid }: the store's verdict, when it judged (coordinator's stamp,
// same clock) and the write's id, which the store's own history event carries too.
const pendingWrites = new Map();
function storeWrite(key, fence, lease) {
  const id = ++seq;
  return new Promise((resolve) => {
    pendingWrites.set(id, (ok, storeAt) => resolve({ ok, storeAt, wid: id }));
    process.send({ t: 'write', id, key, fence, lease, p: proc, inc: incarnation, sentAt: now() });
  });
}

let stopping = false;
let finished = false;
// The coordinator died (killed, crashed): nobody will say stop, and nobody records anything.
process.on('disconnect', () => { if (!finished) process.exit(2); });
let stopped;
const stopRequested = new Promise((resolve) => { stopped = resolve; });
process.on('message', (msg) => {
  if (msg.t === 'ack') {
    pendingWrites.get(msg.id)?.(msg.ok, msg.at);
    pendingWrites.delete(msg.id);
  } else if (msg.t === 'stop') {
    stopping = true;
    stopped();
  }
});

// Error codes come with the cause's structure, never its message (which is ours anyway,
// but the checker needs only the classification).
const describe = (err) => ({
  code: err?.code ?? null,
  name: err?.name ?? typeof err,
  cause: err?.cause && typeof err.cause === 'object'
    ? { plugin: err.cause.plugin, code: err.cause.code, outcome: err.cause.outcome, serverCode: err.cause.serverCode }
    : undefined,
  lockError: err?.constructor?.name === 'LockError',
});

const driver = createRedisLockDriver(
  {
    url: cfg.url, cluster: cfg.cluster || undefined, connectTimeoutMs: cfg.connectTimeoutMs, commandTimeoutMs: cfg.commandTimeoutMs,
    // Short, so that a flow the nemesis drops silently (net-silent-cut) is found within the run.
    pingIntervalMs: cfg.pingIntervalMs,
  },
  {
    driver: 'redis', connection: 'main', namespace: cfg.namespace, leaseMs, waitTimeoutMs, notifications: cfg.notifications,
    minReplicas: cfg.minReplicas, replicaTimeoutMs: cfg.replicaTimeoutMs, shutdownTimeoutMs: 5000,
  },
  // The driver's warnings and errors join the history (their code and reason only), so a
  // stretch without leases can be told apart from a cluster without a primary.
  {
    warn: (fields) => send({ k: 'log', level: 'warn', at: now(), code: fields?.code, reason: fields?.reason }),
    error: (fields) => send({ k: 'log', level: 'error', at: now(), code: fields?.code, reason: fields?.reason }),
  },
);

// A holder that obeys its lease's signal (issue 24 item 3) checks `lease.signal.aborted`
// before each fenced write and skips the write when it aborted, and passes the signal to its
// waits, so a lost or expired lease cuts the hold short. A seeded half of the leases obey,
// the other half write regardless (the stale writers the fence has to stop) but record what
// their signal said, so one run compares both under the same faults (decision 0156).
// A quarter of the obeying leases use keepAlive instead of a manual renew.
const OBEY_SHARE = 0.5;
const KEEP_ALIVE_SHARE = 0.25;

async function worker(w) {
  const r = rng(seed, 1000 + proc, incarnation, w);
  // The signal choices come from a stream of their own: `r` draws what it drew before them.
  const rs = rng(seed, 2000 + proc, incarnation, w);
  while (!stopping) {
    const key = r.pick(keys);
    const op = `${proc}.${incarnation}.${w}.${++seq}`;
    const startAt = now();
    send({ k: 'acq-start', op, key, w, at: startAt });
    let lease;
    try {
      lease = await driver.acquire(key, { waitTimeoutMs });
    } catch (err) {
      send({ k: 'acq-fail', op, key, w, at: now(), startAt, err: describe(err), stopping });
      await sleep(r.int(5, 50));
      continue;
    }
    const grantAt = now();
    const obeys = rs.chance(OBEY_SHARE);
    const keepAlive = obeys && rs.chance(KEEP_ALIVE_SHARE);
    send({ k: 'grant', op, key, w, at: grantAt, startAt, fence: lease.fence, expiresAt: grantAt + lease.remainingMs, obeys, keepAlive });
    // Read for every lease, obeying or not: the history says for each write whether the
    // signal had aborted. Its abort is recorded with the reason's code and cause structure.
    const signal = lease.signal;
    const onAbort = () => send({ k: 'signal', op, key, at: now(), err: describe(signal.reason) });
    if (signal.aborted) onAbort();
    else signal.addEventListener('abort', onAbort, { once: true });
    // A keep-alive lease's deadline moves on the addon's thread, unseen here: each event of
    // it says how long the lease had left when the holder looked, a lower bound the checker
    // extends the lease by (a manual renew reports its own).
    const seen = () => {
      if (!keepAlive) return undefined;
      const at = now();
      const ms = lease.remainingMs;
      return ms > 0 ? at + ms : undefined;
    };
    if (keepAlive) {
      try {
        lease.keepAlive({ maxHoldMs: leaseMs });
        send({ k: 'keepalive', op, key, at: now(), ok: true });
      } catch (err) {
        send({ k: 'keepalive', op, key, at: now(), ok: false, err: describe(err) });
      }
    }
    const waitOpts = obeys ? { signal } : undefined;
    const wait = (ms) => sleep(ms, undefined, waitOpts).catch(() => {}); // an abort ends the wait early

    // One fenced write, or its skip. `checkedAt` is stamped before the signal is read, so
    // it is no later than the read; reading `aborted` asks the driver at once (decision 0150).
    const fencedWrite = async (validBefore) => {
      const checkedAt = now();
      const aborted = signal.aborted;
      const reason = aborted ? signal.reason?.code ?? null : undefined;
      if (obeys && aborted) {
        send({ k: 'skip', op, key, at: checkedAt, reason, seenExpiresAt: seen() });
        return;
      }
      const seenExpiresAt = seen();
      const { ok, storeAt, wid } = await storeWrite(key, lease.fence, op);
      send({ k: 'write', op, key, at: now(), ok, validBefore: validBefore ?? lease.valid, checkedAt, storeAt, wid, obeys, aborted, reason, seenExpiresAt });
    };

    // First write at once, then hold. Now and then a worker overruns its lease (a long GC
    // pause, a slow call) and writes anyway: those are the stale writers the fence must stop.
    const overrun = r.chance(0.08);
    const holdMs = overrun ? r.int(leaseMs, leaseMs * 2) : r.int(0, Math.floor(leaseMs * 0.4));
    await fencedWrite();
    await wait(holdMs);
    if (!overrun && r.chance(0.25) && !keepAlive && lease.valid) {
      const at = now();
      try {
        await lease.renew();
        send({ k: 'renew', op, key, at, endAt: now(), ok: true, expiresAt: now() + lease.remainingMs });
      } catch (err) {
        send({ k: 'renew', op, key, at, endAt: now(), ok: false, err: describe(err), valid: lease.valid, expiresAt: now() + lease.remainingMs });
      }
      await wait(r.int(0, Math.floor(leaseMs * 0.2)));
    }
    await fencedWrite(lease.valid);
    const relAt = now();
    const validAtRelease = lease.valid;
    // Sent before the call: a process killed while its release is in flight has still ended
    // the lease here, and Redis may run that release after the process died.
    send({ k: 'release-call', op, key, at: relAt, seenExpiresAt: seen() });
    try {
      const released = await lease.release();
      send({ k: 'release', op, key, at: relAt, endAt: now(), ok: true, released, validBefore: validAtRelease });
    } catch (err) {
      send({ k: 'release', op, key, at: relAt, endAt: now(), ok: false, err: describe(err), validBefore: validAtRelease });
    }
    await sleep(r.int(0, 30));
  }
}

// When the driver found a connection dead by its liveness PING (stats().deadConnections
// rose): the checker sets these beside the silent cuts (net-silent-cut). Read every 20 ms, so
// the time recorded is at most that late.
let deadSeen = 0;
const deadWatch = setInterval(() => {
  const total = driver.stats().deadConnections;
  if (total !== deadSeen) send({ k: 'dead', at: now(), total, was: deadSeen });
  deadSeen = total;
}, 20);

// A stretch in which this process's event loop did not run (the host starved or paused it):
// recorded, so a gap in the history can be told from one the servers or the driver made.
let lastTick = now();
const stallWatch = setInterval(() => {
  const t = now();
  if (t - lastTick > 500) send({ k: 'stall', at: t, ms: t - lastTick });
  lastTick = t;
}, 100);

const running = Array.from({ length: workers }, (_, w) => worker(w));
send({ k: 'proc-start', at: now(), pid: process.pid });
await stopRequested;
await Promise.all(running);
clearInterval(deadWatch);
clearInterval(stallWatch);
const shutdownAt = now();
try {
  await driver.shutdown();
  send({ k: 'shutdown', at: shutdownAt, endAt: now(), ok: true });
} catch (err) {
  send({ k: 'shutdown', at: shutdownAt, endAt: now(), ok: false, err: describe(err) });
}
// Leave the IPC channel so that nothing but the driver could keep this process alive: the
// coordinator checks that it then exits on its own, with code 0.
finished = true;
process.disconnect();
