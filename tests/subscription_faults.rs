//! Faults of the release-notification subscription, in every mode: they must stay the
//! subscription's own (issue 22).

mod common;
mod support;

use std::sync::Arc;
use std::time::Duration;

use common::{connection, eventually, notifying_driver as driver, url};
use dokebi_lock_redis::testing::SubscriptionState;
use dokebi_lock_redis::Raw;
use dokebi_lock_redis::{Driver, Lease, LockError};
use support::RedisServer;
use tokio_util::sync::CancellationToken;

fn waiter(
    d: &Driver,
    key: &str,
    cancel: CancellationToken,
) -> tokio::task::JoinHandle<Result<Arc<Lease>, LockError>> {
    let (d, key) = (d.clone(), key.to_owned());
    tokio::spawn(async move { d.acquire(&key, Some(20_000), cancel).await })
}

/// The ids of the clients that are not subscribers (the drivers' command connections; the
/// CLIENT LIST of this check itself left out).
fn command_clients(redis: &RedisServer) -> Vec<String> {
    let list = redis.command(&["CLIENT", "LIST"]);
    let mut ids: Vec<String> = list
        .lines()
        .filter(|l| l.contains("id=") && !l.contains("cmd=client"))
        .filter(|l| !l.split(' ').any(|f| f.starts_with("flags=") && f.contains('P')))
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")).map(str::to_owned))
        .collect();
    ids.sort();
    ids
}

/// A subscription connection killed on its own says nothing about the command connection:
/// the backend keeps it, and its acquires, the woken waiter's and an unrelated one, run on
/// it as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_subscription_leaves_the_command_connection_alone() {
    if support::external() {
        return;
    }
    for mode in ["namespace", "per-key"] {
        let redis = RedisServer::start();
        let holder = driver(url(redis.url()), "alone", mode, &[]);
        let d = driver(url(redis.url()), "alone", mode, &[("pollIntervalMs", 20.0)]);
        let held = holder.acquire("a", None, CancellationToken::new()).await.unwrap();
        let waiting = waiter(&d, "a", CancellationToken::new());
        eventually("the subscription", Duration::from_secs(5), || {
            d.subscription_state() == SubscriptionState::Live
        })
        .await;
        let before = command_clients(&redis);
        assert_eq!(before.len(), 2, "{mode}: the holder's and the waiter's: {before:?}");

        redis.command(&["CLIENT", "KILL", "TYPE", "pubsub"]);
        eventually("the failure", Duration::from_secs(5), || {
            matches!(d.subscription_state(), SubscriptionState::Failed(_))
        })
        .await;
        holder.release(&held).await.unwrap();
        let lease = waiting.await.unwrap().unwrap();
        d.release(&lease).await.unwrap();
        let other = d.acquire("b", Some(0), CancellationToken::new()).await.unwrap();
        d.release(&other).await.unwrap();

        assert_eq!(command_clients(&redis), before, "{mode}: no command connection replaced");
        d.shutdown().await.unwrap();
        holder.shutdown().await.unwrap();
    }
}

/// Waits until key `a`'s subscription is let go while `b`'s stays, with the server
/// black-holed first: the UNSUBSCRIBE of `a` is then in flight and unanswered.
async fn unsubscribe_into_a_black_hole(
    redis: &RedisServer,
    d: &Driver,
    holder: &Driver,
) -> (Arc<Lease>, tokio::task::JoinHandle<Result<Arc<Lease>, LockError>>) {
    let held_a = holder.acquire("a", None, CancellationToken::new()).await.unwrap();
    let held_b = holder.acquire("b", None, CancellationToken::new()).await.unwrap();
    let leaves = CancellationToken::new();
    let waiting_a = waiter(d, "a", leaves.clone());
    let waiting_b = waiter(d, "b", CancellationToken::new());
    eventually("both keys' subscriptions", Duration::from_secs(5), || d.subscribed_keys() == 2)
        .await;
    leaves.cancel();
    assert!(waiting_a.await.unwrap().is_err());
    redis.pause();
    // The key is let go a grace period (1 s) after its line emptied.
    eventually("a let go", Duration::from_secs(10), || d.subscribed_keys() == 1).await;
    let _ = held_a;
    (held_b, waiting_b)
}

