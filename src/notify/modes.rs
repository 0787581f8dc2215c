//! What differs between the modes, and nothing else: which channels a subscription holds
//! ([`Mode`]: the namespace channel, or a channel per key) and which connection carries
//! them ([`Carrier`]: one classic pub/sub connection, or a Cluster connection that sends
//! each SSUBSCRIBE to the slot's owner, decision 0063, and judges per key which pub/sub its
//! node's release script reaches, decision 0160).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use super::tracker::{Held, Usage, Verdict, Via};
use crate::connection::{
    ping_nodes, refuses_subscribe, Answer, ClusterConn, RedisLink, ShardPushes, SubscribeFailure,
};
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
    Sharded { conn: ClusterConn, pushes: ShardPushes },
}

/// What the connection delivered.
pub(super) enum Event {
    /// A release was announced.
    Message(Message),
    /// The server ended the sharded subscription of one channel (a slot moved away), or ours
    /// ended. (Classic ones end only when we end them.)
    Unsubscribed(String),
    /// One node's connection ended: its subscriptions with it (which ones is not said).
    NodeLost,
    /// The connection itself ended.
    Closed,
}

pub(super) enum Message {
    Classic(redis::Msg),
    /// A RESP3 push of the Cluster connection: `smessage`, or `message` for a key heard
    /// through classic pub/sub (decision 0160).
    Push(redis::PushInfo),
}

impl Message {
    /// The payload: the released key's hash.
    pub(super) fn hash(&self) -> Option<&str> {
        let bytes = match self {
            Self::Classic(msg) => msg.get_payload_bytes(),
            Self::Push(push) => match push.data.get(1) {
                Some(redis::Value::BulkString(b)) => b,
                _ => return None,
            },
        };
        std::str::from_utf8(bytes).ok()
    }
}

/// How a SUBSCRIBE of a batch went.
pub(super) enum Subscribed {
    /// What each channel of the batch came to, in order.
    Each(Vec<Judged>),
    /// The server refuses SUBSCRIBE itself (unknown, NOPERM): classic connection only.
    Refused,
    /// The connection failed, and it carries every channel: classic connection only.
    Lost(RedisFailure),
}

/// What subscribing one channel came to, and the subscriptions it holds after it.
pub(super) struct Judged {
    /// Err: it may pass (a node down, a timeout); the key is sent again.
    pub(super) verdict: Result<Verdict, RedisFailure>,
    pub(super) held: Held,
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
                    redis::PushKind::SMessage | redis::PushKind::Message => {
                        return Event::Message(Message::Push(push))
                    }
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

    /// One liveness PING (decision 0172): on a classic connection in subscribed mode; on a
    /// sharded one to every node, each on the node connection its subscriptions use.
    pub(super) async fn ping(&mut self, link: &RedisLink) -> Answer {
        let timeout = link.liveness.timeout;
        match self {
            Self::Classic { sink, .. } => {
                Answer::of(timeout, sink.ping::<redis::Value>(), true).await
            }
            Self::Sharded { conn, .. } => Answer::of(timeout, ping_nodes(conn), false).await,
        }
    }

    /// Subscribes `channels` (with what each holds already), each within commandTimeoutMs:
    /// one SUBSCRIBE on a classic connection; on a sharded one, each channel is judged on
    /// its own, all sent together (SSUBSCRIBE takes the channels of one slot only).
    pub(super) async fn subscribe(
        &mut self,
        channels: &[(String, Held)],
        link: &RedisLink,
    ) -> Subscribed {
        match self {
            Self::Classic { sink, .. } => {
                let names: Vec<&str> = channels.iter().map(|(c, _)| c.as_str()).collect();
                let reply = tokio::time::timeout(link.command_timeout, sink.subscribe(names));
                let failure = match reply.await {
                    Ok(Ok(())) => {
                        let live = || Judged {
                            verdict: Ok(Verdict::Live(Via::Classic)),
                            held: Held { sharded: false, classic: true },
                        };
                        return Subscribed::Each(channels.iter().map(|_| live()).collect());
                    }
                    Ok(Err(e)) if refuses_subscribe(&e) => return Subscribed::Refused,
                    Ok(Err(e)) => RedisFailure::command(&e),
                    Err(_) => RedisFailure::command_timeout(),
                };
                Subscribed::Lost(failure)
            }
            Self::Sharded { conn, .. } => {
                let judged = channels.iter().map(|(c, held)| judge(conn, link, c, *held));
                Subscribed::Each(futures::future::join_all(judged).await)
            }
        }
    }

    /// Unsubscribes `channels` from what each holds, each within commandTimeoutMs. Its
    /// outcome is not looked at (decision 0110): nobody waits on these keys any more, they
    /// are forgotten either way, and a channel left subscribed only brings messages that
    /// wake nobody.
    pub(super) async fn unsubscribe(&mut self, channels: &[(String, Held)], link: &RedisLink) {
        match self {
            Self::Classic { sink, .. } => {
                let names: Vec<&str> = channels.iter().map(|(c, _)| c.as_str()).collect();
                let _ = tokio::time::timeout(link.command_timeout, sink.unsubscribe(names)).await;
            }
            Self::Sharded { conn, .. } => {
                let sent = channels.iter().flat_map(|(c, held)| {
                    let sharded = held.sharded.then(|| shard_command(conn, link, Cmd::SUnsub, c));
                    let classic = held.classic.then(|| shard_command(conn, link, Cmd::Unsub, c));
                    sharded.into_iter().chain(classic)
                });
                futures::future::join_all(sent).await;
            }
        }
    }
}

