//! One lazily opened, multiplexed Redis connection per backend (or one Cluster connection),
//! and script calls on it.
//!
//! Failures are classified where they happen: a connect that fails sent nothing
//! (`not-submitted`); once a command is queued on the multiplexed connection, redis-rs
//! cannot say whether Redis saw it, so an I/O failure there is `unknown` (decision 0003).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, FutureExt, Shared};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Client, IntoConnectionInfo, ProtocolVersion, Value};

use crate::error::{LockError, LockErrorCode, Outcome, RedisErrorCode, RedisFailure};
use crate::events;
use crate::options::{ConnectionOptions, TlsOptions};
use crate::scripts::LuaScript;
use crate::sentinel::{self, Sentinel, SentinelAuth};

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
}

impl Conn {
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Tells connections apart, e.g. to share one WAIT among writes of the same one (issue 11).
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

#[derive(Clone)]
enum Handle {
    Single(MultiplexedConnection),
    /// Routes each script by its first key's slot; both lock keys share a hash tag.
    Cluster(ClusterConnection),
}

impl Handle {
    async fn send(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<Value> {
        match self {
            Handle::Single(conn) => conn.send_packed_command(cmd).await,
            Handle::Cluster(conn) => conn.req_packed_command(cmd).await,
        }
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
}

pub struct RedisLink {
    target: Target,
    tls: Option<TlsOptions>,
    /// The server refused HELLO 3 (Redis < 6): commands use the RESP2 client.
    resp2_only: AtomicBool,
    cluster: Option<ClusterClient>,
    /// Where sharded subscriptions start (the URL of a Cluster node; holds a password,
    /// never printed).
    cluster_url: Option<String>,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
    pub command_timeout: Duration,
    state: Mutex<State>,
    generation: AtomicU64,
    /// After shutdown, late cleanups still connect but nothing is kept open.
    closed: AtomicBool,
    checked_eviction: AtomicBool,
    driver_id: u64,
}

/// A script with its keys and arguments, ready to send.
pub struct ScriptCall {
    pub script: &'static LuaScript,
    pub keys: Vec<String>,
    pub args: Vec<String>,
}

impl ScriptCall {
    fn command(&self, by_sha: bool) -> redis::Cmd {
        let (name, script) =
            if by_sha { ("EVALSHA", self.script.sha()) } else { ("EVAL", self.script.source) };
        // Sized up front: grown argument by argument, the command's buffers were reallocated
        // several times per call on the runtime's thread (docs/perf/README.md).
        let data = name.len()
            + script.len()
            + 20
            + self.keys.iter().chain(&self.args).map(String::len).sum::<usize>();
        let mut cmd = redis::Cmd::with_capacity(3 + self.keys.len() + self.args.len(), data);
        cmd.arg(name).arg(script).arg(self.keys.len()).arg(&self.keys).arg(&self.args);
        cmd
    }
}

impl RedisLink {
    /// Fails INVALID_OPTIONS naming the field at fault: the URL, or a TLS PEM.
    pub fn new(options: &ConnectionOptions, driver_id: u64) -> Result<Self, LockError> {
        let url = options.url.to_ascii_lowercase();
        if url.starts_with("rediss://") || url.starts_with("rediss-sentinel://") {
            install_crypto_provider();
        }
        if let Some(tls) = &options.tls {
            check_pems(tls)?;
        }
        Self::build(options, driver_id).map_err(|_| {
            LockError::new(LockErrorCode::InvalidOptions, "connection.url is not a valid Redis URL")
        })
    }

    fn build(options: &ConnectionOptions, driver_id: u64) -> Result<Self, redis::RedisError> {
        let connect_timeout = Duration::from_millis(options.connect_timeout_ms.into());
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
                )?))
            }
            None => Target::Fixed(Box::new(NodeClients::new(
                options.url.as_str().into_connection_info()?,
                options.tls.as_ref(),
            )?)),
        };
        let cluster = if options.cluster {
            // No retries: redis-rs would resend a command after an I/O error, and a command
            // with an unsettled outcome is never retried (redirects are handled in `eval`).
            let mut builder = ClusterClient::builder(vec![options.url.as_str()])
                .retries(0)
                .connection_timeout(connect_timeout);
            if let Some(certificates) = options.tls.as_ref().map(certificates) {
                builder = builder.certs(certificates);
            }
            Some(builder.build()?)
        } else {
            None
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
            cluster,
            cluster_url: options.cluster.then(|| options.url.clone()),
            config,
            connect_timeout,
            command_timeout,
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
            Target::Fixed(_) => 0,
        }
    }

    /// Closed, or connected to a node that is no longer the primary: nothing more is sent
    /// on it.
    fn is_stale(&self, conn: &Conn) -> bool {
        conn.is_closed()
            || match &self.target {
                Target::Sentinel(sentinel) => {
                    conn.epoch != sentinel.epoch() || sentinel.holds(conn.epoch, conn.opened)
                }
                Target::Fixed(_) => false,
            }
    }

    /// Changes of primary (Sentinel): the subscription follows them. None without Sentinel.
    pub fn primary_switches(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        match &self.target {
            Target::Sentinel(sentinel) => Some(sentinel.switches()),
            Target::Fixed(_) => None,
        }
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
                State::Connected(conn) if !self.is_stale(conn) => return Ok(conn.clone()),
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
            match (&self.target, &self.cluster) {
                (_, Some(cluster)) => Ok((
                    Handle::Cluster(
                        cluster
                            .get_async_connection()
                            .await
                            .map_err(|e| RedisFailure::connect(&e))?,
                    ),
                    0,
                )),
                (Target::Fixed(node), None) => Ok((
                    Handle::Single(
                        self.open_single(node, &closed)
                            .await
                            .map_err(|e| RedisFailure::connect(&e))?,
                    ),
                    0,
                )),
                (Target::Sentinel(sentinel), None) => self.open_primary(sentinel, &closed).await,
            }
        };
        let (inner, epoch) = match tokio::time::timeout(self.connect_timeout, connect).await {
            Err(_) => return Err(RedisFailure::connect_timeout()),
            Ok(Err(failure)) => return Err(failure),
            Ok(Ok(opened)) => opened,
        };
        if !self.checked_eviction.swap(true, Ordering::AcqRel) {
            tokio::spawn(check_eviction_policy(self.clone(), inner.clone()));
        }
        Ok(Conn { inner, generation, epoch, closed, opened })
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
            if sentinel.is_held(&address) {
                return Err(sentinel::failover_in_progress());
            }
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

    /// Drops `conn` if it is still the shared one, so the next command reconnects.
    pub fn forget(&self, conn: &Conn) {
        let mut state = self.state();
        if matches!(&*state, State::Connected(c) if c.generation == conn.generation) {
            *state = State::Idle;
        }
    }

    /// Gives up on `conn` for good (a command on it stalled past our own limit): the next
    /// command opens a new connection, and nothing more is sent on this one by anyone still
    /// holding it (it would only queue behind the stalled command); that is reported as
    /// surely not submitted.
    pub fn give_up(&self, conn: &Conn) {
        conn.closed.store(true, Ordering::Release);
        self.forget(conn);
    }

    /// Drops the shared connection, whichever it is: the next command opens a new one.
    pub fn forget_current(&self) {
        let mut state = self.state();
        if matches!(&*state, State::Connected(_)) {
            *state = State::Idle;
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

    /// A dedicated connection subscribed to `channel`, confirmed by the server.
    /// With Sentinel: on the node Sentinel names now (no ROLE check: a subscription on the
    /// wrong node only misses notifications, and it moves at the next change of primary).
    pub async fn subscribe(
        &self,
        channel: &str,
    ) -> Result<redis::aio::PubSubStream, SubscribeFailure> {
        let resolved = AtomicBool::new(matches!(self.target, Target::Fixed(_)));
        let connect = async {
            let mut pubsub = self.pubsub_connection(&resolved).await?;
            pubsub.subscribe(channel).await.map_err(|e| {
                let failure = RedisFailure::command(&e);
                if refuses_subscribe(&e) {
                    SubscribeFailure::Unsupported(failure)
                } else {
                    SubscribeFailure::Failed(failure)
                }
            })?;
            Ok(pubsub.into_on_message())
        };
        let outcome =
            tokio::time::timeout(self.connect_timeout + self.command_timeout, connect).await;
        outcome.unwrap_or_else(|_| Err(subscribe_timeout(&resolved)))
    }

    /// A dedicated connection for subscriptions, not yet subscribed to anything (per-key
    /// notifications subscribe and unsubscribe on it as keys come and go): on the node the
    /// URL names (a Cluster's classic pub/sub reaches every node), or on the primary
    /// Sentinel names now, as [`subscribe`](Self::subscribe).
    pub async fn open_pubsub(&self) -> Result<redis::aio::PubSub, SubscribeFailure> {
        let resolved = AtomicBool::new(matches!(self.target, Target::Fixed(_)));
        let connect = self.pubsub_connection(&resolved);
        let outcome = tokio::time::timeout(self.connect_timeout, connect).await;
        outcome.unwrap_or_else(|_| Err(subscribe_timeout(&resolved)))
    }

    /// A Cluster connection for sharded subscriptions (SSUBSCRIBE is sent to the node that
    /// owns the channel's slot), speaking RESP3 so that messages, the server's own
    /// `sunsubscribe` at a slot move, and a node connection's end arrive as pushes on the
    /// returned receiver. None without `cluster: true`.
    pub async fn open_shard_pubsub(
        &self,
    ) -> Option<Result<(ClusterConnection, ShardPushes), SubscribeFailure>> {
        let url = self.cluster_url.as_deref()?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        // Unlike scripts, SSUBSCRIBE is safe to resend: redis-rs may follow MOVED and retry.
        let mut builder = ClusterClient::builder(vec![url])
            .use_protocol(ProtocolVersion::RESP3)
            .push_sender(tx)
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.command_timeout);
        if let Some(certificates) = self.tls.as_ref().map(certificates) {
            builder = builder.certs(certificates);
        }
        let opened = async {
            let client = builder.build().map_err(|e| RedisFailure::connect(&e))?;
            client.get_async_connection().await.map_err(|e| RedisFailure::connect(&e))
        };
        Some(match tokio::time::timeout(self.connect_timeout, opened).await {
            Err(_) => Err(SubscribeFailure::Failed(RedisFailure::connect_timeout())),
            Ok(Err(failure)) => Err(SubscribeFailure::Failed(failure)),
            Ok(Ok(conn)) => Ok((conn, rx)),
        })
    }

    async fn pubsub_connection(
        &self,
        resolved: &AtomicBool,
    ) -> Result<redis::aio::PubSub, SubscribeFailure> {
        let client = match &self.target {
            Target::Fixed(node) => node.resp2.clone(),
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

    /// Known dead, or no longer to be used for the primary, before anything was handed to
    /// it: the connection is dropped and the command fails as surely not sent.
    fn refuse_if_stale(&self, conn: &Conn) -> Result<(), RedisFailure> {
        if !self.is_stale(conn) {
            return Ok(());
        }
        self.forget(conn);
        let message = if conn.is_closed() {
            "the connection to Redis had closed"
        } else if conn.epoch == self.epoch() {
            "Sentinel is failing the primary over"
        } else {
            "the primary changed before the command was sent"
        };
        Err(RedisFailure::new(RedisErrorCode::ConnectionFailed, Outcome::NotSubmitted, message))
    }

    /// Runs a script by EVALSHA, and once by EVAL when the server lacks it (NOSCRIPT).
    /// Not timed: callers decide how long to wait, and may keep waiting for a late reply.
    pub async fn eval(&self, conn: &Conn, call: &ScriptCall) -> Result<Value, RedisFailure> {
        self.refuse_if_stale(conn)?;
        let mut inner = conn.inner.clone();
        let mut reply = send(&mut inner, &call.command(true)).await;
        // A MOVED reply means the node did not run it, so sending it again is no retry of
        // an unsettled command. redis-rs refreshes its slot map on MOVED; give it a moment.
        for pause_ms in [0, 10, 50] {
            if !matches!(&reply, Err(f) if f.server_code.as_deref() == Some("MOVED")) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(pause_ms)).await;
            reply = send(&mut inner, &call.command(true)).await;
        }
        if matches!(&reply, Err(f) if f.is_no_script()) {
            reply = send(&mut inner, &call.command(false)).await;
        }
        if matches!(&reply, Err(f) if !f.surely_not_applied()) {
            self.forget(conn);
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
        let reply = send(&mut conn.inner.clone(), cmd).await;
        if matches!(&reply, Err(f) if !f.surely_not_applied()) {
            self.forget(conn);
        }
        reply
    }

    /// Connects if needed, then runs the script within commandTimeoutMs. Also returns the
    /// moment the command was submitted, where lease deadlines start.
    pub async fn run(
        self: &Arc<Self>,
        call: &ScriptCall,
    ) -> Result<(Value, Instant), RedisFailure> {
        self.run_on(call).await.map(|(value, submitted, _)| (value, submitted))
    }

    /// [`run`](Self::run), also returning the connection that ran it (for WAIT, issue 11).
    pub async fn run_on(
        self: &Arc<Self>,
        call: &ScriptCall,
    ) -> Result<(Value, Instant, Conn), RedisFailure> {
        let conn = self.connection().await?;
        let submitted = Instant::now();
        match tokio::time::timeout(self.command_timeout, self.eval(&conn, call)).await {
            Ok(reply) => reply.map(|v| (v, submitted, conn)),
            Err(_) => {
                // Later commands would queue behind the stalled one on this connection.
                self.forget(&conn);
                Err(RedisFailure::command_timeout())
            }
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

/// The pushes of a sharded subscription connection.
pub type ShardPushes = tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>;

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

fn is_no_resp3(err: &redis::RedisError) -> bool {
    match err.code() {
        Some("NOPROTO") => true,
        Some("ERR") => {
            err.detail().is_some_and(|d| d.to_ascii_lowercase().contains("unknown command"))
        }
        _ => false,
    }
}

/// redis-rs takes rustls's process-wide crypto provider; install ring once if none is.
fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Parses each PEM as redis-rs will, so that a malformed one is reported by its field rather
/// than as a bad URL (the PEM's text is never repeated).
fn check_pems(tls: &TlsOptions) -> Result<(), LockError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certificates = |pem: &str| {
        let parsed: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(pem.as_bytes()).collect();
        parsed.is_ok_and(|certs| !certs.is_empty())
    };
    let bad = |field: &str, what: &str| {
        Err(LockError::new(
            LockErrorCode::InvalidOptions,
            format!("connection.tls.{field} is not {what}"),
        ))
    };
    if tls.ca.as_deref().is_some_and(|ca| !certificates(ca) || !trust_anchors(ca)) {
        return bad("ca", "a valid PEM certificate");
    }
    if tls.cert.as_deref().is_some_and(|cert| !certificates(cert)) {
        return bad("cert", "a valid PEM certificate");
    }
    if tls.key.as_deref().is_some_and(|key| PrivateKeyDer::from_pem_slice(key.as_bytes()).is_err())
    {
        return bad("key", "a valid PEM private key");
    }
    Ok(())
}

/// Every certificate of `ca` is accepted as a trust anchor (as redis-rs requires).
fn trust_anchors(ca: &str) -> bool {
    use rustls::pki_types::pem::PemObject;
    let mut store = rustls::RootCertStore::empty();
    rustls::pki_types::CertificateDer::pem_slice_iter(ca.as_bytes())
        .all(|cert| cert.is_ok_and(|c| store.add(c).is_ok()))
}

fn certificates(tls: &TlsOptions) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: match (&tls.cert, &tls.key) {
            (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                client_cert: cert.as_bytes().to_vec(),
                client_key: key.as_bytes().to_vec(),
            }),
            _ => None,
        },
        root_cert: tls.ca.as_ref().map(|ca| ca.as_bytes().to_vec()),
    }
}

async fn send(conn: &mut Handle, cmd: &redis::Cmd) -> Result<Value, RedisFailure> {
    conn.send(cmd).await.and_then(Value::extract_error).map_err(|e| RedisFailure::command(&e))
}

/// Reads `maxmemory-policy` through INFO (allowed where CONFIG is not) and warns when Redis
/// may evict lock keys. A denied INFO is not an error: the check is advice.
/// In a Cluster, INFO is asked of the node the URL names.
async fn check_eviction_policy(link: Arc<RedisLink>, conn: Handle) {
    let mut info = redis::cmd("INFO");
    info.arg("memory");
    let ask = async {
        let mut conn = match conn {
            Handle::Single(conn) => conn,
            Handle::Cluster(_) => match &link.target {
                Target::Fixed(node) => {
                    node.resp2.get_multiplexed_async_connection_with_config(&link.config).await?
                }
                Target::Sentinel(_) => return Ok(String::new()),
            },
        };
        info.query_async::<String>(&mut conn).await
    };
    let Ok(Ok(info)) = tokio::time::timeout(Duration::from_secs(5), ask).await else { return };
    if let Some(policy) = maxmemory_policy(&info) {
        if policy != "noeviction" {
            events::eviction_unsafe(link.driver_id, policy);
        }
    }
}

pub fn maxmemory_policy(info: &str) -> Option<&str> {
    info.lines().find_map(|line| line.strip_prefix("maxmemory_policy:")).map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_is_read_from_info_memory() {
        let info = "# Memory\r\nused_memory:1\r\nmaxmemory_policy:allkeys-lru\r\nmem_fragmentation_ratio:1.0\r\n";
        assert_eq!(maxmemory_policy(info), Some("allkeys-lru"));
        assert_eq!(maxmemory_policy("# Memory\r\n"), None);
    }
}
