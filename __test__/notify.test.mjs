// The wait line and release notifications, through the public JS API: FIFO inside a
// backend, one Redis attempt per line, the `<ns>:lock-released` subscription's life, wake-ups
// by any releaser, and the 'unsupported' and 'failed' fallbacks with their log events.
// (tests/notify.rs proves the same from Rust.)
//
// Timing is asserted only as loose bounds. Where both safety intervals are 5000 ms, a waiter
// that gets the lock within 1500 ms of a release can only have been woken by the notification.

import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { createRequire } from 'node:module';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  backend, eventually, failure, lockKeyOf, scriptCalls, sha256hex, uniqueNamespace, within,
} from './helpers/lock.mjs';
import { external, startRedis } from './helpers/redis.mjs';

const { createRedisLockDriver, LockError } = createRequire(import.meta.url)('../index.js');

/** Both safety intervals so slow that only a notification explains a quick wake-up. */
const SLOW_POLLS = { pollIntervalMs: 5000, notifyPollIntervalMs: 5000 };
/** "Well before the slow safety polls". */
const WOKEN_WITHIN_MS = 1500;

let redis;
before(async () => { redis = await startRedis(); });
after(() => redis?.stop());

// ------------------------------------------------------------------ helpers ----

/** Everything any logger in this file received, for the leak check at the end. */
const allLogs = [];
/** Every key, token and password this file used, none of which may reach a log. */
const secrets = { keys: new Set(), tokens: new Set() };
/** Which log-producing tests ran (a --test-name-pattern run may skip them). */
const ran = { unsupported: false, failed: false };

/** A pino-style logger that records `{ level, fields, msg }`. */
function recorder() {
  const entries = [];
  const at = (level) => (fields, msg) => {
    const entry = { level, fields, msg };
    entries.push(entry);
    allLogs.push(entry);
  };
  return {
    entries,
    debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error'),
    /** The LOCK_NOTIFY_UNAVAILABLE events logged at `level`. */
    notifyEvents(level) {
      return entries.filter((e) => e.level === level && e.fields?.code === 'LOCK_NOTIFY_UNAVAILABLE');
    },
  };
}

/** A driver on this file's server (or `url`), shut down when the test ends. */
function driverFor(t, namespace, extra = {}, { url = redis.url, logger = recorder() } = {}) {
  const d = createRedisLockDriver(url, backend(namespace, extra), logger);
  t.after(() => d.shutdown());
  return d;
}

/** A key no other test uses; remembered for the leak check. */
function keyName(label) {
  const key = `notify-key/${label}/${randomBytes(4).toString('hex')}`;
  secrets.keys.add(key);
  return key;
}

/** The owner token Redis holds for `key` right now; remembered for the leak check. */
async function tokenOf(namespace, key) {
  const token = await redis.command('GET', lockKeyOf(namespace, key));
  assert.equal(typeof token, 'string', 'the key is held');
  secrets.tokens.add(token);
  return token;
}

const channelOf = (namespace) => `${namespace}:lock-released`;

async function subscribers(namespace) {
  const [, n] = await redis.command('PUBSUB', 'NUMSUB', channelOf(namespace));
  return n;
}

function subscribed(namespace, n = 1, timeoutMs = 3000) {
  return eventually(`PUBSUB NUMSUB ${n} on the release channel`,
    async () => (await subscribers(namespace)) === n, { timeoutMs, intervalMs: 10 });
}

/** Fails if `check` turns false at any poll during `ms` (for things that must not happen). */
async function stays(what, check, ms) {
  const end = performance.now() + ms;
  while (performance.now() < end) {
    assert.ok(await check(), `${what} did not hold for ${ms} ms`);
    await sleep(20);
  }
}

/**
 * Resolves once Redis ran no script for `quietMs`: every waiter is asleep (after its busy
 * reply and the re-check that follows the subscription's confirmation).
 */
