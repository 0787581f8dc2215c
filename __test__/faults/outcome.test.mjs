// Fault matrix (OPS-002), the rows about *whether a command took effect*: Redis down before
// the command, a reply stalled past commandTimeoutMs, a connection cut in the middle of a
// reply, latency, and connections cut while waiters wait. Every fault is injected by the
// TCP proxy of helpers/proxy.mjs between the driver and a real redis-server; every check
// goes through the public JS API, and attempts are counted both at the proxy (what the
// driver sent) and at the server (MONITOR: what Redis ran).

import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  backend, eventually, failure, fenceKeyOf, lockKeyOf, uniqueNamespace, within,
} from '../helpers/lock.mjs';
import { proxyFor } from '../helpers/proxy.mjs';
import { external, startRedis } from '../helpers/redis.mjs';
import { assertRedisFailure, loadScripts, monitor, scriptCommands } from './support.mjs';

const { createRedisLockDriver } = createRequire(import.meta.url)('../../index.js');

const skip = external && 'needs throwaway redis-servers and a proxy (REDIS_URL is set)';
const COMMAND_TIMEOUT_MS = 250;
/** Long, so that "cleaned up by token" can only mean the driver deleted the key. */
const LONG_LEASE_MS = 20_000;

let redis;
before(async () => {
  if (external) return;
  redis = await startRedis();
  await loadScripts(redis); // faults aimed at a script's reply must not hit a NOSCRIPT instead
});
after(() => redis?.stop());


/** A driver through `proxy`, shut down (quickly) after the test. */
function driverVia(t, proxy, ns, extra = {}, connection = {}) {
  const d = createRedisLockDriver(
    { url: proxy.url, commandTimeoutMs: COMMAND_TIMEOUT_MS, connectTimeoutMs: 500, ...connection },
    backend(ns, { leaseMs: LONG_LEASE_MS, shutdownTimeoutMs: 500, ...extra }),
  );
  t.after(() => d.shutdown().catch(() => {}));
  return d;
}

/** Opens the driver's connection (so the fault hits an established one). */
async function warmUp(d) {
  const lease = await d.acquire(`warm-up-${Math.random()}`);
  assert.equal(await lease.release(), true);
}

async function monitorFor(t, server = redis) {
  const m = await monitor(server.port);
  t.after(() => m.close());
  return m;
}

const exists = (key) => redis.command('EXISTS', key);

// ------------------------------------------------------------------------------------

