/// <reference lib="esnext.disposable" />
/**
 * @dokebi/lock-redis — the single-Redis lease driver of @dokebi/lock, as a Rust addon.
 * Single-Redis: one primary holds each lock (standalone, through Sentinel, or a Cluster
 * slot's owner), never a Redlock quorum.
 *
 * A lease is a lock with an expiry and a fencing token. Mutual exclusion holds only when
 * the store you write to checks the fence: see docs/fencing.md.
 */

/** Every `LockError.code`. */
export type LockErrorCode =
  | 'INVALID_OPTIONS'
  | 'INVALID_KEY'
  | 'LOCK_BUSY'
  | 'WAIT_TIMEOUT'
  | 'QUEUE_FULL'
  | 'TOO_MANY_LEASES'
  | 'ABORTED'
  | 'SHUT_DOWN'
  | 'LEASE_EXPIRED'
  | 'LEASE_LOST'
  | 'PROVIDER_FAILED'
  | 'OUTCOME_UNKNOWN'
  | 'CLEANUP_TIMEOUT'
  | 'CLEANUP_FAILED'

/** The codes as a frozen object, each mapped to itself: `LockErrorCode.LOCK_BUSY === 'LOCK_BUSY'`. */
export declare const LockErrorCode: { readonly [K in LockErrorCode]: K }

/**
 * The one error class of the driver. Classify by `code`. For PROVIDER_FAILED and
 * OUTCOME_UNKNOWN `cause` is a {@link RedisErrorLike}; for ABORTED it is `signal.reason`;
 * for CLEANUP_FAILED an `AggregateError` of the failed releases. An internal error of the
 * driver (a bug) is OUTCOME_UNKNOWN (CLEANUP_FAILED from shutdown) without a cause. Messages
 * never hold a key, a token, a password or an address.
 */
export declare class LockError extends Error {
  constructor(code: LockErrorCode, message?: string, options?: ErrorOptions)
  readonly name: 'LockError'
  readonly code: LockErrorCode
  readonly cause?: unknown
}

/** The Redis failure behind PROVIDER_FAILED / OUTCOME_UNKNOWN, shaped as @dokebi/redis shapes its own. */
export interface RedisErrorLike extends Error {
  readonly name: 'RedisError'
  readonly plugin: 'dokebi-redis'
  readonly code: 'CONNECTION_FAILED' | 'CONNECTION_LOST' | 'COMMAND_TIMEOUT' | 'COMMAND_REJECTED' | 'UNEXPECTED_REPLY'
  /** `not-submitted` and `rejected`: surely no effect. `unknown`: Redis may have run it. */
  readonly outcome: 'not-submitted' | 'unknown' | 'rejected'
  /** True (with `status: 503`) where the same call may succeed later. */
  readonly retryable: boolean
  readonly status?: 503
  /** The first word of a server error reply, e.g. `OOM`, `NOPERM`, `READONLY`; `NOREPLICAS` also when too few replicas acknowledged a write (minReplicas). */
  readonly serverCode?: string
}

/**
 * Where Redis is. The Redis I/O runs in Rust, so the driver takes an address, not a JS client.
 *
 * Through Sentinel: `redis-sentinel://[[user]:password@]host[:port][,host[:port]]…[/db]#masterName`
 * (Sentinel port 26379 by default; the credentials and database are the data nodes'), or
 * `rediss-sentinel://…` for TLS to the Sentinels and the data nodes. The driver asks the
 * Sentinels in the listed order, confirms the primary with ROLE and follows it through
 * failovers (docs/redis-ha.md, "Connecting through Sentinel").
 */
