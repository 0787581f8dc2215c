// The addon in several worker_threads at once: every worker loads it by the package name
// and runs its own driver; the main thread uses it at the same time. A key shared by the
// workers is mutually exclusive across them (no overlapping holds, fences strictly increase
// in hold order), each worker's own key is never busy, and every thread ends by itself.
// A worker terminated while it holds a lease and waits does not take the process down,
// and its driver is shut down with it.

import assert from 'node:assert/strict'
import { execFile } from 'node:child_process'
import { createRequire } from 'node:module'
import path from 'node:path'
import { after, before, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { Worker } from 'node:worker_threads'
import { startRedis } from '../helpers/redis.mjs'

const { createRedisLockDriver } = createRequire(import.meta.url)('@dokebi/lock-redis')
const WORKER = path.join(import.meta.dirname, 'workers', 'lock-worker.mjs')
const WORKERS = 4
const ROUNDS = 12

let redis
before(async () => { redis = await startRedis() })
after(() => redis?.stop())

const namespace = (label) => `workers-${label}-${process.pid}-${Date.now()}`

/** Starts a worker; `done` resolves with its last message and exit code, or rejects on its error or a hang. */
function startWorker(workerData, timeoutMs = 60_000) {
  const worker = new Worker(WORKER, { workerData })
  const messages = []
  worker.on('message', (m) => messages.push(m))
  const done = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`worker ${workerData.id} did not exit within ${timeoutMs} ms`)), timeoutMs)
    worker.once('error', (err) => { clearTimeout(timer); reject(err) })
    worker.once('exit', (code) => { clearTimeout(timer); resolve({ code, message: messages.at(-1) }) })
  })
  return { worker, messages, done }
}

test(`${WORKERS} workers share one key exclusively and keep their own keys, then all exit`, async () => {
  const ns = namespace('share')
  const shared = new SharedArrayBuffer(3 * Int32Array.BYTES_PER_ELEMENT)
  const workers = Array.from({ length: WORKERS }, (_, i) =>
    startWorker({ url: redis.url, namespace: ns, id: i + 1, rounds: ROUNDS, shared, holdMs: 2, mode: 'compete' }))

  // The main thread uses the addon while the workers run.
  const main = createRedisLockDriver(redis.url, { driver: 'redis', connection: 'main', namespace: ns })
  const mainFences = []
  for (let i = 0; i < 5; i++) {
    const lease = await main.acquire('main-thread')
    try { mainFences.push(BigInt(lease.fence)) } finally { assert.equal(await lease.release(), true) }
  }

  const results = await Promise.all(workers.map((w) => w.done))
  for (const { code, message } of results) {
    assert.equal(code, 0, 'the worker exited by itself, with code 0')
    assert.ok(message, 'the worker reported')
    assert.equal(message.error, undefined, message.error)
    assert.equal(message.releasedAll, true, 'every release deleted its own key')
    assert.equal(message.holds.length, ROUNDS)
    const own = message.own.map(BigInt)
    assert.equal(own.length, ROUNDS)
    for (let i = 1; i < own.length; i++) assert.ok(own[i] > own[i - 1], `worker ${message.id}: own fences increase`)
  }

  assert.equal(new Int32Array(shared)[2], 0, 'no two workers ever held the shared key at once')
  const holds = results.flatMap((r) => r.message.holds).sort((a, b) => a.seq - b.seq)
  assert.equal(holds.length, WORKERS * ROUNDS)
  assert.equal(new Set(holds.map((h) => h.thread)).size, WORKERS, 'every worker thread held it')
  for (let i = 1; i < holds.length; i++) {
    assert.ok(BigInt(holds[i].fence) > BigInt(holds[i - 1].fence),
      `hold ${i}: fence ${holds[i].fence} after ${holds[i - 1].fence} must be larger`)
  }

  // The main thread's addon outlives the workers' environments.
  const lease = await main.acquire('main-thread')
  assert.ok(BigInt(lease.fence) > mainFences.at(-1))
  assert.equal(await lease.release(), true)
  await main.shutdown()
})

