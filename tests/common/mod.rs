//! What the driver's integration tests share: building a driver and reading Redis replies.
#![allow(dead_code)] // each test binary uses a different part of this

use std::time::{Duration, Instant};

use dokebi_lock_redis::Driver;
use dokebi_lock_redis::{parse_backend, parse_connection, Raw};

use crate::support::RedisServer;

/// A driver for `connection` (a URL string or an object, as JS would pass it) with the
/// namespace and extra integer options given.
pub(crate) fn driver(connection: Raw, namespace: &str, extra: &[(&str, f64)]) -> Driver {
    build(connection, namespace, None, extra)
}

/// [`driver`] with `notifications` set to `mode`.
pub(crate) fn notifying_driver(
    connection: Raw,
    namespace: &str,
    mode: &str,
    extra: &[(&str, f64)],
) -> Driver {
    build(connection, namespace, Some(mode), extra)
}

fn build(connection: Raw, namespace: &str, mode: Option<&str>, extra: &[(&str, f64)]) -> Driver {
    let mut fields = vec![
        ("driver".to_owned(), Raw::String("redis".into())),
        ("connection".to_owned(), Raw::String("main".into())),
        ("namespace".to_owned(), Raw::String(namespace.into())),
    ];
    fields.extend(mode.map(|m| ("notifications".to_owned(), Raw::String(m.into()))));
    fields.extend(extra.iter().map(|(k, v)| (k.to_string(), Raw::Number(*v))));
    let backend = parse_backend(&Raw::Object(fields)).unwrap();
    Driver::new(&parse_connection(&connection).unwrap(), backend).unwrap()
}

pub(crate) fn url(url: &str) -> Raw {
    Raw::String(url.to_owned())
}

/// A connection object: `{ url, …fields }`.
pub(crate) fn connection(url: &str, fields: &[(&str, Raw)]) -> Raw {
    let mut all = vec![("url".to_owned(), Raw::String(url.into()))];
    all.extend(fields.iter().map(|(k, v)| (k.to_string(), v.clone())));
    Raw::Object(all)
}

/// The lowercase SHA-256 hex of a key, as in `<namespace>:lock:{<hex>}`.
pub(crate) fn hash(key: &str) -> String {
    dokebi_lock_redis::testing::KeyNames::new("x", key).hash.to_string()
}

/// The bulk-string payload of a raw RESP reply, or the integer of an integer reply.
pub(crate) fn value(reply: &str) -> String {
    let mut lines = reply.split("\r\n");
    let first = lines.next().unwrap_or_default();
    match first.as_bytes().first() {
        Some(b'$') => lines.next().unwrap_or_default().to_owned(),
        _ => first[1..].to_owned(),
    }
}

