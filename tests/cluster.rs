//! A local 3-master Redis Cluster: locks on keys in different slots, release notifications
//! across nodes, and a slot moved to another node while the driver's map is stale.

mod common;
mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{connection, driver};
use dokebi_lock_redis::Raw;
use support::RedisServer;
use tokio_util::sync::CancellationToken;

fn free_port() -> String {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string()
}

struct Cluster {
    nodes: Vec<RedisServer>,
}

impl Cluster {
    fn start() -> Self {
        Self::start_with_args(&[])
    }

    /// Three masters, each started with `extra` redis-server arguments too.
    fn start_with_args(extra: &[&str]) -> Self {
        Self::start_nodes(3, extra)
    }

    /// `count` nodes: 3 masters, and with 6 a replica of each.
    fn start_nodes(count: usize, extra: &[&str]) -> Self {
        let nodes: Vec<_> = (0..count)
            .map(|_| {
                let port = free_port();
                let mut args = vec![
                    "--cluster-enabled",
                    "yes",
                    "--cluster-port",
                    &port,
                    "--cluster-node-timeout",
                    "2000",
                ];
                args.extend_from_slice(extra);
                RedisServer::start_with_args(&args)
            })
            .collect();
        let addresses: Vec<String> =
            nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", if count == 6 { "1" } else { "0" }, "--cluster-yes"])
            .output()
            .expect("redis-cli runs");
        assert!(out.status.success(), "cluster create: {}", String::from_utf8_lossy(&out.stdout));
        let cluster = Self { nodes };
        let end = Instant::now() + Duration::from_secs(10);
        while !cluster
            .nodes
            .iter()
            .all(|n| n.command(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
        {
            assert!(Instant::now() < end, "the cluster did not become ok");
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
    }

    fn node_id(&self, node: usize) -> String {
        let reply = self.nodes[node].command(&["CLUSTER", "MYID"]);
        reply.lines().nth(1).unwrap().to_owned()
    }

    /// The node serving `key`: the others answer -MOVED.
    fn owner(&self, key: &str) -> usize {
        self.try_owner(key, &[]).expect("some node serves the key")
    }

    /// The node serving `key` among those not in `dead`.
    fn try_owner(&self, key: &str, dead: &[usize]) -> Option<usize> {
        (0..self.nodes.len()).filter(|i| !dead.contains(i)).find(|&i| {
            self.nodes[i]
                .try_command(&["EXISTS", key], Duration::from_secs(1))
                .is_ok_and(|reply| !reply.starts_with('-'))
        })
    }
}

fn slot_of(redis: &RedisServer, key: &str) -> u16 {
    let reply = redis.command(&["CLUSTER", "KEYSLOT", key]);
    reply.trim_start_matches(':').trim().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_work_across_slots_notifications_cross_nodes_and_a_moved_slot_is_followed() {
    if support::external() {
        return;
    }
    let cluster = tokio::task::spawn_blocking(Cluster::start).await.unwrap();
    let d = driver(
        connection(cluster.nodes[0].url(), &[("cluster", Raw::Bool(true))]),
        "cl",
        &[("pollIntervalMs", 5_000.0), ("notifyPollIntervalMs", 5_000.0)],
    );

    // Keys spread over the nodes; each lock's two keys share a slot, so each script runs whole.
    let keys: Vec<String> = (0..12).map(|i| format!("job:{i}")).collect();
    let mut leases = Vec::new();
    for key in &keys {
        leases.push(d.acquire(key, Some(0), CancellationToken::new()).await.unwrap());
    }
    let hashes: Vec<String> = keys
        .iter()
        .map(|k| dokebi_lock_redis::testing::KeyNames::new("cl", k).hash.to_string())
        .collect();
    let lock_key = |i: usize| format!("cl:lock:{{{}}}", hashes[i]);
    let owners: std::collections::HashSet<usize> =
        (0..keys.len()).map(|i| cluster.owner(&lock_key(i))).collect();
    assert!(owners.len() > 1, "the keys landed on more than one node");

    // A waiter subscribed through node 0 hears a release published on another node.
    let remote = (0..keys.len()).find(|&i| cluster.owner(&lock_key(i)) != 0).unwrap();
    let waiter = tokio::spawn({
        let (d, key) = (d.clone(), keys[remote].clone());
        async move { d.acquire(&key, Some(8_000), CancellationToken::new()).await }
    });
    let end = Instant::now() + Duration::from_secs(3);
    while d.subscription_state() != dokebi_lock_redis::testing::SubscriptionState::Live {
        assert!(Instant::now() < end, "no subscription");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released_at = Instant::now();
    assert!(d.release(&leases[remote]).await.unwrap());
    let next = waiter.await.unwrap().unwrap();
    assert!(
        released_at.elapsed() < Duration::from_millis(2_000),
        "woke after {:?} (the safety poll is 5 s)",
        released_at.elapsed()
    );
    d.release(&next).await.unwrap();

    // Move the slot of one lock to another node behind the driver's back: its next command
    // meets MOVED, and the driver follows it.
    let moved = (0..keys.len()).find(|&i| i != remote).unwrap();
    let slot = slot_of(&cluster.nodes[0], &format!("{{{}}}", hashes[moved]));
    let from = cluster.owner(&lock_key(moved));
    let to = (from + 1) % 3;
    let (from_id, to_id) = (cluster.node_id(from), cluster.node_id(to));
    let slot_s = slot.to_string();
    cluster.nodes[to].command(&["CLUSTER", "SETSLOT", &slot_s, "IMPORTING", &from_id]);
    cluster.nodes[from].command(&["CLUSTER", "SETSLOT", &slot_s, "MIGRATING", &to_id]);
    for key in
        [format!("cl:lock:{{{}}}", hashes[moved]), format!("cl:lock-fence:{{{}}}", hashes[moved])]
    {
        let reply = cluster.nodes[from].command(&[
            "MIGRATE",
            "127.0.0.1",
            &cluster.nodes[to].port.to_string(),
            &key,
            "0",
            "5000",
        ]);
        assert!(reply.starts_with('+'), "migrate: {reply}");
    }
    for node in &cluster.nodes {
        node.command(&["CLUSTER", "SETSLOT", &slot_s, "NODE", &to_id]);
    }
    cluster.nodes[from].command(&["CONFIG", "RESETSTAT"]);
    assert!(
        d.release(&leases[moved]).await.unwrap(),
        "the release followed MOVED to the new owner"
    );
    assert!(
        cluster.nodes[from].command(&["INFO", "errorstats"]).contains("errorstat_MOVED"),
        "the old owner answered MOVED"
    );
    let again = d.acquire(&keys[moved], Some(0), CancellationToken::new()).await.unwrap();
    assert!(
        again.fence.parse::<u128>().unwrap() > leases[moved].fence.parse::<u128>().unwrap(),
        "the fence moved with its slot"
    );
    d.shutdown().await.unwrap();
}

// --- per-key notifications, sharded (issue 17, decisions 0063 and 0064) --------------------

/// A driver on the Cluster with `notifications: 'per-key'` and safety polls so slow that
/// only a notification explains a quick wake-up.
fn per_key_driver(cluster: &Cluster, namespace: &str) -> dokebi_lock_redis::Driver {
    per_key_driver_polling(cluster, namespace, 5_000.0)
}

fn per_key_driver_polling(
    cluster: &Cluster,
    namespace: &str,
    poll_ms: f64,
) -> dokebi_lock_redis::Driver {
    per_key_driver_with(cluster, namespace, poll_ms, 10_000.0)
}

fn per_key_driver_with(
    cluster: &Cluster,
    namespace: &str,
    poll_ms: f64,
    lease_ms: f64,
) -> dokebi_lock_redis::Driver {
    use dokebi_lock_redis::{parse_backend, parse_connection};
    let fields = [
        ("driver", Raw::String("redis".into())),
        ("connection", Raw::String("main".into())),
        ("namespace", Raw::String(namespace.into())),
        ("notifications", Raw::String("per-key".into())),
        ("pollIntervalMs", Raw::Number(poll_ms)),
        ("notifyPollIntervalMs", Raw::Number(poll_ms)),
        ("leaseMs", Raw::Number(lease_ms)),
    ];
    let backend =
        parse_backend(&Raw::Object(fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()))
            .unwrap();
    let conn = connection(cluster.nodes[0].url(), &[("cluster", Raw::Bool(true))]);
    dokebi_lock_redis::Driver::new(&parse_connection(&conn).unwrap(), backend).unwrap()
}

/// The number at the end of a two-element `PUBSUB (SHARD)NUMSUB` reply.
fn subscribers(node: &RedisServer, subcommand: &str, channel: &str) -> u64 {
    let reply = node.command(&["PUBSUB", subcommand, channel]);
    reply.rsplit(':').next().unwrap_or_default().trim().parse().unwrap_or(u64::MAX)
}

async fn eventually(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let end = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < end, "{what} did not happen within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Moves the slot of `hash` (and its lock and fence keys) from its owner to the next node.
fn move_slot(cluster: &Cluster, namespace: &str, hash: &str) -> (usize, usize) {
    let lock = format!("{namespace}:lock:{{{hash}}}");
    let slot = slot_of(&cluster.nodes[0], &lock).to_string();
    let from = cluster.owner(&lock);
    let to = (from + 1) % 3;
    let (from_id, to_id) = (cluster.node_id(from), cluster.node_id(to));
    cluster.nodes[to].command(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]);
    cluster.nodes[from].command(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]);
    for key in [lock.clone(), format!("{namespace}:lock-fence:{{{hash}}}")] {
        let port = cluster.nodes[to].port.to_string();
        let reply =
            cluster.nodes[from].command(&["MIGRATE", "127.0.0.1", &port, &key, "0", "5000"]);
        assert!(reply.starts_with('+'), "migrate: {reply}");
    }
    for node in &cluster.nodes {
        node.command(&["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]);
    }
    (from, to)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_waiters_subscribe_sharded_at_the_slot_owner_and_follow_a_slot_move() {
    if support::external() {
        return;
    }
    let cluster = tokio::task::spawn_blocking(Cluster::start).await.unwrap();
    let holder = per_key_driver(&cluster, "sh");
    let d = per_key_driver(&cluster, "sh");
    let hash = dokebi_lock_redis::testing::KeyNames::new("sh", "job").hash.to_string();
    let channel = format!("sh:lock-released:{{{hash}}}");
    let owner = cluster.owner(&format!("sh:lock:{{{hash}}}"));

    let held = holder.acquire("job", None, CancellationToken::new()).await.unwrap();
    let waiter = tokio::spawn({
        let d = d.clone();
        async move { d.acquire("job", Some(15_000), CancellationToken::new()).await }
    });
    eventually("the key's subscription", Duration::from_secs(5), || d.subscribed_keys() == 1).await;
    // Sharded, at the owner of the key's slot only; no classic subscription anywhere.
    assert_eq!(subscribers(&cluster.nodes[owner], "SHARDNUMSUB", &channel), 1);
    for node in &cluster.nodes {
        assert_eq!(subscribers(node, "NUMSUB", &channel), 0);
    }

    // The slot moves: the old owner ends the shard subscription, and the driver subscribes
    // again at the new owner.
    let subscribed_before = d.subscriptions();
    let (from, to) = move_slot(&cluster, "sh", &hash);
    assert_ne!(from, to);
    eventually("the subscription at the new owner", Duration::from_secs(5), || {
        subscribers(&cluster.nodes[to], "SHARDNUMSUB", &channel) == 1
    })
    .await;
    // The server counts the subscriber when it runs SSUBSCRIBE; the driver counts it when
    // the confirmation comes back, a moment later.
    eventually("the driver to count its new subscription", Duration::from_secs(2), || {
        d.subscriptions() > subscribed_before
    })
    .await;
    eventually("the key live again", Duration::from_secs(2), || d.subscribed_keys() == 1).await;
    tokio::time::sleep(Duration::from_millis(100)).await; // the confirmation's check once more

    // The release (following MOVED to the new owner) publishes there; the waiter wakes by
    // that notification, not by its 5 s safety poll.
    let released_at = Instant::now();
    assert!(holder.release(&held).await.unwrap());
    let lease = waiter.await.unwrap().unwrap();
    assert!(
        released_at.elapsed() < Duration::from_millis(2_000),
        "woke after {:?} (the safety poll is 5 s)",
        released_at.elapsed()
    );
    assert_eq!(d.notifications_received(), 1);
    d.release(&lease).await.unwrap();
    d.shutdown().await.unwrap();
    holder.shutdown().await.unwrap();
}

/// A Cluster without sharded pub/sub (SSUBSCRIBE and SPUBLISH unknown, as before Redis 7.0):
/// per-key notifications say so once and use classic SUBSCRIBE/PUBLISH on the key's channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_sharded_pubsub_per_key_notifications_say_so_once_and_fall_back_to_classic() {
    if support::external() {
        return;
    }
    let codes = common::recorded_codes();
    let cluster = tokio::task::spawn_blocking(|| {
        Cluster::start_with_args(&[
            "--rename-command",
            "SSUBSCRIBE",
            "",
            "--rename-command",
            "SPUBLISH",
            "",
        ])
    })
    .await
    .unwrap();
    assert!(cluster.nodes[0].command(&["SSUBSCRIBE", "x"]).contains("unknown command"));
    let holder = per_key_driver(&cluster, "old");
    let d = per_key_driver(&cluster, "old");
    for round in 0..2 {
        let key = format!("job-{round}");
        let hash = dokebi_lock_redis::testing::KeyNames::new("old", &key).hash.to_string();
        let channel = format!("old:lock-released:{{{hash}}}");
        let held = holder.acquire(&key, None, CancellationToken::new()).await.unwrap();
        let waiter = tokio::spawn({
            let (d, key) = (d.clone(), key.clone());
            async move { d.acquire(&key, Some(15_000), CancellationToken::new()).await }
        });
        eventually("the key's subscription", Duration::from_secs(5), || d.subscribed_keys() == 1)
            .await;
        // Classic, through the node the URL names; classic PUBLISH reaches every node.
        assert_eq!(subscribers(&cluster.nodes[0], "NUMSUB", &channel), 1);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let released_at = Instant::now();
        assert!(holder.release(&held).await.unwrap());
        let lease = waiter.await.unwrap().unwrap();
        assert!(
            released_at.elapsed() < Duration::from_millis(2_000),
            "round {round}: woke after {:?} (the safety poll is 5 s)",
            released_at.elapsed()
        );
        d.release(&lease).await.unwrap();
        // Wait out the grace period, so the next round subscribes anew.
        eventually("the unsubscribe", Duration::from_secs(4), || d.subscribed_keys() == 0).await;
    }
    let ours: Vec<String> = codes
        .lock()
        .unwrap()
        .iter()
        .filter(|(driver, _)| *driver == d.id())
        .map(|(_, code)| code.clone())
        .collect();
    assert_eq!(ours, ["LOCK_NOTIFY_UNSHARDED"], "said once; nothing is unavailable");
    d.shutdown().await.unwrap();
    holder.shutdown().await.unwrap();
}

/// A failover under a per-key waiter: the master owning its key dies, its replica takes
/// over, and the driver subscribes the key again at the new master, where a release wakes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_waiters_subscribe_again_at_the_new_master_after_a_failover() {
    if support::external() {
        return;
    }
    let mut cluster = tokio::task::spawn_blocking(|| Cluster::start_nodes(6, &[])).await.unwrap();
    // A lease that outlives a slow failover (Valkey 8.0's took longer than the default 10 s
    // lease: the key expired and the test's waiter simply took it).
    let holder = per_key_driver_with(&cluster, "fo", 5_000.0, 60_000.0);
    // Polls 20 s apart: the waiter asks Redis only when a notification or a confirmed
    // subscription tells it to, not in the middle of the failover.
    let d = per_key_driver_polling(&cluster, "fo", 20_000.0);
    // A key whose master is not the node the URL names (that one must stay up).
    let (key, names, master) = (0..)
        .map(|i| {
            let key = format!("job-{i}");
            let names = dokebi_lock_redis::testing::KeyNames::new("fo", &key);
            let owner = cluster.owner(&names.lock);
            (key, names, owner)
        })
        .find(|(_, _, owner)| *owner != 0)
        .unwrap();
    let channel = format!("fo:lock-released:{{{}}}", names.hash);
    let _held = holder.acquire(&key, None, CancellationToken::new()).await.unwrap();
    let token = cluster.nodes[master].command(&["GET", &names.lock]);
    let token = token.lines().nth(1).unwrap().to_owned();
    // The replica may still be syncing after the cluster was created.
    eventually("the replica's copy", Duration::from_secs(15), || {
        cluster.nodes[master].command(&["WAIT", "1", "500"]).starts_with(":1")
    })
    .await;
    let waiter = tokio::spawn({
        let (d, key) = (d.clone(), key.clone());
        async move { d.acquire(&key, Some(30_000), CancellationToken::new()).await }
    });
    eventually("the key's subscription", Duration::from_secs(5), || d.subscribed_keys() == 1).await;

    cluster.nodes[master].kill();
    let end = Instant::now() + Duration::from_secs(20);
    let promoted = loop {
        if let Some(owner) = cluster.try_owner(&names.lock, &[master]) {
            break owner;
        }
        assert!(Instant::now() < end, "no replica took over");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The command connection may answer the first command after the death with
    // OUTCOME_UNKNOWN (it wrote to the dead node; decision 0063 notes it), which ends that
    // wait; then a new waiter takes its place once commands reach the new master.
    let waiter = if waiter.is_finished() {
        let end = Instant::now() + Duration::from_secs(10);
        while d.acquire(&key, Some(0), CancellationToken::new()).await.map(|_| ()).unwrap_err().code
            != dokebi_lock_redis::LockErrorCode::LockBusy
        {
            assert!(Instant::now() < end, "commands did not reach the new master");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::spawn({
            let (d, key) = (d.clone(), key.clone());
            async move { d.acquire(&key, Some(30_000), CancellationToken::new()).await }
        })
    } else {
        waiter
    };
    eventually("the subscription at the new master", Duration::from_secs(10), || {
        subscribers(&cluster.nodes[promoted], "SHARDNUMSUB", &channel) == 1
    })
    .await;
    eventually("the key live", Duration::from_secs(5), || d.subscribed_keys() == 1).await;
    tokio::time::sleep(Duration::from_millis(100)).await; // the confirmation's check once more
    assert!(!waiter.is_finished(), "{:?}", waiter.await);

    // The holder's release, as the script runs it, on the new master: the waiter hears it.
    let released_at = Instant::now();
    let reply = cluster.nodes[promoted].command(&[
        "EVAL",
        dokebi_lock_redis::testing::RELEASE_KEYED_SOURCE,
        "1",
        &names.lock,
        &token,
        &channel,
        &names.hash,
        "1",
    ]);
    assert_eq!(reply.trim(), ":2", "deleted, heard by one subscriber");
    let lease = waiter.await.unwrap().unwrap();
    assert!(
        released_at.elapsed() < Duration::from_millis(2_000),
        "woke after {:?} (the safety poll is 5 s)",
        released_at.elapsed()
    );
    d.release(&lease).await.unwrap();
    d.shutdown().await.unwrap();
    let _ = holder.shutdown().await;
}
