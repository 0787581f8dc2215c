//! A Cluster reached through any node it has (issue 23): the seed nodes the URL lists and
//! every node learned from the Cluster since are all ways back in, so no single node's
//! death keeps the driver out. The Cluster connection itself is never dropped for what
//! happened on one node (redis-rs repairs that node's connection and refreshes its slot map
//! from the others); only when it has no node left is a new one built, from all of them.
//!
//! Node connections skip `CLIENT SETINFO` like every other connection (decision 0075):
//! redis-rs builds a Cluster's node connections itself, so they are made by [`QuietNode`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::FutureExt;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::Connect;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisFuture,
    Value,
};

use super::quiet;
use super::tls::certificates;
use crate::options::TlsOptions;

/// The Cluster connection type every Cluster handle uses.
pub(crate) type ClusterConn = redis::cluster_async::ClusterConnection<QuietNode>;

/// How many learned nodes are kept: a Cluster's nodes, with room for replaced ones.
const MAX_LEARNED: usize = 64;
/// How often the slot map is asked for again while commands flow.
const RELEARN_EVERY: Duration = Duration::from_secs(10);

/// One PING to every node of the slot map, replicas too (a master that failed over and
/// came back as a replica may still hold a flow), each on the connection the Cluster
/// connection keeps to it (liveness, decision 0172).
pub(crate) async fn ping_nodes(conn: &mut ClusterConn) -> redis::RedisResult<Value> {
    let every_node = RoutingInfo::MultiNode((
        MultipleNodeRoutingInfo::AllNodes,
        Some(ResponsePolicy::AllSucceeded),
    ));
    conn.route_command(redis::cmd("PING"), every_node).await
}

/// One node's multiplexed connection, opened without `CLIENT SETINFO`.
#[derive(Clone)]
pub(crate) struct QuietNode(MultiplexedConnection);

impl ConnectionLike for QuietNode {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, Value> {
        self.0.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.0.req_packed_commands(cmd, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
    }
}

impl Connect for QuietNode {
    fn connect_with_config<'a, T>(info: T, config: AsyncConnectionConfig) -> RedisFuture<'a, Self>
    where
        T: IntoConnectionInfo + Send + 'a,
    {
        async move {
            let client = Client::open(quiet(info.into_connection_info()?))?;
            Ok(QuietNode(client.get_multiplexed_async_connection_with_config(&config).await?))
        }
        .boxed()
    }
}

/// The nodes of one Cluster this driver knows.
pub(crate) struct ClusterNodes {
    /// The nodes the URL lists, in its order (they hold the password).
    seeds: Vec<ConnectionInfo>,
    /// `host:port` of every node learned from the Cluster's slot map since.
    learned: Mutex<Vec<(String, u16)>>,
    /// Which master served which slots when the map was last learned: `(first, last,
    /// host:port)`. Only groups WAITs by node (decision 0142); redis-rs routes by its own map.
    masters: Mutex<Vec<(u16, u16, String)>>,
    last_learned: Mutex<Option<Instant>>,
    /// When the slot map was last nudged after a stall ([`ClusterNodes::nudge`]).
    last_nudged: Mutex<Option<Instant>>,
    tls: Option<TlsOptions>,
    connect_timeout: Duration,
    /// Where the next classic subscription connection starts looking.
    next_subscriber: AtomicUsize,
}

impl ClusterNodes {
    pub(super) fn new(
        seeds: &[String],
        tls: Option<&TlsOptions>,
        connect_timeout: Duration,
    ) -> redis::RedisResult<Self> {
        let seeds = seeds
            .iter()
            .map(|url| url.as_str().into_connection_info().map(quiet))
            .collect::<Result<Vec<_>, _>>()?;
        if seeds.is_empty() {
            return Err((redis::ErrorKind::InvalidClientConfig, "no Cluster node").into());
        }
        let nodes = Self {
            seeds,
            learned: Mutex::new(Vec::new()),
            masters: Mutex::new(Vec::new()),
            last_learned: Mutex::new(None),
            last_nudged: Mutex::new(None),
            tls: tls.cloned(),
            connect_timeout,
            next_subscriber: AtomicUsize::new(0),
        };
        // Checked now, so a bad setting is INVALID_OPTIONS at creation, not a failed connect.
        nodes.builder().build()?;
        Ok(nodes)
    }

