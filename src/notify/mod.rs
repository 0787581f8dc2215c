//! Release notifications: one subscription per backend, held only while waiters really
//! wait, serving the namespace channel (the default) or a channel per key waited on
//! (`'per-key'`, `'both'`; sharded in a Cluster). Notifications only make waiting cheaper:
//! the safety poll keeps every waiter correct when one is missed (subscription down, a
//! release by an older driver).
//!
//! - [`lifecycle`]: the one task that owns the connection: when it starts, how a failure is
//!   handled, what a change of primary does, what "unsupported" means, how it stops.
//! - [`tracker`]: the channels held and their states, as plain state.
//! - [`modes`]: what differs: which channels (namespace or per key) and which connection
//!   carries them (classic, or a Cluster's, which judges per key whether its node's releases
//!   are heard sharded, classic or not at all: decision 0160).

mod lifecycle;
mod modes;
mod tracker;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::connection::RedisLink;
use crate::waiters::Lines;

/// How long after a failure before waiters may subscribe again (description: 5 seconds).
pub(crate) const RESUBSCRIBE_AFTER_FAILURE: Duration = Duration::from_secs(5);

/// The state of a backend's subscribe connection, as `stats().subscription` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubscriptionState {
    /// No subscription: nobody waits, or the last waiter left a grace period ago.
    Off,
    /// Opening the connection, or (per key) no key confirmed on it yet.
    Starting,
    /// Confirmed: releases are heard.
    Live,
    /// Up, but some keys waited on cannot be heard (per key in a Cluster: their node
    /// accepts SPUBLISH and refuses SSUBSCRIBE, decision 0160); their waiters poll at
    /// pollIntervalMs.
    Partial,
    /// The server refuses SUBSCRIBE itself (unknown command, NOPERM): poll for good.
    Unsupported,
    /// The connection failed at this moment.
    Failed(Instant),
}

impl SubscriptionState {
    /// The name `stats()` reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Starting => "starting",
            Self::Live => "live",
            Self::Partial => "partial",
            Self::Unsupported => "unsupported",
            Self::Failed(_) => "failed",
        }
    }
}

/// The release notifications of one backend, as `notifications` chose them.
pub(crate) struct Notifications(Arc<Shared>);

/// What the driver's calls and the lifecycle task share.
struct Shared {
    driver_id: u64,
    enabled: bool,
    mode: modes::Mode,
    /// LOCK_NOTIFY_UNSHARDED was said: a key heard through classic pub/sub in a Cluster
    /// (decisions 0064, 0160).
    said_unsharded: AtomicBool,
    /// LOCK_NOTIFY_UNAVAILABLE `unsupported` was said for a key that cannot be heard.
    said_deaf: AtomicBool,
    state: Mutex<State>,
    /// Keys wait to be sent.
    kick: Notify,
    /// False only while nothing is tracked: an acquire that ends then has nothing to tell
    /// (set under the state lock when a key is registered, cleared there once none is left).
    tracking: AtomicBool,
    received: AtomicU64,
    subscriptions: AtomicU64,
}

struct State {
    conn: SubscriptionState,
    channels: tracker::Tracker,
}

impl Notifications {
    /// The namespace channel (the default): one channel, held while any waiter waits.
    pub(crate) fn namespace(driver_id: u64, channel: String, enabled: bool) -> Self {
        Self::new(driver_id, modes::Mode::namespace(channel), enabled)
    }

    /// A channel per key waited on (`'per-key'`, `'both'`); sharded in a Cluster
    /// (decision 0063).
    pub(crate) fn per_key(driver_id: u64, namespace: &str, enabled: bool, cluster: bool) -> Self {
        Self::new(driver_id, modes::Mode::per_key(namespace, cluster), enabled)
    }

    fn new(driver_id: u64, mode: modes::Mode, enabled: bool) -> Self {
        Self(Arc::new(Shared {
            driver_id,
            enabled,
            mode,
            said_unsharded: AtomicBool::new(false),
            said_deaf: AtomicBool::new(false),
            state: Mutex::new(State {
                conn: SubscriptionState::Off,
                channels: tracker::Tracker::default(),
            }),
            kick: Notify::new(),
            tracking: AtomicBool::new(false),
            received: AtomicU64::new(0),
            subscriptions: AtomicU64::new(0),
        }))
    }

