//! Replica acknowledgements (issue 11): with `minReplicas` N > 0, a winning acquire and a
//! renew count only once N replicas acknowledged them (docs/decisions/0025, 0026).
//!
//! WAIT counts the replication offset of the connection it runs on, so it is sent on the
//! connection that wrote, and it blocks that connection: every command multiplexed behind
//! it waits until it answers. So at most one WAIT is in flight per connection and it is
//! shared: it covers every write whose reply arrived before it was sent (Redis ran those
//! first). A write that finds one already in flight cannot know whether it is covered, and
//! joins the next round, sent as soon as the current one answers. An unrelated command then
//! waits behind one WAIT at most, about replicaTimeoutMs, however many writes need one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, Shared};
use redis::Value;

use crate::connection::{Conn, RedisLink};
use crate::error::{Outcome, RedisFailure};
use crate::options::BackendOptions;

type Round = Shared<BoxFuture<'static, Result<(), RedisFailure>>>;

/// The WAIT rounds of one connection.
#[derive(Default)]
struct Rounds {
    /// The round whose WAIT is on the wire, by id.
    in_flight: Option<(u64, Round)>,
    /// The round that will be sent once `in_flight` answers; later writes join it.
    next: Option<Round>,
}

type ByConnection = Arc<Mutex<HashMap<u64, Rounds>>>;

/// WAIT for minReplicas acknowledgements, one WAIT shared by the writes of a connection
/// (decisions 0025–0027).
pub struct Replicas {
    min: u32,
    timeout_ms: u32,
    /// How long we wait for WAIT's answer ourselves: Redis answers at replicaTimeoutMs,
    /// plus commandTimeoutMs for a loaded server. Past that the primary itself is stalled.
    local_limit: Duration,
    rounds: ByConnection,
    next_id: std::sync::atomic::AtomicU64,
}

impl Replicas {
    /// WAIT for the backend's minReplicas, within replicaTimeoutMs.
    pub fn new(options: &BackendOptions, command_timeout: Duration) -> Self {
        Self {
            min: options.min_replicas,
            timeout_ms: options.replica_timeout_ms,
            local_limit: Duration::from_millis(options.replica_timeout_ms.into()) + command_timeout,
            rounds: ByConnection::default(),
            next_id: std::sync::atomic::AtomicU64::new(1),
        }
    }

    /// Resolves once `minReplicas` replicas acknowledged every write whose reply `conn`
    /// already delivered. With minReplicas 0 it sends nothing. Too few acknowledgements, a
    /// lost connection or no answer in time: a NOREPLICAS failure (decision 0026). WAIT
    /// refused by the server (NOPERM, a service without WAIT): that refusal.
    pub async fn confirm(&self, link: &Arc<RedisLink>, conn: &Conn) -> Result<(), RedisFailure> {
        if self.min == 0 || crate::mutants::skips_wait() {
            return Ok(());
        }
        let round = {
            let mut map = crate::sync::lock(&self.rounds);
            let rounds = map.entry(conn.generation()).or_default();
            match (&rounds.in_flight, &rounds.next) {
                // Not sent yet, and sent only after this moment: it covers us.
                (_, Some(next)) => next.clone(),
                (None, None) => {
                    let (id, round) = self.start(link, conn, None);
                    rounds.in_flight = Some((id, round.clone()));
                    round
                }
                (Some((_, current)), None) => {
                    let (_, round) = self.start(link, conn, Some(current.clone()));
                    rounds.next = Some(round.clone());
                    round
                }
            }
        };
        round.await
    }

    /// A round: after `previous` answers (if any), one WAIT on `conn`. Spawned, so it runs
    /// even if the write that started it stops waiting for it.
    fn start(&self, link: &Arc<RedisLink>, conn: &Conn, previous: Option<Round>) -> (u64, Round) {
        let id = self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (rounds, link, conn) = (self.rounds.clone(), link.clone(), conn.clone());
        let (min, timeout_ms, local_limit) = (self.min, self.timeout_ms, self.local_limit);
        let generation = conn.generation();
        let task = tokio::spawn(async move {
            if let Some(previous) = previous {
                let _ = previous.await;
                let mut map = crate::sync::lock(&rounds);
                let entry = map.entry(generation).or_default();
                if let Some(me) = entry.next.take() {
                    entry.in_flight = Some((id, me));
                }
            }
            let result = wait(&link, &conn, min, timeout_ms, local_limit).await;
            let mut map = crate::sync::lock(&rounds);
            if let Some(entry) = map.get_mut(&generation) {
                if entry.in_flight.as_ref().is_some_and(|(i, _)| *i == id) {
                    entry.in_flight = None;
                }
                if entry.in_flight.is_none() && entry.next.is_none() {
                    map.remove(&generation);
                }
            }
            result
        });
        let round = async move {
            task.await.unwrap_or_else(|_| {
                Err(RedisFailure::too_few_replicas("the replica acknowledgement was not confirmed"))
            })
        };
        (id, round.boxed().shared())
    }
}

/// One `WAIT min timeout_ms` on `conn`, judged.
async fn wait(
    link: &RedisLink,
    conn: &Conn,
    min: u32,
    timeout_ms: u32,
    local_limit: Duration,
) -> Result<(), RedisFailure> {
    let mut cmd = redis::cmd("WAIT");
    cmd.arg(min).arg(timeout_ms);
    match tokio::time::timeout(local_limit, link.command_on(conn, &cmd)).await {
        Ok(Ok(Value::Int(acked))) if acked >= i64::from(min) => Ok(()),
        Ok(Ok(Value::Int(acked))) => Err(RedisFailure::too_few_replicas(format!(
            "only {acked} of minReplicas {min} replicas acknowledged the write within replicaTimeoutMs"
        ))),
        Ok(Ok(_)) => Err(RedisFailure::too_few_replicas("Redis sent an unexpected reply to WAIT: replication is not confirmed")),
        // The server refused WAIT itself (ACL, a service without it): waiting will not fix that.
        Ok(Err(failure)) if failure.outcome == Outcome::Rejected => Err(failure),
        // The write was already settled by its own reply; only its replication is unknown.
        Ok(Err(_)) => Err(RedisFailure::too_few_replicas(
            "the connection to Redis was lost before replicas acknowledged the write",
        )),
        Err(_) => {
            // Everything behind the stalled WAIT would wait too, the next round's WAIT
            // included: no one sends on this connection again.
            link.give_up(conn);
            Err(RedisFailure::too_few_replicas("Redis did not answer WAIT in time: replication is not confirmed"))
        }
    }
}
