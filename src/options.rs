//! Backend options and the Redis connection, validated as the contract fixes them.
//!
//! Input arrives as [`Raw`], a plain mirror of a JS value, so validation lives here in Rust
//! and sees `undefined`, `NaN` or a fraction exactly as the caller wrote them. Errors name
//! the field and the rule, never the value: a URL holds a password.

use crate::error::{LockError, LockErrorCode};
use crate::sentinel::{is_sentinel_url, SentinelUrl};

/// A JS value as the binding hands it over.
#[derive(Debug, Clone, PartialEq)]
pub enum Raw {
    /// `undefined`, or an absent field.
    Undefined,
    /// `null`.
    Null,
    /// A boolean.
    Bool(bool),
    /// A number.
    Number(f64),
    /// A string.
    String(String),
    /// An object's own fields, in order.
    Object(Vec<(String, Raw)>),
    /// Arrays, functions, symbols, bigints: never valid where options are read.
    Other(&'static str),
}

impl Raw {
    fn type_name(&self) -> &'static str {
        match self {
            Raw::Undefined => "undefined",
            Raw::Null => "null",
            Raw::Bool(_) => "a boolean",
            Raw::Number(_) => "a number",
            Raw::String(_) => "a string",
            Raw::Object(_) => "an object",
            Raw::Other(name) => name,
        }
    }
}

pub(crate) const MAX_INT: u32 = i32::MAX as u32;

/// The validated options of one backend (`parseRedisLockBackend`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendOptions {
    pub(crate) connection: String,
    pub(crate) namespace: String,
    pub(crate) lease_ms: u32,
    pub(crate) wait_timeout_ms: u32,
    pub(crate) poll_interval_ms: u32,
    pub(crate) notify_poll_interval_ms: u32,
    pub(crate) max_waiters: u32,
    pub(crate) max_tracked_leases: u32,
    pub(crate) shutdown_timeout_ms: u32,
    pub(crate) max_key_bytes: u32,
    /// Replicas that must acknowledge a winning acquire and a renew (issue 11; 0 = no WAIT).
    pub(crate) min_replicas: u32,
    pub(crate) replica_timeout_ms: u32,
    /// Expiry of a newly seeded fence counter; `None`: counters never expire (decision 0031).
    pub(crate) fence_ttl_ms: Option<u64>,
    /// Where releases are announced and waiters listen (issue 17, decision 0060).
    pub(crate) notifications: NotificationMode,
}

/// `notifications`: the channels a release publishes on and a waiter listens to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum NotificationMode {
    /// The TypeScript driver's one channel `<namespace>:lock-released` (the default).
    #[default]
    Namespace,
    /// A channel per key, `<namespace>:lock-released:{<hash>}`; waiters subscribe to the
    /// keys they wait on only.
    PerKey,
    /// Migration: publishes on both channels, listens per key (decision 0062).
    Both,
}

impl NotificationMode {
    pub(crate) const VALUES: [(&'static str, Self); 3] =
        [("namespace", Self::Namespace), ("per-key", Self::PerKey), ("both", Self::Both)];

    #[cfg_attr(not(all(feature = "node", not(test))), allow(dead_code))] // read by the binding
    pub(crate) fn as_str(self) -> &'static str {
        Self::VALUES.iter().find(|(_, m)| *m == self).map_or("namespace", |(name, _)| name)
    }

    /// Waiters listen on the channels of their keys, not the namespace channel.
    pub(crate) fn per_key(self) -> bool {
        self != Self::Namespace
    }
}

/// One integer field: its name, default and inclusive range.
struct IntField {
    name: &'static str,
    default: u32,
    min: u32,
}

const INT_FIELDS: [IntField; 10] = [
    IntField { name: "leaseMs", default: 10_000, min: 1 },
    IntField { name: "waitTimeoutMs", default: 5_000, min: 0 },
    IntField { name: "pollIntervalMs", default: 25, min: 1 },
    IntField { name: "notifyPollIntervalMs", default: 250, min: 1 },
    IntField { name: "maxWaiters", default: 128, min: 1 },
    IntField { name: "maxTrackedLeases", default: 10_000, min: 1 },
    IntField { name: "shutdownTimeoutMs", default: 5_000, min: 0 },
    IntField { name: "maxKeyBytes", default: 1_024, min: 1 },
    // Extensions (issue 11, docs/decisions/0025).
    IntField { name: "minReplicas", default: 0, min: 0 },
    IntField { name: "replicaTimeoutMs", default: DEFAULT_REPLICA_TIMEOUT_MS, min: 1 },
];

/// The WAIT timeout: see docs/decisions/0025 for the measurement behind it.
pub(crate) const DEFAULT_REPLICA_TIMEOUT_MS: u32 = 500;

fn invalid(message: String) -> LockError {
    LockError::new(LockErrorCode::InvalidOptions, message)
}

/// An object's fields, after rejecting any name not in `known`.
fn fields<'a>(what: &str, raw: &'a Raw, known: &[&str]) -> Result<&'a [(String, Raw)], LockError> {
    let Raw::Object(fields) = raw else {
        return Err(invalid(format!("{what} must be an object, not {}", raw.type_name())));
    };
    for (name, _) in fields {
        if !known.contains(&name.as_str()) {
            // The name of an unknown field is the caller's code, not a secret; it makes the typo findable.
            let shown: String = name.chars().filter(|c| !c.is_control()).take(64).collect();
            return Err(invalid(format!(
                "{what} has an unknown field '{shown}'; known fields: {}",
                known.join(", ")
            )));
        }
    }
    Ok(fields)
}

