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
//!
//! In a Cluster (decision 0142) one connection is many: redis-rs keeps one per node, may
//! reconnect one behind our back (a WAIT on the new one counts nothing we wrote), and a slot
//! may have moved since the write. So a round there is one pipeline to the slot's primary:
//! each lease it covers rewritten unchanged if it is still ours (`confirm.lua`), then the
//! WAIT, on the same node connection. A lease the node no longer holds is not confirmed.
//! Rounds are shared per node (by the slot map last learned), so the bound above holds per
//! node; a lease whose slot moved meanwhile answers MOVED, and the round counts as
//! unconfirmed for every lease in it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, Shared};
use redis::Value;

use crate::connection::{Conn, RedisLink};
use crate::error::{Outcome, RedisFailure};
use crate::keys::KeyNames;
use crate::options::BackendOptions;
use crate::scripts::CONFIRM;

/// A lease a round must find still ours (only a Cluster round looks).
#[derive(Clone)]
pub struct Claim {
    lock_key: String,
    token: String,
    /// The lock key's hash tag: its Cluster slot.
    tag: Arc<str>,
}

impl Claim {
    /// The lease of `keys` held with `token`.
    pub fn of(keys: &KeyNames, token: &str) -> Self {
        Self { lock_key: keys.lock.clone(), token: token.to_owned(), tag: keys.hash.clone() }
    }
}

/// For each lease a round covered, in the order they joined: still ours on the node.
type Confirmed = Result<Arc<Vec<bool>>, RedisFailure>;
type Round = Shared<BoxFuture<'static, Confirmed>>;

/// The WAIT rounds of one connection (of one node, in a Cluster).
#[derive(Default)]
struct Rounds {
    /// The round whose WAIT is on the wire, by id.
    in_flight: Option<(u64, Round)>,
    /// The round that will be sent once `in_flight` answers, and the leases that joined it.
    next: Option<(Round, Vec<Claim>)>,
}

/// Rounds by connection generation and, in a Cluster, by node.
type ByConnection = Arc<Mutex<HashMap<(u64, Option<String>), Rounds>>>;

