//! @dokebi/lock-redis: a Redis lease-lock driver whose Redis work runs in Rust on tokio.
//!
//! Everything but the binding is plain Rust with no napi types, tested by `cargo test`.
//! The crate's surface is what is re-exported here: a [`Driver`] built from validated
//! options ([`parse_connection`], [`parse_backend`]), its [`Lease`]s, and [`LockError`].

mod awake;
mod backoff;
mod clock;
mod connection;
mod driver;
mod error;
mod events;
mod keys;
mod lease;
mod mutants;
mod notify;
mod options;
mod replicas;
mod scripts;
mod seeds;
mod sentinel;
mod stats;
mod switches;
mod sync;
mod waiters;

// napi-derive registers nothing in a test build, so there the binding would be dead code.
#[cfg(all(feature = "node", not(test)))]
mod binding;

pub use driver::Driver;
pub use error::{LockError, LockErrorCode, Outcome, RedisErrorCode, RedisFailure};
pub use lease::{Ended, Lease, Watcher};
pub use options::{
    parse_backend, parse_connection, BackendOptions, ConnectionOptions, KeepAlive, Raw,
};
pub use stats::Stats;

/// What the crate's own tests (`tests/*.rs`) reach beyond the public surface: internals,
/// not API. Nothing outside this repository may use it.
#[doc(hidden)]
pub mod testing {
    pub use crate::clock::skip as skip_lease_clock;
    pub use crate::connection::{close_before_send, RedisLink, SubscribeFailure};
    pub use crate::events::TARGET as EVENT_TARGET;
    pub use crate::keys::KeyNames;
    pub use crate::notify::SubscriptionState;
    pub use crate::replicas::{Claim, Replicas};
    pub use crate::scripts::RELEASE_KEYED_SOURCE;
}
