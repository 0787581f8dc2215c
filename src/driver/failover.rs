//! Leases on a primary that Sentinel replaced (decision 0153). With `minReplicas` 0 nothing
//! says a lease's last write reached a replica, so once the driver follows a change of
//! primary, a lease last written on an older one may be gone from the new primary (another
//! process can take the key there): it ends with LEASE_LOST, and its signal says so at
//! once. With `minReplicas` ≥ 1 its writes were acknowledged by replicas, and it is left
//! alone (decision 0027's limits apply). A Cluster's failovers are not events the driver
//! hears; nothing changes there.
//!
//! Two paths cover every lease: the task below looks over the leases tracked when an epoch
//! begins, and [`Driver::track`] checks each lease as it starts being tracked. A lease
//! tracked before the sweep reads the registry is swept; one tracked after it sees the
//! new epoch in its own check (the epoch moves before the sweep is woken).

use super::Driver;
use crate::error::{LockError, LockErrorCode};
use crate::lease::Lease;

impl Driver {
    /// Whether leases can be lost to a change of primary this driver follows.
    fn ends_leases_at_switches(&self) -> bool {
        self.inner.options.min_replicas == 0
    }

    /// Starts, once, the task that ends the leases a change of primary may have lost. It
    /// keeps no driver alive and stops at shutdown. Called before a lease is tracked, so
    /// that no change after the lease's own check goes unseen.
    pub(super) fn follow_failovers(&self) {
        if !self.ends_leases_at_switches()
            || self.inner.following_failovers.swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            return;
        }
        let Some(mut switches) = self.inner.link.primary_switches() else {
            return;
        };
        let driver = self.downgrade();
        let stopping = self.inner.stopping.token().clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stopping.cancelled() => return,
                    changed = switches.changed() => if changed.is_err() { return },
                }
                let epoch = *switches.borrow_and_update();
                let Some(driver) = driver.upgrade() else { return };
                for lease in driver.inner.leases.all() {
                    driver.end_if_written_before(&lease, epoch);
                }
            }
        });
    }

    /// The check of a lease as it starts being tracked: its write may have gone to a
    /// primary replaced while the reply was on its way.
    pub(super) fn check_written_on_current_primary(&self, lease: &Lease) {
        if self.ends_leases_at_switches() {
            self.end_if_written_before(lease, self.inner.link.primary_switch_count());
        }
    }

    fn end_if_written_before(&self, lease: &Lease, epoch: u64) {
        if lease.written_in() < epoch {
            lease.invalidate(replaced());
        }
    }
}

fn replaced() -> LockError {
    LockError::new(
        LockErrorCode::LeaseLost,
        "the primary that held the lease was replaced; with minReplicas 0 the lease may not have survived",
    )
}
