//! The one task that owns a backend's subscription connection, for every mode: it opens the
//! connection when a waiter first needs it, subscribes the channels registered, delivers
//! notifications, lets channels go a grace period after their last waiter, and closes the
//! connection when none is left. Failures, changes of primary, a refused SUBSCRIBE and
//! shutdown are handled here once (decisions 0007, 0046, 0061, 0063, 0110, 0160).
//!
//! Every await watches for shutdown: `shutdown()` waits for this task.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::modes::{lost, unanswered, Carrier, Event, Judged, Subscribed};
use super::tracker::{Verdict, Via};
use super::RESUBSCRIBE_AFTER_FAILURE;
use super::{primary_switched, sleep_until_opt, Shared, SubscriptionState};
use crate::backoff::Backoff;
use crate::connection::{Answer, Quiet, RedisLink, SubscribeFailure};
use crate::error::RedisFailure;
use crate::events;
use crate::waiters::Lines;

/// How long the first new key waits for others before their SUBSCRIBE is sent (decision
/// 0061): about one timer tick. Notifications are delivered meanwhile.
const BATCH_WINDOW: Duration = Duration::from_millis(2);

/// The most channels in one SUBSCRIBE; more go in the next, at once.
const MAX_BATCH: usize = 1024;

/// The first and the longest pause before SSUBSCRIBEs that failed are sent again.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);

/// Events handled in one turn of the loop at most, before timers are looked at again.
const DRAIN: usize = 64;

/// Why [`serve`] stopped.
enum Ended {
    Stopped,
    /// No channel is left; the state is Off.
    Idle,
    /// Sentinel moved the primary: releases are published there now.
    Switched,
    Unsupported,
    Lost(RedisFailure),
}

type Switches = Option<watch::Receiver<u64>>;

pub(super) async fn run(
    shared: Arc<Shared>,
    link: Arc<RedisLink>,
    lines: Arc<Lines>,
    stopping: CancellationToken,
) {
    // Taken before the first subscribe, so a change of primary while it fails is seen.
    let mut switches = link.primary_switches();
    loop {
        let opened = tokio::select! {
            _ = stopping.cancelled() => break,
            opened = Carrier::open(&link, shared.mode.sharded()) => opened,
        };
        let failure = match opened {
            Ok(carrier) => {
                {
                    let mut state = shared.lock();
                    state.conn = SubscriptionState::Live;
                    state.channels.new_connection();
                }
                match serve(&shared, carrier, &link, &lines, &stopping, &mut switches).await {
                    Ended::Stopped => break,
                    Ended::Idle => return,
                    Ended::Switched => {
                        restart(&shared);
                        continue;
                    }
                    Ended::Unsupported => return unsupported(&shared, &lines),
                    Ended::Lost(failure) => failure,
                }
            }
            Err(SubscribeFailure::Unsupported(_)) => return unsupported(&shared, &lines),
            Err(SubscribeFailure::Failed(failure) | SubscribeFailure::NoPrimary(failure)) => {
                failure
            }
        };
        let at = failed(&shared, failure);
        if !resubscribe_at_switch(&shared, &link, at, &lines, &stopping, &mut switches).await {
            return;
        }
    }
    // Dropping the connection closed it.
    let mut state = shared.lock();
    state.conn = SubscriptionState::Off;
    state.channels.clear();
}

