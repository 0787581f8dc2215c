//! Error codes of the public contract and the classification of Redis failures.
//!
//! Messages are written here, never forwarded from Redis or the OS: a server's text can
//! name an ACL user and an OS error can name an address, and neither may leave the driver.

use std::fmt;

/// `LockError.code` of the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockErrorCode {
    /// An option, the connection or a TLS PEM is not valid.
    InvalidOptions,
    /// The key is empty, not well-formed UTF-16, or longer than maxKeyBytes.
    InvalidKey,
    /// Another owner holds the key (an acquire that waits 0 ms).
    LockBusy,
    /// The wait for the key ran out.
    WaitTimeout,
    /// maxWaiters acquires are already in progress.
    QueueFull,
    /// maxTrackedLeases leases are already tracked.
    TooManyLeases,
    /// The caller's AbortSignal fired.
    Aborted,
    /// The backend is shutting down or shut down.
    ShutDown,
    /// The lease is no longer valid (expired or released).
    LeaseExpired,
    /// Redis says the key is no longer held by this lease.
    LeaseLost,
    /// Redis failed and surely did not apply the command.
    ProviderFailed,
    /// Redis failed and may have applied the command: never retried automatically.
    OutcomeUnknown,
    /// Shutdown ran out of shutdownTimeoutMs before every release settled.
    CleanupTimeout,
    /// A release during shutdown failed.
    CleanupFailed,
}

impl LockErrorCode {
    /// Every code, in the contract's order.
    pub const ALL: [LockErrorCode; 14] = [
        Self::InvalidOptions,
        Self::InvalidKey,
        Self::LockBusy,
        Self::WaitTimeout,
        Self::QueueFull,
        Self::TooManyLeases,
        Self::Aborted,
        Self::ShutDown,
        Self::LeaseExpired,
        Self::LeaseLost,
        Self::ProviderFailed,
        Self::OutcomeUnknown,
        Self::CleanupTimeout,
        Self::CleanupFailed,
    ];

    /// The name JS sees.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidOptions => "INVALID_OPTIONS",
            Self::InvalidKey => "INVALID_KEY",
            Self::LockBusy => "LOCK_BUSY",
            Self::WaitTimeout => "WAIT_TIMEOUT",
            Self::QueueFull => "QUEUE_FULL",
            Self::TooManyLeases => "TOO_MANY_LEASES",
            Self::Aborted => "ABORTED",
            Self::ShutDown => "SHUT_DOWN",
            Self::LeaseExpired => "LEASE_EXPIRED",
            Self::LeaseLost => "LEASE_LOST",
            Self::ProviderFailed => "PROVIDER_FAILED",
            Self::OutcomeUnknown => "OUTCOME_UNKNOWN",
            Self::CleanupTimeout => "CLEANUP_TIMEOUT",
            Self::CleanupFailed => "CLEANUP_FAILED",
        }
    }
}

impl fmt::Display for LockErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether Redis may have applied a failed command (the `outcome` of a RedisError).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Surely never reached Redis.
    NotSubmitted,
    /// Sent; Redis may or may not have run it.
    Unknown,
    /// Redis answered with an error reply: it did not run it.
    Rejected,
}

impl Outcome {
    /// The name JS sees.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotSubmitted => "not-submitted",
            Self::Unknown => "unknown",
            Self::Rejected => "rejected",
        }
    }
}

/// The `code` of a RedisError, as @dokebi/redis names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisErrorCode {
    /// No connection could be had: nothing was sent.
    ConnectionFailed,
    /// The connection ended after the command was sent.
    ConnectionLost,
    /// No reply within commandTimeoutMs.
    CommandTimeout,
    /// Redis answered with an error reply.
    CommandRejected,
    /// A reply the scripts never give.
    UnexpectedReply,
}

impl RedisErrorCode {
    /// The name JS sees.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ConnectionFailed => "CONNECTION_FAILED",
            Self::ConnectionLost => "CONNECTION_LOST",
            Self::CommandTimeout => "COMMAND_TIMEOUT",
            Self::CommandRejected => "COMMAND_REJECTED",
            Self::UnexpectedReply => "UNEXPECTED_REPLY",
        }
    }
}

/// A Redis failure, shaped like @dokebi/redis's RedisError so callers classify by structure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisFailure {
    /// What failed.
    pub code: RedisErrorCode,
    /// Whether Redis may have applied it.
    pub outcome: Outcome,
    /// The first word of a server error reply (`OOM`, `NOPERM`, `LOADING`…); never its text.
    pub server_code: Option<String>,
    /// Written by the driver, never forwarded from Redis or the OS.
    pub message: String,
}

