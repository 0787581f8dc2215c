// One worker thread of workers.test.mjs: loads the addon by the package name, competes for a
// shared key with the other workers and takes its own key, then shuts its driver down and
// lets the thread end by itself (no process.exit, no parentPort.close).
import { createRequire } from 'node:module'
import { setTimeout as sleep } from 'node:timers/promises'
import { parentPort, threadId, workerData } from 'node:worker_threads'

const { createRedisLockDriver, LockError } = createRequire(import.meta.url)('@dokebi/lock-redis')
const { url, namespace, id, rounds, shared, holdMs, mode } = workerData
// shared: [0] who holds the shared key (0 = nobody), [1] hold sequence, [2] overlaps seen
const cells = new Int32Array(shared)

const driver = createRedisLockDriver(url, { driver: 'redis', connection: 'main', namespace, leaseMs: 10_000 })

if (mode === 'abandon') {
  // Holds a lease and waits on the shared key; the parent terminates this thread meanwhile.
  const lease = await driver.acquire(`abandoned:${id}`)
  parentPort.postMessage({ id, holding: lease.fence })
  await driver.acquire('shared', { waitTimeoutMs: 60_000 }).catch(() => {})
} else {
  const holds = [] // { seq, fence } of every shared-key hold
  const own = [] // fences of this worker's own key
  let releasedAll = true

  async function sharedKey() {
    for (let i = 0; i < rounds; i++) {
      const lease = await driver.acquire('shared', { waitTimeoutMs: 20_000 })
      try {
        if (Atomics.compareExchange(cells, 0, 0, id) !== 0) Atomics.add(cells, 2, 1)
        holds.push({ seq: Atomics.add(cells, 1, 1), fence: lease.fence, thread: threadId })
        await sleep(holdMs)
        Atomics.compareExchange(cells, 0, id, 0) // clear before releasing, or the next holder sees us
      } finally {
        releasedAll = (await lease.release()) && releasedAll
      }
    }
  }

  async function ownKey() {
    for (let i = 0; i < rounds; i++) {
      // Nobody else uses this key: it must be free at once, every time.
      const lease = await driver.acquire(`own:${id}`, { waitTimeoutMs: 0 })
      try {
        own.push(lease.fence)
        await sleep(1)
      } finally {
        releasedAll = (await lease.release()) && releasedAll
      }
    }
  }

  let error
  try {
    await Promise.all([sharedKey(), ownKey()])
  } catch (err) {
    error = err instanceof LockError ? `${err.code}: ${err.message}` : String(err?.stack ?? err)
  } finally {
    await driver.shutdown()
  }
  parentPort.postMessage({ id, holds, own, releasedAll, error })
}
