//! The backend: acquire with its wait, release, renew. Plain Rust; the binding maps it to JS.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::attempt::Attempt;
use crate::connection::{RedisLink, ScriptCall};
use crate::error::{LockError, LockErrorCode, RedisFailure};
use crate::keys::{self, KeyLayout, KeyNames};
use crate::lease::{Lease, NotExtended, Refused, Registry};
use crate::notify::{sleep_until_opt, Notifications};
use crate::options::{BackendOptions, ConnectionOptions};
use crate::replicas::Replicas;
use crate::scripts::{self, ReleaseChannels, ReleaseReply};
use crate::stats::{Counters, Stats};
use crate::waiters::{InProgress, InProgressGuard, Lines, Place};

static NEXT_DRIVER_ID: AtomicU64 = AtomicU64::new(1);

/// A lock backend on one Redis. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Driver {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub id: u64,
    pub options: BackendOptions,
    pub layout: KeyLayout,
    pub link: Arc<RedisLink>,
    /// Where releases are published (`notifications`).
    pub release_channels: ReleaseChannels,
    pub leases: Registry,
    pub lines: Arc<Lines>,
    pub notify: Notifications,
    pub in_progress: InProgress,
    pub counters: Counters,
    /// WAIT for minReplicas after a winning acquire and a renew (decisions 0025–0027).
    pub replicas: Replicas,
    /// Cancelled when shutdown begins: stops every wait.
    pub stopping: CancellationToken,
    /// Every task that talks to Redis, so shutdown can wait for them.
    pub tasks: TaskTracker,
    /// Background cleanups that failed while shutdown was running.
    pub cleanup_failures: Mutex<Vec<LockError>>,
    pub shutdown_result: tokio::sync::OnceCell<Result<(), LockError>>,
}

/// See [`Driver::downgrade`].
pub struct WeakDriver(std::sync::Weak<Inner>);

impl WeakDriver {
    pub fn upgrade(&self) -> Option<Driver> {
        self.0.upgrade().map(|inner| Driver { inner })
    }
}

/// An acquire that passed the checks and holds its place in line.
struct Admitted {
    _in_progress: InProgressGuard,
    place: Place,
    keys: Arc<KeyNames>,
    wait_ms: u32,
    deadline: Instant,
}

impl Driver {
    /// Validates nothing itself: pass options from [`crate::options`]. Connects lazily.
    pub fn new(connection: &ConnectionOptions, options: BackendOptions) -> Result<Self, LockError> {
        let id = NEXT_DRIVER_ID.fetch_add(1, Ordering::Relaxed);
        let link = RedisLink::new(connection, id)?;
        // A Cluster cannot promise WAIT runs on the node connection that wrote (decision 0025).
        if options.min_replicas > 0 && connection.cluster {
            return Err(LockError::new(
                LockErrorCode::InvalidOptions,
                "options.minReplicas needs a single Redis, not connection.cluster",
            ));
        }
        let replicas = Replicas::new(&options, link.command_timeout);
        let release_channels =
            ReleaseChannels::new(&options.namespace, options.notifications, connection.cluster);
        let notify = if options.notifications.per_key() {
            Notifications::per_key(
                id,
                &options.namespace,
                notifications_enabled(),
                connection.cluster,
            )
        } else {
            let channel = keys::released_channel(&options.namespace);
            Notifications::namespace(id, channel, notifications_enabled())
        };
        Ok(Self {
            inner: Arc::new(Inner {
                id,
                layout: KeyLayout::new(&options.namespace),
                options,
                link: Arc::new(link),
                release_channels,
                leases: Registry::default(),
                lines: Arc::new(Lines::default()),
                notify,
                in_progress: InProgress::default(),
                counters: Counters::default(),
                replicas,
                stopping: CancellationToken::new(),
                tasks: TaskTracker::new(),
                cleanup_failures: Mutex::new(Vec::new()),
                shutdown_result: tokio::sync::OnceCell::new(),
            }),
        })
    }

    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// A handle that does not keep the driver alive.
    pub fn downgrade(&self) -> WeakDriver {
        WeakDriver(Arc::downgrade(&self.inner))
    }

