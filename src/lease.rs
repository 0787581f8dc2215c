//! Leases: the local view of a lock this process holds, and the registry of tracked leases.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock::{self, Instant};

use tokio_util::sync::CancellationToken;

use crate::error::{LockError, LockErrorCode};
use crate::keys::KeyNames;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Held,
    /// `release()` was called (or shutdown released it): never valid again.
    Released,
    /// Lost, expired on a renew, or an unknown outcome: never valid again.
    Invalid,
}

/// When a key written with `PX leaseMs` at `written` expires in Redis. The one expiry
/// formula: with the write's submission it gives the earliest expiry (the local deadline),
/// with the moment its reply came (or we stopped waiting for it) the latest.
pub(crate) fn key_expiry(written: Instant, lease_ms: u32) -> Instant {
    written + Duration::from_millis(lease_ms.into())
}

/// A lease. Its deadline counts from the submission of the command that set it, on a
/// monotonic clock that counts suspended time (`crate::clock`), so the local estimate is
/// never later than Redis's expiry, also after the machine slept.
pub struct Lease {
    /// The lease's number in its backend (how the binding names it to JS).
    pub id: u64,
    /// The Redis names of its key.
    pub keys: Arc<KeyNames>,
    /// The owner token stored in the lock key (never logged).
    pub token: String,
    /// The fencing token, a decimal string: compare as a big integer.
    pub fence: String,
    /// leaseMs: how long each write makes the key live.
    pub lease_ms: u32,
    /// The Sentinel epoch of the connection that made its last confirmed write (0 without
    /// Sentinel): a change of primary after it may have lost the key (decision 0153).
    written_in: AtomicU64,
    inner: Mutex<Times>,
}

/// Told the lease's id once when it stops being valid for a cause other than its deadline
/// passing, or by its deadline passing while the machine slept (the binding wakes the
/// lease's `signal` with it). Plain Rust: the binding wraps
/// its threadsafe function in one.
pub type Watcher = Arc<dyn Fn(u64) + Send + Sync>;

/// Why a lease is no longer valid: the first cause wins, and a lease whose deadline had
/// passed before any other cause ended by its deadline.
#[derive(Debug, Clone)]
pub enum Ended {
    /// The local deadline passed (also: a renew confirmed only after it).
    Expired,
    /// `release()` was called.
    Released,
    /// Shutdown released it.
    ShutDown,
    /// A renew, a keep-alive renewal or a failover ended it with this error.
    Failed(LockError),
}

impl Ended {
    /// The `LockError` the lease's signal carries as its reason.
    pub fn to_error(&self) -> LockError {
        match self {
            Ended::Expired => {
                LockError::new(LockErrorCode::LeaseExpired, "the lease's local deadline passed")
            }
            Ended::Released => {
                LockError::new(LockErrorCode::LeaseExpired, "the lease was released")
            }
            Ended::ShutDown => {
                LockError::new(LockErrorCode::ShutDown, "shutdown released the lease")
            }
            Ended::Failed(err) => err.clone(),
        }
    }
}

struct Times {
    state: State,
    /// The earliest moment Redis may expire the key: valid until then.
    deadline: Instant,
    /// The latest moment Redis may still hold the key: cleanup by token ends there.
    latest: Instant,
    /// Why it ended, once it left `Held` (a deadline that merely passed is not stored).
    ended: Option<Ended>,
    /// Told when it ends (set once its signal is read).
    watcher: Option<Watcher>,
    /// Stops the keep-alive running for it, if any.
    keep_alive: Option<CancellationToken>,
}

impl Times {
    /// Why it is no longer valid at `now`; None while it is.
    fn end_at(&self, now: Instant) -> Option<Ended> {
        match (&self.ended, self.state) {
            (Some(ended), _) => Some(ended.clone()),
            (None, State::Held) if now < self.deadline => None,
            (None, _) => Some(Ended::Expired),
        }
    }
}

/// The token is the lock's secret: it never reaches a log, not even a debug print.
impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("id", &self.id)
            .field("keys", &self.keys)
            .field("token", &"<redacted>")
            .field("fence", &self.fence)
            .field("lease_ms", &self.lease_ms)
            .field("state", &self.lock().state)
            .finish()
    }
}

