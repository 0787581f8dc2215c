//! One lazily opened, multiplexed Redis connection per backend (or one Cluster connection):
//! where it connects (the URL's node, the primary Sentinel names, a Cluster), its
//! generations, and forgetting or closing it. A plain-TCP connection to the URL's node is
//! the driver's own (`lane`, decision 0180), any other redis-rs's. Beside it: script calls
//! on it (`script`), subscription connections (`pubsub`), TLS (`tls`) and the
//! eviction-policy advice (`eviction`).
//!
//! Failures are classified where they happen: a connect that fails sent nothing
//! (`not-submitted`); once a command is queued on a connection, neither redis-rs nor the
//! driver's own connection can say whether Redis saw it, so an I/O failure there is
//! `unknown` (decision 0003).

mod cluster;
mod eviction;
mod lane;
mod liveness;
mod pubsub;
mod script;
mod tls;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, FutureExt, Shared};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, IntoConnectionInfo, ProtocolVersion, Value};

pub(crate) use cluster::{ping_nodes, ClusterConn};
// The benchmarks' floor build measures this connection with no driver on it.
#[cfg(all(feature = "bench-floor", not(test)))]
pub(crate) use lane::Lane;
pub(crate) use liveness::{Answer, Liveness, Quiet};
pub use pubsub::SubscribeFailure;
pub(crate) use pubsub::{refuses_subscribe, ShardPushes};
pub use script::close_before_send;
pub(crate) use script::ScriptCall;

use crate::error::{LockError, LockErrorCode, Outcome, RedisErrorCode, RedisFailure};
use crate::options::{ConnectionOptions, TlsOptions};
use crate::sentinel::{self, Sentinel, SentinelAuth};
use crate::switches::lanes_enabled;
use tls::certificates;

/// A connection of a known generation, so a failure resets only the connection it hit.
#[derive(Clone)]
pub struct Conn {
    inner: Handle,
    generation: u64,
    /// The Sentinel epoch of the primary this connects to (always 0 without Sentinel).
    epoch: u64,
    /// Set by redis-rs (a RESP3 push) when the connection closed, so no command is handed
    /// to a dead connection: that one would fail as "outcome unknown" (decision 0013).
    closed: Arc<AtomicBool>,
    /// When it was opened: one opened before a failover began is not used after it
    /// (decision 0051).
    opened: Instant,
    /// What it carries, for its liveness PINGs; dropped with the last handle.
    activity: Arc<liveness::Activity>,
}

impl Conn {
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Marks a command out on it until the guard drops: no liveness PING meanwhile.
    pub(crate) fn carrying(&self) -> liveness::Carrying<'_> {
        self.activity.carrying()
    }

    /// Tells connections apart, e.g. to share one WAIT among writes of the same one (issue 11).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The Sentinel epoch of the primary it connects to (0 without Sentinel): a write on
    /// it was made on that primary (decision 0153).
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }
}

#[derive(Clone)]
enum Handle {
    Single(MultiplexedConnection),
    /// A plain-TCP connection to the URL's node: callers write, one task reads (`lane`,
    /// decision 0180).
    Lane(lane::Lane),
    /// Routes each script by its first key's slot; both lock keys share a hash tag.
    Cluster(ClusterConn),
}

