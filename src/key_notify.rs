//! Per-key release notifications (`notifications: 'per-key'` or `'both'`, decision 0060):
//! one subscribe connection per backend, subscribed only to the channels of the keys this
//! process really waits on.
//!
//! One task owns the connection. Waiters register their key ([`KeySubscriptions::ensure`])
//! and the task subscribes every key registered since its last round trip in one
//! SUBSCRIBE, so a burst of new keys costs one round trip. A key is unsubscribed once its
//! wait line has been empty for [`GRACE`]; the connection closes when no key is left.
//! As with the namespace channel, notifications only make waiting cheaper: the safety poll
//! keeps every waiter correct when one is missed.

// TODO(lead): notify/ after merge: spell these pub(crate) and drop the allow (issue 22).
#![allow(unreachable_pub, missing_docs)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::connection::{RedisLink, SubscribeFailure};
use crate::error::{Outcome, RedisErrorCode, RedisFailure};
use crate::events;
use crate::notify::{sleep_until_opt, SubscriptionState, RESUBSCRIBE_AFTER_FAILURE};
use crate::waiters::Lines;

/// How long a key stays subscribed after its wait line emptied (decision 0061): a key
/// that is contended now is likely contended again within a second, and unsubscribing at
/// once would pay a round trip and a missed-release check for every short gap.
pub const GRACE: Duration = Duration::from_secs(1);

/// How long the first new key waits for others before their SUBSCRIBE is sent (decision
/// 0061): about one timer tick.
const BATCH_WINDOW: Duration = Duration::from_millis(2);

/// The first and the longest pause before SSUBSCRIBEs that failed are sent again.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);

/// One key's subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyState {
    /// Registered, not yet sent.
    Pending,
    /// Sent, not yet confirmed.
    Sent,
    /// Confirmed; `idle` is when its line was first seen empty.
    Live { idle: Option<Instant> },
}

struct State {
    conn: SubscriptionState,
    keys: HashMap<Arc<str>, KeyState>,
}

pub struct KeySubscriptions {
    driver_id: u64,
    /// `<namespace>:lock-released:{`: a key's channel is this, its hash and `}`.
    prefix: String,
    enabled: bool,
    /// A Cluster: subscribe sharded (SSUBSCRIBE at the slot's owner, decision 0063).
    sharded: bool,
    /// The Cluster has no sharded pub/sub (Redis < 7.0): classic SUBSCRIBE (decision 0064).
    unsharded: std::sync::atomic::AtomicBool,
    state: Mutex<State>,
    /// New keys to subscribe.
    kick: Notify,
    received: AtomicU64,
    subscriptions: AtomicU64,
}

impl KeySubscriptions {
    pub fn new(driver_id: u64, namespace: &str, enabled: bool, cluster: bool) -> Self {
        Self {
            driver_id,
            prefix: crate::keys::key_released_prefix(namespace),
            enabled,
            sharded: cluster,
            unsharded: std::sync::atomic::AtomicBool::new(false),
            state: Mutex::new(State { conn: SubscriptionState::Off, keys: HashMap::new() }),
            kick: Notify::new(),
            received: AtomicU64::new(0),
            subscriptions: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn channel(&self, hash: &str) -> String {
        let mut channel = String::with_capacity(self.prefix.len() + hash.len() + 1);
        channel.push_str(&self.prefix);
        channel.push_str(hash);
        channel.push('}');
        channel
    }

    /// The key of one of our channels (its hash), or None.
    fn hash_of<'a>(&self, channel: &'a str) -> Option<&'a str> {
        channel.strip_prefix(self.prefix.as_str())?.strip_suffix('}')
    }

    /// Subscriptions are sharded now (a Cluster with sharded pub/sub).
    pub fn is_sharded(&self) -> bool {
        self.sharded && !self.unsharded.load(Ordering::Acquire)
    }

    /// The state of the subscribe connection.
    pub fn state(&self) -> SubscriptionState {
        self.lock().conn
    }

