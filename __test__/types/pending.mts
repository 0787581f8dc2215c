// Uses the types should allow but index.d.ts does not yet (see the packaging report);
// checked by a `todo` test in __test__/packaging/types.test.mjs, so a failure here is
// reported, not fatal. Move each line into usage.mts once it compiles.
import { LockError, LockErrorCode, type LockDriver, type RedisConnectionLike, type RedisLockBackendInput } from '@dokebi/lock-redis'

declare const driver: LockDriver
declare const maybeSignal: AbortSignal | undefined
declare const maybeWait: number | undefined
declare const maybeLease: number | undefined

// LockError's constructor is (code, message?, options?) at run time (index.js).
const made = new LockError(LockErrorCode.LOCK_BUSY, 'busy', { cause: new Error('inner') })

// The runtime treats `undefined` as absent, so `exactOptionalPropertyTypes` users may pass it.
await driver.acquire('k', { signal: maybeSignal, waitTimeoutMs: maybeWait })
const input: RedisLockBackendInput = { driver: 'redis', connection: 'main', namespace: 'svc', leaseMs: maybeLease }
const conn: RedisConnectionLike = { url: 'redis://127.0.0.1:6379', commandTimeoutMs: maybeWait }

export { made, input, conn }
