// The whole public API, used the way the README tells an ES-module user to use it.
// Type-checked by `npm run test:types`; it is never run (no Redis needed).
import {
  createRedisLockDriver,
  parseRedisLockBackend,
  LockError,
  LockErrorCode,
  type AcquireOptions,
  type KeepAliveOptions,
  type AcquireTraceContext,
  type Lease,
  type LockDriver,
  type LockDriverStats,
  type LockLogger,
  type RedisConnectionLike,
  type RedisErrorLike,
  type RedisLockBackend,
  type RedisLockBackendInput,
  type RedisLockNotifications,
  type ReleaseTraceContext,
  type RenewTraceContext,
} from '@dokebi/lock-redis'
import { tracingChannel } from 'node:diagnostics_channel'
import lockRedis from '@dokebi/lock-redis' // the CommonJS module object, as Node's default import gives it
import { pino } from 'pino'

// Options: check a literal against the input type; parse fills in every default.
const input = {
  driver: 'redis',
  connection: 'main',
  namespace: 'my-service',
  leaseMs: 10_000,
  waitTimeoutMs: 5_000,
  pollIntervalMs: 25,
  notifyPollIntervalMs: 250,
  maxWaiters: 128,
  maxTrackedLeases: 10_000,
  shutdownTimeoutMs: 5_000,
  maxKeyBytes: 1024,
  minReplicas: 1,
  replicaTimeoutMs: 500,
  fenceTtlMs: 86_400_000,
  notifications: 'per-key',
} satisfies RedisLockBackendInput
const minimal: RedisLockBackendInput = { driver: 'redis', connection: 'main', namespace: 'my-service' }
const parsed: RedisLockBackend = parseRedisLockBackend(minimal)
const everyDefault: [number, number, number, number, number, number, number, number, number, number] = [
  parsed.leaseMs, parsed.waitTimeoutMs, parsed.pollIntervalMs, parsed.notifyPollIntervalMs,
  parsed.maxWaiters, parsed.maxTrackedLeases, parsed.shutdownTimeoutMs, parsed.maxKeyBytes,
  parsed.minReplicas, parsed.replicaTimeoutMs,
]
const namespace: string = parsed.namespace
const notifications: RedisLockNotifications = parsed.notifications // always filled in: 'namespace' by default
const fenceTtlMs: number | undefined = parsed.fenceTtlMs // absent unless given: no default
const fromYaml: unknown = JSON.parse('{"driver":"redis","connection":"main","namespace":"x"}')
parseRedisLockBackend(fromYaml) // dokebi-lock passes raw config: `unknown` is accepted

// Connections: a URL, or an options.dokebi-redis.connections entry.
const byUrl: RedisConnectionLike = 'redis://127.0.0.1:6379/0'
const byEntry: RedisConnectionLike = {
  url: 'redis://127.0.0.1:6379/0',
  name: 'main',
  connectTimeoutMs: 2000,
  commandTimeoutMs: 2000,
  pingIntervalMs: 30000,
}
const tlsCluster: RedisConnectionLike = {
  url: 'rediss://redis.internal:6380',
  cluster: true,
  tls: { ca: '-----BEGIN CERTIFICATE-----…', cert: '…', key: '…' },
}
const throughSentinel: RedisConnectionLike = {
  url: 'rediss-sentinel://locker:pw@sentinel-1,sentinel-2:26380/0#locks',
  sentinelUsername: 'watcher',
  sentinelPassword: 'pw',
  tls: { ca: '-----BEGIN CERTIFICATE-----…' },
}

// Loggers: real pino, a partial object, none.
const logger: LockLogger = pino({ level: 'debug' })
const partial: LockLogger = { error: (fields, msg) => console.error(fields, msg) }
const driver: LockDriver = createRedisLockDriver(byEntry, input, logger)
const quiet = createRedisLockDriver(byUrl, parsed)
createRedisLockDriver(byUrl, fromYaml, partial)
createRedisLockDriver(byUrl, minimal, pino())
const kind: 'redis' = driver.driver
createRedisLockDriver(tlsCluster, minimal)
createRedisLockDriver(throughSentinel, minimal)

// Metrics: cheap to poll.
function metrics(d: LockDriver): Record<string, number> {
  const stats: LockDriverStats = d.stats()
  const subscription: 'off' | 'starting' | 'live' | 'partial' | 'unsupported' | 'failed' = stats.subscription
  const busy: number = stats.errors.LOCK_BUSY
  const errors = Object.entries(stats.errors).reduce((sum, [, n]) => sum + n, 0)
  return {
    waiters: stats.waiters, lines: stats.lines, inProgress: stats.inProgress, trackedLeases: stats.trackedLeases,
    redisAttempts: stats.redisAttempts, notificationsReceived: stats.notificationsReceived,
    deadConnections: stats.deadConnections,
    live: subscription === 'live' ? 1 : 0, busy, errors,
  }
}

// The fence is a decimal string: compare as BigInt.
let lastFence = 0n
function fencedWrite(fence: string): void {
  const f = BigInt(fence)
  if (f <= lastFence) throw new Error('stale fence')
  lastFence = f
}

