//! The driver's own connection to a standalone node (decision 0180): what redis-rs's
//! connection did for it on the way in — the URL's database and credentials — and many
//! calls sharing one connection, each answered with its own reply.

mod common;
mod support;

use std::time::Duration;

use common::{driver, eventually, url};
use dokebi_lock_redis::LockErrorCode;
use support::RedisServer;
use tokio_util::sync::CancellationToken;

/// `db3:keys=2,…` of `INFO keyspace`, as a key count per database.
fn keys_in(redis: &RedisServer, db: u32) -> u64 {
    let info = redis.command(&["INFO", "keyspace"]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("db{db}:keys=")))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_naming_a_database_keeps_the_locks_in_that_database() {
    if support::external() {
        return;
    }
    let redis = RedisServer::start();
    let d = driver(url(&format!("{}/3", redis.url())), "db", &[]);
    let lease = d.acquire("report", Some(0), CancellationToken::new()).await.unwrap();
    assert!(keys_in(&redis, 3) > 0, "the lock is in database 3");
    assert_eq!(keys_in(&redis, 0), 0, "and nothing in database 0");
    assert!(d.release(&lease).await.unwrap());
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_only_url_authenticates_the_default_user() {
    if support::external() {
        return;
    }
    let redis = RedisServer::start();
    // Set after the start: the harness's own readiness PING has no password.
    assert!(redis.command(&["CONFIG", "SET", "requirepass", "s3cret"]).starts_with("+OK"));
    let with_password = redis.url().replace("redis://", "redis://:s3cret@");
    let d = driver(url(&with_password), "auth", &[]);
    let lease = d.acquire("report", Some(0), CancellationToken::new()).await.unwrap();
    assert!(d.release(&lease).await.unwrap());
    d.shutdown().await.unwrap();
}

/// 512 acquires, then their 512 releases, all in flight at once on the one connection:
/// a reply handed to the wrong call would give an acquire a release's reply (an
/// unexpected reply) or a release another key's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_of_many_calls_in_flight_gets_its_own_reply() {
    if support::external() {
        return;
    }
    let redis = RedisServer::start();
    let d = driver(url(redis.url()), "many", &[("maxWaiters", 1024.0)]);
    let keys: Vec<String> = (0..512).map(|i| format!("key-{i}")).collect();
    let acquires = keys.iter().map(|k| d.acquire(k, Some(0), CancellationToken::new()));
    let leases: Vec<_> = futures::future::join_all(acquires).await;
    let leases: Vec<_> = leases.into_iter().map(Result::unwrap).collect();
    let releases = leases.iter().map(|l| d.release(l));
    for released in futures::future::join_all(releases).await {
        assert!(released.unwrap(), "every release found its own lock");
    }
    d.shutdown().await.unwrap();
}

/// Redis stops answering with 256 acquires in flight on the one connection, so most of them
/// wait for the connection's task to write them together (decision 0189), then dies: each
/// acquire ends, as a failure whose outcome is unknown or that surely did not apply, and none
/// waits on for a command that will never be written or answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_calls_in_flight_all_end_when_redis_dies_under_them() {
    if support::external() {
        return;
    }
    let mut redis = RedisServer::start();
    let d = driver(url(redis.url()), "dies", &[("maxWaiters", 1024.0)]);
    // Connected, and the scripts loaded, before Redis stops.
    let warm = d.acquire("warm", Some(0), CancellationToken::new()).await.unwrap();
    assert!(d.release(&warm).await.unwrap());
    let before = d.stats().redis_attempts;
    redis.pause();
    let acquires: Vec<_> = (0..256)
        .map(|i| tokio::spawn(d.acquire(&format!("key-{i}"), Some(0), CancellationToken::new())))
        .collect();
    eventually("every acquire to make its attempt", Duration::from_secs(10), || {
        d.stats().redis_attempts >= before + 256
    })
    .await;
    redis.kill();
    let ended = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(acquires))
        .await
        .expect("every acquire ends once Redis is gone");
    for result in ended {
        let err = result.unwrap().expect_err("Redis answered none of them");
        assert!(
            matches!(err.code, LockErrorCode::OutcomeUnknown | LockErrorCode::ProviderFailed),
            "{err:?}"
        );
    }
}