impl Handle {
    async fn send(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<Value> {
        match self {
            Handle::Single(conn) => conn.send_packed_command(cmd).await,
            Handle::Lane(lane) => lane.send(cmd).await,
            Handle::Cluster(conn) => conn.req_packed_command(cmd).await,
        }
    }

    /// A connection to one node, not a Cluster's.
    fn is_one_node(&self) -> bool {
        !matches!(self, Handle::Cluster(_))
    }
}

type Connecting = Shared<BoxFuture<'static, Result<Conn, RedisFailure>>>;

enum State {
    Idle,
    /// Every caller awaits the same attempt, so a slow or refused connect is paid once.
    Connecting(u64, Connecting),
    Connected(Conn),
}

/// Clients for one data node.
struct NodeClients {
    /// Subscriptions, and commands against a server without RESP3.
    resp2: Client,
    /// The same, speaking RESP3 so that a closed connection is announced (decision 0013).
    resp3: Client,
}

/// The settings of every connection the driver opens, minus what redis-rs would send
/// unasked: `CLIENT SETINFO` (Redis 7.2+, every Valkey) is not in README's least-privilege
/// rule, and each refusal would leave an `ACL LOG` entry per connection (decision 0075).
fn quiet(info: redis::ConnectionInfo) -> redis::ConnectionInfo {
    let settings = info.redis_settings().clone().set_skip_set_lib_name();
    info.set_redis_settings(settings)
}

impl NodeClients {
    fn new(info: redis::ConnectionInfo, tls: Option<&TlsOptions>) -> redis::RedisResult<Self> {
        let info = quiet(info);
        let info_resp3 = info
            .clone()
            .set_redis_settings(info.redis_settings().clone().set_protocol(ProtocolVersion::RESP3));
        Ok(match tls {
            None => Self { resp2: Client::open(info)?, resp3: Client::open(info_resp3)? },
            Some(tls) => Self {
                resp2: Client::build_with_tls(info, certificates(tls))?,
                resp3: Client::build_with_tls(info_resp3, certificates(tls))?,
            },
        })
    }
}

/// Where the data node is.
enum Target {
    /// The node the URL names (the one a Cluster is reached through).
    Fixed(Box<NodeClients>),
    /// The primary Sentinel names, asked again at each connect.
    Sentinel(Arc<Sentinel>),
    /// A Cluster, through any node known (`cluster`).
    Cluster(Box<cluster::ClusterNodes>),
}

/// The connection of one backend (decision 0004): where it connects, the connection
/// open now and its generation.
pub struct RedisLink {
    target: Target,
    tls: Option<TlsOptions>,
    /// The server refused HELLO 3 (Redis < 6): commands use the RESP2 client.
    resp2_only: AtomicBool,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
    /// commandTimeoutMs: how long a command's reply is waited for.
    pub command_timeout: Duration,
    /// pingIntervalMs, with commandTimeoutMs for the answer.
    pub(crate) liveness: Liveness,
    state: Mutex<State>,
    generation: AtomicU64,
    /// After shutdown, late cleanups still connect but nothing is kept open.
    closed: AtomicBool,
    checked_eviction: AtomicBool,
    driver_id: u64,
}

impl RedisLink {
    /// Fails INVALID_OPTIONS naming the field at fault: the URL, or a TLS PEM.
    pub fn new(options: &ConnectionOptions, driver_id: u64) -> Result<Self, LockError> {
        let url = options.url.to_ascii_lowercase();
        if url.starts_with("rediss://") || url.starts_with("rediss-sentinel://") {
            tls::install_crypto_provider();
        }
        if let Some(tls) = &options.tls {
            tls::check_pems(tls)?;
        }
        Self::build(options, driver_id).map_err(|_| {
            LockError::new(LockErrorCode::InvalidOptions, "connection.url is not a valid Redis URL")
        })
    }