/// Server error codes after which the same command may succeed later (contract: 503).
/// NOREPLICAS: too few replicas, from Redis's `min-replicas-to-write` or from our own WAIT
/// (decision 0026); replicas come back.
const TRANSIENT_SERVER_CODES: [&str; 5] =
    ["LOADING", "TRYAGAIN", "MASTERDOWN", "READONLY", "NOREPLICAS"];
/// Server error codes a waiting acquire rides out until its wait ends: the contract's list,
/// plus a Cluster's redirections and outages, which also surely had no effect (decision 0009),
/// plus too few replicas (decision 0026).
const RIDE_OUT_SERVER_CODES: [&str; 9] = [
    "LOADING",
    "READONLY",
    "MASTERDOWN",
    "TRYAGAIN",
    "OOM",
    "MOVED",
    "ASK",
    "CLUSTERDOWN",
    "NOREPLICAS",
];
/// What a command that reached no Cluster node failed with.
const NO_CLUSTER_NODE: &str = "no connection to a Cluster node, so nothing was sent";
/// What a command was refused with, unsent, on a connection already known closed.
pub(crate) const CONNECTION_HAD_CLOSED: &str = "the connection to Redis had closed";
/// What a command failed with when the Cluster connection's own task had ended.
const CLUSTER_CONNECTION_ENDED: &str = "the Cluster connection had ended, so nothing was sent";
/// redis-rs 1.8's words when a Cluster connection cannot queue a command because its task
/// ended (`cluster_async`, `route_command`): the command never left the process. Its other
/// words, "Unable to receive command", come after queueing and stay unknown.
const REDIS_RS_CLUSTER_UNABLE_TO_SEND: &str = "redis_cluster: Unable to send command";
/// Refused credentials or permissions: waiting cannot fix them.
const REFUSAL_SERVER_CODES: [&str; 3] = ["WRONGPASS", "NOAUTH", "NOPERM"];

impl RedisFailure {
    /// A failure with no server code.
    pub fn new(code: RedisErrorCode, outcome: Outcome, message: impl Into<String>) -> Self {
        Self { code, outcome, server_code: None, message: message.into() }
    }

    /// A connect that failed (refused, timed out, handshake refused): nothing of ours was
    /// sent. A refusing server's code (WRONGPASS, NOAUTH…) is kept in `server_code`.
    pub fn connect(err: &redis::RedisError) -> Self {
        let server_code = server_code_of(err);
        let message = match &server_code {
            Some(code) => format!("Redis refused the connection handshake ({code})"),
            None if err.is_timeout() => "connecting to Redis timed out".to_owned(),
            None => "could not connect to Redis".to_owned(),
        };
        Self {
            code: RedisErrorCode::ConnectionFailed,
            outcome: Outcome::NotSubmitted,
            server_code,
            message,
        }
    }

    /// No connection within connectTimeoutMs: nothing was sent.
    pub fn connect_timeout() -> Self {
        Self::new(
            RedisErrorCode::ConnectionFailed,
            Outcome::NotSubmitted,
            "connecting to Redis timed out",
        )
    }

    /// A command that failed after it was handed to the connection.
    pub fn command(err: &redis::RedisError) -> Self {
        if let Some(code) = server_code_of(err) {
            let message = format!("Redis rejected the command ({code})");
            return Self {
                code: RedisErrorCode::CommandRejected,
                outcome: Outcome::Rejected,
                server_code: Some(code),
                message,
            };
        }
        if err.is_timeout() {
            return Self::command_timeout();
        }
        // A Cluster connection that has no connection to any node, or not to the one a
        // redirect named, says so before it sends anything (issue 23).
        if err.kind() == redis::ErrorKind::ClusterConnectionNotFound {
            return Self::new(
                RedisErrorCode::ConnectionFailed,
                Outcome::NotSubmitted,
                NO_CLUSTER_NODE,
            );
        }
        // Also raised before anything was written (decision 0160): a Cluster connection
        // whose task ended, a node connection refused (a refusal comes only from a connect,
        // which a Cluster makes on a command's behalf), and redis-rs refusing the command
        // itself.
        if is_cluster_connection_ended(err) {
            return Self::new(
                RedisErrorCode::ConnectionFailed,
                Outcome::NotSubmitted,
                CLUSTER_CONNECTION_ENDED,
            );
        }
        if err.is_connection_refusal() {
            return Self::new(
                RedisErrorCode::ConnectionFailed,
                Outcome::NotSubmitted,
                "could not connect to Redis",
            );
        }
        if matches!(
            err.kind(),
            redis::ErrorKind::InvalidClientConfig | redis::ErrorKind::RESP3NotSupported
        ) {
            return Self::new(
                RedisErrorCode::ConnectionFailed,
                Outcome::NotSubmitted,
                "the Redis client refused the command before sending it",
            );
        }
        // redis-rs cannot tell a command that never left the process from one Redis ran
        // once it was queued on the multiplexed connection (docs/decisions/0003).
        Self::new(
            RedisErrorCode::ConnectionLost,
            Outcome::Unknown,
            "the connection to Redis was lost before the reply",
        )
    }

