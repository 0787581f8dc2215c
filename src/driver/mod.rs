//! The backend: the front `Driver` (release, renew, what it reports) with its internals
//! beside it: acquiring and waiting (`acquire`), one acquire attempt (`attempt`), releasing
//! by token in the background (`cleanup`) and shutdown (`shutdown`). Plain Rust; the
//! binding maps it to JS.

mod acquire;
mod attempt;
mod cleanup;
mod failover;
mod keep_alive;
mod shutdown;
mod wake_up;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use smallvec::smallvec;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::connection::{RedisLink, ScriptCall};
use crate::error::{LockError, LockErrorCode, RedisFailure};
use crate::keys::{self, KeyLayout};
use crate::lease::{Lease, NotExtended, Refused, Registry};
use crate::notify::Notifications;
use crate::options::{BackendOptions, ConnectionOptions};
use crate::replicas::{Claim, Replicas};
use crate::scripts::{self, ReleaseChannels, ReleaseReply};
use crate::stats::{Counters, Stats};
use crate::waiters::{InProgress, Lines};

static NEXT_DRIVER_ID: AtomicU64 = AtomicU64::new(1);

/// Shutdown's token, with a flag that says the same without a lock: `is_cancelled` on the
/// token takes its mutex, and an uncontended acquire asked three times (issue 37).
#[derive(Default)]
pub(crate) struct Stopping {
    stopped: AtomicBool,
    token: CancellationToken,
}

impl Stopping {
    /// Set before the token is cancelled: whoever sees the token cancelled sees this too.
    fn cancel(&self) {
        self.stopped.store(true, Ordering::Release);
        self.token.cancel();
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    pub(crate) fn cancelled(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.token.cancelled()
    }

    pub(crate) fn token(&self) -> &CancellationToken {
        &self.token
    }
}

/// A lock backend on one Redis. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Driver {
    inner: Arc<Inner>,
}

struct Inner {
    id: u64,
    options: BackendOptions,
    layout: KeyLayout,
    link: Arc<RedisLink>,
    /// Where releases are published (`notifications`).
    release_channels: ReleaseChannels,
    /// The acquire script's arguments after the token, written once.
    acquire_args: scripts::AcquireArgs,
    leases: Registry,
    lines: Arc<Lines>,
    notify: Notifications,
    in_progress: InProgress,
    counters: Counters,
    /// WAIT for minReplicas after a winning acquire and a renew (decisions 0025–0027).
    replicas: Replicas,
    /// Cancelled when shutdown begins: stops every wait.
    stopping: Stopping,
    /// Every task that talks to Redis, so shutdown can wait for them.
    tasks: TaskTracker,
    /// Background cleanups that failed while shutdown was running.
    cleanup_failures: Mutex<Vec<LockError>>,
    shutdown_result: tokio::sync::OnceCell<Result<(), LockError>>,
    /// Whether the task that ends leases at a change of primary was started (`failover`).
    following_failovers: std::sync::atomic::AtomicBool,
    /// Whether the tick that tells leases expired during a sleep of the machine was started
    /// (`wake_up`).
    noticing_wake_ups: std::sync::atomic::AtomicBool,
    /// Acquire replies awaited past the moment their key would have expired (`attempt`).
    late_replies: AtomicUsize,
}

/// See [`Driver::downgrade`].
#[doc(hidden)]
pub struct WeakDriver(std::sync::Weak<Inner>);

impl WeakDriver {
    pub fn upgrade(&self) -> Option<Driver> {
        self.0.upgrade().map(|inner| Driver { inner })
    }
}

