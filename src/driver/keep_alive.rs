//! A lease's signal and keep-alive (decisions 0150–0153): who is told when a lease ends,
//! and renewals on the runtime's threads, so a busy JS thread cannot make them late.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::Driver;
use crate::clock;
use crate::error::LockError;
use crate::lease::{Ended, Lease, Watcher};
use crate::options::{parse_keep_alive, KeepAlive, Raw};

impl Driver {
    #[doc(hidden)] // for the binding (and the crate's tests), not API
    /// Why the lease of `id` is no longer valid, `Some(None)` while it is. A lease this
    /// backend no longer tracks was released by `release()` or by shutdown, and which one
    /// is no longer known here: `None`, and index.js decides from whether `release()` was
    /// called.
    pub fn lease_ended(&self, id: u64) -> Option<Option<Ended>> {
        self.lease(id).map(|lease| lease.ended())
    }

    #[doc(hidden)] // for the binding (and the crate's tests), not API
    /// [`Lease::watch`] by id: `watcher` is told once when the lease ends for a cause other
    /// than its deadline. Answers as [`Driver::lease_ended`] does.
    pub fn watch_lease(&self, id: u64, watcher: Watcher) -> Option<Option<Ended>> {
        self.lease(id).map(|lease| lease.watch(watcher))
    }

    #[doc(hidden)] // for the binding (and the crate's tests), not API
    /// Checks keep-alive options as [`Driver::keep_alive_by_id`] would, before any lease:
    /// `withLock` refuses bad ones before it sends anything.
    pub fn check_keep_alive(&self, options: &Raw) -> Result<(), LockError> {
        self.counted(parse_keep_alive(options, self.inner.options.lease_ms)).map(|_| ())
    }

    #[doc(hidden)] // for the binding (and the crate's tests), not API
    /// [`Driver::keep_alive`] by id, with its options as JS gave them: INVALID_OPTIONS
    /// before anything else.
    pub fn keep_alive_by_id(
        &self,
        id: u64,
        options: &Raw,
    ) -> Result<impl Future<Output = ()> + Send + 'static, LockError> {
        let options = self.counted(parse_keep_alive(options, self.inner.options.lease_ms))?;
        match self.lease(id) {
            Some(lease) => self.keep_alive(&lease, options),
            None => Err(self.counted::<()>(Err(super::no_longer_valid())).unwrap_err()),
        }
    }

    /// `lease.keepAlive(options)`: renews the lease every `every_ms` with `renew()`'s rules
    /// until `release()`, shutdown, the first renewal that fails (the lease then ends with
    /// that renewal's error, which its signal carries) or `max_hold_ms` after this call,
    /// when renewals stop and the lease runs out at its deadline. A second call replaces
    /// the first. On a lease no longer valid it starts nothing and answers LEASE_EXPIRED
    /// as `renew()` does.
    ///
    /// The checks and the replacement happen when this is called; the returned future is
    /// the renewal loop, to be spawned on the runtime.
    pub fn keep_alive(
        &self,
        lease: &Arc<Lease>,
        options: KeepAlive,
    ) -> Result<impl Future<Output = ()> + Send + 'static, LockError> {
        let stop = match lease.start_keep_alive(self.inner.stopping.token()) {
            Ok(stop) => stop,
            // renew()'s rule: not valid locally is LEASE_EXPIRED, whatever ended it.
            Err(_) => return Err(self.counted::<()>(Err(super::no_longer_valid())).unwrap_err()),
        };
        let started = clock::now();
        let hold_until = started + Duration::from_millis(options.max_hold_ms);
        let every = Duration::from_millis(options.every_ms.into());
        let this = self.clone();
        let lease = lease.clone();
        let tracker = self.inner.tasks.clone();
        Ok(tracker.track_future(async move {
            let mut next = started + every;
            while next < hold_until {
                tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(clock::until(next)) => {}
                }
                if !lease.valid() {
                    return;
                }
                let submitted = clock::now();
                // Not raced against `stop`: a renewal on the wire keeps its outcome, and
                // shutdown waits for it (it is one of the driver's tasks).
                if let Err(err) = this.renew_valid(&lease).await {
                    // The first failed renewal ends the lease: a PROVIDER_FAILED one too,
                    // which leaves Redis's key as it was (decision 0152).
                    lease.invalidate(err);
                    return;
                }
                next = submitted + every;
            }
        }))
    }
}
