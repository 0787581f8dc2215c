//! `driver.stats()`: counters cheap enough to poll for metrics (atomics and a few short locks).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::LockErrorCode;

/// Counters that only grow.
#[derive(Default)]
pub(crate) struct Counters {
    attempts: AtomicU64,
    errors: [AtomicU64; LockErrorCode::ALL.len()],
}

impl Counters {
    pub(crate) fn attempt(&self) {
        self.attempts.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn error(&self, code: LockErrorCode) {
        self.errors[code as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn attempts(&self) -> u64 {
        self.attempts.load(Ordering::Relaxed)
    }

    /// Every code of the contract with its count, zeros included, so a metrics shape never changes.
    pub(crate) fn errors(&self) -> Vec<(LockErrorCode, u64)> {
        LockErrorCode::ALL
            .iter()
            .map(|&code| (code, self.errors[code as usize].load(Ordering::Relaxed)))
            .collect()
    }
}

/// A snapshot of one backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stats {
    /// Acquires waiting in a line (first waiters included).
    pub waiters: usize,
    /// Keys with at least one waiter.
    pub lines: usize,
    /// All acquires in progress (what maxWaiters bounds).
    pub in_progress: usize,
    /// Leases handed out and not yet released.
    pub tracked_leases: usize,
    /// `off`, `starting`, `live`, `partial`, `unsupported` or `failed`.
    pub subscription: &'static str,
    /// Acquire scripts sent to Redis.
    pub redis_attempts: u64,
    /// Release notifications received.
    pub notifications_received: u64,
    /// Connections found dead by a liveness PING (pingIntervalMs), each replaced.
    pub dead_connections: u64,
    /// Failed calls by code.
    pub errors: Vec<(LockErrorCode, u64)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_counted_separately_and_listed_even_at_zero() {
        let c = Counters::default();
        c.error(LockErrorCode::LockBusy);
        c.error(LockErrorCode::LockBusy);
        c.error(LockErrorCode::CleanupFailed);
        c.attempt();
        let errors = c.errors();
        assert_eq!(errors.len(), 14);
        assert!(errors.contains(&(LockErrorCode::LockBusy, 2)));
        assert!(errors.contains(&(LockErrorCode::CleanupFailed, 1)));
        assert!(errors.contains(&(LockErrorCode::InvalidKey, 0)));
        assert_eq!(c.attempts(), 1);
    }
}