/// A field's value; `undefined` counts as absent, as in an object spread from optional values.
fn get<'a>(fields: &'a [(String, Raw)], name: &str) -> Option<&'a Raw> {
    fields.iter().find(|(n, _)| n == name).map(|(_, v)| v).filter(|v| **v != Raw::Undefined)
}

/// A whole number in `min..=MAX_INT`.
pub(crate) fn int_in_range(what: &str, raw: &Raw, min: u32) -> Result<u32, LockError> {
    let rule = || invalid(format!("{what} must be an integer from {min} to {MAX_INT}"));
    match raw {
        Raw::Number(n)
            if n.is_finite()
                && n.fract() == 0.0
                && *n >= f64::from(min)
                && *n <= f64::from(MAX_INT) =>
        {
            Ok(*n as u32)
        }
        _ => Err(rule()),
    }
}

fn required_string<'a>(what: &str, raw: Option<&'a Raw>) -> Result<&'a str, LockError> {
    match raw {
        Some(Raw::String(s)) if !s.is_empty() => Ok(s),
        Some(Raw::String(_)) => Err(invalid(format!("{what} must not be empty"))),
        None => Err(invalid(format!("{what} is required"))),
        Some(other) => Err(invalid(format!("{what} must be a string, not {}", other.type_name()))),
    }
}

/// Validates backend options: unknown fields rejected, integers only, no invented defaults
/// for `connection` and `namespace`.
pub fn parse_backend(raw: &Raw) -> Result<BackendOptions, LockError> {
    let mut known = vec!["driver", "connection", "namespace"];
    known.extend(INT_FIELDS.iter().map(|f| f.name));
    known.extend(["fenceTtlMs", "notifications"]);
    let fields = fields("options", raw, &known)?;

    match get(fields, "driver") {
        Some(Raw::String(s)) if s == "redis" => {}
        None => return Err(invalid("options.driver is required and must be 'redis'".to_owned())),
        Some(_) => return Err(invalid("options.driver must be exactly 'redis'".to_owned())),
    }
    let connection = required_string("options.connection", get(fields, "connection"))?.to_owned();
    let namespace = required_string("options.namespace", get(fields, "namespace"))?;
    if namespace.chars().any(|c| c.is_whitespace() || c.is_control() || c == '{' || c == '}') {
        return Err(invalid(
            "options.namespace must not contain whitespace, control characters, '{' or '}'"
                .to_owned(),
        ));
    }

    let mut ints = [0u32; INT_FIELDS.len()];
    for (slot, field) in ints.iter_mut().zip(INT_FIELDS.iter()) {
        *slot = match get(fields, field.name) {
            None => field.default,
            Some(v) => int_in_range(&format!("options.{}", field.name), v, field.min)?,
        };
    }
    let fence_ttl_ms =
        get(fields, "fenceTtlMs").map(|v| fence_ttl("options.fenceTtlMs", v)).transpose()?;
    let notifications = match get(fields, "notifications") {
        None => NotificationMode::default(),
        Some(Raw::String(s)) => NotificationMode::VALUES
            .iter()
            .find(|(name, _)| name == s)
            .map(|(_, mode)| *mode)
            .ok_or_else(notifications_rule)?,
        Some(_) => return Err(notifications_rule()),
    };
    let [lease_ms, wait_timeout_ms, poll_interval_ms, notify_poll_interval_ms, max_waiters, max_tracked_leases, shutdown_timeout_ms, max_key_bytes, min_replicas, replica_timeout_ms] =
        ints;
    Ok(BackendOptions {
        connection,
        namespace: namespace.to_owned(),
        lease_ms,
        wait_timeout_ms,
        poll_interval_ms,
        notify_poll_interval_ms,
        max_waiters,
        max_tracked_leases,
        shutdown_timeout_ms,
        max_key_bytes,
        min_replicas,
        replica_timeout_ms,
        fence_ttl_ms,
        notifications,
    })
}

fn notifications_rule() -> LockError {
    invalid("options.notifications must be 'namespace', 'per-key' or 'both'".to_owned())
}

/// The largest integer a JS number holds exactly.
pub(crate) const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// `fenceTtlMs` is only ever handed to Redis (no timer), so it may exceed the 2^31-1 of the
/// other fields: a month is a sensible value.
fn fence_ttl(what: &str, raw: &Raw) -> Result<u64, LockError> {
    match raw {
        Raw::Number(n)
            if n.is_finite() && n.fract() == 0.0 && *n >= 1.0 && *n <= MAX_SAFE_INTEGER as f64 =>
        {
            Ok(*n as u64)
        }
        _ => Err(invalid(format!("{what} must be an integer from 1 to {MAX_SAFE_INTEGER}"))),
    }
}

