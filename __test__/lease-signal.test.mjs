// lease.signal and lease.keepAlive (issue 24; decisions 0150–0153): the signal aborts the
// moment the lease stops being valid, with a LockError saying why; keep-alive renews on the
// addon's threads, so a blocked JS thread does not make renewals late.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createRequire } from 'node:module';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { eventually, failure, lockKeyOf, runNodeChild, scriptCalls, thrown, uniqueNamespace, within, driverFor as sharedDriverFor } from './helpers/lock.mjs';
import { external, startRedis } from './helpers/redis.mjs';

const require = createRequire(import.meta.url);
const PACKAGE = require.resolve('../index.js');
const { createRedisLockDriver, LockError } = require('../index.js');

let redis;
before(async () => { redis = await startRedis(); });
after(() => redis?.stop());

const driverFor = (t, namespace, extra, connection = redis.url) => sharedDriverFor(t, createRedisLockDriver, connection, namespace, extra);

/** Resolves with the signal's reason once it aborted (at once if it already did). */
function aborted(signal) {
  if (signal.aborted) return Promise.resolve(signal.reason);
  return once(signal, 'abort').then(() => signal.reason);
}

/** Blocks the JS thread for `ms` (a stalled event loop, as a long synchronous task makes it). */
function block(ms) {
  const end = performance.now() + ms;
  while (performance.now() < end) { /* busy */ }
}

function assertReason(reason, code) {
  assert.ok(reason instanceof LockError, `reason is a LockError: ${reason}`);
  assert.equal(reason.name, 'LockError');
  assert.equal(reason.code, code);
}

describe('lease.signal', () => {
  test('is one AbortSignal per lease, not aborted while the lease is valid', async (t) => {
    const d = driverFor(t, uniqueNamespace('sig'));
    const lease = await d.acquire('k');
    const { signal } = lease;
    assert.ok(signal instanceof AbortSignal);
    assert.equal(lease.signal, signal, 'the same signal at every read');
    assert.equal(signal.aborted, false);
    assert.equal(lease.valid, true);
    await lease.release();
  });

  test('release() aborts it synchronously, with LEASE_EXPIRED', async (t) => {
    const d = driverFor(t, uniqueNamespace('sig-release'));
    const lease = await d.acquire('k');
    const { signal } = lease;
    let heard;
    signal.addEventListener('abort', () => { heard = lease.valid; });
    const releasing = lease.release();
    assert.equal(signal.aborted, true, 'aborted within the release() call');
    assert.equal(heard, false, 'valid already false when the abort listener runs');
    assertReason(signal.reason, 'LEASE_EXPIRED');
    assert.equal(await releasing, true);
    assertReason((await d.acquire('k2').then((l) => { l.release(); return l.signal; })).reason, 'LEASE_EXPIRED');
  });

  test('a signal first read after release() is already aborted', async (t) => {
    const d = driverFor(t, uniqueNamespace('sig-late'));
    const lease = await d.acquire('k');
    await lease.release();
    assert.equal(lease.signal.aborted, true);
    assertReason(lease.signal.reason, 'LEASE_EXPIRED');
  });

  test('the local deadline aborts it with LEASE_EXPIRED, and valid is false by then', async (t) => {
    const d = driverFor(t, uniqueNamespace('sig-deadline'), { leaseMs: 150 });
    const lease = await d.acquire('k');
    const { signal } = lease;
    const reason = await within(5000, aborted(signal), 'the abort at the deadline');
    assertReason(reason, 'LEASE_EXPIRED');
    assert.equal(lease.valid, false);
    assert.equal(lease.remainingMs, 0);
  });

  test('when the deadline passes while the JS thread is blocked, reading valid or remainingMs aborts the signal at once', async (t) => {
    const d = driverFor(t, uniqueNamespace('sig-blocked'), { leaseMs: 100 });
    for (const read of ['valid', 'remainingMs', 'signal']) {
      const lease = await d.acquire(`k-${read}`);
      const { signal } = lease;
      // The deadline (100 ms from the acquire's submission) passes while the thread is
      // blocked, so the deadline timer cannot run; only the read below can abort the signal.
      block(250);
      assert.equal(signal.aborted, false, 'nothing ran while the thread was blocked');
      if (read === 'valid') assert.equal(lease.valid, false);
      if (read === 'remainingMs') assert.equal(lease.remainingMs, 0);
      if (read === 'signal') assert.equal(lease.signal, signal);
      assert.equal(signal.aborted, true, `aborted once ${read} was read`);
      assertReason(signal.reason, 'LEASE_EXPIRED');
    }
  });

  test('a renew that finds another owner aborts it with LEASE_LOST', async (t) => {
    const ns = uniqueNamespace('sig-lost');
    const d = driverFor(t, ns);
    const lease = await d.acquire('k');
    const { signal } = lease;
    await redis.command('SET', lockKeyOf(ns, 'k'), 'someone-else');
    const err = await failure(lease.renew());
    assert.equal(err.code, 'LEASE_LOST');
    assert.equal(signal.aborted, true, 'aborted by the time renew() rejects');
    assertReason(signal.reason, 'LEASE_LOST');
    assert.equal(lease.valid, false);
  });

  test('a renew whose outcome is unknown aborts it with OUTCOME_UNKNOWN and the RedisError as cause', { skip: external && 'pauses the server' }, async (t) => {
    const d = driverFor(t, uniqueNamespace('sig-unknown'), {}, { url: redis.url, commandTimeoutMs: 300 });
    const lease = await d.acquire('k');
    const { signal } = lease;
    await redis.pause();
    try {
      const err = await failure(lease.renew());
      assert.equal(err.code, 'OUTCOME_UNKNOWN');
    } finally {
      await redis.resume();
    }
    assert.equal(signal.aborted, true);
    assertReason(signal.reason, 'OUTCOME_UNKNOWN');
    assert.equal(signal.reason.cause?.name, 'RedisError');
    assert.equal(signal.reason.cause?.outcome, 'unknown');
  });

  test('shutdown aborts it with SHUT_DOWN, also when read only afterwards', async (t) => {
    const d = driverFor(t, uniqueNamespace('sig-shutdown'));
    const watched = await d.acquire('a');
    const unread = await d.acquire('b');
    const { signal } = watched;
    const reason = aborted(signal);
    await d.shutdown();
    assertReason(await within(5000, reason, 'the abort by shutdown'), 'SHUT_DOWN');
    assert.equal(watched.valid, false);
    assert.equal(unread.signal.aborted, true);
    assertReason(unread.signal.reason, 'SHUT_DOWN');
  });

  test('works where Node takes a signal: timers/promises and AbortSignal.any', async (t) => {
    const d = driverFor(t, uniqueNamespace('sig-node'));
    const lease = await d.acquire('k');
    const waiting = failure(sleep(60_000, 'never', { signal: AbortSignal.any([lease.signal, AbortSignal.timeout(60_000)]) }));
    await lease.release();
    const err = await waiting;
    assert.equal(err.name, 'AbortError');
    assertReason(err.cause, 'LEASE_EXPIRED');
  });
});