impl Driver {
    /// Checks only the rules across both arguments (`options::check_together`): pass
    /// options from [`crate::parse_connection`] and
    /// [`crate::parse_backend`]. Connects lazily.
    pub fn new(connection: &ConnectionOptions, options: BackendOptions) -> Result<Self, LockError> {
        crate::options::check_together(connection, &options)?;
        let id = NEXT_DRIVER_ID.fetch_add(1, Ordering::Relaxed);
        let link = RedisLink::new(connection, id)?;
        let replicas = Replicas::new(&options, link.command_timeout);
        let release_channels =
            ReleaseChannels::new(&options.namespace, options.notifications, connection.cluster);
        let notify = if options.notifications.per_key() {
            Notifications::per_key(
                id,
                &options.namespace,
                crate::switches::notifications_enabled(),
                connection.cluster,
            )
        } else {
            let channel = keys::released_channel(&options.namespace);
            Notifications::namespace(id, channel, crate::switches::notifications_enabled())
        };
        let acquire_args = scripts::AcquireArgs::new(options.lease_ms, options.fence_ttl_ms);
        Ok(Self {
            inner: Arc::new(Inner {
                id,
                layout: KeyLayout::new(&options.namespace),
                options,
                link: Arc::new(link),
                release_channels,
                acquire_args,
                leases: Registry::default(),
                lines: Arc::new(Lines::default()),
                notify,
                in_progress: InProgress::default(),
                counters: Counters::default(),
                replicas,
                stopping: Stopping::default(),
                tasks: TaskTracker::new(),
                cleanup_failures: Mutex::new(Vec::new()),
                shutdown_result: tokio::sync::OnceCell::new(),
                following_failovers: std::sync::atomic::AtomicBool::new(false),
                noticing_wake_ups: std::sync::atomic::AtomicBool::new(false),
                late_replies: AtomicUsize::new(0),
            }),
        })
    }

    /// This backend's number in the process (its log events carry it).
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    #[doc(hidden)] // for the binding (and the crate's tests), not API
    /// A handle that does not keep the driver alive.
    pub fn downgrade(&self) -> WeakDriver {
        WeakDriver(Arc::downgrade(&self.inner))
    }

    /// The validated options it was created with.
    pub fn options(&self) -> &BackendOptions {
        &self.inner.options
    }

    #[doc(hidden)] // for the binding (and the crate's tests), not API
    /// Validates a key given as UTF-16 code units against this backend's maxKeyBytes.
    pub fn validate_key(&self, units: &[u16]) -> Result<String, LockError> {
        keys::validate_utf16(units, self.inner.options.max_key_bytes)
    }

    /// Leases handed out and not yet released (what maxTrackedLeases bounds).
    pub fn tracked_leases(&self) -> usize {
        self.inner.leases.len()
    }

    /// Acquires waiting in a line (first waiters included).
    pub fn waiters(&self) -> usize {
        self.inner.lines.waiters()
    }

    /// Keys with at least one waiter.
    pub fn lines(&self) -> usize {
        self.inner.lines.len()
    }

    #[doc(hidden)] // for the binding (and the crate's tests), not API
    /// The state of the release-notification subscription.
    pub fn subscription_state(&self) -> crate::notify::SubscriptionState {
        self.inner.notify.state()
    }

    /// Release notifications received since the start.
    pub fn notifications_received(&self) -> u64 {
        self.inner.notify.received()
    }

    /// Release-notification subscriptions confirmed since the start (one more each time
    /// it follows a new primary).
    pub fn subscriptions(&self) -> u64 {
        self.inner.notify.subscriptions()
    }

    /// Keys with a confirmed per-key subscription now (0 with the namespace channel).
    pub fn subscribed_keys(&self) -> usize {
        self.inner.notify.subscribed_keys()
    }

    #[doc(hidden)] // for the crate's tests, not API
    /// The release-notification tracker's entries: keys tracked, and entries over all its
    /// collections (what its memory grows with).
    pub fn notify_tracked(&self) -> (usize, usize) {
        self.inner.notify.tracked()
    }

    /// Staggered head-start steps this backend's waiters gave other processes (decision
    /// 0070): what fairness cost its hand-offs.
    pub fn head_start_steps(&self) -> u64 {
        self.inner.lines.steps_given()
    }

    /// Head starts this backend's waiters gave other processes, of either kind: after
    /// their own backend's release (decision 0010) or staggered (decision 0070).
    pub fn head_starts(&self) -> u64 {
        self.inner.lines.head_starts_given()
    }

    /// Changes of primary this backend followed (Sentinel; 0 otherwise).
    pub fn primary_switches(&self) -> u64 {
        self.inner.link.primary_switch_count()
    }

