//! The one module that knows napi: it maps the plain-Rust driver to JS.
//!
//! Outcomes cross as tagged values (a lease, a flag, or a `NativeError` object) and
//! index.js turns the error objects into `LockError`s: napi cannot reject with a custom
//! error class or code (shared/NOTES.md).

// The #[napi] items are JS exports registered by napi-derive, not Rust API reached from the
// crate root.
#![allow(unreachable_pub)]

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, OnceLock};

use napi::bindgen_prelude::*;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::{JsString, ValueType};
use napi_derive::napi;
use tokio_util::sync::CancellationToken;

use crate::driver::Driver;
use crate::error::{LockError, LockErrorCode, RedisFailure};
use crate::lease::{Ended, Watcher};
use crate::options::{self, Raw};

mod dispatch;
#[cfg(feature = "bench-floor")]
mod floor;
mod logging;
mod settle;

use logging::{install_log_layer, loggers, LogFn};

/// Futures, replies and leases are allocated on the tokio thread and freed on the JS thread;
/// glibc malloc serialises that on its arena locks (docs/decisions/0014).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A RedisError-shaped cause, as @dokebi/redis shapes its own.
#[napi(object)]
pub struct NativeRedisError {
    pub code: String,
    pub outcome: String,
    pub retryable: bool,
    pub server_code: Option<String>,
    pub message: String,
}

/// A LockError on its way to index.js.
#[napi(object)]
pub struct NativeError {
    pub code: String,
    pub message: String,
    pub cause: Option<NativeRedisError>,
    pub causes: Option<Vec<NativeError>>,
}

impl From<&RedisFailure> for NativeRedisError {
    fn from(f: &RedisFailure) -> Self {
        Self {
            code: f.code.as_str().to_owned(),
            outcome: f.outcome.as_str().to_owned(),
            retryable: f.retryable(),
            server_code: f.server_code.clone(),
            message: f.message.clone(),
        }
    }
}

impl From<LockError> for NativeError {
    fn from(e: LockError) -> Self {
        Self {
            code: e.code.as_str().to_owned(),
            message: e.message,
            cause: e.cause.as_ref().map(NativeRedisError::from),
            causes: (!e.causes.is_empty())
                .then(|| e.causes.into_iter().map(NativeError::from).collect()),
        }
    }
}

/// A call whose task panicked (decision 0015).
fn internal_error(what: &str, code: LockErrorCode) -> NativeError {
    LockError::internal(code, what).into()
}

/// Test hook, read once: `DOKEBI_LOCK_REDIS_TEST_PANIC=acquire` makes every acquire's task
/// panic, so the suite can see what a caller gets from a bug. Not an option; unset, it
/// costs one load of a static.
fn test_panic(call: &str) -> bool {
    crate::switches::test_panic(call)
}

/// The codes of the contract, for `LockErrorCode` in index.js.
#[napi]
pub fn error_codes() -> Vec<&'static str> {
    LockErrorCode::ALL.iter().map(|c| c.as_str()).collect()
}

/// A JS string's UTF-16 code units as they are, lone surrogates included. Call only after
/// `get_type()` said String.
fn utf16_units(value: &Unknown) -> Result<Vec<u16>> {
    let string = unsafe { value.cast::<JsString>()? }.into_utf16()?;
    // napi's buffer ends with the NUL terminator it asked V8 to write.
    let units = string.as_slice();
    Ok(units[..units.len().saturating_sub(1)].to_vec())
}

