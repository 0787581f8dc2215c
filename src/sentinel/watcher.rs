//! One subscription to `+switch-master` on a Sentinel, kept while the link is open.
//!
//! After `SENTINEL FAILOVER` the old primary keeps accepting writes until Sentinel converts
//! it, seconds later; the announcement is the earliest moment a client can stop writing
//! there. When the watched Sentinel goes away the next one in the list is watched, and the
//! primary is asked again, since a switch announced in between was not heard.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;

use super::{address, pause, Sentinel};

const CHANNEL: &str = "+switch-master";
/// The longest pause after every Sentinel refused or failed to take the subscription.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// A subscription held at least this long was a working one: the backoff starts over.
const HELD_LONG_ENOUGH: Duration = Duration::from_secs(1);

pub(super) async fn run(sentinel: Arc<Sentinel>) {
    let count = sentinel.sentinels.len();
    let mut index = 0;
    let mut failed_in_a_row = 0;
    let mut backoff = Duration::from_millis(100);
    while !sentinel.stop.is_cancelled() {
        match subscribe(&sentinel, index).await {
            Some(messages) => {
                let began = Instant::now();
                follow(&sentinel, messages).await;
                // A subscription that ended at once (a Sentinel that takes it and drops it)
                // counts as a failure: otherwise it would be asked again in a tight loop.
                if began.elapsed() >= HELD_LONG_ENOUGH {
                    failed_in_a_row = 0;
                    backoff = Duration::from_millis(100);
                } else {
                    failed_in_a_row += 1;
                }
            }
            None => failed_in_a_row += 1,
        }
        index = (index + 1) % count;
        if failed_in_a_row >= count {
            failed_in_a_row = 0;
            if !pause(&sentinel.stop, backoff).await {
                return;
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}

async fn subscribe(sentinel: &Sentinel, index: usize) -> Option<redis::aio::PubSubStream> {
    let connect = async {
        let mut pubsub = sentinel.sentinels[index].get_async_pubsub().await?;
        pubsub.subscribe(CHANNEL).await?;
        Ok::<_, redis::RedisError>(pubsub.into_on_message())
    };
    tokio::select! {
        _ = sentinel.stop.cancelled() => None,
        subscribed = tokio::time::timeout(sentinel.connect_timeout + sentinel.command_timeout, connect) => subscribed.ok()?.ok(),
    }
}

/// Reads announcements until the connection ends or the link closes.
async fn follow(sentinel: &Sentinel, mut messages: redis::aio::PubSubStream) {
    // Whatever was announced before this subscription took went unheard.
    let asked = tokio::select! {
        _ = sentinel.stop.cancelled() => return,
        asked = sentinel.primary_address() => asked,
    };
    if let Ok(now_at) = asked {
        sentinel.switched_to(&now_at);
    }
    loop {
        let message = tokio::select! {
            _ = sentinel.stop.cancelled() => return,
            message = messages.next() => message,
        };
        let Some(message) = message else { return };
        let Ok(payload) = std::str::from_utf8(message.get_payload_bytes()) else { continue };
        if let Some(now_at) = announced(payload, &sentinel.url.master_name) {
            sentinel.switched_to(&now_at);
        }
    }
}

/// The new primary's address in `<name> <old-ip> <old-port> <new-ip> <new-port>`, when
/// the announcement is about our master name.
fn announced(payload: &str, master_name: &str) -> Option<String> {
    let words: Vec<&str> = payload.split_ascii_whitespace().collect();
    match words.as_slice() {
        [name, _, _, host, port] if *name == master_name => Some(address(host, port)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_master_name_counts() {
        assert_eq!(announced("m 127.0.0.1 1 127.0.0.1 2", "m").as_deref(), Some("127.0.0.1:2"));
        assert_eq!(announced("other 127.0.0.1 1 127.0.0.1 2", "m"), None);
        assert_eq!(announced("m ::1 1 ::1 2", "m").as_deref(), Some("[::1]:2"));
        assert_eq!(announced("m garbage", "m"), None);
    }
}
