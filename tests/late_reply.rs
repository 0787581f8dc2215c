//! An acquire whose reply comes after its command timed out, from a Redis stalled for
//! longer than leaseMs (a slow script, a long fork, DEBUG SLEEP; here SIGSTOP): Redis runs
//! the queued acquire when it wakes, so the driver must still take it back by token then,
//! and a shutdown waiting on it must not report a cleanup it never saw (decision 0167).

mod common;
mod support;

use std::time::{Duration, Instant};

use common::{connection, driver, eventually, hash, value};
use dokebi_lock_redis::{Driver, LockErrorCode, Raw};
use support::RedisServer;
use tokio_util::sync::CancellationToken;

const LEASE_MS: f64 = 200.0;

/// A driver with leaseMs 200 and commandTimeoutMs 100 whose connection is open, so the
/// acquire that follows is surely submitted before the stall. connectTimeoutMs 100: the
/// stall outlasts a connection attempt (2 s by default), so no release sent in the chase
/// waits out the stall in a handshake and runs by luck after the acquire.
async fn warmed_driver(redis: &RedisServer, namespace: &str, shutdown_ms: f64) -> Driver {
    let timeouts =
        [("commandTimeoutMs", Raw::Number(100.0)), ("connectTimeoutMs", Raw::Number(100.0))];
    let conn = connection(redis.url(), &timeouts);
    let d = driver(conn, namespace, &[("leaseMs", LEASE_MS), ("shutdownTimeoutMs", shutdown_ms)]);
    d.release(&d.acquire("warm", Some(0), CancellationToken::new()).await.unwrap()).await.unwrap();
    d
}

/// Keys Redis expired by itself (lazily or actively) since it started.
fn expired_keys(redis: &RedisServer) -> u64 {
    let stats = redis.command(&["INFO", "stats"]);
    stats
        .lines()
        .find_map(|l| l.strip_prefix("expired_keys:"))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// Stalls Redis, lets one acquire time out in it, and keeps Redis stalled until the driver
/// counts its reply overdue: past the moment a key written before the timeout would have
/// expired (the timeout + leaseMs), where the chase used to give up.
async fn acquire_into_a_stall_longer_than_lease_ms(redis: &RedisServer, d: &Driver) {
    redis.pause();
    let err = d.acquire("k", Some(0), CancellationToken::new()).await.unwrap_err();
    assert_eq!(err.code, LockErrorCode::OutcomeUnknown);
    eventually(
        "the acquire's reply to be overdue and still awaited",
        Duration::from_secs(10),
        || d.overdue_acquire_replies() == 1,
    )
    .await;
}

/// Once Redis wakes and runs the queued acquire, the key goes again by the driver's
/// release (a DEL), never by expiring after a lease nobody held.
async fn taken_back_by_token(redis: &RedisServer, namespace: &str) {
    let key = format!("{namespace}:lock:{{{}}}", hash("k"));
    eventually("the late acquire's key to go", Duration::from_secs(10), || {
        value(&redis.command(&["EXISTS", &key])) == "0"
    })
    .await;
    assert_eq!(
        expired_keys(redis),
        0,
        "the late acquire's key was left to expire: held by nobody for a lease"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_run_after_a_stall_longer_than_lease_ms_is_taken_back_by_token() {
    let redis = RedisServer::start();
    let d = warmed_driver(&redis, "late", 5_000.0).await;
    acquire_into_a_stall_longer_than_lease_ms(&redis, &d).await;
    redis.resume();
    taken_back_by_token(&redis, "late").await;
    eventually("the overdue reply to be let go", Duration::from_secs(5), || {
        d.overdue_acquire_replies() == 0
    })
    .await;
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_a_late_acquire_reply_and_resolves_once_it_was_taken_back() {
    let redis = RedisServer::start();
    let d = warmed_driver(&redis, "waits", 20_000.0).await;
    acquire_into_a_stall_longer_than_lease_ms(&redis, &d).await;
    let shutdown = tokio::spawn({
        let d = d.clone();
        async move { d.shutdown().await }
    });
    tokio::time::sleep(Duration::from_millis(3 * LEASE_MS as u64)).await;
    assert!(!shutdown.is_finished(), "shutdown resolved while the acquire's outcome was unseen");
    redis.resume();
    let resolved = tokio::time::timeout(Duration::from_secs(15), shutdown).await;
    resolved.expect("shutdown resolves once Redis answered").unwrap().unwrap();
    taken_back_by_token(&redis, "waits").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_past_its_timeout_on_a_late_acquire_reply_is_cleanup_timeout_and_cleans_up_after()
{
    let redis = RedisServer::start();
    let d = warmed_driver(&redis, "timeout", 1_000.0).await;
    acquire_into_a_stall_longer_than_lease_ms(&redis, &d).await;
    let started = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(15), d.shutdown())
        .await
        .expect("shutdown ends by shutdownTimeoutMs")
        .unwrap_err();
    assert_eq!(err.code, LockErrorCode::CleanupTimeout, "resolved after {:?}", started.elapsed());
    redis.resume();
    taken_back_by_token(&redis, "timeout").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_dropped_while_its_script_is_in_flight_is_taken_back_once_redis_answers() {
    let redis = RedisServer::start();
    // A long commandTimeoutMs: the attempt still awaits its reply when its caller drops it.
    let conn = connection(redis.url(), &[("commandTimeoutMs", Raw::Number(10_000.0))]);
    let d = driver(conn, "dropped", &[("leaseMs", 10_000.0)]);
    d.release(&d.acquire("warm", Some(0), CancellationToken::new()).await.unwrap()).await.unwrap();
    redis.pause();
    let acquiring = d.acquire("k", Some(0), CancellationToken::new());
    let dropped = tokio::time::timeout(Duration::from_millis(200), acquiring).await;
    assert!(dropped.is_err(), "the acquire was still in flight when its caller dropped it");
    redis.resume();
    let fence = format!("dropped:lock-fence:{{{}}}", hash("k"));
    eventually("the dropped acquire's script to run", Duration::from_secs(10), || {
        value(&redis.command(&["EXISTS", &fence])) == "1"
    })
    .await;
    // Its 10 s lease would hold the key past this bound had nobody seen the reply.
    let key = format!("dropped:lock:{{{}}}", hash("k"));
    eventually("the dropped acquire's key to be taken back", Duration::from_secs(5), || {
        value(&redis.command(&["EXISTS", &key])) == "0"
    })
    .await;
    d.shutdown().await.unwrap();
}
