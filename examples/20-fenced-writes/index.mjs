// Example 20: the other half of fencing. A lease's `fence` only protects the data if the
// store checks it: here a holder stalls past its lease (a GC pause, a stopped VM), the next
// holder writes, and the stale holder's late write is refused — by a SQL upsert on Node's
// built-in SQLite and by a Redis script. Needs `ioredis` for the Redis store.
//
//   REDIS_URL=redis://127.0.0.1:6379/0 node examples/20-fenced-writes/index.mjs
import { setTimeout as sleep } from 'node:timers/promises'
import { createRedisLockDriver } from '@dokebi/lock-redis'
import { Redis } from 'ioredis'
import { fencedRedisStore } from './redis-store.mjs'
import { openReports } from './sql-store.mjs'

const url = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379/0'
await using locks = createRedisLockDriver(url, { driver: 'redis', connection: 'main', namespace: 'example-20', leaseMs: 200 })
const sql = openReports()
const client = new Redis(url)
const kv = fencedRedisStore((script, keys, args) => client.eval(script, keys.length, ...keys, ...args))
const verdict = (kept) => (kept ? 'kept' : 'refused')

// A takes the lock, then stalls longer than its lease: it never sees the lease end.
const a = await locks.acquire('report:daily')
await sleep(400)

// B gets the lock A's lease no longer holds, and writes with its larger fence.
const b = await locks.acquire('report:daily', { waitTimeoutMs: 0 })
const bSql = sql.write('daily', 'from B', b.fence)
const bKv = await kv.write('example-20:report:daily', 'from B', b.fence)
console.log(`B wrote with a larger fence: sql ${verdict(bSql)}, redis ${verdict(bKv)}`)
await b.release()

// A wakes up and writes what it computed before the stall, with its old fence.
const aSql = sql.write('daily', 'from A', a.fence)
const aKv = await kv.write('example-20:report:daily', 'from A', a.fence)
console.log(`A wrote late with its old fence: sql ${verdict(aSql)}, redis ${verdict(aKv)}`)
console.log(`the report is ${sql.read('daily').body}, and ${await client.hget('example-20:report:daily', 'body')} in Redis`)

await a.release() // false: the key is no longer A's
await client.del('example-20:report:daily')
client.disconnect()
sql.close()
