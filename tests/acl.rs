//! The whole driver as a least-privilege user: only the commands, key pattern and channel
//! that the ACL rule of docs/operations.md grants.

mod common;
mod support;

use std::time::Duration;

use common::{driver, url};
use dokebi_lock_redis::testing::SubscriptionState;
use dokebi_lock_redis::Driver;
use dokebi_lock_redis::{parse_backend, parse_connection, Outcome, Raw};
use support::RedisServer;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_runs_whole_as_the_least_privileged_user() {
    if support::external() {
        return;
    }
    let redis = RedisServer::start_with_args(&["--maxmemory-policy", "noeviction"]);
    let mut setuser = vec!["ACL", "SETUSER", "locker"];
    setuser.extend_from_slice(common::LEAST_PRIVILEGE_RULE);
    assert!(redis.command(&setuser).starts_with("+OK"));
    let user_url = redis.url().replace("redis://", "redis://locker:s3cret@");
    let d = driver(
        url(&user_url),
        "locks",
        &[("pollIntervalMs", 5_000.0), ("notifyPollIntervalMs", 5_000.0)],
    );

    let held = d.acquire("k", Some(0), CancellationToken::new()).await.unwrap();
    d.renew(&held).await.unwrap();
    let waiter = tokio::spawn({
        let d = d.clone();
        async move { d.acquire("k", Some(5_000), CancellationToken::new()).await }
    });
    let end = std::time::Instant::now() + Duration::from_secs(3);
    while d.subscription_state() != SubscriptionState::Live {
        assert!(std::time::Instant::now() < end, "subscription state {:?}", d.subscription_state());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(d.release(&held).await.unwrap());
    let next = waiter.await.unwrap().expect("woken by the notification, well before the 5 s poll");
    assert!(d.release(&next).await.unwrap());
    d.shutdown().await.unwrap();

    // Nothing the driver sent was refused: not even what redis-rs sends on connect
    // (CLIENT SETINFO on Redis 7.2+ and Valkey). The log was empty before the driver ran.
    let log = redis.command(&["ACL", "LOG"]);
    assert_eq!(log, "*0\r\n", "ACL LOG has denials: {log}");
}

/// The rule these tests (and the minReplicas and Sentinel ones) grant is docs/operations.md's, word for
/// word but for the namespace and password they use: an edit to that rule is tested.
#[test]
fn the_tests_grant_the_rule_the_operations_guide_gives() {
    let line = include_str!("../docs/operations.md")
        .lines()
        .find(|l| l.starts_with("ACL SETUSER locker "))
        .expect("docs/operations.md, \"Least privilege\", has the ACL SETUSER line");
    let guide: Vec<String> = line
        .split(' ')
        .skip(3)
        .map(|word| word.replace("my-service", "locks").replace(">password", ">s3cret"))
        .collect();
    assert_eq!(guide, common::LEAST_PRIVILEGE_RULE);
}

/// docs/operations.md's rule for `notifications: 'per-key'`: the key channels (`&locks:lock-released*`)
/// and `+unsubscribe`, which the grace period's UNSUBSCRIBE needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_notifications_run_whole_as_the_least_privileged_user_with_the_guides_additions() {
    if support::external() {
        return;
    }
    let redis = RedisServer::start_with_args(&["--maxmemory-policy", "noeviction"]);
    let mut setuser = vec!["ACL", "SETUSER", "locker"];
    setuser.extend(common::LEAST_PRIVILEGE_RULE.iter().map(|r| {
        if *r == "&locks:lock-released" {
            "&locks:lock-released*"
        } else {
            r
        }
    }));
    setuser.push("+unsubscribe");
    assert!(redis.command(&setuser).starts_with("+OK"));
    let user_url = redis.url().replace("redis://", "redis://locker:s3cret@");
    let fields = vec![
        ("driver".to_owned(), Raw::String("redis".into())),
        ("connection".to_owned(), Raw::String("main".into())),
        ("namespace".to_owned(), Raw::String("locks".into())),
        ("notifications".to_owned(), Raw::String("per-key".into())),
        ("pollIntervalMs".to_owned(), Raw::Number(5_000.0)),
        ("notifyPollIntervalMs".to_owned(), Raw::Number(5_000.0)),
    ];
    let backend = parse_backend(&Raw::Object(fields)).unwrap();
    let d = Driver::new(&parse_connection(&url(&user_url)).unwrap(), backend).unwrap();

    let held = d.acquire("k", Some(0), CancellationToken::new()).await.unwrap();
    let waiter = tokio::spawn({
        let d = d.clone();
        async move { d.acquire("k", Some(5_000), CancellationToken::new()).await }
    });
    let end = std::time::Instant::now() + Duration::from_secs(3);
    while d.subscribed_keys() != 1 {
        assert!(std::time::Instant::now() < end, "subscription state {:?}", d.subscription_state());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(d.release(&held).await.unwrap());
    let next = waiter.await.unwrap().expect("woken by the notification, well before the 5 s poll");
    assert!(d.release(&next).await.unwrap());
    // The grace period passes: the key is unsubscribed (UNSUBSCRIBE) and the connection closes.
    let end = std::time::Instant::now() + Duration::from_secs(4);
    while d.subscription_state() != SubscriptionState::Off {
        assert!(std::time::Instant::now() < end, "subscription state {:?}", d.subscription_state());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    d.shutdown().await.unwrap();

    let log = redis.command(&["ACL", "LOG"]);
    assert!(!log.contains("locker"), "ACL LOG has denials: {log}");
}

/// Issue 34: an ACL written by category grants every command the scripts call but `TIME`
/// (only in `@fast`). The first acquire of a key then fails at once, even waiting, and leaves
/// neither the lease nor a counter at 1 behind; docs/operations.md says to add `+time`, and with it the
/// next acquire draws a fence seeded from TIME.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_written_by_category_refuses_a_new_keys_acquire_and_leaves_nothing_until_time_is_added(
) {
    if support::external() {
        return;
    }
    let redis = RedisServer::start_with_args(&["--maxmemory-policy", "noeviction"]);
    let by_category = [
        "ACL",
        "SETUSER",
        "locker",
        "on",
        ">s3cret",
        "resetkeys",
        "~locks:*",
        "resetchannels",
        "&locks:lock-released",
        "-@all",
        "+@read",
        "+@write",
        "+@scripting",
        "+@pubsub",
        "+@connection",
    ];
    assert!(redis.command(&by_category).starts_with("+OK"));
    let user_url = redis.url().replace("redis://", "redis://locker:s3cret@");
    let d = driver(url(&user_url), "locks", &[]);
    let keys = dokebi_lock_redis::testing::KeyNames::new("locks", "job");

    for wait_ms in [0, 5_000] {
        let started = std::time::Instant::now();
        let err = d.acquire("job", Some(wait_ms), CancellationToken::new()).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(1), "refused at once, waiting {wait_ms}");
        let cause = err.cause.as_ref().expect("the Redis refusal");
        assert_eq!(
            (err.code, cause.outcome, cause.retryable()),
            (dokebi_lock_redis::LockErrorCode::ProviderFailed, Outcome::Rejected, false)
        );
        assert_eq!(
            common::value(&redis.command(&["EXISTS", &keys.lock, &keys.fence])),
            "0",
            "neither the lease nor the counter is left"
        );
    }

    assert!(redis.command(&["ACL", "SETUSER", "locker", "+time"]).starts_with("+OK"));
    let seconds: u128 = common::value(&redis.command(&["TIME"])).parse().unwrap();
    let lease = d.acquire("job", Some(0), CancellationToken::new()).await.unwrap();
    let fence: u128 = lease.fence.parse().unwrap();
    assert!(fence > seconds * 1_000_000 && fence % 1000 == 1, "seeded from TIME: {fence}");
    assert!(d.release(&lease).await.unwrap());
    d.shutdown().await.unwrap();
}