describe('Redis down before the command', () => {
  test('no connection can be opened: PROVIDER_FAILED, cause CONNECTION_FAILED not-submitted, retryable 503; nothing reached Redis', { skip }, async (t) => {
    const proxy = await proxyFor(t, redis.port);
    const m = await monitorFor(t);
    const ns = uniqueNamespace('down');
    const d = driverVia(t, proxy, ns);
    proxy.refuse();
    const started = performance.now();
    const err = await within(2000, failure(d.acquire('k', { waitTimeoutMs: 0 })), 'the acquire');
    assert.ok(performance.now() - started < 1000, 'fails fast');
    assertRedisFailure(assert, err, {
      lockCode: 'PROVIDER_FAILED', code: 'CONNECTION_FAILED', outcome: 'not-submitted', retryable: true,
    });
    assert.equal(proxy.count('EVALSHA') + proxy.count('EVAL'), 0, 'no script left the driver');
    assert.equal(scriptCommands(m.entries, 'acquire').length, 0, 'Redis ran no acquire');
    assert.equal(await exists(lockKeyOf(ns, 'k')), 0);
  });

  test('a waiting acquire rides it out: PROVIDER_FAILED when its wait ends, or the lock once Redis is reachable again', { skip }, async (t) => {
    const proxy = await proxyFor(t, redis.port);
    const ns = uniqueNamespace('down-wait');
    const d = driverVia(t, proxy, ns, { pollIntervalMs: 20 });
    proxy.refuse();
    const started = performance.now();
    const err = await within(3000, failure(d.acquire('k', { waitTimeoutMs: 300 })), 'the acquire');
    const took = performance.now() - started;
    assert.ok(took >= 280 && took < 1300, `a 300 ms wait ended after ${took.toFixed(0)} ms`);
    assertRedisFailure(assert, err, { lockCode: 'PROVIDER_FAILED', code: 'CONNECTION_FAILED', outcome: 'not-submitted', retryable: true });
    assert.ok(proxy.stats().refused >= 3, `it kept trying (${proxy.stats().refused} connects refused)`);

    const refusedBefore = proxy.stats().refused;
    const waiting = d.acquire('k', { waitTimeoutMs: 5000 });
    await eventually('the waiter to be refused again', () => proxy.stats().refused >= refusedBefore + 2);
    proxy.accept();
    const lease = await within(5000, waiting, 'the waiting acquire');
    assert.equal(lease.valid, true);
    assert.equal(await lease.release(), true);
  });

  /**
   * "Idle": the driver's I/O thread reads the FIN on its own schedule, and a command queued
   * in the same instant can be written before it does; that narrow window stays
   * OUTCOME_UNKNOWN (decision 0013) and is not what these rows are about. No public signal
   * says "the driver noticed", so the dead connection is left idle for a moment.
   */
  const leftIdle = () => sleep(100);

  test('a connection that died while idle: the next acquire was never sent, so it is PROVIDER_FAILED not-submitted', {
    skip,
  }, async (t) => {
    const proxy = await proxyFor(t, redis.port);
    const ns = uniqueNamespace('idle-dead');
    const d = driverVia(t, proxy, ns);
    await warmUp(d);
    // Redis (or the network path) goes away while the driver is idle, and stays away.
    const closed = new Promise((resolve) => proxy.events.once('close', resolve));
    proxy.refuse();
    proxy.killAll();
    await closed;
    await leftIdle();
    const sentBefore = proxy.commands.length;
    const err = await within(2000, failure(d.acquire('k', { waitTimeoutMs: 0 })), 'the acquire');
    assert.equal(proxy.commands.length, sentBefore, 'nothing reached the proxy: the command was surely not submitted');
    assertRedisFailure(assert, err, {
      lockCode: 'PROVIDER_FAILED', code: 'CONNECTION_FAILED', outcome: 'not-submitted', retryable: true,
    });
  });

  test('a connection that died while idle, Redis reachable again: a waiting acquire gets the lock', {
    skip,
  }, async (t) => {
    const proxy = await proxyFor(t, redis.port);
    const ns = uniqueNamespace('idle-dead-wait');
    const d = driverVia(t, proxy, ns);
    await warmUp(d);
    const closed = new Promise((resolve) => proxy.events.once('close', resolve));
    proxy.killAll(); // e.g. a Redis restart or an idle-timeout: the server is back at once
    await closed;
    await leftIdle();
    const lease = await within(3000, d.acquire('k', { waitTimeoutMs: 2000 }), 'the acquire');
    assert.equal(lease.valid, true);
    assert.equal(await lease.release(), true);
  });
});

// ------------------------------------------------------------------------------------

