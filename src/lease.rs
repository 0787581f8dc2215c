//! Leases: the local view of a lock this process holds, and the registry of tracked leases.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::keys::KeyNames;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Held,
    /// `release()` was called (or shutdown released it): never valid again.
    Released,
    /// Lost, expired on a renew, or an unknown outcome: never valid again.
    Invalid,
}

/// A lease. Its deadline counts from the submission of the command that set it, on the
/// monotonic clock, so the local estimate is never later than Redis's expiry.
#[derive(Debug)]
pub struct Lease {
    pub id: u64,
    pub keys: Arc<KeyNames>,
    pub token: String,
    pub fence: String,
    pub lease_ms: u32,
    inner: Mutex<(State, Instant)>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A fresh owner token: 128 random bits, hex. It identifies the holder in Redis and is never logged.
pub fn new_token() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the OS random source is available");
    hex::encode(bytes)
}

impl Lease {
    pub fn new(keys: Arc<KeyNames>, token: String, fence: String, lease_ms: u32, submitted: Instant) -> Self {
        let deadline = submitted + Duration::from_millis(lease_ms.into());
        Self { id: NEXT_ID.fetch_add(1, Ordering::Relaxed), keys, token, fence, lease_ms, inner: Mutex::new((State::Held, deadline)) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (State, Instant)> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn valid(&self) -> bool {
        let (state, deadline) = *self.lock();
        state == State::Held && Instant::now() < deadline
    }

    /// Milliseconds left, rounded down; 0 once not valid.
    pub fn remaining_ms(&self) -> u64 {
        let (state, deadline) = *self.lock();
        if state != State::Held {
            return 0;
        }
        deadline.saturating_duration_since(Instant::now()).as_millis() as u64
    }

    /// Marks the lease released; false when it already was, so a second `release()` asks
    /// Redis nothing.
    pub fn mark_released(&self) -> bool {
        let mut inner = self.lock();
        let first = inner.0 != State::Released;
        inner.0 = State::Released;
        first
    }

    /// Never valid again (lost, unknown outcome, or a renew that came back too late).
    pub fn invalidate(&self) {
        let mut inner = self.lock();
        if inner.0 == State::Held {
            inner.0 = State::Invalid;
        }
    }

    /// Applies a confirmed renew submitted at `submitted`. A reply that arrives after the
    /// local deadline cannot bring the lease back: it becomes invalid for good.
    pub fn extend(&self, submitted: Instant) -> bool {
        let mut inner = self.lock();
        let (state, deadline) = *inner;
        if state != State::Held {
            return false;
        }
        if Instant::now() >= deadline {
            inner.0 = State::Invalid;
            return false;
        }
        inner.1 = deadline.max(submitted + Duration::from_millis(self.lease_ms.into()));
        true
    }

    /// When Redis expires the key at the latest (for bounding background cleanup).
    pub fn expiry_bound(&self) -> Instant {
        self.lock().1
    }
}

/// The leases this backend tracks, so shutdown can release them.
#[derive(Debug, Default)]
pub struct Registry {
    leases: Mutex<HashMap<u64, Arc<Lease>>>,
}

impl Registry {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Lease>>> {
        self.leases.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn len(&self) -> usize {
        self.map().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tracks the lease unless `max` are tracked already.
    pub fn insert(&self, lease: Arc<Lease>, max: usize) -> bool {
        let mut map = self.map();
        if map.len() >= max {
            return false;
        }
        map.insert(lease.id, lease);
        true
    }

    pub fn remove(&self, id: u64) {
        self.map().remove(&id);
    }

    pub fn drain(&self) -> Vec<Arc<Lease>> {
        self.map().drain().map(|(_, l)| l).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(ms: u32, submitted: Instant) -> Lease {
        Lease::new(Arc::new(KeyNames::new("t", "k")), new_token(), "1".into(), ms, submitted)
    }

    #[test]
    fn deadline_counts_from_submission_not_from_the_reply() {
        let submitted = Instant::now() - Duration::from_millis(400);
        let l = lease(1000, submitted);
        assert!(l.valid());
        assert!(l.remaining_ms() <= 600, "{}", l.remaining_ms());
        let late = lease(300, submitted);
        assert!(!late.valid());
        assert_eq!(late.remaining_ms(), 0);
    }

    #[test]
    fn released_or_invalid_leases_never_become_valid_again() {
        let l = lease(10_000, Instant::now());
        assert!(l.mark_released());
        assert!(!l.mark_released(), "second release is a no-op");
        assert!(!l.valid());
        assert_eq!(l.remaining_ms(), 0);
        assert!(!l.extend(Instant::now()));
        let u = lease(10_000, Instant::now());
        u.invalidate();
        assert!(!u.extend(Instant::now()));
        assert!(!u.valid());
    }

    #[test]
    fn a_renew_confirmed_after_the_local_deadline_leaves_the_lease_invalid() {
        let l = lease(50, Instant::now() - Duration::from_millis(60));
        assert!(!l.extend(Instant::now()));
        assert!(!l.valid());
    }

    #[test]
    fn a_renew_extends_from_its_own_submission_and_never_shortens() {
        let l = lease(1000, Instant::now());
        assert!(l.extend(Instant::now() - Duration::from_millis(900)));
        assert!(l.remaining_ms() > 900, "a renew submitted earlier must not shorten the lease");
    }

    #[test]
    fn tokens_are_random_128_bit_hex() {
        let (a, b) = (new_token(), new_token());
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
    }

    #[test]
    fn registry_refuses_past_its_limit() {
        let r = Registry::default();
        assert!(r.insert(Arc::new(lease(1000, Instant::now())), 1));
        assert!(!r.insert(Arc::new(lease(1000, Instant::now())), 1));
        assert_eq!(r.drain().len(), 1);
        assert!(r.is_empty());
    }
}
