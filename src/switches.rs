//! The environment switches, every `DOKEBI_LOCK_REDIS_*` variable the addon reads (README
//! "Environment"): for experiments, benchmarks and tests, never options. Each is read here
//! and nowhere else; a new one gets a line in README first.

use std::sync::LazyLock;
use std::time::Duration;

fn micros(cell: &'static LazyLock<u64>) -> Duration {
    Duration::from_micros(**cell)
}

/// `name` as a number; None when unset or not one (the caller's default applies).
fn number<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// `DOKEBI_LOCK_REDIS_HEAD_START_US`: the head start other processes get on this backend's
/// own release (decision 0010); 0 turns it off.
pub(crate) fn head_start() -> Duration {
    static MICROS: LazyLock<u64> =
        LazyLock::new(|| number("DOKEBI_LOCK_REDIS_HEAD_START_US").unwrap_or(300));
    micros(&MICROS)
}

/// `DOKEBI_LOCK_REDIS_STAGGER_US`: the step of the staggered head start (decision 0070);
/// 0 returns to decision 0010's head start for the releasing process alone.
pub(crate) fn stagger_step() -> Duration {
    static MICROS: LazyLock<u64> =
        LazyLock::new(|| number("DOKEBI_LOCK_REDIS_STAGGER_US").unwrap_or(1500));
    micros(&MICROS)
}

/// `DOKEBI_LOCK_REDIS_NOTIFICATIONS=0` turns release notifications off, so waiters only
/// poll: the "before" of the contention benchmark (docs/decisions/0007). Read at each
/// driver's creation.
pub(crate) fn notifications_enabled() -> bool {
    std::env::var("DOKEBI_LOCK_REDIS_NOTIFICATIONS").map_or(true, |v| v != "0")
}

/// `DOKEBI_LOCK_REDIS_LANE=0` sends a standalone node's commands through redis-rs's
/// multiplexed connection instead of the driver's own (decision 0180). Read once.
pub(crate) fn lanes_enabled() -> bool {
    static ON: LazyLock<bool> =
        LazyLock::new(|| std::env::var("DOKEBI_LOCK_REDIS_LANE").map_or(true, |v| v != "0"));
    *ON
}

/// `DOKEBI_LOCK_REDIS_STAY_AWAKE_US`: how long the runtime's thread polls while a reply is
/// due (docs/decisions/0041); 0 turns it off.
#[cfg(all(feature = "node", not(test)))]
pub(crate) fn stay_awake() -> Duration {
    static MICROS: LazyLock<u64> =
        LazyLock::new(|| number("DOKEBI_LOCK_REDIS_STAY_AWAKE_US").unwrap_or(100));
    micros(&MICROS)
}

/// `DOKEBI_LOCK_REDIS_WORKER_THREADS`: the runtime's worker threads (at least 1).
#[cfg(all(feature = "node", not(test)))]
pub(crate) fn worker_threads() -> usize {
    number::<usize>("DOKEBI_LOCK_REDIS_WORKER_THREADS").unwrap_or(1).max(1)
}

/// `DOKEBI_LOCK_REDIS_TEST_PANIC=acquire`, a test-only hook (decision 0015): whether the
/// task of `call` is to panic. Read once; unset, it costs one load of a static.
#[cfg(all(feature = "node", not(test)))]
pub(crate) fn test_panic(call: &str) -> bool {
    static PANICS: LazyLock<Option<String>> =
        LazyLock::new(|| std::env::var("DOKEBI_LOCK_REDIS_TEST_PANIC").ok());
    PANICS.as_deref().is_some_and(|calls| calls.split(',').any(|c| c == call))
}

/// `DOKEBI_LOCK_REDIS_CHAOS_MUTANT`: the name of the deliberate defect to run, only in the
/// `chaos-mutants` build (decision 0057).
#[cfg(feature = "chaos-mutants")]
pub(crate) fn chaos_mutant() -> Option<String> {
    std::env::var("DOKEBI_LOCK_REDIS_CHAOS_MUTANT").ok()
}