describe('stall after write', () => {
  test('a reply held past commandTimeoutMs: OUTCOME_UNKNOWN at commandTimeoutMs, one attempt only, no lease, and the late acquire is released by token once replies flow', { skip }, async (t) => {
    const proxy = await proxyFor(t, redis.port);
    const m = await monitorFor(t);
    const ns = uniqueNamespace('stall');
    const key = 'stalled-key';
    const lockKey = lockKeyOf(ns, key);
    const d = driverVia(t, proxy, ns);
    await warmUp(d);

    proxy.stallAfterWrite();
    const started = performance.now();
    const err = await within(3000, failure(d.acquire(key)), 'the acquire'); // default 5 s wait
    const took = performance.now() - started;
    assertRedisFailure(assert, err, { lockCode: 'OUTCOME_UNKNOWN', code: 'COMMAND_TIMEOUT', outcome: 'unknown', retryable: true });
    assert.ok(took >= COMMAND_TIMEOUT_MS - 10 && took < COMMAND_TIMEOUT_MS + 700, `OUTCOME_UNKNOWN after ${took.toFixed(0)} ms`);

    // Redis ran it (the reply is what was held): the key is ours in Redis right now. (The
    // driver's releases over fresh connections cannot get through while every reply is
    // held: their handshakes wait too.)
    await m.until((e) => scriptCommands([e], 'acquire', lockKey).length === 1);
    assert.equal(await exists(lockKey), 1, 'the acquire took effect in Redis');
    // Never retried: nothing more within several commandTimeoutMs (absence cannot be awaited).
    await sleep(3 * COMMAND_TIMEOUT_MS);
    assert.equal(scriptCommands(proxy.commands, 'acquire', lockKey).length, 1, 'the driver sent one acquire');
    assert.equal(scriptCommands(m.entries, 'acquire', lockKey).length, 1, 'Redis ran exactly one acquire');

    const releasedAt = performance.now();
    proxy.release();
    await eventually('the late acquire to be released by token', async () => (await exists(lockKey)) === 0, { timeoutMs: 3000 });
    const cleaned = performance.now() - releasedAt;
    assert.ok(cleaned < LONG_LEASE_MS / 4, `cleaned up ${cleaned.toFixed(0)} ms after replies flowed; leaseMs ${LONG_LEASE_MS}`);
    // By a release script (MONITOR's stream may trail the key's removal by a moment).
    await m.until((e) => scriptCommands([e], 'release', lockKey).length === 1);
    assert.equal(await exists(fenceKeyOf(ns, key)), 1, 'the counter the late acquire drew stays');
    assert.equal(scriptCommands(m.entries, 'acquire', lockKey).length, 1, 'still one acquire');

    const lease = await d.acquire(key, { waitTimeoutMs: 0 });
    assert.equal(lease.valid, true);
    assert.equal(await lease.release(), true);
  });

  test('waitTimeoutMs 0 is one real attempt too: OUTCOME_UNKNOWN at commandTimeoutMs, not LOCK_BUSY', { skip }, async (t) => {
    const proxy = await proxyFor(t, redis.port);
    const ns = uniqueNamespace('stall-zero');
    const d = driverVia(t, proxy, ns);
    await warmUp(d);
    proxy.stallAfterWrite();
    const err = await within(3000, failure(d.acquire('k', { waitTimeoutMs: 0 })), 'the acquire');
    assertRedisFailure(assert, err, { lockCode: 'OUTCOME_UNKNOWN', code: 'COMMAND_TIMEOUT', outcome: 'unknown' });
    assert.equal(scriptCommands(proxy.commands, 'acquire', lockKeyOf(ns, 'k')).length, 1);
    proxy.release();
    await eventually('the late acquire to be released', async () => (await exists(lockKeyOf(ns, 'k'))) === 0);
  });

  test('a reply lost for good (dropped): the acquire that took effect is still released by token, well before leaseMs', {
    skip,
  }, async (t) => {
    const proxy = await proxyFor(t, redis.port);
    const ns = uniqueNamespace('drop');
    const lockKey = lockKeyOf(ns, 'k');
    const d = driverVia(t, proxy, ns);
    await warmUp(d);
    proxy.stallAfterWrite({ drop: true });
    const err = await within(3000, failure(d.acquire('k')), 'the acquire');
    assertRedisFailure(assert, err, { lockCode: 'OUTCOME_UNKNOWN', code: 'COMMAND_TIMEOUT', outcome: 'unknown' });
    assert.equal(await exists(lockKey), 1, 'the acquire took effect in Redis');
    proxy.release(); // new connections work again; the lost reply is gone for good
    await eventually('the orphan lock to be released by token', async () => (await exists(lockKey)) === 0, { timeoutMs: 2500 });
  });

  test('a held reply that ends in a connection reset: the acquire that took effect is still released by token, well before leaseMs', {
    skip,
  }, async (t) => {
    const proxy = await proxyFor(t, redis.port);
    const m = await monitorFor(t);
    const ns = uniqueNamespace('stall-reset');
    const lockKey = lockKeyOf(ns, 'k');
    const d = driverVia(t, proxy, ns);
    await warmUp(d);
    proxy.stallAfterWrite();
    const err = await within(3000, failure(d.acquire('k')), 'the acquire');
    assertRedisFailure(assert, err, { lockCode: 'OUTCOME_UNKNOWN', code: 'COMMAND_TIMEOUT', outcome: 'unknown' });
    await m.until((e) => scriptCommands([e], 'acquire', lockKey).length === 1);
    assert.equal(await exists(lockKey), 1, 'the acquire took effect in Redis');
    // The late reply never comes: its connection is reset (an error, not a "busy"), and
    // the held replies of every other connection are gone with it.
    proxy.killAll({ reset: true });
    proxy.release();
    const resetAt = performance.now();
    await eventually('the orphan lock to be released by token', async () => (await exists(lockKey)) === 0, { timeoutMs: 3000 });
    const cleaned = performance.now() - resetAt;
    assert.ok(cleaned < LONG_LEASE_MS / 4, `cleaned up ${cleaned.toFixed(0)} ms after the reset; leaseMs ${LONG_LEASE_MS}`);
  });
});

