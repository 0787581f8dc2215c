//! What differs between the modes, and nothing else: which channels a subscription holds
//! ([`Mode`]: the namespace channel, or a channel per key) and which connection carries
//! them ([`Carrier`]: one classic pub/sub connection, or a Cluster connection that sends
//! each SSUBSCRIBE to the slot's owner, decision 0063).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use super::tracker::Usage;
use crate::connection::{refuses_subscribe, RedisLink, ShardPushes, SubscribeFailure};
use crate::error::{Outcome, RedisErrorCode, RedisFailure};
use crate::keys::KeyChannels;
use crate::waiters::Lines;

/// Which channels are held, and what "used" means for one.
pub(super) enum Mode {
    /// `<namespace>:lock-released`, held while any waiter of the backend waits; tracked
    /// under its own name.
    Namespace { channel: Arc<str> },
    /// `<namespace>:lock-released:{<hash>}` per key, held while the key has a wait line;
    /// tracked under the key's hash. `sharded`: a Cluster (SSUBSCRIBE, decision 0063).
    PerKey { channels: KeyChannels, sharded: bool },
}

impl Mode {
    pub(super) fn namespace(channel: String) -> Self {
        Self::Namespace { channel: channel.into() }
    }

    pub(super) fn per_key(namespace: &str, cluster: bool) -> Self {
        Self::PerKey { channels: KeyChannels::new(namespace), sharded: cluster }
    }

    pub(super) fn is_per_key(&self) -> bool {
        matches!(self, Self::PerKey { .. })
    }

    pub(super) fn sharded(&self) -> bool {
        matches!(self, Self::PerKey { sharded: true, .. })
    }

    /// The tracked name of what a waiter of `hash` needs.
    pub(super) fn key_of<'a>(&'a self, hash: &'a Arc<str>) -> &'a Arc<str> {
        match self {
            Self::Namespace { channel } => channel,
            Self::PerKey { .. } => hash,
        }
    }

    pub(super) fn key_of_str<'a>(&'a self, hash: &'a str) -> &'a str {
        match self {
            Self::Namespace { channel } => channel,
            Self::PerKey { .. } => hash,
        }
    }

    /// The channel of a tracked name.
    pub(super) fn channel(&self, key: &str) -> String {
        match self {
            Self::Namespace { channel } => channel.to_string(),
            Self::PerKey { channels, .. } => channels.channel(key),
        }
    }

    /// The tracked name of one of our channels, or None.
    pub(super) fn key_of_channel<'a>(&self, channel: &'a str) -> Option<&'a str> {
        match self {
            Self::Namespace { channel: ours } => (channel == &**ours).then_some(channel),
            Self::PerKey { channels, .. } => channels.hash_of(channel),
        }
    }

    /// Whether `key` is still used. The namespace channel knows when the last waiter left;
    /// a key's channel only that its line is gone (O(1) either way).
    pub(super) fn usage(&self, lines: &Lines, key: &str) -> Usage {
        match self {
            Self::Namespace { .. } => lines.idle_since().map_or(Usage::InUse, Usage::IdleSince),
            Self::PerKey { .. } if lines.contains(key) => Usage::InUse,
            Self::PerKey { .. } => Usage::Idle,
        }
    }

    /// Whether a registered key is still to be sent: a key whose line went away before its
    /// SUBSCRIBE is forgotten instead; the namespace channel is always sent (the backend's
    /// waiters come and go, the idle rule lets it go).
    pub(super) fn in_use(&self, lines: &Lines, key: &str) -> bool {
        match self {
            Self::Namespace { .. } => true,
            Self::PerKey { .. } => lines.contains(key),
        }
    }

    /// The namespace channel's tracked name (None per key).
    pub(super) fn namespace_key(&self) -> Option<&str> {
        match self {
            Self::Namespace { channel } => Some(channel),
            Self::PerKey { .. } => None,
        }
    }

    /// The backend going idle or busy tells when the namespace channel is due; a key's
    /// line has no such signal and is looked at once per grace period.
    pub(super) fn follows_idle(&self) -> bool {
        matches!(self, Self::Namespace { .. })
    }

    /// Channels were confirmed: a release before them was not heard, so the first waiter of
    /// each line they serve checks once more.
    pub(super) fn confirmed(&self, keys: &[Arc<str>], lines: &Lines) {
        match self {
            Self::Namespace { .. } => lines.wake_all(),
            Self::PerKey { .. } => keys.iter().for_each(|hash| lines.check_again(hash)),
        }
    }
}

/// The connection that carries the channels.
pub(super) enum Carrier {
    Classic { sink: redis::aio::PubSubSink, messages: redis::aio::PubSubStream },
    Sharded { conn: crate::connection::ClusterConn, pushes: ShardPushes },
}

/// What the connection delivered.
pub(super) enum Event {
    /// A release was announced.
    Message(Message),
    /// The server ended the subscription of one channel (a slot moved away), or ours ended.
    Unsubscribed(String),
    /// One node's connection ended: its subscriptions with it (which ones is not said).
    NodeLost,
    /// The connection itself ended.
    Closed,
}

pub(super) enum Message {
    Classic(redis::Msg),
    Sharded(redis::PushInfo),
}

impl Message {
    /// The payload: the released key's hash.
    pub(super) fn hash(&self) -> Option<&str> {
        let bytes = match self {
            Self::Classic(msg) => msg.get_payload_bytes(),
            Self::Sharded(push) => match push.data.get(1) {
                Some(redis::Value::BulkString(b)) => b,
                _ => return None,
            },
        };
        std::str::from_utf8(bytes).ok()
    }
}

