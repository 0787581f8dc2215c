//! A local 3-master Redis Cluster: locks on keys in different slots, release notifications
//! across nodes, and a slot moved to another node while the driver's map is stale.

mod common;
mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{connection, driver};
use dokebi_lock_redis::options::Raw;
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
        let nodes: Vec<_> = (0..3)
            .map(|_| {
                RedisServer::start_with_args(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-port",
                    &free_port(),
                    "--cluster-node-timeout",
                    "2000",
                ])
            })
            .collect();
        let addresses: Vec<String> =
            nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
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
        (0..3)
            .find(|&i| !self.nodes[i].command(&["EXISTS", key]).starts_with('-'))
            .expect("some node serves the key")
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
        .map(|k| dokebi_lock_redis::keys::KeyNames::new("cl", k).hash.to_string())
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
    while d.subscription_state() != dokebi_lock_redis::notify::SubscriptionState::Live {
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