    /// Every node known: the seeds, then the learned ones, each once.
    pub(super) fn all(&self) -> Vec<ConnectionInfo> {
        let mut all = self.seeds.clone();
        let template = &self.seeds[0];
        for (host, port) in crate::sync::lock(&self.learned).iter() {
            let addr = match template.addr() {
                ConnectionAddr::TcpTls { insecure, tls_params, .. } => ConnectionAddr::TcpTls {
                    host: host.clone(),
                    port: *port,
                    insecure: *insecure,
                    tls_params: tls_params.clone(),
                },
                _ => ConnectionAddr::Tcp(host.clone(), *port),
            };
            if !all.iter().any(|known| known.addr().to_string() == addr.to_string()) {
                all.push(template.clone().set_addr(addr));
            }
        }
        all
    }

    /// A client for every node known, with the URL's settings and TLS material.
    fn builder(&self) -> ClusterClientBuilder {
        let mut builder =
            ClusterClient::builder(self.all()).connection_timeout(self.connect_timeout);
        if let Some(certificates) = self.tls.as_ref().map(certificates) {
            builder = builder.certs(certificates);
        }
        builder
    }

    /// The connection for commands. No retries: redis-rs would resend a command after an
    /// I/O error, and a command with an unsettled outcome is never retried (redirects are
    /// followed in `eval`). Replies are waited for commandTimeoutMs, as by the callers, and
    /// that bound matters for what redis-rs sends itself: its slot-map refresh asks the known
    /// nodes one by one under a lock every command waits for, and without a bound a
    /// SIGSTOPped node held it, and every shard, for as long as it stayed stopped
    /// (`tests/cluster.rs` `a_stopped_url_node_…`).
    pub(super) async fn open_commands(
        &self,
        command_timeout: Duration,
    ) -> redis::RedisResult<ClusterConn> {
        let client = self.builder().retries(0).response_timeout(command_timeout).build()?;
        client.get_async_generic_connection::<QuietNode>().await
    }

    /// [`open_commands`](Self::open_commands), then the slot map learned; when it named
    /// nodes the connection was not built with (the first connect knows only the seeds), the
    /// connection is built again from every node known. redis-rs reconnects from a
    /// connection's initial nodes when it finds none it can use, and from the seeds alone
    /// that fails for as long as they are down or stopped, whatever the other nodes do.
    pub(super) async fn open_commands_learned(
        &self,
        command_timeout: Duration,
    ) -> redis::RedisResult<ClusterConn> {
        let first = self.open_commands(command_timeout).await?;
        let built_with = self.all().len();
        self.learn(&first).await;
        if self.all().len() == built_with {
            return Ok(first);
        }
        Ok(self.open_commands(command_timeout).await.unwrap_or(first))
    }

    /// A RESP3 connection for sharded subscriptions, its pushes sent to `pushes`. Unlike
    /// scripts, SSUBSCRIBE is safe to resend: redis-rs may follow MOVED and retry.
    pub(super) async fn open_sharded(
        &self,
        command_timeout: Duration,
        pushes: tokio::sync::mpsc::UnboundedSender<redis::PushInfo>,
    ) -> redis::RedisResult<ClusterConn> {
        let client = self
            .builder()
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(pushes)
            .response_timeout(command_timeout)
            .build()?;
        client.get_async_generic_connection::<QuietNode>().await
    }

    /// The nodes to try for a classic subscription, starting after the last one tried, so
    /// that a dead node is not the first choice twice in a row.
    pub(super) fn subscriber_candidates(&self) -> Vec<ConnectionInfo> {
        let mut all = self.all();
        let start = self.next_subscriber.fetch_add(1, Ordering::Relaxed) % all.len();
        all.rotate_left(start);
        all
    }

    /// True, once per [`RELEARN_EVERY`], for the one caller that is to learn again: checked
    /// and claimed under one lock, so the callers of a busy moment start one refresh, not one
    /// each.
    pub(super) fn claim_learning(&self) -> bool {
        let mut last = crate::sync::lock(&self.last_learned);
        if last.is_some_and(|at| at.elapsed() < RELEARN_EVERY) {
            return false;
        }
        *last = Some(Instant::now());
        true
    }