/// Mirrors a JS value for validation in Rust. Strings are read as UTF-16 so that a lone
/// surrogate is seen, not silently replaced.
fn to_raw(value: &Unknown, depth: u8) -> Result<Raw> {
    Ok(match value.get_type()? {
        ValueType::Undefined => Raw::Undefined,
        ValueType::Null => Raw::Null,
        ValueType::Boolean => Raw::Bool(unsafe { value.cast::<bool>()? }),
        ValueType::Number => Raw::Number(unsafe { value.cast::<f64>()? }),
        ValueType::String => match String::from_utf16(&utf16_units(value)?) {
            Ok(s) => Raw::String(s),
            Err(_) => Raw::Other("a malformed string"),
        },
        ValueType::Object if depth < 3 => {
            let object = unsafe { value.cast::<Object>()? };
            if object.is_array()? {
                return Ok(Raw::Other("an array"));
            }
            let mut fields = Vec::new();
            for name in Object::keys(&object)? {
                let field: Unknown = object.get_named_property(&name)?;
                fields.push((name, to_raw(&field, depth + 1)?));
            }
            Raw::Object(fields)
        }
        ValueType::Object => Raw::Other("a nested object"),
        ValueType::Function => Raw::Other("a function"),
        ValueType::Symbol => Raw::Other("a symbol"),
        ValueType::BigInt => Raw::Other("a bigint"),
        _ => Raw::Other("an unsupported value"),
    })
}

/// `parseRedisLockBackend`: the validated options with defaults, or an error object.
#[napi(object)]
pub struct NativeBackendOptions {
    pub driver: String,
    pub connection: String,
    pub namespace: String,
    pub lease_ms: u32,
    pub wait_timeout_ms: u32,
    pub poll_interval_ms: u32,
    pub notify_poll_interval_ms: u32,
    pub max_waiters: u32,
    pub max_tracked_leases: u32,
    pub shutdown_timeout_ms: u32,
    pub max_key_bytes: u32,
    pub min_replicas: u32,
    pub replica_timeout_ms: u32,
    /// Absent unless given (decision 0031).
    pub fence_ttl_ms: Option<i64>,
    /// `'namespace'`, `'per-key'` or `'both'` (decision 0060).
    pub notifications: String,
}

#[napi]
pub fn parse_backend(input: Unknown) -> Result<Either<NativeBackendOptions, NativeError>> {
    Ok(match options::parse_backend(&to_raw(&input, 0)?) {
        Ok(o) => Either::A(NativeBackendOptions {
            driver: "redis".to_owned(),
            connection: o.connection,
            namespace: o.namespace,
            lease_ms: o.lease_ms,
            wait_timeout_ms: o.wait_timeout_ms,
            poll_interval_ms: o.poll_interval_ms,
            notify_poll_interval_ms: o.notify_poll_interval_ms,
            max_waiters: o.max_waiters,
            max_tracked_leases: o.max_tracked_leases,
            shutdown_timeout_ms: o.shutdown_timeout_ms,
            max_key_bytes: o.max_key_bytes,
            min_replicas: o.min_replicas,
            replica_timeout_ms: o.replica_timeout_ms,
            // At most 2^53-1 (validated), so exact as i64 and as a JS number.
            fence_ttl_ms: o.fence_ttl_ms.map(|ttl| ttl as i64),
            notifications: o.notifications.as_str().to_owned(),
        }),
        Err(e) => Either::B(e.into()),
    })
}

// --- runtime ---------------------------------------------------------------------------

/// The tokio runtime every driver of this process runs on (docs/decisions/0011, 0014). The
/// addon owns it for the life of the process and never hands it to napi-rs: napi-rs shuts
/// its runtime down when the last environment using the addon goes away, and a worker
/// thread started after that would spawn onto a stopped runtime, its promises never
/// settling. A static is never dropped, so this one runs until the process exits.
static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    let threads = crate::switches::worker_threads();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("dokebi-lock-redis")
        .enable_all()
        .build()
        .expect("a tokio runtime can be built")
});

fn runtime() -> &'static tokio::runtime::Handle {
    RUNTIME.handle()
}

// --- driver ----------------------------------------------------------------------------

/// An AbortSignal's Rust side: index.js calls `cancel()` from the signal's abort listener.
#[napi]
pub struct CancelToken {
    token: CancellationToken,
}

#[napi]
impl CancelToken {
    #[napi(constructor)]
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        Self { token: CancellationToken::new() }
    }

    #[napi]
    pub fn cancel(&self) {
        self.token.cancel();
    }
}

