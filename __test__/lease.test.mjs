// Leases: what acquire hands out, the Redis layout behind it, fencing, release and renew.

import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  eventually, failure, fenceKeyOf, lockKeyOf, scriptCalls, sha256hex, subscribe, uniqueNamespace, driverFor as sharedDriverFor,
} from './helpers/lock.mjs';
import { external, startRedis } from './helpers/redis.mjs';

const skip = external && 'flushes the whole server: needs a throwaway redis-server (REDIS_URL is set)';

const { createRedisLockDriver, LockError } = createRequire(import.meta.url)('../index.js');

let redis;
before(async () => { redis = await startRedis(); });
after(() => redis?.stop());

/** A driver on this file's Redis, shut down when the test ends. */
const driverFor = (t, namespace, extra) => sharedDriverFor(t, createRedisLockDriver, redis.url, namespace, extra);

/** Redis TIME in microseconds, as a BigInt. */
async function redisMicros() {
  const [s, us] = await redis.command('TIME');
  return BigInt(s) * 1_000_000n + BigInt(us);
}

/** Waits until Redis's clock is past the millisecond encoded in `fence` (fence = ms × 1000 + n). */
async function redisClockPast(fence) {
  const ms = fence / 1000n;
  await eventually('Redis TIME to pass the last fence', async () => (await redisMicros()) / 1000n > ms);
}

