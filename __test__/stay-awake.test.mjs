// The runtime's thread stays awake briefly while replies are due (decision 0041): that must
// never turn into a thread that keeps a core busy while nothing happens, or while a waiter
// waits for a lock held elsewhere.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { readdirSync, readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { setTimeout as sleep } from 'node:timers/promises'
import { startRedis } from './helpers/redis.mjs'
import { uniqueNamespace, backend } from './helpers/lock.mjs'

const { createRedisLockDriver } = createRequire(import.meta.url)('../index.js')

let redis
before(async () => { redis = await startRedis() })
after(() => redis?.stop())

// CPU time (ms, 10 ms ticks) of the addon's runtime thread(s), from /proc.
function runtimeCpuMs() {
  let ticks = 0
  for (const tid of readdirSync('/proc/self/task')) {
    let comm
    try { comm = readFileSync(`/proc/self/task/${tid}/comm`, 'utf8').trim() } catch { continue }
    if (!comm.startsWith('dokebi-lock-red')) continue
    const fields = readFileSync(`/proc/self/task/${tid}/stat`, 'utf8').split(') ')[1].split(' ')
    ticks += Number(fields[11]) + Number(fields[12]) // utime, stime
  }
  return ticks * 10
}

async function cpuOver(ms) {
  const before = runtimeCpuMs()
  await sleep(ms)
  return runtimeCpuMs() - before
}

test('the runtime thread does not stay busy once calls are answered, nor while a waiter waits for a lock held elsewhere', { skip: process.platform !== 'linux' }, async () => {
  const ns = uniqueNamespace('stay-awake')
  const holder = createRedisLockDriver(redis.url, backend(ns))
  const waiter = createRedisLockDriver(redis.url, backend(ns, { pollIntervalMs: 5000, notifyPollIntervalMs: 5000 }))
  try {
    for (let i = 0; i < 20; i++) await (await holder.acquire(`k${i}`)).release()
    // Nothing due: a thread that kept polling would burn the whole second.
    const idle = await cpuOver(1000)
    assert.ok(idle < 300, `${idle} ms of runtime-thread CPU in 1 s with nothing to do`)

    const held = await holder.acquire('held')
    const waiting = waiter.acquire('held', { waitTimeoutMs: 10_000 })
    await sleep(50)
    // One reply due for seconds (the waiter's): the thread sleeps, it does not spin.
    const busy = await cpuOver(1000)
    assert.ok(busy < 300, `${busy} ms of runtime-thread CPU in 1 s while one waiter waits`)
    await held.release()
    await (await waiting).release()
  } finally {
    await Promise.all([holder.shutdown(), waiter.shutdown()])
  }
})
