//! A subscription to `+switch-master` on every Sentinel, each kept while the link is open.
//!
//! After `SENTINEL FAILOVER` the old primary keeps accepting writes until Sentinel converts
//! it, seconds later; the first announcement is the earliest moment a client can stop
//! writing there. The Sentinel that led the failover announces last (when it has re-pointed
//! the replicas), the others as soon as its hello messages reach them, about a second
//! earlier: so every Sentinel is listened to, and whichever announces first is followed
//! (decision 0050). Each Sentinel has its own subscription and backoff; after every
//! (re)subscription the primary is asked again, since a switch announced while that
//! subscription was down may have gone unheard. The same subscription also hears the
//! leader begin a failover (and abort it), which holds the old primary (decision 0051).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;

use super::{address, pause, Sentinel};
use crate::backoff::Backoff;
use crate::connection::{Answer, Quiet};
use crate::events;

const CHANNEL: &str = "+switch-master";
/// The leading Sentinel's word that it is promoting a replica, and that it gave up (decision
/// 0051). Subscribed apart: a Sentinel user without them (README's older ACL line) still
/// gets `+switch-master`.
const FAILOVER_BEGINS: &str = "+failover-state-send-slaveof-noone";
const FAILOVER_ABORTED: &str = "-failover-abort-slave-timeout";
/// The first pause after a Sentinel refused or failed to take the subscription.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest pause between subscriptions to one Sentinel that keeps failing.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// A subscription held at least this long was a working one: the backoff starts over.
const HELD_LONG_ENOUGH: Duration = Duration::from_secs(1);

/// Keeps a subscription on the Sentinel at `index` until the link closes.
pub(super) async fn run(sentinel: Arc<Sentinel>, index: usize) {
    let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
    while !sentinel.stop.is_cancelled() {
        if let Some((sink, messages)) = subscribe(&sentinel, index).await {
            let began = Instant::now();
            follow(&sentinel, sink, messages).await;
            // A subscription that ended at once (a Sentinel that takes it and drops it)
            // counts as a failure: otherwise it would be asked again in a tight loop.
            if began.elapsed() >= HELD_LONG_ENOUGH {
                backoff.reset();
                continue;
            }
        }
        if !pause(&sentinel.stop, backoff.next()).await {
            return;
        }
    }
}

async fn subscribe(
    sentinel: &Sentinel,
    index: usize,
) -> Option<(redis::aio::PubSubSink, redis::aio::PubSubStream)> {
    let connect = async {
        let mut pubsub = sentinel.sentinels[index].get_async_pubsub().await?;
        pubsub.subscribe(CHANNEL).await?;
        if let Err(err) = pubsub.subscribe(&[FAILOVER_BEGINS, FAILOVER_ABORTED]).await {
            // Anything but a refusal (a timeout, a lost connection) is a failed
            // subscription like any other, taken again after the backoff: the hold is not
            // given up for it.
            if !refused(&err) {
                return Err(err);
            }
            if first_refusal(&sentinel.hold_refusal_logged) {
                events::failover_hold_unavailable(sentinel.driver_id);
            }
        }
        Ok::<_, redis::RedisError>(pubsub.split())
    };
    tokio::select! {
        _ = sentinel.stop.cancelled() => None,
        subscribed = tokio::time::timeout(sentinel.connect_timeout + sentinel.command_timeout, connect) => subscribed.ok()?.ok(),
    }
}

/// Reads announcements until the connection ends, does not answer a liveness PING within
/// commandTimeoutMs (a flow dropped without a word: subscribed again, decision 0172), or the
/// link closes.
async fn follow(
    sentinel: &Sentinel,
    mut sink: redis::aio::PubSubSink,
    mut messages: redis::aio::PubSubStream,
) {
    // Whatever was announced before this subscription took went unheard.
    if !ask(sentinel).await {
        return;
    }
    let mut quiet = Quiet::new(&sentinel.liveness);
    loop {
        let message = tokio::select! {
            _ = sentinel.stop.cancelled() => return,
            message = messages.next() => message,
            _ = quiet.due() => {
                let ping = sink.ping::<redis::Value>();
                let answer = tokio::select! {
                    _ = sentinel.stop.cancelled() => return,
                    answer = Answer::of(sentinel.liveness.timeout, ping, true) => answer,
                };
                if answer == Answer::Dead {
                    sentinel.liveness.died();
                    return;
                }
                quiet.heard();
                continue;
            }
        };
        quiet.heard();
        let Some(message) = message else { return };
        let Ok(payload) = std::str::from_utf8(message.get_payload_bytes()) else { continue };
        match message.get_channel_name() {
            FAILOVER_BEGINS => {
                if let Some(primary) = failing_over(payload, &sentinel.url.master_name) {
                    sentinel.failover_begins(&primary);
                }
                continue;
            }
            FAILOVER_ABORTED => {
                if let Some(primary) = failing_over(payload, &sentinel.url.master_name) {
                    sentinel.failover_aborted(&primary);
                }
                continue;
            }
            _ => {}
        }
        let Some((from, to)) = announced(payload, &sentinel.url.master_name) else { continue };
        // Another Sentinel announced this switch first (nothing to do), or this one speaks
        // of a primary this driver did not know: either its news is older than a switch
        // already followed, or a switch went unheard. The Sentinels settle which.
        if !sentinel.switched_from(&from, &to) && !ask(sentinel).await {
            return;
        }
    }
}