async function job(signal: AbortSignal): Promise<boolean> {
  const options: AcquireOptions = { signal, waitTimeoutMs: 2_000 }
  const lease: Lease = await driver.acquire('job:nightly-report', options)
  try {
    const key: string = lease.key
    const fence: string = lease.fence
    fencedWrite(fence)
    if (lease.valid && lease.remainingMs < 1_000) await lease.renew()
    const keepAlive: KeepAliveOptions = { maxHoldMs: 60_000, everyMs: 1_000 }
    lease.keepAlive(keepAlive)
    // An option passed on as it came (`undefined` when the caller gave none) counts as absent,
    // as for every other optional field, also under exactOptionalPropertyTypes.
    const everyMs: number | undefined = undefined
    lease.keepAlive({ maxHoldMs: 60_000, everyMs })
    const held: AbortSignal = AbortSignal.any([lease.signal, signal])
    void held
    return key.length > 0
  } finally {
    const released: boolean = await lease.release()
    void released
  }
}

// `await using`: the lease releases itself at the end of the block (also on a throw), then
// the driver shuts down; both are AsyncDisposable.
async function scoped(url: string): Promise<string> {
  await using backend = createRedisLockDriver(url, minimal)
  await using lease = await backend.acquire('job:nightly-report')
  fencedWrite(lease.fence)
  return lease.fence
}
const disposables: AsyncDisposable[] = [driver]
async function disposeLease(lease: Lease): Promise<void> {
  await lease[Symbol.asyncDispose]()
}

// Tracing channels for APM: typed contexts, the lease (and its fence) after an acquire.
const acquires = tracingChannel<unknown, AcquireTraceContext>('dokebi:lock-redis:acquire')
const started = new WeakMap<object, number>()
acquires.subscribe({
  start(ctx) { started.set(ctx, performance.now()); const where: string = `${ctx.namespace}/${ctx.key}`; void where },
  end() {},
  asyncStart() {},
  asyncEnd(ctx) { const fence: string | undefined = ctx.result?.fence; void fence },
  error(ctx) { const code: LockErrorCode | undefined = ctx.error?.code; void code },
})
tracingChannel<unknown, ReleaseTraceContext>('dokebi:lock-redis:release').asyncEnd.subscribe((message) => {
  const ctx = message as ReleaseTraceContext
  const deleted: boolean | undefined = ctx.result
  const fence: string = ctx.lease.fence
  void [deleted, fence]
})
const renews = tracingChannel<unknown, RenewTraceContext>('dokebi:lock-redis:renew')
const renewing: boolean = renews.hasSubscribers

// `exactOptionalPropertyTypes` users forward optional values as they are.
async function forward(opts: { signal?: AbortSignal; waitTimeoutMs?: number }): Promise<Lease> {
  const options: AcquireOptions = {}
  if (opts.signal) options.signal = opts.signal
  if (opts.waitTimeoutMs !== undefined) options.waitTimeoutMs = opts.waitTimeoutMs
  return quiet.acquire('k', options)
}

function never(value: never): never {
  throw new Error(`unhandled ${String(value)}`)
}

// Every code is handled; a new code would make `never(err.code)` fail to compile.
function describe(err: unknown): string {
  if (!(err instanceof LockError)) return 'not a lock error'
  const code: LockErrorCode = err.code
  const name: 'LockError' = err.name
  const message: string = err.message
  switch (err.code) {
    case LockErrorCode.INVALID_OPTIONS:
    case LockErrorCode.INVALID_KEY:
      return `bug: ${message}`
    case LockErrorCode.LOCK_BUSY:
    case LockErrorCode.WAIT_TIMEOUT:
    case LockErrorCode.QUEUE_FULL:
    case LockErrorCode.TOO_MANY_LEASES:
      return 'busy, try later'
    case 'ABORTED':
      return `aborted: ${String(err.cause)}`
    case 'SHUT_DOWN':
    case 'LEASE_EXPIRED':
    case 'LEASE_LOST':
      return code
    case 'PROVIDER_FAILED':
    case 'OUTCOME_UNKNOWN': {
      // The cause is shaped as @dokebi/redis shapes its errors; classify by structure.
      const cause = err.cause as RedisErrorLike
      const plugin: 'dokebi-redis' = cause.plugin
      const outcome: 'not-submitted' | 'unknown' | 'rejected' = cause.outcome
      const status: 503 | undefined = cause.status
      const serverCode: string | undefined = cause.serverCode
      return `${plugin} ${cause.code} ${outcome} ${cause.retryable} ${status} ${serverCode} ${name}`
    }
    case 'CLEANUP_TIMEOUT':
      return 'cleanup timed out'
    case 'CLEANUP_FAILED':
      return `cleanup failed: ${(err.cause as AggregateError).errors.length}`
    default:
      return never(err.code)
  }
}

const codes: readonly LockErrorCode[] = Object.values(LockErrorCode)
const busy: 'LOCK_BUSY' = LockErrorCode.LOCK_BUSY
const sameModule: typeof createRedisLockDriver = lockRedis.createRedisLockDriver

const controller = new AbortController()
try {
  await job(controller.signal)
  await forward({ waitTimeoutMs: 0 })
} catch (err) {
  describe(err)
} finally {
  await Promise.all([driver.shutdown(), quiet.shutdown()])
}

export { everyDefault, namespace, kind, codes, busy, sameModule, metrics, scoped, disposables, disposeLease, renewing }
