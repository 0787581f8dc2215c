//! The driver's Redis paths against a real, throwaway redis-server.

mod common;
mod support;

use std::time::{Duration, Instant};

use common::{connection, driver, eventually, hash, url, value};
use dokebi_lock_redis::Raw;
use dokebi_lock_redis::{LockErrorCode, Outcome};
use support::RedisServer;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_are_exact_decimals_seeded_from_redis_time_and_survive_data_loss() {
    let redis = RedisServer::start();
    let d = driver(url(redis.url()), "fence", &[]);
    let before: u128 = value(&redis.command(&["TIME"])).parse().unwrap();
    let first = d.acquire("job", Some(0), CancellationToken::new()).await.unwrap();
    let fence: u128 = first.fence.parse().unwrap();
    // TIME's first element is seconds; the seed is milliseconds x 1000, plus 1.
    assert!(fence > before * 1_000_000 && fence % 1000 == 1, "fence {fence} vs time {before}");
    assert!(d.release(&first).await.unwrap());

    let second = d.acquire("job", Some(0), CancellationToken::new()).await.unwrap();
    assert_eq!(second.fence.parse::<u128>().unwrap(), fence + 1);
    d.release(&second).await.unwrap();

    // Around and far above 2^53 (where a Lua double stops being exact) a fence comes back
    // digit for digit.
    let fence_key = format!("fence:lock-fence:{{{}}}", hash("job"));
    for (stored, expected) in [
        ("9007199254740990", "9007199254740991"),
        ("9007199254740991", "9007199254740992"),
        ("9007199254740992", "9007199254740993"),
        ("9007199254740993000", "9007199254740993001"),
    ] {
        redis.command(&["SET", &fence_key, stored]);
        let lease = d.acquire("job", Some(0), CancellationToken::new()).await.unwrap();
        assert_eq!(lease.fence, expected);
        assert!(d.release(&lease).await.unwrap());
    }

    // Data loss: the counter restarts from TIME, still above every fence handed out before
    // (from the next millisecond on: within the same one both seeds are equal, D-0041).
    tokio::time::sleep(Duration::from_millis(2)).await;
    redis.command(&["FLUSHALL"]);
    let fourth = d.acquire("job", Some(0), CancellationToken::new()).await.unwrap();
    assert!(fourth.fence.parse::<u128>().unwrap() > fence + 1);
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_script_cache_falls_back_to_eval_once() {
    let redis = RedisServer::start();
    let d = driver(url(redis.url()), "noscript", &[]);
    let lease = d.acquire("k", Some(0), CancellationToken::new()).await.unwrap();
    redis.command(&["SCRIPT", "FLUSH"]);
    redis.command(&["CONFIG", "RESETSTAT"]);
    assert!(d.release(&lease).await.unwrap());
    let stats = redis.command(&["INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_evalsha:calls=1"), "{stats}");
    assert!(stats.contains("cmdstat_eval:calls=1"), "{stats}");
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_gets_the_lock_when_the_holder_releases_and_zero_wait_is_busy() {
    let redis = RedisServer::start();
    let d = driver(url(redis.url()), "wait", &[]);
    let held = d.acquire("k", None, CancellationToken::new()).await.unwrap();
    let busy = d.acquire("k", Some(0), CancellationToken::new()).await.unwrap_err();
    assert_eq!(busy.code, LockErrorCode::LockBusy);

    let waiter = tokio::spawn({
        let d = d.clone();
        async move { d.acquire("k", Some(2_000), CancellationToken::new()).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(d.release(&held).await.unwrap());
    let next = waiter.await.unwrap().unwrap();
    assert!(next.valid());
    assert!(next.fence.parse::<u128>().unwrap() > held.fence.parse::<u128>().unwrap());
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renew_extends_and_a_stolen_lease_is_lost() {
    let redis = RedisServer::start();
    let d = driver(url(redis.url()), "renew", &[("leaseMs", 300.0)]);
    let lease = d.acquire("k", Some(0), CancellationToken::new()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    d.renew(&lease).await.unwrap();
    assert!(
        lease.remaining_ms() > 200,
        "renewed to leaseMs from the renew: {}",
        lease.remaining_ms()
    );

    redis.command(&["SET", &format!("renew:lock:{{{}}}", hash("k")), "someone-else"]);
    let lost = d.renew(&lease).await.unwrap_err();
    assert_eq!(lost.code, LockErrorCode::LeaseLost);
    assert!(!lease.valid());
    assert_eq!(d.renew(&lease).await.unwrap_err().code, LockErrorCode::LeaseExpired);
    assert!(!d.release(&lease).await.unwrap(), "not ours any more");
    d.shutdown().await.unwrap();
}

/// A lease's watcher (what wakes its JS signal) that records, when told, how many
/// LEASE_LOST errors `stats()` counts at that moment.
fn lost_counted_when_told(
    d: &dokebi_lock_redis::Driver,
    lease: &dokebi_lock_redis::Lease,
) -> std::sync::Arc<std::sync::Mutex<Option<u64>>> {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(None));
    let (d, record) = (d.clone(), seen.clone());
    let watcher: dokebi_lock_redis::Watcher = std::sync::Arc::new(move |_| {
        let errors = d.stats().errors;
        let lost = errors.iter().find(|(code, _)| *code == LockErrorCode::LeaseLost).unwrap().1;
        *record.lock().unwrap() = Some(lost);
    });
    assert!(lease.watch(watcher).is_none());
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_that_ends_a_lease_is_counted_in_stats_before_its_signal_is_told() {
    // A listener on the signal that reads stats() finds the failure there (seen once in
    // CI: the keep-alive counted it only after the lease had ended).
    let redis = RedisServer::start();
    let d = driver(url(redis.url()), "counted", &[("leaseMs", 1_000.0)]);

    let lease = d.acquire("renewed", Some(0), CancellationToken::new()).await.unwrap();
    let seen = lost_counted_when_told(&d, &lease);
    redis.command(&["DEL", &format!("counted:lock:{{{}}}", hash("renewed"))]);
    assert_eq!(d.renew(&lease).await.unwrap_err().code, LockErrorCode::LeaseLost);
    assert_eq!(*seen.lock().unwrap(), Some(1), "renew(): counted when the watcher was told");

    let lease = d.acquire("kept", Some(0), CancellationToken::new()).await.unwrap();
    let seen = lost_counted_when_told(&d, &lease);
    let options = dokebi_lock_redis::KeepAlive { max_hold_ms: 60_000, every_ms: 20 };
    tokio::spawn(d.keep_alive(&lease, options).unwrap());
    redis.command(&["DEL", &format!("counted:lock:{{{}}}", hash("kept"))]);
    eventually("the keep-alive to end the lease", Duration::from_secs(5), || !lease.valid()).await;
    assert_eq!(*seen.lock().unwrap(), Some(2), "keepAlive: counted when the watcher was told");
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_confirmed_after_cancellation_is_released_by_token() {
    let redis = RedisServer::start();
    let d = driver(url(redis.url()), "cancel", &[]);
    // Warm the connection, so the attempt below is surely submitted before the pause.
    d.release(&d.acquire("warm", Some(0), CancellationToken::new()).await.unwrap()).await.unwrap();
    redis.pause();
    let cancel = CancellationToken::new();
    let attempt = tokio::spawn({
        let (d, cancel) = (d.clone(), cancel.clone());
        async move { d.acquire("k", Some(5_000), cancel).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    cancel.cancel();
    assert_eq!(attempt.await.unwrap().unwrap_err().code, LockErrorCode::Aborted);
    redis.resume();
    let key = format!("cancel:lock:{{{}}}", hash("k"));
    eventually("the late acquire's cleanup", Duration::from_secs(3), || {
        value(&redis.command(&["EXISTS", &key])) == "0"
    })
    .await;
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_reply_is_outcome_unknown_and_is_cleaned_up_once_redis_answers() {
    let redis = RedisServer::start();
    let d =
        driver(connection(redis.url(), &[("commandTimeoutMs", Raw::Number(150.0))]), "stall", &[]);
    d.release(&d.acquire("warm", Some(0), CancellationToken::new()).await.unwrap()).await.unwrap();
    redis.pause();
    let started = Instant::now();
    let err = d.acquire("k", Some(5_000), CancellationToken::new()).await.unwrap_err();
    assert_eq!(
        err.code,
        LockErrorCode::OutcomeUnknown,
        "never retried, never a wait past the unknown outcome"
    );
    assert!(started.elapsed() < Duration::from_millis(1_500), "{:?}", started.elapsed());
    assert_eq!(err.cause.as_ref().map(|c| c.outcome), Some(Outcome::Unknown));
    redis.resume();
    let key = format!("stall:lock:{{{}}}", hash("k"));
    // Redis ran the late acquire after it resumed; the driver takes it back by token.
    eventually("the unknown outcome's cleanup", Duration::from_secs(5), || {
        value(&redis.command(&["EXISTS", &key])) == "0"
    })
    .await;
    let again = d.acquire("k", Some(1_000), CancellationToken::new()).await.unwrap();
    assert!(again.valid());
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_listening_is_provider_failed_and_a_wait_rides_it_out_until_the_end() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let d = driver(url(&format!("redis://127.0.0.1:{port}")), "down", &[]);
    let once = d.acquire("k", Some(0), CancellationToken::new()).await.unwrap_err();
    assert_eq!(once.code, LockErrorCode::ProviderFailed);
    assert_eq!(once.cause.as_ref().map(|c| c.outcome), Some(Outcome::NotSubmitted));
    let started = Instant::now();
    let waited = d.acquire("k", Some(300), CancellationToken::new()).await.unwrap_err();
    assert_eq!(waited.code, LockErrorCode::ProviderFailed);
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "it rode out the failures until the wait ended"
    );
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_tracked_leases_and_stops_waits() {
    let redis = RedisServer::start();
    let d = driver(url(redis.url()), "stop", &[]);
    let a = d.acquire("a", Some(0), CancellationToken::new()).await.unwrap();
    let _b = d.acquire("b", Some(0), CancellationToken::new()).await.unwrap();
    let waiter = tokio::spawn({
        let d = d.clone();
        async move { d.acquire("a", Some(5_000), CancellationToken::new()).await }
    });
    eventually("the waiter to queue", Duration::from_secs(2), || d.waiters() == 1).await;
    d.shutdown().await.unwrap();
    assert_eq!(waiter.await.unwrap().unwrap_err().code, LockErrorCode::ShutDown);
    assert_eq!(value(&redis.command(&["KEYS", "stop:lock:*"])), "0", "every lock key is gone");
    assert!(!a.valid());
    assert!(!d.release(&a).await.unwrap(), "released by shutdown already");
    assert_eq!(
        d.acquire("c", Some(0), CancellationToken::new()).await.unwrap_err().code,
        LockErrorCode::ShutDown
    );
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_against_a_stalled_redis_times_out_and_never_claims_success() {
    let redis = RedisServer::start();
    let d = driver(url(redis.url()), "stall-stop", &[("shutdownTimeoutMs", 200.0)]);
    let _lease = d.acquire("k", Some(0), CancellationToken::new()).await.unwrap();
    redis.pause();
    let err = d.shutdown().await.unwrap_err();
    assert_eq!(err.code, LockErrorCode::CleanupTimeout);
    redis.resume();
    let key = format!("stall-stop:lock:{{{}}}", hash("k"));
    eventually("the late release", Duration::from_secs(3), || {
        value(&redis.command(&["EXISTS", &key])) == "0"
    })
    .await;
}