async function quiet(quietMs = 200) {
  let last = await scriptCalls(redis);
  let since = performance.now();
  return eventually('Redis to see no script for a while', async () => {
    const now = await scriptCalls(redis);
    if (now !== last) {
      last = now;
      since = performance.now();
      return false;
    }
    return performance.now() - since >= quietMs;
  }, { timeoutMs: 5000, intervalMs: 20 });
}

function assertLockError(err, code) {
  assert.ok(err instanceof LockError, `not a LockError: ${err?.stack ?? err}`);
  assert.equal(err.code, code, err.message);
}

/** A waiter that records when it got the lock, into `served`, and releases at once. */
function servedWaiter(d, key, label, served, options = {}) {
  const started = performance.now();
  const promise = d.acquire(key, { waitTimeoutMs: 10_000, ...options }).then(async (lease) => {
    served.push(label);
    assert.equal(lease.valid, true);
    const fence = BigInt(lease.fence);
    assert.equal(await lease.release(), true);
    return fence;
  });
  return { promise, started };
}

// No public API tells when a waiter has queued; arrivals are a few ms apart so each test
// reads plainly. (Back-to-back calls in one tick have their own test below.)
const ARRIVAL_GAP_MS = 20;

// --------------------------------------------------------------- the line ----

describe('the wait line inside a backend', () => {
  test('five waiters on a held key are served in arrival order, with rising fences', async (t) => {
    const ns = uniqueNamespace('order');
    const d = driverFor(t, ns, { pollIntervalMs: 20, notifyPollIntervalMs: 50 });
    const key = keyName('order');
    const held = await d.acquire(key);
    const served = [];
    const waiters = [];
    for (let i = 0; i < 5; i++) {
      if (i > 0) await sleep(ARRIVAL_GAP_MS);
      waiters.push(servedWaiter(d, key, i, served).promise);
    }
    assert.deepEqual(served, [], 'nobody is served while the key is held');
    assert.equal(await held.release(), true);
    const fences = await within(10_000, Promise.all(waiters), 'the five waiters');
    assert.deepEqual(served, [0, 1, 2, 3, 4], 'first come, first served');
    let previous = BigInt(held.fence);
    for (const fence of fences) {
      assert.ok(fence > previous, 'every later holder has a larger fence');
      previous = fence;
    }
  });

  test('waiters started back to back in one tick are served in call order', async (t) => {
    const ns = uniqueNamespace('order-tick');
    const d = driverFor(t, ns, { pollIntervalMs: 20, notifyPollIntervalMs: 50 });
    // Several rounds: the race does not lose every time.
    for (let round = 0; round < 8; round++) {
      const key = keyName(`order-tick-${round}`);
      const held = await d.acquire(key);
      const served = [];
      const waiters = [0, 1, 2, 3, 4].map((i) => servedWaiter(d, key, i, served).promise);
      await eventually('the five in the line', () => d.stats().waiters === 5);
      assert.equal(await held.release(), true);
      await within(10_000, Promise.all(waiters), 'the five waiters');
      assert.deepEqual(served, [0, 1, 2, 3, 4], `round ${round}: served in call order`);
    }
  });

  test('eight waiters on one key make about one Redis attempt per safety interval, not eight', async (t) => {
    const ns = uniqueNamespace('one-attempt');
    const pollIntervalMs = 50;
    const notifyPollIntervalMs = 100;
    const holdMs = 1000;
    const holder = driverFor(t, ns);
    const d = driverFor(t, ns, { pollIntervalMs, notifyPollIntervalMs });
    const key = keyName('one-attempt');
    const held = await holder.acquire(key);
    const served = [];
    const base = await scriptCalls(redis);
    const started = performance.now();
    const waiters = [];
    for (let i = 0; i < 8; i++) waiters.push(servedWaiter(d, key, i, served).promise);
    await sleep(holdMs); // the key stays held for about a second: this is the scenario
    const attempts = (await scriptCalls(redis)) - base;
    const elapsed = performance.now() - started;
    assert.equal(await held.release(), true);
    await within(10_000, Promise.all(waiters), 'the eight waiters');
    assert.equal(served.length, 8);

    // One line polls at most every pollIntervalMs (before the subscription is live) and
    // every notifyPollIntervalMs after; the subscription's confirmation adds one re-check.
    const oneLine = 1 + elapsed / pollIntervalMs + 5;
    // Eight waiters polling on their own, even at the slower interval.
    const eightPollers = 8 * (elapsed / notifyPollIntervalMs);
    assert.ok(attempts >= 1, 'the first waiter asked Redis');
    assert.ok(attempts <= oneLine, `${attempts} script calls in ${elapsed.toFixed(0)} ms; one line makes at most ~${oneLine.toFixed(0)}`);
    assert.ok(attempts < eightPollers / 2,
      `${attempts} script calls in ${elapsed.toFixed(0)} ms; eight independent pollers would make ~${eightPollers.toFixed(0)}`);
  });

  test('a key has its own line: a waiter on key B is not held up behind key A', async (t) => {
    const ns = uniqueNamespace('two-keys');
    const holder = driverFor(t, ns);
    const d = driverFor(t, ns, SLOW_POLLS);
    const keyA = keyName('A');
    const keyB = keyName('B');
    const heldA = await holder.acquire(keyA);
    const servedA = [];
    const waitersA = [];
    for (let i = 0; i < 3; i++) {
      if (i > 0) await sleep(ARRIVAL_GAP_MS);
      waitersA.push(servedWaiter(d, keyA, i, servedA).promise);
    }
    await subscribed(ns);

    // A free key B is taken at once, even with waitTimeoutMs 0 (B's line is empty).
    const leaseB = await within(1000, d.acquire(keyB, { waitTimeoutMs: 0 }), 'acquire of the free key B');
    assert.equal(leaseB.valid, true);
    assert.equal(await leaseB.release(), true);

    // A waiter on a held key B gets it when B is released, while A's line still waits.
    const heldB = await holder.acquire(keyB);
    const servedB = [];
    const waiterB = servedWaiter(d, keyB, 'B', servedB);
    await quiet();
    const releasedB = performance.now();
    assert.equal(await heldB.release(), true);
    await within(5000, waiterB.promise, 'the waiter on B');
    const took = performance.now() - releasedB;
    assert.ok(took < WOKEN_WITHIN_MS, `the waiter on B got it ${took.toFixed(0)} ms after the release`);
    assert.deepEqual(servedA, [], "A's line is still waiting, untouched by B");

    assert.equal(await heldA.release(), true);
    await within(10_000, Promise.all(waitersA), "A's waiters");
    assert.deepEqual(servedA, [0, 1, 2]);
  });

  test('waitTimeoutMs 0 behind a waiter of this backend is LOCK_BUSY at once, without asking Redis', async (t) => {
    const ns = uniqueNamespace('zero-wait');
    const holder = driverFor(t, ns);
    const d = driverFor(t, ns, SLOW_POLLS);
    const key = keyName('zero-wait');
    const other = keyName('zero-wait-other');
    const held = await holder.acquire(key);
    const heldOther = await holder.acquire(other);
    const served = [];
    const waiter = servedWaiter(d, key, 'first', served);
    await subscribed(ns);
    await quiet(); // the waiter sleeps its 5000 ms safety interval now

    const base = await scriptCalls(redis);
    const started = performance.now();
    const err = await failure(d.acquire(key, { waitTimeoutMs: 0 }));
    const took = performance.now() - started;
    assertLockError(err, 'LOCK_BUSY');
    // Refused in the process (a few ms, tens when busy); queued behind the sleeping waiter it
    // would have waited for that waiter's 5000 ms safety interval.
    assert.ok(took < 2500, `rejected after ${took.toFixed(0)} ms`);
    assert.equal((await scriptCalls(redis)) - base, 0, 'no script reached Redis: it never jumps the line');

    // For contrast: a held key without a waiter of ours is asked once.
    const base2 = await scriptCalls(redis);
    assertLockError(await failure(d.acquire(other, { waitTimeoutMs: 0 })), 'LOCK_BUSY');
    assert.equal((await scriptCalls(redis)) - base2, 1, 'a key without a line is tried once');

    // The LOCK_BUSY did not disturb the waiter.
    assert.equal(await held.release(), true);
    await within(WOKEN_WITHIN_MS, waiter.promise, 'the waiter after the release');
    assert.deepEqual(served, ['first']);
    assert.equal(await heldOther.release(), true);
  });

  test('aborting or timing out a waiter in the middle of the line keeps the others in order', async (t) => {
    const ns = uniqueNamespace('middle');
    const holder = driverFor(t, ns);
    const d = driverFor(t, ns, { pollIntervalMs: 20, notifyPollIntervalMs: 50 });
    const key = keyName('middle');
    const held = await holder.acquire(key);
    const served = [];
    const controller = new AbortController();
    const w0 = servedWaiter(d, key, 0, served);
    await sleep(ARRIVAL_GAP_MS);
    const w1 = servedWaiter(d, key, 1, served, { signal: controller.signal });
    await sleep(ARRIVAL_GAP_MS);
    const w2 = servedWaiter(d, key, 2, served, { waitTimeoutMs: 300 });
    await sleep(ARRIVAL_GAP_MS);
    const w3 = servedWaiter(d, key, 3, served);
    await sleep(ARRIVAL_GAP_MS);
    const w4 = servedWaiter(d, key, 4, served);

    const reason = new Error('the caller gave up');
    controller.abort(reason);
    const aborted = await within(1000, failure(w1.promise), 'the aborted waiter');
    assertLockError(aborted, 'ABORTED');
    assert.equal(aborted.cause, reason);

    const timedOut = await within(2000, failure(w2.promise), 'the timed-out waiter');
    const took = performance.now() - w2.started;
    assertLockError(timedOut, 'WAIT_TIMEOUT');
    assert.ok(took >= 280 && took < 1300, `a 300 ms wait in the middle of the line ended after ${took.toFixed(0)} ms`);

    assert.equal(held.valid, true, 'the key was held throughout');
    assert.deepEqual(served, []);
    assert.equal(await held.release(), true);
    await within(10_000, Promise.all([w0.promise, w3.promise, w4.promise]), 'the remaining waiters');
    assert.deepEqual(served, [0, 3, 4], 'the others kept their order; the ones that left never got it');
  });
});