/// `calls=` of a command in `INFO commandstats`.
pub(crate) fn calls(redis: &RedisServer, command: &str) -> u64 {
    let stats = redis.command(&["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

pub(crate) async fn eventually(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let end = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < end, "{what} did not happen within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// docs/operations.md, "Least privilege", for the namespace `locks` (user password `s3cret`): the
/// ACL tests, the minReplicas one (+ `+wait`) and the Sentinel one (+ `+role`) all start here.
/// `tests/acl.rs` checks it against that line.
/// The Cluster line of docs/operations.md, added to the rule on every node of a Cluster: the topology
/// redis-rs reads, and the sharded channels (with `&…lock-released*` for per-key mode).
pub(crate) const CLUSTER_PRIVILEGE_ADDITIONS: &[&str] =
    &["+cluster|slots", "+unsubscribe", "+spublish", "+ssubscribe", "+sunsubscribe"];

pub(crate) const LEAST_PRIVILEGE_RULE: &[&str] = &[
    "on",
    ">s3cret",
    "resetkeys",
    "~locks:*",
    "resetchannels",
    "&locks:lock-released",
    "-@all",
    "+evalsha",
    "+eval",
    "+set",
    "+pttl",
    "+exists",
    "+time",
    "+incr",
    "+get",
    "+del",
    "+pexpire",
    "+publish",
    "+subscribe",
    "+info",
    "+ping",
];

/// The `driver` and `code` fields of every log event, in order (a process-wide subscriber:
/// the driver's tasks run on the runtime's threads, and other tests' drivers log too).
pub(crate) fn recorded_codes() -> &'static std::sync::Mutex<Vec<(u64, String)>> {
    use tracing_subscriber::layer::SubscriberExt;
    static CODES: std::sync::OnceLock<std::sync::Mutex<Vec<(u64, String)>>> =
        std::sync::OnceLock::new();
    struct Codes;
    struct Code(u64, Option<String>);
    impl tracing::field::Visit for Code {
        fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
            if field.name() == "code" {
                self.1 = Some(value.to_owned());
            }
        }
        fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
            if field.name() == "driver" {
                self.0 = value;
            }
        }
        fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
    }
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Codes {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            if event.metadata().target() != dokebi_lock_redis::testing::EVENT_TARGET {
                return;
            }
            let mut code = Code(0, None);
            event.record(&mut code);
            if let Some(name) = code.1 {
                CODES.get().unwrap().lock().unwrap().push((code.0, name));
            }
        }
    }
    CODES.get_or_init(|| {
        let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Codes));
        std::sync::Mutex::new(Vec::new())
    })
}

/// Issue 34's silent cut of a subscription, in any mode: `d` (pollIntervalMs short,
/// notifyPollIntervalMs a minute) waits on `key`, which `holder` holds, until its
/// subscription is live; `cut` drops that subscription's flow without a word. The dead
/// subscription must be found within `found_within` (`stats()` says `failed` and counts it),
/// the waiter must get the lock by polling, and waiters that come back after the resubscribe
/// rule's 5 s must subscribe anew (`resubscribed` too) and hear a release again. Returns how
/// long finding it took.
pub(crate) async fn a_silent_cut_is_found_then_polled_then_heard_again(
    d: &Driver,
    holder: &Driver,
    key: &str,
    cut: impl FnOnce(),
    found_within: Duration,
    resubscribed: impl Fn() -> bool,
) -> Duration {
    use dokebi_lock_redis::testing::SubscriptionState;
    use tokio_util::sync::CancellationToken;
    let waiter = || {
        let (d, key) = (d.clone(), key.to_owned());
        tokio::spawn(async move { d.acquire(&key, Some(60_000), CancellationToken::new()).await })
    };
    let held = holder.acquire(key, None, CancellationToken::new()).await.unwrap();
    let waiting = waiter();
    eventually("the subscription", Duration::from_secs(5), || {
        d.subscription_state() == SubscriptionState::Live
    })
    .await;
    cut();
    let cut_at = Instant::now();
    eventually("the dead subscription found", found_within, || {
        matches!(d.subscription_state(), SubscriptionState::Failed(_))
    })
    .await;
    let found_after = cut_at.elapsed();
    assert!(d.stats().dead_connections >= 1, "found by its PING");

    // Released while nobody can hear it: the waiter polls, not a minute.
    holder.release(&held).await.unwrap();
    let polled = tokio::time::timeout(Duration::from_secs(10), waiting).await;
    let lease = polled.expect("the waiter polled").unwrap().unwrap();
    d.release(&lease).await.unwrap();

    let heard_before = d.stats().notifications_received;
    let held = holder.acquire(key, None, CancellationToken::new()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(6)).await; // the resubscribe rule's own 5 s
    let waiting = waiter();
    eventually("a new subscription", Duration::from_secs(10), || {
        d.subscription_state() == SubscriptionState::Live && resubscribed()
    })
    .await;
    holder.release(&held).await.unwrap();
    let heard = tokio::time::timeout(Duration::from_secs(10), waiting).await;
    let lease = heard.expect("the waiter heard the release").unwrap().unwrap();
    assert!(d.stats().notifications_received > heard_before, "heard again");
    d.release(&lease).await.unwrap();
    found_after
}