/// Judges one key's channel on a Cluster connection (decision 0160): which pub/sub its
/// node's release script reaches, and a subscription there. The script SPUBLISHes where
/// SPUBLISH works and PUBLISHes where it is refused, so SPUBLISH is tried too (on a channel
/// of the key's slot nobody subscribes to), beside the SSUBSCRIBE:
/// - SPUBLISH works, SSUBSCRIBE works: sharded.
/// - SPUBLISH works, SSUBSCRIBE refused (renamed, or an ACL that denies only it): nothing
///   here can hear the releases: deaf, and the key's waiters poll at pollIntervalMs.
/// - SPUBLISH refused (Redis < 7.0, renamed, denied): the script PUBLISHes, which reaches
///   every node: a classic SUBSCRIBE (deaf if that is refused too).
///
/// Only this key's node is judged: another node's refusal says nothing about it.
async fn judge(conn: &ClusterConn, link: &RedisLink, channel: &str, held: Held) -> Judged {
    let probe = format!("{channel}{PROBE_SUFFIX}");
    let (subscribed, published) = futures::join!(
        shard_command(conn, link, Cmd::SSub, channel),
        shard_command(conn, link, Cmd::SPub, &probe),
    );
    // A sharded subscription made is kept until the key goes (it hears nothing where the
    // script PUBLISHes): undoing it here would bring a `sunsubscribe` push for a key still
    // held, which reads as a slot move.
    let mut held = Held { sharded: held.sharded || subscribed.is_ok(), ..held };
    let verdict = match published {
        Err(e) if refuses_subscribe(&e) => {
            if held.classic {
                Ok(Verdict::Live(Via::Classic))
            } else {
                match shard_command(conn, link, Cmd::Sub, channel).await {
                    Ok(()) => {
                        held.classic = true;
                        Ok(Verdict::Live(Via::Classic))
                    }
                    Err(e) if refuses_subscribe(&e) => Ok(Verdict::Deaf),
                    Err(e) => Err(RedisFailure::command(&e)),
                }
            }
        }
        Err(e) => Err(RedisFailure::command(&e)),
        Ok(()) => {
            let verdict = match subscribed {
                Ok(()) => Ok(Verdict::Live(Via::Sharded)),
                Err(e) if refuses_subscribe(&e) => Ok(Verdict::Deaf),
                Err(e) => Err(RedisFailure::command(&e)),
            };
            if verdict.is_ok() && held.classic {
                // Its releases are SPUBLISHed now (the slot moved): the classic one hears nothing.
                let _ = shard_command(conn, link, Cmd::Unsub, channel).await;
                held.classic = false;
            }
            verdict
        }
    };
    Judged { verdict, held }
}

/// What follows a key's channel to make the channel SPUBLISH is tried on: the same slot
/// (the hash tag comes first), a name no waiter subscribes to, and within README's channel
/// rule `&<namespace>:lock-released*`.
const PROBE_SUFFIX: &str = ":probe";

/// A command about one channel on the Cluster connection.
#[derive(Clone, Copy)]
enum Cmd {
    SSub,
    SUnsub,
    /// SPUBLISH of an empty message, only to learn whether the node takes SPUBLISH.
    SPub,
    /// Classic SUBSCRIBE and UNSUBSCRIBE, routed by the channel's slot like any key; the
    /// messages of classic PUBLISH reach every node, so any node would do.
    Sub,
    Unsub,
}

/// One [`Cmd`] within commandTimeoutMs. A MOVED (the slot moved, redis-rs's map is behind)
/// surely did nothing and is sent again after a pause, as scripts are (connection.rs).
async fn shard_command(
    conn: &ClusterConn,
    link: &RedisLink,
    cmd: Cmd,
    channel: &str,
) -> redis::RedisResult<()> {
    let mut result = Ok(());
    for pause_ms in [0, 10, 50, 200] {
        tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        let mut conn = conn.clone();
        let sent = async {
            match cmd {
                Cmd::SSub => conn.ssubscribe(channel).await,
                Cmd::SUnsub => conn.sunsubscribe(channel).await,
                Cmd::Sub => conn.subscribe(channel).await,
                Cmd::Unsub => conn.unsubscribe(channel).await,
                Cmd::SPub => {
                    redis::cmd("SPUBLISH").arg(channel).arg("").exec_async(&mut conn).await
                }
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

/// The connection did not answer a liveness PING in time: a flow dropped without a word.
pub(super) fn unanswered() -> RedisFailure {
    RedisFailure::new(
        RedisErrorCode::ConnectionLost,
        Outcome::Unknown,
        "the release-notification connection did not answer a PING within commandTimeoutMs",
    )
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
