//! Script calls on the shared connection: EVALSHA with one EVAL on NOSCRIPT, a `MOVED`
//! followed (it surely did not run, decision 0009), and nothing handed to a connection
//! that is closed or no longer the primary's (`refuse_if_stale`).

use std::borrow::Cow;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use redis::Value;
use smallvec::SmallVec;

use super::{Conn, Handle, RedisLink, Target};
use crate::clock::{self, Instant};
use crate::error::RedisFailure;
use crate::scripts::LuaScript;

/// A script with its keys and arguments, ready to send. The keys and most arguments are
/// borrowed from the lease or the driver, and both lists are inline: copying them into owned
/// strings, and the lists themselves, were an allocation and a free each, on the runtime's
/// thread, for every call (issue 37).
pub struct ScriptCall<'a> {
    pub script: &'static LuaScript,
    pub keys: SmallVec<[&'a str; 2]>,
    pub args: SmallVec<[Cow<'a, str>; 5]>,
}

impl ScriptCall<'_> {
    /// The command's name and its first argument: EVALSHA and the SHA-1, or EVAL and the
    /// source.
    fn head(&self, by_sha: bool) -> (&'static str, &'static str) {
        if by_sha {
            ("EVALSHA", self.script.sha())
        } else {
            ("EVAL", self.script.source)
        }
    }

    fn command(&self, by_sha: bool) -> redis::Cmd {
        let (name, script) = self.head(by_sha);
        // Sized up front: grown argument by argument, the command's buffers were reallocated
        // several times per call on the runtime's thread (docs/perf/README.md).
        let data = name.len()
            + script.len()
            + 20
            + self.keys.iter().map(|k| k.len()).sum::<usize>()
            + self.args.iter().map(|a| a.len()).sum::<usize>();
        let mut cmd = redis::Cmd::with_capacity(3 + self.keys.len() + self.args.len(), data);
        cmd.arg(name).arg(script).arg(self.keys.len()).arg(&self.keys[..]);
        for arg in &self.args {
            cmd.arg(arg.as_ref());
        }
        cmd
    }

    /// The command as RESP, written straight into `out`: on the driver's own connection
    /// (decision 0180), building a `redis::Cmd` and packing it was about a sixth of the
    /// runtime thread's instructions per pair (two allocations, two passes over the
    /// arguments). Byte for byte what redis-rs packs from [`command`](Self::command) (tested).
    fn pack(&self, by_sha: bool, out: &mut Vec<u8>) {
        let (name, script) = self.head(by_sha);
        let mut digits = itoa::Buffer::new();
        out.push(b'*');
        out.extend_from_slice(digits.format(3 + self.keys.len() + self.args.len()).as_bytes());
        out.extend_from_slice(b"\r\n");
        bulk(out, name.as_bytes());
        bulk(out, script.as_bytes());
        bulk(out, digits.format(self.keys.len()).as_bytes());
        for key in &self.keys {
            bulk(out, key.as_bytes());
        }
        for arg in &self.args {
            bulk(out, arg.as_bytes());
        }
    }
}

