//! Release notifications: one subscribe connection per backend to `<namespace>:lock-released`,
//! opened only when a waiter really waits and closed a second after the last one left.
//!
//! Notifications only make waiting cheaper; the safety poll keeps every waiter correct
//! when one is missed (subscription down, a release by an older driver).

// TODO(lead): notify/ after merge: spell these pub(crate) and drop the allow (issue 22).
#![allow(unreachable_pub, missing_docs)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::connection::{RedisLink, SubscribeFailure};
use crate::error::RedisFailure;
use crate::events;
use crate::key_notify::KeySubscriptions;
use crate::waiters::Lines;

/// The release notifications of one backend, as `notifications` chose them.
pub enum Notifications {
    /// The namespace channel (the default).
    Namespace(Arc<Notifier>),
    /// A channel per key waited on (`'per-key'`, `'both'`).
    PerKey(Arc<KeySubscriptions>),
}

impl Notifications {
    /// A waiter of `hash` really starts waiting.
    pub fn ensure(
        &self,
        hash: &Arc<str>,
        link: &Arc<RedisLink>,
        lines: &Arc<Lines>,
        stopping: &CancellationToken,
        tasks: &TaskTracker,
    ) {
        match self {
            Self::Namespace(n) => n.ensure(link, lines, stopping, tasks),
            Self::PerKey(k) => k.ensure(hash, link, lines, stopping, tasks),
        }
    }

    /// A release of `hash` would be heard here now.
    pub fn is_live_for(&self, hash: &str) -> bool {
        match self {
            Self::Namespace(n) => n.is_live(),
            Self::PerKey(k) => k.is_live_for(hash),
        }
    }

    /// The state of the subscribe connection.
    pub fn state(&self) -> SubscriptionState {
        match self {
            Self::Namespace(n) => n.state(),
            Self::PerKey(k) => k.state(),
        }
    }

    pub fn received(&self) -> u64 {
        match self {
            Self::Namespace(n) => n.received(),
            Self::PerKey(k) => k.received(),
        }
    }

    /// Subscriptions confirmed: of the namespace channel, or SUBSCRIBE round trips (each a
    /// batch of keys).
    pub fn subscriptions(&self) -> u64 {
        match self {
            Self::Namespace(n) => n.subscriptions(),
            Self::PerKey(k) => k.subscriptions(),
        }
    }

    /// Keys with a confirmed subscription (per key; 0 on the namespace channel).
    pub fn subscribed_keys(&self) -> usize {
        match self {
            Self::Namespace(_) => 0,
            Self::PerKey(k) => k.live_keys(),
        }
    }
}

/// How long the subscription outlives the last waiter (description: 1 second).
pub const IDLE_UNSUBSCRIBE: Duration = Duration::from_secs(1);
/// How long after a failure before waiters may subscribe again (description: 5 seconds).
pub const RESUBSCRIBE_AFTER_FAILURE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubscriptionState {
    Off,
    Starting,
    Live,
    /// The server refuses SUBSCRIBE itself (unknown command, NOPERM): poll for good.
    Unsupported,
    /// The connection failed at this moment.
    Failed(Instant),
}

impl SubscriptionState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Starting => "starting",
            Self::Live => "live",
            Self::Unsupported => "unsupported",
            Self::Failed(_) => "failed",
        }
    }
}

pub struct Notifier {
    driver_id: u64,
    channel: String,
    enabled: bool,
    state: Mutex<SubscriptionState>,
    received: AtomicU64,
    subscriptions: AtomicU64,
}

