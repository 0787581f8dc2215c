//! The clock that lease deadlines are read on (decision 0166). Redis expires a key by wall
//! time, which runs on while this machine is suspended; `std::time::Instant` does not on
//! Linux (CLOCK_MONOTONIC) or macOS (CLOCK_UPTIME_RAW), so a lease read after a laptop's
//! sleep would still look valid. [`now`] counts the sleep: CLOCK_BOOTTIME on Linux and
//! Android, `mach_continuous_time` on macOS, and on Windows std's Instant, whose
//! QueryPerformanceCounter already counts it (the `boot-time` crate picks the call).
//!
//! Only what protects mutual exclusion reads it: a lease's deadlines, the submission and
//! reply moments they count from, the keep-alive's schedule and cleanup's end. tokio's
//! timers stay on tokio's clock (they merely wait, and fire late after a suspend); whatever
//! they wake checks the deadline again here.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A moment on the clock that counts suspended time.
pub(crate) use boot_time::Instant;

/// Time the tests pretend the machine slept, added to every reading (see [`skip`]).
static SKIPPED_NANOS: AtomicU64 = AtomicU64::new(0);

/// Now, counting the time the machine was suspended. One vDSO call on Linux (no syscall)
/// and a relaxed load.
pub(crate) fn now() -> Instant {
    let now = Instant::now();
    match SKIPPED_NANOS.load(Ordering::Relaxed) {
        0 => now,
        skipped => now + Duration::from_nanos(skipped),
    }
}

/// How long until `at`, on this clock; zero once it passed. For a tokio timer that waits
/// for it: such a timer fires late by any suspend in between, so whatever it wakes must
/// read [`now`] again.
pub(crate) fn until(at: Instant) -> Duration {
    at.saturating_duration_since(now())
}

/// Test-only: moves this process's lease clock `by` forward, as a suspend of that long
/// would, while tokio's timers (like CLOCK_MONOTONIC) see none of it. Process-wide: a test
/// using it runs alone in its own test binary.
pub fn skip(by: Duration) {
    let nanos = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
    SKIPPED_NANOS.fetch_add(nanos, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skip_moves_the_clock_on_at_once() {
        // Unit tests share this process: only ever a forward skip, which other tests read
        // as the machine having slept, and small enough not to expire their leases.
        let before = now();
        skip(Duration::from_nanos(1));
        assert!(now() > before);
        assert_eq!(until(before), Duration::ZERO, "a moment passed is zero away");
    }
}