// ---------------------------------------------------------- notifications ----

describe('release notifications', () => {
  test('the backend subscribes only while waiters wait, and unsubscribes about a second after the last left', async (t) => {
    const ns = uniqueNamespace('numsub');
    const holder = driverFor(t, ns);
    const d = driverFor(t, ns, { pollIntervalMs: 20, notifyPollIntervalMs: 100 });
    const key = keyName('numsub');

    // Uncontended: never subscribes, nor does a LOCK_BUSY try (it does not wait).
    for (let i = 0; i < 5; i++) {
      const lease = await d.acquire(key);
      assert.equal(await lease.release(), true);
    }
    let held = await holder.acquire(key);
    assertLockError(await failure(d.acquire(key, { waitTimeoutMs: 0 })), 'LOCK_BUSY');
    await stays('no subscriber without a waiter', async () => (await subscribers(ns)) === 0, 200);

    // A waiter that really waits subscribes, once.
    let waiter = d.acquire(key, { waitTimeoutMs: 10_000 });
    await subscribed(ns, 1);
    // The clock starts before the hand-off, not after the waiter resolved: the idle second
    // runs from when the waiter left, and a busy machine may take long to tell us so.
    const lastLeft = performance.now();
    assert.equal(await held.release(), true);
    let lease = await within(5000, waiter, 'the waiter');
    assert.equal(await lease.release(), true);

    // Dropped about a second after the last waiter left, not at once.
    await subscribed(ns, 0, 3000);
    const droppedAfter = performance.now() - lastLeft;
    assert.ok(droppedAfter >= 700 && droppedAfter < 2500,
      `the subscription was dropped ${droppedAfter.toFixed(0)} ms after the last waiter left (expected ~1000)`);

    // A later waiter subscribes again.
    held = await holder.acquire(key);
    waiter = d.acquire(key, { waitTimeoutMs: 10_000 });
    await subscribed(ns, 1);
    assert.equal(await held.release(), true);
    lease = await within(5000, waiter, 'the later waiter');
    assert.equal(await lease.release(), true);

    // Shutdown closes it too.
    await d.shutdown();
    await subscribed(ns, 0, 1000);
  });

  test('a release published by hand (another driver, e.g. the TypeScript one) wakes the waiter at once', async (t) => {
    const ns = uniqueNamespace('foreign-publish');
    const d = driverFor(t, ns, SLOW_POLLS);
    const key = keyName('foreign-publish');
    const lockKey = lockKeyOf(ns, key);
    assert.equal(await redis.command('SET', lockKey, 'a-foreign-owner-token', 'PX', '60000'), 'OK');
    secrets.tokens.add('a-foreign-owner-token');

    const waiting = d.acquire(key, { waitTimeoutMs: 10_000 });
    await subscribed(ns);
    await quiet(); // asleep for its 5000 ms safety interval

    const released = performance.now();
    assert.equal(await redis.command('DEL', lockKey), 1);
    assert.equal(await redis.command('PUBLISH', channelOf(ns), sha256hex(key)), 1, 'our backend is the one subscriber');
    const lease = await within(5000, waiting, 'the waiter');
    const took = performance.now() - released;
    assert.ok(took < WOKEN_WITHIN_MS, `woke ${took.toFixed(0)} ms after the PUBLISH; the safety poll is 5000 ms`);
    assert.equal(lease.valid, true);
    assert.notEqual(await redis.command('GET', lockKey), 'a-foreign-owner-token');
    assert.equal(await lease.release(), true);
  });

  test('a release by another driver instance on the namespace wakes the waiter at once', async (t) => {
    const ns = uniqueNamespace('other-instance');
    const other = driverFor(t, ns); // stands for another process
    const d = driverFor(t, ns, SLOW_POLLS);
    const key = keyName('other-instance');
    const held = await other.acquire(key);
    await tokenOf(ns, key);

    const waiting = d.acquire(key, { waitTimeoutMs: 10_000 });
    await subscribed(ns);
    await quiet();

    const released = performance.now();
    assert.equal(await held.release(), true);
    const lease = await within(5000, waiting, 'the waiter');
    const took = performance.now() - released;
    assert.ok(took < WOKEN_WITHIN_MS, `woke ${took.toFixed(0)} ms after the other instance released; the safety poll is 5000 ms`);
    assert.ok(BigInt(lease.fence) > BigInt(held.fence));
    assert.equal(await lease.release(), true);
  });

  test('a release by the same backend wakes its own waiter through the notification', async (t) => {
    const ns = uniqueNamespace('same-backend');
    const d = driverFor(t, ns, SLOW_POLLS);
    const key = keyName('same-backend');
    const held = await d.acquire(key);
    await tokenOf(ns, key);

    const waiting = d.acquire(key, { waitTimeoutMs: 10_000 });
    await subscribed(ns);
    await quiet();

    const released = performance.now();
    assert.equal(await held.release(), true);
    const lease = await within(5000, waiting, 'the waiter');
    const took = performance.now() - released;
    assert.ok(took < WOKEN_WITHIN_MS, `woke ${took.toFixed(0)} ms after its own backend released; the safety poll is 5000 ms`);
    assert.ok(BigInt(lease.fence) > BigInt(held.fence));
    assert.equal(await lease.release(), true);
  });

  test("a server that refuses SUBSCRIBE logs debug LOCK_NOTIFY_UNAVAILABLE 'unsupported' once, and waiters poll", {
    skip: external && 'needs an ACL change on a throwaway server',
  }, async (t) => {
    await redis.command('ACL', 'SETUSER', 'locker', 'on', '>pw', '~*', 'resetchannels', '+@all', '-subscribe');
    t.after(() => redis.command('ACL', 'DELUSER', 'locker'));
    const ns = uniqueNamespace('unsupported');
    ran.unsupported = true;
    const log = recorder();
    const url = `redis://locker:pw@127.0.0.1:${redis.port}`;
    const d = driverFor(t, ns, { pollIntervalMs: 20 }, { url, logger: log });
    const holder = driverFor(t, ns);
    const key = keyName('unsupported');

    for (let round = 0; round < 3; round++) {
      const held = await holder.acquire(key);
      await tokenOf(ns, key);
      const base = await scriptCalls(redis);
      const waiting = d.acquire(key, { waitTimeoutMs: 5000 });
      // Really waiting: it found the key busy and asked again.
      await eventually('the waiter to poll', async () => (await scriptCalls(redis)) >= base + 2);
      if (round === 0) await eventually('the debug event', () => log.notifyEvents('debug').length > 0);
      const released = performance.now();
      assert.equal(await held.release(), true);
      const lease = await within(3000, waiting, `round ${round}: the polling waiter`);
      const took = performance.now() - released;
      assert.ok(took < 1000, `round ${round}: a 20 ms poller got the lock ${took.toFixed(0)} ms after the release`);
      await tokenOf(ns, key);
      assert.equal(await lease.release(), true);
    }

    const debug = log.notifyEvents('debug');
    assert.equal(debug.length, 1, 'logged once, however many waits');
    assert.deepEqual(debug[0].fields, { code: 'LOCK_NOTIFY_UNAVAILABLE', reason: 'unsupported' });
    assert.equal(typeof debug[0].msg, 'string');
    assert.deepEqual(log.entries.filter((e) => e.level === 'warn' || e.level === 'error'), [], 'no warn or error');
    assert.equal(await subscribers(ns), 0);
  });
});

