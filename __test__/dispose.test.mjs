// `await using`: a lease releases itself at the end of its block, a driver shuts itself down.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { backend, eventually, failure, lockKeyOf, scriptCalls, uniqueNamespace, driverFor as sharedDriverFor } from './helpers/lock.mjs';
import { startProxy } from './helpers/proxy.mjs';
import { external, startRedis } from './helpers/redis.mjs';

const PACKAGE = fileURLToPath(new URL('../index.js', import.meta.url));
const { createRedisLockDriver, LockError } = createRequire(import.meta.url)('../index.js');

const skip = external && 'needs a throwaway redis-server and a proxy (REDIS_URL is set)';

let redis;
before(async () => { redis = await startRedis(); });
after(() => redis?.stop());

const driverFor = (t, namespace, extra, connection = redis.url) =>
  sharedDriverFor(t, createRedisLockDriver, connection, namespace, extra);

const held = async (ns, key) => (await redis.command('EXISTS', lockKeyOf(ns, key))) === 1;

describe('await using lease', () => {
  test('the lease is released in Redis when the block ends normally', async (t) => {
    const ns = uniqueNamespace('dispose');
    const d = driverFor(t, ns);
    let outside;
    {
      await using lease = await d.acquire('job');
      outside = lease;
      assert.equal(await held(ns, 'job'), true);
      assert.equal(lease.valid, true);
    }
    assert.equal(outside.valid, false);
    assert.equal(await held(ns, 'job'), false, 'the key is gone from Redis after the block');
    assert.equal(d.stats().trackedLeases, 0);
    // The key is free for the next owner at once, without waiting for the TTL.
    const next = await d.acquire('job', { waitTimeoutMs: 0 });
    assert.ok(BigInt(next.fence) > BigInt(outside.fence));
    await next.release();
  });

  test('the lease is released when the block throws, and the block\'s own error is what propagates', async (t) => {
    const ns = uniqueNamespace('dispose-throw');
    const d = driverFor(t, ns);
    const boom = new Error('the job failed');
    const err = await failure(async () => {
      await using lease = await d.acquire('job');
      assert.equal(lease.valid, true);
      throw boom;
    });
    assert.equal(err, boom, 'not wrapped: the release succeeded, so nothing is suppressed');
    assert.equal(await held(ns, 'job'), false);
  });

  test('a lease already released in the block disposes quietly, without asking Redis again', async (t) => {
    const d = driverFor(t, uniqueNamespace('dispose-released'));
    let calls;
    {
      await using lease = await d.acquire('job');
      assert.equal(await lease.release(), true);
      calls = await scriptCalls(redis);
    }
    assert.equal(await scriptCalls(redis), calls, 'no script ran for the disposal');
  });

  test("a lease that expired and was taken over disposes quietly and leaves the new owner's key", async (t) => {
    const ns = uniqueNamespace('dispose-expired');
    const d = driverFor(t, ns, { leaseMs: 50 });
    const other = driverFor(t, ns);
    let theirs;
    {
      await using lease = await d.acquire('job');
      await eventually('the lease to expire in Redis', async () => !(await held(ns, 'job')));
      theirs = await other.acquire('job', { waitTimeoutMs: 0 });
      assert.equal(lease.valid, false);
    }
    assert.equal(await held(ns, 'job'), true, 'the new owner still holds the key');
    assert.equal(await theirs.release(), true);
  });

  test('a lease expired locally but still ours in Redis (its clock behind) is released by token at disposal', async (t) => {
    const ns = uniqueNamespace('dispose-late');
    // Long enough that the PEXPIRE below lands before the key expires even on a busy machine.
    const d = driverFor(t, ns, { leaseMs: 500 });
    {
      await using lease = await d.acquire('job');
      // As if Redis's clock ran behind ours: the key outlives the local deadline.
      assert.equal(await redis.command('PEXPIRE', lockKeyOf(ns, 'job'), 60_000), 1);
      await eventually('the lease to expire locally', () => !lease.valid);
      assert.equal(await held(ns, 'job'), true);
    }
    assert.equal(await held(ns, 'job'), false, 'disposal deleted our token instead of leaving it to a 60 s TTL');
  });

  test('a lease that was lost (its key deleted) disposes quietly', async (t) => {
    const ns = uniqueNamespace('dispose-lost');
    const d = driverFor(t, ns);
    {
      await using lease = await d.acquire('job');
      await redis.command('DEL', lockKeyOf(ns, 'job'));
      const err = await failure(lease.renew());
      assert.equal(err.code, 'LEASE_LOST');
    }
    assert.equal(await held(ns, 'job'), false);
  });

  test('a release that fails makes disposal reject with the same LockError as release(); after a throw it is a SuppressedError', { skip }, async (t) => {
    const proxy = await startProxy(redis.port);
    t.after(() => proxy.close());
    const ns = uniqueNamespace('dispose-fails');
    const d = driverFor(t, ns, { shutdownTimeoutMs: 300 }, { url: proxy.url, connectTimeoutMs: 300, commandTimeoutMs: 300 });
    const [a, b, c, z] = [await d.acquire('a'), await d.acquire('b'), await d.acquire('c'), await d.acquire('z')];
    proxy.refuse();
    proxy.killAll();
    // The first call after the cut may still be written to the dying connection
    // (OUTCOME_UNKNOWN) or find it announced closed (PROVIDER_FAILED): which one is a race.
    // It is spent here, so every call compared below reconnects and is refused alike.
    await failure(z.release());

    const byRelease = await failure(a.release());
    const byDispose = await failure(b[Symbol.asyncDispose]());
    assert.ok(byDispose instanceof LockError, String(byDispose));
    assert.ok(['PROVIDER_FAILED', 'OUTCOME_UNKNOWN'].includes(byRelease.code), byRelease.message);
    assert.equal(byDispose.code, byRelease.code);
    assert.equal(byDispose.message, byRelease.message);
    assert.equal(byDispose.cause?.name, 'RedisError');
    assert.equal(byDispose.cause.code, byRelease.cause.code);
    assert.equal(byDispose.cause.outcome, byRelease.cause.outcome);

    // JavaScript's own rule for a failing disposal after a throw: neither error is lost.
    const boom = new Error('the job failed');
    const both = await failure(async () => {
      await using lease = c;
      throw boom;
    });
    assert.ok(both instanceof SuppressedError, String(both));
    assert.equal(both.suppressed, boom);
    assert.ok(both.error instanceof LockError);
    assert.equal(both.error.code, byRelease.code);

    // The failed releases stay tracked: once Redis is reachable, shutdown releases them.
    proxy.accept();
    await d.shutdown();
    for (const key of ['a', 'b', 'c', 'z']) assert.equal(await held(ns, key), false, `${key} released by shutdown`);
  });
});

