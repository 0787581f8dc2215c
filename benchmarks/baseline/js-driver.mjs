// The same-protocol JS baseline of the benchmarks (issue 37): a driver of this package's
// contract written in JS on ioredis, so a run shows what the addon gains over doing the very
// same work on the JS thread. Not a product and not tested as one: a yardstick.
//
// What it shares with the addon, so that the difference is the client side alone:
// - the Redis layout and scripts: <namespace>:lock:{sha256(key)} / <namespace>:lock-fence:{…},
//   src/scripts/acquire.lua and release.lua (SCRIPT LOAD on connect, EVALSHA, EVAL on
//   NOSCRIPT), a random 128-bit token, the fence handed out as the script's decimal string,
//   the release PUBLISH on <namespace>:lock-released (done by release.lua);
// - the per-call checks a user pays for: key validation, maxWaiters, deadlines counted from
//   the call, lease validity counted from the acquire's submission;
// - waiting as spec/lock-redis.txt describes it: a FIFO line per key in this process where
//   only the first waiter asks Redis; on a busy reply it retries after min(PTTL, safety
//   interval, remaining wait); it subscribes to the namespace channel only when a waiter
//   really waits, checks once more when the subscription is confirmed, and disconnects it
//   when no waiter came for 1 s.
// Left out (not on the measured paths): signal, renew, tracked leases and shutdown cleanup,
// the per-process head start, error classification (Redis errors reach the caller as they
// are) and resubscribing after a failed subscription (the waiters then keep polling).