#[napi]
pub struct NativeDriver {
    driver: Driver,
    /// Set by index.js at the first read of a lease's `signal` (decision 0151): nothing
    /// crosses back to JS for leases whose signal nobody reads.
    watcher: OnceLock<Watcher>,
}

/// Called with a lease's id when it ends for a cause other than its deadline (a renew or
/// keep-alive renewal failed, shutdown released it). Weak: it never keeps the process alive.
pub type LeaseEndedFn = ThreadsafeFunction<i64, (), i64, Status, false, true>;

#[napi]
pub fn create_driver(
    env: Env,
    connection: Unknown,
    options: Unknown,
    log: Option<LogFn>,
    in_worker_thread: bool,
) -> Result<Either<NativeDriver, NativeError>> {
    let (connection, options) = (to_raw(&connection, 0)?, to_raw(&options, 0)?);
    let created = options::parse_connection(&connection).and_then(|conn| {
        let opts = options::parse_backend(&options)?;
        if conn.name.as_ref().is_some_and(|name| *name != opts.connection) {
            return Err(LockError::new(
                LockErrorCode::InvalidOptions,
                "connection.name must equal options.connection",
            ));
        }
        Driver::new(&conn, opts)
    });
    let driver = match created {
        Ok(driver) => driver,
        Err(e) => return Ok(Either::B(e.into())),
    };
    if let Some(log) = log {
        install_log_layer();
        loggers().insert(driver.id(), Arc::new(log));
    }
    // The runtime is shared by every thread of the process: when a worker thread's
    // environment goes away, its drivers must stop waiting and give their leases back
    // rather than go on locking for a thread that no longer exists. (When the process
    // itself exits, the leases it did not release are left to their TTL, as always.)
    if in_worker_thread {
        let weak = driver.downgrade();
        env.add_env_cleanup_hook((), move |()| {
            if let Some(driver) = weak.upgrade() {
                runtime().spawn(async move {
                    let _ = driver.shutdown().await;
                });
            }
        })?;
    }
    Ok(Either::A(NativeDriver { driver, watcher: OnceLock::new() }))
}

fn key_units(key: &Unknown) -> Result<Option<Vec<u16>>> {
    if key.get_type()? != ValueType::String {
        return Ok(None);
    }
    utf16_units(key).map(Some)
}

#[napi]
impl NativeDriver {
    /// The handle `acquire` and `release` take (see [`acquire`]); index.js asks once per driver.
    #[napi(ts_return_type = "ExternalObject<'NativeDriver'>")]
    pub fn handle(&self) -> External<Driver> {
        External::new(self.driver.clone())
    }

    /// Resolves with nothing, or a `NativeError` (CLEANUP_TIMEOUT / CLEANUP_FAILED).
    #[napi(ts_return_type = "Promise<NativeError | null>")]
    pub fn shutdown<'env>(&self, env: &'env Env) -> Result<PromiseRaw<'env, Option<NativeError>>> {
        let driver = self.driver.clone();
        settle::spawn(
            env,
            runtime(),
            async move { driver.shutdown().await.err().map(NativeError::from) },
            || Some(internal_error("shutdown", LockErrorCode::CleanupFailed)),
        )
    }

    /// The validated namespace, for the tracing-channel contexts in index.js.
    #[napi(getter)]
    pub fn namespace(&self) -> String {
        self.driver.options().namespace.clone()
    }

    #[napi]
    pub fn stats(&self) -> NativeStats {
        let s = self.driver.stats();
        NativeStats {
            waiters: s.waiters as u32,
            lines: s.lines as u32,
            in_progress: s.in_progress as u32,
            tracked_leases: s.tracked_leases as u32,
            subscription: s.subscription.to_owned(),
            redis_attempts: s.redis_attempts as f64,
            notifications_received: s.notifications_received as f64,
            dead_connections: s.dead_connections as f64,
            errors: s
                .errors
                .into_iter()
                .map(|(code, n)| (code.as_str().to_owned(), n as f64))
                .collect(),
        }
    }
}

