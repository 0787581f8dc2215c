// Jest: one driver per test file, shut down in afterAll. Jest then exits by itself: no --forceExit.
const { createRedisLockDriver } = require('@dokebi/lock-redis')

const options = { driver: 'redis', connection: 'main', namespace: `jest-${process.pid}`, leaseMs: 5000 }
let locks

beforeAll(() => {
  locks = createRedisLockDriver(process.env.REDIS_URL, options)
})

afterAll(async () => {
  await locks.shutdown()
})

test('only one holder at a time', async () => {
  await using lease = await locks.acquire('job:report')
  await expect(locks.acquire('job:report', { waitTimeoutMs: 0 })).rejects.toMatchObject({ code: 'LOCK_BUSY' })
})

test('fences grow from one lease of a key to the next', async () => {
  const first = await locks.acquire('job:fenced')
  await first.release()
  await using second = await locks.acquire('job:fenced')
  expect(BigInt(second.fence) > BigInt(first.fence)).toBe(true)
})