/// How a SUBSCRIBE of a batch went.
pub(super) enum Subscribed {
    All,
    /// The server refuses the command itself (unknown, NOPERM).
    Refused,
    /// These channels (indices into the batch) were not subscribed. `ends_connection`: the
    /// failure is the connection's, which carries every channel (classic); otherwise one
    /// node's, and the others stay (sharded).
    Failed {
        failure: RedisFailure,
        failed: Vec<usize>,
        ends_connection: bool,
    },
}

impl Carrier {
    /// A connection for subscriptions, with nothing subscribed yet.
    pub(super) async fn open(link: &RedisLink, sharded: bool) -> Result<Self, SubscribeFailure> {
        if sharded {
            let (conn, pushes) = link.open_shard_pubsub().await.expect("sharded needs cluster")?;
            return Ok(Self::Sharded { conn, pushes });
        }
        let (sink, messages) = link.open_pubsub().await?.split();
        Ok(Self::Classic { sink, messages })
    }

    pub(super) fn is_sharded(&self) -> bool {
        matches!(self, Self::Sharded { .. })
    }

    /// The next event (cancel-safe).
    pub(super) async fn next(&mut self) -> Event {
        match self {
            Self::Classic { messages, .. } => match messages.next().await {
                Some(msg) => Event::Message(Message::Classic(msg)),
                None => Event::Closed,
            },
            Self::Sharded { pushes, .. } => loop {
                let Some(push) = pushes.recv().await else { return Event::Closed };
                match push.kind {
                    redis::PushKind::SMessage => return Event::Message(Message::Sharded(push)),
                    redis::PushKind::SUnsubscribe => {
                        if let Some(redis::Value::BulkString(b)) = push.data.first() {
                            if let Ok(channel) = String::from_utf8(b.clone()) {
                                return Event::Unsubscribed(channel);
                            }
                        }
                    }
                    redis::PushKind::Disconnection => return Event::NodeLost,
                    _ => {}
                }
            },
        }
    }

    /// Subscribes `channels`, each within commandTimeoutMs: one SUBSCRIBE on a classic
    /// connection; one SSUBSCRIBE per channel, sent together, on a sharded one (it takes the
    /// channels of one slot only).
    pub(super) async fn subscribe(&mut self, channels: &[String], link: &RedisLink) -> Subscribed {
        match self {
            Self::Classic { sink, .. } => {
                let reply = tokio::time::timeout(link.command_timeout, sink.subscribe(channels));
                let failure = match reply.await {
                    Ok(Ok(())) => return Subscribed::All,
                    Ok(Err(e)) if refuses_subscribe(&e) => return Subscribed::Refused,
                    Ok(Err(e)) => RedisFailure::command(&e),
                    Err(_) => RedisFailure::command_timeout(),
                };
                Subscribed::Failed {
                    failure,
                    failed: (0..channels.len()).collect(),
                    ends_connection: true,
                }
            }
            Self::Sharded { conn, .. } => {
                let sent = channels.iter().map(|c| shard_command(conn, link, true, c));
                let results = futures::future::join_all(sent).await;
                let (mut failure, mut failed) = (None, Vec::new());
                for (i, result) in results.into_iter().enumerate() {
                    match result {
                        Ok(()) => {}
                        Err(e) if refuses_subscribe(&e) => return Subscribed::Refused,
                        Err(e) => {
                            failure.get_or_insert_with(|| RedisFailure::command(&e));
                            failed.push(i);
                        }
                    }
                }
                match failure {
                    None => Subscribed::All,
                    Some(failure) => Subscribed::Failed { failure, failed, ends_connection: false },
                }
            }
        }
    }

    /// Unsubscribes `channels`, each within commandTimeoutMs. Its outcome is not looked at
    /// (decision 0110): nobody waits on these keys any more, they are forgotten either way,
    /// and a channel left subscribed only brings messages that wake nobody.
    pub(super) async fn unsubscribe(&mut self, channels: &[String], link: &RedisLink) {
        match self {
            Self::Classic { sink, .. } => {
                let _ =
                    tokio::time::timeout(link.command_timeout, sink.unsubscribe(channels)).await;
            }
            Self::Sharded { conn, .. } => {
                let sent = channels.iter().map(|c| shard_command(conn, link, false, c));
                futures::future::join_all(sent).await;
            }
        }
    }
}

/// SSUBSCRIBE (or SUNSUBSCRIBE) of one channel within commandTimeoutMs. A MOVED (the slot
/// moved, redis-rs's map is behind) surely did nothing and is sent again after a pause, as
/// scripts are (connection.rs).
async fn shard_command(
    conn: &crate::connection::ClusterConn,
    link: &RedisLink,
    subscribe: bool,
    channel: &str,
) -> redis::RedisResult<()> {
    let mut result = Ok(());
    for pause_ms in [0, 10, 50, 200] {
        tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        let mut conn = conn.clone();
        let sent = async {
            if subscribe {
                conn.ssubscribe(channel).await
            } else {
                conn.sunsubscribe(channel).await
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

/// The subscription connection ended.
pub(super) fn lost() -> RedisFailure {
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
        let mode = Mode::per_key("svc", false);
        let names = crate::keys::KeyNames::new("svc", "job:1");
        let channel = mode.channel(&names.hash);
        assert_eq!(channel, format!("svc:lock-released:{{{}}}", names.hash));
        assert_eq!(mode.key_of_channel(&channel), Some(&*names.hash));
        // The same {…} as the lock key: one Cluster slot.
        let tag = |s: &str| s[s.find('{').unwrap()..].to_owned();
        assert_eq!(tag(&channel), tag(&names.lock));
    }
}
