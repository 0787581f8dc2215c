'use strict'
// A thin wrapper over the generated binding: the LockError class, AbortSignal wiring, the
// logger adapter, `await using` and tracing channels. Every lock decision is made in Rust (src/).

// The generated loader's own error does not name the platform; this one does.
function loadBinding() {
  try {
    return require('./binding.js')
  } catch (cause) {
    const { platform, arch } = process
    let target = `${platform}-${arch}`
    if (platform === 'linux') {
      process.report.excludeNetwork = true
      target += process.report.getReport().header.glibcVersionRuntime ? '-gnu' : '-musl'
    } else if (platform === 'win32') target += '-msvc'
    const prebuilt = ['linux-x64-gnu', 'linux-x64-musl', 'linux-arm64-gnu', 'linux-arm64-musl', 'darwin-x64', 'darwin-arm64', 'win32-x64-msvc', 'win32-arm64-msvc']
    const fix = prebuilt.includes(target)
      ? `Its binary comes in the optional dependency @dokebi/lock-redis-${target}: install without --omit=optional / --no-optional (if it is still missing, remove node_modules and package-lock.json and install again: npm/cli#4828).`
      : 'No prebuilt binary exists for it; build from source with Rust (npm run build).'
    throw new Error(`@dokebi/lock-redis: no native binding could be loaded for ${target} (Node ${process.version}). Prebuilt: ${prebuilt.join(', ')}. ${fix}`, { cause })
  }
}

const native = loadBinding()
const { isMainThread } = require('node:worker_threads')
const { tracingChannel } = require('node:diagnostics_channel')

// For APM (decision 0036). Contexts carry the key, the namespace and the Lease, whose own
// fields are key and fence: never a token, a password or an address. Without a subscriber
// nothing is traced, not even a context object is made.
const channels = {
  acquire: tracingChannel('dokebi:lock-redis:acquire'),
  release: tracingChannel('dokebi:lock-redis:release'),
  renew: tracingChannel('dokebi:lock-redis:renew'),
}

const LockErrorCode = Object.freeze(Object.fromEntries(native.errorCodes().map((code) => [code, code])))

class LockError extends Error {
  constructor(code, message, options) {
    super(message, options)
    this.name = 'LockError'
    this.code = code
  }
}

// Shaped as @dokebi/redis shapes its errors, so callers classify by structure.
class RedisError extends Error {
  constructor({ code, outcome, retryable, serverCode, message }) {
    super(message)
    // Enumerable, so loggers that serialise `cause` as a plain object (pino) keep it.
    Object.defineProperty(this, 'message', { value: message, enumerable: true, writable: true, configurable: true })
    this.name = 'RedisError'
    this.plugin = 'dokebi-redis'
    this.code = code
    this.outcome = outcome
    this.retryable = retryable
    if (retryable) this.status = 503
    if (serverCode) this.serverCode = serverCode
  }
}

function toLockError(native, signal) {
  let cause
  if (native.code === LockErrorCode.ABORTED && signal) cause = signal.reason
  else if (native.cause) cause = new RedisError(native.cause)
  else if (native.causes) cause = new AggregateError(native.causes.map((c) => toLockError(c)), native.message)
  return new LockError(native.code, native.message, cause === undefined ? undefined : { cause })
}

function invalidOptions(message) {
  return new LockError(LockErrorCode.INVALID_OPTIONS, message)
}

function parseRedisLockBackend(input) {
  const parsed = native.parseBackend(input)
  if (parsed.driver !== 'redis') throw toLockError(parsed)
  return parsed
}

// pino-style `(fields, message)`; a missing level or a throwing logger never breaks a lock.
function logAdapter(logger) {
  if (logger == null) return undefined
  return (level, fields, message) => {
    const log = logger[level]
    if (typeof log !== 'function') return
    const out = { code: fields.code }
    if (fields.reason != null) out.reason = fields.reason
    if (fields.policy != null) out.policy = fields.policy
    if (fields.cause != null) out.cause = new RedisError(fields.cause)
    try {
      log.call(logger, out, message)
    } catch {}
  }
}

// Each backend's leases whose `signal` was read and has not aborted yet, by id: the native
// listener (one per backend, set at the first read) wakes them (decision 0151).
const watchedOf = new WeakMap()

function watchedLeases(backend) {
  let watched = watchedOf.get(backend)
  if (watched === undefined) {
    watched = new Map()
    watchedOf.set(backend, watched)
    // Weak on the native side: it never keeps the process alive.
    backend.setLeaseListener((id) => watched.get(id)?.())
  }
  return watched
}

