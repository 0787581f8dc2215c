// A second Jest test file loads the addon again in a fresh module registry (as every test
// file of an app does) and exercises what keeps resources open: a waiter that subscribes to
// release notifications, an aborted wait, a second driver. All of it ends with shutdown().
'use strict'

const { createRedisLockDriver, LockError } = require('@dokebi/lock-redis')

const url = process.env.DOKEBI_JEST_REDIS_URL
const options = { driver: 'redis', connection: 'main', namespace: `jest-wait-${process.pid}-${Date.now()}` }
const holder = createRedisLockDriver(url, options)
const waiter = createRedisLockDriver(url, options)

afterAll(async () => {
  await Promise.all([holder.shutdown(), waiter.shutdown()])
})

test('a waiter gets the lease when the holder releases it, with a larger fence', async () => {
  const held = await holder.acquire('job')
  const waiting = waiter.acquire('job', { waitTimeoutMs: 5000 })
  await new Promise((resolve) => setTimeout(resolve, 100)) // the waiter is waiting (and subscribed)
  await held.release()
  const lease = await waiting
  try {
    expect(BigInt(lease.fence) > BigInt(held.fence)).toBe(true)
  } finally {
    await lease.release()
  }
})

test('an aborted wait rejects ABORTED with the reason as cause', async () => {
  const held = await holder.acquire('abort')
  try {
    const controller = new AbortController()
    const waiting = waiter.acquire('abort', { signal: controller.signal, waitTimeoutMs: 5000 })
    const reason = new Error('user went away')
    setTimeout(() => controller.abort(reason), 50)
    const err = await waiting.catch((e) => e)
    expect(err).toBeInstanceOf(LockError)
    expect(err.code).toBe('ABORTED')
    expect(err.cause).toBe(reason)
  } finally {
    await held.release()
  }
})

test('a wait that runs out rejects WAIT_TIMEOUT', async () => {
  const held = await holder.acquire('timeout')
  try {
    await expect(waiter.acquire('timeout', { waitTimeoutMs: 100 })).rejects.toMatchObject({ code: 'WAIT_TIMEOUT' })
  } finally {
    await held.release()
  }
})