describe('lease.keepAlive', () => {
  test('rejects bad values with INVALID_OPTIONS, naming the field, and starts nothing', async (t) => {
    const d = driverFor(t, uniqueNamespace('ka-options'), { leaseMs: 1000 });
    const lease = await d.acquire('k');
    const cases = [
      [undefined, /must be an object/],
      [null, /must be an object/],
      [{}, /maxHoldMs is required/],
      [{ maxHoldMs: 0 }, /maxHoldMs must be an integer/],
      [{ maxHoldMs: 1.5 }, /maxHoldMs must be an integer/],
      [{ maxHoldMs: '1000' }, /maxHoldMs must be an integer/],
      [{ maxHoldMs: 1000, everyMs: 0 }, /everyMs must be an integer from 1 to leaseMs - 1/],
      [{ maxHoldMs: 1000, everyMs: 1000 }, /everyMs must be an integer from 1 to leaseMs - 1/],
      [{ maxHoldMs: 1000, everyMs: 10.5 }, /everyMs/],
      [{ maxHoldMs: 1000, every: 10 }, /unknown field 'every'/],
    ];
    for (const [options, message] of cases) {
      const err = thrown(() => lease.keepAlive(options));
      assert.ok(err instanceof LockError);
      assert.equal(err.code, 'INVALID_OPTIONS', JSON.stringify(options));
      assert.match(err.message, message);
    }
    assert.equal(lease.keepAlive({ maxHoldMs: 1000, everyMs: 999 }), undefined);
    await lease.release();
  });

  test('on a lease that is no longer valid throws LEASE_EXPIRED', async (t) => {
    const d = driverFor(t, uniqueNamespace('ka-expired'), { leaseMs: 50 });
    const lease = await d.acquire('k');
    await eventually('the lease to expire', () => !lease.valid);
    assert.equal(thrown(() => lease.keepAlive({ maxHoldMs: 1000 })).code, 'LEASE_EXPIRED');
    const released = await d.acquire('k2');
    await released.release();
    assert.equal(thrown(() => released.keepAlive({ maxHoldMs: 1000 })).code, 'LEASE_EXPIRED');
  });

  test('keeps the lease past leaseMs and stops at release()', async (t) => {
    const d = driverFor(t, uniqueNamespace('ka-renews'), { leaseMs: 1000 });
    const lease = await d.acquire('k');
    lease.keepAlive({ maxHoldMs: 60_000, everyMs: 100 });
    const calls = await scriptCalls(redis);
    // Twelve renewals (each a script call) take 1.2 s: the lease outlives leaseMs.
    await eventually('renewals', async () => (await scriptCalls(redis)) >= calls + 12, { timeoutMs: 20_000 });
    assert.equal(lease.valid, true);
    assert.equal(lease.signal.aborted, false);
    await lease.release();
    const afterRelease = await scriptCalls(redis);
    await sleep(300);
    assert.equal(await scriptCalls(redis), afterRelease, 'no renewal after release()');
  });

  test('stops maxHoldMs after the call: the lease then runs out at its deadline (LEASE_EXPIRED)', async (t) => {
    const d = driverFor(t, uniqueNamespace('ka-max-hold'), { leaseMs: 500 });
    const lease = await d.acquire('k');
    const { signal } = lease;
    lease.keepAlive({ maxHoldMs: 600, everyMs: 100 });
    assertReason(await within(10_000, aborted(signal), 'the end after maxHoldMs'), 'LEASE_EXPIRED');
    assert.equal(signal.reason.message, "the lease's local deadline passed");
    assert.equal(lease.valid, false);
  });

  test('a second call replaces the first', async (t) => {
    const d = driverFor(t, uniqueNamespace('ka-replace'), { leaseMs: 200 });
    const lease = await d.acquire('k');
    lease.keepAlive({ maxHoldMs: 600_000, everyMs: 50 });
    lease.keepAlive({ maxHoldMs: 1, everyMs: 50 });
    // Had the first one gone on, the lease would never expire.
    assertReason(await within(10_000, aborted(lease.signal), 'the expiry'), 'LEASE_EXPIRED');
  });

  test('the first failed renewal ends the lease: the signal aborts with its error (LEASE_LOST)', async (t) => {
    const ns = uniqueNamespace('ka-lost');
    const d = driverFor(t, ns, { leaseMs: 1000 });
    const lease = await d.acquire('k');
    const { signal } = lease;
    lease.keepAlive({ maxHoldMs: 60_000, everyMs: 50 });
    await redis.command('DEL', lockKeyOf(ns, 'k'));
    assertReason(await within(5000, aborted(signal), 'the abort by a failed renewal'), 'LEASE_LOST');
    assert.equal(lease.valid, false);
    assert.equal(d.stats().errors.LEASE_LOST, 1);
  });

  test('a failed renewal whose signal was never read still leaves the lease invalid', async (t) => {
    const ns = uniqueNamespace('ka-lost-unread');
    const d = driverFor(t, ns, { leaseMs: 1000 });
    const lease = await d.acquire('k');
    lease.keepAlive({ maxHoldMs: 60_000, everyMs: 50 });
    await redis.command('DEL', lockKeyOf(ns, 'k'));
    await eventually('the lease to end', () => !lease.valid, { timeoutMs: 5000 });
    assertReason(lease.signal.reason, 'LEASE_LOST');
  });

  test('shutdown stops it and aborts the signal with SHUT_DOWN', async (t) => {
    const d = driverFor(t, uniqueNamespace('ka-shutdown'), { leaseMs: 200 });
    const lease = await d.acquire('k');
    lease.keepAlive({ maxHoldMs: 60_000, everyMs: 50 });
    const reason = aborted(lease.signal);
    await d.shutdown();
    assertReason(await within(5000, reason, 'the abort by shutdown'), 'SHUT_DOWN');
  });

  test('a JS thread blocked for longer than leaseMs does not lose the lease to a process waiting for it', async (t) => {
    const ns = uniqueNamespace('ka-blocked');
    // A renewal has leaseMs - everyMs = 500 ms to come back, ~100× a round trip here.
    const leaseMs = 600;
    const d = driverFor(t, ns, { leaseMs });
    const lease = await d.acquire('k');
    lease.keepAlive({ maxHoldMs: 60_000, everyMs: 100 });
    // Another process waits for the key, polling every 10 ms, and says when it got it.
    const child = spawn(process.execPath, ['--input-type=module', '-e', `
      import { createRequire } from 'node:module';
      const { createRedisLockDriver } = createRequire(process.env.LOCK_PACKAGE)(process.env.LOCK_PACKAGE);
      const d = createRedisLockDriver(process.env.LOCK_REDIS_URL,
        { driver: 'redis', connection: 'main', namespace: process.env.LOCK_NS, pollIntervalMs: 10, notifyPollIntervalMs: 10, waitTimeoutMs: 60000 });
      const busy = await d.acquire('k', { waitTimeoutMs: 0 }).then(() => 'got', (e) => e.code);
      console.log('first ' + busy);
      const lease = await d.acquire('k');
      console.log('got ' + Date.now());
      await lease.release();
      await d.shutdown();
    `], { env: { ...process.env, LOCK_PACKAGE: PACKAGE, LOCK_REDIS_URL: redis.url, LOCK_NS: ns }, stdio: ['ignore', 'pipe', 'inherit'] });
    const exited = once(child, 'exit');
    t.after(() => child.kill('SIGKILL'));
    let out = '';
    child.stdout.on('data', (chunk) => { out += chunk; });
    await eventually('the other process to find the key busy', () => out.includes('first '), { timeoutMs: 20_000 });
    assert.match(out, /first LOCK_BUSY/);
    // The other process is waiting now. Block this thread for 4 × leaseMs.
    block(4 * leaseMs);
    assert.equal(lease.valid, true, 'still valid after the blocked stretch');
    assert.equal(lease.signal.aborted, false);
    await lease.renew(); // Redis still holds our token: nobody took the key in between
    assert.doesNotMatch(out, /got/, 'the other process did not get the key while we held it');
    const releasedAt = Date.now();
    assert.equal(await lease.release(), true);
    await eventually('the other process to get the key', () => /got \d+/.test(out), { timeoutMs: 20_000 });
    const gotAt = Number(/got (\d+)/.exec(out)[1]);
    assert.ok(gotAt >= releasedAt, `the other got the key only after the release (${gotAt} < ${releasedAt})`);
    const [code] = await exited;
    assert.equal(code, 0);
  });
});

