//! @dokebi/lock-redis: a Redis lease-lock driver whose Redis work runs in Rust on tokio.
//!
//! Everything but [`binding`] is plain Rust with no napi types, tested by `cargo test`.

mod attempt;
mod cleanup;
pub mod connection;
pub mod driver;
pub mod error;
pub mod events;
pub mod keys;
pub mod lease;
pub mod mutants;
pub mod notify;
pub mod options;
pub mod replicas;
pub mod scripts;
pub mod sentinel;
pub mod shutdown;
pub mod stats;
pub mod waiters;

// napi-derive registers nothing in a test build, so there the binding would be dead code.
#[cfg(all(feature = "node", not(test)))]
mod binding;

pub use driver::Driver;
pub use error::{LockError, LockErrorCode, Outcome, RedisErrorCode, RedisFailure};
pub use lease::Lease;
pub use options::{BackendOptions, ConnectionOptions, Raw};
