// Example 16: lock waits and hold times in your traces and metrics, from the driver's
// tracing channels (node:diagnostics_channel). A native addon cannot be monkey-patched; an APM
// subscribes to `dokebi:lock-redis:acquire`, `…:release` and `…:renew` instead. This small
// subscriber turns them into spans (nested under the caller's span through AsyncLocalStorage,
// as OpenTelemetry does) and into perf_hooks histograms. No dependency beyond Node.
//
//   REDIS_URL=redis://127.0.0.1:6379/0 node examples/16-tracing-channels/index.mjs
import { AsyncLocalStorage } from 'node:async_hooks'
import { tracingChannel } from 'node:diagnostics_channel'
import { createHistogram } from 'node:perf_hooks'
import { setTimeout as sleep } from 'node:timers/promises'
import { createRedisLockDriver } from '@dokebi/lock-redis'

// ------------------------------------------------------------- a tiny tracer ----

const currentSpan = new AsyncLocalStorage()
let nextId = 1
const spans = []

function startSpan(name, attributes) {
  return { id: nextId++, parent: currentSpan.getStore()?.id ?? null, name, attributes, start: performance.now() }
}
function endSpan(span, status) {
  span.ms = performance.now() - span.start
  span.status = status
  spans.push(span)
  const indent = span.parent ? '  ' : ''
  console.log(`${indent}span #${span.id} ${span.name} ${span.ms.toFixed(2)} ms ${status} ${JSON.stringify(span.attributes)}${span.parent ? ` (child of #${span.parent})` : ''}`)
}
async function inSpan(name, fn) {
  const span = startSpan(name, {})
  try {
    const result = await currentSpan.run(span, fn)
    endSpan(span, 'ok')
    return result
  } catch (err) {
    endSpan(span, 'error')
    throw err
  }
}

// -------------------------------------------------- the channel subscriber ----

const µs = { wait: createHistogram(), hold: createHistogram() }
const errors = {}
const spanOf = new WeakMap() // context → span
const acquiredAt = new WeakMap() // lease → when the acquire resolved

for (const op of ['acquire', 'release', 'renew']) {
  tracingChannel(`dokebi:lock-redis:${op}`).subscribe({
    // start runs synchronously inside the caller's call, so currentSpan is the caller's span.
    // The key is your own value: keep it, hash it or drop it as your tracing policy says.
    start(ctx) { spanOf.set(ctx, startSpan(`lock.${op}`, { 'lock.namespace': ctx.namespace, 'lock.key': ctx.key })) },
    end() {},
    asyncStart() {},
    error(ctx) { errors[ctx.error.code] = (errors[ctx.error.code] ?? 0) + 1 },
    asyncEnd(ctx) {
      const span = spanOf.get(ctx)
      const elapsedUs = Math.max(1, Math.round((performance.now() - span.start) * 1000))
      if (ctx.error) {
        span.attributes['lock.error'] = ctx.error.code
      } else if (op === 'acquire') {
        span.attributes['lock.fence'] = ctx.result.fence // a decimal string: never a Number
        µs.wait.record(elapsedUs)
        acquiredAt.set(ctx.result, performance.now())
      } else if (op === 'release') {
        span.attributes['lock.deleted'] = ctx.result // false: it was no longer ours
        const since = acquiredAt.get(ctx.lease)
        if (since !== undefined) µs.hold.record(Math.max(1, Math.round((performance.now() - since) * 1000)))
      }
      endSpan(span, ctx.error ? 'error' : 'ok')
    },
  })
}

// ------------------------------------------------------------------ the app ----

const url = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379/0'
await using locks = createRedisLockDriver(url, { driver: 'redis', connection: 'main', namespace: 'example-16', leaseMs: 2000 })

async function nightlyReport(worker) {
  await inSpan(`job ${worker}`, async () => {
    await using lease = await locks.acquire('job:nightly-report', { waitTimeoutMs: 2000 })
    await sleep(20) // the work, fenced by lease.fence downstream
    await lease.renew()
    await sleep(10)
  }) // the lease is released here, inside the job's span
}

await Promise.all([nightlyReport('A'), nightlyReport('B'), nightlyReport('C')])
await inSpan('job D (busy)', async () => {
  await using held = await locks.acquire('job:weekly')
  await locks.acquire('job:weekly', { waitTimeoutMs: 0 }).catch((err) => console.log(`  D gave up: ${err.code}`))
})

const ms = (h, p) => (h.count ? (h.percentile(p) / 1000).toFixed(2) : '-')
console.log(`lock wait (acquire) ms: n=${µs.wait.count} p50=${ms(µs.wait, 50)} max=${ms(µs.wait, 100)}`)
console.log(`lock hold ms: n=${µs.hold.count} p50=${ms(µs.hold, 50)} max=${ms(µs.hold, 100)}`)
console.log(`errors by code: ${JSON.stringify(errors)}`)
console.log(`spans: ${spans.length}`)