// ------------------------------------------------------------ a lost subscription ----

describe('a failed subscription', () => {
  test("a killed subscription logs warn LOCK_NOTIFY_UNAVAILABLE 'failed' once, waiters switch to pollIntervalMs, and subscribe again after 5 s", {
    skip: external && 'needs CLIENT KILL on a throwaway server',
  }, async (t) => {
    const ns = uniqueNamespace('failed');
    ran.failed = true;
    const log = recorder();
    const pollIntervalMs = 20;
    const holder = driverFor(t, ns);
    const d = driverFor(t, ns, { pollIntervalMs, notifyPollIntervalMs: 5000 }, { logger: log });
    const key = keyName('failed');
    const other = keyName('failed-other');
    const held = await holder.acquire(key);
    const heldOther = await holder.acquire(other);
    await tokenOf(ns, key);
    await tokenOf(ns, other);

    const waiting = d.acquire(key, { waitTimeoutMs: 8000 });
    const spanning = d.acquire(other, { waitTimeoutMs: 1500 }); // waits across the failure
    const spanningStarted = performance.now();
    await subscribed(ns);
    await quiet(); // both asleep for notifyPollIntervalMs (5000 ms)

    const killed = await redis.command('CLIENT', 'KILL', 'TYPE', 'pubsub');
    assert.ok(killed >= 1, 'the subscribe connection was killed');
    await eventually('the warn event', () => log.notifyEvents('warn').length > 0);
    const failedSeen = performance.now();
    const [warn] = log.notifyEvents('warn');
    assert.equal(warn.fields.code, 'LOCK_NOTIFY_UNAVAILABLE');
    assert.equal(warn.fields.reason, 'failed');
    assert.equal(typeof warn.msg, 'string');
    const { cause } = warn.fields;
    assert.ok(cause instanceof Error, 'cause is an Error');
    assert.equal(cause.name, 'RedisError');
    assert.equal(cause.plugin, 'dokebi-redis');
    assert.ok(['CONNECTION_FAILED', 'CONNECTION_LOST', 'COMMAND_TIMEOUT', 'COMMAND_REJECTED', 'UNEXPECTED_REPLY'].includes(cause.code),
      `cause.code ${cause.code}`);
    assert.ok(['not-submitted', 'unknown', 'rejected'].includes(cause.outcome), `cause.outcome ${cause.outcome}`);
    assert.equal(typeof cause.retryable, 'boolean');
    if (['CONNECTION_FAILED', 'CONNECTION_LOST', 'COMMAND_TIMEOUT'].includes(cause.code)) {
      assert.equal(cause.retryable, true, 'a transient failure is retryable');
      assert.equal(cause.status, 503);
    }

    // The waiter asleep for 5000 ms moved to the 20 ms poll: it notices the release at once.
    const released = performance.now();
    assert.equal(await held.release(), true);
    const lease = await within(5000, waiting, 'the waiter after the failure');
    const took = performance.now() - released;
    assert.ok(took < 750, `got the lock ${took.toFixed(0)} ms after the release; pollIntervalMs is ${pollIntervalMs}, notifyPollIntervalMs 5000`);
    assert.equal(await lease.release(), true);

    // No waiter waits past its waitTimeoutMs: neither the one waiting across the failure...
    assertLockError(await within(5000, failure(spanning), 'the spanning waiter'), 'WAIT_TIMEOUT');
    const spanned = performance.now() - spanningStarted;
    assert.ok(spanned >= 1450 && spanned < 2300, `a 1500 ms wait ended after ${spanned.toFixed(0)} ms`);
    // ...nor a new one on a key that stays held.
    const started = performance.now();
    assertLockError(await within(5000, failure(d.acquire(other, { waitTimeoutMs: 300 })), 'the new waiter'), 'WAIT_TIMEOUT');
    const waited = performance.now() - started;
    assert.ok(waited >= 280 && waited < 1000, `a 300 ms wait ended after ${waited.toFixed(0)} ms`);

    // Within 5 s of the failure nobody subscribes again, and the warn was logged once.
    assert.equal(await subscribers(ns), 0);
    assert.equal(log.notifyEvents('warn').length, 1, 'one warn for one failure');
    assert.deepEqual(log.notifyEvents('debug'), [], 'not reported as unsupported');

    // Waiters busy more than 5 s after the failure subscribe again, and are woken by it.
    const resubscribeAt = failedSeen + 5100;
    await sleep(Math.max(0, resubscribeAt - performance.now())); // the description's 5 s; nothing to await
    const later = d.acquire(other, { waitTimeoutMs: 10_000 });
    await subscribed(ns);
    await quiet();
    const releasedOther = performance.now();
    assert.equal(await heldOther.release(), true);
    const laterLease = await within(5000, later, 'the waiter after resubscribing');
    const woke = performance.now() - releasedOther;
    assert.ok(woke < WOKEN_WITHIN_MS, `woke ${woke.toFixed(0)} ms after the release; notifyPollIntervalMs is 5000`);
    assert.equal(await laterLease.release(), true);
    assert.equal(log.notifyEvents('warn').length, 1, 'no new warn without a new failure');
  });
});