describe('acquire', () => {
  test('returns a valid lease with the original key, a decimal fence and remainingMs within leaseMs', async (t) => {
    const d = driverFor(t, uniqueNamespace('lease'), { leaseMs: 5000 });
    const key = 'orders:42/é🔒';
    const lease = await d.acquire(key);
    assert.equal(lease.key, key);
    assert.equal(typeof lease.fence, 'string');
    assert.match(lease.fence, /^[1-9][0-9]*$/);
    assert.ok(BigInt(lease.fence) > 0n);
    assert.equal(lease.valid, true);
    assert.equal(typeof lease.remainingMs, 'number');
    assert.ok(lease.remainingMs > 0 && lease.remainingMs <= 5000, `remainingMs ${lease.remainingMs}`);
    await lease.release();
  });

  test("a lease's key and fence cannot be changed: assigning either throws and leaves it as it was", async (t) => {
    const d = driverFor(t, uniqueNamespace('lease'));
    const lease = await d.acquire('readonly');
    const { key, fence } = lease;
    assert.throws(() => { lease.fence = '1'; }, TypeError);
    assert.throws(() => { lease.key = 'other'; }, TypeError);
    assert.equal(lease.fence, fence);
    assert.equal(lease.key, key);
    assert.equal(await lease.release(), true);
  });

  test('stores the token under <ns>:lock:{sha256} with a PTTL near leaseMs and the fence under <ns>:lock-fence:{sha256} without expiry', async (t) => {
    const ns = uniqueNamespace('layout');
    const d = driverFor(t, ns, { leaseMs: 4000 });
    const key = 'clé-🔑-ключ';
    const hex = sha256hex(key);
    assert.match(hex, /^[0-9a-f]{64}$/);
    const lease = await d.acquire(key);

    const lockKey = `${ns}:lock:{${hex}}`;
    const fenceKey = `${ns}:lock-fence:{${hex}}`;
    assert.deepEqual((await redis.command('KEYS', `${ns}:*`)).sort(), [fenceKey, lockKey].sort());

    const token = await redis.command('GET', lockKey);
    assert.equal(typeof token, 'string');
    assert.ok(token.length >= 16, 'the owner token is long enough to be unguessable');
    assert.ok(!token.includes(key), 'the token is not the key');
    const pttl = await redis.command('PTTL', lockKey);
    assert.ok(pttl > 3000 && pttl <= 4000, `lock PTTL ${pttl}`);

    assert.equal(await redis.command('GET', fenceKey), lease.fence);
    assert.equal(await redis.command('PTTL', fenceKey), -1, 'the fence counter never expires');
    await lease.release();
    assert.equal(await redis.command('PTTL', fenceKey), -1, 'the fence counter outlives the lock');
  });

  test('the first fence of a fresh key is Redis TIME in milliseconds × 1000 + 1', async (t) => {
    const d = driverFor(t, uniqueNamespace('first-fence'));
    const before = await redisMicros();
    const lease = await d.acquire('fresh');
    const after = await redisMicros();
    const fence = BigInt(lease.fence);
    const low = (before / 1000n) * 1000n + 1n;
    const high = (after / 1000n) * 1000n + 1n;
    assert.ok(fence >= low && fence <= high, `fence ${fence} not within [${low}, ${high}]`);
    assert.equal(fence % 1000n, 1n);
    await lease.release();
  });

  test('fences strictly increase across acquire and release cycles', async (t) => {
    const d = driverFor(t, uniqueNamespace('fences'));
    let last = 0n;
    for (let i = 0; i < 20; i++) {
      const lease = await d.acquire('cycle');
      const fence = BigInt(lease.fence);
      assert.ok(fence > last, `cycle ${i}: fence ${fence} not above ${last}`);
      last = fence;
      assert.equal(await lease.release(), true);
    }
  });

  test('keys have their own fence counters and do not block each other', async (t) => {
    const ns = uniqueNamespace('two-keys');
    const d = driverFor(t, ns);
    const a = await d.acquire('a');
    const b = await d.acquire('b', { waitTimeoutMs: 0 });
    assert.equal(await redis.command('GET', fenceKeyOf(ns, 'a')), a.fence);
    assert.equal(await redis.command('GET', fenceKeyOf(ns, 'b')), b.fence);
    await Promise.all([a.release(), b.release()]);
  });

  test('after the fence counter is deleted (data loss) the next fence is still larger than every earlier one', async (t) => {
    const ns = uniqueNamespace('fence-loss');
    const d = driverFor(t, ns);
    let highest = 0n;
    for (let i = 0; i < 5; i++) {
      const lease = await d.acquire('lossy');
      highest = BigInt(lease.fence) > highest ? BigInt(lease.fence) : highest;
      await lease.release();
    }
    assert.equal(await redis.command('DEL', fenceKeyOf(ns, 'lossy')), 1);
    await redisClockPast(highest); // the contract's condition: the server clock moved on
    const lease = await d.acquire('lossy');
    assert.ok(BigInt(lease.fence) > highest, `fence ${lease.fence} not above ${highest}`);
    await lease.release();
  });

  test('after FLUSHALL the next fence is still larger than every earlier one', { skip }, async (t) => {
    const ns = uniqueNamespace('fence-flush');
    const d = driverFor(t, ns);
    let highest = 0n;
    for (let i = 0; i < 5; i++) {
      const lease = await d.acquire('flushed');
      highest = BigInt(lease.fence);
      await lease.release();
    }
    await redis.command('FLUSHALL');
    assert.equal(await redis.command('EXISTS', fenceKeyOf(ns, 'flushed')), 0);
    await redisClockPast(highest);
    const lease = await d.acquire('flushed');
    assert.ok(BigInt(lease.fence) > highest, `fence ${lease.fence} not above ${highest}`);
    await lease.release();
  });

  test('a lease lost with the data (FLUSHALL) no longer blocks the key', { skip }, async (t) => {
    const ns = uniqueNamespace('flush-held');
    const d = driverFor(t, ns);
    const held = await d.acquire('k');
    // The re-seeded counter (TIME ms × 1000) is above the old fence only from the next
    // millisecond on: within the same one both seeds are equal (D-0041's condition).
    await sleep(2);
    await redis.command('FLUSHALL');
    const next = await d.acquire('k', { waitTimeoutMs: 0 });
    assert.ok(BigInt(next.fence) > BigInt(held.fence));
    assert.equal(await held.release(), false, 'the old lease was no longer ours');
    assert.equal(await redis.command('EXISTS', lockKeyOf(ns, 'k')), 1, "releasing the old lease left the new holder's key");
    await next.release();
  });
});