/// Subscribes the channels registered, in batches; delivers notifications; lets go of the
/// channels no longer used; until shutdown, no channel is left, a change of primary, or the
/// loss of the connection.
async fn serve(
    shared: &Shared,
    mut carrier: Carrier,
    link: &RedisLink,
    lines: &Lines,
    stopping: &CancellationToken,
    switches: &mut Switches,
) -> Ended {
    // Channels registered before the connection was open go out with those registered
    // within the batch window.
    let mut send_at = Some(Instant::now() + BATCH_WINDOW);
    let mut retry = Retry::default();
    // A sharded connection's messages come from several nodes: one node's say nothing of
    // another's flow, so it is asked every interval (decision 0172).
    let mut quiet = if carrier.is_sharded() {
        Quiet::per_interval(&link.liveness)
    } else {
        Quiet::new(&link.liveness)
    };
    loop {
        let (due, rejudge) = {
            let state = shared.lock();
            (state.channels.next_due(), state.channels.next_rejudge())
        };
        let send = send_at.into_iter().chain(retry.at).min();
        tokio::select! {
            _ = stopping.cancelled() => return Ended::Stopped,
            _ = primary_switched(switches) => return Ended::Switched,
            event = carrier.next() => {
                quiet.heard();
                if let Some(ended) = handle(shared, event, lines, &mut send_at) {
                    return ended;
                }
                // A burst of messages is delivered without a look at the timers for each.
                for _ in 1..DRAIN {
                    let Some(event) = carrier.next().now_or_never() else { break };
                    if let Some(ended) = handle(shared, event, lines, &mut send_at) {
                        return ended;
                    }
                }
            }
            _ = shared.kick.notified() => {
                // Lets the waiters whose busy replies arrived with this one register too, so
                // a burst of new keys goes out in one SUBSCRIBE. Their waiters lose nothing:
                // until it is confirmed they poll, then check once more.
                send_at.get_or_insert_with(|| Instant::now() + BATCH_WINDOW);
            }
            _ = sleep_until_opt(send) => {
                send_at = None;
                retry.at = None;
                let sent = tokio::select! {
                    _ = stopping.cancelled() => return Ended::Stopped,
                    sent = send_batch(shared, &mut carrier, link, lines, &mut retry) => sent,
                };
                quiet.heard();
                match sent {
                    Err(ended) => return ended,
                    Ok(more) if more => send_at = Some(Instant::now()),
                    Ok(_) => {}
                }
            }
            _ = sleep_until_opt(due) => {
                let idle = {
                    let mut state = shared.lock();
                    let idle =
                        state.channels.sweep(Instant::now(), |key| shared.mode.usage(lines, key));
                    // Decided under the state lock: a waiter registers its key under it
                    // before it sleeps, so either it is seen here and the connection stays,
                    // or it finds the connection Off and starts a new one.
                    if state.channels.is_empty() {
                        state.conn = SubscriptionState::Off;
                        return Ended::Idle; // dropping the connection closes it
                    }
                    idle
                };
                if !idle.is_empty() {
                    let channels: Vec<_> =
                        idle.iter().map(|(k, held)| (shared.mode.channel(k), *held)).collect();
                    tokio::select! {
                        _ = stopping.cancelled() => return Ended::Stopped,
                        _ = carrier.unsubscribe(&channels, link) => quiet.heard(),
                    }
                }
            }
            // Nothing came or went for pingIntervalMs: a flow dropped without a word would
            // look just like this, so ask (decision 0172).
            _ = quiet.due() => {
                let answer = tokio::select! {
                    _ = stopping.cancelled() => return Ended::Stopped,
                    answer = carrier.ping(link) => answer,
                };
                if answer == Answer::Dead {
                    link.liveness.died();
                    return Ended::Lost(unanswered());
                }
                quiet.answered();
            }
            // A classic or deaf key's slot may have moved to a node that judges it otherwise.
            _ = sleep_until_opt(rejudge) => {
                if shared.lock().channels.rejudge_due(Instant::now()) {
                    send_at.get_or_insert_with(Instant::now);
                }
            }
            _ = lines.changed(), if shared.mode.follows_idle() => {
                let mut state = shared.lock();
                if let Some(key) = shared.mode.namespace_key() {
                    state.channels.look_again(key, Instant::now());
                }
            }
        }
    }
}