    /// The connection is live and the key's subscription confirmed: a release of it will be
    /// heard.
    pub fn is_live_for(&self, hash: &str) -> bool {
        let state = self.lock();
        state.conn == SubscriptionState::Live
            && matches!(state.keys.get(hash), Some(KeyState::Live { .. }))
    }

    /// Keys subscribed (confirmed) now.
    pub fn live_keys(&self) -> usize {
        self.lock().keys.values().filter(|k| matches!(k, KeyState::Live { .. })).count()
    }

    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// SUBSCRIBE round trips confirmed since the backend started (one per batch of keys).
    pub fn subscriptions(&self) -> u64 {
        self.subscriptions.load(Ordering::Relaxed)
    }

    /// Called when a waiter of `hash` really starts waiting: registers the key, and starts
    /// the connection's task unless it runs, the server refuses SUBSCRIBE, or it failed
    /// under 5 s ago.
    pub fn ensure(
        self: &Arc<Self>,
        hash: &Arc<str>,
        link: &Arc<RedisLink>,
        lines: &Arc<Lines>,
        stopping: &CancellationToken,
        tasks: &TaskTracker,
    ) {
        if !self.enabled || stopping.is_cancelled() {
            return;
        }
        let mut state = self.lock();
        let start = match state.conn {
            SubscriptionState::Off => true,
            SubscriptionState::Failed(at) => at.elapsed() > RESUBSCRIBE_AFTER_FAILURE,
            SubscriptionState::Unsupported => return,
            SubscriptionState::Starting | SubscriptionState::Live => false,
        };
        match state.keys.get_mut(hash) {
            None => {
                state.keys.insert(hash.clone(), KeyState::Pending);
            }
            // Waited on again within the grace period: it stays.
            Some(KeyState::Live { idle }) => *idle = None,
            Some(_) => {}
        }
        if start {
            state.conn = SubscriptionState::Starting;
            drop(state);
            tasks.spawn(self.clone().run(link.clone(), lines.clone(), stopping.clone()));
        } else {
            drop(state);
            self.kick.notify_one();
        }
    }

