//! What a backend keeps per key for its release notifications stays the size of the keys
//! waited on now, whatever the subscription's state: here, a subscription that keeps failing
//! without counting as unsupported (issue 34, item 4; decision 0168).

mod common;
mod support;

use std::time::{Duration, Instant};

use common::{notifying_driver as driver, url};
use dokebi_lock_redis::testing::SubscriptionState;
use dokebi_lock_redis::Driver;
use support::RedisServer;
use tokio_util::sync::CancellationToken;

/// Distinct keys contended, one after another on each waiting backend.
const KEYS: usize = 10_000;
/// Waiting backends, each with its own tracker and its own failing subscription, working
/// at once to keep the run short.
const BACKENDS: usize = 8;
/// The most entries a tracker with one key waited on may hold over all its collections: the
/// key, its place in the send queue, and queue places of forgotten keys not yet cleaned out
/// (a few dozen at most; one per key contended, 2 × 1,250 here, without the bound).
const FOOTPRINT: usize = 32;

/// Waits for `done`, looking every millisecond (a key's hand-off takes a few).
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    // Each step needs a round trip or two and a 2 ms poll on an idle machine.
    let end = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < end, "{what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Contends [`KEYS`] distinct keys in `mode`, one after another on each of [`BACKENDS`]
/// waiting backends whose subscriptions are refused (the server's maxclients is reached):
/// each key is held by one lease, and a waiter that polls every 2 ms takes it after the
/// holder releases. `check(backend, waiting)` runs while the waiter waits and after it was
/// served. Returns the largest footprint seen.
async fn contend_while_subscriptions_fail(
    mode: &str,
    check: impl Fn(&Driver, bool) + Send + Sync + Copy + 'static,
) -> usize {
    let redis = RedisServer::start();
    let namespace = "bounded";
    let holder = driver(url(redis.url()), namespace, mode, &[]);
    let backends: Vec<Driver> = (0..BACKENDS)
        .map(|_| driver(url(redis.url()), namespace, mode, &[("pollIntervalMs", 2.0)]))
        .collect();
    // Every command connection opens now; no other client may connect after.
    for d in backends.iter().chain([&holder]) {
        let lease = d.acquire("warm-up", Some(0), CancellationToken::new()).await.unwrap();
        d.release(&lease).await.unwrap();
    }
    let reply = redis.command(&["CONFIG", "SET", "maxclients", &(BACKENDS + 1).to_string()]);
    assert!(reply.starts_with("+OK"), "{reply}");

    let workers: Vec<_> = backends
        .iter()
        .enumerate()
        .map(|(first, d)| {
            let (d, holder) = (d.clone(), holder.clone());
            tokio::spawn(async move {
                let mut most = 0;
                for i in (first..KEYS).step_by(BACKENDS) {
                    let key = format!("key-{i}");
                    let held = holder.acquire(&key, Some(0), CancellationToken::new()).await;
                    let held = held.unwrap();
                    let attempts = d.stats().redis_attempts;
                    let waiting = tokio::spawn({
                        let (d, key) = (d.clone(), key.clone());
                        async move { d.acquire(&key, Some(20_000), CancellationToken::new()).await }
                    });
                    // A second attempt follows a busy reply: the waiter really waits.
                    until("the waiter's second attempt", || {
                        d.stats().redis_attempts >= attempts + 2
                    })
                    .await;
                    check(&d, true);
                    most = most.max(d.notify_tracked().1);
                    assert!(holder.release(&held).await.unwrap());
                    let lease = waiting.await.unwrap().expect("served by its polls");
                    assert!(d.release(&lease).await.unwrap());
                    check(&d, false);
                    most = most.max(d.notify_tracked().1);
                }
                most
            })
        })
        .collect();
    let mut most = 0;
    for worker in workers {
        most = most.max(worker.await.unwrap());
    }
    for d in &backends {
        assert!(
            matches!(d.subscription_state(), SubscriptionState::Failed(_)),
            "{:?}",
            d.subscription_state()
        );
        assert_eq!(d.subscriptions(), 0, "never subscribed");
        assert_eq!(d.notifications_received(), 0, "every waiter was served by polling");
        d.shutdown().await.unwrap();
    }
    holder.shutdown().await.unwrap();
    most
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_tracking_holds_only_the_keys_waited_on_while_the_subscription_keeps_failing() {
    if support::external() {
        return;
    }
    let most = contend_while_subscriptions_fail("per-key", |d, waiting| {
        let (keys, footprint) = d.notify_tracked();
        if waiting {
            assert_eq!(keys, 1, "the key waited on is tracked, to be subscribed on the retry");
        } else {
            assert_eq!(keys, 0, "a key served is forgotten with its last waiter");
        }
        assert!(footprint <= FOOTPRINT, "footprint {footprint} with {keys} keys");
    })
    .await;
    eprintln!("largest footprint of a tracker: {most}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_tracking_holds_one_channel_at_most_while_the_subscription_keeps_failing() {
    if support::external() {
        return;
    }
    let most = contend_while_subscriptions_fail("namespace", |d, _| {
        let (channels, footprint) = d.notify_tracked();
        assert!(channels <= 1, "{channels} channels tracked");
        assert!(footprint <= FOOTPRINT, "footprint {footprint}");
    })
    .await;
    eprintln!("largest footprint of a tracker: {most}");
}