    /// No reply within commandTimeoutMs: the outcome is unknown.
    pub fn command_timeout() -> Self {
        Self::new(
            RedisErrorCode::CommandTimeout,
            Outcome::Unknown,
            "Redis did not reply within commandTimeoutMs",
        )
    }

    /// A write that fewer than `minReplicas` replicas acknowledged (decision 0026): shaped as
    /// Redis's own NOREPLICAS refusal, since the driver takes the write back.
    pub fn too_few_replicas(message: impl Into<String>) -> Self {
        Self {
            code: RedisErrorCode::CommandRejected,
            outcome: Outcome::Rejected,
            server_code: Some("NOREPLICAS".to_owned()),
            message: message.into(),
        }
    }

    /// A reply of a shape the scripts never give: the outcome is unknown.
    pub fn unexpected_reply() -> Self {
        Self::new(
            RedisErrorCode::UnexpectedReply,
            Outcome::Unknown,
            "Redis sent a reply the lock scripts never produce",
        )
    }

    /// `retryable: true` (and `status: 503`) where the same call may succeed later.
    pub fn retryable(&self) -> bool {
        match self.code {
            RedisErrorCode::ConnectionFailed => !self.is_refusal(),
            RedisErrorCode::ConnectionLost | RedisErrorCode::CommandTimeout => true,
            RedisErrorCode::CommandRejected => self.server_code_in(&TRANSIENT_SERVER_CODES),
            RedisErrorCode::UnexpectedReply => false,
        }
    }

    /// A waiting acquire tries again after this failure instead of giving up.
    pub fn rides_out_waiting(&self) -> bool {
        match self.code {
            RedisErrorCode::ConnectionFailed => !self.is_refusal(),
            RedisErrorCode::CommandRejected => self.server_code_in(&RIDE_OUT_SERVER_CODES),
            _ => false,
        }
    }

    /// The command surely had no effect (PROVIDER_FAILED rather than OUTCOME_UNKNOWN).
    pub fn surely_not_applied(&self) -> bool {
        matches!(self.outcome, Outcome::NotSubmitted | Outcome::Rejected)
    }

    /// A Cluster connection reached no node, or had ended, so sent nothing (see
    /// [`Self::command`]): it is to be built anew.
    pub(crate) fn reached_no_node(&self) -> bool {
        self.outcome == Outcome::NotSubmitted
            && (self.message == NO_CLUSTER_NODE || self.message == CLUSTER_CONNECTION_ENDED)
    }

    /// Refused before sending because the connection it was handed had just closed (or
    /// its Cluster task had ended): the command was never tried, so sending it once on a
    /// new connection is not a retry of anything (decision 0178).
    pub(crate) fn refused_on_closed_connection(&self) -> bool {
        self.outcome == Outcome::NotSubmitted
            && (self.message == CONNECTION_HAD_CLOSED || self.message == CLUSTER_CONNECTION_ENDED)
    }

    /// The server does not have the script (NOSCRIPT): EVAL it once.
    pub fn is_no_script(&self) -> bool {
        self.server_code.as_deref() == Some("NOSCRIPT")
    }

    fn is_refusal(&self) -> bool {
        self.server_code_in(&REFUSAL_SERVER_CODES)
    }

    fn server_code_in(&self, codes: &[&str]) -> bool {
        self.server_code.as_deref().is_some_and(|c| codes.contains(&c))
    }
}

/// redis-rs could not hand the command to its Cluster connection's task (see
/// [`REDIS_RS_CLUSTER_UNABLE_TO_SEND`]).
fn is_cluster_connection_ended(err: &redis::RedisError) -> bool {
    // Only compared, never passed on: the io::Error is redis-rs's own, with its own words.
    err.kind() == redis::ErrorKind::Io
        && err.is_connection_dropped()
        && err.to_string() == REDIS_RS_CLUSTER_UNABLE_TO_SEND
}