describe('release', () => {
  test('resolves true and deletes the lock key but keeps the fence counter', async (t) => {
    const ns = uniqueNamespace('release');
    const d = driverFor(t, ns);
    const lease = await d.acquire('r');
    assert.equal(await redis.command('EXISTS', lockKeyOf(ns, 'r')), 1);
    assert.equal(await lease.release(), true);
    assert.equal(await redis.command('EXISTS', lockKeyOf(ns, 'r')), 0);
    assert.equal(await redis.command('GET', fenceKeyOf(ns, 'r')), lease.fence);
  });

  test('a second release resolves false without talking to Redis', async (t) => {
    const d = driverFor(t, uniqueNamespace('release-twice'));
    const lease = await d.acquire('r');
    assert.equal(await lease.release(), true);
    const calls = await scriptCalls(redis);
    assert.equal(await lease.release(), false);
    assert.equal(await lease.release(), false);
    assert.equal(await scriptCalls(redis), calls, 'no script ran for the repeated releases');
  });

  test('two concurrent release() calls: exactly one resolves true', async (t) => {
    const ns = uniqueNamespace('release-race');
    const d = driverFor(t, ns);
    const lease = await d.acquire('r');
    const results = await Promise.all([lease.release(), lease.release()]);
    assert.deepEqual(results.sort(), [false, true]);
    assert.equal(await redis.command('EXISTS', lockKeyOf(ns, 'r')), 0);
  });

  test("release after the lease expired and another owner took the key resolves false and leaves the other owner's key", async (t) => {
    const ns = uniqueNamespace('release-late');
    const short = driverFor(t, ns, { leaseMs: 150 });
    const other = driverFor(t, ns);
    const first = await short.acquire('r');
    const second = await other.acquire('r'); // waits for the 150 ms lease to expire
    assert.ok(BigInt(second.fence) > BigInt(first.fence));
    assert.equal(first.valid, false);
    const token = await redis.command('GET', lockKeyOf(ns, 'r'));
    assert.equal(await first.release(), false);
    assert.equal(await redis.command('GET', lockKeyOf(ns, 'r')), token, "the other owner's key is untouched");
    assert.equal(second.valid, true);
    assert.equal(await second.release(), true);
  });

  test('release after the lease expired with no new owner resolves false', async (t) => {
    const ns = uniqueNamespace('release-expired');
    const d = driverFor(t, ns, { leaseMs: 50 });
    const lease = await d.acquire('r');
    await eventually('the lock key to expire', async () => (await redis.command('EXISTS', lockKeyOf(ns, 'r'))) === 0);
    assert.equal(await lease.release(), false);
  });

  test('valid is false and remainingMs 0 the moment release() is called', async (t) => {
    const d = driverFor(t, uniqueNamespace('release-valid'));
    // The contract says "the moment it is called"; a race shows up only now and then, so try often.
    for (let i = 0; i < 50; i++) {
      const lease = await d.acquire('r');
      assert.equal(lease.valid, true);
      const pending = lease.release();
      const [valid, remaining] = [lease.valid, lease.remainingMs];
      assert.equal(await pending, true);
      assert.equal(valid, false, `round ${i}: valid right after release() was called`);
      assert.equal(remaining, 0, `round ${i}: remainingMs right after release() was called`);
      assert.equal(lease.valid, false);
    }
  });

  test('renew() called right after release() rejects LEASE_EXPIRED', async (t) => {
    const d = driverFor(t, uniqueNamespace('release-renew'));
    const outcomes = {};
    for (let i = 0; i < 300; i++) {
      const lease = await d.acquire('r');
      const released = lease.release();
      const outcome = await lease.renew().then(() => 'renewed', (err) => err.code);
      await released;
      outcomes[outcome] = (outcomes[outcome] ?? 0) + 1;
    }
    assert.deepEqual(outcomes, { LEASE_EXPIRED: 300 });
  });

  test('release publishes the key hash on <ns>:lock-released', async (t) => {
    const ns = uniqueNamespace('publish');
    const d = driverFor(t, ns);
    const sub = await subscribe(redis.port, `${ns}:lock-released`);
    t.after(() => sub.close());
    const lease = await d.acquire('announced');
    const message = sub.next();
    assert.equal(await lease.release(), true);
    assert.equal(await message, sha256hex('announced'));
  });

  test('a release that deleted nothing publishes nothing', async (t) => {
    const ns = uniqueNamespace('no-publish');
    const d = driverFor(t, ns);
    const sub = await subscribe(redis.port, `${ns}:lock-released`);
    t.after(() => sub.close());
    const gone = await d.acquire('gone');
    const sentinel = await d.acquire('sentinel');
    await redis.command('DEL', lockKeyOf(ns, 'gone'));
    assert.equal(await gone.release(), false);
    // Messages on one channel arrive in order: once the sentinel's is in, any
    // message from the first release would have arrived before it.
    const next = sub.next();
    assert.equal(await sentinel.release(), true);
    await next;
    assert.deepEqual(sub.messages, [sha256hex('sentinel')]);
  });
});