import { createHash, randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import Redis from 'ioredis';

const SCRIPTS_DIR = path.resolve(import.meta.dirname, '../../src/scripts');
const UNSUBSCRIBE_AFTER_MS = 1000;
const FENCE = /^[1-9][0-9]*$/;

function lockError(code, message) {
  return Object.assign(new Error(message), { code });
}

/**
 * Connects, loads the scripts, and returns `{ acquire(key, { waitTimeoutMs }), close(),
 * client, stats() }`. Leases: `{ key, fence, valid, remainingMs, release() → boolean }`.
 */
export async function createJsLockDriver(url, options) {
  const {
    namespace, leaseMs = 10_000, waitTimeoutMs = 5000, pollIntervalMs = 25, notifyPollIntervalMs = 250,
    maxWaiters = 128, maxKeyBytes = 1024,
  } = options;
  if (!namespace) throw lockError('INVALID_OPTIONS', 'namespace is required');
  const channel = `${namespace}:lock-released`;
  // Never resend a command whose outcome is unsettled (the contract retries none).
  const client = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, autoResendUnfulfilledCommands: false });
  client.on('error', () => {});
  await client.connect();
  const sources = {
    acquire: readFileSync(path.join(SCRIPTS_DIR, 'acquire.lua'), 'utf8'),
    release: readFileSync(path.join(SCRIPTS_DIR, 'release.lua'), 'utf8'),
  };
  const shas = {};
  for (const [name, source] of Object.entries(sources)) shas[name] = await client.script('LOAD', source);

  async function run(name, ...args) {
    try {
      return await client.evalsha(shas[name], ...args);
    } catch (err) {
      // A server that lost its scripts (restart, SCRIPT FLUSH, failover) gets the source once.
      if (!String(err?.message).startsWith('NOSCRIPT')) throw err;
      return client.eval(sources[name], ...args);
    }
  }

  // ---- waiting: lines per key hash, and the subscription while anyone really waits ----
  const lines = new Map(); // hash → { queue: [waiter], heldHere, wake, woken }
  const stats = { redisAttempts: 0, notificationsReceived: 0 };
  let inProgress = 0;
  let waiting = 0;
  let sub = null; // { client, live }
  let idleTimer = null;

  function wakeLine(line) {
    if (line.wake) line.wake();
    else line.woken = true; // the head is asking Redis now: its next sleep returns at once
  }

  function subscribe() {
    if (sub) return;
    const c = client.duplicate({ lazyConnect: false });
    c.on('error', () => {});
    c.on('message', (_channel, hash) => {
      stats.notificationsReceived++;
      const line = lines.get(hash);
      if (line) wakeLine(line);
    });
    sub = { client: c, live: false };
    c.subscribe(channel).then(() => {
      if (sub?.client !== c) return;
      sub.live = true;
      // A release before the subscription sent nothing we could hear: every first waiter looks again.
      for (const line of lines.values()) wakeLine(line);
    }, () => {}); // failed: the waiters keep polling at pollIntervalMs
  }

  function unsubscribe() {
    idleTimer = null;
    sub?.client.disconnect();
    sub = null;
  }

  function startWaiting(w) {
    if (w.waiting) return;
    w.waiting = true;
    waiting++;
    if (idleTimer) clearTimeout(idleTimer);
    idleTimer = null;
    subscribe();
  }

  function stopWaiting(w) {
    if (!w.waiting) return;
    w.waiting = false;
    if (--waiting === 0) idleTimer = setTimeout(unsubscribe, UNSUBSCRIBE_AFTER_MS).unref();
  }

  // The head sleeps until a release of its key is heard or `ms` pass.
  function sleepOrWake(line, ms) {
    if (line.woken) {
      line.woken = false;
      return null;
    }
    return new Promise((resolve) => {
      const timer = setTimeout(done, ms);
      function done() {
        clearTimeout(timer);
        line.wake = null;
        line.woken = false;
        resolve();
      }
      line.wake = done;
    });
  }

  // Behind others: until the waiter before leaves, or the deadline.
  function turn(w, deadline) {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(lockError('WAIT_TIMEOUT', 'the wait ran out')), Math.max(0, deadline - performance.now()));
      w.turn = () => { clearTimeout(timer); resolve(); };
    });
  }

  function leave(hash, line, w) {
    stopWaiting(w);
    const i = line.queue.indexOf(w);
    line.queue.splice(i, 1);
    if (line.queue.length === 0) lines.delete(hash);
    else if (i === 0) line.queue[0].turn?.();
  }

  // ---- acquire and release ----
  async function acquire(key, { waitTimeoutMs: wait = waitTimeoutMs } = {}) {
    const deadline = performance.now() + wait;
    if (typeof key !== 'string' || key === '' || !key.isWellFormed() || Buffer.byteLength(key) > maxKeyBytes) {
      throw lockError('INVALID_KEY', 'the key is not a valid lock key');
    }
    if (inProgress >= maxWaiters) throw lockError('QUEUE_FULL', 'too many acquires in progress');
    const hash = createHash('sha256').update(key).digest('hex');
    let line = lines.get(hash);
    if (line === undefined) {
      line = { queue: [], heldHere: false, wake: null, woken: false };
      lines.set(hash, line);
    } else if (wait === 0 && line.queue.length) {
      throw lockError('LOCK_BUSY', 'the lock is busy: this process already waits for it');
    }
    const w = { turn: null, waiting: false };
    line.queue.push(w);
    inProgress++;
    try {
      if (line.queue.length > 1) {
        startWaiting(w);
        await turn(w, deadline);
      }
      return await attempts(key, hash, line, w, wait, deadline);
    } finally {
      inProgress--;
      leave(hash, line, w);
    }
  }

  async function attempts(key, hash, line, w, wait, deadline) {
    const lockKey = `${namespace}:lock:{${hash}}`;
    const token = randomBytes(16).toString('hex');
    // The waiter before us took the key: asking Redis before its release is heard is a wasted trip.
    let askNow = !line.heldHere;
    line.heldHere = false;
    let pttl = 0;
    for (;;) {
      if (askNow) {
        const sentAt = performance.now();
        stats.redisAttempts++;
        const reply = await run('acquire', 2, lockKey, `${namespace}:lock-fence:{${hash}}`, token, leaseMs);
        if (typeof reply === 'string') {
          if (!FENCE.test(reply)) throw lockError('OUTCOME_UNKNOWN', 'unexpected acquire reply');
          line.heldHere = true;
          line.woken = false; // a release heard before this acquire is older than our hold
          return lease(key, hash, lockKey, token, reply, sentAt + leaseMs);
        }
        if (reply !== null && !(Number.isInteger(reply) && reply >= -2)) throw lockError('OUTCOME_UNKNOWN', 'unexpected acquire reply');
        pttl = reply ?? 0;
      }
      askNow = true;
      const remaining = deadline - performance.now();
      if (remaining <= 0) throw wait === 0 ? lockError('LOCK_BUSY', 'the lock is busy') : lockError('WAIT_TIMEOUT', 'the wait ran out');
      startWaiting(w);
      const safety = sub?.live ? notifyPollIntervalMs : pollIntervalMs;
      await sleepOrWake(line, Math.min(pttl > 0 ? pttl : safety, safety, remaining));
    }
  }

  function lease(key, hash, lockKey, token, fence, expiresAt) {
    let released = false;
    return {
      key,
      fence,
      get valid() { return !released && performance.now() < expiresAt; },
      get remainingMs() { return this.valid ? Math.floor(expiresAt - performance.now()) : 0; },
      async release() {
        if (released) return false;
        released = true;
        // A release wakes this process's waiters through the notification too, like any other's.
        return (await run('release', 1, lockKey, token, channel, hash)) > 0;
      },
    };
  }

  return {
    client,
    acquire,
    stats: () => ({ ...stats, inProgress, waiting, lines: lines.size, subscription: sub ? (sub.live ? 'live' : 'connecting') : 'off' }),
    close() {
      if (idleTimer) clearTimeout(idleTimer);
      unsubscribe();
      client.disconnect();
    },
  };
}
