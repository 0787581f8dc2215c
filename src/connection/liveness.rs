//! Connection liveness (CONTRACT.md "Connection liveness", decision 0172): a connection that
//! has carried nothing for `pingIntervalMs` sends a PING, and one whose PING gets no answer
//! within `commandTimeoutMs` is dead.
//!
//! Why the driver asks at all: a NAT, a cloud load balancer or a partition that drops a flow
//! sends neither FIN nor RST, so an idle connection looks open until the next command is
//! handed to it and times out (OUTCOME_UNKNOWN), and a subscription stays "live" while it
//! hears nothing. TCP keepalive would not see a middlebox that answers for the peer.
//!
//! [`Activity`] is the state (when the connection last carried something, and whether a
//! command is out now); [`Quiet`] is the same for a loop that owns its connection (the
//! subscriptions, the Sentinel watchers); [`watch`] is the task that pings a shared one.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How often to ask, how long an answer may take (`every` zero: never), and how many
/// connections of the driver were found dead so far (`stats().deadConnections`).
#[derive(Clone, Debug)]
pub(crate) struct Liveness {
    pub(crate) every: Duration,
    pub(crate) timeout: Duration,
    deaths: Arc<AtomicU64>,
}

impl Liveness {
    /// pingIntervalMs, with commandTimeoutMs for the answer.
    pub(crate) fn of(options: &crate::options::ConnectionOptions) -> Self {
        Self {
            every: Duration::from_millis(options.ping_interval_ms.into()),
            timeout: Duration::from_millis(options.command_timeout_ms.into()),
            deaths: Arc::default(),
        }
    }

    /// A connection did not answer its PING in time.
    pub(crate) fn died(&self) {
        self.deaths.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn deaths(&self) -> u64 {
        self.deaths.load(Ordering::Relaxed)
    }

    pub(crate) fn is_on(&self) -> bool {
        !self.every.is_zero()
    }
}

/// When a shared connection last carried something, and how many commands it carries now.
/// Dropped with the last handle of its connection, which ends its [`watch`].
pub(crate) struct Activity {
    base: Instant,
    /// Milliseconds from `base` to the end of the last command (or to the connect). Tokio's
    /// clock, so that tests can pause it.
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
    /// False for a Cluster connection: its traffic is spread over nodes it cannot tell
    /// apart, so it is PINGed every interval whatever it carries.
    follows_traffic: bool,
    gone: CancellationToken,
}

impl Activity {
    pub(crate) fn new() -> Self {
        Self::with(true)
    }

    /// For a connection to several nodes (a Cluster's): traffic to one node says nothing of
    /// another's flow, and which node a command went to is redis-rs's to know, so it is
    /// PINGed once per interval, every node, whatever it carries (decision 0172).
    pub(crate) fn per_interval() -> Self {
        Self::with(false)
    }

    fn with(follows_traffic: bool) -> Self {
        Self {
            base: Instant::now(),
            last_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            follows_traffic,
            gone: CancellationToken::new(),
        }
    }

    /// Marks a command out until the guard drops (its reply came, or its caller left).
    pub(crate) fn carrying(&self) -> Carrying<'_> {
        if self.follows_traffic {
            self.in_flight.fetch_add(1, Ordering::AcqRel);
        }
        Carrying(self)
    }

    fn touch(&self) {
        let ms = u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.fetch_max(ms, Ordering::AcqRel);
    }

    /// When a PING would be due if nothing more is sent: `every` after the last traffic. A
    /// command out now counts as traffic until its end, so it is asked again `every` later.
    fn ping_due(&self, every: Duration, now: Instant) -> Instant {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return now + every;
        }
        self.base + Duration::from_millis(self.last_ms.load(Ordering::Acquire)) + every
    }
}

impl Drop for Activity {
    fn drop(&mut self) {
        self.gone.cancel();
    }
}

/// A command out on a connection; see [`Activity::carrying`].
pub(crate) struct Carrying<'a>(&'a Activity);