impl Notifier {
    pub fn new(driver_id: u64, channel: String, enabled: bool) -> Self {
        Self {
            driver_id,
            channel,
            enabled,
            state: Mutex::new(SubscriptionState::Off),
            received: AtomicU64::new(0),
            subscriptions: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SubscriptionState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn state(&self) -> SubscriptionState {
        *self.lock()
    }

    pub fn is_live(&self) -> bool {
        self.state() == SubscriptionState::Live
    }

    /// Notifications received since the backend started.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Subscriptions confirmed since the backend started.
    pub fn subscriptions(&self) -> u64 {
        self.subscriptions.load(Ordering::Relaxed)
    }

    /// Called when a waiter really starts waiting: subscribes unless a subscription is
    /// live or starting, the server does not support it, or it failed under 5 s ago.
    pub fn ensure(
        self: &Arc<Self>,
        link: &Arc<RedisLink>,
        lines: &Arc<Lines>,
        stopping: &CancellationToken,
        tasks: &TaskTracker,
    ) {
        if !self.enabled || stopping.is_cancelled() {
            return;
        }
        {
            let mut state = self.lock();
            match *state {
                SubscriptionState::Off => {}
                SubscriptionState::Failed(at) if at.elapsed() > RESUBSCRIBE_AFTER_FAILURE => {}
                _ => return,
            }
            *state = SubscriptionState::Starting;
        }
        tasks.spawn(self.clone().run(link.clone(), lines.clone(), stopping.clone()));
    }

    async fn run(
        self: Arc<Self>,
        link: Arc<RedisLink>,
        lines: Arc<Lines>,
        stopping: CancellationToken,
    ) {
        // Taken before the first subscribe, so a change of primary while it fails is seen.
        let mut switches = link.primary_switches();
        loop {
            let subscribed = tokio::select! {
                _ = stopping.cancelled() => break,
                subscribed = link.subscribe(&self.channel) => subscribed,
            };
            // The failure, and whether it came from the data node (not from asking Sentinel).
            let failure = match subscribed {
                Ok(messages) => {
                    *self.lock() = SubscriptionState::Live;
                    self.subscriptions.fetch_add(1, Ordering::Relaxed);
                    // A release before the subscription sent nothing we could hear: every
                    // line's first waiter checks once more.
                    lines.wake_all();
                    match self.listen(messages, &lines, &stopping, &mut switches).await {
                        Ended::Stopped => break,
                        Ended::Idle => return,
                        // Sentinel moved the primary: releases are published there now.
                        Ended::Switched => continue,
                        Ended::Lost(failure) => (failure, true),
                    }
                }
                Err(SubscribeFailure::Unsupported(_)) => return self.unsupported(&lines),
                Err(SubscribeFailure::Failed(failure)) => (failure, true),
                Err(SubscribeFailure::NoPrimary(failure)) => (failure, false),
            };
            let at = self.failed(failure, &link, &lines);
            if !self.resubscribe_at_switch(at, &lines, &stopping, &mut switches).await {
                return;
            }
        }
        // Dropping the stream closes the subscribe connection.
        *self.lock() = SubscriptionState::Off;
    }

    /// Delivers notifications until shutdown, the last waiter leaving, a change of primary
    /// or the loss of the subscription.
    async fn listen(
        &self,
        mut messages: redis::aio::PubSubStream,
        lines: &Lines,
        stopping: &CancellationToken,
        switches: &mut Option<tokio::sync::watch::Receiver<u64>>,
    ) -> Ended {
        loop {
            let idle_until = lines.idle_since().map(|since| since + IDLE_UNSUBSCRIBE);
            tokio::select! {
                _ = stopping.cancelled() => return Ended::Stopped,
                _ = primary_switched(switches) => return Ended::Switched,
                message = messages.next() => match message {
                    Some(message) => {
                        self.received.fetch_add(1, Ordering::Relaxed);
                        if let Ok(hash) = std::str::from_utf8(message.get_payload_bytes()) {
                            lines.wake(hash);
                        }
                    }
                    None => return Ended::Lost(RedisFailure::new(
                        crate::error::RedisErrorCode::ConnectionLost,
                        crate::error::Outcome::Unknown,
                        "the release-notification connection was closed",
                    )),
                },
                _ = lines.changed(), if idle_until.is_none() => {}
                _ = sleep_until_opt(idle_until) => {
                    // Decided under the state lock: a waiter marks itself waiting before it
                    // calls `ensure()`, so either it is seen here and the subscription stays,
                    // or `ensure()` runs after this and finds Off and subscribes again. It
                    // never sleeps on a subscription that is going away.
                    let mut state = self.lock();
                    if lines.idle_since().is_some_and(|since| since.elapsed() >= IDLE_UNSUBSCRIBE) {
                        *state = SubscriptionState::Off;
                        return Ended::Idle; // dropping the stream closes the subscribe connection
                    }
                }
            }
        }
    }

    /// After a failure at `at`: with Sentinel, the likeliest cause is a primary that went
    /// away, and Sentinel soon names a new one. Subscribing there as soon as it does, rather
    /// than 5 s after the failure, keeps waiters from polling through the whole failover.
    /// True to subscribe again now; false when the usual 5 s rule applies (no Sentinel, no
    /// switch in time, shutdown, or `ensure()` already started another subscription).
    async fn resubscribe_at_switch(
        &self,
        at: Instant,
        lines: &Lines,
        stopping: &CancellationToken,
        switches: &mut Option<tokio::sync::watch::Receiver<u64>>,
    ) -> bool {
        if switches.is_none() {
            return false;
        }
        let switched = tokio::select! {
            _ = stopping.cancelled() => false,
            _ = primary_switched(switches) => true,
            _ = tokio::time::sleep_until((at + RESUBSCRIBE_AFTER_FAILURE).into()) => false,
        };
        let mut state = self.lock();
        if !switched || *state != SubscriptionState::Failed(at) {
            return false;
        }
        if lines.idle_since().is_some() {
            // Nobody waits: the next waiter subscribes at once, on the new primary.
            *state = SubscriptionState::Off;
            return false;
        }
        *state = SubscriptionState::Starting;
        true
    }

    /// The server refuses SUBSCRIBE itself: poll for good, said once.
    fn unsupported(&self, lines: &Lines) {
        let mut state = self.lock();
        // Waiters asleep for notifyPollIntervalMs must move to the faster pollIntervalMs.
        lines.wake_all();
        if *state != SubscriptionState::Unsupported {
            events::notify_unsupported(self.driver_id);
        }
        *state = SubscriptionState::Unsupported;
    }

    /// The subscription failed or was lost, or its connection was refused (maxclients,
    /// AUTH): poll, and subscribe again when waiters come back after 5 s.
    fn failed(
        &self,
        (failure, from_node): (RedisFailure, bool),
        link: &RedisLink,
        lines: &Lines,
    ) -> Instant {
        if from_node && failure.server_code.is_none() {
            // Whatever closed this connection (a restart, a network cut) likely closed the
            // command connection too; the waiters woken below must not race its death. A
            // server's refusal (maxclients), or Sentinels that could not name the primary,
            // say nothing about the open command connection.
            link.forget_current();
        }
        let mut state = self.lock();
        lines.wake_all();
        events::notify_failed(self.driver_id, &failure);
        let at = Instant::now();
        *state = SubscriptionState::Failed(at);
        at
    }
}

/// Why [`Notifier::listen`] stopped.
enum Ended {
    Stopped,
    Idle,
    Switched,
    Lost(RedisFailure),
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