// The native side hands a lease over as `{ id, fence }`; its calls go to the backend by id.
class Lease {
  #backend
  #handle
  #id
  #key
  #fence
  #namespace
  #released = false
  // Made at the first read of `signal`, not before: a caller who never reads it pays nothing.
  #controller
  #timer
  constructor(key, namespace, backend, handle, nativeLease) {
    this.#key = key
    this.#namespace = namespace
    this.#backend = backend
    this.#handle = handle
    this.#id = nativeLease.id
    // A getter, like `key`: read-only as the contract says, and ~0.2 µs less per acquire on
    // the JS thread than a non-writable own property (docs/decisions/0181).
    this.#fence = nativeLease.fence
  }
  get key() {
    return this.#key
  }
  get fence() {
    return this.#fence
  }
  get valid() {
    const valid = this.#backend.leaseValid(this.#id)
    // `valid` and `signal` agree at every read: a deadline timer that is late does not
    // leave the signal behind.
    if (!valid && this.#controller !== undefined) this.#check()
    return valid
  }
  get remainingMs() {
    const ms = this.#backend.leaseRemainingMs(this.#id)
    if (ms === 0 && this.#controller !== undefined) this.#check()
    return ms
  }
  // Aborted the moment the lease stops being valid; `reason` is a LockError saying why.
  get signal() {
    if (this.#controller === undefined) {
      this.#controller = new AbortController()
      // The listener first (once per backend), then the watch, so no end falls between.
      const watched = watchedLeases(this.#backend)
      const ended = this.#backend.watchLease(this.#id)
      if (ended !== null) this.#abort(ended)
      else {
        watched.set(this.#id, () => this.#check())
        this.#arm()
      }
    } else if (!this.#controller.signal.aborted) this.#check()
    return this.#controller.signal
  }
  // Asks the native lease whether it ended, and aborts the signal if so; else the deadline
  // timer waits for the (maybe renewed) deadline.
  #check() {
    if (this.#controller.signal.aborted) return
    const ended = this.#backend.leaseEnded(this.#id)
    if (ended !== null) this.#abort(ended)
    else this.#arm()
  }
  #arm() {
    clearTimeout(this.#timer)
    // Unref'd: a lease's signal never keeps the process alive. Renewals move the deadline
    // on; the timer then finds the lease valid and waits again.
    this.#timer = setTimeout(() => this.#check(), this.#backend.leaseRemainingMs(this.#id))
    this.#timer.unref()
  }
  #abort(ended) {
    clearTimeout(this.#timer)
    this.#timer = undefined
    watchedOf.get(this.#backend)?.delete(this.#id)
    // `false`: the backend no longer tracks it, released by release() or by shutdown.
    const reason =
      ended !== false
        ? toLockError(ended)
        : this.#released
          ? new LockError(LockErrorCode.LEASE_EXPIRED, 'the lease was released')
          : new LockError(LockErrorCode.SHUT_DOWN, 'shutdown released the lease')
    this.#controller.abort(reason)
  }
  keepAlive(options) {
    const failed = this.#backend.keepAlive(this.#id, options)
    if (failed) throw toLockError(failed)
  }
  release() {
    this.#released = true
    if (!channels.release.hasSubscribers) return this.#release()
    return channels.release.tracePromise(this.#release, { key: this.#key, namespace: this.#namespace, lease: this }, this)
  }
  async #release() {
    const releasing = native.release(this.#handle, this.#id)
    // Invalid from the call on: the signal aborts now, not when Redis answers.
    if (this.#controller !== undefined) this.#check()
    const released = await releasing
    if (typeof released === 'boolean') return released
    throw toLockError(released)
  }
  renew() {
    if (!channels.renew.hasSubscribers) return this.#renew()
    return channels.renew.tracePromise(this.#renew, { key: this.#key, namespace: this.#namespace, lease: this }, this)
  }
  async #renew() {
    const failed = await this.#backend.renew(this.#id)
    if (this.#controller !== undefined) this.#check()
    if (failed) throw toLockError(failed)
  }
  // `await using`: release by token unless already released. `false` (no longer ours:
  // expired or taken over) is the quiet end of a block; a failed release rejects as release() does.
  async [Symbol.asyncDispose]() {
    await this.release()
  }
}

const ACQUIRE_OPTIONS = new Set(['signal', 'waitTimeoutMs'])
const WITH_LOCK_OPTIONS = new Set([...ACQUIRE_OPTIONS, 'maxHoldMs', 'everyMs'])

function checkFields(what, options, known) {
  if (options === null || typeof options !== 'object') throw invalidOptions(`${what} must be an object`)
  for (const name of Object.keys(options)) {
    if (!known.has(name)) {
      // The field's name is the caller's code, not a secret: naming it makes the typo findable.
      const shown = name.replace(/\p{Cc}/gu, '').slice(0, 64)
      throw invalidOptions(`${what} has an unknown field '${shown}'; known fields: ${[...known].join(', ')}`)
    }
  }
}

function createRedisLockDriver(connection, options, logger) {
  if (logger != null && typeof logger !== 'object' && typeof logger !== 'function') {
    throw invalidOptions('logger must be an object with debug/info/warn/error methods')
  }
  const created = native.createDriver(connection, options, logAdapter(logger), !isMainThread)
  if (!(created instanceof native.NativeDriver)) throw toLockError(created)
  const backend = created
  // acquire and release take this handle rather than being methods of the backend: a
  // method call costs napi-rs a lock and a map entry for its `this` (docs/decisions/0182).
  const handle = backend.handle()
  // For tracing-channel contexts: read once from the driver, not parsed from the options again.
  const { namespace } = backend

  function acquire(key, acquireOptions) {
    if (!channels.acquire.hasSubscribers) return acquireLease(key, acquireOptions)
    return channels.acquire.tracePromise(acquireLease, { key, namespace }, undefined, key, acquireOptions)
  }

  async function acquireLease(key, acquireOptions) {
    if (acquireOptions === undefined) return leaseOf(key, await native.acquire(handle, key, undefined))
    checkFields('acquire options', acquireOptions, ACQUIRE_OPTIONS)
    const { signal, waitTimeoutMs } = acquireOptions
    if (signal !== undefined && !(signal instanceof AbortSignal)) {
      throw invalidOptions('acquire options.signal must be an AbortSignal')
    }
    if (signal?.aborted) {
      throw new LockError(LockErrorCode.ABORTED, 'the acquire was aborted by its signal', { cause: signal.reason })
    }
    if (signal === undefined) return leaseOf(key, await native.acquire(handle, key, waitTimeoutMs))
    const cancel = new native.CancelToken()
    const onAbort = () => cancel.cancel()
    signal.addEventListener('abort', onAbort, { once: true })
    try {
      return leaseOf(key, await native.acquire(handle, key, waitTimeoutMs, cancel), signal)
    } finally {
      signal.removeEventListener('abort', onAbort)
    }
  }

  function leaseOf(key, result, signal) {
    if (typeof result.fence === 'string') return new Lease(key, namespace, backend, handle, result)
    throw toLockError(result, signal)
  }

  // acquire, an optional bounded keep-alive, fn(lease), release: whatever fn does. A release
  // that fails after fn settled does not replace fn's outcome: the driver goes on releasing
  // by token in the background, as after any failed release, and the warn event says so.
  async function withLock(key, fn, options = {}) {
    if (typeof fn !== 'function') throw invalidOptions('withLock needs a function to run under the lock')
    checkFields('withLock options', options, WITH_LOCK_OPTIONS)
    const { signal, waitTimeoutMs, maxHoldMs, everyMs } = options
    let keepAlive
    if (maxHoldMs !== undefined) {
      keepAlive = everyMs === undefined ? { maxHoldMs } : { maxHoldMs, everyMs }
      const failed = backend.checkKeepAlive(keepAlive)
      if (failed) throw toLockError(failed)
    } else if (everyMs !== undefined) {
      throw invalidOptions('withLock options.everyMs needs maxHoldMs')
    }
    const acquireOptions = {}
    if (signal !== undefined) acquireOptions.signal = signal
    if (waitTimeoutMs !== undefined) acquireOptions.waitTimeoutMs = waitTimeoutMs
    const lease = await acquire(key, acquireOptions)
    let value
    try {
      if (keepAlive) lease.keepAlive(keepAlive)
      value = await fn(lease)
    } catch (err) {
      await releaseAfter(lease)
      throw err
    }
    await releaseAfter(lease)
    return value
  }

  async function releaseAfter(lease) {
    try {
      await lease.release()
    } catch (cause) {
      warn({ code: 'LOCK_RELEASE_FAILED', cause }, 'withLock could not confirm its release; it goes on by token in the background')
    }
  }

  function warn(fields, message) {
    try {
      logger?.warn?.(fields, message)
    } catch {}
  }

  async function shutdown() {
    const failed = await backend.shutdown()
    if (failed) throw toLockError(failed)
  }

  // Counters for metrics; cheap enough to poll. Errors keep the contract's order of codes.
  function stats() {
    const native = backend.stats()
    return { ...native, errors: Object.fromEntries(Object.keys(LockErrorCode).map((code) => [code, native.errors[code]])) }
  }

  // `await using backend = createRedisLockDriver(…)` shuts it down at the end of the block.
  return Object.freeze({ driver: 'redis', acquire, withLock, shutdown, stats, [Symbol.asyncDispose]: shutdown })
}

module.exports = { createRedisLockDriver, parseRedisLockBackend, LockError, LockErrorCode }