    /// Learns the Cluster's nodes from its slot map, asked of any node `conn` has. Best
    /// effort: a failure leaves what was known.
    pub(super) async fn learn(&self, conn: &ClusterConn) {
        *crate::sync::lock(&self.last_learned) = Some(Instant::now());
        let mut conn = conn.clone();
        let asked = conn.route_command(
            redis::cmd("CLUSTER").arg("SLOTS").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        );
        if let Ok(Ok(reply)) = tokio::time::timeout(self.connect_timeout, asked).await {
            let masters = masters_of_slots(&reply);
            if !masters.is_empty() {
                *crate::sync::lock(&self.masters) = masters;
            }
            let found = nodes_in_slots(&reply);
            if !found.is_empty() {
                let mut learned = crate::sync::lock(&self.learned);
                for node in found {
                    if !learned.contains(&node) {
                        learned.push(node);
                    }
                }
                // The oldest go first: a node replaced long ago is the least likely way in.
                let excess = learned.len().saturating_sub(MAX_LEARNED);
                learned.drain(..excess);
            }
        }
    }
}

/// How often a stall may nudge redis-rs into reading the slot map again.
const NUDGE_EVERY: Duration = Duration::from_secs(1);

impl ClusterNodes {
    /// After a command on `key` got no reply within commandTimeoutMs. redis-rs reads the
    /// slot map again only on a MOVED or a lost connection, and a master that stopped
    /// answering without closing its socket (SIGSTOP, a hung host) gives neither: after its
    /// replica took over, its slots would still be sent to it for as long as it stayed
    /// stopped (`tests/cluster.rs` `a_stopped_url_node_…`). So the key's PTTL (README's ACL
    /// rule grants it; no write) is sent, routed by redis-rs's own map, to the master of a
    /// slot another master serves: that one answers MOVED, which makes redis-rs refresh
    /// its map. Not by address: an address redis-rs holds no connection to fails as "no
    /// connection found", and redis-rs answers that by reconnecting every node from its
    /// initial ones. At most once per [`NUDGE_EVERY`]; nobody waits for the answer.
    pub(super) fn nudge(&self, conn: &ClusterConn, key: &str, timeout: Duration) {
        let Some(tag) = key.split_once('{').and_then(|(_, rest)| rest.split_once('}')) else {
            return;
        };
        {
            let mut last = crate::sync::lock(&self.last_nudged);
            if last.is_some_and(|at| at.elapsed() < NUDGE_EVERY) {
                return;
            }
            *last = Some(Instant::now());
        }
        let slot = slot_of_tag(tag.0);
        let elsewhere = {
            let masters = crate::sync::lock(&self.masters);
            let owner = masters.iter().find(|(first, last, _)| (*first..=*last).contains(&slot));
            masters
                .iter()
                .find(|(_, _, node)| owner.is_none_or(|o| &o.2 != node))
                .map(|(first, _, _)| *first)
        };
        // Before the map was learned: the opposite half of the slots, another master in any
        // Cluster of several; if it is the same one, it answers and nothing is lost.
        let elsewhere = elsewhere.unwrap_or((slot + 8192) % 16384);
        let mut conn = conn.clone();
        let ask = redis::cmd("PTTL").arg(key).clone();
        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
            elsewhere,
            SlotAddr::Master,
        )));
        tokio::spawn(async move {
            let _ = tokio::time::timeout(timeout, conn.route_command(ask, route)).await;
        });
    }

    /// `host:port` of the master that served `slot` when the slot map was last learned.
    pub(super) fn master_of(&self, slot: u16) -> Option<String> {
        let masters = crate::sync::lock(&self.masters);
        masters
            .iter()
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
            .map(|m| m.2.clone())
    }
}

/// The Cluster slot of a key whose hash tag holds `tag` (redis-rs's CRC16, XMODEM).
pub(crate) fn slot_of_tag(tag: &str) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes()) % 16384
}

/// `(first, last, host:port)` of each slot range's master in a `CLUSTER SLOTS` reply.
fn masters_of_slots(reply: &Value) -> Vec<(u16, u16, String)> {
    let Value::Array(ranges) = reply else { return Vec::new() };
    let slot = |v: Option<&Value>| match v {
        Some(Value::Int(n)) => u16::try_from(*n).ok(),
        _ => None,
    };
    ranges
        .iter()
        .filter_map(|range| {
            let Value::Array(parts) = range else { return None };
            let (first, last) = (slot(parts.first())?, slot(parts.get(1))?);
            let master = nodes_in_slots(&Value::Array(vec![range.clone()])).into_iter().next()?;
            Some((first, last, format!("{}:{}", master.0, master.1)))
        })
        .collect()
}