/// Where and how to reach Redis. `url` may hold a password: it is never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectionOptions {
    pub(crate) url: String,
    pub(crate) name: Option<String>,
    pub(crate) connect_timeout_ms: u32,
    pub(crate) command_timeout_ms: u32,
    /// pingIntervalMs: a connection silent this long sends a PING (0: never).
    pub(crate) ping_interval_ms: u32,
    /// PEM material for `rediss://` with a private CA or client certificates.
    pub(crate) tls: Option<TlsOptions>,
    /// `url` names one node of a Redis Cluster, or several (`seeds`).
    pub(crate) cluster: bool,
    /// With `cluster`: the URL of each node `url` lists (they hold the password).
    pub(crate) seeds: Vec<String>,
    /// `url` is a `redis-sentinel://` or `rediss-sentinel://` URL (parsed).
    pub(crate) sentinel: Option<SentinelUrl>,
    /// Credentials for the Sentinels themselves; the password is never printed.
    pub(crate) sentinel_username: Option<String>,
    pub(crate) sentinel_password: Option<String>,
}

/// PEM strings. The key is secret: never printed.
#[derive(Clone, PartialEq, Eq, Default)]
pub(crate) struct TlsOptions {
    pub(crate) ca: Option<String>,
    pub(crate) cert: Option<String>,
    pub(crate) key: Option<String>,
}

