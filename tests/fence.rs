//! The acquire script's work in Redis: the commands it runs, what a failed acquire leaves
//! behind, and fence counters with and without `fenceTtlMs` (decisions 0030, 0031).

mod common;
mod support;

use std::time::Duration;

use common::{calls, driver, eventually, hash, url, value};
use dokebi_lock_redis::{LockErrorCode, Outcome};
use support::RedisServer;
use tokio_util::sync::CancellationToken;

fn fence_key(namespace: &str, key: &str) -> String {
    format!("{namespace}:lock-fence:{{{}}}", hash(key))
}

fn lock_key(namespace: &str, key: &str) -> String {
    format!("{namespace}:lock:{{{}}}", hash(key))
}

fn pttl(redis: &RedisServer, key: &str) -> i64 {
    value(&redis.command(&["PTTL", key])).parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_on_a_known_key_runs_only_set_and_incr_in_redis() {
    if support::external() {
        return;
    }
    let redis = RedisServer::start();
    for (namespace, extra) in [("plain", vec![]), ("ttl", vec![("fenceTtlMs", 60_000.0)])] {
        let d = driver(url(redis.url()), namespace, &extra);
        let first = d.acquire("job", Some(0), CancellationToken::new()).await.unwrap();
        assert!(d.release(&first).await.unwrap());
        redis.command(&["CONFIG", "RESETSTAT"]);
        let lease = d.acquire("job", Some(0), CancellationToken::new()).await.unwrap();
        let counts: Vec<_> = ["set", "incr", "exists", "pttl", "time", "get"]
            .iter()
            .map(|c| calls(&redis, c))
            .collect();
        assert_eq!(counts, [1, 1, 0, 0, 0, 0], "{namespace}: set, incr, exists, pttl, time, get");
        assert_eq!(lease.fence.parse::<u128>().unwrap(), first.fence.parse::<u128>().unwrap() + 1);
        d.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_fence_cannot_be_drawn_leaves_no_lock_behind() {
    let redis = RedisServer::start();
    let d = driver(url(redis.url()), "broken", &[]);
    // A counter that is not an integer (written by hand): INCR fails after the SET succeeded.
    redis.command(&["SET", &fence_key("broken", "job"), "not-a-number"]);
    let err = d.acquire("job", Some(0), CancellationToken::new()).await.unwrap_err();
    assert_eq!(err.code, LockErrorCode::ProviderFailed);
    assert_eq!(err.cause.as_ref().map(|c| c.outcome), Some(Outcome::Rejected));
    assert_eq!(
        value(&redis.command(&["EXISTS", &lock_key("broken", "job")])),
        "0",
        "PROVIDER_FAILED: nothing took effect"
    );
    assert_eq!(value(&redis.command(&["GET", &fence_key("broken", "job")])), "not-a-number");
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_key_answers_busy_even_when_redis_refuses_writes() {
    if support::external() {
        return;
    }
    let redis = RedisServer::start_with_args(&["--maxmemory-policy", "noeviction"]);
    let d = driver(url(redis.url()), "oom", &[]);
    let held = d.acquire("job", Some(0), CancellationToken::new()).await.unwrap();
    redis.command(&["CONFIG", "SET", "maxmemory", "1"]);
    let busy = d.acquire("job", Some(0), CancellationToken::new()).await.unwrap_err();
    assert_eq!(
        busy.code,
        LockErrorCode::LockBusy,
        "the holder's PTTL, not the OOM of the refused SET"
    );
    let free = d.acquire("other", Some(0), CancellationToken::new()).await.unwrap_err();
    assert_eq!(free.cause.as_ref().and_then(|c| c.server_code.as_deref()), Some("OOM"));
    assert_eq!(value(&redis.command(&["EXISTS", &lock_key("oom", "other")])), "0");
    redis.command(&["CONFIG", "SET", "maxmemory", "0"]);
    assert!(d.release(&held).await.unwrap());
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_never_expire_without_fence_ttl() {
    let redis = RedisServer::start();
    let d = driver(url(redis.url()), "forever", &[]);
    let lease = d.acquire("job", Some(0), CancellationToken::new()).await.unwrap();
    assert!(d.release(&lease).await.unwrap());
    assert_eq!(pttl(&redis, &fence_key("forever", "job")), -1);
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_fence_ttl_counters_expire_and_fences_keep_rising_across_the_expiry() {
    let redis = RedisServer::start();
    let ttl_ms: i64 = 300;
    let d = driver(url(redis.url()), "ttl", &[("fenceTtlMs", ttl_ms as f64)]);
    let counter = fence_key("ttl", "job");

    let first = d.acquire("job", Some(0), CancellationToken::new()).await.unwrap();
    assert!(d.release(&first).await.unwrap());
    let seeded_ttl = pttl(&redis, &counter);
    assert!(seeded_ttl > 0 && seeded_ttl <= ttl_ms, "seeded with the expiry: {seeded_ttl}");
    // INCR keeps the expiry: it counts from the seed, not from each acquire.
    let second = d.acquire("job", Some(0), CancellationToken::new()).await.unwrap();
    assert!(d.release(&second).await.unwrap());
    let (f1, f2) = (first.fence.parse::<u128>().unwrap(), second.fence.parse::<u128>().unwrap());
    assert_eq!(f2, f1 + 1);
    let kept = pttl(&redis, &counter);
    assert!(kept > 0 && kept <= seeded_ttl, "not extended: {kept} after {seeded_ttl}");

    eventually("the counter to expire", Duration::from_secs(5), || {
        value(&redis.command(&["EXISTS", &counter])) == "0"
    })
    .await;
    let third = d.acquire("job", Some(0), CancellationToken::new()).await.unwrap();
    let f3 = third.fence.parse::<u128>().unwrap();
    assert!(f3 > f2, "a fence after the expiry ({f3}) is above every earlier one ({f2})");
    assert_eq!(f3 % 1000, 1, "seeded again from TIME: {f3}");
    assert!(pttl(&redis, &counter) > 0, "the new counter expires too");
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_ttl_shorter_than_the_lease_keeps_later_fences_above_the_holders() {
    let redis = RedisServer::start();
    let d = driver(url(redis.url()), "short", &[("fenceTtlMs", 1.0), ("leaseMs", 200.0)]);
    let counter = fence_key("short", "job");
    let mut last = 0u128;
    for _ in 0..5 {
        let lease = d.acquire("job", Some(0), CancellationToken::new()).await.unwrap();
        eventually("the counter to expire under the lease", Duration::from_secs(5), || {
            value(&redis.command(&["EXISTS", &counter])) == "0"
        })
        .await;
        // The holder's fence stays valid, and whoever comes next draws a larger one.
        assert!(d.release(&lease).await.unwrap());
        let fence = lease.fence.parse::<u128>().unwrap();
        assert!(fence > last, "{fence} after {last}");
        last = fence;
    }
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_seed_leaves_neither_the_lock_nor_a_counter_at_one_behind() {
    if support::external() {
        return; // creates an ACL user
    }
    let redis = RedisServer::start();
    // Every command but SET on both keys, and SET (a selector) on the lock keys only: INCR
    // creates the missing counter at 1, then the seed's SET is refused.
    let setuser = [
        "ACL",
        "SETUSER",
        "seedless",
        "on",
        ">s3cret",
        "resetkeys",
        "~seeds:*",
        "-@all",
        "+evalsha",
        "+eval",
        "+pttl",
        "+exists",
        "+time",
        "+incr",
        "+get",
        "+del",
        "+pexpire",
        "+publish",
        "+info",
        "+ping",
        "(~seeds:lock:* +set)",
    ];
    assert!(redis.command(&setuser).starts_with("+OK"), "Redis 7 ACL selectors");
    let user_url = redis.url().replace("redis://", "redis://seedless:s3cret@");
    let d = driver(url(&user_url), "seeds", &[]);
    let err = d.acquire("job", Some(0), CancellationToken::new()).await.unwrap_err();
    assert_eq!(err.code, LockErrorCode::ProviderFailed);
    assert_eq!(
        value(&redis.command(&["EXISTS", &lock_key("seeds", "job")])),
        "0",
        "the lease was taken back"
    );
    // A counter left at 1 would make the next acquire (with the ACL fixed) draw 2, far
    // below every fence handed out before the data loss.
    assert_eq!(
        value(&redis.command(&["EXISTS", &fence_key("seeds", "job")])),
        "0",
        "no counter left at 1"
    );
    d.shutdown().await.unwrap();
    let fixed = driver(url(redis.url()), "seeds", &[]);
    let lease = fixed.acquire("job", Some(0), CancellationToken::new()).await.unwrap();
    assert!(
        lease.fence.parse::<u128>().unwrap() > 1_000_000_000_000_000,
        "seeded from TIME: {}",
        lease.fence
    );
    fixed.shutdown().await.unwrap();
}
