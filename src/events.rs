//! Log events of the contract, emitted as `tracing` events under one target.
//!
//! Each carries the driver's id so the binding can hand it to that driver's logger, and a
//! `code` field. Fields never hold a key, a token, a password or an address.

use crate::error::RedisFailure;

/// The `tracing` target of every log event (the binding routes them to loggers by it).
pub const TARGET: &str = "dokebi_lock_redis::event";

pub(crate) fn eviction_unsafe(driver: u64, policy: &str) {
    tracing::error!(
        target: TARGET,
        driver,
        code = "REDIS_EVICTION_UNSAFE",
        policy,
        "Redis may evict lock keys: maxmemory-policy must be noeviction for locks"
    );
}

pub(crate) fn notify_unsupported(driver: u64) {
    tracing::debug!(
        target: TARGET,
        driver,
        code = "LOCK_NOTIFY_UNAVAILABLE",
        reason = "unsupported",
        "release notifications are unavailable; waiters poll"
    );
}

pub(crate) fn notify_failed(driver: u64, cause: &RedisFailure) {
    tracing::warn!(
        target: TARGET,
        driver,
        code = "LOCK_NOTIFY_UNAVAILABLE",
        reason = "failed",
        cause.code = cause.code.as_str(),
        cause.outcome = cause.outcome.as_str(),
        cause.retryable = cause.retryable(),
        cause.message = cause.message.as_str(),
        "the release-notification subscription failed; waiters poll"
    );
}

/// Per-key notifications on a Cluster node without sharded pub/sub (Redis < 7.0, SPUBLISH
/// renamed or denied): classic PUBLISH/SUBSCRIBE on the channels of that node's keys, which
/// every node relays to every other (decisions 0064, 0160). Said once per backend, at the
/// first such key; other nodes' keys stay sharded.
pub(crate) fn notify_unsharded(driver: u64) {
    tracing::info!(
        target: TARGET,
        driver,
        code = "LOCK_NOTIFY_UNSHARDED",
        reason = "unsupported",
        "a node of this Redis Cluster has no sharded pub/sub; per-key notifications of its keys use classic PUBLISH/SUBSCRIBE"
    );
}

/// The Sentinel user may not subscribe to the failover-state channels (an ACL line from
/// before decision 0051): switches are still followed, but a primary whose failover began
/// is not held. Said once per driver: every listed Sentinel would meet the same ACL.
pub(crate) fn failover_hold_unavailable(driver: u64) {
    tracing::warn!(
        target: TARGET,
        driver,
        code = "LOCK_FAILOVER_HOLD_UNAVAILABLE",
        reason = "refused",
        "Sentinel refused the failover-state channels; a primary whose failover began is not held off"
    );
}
