//! Releasing by token in the background (decisions 0005, 0006): after an acquire whose
//! caller went away or whose outcome is unknown, and after a `release()` that failed.

use std::sync::Arc;
use std::time::Duration;

use super::Driver;
use crate::backoff::Backoff;
use crate::clock::{self, Instant};
use crate::error::{LockError, Outcome, RedisFailure};
use crate::keys::KeyNames;
use crate::lease::Lease;
use crate::scripts::{self, ReleaseReply};

impl Driver {
    /// The pause between tries of a background release: pollIntervalMs, doubling up to 1 s.
    pub(crate) fn backoff(&self) -> Backoff {
        Backoff::new(
            Duration::from_millis(self.inner.options.poll_interval_ms.into()),
            Duration::from_secs(1),
        )
    }

    /// A cleanup that gives up while shutdown runs makes shutdown report CLEANUP_FAILED.
    pub(crate) fn note_cleanup_failure(&self, err: LockError) {
        if self.inner.stopping.is_cancelled() {
            crate::sync::lock(&self.inner.cleanup_failures).push(err);
        }
    }

    /// Releases `token` in the background until `gone_by`, when Redis surely dropped it.
    pub(crate) fn spawn_cleanup(&self, keys: Arc<KeyNames>, token: String, gone_by: Instant) {
        let this = self.clone();
        self.inner.tasks.spawn(async move {
            if let Err(err) = this.clean_up(&keys, &token, gone_by).await {
                this.note_cleanup_failure(err);
            }
        });
    }

    /// A `release()` that failed: the caller was told so, and the release goes on by token
    /// in the background. The lease stays tracked (counted against maxTrackedLeases) until
    /// its key is surely gone: a release confirmed, or its latest expiry passed. Shutdown
    /// drains what is still tracked and releases it itself, so this stops when shutdown
    /// begins.
    pub(crate) fn finish_failed_release(&self, lease: Arc<Lease>) {
        let this = self.clone();
        self.inner.tasks.spawn(async move {
            let gone_by = lease.latest_expiry();
            let surely_gone = async {
                if this.clean_up(&lease.keys, &lease.token, gone_by).await.is_err() {
                    tokio::time::sleep(clock::until(gone_by)).await;
                }
            };
            tokio::select! {
                biased;
                _ = this.inner.stopping.cancelled() => {}
                _ = surely_gone => this.inner.leases.remove(lease.id),
            }
        });
    }

    /// Releases `token`, trying again while the failure may pass (unknown outcome, no
    /// connection, a stalled server) until the key has surely expired in Redis (`gone_by`).
    /// Safe to repeat: the script deletes only our own token.
    pub(crate) async fn clean_up(
        &self,
        keys: &KeyNames,
        token: &str,
        gone_by: Instant,
    ) -> Result<bool, LockError> {
        let mut backoff = self.backoff();
        loop {
            let err = match self.release_token(keys, token).await {
                Ok(released) => return Ok(released),
                Err(err) => err,
            };
            let may_pass = err
                .cause
                .as_ref()
                .is_some_and(|c| c.outcome == Outcome::Unknown || c.rides_out_waiting());
            if !may_pass || clock::now() + backoff.peek() >= gone_by {
                return Err(err);
            }
            tokio::time::sleep(backoff.next()).await;
        }
    }

    /// One release script for `token`: true when it deleted our key.
    pub(crate) async fn release_token(
        &self,
        keys: &KeyNames,
        token: &str,
    ) -> Result<bool, LockError> {
        Ok(matches!(self.run_release(keys, token).await?, ReleaseReply::Deleted { .. }))
    }

    pub(crate) async fn run_release(
        &self,
        keys: &KeyNames,
        token: &str,
    ) -> Result<ReleaseReply, LockError> {
        let call = self.inner.release_channels.call(keys, token);
        let (value, _) = self.inner.link.run(&call).await.map_err(LockError::from_redis)?;
        scripts::parse_release(&value)
            .ok_or_else(|| LockError::from_redis(RedisFailure::unexpected_reply()))
    }
}