describe('renew', () => {
  test('extends the lock TTL and remainingMs back to about leaseMs', async (t) => {
    const ns = uniqueNamespace('renew');
    // 5 s, run down by 1.5 s: the renew and the PTTLs around it (a few ms, up to ~100 on a
    // busy machine) stay far inside the margins below, and each still tells the run-down
    // lease from the renewed one.
    const d = driverFor(t, ns, { leaseMs: 5000 });
    const lease = await d.acquire('r');
    await eventually('the lease to run down', () => lease.remainingMs < 3500, { timeoutMs: 4000 });
    const before = await redis.command('PTTL', lockKeyOf(ns, 'r'));
    assert.ok(before < 3750, `PTTL before renew ${before}`);
    await lease.renew();
    const after = await redis.command('PTTL', lockKeyOf(ns, 'r'));
    assert.ok(after > 4500 && after <= 5000, `PTTL after renew ${after}`);
    assert.ok(lease.remainingMs > 4250, `remainingMs after renew ${lease.remainingMs}`);
    assert.equal(lease.valid, true);
    assert.equal(await lease.release(), true);
  });

  test('a renewed lease outlives its original lease time', async (t) => {
    const ns = uniqueNamespace('renew-outlives');
    const d = driverFor(t, ns, { leaseMs: 300 });
    const lease = await d.acquire('r');
    const started = performance.now();
    while (performance.now() - started < 600) {
      await eventually('the lease to run down', () => lease.remainingMs < 200);
      await lease.renew();
    }
    assert.equal(lease.valid, true);
    assert.equal(await redis.command('EXISTS', lockKeyOf(ns, 'r')), 1);
    assert.equal(await lease.release(), true);
  });

  test('renew of a released lease rejects LEASE_EXPIRED', async (t) => {
    const d = driverFor(t, uniqueNamespace('renew-released'));
    const lease = await d.acquire('r');
    await lease.release();
    const err = await failure(lease.renew());
    assert.ok(err instanceof LockError);
    assert.equal(err.code, 'LEASE_EXPIRED');
  });

  test('renew of an expired lease rejects LEASE_EXPIRED and does not bring it back', async (t) => {
    const ns = uniqueNamespace('renew-expired');
    const d = driverFor(t, ns, { leaseMs: 100 });
    const lease = await d.acquire('r');
    await eventually('the lease to expire locally', () => !lease.valid);
    const err = await failure(lease.renew());
    assert.equal(err.code, 'LEASE_EXPIRED');
    assert.equal(lease.valid, false);
    assert.equal(lease.remainingMs, 0);
  });

  test('renew after another owner took the key rejects LEASE_LOST and the lease stays invalid', async (t) => {
    const ns = uniqueNamespace('renew-lost');
    const d = driverFor(t, ns);
    const other = driverFor(t, ns);
    const lease = await d.acquire('r');
    // The key expires in Redis while this process still thinks it holds it (a
    // paused process, a skewed clock): another owner takes it.
    await redis.command('PEXPIRE', lockKeyOf(ns, 'r'), 1);
    const thief = await other.acquire('r');
    assert.equal(lease.valid, true, 'locally the lease still looks valid');
    const err = await failure(lease.renew());
    assert.ok(err instanceof LockError);
    assert.equal(err.code, 'LEASE_LOST');
    assert.equal(lease.valid, false);
    assert.equal(lease.remainingMs, 0);
    const again = await failure(lease.renew());
    assert.equal(again.code, 'LEASE_EXPIRED', 'a lost lease never becomes renewable again');
    assert.equal(thief.valid, true);
    assert.ok((await redis.command('PTTL', lockKeyOf(ns, 'r'))) > 9000, "the other owner's TTL was not touched");
    assert.equal(await lease.release(), false);
    assert.equal(await thief.release(), true);
  });

  test('renew when the key vanished rejects LEASE_LOST', async (t) => {
    const ns = uniqueNamespace('renew-vanished');
    const d = driverFor(t, ns);
    const lease = await d.acquire('r');
    await redis.command('DEL', lockKeyOf(ns, 'r'));
    const err = await failure(lease.renew());
    assert.equal(err.code, 'LEASE_LOST');
    assert.equal(lease.valid, false);
    assert.equal(await redis.command('EXISTS', lockKeyOf(ns, 'r')), 0, 'renew did not recreate the key');
  });
});

describe('remainingMs and valid', () => {
  test('remainingMs decreases over time and is 0 once the lease is no longer valid', async (t) => {
    const d = driverFor(t, uniqueNamespace('remaining'), { leaseMs: 300 });
    const lease = await d.acquire('r');
    const first = lease.remainingMs;
    assert.ok(first > 0 && first <= 300);
    await sleep(30);
    const second = lease.remainingMs;
    assert.ok(second < first, `remainingMs ${second} did not drop below ${first}`);
    const expired = await eventually('the lease to expire', () => !lease.valid && performance.now(), { timeoutMs: 1000, intervalMs: 5 });
    assert.ok(expired);
    assert.equal(lease.remainingMs, 0);
    assert.equal(lease.valid, false);
  });

  test('the local estimate never outlives the key in Redis', async (t) => {
    const ns = uniqueNamespace('estimate');
    const d = driverFor(t, ns, { leaseMs: 2000 });
    const lease = await d.acquire('r');
    const pttl = await redis.command('PTTL', lockKeyOf(ns, 'r'));
    const remaining = lease.remainingMs; // read after PTTL, so it must not be larger
    assert.ok(remaining <= pttl + 1, `remainingMs ${remaining} is beyond Redis PTTL ${pttl}`);
    await lease.release();
  });
});
