// fenceTtlMs (decision 0031): opt-in expiry of fence counters, through the public JS API.

import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { after, before, describe, test } from 'node:test';
import { backend, eventually, fenceKeyOf, thrown, uniqueNamespace, driverFor as sharedDriverFor } from './helpers/lock.mjs';
import { startRedis } from './helpers/redis.mjs';

const { createRedisLockDriver, parseRedisLockBackend } = createRequire(import.meta.url)('../index.js');

let redis;
before(async () => { redis = await startRedis(); });
after(() => redis?.stop());

const driverFor = (t, namespace, extra) => sharedDriverFor(t, createRedisLockDriver, redis.url, namespace, extra);

describe('fenceTtlMs option', () => {
  test('parseRedisLockBackend returns fenceTtlMs only when given, and accepts integers from 1 to 2^53-1', () => {
    assert.equal('fenceTtlMs' in parseRedisLockBackend(backend('svc')), false);
    assert.equal('fenceTtlMs' in parseRedisLockBackend(backend('svc', { fenceTtlMs: undefined })), false);
    assert.equal(parseRedisLockBackend(backend('svc', { fenceTtlMs: 1 })).fenceTtlMs, 1);
    const month = 30 * 86_400_000; // above the 2^31-1 of the other fields: only Redis sees it
    assert.equal(parseRedisLockBackend(backend('svc', { fenceTtlMs: month })).fenceTtlMs, month);
    assert.equal(parseRedisLockBackend(backend('svc', { fenceTtlMs: Number.MAX_SAFE_INTEGER })).fenceTtlMs, Number.MAX_SAFE_INTEGER);
  });

  test('a fenceTtlMs that is not an integer from 1 is INVALID_OPTIONS naming the field, not the value', () => {
    for (const bad of [0, -5, 1.5, 987654.5, NaN, Infinity, 2 ** 53, '60000', null, 60000n]) {
      const err = thrown(() => parseRedisLockBackend(backend('svc', { fenceTtlMs: bad })));
      assert.equal(err.code, 'INVALID_OPTIONS', String(bad));
      assert.ok(err.message.includes('fenceTtlMs'), err.message);
      assert.ok(!err.message.includes('987654') && !err.message.includes('60000'), err.message);
      assert.equal(thrown(() => createRedisLockDriver(redis.url, backend('svc', { fenceTtlMs: bad }))).code, 'INVALID_OPTIONS');
    }
  });
});

describe('fence counters', () => {
  test('without fenceTtlMs a counter never expires', async (t) => {
    const ns = uniqueNamespace('fence-forever');
    const d = driverFor(t, ns);
    await (await d.acquire('job')).release();
    assert.equal(await redis.command('PTTL', fenceKeyOf(ns, 'job')), -1);
  });

  test('with fenceTtlMs a counter expires, and the fences after its expiry are larger than every fence before', async (t) => {
    const ns = uniqueNamespace('fence-ttl');
    const d = driverFor(t, ns, { fenceTtlMs: 200 });
    const counter = fenceKeyOf(ns, 'job');
    const before = [];
    for (let i = 0; i < 3; i++) {
      const lease = await d.acquire('job');
      before.push(BigInt(lease.fence));
      await lease.release();
    }
    const ttl = await redis.command('PTTL', counter);
    assert.ok(ttl > 0 && ttl <= 200, `the counter carries the expiry: PTTL ${ttl}`);
    assert.deepEqual(before, [before[0], before[0] + 1n, before[0] + 2n], 'consecutive while the counter lives');

    await eventually('the counter to expire', async () => (await redis.command('EXISTS', counter)) === 0);
    const lease = await d.acquire('job');
    const after = BigInt(lease.fence);
    await lease.release();
    assert.ok(after > before[2], `${after} after ${before[2]}`);
    assert.equal(after % 1000n, 1n, 'seeded again from Redis TIME');
    assert.ok((await redis.command('PTTL', counter)) > 0, 'the new counter expires too');
  });
});
