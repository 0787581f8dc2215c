//! Leases whose deadline passed while the machine slept (decision 0166). `valid` reads the
//! lease clock, which counts the sleep, so it is false at once on wake-up; but the signal's
//! deadline timer runs on Node's clock (and keep-alives on tokio's), which on Linux and
//! macOS did not see the sleep and fire late by all of it. A coarse tick notices that the
//! lease clock jumped and tells the watched leases that expired meanwhile, so their
//! signals abort within about a second of the wake-up.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::Driver;
use crate::clock;

/// How often the lease clock is compared with the tick's own pace: one timer wake-up a
/// second per backend, at most this late after a wake-up.
const TICK: Duration = Duration::from_secs(1);

/// A tick that came this much later than due (by the lease clock) is taken for a sleep of
/// the machine. A runtime too busy to tick on time only makes a harmless extra look.
const LATE: Duration = Duration::from_millis(500);

impl Driver {
    /// Starts, once, the tick that looks for a sleep of the machine. Like the failover
    /// task it keeps no driver alive, and it stops at shutdown or once the driver is gone.
    pub(super) fn notice_wake_ups(&self) {
        let started = &self.inner.noticing_wake_ups;
        // A load first: this runs at every tracked lease, and only the first one swaps.
        if started.load(Ordering::Acquire) || started.swap(true, Ordering::AcqRel) {
            return;
        }
        let driver = self.downgrade();
        let stopping = self.inner.stopping.token().clone();
        // Read now, not when the task first runs: a sleep in between is one to notice.
        let mut last = clock::now();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stopping.cancelled() => return,
                    () = tokio::time::sleep(TICK) => {}
                }
                // A driver dropped without shutdown ends the tick too.
                let Some(driver) = driver.upgrade() else { return };
                let now = clock::now();
                let slept = now.saturating_duration_since(last) > TICK + LATE;
                last = now;
                if slept {
                    for lease in driver.inner.leases.all() {
                        lease.tell_if_expired();
                    }
                }
            }
        });
    }
}