/// `host:port` of each node in a `CLUSTER SLOTS` reply: `[[start, end, [host, port, id…],
/// replicas…], …]`. An empty host (the node asked, by its own account) is skipped.
fn nodes_in_slots(reply: &Value) -> Vec<(String, u16)> {
    let Value::Array(ranges) = reply else { return Vec::new() };
    let mut nodes = Vec::new();
    for range in ranges {
        let Value::Array(parts) = range else { continue };
        for node in parts.iter().skip(2) {
            let Value::Array(fields) = node else { continue };
            let host = match fields.first() {
                Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                Some(Value::SimpleString(s)) => s.clone(),
                _ => continue,
            };
            let port = match fields.get(1) {
                Some(Value::Int(p)) => u16::try_from(*p).ok(),
                _ => None,
            };
            if let (false, Some(port)) = (host.is_empty() || host == "?", port) {
                if !nodes.contains(&(host.clone(), port)) {
                    nodes.push((host, port));
                }
            }
        }
    }
    nodes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    #[test]
    fn the_slot_map_names_every_master_and_replica_once() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("10.0.0.1", 7000),
                node("10.0.0.4", 7003),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(10922),
                node("10.0.0.2", 7001),
                node("", 7004),
            ]),
            Value::Array(vec![Value::Int(10923), Value::Int(16383), node("10.0.0.1", 7000)]),
        ]);
        assert_eq!(
            nodes_in_slots(&reply),
            [
                ("10.0.0.1".to_owned(), 7000),
                ("10.0.0.4".to_owned(), 7003),
                ("10.0.0.2".to_owned(), 7001)
            ]
        );
        assert!(nodes_in_slots(&Value::Nil).is_empty());
        assert_eq!(
            masters_of_slots(&reply),
            [
                (0, 5460, "10.0.0.1:7000".to_owned()),
                (5461, 10922, "10.0.0.2:7001".to_owned()),
                (10923, 16383, "10.0.0.1:7000".to_owned())
            ]
        );
    }

    #[test]
    fn a_keys_slot_is_the_one_redis_gives_its_hash_tag() {
        // CLUSTER KEYSLOT answers, on Redis 7.0: "{123456789}" -> 12739, "x{foo}y" -> 12182.
        assert_eq!(slot_of_tag("123456789"), 12739);
        assert_eq!(slot_of_tag("foo"), 12182);
        let nodes =
            ClusterNodes::new(&["redis://h1:7000".to_owned()], None, Duration::from_secs(1))
                .unwrap();
        assert_eq!(nodes.master_of(12182), None, "nothing learned yet");
        *nodes.masters.lock().unwrap() = vec![(0, 8191, "a:1".into()), (8192, 16383, "b:2".into())];
        assert_eq!(nodes.master_of(8191).as_deref(), Some("a:1"));
        assert_eq!(nodes.master_of(12182).as_deref(), Some("b:2"));
    }

    #[test]
    fn learned_nodes_follow_the_seeds_with_their_settings() {
        let nodes = ClusterNodes::new(
            &["redis://:pw@h1:7000/0".to_owned(), "redis://:pw@h2:7000/0".to_owned()],
            None,
            Duration::from_secs(1),
        )
        .unwrap();
        nodes.learned.lock().unwrap().extend([("h2".to_owned(), 7000), ("h3".to_owned(), 7001)]);
        let all = nodes.all();
        let addrs: Vec<String> = all.iter().map(|n| n.addr().to_string()).collect();
        assert_eq!(addrs, ["h1:7000", "h2:7000", "h3:7001"]);
        assert_eq!(all[2].redis_settings().password(), Some("pw"));
        assert!(all[2].redis_settings().skip_set_lib_name());
        assert!(nodes.claim_learning(), "never learned: due");
        assert!(!nodes.claim_learning(), "claimed a moment ago: one refresh, not two");
        let first = nodes.subscriber_candidates()[0].addr().to_string();
        let second = nodes.subscriber_candidates()[0].addr().to_string();
        assert_ne!(first, second, "a second subscription starts at another node");
    }
}
