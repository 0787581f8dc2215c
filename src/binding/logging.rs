//! The driver's log events, routed to the JS logger of the driver that emitted them (the
//! logger adapter in index.js turns them into pino-style calls).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Once};

use napi::bindgen_prelude::*;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi_derive::napi;

use super::NativeRedisError;
use crate::events;

/// One log event for the JS logger adapter: `(level, fields, message)`.
#[napi(object)]
pub struct LogFields {
    pub code: String,
    pub reason: Option<String>,
    pub policy: Option<String>,
    pub cause: Option<NativeRedisError>,
}

/// Weak: a logger must never keep the Node process alive.
pub(super) type LogFn = ThreadsafeFunction<
    FnArgs<(String, LogFields, String)>,
    (),
    FnArgs<(String, LogFields, String)>,
    Status,
    false,
    true,
>;

static LOGGERS: LazyLock<Mutex<HashMap<u64, Arc<LogFn>>>> = LazyLock::new(Default::default);

pub(super) fn loggers() -> std::sync::MutexGuard<'static, HashMap<u64, Arc<LogFn>>> {
    crate::sync::lock(&LOGGERS)
}

/// Routes the driver's `tracing` events to the logger of the driver that emitted them.
struct JsLogLayer;

#[derive(Default)]
struct EventVisitor {
    driver: u64,
    code: String,
    reason: Option<String>,
    policy: Option<String>,
    message: String,
    cause: HashMap<String, String>,
    cause_retryable: bool,
}

impl tracing::field::Visit for EventVisitor {
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        if field.name() == "driver" {
            self.driver = value;
        }
    }
    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        if field.name() == "cause.retryable" {
            self.cause_retryable = value;
        }
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        match field.name() {
            "code" => self.code = value.to_owned(),
            "reason" => self.reason = Some(value.to_owned()),
            "policy" => self.policy = Some(value.to_owned()),
            name => {
                if let Some(key) = name.strip_prefix("cause.") {
                    self.cause.insert(key.to_owned(), value.to_owned());
                }
            }
        }
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for JsLogLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() != events::TARGET {
            return;
        }
        let mut v = EventVisitor::default();
        event.record(&mut v);
        let Some(logger) = loggers().get(&v.driver).cloned() else { return };
        let level = match *event.metadata().level() {
            tracing::Level::ERROR => "error",
            tracing::Level::WARN => "warn",
            tracing::Level::INFO => "info",
            _ => "debug",
        };
        let cause = v.cause.get("code").map(|code| NativeRedisError {
            code: code.clone(),
            outcome: v.cause.get("outcome").cloned().unwrap_or_default(),
            retryable: v.cause_retryable,
            server_code: v.cause.get("server_code").cloned(),
            message: v.cause.get("message").cloned().unwrap_or_default(),
        });
        let fields = LogFields { code: v.code, reason: v.reason, policy: v.policy, cause };
        logger.call(
            (level.to_owned(), fields, v.message).into(),
            ThreadsafeFunctionCallMode::NonBlocking,
        );
    }
}

pub(super) fn install_log_layer() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        use tracing_subscriber::layer::SubscriberExt;
        // Another global subscriber (an embedding app's) wins; then events go there.
        let _ = tracing::subscriber::set_global_default(
            tracing_subscriber::registry().with(JsLogLayer),
        );
    });
}
