// Example 18: work that stops the moment its lock stops being safe. `lease.signal` is an
// AbortSignal that aborts when the lease stops being valid (deadline, release(), a renew
// that lost the key or whose outcome is unknown, shutdown), with a LockError as its reason;
// hand it to whatever Node API takes a signal. `lease.keepAlive()` renews on the addon's
// threads, so a busy event loop does not make renewals late. No dependency beyond Node.
//
//   REDIS_URL=redis://127.0.0.1:6379/0 node examples/18-lease-signal/index.mjs
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { createServer } from 'node:http'
import { setTimeout as sleep } from 'node:timers/promises'
import { createRedisLockDriver } from '@dokebi/lock-redis'

const url = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379/0'
await using locks = createRedisLockDriver(url, { driver: 'redis', connection: 'main', namespace: 'example-18', leaseMs: 600 })

// A slow upstream: it answers only after 60 s, long after any lease here ends.
const upstream = createServer((req, res) => { setTimeout(() => res.end('late'), 60_000).unref() })
upstream.listen(0, '127.0.0.1')
await once(upstream, 'listening')
const upstreamUrl = `http://127.0.0.1:${upstream.address().port}/report`

// 1. fetch() gives up when the lease runs out. keepAlive holds it for at most maxHoldMs,
//    then the lease runs out at its deadline and the request is aborted.
{
  await using lease = await locks.acquire('job:fetch')
  lease.keepAlive({ maxHoldMs: 900 })
  const started = performance.now()
  try {
    await fetch(upstreamUrl, { signal: lease.signal })
  } catch (err) {
    // fetch rejects with the signal's reason: the LockError.
    console.log(`fetch stopped: ${err.name} ${err.code} after ${Math.round(performance.now() - started)} ms (lease valid: ${lease.valid})`)
  }
}

// 2. A child process is killed when the lease ends (here: release() is called).
{
  const lease = await locks.acquire('job:spawn')
  const child = spawn(process.execPath, ['-e', 'setTimeout(() => {}, 60_000)'], { signal: lease.signal, stdio: 'ignore' })
  child.on('error', (err) => console.log(`child stopped: ${err.name}, reason ${err.cause?.code}`))
  // Listened for before release(): the child may be gone before release() resolves. Not
  // events.once(), which rejects on the 'error' the abort emits first.
  const exited = new Promise((resolve) => child.on('exit', (_code, signal) => resolve(signal)))
  await sleep(50)
  await lease.release()
  const signal = await exited
  console.log(`child exited by ${signal}`)
}

// 3. Your own deadline and the lease's, together: whichever comes first.
{
  await using lease = await locks.acquire('job:timer')
  const jobDeadline = AbortSignal.timeout(100)
  try {
    await sleep(60_000, undefined, { signal: AbortSignal.any([lease.signal, jobDeadline]) })
  } catch (err) {
    const why = lease.signal.aborted ? `lease ${lease.signal.reason.code}` : `job deadline ${jobDeadline.reason.name}`
    console.log(`timer stopped: ${why}`)
  }
}

// 4. Renewals do not wait for the event loop: a synchronous stretch longer than leaseMs.
{
  await using lease = await locks.acquire('job:busy')
  lease.keepAlive({ maxHoldMs: 60_000, everyMs: 200 })
  const end = performance.now() + 1500 // 2.5 × leaseMs with the JS thread blocked
  while (performance.now() < end) { /* a long synchronous task */ }
  console.log(`after blocking 1500 ms: valid ${lease.valid}, aborted ${lease.signal.aborted}`)
}

upstream.close()
upstream.closeAllConnections()