impl Drop for Carrying<'_> {
    fn drop(&mut self) {
        if !self.0.follows_traffic {
            return;
        }
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a PING came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// A reply, an error reply included: the connection carries both ways.
    Answered,
    /// No reply within the timeout, or the connection failed under it.
    Dead,
    /// Failed at once for a reason the connection's owner handles itself (a Cluster node
    /// that refuses connections: redis-rs reconnects it).
    Skipped,
}

impl Answer {
    /// Judges `ping`, bounded by `timeout`. `io_is_dead`: an I/O failure means this very
    /// connection broke (a single node's), rather than that a node could not be reached.
    pub(crate) async fn of(
        timeout: Duration,
        ping: impl Future<Output = redis::RedisResult<redis::Value>>,
        io_is_dead: bool,
    ) -> Self {
        match tokio::time::timeout(timeout, ping).await {
            Ok(Ok(_)) => Self::Answered,
            Ok(Err(e)) if e.code().is_some() => Self::Answered,
            // redis-rs's own response timeout (a Cluster's) is the unanswered PING too.
            Ok(Err(e)) if !io_is_dead && !e.is_timeout() => Self::Skipped,
            Ok(Err(_)) | Err(_) => Self::Dead,
        }
    }
}

/// Pings the connection `activity` belongs to whenever it has been quiet for `every`, until
/// it is dropped (returns false) or a PING is not answered in time (returns true: the
/// caller replaces it). `ping` sends one PING on it.
pub(crate) async fn watch<F, P>(activity: Weak<Activity>, liveness: Liveness, mut ping: P) -> bool
where
    P: FnMut() -> F,
    F: Future<Output = Answer>,
{
    let Some(gone) = activity.upgrade().map(|a| a.gone.clone()) else { return false };
    loop {
        let due = match activity.upgrade() {
            Some(a) => a.ping_due(liveness.every, Instant::now()),
            None => return false,
        };
        tokio::select! {
            _ = gone.cancelled() => return false,
            _ = tokio::time::sleep_until(due) => {}
        }
        let Some(a) = activity.upgrade() else { return false };
        if a.ping_due(liveness.every, Instant::now()) > Instant::now() {
            continue; // traffic came meanwhile: that proved it
        }
        // Held for the PING (which is bounded by its timeout): the PING is traffic too.
        let answer = {
            let _carrying = a.carrying();
            ping().await
        };
        a.touch(); // the next one is due an interval after this one's end
        if answer == Answer::Dead {
            return true;
        }
    }
}

/// The quiet of a connection owned by one loop (a subscription, a Sentinel watcher): the
/// loop says when it carried something and awaits [`due`](Self::due) beside its events.
pub(crate) struct Quiet {
    every: Option<Duration>,
    since: Instant,
    follows_traffic: bool,
}

impl Quiet {
    pub(crate) fn new(liveness: &Liveness) -> Self {
        Self::with(liveness, true)
    }

    /// For a connection to several nodes (a Cluster's sharded subscriptions): a PING every
    /// interval whatever it carries, as [`Activity::per_interval`].
    pub(crate) fn per_interval(liveness: &Liveness) -> Self {
        Self::with(liveness, false)
    }

    fn with(liveness: &Liveness, follows_traffic: bool) -> Self {
        let every = liveness.is_on().then_some(liveness.every);
        Self { every, since: Instant::now(), follows_traffic }
    }

    /// Something was sent or received.
    pub(crate) fn heard(&mut self) {
        if self.follows_traffic {
            self.since = Instant::now();
        }
    }

    /// A PING was answered.
    pub(crate) fn answered(&mut self) {
        self.since = Instant::now();
    }

    /// Resolves when a PING is due (never when liveness is off). Cancel-safe.
    pub(crate) async fn due(&self) {
        match self.every {
            Some(every) => tokio::time::sleep_until(self.since + every).await,
            None => std::future::pending().await,
        }
    }
}