export type RedisConnectionLike =
  | string
  | {
      /** `redis://`, `rediss://`, `redis+unix://`, `unix://`, `redis-sentinel://` or `rediss-sentinel://`; several comma-separated hosts only with `cluster: true` or Sentinel. */
      url: string
      /** The connection's name in options.dokebi-redis.connections; must equal `options.connection` when given. */
      name?: string | undefined
      /** Default 2000. */
      connectTimeoutMs?: number | undefined
      /** Default 2000. A reply later than this is OUTCOME_UNKNOWN. */
      commandTimeoutMs?: number | undefined
      /** Default 30000; 0 turns it off. Every connection the driver holds sends a PING once it has carried nothing this long; one unanswered within `commandTimeoutMs` is dead and replaced (a subscription falls back to polling and subscribes again). In a Cluster every node is PINGed once per interval. */
      pingIntervalMs?: number | undefined
      /** `url` names one node of a Redis Cluster, or several seed nodes (`redis://[user:password@]host[:port],host[:port]…`). Not with a Sentinel URL. */
      cluster?: boolean | undefined
      /** The Sentinels' own user (Sentinel URLs only); the URL's credentials are the data nodes'. */
      sentinelUsername?: string | undefined
      /** The Sentinels' own password (Sentinel URLs only). Never printed. */
      sentinelPassword?: string | undefined
      /** PEM strings, for `rediss://` (or `rediss-sentinel://`: Sentinels and data nodes) with a private CA or a client certificate (cert and key together). */
      tls?: { ca?: string | undefined; cert?: string | undefined; key?: string | undefined } | undefined
    }

/** The backend options, validated by {@link parseRedisLockBackend}. Unknown fields are rejected. */
export interface RedisLockBackendInput {
  driver: 'redis'
  /** A name in options.dokebi-redis.connections. Required. */
  connection: string
  /** Required, never defaulted; no whitespace, control characters, `{` or `}`. */
  namespace: string
  /** 1 .. 2^31-1, default 10000. */
  leaseMs?: number | undefined
  /** 0 .. 2^31-1, default 5000; 0 tries once. */
  waitTimeoutMs?: number | undefined
  /** Safety interval without a live subscription, ≥ 1, default 25. */
  pollIntervalMs?: number | undefined
  /** Safety interval with a live subscription, ≥ 1, default 250. */
  notifyPollIntervalMs?: number | undefined
  /** All acquires in progress on the backend, default 128. */
  maxWaiters?: number | undefined
  /** Default 10000. */
  maxTrackedLeases?: number | undefined
  /** How long `shutdown()` waits for releases and acquires in progress (then CLEANUP_TIMEOUT), ≥ 0, default 5000. */
  shutdownTimeoutMs?: number | undefined
  /** UTF-8 bytes of a key, default 1024. */
  maxKeyBytes?: number | undefined
  /**
   * Extension: replicas that must acknowledge (WAIT) a winning acquire and a renew before it
   * counts; default 0 (no WAIT). Too few: PROVIDER_FAILED with a retryable NOREPLICAS cause.
   * With `cluster: true`, confirmed per node by a rewrite and WAIT in one pipeline. docs/redis-ha.md.
   */
  minReplicas?: number | undefined
  /**
   * Extension: the WAIT timeout in ms, 1 .. 2^31-1, default 500. With `minReplicas` > 0 it must
   * be below the connection's `commandTimeoutMs` (INVALID_OPTIONS otherwise): a WAIT blocks the
   * commands queued behind it.
   */
  replicaTimeoutMs?: number | undefined
  /**
   * Opt-in: a newly seeded fence counter expires after this many ms (1 .. 2^53-1) and is seeded
   * again from Redis TIME, so fences keep rising. Absent: counters never expire.
   */
  fenceTtlMs?: number | undefined
  /**
   * Extension: where releases are announced and waiters listen; default `'namespace'` (the
   * TypeScript driver's one channel `<namespace>:lock-released`). `'per-key'`: a release
   * publishes on `<namespace>:lock-released:{<sha256 hex of the key>}` only (sharded pub/sub
   * on a Redis Cluster 7.0+), and a process subscribes only to the keys it waits on.
   * `'both'`: publishes on both channels and listens per key, for a rolling migration.
   * docs/waiting.md, "Release notifications per key".
   */
  notifications?: RedisLockNotifications | undefined
}