/// One RESP bulk string: `$<length>\r\n<bytes>\r\n`.
fn bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    let mut digits = itoa::Buffer::new();
    out.push(b'$');
    out.extend_from_slice(digits.format(bytes.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

impl RedisLink {
    /// Known dead, or no longer to be used for the primary, before anything was handed to
    /// it: the connection is dropped and the command fails as surely not sent.
    fn refuse_if_stale(&self, conn: &Conn) -> Result<(), RedisFailure> {
        self.stale(conn).inspect_err(|_| self.forget(conn))
    }

    /// Runs a script by EVALSHA, and once by EVAL when the server lacks it (NOSCRIPT).
    /// Not timed: callers decide how long to wait, and may keep waiting for a late reply.
    pub async fn eval(&self, conn: &Conn, call: &ScriptCall<'_>) -> Result<Value, RedisFailure> {
        close_if_asked(conn);
        self.refuse_if_stale(conn)?;
        let _carrying = conn.carrying();
        let mut inner = conn.inner.clone();
        let mut reply = send_script(&mut inner, call, true).await;
        // A MOVED reply means the node did not run it, so sending it again is no retry of
        // an unsettled command. redis-rs refreshes its slot map on MOVED; give it a moment.
        for pause_ms in [0, 10, 50] {
            if !matches!(&reply, Err(f) if f.server_code.as_deref() == Some("MOVED")) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(pause_ms)).await;
            reply = send_script(&mut inner, call, true).await;
        }
        if matches!(&reply, Err(f) if f.is_no_script()) {
            reply = send_script(&mut inner, call, false).await;
        }
        if matches!(&reply, Err(f) if !f.surely_not_applied()) {
            self.forget(conn);
        }
        if matches!(&reply, Err(f) if f.reached_no_node()) {
            self.lost_cluster(conn);
        }
        // A demoted primary refuses writes: ask Sentinel where the primary went.
        if matches!(&self.target, Target::Sentinel(_))
            && matches!(&reply, Err(f) if f.server_code.as_deref() == Some("READONLY"))
        {
            self.forget(conn);
        }
        reply
    }

    /// Sends one command on `conn` itself, not on whichever connection is current: WAIT
    /// counts the writes of the connection it runs on (issue 11). Not timed, like `eval`.
    /// On a connection to a node that is no longer the primary nothing is sent: a WAIT there
    /// would count the replicas of a demoted node, so the write counts as unconfirmed.
    pub async fn command_on(&self, conn: &Conn, cmd: &redis::Cmd) -> Result<Value, RedisFailure> {
        self.refuse_if_stale(conn)?;
        let _carrying = conn.carrying();
        let reply = send(&mut conn.inner.clone(), cmd).await;
        if matches!(&reply, Err(f) if !f.surely_not_applied()) {
            self.forget(conn);
        }
        reply
    }

    /// Whether `conn`'s flow is dead although it looks open (a NAT or load balancer forgot
    /// it): the server answers a PING on another connection, and then a PING sent on `conn`
    /// — behind whatever is still unanswered there — gets no answer within commandTimeoutMs.
    /// A server that answers others has run everything that reached it, so what `conn` still
    /// awaits never reached it, and a forgotten flow never delivers it later (decision 0167).
    /// False whenever that cannot be told: the server not answering either (stalled: what
    /// is queued may still run), no other connection, or a Cluster connection (its PING
    /// would go to any node).
    pub(crate) async fn carries_nothing(self: &Arc<Self>, conn: &Conn) -> bool {
        if !conn.inner.is_one_node() {
            return false;
        }
        let ping = redis::cmd("PING");
        let answered = |reply: Result<Result<Value, RedisFailure>, _>| match reply {
            Ok(Ok(_)) => true,
            Ok(Err(failure)) => failure.server_code.is_some(),
            Err(_) => false,
        };
        let Ok(other) = self.connection().await else { return false };
        if other.generation() == conn.generation()
            || !answered(
                tokio::time::timeout(self.command_timeout, self.command_on(&other, &ping)).await,
            )
        {
            return false;
        }
        match tokio::time::timeout(self.command_timeout, self.command_on(conn, &ping)).await {
            Err(_) => true,
            // Refused before it was sent (closed, no longer the primary): no evidence.
            Ok(Err(failure)) if failure.surely_not_applied() => false,
            Ok(reply) => !answered(Ok(reply)),
        }
    }

    /// Sends `pipe` on `conn` itself, in one write to one node connection: in a Cluster, to
    /// the primary of `route_key`'s slot, and its commands are not routed one by one (a key
    /// of another node answers MOVED). Not timed, like `command_on`.
    pub async fn pipeline_on(
        &self,
        conn: &Conn,
        pipe: &redis::Pipeline,
        count: usize,
        route_key: &str,
    ) -> Result<Vec<Value>, RedisFailure> {
        self.refuse_if_stale(conn)?;
        let _carrying = conn.carrying();
        let reply = match conn.inner.clone() {
            Handle::Single(mut single) => single.req_packed_commands(pipe, 0, count).await,
            Handle::Lane(lane) => lane.send_all(pipe, count).await,
            Handle::Cluster(mut cluster) => {
                let route = Route::with_key(route_key, SlotAddr::Master);
                cluster
                    .route_pipeline(
                        pipe.clone(),
                        0,
                        count,
                        SingleNodeRoutingInfo::SpecificNode(route),
                    )
                    .await
            }
        }
        .map_err(|e| RedisFailure::command(&e));
        if matches!(&reply, Err(f) if !f.surely_not_applied()) {
            self.forget(conn);
        }
        reply
    }

    /// Connects if needed, then runs the script within commandTimeoutMs. Also returns the
    /// moment the command was submitted, where lease deadlines start.
    pub async fn run(
        self: &Arc<Self>,
        call: &ScriptCall<'_>,
    ) -> Result<(Value, Instant), RedisFailure> {
        self.run_on(call).await.map(|(value, submitted, _)| (value, submitted))
    }

    /// [`run`](Self::run), also returning the connection that ran it (for WAIT, issue 11).
    /// Refused unsent because the connection it took closed in that moment, it is sent
    /// once on a new one (decision 0178).
    pub async fn run_on(
        self: &Arc<Self>,
        call: &ScriptCall<'_>,
    ) -> Result<(Value, Instant, Conn), RedisFailure> {
        let mut sent_anew = false;
        loop {
            let conn = self.connection().await?;
            let submitted = clock::now();
            match tokio::time::timeout(self.command_timeout, self.eval(&conn, call)).await {
                Ok(Err(f)) if f.refused_on_closed_connection() && !sent_anew => sent_anew = true,
                Ok(reply) => return reply.map(|v| (v, submitted, conn)),
                Err(_) => {
                    // Later commands would queue behind the stalled one on this connection.
                    self.stalled(&conn, call.keys.first().copied().unwrap_or(""));
                    return Err(RedisFailure::command_timeout());
                }
            }
        }
    }
}

async fn send(conn: &mut Handle, cmd: &redis::Cmd) -> Result<Value, RedisFailure> {
    conn.send(cmd).await.and_then(Value::extract_error).map_err(|e| RedisFailure::command(&e))
}

/// [`send`] of a script: packed straight into the driver's own connection, else as a
/// `redis::Cmd`.
async fn send_script(
    conn: &mut Handle,
    call: &ScriptCall<'_>,
    by_sha: bool,
) -> Result<Value, RedisFailure> {
    let reply = match conn {
        Handle::Lane(lane) => lane.send_packed(|out| call.pack(by_sha, out)).await,
        other => other.send(&call.command(by_sha)).await,
    };
    reply.and_then(Value::extract_error).map_err(|e| RedisFailure::command(&e))
}

/// Scripts still to find their connection closed in the moment they are handed to it
/// (see [`close_before_send`]); 0 outside the crate's tests.
static CLOSE_BEFORE_SEND: AtomicU32 = AtomicU32::new(0);

/// Test-only: the next `times` scripts handed to a connection find it closed in that
/// moment, as when Redis's close is read on another worker thread, or the liveness PING's
/// verdict lands, between choosing the connection and sending. Process-wide: a test using
/// it runs alone in its own test binary.
pub fn close_before_send(times: u32) {
    CLOSE_BEFORE_SEND.store(times, Ordering::Relaxed);
}

/// One relaxed load when unused.
fn close_if_asked(conn: &Conn) {
    if CLOSE_BEFORE_SEND.load(Ordering::Relaxed) > 0
        && CLOSE_BEFORE_SEND
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    {
        conn.closed.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scripts::{ACQUIRE, RELEASE};
    use smallvec::smallvec;

    #[test]
    fn a_script_is_packed_byte_for_byte_as_redis_rs_packs_it() {
        let long = "é".repeat(200);
        let calls = [
            ScriptCall {
                script: &ACQUIRE,
                keys: smallvec!["{h}:lock", "{h}:fence"],
                args: smallvec![],
            },
            ScriptCall {
                script: &RELEASE,
                keys: smallvec!["{h}:lock"],
                args: smallvec![
                    Cow::Borrowed("token"),
                    Cow::Owned(long.clone()),
                    Cow::Borrowed("")
                ],
            },
            ScriptCall {
                script: &RELEASE,
                keys: smallvec![],
                args: smallvec![Cow::Borrowed("1234567890")],
            },
        ];
        for call in &calls {
            for by_sha in [true, false] {
                let mut packed = b"before".to_vec();
                call.pack(by_sha, &mut packed);
                let mut expected = b"before".to_vec();
                expected.extend_from_slice(&call.command(by_sha).get_packed_command());
                assert_eq!(packed, expected);
            }
        }
    }
}