/// One event of the connection.
fn handle(
    shared: &Shared,
    event: Event,
    lines: &Lines,
    send_at: &mut Option<Instant>,
) -> Option<Ended> {
    match event {
        Event::Message(message) => {
            shared.received.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if let Some(hash) = message.hash() {
                lines.wake(hash);
            }
        }
        // Ours a grace period after the last waiter (the key is forgotten then), or the
        // server's at a slot move: a key still held is judged again, at the new owner.
        Event::Unsubscribed(channel) => {
            if let Some(key) = shared.mode.key_of_channel(&channel) {
                shared.lock().channels.ended(key);
                send_at.get_or_insert_with(|| Instant::now() + BATCH_WINDOW);
            }
        }
        // Which keys were on the node is not said: every key is subscribed again
        // (subscribing twice is harmless).
        Event::NodeLost => {
            shared.lock().channels.resend_all();
            send_at.get_or_insert_with(|| Instant::now() + BATCH_WINDOW);
        }
        Event::Closed => return Some(Ended::Lost(lost())),
    }
    None
}

/// Failed SSUBSCRIBEs are sent again, backing off, while their keys still have waiters.
struct Retry {
    at: Option<Instant>,
    pause: Backoff,
    /// The failure of this run was said.
    said: bool,
}

impl Default for Retry {
    fn default() -> Self {
        Self { at: None, pause: Backoff::new(RETRY_FIRST, RETRY_MAX), said: false }
    }
}

