//! Connections that die without a word (issue 34, CONTRACT.md "Connection liveness"): a NAT,
//! a cloud load balancer or a partition drops an idle flow and tells neither side. Every
//! connection the driver holds PINGs after `pingIntervalMs` of quiet, and one whose PING
//! goes unanswered within `commandTimeoutMs` is replaced.

mod common;
mod support;

use std::time::{Duration, Instant};

use common::{connection, eventually, notifying_driver};
use dokebi_lock_redis::{LockErrorCode, Raw};
use support::middlebox::{Drop, Flows, Middlebox};
use support::RedisServer;
use tokio_util::sync::CancellationToken;

const PING_MS: f64 = 300.0;
const COMMAND_TIMEOUT_MS: f64 = 500.0;
/// Five times what finding a dead connection takes (one interval of quiet, one unanswered
/// PING), for a busy 2-core machine.
const FOUND_WITHIN: Duration =
    Duration::from_millis(5 * (PING_MS as u64 + COMMAND_TIMEOUT_MS as u64));

fn through(mb: &Middlebox, redis: &RedisServer, ping_ms: f64) -> Raw {
    connection(
        &mb.url_for(redis.url()),
        &[
            ("pingIntervalMs", Raw::Number(ping_ms)),
            ("commandTimeoutMs", Raw::Number(COMMAND_TIMEOUT_MS)),
        ],
    )
}

/// The waiters' subscription is cut silently while they keep coming: it is found dead within
/// an interval and a timeout, `stats()` says so, the waiters get the lock by polling
/// meanwhile (not after notifyPollIntervalMs, a minute here), and once the flow passes again
/// they subscribe anew and hear releases again. Namespace and per-key modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_cut_silently_is_found_dead_and_its_waiters_poll_then_hear_again() {
    if support::external() {
        return;
    }
    for mode in ["namespace", "per-key"] {
        let redis = RedisServer::start();
        let mb = Middlebox::start(redis.port);
        let holder = notifying_driver(common::url(redis.url()), "cut", mode, &[]);
        let d = notifying_driver(
            through(&mb, &redis, PING_MS),
            "cut",
            mode,
            &[("pollIntervalMs", 20.0), ("notifyPollIntervalMs", 60_000.0)],
        );

        let found_after = common::a_silent_cut_is_found_then_polled_then_heard_again(
            &d,
            &holder,
            "k",
            || assert_eq!(mb.cut(Flows::Subscribers, Drop::Silently), 1, "{mode}"),
            FOUND_WITHIN,
            || mb.live_subscribers() == 1,
        )
        .await;
        assert!(mb.pings_into_cut() >= 1, "{mode}: found by its PING");
        eprintln!("{mode}: a silent cut of the subscription was found after {found_after:?}");
        d.shutdown().await.unwrap();
        holder.shutdown().await.unwrap();
    }
}

/// A driver left idle past a middlebox's idle timeout hands its next acquire to a live
/// connection: its PING found the dropped flow first. Without PINGs (pingIntervalMs 0) the
/// same acquire goes to the dead flow and ends OUTCOME_UNKNOWN, which is what users of cloud
/// Redis meet as "ECONNRESET after 10 minutes idle".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_driver_whose_flow_was_dropped_acquires_on_a_live_connection() {
    if support::external() {
        return;
    }
    let redis = RedisServer::start();
    for how in [Drop::Silently, Drop::WithResetOnNextPacket] {
        let mb = Middlebox::start(redis.port);
        let pinging = notifying_driver(through(&mb, &redis, PING_MS), "idle", "namespace", &[]);
        let silent = notifying_driver(
            through(&mb, &redis, 0.0),
            "idle",
            "namespace",
            &[("shutdownTimeoutMs", 500.0)],
        );
        for d in [&pinging, &silent] {
            let lease = d.acquire("k", Some(0), CancellationToken::new()).await.unwrap();
            assert!(d.release(&lease).await.unwrap());
        }
        assert_eq!(mb.cut(Flows::All, how), 2, "{how:?}: both command flows");
        eventually("the dropped flow found", FOUND_WITHIN, || {
            pinging.stats().dead_connections == 1
        })
        .await;

        let lease = pinging.acquire("k", Some(0), CancellationToken::new()).await;
        let lease = lease.unwrap_or_else(|e| panic!("{how:?}: {:?}", e.code));
        assert!(pinging.release(&lease).await.unwrap());

        // Silently: no reply within commandTimeoutMs; reset: the RST comes after the write,
        // and nobody can say whether Redis read it first. Unknown either way.
        let err = silent.acquire("k", Some(0), CancellationToken::new()).await.unwrap_err();
        assert_eq!(err.code, LockErrorCode::OutcomeUnknown, "{how:?}: the fault is real");
        assert_eq!(silent.stats().dead_connections, 0);
        pinging.shutdown().await.unwrap();
        // Its unknown acquire's cleanup waits on a reply the dead flow will never bring:
        // shutdown may well say CLEANUP_TIMEOUT, which is not what this test is about.
        let _ = silent.shutdown().await;
    }
}