    /// A snapshot of the counters `stats()` reports.
    pub fn stats(&self) -> Stats {
        let inner = &self.inner;
        Stats {
            waiters: inner.lines.waiters(),
            lines: inner.lines.len(),
            in_progress: inner.in_progress.count(),
            tracked_leases: inner.leases.len(),
            subscription: inner.notify.state().as_str(),
            redis_attempts: inner.counters.attempts(),
            notifications_received: inner.notify.received(),
            dead_connections: inner.link.dead_connections(),
            errors: inner.counters.errors(),
        }
    }

    /// Counts a failed call by code for `stats()`, and passes the result on.
    fn counted<T>(&self, result: Result<T, LockError>) -> Result<T, LockError> {
        if let Err(err) = &result {
            self.inner.counters.error(err.code);
        }
        result
    }

    pub(crate) fn track(&self, lease: Arc<Lease>) -> Result<Arc<Lease>, LockError> {
        let max = self.inner.options.max_tracked_leases;
        self.follow_failovers();
        self.notice_wake_ups();
        let refused = match self.inner.leases.insert(lease.clone(), max as usize) {
            Ok(()) => {
                self.check_written_on_current_primary(&lease);
                return Ok(lease);
            }
            // Other acquires filled the registry while this one was in flight.
            Err(Refused::Full) => too_many_leases(max),
            // Shutdown already drained the registry: it would never release this one.
            Err(Refused::Closed) => LockError::shut_down(),
        };
        lease.mark_released();
        self.spawn_cleanup(lease.keys.clone(), lease.token.clone(), lease.latest_expiry());
        Err(refused)
    }

