//! Liveness under faults (issue 10): failed releases do not pile up, a connect never
//! outlasts the wait, nothing is sent for a caller that left, and errors say what happened.

mod common;
mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{connection, driver, eventually, hash, url, value};
use dokebi_lock_redis::{parse_backend, parse_connection, Raw};
use dokebi_lock_redis::{Driver, LockErrorCode};
use support::RedisServer;
use tokio_util::sync::CancellationToken;

/// A TCP listener that accepts connections and holds them silent until `open()`, then
/// relays them (and later ones) to `upstream`; with no upstream it never answers.
struct Gate {
    port: u16,
    open: Arc<AtomicBool>,
}

impl Gate {
    fn start(upstream: Option<u16>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = Arc::new(AtomicBool::new(false));
        let flag = open.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let flag = flag.clone();
                std::thread::spawn(move || {
                    while !flag.load(Ordering::Acquire) {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    let Some(port) = upstream else {
                        std::thread::sleep(Duration::from_secs(60));
                        return;
                    };
                    let server = TcpStream::connect(("127.0.0.1", port)).unwrap();
                    relay(client.try_clone().unwrap(), server.try_clone().unwrap());
                    relay(server, client);
                });
            }
        });
        Self { port, open }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn open(&self) {
        self.open.store(true, Ordering::Release);
    }
}

fn relay(mut from: TcpStream, mut to: TcpStream) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 || to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Both);
    });
}

fn lock_key(ns: &str, key: &str) -> String {
    format!("{ns}:lock:{{{}}}", hash(key))
}