/// The error-reply code of a server error, or `None` for client-side failures.
fn server_code_of(err: &redis::RedisError) -> Option<String> {
    use redis::ErrorKind;
    match err.kind() {
        ErrorKind::Server(_) | ErrorKind::Extension => err
            .code()
            .map(|code| sanitize_code(wrapped_script_code(code, err.detail()).unwrap_or(code))),
        ErrorKind::AuthenticationFailed => {
            Some(err.code().map(sanitize_code).unwrap_or_else(|| "WRONGPASS".to_owned()))
        }
        _ => None,
    }
}

/// Redis before 7.0 answers a command refused inside a script with where it happened:
/// `@user_script: 10: -OOM command not allowed …` (returned from `redis.pcall`), or
/// `ERR Error running script (call to f_…): @user_script:10: @user_script: 10: -READONLY …`
/// (raised by `redis.call`). The refused command's own code decides what the caller may do
/// (OOM and READONLY are ridden out, ERR is not), as it does from 7.0 on.
fn wrapped_script_code<'a>(code: &str, detail: Option<&'a str>) -> Option<&'a str> {
    let detail = detail?;
    let from_script = code.starts_with("@user_script")
        || (code == "ERR" && detail.starts_with("Error running script"));
    if !from_script {
        return None;
    }
    let (_, inner) = detail.split_once(": -")?;
    inner.split_whitespace().next()
}

/// Error codes are a single upper-case word; anything else is not passed on.
fn sanitize_code(code: &str) -> String {
    if !code.is_empty()
        && code.len() <= 32
        && code.bytes().all(|b| b.is_ascii_uppercase() || b == b'_' || b.is_ascii_digit())
    {
        code.to_owned()
    } else {
        "ERR".to_owned()
    }
}

/// A `LockError` of the contract.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct LockError {
    /// The contract's code.
    pub code: LockErrorCode,
    /// Written by the driver; never holds a key, a token, a password or an address.
    pub message: String,
    /// The Redis failure behind PROVIDER_FAILED / OUTCOME_UNKNOWN.
    pub cause: Option<RedisFailure>,
    /// The failures behind CLEANUP_FAILED (an AggregateError in JS).
    pub causes: Vec<LockError>,
}