// ------------------------------------------------------------------------------------

describe('connection cut mid-reply', () => {
  test('an acquire reply cut after 3 bytes: OUTCOME_UNKNOWN CONNECTION_LOST, one attempt, no lease, released by token at once', { skip }, async (t) => {
    const proxy = await proxyFor(t, redis.port);
    const m = await monitorFor(t);
    const ns = uniqueNamespace('cut');
    const lockKey = lockKeyOf(ns, 'k');
    const d = driverVia(t, proxy, ns);
    await warmUp(d);
    const cut = proxy.cutMidReply({ after: 'EVALSHA', bytes: 3 });
    const err = await within(3000, failure(d.acquire('k')), 'the acquire'); // default 5 s wait
    assertRedisFailure(assert, err, { lockCode: 'OUTCOME_UNKNOWN', code: 'CONNECTION_LOST', outcome: 'unknown', retryable: true });
    const info = await cut;
    assert.ok(info.of > 3, 'the reply was cut in its middle');
    await eventually('the lock to be released by token', async () => (await exists(lockKey)) === 0, { timeoutMs: 3000 });
    assert.equal(scriptCommands(m.entries, 'acquire', lockKey).length, 1, 'Redis ran exactly one acquire: never retried');
    assert.ok(scriptCommands(m.entries, 'release', lockKey).length >= 1);
    const lease = await d.acquire('k', { waitTimeoutMs: 0 });
    assert.equal(await lease.release(), true);
  });

  test('cut at every byte of a fence reply: never a lease, never a truncated fence, always cleaned up', { skip }, async (t) => {
    const proxy = await proxyFor(t, redis.port);
    const ns = uniqueNamespace('cut-every');
    const d = driverVia(t, proxy, ns);
    await warmUp(d);
    // A fence reply is `$<n>\r\n<n digits>\r\n`: find its length with one uncut acquire.
    const probe = await d.acquire('probe');
    const replyLength = `$${probe.fence.length}\r\n${probe.fence}\r\n`.length;
    assert.equal(await probe.release(), true);
    const fences = [BigInt(probe.fence)];
    for (let bytes = 1; bytes < replyLength; bytes++) {
      const key = `k${bytes}`;
      const cut = proxy.cutMidReply({ after: 'EVALSHA', bytes });
      const err = await within(3000, failure(d.acquire(key)), `the acquire cut after ${bytes} bytes`);
      assert.equal(err.code, 'OUTCOME_UNKNOWN', `cut after ${bytes} of ${replyLength} bytes: ${err.message}`);
      assert.equal((await cut).forwarded, bytes);
      await eventually(`the lock cut after ${bytes} bytes to be released`, async () => (await exists(lockKeyOf(ns, key))) === 0, { timeoutMs: 3000 });
      const next = await d.acquire(key, { waitTimeoutMs: 0 });
      assert.ok(BigInt(next.fence) > BigInt(fences.at(-1)), 'fences keep rising');
      fences.push(BigInt(next.fence));
      assert.equal(await next.release(), true);
    }
  });

  test('a renew whose reply is cut or held: OUTCOME_UNKNOWN, and the lease stays invalid when a late confirmation arrives', { skip }, async (t) => {
    const proxy = await proxyFor(t, redis.port);
    const ns = uniqueNamespace('renew-faults');
    const d = driverVia(t, proxy, ns);

    const cutLease = await d.acquire('cut');
    const cut = proxy.cutMidReply({ after: 'EVALSHA', bytes: 1 });
    const cutErr = await within(3000, failure(cutLease.renew()), 'the renew');
    await cut;
    assertRedisFailure(assert, cutErr, { lockCode: 'OUTCOME_UNKNOWN', code: 'CONNECTION_LOST', outcome: 'unknown' });
    assert.equal(cutLease.valid, false);
    assert.equal(cutLease.remainingMs, 0);
    assert.equal((await failure(cutLease.renew())).code, 'LEASE_EXPIRED', 'never valid again');

    const heldLease = await d.acquire('held');
    proxy.stallAfterWrite();
    const heldErr = await within(3000, failure(heldLease.renew()), 'the renew');
    assertRedisFailure(assert, heldErr, { lockCode: 'OUTCOME_UNKNOWN', code: 'COMMAND_TIMEOUT', outcome: 'unknown' });
    assert.equal(heldLease.valid, false);
    const delivered = proxy.stats().bytesDown;
    proxy.release(); // the renew's "1" arrives now, after the caller was told OUTCOME_UNKNOWN
    await eventually('the late reply to be delivered', () => proxy.stats().bytesDown > delivered);
    assert.equal(heldLease.valid, false, 'a late confirmation does not bring it back');
    assert.equal(heldLease.remainingMs, 0);
  });

  test('a release whose reply is cut: OUTCOME_UNKNOWN, the lease is invalid, and shutdown confirms the key is gone', { skip }, async (t) => {
    const proxy = await proxyFor(t, redis.port);
    const ns = uniqueNamespace('release-cut');
    const d = driverVia(t, proxy, ns);
    const lease = await d.acquire('k');
    const cut = proxy.cutMidReply({ after: 'EVALSHA', bytes: 2 });
    const err = await within(3000, failure(lease.release()), 'the release');
    await cut;
    assertRedisFailure(assert, err, { lockCode: 'OUTCOME_UNKNOWN', code: 'CONNECTION_LOST', outcome: 'unknown' });
    assert.equal(lease.valid, false);
    assert.equal(await exists(lockKeyOf(ns, 'k')), 0, 'the release ran in Redis');
    await within(3000, d.shutdown(), 'shutdown'); // retries the unconfirmed release by token: resolves
  });
});

