//! Dedicated connections for subscriptions: the namespace channel, the per-key channels
//! and a Cluster's sharded ones.
//!
//! One timeout rule, the one commands follow: opening a subscription connection (naming
//! the primary through Sentinel included) is bounded by connectTimeoutMs, and each command
//! on it (SUBSCRIBE and its confirmation, SSUBSCRIBE) by commandTimeoutMs (decision 0120).

use std::sync::atomic::{AtomicBool, Ordering};

use super::{ClusterConn, NodeClients, RedisLink, Target};
use crate::error::RedisFailure;

impl RedisLink {
    /// A dedicated connection subscribed to `channel`, confirmed by the server.
    /// With Sentinel: on the node Sentinel names now (no ROLE check: a subscription on the
    /// wrong node only misses notifications, and it moves at the next change of primary).
    pub async fn subscribe(
        &self,
        channel: &str,
    ) -> Result<redis::aio::PubSubStream, SubscribeFailure> {
        let mut pubsub = self.open_pubsub().await?;
        let subscribed = tokio::time::timeout(self.command_timeout, pubsub.subscribe(channel));
        match subscribed.await {
            Err(_) => Err(SubscribeFailure::Failed(RedisFailure::command_timeout())),
            Ok(Err(e)) => {
                let failure = RedisFailure::command(&e);
                Err(if refuses_subscribe(&e) {
                    SubscribeFailure::Unsupported(failure)
                } else {
                    SubscribeFailure::Failed(failure)
                })
            }
            Ok(Ok(())) => Ok(pubsub.into_on_message()),
        }
    }

    /// A dedicated connection for subscriptions, not yet subscribed to anything (per-key
    /// notifications subscribe and unsubscribe on it as keys come and go): on the node the
    /// URL names, on any node of a Cluster that answers (its classic pub/sub reaches every
    /// node), or on the primary Sentinel names now, as [`subscribe`](Self::subscribe).
    pub async fn open_pubsub(&self) -> Result<redis::aio::PubSub, SubscribeFailure> {
        let resolved = AtomicBool::new(!matches!(self.target, Target::Sentinel(_)));
        let connect = self.pubsub_connection(&resolved);
        let outcome = tokio::time::timeout(self.connect_timeout, connect).await;
        outcome.unwrap_or_else(|_| Err(subscribe_timeout(&resolved)))
    }

    /// A Cluster connection for sharded subscriptions (SSUBSCRIBE is sent to the node that
    /// owns the channel's slot), speaking RESP3 so that messages, the server's own
    /// `sunsubscribe` at a slot move, and a node connection's end arrive as pushes on the
    /// returned receiver. None without `cluster: true`.
    pub(crate) async fn open_shard_pubsub(
        &self,
    ) -> Option<Result<(ClusterConn, ShardPushes), SubscribeFailure>> {
        let Target::Cluster(nodes) = &self.target else { return None };
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let opened = nodes.open_sharded(self.command_timeout, tx);
        Some(match tokio::time::timeout(self.connect_timeout, opened).await {
            Err(_) => Err(SubscribeFailure::Failed(RedisFailure::connect_timeout())),
            Ok(Err(e)) => Err(SubscribeFailure::Failed(RedisFailure::connect(&e))),
            Ok(Ok(conn)) => Ok((conn, rx)),
        })
    }

    async fn pubsub_connection(
        &self,
        resolved: &AtomicBool,
    ) -> Result<redis::aio::PubSub, SubscribeFailure> {
        let client = match &self.target {
            Target::Fixed(node) => node.resp2.clone(),
            // Classic pub/sub reaches every node of a Cluster: any node that answers will do.
            Target::Cluster(nodes) => {
                let mut last = None;
                for info in nodes.subscriber_candidates() {
                    let client = NodeClients::new(info, self.tls.as_ref())
                        .map_err(|e| SubscribeFailure::Failed(RedisFailure::connect(&e)))?;
                    match client.resp2.get_async_pubsub().await {
                        Ok(pubsub) => return Ok(pubsub),
                        Err(e) => last = Some(e),
                    }
                }
                let failure =
                    last.map_or_else(RedisFailure::connect_timeout, |e| RedisFailure::connect(&e));
                return Err(SubscribeFailure::Failed(failure));
            }
            Target::Sentinel(sentinel) => {
                let address =
                    sentinel.primary_address().await.map_err(SubscribeFailure::NoPrimary)?;
                let node = sentinel
                    .node_info(&address)
                    .and_then(|info| NodeClients::new(info, self.tls.as_ref()))
                    .map_err(|e| SubscribeFailure::NoPrimary(RedisFailure::connect(&e)))?;
                resolved.store(true, Ordering::Release);
                node.resp2
            }
        };
        client
            .get_async_pubsub()
            .await
            .map_err(|e| SubscribeFailure::Failed(RedisFailure::connect(&e)))
    }
}

/// The pushes of a sharded subscription connection.
pub(crate) type ShardPushes = tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>;

/// Why a subscription could not be had.
#[derive(Debug)]
pub enum SubscribeFailure {
    /// The server refuses SUBSCRIBE itself (unknown or renamed command, NOPERM): it will
    /// keep refusing, so waiters poll for good.
    Unsupported(RedisFailure),
    /// Anything else, including a refused connection (AUTH, SELECT, maxclients): it may
    /// pass, so waiters subscribe again later.
    Failed(RedisFailure),
    /// Sentinel did not name the primary (none answered, or too slowly): a failure like
    /// `Failed`, but one that says nothing about the connection to the primary, which may
    /// be perfectly healthy.
    NoPrimary(RedisFailure),
}

/// A subscription that timed out: a failure at the data node once it was known, otherwise
/// Sentinel's failure to name it.
fn subscribe_timeout(resolved: &AtomicBool) -> SubscribeFailure {
    let failure = RedisFailure::connect_timeout();
    if resolved.load(Ordering::Acquire) {
        SubscribeFailure::Failed(failure)
    } else {
        SubscribeFailure::NoPrimary(failure)
    }
}

/// The reply to SUBSCRIBE says the command itself is refused, not the connection: NOPERM
/// (an ACL without the channel or the command) or an unknown command. "max number of
/// clients reached" and other ERRs say nothing about SUBSCRIBE.
pub(crate) fn refuses_subscribe(err: &redis::RedisError) -> bool {
    match err.code() {
        Some("NOPERM") => true,
        Some("ERR") => {
            err.detail().is_some_and(|d| d.to_ascii_lowercase().contains("unknown command"))
        }
        _ => false,
    }
}