/// Why a confirmed renew did not extend the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotExtended {
    /// `release()` was called while the renew was in flight.
    Released,
    /// The confirmation came after the local deadline (or the lease was already invalid).
    Expired,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A fresh owner token: 128 random bits, hex. It identifies the holder in Redis and is never logged.
pub(crate) fn new_token() -> String {
    // ThreadRng: ChaCha12 seeded from the OS and reseeded every 64 KiB (decision 0176).
    let bytes: [u8; 16] = rand::random();
    // Into a buffer: `hex::encode`'s char iterator cost ~600 instructions per token on the
    // runtime's thread, several times this (issue 37).
    let mut hex = [0u8; 32];
    hex::encode_to_slice(bytes, &mut hex).expect("32 hex digits fit 16 bytes");
    String::from_utf8(hex.to_vec()).expect("hex digits are ASCII")
}

impl Lease {
    /// A lease set by a command submitted at `submitted` whose reply came at `answered`.
    pub fn new(
        keys: Arc<KeyNames>,
        token: String,
        fence: String,
        lease_ms: u32,
        submitted: Instant,
        answered: Instant,
    ) -> Self {
        let times = Times {
            state: State::Held,
            deadline: key_expiry(submitted, lease_ms),
            latest: key_expiry(answered, lease_ms),
            ended: None,
            watcher: None,
            keep_alive: None,
        };
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            keys,
            token,
            fence,
            lease_ms,
            written_in: AtomicU64::new(0),
            inner: Mutex::new(times),
        }
    }

    /// Records that a write of this lease was confirmed on a connection of Sentinel
    /// `epoch`; the newest such epoch is kept (a late renew of an older one changes nothing).
    pub(crate) fn wrote_in(&self, epoch: u64) {
        self.written_in.fetch_max(epoch, Ordering::AcqRel);
    }

    /// The Sentinel epoch of its last confirmed write.
    pub(crate) fn written_in(&self) -> u64 {
        self.written_in.load(Ordering::Acquire)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Times> {
        crate::sync::lock(&self.inner)
    }

    /// Whether the lease is still valid by the local estimate.
    pub fn valid(&self) -> bool {
        let times = self.lock();
        times.state == State::Held && clock::now() < times.deadline
    }

    /// Milliseconds left, rounded down; 0 once not valid.
    pub fn remaining_ms(&self) -> u64 {
        let times = self.lock();
        if times.state != State::Held {
            return 0;
        }
        times.deadline.saturating_duration_since(clock::now()).as_millis() as u64
    }

    /// Why the lease is no longer valid (what its signal's reason says); None while valid.
    pub fn ended(&self) -> Option<Ended> {
        self.lock().end_at(clock::now())
    }

    /// Tells `watcher` once when the lease ends for a cause other than its deadline (or by
    /// its deadline during a sleep of the machine, `tell_if_expired`), and answers whether
    /// it ended already (checked under the same lock, so no end falls
    /// between the answer and the watch).
    pub fn watch(&self, watcher: Watcher) -> Option<Ended> {
        let mut times = self.lock();
        let ended = times.end_at(clock::now());
        if ended.is_none() {
            times.watcher = Some(watcher);
        }
        ended
    }

    /// Tells the watcher, once, that the deadline passed, if it did. Only after a sleep of
    /// the machine: the signal's own deadline timer then fires late by the sleep.
    pub(crate) fn tell_if_expired(&self) {
        let mut times = self.lock();
        if times.ended.is_some() || times.state != State::Held || clock::now() < times.deadline {
            return;
        }
        let watcher = times.watcher.take();
        drop(times);
        if let Some(watcher) = watcher {
            watcher(self.id);
        }
    }

    /// Leaves `Held` for `state` (the first end wins; a deadline already passed is that
    /// end), stops its keep-alive and tells its watcher. Answers the state before.
    fn end(&self, state: State, why: Ended) -> State {
        let mut times = self.lock();
        let before = times.state;
        let now = clock::now();
        if times.ended.is_none() {
            times.ended = Some(times.end_at(now).unwrap_or(why));
        }
        if state == State::Released || times.state == State::Held {
            times.state = state;
        }
        let keep_alive = times.keep_alive.take();
        let watcher = times.watcher.take();
        drop(times);
        if let Some(token) = keep_alive {
            token.cancel();
        }
        if let Some(watcher) = watcher {
            watcher(self.id);
        }
        before
    }

    /// Marks the lease released; false when it already was, so a second `release()` asks
    /// Redis nothing.
    pub fn mark_released(&self) -> bool {
        self.end(State::Released, Ended::Released) != State::Released
    }

    /// Marks the lease released by shutdown.
    pub(crate) fn mark_shut_down(&self) {
        let _ = self.end(State::Released, Ended::ShutDown);
    }

    /// Never valid again (lost, unknown outcome, a failed keep-alive renewal or a failover
    /// it may not have survived): `why` is what its signal says.
    pub fn invalidate(&self, why: LockError) {
        let _ = self.end(State::Invalid, Ended::Failed(why));
    }

    /// Starts a keep-alive's life: stops the one before it (a second call replaces the
    /// first) and answers the token the new one stops on, a child of `parent` (shutdown);
    /// or why the lease is no longer valid, starting nothing.
    pub(crate) fn start_keep_alive(
        &self,
        parent: &CancellationToken,
    ) -> Result<CancellationToken, Ended> {
        let mut times = self.lock();
        if let Some(ended) = times.end_at(clock::now()) {
            return Err(ended);
        }
        let token = parent.child_token();
        if let Some(old) = times.keep_alive.replace(token.clone()) {
            old.cancel();
        }
        Ok(token)
    }

    /// A renew whose outcome is unknown may have extended the key in Redis until
    /// `key_expiry(at)`: cleanup must go on that long.
    pub fn may_have_written(&self, at: Instant) {
        let mut inner = self.lock();
        inner.latest = inner.latest.max(key_expiry(at, self.lease_ms));
    }

    /// Applies a renew submitted at `submitted` and confirmed at `answered`. A reply that
    /// arrives after the local deadline cannot bring the lease back: it becomes invalid for
    /// good. Redis extended the key either way, so the latest expiry moves on regardless.
    pub fn extend(&self, submitted: Instant, answered: Instant) -> Result<(), NotExtended> {
        let mut inner = self.lock();
        inner.latest = inner.latest.max(key_expiry(answered, self.lease_ms));
        match inner.state {
            State::Released => return Err(NotExtended::Released),
            State::Invalid => return Err(NotExtended::Expired),
            State::Held => {}
        }
        if clock::now() >= inner.deadline {
            drop(inner);
            let _ = self.end(State::Invalid, Ended::Expired);
            return Err(NotExtended::Expired);
        }
        inner.deadline = inner.deadline.max(key_expiry(submitted, self.lease_ms));
        Ok(())
    }

    /// The latest moment Redis may still hold the key (the last write's reply, or the
    /// moment we stopped waiting for it, + leaseMs): past it, the key is surely gone and
    /// cleanup by token has nothing left to do. Not the deadline: that is the earliest.
    pub fn latest_expiry(&self) -> Instant {
        self.lock().latest
    }
}

