//! minReplicas (issue 11): acquires and renews confirmed by WAIT, against a real primary
//! with a real replica; the replica stopped with SIGSTOP stands for a slow or lost one.

mod common;
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{calls, driver, eventually, url, value};
use dokebi_lock_redis::{Driver, Lease, LockError, LockErrorCode, Outcome, RedisErrorCode};
use support::RedisServer;
use tokio_util::sync::CancellationToken;

/// A primary that starts a replica's sync at once, and a replica linked to it.
fn primary_and_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start_with_args(&["--repl-diskless-sync-delay", "0"]);
    let port = primary.port.to_string();
    let replica = RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &port]);
    support::wait_for_replicas(&primary, 1, Duration::from_secs(10));
    (primary, replica)
}

fn get(redis: &RedisServer, key: &str) -> String {
    value(&redis.command(&["GET", key]))
}

fn assert_too_few_replicas(err: &LockError) {
    assert_eq!(err.code, LockErrorCode::ProviderFailed, "{err:?}");
    let cause = err.cause.as_ref().expect("a RedisError cause");
    assert_eq!(cause.code, RedisErrorCode::CommandRejected);
    assert_eq!(cause.outcome, Outcome::Rejected);
    assert_eq!(cause.server_code.as_deref(), Some("NOREPLICAS"));
    assert!(cause.retryable(), "too few replicas is worth retrying (503)");
}