    /// `lease.release()`: true when this call deleted our key, false when it was no longer
    /// ours. Invalid from the moment it is called (not when the future is polled); a second
    /// call asks Redis nothing.
    pub fn release(
        &self,
        lease: &Arc<Lease>,
    ) -> impl Future<Output = Result<bool, LockError>> + Send + 'static {
        let releasing = self.releasing(lease);
        let this = self.clone();
        async move {
            let Some(releasing) = releasing else { return Ok(false) };
            // Tracked, so shutdown waits for releases in progress; a task of its own, so
            // the release goes on when its caller stops waiting.
            match this.inner.tasks.spawn(releasing).await {
                Ok(released) => released,
                joined @ Err(_) => this.counted(released_or_internal(joined)),
            }
        }
    }

    /// [`Driver::release`]'s work, for a caller that runs it in a task of its own made by
    /// [`Driver::spawn_tracked`] (the binding: one task per release instead of two). `None`
    /// when the lease was released already: false, asking Redis nothing. Marks the lease
    /// released when called.
    pub(crate) fn releasing(&self, lease: &Arc<Lease>) -> Option<Releasing> {
        if !lease.mark_released() {
            return None;
        }
        self.inner.lines.releasing(&lease.keys.hash);
        let (this, lease) = (self.clone(), lease.clone());
        // Boxed, as the acquire attempt is (attempt.rs): the release script's future is large.
        Some(Box::pin(async move {
            let released = this.run_release(&lease.keys, &lease.token).await;
            if released.is_ok() {
                this.inner.leases.remove(lease.id);
            } else {
                // Still reported as failed, but released by token in the background
                // and untracked once the key is surely gone (decision 0006).
                this.finish_failed_release(lease.clone());
            }
            if let Ok(ReleaseReply::Deleted { listeners }) = released {
                // Our own subscription is one of the listeners while it is live.
                let ours = u64::from(this.inner.notify.is_live_for(&lease.keys.hash));
                this.inner.lines.heard_release(listeners.saturating_sub(ours));
            }
            this.counted(released.map(|r| matches!(r, ReleaseReply::Deleted { .. })))
        }))
    }

    /// `task` as one of the driver's tracked tasks: shutdown waits for it from now on
    /// until it completes or is dropped.
    #[cfg(all(feature = "node", not(test)))]
    pub(crate) fn tracked<F: Future>(&self, task: F) -> impl Future<Output = F::Output> {
        self.inner.tasks.track_future(task)
    }

    #[doc(hidden)] // for the binding (and the crate's tests), not API
    /// A lease handed out by this backend, by id, while it is tracked: until it is released
    /// (the binding hands leases to JS by id, not as one native object each).
    pub fn lease(&self, id: u64) -> Option<Arc<Lease>> {
        self.inner.leases.get(id)
    }

    #[doc(hidden)] // for the binding (and the crate's tests), not API
    /// [`Driver::renew`] by lease id; a lease no longer tracked was released, so it is no
    /// longer valid, as [`Driver::renew`] says of it.
    pub fn renew_by_id(
        &self,
        id: u64,
    ) -> impl Future<Output = Result<(), LockError>> + Send + 'static {
        let renewing = self.lease(id).map(|lease| self.renew(&lease));
        let this = self.clone();
        async move {
            match renewing {
                Some(renewing) => renewing.await,
                None => this.counted(Err(no_longer_valid())),
            }
        }
    }

    /// `lease.renew()`: extends to leaseMs from this renew's submission. Whether the lease
    /// is still valid locally is decided when this is called.
    pub fn renew(
        &self,
        lease: &Arc<Lease>,
    ) -> impl Future<Output = Result<(), LockError>> + Send + 'static {
        let valid = lease.valid();
        let this = self.clone();
        let lease = lease.clone();
        async move {
            if !valid {
                return this.counted(Err(no_longer_valid()));
            }
            // Counted inside, before the lease ends with it.
            this.renew_valid(&lease).await
        }
    }

    /// A renew of a lease that was valid when called. A failure is counted for `stats()`
    /// before it ends the lease, so a listener on the lease's signal that reads `stats()`
    /// finds it counted.
    async fn renew_valid(&self, lease: &Arc<Lease>) -> Result<(), LockError> {
        self.try_renew(lease).await.map_err(|failed| {
            self.inner.counters.error(failed.err.code);
            if failed.ends_lease {
                lease.invalidate(failed.err.clone());
            }
            failed.err
        })
    }

    async fn try_renew(&self, lease: &Arc<Lease>) -> Result<(), RenewFailed> {
        let call = ScriptCall {
            script: &scripts::RENEW,
            keys: smallvec![&*lease.keys.lock],
            args: smallvec![lease.token.as_str().into(), lease.lease_ms.to_string().into()],
        };
        let (value, submitted, conn) = match self.inner.link.run_on(&call).await {
            Ok(reply) => reply,
            Err(failure) => {
                let surely_not_applied = failure.surely_not_applied();
                if !surely_not_applied {
                    lease.may_have_written(crate::clock::now());
                }
                return Err(RenewFailed {
                    err: LockError::from_redis(failure),
                    ends_lease: !surely_not_applied,
                });
            }
        };
        let answered = crate::clock::now();
        if scripts::parse_flag(&value) == Some(true) {
            // The extension counts once minReplicas replicas have it; until then the lease
            // keeps its old deadline, which every replica agrees with (decision 0027). Redis
            // did extend the key, so cleanup must go on until the new latest expiry.
            let claim = Claim::of(&lease.keys, &lease.token);
            if let Err(failure) = self.inner.replicas.confirm(&self.inner.link, &conn, claim).await
            {
                lease.may_have_written(answered);
                return Err(RenewFailed::keeping_lease(LockError::from_redis(failure)));
            }
        }
        match scripts::parse_flag(&value) {
            Some(true) => match lease.extend(submitted, answered) {
                Ok(()) => {
                    lease.wrote_in(conn.epoch());
                    Ok(())
                }
                Err(NotExtended::Released) => Err(RenewFailed::keeping_lease(LockError::new(
                    LockErrorCode::LeaseExpired,
                    "the lease was released while the renew was in flight",
                ))),
                Err(NotExtended::Expired) => Err(RenewFailed::keeping_lease(LockError::new(
                    LockErrorCode::LeaseExpired,
                    "the renew was confirmed after the lease expired",
                ))),
            },
            Some(false) => Err(RenewFailed {
                err: LockError::new(
                    LockErrorCode::LeaseLost,
                    "the lock is no longer held by this lease",
                ),
                ends_lease: true,
            }),
            None => Err(RenewFailed {
                err: LockError::from_redis(RedisFailure::unexpected_reply()),
                ends_lease: true,
            }),
        }
    }
}

/// How a renew failed: its error, and whether that error ends the lease (an unknown outcome,
/// the key no longer ours, a reply not understood) or leaves it as it was.
struct RenewFailed {
    err: LockError,
    ends_lease: bool,
}