/// Shutdown does not wait for a subscription command the server never answers: with every
/// lease released, it settles within shutdownTimeoutMs although commandTimeoutMs is longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_does_not_wait_for_an_unanswered_unsubscribe() {
    if support::external() {
        return;
    }
    let redis = RedisServer::start();
    let slow = connection(redis.url(), &[("commandTimeoutMs", Raw::Number(10_000.0))]);
    let polls = [("notifyPollIntervalMs", 20_000.0), ("shutdownTimeoutMs", 500.0)];
    let holder = driver(url(redis.url()), "hole", "per-key", &[]);
    let d = driver(slow, "hole", "per-key", &polls);
    let (_held, waiting) = unsubscribe_into_a_black_hole(&redis, &d, &holder).await;

    let stopped = d.shutdown().await;
    assert!(stopped.is_ok(), "{stopped:?}");
    assert!(waiting.await.unwrap().is_err(), "the waiter ended with the shutdown");
    redis.resume();
    holder.shutdown().await.unwrap();
}

/// An UNSUBSCRIBE that times out is no failure of the subscription (decision 0110): the
/// keys still waited on stay subscribed and their releases are heard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsubscribe_that_times_out_leaves_the_other_keys_subscribed() {
    if support::external() {
        return;
    }
    let redis = RedisServer::start();
    let quick = connection(redis.url(), &[("commandTimeoutMs", Raw::Number(200.0))]);
    let polls = [("pollIntervalMs", 20_000.0), ("notifyPollIntervalMs", 20_000.0)];
    let holder = driver(url(redis.url()), "timeout", "per-key", &[]);
    let d = driver(quick, "timeout", "per-key", &polls);
    let (held_b, waiting_b) = unsubscribe_into_a_black_hole(&redis, &d, &holder).await;
    // Five times commandTimeoutMs: the UNSUBSCRIBE has timed out.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    redis.resume();

    assert_eq!(d.subscription_state(), SubscriptionState::Live);
    assert!(d.subscribed_keys() == 1);
    holder.release(&held_b).await.unwrap();
    // The safety polls are 20 s away: only the notification wakes the waiter.
    let lease = waiting_b.await.unwrap().unwrap();
    assert_eq!(d.notifications_received(), 1);
    d.release(&lease).await.unwrap();
    d.shutdown().await.unwrap();
    holder.shutdown().await.unwrap();
}

/// A restart closes both connections at once: the waiters woken by the subscription's loss
/// ride out the command connection's end too (it is announced closed, so their attempt is
/// surely not sent) and get the key, which the restart freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_woken_by_a_restart_ride_out_the_command_connections_end() {
    if support::external() {
        return;
    }
    for mode in ["namespace", "per-key"] {
        let mut redis = RedisServer::start();
        let holder = driver(url(redis.url()), "restart", mode, &[]);
        let d = driver(url(redis.url()), "restart", mode, &[("pollIntervalMs", 20.0)]);
        let _held = holder.acquire("a", None, CancellationToken::new()).await.unwrap();
        // Each takes the key in turn and hands it on.
        let waiting: Vec<_> = (0..4)
            .map(|_| {
                let d = d.clone();
                tokio::spawn(async move {
                    let lease = d.acquire("a", Some(20_000), CancellationToken::new()).await?;
                    d.release(&lease).await.map(|_| ())
                })
            })
            .collect();
        eventually("the subscription", Duration::from_secs(5), || {
            d.subscription_state() == SubscriptionState::Live
        })
        .await;
        redis.restart();
        let mut outcomes = Vec::new();
        for w in waiting {
            outcomes.push(w.await.unwrap());
        }
        assert!(outcomes.iter().all(Result::is_ok), "{mode}: {outcomes:?}");
        d.shutdown().await.unwrap();
        let _ = holder.shutdown().await;
    }
}
