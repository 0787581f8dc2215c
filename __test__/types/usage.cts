// The same package from a CommonJS TypeScript file (`require`). Type-checked, never run.
import lock = require('@dokebi/lock-redis')

const driver: lock.LockDriver = lock.createRedisLockDriver('redis://127.0.0.1:6379/0', {
  driver: 'redis',
  connection: 'main',
  namespace: 'my-service',
})

async function once(): Promise<string> {
  const lease: lock.Lease = await driver.acquire('k', { waitTimeoutMs: 0 })
  try {
    return lease.fence
  } catch (err) {
    if (err instanceof lock.LockError && err.code === lock.LockErrorCode.LOCK_BUSY) return ''
    throw err
  } finally {
    await lease.release()
  }
}

// `await using` in CommonJS: the lease is released when the function returns.
async function scoped(): Promise<string> {
  await using lease = await driver.acquire('k')
  return lease.fence
}

export = { once, scoped, parsed: lock.parseRedisLockBackend({}) satisfies lock.RedisLockBackend }