/** The values of {@link RedisLockBackendInput.notifications}. */
export type RedisLockNotifications = 'namespace' | 'per-key' | 'both'

/** Options without a default: {@link parseRedisLockBackend} returns them only when given. */
type OptionalBackendFields = 'fenceTtlMs'

/** The options with every default filled in. */
export type RedisLockBackend = {
  [K in Exclude<keyof RedisLockBackendInput, OptionalBackendFields>]-?: Exclude<RedisLockBackendInput[K], undefined>
} & { [K in OptionalBackendFields]?: Exclude<RedisLockBackendInput[K], undefined> }

export interface AcquireOptions {
  /** Aborting rejects with ABORTED whose `cause` is `signal.reason`. */
  signal?: AbortSignal | undefined
  /** Overrides the backend's waitTimeoutMs for this call; 0 tries once. */
  waitTimeoutMs?: number | undefined
}

/**
 * `await using lease = await backend.acquire(key)` releases it at the end of the block:
 * quietly when it is no longer ours (already released, expired, lost); a release that fails
 * rejects with the LockError `release()` would.
 */
export interface Lease extends AsyncDisposable {
  /** The key as given to `acquire`. */
  readonly key: string
  /** Decimal string, larger for every new lease of the key. Compare as BigInt, never as Number. */
  readonly fence: string
  /** Read afresh on every access; a conservative local estimate. */
  readonly valid: boolean
  /** Read afresh; 0 once not valid. */
  readonly remainingMs: number
  /** true: this call deleted our key; false: it was no longer ours. Call it in `finally`, or use `await using`. */
  release(): Promise<boolean>
  /** Extends to leaseMs from the renew's submission. LEASE_EXPIRED / LEASE_LOST when it cannot. */
  renew(): Promise<void>
  /**
   * Aborted the moment `valid` turns false, for any reason; `reason` is a `LockError`:
   * LEASE_EXPIRED (the local deadline passed, or `release()` was called), LEASE_LOST (a renew
   * found another owner or none, or, with Sentinel and minReplicas 0, a followed failover),
   * OUTCOME_UNKNOWN (a renew whose outcome is unknown),
   * SHUT_DOWN (shutdown released it), or the error of the keep-alive renewal that failed.
   * Made at its first read: a lease whose signal is never read pays nothing for it.
   */
  readonly signal: AbortSignal
  /**
   * Renews on the addon's threads every `everyMs` (default leaseMs / 3) with `renew()`'s
   * rules, until `release()`, shutdown, the first failed renewal (the lease ends and `signal`
   * aborts with its error) or `maxHoldMs` after this call (then the lease runs out at its
   * deadline). A second call replaces the first. Throws INVALID_OPTIONS on bad values (and
   * always with `leaseMs` < 2, where no `everyMs` fits below it), LEASE_EXPIRED on a lease
   * that is no longer valid.
   */
  keepAlive(options: KeepAliveOptions): void
}

export interface KeepAliveOptions {
  /** Required, integer ≥ 1: renewals stop this long after the call. */
  maxHoldMs: number
  /** Integer, 1 ≤ everyMs < leaseMs; default leaseMs / 3 rounded down. With `leaseMs` < 2 no value fits: keepAlive throws INVALID_OPTIONS. */
  everyMs?: number | undefined
}

export interface WithLockOptions extends AcquireOptions {
  /** Given: the lease is kept alive this long at most while `fn` runs (`keepAlive`'s rule). */
  maxHoldMs?: number | undefined
  /** Only with `maxHoldMs`: `keepAlive`'s `everyMs`. */
  everyMs?: number | undefined
}

