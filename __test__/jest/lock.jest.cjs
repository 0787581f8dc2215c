// The driver inside Jest: loaded by the package name, used against a throwaway Redis, shut
// down in afterAll. Jest must then exit by itself: no --forceExit, and --detectOpenHandles
// finds nothing.
'use strict'

const { createRedisLockDriver, LockError, LockErrorCode, parseRedisLockBackend } = require('@dokebi/lock-redis')

const url = process.env.DOKEBI_JEST_REDIS_URL
const namespace = `jest-lock-${process.pid}-${Date.now()}`
let driver

beforeAll(() => {
  driver = createRedisLockDriver(url, { driver: 'redis', connection: 'main', namespace, leaseMs: 5000 })
})

afterAll(async () => {
  await driver.shutdown()
})

test('exports the API', () => {
  expect(typeof createRedisLockDriver).toBe('function')
  expect(LockErrorCode.LOCK_BUSY).toBe('LOCK_BUSY')
  expect(parseRedisLockBackend({ driver: 'redis', connection: 'main', namespace }).leaseMs).toBe(10000)
})

test('acquire, fenced work, release in finally', async () => {
  const fences = []
  for (let i = 0; i < 3; i++) {
    const lease = await driver.acquire('report')
    try {
      expect(lease.valid).toBe(true)
      expect(lease.remainingMs).toBeGreaterThan(0)
      fences.push(BigInt(lease.fence))
    } finally {
      await expect(lease.release()).resolves.toBe(true)
    }
    expect(lease.valid).toBe(false)
  }
  expect(fences[1] > fences[0] && fences[2] > fences[1]).toBe(true)
})

test('a held key is LOCK_BUSY with waitTimeoutMs 0', async () => {
  const lease = await driver.acquire('busy')
  try {
    const err = await driver.acquire('busy', { waitTimeoutMs: 0 }).catch((e) => e)
    expect(err).toBeInstanceOf(LockError)
    expect(err).toMatchObject({ name: 'LockError', code: 'LOCK_BUSY' })
  } finally {
    await lease.release()
  }
})

test('renew extends a held lease', async () => {
  const lease = await driver.acquire('renew')
  try {
    await expect(lease.renew()).resolves.toBeUndefined()
    expect(lease.valid).toBe(true)
  } finally {
    await lease.release()
  }
})

test('stats() follows leases and counts failed calls by code', async () => {
  const before = driver.stats()
  const lease = await driver.acquire('stats')
  try {
    expect(driver.stats().trackedLeases).toBe(before.trackedLeases + 1)
    await expect(driver.acquire('stats', { waitTimeoutMs: 0 })).rejects.toMatchObject({ code: 'LOCK_BUSY' })
    expect(driver.stats().errors.LOCK_BUSY).toBe(before.errors.LOCK_BUSY + 1)
  } finally {
    await lease.release()
  }
  expect(driver.stats()).toMatchObject({ trackedLeases: before.trackedLeases, waiters: 0, inProgress: 0 })
})
