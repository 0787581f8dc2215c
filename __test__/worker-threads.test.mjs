// With DOKEBI_LOCK_REDIS_WORKER_THREADS above 1, calls run as tasks of their own instead of
// through the one dispatcher (decision 0179): the same locks, waits and shutdown. The
// variable is read once by the addon, so it is set before the package is loaded; node --test
// runs this file in its own process.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { after, before, test } from 'node:test';
import { backend, uniqueNamespace, within } from './helpers/lock.mjs';
import { startRedis } from './helpers/redis.mjs';

process.env.DOKEBI_LOCK_REDIS_WORKER_THREADS = '2';
const { createRedisLockDriver } = createRequire(import.meta.url)('../index.js');

let redis;
before(async () => { redis = await startRedis(); });
after(() => redis?.stop());

test('with two worker threads, 256 locks in flight, a waiter and shutdown work as with one', async () => {
  const ns = uniqueNamespace('workers');
  const d = createRedisLockDriver(redis.url, backend(ns, { maxWaiters: 1024 }));
  const leases = await within(10_000, Promise.all(Array.from({ length: 256 }, (_, i) => d.acquire(`k${i}`))), '256 acquires');
  assert.ok(leases.every((l) => l.valid));
  const waiting = d.acquire('k0', { waitTimeoutMs: 5000 });
  const released = await Promise.all(leases.map((l) => l.release()));
  assert.ok(released.every((r) => r === true));
  const next = await within(5000, waiting, 'the waiter');
  assert.ok(BigInt(next.fence) > BigInt(leases[0].fence));
  await next.release();
  if (process.platform === 'linux') {
    const runtimeThreads = readdirSync('/proc/self/task').filter((tid) => {
      try { return readFileSync(`/proc/self/task/${tid}/comm`, 'utf8').startsWith('dokebi-lock-red'); } catch { return false; }
    });
    assert.equal(runtimeThreads.length, 2, 'the runtime has the two worker threads asked for');
  }
  await d.shutdown();
});
