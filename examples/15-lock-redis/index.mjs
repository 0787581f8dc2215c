// Example 15: two workers compete for one job through Redis, write through a store that
// checks fences, release in finally, and shut down gracefully on SIGINT.
//
//   npm run example                                   # REDIS_URL, else 127.0.0.1:6379, else a throwaway redis-server
//   REDIS_URL=redis://127.0.0.1:6379/0 node examples/15-lock-redis/index.mjs
import { setTimeout as sleep } from 'node:timers/promises'
import { createRedisLockDriver, LockError } from '@dokebi/lock-redis'

const url = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379/0'
const options = { driver: 'redis', connection: 'main', namespace: 'example-15', leaseMs: 2000 }
const logger = { warn: (fields, msg) => console.warn('warn', fields.code, msg), error: (fields, msg) => console.error('error', fields.code, msg) }

// Stands in for the downstream store (a database row, a file): it accepts a write only with
// a fence above the last one it accepted, atomically. In PostgreSQL:
//   UPDATE jobs SET result = $2, fence = $1 WHERE id = 'nightly' AND fence < $1
const store = {
  fence: 0n,
  writes: [],
  write(fence, value) {
    const f = BigInt(fence) // fences are decimal strings: compare as BigInt, never Number
    if (f <= this.fence) throw new Error(`stale fence rejected`)
    this.fence = f
    this.writes.push(value)
  },
}

// Each worker has its own driver, as two servers would.
const workers = ['A', 'B'].map((name) => ({ name, driver: createRedisLockDriver(url, options, logger) }))
const stop = new AbortController()
process.once('SIGINT', () => stop.abort(new Error('SIGINT')))

async function work({ name, driver }) {
  for (let run = 1; run <= 3 && !stop.signal.aborted; run++) {
    let lease
    try {
      lease = await driver.acquire('job:nightly-report', { signal: stop.signal, waitTimeoutMs: 5000 })
    } catch (err) {
      if (err instanceof LockError && err.code === 'ABORTED') return
      throw err
    }
    try {
      console.log(`${name} holds the job (fence ${lease.fence}, ${lease.remainingMs} ms left)`)
      await sleep(100) // the job itself
      if (!lease.valid) throw new Error('lease expired during the job; not writing')
      store.write(lease.fence, `${name} run ${run}`)
    } finally {
      await lease.release()
    }
  }
}

try {
  await Promise.all(workers.map(work))
  console.log(`the store accepted ${store.writes.length} fenced writes: ${store.writes.join(', ')}`)
} finally {
  await Promise.all(workers.map(({ driver }) => driver.shutdown()))
}
