//! Per-key release notifications (`notifications: 'per-key'` / `'both'`, issue 17) against
//! a real redis-server.

mod common;
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{calls, eventually, hash, notifying_driver as driver, url};
use dokebi_lock_redis::testing::SubscriptionState;
use dokebi_lock_redis::{Driver, Lease, LockError};
use support::RedisServer;
use tokio_util::sync::CancellationToken;

/// `<namespace>:lock-released:{<hash>}`.
fn channel(namespace: &str, key: &str) -> String {
    format!("{namespace}:lock-released:{{{}}}", hash(key))
}

fn numsub(redis: &RedisServer, channel: &str) -> String {
    let reply = redis.command(&["PUBSUB", "NUMSUB", channel]);
    reply.rsplit(':').next().unwrap_or_default().trim().to_owned()
}

/// The channels with a subscriber, as `PUBSUB CHANNELS` lists them (RESP bulk strings).
fn channels(redis: &RedisServer) -> Vec<String> {
    let reply = redis.command(&["PUBSUB", "CHANNELS"]);
    let mut lines = reply.split("\r\n").skip(1);
    let mut out = Vec::new();
    while let (Some(_len), Some(name)) = (lines.next(), lines.next()) {
        out.push(name.to_owned());
    }
    out.sort();
    out
}

fn waiter(d: &Driver, key: &str) -> tokio::task::JoinHandle<Result<Arc<Lease>, LockError>> {
    let (d, key) = (d.clone(), key.to_owned());
    tokio::spawn(async move { d.acquire(&key, Some(8_000), CancellationToken::new()).await })
}

