//! TLS: the crypto provider, the PEMs checked as redis-rs will read them, and the
//! certificates handed to redis-rs.

use crate::error::{LockError, LockErrorCode};
use crate::options::TlsOptions;

/// redis-rs takes rustls's process-wide crypto provider; install ring once if none is.
pub(super) fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Parses each PEM as redis-rs will, so that a malformed one is reported by its field rather
/// than as a bad URL (the PEM's text is never repeated).
pub(super) fn check_pems(tls: &TlsOptions) -> Result<(), LockError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certificates = |pem: &str| {
        let parsed: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(pem.as_bytes()).collect();
        parsed.is_ok_and(|certs| !certs.is_empty())
    };
    let bad = |field: &str, what: &str| {
        Err(LockError::new(
            LockErrorCode::InvalidOptions,
            format!("connection.tls.{field} is not {what}"),
        ))
    };
    if tls.ca.as_deref().is_some_and(|ca| !certificates(ca) || !trust_anchors(ca)) {
        return bad("ca", "a valid PEM certificate");
    }
    if tls.cert.as_deref().is_some_and(|cert| !certificates(cert)) {
        return bad("cert", "a valid PEM certificate");
    }
    if tls.key.as_deref().is_some_and(|key| PrivateKeyDer::from_pem_slice(key.as_bytes()).is_err())
    {
        return bad("key", "a valid PEM private key");
    }
    Ok(())
}

/// Every certificate of `ca` is accepted as a trust anchor (as redis-rs requires).
fn trust_anchors(ca: &str) -> bool {
    use rustls::pki_types::pem::PemObject;
    let mut store = rustls::RootCertStore::empty();
    rustls::pki_types::CertificateDer::pem_slice_iter(ca.as_bytes())
        .all(|cert| cert.is_ok_and(|c| store.add(c).is_ok()))
}

pub(super) fn certificates(tls: &TlsOptions) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: match (&tls.cert, &tls.key) {
            (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                client_cert: cert.as_bytes().to_vec(),
                client_key: key.as_bytes().to_vec(),
            }),
            _ => None,
        },
        root_cert: tls.ca.as_ref().map(|ca| ca.as_bytes().to_vec()),
    }
}
