//! Acquiring: the checks and the place in the key's line taken at the call, then the wait
//! (its turn in line, attempts, pauses until a release is announced or the safety interval
//! passes, the head start) until the lease is won or the wait ends.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::attempt::Attempt;
use super::{internal_error, too_many_leases, Driver};
use crate::awake::Waiting;
use crate::error::{LockError, LockErrorCode, RedisFailure};
use crate::keys::KeyNames;
use crate::lease::Lease;
use crate::notify::{sleep_until_opt, Leaving};
use crate::waiters::{InProgressGuard, Place};

/// An acquire that passed the checks and holds its place in line.
struct Admitted {
    _in_progress: InProgressGuard,
    place: Place,
    /// After `place`, so it drops after the place leaves the line.
    _leaving: Option<Leaving>,
    keys: Arc<KeyNames>,
    wait_ms: u32,
    deadline: Instant,
}

impl Driver {
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
        self.acquire_unless(key, wait_ms, Some(cancel))
    }

    /// [`acquire`](Self::acquire), with no token when the caller has no signal: most
    /// acquires, which then allocate no token and take none of its locks.
    pub fn acquire_unless(
        &self,
        key: &str,
        wait_ms: Option<u32>,
        cancel: Option<CancellationToken>,
    ) -> impl Future<Output = Result<Arc<Lease>, LockError>> + Send + 'static {
        let cancel = Signal(cancel);
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
        cancel: &Signal,
    ) -> Result<Admitted, LockError> {
        let inner = &self.inner;
        let options = &inner.options;
        if inner.stopping.is_cancelled() {
            return Err(LockError::shut_down());
        }
        if cancel.is_aborted() {
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
            _leaving: inner.notify.leaving(&keys.hash, &inner.lines),
            keys,
            wait_ms,
            deadline: Instant::now() + Duration::from_millis(wait_ms.into()),
        })
    }

    async fn wait_and_acquire(
        &self,
        admitted: Admitted,
        cancel: Signal,
    ) -> Result<Arc<Lease>, LockError> {
        let inner = &self.inner;
        let options = &inner.options;
        let Admitted { place, keys, wait_ms, deadline, .. } = &admitted;
        let (wait_ms, deadline) = (*wait_ms, *deadline);

        let my_turn = self
            .unless_stopped(&cancel, async {
                let mut turn = std::pin::pin!(place.turn());
                if futures::poll!(turn.as_mut()).is_ready() {
                    return true;
                }
                let waiting = Waiting::begin();
                let my_turn = tokio::select! {
                    biased;
                    _ = turn => true,
                    _ = tokio::time::sleep_until(deadline.into()) => false,
                };
                if my_turn {
                    waiting.attempt();
                }
                my_turn
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
        // An attempt refused unsent, its connection closed in that moment, is made once more
        // at once on a new one, also with waitTimeoutMs 0: it was never tried (decision 0178).
        let mut sent_anew = false;
        loop {
            if skip_attempt {
                skip_attempt = false;
                self.really_waiting(place, &keys.hash);
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
                    let (mut attempt, mut reply) = self.attempt(conn, keys.clone());
                    // Driven here until it answers; dropped then (or on leaving), what is
                    // left of it goes on in a task of its own. The two stops are registered
                    // once for the whole loop, not at each of its turns (two locks each).
                    let stopped = inner.stopping.cancelled();
                    let aborted = cancel.aborted();
                    tokio::pin!(stopped, aborted);
                    let answer = loop {
                        tokio::select! {
                            biased;
                            r = &mut reply => break r,
                            _ = &mut attempt, if !attempt.is_done() => {}
                            _ = &mut stopped => { drop(attempt); self.salvage(reply); return Err(LockError::shut_down()) }
                            _ = &mut aborted => { drop(attempt); self.salvage(reply); return Err(LockError::aborted()) }
                        }
                    };
                    drop(attempt);
                    match answer {
                        Ok(attempt) => attempt,
                        // The attempt panicked: it may have run, so the wait ends.
                        Err(_) => return Err(internal_error("acquire attempt")),
                    }
                }
            };
            let delay = match attempt {
                Attempt::Failed(failure)
                    if failure.refused_on_closed_connection() && !sent_anew =>
                {
                    sent_anew = true;
                    last_failure = Some(failure);
                    continue;
                }
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
                    self.really_waiting(place, &keys.hash);
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

    /// This acquire really waits now: it counts as waiting (the subscription stays) and
    /// listens for releases of its key instead of polling fast.
    fn really_waiting(&self, place: &Place, hash: &Arc<str>) {
        let inner = &self.inner;
        place.mark_waiting();
        inner.notify.ensure(hash, &inner.link, &inner.lines, inner.stopping.token(), &inner.tasks);
    }

    /// Runs `work` unless shutdown begins or the caller's signal aborts first (checked first).
    /// Work ready at once (the first in its line, a connection already open) registers on
    /// neither token: each registration takes two locks, and an uncontended acquire passes
    /// here twice (benchmarks/results/2026-12-06-where-it-goes.md).
    async fn unless_stopped<T>(
        &self,
        cancel: &Signal,
        work: impl Future<Output = T>,
    ) -> Result<T, LockError> {
        if self.inner.stopping.is_cancelled() {
            return Err(LockError::shut_down());
        }
        if cancel.is_aborted() {
            return Err(LockError::aborted());
        }
        let mut work = std::pin::pin!(work);
        if let Poll::Ready(out) = futures::poll!(work.as_mut()) {
            return Ok(out);
        }
        tokio::select! {
            biased;
            _ = self.inner.stopping.cancelled() => Err(LockError::shut_down()),
            _ = cancel.aborted() => Err(LockError::aborted()),
            out = work => Ok(out),
        }
    }

    /// Waits before the next attempt, counted as waiting meanwhile (`crate::awake`).
    async fn pause(
        &self,
        place: &Place,
        delay: Duration,
        cancel: &Signal,
    ) -> Result<(), LockError> {
        let waiting = Waiting::begin();
        self.sleep_until_woken(place, delay, cancel).await?;
        waiting.attempt();
        Ok(())
    }

    /// Sleeps up to `delay`, or until a release of the key is announced.
    async fn sleep_until_woken(
        &self,
        place: &Place,
        delay: Duration,
        cancel: &Signal,
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
    async fn head_start(&self, place: &Place, cancel: &Signal) -> Result<(), LockError> {
        while let Some(head_start) = self.inner.lines.head_start(&place.line) {
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
}

/// The caller's AbortSignal as a token, or none.
struct Signal(Option<CancellationToken>);

impl Signal {
    fn is_aborted(&self) -> bool {
        self.0.as_ref().is_some_and(CancellationToken::is_cancelled)
    }

    /// Pending forever without a signal.
    async fn aborted(&self) {
        match &self.0 {
            Some(token) => token.cancelled().await,
            None => std::future::pending().await,
        }
    }
}

/// tokio's timer counts whole milliseconds (a 300 µs sleep lasts 1–2 ms); a head start
/// shorter than that sleeps on the blocking pool instead.
async fn precise_sleep(d: Duration) {
    if d >= Duration::from_millis(1) {
        return tokio::time::sleep(d).await;
    }
    let _ = tokio::task::spawn_blocking(move || std::thread::sleep(d)).await;
}

fn wait_timeout() -> LockError {
    LockError::new(LockErrorCode::WaitTimeout, "the wait for the lock ran out")
}
