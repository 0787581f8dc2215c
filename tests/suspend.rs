//! A machine that sleeps while holding a lease (decision 0166): Redis's expiry ran on, so
//! on wake-up the lease must read as expired at once. The suspend is simulated by moving
//! the lease clock forward (`testing::skip_lease_clock`), which is process-wide: this file
//! holds one test so nothing else runs beside it.

mod common;
mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{driver, eventually, url};
use dokebi_lock_redis::testing::skip_lease_clock;
use dokebi_lock_redis::{Ended, KeepAlive, LockErrorCode};
use support::RedisServer;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_held_across_a_suspend_longer_than_lease_ms_is_expired_on_wake_up() {
    let redis = RedisServer::start();
    let d = driver(url(redis.url()), "suspend", &[("leaseMs", 60_000.0)]);
    let lease = d.acquire("job", Some(0), CancellationToken::new()).await.unwrap();
    let kept = tokio::spawn(
        d.keep_alive(&lease, KeepAlive { max_hold_ms: 600_000, every_ms: 50 }).unwrap(),
    );
    assert!(lease.valid() && lease.remaining_ms() > 50_000);
    // As index.js does at the first read of `lease.signal`.
    let told = Arc::new(AtomicBool::new(false));
    let heard = told.clone();
    let watcher = Arc::new(move |_| heard.store(true, Ordering::Release));
    assert!(matches!(d.watch_lease(lease.id, watcher), Some(None)));

    // The machine sleeps past the lease: Redis's key has expired by wall time, though
    // CLOCK_MONOTONIC (tokio's clock, std's Instant) saw none of the sleep.
    skip_lease_clock(Duration::from_millis(61_000));

    assert!(!lease.valid(), "valid on wake-up while another process may hold the key");
    assert_eq!(lease.remaining_ms(), 0);
    // What index.js's signal reads when it checks the lease: ended by its deadline.
    assert!(matches!(d.lease_ended(lease.id), Some(Some(Ended::Expired))));
    // The signal's own deadline timer is on a clock that saw no sleep (it would fire a
    // minute late): the driver notices the jump and tells the signal, within about a second.
    eventually("the signal to be told on wake-up", Duration::from_secs(10), || {
        told.load(Ordering::Acquire)
    })
    .await;
    assert_eq!(d.renew(&lease).await.unwrap_err().code, LockErrorCode::LeaseExpired);
    // The keep-alive's next tick finds the lease expired and stops without renewing it.
    eventually("the keep-alive to stop", Duration::from_secs(5), || kept.is_finished()).await;
    assert!(!lease.valid(), "no renewal after the wake-up brought it back");
    let _ = d.release(&lease).await;
    d.shutdown().await.unwrap();
}