/// Spawns [`watch`] for a shared connection; `dead` runs once if a PING goes unanswered.
pub(crate) fn spawn_watch<F, P>(
    activity: &Arc<Activity>,
    liveness: Liveness,
    ping: P,
    dead: impl FnOnce() + Send + 'static,
) where
    P: FnMut() -> F + Send + 'static,
    F: Future<Output = Answer> + Send,
{
    if !liveness.is_on() {
        return;
    }
    let activity = Arc::downgrade(activity);
    tokio::spawn(async move {
        if watch(activity, liveness.clone(), ping).await {
            dead();
            liveness.died(); // after: a count seen means the connection is already replaced
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_30s_answer_within_2s() -> Liveness {
        Liveness {
            every: Duration::from_secs(30),
            timeout: Duration::from_secs(2),
            deaths: Arc::default(),
        }
    }

    #[test]
    fn a_ping_is_due_a_whole_interval_after_the_last_traffic_and_never_while_a_command_is_out() {
        let a = Activity::new();
        let every = Duration::from_secs(30);
        let now = a.base + Duration::from_secs(10);
        assert_eq!(a.ping_due(every, now), a.base + every, "counted from the connect");
        let out = a.carrying();
        assert_eq!(a.ping_due(every, now), now + every, "a command out is traffic");
        drop(out);
        assert!(a.ping_due(every, now) >= a.base + every, "its end counts as traffic");
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_connection_is_pinged_and_declared_dead_when_the_ping_goes_unanswered() {
        let activity = Arc::new(Activity::new());
        let liveness = every_30s_answer_within_2s();
        let pings = Arc::new(AtomicUsize::new(0));
        let counted = pings.clone();
        let answered = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let flag = answered.clone();
        let started = tokio::time::Instant::now();
        let timeout = liveness.timeout;
        let dead = watch(Arc::downgrade(&activity), liveness, move || {
            counted.fetch_add(1, Ordering::Relaxed);
            let answering = flag.load(Ordering::Relaxed);
            async move {
                if answering {
                    Answer::Answered
                } else {
                    Answer::of(timeout, std::future::pending(), true).await
                }
            }
        });
        let cut = async {
            tokio::time::sleep(Duration::from_secs(100)).await;
            answered.store(false, Ordering::Relaxed);
            std::future::pending::<()>().await
        };
        let dead = tokio::select! { d = dead => d, _ = cut => unreachable!() };
        assert!(dead);
        // Answered at 30, 60 and 90 s; the one at 120 s went unanswered for 2 s.
        assert_eq!(pings.load(Ordering::Relaxed), 4);
        assert_eq!(started.elapsed(), Duration::from_secs(122));
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_to_several_nodes_is_pinged_every_interval_whatever_it_carries() {
        let activity = Arc::new(Activity::per_interval());
        let pings = Arc::new(AtomicUsize::new(0));
        let counted = pings.clone();
        let watched = tokio::spawn(watch(
            Arc::downgrade(&activity),
            every_30s_answer_within_2s(),
            move || {
                counted.fetch_add(1, Ordering::Relaxed);
                async { Answer::Answered }
            },
        ));
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_secs(10)).await;
            let _out = activity.carrying(); // a command out at every moment the watch looks
        }
        assert_eq!(pings.load(Ordering::Relaxed), 3, "at 30, 60 and 90 s");
        drop(activity);
        assert!(!watched.await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn traffic_postpones_the_ping_and_a_dropped_connection_ends_the_watch() {
        let activity = Arc::new(Activity::new());
        let liveness = every_30s_answer_within_2s();
        let pings = Arc::new(AtomicUsize::new(0));
        let counted = pings.clone();
        let watched = tokio::spawn(watch(Arc::downgrade(&activity), liveness, move || {
            counted.fetch_add(1, Ordering::Relaxed);
            async { Answer::Answered }
        }));
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_secs(20)).await;
            drop(activity.carrying());
        }
        assert_eq!(pings.load(Ordering::Relaxed), 0, "never quiet for 30 s");
        drop(activity);
        assert!(!watched.await.unwrap(), "gone, not dead");
    }
}