async fn acquire(d: &Driver, key: &str, wait_ms: u32) -> Result<Arc<Lease>, LockError> {
    d.acquire(key, Some(wait_ms), CancellationToken::new()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_min_replicas_1_the_lease_and_its_fence_are_on_the_replica_when_handed_out_and_renews_wait_too(
) {
    if support::external() {
        return;
    }
    let (primary, replica) = primary_and_replica();
    let d = driver(url(primary.url()), "rep", &[("minReplicas", 1.0), ("leaseMs", 5_000.0)]);
    let lease = acquire(&d, "job", 0).await.unwrap();
    // Read at once, no waiting: WAIT answered only after the replica acknowledged.
    assert_eq!(get(&replica, &lease.keys.lock), lease.token);
    assert_eq!(get(&replica, &lease.keys.fence), lease.fence);
    assert_eq!(calls(&primary, "wait"), 1);

    d.renew(&lease).await.unwrap();
    assert_eq!(calls(&primary, "wait"), 2, "a renew waits for the replica too");
    assert!(lease.valid());
    assert!(d.release(&lease).await.unwrap());
    assert_eq!(calls(&primary, "wait"), 2, "a release sends no WAIT");
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_0_sends_no_wait() {
    if support::external() {
        return;
    }
    let (primary, _replica) = primary_and_replica();
    let d = driver(url(primary.url()), "norep", &[]);
    let lease = acquire(&d, "job", 0).await.unwrap();
    d.renew(&lease).await.unwrap();
    assert!(d.release(&lease).await.unwrap());
    assert_eq!(calls(&primary, "evalsha"), 3);
    assert_eq!(calls(&primary, "wait"), 0);
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_replica_fails_a_zero_wait_acquire_retryably_and_leaves_no_lock_on_the_primary() {
    if support::external() {
        return;
    }
    let (primary, replica) = primary_and_replica();
    let d =
        driver(url(primary.url()), "stopped", &[("minReplicas", 1.0), ("replicaTimeoutMs", 200.0)]);
    let lock_key = dokebi_lock_redis::testing::KeyNames::new("stopped", "job").lock;
    replica.pause();
    let started = Instant::now();
    let err = acquire(&d, "job", 0).await.unwrap_err();
    assert_too_few_replicas(&err);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "waitTimeoutMs 0 fails after one WAIT: {:?}",
        started.elapsed()
    );
    // The script did win on the primary; the background release by token takes it back.
    eventually("the lock key is released on the primary", Duration::from_secs(3), || {
        value(&primary.command(&["EXISTS", &lock_key])) == "0"
    })
    .await;
    assert_eq!(d.tracked_leases(), 0);
    replica.resume();
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_rides_out_a_stopped_replica_and_gets_the_lock_once_it_resumes() {
    if support::external() {
        return;
    }
    let (primary, replica) = primary_and_replica();
    let d =
        driver(url(primary.url()), "ride", &[("minReplicas", 1.0), ("replicaTimeoutMs", 100.0)]);
    replica.pause();
    let waiter = tokio::spawn({
        let d = d.clone();
        async move { acquire(&d, "job", 20_000).await }
    });
    // Two WAITs that timed out: the acquire failed twice and is still waiting.
    eventually("two unacknowledged attempts", Duration::from_secs(10), || {
        calls(&primary, "wait") >= 2
    })
    .await;
    assert!(!waiter.is_finished());
    replica.resume();
    let lease =
        waiter.await.unwrap().expect("the waiting acquire gets the lock once the replica is back");
    assert_eq!(get(&replica, &lease.keys.lock), lease.token);
    assert_eq!(get(&replica, &lease.keys.fence), lease.fence);
    assert!(d.release(&lease).await.unwrap());
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renew_during_a_stopped_replica_rejects_retryably_and_does_not_extend_the_lease() {
    if support::external() {
        return;
    }
    let (primary, replica) = primary_and_replica();
    let d = driver(
        url(primary.url()),
        "renew",
        &[("minReplicas", 1.0), ("replicaTimeoutMs", 200.0), ("leaseMs", 4_000.0)],
    );
    let lease = acquire(&d, "job", 0).await.unwrap();
    // Let the lease age, so that an extension to a full leaseMs would show.
    eventually("the lease to age", Duration::from_secs(4), || lease.remaining_ms() < 3_000).await;
    replica.pause();
    let err = d.renew(&lease).await.unwrap_err();
    assert_too_few_replicas(&err);
    assert!(lease.valid(), "the lease stays valid until its old deadline");
    assert!(lease.remaining_ms() < 3_000, "not extended: {} ms left", lease.remaining_ms());
    replica.resume();
    if let Err(e) = d.renew(&lease).await {
        panic!("renew after resume: {e:?}")
    }
    assert!(
        lease.remaining_ms() > 3_000,
        "a confirmed renew extends: {} ms left",
        lease.remaining_ms()
    );
    assert!(d.release(&lease).await.unwrap());
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn winners_share_one_wait_so_an_unrelated_release_waits_behind_one_wait_at_most() {
    if support::external() {
        return;
    }
    let (primary, replica) = primary_and_replica();
    let timeout_ms = 1_000u64;
    let d = driver(
        url(primary.url()),
        "stall",
        &[("minReplicas", 1.0), ("replicaTimeoutMs", timeout_ms as f64)],
    );
    // Load the release script first: a NOSCRIPT fallback would be a second command, sent
    // behind the next WAIT.
    let warm = acquire(&d, "warm", 0).await.unwrap();
    assert!(d.release(&warm).await.unwrap());
    let held = acquire(&d, "held", 0).await.unwrap();
    replica.pause();
    // Ten winners at once: one WAIT each, queued on the connection, would stall it 10 s.
    let winners: Vec<_> = (0..10)
        .map(|i| {
            let d = d.clone();
            tokio::spawn(async move { acquire(&d, &format!("w{i}"), 0).await })
        })
        .collect();
    eventually("a WAIT blocks the connection", Duration::from_secs(5), || {
        primary.command(&["INFO", "clients"]).contains("blocked_clients:1")
    })
    .await;
    let started = Instant::now();
    let released = d.release(&held).await;
    let stalled = started.elapsed();
    assert!(released.unwrap());
    // Behind one WAIT it waits at most that WAIT's timeout (1 s); 5 s is 5× that and half of
    // what ten queued WAITs would make.
    assert!(
        stalled < Duration::from_millis(timeout_ms * 5),
        "the release waited {stalled:?} behind WAITs"
    );
    for w in winners {
        assert_too_few_replicas(&w.await.unwrap().unwrap_err());
    }
    assert!(calls(&primary, "wait") < 2 + 10, "concurrent winners share WAITs");
    replica.resume();
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_own_noreplicas_refusal_reads_the_same_and_writes_nothing() {
    if support::external() {
        return;
    }
    // min-replicas-to-write with no replica: Redis refuses the script's first write itself.
    let primary = RedisServer::start_with_args(&["--min-replicas-to-write", "1"]);
    let d = driver(url(primary.url()), "refused", &[]);
    let err = acquire(&d, "job", 0).await.unwrap_err();
    assert_too_few_replicas(&err);
    let keys = dokebi_lock_redis::testing::KeyNames::new("refused", "job");
    assert_eq!(value(&primary.command(&["EXISTS", &keys.lock, &keys.fence])), "0");
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_needs_wait_in_the_acl_and_a_refused_wait_fails_at_once_and_leaves_no_lock() {
    if support::external() {
        return;
    }
    let (primary, _replica) = primary_and_replica();
    for (user, extra) in [("nowait", None), ("withwait", Some("+wait"))] {
        let mut setuser = vec!["ACL", "SETUSER", user];
        setuser.extend_from_slice(common::LEAST_PRIVILEGE_RULE);
        setuser.extend(extra);
        assert!(primary.command(&setuser).starts_with("+OK"));
    }
    let as_user =
        |user: &str| url(&primary.url().replace("redis://", &format!("redis://{user}:s3cret@")));
    let lock_key = dokebi_lock_redis::testing::KeyNames::new("locks", "job").lock;

    // Without +wait: the refusal itself, not "too few replicas", and not ridden out.
    let d = driver(as_user("nowait"), "locks", &[("minReplicas", 1.0)]);
    let started = Instant::now();
    let err = acquire(&d, "job", 5_000).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(3), "a refusal ends the wait at once");
    let cause = err.cause.as_ref().expect("cause");
    assert_eq!(
        (err.code, cause.server_code.as_deref(), cause.retryable()),
        (LockErrorCode::ProviderFailed, Some("NOPERM"), false)
    );
    eventually("the refused acquire is released", Duration::from_secs(3), || {
        value(&primary.command(&["EXISTS", &lock_key])) == "0"
    })
    .await;
    d.shutdown().await.unwrap();

    // With +wait: acquire, renew and release work, and nothing sent was refused (the
    // nowait user's refused WAIT is in the log; nothing of this one may be).
    let d = driver(as_user("withwait"), "locks", &[("minReplicas", 1.0)]);
    let lease = acquire(&d, "job", 0).await.unwrap();
    d.renew(&lease).await.unwrap();
    assert!(d.release(&lease).await.unwrap());
    d.shutdown().await.unwrap();
    let log = primary.command(&["ACL", "LOG"]);
    assert!(!log.contains("withwait"), "ACL LOG has denials of the user with +wait: {log}");
}

/// Waits until a WAIT blocks a connection of the primary.
async fn wait_in_flight(primary: &RedisServer) {
    eventually("a WAIT blocks the connection", Duration::from_secs(5), || {
        primary.command(&["INFO", "clients"]).contains("blocked_clients:1")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_during_wait_counts_as_too_few_replicas_not_an_unknown_outcome() {
    if support::external() {
        return;
    }
    let (primary, replica) = primary_and_replica();
    // A WAIT longer than the test, and commands allowed longer still (decision 0130).
    let connection = common::connection(
        primary.url(),
        &[("commandTimeoutMs", dokebi_lock_redis::Raw::Number(20_000.0))],
    );
    let d = driver(connection, "lost", &[("minReplicas", 1.0), ("replicaTimeoutMs", 10_000.0)]);
    let lock_key = dokebi_lock_redis::testing::KeyNames::new("lost", "job").lock;
    replica.pause();
    let attempt = tokio::spawn({
        let d = d.clone();
        async move { acquire(&d, "job", 0).await }
    });
    wait_in_flight(&primary).await;
    let started = Instant::now();
    primary.command(&["CLIENT", "KILL", "TYPE", "normal"]);
    let err = attempt.await.unwrap().unwrap_err();
    // The script's own reply settled the write; only its replication is unknown.
    assert_too_few_replicas(&err);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "failed when the connection went, not at replicaTimeoutMs"
    );
    eventually("the lock key is released on the primary", Duration::from_secs(3), || {
        value(&primary.command(&["EXISTS", &lock_key])) == "0"
    })
    .await;
    replica.resume();
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_the_primary_never_answers_counts_as_too_few_replicas_after_replica_and_command_timeouts(
) {
    if support::external() {
        return;
    }
    let (primary, replica) = primary_and_replica();
    let connection = common::connection(
        primary.url(),
        &[("commandTimeoutMs", dokebi_lock_redis::Raw::Number(2_500.0))],
    );
    // Stopped well before replicaTimeoutMs, the primary can never answer: only our own
    // limit (replicaTimeoutMs + commandTimeoutMs) ends the WAIT.
    let d = driver(connection, "stalled", &[("minReplicas", 1.0), ("replicaTimeoutMs", 2_000.0)]);
    let lock_key = dokebi_lock_redis::testing::KeyNames::new("stalled", "job").lock;
    replica.pause();
    let attempt = tokio::spawn({
        let d = d.clone();
        async move { acquire(&d, "job", 0).await }
    });
    wait_in_flight(&primary).await;
    primary.pause();
    let err = attempt.await.unwrap().unwrap_err();
    assert_too_few_replicas(&err);
    assert!(err.message.contains("did not answer WAIT"), "{}", err.message);
    primary.resume();
    eventually("the lock key is released on the primary", Duration::from_secs(8), || {
        value(&primary.command(&["EXISTS", &lock_key])) == "0"
    })
    .await;
    replica.resume();
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_wait_stalls_past_our_limit_the_next_round_is_not_sent_on_the_same_connection() {
    if support::external() {
        return;
    }
    let (primary, replica) = primary_and_replica();
    let options = dokebi_lock_redis::parse_backend(&dokebi_lock_redis::Raw::Object(vec![
        ("driver".into(), dokebi_lock_redis::Raw::String("redis".into())),
        ("connection".into(), dokebi_lock_redis::Raw::String("main".into())),
        ("namespace".into(), dokebi_lock_redis::Raw::String("rounds".into())),
        ("minReplicas".into(), dokebi_lock_redis::Raw::Number(1.0)),
        ("replicaTimeoutMs".into(), dokebi_lock_redis::Raw::Number(1_000.0)),
    ]))
    .unwrap();
    let connection = dokebi_lock_redis::parse_connection(&url(primary.url())).unwrap();
    let link = Arc::new(dokebi_lock_redis::testing::RedisLink::new(&connection, 0).unwrap());
    let command_timeout = Duration::from_millis(300);
    let replicas = dokebi_lock_redis::testing::Replicas::new(&options, command_timeout);
    let conn = link.connection().await.unwrap();
    let mut write = redis::cmd("SET");
    write.arg("rounds:written").arg("1");
    link.command_on(&conn, &write).await.unwrap();
    replica.pause();
    // Two writes confirmed at once: the first sends a WAIT, the second joins the round after it.
    let claim = || {
        let keys = dokebi_lock_redis::testing::KeyNames::new("rounds", "written");
        dokebi_lock_redis::testing::Claim::of(&keys, "token")
    };
    let first = replicas.confirm(&link, &conn, claim());
    let second = replicas.confirm(&link, &conn, claim());
    let both = async { tokio::join!(first, second) };
    tokio::pin!(both);
    tokio::select! {
        _ = &mut both => panic!("a WAIT answered although the replica is stopped"),
        _ = wait_in_flight(&primary) => {}
    }
    // The primary stalls too: only our own limit (replicaTimeoutMs + commandTimeoutMs) ends
    // the first round. The second must not wait out the same limit again on that connection.
    primary.pause();
    let paused = Instant::now();
    let (first, second) = both.await;
    let elapsed = paused.elapsed();
    let (first, second) = (first.unwrap_err(), second.unwrap_err());
    for failure in [&first, &second] {
        assert_eq!(failure.server_code.as_deref(), Some("NOREPLICAS"), "{failure:?}");
    }
    // The first round waited out its limit; the second was refused before it was sent, on a
    // connection given up. Sent, it would have waited out a second limit (and said so).
    assert!(first.message.contains("did not answer WAIT in time"), "{}", first.message);
    assert!(
        second.message.contains("connection to Redis was lost"),
        "the second round was sent on the stalled connection ({elapsed:?}): {}",
        second.message
    );
    primary.resume();
    replica.resume();
}

#[tokio::test]
async fn a_replica_timeout_not_below_the_command_timeout_is_refused_with_min_replicas() {
    // A WAIT as long as commandTimeoutMs would leave the release or renew queued behind it
    // on the shared connection no time of its own: it would fail OUTCOME_UNKNOWN, and a
    // renewed lease would turn invalid (decision 0130).
    let connection = dokebi_lock_redis::parse_connection(&common::connection(
        "redis://127.0.0.1:1",
        &[("commandTimeoutMs", dokebi_lock_redis::Raw::Number(1_500.0))],
    ))
    .unwrap();
    let backend = |fields: &[(&str, f64)]| {
        let mut all = vec![
            ("driver".to_owned(), dokebi_lock_redis::Raw::String("redis".into())),
            ("connection".to_owned(), dokebi_lock_redis::Raw::String("main".into())),
            ("namespace".to_owned(), dokebi_lock_redis::Raw::String("both".into())),
        ];
        all.extend(fields.iter().map(|(k, v)| (k.to_string(), dokebi_lock_redis::Raw::Number(*v))));
        dokebi_lock_redis::parse_backend(&dokebi_lock_redis::Raw::Object(all)).unwrap()
    };
    for replica_timeout in [1_500.0, 9_000.0] {
        let refused = Driver::new(
            &connection,
            backend(&[("minReplicas", 1.0), ("replicaTimeoutMs", replica_timeout)]),
        );
        let err = refused.err().expect("refused");
        assert_eq!(err.code, LockErrorCode::InvalidOptions);
        assert!(
            err.message.contains("replicaTimeoutMs") && err.message.contains("commandTimeoutMs"),
            "{}",
            err.message
        );
        assert!(!err.message.contains("1500") && !err.message.contains("9000"), "{}", err.message);
    }
    // Below it, or without minReplicas (no WAIT is sent), the driver is made.
    assert!(Driver::new(
        &connection,
        backend(&[("minReplicas", 1.0), ("replicaTimeoutMs", 1_499.0)])
    )
    .is_ok());
    assert!(Driver::new(&connection, backend(&[("replicaTimeoutMs", 9_000.0)])).is_ok());
}