impl std::fmt::Debug for ConnectionOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionOptions")
            .field("url", &"<redacted>")
            .field("name", &self.name)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("command_timeout_ms", &self.command_timeout_ms)
            .field("ping_interval_ms", &self.ping_interval_ms)
            .field("tls", &self.tls.as_ref().map(|_| "<redacted>"))
            .field("cluster", &self.cluster)
            .field("seeds", &self.seeds.len())
            .field("sentinel", &self.sentinel)
            .field("sentinel_username", &self.sentinel_username)
            .field("sentinel_password", &self.sentinel_password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Defaults chosen in docs/decisions/0002: long enough for a loaded server, short enough
/// that a stalled one is noticed well inside the default 5 s wait.
pub(crate) const DEFAULT_CONNECT_TIMEOUT_MS: u32 = 2_000;
pub(crate) const DEFAULT_COMMAND_TIMEOUT_MS: u32 = 2_000;
/// CONTRACT.md "Connection liveness": under the idle timeouts of common middleboxes (cloud
/// load balancers and NATs drop idle flows after 350 s and more).
pub(crate) const DEFAULT_PING_INTERVAL_MS: u32 = 30_000;

const SCHEMES: [&str; 6] =
    ["redis", "rediss", "redis+unix", "unix", "redis-sentinel", "rediss-sentinel"];

/// Validates the first argument of `createRedisLockDriver`: a URL or `{ url, … }`.
pub fn parse_connection(raw: &Raw) -> Result<ConnectionOptions, LockError> {
    let (mut sentinel_username, mut sentinel_password) = (None, None);
    let mut ping_interval_ms = DEFAULT_PING_INTERVAL_MS;
    let (url, name, connect_timeout_ms, command_timeout_ms, tls, cluster) = match raw {
        Raw::String(url) => (
            url.as_str(),
            None,
            DEFAULT_CONNECT_TIMEOUT_MS,
            DEFAULT_COMMAND_TIMEOUT_MS,
            None,
            false,
        ),
        Raw::Object(_) => {
            let fields = fields(
                "connection",
                raw,
                &[
                    "url",
                    "name",
                    "connectTimeoutMs",
                    "commandTimeoutMs",
                    "pingIntervalMs",
                    "cluster",
                    "tls",
                    "sentinelUsername",
                    "sentinelPassword",
                ],
            )?;
            for (field, slot) in [
                ("sentinelUsername", &mut sentinel_username),
                ("sentinelPassword", &mut sentinel_password),
            ] {
                *slot = match get(fields, field) {
                    None => None,
                    Some(v) => {
                        Some(required_string(&format!("connection.{field}"), Some(v))?.to_owned())
                    }
                };
            }
            let cluster = match get(fields, "cluster") {
                None => false,
                Some(Raw::Bool(b)) => *b,
                Some(_) => return Err(invalid("connection.cluster must be a boolean".to_owned())),
            };
            let url = required_string("connection.url", get(fields, "url"))?;
            let name = match get(fields, "name") {
                None => None,
                Some(v) => Some(required_string("connection.name", Some(v))?.to_owned()),
            };
            let timeout = |field: &str, default| match get(fields, field) {
                None => Ok(default),
                Some(v) => int_in_range(&format!("connection.{field}"), v, 1),
            };
            let tls = get(fields, "tls").map(parse_tls).transpose()?;
            if let Some(v) = get(fields, "pingIntervalMs") {
                ping_interval_ms = int_in_range("connection.pingIntervalMs", v, 0)?;
            }
            (
                url,
                name,
                timeout("connectTimeoutMs", DEFAULT_CONNECT_TIMEOUT_MS)?,
                timeout("commandTimeoutMs", DEFAULT_COMMAND_TIMEOUT_MS)?,
                tls,
                cluster,
            )
        }
        other => {
            return Err(invalid(format!(
                "connection must be a URL string or an object with url, not {}",
                other.type_name()
            )))
        }
    };
    if url.is_empty() {
        return Err(invalid("connection.url must not be empty".to_owned()));
    }
    let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    match scheme.as_deref() {
        Some(s) if s != "rediss" && s != "rediss-sentinel" && tls.is_some() => {
            return Err(invalid("connection.tls needs a rediss:// or rediss-sentinel:// url".to_owned()));
        }
        Some(s) if SCHEMES.contains(&s) => {}
        _ => {
            return Err(invalid(
                "connection.url must start with redis://, rediss://, redis+unix://, unix://, redis-sentinel:// or rediss-sentinel://".to_owned(),
            ))
        }
    }
    let sentinel = if is_sentinel_url(url) {
        if cluster {
            return Err(invalid(
                "connection.cluster cannot be used with a Sentinel url".to_owned(),
            ));
        }
        Some(SentinelUrl::parse(url).map_err(|rule| invalid(rule.to_owned()))?)
    } else {
        if sentinel_username.is_some() || sentinel_password.is_some() {
            return Err(invalid("connection.sentinelUsername and connection.sentinelPassword need a redis-sentinel:// or rediss-sentinel:// url".to_owned()));
        }
        if crate::seeds::lists_several(url) && !cluster {
            return Err(invalid(
                "connection.url lists several nodes, which needs connection.cluster: true"
                    .to_owned(),
            ));
        }
        if !cluster && redis::IntoConnectionInfo::into_connection_info(url).is_err() {
            return Err(invalid("connection.url is not a valid Redis URL".to_owned()));
        }
        None
    };
    if cluster && scheme.as_deref().is_some_and(|s| s.ends_with("unix")) {
        return Err(invalid("connection.cluster needs a redis:// or rediss:// url".to_owned()));
    }
    let seeds = if cluster {
        crate::seeds::split(url).map_err(|rule| invalid(rule.to_owned()))?
    } else {
        Vec::new()
    };
    Ok(ConnectionOptions {
        url: url.to_owned(),
        name,
        connect_timeout_ms,
        command_timeout_ms,
        ping_interval_ms,
        tls,
        cluster,
        seeds,
        sentinel,
        sentinel_username,
        sentinel_password,
    })
}

/// `{ ca?, cert?, key? }`, PEM strings; a client certificate needs its key.
fn parse_tls(raw: &Raw) -> Result<TlsOptions, LockError> {
    let fields = fields("connection.tls", raw, &["ca", "cert", "key"])?;
    let pem = |name: &str| match get(fields, name) {
        None => Ok(None),
        Some(Raw::String(s)) if s.contains("-----BEGIN ") => Ok(Some(s.clone())),
        Some(_) => Err(invalid(format!("connection.tls.{name} must be a PEM string"))),
    };
    let tls = TlsOptions { ca: pem("ca")?, cert: pem("cert")?, key: pem("key")? };
    if tls.cert.is_some() != tls.key.is_some() {
        return Err(invalid("connection.tls.cert and connection.tls.key go together".to_owned()));
    }
    Ok(tls)
}

/// The per-call `waitTimeoutMs` of `acquire`, or the backend's default.
#[cfg_attr(not(all(feature = "node", not(test))), allow(dead_code))] // read by the binding
pub(crate) fn parse_wait_timeout(raw: &Raw, default: u32) -> Result<u32, LockError> {
    match raw {
        Raw::Undefined => Ok(default),
        v => int_in_range("acquire options.waitTimeoutMs", v, 0),
    }
}

/// `lease.keepAlive(options)`: how often to renew and for how long at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepAlive {
    /// Renewals stop this long after the call; the lease then runs out at its deadline.
    pub max_hold_ms: u64,
    /// The pause between renewals: 1 ≤ everyMs < leaseMs.
    pub every_ms: u32,
}