    pub fn options(&self) -> &BackendOptions {
        &self.inner.options
    }

    /// Validates a key given as UTF-16 code units against this backend's maxKeyBytes.
    pub fn validate_key(&self, units: &[u16]) -> Result<String, LockError> {
        keys::validate_utf16(units, self.inner.options.max_key_bytes)
    }

    pub fn tracked_leases(&self) -> usize {
        self.inner.leases.len()
    }

    pub fn waiters(&self) -> usize {
        self.inner.lines.waiters()
    }

    /// Keys with at least one waiter.
    pub fn lines(&self) -> usize {
        self.inner.lines.len()
    }

    pub fn subscription_state(&self) -> crate::notify::SubscriptionState {
        self.inner.notify.state()
    }

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

    /// Changes of primary this backend followed (Sentinel; 0 otherwise).
    pub fn primary_switches(&self) -> u64 {
        self.inner.link.primary_switch_count()
    }

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

    /// Acquires `key`, waiting up to `wait_ms` (`None`: the backend's waitTimeoutMs).
    /// `cancel` is the caller's AbortSignal.
    ///
    /// The checks and the place in the key's line are taken when this is called, not when
    /// the future is first polled: acquires called one after another line up in call
    /// order, whichever runtime thread later drives them.
    pub fn acquire(
        &self,
        key: &str,
        wait_ms: Option<u32>,
        cancel: CancellationToken,
    ) -> impl Future<Output = Result<Arc<Lease>, LockError>> + Send + 'static {
        let admitted = self.admit(key, wait_ms, &cancel);
        let this = self.clone();
        async move {
            let acquired = match admitted {
                Ok(admitted) => this.wait_and_acquire(admitted, cancel).await,
                Err(err) => Err(err),
            };
            this.counted(acquired)
        }
    }

    fn admit(
        &self,
        key: &str,
        wait_ms: Option<u32>,
        cancel: &CancellationToken,
    ) -> Result<Admitted, LockError> {
        let inner = &self.inner;
        let options = &inner.options;
        if inner.stopping.is_cancelled() {
            return Err(LockError::shut_down());
        }
        if cancel.is_cancelled() {
            return Err(LockError::aborted());
        }
        let in_progress = inner.in_progress.enter(options.max_waiters as usize)?;
        if inner.leases.len() >= options.max_tracked_leases as usize {
            return Err(too_many_leases(options.max_tracked_leases));
        }
        let wait_ms = wait_ms.unwrap_or(options.wait_timeout_ms);
        let keys = Arc::new(inner.layout.names(key));
        let place = inner.lines.join(&keys.hash, wait_ms == 0)?;
        Ok(Admitted {
            _in_progress: in_progress,
            place,
            keys,
            wait_ms,
            deadline: Instant::now() + Duration::from_millis(wait_ms.into()),
        })
    }

    async fn wait_and_acquire(
        &self,
        admitted: Admitted,
        cancel: CancellationToken,
    ) -> Result<Arc<Lease>, LockError> {
        let inner = &self.inner;
        let options = &inner.options;
        let Admitted { place, keys, wait_ms, deadline, .. } = &admitted;
        let (wait_ms, deadline) = (*wait_ms, *deadline);

        let my_turn = self
            .unless_stopped(&cancel, async {
                tokio::select! {
                    biased;
                    _ = place.turn() => true,
                    _ = tokio::time::sleep_until(deadline.into()) => false,
                }
            })
            .await?;
        if !my_turn {
            return Err(wait_timeout());
        }

        // A failure ridden out while waiting; reported if the wait ends on it.
        let mut last_failure: Option<RedisFailure> = None;
        // Nothing is submitted while connecting, so the wait's deadline cuts a connect; with
        // waitTimeoutMs 0 ("tries once") only connectTimeoutMs bounds it (decision 0004).
        let connect_until = (wait_ms > 0).then_some(deadline);
        // The waiter before us in this line acquired the key: it is held here, so asking
        // Redis now would only hear "busy". Wait for the release to be announced.
        let mut skip_attempt = wait_ms > 0 && place.line.held_here();
        loop {
            if skip_attempt {
                skip_attempt = false;
                place.mark_waiting();
                inner.notify.ensure(
                    &keys.hash,
                    &inner.link,
                    &inner.lines,
                    &inner.stopping,
                    &inner.tasks,
                );
                let delay = self
                    .safety_interval(&keys.hash)
                    .min(deadline.saturating_duration_since(Instant::now()));
                self.pause(place, delay, &cancel).await?;
                continue;
            }
            inner.counters.attempt();
            let connected = self
                .unless_stopped(&cancel, async {
                    tokio::select! {
                        biased;
                        conn = inner.link.connection() => Some(conn),
                        _ = sleep_until_opt(connect_until) => None,
                    }
                })
                .await?;
            let attempt = match connected {
                None => {
                    return Err(last_failure
                        .map(LockError::from_redis)
                        .unwrap_or_else(wait_timeout))
                }
                Some(Err(failure)) => Attempt::Failed(failure),
                Some(Ok(conn)) => {
                    let mut reply = self.spawn_attempt(conn, keys.clone());
                    tokio::select! {
                        biased;
                        r = &mut reply => match r {
                            Ok(attempt) => attempt,
                            // The attempt's task panicked: it may have run, so the wait ends.
                            Err(_) => return Err(internal_error("acquire attempt")),
                        },
                        _ = inner.stopping.cancelled() => { self.salvage(reply); return Err(LockError::shut_down()) }
                        _ = cancel.cancelled() => { self.salvage(reply); return Err(LockError::aborted()) }
                    }
                }
            };
            let delay = match attempt {
                Attempt::Acquired(lease) => {
                    place.line.mark_held_here();
                    return self.track(lease);
                }
                Attempt::Busy(_) if wait_ms == 0 => {
                    return Err(LockError::new(
                        LockErrorCode::LockBusy,
                        "the lock is held by another owner",
                    ))
                }
                Attempt::Busy(pttl) => {
                    last_failure = None;
                    // Really waiting now: listen for releases instead of polling fast.
                    place.mark_waiting();
                    inner.notify.ensure(
                        &keys.hash,
                        &inner.link,
                        &inner.lines,
                        &inner.stopping,
                        &inner.tasks,
                    );
                    match pttl {
                        // Expired or gone in between: try again at once.
                        Some(0) | Some(-2) => Duration::ZERO,
                        Some(ms) if ms > 0 => {
                            Duration::from_millis(ms as u64).min(self.safety_interval(&keys.hash))
                        }
                        // No expiry (-1) or an old script's nil: only the safety interval is known.
                        _ => self.safety_interval(&keys.hash),
                    }
                }
                Attempt::Failed(failure) if wait_ms > 0 && failure.rides_out_waiting() => {
                    last_failure = Some(failure);
                    Duration::from_millis(options.poll_interval_ms.into())
                }
                Attempt::Failed(failure) => return Err(LockError::from_redis(failure)),
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(last_failure.map(LockError::from_redis).unwrap_or_else(wait_timeout));
            }
            let delay = delay.min(deadline - now);
            if delay.is_zero() {
                continue;
            }
            self.pause(place, delay, &cancel).await?;
        }
    }

    /// Runs `work` unless shutdown begins or the caller's signal aborts first (checked first).
    async fn unless_stopped<T>(
        &self,
        cancel: &CancellationToken,
        work: impl Future<Output = T>,
    ) -> Result<T, LockError> {
        tokio::select! {
            biased;
            _ = self.inner.stopping.cancelled() => Err(LockError::shut_down()),
            _ = cancel.cancelled() => Err(LockError::aborted()),
            out = work => Ok(out),
        }
    }

    /// Sleeps up to `delay`, or until a release of the key is announced.
    async fn pause(
        &self,
        place: &Place,
        delay: Duration,
        cancel: &CancellationToken,
    ) -> Result<(), LockError> {
        let woken = self
            .unless_stopped(cancel, async {
                tokio::select! {
                    biased;
                    _ = place.line.wake.notified() => true,
                    _ = tokio::time::sleep(delay) => false,
                }
            })
            .await?;
        if woken {
            return self.head_start(place, cancel).await;
        }
        // A head start owed to a release whose notification never came is void: it must not
        // delay a later, unrelated wake.
        place.line.forget_head_start();
        Ok(())
    }

    /// Woken by a release this backend made itself while other processes listen: let
    /// their first waiters try first, or this process, whose runtime is already awake,
    /// would win most hand-offs (decision 0010). Counted from our own wake: the other
    /// processes hear the same notification at about the same moment.
    ///
    /// A release announced during a staggered head start (decision 0070) means someone took
    /// the key and gave it back meanwhile: the head start is sized again, shorter, instead
    /// of trying for a key that was surely taken. A long head start is thus often never
    /// served, which spares Redis the attempt.
    async fn head_start(&self, place: &Place, cancel: &CancellationToken) -> Result<(), LockError> {
        while let Some(head_start) = place.line.head_start(self.inner.lines.others_listening()) {
            let announced = self
                .unless_stopped(cancel, async {
                    tokio::select! {
                        biased;
                        _ = place.line.wake.notified() => true,
                        _ = precise_sleep(head_start) => false,
                    }
                })
                .await?;
            if !announced {
                break;
            }
        }
        Ok(())
    }

    /// How long a waiter of `hash` sleeps without other news: notifyPollIntervalMs while a
    /// release of it would be heard (per key: its subscription is confirmed),
    /// pollIntervalMs otherwise.
    fn safety_interval(&self, hash: &str) -> Duration {
        let options = &self.inner.options;
        let ms = if self.inner.notify.is_live_for(hash) {
            options.notify_poll_interval_ms
        } else {
            options.poll_interval_ms
        };
        Duration::from_millis(ms.into())
    }

    pub(crate) fn track(&self, lease: Arc<Lease>) -> Result<Arc<Lease>, LockError> {
        let max = self.inner.options.max_tracked_leases;
        let refused = match self.inner.leases.insert(lease.clone(), max as usize) {
            Ok(()) => return Ok(lease),
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
        let first = lease.mark_released();
        if first {
            self.inner.lines.releasing(&lease.keys.hash);
        }
        let this = self.clone();
        let lease = lease.clone();
        async move {
            if !first {
                return Ok(false);
            }
            let tracked = this.clone();
            // Tracked, so shutdown waits for releases in progress. Boxed, as the acquire
            // attempt is (attempt.rs): the release script's future is large.
            let task = this.inner.tasks.spawn(Box::pin(async move {
                let released = tracked.run_release(&lease.keys, &lease.token).await;
                if released.is_ok() {
                    tracked.inner.leases.remove(lease.id);
                } else {
                    // Still reported as failed, but released by token in the background
                    // and untracked once the key is surely gone (decision 0006).
                    tracked.finish_failed_release(lease.clone());
                }
                if let Ok(ReleaseReply::Deleted { listeners }) = released {
                    // Our own subscription is one of the listeners while it is live.
                    let ours = u64::from(tracked.inner.notify.is_live_for(&lease.keys.hash));
                    tracked.inner.lines.heard_release(listeners.saturating_sub(ours));
                }
                released.map(|r| matches!(r, ReleaseReply::Deleted { .. }))
            }));
            this.counted(released_or_internal(task.await))
        }
    }

    /// A lease handed out by this backend, by id, while it is tracked: until it is released
    /// (the binding hands leases to JS by id, not as one native object each).
    pub fn lease(&self, id: u64) -> Option<Arc<Lease>> {
        self.inner.leases.get(id)
    }

    /// [`Driver::release`] by lease id. A lease no longer tracked was released already (by
    /// `release()` or shutdown): false, asking Redis nothing, as a second `release()` does.
    pub fn release_by_id(
        &self,
        id: u64,
    ) -> impl Future<Output = Result<bool, LockError>> + Send + 'static {
        let releasing = self.lease(id).map(|lease| self.release(&lease));
        async move {
            match releasing {
                Some(releasing) => releasing.await,
                None => Ok(false),
            }
        }
    }

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
            let renewed = this.renew_valid(&lease).await;
            this.counted(renewed)
        }
    }

    async fn renew_valid(&self, lease: &Arc<Lease>) -> Result<(), LockError> {
        let call = ScriptCall {
            script: &scripts::RENEW,
            keys: vec![lease.keys.lock.clone()],
            args: vec![lease.token.clone(), lease.lease_ms.to_string()],
        };
        let (value, submitted, conn) = match self.inner.link.run_on(&call).await {
            Ok(reply) => reply,
            Err(failure) => {
                if !failure.surely_not_applied() {
                    lease.invalidate();
                    lease.may_have_written(Instant::now());
                }
                return Err(LockError::from_redis(failure));
            }
        };
        let answered = Instant::now();
        if scripts::parse_flag(&value) == Some(true) {
            // The extension counts once minReplicas replicas have it; until then the lease
            // keeps its old deadline, which every replica agrees with (decision 0027). Redis
            // did extend the key, so cleanup must go on until the new latest expiry.
            if let Err(failure) = self.inner.replicas.confirm(&self.inner.link, &conn).await {
                lease.may_have_written(answered);
                return Err(LockError::from_redis(failure));
            }
        }
        match scripts::parse_flag(&value) {
            Some(true) => match lease.extend(submitted, answered) {
                Ok(()) => Ok(()),
                Err(NotExtended::Released) => Err(LockError::new(
                    LockErrorCode::LeaseExpired,
                    "the lease was released while the renew was in flight",
                )),
                Err(NotExtended::Expired) => Err(LockError::new(
                    LockErrorCode::LeaseExpired,
                    "the renew was confirmed after the lease expired",
                )),
            },
            Some(false) => {
                lease.invalidate();
                Err(LockError::new(
                    LockErrorCode::LeaseLost,
                    "the lock is no longer held by this lease",
                ))
            }
            None => {
                lease.invalidate();
                Err(LockError::from_redis(RedisFailure::unexpected_reply()))
            }
        }
    }
}

/// `DOKEBI_LOCK_REDIS_NOTIFICATIONS=0` turns release notifications off, so waiters only
/// poll: the "before" of the contention benchmark (docs/decisions/0007).
fn notifications_enabled() -> bool {
    std::env::var("DOKEBI_LOCK_REDIS_NOTIFICATIONS").map_or(true, |v| v != "0")
}

/// tokio's timer counts whole milliseconds (a 300 µs sleep lasts 1–2 ms); a head start
/// shorter than that sleeps on the blocking pool instead.
async fn precise_sleep(d: Duration) {
    if d >= Duration::from_millis(1) {
        return tokio::time::sleep(d).await;
    }
    let _ = tokio::task::spawn_blocking(move || std::thread::sleep(d)).await;
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

fn no_longer_valid() -> LockError {
    LockError::new(LockErrorCode::LeaseExpired, "the lease is no longer valid")
}

fn wait_timeout() -> LockError {
    LockError::new(LockErrorCode::WaitTimeout, "the wait for the lock ran out")
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
        let now = Instant::now();
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
        let now = Instant::now();
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
        assert!(!d.release_by_id(lease.id).await.unwrap(), "released already: false");
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