/// WAIT for minReplicas acknowledgements, one WAIT shared by the writes of a connection
/// (decisions 0025–0027, 0142).
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
    /// already delivered (in a Cluster: acknowledged `claim`'s lease, found still ours on its
    /// slot's primary). With minReplicas 0 it sends nothing. Too few acknowledgements, a
    /// lost connection, no answer in time or the lease not found: a NOREPLICAS failure
    /// (decision 0026). WAIT refused by the server (NOPERM, a service without WAIT): that
    /// refusal.
    pub async fn confirm(
        &self,
        link: &Arc<RedisLink>,
        conn: &Conn,
        claim: Claim,
    ) -> Result<(), RedisFailure> {
        if self.min == 0 || crate::mutants::skips_wait() {
            return Ok(());
        }
        let group = (conn.generation(), link.replica_group(conn, &claim.tag));
        let (round, index) = {
            let mut map = crate::sync::lock(&self.rounds);
            let rounds = map.entry(group.clone()).or_default();
            match (&rounds.in_flight, &mut rounds.next) {
                // Not sent yet, and sent only after this moment: it covers us.
                (_, Some((next, claims))) => {
                    claims.push(claim);
                    (next.clone(), claims.len() - 1)
                }
                (None, None) => {
                    let (id, round) = self.start(link, conn, &group, None, vec![claim]);
                    rounds.in_flight = Some((id, round.clone()));
                    (round, 0)
                }
                (Some((_, current)), None) => {
                    let (_, round) = self.start(link, conn, &group, Some(current.clone()), vec![]);
                    rounds.next = Some((round.clone(), vec![claim]));
                    (round, 0)
                }
            }
        };
        match round.await?.get(index) {
            Some(true) => Ok(()),
            _ => Err(RedisFailure::too_few_replicas(
                "the lease was no longer on its slot's primary when replicas were asked: replication is not confirmed",
            )),
        }
    }

    /// A round: after `previous` answers (if any), one WAIT on `conn`, covering `claims` and,
    /// for a round sent later, the leases that joined it meanwhile. Spawned, so it runs even
    /// if the write that started it stops waiting for it.
    fn start(
        &self,
        link: &Arc<RedisLink>,
        conn: &Conn,
        group: &(u64, Option<String>),
        previous: Option<Round>,
        claims: Vec<Claim>,
    ) -> (u64, Round) {
        let id = self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (rounds, link, conn, group) =
            (self.rounds.clone(), link.clone(), conn.clone(), group.clone());
        let limits = Limits { min: self.min, timeout_ms: self.timeout_ms, local: self.local_limit };
        let task = tokio::spawn(async move {
            let mut claims = claims;
            if let Some(previous) = previous {
                let _ = previous.await;
                let mut map = crate::sync::lock(&rounds);
                let entry = map.entry(group.clone()).or_default();
                if let Some((me, joined)) = entry.next.take() {
                    entry.in_flight = Some((id, me));
                    claims = joined;
                }
            }
            let result = if group.1.is_some() {
                wait_in_cluster(&link, &conn, &claims, limits).await
            } else {
                wait(&link, &conn, limits).await.map(|()| Arc::new(vec![true; claims.len()]))
            };
            let mut map = crate::sync::lock(&rounds);
            if let Some(entry) = map.get_mut(&group) {
                if entry.in_flight.as_ref().is_some_and(|(i, _)| *i == id) {
                    entry.in_flight = None;
                }
                if entry.in_flight.is_none() && entry.next.is_none() {
                    map.remove(&group);
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

#[derive(Clone, Copy)]
struct Limits {
    min: u32,
    timeout_ms: u32,
    local: Duration,
}

fn wait_command(limits: Limits) -> redis::Cmd {
    let mut cmd = redis::cmd("WAIT");
    cmd.arg(limits.min).arg(limits.timeout_ms);
    cmd
}

/// One `WAIT min timeout_ms` on `conn`, judged.
async fn wait(link: &RedisLink, conn: &Conn, limits: Limits) -> Result<(), RedisFailure> {
    let reply =
        tokio::time::timeout(limits.local, link.command_on(conn, &wait_command(limits))).await;
    match reply {
        Ok(reply) => judge_wait(reply, limits.min),
        Err(_) => Err(stalled(link, conn)),
    }
}

/// WAIT's reply, judged.
fn judge_wait(reply: Result<Value, RedisFailure>, min: u32) -> Result<(), RedisFailure> {
    match reply {
        Ok(Value::Int(acked)) if acked >= i64::from(min) => Ok(()),
        Ok(Value::Int(acked)) => Err(RedisFailure::too_few_replicas(format!(
            "only {acked} of minReplicas {min} replicas acknowledged the write within replicaTimeoutMs"
        ))),
        Ok(_) => Err(RedisFailure::too_few_replicas("Redis sent an unexpected reply to WAIT: replication is not confirmed")),
        // The server refused WAIT itself (ACL, a service without it): waiting will not fix that.
        Err(failure) if failure.outcome == Outcome::Rejected => Err(failure),
        // The write was already settled by its own reply; only its replication is unknown.
        Err(_) => Err(RedisFailure::too_few_replicas(
            "the connection to Redis was lost before replicas acknowledged the write",
        )),
    }
}

/// Everything behind the stalled WAIT would wait too, the next round's WAIT included: no
/// one sends on this connection again.
fn stalled(link: &RedisLink, conn: &Conn) -> RedisFailure {
    link.give_up(conn);
    RedisFailure::too_few_replicas(
        "Redis did not answer WAIT in time: replication is not confirmed",
    )
}

/// A Cluster round: `confirm.lua` for each claim, then WAIT, in one pipeline to the first
/// claim's slot primary. The script goes by EVALSHA, and once more by EVAL where the node
/// lacks it (a promoted replica has an empty script cache): a NOSCRIPT did not rewrite.
async fn wait_in_cluster(
    link: &RedisLink,
    conn: &Conn,
    claims: &[Claim],
    limits: Limits,
) -> Confirmed {
    let Some(first) = claims.first() else { return Ok(Arc::new(Vec::new())) };
    let pipeline = |by_sha: bool| {
        let mut pipe = redis::pipe();
        for claim in claims {
            let script = if by_sha { CONFIRM.sha() } else { CONFIRM.source };
            pipe.cmd(if by_sha { "EVALSHA" } else { "EVAL" })
                .arg(script)
                .arg(1)
                .arg(&claim.lock_key)
                .arg(&claim.token);
        }
        pipe.add_command(wait_command(limits));
        pipe
    };
    let count = claims.len() + 1;
    let send = |pipe: redis::Pipeline| async move {
        tokio::time::timeout(limits.local, link.pipeline_on(conn, &pipe, count, &first.lock_key))
            .await
    };
    let mut reply = send(pipeline(true)).await;
    let no_script = |v: &Value| matches!(v, Value::ServerError(e) if e.code() == "NOSCRIPT");
    if matches!(&reply, Ok(Ok(values)) if values.iter().any(no_script)) {
        reply = send(pipeline(false)).await;
    }
    match reply {
        Ok(Ok(values)) => judge_cluster_round(values, claims.len(), limits.min),
        Ok(Err(failure)) => judge_wait(Err(failure), limits.min).map(|()| Arc::new(Vec::new())),
        Err(_) => Err(stalled(link, conn)),
    }
}

/// A Cluster round's replies: one per claim (1: rewritten, still ours; 0: not), then WAIT's.
/// A refused rewrite (an ACL) is that refusal, as a refused WAIT is.
fn judge_cluster_round(values: Vec<Value>, claims: usize, min: u32) -> Confirmed {
    if values.len() != claims + 1 {
        return Err(RedisFailure::too_few_replicas(
            "Redis sent an unexpected reply to WAIT: replication is not confirmed",
        ));
    }
    let mut values = values;
    let waited = values.pop().expect("claims + 1 replies");
    let mut confirmed = Vec::with_capacity(claims);
    for value in values {
        match value {
            Value::Int(1) => confirmed.push(true),
            Value::Int(0) => confirmed.push(false),
            refused @ Value::ServerError(_) => {
                return judge_wait(Err(server_error(refused)), min).map(|()| Arc::new(Vec::new()))
            }
            _ => confirmed.push(false),
        }
    }
    let waited = match waited {
        refused @ Value::ServerError(_) => Err(server_error(refused)),
        other => Ok(other),
    };
    judge_wait(waited, min).map(|()| Arc::new(confirmed))
}

/// An error reply inside a pipeline's replies, as the failure it is.
fn server_error(value: Value) -> RedisFailure {
    match value.extract_error() {
        Err(e) => RedisFailure::command(&e),
        Ok(_) => RedisFailure::unexpected_reply(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> Value {
        redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).unwrap()
    }

    #[test]
    fn a_cluster_round_confirms_only_the_leases_the_node_still_holds_and_only_with_enough_acks() {
        let round = judge_cluster_round(vec![Value::Int(1), Value::Int(0), Value::Int(1)], 2, 1);
        assert_eq!(*round.unwrap(), [true, false]);
        let few = judge_cluster_round(vec![Value::Int(1), Value::Int(0)], 1, 1).unwrap_err();
        assert_eq!(few.server_code.as_deref(), Some("NOREPLICAS"));
        assert!(few.message.contains("only 0 of minReplicas 1"), "{}", few.message);
        let short = judge_cluster_round(vec![Value::Int(1)], 1, 1).unwrap_err();
        assert_eq!(short.server_code.as_deref(), Some("NOREPLICAS"));
    }

    #[test]
    fn a_refused_rewrite_or_wait_in_a_cluster_round_is_that_refusal() {
        let denied = error("NOPERM this user has no permissions to run the 'wait' command");
        let refused = judge_cluster_round(vec![Value::Int(1), denied.clone()], 1, 1).unwrap_err();
        assert_eq!(refused.server_code.as_deref(), Some("NOPERM"));
        assert_eq!(refused.outcome, Outcome::Rejected);
        let refused = judge_cluster_round(vec![denied, Value::Int(1)], 1, 1).unwrap_err();
        assert_eq!(refused.server_code.as_deref(), Some("NOPERM"));
    }
}