    fn build(options: &ConnectionOptions, driver_id: u64) -> Result<Self, redis::RedisError> {
        let connect_timeout = Duration::from_millis(options.connect_timeout_ms.into());
        // One for every connection of the driver, so their deaths are counted together.
        let liveness = Liveness::of(options);
        let command_timeout = Duration::from_millis(options.command_timeout_ms.into());
        let target = match &options.sentinel {
            Some(sentinel_url) => {
                let auth = SentinelAuth {
                    username: options.sentinel_username.as_deref(),
                    password: options.sentinel_password.as_deref(),
                };
                let open = |info| match &options.tls {
                    None => Client::open(quiet(info)),
                    Some(tls) => Client::build_with_tls(quiet(info), certificates(tls)),
                };
                Target::Sentinel(Arc::new(Sentinel::new(
                    sentinel_url.clone(),
                    auth,
                    open,
                    connect_timeout,
                    command_timeout,
                    liveness.clone(),
                    driver_id,
                )?))
            }
            None if options.cluster => Target::Cluster(Box::new(cluster::ClusterNodes::new(
                &options.seeds,
                options.tls.as_ref(),
                connect_timeout,
            )?)),
            None => Target::Fixed(Box::new(NodeClients::new(
                options.url.as_str().into_connection_info()?,
                options.tls.as_ref(),
            )?)),
        };
        // Replies are timed here, not by redis-rs: a late reply must still reach us so an
        // acquire that succeeded after its caller gave up can be cleaned up.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(None);
        Ok(Self {
            target,
            tls: options.tls.clone(),
            resp2_only: AtomicBool::new(false),
            config,
            connect_timeout,
            command_timeout,
            liveness,
            state: Mutex::new(State::Idle),
            generation: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            checked_eviction: AtomicBool::new(false),
            driver_id,
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }

    /// The Sentinel epoch now (0 without Sentinel).
    fn epoch(&self) -> u64 {
        match &self.target {
            Target::Sentinel(sentinel) => sentinel.epoch(),
            Target::Fixed(_) | Target::Cluster(_) => 0,
        }
    }

    /// Why nothing more is to be sent on `conn`, if so: it closed, or it is to a node that
    /// is no longer the primary or whose failover began (Sentinel's rule, decision 0051).
    fn stale(&self, conn: &Conn) -> Result<(), RedisFailure> {
        if conn.is_closed() {
            return Err(RedisFailure::new(
                RedisErrorCode::ConnectionFailed,
                Outcome::NotSubmitted,
                crate::error::CONNECTION_HAD_CLOSED,
            ));
        }
        match &self.target {
            Target::Sentinel(sentinel) => sentinel.admits(conn.epoch, conn.opened),
            Target::Fixed(_) | Target::Cluster(_) => Ok(()),
        }
    }

    fn is_stale(&self, conn: &Conn) -> bool {
        self.stale(conn).is_err()
    }

    /// Changes of primary (Sentinel): the subscription follows them. None without Sentinel.
    pub fn primary_switches(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        match &self.target {
            Target::Sentinel(sentinel) => Some(sentinel.switches()),
            Target::Fixed(_) | Target::Cluster(_) => None,
        }
    }

    /// Connections found dead by a liveness PING since the start (decision 0172).
    pub fn dead_connections(&self) -> u64 {
        self.liveness.deaths()
    }

    /// Changes of primary seen since the start (0 without Sentinel).
    pub fn primary_switch_count(&self) -> u64 {
        self.epoch()
    }

    /// The shared connection, opened on first use. The connect runs in its own task, so it
    /// goes on (bounded by connectTimeoutMs) when every caller stopped waiting for it: a
    /// waiter whose wait ended leaves it to the next caller, never half-done (decision 0004).
    pub async fn connection(self: &Arc<Self>) -> Result<Conn, RedisFailure> {
        let attempt = {
            let mut state = self.state();
            match &*state {
                State::Connected(conn) if !self.is_stale(conn) => {
                    self.keep_learning(conn);
                    return Ok(conn.clone());
                }
                State::Connecting(_, attempt) => attempt.clone(),
                // Nothing open, or the open one was announced closed: connect anew.
                State::Idle | State::Connected(_) => {
                    let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
                    let link = self.clone();
                    let task = tokio::spawn(async move {
                        let result = link.clone().open(generation).await;
                        link.connected(generation, &result);
                        result
                    });
                    let attempt = async move {
                        task.await.unwrap_or_else(|_| {
                            Err(RedisFailure::new(
                                RedisErrorCode::ConnectionFailed,
                                Outcome::NotSubmitted,
                                "an internal error ended the connect",
                            ))
                        })
                    }
                    .boxed()
                    .shared();
                    *state = State::Connecting(generation, attempt.clone());
                    attempt
                }
            }
        };
        attempt.await
    }

    /// Records how the connect of `generation` ended, unless a newer one replaced it.
    fn connected(&self, generation: u64, result: &Result<Conn, RedisFailure>) {
        let mut state = self.state();
        if matches!(&*state, State::Connecting(g, _) if *g == generation) {
            *state = match result {
                Ok(conn) if !self.closed.load(Ordering::Acquire) => State::Connected(conn.clone()),
                _ => State::Idle,
            };
        }
    }

    async fn open(self: Arc<Self>, generation: u64) -> Result<Conn, RedisFailure> {
        let opened = Instant::now();
        let closed = Arc::new(AtomicBool::new(false));
        let connect = async {
            match &self.target {
                Target::Cluster(nodes) => {
                    let conn = nodes
                        .open_commands_learned(self.command_timeout)
                        .await
                        .map_err(|e| RedisFailure::connect(&e))?;
                    Ok((Handle::Cluster(conn), 0))
                }
                Target::Fixed(node) => {
                    let info = node.resp2.get_connection_info();
                    let handle = if self.tls.is_none() && lane::fits(info) && lanes_enabled() {
                        lane::Lane::open(info, closed.clone()).await.map(Handle::Lane)
                    } else {
                        self.open_single(node, &closed).await.map(Handle::Single)
                    };
                    Ok((handle.map_err(|e| RedisFailure::connect(&e))?, 0))
                }
                Target::Sentinel(sentinel) => self.open_primary(sentinel, &closed).await,
            }
        };
        let (inner, epoch) = match tokio::time::timeout(self.connect_timeout, connect).await {
            Err(_) => return Err(RedisFailure::connect_timeout()),
            Ok(Err(failure)) => return Err(failure),
            Ok(Ok(opened)) => opened,
        };
        if !self.checked_eviction.swap(true, Ordering::AcqRel) {
            tokio::spawn(eviction::check_eviction_policy(self.clone(), inner.clone()));
        }
        let activity = Arc::new(match inner {
            Handle::Single(_) | Handle::Lane(_) => liveness::Activity::new(),
            Handle::Cluster(_) => liveness::Activity::per_interval(),
        });
        self.watch_liveness(&activity, &inner, &closed);
        Ok(Conn { inner, generation, epoch, closed, opened, activity })
    }

    /// PINGs the connection whenever it has been quiet for pingIntervalMs; one unanswered
    /// within commandTimeoutMs marks it closed, so the next command opens a new one instead
    /// of being handed to a flow a middlebox dropped. A Cluster connection asks every node,
    /// once per interval: an I/O error there is one node redis-rs reconnects itself, not a
    /// dead flow.
    fn watch_liveness(
        &self,
        activity: &Arc<liveness::Activity>,
        handle: &Handle,
        closed: &Arc<AtomicBool>,
    ) {
        let (handle, timeout, flag) = (handle.clone(), self.liveness.timeout, closed.clone());
        let ping = move || {
            let mut handle = handle.clone();
            async move {
                match &mut handle {
                    Handle::Cluster(conn) => {
                        Answer::of(timeout, cluster::ping_nodes(conn), false).await
                    }
                    one_node => Answer::of(timeout, one_node.send(&redis::cmd("PING")), true).await,
                }
            }
        };
        let liveness = self.liveness.clone();
        liveness::spawn_watch(activity, liveness, ping, move || {
            flag.store(true, Ordering::Release)
        });
    }

    /// The primary Sentinel names, confirmed by ROLE on the connection that will carry the
    /// commands. Asked again when the primary changed while this connected.
    async fn open_primary(
        &self,
        sentinel: &Arc<Sentinel>,
        closed: &Arc<AtomicBool>,
    ) -> Result<(Handle, u64), RedisFailure> {
        loop {
            let began = sentinel.epoch();
            let address = sentinel.primary_address().await?;
            sentinel.admits_address(&address)?;
            let node = sentinel
                .node_info(&address)
                .and_then(|info| NodeClients::new(info, self.tls.as_ref()))
                .map_err(|e| RedisFailure::connect(&e))?;
            let mut conn =
                self.open_single(&node, closed).await.map_err(|e| RedisFailure::connect(&e))?;
            sentinel::confirm_primary(&mut conn).await?;
            if let Some(epoch) = sentinel.confirm(began, &address) {
                sentinel.watch();
                return Ok((Handle::Single(conn), epoch));
            }
        }
    }

    /// A RESP3 connection that announces its own end, or RESP2 where the server has no HELLO.
    async fn open_single(
        &self,
        node: &NodeClients,
        closed: &Arc<AtomicBool>,
    ) -> redis::RedisResult<MultiplexedConnection> {
        if !self.resp2_only.load(Ordering::Acquire) {
            let flag = closed.clone();
            let config = self.config.clone().set_push_sender(move |push: redis::PushInfo| {
                if push.kind == redis::PushKind::Disconnection {
                    flag.store(true, Ordering::Release);
                }
                Ok::<(), std::convert::Infallible>(())
            });
            match node.resp3.get_multiplexed_async_connection_with_config(&config).await {
                // An old server answers HELLO with NOPROTO or "ERR unknown command"; other
                // ERRs (maxclients) say nothing about the protocol.
                Err(err) if is_no_resp3(&err) => self.resp2_only.store(true, Ordering::Release),
                other => return other,
            }
        }
        node.resp2.get_multiplexed_async_connection_with_config(&self.config).await
    }

    /// Drops `conn` if it is still the shared one, so the next command reconnects. Never a
    /// Cluster connection: what failed on one node says nothing of the others, and redis-rs
    /// repairs that node's connection itself (issue 23).
    pub fn forget(&self, conn: &Conn) {
        if !matches!(conn.inner, Handle::Cluster(_)) {
            self.drop_shared(conn);
        }
    }

    /// A command on `key` got no reply within commandTimeoutMs on `conn`. On a single node
    /// the connection is dropped ([`forget`](Self::forget)); in a Cluster it is kept, and
    /// redis-rs is nudged to read the slot map again, in case the key's master stopped
    /// answering and a replica took over (`cluster::ClusterNodes::nudge`).
    pub fn stalled(&self, conn: &Conn, key: &str) {
        self.forget(conn);
        if let (Target::Cluster(nodes), Handle::Cluster(cluster), false) =
            (&self.target, &conn.inner, key.is_empty())
        {
            nodes.nudge(cluster, key, self.command_timeout);
        }
    }

    /// Which WAITs may share a round (issue 11, decision 0142): on a single node, every write
    /// of `conn`; in a Cluster, the writes to keys whose slot (of hash tag `tag`) the same
    /// master served when the slot map was last learned, or to that slot alone before then.
    pub(crate) fn replica_group(&self, conn: &Conn, tag: &str) -> Option<String> {
        let (Target::Cluster(nodes), Handle::Cluster(_)) = (&self.target, &conn.inner) else {
            return None;
        };
        let slot = cluster::slot_of_tag(tag);
        Some(nodes.master_of(slot).unwrap_or_else(|| format!("slot {slot}")))
    }

    fn drop_shared(&self, conn: &Conn) {
        let mut state = self.state();
        if matches!(&*state, State::Connected(c) if c.generation == conn.generation) {
            *state = State::Idle;
        }
    }

    /// Asks the shared connection whether it still answers, after something that may have
    /// closed it too (a subscription lost to an I/O error): a TIME, which changes nothing
    /// and README's least-privilege user may run. No answer within commandTimeoutMs, or the
    /// connection gone: only that connection is forgotten, so the waiters woken next open
    /// a new one instead of sending their attempt on a dead one, where its outcome would be
    /// unknown. Any reply, an error reply included, means it works: it is left alone
    /// (decision 0111). A Cluster connection is never probed (a PING there goes to any
    /// node); false then, and for no connection at all.
    pub(crate) async fn probe(&self) -> bool {
        let conn = match &*self.state() {
            State::Connected(conn) if conn.inner.is_one_node() => conn.clone(),
            _ => return false,
        };
        if conn.is_closed() {
            self.forget(&conn);
            return true;
        }
        let mut handle = conn.inner.clone();
        let _carrying = conn.carrying();
        let time = redis::cmd("TIME");
        let answered = match tokio::time::timeout(self.command_timeout, handle.send(&time)).await {
            Ok(Ok(_)) => true,
            // A server's error reply (NOPERM, LOADING, …) still came over this connection.
            Ok(Err(e)) => e.code().is_some(),
            Err(_) => false,
        };
        if !answered {
            self.forget(&conn);
        }
        true
    }

    /// Gives up on `conn` for good (a command on it stalled past our own limit): the next
    /// command opens a new connection, and nothing more is sent on this one by anyone still
    /// holding it (it would only queue behind the stalled command); that is reported as
    /// surely not submitted.
    pub fn give_up(&self, conn: &Conn) {
        if !matches!(conn.inner, Handle::Cluster(_)) {
            conn.closed.store(true, Ordering::Release);
            self.forget(conn);
        }
    }

    /// A Cluster connection that reached no node at all: the next command builds a new one
    /// from every node known, where redis-rs would go back to the URL's seeds alone.
    fn lost_cluster(&self, conn: &Conn) {
        if matches!(conn.inner, Handle::Cluster(_)) {
            self.drop_shared(conn);
        }
    }

    /// Refreshes the learned Cluster nodes now and then, in the background, so the ways
    /// back in follow a Cluster whose nodes are replaced.
    fn keep_learning(self: &Arc<Self>, conn: &Conn) {
        if let (Target::Cluster(nodes), Handle::Cluster(cluster)) = (&self.target, &conn.inner) {
            if nodes.claim_learning() {
                let (link, cluster) = (self.clone(), cluster.clone());
                tokio::spawn(async move {
                    if let Target::Cluster(nodes) = &link.target {
                        nodes.learn(&cluster).await;
                    }
                });
            }
        }
    }

    /// Closes the shared connection; commands still in flight keep their own handle.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        *self.state() = State::Idle;
        if let Target::Sentinel(sentinel) = &self.target {
            sentinel.stop();
        }
    }
}

impl Drop for RedisLink {
    fn drop(&mut self) {
        if let Target::Sentinel(sentinel) = &self.target {
            sentinel.stop();
        }
    }
}

fn is_no_resp3(err: &redis::RedisError) -> bool {
    match err.code() {
        Some("NOPROTO") => true,
        Some("ERR") => {
            err.detail().is_some_and(|d| d.to_ascii_lowercase().contains("unknown command"))
        }
        _ => false,
    }
}
