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
        Self::start_each(count, |_| extra.to_vec())
    }

    /// `count` nodes, node `i` started with `extra(i)` redis-server arguments too.
    fn start_each<'a>(count: usize, extra: impl Fn(usize) -> Vec<&'a str>) -> Self {
        let nodes: Vec<_> = (0..count)
            .map(|i| {
                let port = free_port();
                let mut args = vec![
                    "--cluster-enabled",
                    "yes",
                    "--cluster-port",
                    &port,
                    "--cluster-node-timeout",
                    "2000",
                ];
                args.extend(extra(i));
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
        while !cluster.is_ok(&[]) {
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

    /// Every node not in `dead` says the Cluster is whole (`cluster_state:ok`).
    fn is_ok(&self, dead: &[usize]) -> bool {
        (0..self.nodes.len())
            .filter(|i| !dead.contains(i))
            .all(|i| self.nodes[i].command(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
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

async fn eventually(what: &str, within: Duration, check: impl FnMut() -> bool) {
    eventually_explained(what, within, check, String::new).await;
}

/// [`eventually`], its failure saying what `explain` finds at that moment.
async fn eventually_explained(
    what: &str,
    within: Duration,
    mut check: impl FnMut() -> bool,
    explain: impl FnOnce() -> String,
) {
    let end = Instant::now() + within;
    while !check() {
        if Instant::now() >= end {
            panic!("{what} did not happen within {within:?}{}", explain());
        }
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
        // Classic, through one node (any: classic PUBLISH reaches every node).
        let classic: u64 =
            cluster.nodes.iter().map(|node| subscribers(node, "NUMSUB", &channel)).sum();
        assert_eq!(classic, 1);
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

/// A per-key driver on the Cluster with its own safety intervals and a 60 s lease, so that
/// a waiter that neither hears the release nor polls fast runs out its wait.
fn per_key_driver_intervals(
    cluster: &Cluster,
    namespace: &str,
    poll_ms: f64,
    notify_poll_ms: f64,
) -> dokebi_lock_redis::Driver {
    use dokebi_lock_redis::{parse_backend, parse_connection};
    let fields = [
        ("driver", Raw::String("redis".into())),
        ("connection", Raw::String("main".into())),
        ("namespace", Raw::String(namespace.into())),
        ("notifications", Raw::String("per-key".into())),
        ("pollIntervalMs", Raw::Number(poll_ms)),
        ("notifyPollIntervalMs", Raw::Number(notify_poll_ms)),
        ("leaseMs", Raw::Number(60_000.0)),
    ];
    let backend =
        parse_backend(&Raw::Object(fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()))
            .unwrap();
    let conn = connection(cluster.nodes[0].url(), &[("cluster", Raw::Bool(true))]);
    dokebi_lock_redis::Driver::new(&parse_connection(&conn).unwrap(), backend).unwrap()
}

/// Three masters; master 0 alone has SSUBSCRIBE renamed away (SPUBLISH still works there,
/// as everywhere): the repro, also what an ACL denying only SSUBSCRIBE gives.
fn cluster_with_one_master_refusing_ssubscribe() -> Cluster {
    let cluster = Cluster::start_each(3, |i| {
        if i == 0 {
            vec!["--rename-command", "SSUBSCRIBE", ""]
        } else {
            vec![]
        }
    });
    assert!(cluster.nodes[0].command(&["SSUBSCRIBE", "x"]).contains("unknown command"));
    // (Answered, or MOVED for a slot of another master: known either way.)
    assert!(!cluster.nodes[0].command(&["SPUBLISH", "x", "y"]).contains("unknown command"));
    cluster
}

fn channel_of(namespace: &str, key: &str) -> String {
    let hash = dokebi_lock_redis::testing::KeyNames::new(namespace, key).hash.to_string();
    format!("{namespace}:lock-released:{{{hash}}}")
}

/// Decision 0160: one master's refusal of SSUBSCRIBE is no verdict on the others. With a
/// waiter on a key of the refusing master already waiting, a waiter on another master's key
/// still subscribes sharded there and wakes by the release's notification; safety polls of
/// a minute mean it could not have got the lock otherwise within its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_masters_refusal_of_ssubscribe_leaves_the_other_masters_keys_sharded_and_heard() {
    if support::external() {
        return;
    }
    let cluster =
        tokio::task::spawn_blocking(cluster_with_one_master_refusing_ssubscribe).await.unwrap();
    let holder = per_key_driver_intervals(&cluster, "one", 60_000.0, 60_000.0);
    let d = per_key_driver_intervals(&cluster, "one", 60_000.0, 60_000.0);
    let keys = key_per_master(&cluster, "one");
    let (refused, heard) = (keys[0].clone(), keys[1].clone());
    let held_refused = holder.acquire(&refused, None, CancellationToken::new()).await.unwrap();
    let held_heard = holder.acquire(&heard, None, CancellationToken::new()).await.unwrap();

    // First a waiter on the refusing master's key: it meets the refusal.
    let cancel_refused = CancellationToken::new();
    let waiter_refused = tokio::spawn({
        let (d, key, cancel) = (d.clone(), refused.clone(), cancel_refused.clone());
        async move { d.acquire(&key, Some(20_000), cancel).await }
    });
    eventually("the refusal judged", Duration::from_secs(10), || {
        d.stats().subscription == "partial"
    })
    .await;
    let waiter_heard = tokio::spawn({
        let (d, key) = (d.clone(), heard.clone());
        async move { d.acquire(&key, Some(20_000), CancellationToken::new()).await }
    });
    eventually("the other key's subscription", Duration::from_secs(10), || {
        d.subscribed_keys() == 1
    })
    .await;
    // Sharded, at its own master; classic nowhere.
    let channel = channel_of("one", &heard);
    assert_eq!(subscribers(&cluster.nodes[1], "SHARDNUMSUB", &channel), 1);
    for node in &cluster.nodes {
        assert_eq!(subscribers(node, "NUMSUB", &channel), 0);
    }
    assert_eq!(d.stats().subscription, "partial", "the refusing master's key is still unheard");

    assert!(holder.release(&held_heard).await.unwrap());
    let lease = waiter_heard.await.unwrap().expect("woken by the notification");
    assert_eq!(d.notifications_received(), 1);
    d.release(&lease).await.unwrap();
    // (How the refusing master's key is handed over: the test below.)
    cancel_refused.cancel();
    assert!(waiter_refused.await.unwrap().is_err());
    holder.release(&held_refused).await.unwrap();
    d.shutdown().await.unwrap();
    holder.shutdown().await.unwrap();
}

/// Decision 0160: a key of the master that refuses SSUBSCRIBE while accepting SPUBLISH
/// cannot be heard (its release is SPUBLISHed where nobody can subscribe), so its waiter
/// polls at pollIntervalMs (here 50 ms; notifyPollIntervalMs is a minute, longer than the
/// wait), `stats()` says `partial`, and nothing is subscribed for it. When the key's slot
/// moves to a master with sharded pub/sub, the key is judged again and heard there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_the_refusing_master_is_polled_fast_reported_partial_and_judged_again_after_a_slot_move(
) {
    if support::external() {
        return;
    }
    let cluster =
        tokio::task::spawn_blocking(cluster_with_one_master_refusing_ssubscribe).await.unwrap();
    let holder = per_key_driver_intervals(&cluster, "deaf", 60_000.0, 60_000.0);
    let d = per_key_driver_intervals(&cluster, "deaf", 50.0, 60_000.0);
    let key = key_per_master(&cluster, "deaf")[0].clone();
    let channel = channel_of("deaf", &key);
    let hash = dokebi_lock_redis::testing::KeyNames::new("deaf", &key).hash.to_string();

    let held = holder.acquire(&key, None, CancellationToken::new()).await.unwrap();
    let waiter = tokio::spawn({
        let (d, key) = (d.clone(), key.clone());
        async move { d.acquire(&key, Some(20_000), CancellationToken::new()).await }
    });
    eventually("the key judged unheard", Duration::from_secs(10), || {
        d.stats().subscription == "partial"
    })
    .await;
    assert_eq!(d.subscribed_keys(), 0);
    for node in &cluster.nodes {
        assert_eq!(subscribers(node, "SHARDNUMSUB", &channel), 0);
        assert_eq!(subscribers(node, "NUMSUB", &channel), 0, "a classic one would hear nothing");
    }
    // It polls: attempts keep coming while it waits.
    let attempts = d.stats().redis_attempts;
    eventually("more attempts", Duration::from_secs(10), || {
        d.stats().redis_attempts >= attempts + 3
    })
    .await;
    assert!(holder.release(&held).await.unwrap());
    let lease = waiter.await.unwrap().expect("the fast poll finds the key free within the wait");
    assert_eq!(d.notifications_received(), 0, "nothing could be heard");
    d.release(&lease).await.unwrap();

    // The slot moves to a master with sharded pub/sub: judged again, the key is heard there.
    let held = holder.acquire(&key, None, CancellationToken::new()).await.unwrap();
    let waiter = tokio::spawn({
        let (d, key) = (d.clone(), key.clone());
        async move { d.acquire(&key, Some(30_000), CancellationToken::new()).await }
    });
    eventually("the key judged unheard again", Duration::from_secs(10), || {
        d.stats().subscription == "partial"
    })
    .await;
    let (from, to) = move_slot(&cluster, "deaf", &hash);
    assert_eq!((from, to), (0, 1));
    // Judged again within REJUDGE (5 s): 25 s is five times that.
    eventually("the key subscribed at its new master", Duration::from_secs(25), || {
        d.subscribed_keys() == 1 && d.stats().subscription == "live"
    })
    .await;
    assert_eq!(subscribers(&cluster.nodes[to], "SHARDNUMSUB", &channel), 1);
    assert!(holder.release(&held).await.unwrap());
    // Live now, the waiter sleeps notifyPollIntervalMs (a minute, beyond its 30 s wait and
    // the key's lease): only the notification hands the key over before its wait ends.
    let lease = waiter.await.unwrap().expect("woken by the notification");
    assert_eq!(d.notifications_received(), 1);
    d.release(&lease).await.unwrap();
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
    // wait; then a new waiter takes its place once commands reach the new master and every
    // node agrees the Cluster is whole. Without the latter, a node still in `fail` answered
    // the new waiter's first attempt CLUSTERDOWN (reproduced under load on valkey-8.0,
    // 4 runs in 222): a failure it rides out by polling at pollIntervalMs, 20 s here,
    // before it ever hears "busy" and subscribes.
    let waiter = if waiter.is_finished() {
        let within = Duration::from_secs(10);
        let end = Instant::now() + within;
        eventually("cluster_state:ok on every live node", within, || cluster.is_ok(&[master]))
            .await;
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
    // Usually there within tens of ms; when it is not, say where the channel was subscribed.
    eventually_explained(
        "the subscription at the new master",
        Duration::from_secs(10),
        || subscribers(&cluster.nodes[promoted], "SHARDNUMSUB", &channel) == 1,
        || {
            let per_node: Vec<_> = (0..cluster.nodes.len())
                .filter(|&i| i != master)
                .map(|i| (i, subscribers(&cluster.nodes[i], "SHARDNUMSUB", &channel)))
                .collect();
            format!(
                " (new master: node {promoted}; SHARDNUMSUB per live node {per_node:?}; \
                 the driver's subscribed keys: {})",
                d.subscribed_keys()
            )
        },
    )
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

// --- no single point of failure (issue 23) ---------------------------------------------

/// A driver on the Cluster through `url`, in the given notification mode, with safety polls
/// so slow that only a notification explains a quick wake-up.
fn driver_on(url: &str, namespace: &str, mode: &str) -> dokebi_lock_redis::Driver {
    use dokebi_lock_redis::{parse_backend, parse_connection};
    let fields = [
        ("driver", Raw::String("redis".into())),
        ("connection", Raw::String("main".into())),
        ("namespace", Raw::String(namespace.into())),
        ("notifications", Raw::String(mode.into())),
        ("pollIntervalMs", Raw::Number(5_000.0)),
        ("notifyPollIntervalMs", Raw::Number(5_000.0)),
        ("leaseMs", Raw::Number(60_000.0)),
    ];
    let backend =
        parse_backend(&Raw::Object(fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()))
            .unwrap();
    let conn = connection(url, &[("cluster", Raw::Bool(true))]);
    dokebi_lock_redis::Driver::new(&parse_connection(&conn).unwrap(), backend).unwrap()
}

/// For each of the three masters, a key whose slot it owns.
fn key_per_master(cluster: &Cluster, namespace: &str) -> Vec<String> {
    (0..3)
        .map(|master| {
            (0..)
                .map(|i| format!("job-{i}"))
                .find(|key| {
                    let names = dokebi_lock_redis::testing::KeyNames::new(namespace, key);
                    cluster.owner(&names.lock) == master
                })
                .unwrap()
        })
        .collect()
}

/// Kills the master the URL names once every replica has synced, and waits until another
/// node serves its slots; returns when that was seen.
async fn kill_url_node_and_wait_for_its_replica(cluster: &mut Cluster, key_of_node_0: &str) {
    for master in 0..3 {
        eventually("the replica's copy", Duration::from_secs(15), || {
            cluster.nodes[master].command(&["WAIT", "1", "500"]).starts_with(":1")
        })
        .await;
    }
    cluster.nodes[0].kill();
    let lock = dokebi_lock_redis::testing::KeyNames::new("spof", key_of_node_0).lock;
    let end = Instant::now() + Duration::from_secs(30);
    while cluster.try_owner(&lock, &[0]).is_none()
        || !cluster.nodes[1].command(&["CLUSTER", "INFO"]).contains("cluster_state:ok")
    {
        assert!(Instant::now() < end, "no replica took over");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The fault that hurts most: the node the URL names dies. Once its replica takes over,
/// every shard serves acquires again, a release on a healthy shard still reaches its waiter,
/// and the notifications come back without that node (issue 23).
async fn the_url_nodes_death_stops_no_shard(mode: &str) {
    let mut cluster = tokio::task::spawn_blocking(|| {
        Cluster::start_nodes(6, &["--cluster-node-timeout", "1000"])
    })
    .await
    .unwrap();
    let d = driver_on(cluster.nodes[0].url(), "spof", mode);
    // The holder reaches the Cluster through another node: it is not the one under test.
    let holder = driver_on(cluster.nodes[1].url(), "spof", mode);
    let keys = key_per_master(&cluster, "spof");
    for key in &keys {
        let lease = d.acquire(key, Some(0), CancellationToken::new()).await.unwrap();
        assert!(d.release(&lease).await.unwrap());
    }
    // A waiter on master 1's key, behind the holder.
    let held = holder.acquire(&keys[1], None, CancellationToken::new()).await.unwrap();
    let waiter = tokio::spawn({
        let (d, key) = (d.clone(), keys[1].clone());
        async move { d.acquire(&key, Some(60_000), CancellationToken::new()).await }
    });
    eventually("the waiter's subscription", Duration::from_secs(5), || {
        d.subscription_state() == dokebi_lock_redis::testing::SubscriptionState::Live
            && d.stats().waiters == 1
    })
    .await;

    // Traffic on every shard through the failover, so commands meet the dead node (lost
    // replies, refused connects) as they would in production.
    let traffic = CancellationToken::new();
    let traffic_task = tokio::spawn({
        let (d, keys, stop) = (d.clone(), keys.clone(), traffic.clone());
        async move {
            while !stop.is_cancelled() {
                for key in [&keys[0], &keys[2]] {
                    if let Ok(lease) = d.acquire(key, Some(0), CancellationToken::new()).await {
                        let _ = d.release(&lease).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
    kill_url_node_and_wait_for_its_replica(&mut cluster, &keys[0]).await;
    traffic.cancel();
    traffic_task.await.unwrap();
    let recovered_from = Instant::now();
    // Every shard, the dead node's included, serves acquires again (ioredis: ~5 s; the
    // issue's target is 10 s; the bound is 5x what a busy machine may need for that).
    for key in &keys {
        let end = recovered_from + Duration::from_secs(50);
        loop {
            match d.acquire(key, Some(0), CancellationToken::new()).await {
                Ok(lease) => {
                    assert!(d.release(&lease).await.unwrap(), "released on its shard");
                    break;
                }
                // The shard's primary answered: that is serving too. Not only the held key
                // may be busy: a traffic lease whose release met CLUSTERDOWN during the
                // failover is held until it expires.
                Err(e) if e.code == dokebi_lock_redis::LockErrorCode::LockBusy => break,
                Err(e) => assert!(Instant::now() < end, "{key}: still failing: {e:?}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    eprintln!(
        "{mode}: every shard served acquires {:?} after cluster_state:ok",
        recovered_from.elapsed()
    );
    // Notifications come back without the node the URL names.
    eventually("a live subscription again", Duration::from_secs(30), || {
        d.subscription_state() == dokebi_lock_redis::testing::SubscriptionState::Live
    })
    .await;
    let heard = d.notifications_received();
    assert!(holder.release(&held).await.unwrap(), "the holder's release on a healthy shard");
    let lease = waiter.await.unwrap().expect("the waiter on the healthy shard gets the lock");
    eventually("the release heard", Duration::from_secs(4), || d.notifications_received() > heard)
        .await;
    assert!(d.release(&lease).await.unwrap());
    d.shutdown().await.unwrap();
    holder.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_url_nodes_death_stops_no_shard_once_its_replica_takes_over_namespace_channel() {
    if support::external() {
        return;
    }
    the_url_nodes_death_stops_no_shard("namespace").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_url_nodes_death_stops_no_shard_once_its_replica_takes_over_per_key() {
    if support::external() {
        return;
    }
    the_url_nodes_death_stops_no_shard("per-key").await;
}

/// `url` may list several seed nodes: a driver started while the first is down reaches the
/// Cluster through the next (issue 23, CONTRACT "Cluster seed nodes").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_started_while_a_seed_node_is_down_reaches_the_cluster_through_another() {
    if support::external() {
        return;
    }
    let cluster = tokio::task::spawn_blocking(Cluster::start).await.unwrap();
    let dead = free_port();
    let url = format!("redis://127.0.0.1:{dead},127.0.0.1:{}", cluster.nodes[1].port);
    let d = driver_on(&url, "seeds", "namespace");
    for key in key_per_master(&cluster, "seeds") {
        let lease = d.acquire(&key, Some(0), CancellationToken::new()).await.unwrap();
        assert!(d.release(&lease).await.unwrap());
    }
    d.shutdown().await.unwrap();
}

/// The least-privilege rule of docs/operations.md with its Cluster line, on every node: the whole cycle, in
/// both notification modes, leaves `ACL LOG` empty everywhere, so nothing redis-rs's Cluster
/// client sends unasked (`CLIENT SETINFO` on Redis 7.2+ and Valkey) is refused (issue 23).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_runs_whole_on_a_cluster_as_the_least_privileged_user() {
    if support::external() {
        return;
    }
    let cluster = tokio::task::spawn_blocking(Cluster::start).await.unwrap();
    for node in &cluster.nodes {
        let mut setuser = vec!["ACL", "SETUSER", "locker"];
        setuser.extend(common::LEAST_PRIVILEGE_RULE.iter().map(|r| {
            if *r == "&locks:lock-released" {
                "&locks:lock-released*"
            } else {
                r
            }
        }));
        setuser.extend_from_slice(common::CLUSTER_PRIVILEGE_ADDITIONS);
        assert!(node.command(&setuser).starts_with("+OK"));
    }
    let user_url = cluster.nodes[0].url().replace("redis://", "redis://locker:s3cret@");
    for mode in ["namespace", "per-key"] {
        let holder = driver_on(&user_url, "locks", mode);
        let d = driver_on(&user_url, "locks", mode);
        for key in key_per_master(&cluster, "locks") {
            // The last key's subscription outlives its wait by a grace period: let it end,
            // so the count below is this key's.
            eventually("the last key's unsubscribe", Duration::from_secs(5), || {
                d.subscribed_keys() == 0
            })
            .await;
            let held = holder.acquire(&key, Some(0), CancellationToken::new()).await.unwrap();
            holder.renew(&held).await.unwrap();
            let waiter = tokio::spawn({
                let (d, key) = (d.clone(), key.clone());
                async move { d.acquire(&key, Some(15_000), CancellationToken::new()).await }
            });
            eventually("the waiter's subscription", Duration::from_secs(5), || {
                d.subscription_state() == dokebi_lock_redis::testing::SubscriptionState::Live
                    && d.stats().waiters == 1
                    && (mode == "namespace" || d.subscribed_keys() == 1)
            })
            .await;
            let heard = d.notifications_received();
            assert!(holder.release(&held).await.unwrap());
            let next = waiter.await.unwrap().unwrap();
            // Heard, whether or not the waiter's own check got there first.
            eventually("the release heard", Duration::from_secs(4), || {
                d.notifications_received() > heard
            })
            .await;
            assert!(d.release(&next).await.unwrap());
        }
        d.shutdown().await.unwrap();
        holder.shutdown().await.unwrap();
    }
    for (i, node) in cluster.nodes.iter().enumerate() {
        let log = node.command(&["ACL", "LOG"]);
        assert_eq!(log, "*0\r\n", "node {i}: ACL LOG has denials: {log}");
    }
}

/// A node started like the Cluster's and made a replica of master `master`, once it synced.
fn add_replica(cluster: &mut Cluster, master: usize, extra: &[&str]) -> usize {
    let bus_port = free_port();
    let mut args = vec!["--cluster-enabled", "yes", "--cluster-port", &bus_port];
    args.extend_from_slice(extra);
    let node = RedisServer::start_with_args(&args);
    let master_id = cluster.node_id(master);
    // The master meets the new node: the bus ports are not port + 10000 here.
    let new_port = node.port.to_string();
    cluster.nodes[master].command(&["CLUSTER", "MEET", "127.0.0.1", &new_port, &bus_port]);
    let end = Instant::now() + Duration::from_secs(20);
    while !node.command(&["CLUSTER", "NODES"]).contains(&master_id) {
        assert!(Instant::now() < end, "the new node did not learn the master");
        std::thread::sleep(Duration::from_millis(50));
    }
    node.command(&["CLUSTER", "REPLICATE", &master_id]);
    let port = node.port;
    cluster.nodes.push(node);
    while replicas_of(&cluster.nodes[master]).len() < 2 {
        assert!(Instant::now() < end, "the new replica did not sync");
        std::thread::sleep(Duration::from_millis(50));
    }
    cluster.nodes.iter().position(|n| n.port == port).unwrap()
}

/// The ports of a master's online replicas, from its `INFO replication`.
fn replicas_of(master: &RedisServer) -> Vec<u16> {
    master
        .command(&["INFO", "replication"])
        .lines()
        .filter(|l| l.starts_with("slave") && l.contains("state=online"))
        .filter_map(|l| l.split(',').find_map(|f| f.strip_prefix("port=")))
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Issue 23 item 2: with `minReplicas: 1` a lease is handed out only once a replica of its
/// shard has it, so when the URL's node dies with replicas that lag, the replica promoted
/// draws no fence at or below one handed out before (decision 0142). With `minReplicas: 0`
/// this test fails: the acquire during the lag is handed out, its fence is lost with the
/// master, and the new master draws the same fence again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_min_replicas_1_a_shard_failover_after_replicas_lagged_hands_out_no_smaller_fence() {
    let extra = ["--cluster-node-timeout", "1000", "--cluster-replica-validity-factor", "0"];
    let mut cluster = tokio::task::spawn_blocking(move || {
        let mut cluster = Cluster::start_nodes(6, &extra);
        add_replica(&mut cluster, 0, &extra);
        cluster
    })
    .await
    .unwrap();
    let key = key_per_master(&cluster, "fence-failover")[0].clone();
    let conn = connection(cluster.nodes[0].url(), &[("cluster", Raw::Bool(true))]);
    let d = driver(conn, "fence-failover", &[("minReplicas", 1.0), ("leaseMs", 60_000.0)]);

    // Handed out: each one's fence and lease were on a replica of node 0 first.
    let mut handed_out = Vec::new();
    for _ in 0..3 {
        let lease = d.acquire(&key, Some(0), CancellationToken::new()).await.unwrap();
        handed_out.push(lease.fence.parse::<u128>().unwrap());
        d.renew(&lease).await.expect("a renew a replica acknowledged");
        assert!(d.release(&lease).await.unwrap());
    }
    // The releases on the replicas too, so the key is free after the failover.
    let replicas: Vec<usize> = replicas_of(&cluster.nodes[0])
        .iter()
        .map(|port| cluster.nodes.iter().position(|n| n.port == *port).unwrap())
        .collect();
    assert_eq!(replicas.len(), 2, "node 0 has two replicas");
    assert!(cluster.nodes[0].command(&["WAIT", "2", "5000"]).starts_with(":2"));

    // Both replicas fall behind: stopped, and cut off, so what node 0 writes now never
    // reaches them (a stopped replica would still read what its socket buffered). The
    // acquire wins on node 0, and no replica acknowledges it.
    for &r in &replicas {
        cluster.nodes[r].pause();
    }
    cluster.nodes[0].command(&["CLIENT", "KILL", "TYPE", "replica"]);
    assert!(replicas_of(&cluster.nodes[0]).is_empty(), "node 0 has no replica connected");
    let err =
        d.acquire(&key, Some(0), CancellationToken::new()).await.expect_err("no replica has it");
    assert_eq!(err.code, dokebi_lock_redis::LockErrorCode::ProviderFailed, "{err:?}");
    let cause = err.cause.as_ref().expect("a RedisError cause");
    assert_eq!(cause.server_code.as_deref(), Some("NOREPLICAS"), "{err:?}");
    let lock = dokebi_lock_redis::testing::KeyNames::new("fence-failover", &key);
    let drawn: u128 =
        cluster.nodes[0].command(&["GET", &lock.fence]).lines().nth(1).unwrap().parse().unwrap();
    assert!(drawn > *handed_out.last().unwrap(), "node 0 drew a fence it did not hand out");

    // Node 0, the URL's node, dies with that write; a lagging replica takes over.
    cluster.nodes[0].kill();
    for &r in &replicas {
        cluster.nodes[r].resume();
    }
    let end = Instant::now() + Duration::from_secs(50);
    while cluster.try_owner(&lock.lock, &[0]).is_none()
        || !cluster.nodes[1].command(&["CLUSTER", "INFO"]).contains("cluster_state:ok")
    {
        assert!(Instant::now() < end, "no replica took over");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The new master's other replica follows it; then the lock is handed out again, with a
    // fence above every one handed out before.
    let after = loop {
        match d.acquire(&key, Some(0), CancellationToken::new()).await {
            Ok(lease) => break lease,
            Err(e) => assert!(Instant::now() < end, "no acquire after the failover: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let fence: u128 = after.fence.parse().unwrap();
    assert!(
        handed_out.iter().all(|before| fence > *before),
        "fence {fence} after the failover, {handed_out:?} handed out before"
    );
    assert!(d.release(&after).await.unwrap());
    d.shutdown().await.unwrap();
}

/// Decision 0142: in a Cluster the WAITs of writes to one node share rounds as on a single
/// node (decision 0027), whatever their slots, so commands behind a WAIT wait for one round
/// at most. Ten winners on ten slots of node 0, its replica stopped: the first round's WAIT
/// blocks for replicaTimeoutMs, the other nine join the next round, and node 0 runs two
/// WAITs (three if a winner straggles past the first), not ten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_winners_on_many_slots_of_one_node_share_its_wait_rounds() {
    let cluster = tokio::task::spawn_blocking(|| {
        Cluster::start_nodes(6, &["--cluster-node-timeout", "1000"])
    })
    .await
    .unwrap();
    let keys: Vec<String> = (0..)
        .map(|i| format!("slot-{i}"))
        .filter(|key| {
            let lock = dokebi_lock_redis::testing::KeyNames::new("rounds", key).lock;
            cluster.owner(&lock) == 0
        })
        .scan(std::collections::HashSet::new(), |slots, key| {
            let lock = dokebi_lock_redis::testing::KeyNames::new("rounds", &key).lock;
            Some(slots.insert(slot_of(&cluster.nodes[0], &lock)).then_some(key))
        })
        .flatten()
        .take(10)
        .collect();
    let conn = connection(cluster.nodes[0].url(), &[("cluster", Raw::Bool(true))]);
    let d = driver(conn, "rounds", &[("minReplicas", 1.0)]);
    eventually("node 0's replica in sync", Duration::from_secs(15), || {
        cluster.nodes[0].command(&["WAIT", "1", "500"]).starts_with(":1")
    })
    .await;
    // Connected, slot map learned, and a round that passes while the replica runs.
    let lease = d.acquire(&keys[0], Some(0), CancellationToken::new()).await.unwrap();
    assert!(d.release(&lease).await.unwrap());
    cluster.nodes[0].command(&["CONFIG", "RESETSTAT"]);
    let replica = replicas_of(&cluster.nodes[0])[0];
    let replica = cluster.nodes.iter().find(|n| n.port == replica).unwrap();
    replica.pause();
    let attempts = keys.iter().map(|key| d.acquire(key, Some(0), CancellationToken::new()));
    for result in futures::future::join_all(attempts).await {
        let err = result.expect_err("no replica acknowledges");
        let cause = err.cause.as_ref().expect("a RedisError cause");
        assert_eq!(cause.server_code.as_deref(), Some("NOREPLICAS"), "{err:?}");
    }
    replica.resume();
    let stats = cluster.nodes[0].command(&["INFO", "commandstats"]);
    let waits: u64 = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_wait:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!((1..=3).contains(&waits), "node 0 ran {waits} WAITs for 10 winners");
    d.shutdown().await.unwrap();
}

/// The URL's node SIGSTOPped past cluster-node-timeout while the driver is idle: not dead,
/// so its connections stay open and its socket still accepts, and nothing tells redis-rs
/// that its replica took over (no MOVED, no lost connection). Once the replica serves its
/// slots, every shard serves acquires again while the node is still stopped, as after a
/// kill (2–8 s here). Before decision 0162 its shard timed out for as long as it stayed
/// stopped (50 s here, in both notification modes).
async fn a_stopped_url_node_stops_no_shard(mode: &str) {
    let cluster = tokio::task::spawn_blocking(|| {
        Cluster::start_nodes(6, &["--cluster-node-timeout", "1000"])
    })
    .await
    .unwrap();
    let namespace = "stopped";
    let d = driver_on(cluster.nodes[0].url(), namespace, mode);
    let keys = key_per_master(&cluster, namespace);
    for key in &keys {
        let lease = d.acquire(key, Some(0), CancellationToken::new()).await.unwrap();
        assert!(d.release(&lease).await.unwrap());
    }
    for master in 0..3 {
        eventually("the replica's copy", Duration::from_secs(15), || {
            cluster.nodes[master].command(&["WAIT", "1", "500"]).starts_with(":1")
        })
        .await;
    }
    cluster.nodes[0].pause();
    let lock = dokebi_lock_redis::testing::KeyNames::new(namespace, &keys[0]).lock;
    let end = Instant::now() + Duration::from_secs(30);
    while cluster.try_owner(&lock, &[0]).is_none()
        || !cluster.nodes[1].command(&["CLUSTER", "INFO"]).contains("cluster_state:ok")
    {
        assert!(Instant::now() < end, "no replica took over");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let recovered_from = Instant::now();
    // The stopped node's shard first (its key's first command stalls), then the others.
    for key in &keys {
        let end = recovered_from + Duration::from_secs(50);
        loop {
            match d.acquire(key, Some(0), CancellationToken::new()).await {
                Ok(lease) => {
                    assert!(d.release(&lease).await.unwrap(), "released on its shard");
                    break;
                }
                Err(e) => assert!(Instant::now() < end, "{key}: still failing: {e:?}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    eprintln!(
        "{mode}: every shard served acquires {:?} after cluster_state:ok, the node still stopped",
        recovered_from.elapsed()
    );
    cluster.nodes[0].resume();
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_url_node_stops_no_shard_once_its_replica_takes_over_namespace_channel() {
    if support::external() {
        return;
    }
    a_stopped_url_node_stops_no_shard("namespace").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_url_node_stops_no_shard_once_its_replica_takes_over_per_key() {
    if support::external() {
        return;
    }
    a_stopped_url_node_stops_no_shard("per-key").await;
}

/// A Cluster whose every node announces the port of a middlebox in front of it, so the
/// driver reaches each node only through one (issue 34).
async fn cluster_behind_middleboxes() -> (Cluster, Vec<support::middlebox::Middlebox>) {
    use support::middlebox::Middlebox;
    let cluster = tokio::task::spawn_blocking(Cluster::start).await.unwrap();
    let boxes: Vec<Middlebox> = cluster.nodes.iter().map(|n| Middlebox::start(n.port)).collect();
    for (node, mb) in cluster.nodes.iter().zip(&boxes) {
        let port = mb.port().to_string();
        assert!(node.command(&["CONFIG", "SET", "cluster-announce-port", &port]).starts_with('+'));
    }
    let announced = |node: &RedisServer| {
        let slots = node.command(&["CLUSTER", "SLOTS"]);
        boxes.iter().all(|mb| slots.contains(&format!(":{}\r\n", mb.port())))
    };
    eventually("every node announcing its middlebox", Duration::from_secs(10), || {
        cluster.nodes.iter().all(announced)
    })
    .await;
    (cluster, boxes)
}

/// The connection fields of a driver reaching `boxes`' Cluster, with quick liveness PINGs.
fn through_boxes(boxes: &[support::middlebox::Middlebox]) -> Raw {
    let url = format!("redis://127.0.0.1:{}", boxes[0].port());
    connection(
        &url,
        &[
            ("cluster", Raw::Bool(true)),
            ("pingIntervalMs", Raw::Number(300.0)),
            ("commandTimeoutMs", Raw::Number(500.0)),
        ],
    )
}

/// Every node's flows are dropped without a word while the driver is idle: the Cluster
/// connection's PING to the masters finds it, and the next acquire on every shard runs on
/// new connections instead of being handed to a dead flow (issue 34; decision 0172).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_cluster_connection_whose_flows_were_dropped_acquires_on_every_shard() {
    use support::middlebox::{Drop, Flows};
    if support::external() {
        return;
    }
    let (cluster, boxes) = cluster_behind_middleboxes().await;
    let d = driver(through_boxes(&boxes), "cut", &[]);
    let keys = key_per_master(&cluster, "cut");
    for key in &keys {
        let lease = d.acquire(key, Some(0), CancellationToken::new()).await.unwrap();
        assert!(d.release(&lease).await.unwrap());
    }
    for mb in &boxes {
        mb.cut(Flows::All, Drop::Silently);
    }
    // Five times one interval and one unanswered PING.
    eventually("the dropped flows found", Duration::from_secs(4), || {
        d.stats().dead_connections >= 1
    })
    .await;
    assert!(boxes.iter().any(|mb| mb.pings_into_cut() >= 1));
    for key in &keys {
        let lease = d.acquire(key, Some(0), CancellationToken::new()).await;
        let lease = lease.unwrap_or_else(|e| panic!("{:?}", e.code));
        assert!(d.release(&lease).await.unwrap());
    }
    d.shutdown().await.unwrap();
}

/// Per key in a Cluster, the sharded subscription's flow is cut silently while a waiter
/// waits: its PING finds it, the subscription turns failed and the waiter gets the lock by
/// polling (not after notifyPollIntervalMs, a minute here); waiters coming back later
/// subscribe anew and hear releases again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_subscription_cut_silently_is_found_dead_and_its_waiter_polls_then_hears_again() {
    use support::middlebox::{Drop, Flows};
    if support::external() {
        return;
    }
    let (cluster, boxes) = cluster_behind_middleboxes().await;
    let intervals = [("pollIntervalMs", 20.0), ("notifyPollIntervalMs", 60_000.0)];
    let d = common::notifying_driver(through_boxes(&boxes), "shard-cut", "per-key", &intervals);
    let holder = driver_on(cluster.nodes[0].url(), "shard-cut", "per-key");
    let cut = || {
        let cut: usize = boxes.iter().map(|mb| mb.cut(Flows::Subscribers, Drop::Silently)).sum();
        assert_eq!(cut, 1, "the flow to the key's node that carries its SSUBSCRIBE");
    };
    common::a_silent_cut_is_found_then_polled_then_heard_again(
        &d,
        &holder,
        "k",
        cut,
        Duration::from_secs(4), // five times one interval and one unanswered PING
        || true,
    )
    .await;
    d.shutdown().await.unwrap();
    holder.shutdown().await.unwrap();
}

/// One node's flow is cut silently while another shard is kept busy: the Cluster
/// connection's traffic to the busy node says nothing of the cut one, so it is found by the
/// PING every interval all the same, and the cut shard's next acquire runs on a new
/// connection. (Chaos seeds 17316 and 17317 found a quiet judged per Cluster connection
/// never PINGing such a node.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_node_is_found_while_another_shard_stays_busy() {
    use support::middlebox::{Drop, Flows};
    if support::external() {
        return;
    }
    let (cluster, boxes) = cluster_behind_middleboxes().await;
    let d = driver(through_boxes(&boxes), "busy-cut", &[]);
    let keys = key_per_master(&cluster, "busy-cut");
    for key in &keys {
        let lease = d.acquire(key, Some(0), CancellationToken::new()).await.unwrap();
        assert!(d.release(&lease).await.unwrap());
    }
    let stop = CancellationToken::new();
    let busy = tokio::spawn({
        let (d, key, stop) = (d.clone(), keys[0].clone(), stop.clone());
        async move {
            let mut pairs = 0u64;
            while !stop.is_cancelled() {
                let lease = d.acquire(&key, Some(0), CancellationToken::new()).await.unwrap();
                assert!(d.release(&lease).await.unwrap());
                pairs += 1;
            }
            pairs
        }
    });
    boxes[1].cut(Flows::All, Drop::Silently); // node 1 is master 1 (Cluster::start's order)
    eventually("the cut node found while shard 0 is busy", Duration::from_secs(4), || {
        d.stats().dead_connections >= 1
    })
    .await;
    stop.cancel();
    assert!(busy.await.unwrap() > 0, "shard 0 carried traffic all along");
    let lease = d.acquire(&keys[1], Some(0), CancellationToken::new()).await;
    let lease = lease.unwrap_or_else(|e| panic!("{:?}", e.code));
    assert!(d.release(&lease).await.unwrap());
    d.shutdown().await.unwrap();
}