// --- 1: failed releases ----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_that_failed_while_redis_stalled_stop_counting_against_max_tracked_leases_once_confirmed(
) {
    if support::external() {
        return;
    }
    let redis = RedisServer::start();
    let ns = "blip";
    let d = driver(
        connection(
            redis.url(),
            &[("commandTimeoutMs", Raw::Number(200.0)), ("connectTimeoutMs", Raw::Number(300.0))],
        ),
        ns,
        &[("maxTrackedLeases", 5.0), ("leaseMs", 30_000.0)],
    );
    let mut leases = Vec::new();
    for i in 0..5 {
        leases.push(d.acquire(&format!("k{i}"), Some(0), CancellationToken::new()).await.unwrap());
    }
    redis.pause();
    for lease in &leases {
        let err = d.release(lease).await.unwrap_err();
        assert!(
            matches!(err.code, LockErrorCode::OutcomeUnknown | LockErrorCode::ProviderFailed),
            "{err:?}"
        );
    }
    assert_eq!(
        d.acquire("other", Some(0), CancellationToken::new()).await.unwrap_err().code,
        LockErrorCode::TooManyLeases
    );
    redis.resume();
    // The background releases land once Redis answers: the keys are gone and the leases
    // untracked, long before their 30 s lease would have run out.
    eventually(
        "the failed releases to be confirmed in the background",
        Duration::from_secs(5),
        || d.tracked_leases() == 0,
    )
    .await;
    for i in 0..5 {
        assert_eq!(value(&redis.command(&["EXISTS", &lock_key(ns, &format!("k{i}"))])), "0");
    }
    let again = d.acquire("other", Some(0), CancellationToken::new()).await.unwrap();
    assert!(again.valid());
    // A failed release is never reported as a success afterwards.
    assert!(!d.release(&leases[0]).await.unwrap());
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_failed_while_redis_was_down_is_untracked_once_its_key_surely_expired() {
    if support::external() {
        return;
    }
    let mut redis = RedisServer::start();
    let d = driver(
        connection(redis.url(), &[("connectTimeoutMs", Raw::Number(200.0))]),
        "down-release",
        &[("maxTrackedLeases", 1.0), ("leaseMs", 600.0)],
    );
    let lease = d.acquire("k", Some(0), CancellationToken::new()).await.unwrap();
    redis.kill();
    let started = Instant::now();
    let err = d.release(&lease).await.unwrap_err();
    assert!(
        matches!(err.code, LockErrorCode::ProviderFailed | LockErrorCode::OutcomeUnknown),
        "{err:?}"
    );
    assert_eq!(d.tracked_leases(), 1, "tracked while Redis may still hold the key");
    // Redis stays down: nothing can confirm the release, but past the lease's latest expiry
    // the key is surely gone, and the slot frees.
    eventually("the lease to be untracked at its latest expiry", Duration::from_secs(5), || {
        d.tracked_leases() == 0
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "not before the key could have expired: {:?}",
        started.elapsed()
    );
    let refused = d.acquire("k2", Some(0), CancellationToken::new()).await.unwrap_err();
    assert_eq!(
        refused.code,
        LockErrorCode::ProviderFailed,
        "Redis is down, but the registry no longer refuses"
    );
    let _ = d.shutdown().await;
}

// --- 2, 3: the connect ---------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_ends_at_its_deadline_while_the_connection_is_still_being_set_up() {
    let silent = Gate::start(None);
    let d = driver(
        connection(&silent.url(), &[("connectTimeoutMs", Raw::Number(3000.0))]),
        "cold",
        &[],
    );
    let started = Instant::now();
    let err = d.acquire("k", Some(200), CancellationToken::new()).await.unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.code, LockErrorCode::WaitTimeout, "{err:?}");
    assert!(
        took < Duration::from_millis(1500),
        "the 200 ms wait took {took:?} (connectTimeoutMs is 3 s)"
    );
    let _ = d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_wait_tries_once_so_it_waits_for_the_connect_up_to_connect_timeout() {
    let silent = Gate::start(None);
    let d = driver(
        connection(&silent.url(), &[("connectTimeoutMs", Raw::Number(400.0))]),
        "cold-zero",
        &[],
    );
    let started = Instant::now();
    let err = d.acquire("k", Some(0), CancellationToken::new()).await.unwrap_err();
    assert_eq!(err.code, LockErrorCode::ProviderFailed, "{err:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(350),
        "one real try: {:?}",
        started.elapsed()
    );
    let _ = d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_the_waiter_left_ends_on_its_own_and_the_next_caller_is_not_handed_its_stale_timeout(
) {
    if support::external() {
        return;
    }
    let redis = RedisServer::start();
    let gate = Gate::start(Some(redis.port));
    let d = driver(
        connection(&gate.url(), &[("connectTimeoutMs", Raw::Number(1000.0))]),
        "left-connect",
        &[],
    );
    let err = d.acquire("k", Some(100), CancellationToken::new()).await.unwrap_err();
    assert_eq!(err.code, LockErrorCode::WaitTimeout);
    // Long after connectTimeoutMs since that connect began, a zero-wait acquire starts, and
    // the server answers just after: it must get a connect of its own, not the stale end
    // of one nobody drove.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let next = tokio::spawn({
        let d = d.clone();
        async move { d.acquire("k", Some(0), CancellationToken::new()).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    gate.open();
    let lease = next.await.unwrap().expect("a connect of its own");
    d.release(&lease).await.unwrap();
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_aborted_or_shut_down_while_connecting_never_sends_its_script() {
    if support::external() {
        return;
    }
    let redis = RedisServer::start();
    let gate = Gate::start(Some(redis.port));
    let ns = "cold-abort";
    let d = driver(connection(&gate.url(), &[("connectTimeoutMs", Raw::Number(5000.0))]), ns, &[]);
    let cancel = CancellationToken::new();
    let aborted = tokio::spawn({
        let (d, cancel) = (d.clone(), cancel.clone());
        async move { d.acquire("aborted", Some(5_000), cancel).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    cancel.cancel();
    assert_eq!(aborted.await.unwrap().unwrap_err().code, LockErrorCode::Aborted);

    // The connection comes up (another acquire drives it): only that acquire may run.
    gate.open();
    let other = d.acquire("other", Some(5_000), CancellationToken::new()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        value(&redis.command(&["EXISTS", &format!("{ns}:lock-fence:{{{}}}", hash("other"))])),
        "1"
    );
    assert_eq!(value(&redis.command(&["EXISTS", &lock_key(ns, "aborted")])), "0");
    assert_eq!(
        value(&redis.command(&["EXISTS", &format!("{ns}:lock-fence:{{{}}}", hash("aborted"))])),
        "0",
        "no fence drawn"
    );
    d.release(&other).await.unwrap();
    d.shutdown().await.unwrap();

    // Shut down while connecting: the same.
    let gate = Gate::start(Some(redis.port));
    let d = driver(connection(&gate.url(), &[("connectTimeoutMs", Raw::Number(5000.0))]), ns, &[]);
    let stopped = tokio::spawn({
        let d = d.clone();
        async move { d.acquire("stopped", Some(5_000), CancellationToken::new()).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let shutdown = tokio::spawn({
        let d = d.clone();
        async move { d.shutdown().await }
    });
    assert_eq!(stopped.await.unwrap().unwrap_err().code, LockErrorCode::ShutDown);
    gate.open();
    shutdown.await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        value(&redis.command(&["EXISTS", &format!("{ns}:lock-fence:{{{}}}", hash("stopped"))])),
        "0",
        "never sent"
    );
}

// --- 7: causes ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renew_confirmed_while_release_runs_says_the_lease_was_released() {
    if support::external() {
        return;
    }
    let redis = RedisServer::start();
    let d = driver(url(redis.url()), "renew-release", &[]);
    // Load the scripts, so the renew and the release below run in the order they were sent
    // (a NOSCRIPT retry could swap them).
    let warm = d.acquire("warm", Some(0), CancellationToken::new()).await.unwrap();
    d.renew(&warm).await.unwrap();
    d.release(&warm).await.unwrap();
    let lease = d.acquire("k", Some(0), CancellationToken::new()).await.unwrap();
    // The renew is called (and sent) while the lease is valid; release() is called before
    // its confirmation is applied.
    redis.pause();
    let renewing = tokio::spawn(d.renew(&lease));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let releasing = tokio::spawn(d.release(&lease));
    redis.resume();
    let err = renewing.await.unwrap().unwrap_err();
    assert_eq!(err.code, LockErrorCode::LeaseExpired);
    assert!(err.message.contains("released"), "{}", err.message);
    assert!(!err.message.contains("expired"), "{}", err.message);
    assert!(releasing.await.unwrap().unwrap());
    d.shutdown().await.unwrap();
}

#[test]
fn a_malformed_pem_is_reported_by_its_field_not_as_a_bad_url() {
    // Not base64: no parser can read it. (A PEM of a few bytes parses as a PEM and is
    // refused later, by the TLS handshake, if at all.)
    let bad = |label: &str| {
        format!("-----BEGIN {label}-----\nnot base64 at all!\n-----END {label}-----\n")
    };
    let parses = |label: &str| format!("-----BEGIN {label}-----\nAAAA\n-----END {label}-----\n");
    for field in ["ca", "cert", "key"] {
        let tls = match field {
            "ca" => vec![("ca".to_owned(), Raw::String(bad("CERTIFICATE")))],
            "cert" => vec![
                ("cert".to_owned(), Raw::String(bad("CERTIFICATE"))),
                ("key".to_owned(), Raw::String(parses("PRIVATE KEY"))),
            ],
            _ => vec![
                ("cert".to_owned(), Raw::String(parses("CERTIFICATE"))),
                ("key".to_owned(), Raw::String(bad("PRIVATE KEY"))),
            ],
        };
        let conn = connection("rediss://127.0.0.1:6380", &[("tls", Raw::Object(tls))]);
        let backend = parse_backend(&Raw::Object(vec![
            ("driver".to_owned(), Raw::String("redis".into())),
            ("connection".to_owned(), Raw::String("main".into())),
            ("namespace".to_owned(), Raw::String("pem".into())),
        ]))
        .unwrap();
        let err = Driver::new(&parse_connection(&conn).unwrap(), backend)
            .err()
            .expect("a malformed PEM is refused");
        assert_eq!(err.code, LockErrorCode::InvalidOptions);
        assert!(
            err.message.contains(&format!("connection.tls.{field} ")),
            "{field}: {}",
            err.message
        );
        assert!(!err.message.contains("url"), "{field}: {}", err.message);
        assert!(!err.message.contains("base64"), "never the PEM's text: {}", err.message);
    }
}