/** Starts an 'abandon' worker: it takes its own lease, then waits on the held key 'shared'. */
async function abandonedWorker(ns, shared) {
  const doomed = startWorker({ url: redis.url, namespace: ns, id: 1, rounds: 0, shared, holdMs: 0, mode: 'abandon' })
  while (doomed.messages.length === 0) await sleep(10)
  await sleep(50) // it is waiting on 'shared' now
  return doomed
}

const clients = async () => (await redis.command('CLIENT', 'LIST')).trim().split('\n').length

test('terminating a worker that holds a lease and waits does not take the process down; new workers still work', async () => {
  const ns = namespace('terminate')
  const shared = new SharedArrayBuffer(3 * Int32Array.BYTES_PER_ELEMENT)
  const main = createRedisLockDriver(redis.url, { driver: 'redis', connection: 'main', namespace: ns })
  try {
    const blocker = await main.acquire('shared') // so the worker really waits
    const doomed = await abandonedWorker(ns, shared)
    await doomed.worker.terminate()
    assert.equal((await doomed.done).code, 1, 'terminate() ends the thread')

    // A fresh worker still loads and uses the addon after one was torn down.
    const fresh = startWorker({ url: redis.url, namespace: namespace('fresh'), id: 2, rounds: 3, shared, holdMs: 1, mode: 'compete' })
    const { code, message } = await fresh.done
    assert.equal(code, 0)
    assert.equal(message.error, undefined, message.error)

    // And the main thread's driver is untouched.
    const lease = await main.acquire('after-terminate', { waitTimeoutMs: 0 })
    assert.equal(await lease.release(), true)
    assert.equal(await blocker.release(), true)
  } finally {
    await main.shutdown()
  }
})

// The tokio runtime is shared by every thread, so a terminated worker's driver would go on
// waiting and take the key for a whole lease on behalf of a thread that no longer exists.
// The binding shuts a driver down from its environment's cleanup hook.
test('a terminated worker\'s driver stops: its waiter never takes the key, its connections close',
  async () => {
    const ns = namespace('zombie')
    const shared = new SharedArrayBuffer(3 * Int32Array.BYTES_PER_ELEMENT)
    const main = createRedisLockDriver(redis.url, { driver: 'redis', connection: 'main', namespace: ns })
    try {
      const blocker = await main.acquire('shared')
      const baseline = await clients()
      const doomed = await abandonedWorker(ns, shared)
      await doomed.worker.terminate()
      await doomed.done
      assert.equal(await blocker.release(), true)
      const lease = await main.acquire('shared', { waitTimeoutMs: 1000 }) // WAIT_TIMEOUT today: the dead worker took it
      assert.equal(await lease.release(), true)
      await sleep(200)
      assert.equal(await clients(), baseline, 'the terminated worker\'s connections are closed')
    } finally {
      await main.shutdown()
    }
  })

// The runtime belongs to the addon for the life of the process: when the only threads using
// the addon are workers, the next worker must still be served after the previous one exited
// (napi-rs stops the runtime it is given once no environment uses the addon any more).
test('with only worker threads using the addon, workers started one after another all lock and the process exits by itself', async () => {
  const ns = namespace('only-workers')
  const script = path.join(import.meta.dirname, 'workers', 'only-workers.mjs')
  const { stdout } = await new Promise((resolve, reject) => {
    execFile(process.execPath, [script, redis.url, ns, '3'], { timeout: 30_000 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`the process did not end well (${err.signal ?? err.code}): ${stdout}${stderr}`))
      else resolve({ stdout })
    })
  })
  const reports = stdout.trim().split('\n').map((line) => JSON.parse(line))
  assert.equal(reports.length, 3)
  for (const r of reports) {
    assert.equal(r.code, 0, `worker ${r.id} exited by itself`)
    assert.equal(r.error, null, r.error)
    assert.equal(r.releasedAll, true)
  }
})