/// The leases this backend tracks, so shutdown can release them.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    leases: Mutex<Tracked>,
}

#[derive(Debug, Default)]
struct Tracked {
    map: HashMap<u64, Arc<Lease>>,
    /// Set by shutdown's drain, under the same lock: a lease arriving after it is refused,
    /// so none is tracked where shutdown will never look.
    closed: bool,
}

/// Why [`Registry::insert`] refused a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    Full,
    Closed,
}

impl Registry {
    fn map(&self) -> std::sync::MutexGuard<'_, Tracked> {
        crate::sync::lock(&self.leases)
    }

    pub(crate) fn len(&self) -> usize {
        self.map().map.len()
    }

    /// Tracks the lease unless `max` are tracked already or the registry was closed.
    pub(crate) fn insert(&self, lease: Arc<Lease>, max: usize) -> Result<(), Refused> {
        let mut tracked = self.map();
        if tracked.closed {
            return Err(Refused::Closed);
        }
        if tracked.map.len() >= max {
            return Err(Refused::Full);
        }
        tracked.map.insert(lease.id, lease);
        Ok(())
    }

    pub(crate) fn remove(&self, id: u64) {
        self.map().map.remove(&id);
    }

    /// A tracked lease by id. Leases leave the registry only once released (by `release()`
    /// or shutdown), so a lease not found here is a released one.
    pub(crate) fn get(&self, id: u64) -> Option<Arc<Lease>> {
        self.map().map.get(&id).cloned()
    }

    /// Every lease tracked now (a change of primary looks them over, decision 0153).
    pub(crate) fn all(&self) -> Vec<Arc<Lease>> {
        self.map().map.values().cloned().collect()
    }

    /// Empties the registry for good (shutdown): later inserts are refused.
    pub(crate) fn close(&self) -> Vec<Arc<Lease>> {
        let mut tracked = self.map();
        tracked.closed = true;
        tracked.map.drain().map(|(_, l)| l).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(ms: u32, submitted: Instant) -> Lease {
        Lease::new(
            Arc::new(KeyNames::new("t", "k")),
            new_token(),
            "1".into(),
            ms,
            submitted,
            submitted,
        )
    }

    #[test]
    fn deadline_counts_from_submission_not_from_the_reply() {
        let submitted = clock::now() - Duration::from_millis(400);
        let l = lease(1000, submitted);
        assert!(l.valid());
        assert!(l.remaining_ms() <= 600, "{}", l.remaining_ms());
        let late = lease(300, submitted);
        assert!(!late.valid());
        assert_eq!(late.remaining_ms(), 0);
    }

    #[test]
    fn released_or_invalid_leases_never_become_valid_again() {
        let l = lease(10_000, clock::now());
        assert!(l.mark_released());
        assert!(!l.mark_released(), "second release is a no-op");
        assert!(!l.valid());
        assert_eq!(l.remaining_ms(), 0);
        assert_eq!(l.extend(clock::now(), clock::now()), Err(NotExtended::Released));
        let u = lease(10_000, clock::now());
        u.invalidate(LockError::new(LockErrorCode::LeaseLost, "lost"));
        assert_eq!(u.extend(clock::now(), clock::now()), Err(NotExtended::Expired));
        assert!(!u.valid());
    }

    #[test]
    fn a_renew_confirmed_after_the_local_deadline_leaves_the_lease_invalid() {
        let l = lease(50, clock::now() - Duration::from_millis(60));
        assert_eq!(l.extend(clock::now(), clock::now()), Err(NotExtended::Expired));
        assert!(!l.valid());
    }

    #[test]
    fn a_renew_extends_from_its_own_submission_and_never_shortens() {
        let l = lease(1000, clock::now());
        let earlier = clock::now() - Duration::from_millis(900);
        assert!(l.extend(earlier, earlier).is_ok());
        assert!(l.remaining_ms() > 900, "a renew submitted earlier must not shorten the lease");
    }

    #[test]
    fn the_epoch_of_the_newest_write_is_kept_whatever_order_replies_come_in() {
        let l = lease(1000, clock::now());
        assert_eq!(l.written_in(), 0);
        l.wrote_in(2);
        l.wrote_in(1); // a renew sent before the switch, confirmed after
        assert_eq!(l.written_in(), 2);
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
        assert_eq!(r.insert(Arc::new(lease(1000, clock::now())), 1), Ok(()));
        assert_eq!(r.insert(Arc::new(lease(1000, clock::now())), 1), Err(Refused::Full));
        assert_eq!(r.close().len(), 1);
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn a_lease_arriving_after_shutdown_closed_the_registry_is_refused() {
        let r = Registry::default();
        assert_eq!(r.insert(Arc::new(lease(1000, clock::now())), 10), Ok(()));
        assert_eq!(r.close().len(), 1);
        assert_eq!(r.insert(Arc::new(lease(1000, clock::now())), 10), Err(Refused::Closed));
        assert_eq!(r.len(), 0, "nothing is tracked where shutdown no longer looks");
    }

    #[test]
    fn a_debug_print_of_a_lease_never_shows_its_token() {
        let l = lease(1000, clock::now());
        let printed = format!("{l:?} {l:#?}");
        assert!(!printed.contains(&l.token), "{printed}");
        assert!(printed.contains("<redacted>") && printed.contains(&l.fence));
    }

    #[test]
    fn the_earliest_expiry_counts_from_submission_and_the_latest_from_the_reply() {
        let submitted = clock::now() - Duration::from_millis(300);
        let answered = clock::now() - Duration::from_millis(100);
        let l = Lease::new(
            Arc::new(KeyNames::new("t", "k")),
            new_token(),
            "1".into(),
            1000,
            submitted,
            answered,
        );
        assert_eq!(l.latest_expiry(), key_expiry(answered, 1000));
        assert!(
            l.remaining_ms() <= 700,
            "valid only until the earliest expiry: {}",
            l.remaining_ms()
        );
        // A renew whose outcome is unknown may have moved Redis's expiry on.
        let later = clock::now();
        l.may_have_written(later);
        assert_eq!(l.latest_expiry(), key_expiry(later, 1000));
    }

    #[test]
    fn a_renew_confirmed_after_release_was_called_says_released() {
        let l = lease(10_000, clock::now());
        l.mark_released();
        assert_eq!(l.extend(clock::now(), clock::now()), Err(NotExtended::Released));
    }

    #[test]
    fn the_first_end_wins_and_the_watcher_hears_it_once() {
        use std::sync::atomic::AtomicUsize;
        let l = lease(10_000, clock::now());
        assert!(l.ended().is_none());
        let heard = Arc::new(AtomicUsize::new(0));
        let counter = heard.clone();
        assert!(l
            .watch(Arc::new(move |_| {
                counter.fetch_add(1, Ordering::Relaxed);
            }))
            .is_none());
        l.invalidate(LockError::new(LockErrorCode::LeaseLost, "lost"));
        l.mark_released();
        assert_eq!(heard.load(Ordering::Relaxed), 1);
        assert_eq!(l.ended().unwrap().to_error().code, LockErrorCode::LeaseLost);
        let s = lease(10_000, clock::now());
        s.mark_shut_down();
        assert_eq!(s.ended().unwrap().to_error().code, LockErrorCode::ShutDown);
    }

    #[test]
    fn a_lease_past_its_deadline_ended_by_its_deadline_whatever_comes_after() {
        let l = lease(50, clock::now() - Duration::from_millis(60));
        assert!(matches!(l.ended(), Some(Ended::Expired)));
        l.invalidate(LockError::new(LockErrorCode::OutcomeUnknown, "unknown"));
        assert!(matches!(l.ended(), Some(Ended::Expired)), "the deadline came first");
        assert!(l.watch(Arc::new(|_| panic!("an ended lease is not watched"))).is_some());
    }

    #[test]
    fn a_watched_lease_found_past_its_deadline_on_wake_up_is_told_once() {
        use std::sync::atomic::AtomicUsize;
        let heard = Arc::new(AtomicUsize::new(0));
        let counter = heard.clone();
        let watcher: Watcher = Arc::new(move |_| {
            counter.fetch_add(1, Ordering::Relaxed);
        });
        let valid = lease(10_000, clock::now());
        assert!(valid.watch(watcher.clone()).is_none());
        valid.tell_if_expired();
        assert_eq!(heard.load(Ordering::Relaxed), 0, "still valid: nothing to tell");
        // Watched when valid (as at a signal's first read), found expired later.
        let expired = lease(50, clock::now() - Duration::from_millis(40));
        assert!(expired.watch(watcher).is_none());
        let end = std::time::Instant::now() + Duration::from_secs(5);
        while expired.valid() {
            assert!(std::time::Instant::now() < end, "the 10 ms left never ran out");
            std::thread::sleep(Duration::from_millis(1));
        }
        expired.tell_if_expired();
        expired.tell_if_expired();
        assert_eq!(heard.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_new_keep_alive_stops_the_one_before_and_an_end_stops_the_last() {
        let parent = CancellationToken::new();
        let l = lease(10_000, clock::now());
        let first = l.start_keep_alive(&parent).unwrap();
        let second = l.start_keep_alive(&parent).unwrap();
        assert!(first.is_cancelled() && !second.is_cancelled());
        l.mark_released();
        assert!(second.is_cancelled());
        assert!(l.start_keep_alive(&parent).is_err(), "not on a released lease");
    }
}