/// The hot calls are free functions on a driver handle, not methods of `NativeDriver`: napi-rs
/// registers every method call's `&self` in a process-wide map behind a mutex and removes it
/// after, about 1,200 instructions per call, where an External argument is only
/// type-checked (docs/decisions/0182).
///
/// Resolves with a `NativeLease` or a `NativeError`; never rejects for lock outcomes.
#[napi(ts_return_type = "Promise<NativeLease | NativeError>")]
pub fn acquire<'env>(
    env: &'env Env,
    #[napi(ts_arg_type = "ExternalObject<'NativeDriver'>")] driver: &External<Driver>,
    key: Unknown,
    wait_timeout_ms: Unknown,
    cancel: Option<&CancelToken>,
) -> Result<PromiseRaw<'env, Either<NativeLease, NativeError>>> {
    let driver: &Driver = driver;
    let wait_timeout_ms = to_raw(&wait_timeout_ms, 0)?;
    let checked = match key_units(&key)? {
        None => Err(LockError::new(LockErrorCode::InvalidKey, "the lock key must be a string")),
        Some(units) => driver.validate_key(&units),
    }
    .and_then(|key| {
        Ok((key, options::parse_wait_timeout(&wait_timeout_ms, driver.options().wait_timeout_ms)?))
    });
    // Started here, on the JS thread, so acquires line up in call order.
    // Boxed: the acquire future is about 2 KB, and unboxed it is copied on every move into the task.
    let acquiring = checked.map(|(key, wait_ms)| {
        Box::pin(driver.acquire_unless(&key, Some(wait_ms), cancel.map(|c| c.token.clone())))
    });
    let panic_now = test_panic("acquire");
    settle::spawn(
        env,
        runtime(),
        async move {
            if panic_now {
                panic!("DOKEBI_LOCK_REDIS_TEST_PANIC: acquire");
            }
            let acquired = match acquiring {
                Ok(acquiring) => acquiring.await,
                Err(e) => Err(e),
            };
            match acquired {
                Ok(lease) => {
                    Either::A(NativeLease { id: lease.id as i64, fence: lease.fence.clone() })
                }
                Err(e) => Either::B(e.into()),
            }
        },
        || Either::B(internal_error("acquire", LockErrorCode::OutcomeUnknown)),
    )
}

/// `driver.stats()`.
#[napi(object)]
pub struct NativeStats {
    pub waiters: u32,
    pub lines: u32,
    pub in_progress: u32,
    pub tracked_leases: u32,
    pub subscription: String,
    pub redis_attempts: f64,
    pub notifications_received: f64,
    pub dead_connections: f64,
    pub errors: HashMap<String, f64>,
}

impl Drop for NativeDriver {
    fn drop(&mut self) {
        loggers().remove(&self.driver.id());
    }
}

/// A lease crosses as a plain object: its id for the calls below, and its fence. A native
/// class instance per lease (with a finalizer each) and a getter call for the fence cost
/// more on the JS thread than the whole key naming (docs/perf/README.md). Ids are exact
/// as JS numbers (below 2^53) and never reused in a process.
#[napi(object)]
pub struct NativeLease {
    pub id: i64,
    pub fence: String,
}

/// How a lease's end crosses to index.js: null while valid, a `NativeError` (the signal's
/// reason) once ended, `false` when the backend no longer tracks it (released by
/// `release()` or by shutdown: index.js knows whether `release()` was called).
fn ended_to_js(ended: Option<Option<Ended>>) -> Option<Either<NativeError, bool>> {
    match ended {
        Some(None) => None,
        Some(Some(ended)) => Some(Either::A(ended.to_error().into())),
        None => Some(Either::B(false)),
    }
}

/// The calls on a lease, by its id. A lease this backend no longer tracks was released
/// (by `release()` or shutdown): not valid, nothing left, `release()` false.
#[napi]
impl NativeDriver {
    #[napi]
    pub fn lease_valid(&self, id: i64) -> bool {
        self.driver.lease(id as u64).is_some_and(|lease| lease.valid())
    }

