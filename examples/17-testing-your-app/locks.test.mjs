// node:test against a throwaway Redis (or REDIS_URL's): `node --test examples/17-testing-your-app/locks.test.mjs`
import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import { createRedisLockDriver } from '@dokebi/lock-redis'
import { startRedis } from './redis-server.mjs'

// A namespace per test process: parallel test files never share locks or fences.
const options = { driver: 'redis', connection: 'main', namespace: `test-${process.pid}`, leaseMs: 5000 }
let redis
let locks

before(async () => {
  redis = process.env.REDIS_URL ? { url: process.env.REDIS_URL, stop: async () => {} } : await startRedis()
  locks = createRedisLockDriver(redis.url, options)
})

after(async () => {
  await locks?.shutdown() // settles waits, releases what a failed test left held
  await redis?.stop()
})

test('only one holder at a time', async () => {
  await using lease = await locks.acquire('job:report') // released when the test ends
  await assert.rejects(locks.acquire('job:report', { waitTimeoutMs: 0 }), { code: 'LOCK_BUSY' })
})

test('a test can own its driver for its own duration', async () => {
  await using own = createRedisLockDriver(redis.url, options) // shut down when the test ends
  await using lease = await own.acquire('job:report', { waitTimeoutMs: 0 }) // the previous test released it
  assert.ok(BigInt(lease.fence) > 0n)
})
