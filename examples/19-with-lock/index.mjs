// Example 19: withLock — acquire, keep alive for at most maxHoldMs, run the work with the
// lease, release whatever the work does. The work obeys `lease.signal`, which aborts the
// moment the lease stops being safe, and hands `lease.fence` to the store it writes.
//
//   REDIS_URL=redis://127.0.0.1:6379/0 node examples/19-with-lock/index.mjs
import { setTimeout as sleep } from 'node:timers/promises'
import { createRedisLockDriver } from '@dokebi/lock-redis'

const url = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379/0'
await using locks = createRedisLockDriver(url, { driver: 'redis', connection: 'main', namespace: 'example-19', leaseMs: 1000 })

// Work longer than leaseMs: the keep-alive renews every everyMs (default leaseMs / 3).
const report = await locks.withLock('job:nightly-report', async (lease) => {
  await sleep(2500, undefined, { signal: lease.signal }) // stops if the lease is lost
  return { fence: lease.fence, stillValid: lease.valid }
}, { maxHoldMs: 10_000, waitTimeoutMs: 2000 })
console.log(`report done under fence ${/^\d+$/.test(report.fence) ? '<decimal>' : report.fence}, valid throughout: ${report.stillValid}`)

// A second worker finds it free again: withLock released it.
const again = await locks.withLock('job:nightly-report', () => 'ran', { waitTimeoutMs: 0 })
console.log(`second run: ${again}`)

// A failure inside the work rejects withLock with that error, and the lock is released.
try {
  await locks.withLock('job:nightly-report', () => { throw new Error('upstream down') })
} catch (err) {
  console.log(`work failed: ${err.message}; lock free: ${(await locks.withLock('job:nightly-report', () => true, { waitTimeoutMs: 0 }))}`)
}