// ------------------------------------------------------------------------------------

describe('latency', () => {
  test('deadlines count from submission: with 100 ms each way, remainingMs starts at most leaseMs - 200 and never exceeds the PTTL in Redis', { skip }, async (t) => {
    const proxy = await proxyFor(t, redis.port);
    const ns = uniqueNamespace('latency');
    // The 200 ms round trip must not meet commandTimeoutMs: 250 ms failed it on a busy
    // 2-core machine (issue 21); this test is about where deadlines count from.
    const d = driverVia(t, proxy, ns, { leaseMs: 2000 }, { commandTimeoutMs: 1000 });
    await warmUp(d);
    proxy.latency(100);
    const lease = await d.acquire('k');
    const remaining = lease.remainingMs;
    const pttl = await redis.command('PTTL', lockKeyOf(ns, 'k')); // asked directly, after the lease arrived
    assert.ok(remaining <= 2000 - 200 + 15, `remainingMs ${remaining} right after a 2×100 ms round trip`);
    assert.ok(remaining > 1000, `remainingMs ${remaining}`);
    assert.ok(pttl >= lease.remainingMs, `the local estimate (${lease.remainingMs}) must not outlive Redis (PTTL ${pttl})`);
    proxy.latency(0);
    assert.equal(await lease.release(), true);
  });

  test('latency past commandTimeoutMs: OUTCOME_UNKNOWN, and the late acquire is released once its reply lands', { skip }, async (t) => {
    const proxy = await proxyFor(t, redis.port);
    const ns = uniqueNamespace('latency-slow');
    const d = driverVia(t, proxy, ns);
    await warmUp(d);
    proxy.latency(150); // a 300 ms round trip against a 250 ms commandTimeoutMs
    const err = await within(3000, failure(d.acquire('k')), 'the acquire');
    assertRedisFailure(assert, err, { lockCode: 'OUTCOME_UNKNOWN', code: 'COMMAND_TIMEOUT', outcome: 'unknown' });
    await eventually('the acquire to run in Redis', async () => (await redis.command('EXISTS', fenceKeyOf(ns, 'k'))) === 1);
    await eventually('the late acquire to be released', async () => (await exists(lockKeyOf(ns, 'k'))) === 0, { timeoutMs: 4000 });
  });
});