/** `await using backend = createRedisLockDriver(…)` calls `shutdown()` at the end of the block. */
export interface LockDriver extends AsyncDisposable {
  readonly driver: 'redis'
  acquire(key: string, options?: AcquireOptions): Promise<Lease>
  /**
   * Acquires as `acquire` does (same errors; `fn` never runs then), starts
   * `lease.keepAlive({ maxHoldMs, everyMs })` when `maxHoldMs` is given, runs `fn(lease)` —
   * whose work should obey `lease.signal` — and releases, whether `fn` resolved or threw.
   * Resolves with `fn`'s value or rejects with `fn`'s error: a release that fails afterwards
   * goes on by token in the background and is logged (warn `LOCK_RELEASE_FAILED`).
   * Bad options: INVALID_OPTIONS before anything is sent. An extension, not part of the
   * `@dokebi/lock` contract.
   */
  withLock<T>(key: string, fn: (lease: Lease) => T | Promise<T>, options?: WithLockOptions): Promise<T>
  /** Releases every tracked lease; rejects with CLEANUP_TIMEOUT or CLEANUP_FAILED. */
  shutdown(): Promise<void>
  /** Counters of this backend, cheap enough to poll for metrics. Not part of the LockDriver contract. */
  stats(): LockDriverStats
}

export interface LockDriverStats {
  /** Acquires waiting in a line, first waiters included. */
  waiters: number
  /** Keys with at least one waiter. */
  lines: number
  /** All acquires in progress (what maxWaiters bounds). */
  inProgress: number
  trackedLeases: number
  /** The release-notification connection (with `notifications: 'per-key'`: the one connection for every key's channel). */
  subscription: 'off' | 'starting' | 'live' | 'partial' | 'unsupported' | 'failed'
  /** Acquire scripts sent to Redis. */
  redisAttempts: number
  notificationsReceived: number
  /** Connections found dead by a liveness PING (`pingIntervalMs`): each was replaced. A rising count means a middlebox drops idle flows, or Redis stalls. */
  deadConnections: number
  /** Failed calls by code; every code is present, zeros included. */
  errors: { [K in LockErrorCode]: number }
}

/**
 * The context of the `dokebi:lock-redis:acquire` tracing channel (`node:diagnostics_channel`
 * `tracingChannel(name)`; events start, end, asyncStart, asyncEnd, and error on failure).
 * Never holds a token, a password or an address; `key` is the app's own value.
 */
export interface AcquireTraceContext {
  /** As given to `acquire`. */
  readonly key: string
  readonly namespace: string
  /** The lease, from asyncStart on when the acquire succeeded: read its `fence`. */
  readonly result?: Lease
  /** The LockError, from the error event on when it failed. */
  readonly error?: LockError
}

/** The context of the `dokebi:lock-redis:release` tracing channel. */
export interface ReleaseTraceContext {
  readonly key: string
  readonly namespace: string
  /** The lease being released (the same object `acquire` resolved with). */
  readonly lease: Lease
  /** What `release()` resolves with: true when it deleted our key. */
  readonly result?: boolean
  readonly error?: LockError
}

/** The context of the `dokebi:lock-redis:renew` tracing channel. */
export interface RenewTraceContext {
  readonly key: string
  readonly namespace: string
  readonly lease: Lease
  readonly error?: LockError
}

/** pino-compatible: `(fields, message)`. Every field object has a `code`. */
export interface LockLogger {
  debug?: ((fields: object, msg?: string) => void) | undefined
  info?: ((fields: object, msg?: string) => void) | undefined
  warn?: ((fields: object, msg?: string) => void) | undefined
  error?: ((fields: object, msg?: string) => void) | undefined
}

/** Validates backend options and fills in defaults; throws LockError INVALID_OPTIONS. */
export declare function parseRedisLockBackend(input: unknown): RedisLockBackend

/** dokebi-lock calls this. Validates `options` again and connects lazily. */
export declare function createRedisLockDriver(
  connection: RedisConnectionLike,
  options: unknown,
  logger?: LockLogger,
): LockDriver
