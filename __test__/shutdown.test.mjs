// Shutdown: releasing tracked leases, stopping waits, timeouts, failures, and a process
// that ends by itself.

import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import {
  backend, eventually, failure, fenceKeyOf, lockKeyOf, runNodeChild, scriptCalls, uniqueNamespace, within, driverFor as sharedDriverFor,
} from './helpers/lock.mjs';
import { external, startRedis } from './helpers/redis.mjs';

const PACKAGE = fileURLToPath(new URL('../index.js', import.meta.url));
const { createRedisLockDriver, LockError } = createRequire(import.meta.url)('../index.js');

const skip = external && 'needs a throwaway redis-server (REDIS_URL is set)';

let redis;
before(async () => { redis = await startRedis(); });
after(() => redis?.stop());

/** A driver whose shutdown is the test's business; a leftover one is shut down after. */
const driverFor = (t, namespace, extra, connection = redis.url) =>
  sharedDriverFor(t, createRedisLockDriver, connection, namespace, extra);

function assertLockError(err, code) {
  assert.ok(err instanceof LockError, `not a LockError: ${err}`);
  assert.equal(err.code, code, err.message);
}

describe('shutdown', () => {
  test('releases every tracked lease in Redis and resolves', async (t) => {
    const ns = uniqueNamespace('shutdown');
    const d = driverFor(t, ns);
    const keys = ['a', 'b', 'c', 'd'];
    const leases = await Promise.all(keys.map((k) => d.acquire(k)));
    for (const k of keys) assert.equal(await redis.command('EXISTS', lockKeyOf(ns, k)), 1);
    assert.equal(await d.shutdown(), undefined);
    for (const k of keys) assert.equal(await redis.command('EXISTS', lockKeyOf(ns, k)), 0, `${k} still locked`);
    for (const lease of leases) {
      assert.equal(lease.valid, false);
      assert.equal(lease.remainingMs, 0);
    }
  });

  test('leaves alone keys that another owner took after this lease expired', async (t) => {
    const ns = uniqueNamespace('shutdown-foreign');
    const d = driverFor(t, ns, { leaseMs: 100 });
    const other = driverFor(t, ns);
    await d.acquire('k');
    const theirs = await other.acquire('k'); // after the 100 ms lease expired
    await d.shutdown();
    assert.equal(await redis.command('EXISTS', lockKeyOf(ns, 'k')), 1, "the other owner's lock survived");
    assert.equal(theirs.valid, true);
    assert.equal(await theirs.release(), true);
  });

  test('after shutdown, acquire rejects SHUT_DOWN without asking Redis', async (t) => {
    const ns = uniqueNamespace('after-shutdown');
    const d = driverFor(t, ns);
    await d.shutdown();
    const base = await scriptCalls(redis);
    assertLockError(await failure(d.acquire('k')), 'SHUT_DOWN');
    assertLockError(await failure(d.acquire('k', { waitTimeoutMs: 0 })), 'SHUT_DOWN');
    assert.equal(await scriptCalls(redis), base);
    assert.equal(await redis.command('EXISTS', lockKeyOf(ns, 'k')), 0);
  });

  test('a waiter blocked on a held key rejects SHUT_DOWN as soon as shutdown starts', async (t) => {
    const ns = uniqueNamespace('shutdown-waiter');
    const holder = driverFor(t, ns);
    const d = driverFor(t, ns);
    const held = await holder.acquire('k');
    const base = await scriptCalls(redis);
    const waiting = d.acquire('k'); // would wait 5 s
    await eventually('the waiter to find the key busy', async () => (await scriptCalls(redis)) > base);
    const started = performance.now();
    const [waitResult, shutdownResult] = await Promise.allSettled([waiting, d.shutdown()]);
    assert.ok(performance.now() - started < 1000, 'the wait stopped at once');
    assert.equal(waitResult.status, 'rejected');
    assertLockError(waitResult.reason, 'SHUT_DOWN');
    assert.equal(shutdownResult.status, 'fulfilled');
    assert.equal(held.valid, true, "another backend's lease is untouched");
    assert.equal(await held.release(), true);
  });

  test('lease.release() after shutdown resolves false without asking Redis, and renew rejects LEASE_EXPIRED', async (t) => {
    const d = driverFor(t, uniqueNamespace('release-after'));
    const lease = await d.acquire('k');
    await d.shutdown();
    const base = await scriptCalls(redis);
    assert.equal(await lease.release(), false);
    assertLockError(await failure(lease.renew()), 'LEASE_EXPIRED');
    assert.equal(await scriptCalls(redis), base);
  });

  test('shutdown called twice, or concurrently, resolves every time', async (t) => {
    const ns = uniqueNamespace('shutdown-twice');
    const d = driverFor(t, ns);
    await d.acquire('k');
    const results = await Promise.allSettled([d.shutdown(), d.shutdown()]);
    assert.deepEqual(results.map((r) => r.status), ['fulfilled', 'fulfilled']);
    assert.equal(await d.shutdown(), undefined);
    assert.equal(await redis.command('EXISTS', lockKeyOf(ns, 'k')), 0);
  });

  test('with a stalled Redis, shutdown rejects CLEANUP_TIMEOUT after about shutdownTimeoutMs and the lease is still released once Redis answers', { skip }, async (t) => {
    const ns = uniqueNamespace('shutdown-stalled');
    const d = createRedisLockDriver(redis.url, backend(ns, { shutdownTimeoutMs: 300 }));
    await d.acquire('k');
    await redis.pause();
    let resumed = false;
    t.after(() => (resumed ? undefined : redis.resume()));
    const started = performance.now();
    const err = await within(3000, failure(d.shutdown()), 'shutdown');
    const took = performance.now() - started;
    assertLockError(err, 'CLEANUP_TIMEOUT');
    assert.ok(took >= 250 && took < 1500, `took ${took} ms with shutdownTimeoutMs 300`);
    await redis.resume();
    resumed = true;
    await eventually('the background cleanup to delete the key', async () => (await redis.command('EXISTS', lockKeyOf(ns, 'k'))) === 0, { timeoutMs: 3000 });
    assertLockError(await failure(d.shutdown()), 'CLEANUP_TIMEOUT'); // a second call repeats the result
  });

  test('shutdown during a stalled acquire stops it with SHUT_DOWN and the late lock is released once Redis answers', { skip }, async (t) => {
    const ns = uniqueNamespace('shutdown-in-flight');
    const d = createRedisLockDriver(redis.url, backend(ns, { shutdownTimeoutMs: 300 }));
    await (await d.acquire('warm-up')).release();
    await redis.pause();
    let resumed = false;
    t.after(() => (resumed ? undefined : redis.resume()));
    const attempts = d.stats().redisAttempts;
    const pending = failure(d.acquire('k'));
    // The acquire is on the wire: its script is counted just before it is written (a busy
    // machine may take longer than any fixed pause to get there), then a moment to write it.
    await eventually('the acquire script to be sent', () => d.stats().redisAttempts > attempts);
    await new Promise((resolve) => setTimeout(resolve, 50));
    const [acquireErr, shutdownErr] = await within(3000, Promise.all([pending, failure(d.shutdown())]), 'shutdown');
    assertLockError(acquireErr, 'SHUT_DOWN');
    assertLockError(shutdownErr, 'CLEANUP_TIMEOUT'); // the acquire in flight never answered
    await redis.resume();
    resumed = true;
    await eventually('the late acquire to run and be released', async () => {
      const [fence, lock] = await Promise.all([
        redis.command('EXISTS', fenceKeyOf(ns, 'k')),
        redis.command('EXISTS', lockKeyOf(ns, 'k')),
      ]);
      return fence === 1 && lock === 0;
    }, { timeoutMs: 3000 });
  });

  test('a release that keeps timing out makes shutdown reject CLEANUP_TIMEOUT, never success, and it still lands after Redis resumes', { skip }, async (t) => {
    const ns = uniqueNamespace('shutdown-unconfirmed');
    const d = createRedisLockDriver({ url: redis.url, commandTimeoutMs: 200 }, backend(ns, { shutdownTimeoutMs: 1000 }));
    await d.acquire('k');
    await redis.pause();
    let resumed = false;
    t.after(() => (resumed ? undefined : redis.resume()));
    const started = Date.now();
    const err = await within(3000, failure(d.shutdown()), 'shutdown');
    // Each release try times out after commandTimeoutMs and is tried again (by token, so
    // repeating is safe) until shutdownTimeoutMs; it is never reported as done.
    assertLockError(err, 'CLEANUP_TIMEOUT');
    assert.ok(Date.now() - started >= 900, `gave up after ${Date.now() - started} ms`);
    await redis.resume();
    resumed = true;
    await eventually('the release to land after resume', async () => (await redis.command('EXISTS', lockKeyOf(ns, 'k'))) === 0, { timeoutMs: 3000 });
  });

  test('a release refused by Redis makes shutdown reject CLEANUP_FAILED with an AggregateError of the failures', { skip }, async (t) => {
    await redis.command('ACL', 'SETUSER', 'cleaner', 'on', '>pw', '~*', '&*', '+@all');
    t.after(() => redis.command('ACL', 'DELUSER', 'cleaner'));
    const ns = uniqueNamespace('shutdown-refused');
    const d = driverFor(t, ns, {}, `redis://cleaner:pw@127.0.0.1:${redis.port}`);
    await d.acquire('a');
    await d.acquire('b');
    await redis.command('ACL', 'SETUSER', 'cleaner', '-evalsha', '-eval');
    const err = await failure(d.shutdown());
    assertLockError(err, 'CLEANUP_FAILED');
    assert.ok(err.cause instanceof AggregateError, `cause: ${err.cause}`);
    assert.equal(err.cause.errors.length, 2);
    for (const inner of err.cause.errors) {
      assertLockError(inner, 'PROVIDER_FAILED');
      assert.equal(inner.cause.serverCode, 'NOPERM');
    }
    // Nothing was claimed: the keys are still there, left to their TTL.
    assert.equal(await redis.command('EXISTS', lockKeyOf(ns, 'a')), 1);
    assert.equal(await redis.command('EXISTS', lockKeyOf(ns, 'b')), 1);
  });
});