/// Sends one batch of the channels registered and not yet sent, and has the first waiter
/// of each line they serve check once more when it is confirmed. True when more wait.
async fn send_batch(
    shared: &Shared,
    carrier: &mut Carrier,
    link: &RedisLink,
    lines: &Lines,
    retry: &mut Retry,
) -> Result<bool, Ended> {
    let batch = {
        let mut state = shared.lock();
        let batch = state
            .channels
            .take_batch(MAX_BATCH, Instant::now(), |key| shared.mode.in_use(lines, key));
        if state.channels.is_empty() {
            state.conn = SubscriptionState::Off;
            return Err(Ended::Idle);
        }
        batch
    };
    if batch.is_empty() {
        return Ok(false);
    }
    let channels: Vec<_> = batch.iter().map(|(k, held)| (shared.mode.channel(k), *held)).collect();
    let judged = match carrier.subscribe(&channels, link).await {
        Subscribed::Each(judged) => judged,
        Subscribed::Refused => return Err(Ended::Unsupported),
        Subscribed::Lost(failure) => return Err(Ended::Lost(failure)),
    };
    let now = Instant::now();
    let mut failure = None;
    let (wake, newly_heard, more) = {
        let mut state = shared.lock();
        let mut wake = Vec::new();
        let mut newly_heard = false;
        for ((key, _), Judged { verdict, held }) in batch.into_iter().zip(judged) {
            let verdict = match verdict {
                Ok(verdict) => Some(verdict),
                Err(e) => {
                    failure.get_or_insert(e);
                    None
                }
            };
            let was_live = state.channels.is_live(&key);
            if state.channels.judged(&key, verdict, held, now) {
                newly_heard |= !was_live;
                wake.push(key);
            }
            match verdict {
                Some(Verdict::Live(Via::Classic)) if carrier.is_sharded() => {
                    said_once(&shared.said_unsharded, || events::notify_unsharded(shared.driver_id))
                }
                Some(Verdict::Deaf) => {
                    said_once(&shared.said_deaf, || events::notify_unsupported(shared.driver_id))
                }
                _ => {}
            }
        }
        (wake, newly_heard, state.channels.has_pending())
    };
    if newly_heard {
        shared.subscriptions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    if !wake.is_empty() {
        // A release before the confirmation was not heard; a key no longer heard has its
        // waiter asleep for notifyPollIntervalMs: either way its first waiter checks now.
        shared.mode.confirmed(&wake, lines);
    }
    let Some(failure) = failure else {
        *retry = Retry::default();
        return Ok(more);
    };
    if !retry.said {
        retry.said = true;
        events::notify_failed(shared.driver_id, &failure);
    }
    // Their waiters are not woken: the node that failed the SSUBSCRIBE is likely the one
    // their attempt would go to. Their next sleep is pollIntervalMs (not live).
    retry.at = Some(now + retry.pause.next());
    // What is still pending goes out with the retry.
    Ok(false)
}

/// Runs `say` the first time only (an event said once per backend).
fn said_once(flag: &std::sync::atomic::AtomicBool, say: impl FnOnce()) {
    if !flag.swap(true, std::sync::atomic::Ordering::AcqRel) {
        say();
    }
}

/// A change of primary or of pub/sub kind: every channel is subscribed again on the next
/// connection, and none is live meanwhile.
fn restart(shared: &Shared) {
    let mut state = shared.lock();
    state.conn = SubscriptionState::Starting;
    state.channels.resend_all();
}

/// The server refuses SUBSCRIBE itself: poll for good, said once.
fn unsupported(shared: &Shared, lines: &Lines) {
    let mut state = shared.lock();
    state.channels.clear();
    // Waiters asleep for notifyPollIntervalMs must move to the faster pollIntervalMs.
    lines.wake_all();
    if state.conn != SubscriptionState::Unsupported {
        events::notify_unsupported(shared.driver_id);
    }
    state.conn = SubscriptionState::Unsupported;
}

/// The subscription failed or was lost, or its connection was refused (maxclients, AUTH):
/// waiters poll, and subscribe again when they come back after 5 s (their channels are kept
/// and go out again then, if still used). Command connections are left alone: a closed
/// command connection learns it by itself (RESP3 push, decision 0013), and a subscription's
/// failure says nothing about a healthy one (decision 0111).
fn failed(shared: &Shared, failure: RedisFailure) -> Instant {
    let mut state = shared.lock();
    state.channels.connection_lost();
    events::notify_failed(shared.driver_id, &failure);
    let at = Instant::now();
    state.conn = SubscriptionState::Failed(at);
    at
}

/// After a failure at `at`: waiters are woken to poll at pollIntervalMs, once the command
/// connection has been asked whether it survived the same cause (decision 0111).
/// Then, with Sentinel, the likeliest cause is a primary that went away, and Sentinel soon
/// names a new one: subscribing there as soon as it does, rather than 5 s after the
/// failure, keeps waiters from polling through the whole failover (decision 0046). True to
/// subscribe again now; false when the 5 s rule applies (no Sentinel, no switch in time,
/// shutdown, or `ensure()` already started another subscription).
async fn resubscribe_at_switch(
    shared: &Shared,
    link: &RedisLink,
    at: Instant,
    lines: &Lines,
    stopping: &CancellationToken,
    switches: &mut Switches,
) -> bool {
    // The command connection is asked first (a Cluster's: given a moment), so that their
    // next attempt does not race a command connection closed by the same cause.
    let checked = async {
        if !link.probe().await {
            tokio::time::sleep(WAKE_AFTER_FAILURE).await;
        }
    };
    tokio::select! {
        _ = stopping.cancelled() => return false,
        _ = checked => lines.wake_all(),
    }
    if switches.is_none() {
        return false;
    }
    let switched = tokio::select! {
        _ = stopping.cancelled() => false,
        _ = primary_switched(switches) => true,
        _ = tokio::time::sleep_until((at + RESUBSCRIBE_AFTER_FAILURE).into()) => false,
    };
    let mut state = shared.lock();
    if !switched || state.conn != SubscriptionState::Failed(at) {
        return false;
    }
    if lines.idle_since().is_some() {
        // Nobody waits: the next waiter subscribes at once, on the new primary.
        state.conn = SubscriptionState::Off;
        return false;
    }
    state.conn = SubscriptionState::Starting;
    true
}

/// How long after a failure the waiters of a Cluster are woken (decision 0111): a command
/// connection closed by the same cause usually sees its own end within this. A single
/// node's connection is asked instead ([`RedisLink::probe`]): on a busy machine 50 ms was
/// not always enough (a waiter's attempt then ended OUTCOME_UNKNOWN, issue 21's soak).
const WAKE_AFTER_FAILURE: Duration = Duration::from_millis(50);