    async fn run(
        self: Arc<Self>,
        link: Arc<RedisLink>,
        lines: Arc<Lines>,
        stopping: CancellationToken,
    ) {
        let mut switches = link.primary_switches();
        loop {
            if self.is_sharded() {
                let opened = tokio::select! {
                    _ = stopping.cancelled() => break,
                    opened = link.open_shard_pubsub() => opened,
                };
                let failure = match opened {
                    Some(Ok((conn, pushes))) => {
                        self.lock().conn = SubscriptionState::Live;
                        match self.serve_sharded(conn, pushes, &link, &lines, &stopping).await {
                            Ended::Stopped => break,
                            Ended::Idle => return,
                            Ended::Unsharded => {
                                // Said once; the keys go out again on a classic connection.
                                self.unsharded.store(true, Ordering::Release);
                                events::notify_unsharded(self.driver_id);
                                self.resend_all();
                                continue;
                            }
                            Ended::Switched => continue,
                            Ended::Unsupported => return self.unsupported(&lines),
                            Ended::Lost(failure) => (failure, true),
                        }
                    }
                    Some(Err(SubscribeFailure::Unsupported(_))) => return self.unsupported(&lines),
                    Some(Err(SubscribeFailure::Failed(f) | SubscribeFailure::NoPrimary(f))) => {
                        (f, true)
                    }
                    None => unreachable!("sharded only with cluster: true"),
                };
                self.failed(failure, &link, &lines);
                return;
            }
            let opened = tokio::select! {
                _ = stopping.cancelled() => break,
                opened = link.open_pubsub() => opened,
            };
            let failure = match opened {
                Ok(pubsub) => {
                    self.lock().conn = SubscriptionState::Live;
                    match self.serve(pubsub, &link, &lines, &stopping, &mut switches).await {
                        Ended::Stopped => break,
                        Ended::Idle => return,
                        Ended::Switched => {
                            // Releases are published on the new primary now: subscribe
                            // every key again there (each line checks once more then).
                            self.resend_all();
                            continue;
                        }
                        Ended::Unsupported => return self.unsupported(&lines),
                        Ended::Lost(failure) => (failure, true),
                        Ended::Unsharded => unreachable!("classic subscriptions"),
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
        let mut state = self.lock();
        state.conn = SubscriptionState::Off;
        state.keys.clear();
    }

    /// Subscribes new keys in batches, delivers notifications and drops keys whose lines
    /// stayed empty, until shutdown, no key is left, a change of primary, or a failure.
    async fn serve(
        &self,
        pubsub: redis::aio::PubSub,
        link: &RedisLink,
        lines: &Lines,
        stopping: &CancellationToken,
        switches: &mut Option<tokio::sync::watch::Receiver<u64>>,
    ) -> Ended {
        let (mut sink, mut messages) = pubsub.split();
        // Keys registered before the connection was open are sent at once.
        self.kick.notify_one();
        loop {
            let sweep_at = self.next_sweep(lines);
            tokio::select! {
                _ = stopping.cancelled() => return Ended::Stopped,
                _ = crate::notify::primary_switched(switches) => return Ended::Switched,
                _ = self.kick.notified() => {
                    // Lets the waiters whose busy replies arrived with this one register
                    // too, so a burst of new keys goes out in one SUBSCRIBE. Their waiters
                    // lose nothing: until it is confirmed they poll, then check once more.
                    tokio::time::sleep(BATCH_WINDOW).await;
                    if let Err(ended) = self.subscribe_pending(&mut sink, link, lines).await {
                        return ended;
                    }
                }
                message = messages.next() => match message {
                    Some(message) => {
                        self.received.fetch_add(1, Ordering::Relaxed);
                        if let Ok(hash) = std::str::from_utf8(message.get_payload_bytes()) {
                            lines.wake(hash);
                        }
                    }
                    None => return Ended::Lost(lost()),
                },
                _ = sleep_until_opt(sweep_at) => {
                    let idle = self.sweep(lines);
                    if !idle.is_empty() {
                        let channels: Vec<String> = idle.iter().map(|h| self.channel(h)).collect();
                        match tokio::time::timeout(link.command_timeout, sink.unsubscribe(&channels)).await {
                            Ok(Ok(())) => {}
                            Ok(Err(e)) => return Ended::Lost(RedisFailure::command(&e)),
                            Err(_) => return Ended::Lost(RedisFailure::command_timeout()),
                        }
                    }
                    // Decided under the state lock, as in `ensure()`: a key registered after
                    // this finds the connection Off and starts a new one.
                    let mut state = self.lock();
                    if state.keys.is_empty() {
                        state.conn = SubscriptionState::Off;
                        return Ended::Idle; // dropping the stream closes the connection
                    }
                }
            }
        }
    }

    /// Sends one SUBSCRIBE for every key registered and not yet sent, and wakes each of
    /// their lines once it is confirmed: a release just before it was not heard.
    async fn subscribe_pending(
        &self,
        sink: &mut redis::aio::PubSubSink,
        link: &RedisLink,
        lines: &Lines,
    ) -> Result<(), Ended> {
        let batch = self.take_pending(lines);
        if batch.is_empty() {
            return Ok(());
        }
        let channels: Vec<String> = batch.iter().map(|h| self.channel(h)).collect();
        match tokio::time::timeout(link.command_timeout, sink.subscribe(&channels)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) if crate::connection::refuses_subscribe(&e) => {
                return Err(Ended::Unsupported)
            }
            Ok(Err(e)) => return Err(Ended::Lost(RedisFailure::command(&e))),
            Err(_) => return Err(Ended::Lost(RedisFailure::command_timeout())),
        }
        self.confirmed(&batch, lines);
        Ok(())
    }

    /// The keys registered and not yet sent, now marked sent; those whose line is gone
    /// meanwhile are forgotten instead (a new waiter registers its key again).
    fn take_pending(&self, lines: &Lines) -> Vec<Arc<str>> {
        let mut state = self.lock();
        state.keys.retain(|hash, key| *key != KeyState::Pending || lines.contains(hash));
        let batch: Vec<Arc<str>> = state
            .keys
            .iter()
            .filter(|(_, k)| **k == KeyState::Pending)
            .map(|(h, _)| h.clone())
            .collect();
        for hash in &batch {
            state.keys.insert(hash.clone(), KeyState::Sent);
        }
        batch
    }

    /// The batch's subscriptions are confirmed: each key's first waiter checks once more.
    fn confirmed(&self, batch: &[Arc<str>], lines: &Lines) {
        self.subscriptions.fetch_add(1, Ordering::Relaxed);
        {
            let mut state = self.lock();
            for hash in batch {
                if let Some(key) = state.keys.get_mut(hash) {
                    if *key == KeyState::Sent {
                        *key = KeyState::Live { idle: None };
                    }
                }
            }
        }
        for hash in batch {
            lines.check_again(hash);
        }
    }

    /// [`serve`](Self::serve) on a Cluster with sharded pub/sub: each key is subscribed at
    /// the node that owns its slot (SSUBSCRIBE takes the channels of one slot only, so a
    /// batch is one SSUBSCRIBE per key, sent together). When a slot moves, its owner ends
    /// the subscription with a `sunsubscribe` push: the key is subscribed again at the new
    /// owner, and its waiter checks once more when that is confirmed. When a node's
    /// connection ends (a failover), every key is subscribed again.
    async fn serve_sharded(
        &self,
        conn: redis::cluster_async::ClusterConnection,
        mut pushes: crate::connection::ShardPushes,
        link: &RedisLink,
        lines: &Lines,
        stopping: &CancellationToken,
    ) -> Ended {
        // SSUBSCRIBEs that failed (a node down during a failover) are sent again, backing off,
        // on the same Cluster connection: it learns the new topology (decision 0063).
        let mut retry_at: Option<Instant> = None;
        let mut backoff = RETRY_FIRST;
        let mut failing = false;
        self.kick.notify_one();
        loop {
            let sweep_at = self.next_sweep(lines);
            let send = tokio::select! {
                _ = stopping.cancelled() => return Ended::Stopped,
                _ = self.kick.notified() => {
                    tokio::time::sleep(BATCH_WINDOW).await;
                    true
                }
                _ = sleep_until_opt(retry_at) => {
                    retry_at = None;
                    true
                }
                push = pushes.recv() => match push {
                    None => return Ended::Lost(lost()),
                    Some(push) => {
                        self.shard_push(push, lines);
                        false
                    }
                },
                _ = sleep_until_opt(sweep_at) => {
                    let idle = self.sweep(lines);
                    let sent = idle.iter().map(|hash| {
                        shard_command(&conn, link, "SUNSUBSCRIBE", self.channel(hash))
                    });
                    // A failed SUNSUBSCRIBE leaves a subscription nobody listens to on a node
                    // that is likely gone; the connection stays useful for the other keys.
                    futures::future::join_all(sent).await;
                    let mut state = self.lock();
                    if state.keys.is_empty() {
                        state.conn = SubscriptionState::Off;
                        return Ended::Idle;
                    }
                    false
                }
            };
            if !send {
                continue;
            }
            let batch = self.take_pending(lines);
            if batch.is_empty() {
                continue;
            }
            let sent = batch
                .iter()
                .map(|hash| shard_command(&conn, link, "SSUBSCRIBE", self.channel(hash)));
            let results = futures::future::join_all(sent).await;
            let (mut done, mut failed, mut failure) = (Vec::new(), Vec::new(), None);
            for (hash, result) in batch.into_iter().zip(results) {
                match result {
                    Ok(()) => done.push(hash),
                    Err(e) if crate::connection::refuses_subscribe(&e) => return Ended::Unsharded,
                    Err(e) => {
                        failure.get_or_insert_with(|| RedisFailure::command(&e));
                        failed.push(hash);
                    }
                }
            }
            if !done.is_empty() {
                self.confirmed(&done, lines);
            }
            let Some(failure) = failure else {
                failing = false;
                backoff = RETRY_FIRST;
                continue;
            };
            {
                let mut state = self.lock();
                for hash in &failed {
                    if let Some(key) = state.keys.get_mut(hash) {
                        *key = KeyState::Pending;
                    }
                }
            }
            if !failing {
                failing = true;
                events::notify_failed(self.driver_id, &failure);
            }
            // Their waiters are not woken: the node that failed the SSUBSCRIBE is likely the
            // one their attempt would go to. Their next sleep is pollIntervalMs (not live).
            retry_at = Some(Instant::now() + backoff);
            backoff = (backoff * 2).min(RETRY_MAX);
        }
    }

    /// One push of the sharded connection.
    fn shard_push(&self, push: redis::PushInfo, lines: &Lines) {
        use redis::PushKind;
        let text = |i: usize| match push.data.get(i) {
            Some(redis::Value::BulkString(b)) => std::str::from_utf8(b).ok(),
            _ => None,
        };
        match push.kind {
            PushKind::SMessage => {
                self.received.fetch_add(1, Ordering::Relaxed);
                if let Some(hash) = text(1) {
                    lines.wake(hash);
                }
            }
            // Ours after a grace period (the key is gone from the map then), or the
            // server's at a slot move: subscribe again, at the new owner.
            PushKind::SUnsubscribe => {
                let Some(hash) = text(0).and_then(|c| self.hash_of(c)) else { return };
                let mut state = self.lock();
                if let Some(key @ KeyState::Live { .. }) = state.keys.get_mut(hash) {
                    *key = KeyState::Pending;
                    drop(state);
                    self.kick.notify_one();
                }
            }
            // A node's connection ended: its keys' subscriptions with it. Which keys those
            // were is not said, so every key is subscribed again (SSUBSCRIBE twice is
            // harmless).
            PushKind::Disconnection => {
                let mut state = self.lock();
                for key in state.keys.values_mut() {
                    if matches!(key, KeyState::Live { .. }) {
                        *key = KeyState::Pending;
                    }
                }
                drop(state);
                self.kick.notify_one();
            }
            _ => {}
        }
    }

    /// When the next subscribed key may have been idle for the whole grace period (a key
    /// with waiters is looked at again a grace period later).
    fn next_sweep(&self, lines: &Lines) -> Option<Instant> {
        let now = Instant::now();
        let mut state = self.lock();
        let mut next: Option<Instant> = None;
        for (hash, key) in state.keys.iter_mut() {
            if let KeyState::Live { idle } = key {
                let at = if lines.contains(hash) {
                    *idle = None;
                    // Its line may empty at any moment; look again a grace period later.
                    now + GRACE
                } else {
                    *idle.get_or_insert(now) + GRACE
                };
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        // Without a subscribed key, still once per grace period: the connection closes
        // when no key is left.
        Some(next.unwrap_or(now + GRACE))
    }

    /// Forgets the keys whose lines have been empty for the grace period; returns them.
    fn sweep(&self, lines: &Lines) -> Vec<Arc<str>> {
        let now = Instant::now();
        let mut state = self.lock();
        let mut idle = Vec::new();
        state.keys.retain(|hash, key| {
            let KeyState::Live { idle: since } = key else { return true };
            if lines.contains(hash) {
                *since = None;
                return true;
            }
            let since = *since.get_or_insert(now);
            if now.duration_since(since) >= GRACE {
                idle.push(hash.clone());
                return false;
            }
            true
        });
        idle
    }

    /// After a change of primary: every key is subscribed again on the new connection.
    fn resend_all(&self) {
        let mut state = self.lock();
        for key in state.keys.values_mut() {
            *key = KeyState::Pending;
        }
        state.conn = SubscriptionState::Starting;
    }

    /// See `Notifier::resubscribe_at_switch` (decision 0046): with Sentinel, subscribe again
    /// as soon as a new primary is named rather than 5 s after the failure.
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
            _ = crate::notify::primary_switched(switches) => true,
            _ = tokio::time::sleep_until((at + RESUBSCRIBE_AFTER_FAILURE).into()) => false,
        };
        let mut state = self.lock();
        if !switched || state.conn != SubscriptionState::Failed(at) {
            return false;
        }
        if lines.idle_since().is_some() {
            state.conn = SubscriptionState::Off;
            return false;
        }
        state.conn = SubscriptionState::Starting;
        true
    }

    /// The server refuses SUBSCRIBE itself: poll for good, said once.
    fn unsupported(&self, lines: &Lines) {
        let mut state = self.lock();
        state.keys.clear();
        lines.wake_all();
        if state.conn != SubscriptionState::Unsupported {
            events::notify_unsupported(self.driver_id);
        }
        state.conn = SubscriptionState::Unsupported;
    }

    /// As `Notifier::failed`: poll, and subscribe again when waiters come back after 5 s.
    /// Every key is forgotten; a waiter registers its key again at its next busy reply.
    fn failed(
        &self,
        (failure, from_node): (RedisFailure, bool),
        link: &RedisLink,
        lines: &Lines,
    ) -> Instant {
        if from_node && failure.server_code.is_none() {
            link.forget_current();
        }
        let mut state = self.lock();
        state.keys.clear();
        lines.wake_all();
        events::notify_failed(self.driver_id, &failure);
        let at = Instant::now();
        state.conn = SubscriptionState::Failed(at);
        at
    }
}

enum Ended {
    Stopped,
    Idle,
    Switched,
    Unsupported,
    /// SSUBSCRIBE is unknown or refused: classic pub/sub instead (decision 0064).
    Unsharded,
    Lost(RedisFailure),
}

/// SSUBSCRIBE or SUNSUBSCRIBE of one channel within commandTimeoutMs. A MOVED (the slot
/// moved, redis-rs's map is behind) surely did nothing and is sent again after a pause,
/// as scripts are (connection.rs).
async fn shard_command(
    conn: &redis::cluster_async::ClusterConnection,
    link: &RedisLink,
    name: &'static str,
    channel: String,
) -> redis::RedisResult<()> {
    let mut result = Ok(());
    for pause_ms in [0, 10, 50, 200] {
        tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        let mut conn = conn.clone();
        let sent = async {
            match name {
                "SSUBSCRIBE" => conn.ssubscribe(&channel).await,
                _ => conn.sunsubscribe(&channel).await,
            }
        };
        result = match tokio::time::timeout(link.command_timeout, sent).await {
            Ok(result) => result,
            Err(_) => Err(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the subscription command timed out",
            ))),
        };
        if !matches!(&result, Err(e) if e.code() == Some("MOVED")) {
            break;
        }
    }
    result
}

fn lost() -> RedisFailure {
    RedisFailure::new(
        RedisErrorCode::ConnectionLost,
        Outcome::Unknown,
        "the release-notification connection was closed",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_channel_carries_the_lock_keys_hash_tag() {
        let subs = KeySubscriptions::new(1, "svc", true, false);
        let names = crate::keys::KeyNames::new("svc", "job:1");
        let channel = subs.channel(&names.hash);
        assert_eq!(channel, format!("svc:lock-released:{{{}}}", names.hash));
        // The same {…} as the lock key: one Cluster slot.
        let tag = |s: &str| s[s.find('{').unwrap()..].to_owned();
        assert_eq!(tag(&channel), tag(&names.lock));
    }
}