/// Safety polls so slow that only a notification can explain a quick wake-up.
const SLOW_POLLS: [(&str, f64); 2] =
    [("pollIntervalMs", 5_000.0), ("notifyPollIntervalMs", 5_000.0)];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_per_key_waiter_well_before_the_safety_poll() {
    let redis = RedisServer::start();
    let holder = driver(url(redis.url()), "pk", "per-key", &SLOW_POLLS);
    let d = driver(url(redis.url()), "pk", "per-key", &SLOW_POLLS);
    let held = holder.acquire("k", None, CancellationToken::new()).await.unwrap();
    let waiting = waiter(&d, "k");
    eventually("the key's subscription", Duration::from_secs(3), || d.subscribed_keys() == 1).await;
    assert_eq!(numsub(&redis, &channel("pk", "k")), "1");
    assert_eq!(
        channels(&redis),
        [channel("pk", "k")],
        "only the key's channel, not the namespace's"
    );
    let released_at = Instant::now();
    assert!(holder.release(&held).await.unwrap());
    let lease = waiting.await.unwrap().unwrap();
    assert!(
        released_at.elapsed() < Duration::from_millis(2_000),
        "woke after {:?}",
        released_at.elapsed()
    );
    assert_eq!(d.notifications_received(), 1);
    d.release(&lease).await.unwrap();
    d.shutdown().await.unwrap();
    holder.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_waiting_on_one_key_hears_nothing_of_releases_of_other_keys() {
    let redis = RedisServer::start();
    let listener = driver(url(redis.url()), "quiet", "per-key", &SLOW_POLLS);
    let other = driver(url(redis.url()), "quiet", "per-key", &SLOW_POLLS);
    let held = other.acquire("a", None, CancellationToken::new()).await.unwrap();
    let waiting = waiter(&listener, "a");
    eventually("the subscription to a", Duration::from_secs(3), || listener.subscribed_keys() == 1)
        .await;
    let published_before = calls(&redis, "publish");
    for i in 0..50 {
        let lease = other.acquire(&format!("b-{i}"), None, CancellationToken::new()).await.unwrap();
        assert!(other.release(&lease).await.unwrap());
    }
    // Every release of a b-key was published, on its own channel, to nobody.
    assert_eq!(calls(&redis, "publish"), published_before + 50);
    assert_eq!(listener.notifications_received(), 0, "heard releases of keys it does not wait on");
    assert_eq!(channels(&redis), [channel("quiet", "a")]);
    assert!(!waiting.is_finished());
    other.release(&held).await.unwrap();
    waiting.await.unwrap().unwrap();
    assert_eq!(listener.notifications_received(), 1);
    listener.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_new_keys_is_subscribed_in_a_few_round_trips_not_one_per_key_and_each_checks_once_more(
) {
    let redis = RedisServer::start();
    const KEYS: usize = 40;
    let holder = driver(url(redis.url()), "burst", "per-key", &[]);
    let d = driver(url(redis.url()), "burst", "per-key", &SLOW_POLLS);
    let mut held = Vec::new();
    for i in 0..KEYS {
        held.push(holder.acquire(&format!("k{i}"), None, CancellationToken::new()).await.unwrap());
    }
    let subscribes_before = calls(&redis, "subscribe");
    let waiting: Vec<_> = (0..KEYS).map(|i| waiter(&d, &format!("k{i}"))).collect();
    eventually("every key's subscription", Duration::from_secs(5), || d.subscribed_keys() == KEYS)
        .await;
    // Keys registered within the 2 ms window go out together, and those registered while a
    // SUBSCRIBE is in flight go in the next (decision 0061): one SUBSCRIBE on an idle
    // machine, two or three when a busy one spreads the 40 busy replies; one per key is 40.
    let subscribes = calls(&redis, "subscribe") - subscribes_before;
    assert!(subscribes <= 4, "{subscribes} SUBSCRIBEs for a burst of {KEYS} keys");
    assert_eq!(d.subscriptions(), subscribes, "each SUBSCRIBE confirmed once");
    assert_eq!(channels(&redis).len(), KEYS);
    // Each waiter has had its check at the confirmation; the safety poll is 5 s away, so
    // only each key's own notification wakes its waiter.
    let released_at = Instant::now();
    for lease in &held {
        holder.release(lease).await.unwrap();
    }
    for w in waiting {
        let lease = w.await.unwrap().unwrap();
        d.release(&lease).await.unwrap();
    }
    assert!(released_at.elapsed() < Duration::from_secs(3), "{:?}", released_at.elapsed());
    d.shutdown().await.unwrap();
    holder.shutdown().await.unwrap();
}

/// A release between a waiter's busy reply and its key's subscription is not heard: when
/// the subscription is confirmed, the key's first waiter asks Redis once more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_key_subscription_makes_its_waiter_check_once_more() {
    let redis = RedisServer::start();
    let d = driver(url(redis.url()), "race", "per-key", &SLOW_POLLS);
    // Held by a foreign owner without expiry: the waiter would sleep the 5 s safety poll.
    let names = dokebi_lock_redis::testing::KeyNames::new("race", "k");
    redis.command(&["SET", &names.lock, "foreign"]);
    let waiting = waiter(&d, "k");
    eventually("the key's subscription", Duration::from_secs(3), || d.subscribed_keys() == 1).await;
    eventually("the check once more", Duration::from_secs(1), || d.stats().redis_attempts == 2)
        .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(d.stats().redis_attempts, 2, "one attempt, one check at the confirmation");
    // Freed behind its back (no notification): the check has passed, the poll is seconds away.
    redis.command(&["DEL", &names.lock]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished());
    waiting.abort();
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_unsubscribed_a_grace_period_after_its_line_emptied_and_then_the_connection_closes(
) {
    let redis = RedisServer::start();
    let holder = driver(url(redis.url()), "grace", "per-key", &[]);
    let d = driver(url(redis.url()), "grace", "per-key", &SLOW_POLLS);
    let (a, b) = (channel("grace", "a"), channel("grace", "b"));
    let held_a = holder.acquire("a", None, CancellationToken::new()).await.unwrap();
    let held_b = holder.acquire("b", None, CancellationToken::new()).await.unwrap();
    let wait_a = waiter(&d, "a");
    let wait_b = waiter(&d, "b");
    eventually("both subscriptions", Duration::from_secs(3), || d.subscribed_keys() == 2).await;
    // a's line empties during this hand-off: the clock starts before it, so a busy machine's
    // slow hand-off cannot make the unsubscribe look early.
    let emptied = Instant::now();
    holder.release(&held_a).await.unwrap();
    let lease_a = wait_a.await.unwrap().unwrap();
    d.release(&lease_a).await.unwrap();
    // a's line is empty; b still waits: a goes after its grace period, b stays.
    eventually("a's unsubscribe", Duration::from_secs(4), || numsub(&redis, &a) == "0").await;
    let after = emptied.elapsed();
    assert!(after >= Duration::from_millis(900), "unsubscribed after {after:?}, before its grace");
    assert_eq!(numsub(&redis, &b), "1");
    assert_eq!(d.subscription_state(), SubscriptionState::Live);
    holder.release(&held_b).await.unwrap();
    let lease_b = wait_b.await.unwrap().unwrap();
    d.release(&lease_b).await.unwrap();
    eventually("b's unsubscribe", Duration::from_secs(4), || numsub(&redis, &b) == "0").await;
    eventually("the connection closing", Duration::from_secs(2), || {
        d.subscription_state() == SubscriptionState::Off
    })
    .await;
    d.shutdown().await.unwrap();
    holder.shutdown().await.unwrap();
}

/// The rolling migration of decision 0062: 'both' publishes on both channels, so a release
/// by a 'both' process wakes the waiters of a namespace process and of a per-key process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_in_both_mode_wakes_namespace_and_per_key_waiters() {
    let redis = RedisServer::start();
    let migrating = driver(url(redis.url()), "mig", "both", &SLOW_POLLS);
    let old = driver(url(redis.url()), "mig", "namespace", &SLOW_POLLS);
    let new = driver(url(redis.url()), "mig", "per-key", &SLOW_POLLS);
    for (i, waiting_driver) in [&old, &new].into_iter().enumerate() {
        let key = format!("k{i}");
        let held = migrating.acquire(&key, None, CancellationToken::new()).await.unwrap();
        let waiting = waiter(waiting_driver, &key);
        eventually("the subscription", Duration::from_secs(3), || {
            waiting_driver.subscription_state() == SubscriptionState::Live
                && (i == 0 || waiting_driver.subscribed_keys() == 1)
        })
        .await;
        tokio::time::sleep(Duration::from_millis(50)).await; // the confirmation's re-check
        let released_at = Instant::now();
        migrating.release(&held).await.unwrap();
        let lease = waiting.await.unwrap().unwrap();
        assert!(released_at.elapsed() < Duration::from_secs(2), "{:?}", released_at.elapsed());
        assert_eq!(waiting_driver.notifications_received(), 1);
        waiting_driver.release(&lease).await.unwrap();
    }
    for d in [migrating, old, new] {
        d.shutdown().await.unwrap();
    }
}

/// A fleet in the middle of a switch: one process on the namespace channel, one per key,
/// contending on one key. Neither hears the other's releases, so each relies on the
/// safety poll (notifyPollIntervalMs) for the other's: both keep acquiring, and no wait
/// takes more than a few safety intervals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_fleet_of_namespace_and_per_key_processes_both_make_progress() {
    let redis = RedisServer::start();
    let polls = [("pollIntervalMs", 25.0), ("notifyPollIntervalMs", 250.0)];
    let old = driver(url(redis.url()), "mixed", "namespace", &polls);
    let new = driver(url(redis.url()), "mixed", "per-key", &polls);
    let until = Instant::now() + Duration::from_secs(3);
    let run = |d: Driver| {
        tokio::spawn(async move {
            let (mut acquired, mut longest) = (0u32, Duration::ZERO);
            while Instant::now() < until {
                let asked = Instant::now();
                let lease = d.acquire("shared", Some(5_000), CancellationToken::new()).await?;
                longest = longest.max(asked.elapsed());
                acquired += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
                d.release(&lease).await?;
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            Ok::<_, LockError>((acquired, longest, d))
        })
    };
    let (old_run, new_run) = (run(old), run(new));
    let (old_acquired, old_longest, old) = old_run.await.unwrap().unwrap();
    let (new_acquired, new_longest, new) = new_run.await.unwrap().unwrap();
    assert!(old_acquired >= 5 && new_acquired >= 5, "acquired {old_acquired} / {new_acquired}");
    // A wait for the other process's release takes one or two safety intervals (250 ms),
    // a few when its polls keep landing on the other's 10 ms holds; 2.5 s is 5× two
    // intervals and half the 5 s waitTimeoutMs a starved process would run into.
    for longest in [old_longest, new_longest] {
        assert!(longest < Duration::from_millis(2_500), "a wait took {longest:?}");
    }
    old.shutdown().await.unwrap();
    new.shutdown().await.unwrap();
}

/// LOCK_NOTIFY_UNAVAILABLE's rules hold per key: a server that refuses SUBSCRIBE makes the
/// backend poll for good; a killed subscribe connection is a failure, ridden out by polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_or_killed_per_key_subscription_falls_back_to_polling() {
    if support::external() {
        return;
    }
    let redis = RedisServer::start();
    redis.command(&["ACL", "SETUSER", "nosub", "on", ">pw", "~*", "&*", "+@all", "-subscribe"]);
    let refused_url = redis.url().replace("redis://", "redis://nosub:pw@");
    let polls = [("pollIntervalMs", 20.0), ("notifyPollIntervalMs", 5_000.0)];
    let holder = driver(url(redis.url()), "fb", "per-key", &[]);
    let refused = driver(url(&refused_url), "fb", "per-key", &polls);
    let killed = driver(url(redis.url()), "fb", "per-key", &polls);

    let held = holder.acquire("a", None, CancellationToken::new()).await.unwrap();
    let waiting = waiter(&refused, "a");
    eventually("unsupported", Duration::from_secs(3), || {
        refused.subscription_state() == SubscriptionState::Unsupported
    })
    .await;
    holder.release(&held).await.unwrap();
    let lease = waiting.await.unwrap().unwrap(); // by its 20 ms poll
    refused.release(&lease).await.unwrap();

    let held = holder.acquire("b", None, CancellationToken::new()).await.unwrap();
    let waiting = waiter(&killed, "b");
    eventually("the key's subscription", Duration::from_secs(3), || killed.subscribed_keys() == 1)
        .await;
    redis.command(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    eventually("the failure", Duration::from_secs(3), || {
        matches!(killed.subscription_state(), SubscriptionState::Failed(_))
    })
    .await;
    // Woken at the failure, it polls every 20 ms instead of sleeping out the 5 s interval.
    let released_at = Instant::now();
    holder.release(&held).await.unwrap();
    let lease = waiting.await.unwrap().unwrap();
    assert!(released_at.elapsed() < Duration::from_secs(2), "{:?}", released_at.elapsed());
    killed.release(&lease).await.unwrap();
    for d in [holder, refused, killed] {
        d.shutdown().await.unwrap();
    }
}
