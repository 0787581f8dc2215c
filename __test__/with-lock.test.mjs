// backend.withLock(key, fn, options?) (CONTRACT.md "withLock"; issue 36): acquire, an
// optional bounded keep-alive, fn(lease), release — on every path fn can take.

import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { after, before, describe, test } from 'node:test';
import { eventually, failure, lockKeyOf, scriptCalls, uniqueNamespace, within, driverFor as sharedDriverFor } from './helpers/lock.mjs';
import { proxyFor } from './helpers/proxy.mjs';
import { external, startRedis } from './helpers/redis.mjs';

const require = createRequire(import.meta.url);
const { createRedisLockDriver, LockError } = require('../index.js');

let redis;
before(async () => { redis = await startRedis(); });
after(() => redis?.stop());

const driverFor = (t, namespace, extra, connection = redis.url, logger) =>
  sharedDriverFor(t, createRedisLockDriver, connection, namespace, extra, logger);
const held = async (ns, key) => (await redis.command('EXISTS', lockKeyOf(ns, key))) === 1;

describe('withLock', () => {
  test('runs fn with a valid lease of the key, resolves with its value and releases', async (t) => {
    const ns = uniqueNamespace('wl');
    const d = driverFor(t, ns);
    const value = await d.withLock('job', async (lease) => {
      assert.equal(lease.key, 'job');
      assert.equal(lease.valid, true);
      assert.equal(await held(ns, 'job'), true, 'held while fn runs');
      return { fence: lease.fence };
    });
    assert.match(value.fence, /^\d+$/);
    assert.equal(await held(ns, 'job'), false, 'released after');
    assert.equal(d.stats().trackedLeases, 0);
  });

  test('a synchronous fn works too', async (t) => {
    const d = driverFor(t, uniqueNamespace('wl-sync'));
    assert.equal(await d.withLock('job', () => 42), 42);
  });

  test('when fn throws it rejects with that very error and still releases', async (t) => {
    const ns = uniqueNamespace('wl-throw');
    const d = driverFor(t, ns);
    const boom = new Error('the work failed');
    const err = await failure(d.withLock('job', async () => { throw boom; }));
    assert.equal(err, boom);
    assert.equal(await held(ns, 'job'), false);
    const sync = await failure(d.withLock('job', () => { throw boom; }));
    assert.equal(sync, boom);
    assert.equal(await held(ns, 'job'), false);
  });

  test('fails as acquire does when the key is held, and fn never runs', async (t) => {
    const ns = uniqueNamespace('wl-busy');
    const d = driverFor(t, ns);
    const holder = await d.acquire('job');
    let ran = false;
    const err = await failure(d.withLock('job', () => { ran = true; }, { waitTimeoutMs: 0 }));
    assert.ok(err instanceof LockError);
    assert.equal(err.code, 'LOCK_BUSY');
    const timedOut = await failure(d.withLock('job', () => { ran = true; }, { waitTimeoutMs: 50 }));
    assert.equal(timedOut.code, 'WAIT_TIMEOUT');
    assert.equal(ran, false);
    assert.equal(await holder.release(), true);
  });

  test('the outer signal aborting while it waits rejects ABORTED with its reason; fn never runs', async (t) => {
    const ns = uniqueNamespace('wl-abort');
    const d = driverFor(t, ns);
    const holder = await d.acquire('job');
    const controller = new AbortController();
    let ran = false;
    const waiting = d.withLock('job', () => { ran = true; }, { signal: controller.signal, waitTimeoutMs: 30_000 });
    await eventually('the waiter in line', () => d.stats().waiters === 1);
    const reason = new Error('the request was cancelled');
    controller.abort(reason);
    const err = await within(5000, failure(waiting), 'the aborted withLock');
    assert.equal(err.code, 'ABORTED');
    assert.equal(err.cause, reason);
    assert.equal(ran, false);
    await holder.release();
  });

  test('with maxHoldMs it keeps the lease alive past leaseMs while fn runs', async (t) => {
    const ns = uniqueNamespace('wl-keep');
    const d = driverFor(t, ns, { leaseMs: 300 });
    const value = await d.withLock('job', async (lease) => {
      const end = Date.now() + 1000; // over three leases
      while (Date.now() < end) {
        await new Promise((resolve) => setTimeout(resolve, 50));
        assert.equal(lease.signal.aborted, false, 'still ours');
      }
      assert.equal(await held(ns, 'job'), true);
      return lease.valid;
    }, { maxHoldMs: 10_000, everyMs: 100 });
    assert.equal(value, true);
    assert.equal(await held(ns, 'job'), false);
  });

  test('a lease lost mid-work aborts lease.signal with LEASE_LOST; fn obeying it rejects withLock with that reason', async (t) => {
    const ns = uniqueNamespace('wl-lost');
    const d = driverFor(t, ns, { leaseMs: 2000 });
    const err = await failure(d.withLock('job', async (lease) => {
      // Another owner takes the key over (as after an expiry on a paused holder).
      await redis.command('SET', lockKeyOf(ns, 'job'), 'someone-else', 'PX', '60000');
      await new Promise((resolve, reject) => {
        lease.signal.addEventListener('abort', () => reject(lease.signal.reason), { once: true });
      });
    }, { maxHoldMs: 10_000, everyMs: 50 }));
    assert.ok(err instanceof LockError);
    assert.equal(err.code, 'LEASE_LOST');
    // Not ours: withLock's release left the other owner's key alone.
    assert.equal(await redis.command('GET', lockKeyOf(ns, 'job')), 'someone-else');
  });

  test('a release that fails after fn resolved still resolves with the value, warns LOCK_RELEASE_FAILED, and releases in the background', { skip: external && 'needs a proxy in front of its own server' }, async (t) => {
    const ns = uniqueNamespace('wl-release-fails');
    const proxy = await proxyFor(t, redis.port);
    const logs = [];
    const logger = { warn: (fields, msg) => logs.push({ fields, msg }) };
    const d = driverFor(t, ns, { pollIntervalMs: 20 }, { url: proxy.url, commandTimeoutMs: 300 }, logger);
    const value = await d.withLock('secret-job-name', async () => {
      proxy.stallAfterWrite({ drop: true }); // the release's reply never comes
      return 'done';
    });
    assert.equal(value, 'done');
    const warned = logs.find((l) => l.fields.code === 'LOCK_RELEASE_FAILED');
    assert.ok(warned, `warned: ${JSON.stringify(logs.map((l) => l.fields.code))}`);
    assert.ok(warned.fields.cause instanceof LockError);
    assert.equal(warned.fields.cause.code, 'OUTCOME_UNKNOWN');
    assert.ok(!JSON.stringify(warned).includes('secret-job-name') && !warned.msg.includes('secret-job-name'), 'never the key');
    proxy.killAll({ reset: true });
    proxy.release();
    await eventually('the background release', async () => !(await held(ns, 'secret-job-name')), { timeoutMs: 10_000 });
  });

  test('works inside await using blocks, nested withLock and acquire included', async () => {
    const ns = uniqueNamespace('wl-using');
    {
      await using d = createRedisLockDriver(redis.url, { driver: 'redis', connection: 'main', namespace: ns });
      const fences = await d.withLock('outer', async (outer) => {
        await using inner = await d.acquire('inner');
        const nested = await d.withLock('nested', (lease) => lease.fence);
        return [outer.fence, inner.fence, nested];
      });
      assert.equal(fences.length, 3);
      for (const key of ['outer', 'inner', 'nested']) assert.equal(await held(ns, key), false, key);
    }
  });

  test('bad options are INVALID_OPTIONS before anything is sent', async (t) => {
    const ns = uniqueNamespace('wl-bad');
    const d = driverFor(t, ns, { leaseMs: 1000 });
    const before = await scriptCalls(redis);
    const bad = [
      ['job', () => {}, { maxHoldMs: 0 }],
      ['job', () => {}, { maxHoldMs: 1.5 }],
      ['job', () => {}, { maxHoldMs: 1000, everyMs: 1000 }], // everyMs < leaseMs
      ['job', () => {}, { everyMs: 100 }], // only with maxHoldMs
      ['job', () => {}, { waitTimeoutMs: -1 }],
      ['job', () => {}, { signal: 'stop' }],
      ['job', () => {}, { maxHold: 1000 }],
      ['job', () => {}, null],
      ['job', 'not a function'],
      ['', () => {}],
    ];
    for (const [key, fn, options] of bad) {
      const err = await failure(d.withLock(key, fn, options));
      assert.ok(err instanceof LockError, String(err));
      assert.ok(['INVALID_OPTIONS', 'INVALID_KEY'].includes(err.code), `${err.code} for ${JSON.stringify(options)}`);
    }
    assert.equal(await scriptCalls(redis), before, 'no script ran');
    assert.equal(d.stats().redisAttempts, 0);
  });
});

describe('examples/19-with-lock', () => {
  test('runs against a throwaway Redis: work past leaseMs kept alive, released after a value and after a throw', async () => {
    const { execFile } = await import('node:child_process');
    const { promisify } = await import('node:util');
    const example = new URL('../examples/19-with-lock/index.mjs', import.meta.url);
    const { stdout } = await promisify(execFile)(process.execPath, [example.pathname], { env: { ...process.env, REDIS_URL: redis.url }, timeout: 30_000 });
    assert.match(stdout, /^report done under fence <decimal>, valid throughout: true$/m);
    assert.match(stdout, /^second run: ran$/m);
    assert.match(stdout, /^work failed: upstream down; lock free: true$/m);
  });
});