/// PINGs go only to a quiet connection: a driver that keeps acquiring sends none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_connection_sends_no_ping() {
    if support::external() {
        return;
    }
    let redis = RedisServer::start();
    let d = notifying_driver(
        connection(redis.url(), &[("pingIntervalMs", Raw::Number(200.0))]),
        "busy",
        "namespace",
        &[],
    );
    let pings = || {
        let info = redis.command(&["INFO", "commandstats"]);
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_ping:calls="))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse::<u64>().unwrap())
    };
    let before = pings(); // the harness's own readiness PINGs
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        let lease = d.acquire("k", Some(0), CancellationToken::new()).await.unwrap();
        assert!(d.release(&lease).await.unwrap());
    }
    assert_eq!(pings(), before, "no PING while commands flow");
    eventually("a PING once quiet", Duration::from_secs(5), || pings() > before).await;
    d.shutdown().await.unwrap();
}

/// Through Sentinel, both the data node's flows and the Sentinel's are dropped silently:
/// the command connection and the Sentinel watcher's subscription are both found dead, the
/// next acquire runs on a new connection to the primary, and the watcher subscribes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_sentinel_dropped_flows_to_the_primary_and_to_the_sentinel_are_replaced() {
    if support::external() {
        return;
    }
    let redis = RedisServer::start();
    let to_primary = Middlebox::start(redis.port);
    let sentinel = support::Sentinel::start_for_port("m", to_primary.port(), &[]);
    let to_sentinel = Middlebox::start(sentinel.port());
    let url = format!("redis-sentinel://127.0.0.1:{}#m", to_sentinel.port());
    let d = notifying_driver(
        connection(
            &url,
            &[
                ("pingIntervalMs", Raw::Number(PING_MS)),
                ("commandTimeoutMs", Raw::Number(COMMAND_TIMEOUT_MS)),
            ],
        ),
        "sentinel-cut",
        "namespace",
        &[],
    );
    let lease = d.acquire("k", Some(5_000), CancellationToken::new()).await.unwrap();
    assert!(d.release(&lease).await.unwrap());
    eventually("the watcher's subscription", Duration::from_secs(5), || {
        to_sentinel.live_subscribers() == 1
    })
    .await;

    to_primary.cut(Flows::All, Drop::Silently);
    to_sentinel.cut(Flows::All, Drop::Silently);
    eventually("both dead connections found", FOUND_WITHIN, || d.stats().dead_connections >= 2)
        .await;
    let lease = d.acquire("k", Some(5_000), CancellationToken::new()).await;
    let lease = lease.unwrap_or_else(|e| panic!("{:?}", e.code));
    assert!(d.release(&lease).await.unwrap());
    eventually("the watcher subscribed again", Duration::from_secs(10), || {
        to_sentinel.live_subscribers() == 1
    })
    .await;
    d.shutdown().await.unwrap();
}

/// An acquire sent into a flow a middlebox had already dropped never runs, but its reply
/// never comes either, and the flow looks open forever. The late-reply chase tells it apart
/// from a stalled server (the server answers on a new connection, the dropped flow answers
/// nothing) and ends, so shutdown confirms everything instead of CLEANUP_TIMEOUT (the chaos
/// run's standalone smoke met this at the end of a run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_lost_in_a_dropped_flow_does_not_hold_up_shutdown() {
    if support::external() {
        return;
    }
    let redis = RedisServer::start();
    let mb = Middlebox::start(redis.port);
    let d = notifying_driver(
        connection(
            &mb.url_for(redis.url()),
            &[("pingIntervalMs", Raw::Number(0.0)), ("commandTimeoutMs", Raw::Number(300.0))],
        ),
        "lost",
        "namespace",
        &[("leaseMs", 500.0), ("shutdownTimeoutMs", 10_000.0)],
    );
    let lease = d.acquire("k", Some(0), CancellationToken::new()).await.unwrap();
    assert!(d.release(&lease).await.unwrap());
    assert_eq!(mb.cut(Flows::All, Drop::Silently), 1);
    let err = d.acquire("k", Some(0), CancellationToken::new()).await.unwrap_err();
    assert_eq!(err.code, LockErrorCode::OutcomeUnknown);
    eventually("the chase past the lease", Duration::from_secs(5), || {
        d.overdue_acquire_replies() == 1
    })
    .await;
    eventually("the chase ended", Duration::from_secs(5), || d.overdue_acquire_replies() == 0)
        .await;
    d.shutdown().await.unwrap();
}