/// Asks the Sentinels for the primary and follows the answer; false when the link closed.
async fn ask(sentinel: &Sentinel) -> bool {
    let asked = tokio::select! {
        _ = sentinel.stop.cancelled() => return false,
        asked = sentinel.primary_address() => asked,
    };
    if let Ok(now_at) = asked {
        sentinel.switched_to(&now_at);
    }
    true
}

/// Whether the server itself refused the subscription (the Sentinel user's ACL): that is
/// for good. A timeout or an I/O error says nothing about the ACL.
fn refused(err: &redis::RedisError) -> bool {
    err.code().is_some()
}

/// True the first time a driver's watchers meet a refusal.
fn first_refusal(logged: &AtomicBool) -> bool {
    !logged.swap(true, Ordering::Relaxed)
}

/// The old and the new primary's addresses in `<name> <old-ip> <old-port> <new-ip>
/// <new-port>`, when the announcement is about our master name.
fn announced(payload: &str, master_name: &str) -> Option<(String, String)> {
    let words: Vec<&str> = payload.split_ascii_whitespace().collect();
    match words.as_slice() {
        [name, old_host, old_port, host, port] if *name == master_name => {
            Some((address(old_host, old_port), address(host, port)))
        }
        _ => None,
    }
}

/// The primary's address in a failover event about our master name: `slave <name> <ip>
/// <port> @ <master-name> <ip> <port>` for a replica, `master <name> <ip> <port>` for the
/// primary itself (Redis's `sentinelEvent` with `%@`).
fn failing_over(payload: &str, master_name: &str) -> Option<String> {
    let words: Vec<&str> = payload.split_ascii_whitespace().collect();
    match words.as_slice() {
        [_, _, _, _, "@", name, host, port, ..] | ["master", name, host, port, ..]
            if *name == master_name =>
        {
            Some(address(host, port))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_master_name_counts() {
        let pair = |from: &str, to: &str| Some((from.to_owned(), to.to_owned()));
        assert_eq!(announced("m 127.0.0.1 1 127.0.0.1 2", "m"), pair("127.0.0.1:1", "127.0.0.1:2"));
        assert_eq!(announced("other 127.0.0.1 1 127.0.0.1 2", "m"), None);
        assert_eq!(announced("m ::1 1 ::1 2", "m"), pair("[::1]:1", "[::1]:2"));
        assert_eq!(announced("m garbage", "m"), None);
    }

    #[test]
    fn only_a_refusal_of_the_failover_state_channels_is_logged_and_only_once() {
        let timeout = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(!refused(&timeout), "a timeout is not a refusal");
        let lost = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert!(!refused(&lost), "a lost connection is not a refusal");
        let noperm = redis::parse_redis_value(b"-NOPERM no permissions to access a channel\r\n")
            .unwrap()
            .extract_error()
            .unwrap_err();
        assert!(refused(&noperm));
        let logged = AtomicBool::new(false);
        assert!(first_refusal(&logged));
        assert!(!first_refusal(&logged), "once per driver");
    }

    #[test]
    fn a_failover_event_names_the_primary_it_leaves() {
        let event = "slave 127.0.0.1:7 127.0.0.1 7 @ m 127.0.0.1 1";
        assert_eq!(failing_over(event, "m").as_deref(), Some("127.0.0.1:1"));
        assert_eq!(failing_over("master m 127.0.0.1 1", "m").as_deref(), Some("127.0.0.1:1"));
        assert_eq!(failing_over("master m 127.0.0.1 1 12", "m").as_deref(), Some("127.0.0.1:1"));
        assert_eq!(failing_over("slave 127.0.0.1:7 127.0.0.1 7 @ other 127.0.0.1 1", "m"), None);
        assert_eq!(failing_over("master other 127.0.0.1 1", "m"), None);
    }
}