    #[napi]
    pub fn lease_remaining_ms(&self, id: i64) -> f64 {
        self.driver.lease(id as u64).map_or(0.0, |lease| lease.remaining_ms() as f64)
    }

    /// Why the lease ended (see `ended_to_js`).
    #[napi(ts_return_type = "NativeError | false | null")]
    pub fn lease_ended(&self, id: i64) -> Option<Either<NativeError, bool>> {
        ended_to_js(self.driver.lease_ended(id as u64))
    }

    /// Registers the listener `watch_lease` tells; index.js calls it once per backend, at
    /// the first read of any lease's `signal`.
    #[napi]
    pub fn set_lease_listener(&self, listener: LeaseEndedFn) {
        let listener = Arc::new(listener);
        let _ = self.watcher.set(Arc::new(move |id| {
            let _ = listener.call(id as i64, ThreadsafeFunctionCallMode::NonBlocking);
        }));
    }

    /// The first read of a lease's `signal`: from now on the listener hears when it ends,
    /// and this answers as `lease_ended` does.
    #[napi(ts_return_type = "NativeError | false | null")]
    pub fn watch_lease(&self, id: i64) -> Option<Either<NativeError, bool>> {
        match self.watcher.get() {
            Some(watcher) => ended_to_js(self.driver.watch_lease(id as u64, watcher.clone())),
            None => ended_to_js(self.driver.lease_ended(id as u64)),
        }
    }

    /// `withLock`'s keep-alive options, checked before the acquire: null, or INVALID_OPTIONS.
    #[napi]
    pub fn check_keep_alive(&self, options: Unknown) -> Result<Option<NativeError>> {
        let options = to_raw(&options, 0)?;
        Ok(self.driver.check_keep_alive(&options).err().map(Into::into))
    }

    /// `lease.keepAlive(options)`: the renewals run on the runtime; null when they started,
    /// else the error (INVALID_OPTIONS, LEASE_EXPIRED).
    #[napi]
    pub fn keep_alive(&self, id: i64, options: Unknown) -> Result<Option<NativeError>> {
        let options = to_raw(&options, 0)?;
        Ok(match self.driver.keep_alive_by_id(id as u64, &options) {
            Ok(renewing) => {
                runtime().spawn(renewing);
                None
            }
            Err(e) => Some(e.into()),
        })
    }

    #[napi(ts_return_type = "Promise<NativeError | null>")]
    pub fn renew<'env>(
        &self,
        env: &'env Env,
        id: i64,
    ) -> Result<PromiseRaw<'env, Option<NativeError>>> {
        let renewing = self.driver.renew_by_id(id as u64);
        settle::spawn(
            env,
            runtime(),
            async move { renewing.await.err().map(NativeError::from) },
            || Some(internal_error("renew", LockErrorCode::OutcomeUnknown)),
        )
    }
}

/// Releases the lease `id` (see [`acquire`] for why this is not a method).
#[napi(ts_return_type = "Promise<boolean | NativeError>")]
pub fn release<'env>(
    env: &'env Env,
    #[napi(ts_arg_type = "ExternalObject<'NativeDriver'>")] driver: &External<Driver>,
    id: i64,
) -> Result<PromiseRaw<'env, Either<bool, NativeError>>> {
    // Invalid the moment release() is called, before the future runs. The release and
    // its promise's settling share one tracked task (shutdown waits for it); a lease
    // no longer tracked was released already: false, asking Redis nothing.
    let driver: &Driver = driver;
    let releasing = driver.lease(id as u64).and_then(|lease| driver.releasing(&lease));
    let (promise, task) = settle::settled_by(
        env,
        runtime(),
        async move {
            let released = match releasing {
                Some(releasing) => releasing.await,
                None => Ok(false),
            };
            match released {
                Ok(released) => Either::A(released),
                Err(e) => Either::B(e.into()),
            }
        },
        || Either::B(internal_error("release", LockErrorCode::OutcomeUnknown)),
    )?;
    dispatch::run(driver.tracked(task), runtime());
    Ok(promise)
}