// ------------------------------------------------------------------- leaks ----

test('no log field or message holds a key, a token, the password or the address', () => {
  // Not vacuous: the events of the tests above are among what is searched.
  if (ran.unsupported) assert.ok(allLogs.some((e) => e.fields?.reason === 'unsupported'), 'the unsupported event was seen');
  if (ran.failed) assert.ok(allLogs.some((e) => e.fields?.reason === 'failed'), 'the failed event was seen');
  const url = new URL(redis.url);
  const hostPort = `${url.hostname}:${url.port || 6379}`;
  for (const entry of allLogs) {
    const cause = entry.fields?.cause;
    const text = [
      entry.msg,
      JSON.stringify(entry.fields),
      cause && JSON.stringify({ ...cause, message: cause.message, name: cause.name }),
    ].join('\n');
    for (const key of secrets.keys) assert.ok(!text.includes(key), `a log entry holds a key: ${text}`);
    for (const token of secrets.tokens) assert.ok(!text.includes(token), `a log entry holds a token: ${text}`);
    assert.ok(!/\bpw\b/.test(text) && !text.includes('locker'), `a log entry holds the credentials: ${text}`);
    assert.ok(!text.includes(hostPort) && !text.includes(url.hostname) && !text.includes(`:${url.port}`),
      `a log entry holds the address: ${text}`);
    assert.ok(!text.includes('redis://'), `a log entry holds a URL: ${text}`);
  }
});
