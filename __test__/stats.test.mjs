// driver.stats(): what a metrics scraper sees.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { startRedis } from './helpers/redis.mjs'
import { uniqueNamespace, backend, failure } from './helpers/lock.mjs'

const { createRedisLockDriver, LockErrorCode } = createRequire(import.meta.url)('../index.js')

let redis
before(async () => { redis = await startRedis() })
after(() => redis?.stop())

test('stats count leases, waiters, lines, Redis attempts and errors by code', async () => {
  const d = createRedisLockDriver(redis.url, backend(uniqueNamespace('stats'), { pollIntervalMs: 20 }))
  try {
    const idle = d.stats()
    assert.deepEqual(Object.keys(idle.errors), Object.keys(LockErrorCode), 'every code, in the contract order')
    assert.ok(Object.values(idle.errors).every((n) => n === 0))
    assert.equal(idle.subscription, 'off')

    const [heldA, heldB] = [await d.acquire('a'), await d.acquire('b')]
    assert.equal((await failure(d.acquire('a', { waitTimeoutMs: 0 }))).code, 'LOCK_BUSY')
    const waiting = [d.acquire('a', { waitTimeoutMs: 5000 }), d.acquire('a', { waitTimeoutMs: 5000 }), d.acquire('b', { waitTimeoutMs: 5000 })]
    let s = d.stats()
    assert.equal(s.waiters, 3)
    assert.equal(s.lines, 2)
    assert.equal(s.inProgress, 3)
    assert.equal(s.errors.LOCK_BUSY, 1)
    await Promise.all([heldA.release(), heldB.release()])
    const [nextA, nextB] = [await waiting[0], await waiting[2]]
    s = d.stats()
    assert.equal(s.trackedLeases, 2)
    assert.equal(s.waiters, 1, 'the second waiter for a is still in line')
    assert.ok(s.redisAttempts >= 5, `${s.redisAttempts} attempts`)
    await nextA.release()
    await (await waiting[1]).release()
    await nextB.release()
    assert.equal(d.stats().trackedLeases, 0)
  } finally {
    await d.shutdown()
  }
})