impl RenewFailed {
    fn keeping_lease(err: LockError) -> Self {
        RenewFailed { err, ends_lease: false }
    }
}

fn internal_error(what: &str) -> LockError {
    LockError::internal(LockErrorCode::OutcomeUnknown, what)
}

/// The release task's answer; a panic in it is an internal error, not a Redis reply.
fn released_or_internal(
    joined: Result<Result<bool, LockError>, tokio::task::JoinError>,
) -> Result<bool, LockError> {
    joined.unwrap_or_else(|_| Err(internal_error("release")))
}

/// A release's work, to run in a tracked task ([`Driver::releasing`]).
pub(crate) type Releasing = Pin<Box<dyn Future<Output = Result<bool, LockError>> + Send>>;

fn no_longer_valid() -> LockError {
    LockError::new(LockErrorCode::LeaseExpired, "the lease is no longer valid")
}

fn too_many_leases(max: u32) -> LockError {
    LockError::new(
        LockErrorCode::TooManyLeases,
        format!("maxTrackedLeases ({max}) leases are already tracked"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::KeyNames;
    use crate::options::{parse_backend, parse_connection, Raw};

    fn nowhere() -> Driver {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let conn = parse_connection(&Raw::String(format!("redis://127.0.0.1:{port}"))).unwrap();
        let backend = parse_backend(&Raw::Object(vec![
            ("driver".to_owned(), Raw::String("redis".into())),
            ("connection".to_owned(), Raw::String("main".into())),
            ("namespace".to_owned(), Raw::String("t".into())),
            ("shutdownTimeoutMs".to_owned(), Raw::Number(200.0)),
        ]))
        .unwrap();
        Driver::new(&conn, backend).unwrap()
    }

    /// The race of issue 10 point 5 made deterministic: a reply that was already waiting is
    /// handed to `track` after shutdown drained the registry.
    #[tokio::test]
    async fn a_lease_handed_over_after_shutdown_drained_the_registry_is_refused_not_tracked() {
        let d = nowhere();
        let _ = d.shutdown().await;
        let now = crate::clock::now();
        let lease = Arc::new(Lease::new(
            Arc::new(KeyNames::new("t", "k")),
            "0".repeat(32),
            "1".into(),
            10_000,
            now,
            now,
        ));
        let err = d.track(lease.clone()).unwrap_err();
        assert_eq!(err.code, LockErrorCode::ShutDown);
        assert_eq!(d.tracked_leases(), 0, "tracked where shutdown no longer looks");
        assert!(!lease.valid(), "given back (released by token), never handed to the caller");
    }

    /// Leases cross to JS by id; an id the backend no longer tracks is a released lease.
    #[tokio::test]
    async fn a_lease_id_no_longer_tracked_releases_false_and_renews_lease_expired() {
        let d = nowhere();
        let now = crate::clock::now();
        let lease = Arc::new(Lease::new(
            Arc::new(KeyNames::new("t", "k")),
            "0".repeat(32),
            "1".into(),
            10_000,
            now,
            now,
        ));
        d.track(lease.clone()).unwrap();
        assert!(d.lease(lease.id).is_some_and(|l| l.valid()));
        let _ = d.shutdown().await;
        assert!(d.lease(lease.id).is_none(), "shutdown released it");
        assert!(!d.release(&lease).await.unwrap(), "released already: false");
        assert_eq!(d.renew_by_id(lease.id).await.unwrap_err().code, LockErrorCode::LeaseExpired);
        assert_eq!(
            d.stats()
                .errors
                .iter()
                .find(|(c, _)| *c == LockErrorCode::LeaseExpired)
                .map(|(_, n)| *n),
            Some(1)
        );
    }

    #[tokio::test]
    async fn a_panicking_release_task_says_an_internal_error_happened() {
        let joined =
            tokio::spawn(async { panic!("a bug") }).await.map(|()| Ok::<bool, LockError>(true));
        let err = released_or_internal(joined).unwrap_err();
        assert_eq!(err.code, LockErrorCode::OutcomeUnknown);
        assert!(err.message.contains("internal error"), "{}", err.message);
        assert!(!err.message.contains("never produce"), "{}", err.message);
    }
}
