// Wrong uses of the API that the types must reject. Each `@ts-expect-error` names the
// TypeScript error the next line must produce: `tsc` fails if a line compiles after all
// (an unused directive), and __test__/packaging/types.test.mjs strips the directives and
// checks that each line fails with exactly the named error, not some other mistake.
import {
  createRedisLockDriver,
  parseRedisLockBackend,
  LockError,
  LockErrorCode,
  type AcquireTraceContext,
  type Lease,
  type LockDriver,
  type RedisLockBackendInput,
  type ReleaseTraceContext,
} from '@dokebi/lock-redis'

declare const driver: LockDriver
declare const lease: Lease
declare const err: LockError

// --- the fence is a decimal string, never a number --------------------------------------
// @ts-expect-error TS2322 fence used as a number
const asNumber: number = lease.fence
// @ts-expect-error TS2322 fence used as a bigint without BigInt()
const asBigint: bigint = lease.fence
// @ts-expect-error TS2365 fence compared with a number
const newer = lease.fence > 41
// @ts-expect-error TS2345 fence passed to Math
const biggest = Math.max(lease.fence, 1)

// --- backend options ---------------------------------------------------------------------
// @ts-expect-error TS2322 wrong driver literal
const wrongDriver = { driver: 'redlock', connection: 'main', namespace: 'svc' } satisfies RedisLockBackendInput
// @ts-expect-error TS2353 unknown option (a typo must not pass)
const unknownOption = { driver: 'redis', connection: 'main', namespace: 'svc', retryCount: 3 } satisfies RedisLockBackendInput
// @ts-expect-error TS2741 namespace is required, never defaulted
const noNamespace = { driver: 'redis', connection: 'main' } satisfies RedisLockBackendInput
// @ts-expect-error TS2322 leaseMs is a number of milliseconds, not a string
const stringLease = { driver: 'redis', connection: 'main', namespace: 'svc', leaseMs: '10s' } satisfies RedisLockBackendInput
// @ts-expect-error TS2820 notifications is one of three names (a typo gets a suggestion)
const badNotifications = { driver: 'redis', connection: 'main', namespace: 'svc', notifications: 'perkey' } satisfies RedisLockBackendInput
// @ts-expect-error TS2322 the parsed driver is always 'redis'
const otherDriver: 'memory' = parseRedisLockBackend({}).driver
// @ts-expect-error TS2322 fenceTtlMs has no default: the parsed options may lack it
const alwaysTtl: number = parseRedisLockBackend({}).fenceTtlMs

// --- connection and logger ---------------------------------------------------------------
// @ts-expect-error TS2353 a connection is a URL or { url, ... }, not host/port
createRedisLockDriver({ host: '127.0.0.1', port: 6379 }, {})
// @ts-expect-error TS2345 a connection is not a client object or a number
createRedisLockDriver(6379, {})
// @ts-expect-error TS2322 a logger level is a function (fields, msg)
createRedisLockDriver('redis://127.0.0.1:6379', {}, { warn: 'loud' })

// --- acquire -----------------------------------------------------------------------------
// @ts-expect-error TS2345 the key is a string
driver.acquire(42)
// @ts-expect-error TS2353 unknown acquire option
driver.acquire('k', { retries: 3 })
// @ts-expect-error TS2322 signal is an AbortSignal
driver.acquire('k', { signal: 'abort' })
// @ts-expect-error TS2740 acquire is asynchronous: a Promise is not a Lease
const notAwaited: Lease = driver.acquire('k')
// @ts-expect-error TS2322 the driver literal is 'redis'
const otherKind: 'memory' = driver.driver

// --- leases ------------------------------------------------------------------------------
// @ts-expect-error TS2540 valid is read-only (read afresh on every access)
lease.valid = true
// @ts-expect-error TS2540 the fence is read-only
lease.fence = '1'
// @ts-expect-error TS2322 release resolves a boolean
const releasedText: string = await lease.release()
// @ts-expect-error TS2339 there is no automatic renewal to switch on
lease.autoRenew()
// @ts-expect-error TS2741 keepAlive needs maxHoldMs: a stuck holder must not keep a lock forever
lease.keepAlive({ everyMs: 1000 })
// @ts-expect-error TS2540 the signal is read-only
lease.signal = new AbortController().signal

// --- await using: a release is asynchronous, so a lease is only AsyncDisposable -----------
async function syncUsing(): Promise<void> {
  // @ts-expect-error TS2741 plain `using` cannot await a release (a Lease has no [Symbol.dispose])
  using held = await driver.acquire('k')
}
// @ts-expect-error TS7053 the driver has no synchronous dispose either
driver[Symbol.dispose]()

// --- tracing contexts ----------------------------------------------------------------------
declare const acquireContext: AcquireTraceContext
declare const releaseContext: ReleaseTraceContext
// @ts-expect-error TS2339 contexts hold no token
const traceToken = acquireContext.token
// @ts-expect-error TS2339 a release's result is whether it deleted the key, not a lease
const releaseFence = releaseContext.result.fence

// --- errors ------------------------------------------------------------------------------
// @ts-expect-error TS2339 not an error code
const notACode = LockErrorCode.NOT_A_CODE
// @ts-expect-error TS2367 a misspelt code can never match
const misspelt = err.code === 'LOCK_BUSYY'
// @ts-expect-error TS2540 the codes object is read-only
LockErrorCode.LOCK_BUSY = 'LOCK_BUSY'

// --- stats -------------------------------------------------------------------------------
// @ts-expect-error TS2339 errors are counted by LockErrorCode only
const unknownCounter = driver.stats().errors.NOT_A_CODE
// @ts-expect-error TS2367 not a subscription state
const connected = driver.stats().subscription === 'connected'
// @ts-expect-error TS2322 stats are numbers, not strings
const waitersText: string = driver.stats().waiters

export {
  asNumber, asBigint, newer, biggest, wrongDriver, unknownOption, noNamespace, stringLease,
  otherDriver, notAwaited, otherKind, releasedText, syncUsing, traceToken, releaseFence, notACode, misspelt, unknownCounter, connected, waitersText,
}