describe('await using driver', () => {
  test('is shutdown(): the end of the block releases what is still held and refuses new acquires', async (t) => {
    const ns = uniqueNamespace('dispose-driver');
    let outside;
    let lease;
    {
      await using d = createRedisLockDriver(redis.url, backend(ns));
      outside = d;
      lease = await d.acquire('job'); // deliberately not released
      assert.equal(await held(ns, 'job'), true);
    }
    assert.equal(await held(ns, 'job'), false, 'shutdown released the lease left held');
    assert.equal(lease.valid, false);
    const err = await failure(outside.acquire('job'));
    assert.ok(err instanceof LockError);
    assert.equal(err.code, 'SHUT_DOWN');
  });

  test('the method is shutdown itself and the driver object stays frozen', (t) => {
    const d = driverFor(t, uniqueNamespace('dispose-frozen'));
    assert.equal(d[Symbol.asyncDispose], d.shutdown);
    assert.ok(Object.isFrozen(d));
  });

  test('a process that uses `await using` for its driver and lease exits by itself with code 0, the key released', async () => {
    const ns = uniqueNamespace('dispose-child');
    const source = `
      import { createRequire } from 'node:module';
      const { createRedisLockDriver } = createRequire(process.env.LOCK_PACKAGE)(process.env.LOCK_PACKAGE);
      await using d = createRedisLockDriver(process.env.LOCK_REDIS_URL, { driver: 'redis', connection: 'main', namespace: process.env.LOCK_NS });
      await using lease = await d.acquire('job');
      console.log(lease.fence);
    `;
    const child = spawn(process.execPath, ['--input-type=module', '-e', source], {
      env: { ...process.env, LOCK_PACKAGE: PACKAGE, LOCK_REDIS_URL: redis.url, LOCK_NS: ns },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => { stdout += d; });
    child.stderr.on('data', (d) => { stderr += d; });
    // Far above what it needs (well under a second); a hang is what this catches.
    const killer = setTimeout(() => child.kill('SIGKILL'), 15_000);
    const [code, signal] = await new Promise((resolve) => child.on('exit', (...r) => resolve(r)));
    clearTimeout(killer);
    assert.equal(signal, null, `the child hung and was killed; stderr: ${stderr}`);
    assert.equal(code, 0, stderr);
    assert.match(stdout.trim(), /^[1-9][0-9]*$/);
    assert.equal(await held(ns, 'job'), false);
  });
});