/// Validates `lease.keepAlive(options)` against the backend's leaseMs (decision 0152):
/// `maxHoldMs` required, an integer from 1 to 2^53-1; `everyMs` an integer from 1 to
/// leaseMs - 1, by default leaseMs / 3 rounded down (at least 1).
pub(crate) fn parse_keep_alive(raw: &Raw, lease_ms: u32) -> Result<KeepAlive, LockError> {
    let what = "keepAlive options";
    let fields = fields(what, raw, &["maxHoldMs", "everyMs"])?;
    let max_hold_ms = match get(fields, "maxHoldMs") {
        None => return Err(invalid(format!("{what}.maxHoldMs is required"))),
        Some(v) => match v {
            Raw::Number(n)
                if n.is_finite()
                    && n.fract() == 0.0
                    && *n >= 1.0
                    && *n <= MAX_SAFE_INTEGER as f64 =>
            {
                *n as u64
            }
            _ => {
                return Err(invalid(format!(
                    "{what}.maxHoldMs must be an integer from 1 to {MAX_SAFE_INTEGER}"
                )))
            }
        },
    };
    if lease_ms < 2 {
        return Err(invalid(format!(
            "{what}: keepAlive needs leaseMs of at least 2 (everyMs must be below leaseMs)"
        )));
    }
    let every_ms = match get(fields, "everyMs") {
        None => (lease_ms / 3).max(1),
        Some(v) => {
            let rule = || {
                invalid(format!(
                    "{what}.everyMs must be an integer from 1 to leaseMs - 1 ({})",
                    lease_ms - 1
                ))
            };
            match v {
                Raw::Number(n)
                    if n.is_finite()
                        && n.fract() == 0.0
                        && *n >= 1.0
                        && *n < f64::from(lease_ms) =>
                {
                    *n as u32
                }
                _ => return Err(rule()),
            }
        }
    };
    Ok(KeepAlive { max_hold_ms, every_ms })
}