describe('process exit', () => {
  /** Runs an ESM snippet in a child node; resolves with its exit code, or fails if it outlives `limitMs`. */
  function runChild(source, ns = uniqueNamespace('child'), limitMs = 5000) {
    return runNodeChild(source, { LOCK_PACKAGE: PACKAGE, LOCK_REDIS_URL: redis.url, LOCK_NS: ns }, limitMs);
  }

  const prelude = `
    import { createRequire } from 'node:module';
    const { createRedisLockDriver } = createRequire(process.env.LOCK_PACKAGE)(process.env.LOCK_PACKAGE);
    const opts = { driver: 'redis', connection: 'main', namespace: process.env.LOCK_NS };
    const d = createRedisLockDriver(process.env.LOCK_REDIS_URL, opts);
  `;

  test('a process that acquires, releases and shuts down exits by itself with code 0', async () => {
    const r = await runChild(`${prelude}
      const lease = await d.acquire('k');
      if (!(await lease.release())) throw new Error('release failed');
      await d.shutdown();
      console.log('done');
    `);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout.trim(), 'done');
  });

  test('a process that acquires and releases without calling shutdown still exits by itself', async () => {
    const r = await runChild(`${prelude}
      const lease = await d.acquire('k');
      await lease.release();
      console.log('done');
    `);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout.trim(), 'done');
  });

  test('a process that waited for a busy key and shut down exits by itself', async () => {
    const r = await runChild(`${prelude}
      const other = createRedisLockDriver(process.env.LOCK_REDIS_URL, opts);
      const held = await other.acquire('k');
      const waiting = d.acquire('k');
      setTimeout(() => held.release(), 100);
      const lease = await waiting;
      await lease.release();
      await Promise.all([d.shutdown(), other.shutdown()]);
      console.log('done');
    `);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout.trim(), 'done');
  });

  test('a process that still holds a lease and never shuts down exits by itself, leaving the key to its TTL', async () => {
    const ns = uniqueNamespace('child-holds');
    const r = await runChild(`${prelude}
      const lease = await d.acquire('k');
      console.log(lease.fence);
    `, ns);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout.trim(), /^[1-9][0-9]*$/);
    const pttl = await redis.command('PTTL', lockKeyOf(ns, 'k'));
    assert.ok(pttl > 0 && pttl <= 10000, `PTTL ${pttl}: the lock is left to expire`);
  });
});