describe('process exit with signals and keep-alive', () => {
  const runChild = (source, ns, limitMs = 10_000) =>
    runNodeChild(source, { LOCK_PACKAGE: PACKAGE, LOCK_REDIS_URL: redis.url, LOCK_NS: ns }, limitMs);

  const prelude = `
    import { createRequire } from 'node:module';
    const { createRedisLockDriver } = createRequire(process.env.LOCK_PACKAGE)(process.env.LOCK_PACKAGE);
    const d = createRedisLockDriver(process.env.LOCK_REDIS_URL, { driver: 'redis', connection: 'main', namespace: process.env.LOCK_NS, leaseMs: 60000 });
  `;

  test('a process holding leases with signals read and keep-alive running exits by itself after shutdown', async () => {
    const r = await runChild(`${prelude}
      const a = await d.acquire('a');
      const b = await d.acquire('b');
      a.signal.addEventListener('abort', () => console.log('a ' + a.signal.reason.code));
      b.signal;
      a.keepAlive({ maxHoldMs: 600000 });
      await d.shutdown();
      console.log('done');
    `, uniqueNamespace('exit-shutdown'));
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /done/);
  });

  test('a process holding a lease with its signal read and keep-alive running, never shut down, exits by itself', async () => {
    const ns = uniqueNamespace('exit-held');
    const r = await runChild(`${prelude}
      const a = await d.acquire('a');
      a.signal.addEventListener('abort', () => {});
      a.keepAlive({ maxHoldMs: 600000, everyMs: 1000 });
      console.log('held');
    `, ns);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /held/);
    const pttl = await redis.command('PTTL', lockKeyOf(ns, 'a'));
    assert.ok(pttl > 0, `PTTL ${pttl}: left to its TTL`);
  });
});

describe('examples/18-lease-signal', () => {
  test('runs against a throwaway Redis: fetch, a child process and a timer stop with the lease; renewals outlast a blocked thread', async () => {
    const { execFile } = await import('node:child_process');
    const { promisify } = await import('node:util');
    const example = new URL('../examples/18-lease-signal/index.mjs', import.meta.url);
    const { stdout } = await promisify(execFile)(process.execPath, [example.pathname], { env: { ...process.env, REDIS_URL: redis.url }, timeout: 30_000 });
    assert.match(stdout, /^fetch stopped: LockError LEASE_EXPIRED after \d+ ms \(lease valid: false\)$/m);
    assert.match(stdout, /^child stopped: AbortError, reason LEASE_EXPIRED$/m);
    assert.match(stdout, /^child exited by SIGTERM$/m);
    assert.match(stdout, /^timer stopped: job deadline TimeoutError$/m);
    assert.match(stdout, /^after blocking 1500 ms: valid true, aborted false$/m);
  });
});
