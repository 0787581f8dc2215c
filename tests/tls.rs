//! `rediss://` with a private CA, against a redis-server started with `--tls-port`.

mod common;
mod support;

use std::path::Path;
use std::process::Command;

use dokebi_lock_redis::Raw;
use dokebi_lock_redis::{Driver, LockErrorCode};
use support::RedisServer;
use tokio_util::sync::CancellationToken;

/// A CA and a server certificate for 127.0.0.1, made with the openssl CLI.
fn make_certificates(dir: &Path) {
    let run = |args: &[&str]| {
        let status =
            Command::new("openssl").args(args).current_dir(dir).output().expect("openssl runs");
        assert!(
            status.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&status.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=lock-test-ca",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(dir.join("ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n").unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "ext",
    ]);
}

fn driver(url: &str, ca: Option<String>) -> Driver {
    let mut fields = vec![("connectTimeoutMs", Raw::Number(1000.0))];
    if let Some(ca) = ca {
        fields.push(("tls", Raw::Object(vec![("ca".to_owned(), Raw::String(ca))])));
    }
    common::driver(common::connection(url, &fields), "tls", &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_ca_lets_the_driver_lock_over_tls_and_a_stranger_cert_is_refused() {
    if support::external() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("dokebi-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    make_certificates(&dir);
    let tls_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let path = |f: &str| dir.join(f).to_string_lossy().into_owned();
    let (cert, key, ca_file) = (path("server.crt"), path("server.key"), path("ca.crt"));
    let _redis = RedisServer::start_with_args(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca_file,
        "--tls-auth-clients",
        "no",
    ]);
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let ca = std::fs::read_to_string(dir.join("ca.crt")).unwrap();

    let d = driver(&url, Some(ca));
    let lease = d.acquire("k", Some(0), CancellationToken::new()).await.unwrap();
    assert!(lease.valid());
    assert!(d.release(&lease).await.unwrap());
    d.shutdown().await.unwrap();

    // Without the private CA the server's certificate is not trusted: the connect fails, nothing is sent.
    let stranger = driver(&url, None);
    let err = stranger.acquire("k", Some(0), CancellationToken::new()).await.unwrap_err();
    assert_eq!(err.code, LockErrorCode::ProviderFailed);
    assert!(
        !err.message.contains("127.0.0.1") && !err.message.contains(&tls_port),
        "{}",
        err.message
    );
    stranger.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