// ------------------------------------------------------------------------------------

describe('connections cut while waiters wait', () => {
  test('every waiter settles within its wait (+ commandTimeoutMs), none with a lease it does not hold', { skip }, async (t) => {
    const proxy = await proxyFor(t, redis.port);
    const ns = uniqueNamespace('cut-waiters');
    const holder = createRedisLockDriver(redis.url, backend(ns));
    t.after(() => holder.shutdown().catch(() => {}));
    const d = driverVia(t, proxy, ns, { pollIntervalMs: 20, notifyPollIntervalMs: 100 });
    const held = await holder.acquire('k');
    const waitMs = 800;
    const started = performance.now();
    const waiters = [0, 1, 2].map(() => d.acquire('k', { waitTimeoutMs: waitMs }).then(
      (lease) => ({ lease, at: performance.now() }), (err) => ({ err, at: performance.now() })));
    await eventually('the waiters to subscribe', async () => (await redis.command('PUBSUB', 'NUMSUB', `${ns}:lock-released`))[1] === 1);
    proxy.killAll(); // the command and the subscribe connection
    const results = await within(5000, Promise.all(waiters), 'the waiters');
    for (const r of results) {
      assert.ok(r.at - started < waitMs + COMMAND_TIMEOUT_MS + 400, `settled after ${(r.at - started).toFixed(0)} ms`);
      assert.ok(r.err, 'the key stayed held: nobody may get it');
      assert.ok(['WAIT_TIMEOUT', 'OUTCOME_UNKNOWN', 'PROVIDER_FAILED'].includes(r.err.code), r.err.code);
    }
    assert.equal(held.valid, true);
    assert.equal(await held.release(), true);
  });

  test('waiters whose connections were cut (Redis fine) keep waiting and get the lock when it is released', {
    skip,
  }, async (t) => {
    const proxy = await proxyFor(t, redis.port);
    const ns = uniqueNamespace('cut-waiters-recover');
    const holder = createRedisLockDriver(redis.url, backend(ns));
    t.after(() => holder.shutdown().catch(() => {}));
    const d = driverVia(t, proxy, ns, { pollIntervalMs: 20, notifyPollIntervalMs: 100 });
    const held = await holder.acquire('k');
    const waiters = [0, 1, 2].map(() => d.acquire('k', { waitTimeoutMs: 4000 }).then(async (lease) => {
      assert.equal(lease.valid, true);
      return lease.release();
    }, (err) => err));
    await eventually('the waiters to subscribe', async () => (await redis.command('PUBSUB', 'NUMSUB', `${ns}:lock-released`))[1] === 1);
    const accepted = proxy.stats().accepted; // the command and the subscribe connection
    proxy.killAll();
    await eventually('the driver to reconnect after the cut', () => proxy.stats().accepted > accepted);
    assert.equal(await held.release(), true);
    const settled = await within(8000, Promise.all(waiters), 'the waiters');
    // Only the first waiter of the line asks Redis. If its attempt was on the wire when the
    // connections were cut (the check once more when the subscription was confirmed, or its
    // safety poll), its outcome is unknown and its wait ends: the contract's OUTCOME_UNKNOWN,
    // which a busy machine made likely (issue 21's soak). Every other waiter keeps waiting
    // and gets the lock.
    const unknown = settled.filter((r) => r instanceof Error);
    for (const err of unknown) assert.equal(err.code, 'OUTCOME_UNKNOWN', err.message);
    assert.ok(unknown.length <= 1, `${unknown.length} waiters ended OUTCOME_UNKNOWN; only one asks Redis at a time`);
    assert.deepEqual(settled.filter((r) => !(r instanceof Error)), Array(3 - unknown.length).fill(true));
  });
});