    /// A waiter of `hash` really starts waiting: its channel is registered, and the task
    /// starts unless it runs, the server refuses SUBSCRIBE, or it failed under 5 s ago.
    pub(crate) fn ensure(
        &self,
        hash: &Arc<str>,
        link: &Arc<RedisLink>,
        lines: &Arc<Lines>,
        stopping: &CancellationToken,
        tasks: &TaskTracker,
    ) {
        let shared = &self.0;
        if !shared.enabled || stopping.is_cancelled() {
            return;
        }
        let mut state = shared.lock();
        let start = match state.conn {
            SubscriptionState::Off => true,
            SubscriptionState::Failed(at) => at.elapsed() > RESUBSCRIBE_AFTER_FAILURE,
            SubscriptionState::Unsupported => return,
            SubscriptionState::Starting | SubscriptionState::Live | SubscriptionState::Partial => {
                false
            }
        };
        let new = state.channels.register(shared.mode.key_of(hash));
        shared.tracking.store(true, Ordering::Release);
        if start {
            state.conn = SubscriptionState::Starting;
            drop(state);
            tasks.spawn(lifecycle::run(
                shared.clone(),
                link.clone(),
                lines.clone(),
                stopping.clone(),
            ));
        } else if new {
            drop(state);
            shared.kick.notify_one();
        }
    }

    /// What an acquire of `hash` leaves behind: dropped after its place in line, so that a
    /// key whose last waiter left is forgotten at once, whatever the subscription's state
    /// (issue 34, decision 0168). None on the namespace channel, which is one entry at most.
    pub(crate) fn leaving(&self, hash: &Arc<str>, lines: &Arc<Lines>) -> Option<Leaving> {
        self.0.mode.is_per_key().then(|| Leaving {
            shared: self.0.clone(),
            hash: hash.clone(),
            lines: lines.clone(),
        })
    }

    /// Entries of the tracker: (keys, over all its collections). For tests: both stay
    /// bounded by the keys waited on (issue 34).
    pub(crate) fn tracked(&self) -> (usize, usize) {
        let state = self.0.lock();
        (state.channels.len(), state.channels.footprint())
    }

    /// A release of `hash` would be heard here now (per key: its subscription is confirmed).
    pub(crate) fn is_live_for(&self, hash: &str) -> bool {
        let state = self.0.lock();
        state.conn == SubscriptionState::Live
            && state.channels.is_live(self.0.mode.key_of_str(hash))
    }

    /// The state of the subscription: live once its connection is open and a channel is
    /// confirmed on it; partial while a key waited on cannot be heard.
    pub(crate) fn state(&self) -> SubscriptionState {
        let state = self.0.lock();
        match state.conn {
            SubscriptionState::Live if state.channels.deaf() > 0 => SubscriptionState::Partial,
            SubscriptionState::Live if state.channels.live() == 0 => SubscriptionState::Starting,
            conn => conn,
        }
    }

    /// Notifications received since the backend started.
    pub(crate) fn received(&self) -> u64 {
        self.0.received.load(Ordering::Relaxed)
    }

    /// Subscriptions confirmed: of the namespace channel, or SUBSCRIBE round trips (each a
    /// batch of keys).
    pub(crate) fn subscriptions(&self) -> u64 {
        self.0.subscriptions.load(Ordering::Relaxed)
    }

    /// Keys with a confirmed subscription (per key; 0 on the namespace channel).
    pub(crate) fn subscribed_keys(&self) -> usize {
        if self.0.mode.is_per_key() {
            self.0.lock().channels.live()
        } else {
            0
        }
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }
}

/// See [`Notifications::leaving`].
pub(crate) struct Leaving {
    shared: Arc<Shared>,
    hash: Arc<str>,
    lines: Arc<Lines>,
}

impl Drop for Leaving {
    fn drop(&mut self) {
        let shared = &self.shared;
        if !shared.tracking.load(Ordering::Acquire) {
            return;
        }
        let mut state = shared.lock();
        // Decided under the state lock, as the sweep's: a waiter that joins the line now
        // registers the key under it after this, so it is tracked again if forgotten here.
        if !shared.mode.in_use(&self.lines, &self.hash) {
            state.channels.left(shared.mode.key_of_str(&self.hash));
        }
        if state.channels.is_empty() {
            shared.tracking.store(false, Ordering::Release);
        }
    }
}

/// Resolves at the next change of primary; never without Sentinel.
pub(crate) async fn primary_switched(switches: &mut Option<tokio::sync::watch::Receiver<u64>>) {
    if let Some(switches) = switches {
        if switches.changed().await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

/// Sleeps until `deadline`, or for ever without one (a `select!` arm that never fires).
pub(crate) async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => std::future::pending().await,
    }
}