impl LockError {
    /// An error with no cause.
    pub fn new(code: LockErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), cause: None, causes: Vec::new() }
    }

    /// PROVIDER_FAILED or OUTCOME_UNKNOWN, by whether the command may have taken effect.
    pub fn from_redis(failure: RedisFailure) -> Self {
        let (code, message) = if failure.surely_not_applied() {
            (
                LockErrorCode::ProviderFailed,
                format!("Redis failed and the command did not take effect: {}", failure.message),
            )
        } else {
            (
                LockErrorCode::OutcomeUnknown,
                format!("the outcome of the Redis command is unknown: {}", failure.message),
            )
        };
        Self { code, message, cause: Some(failure), causes: Vec::new() }
    }

    /// ABORTED: the caller's signal fired.
    pub fn aborted() -> Self {
        Self::new(LockErrorCode::Aborted, "the acquire was aborted by its signal")
    }

    /// SHUT_DOWN: the backend is shutting down.
    pub fn shut_down() -> Self {
        Self::new(LockErrorCode::ShutDown, "the lock driver is shutting down")
    }

    /// A task of ours ended without an answer (it panicked, decision 0015): the work may or
    /// may not have reached Redis, so the outcome is unknown. Says what happened, never a
    /// Redis failure that did not happen. `code` is OUTCOME_UNKNOWN but for shutdown's
    /// CLEANUP_FAILED.
    pub fn internal(code: LockErrorCode, what: &str) -> Self {
        Self::new(
            code,
            format!("an internal error (a panic) ended the {what}; its outcome is unknown"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(text: &str) -> redis::RedisError {
        let parsed = redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).unwrap();
        match parsed {
            redis::Value::ServerError(e) => e.into(),
            other => panic!("not an error: {other:?}"),
        }
    }

    #[test]
    fn server_error_reply_is_provider_failed_and_never_carries_server_text() {
        let f = RedisFailure::command(&server_error(
            "NOPERM User alice has no permissions to run the 'evalsha' command",
        ));
        assert_eq!(f.code, RedisErrorCode::CommandRejected);
        assert_eq!(f.outcome, Outcome::Rejected);
        assert_eq!(f.server_code.as_deref(), Some("NOPERM"));
        assert!(!f.message.contains("alice"));
        assert!(!f.retryable());
        assert!(!f.rides_out_waiting());
        assert_eq!(LockError::from_redis(f).code, LockErrorCode::ProviderFailed);
    }

    #[test]
    fn transient_server_errors_are_retryable_and_ridden_out() {
        for code in ["LOADING", "TRYAGAIN", "MASTERDOWN", "READONLY", "NOREPLICAS"] {
            let f = RedisFailure::command(&server_error(&format!("{code} try later")));
            assert!(f.retryable(), "{code}");
            assert!(f.rides_out_waiting(), "{code}");
        }
        let oom = RedisFailure::command(&server_error("OOM command not allowed"));
        assert!(!oom.retryable());
        assert!(oom.rides_out_waiting());
    }

    #[test]
    fn a_refusal_inside_a_script_keeps_its_code_as_redis_before_7_words_it() {
        // Redis 6.2: returned from redis.pcall (acquire's first SET) …
        let oom = RedisFailure::command(&server_error(
            "@user_script: 10: -OOM command not allowed when used memory > 'maxmemory'.",
        ));
        assert_eq!(oom.server_code.as_deref(), Some("OOM"));
        assert!(oom.rides_out_waiting() && !oom.retryable());
        // … and raised by redis.call.
        let readonly = RedisFailure::command(&server_error(
            "ERR Error running script (call to f_0123): @user_script:13: @user_script: 13: -READONLY You can't write against a read only replica.",
        ));
        assert_eq!(readonly.server_code.as_deref(), Some("READONLY"));
        assert!(readonly.retryable() && readonly.rides_out_waiting());
        // A script's own error, or an ERR of another kind, stays ERR.
        for text in [
            "ERR Error running script (call to f_0123): @user_script:1: boom",
            "ERR syntax error: -X",
        ] {
            assert_eq!(
                RedisFailure::command(&server_error(text)).server_code.as_deref(),
                Some("ERR")
            );
        }
    }

    #[test]
    fn io_failure_after_submission_is_outcome_unknown() {
        let io: redis::RedisError =
            std::io::Error::from(std::io::ErrorKind::ConnectionReset).into();
        let f = RedisFailure::command(&io);
        assert_eq!(f.outcome, Outcome::Unknown);
        assert!(f.retryable());
        assert_eq!(LockError::from_redis(f).code, LockErrorCode::OutcomeUnknown);
    }

    #[test]
    fn failures_raised_before_anything_was_sent_are_provider_failed() {
        let io = |kind, text: &str| -> redis::RedisError { std::io::Error::new(kind, text).into() };
        use std::io::ErrorKind::{BrokenPipe, ConnectionRefused};
        let cases = [
            // redis-rs's Cluster connection, its task ended: never queued, and rebuilt.
            (io(BrokenPipe, "redis_cluster: Unable to send command"), true),
            // A node connection refused while a Cluster connects on the command's behalf.
            (io(ConnectionRefused, "connection refused"), false),
            ((redis::ErrorKind::ClusterConnectionNotFound, "No connections found").into(), true),
            ((redis::ErrorKind::InvalidClientConfig, "Invalid node string").into(), false),
        ];
        for (err, rebuilds) in cases {
            let f = RedisFailure::command(&err);
            assert_eq!(
                (f.code, f.outcome),
                (RedisErrorCode::ConnectionFailed, Outcome::NotSubmitted)
            );
            assert!(f.rides_out_waiting(), "{err:?}");
            assert_eq!(f.reached_no_node(), rebuilds, "{err:?}");
            assert_eq!(LockError::from_redis(f).code, LockErrorCode::ProviderFailed);
        }
        // After queueing, or not knowable: unknown. A multiplexed connection says broken pipe
        // both when the command was never queued and when its reply was lost (decision 0003).
        for err in [
            io(BrokenPipe, "redis_cluster: Unable to receive command"),
            std::io::Error::from(BrokenPipe).into(),
        ] {
            let f = RedisFailure::command(&err);
            assert_eq!(f.outcome, Outcome::Unknown, "{err:?}");
            assert_eq!(LockError::from_redis(f).code, LockErrorCode::OutcomeUnknown);
        }
    }

    #[test]
    fn connect_failure_is_not_submitted_unless_credentials_are_refused() {
        let refused: redis::RedisError =
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into();
        let f = RedisFailure::connect(&refused);
        assert_eq!((f.code, f.outcome), (RedisErrorCode::ConnectionFailed, Outcome::NotSubmitted));
        assert!(f.retryable() && f.rides_out_waiting());
        let wrongpass =
            RedisFailure::connect(&server_error("WRONGPASS invalid username-password pair"));
        assert_eq!(
            (wrongpass.code, wrongpass.outcome),
            (RedisErrorCode::ConnectionFailed, Outcome::NotSubmitted)
        );
        assert!(!wrongpass.retryable() && !wrongpass.rides_out_waiting());
        assert_eq!(LockError::from_redis(wrongpass).code, LockErrorCode::ProviderFailed);
    }
}