/// The rules across both arguments of `createRedisLockDriver`. With `minReplicas`, a WAIT
/// blocks the connection it runs on for up to replicaTimeoutMs, and every command queued
/// behind it (an unrelated release or renew) counts that time against its own
/// commandTimeoutMs: a WAIT as long as commandTimeoutMs would make them OUTCOME_UNKNOWN
/// (docs/decisions/0130).
pub(crate) fn check_together(
    connection: &ConnectionOptions,
    backend: &BackendOptions,
) -> Result<(), LockError> {
    if backend.min_replicas > 0 && backend.replica_timeout_ms >= connection.command_timeout_ms {
        return Err(invalid(
            "options.replicaTimeoutMs must be less than connection.commandTimeoutMs when \
             options.minReplicas is above 0: a WAIT blocks the connection, and the commands \
             queued behind it would time out"
                .to_owned(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(fields: &[(&str, Raw)]) -> Raw {
        Raw::Object(fields.iter().map(|(k, v)| (k.to_string(), v.clone())).collect())
    }
    fn s(v: &str) -> Raw {
        Raw::String(v.to_owned())
    }
    fn base() -> Vec<(&'static str, Raw)> {
        vec![("driver", s("redis")), ("connection", s("main")), ("namespace", s("svc"))]
    }
    fn with(extra: (&'static str, Raw)) -> Raw {
        let mut f = base();
        f.push(extra);
        obj(&f)
    }
    fn err(raw: &Raw) -> LockError {
        parse_backend(raw).expect_err("must be rejected")
    }

    #[test]
    fn minimal_options_get_the_contract_defaults() {
        let o = parse_backend(&obj(&base())).unwrap();
        assert_eq!(
            (o.lease_ms, o.wait_timeout_ms, o.poll_interval_ms, o.notify_poll_interval_ms),
            (10_000, 5_000, 25, 250)
        );
        assert_eq!(
            (o.max_waiters, o.max_tracked_leases, o.shutdown_timeout_ms, o.max_key_bytes),
            (128, 10_000, 5_000, 1_024)
        );
        assert_eq!((o.connection.as_str(), o.namespace.as_str()), ("main", "svc"));
    }

    #[test]
    fn min_replicas_defaults_to_0_and_replica_timeout_to_500_and_both_are_integers_in_range() {
        let o = parse_backend(&obj(&base())).unwrap();
        assert_eq!((o.min_replicas, o.replica_timeout_ms), (0, DEFAULT_REPLICA_TIMEOUT_MS));
        assert_eq!(DEFAULT_REPLICA_TIMEOUT_MS, 500);
        assert_eq!(
            parse_backend(&with(("minReplicas", Raw::Number(2.0)))).unwrap().min_replicas,
            2
        );
        assert_eq!(
            parse_backend(&with(("replicaTimeoutMs", Raw::Number(1.0))))
                .unwrap()
                .replica_timeout_ms,
            1
        );
        for bad in [-1.0, 0.5, f64::NAN, 2147483648.0] {
            let e = err(&with(("minReplicas", Raw::Number(bad))));
            assert!(
                e.message.contains("options.minReplicas must be an integer from 0"),
                "{}",
                e.message
            );
        }
        for bad in [0.0, 1.5, -3.0] {
            let e = err(&with(("replicaTimeoutMs", Raw::Number(bad))));
            assert!(
                e.message.contains("options.replicaTimeoutMs must be an integer from 1"),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn namespace_and_connection_never_get_defaults() {
        for missing in ["namespace", "connection", "driver"] {
            let f: Vec<_> = base().into_iter().filter(|(k, _)| *k != missing).collect();
            let e = err(&obj(&f));
            assert_eq!(e.code, LockErrorCode::InvalidOptions);
            assert!(e.message.contains(missing), "{}", e.message);
        }
    }

    #[test]
    fn unknown_fields_are_rejected_by_name() {
        let e = err(&with(("leaseMS", Raw::Number(5.0))));
        assert!(e.message.contains("'leaseMS'"), "{}", e.message);
    }

    #[test]
    fn integers_only_within_range_and_the_value_is_never_echoed() {
        for bad in [f64::NAN, f64::INFINITY, -1.0, 1.5, 2147483648.0, 0.0] {
            let e = err(&with(("leaseMs", Raw::Number(bad))));
            assert!(
                e.message.contains("leaseMs") && e.message.contains("integer from 1"),
                "{}",
                e.message
            );
        }
        let e = err(&with(("leaseMs", s("1000"))));
        assert!(!e.message.contains("1000 "), "{}", e.message);
        assert_eq!(
            parse_backend(&with(("waitTimeoutMs", Raw::Number(0.0)))).unwrap().wait_timeout_ms,
            0
        );
        assert_eq!(
            parse_backend(&with(("shutdownTimeoutMs", Raw::Number(0.0))))
                .unwrap()
                .shutdown_timeout_ms,
            0
        );
        assert_eq!(parse_backend(&with(("leaseMs", Raw::Undefined))).unwrap().lease_ms, 10_000);
    }

    #[test]
    fn notifications_default_to_the_namespace_channel_and_take_three_names_only() {
        assert_eq!(
            parse_backend(&obj(&base())).unwrap().notifications,
            NotificationMode::Namespace
        );
        for (name, mode) in NotificationMode::VALUES {
            assert_eq!(
                parse_backend(&with(("notifications", s(name)))).unwrap().notifications,
                mode
            );
            assert_eq!(mode.as_str(), name);
        }
        assert_eq!(
            parse_backend(&with(("notifications", Raw::Undefined))).unwrap().notifications,
            NotificationMode::Namespace
        );
        for bad in [s("perkey"), s("Per-Key"), s(""), Raw::Null, Raw::Bool(true), Raw::Number(1.0)]
        {
            let e = err(&with(("notifications", bad.clone())));
            assert_eq!(e.code, LockErrorCode::InvalidOptions, "{bad:?}");
            assert!(
                e.message.contains("options.notifications") && !e.message.contains("perkey"),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn fence_ttl_is_absent_unless_given_and_an_integer_from_one() {
        assert_eq!(parse_backend(&obj(&base())).unwrap().fence_ttl_ms, None);
        assert_eq!(
            parse_backend(&with(("fenceTtlMs", Raw::Undefined))).unwrap().fence_ttl_ms,
            None
        );
        assert_eq!(
            parse_backend(&with(("fenceTtlMs", Raw::Number(1.0)))).unwrap().fence_ttl_ms,
            Some(1)
        );
        let month = 30.0 * 86_400_000.0;
        assert_eq!(
            parse_backend(&with(("fenceTtlMs", Raw::Number(month)))).unwrap().fence_ttl_ms,
            Some(2_592_000_000)
        );
        let max = MAX_SAFE_INTEGER as f64;
        assert_eq!(
            parse_backend(&with(("fenceTtlMs", Raw::Number(max)))).unwrap().fence_ttl_ms,
            Some(MAX_SAFE_INTEGER)
        );
        for bad in [
            Raw::Number(0.0),
            Raw::Number(-1.0),
            Raw::Number(1.5),
            Raw::Number(f64::NAN),
            Raw::Number(max + 2.0),
            Raw::Null,
            s("60000"),
        ] {
            let e = err(&with(("fenceTtlMs", bad.clone())));
            assert_eq!(e.code, LockErrorCode::InvalidOptions, "{bad:?}");
            assert!(
                e.message.contains("fenceTtlMs") && !e.message.contains("60000"),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn with_min_replicas_a_replica_timeout_not_below_the_command_timeout_is_refused_naming_both() {
        let connection = |command_timeout_ms: f64| {
            parse_connection(&obj(&[
                ("url", s("redis://h")),
                ("commandTimeoutMs", Raw::Number(command_timeout_ms)),
            ]))
            .unwrap()
        };
        let backend = |min: f64, timeout: f64| {
            let mut f = base();
            f.push(("minReplicas", Raw::Number(min)));
            f.push(("replicaTimeoutMs", Raw::Number(timeout)));
            parse_backend(&obj(&f)).unwrap()
        };
        for (command, replica) in [(1_234.0, 1_234.0), (1_234.0, 4_321.0)] {
            let e = check_together(&connection(command), &backend(1.0, replica)).unwrap_err();
            assert_eq!(e.code, LockErrorCode::InvalidOptions);
            assert!(
                e.message.contains("options.replicaTimeoutMs")
                    && e.message.contains("connection.commandTimeoutMs"),
                "{}",
                e.message
            );
            assert!(!e.message.contains("1234") && !e.message.contains("4321"), "{}", e.message);
        }
        assert!(check_together(&connection(1_234.0), &backend(1.0, 1_233.0)).is_ok());
        // No WAIT is sent without minReplicas: the timeout is not used.
        assert!(check_together(&connection(100.0), &backend(0.0, 500.0)).is_ok());
        // The defaults fit together.
        let defaults = parse_connection(&s("redis://h")).unwrap();
        assert!(check_together(&defaults, &backend(1.0, DEFAULT_REPLICA_TIMEOUT_MS.into())).is_ok());
    }

    #[test]
    fn namespace_rejects_braces_whitespace_and_controls() {
        for bad in ["a b", "a{b", "a}b", "a\u{7}b", "", "tab\t"] {
            let mut f = base();
            f[2] = ("namespace", s(bad));
            assert_eq!(err(&obj(&f)).code, LockErrorCode::InvalidOptions, "{bad:?}");
        }
    }

    #[test]
    fn a_cluster_url_may_list_seed_nodes_and_only_a_cluster_url() {
        let c = parse_connection(&obj(&[
            ("url", s("redis://:hunter2@h1:7000,h2:7001/0")),
            ("cluster", Raw::Bool(true)),
        ]))
        .unwrap();
        assert_eq!(c.seeds, ["redis://:hunter2@h1:7000/0", "redis://:hunter2@h2:7001/0"]);
        assert!(!format!("{c:?}").contains("hunter2"));
        let e = parse_connection(&s("redis://:hunter2@h1:7000,h2:7001")).unwrap_err();
        assert_eq!(e.code, LockErrorCode::InvalidOptions);
        assert!(e.message.contains("cluster: true") && !e.message.contains("hunter2"));
        let e = parse_connection(&obj(&[
            ("url", s("redis://:hunter2@h1,,h2")),
            ("cluster", Raw::Bool(true)),
        ]))
        .unwrap_err();
        assert!(e.message.contains("host[:port]") && !e.message.contains("hunter2"));
    }

    #[test]
    fn ping_interval_is_an_integer_from_zero_and_zero_turns_it_off() {
        let with =
            |v: Raw| parse_connection(&obj(&[("url", s("redis://h")), ("pingIntervalMs", v)]));
        assert_eq!(with(Raw::Number(0.0)).unwrap().ping_interval_ms, 0);
        assert_eq!(with(Raw::Number(250.0)).unwrap().ping_interval_ms, 250);
        for bad in [Raw::Number(-1.0), Raw::Number(1.5), Raw::Number(f64::NAN), s("1000")] {
            let e = with(bad).unwrap_err();
            assert_eq!(e.code, LockErrorCode::InvalidOptions);
            assert!(e.message.contains("connection.pingIntervalMs"), "{}", e.message);
        }
        assert_eq!(
            parse_connection(&s("redis://h")).unwrap().ping_interval_ms,
            DEFAULT_PING_INTERVAL_MS
        );
    }

    #[test]
    fn connection_accepts_urls_and_objects_and_hides_the_url() {
        let c = parse_connection(&s("redis://:hunter2@127.0.0.1:6379/0")).unwrap();
        assert_eq!(c.command_timeout_ms, DEFAULT_COMMAND_TIMEOUT_MS);
        assert!(!format!("{c:?}").contains("hunter2"));
        let c = parse_connection(&obj(&[
            ("url", s("unix:///tmp/redis.sock")),
            ("name", s("main")),
            ("commandTimeoutMs", Raw::Number(50.0)),
        ]))
        .unwrap();
        assert_eq!((c.name.as_deref(), c.command_timeout_ms), (Some("main"), 50));
        assert_eq!(c.ping_interval_ms, DEFAULT_PING_INTERVAL_MS);
        let tls = obj(&[
            ("url", s("rediss://h:6380")),
            ("tls", obj(&[("ca", s("-----BEGIN CERTIFICATE-----\nx\n"))])),
        ]);
        assert!(parse_connection(&tls).unwrap().tls.unwrap().ca.is_some());
        let plain_with_tls = obj(&[("url", s("redis://h")), ("tls", obj(&[]))]);
        assert!(parse_connection(&plain_with_tls).unwrap_err().message.contains("rediss://"));
        let half = obj(&[
            ("url", s("rediss://h")),
            ("tls", obj(&[("cert", s("-----BEGIN CERTIFICATE-----"))])),
        ]);
        assert!(parse_connection(&half).unwrap_err().message.contains("go together"));
        let not_pem = obj(&[("url", s("rediss://h")), ("tls", obj(&[("key", s("sekrit"))]))]);
        assert!(!parse_connection(&not_pem).unwrap_err().message.contains("sekrit"));
        for bad in ["http://:secret@host:1", "secret-host:6379", ""] {
            let e = parse_connection(&s(bad)).unwrap_err();
            assert_eq!(e.code, LockErrorCode::InvalidOptions);
            assert!(!e.message.contains("secret"), "{}", e.message);
        }
        let e = parse_connection(&obj(&[("url", s("redis://h")), ("port", Raw::Number(1.0))]))
            .unwrap_err();
        assert!(e.message.contains("'port'"));
    }

    #[test]
    fn sentinel_urls_list_their_sentinels_and_never_show_a_secret() {
        let c = parse_connection(&s("redis-sentinel://:hunter2@s1,s2:26380/2#mymaster")).unwrap();
        let sentinel = c.sentinel.as_ref().unwrap();
        assert_eq!(sentinel.sentinels, ["s1:26379", "s2:26380"]);
        assert_eq!((sentinel.master_name.as_str(), sentinel.tls), ("mymaster", false));
        assert!(!format!("{c:?}").contains("hunter2"), "{c:?}");
        let with_auth = obj(&[
            ("url", s("rediss-sentinel://user:hunter2@s1#m")),
            ("sentinelUsername", s("watcher")),
            ("sentinelPassword", s("s3ntinel-pw")),
            ("tls", obj(&[("ca", s("-----BEGIN CERTIFICATE-----\nx\n"))])),
        ]);
        let c = parse_connection(&with_auth).unwrap();
        assert!(c.sentinel.as_ref().unwrap().tls);
        assert_eq!(
            (c.sentinel_username.as_deref(), c.sentinel_password.as_deref()),
            (Some("watcher"), Some("s3ntinel-pw"))
        );
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3ntinel-pw") && !shown.contains("hunter2"), "{shown}");
    }

    #[test]
    fn a_bad_sentinel_connection_names_the_rule_and_never_the_value() {
        let cases = [
            ("redis-sentinel://:hunter2@secret-host,secret-host:26380", "#masterName"),
            ("redis-sentinel://:hunter2@secret-host#", "#masterName"),
            ("redis-sentinel://:hunter2@secret-host,#m", "host[:port]"),
            ("redis-sentinel://:hunter2@secret-host:99999#m", "host[:port]"),
            ("redis-sentinel://:hunter2@secret-host:x#m", "host[:port]"),
            ("redis-sentinel://:hunter2@[::1#m", "host[:port]"),
            ("redis-sentinel://:hunter2@secret-host/db#m", "database"),
            ("redis-sentinel://:hunter2@secret-host?x=1#m", "query"),
            ("redis-sentinel://:hunter2@secret-host#m s", "masterName"),
        ];
        for (url, rule) in cases {
            let e = parse_connection(&s(url)).unwrap_err();
            assert_eq!(e.code, LockErrorCode::InvalidOptions, "{url}");
            assert!(e.message.contains(rule), "{url}: {}", e.message);
            assert!(
                !e.message.contains("hunter2") && !e.message.contains("secret-host"),
                "{}",
                e.message
            );
            assert!(!format!("{e:?}").contains("hunter2"));
        }
        let cluster = obj(&[
            ("url", s("redis-sentinel://:hunter2@secret-host#m")),
            ("cluster", Raw::Bool(true)),
        ]);
        assert!(parse_connection(&cluster)
            .unwrap_err()
            .message
            .contains("cluster cannot be used with a Sentinel url"));
        let plain_with_auth =
            obj(&[("url", s("redis://secret-host")), ("sentinelPassword", s("s3ntinel-pw"))]);
        let e = parse_connection(&plain_with_auth).unwrap_err();
        assert!(
            e.message.contains("sentinelPassword") && !e.message.contains("s3ntinel-pw"),
            "{}",
            e.message
        );
        let tls_without_tls =
            obj(&[("url", s("redis-sentinel://secret-host#m")), ("tls", obj(&[]))]);
        assert!(parse_connection(&tls_without_tls)
            .unwrap_err()
            .message
            .contains("rediss-sentinel://"));
        let empty_password =
            obj(&[("url", s("redis-sentinel://secret-host#m")), ("sentinelPassword", s(""))]);
        assert!(parse_connection(&empty_password)
            .unwrap_err()
            .message
            .contains("connection.sentinelPassword must not be empty"));
    }

    #[test]
    fn keep_alive_options_default_every_ms_to_a_third_of_lease_ms_and_reject_bad_values() {
        let obj = |fields: Vec<(&str, Raw)>| {
            Raw::Object(fields.into_iter().map(|(n, v)| (n.to_owned(), v)).collect())
        };
        let ka = parse_keep_alive(&obj(vec![("maxHoldMs", Raw::Number(5000.0))]), 10_000).unwrap();
        assert_eq!(ka, KeepAlive { max_hold_ms: 5000, every_ms: 3333 });
        let two = parse_keep_alive(&obj(vec![("maxHoldMs", Raw::Number(1.0))]), 2).unwrap();
        assert_eq!(two.every_ms, 1);
        for bad in [
            obj(vec![]),
            obj(vec![("maxHoldMs", Raw::Number(0.0))]),
            obj(vec![("maxHoldMs", Raw::Number(1.0)), ("everyMs", Raw::Number(10_000.0))]),
            obj(vec![("maxHoldMs", Raw::Number(1.0)), ("everyMs", Raw::Number(0.0))]),
            obj(vec![("maxHoldMs", Raw::Number(1.0)), ("other", Raw::Number(1.0))]),
            Raw::Undefined,
        ] {
            let err = parse_keep_alive(&bad, 10_000).unwrap_err();
            assert_eq!(err.code, LockErrorCode::InvalidOptions);
        }
        let one = parse_keep_alive(&obj(vec![("maxHoldMs", Raw::Number(1.0))]), 1).unwrap_err();
        assert!(one.message.contains("leaseMs of at least 2"), "{}", one.message);
    }
}
