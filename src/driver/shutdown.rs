//! Shutdown: stop new acquires and waits, release every tracked lease in parallel, and
//! report only what Redis confirmed.

use std::time::Duration;

use super::Driver;
use crate::error::{LockError, LockErrorCode};

impl Driver {
    /// Resolves when every tracked lease was released and every acquire or release in
    /// progress settled, within shutdownTimeoutMs. Calling it again returns the same result.
    pub async fn shutdown(&self) -> Result<(), LockError> {
        let result = self.inner.shutdown_result.get_or_init(|| self.shut_down()).await.clone();
        if let Err(err) = &result {
            self.inner.counters.error(err.code);
        }
        result
    }

    /// Whether `shutdown()` was called (it may still be running).
    pub fn is_shutting_down(&self) -> bool {
        self.inner.stopping.is_cancelled()
    }

    async fn shut_down(&self) -> Result<(), LockError> {
        let inner = &self.inner;
        inner.stopping.cancel();
        let releases: Vec<_> = inner
            .leases
            .close()
            .into_iter()
            .map(|lease| {
                lease.mark_shut_down();
                let this = self.clone();
                // Spawned: past the timeout they go on, and late confirmations still clean up.
                inner.tasks.spawn(async move {
                    this.clean_up(&lease.keys, &lease.token, lease.latest_expiry()).await
                })
            })
            .collect();
        inner.tasks.close();

        let everything = async {
            let mut failures = Vec::new();
            for release in releases {
                match release.await {
                    Ok(Ok(_)) => {}
                    Ok(Err(err)) => failures.push(err),
                    Err(_) => failures.push(LockError::new(
                        LockErrorCode::CleanupFailed,
                        "a release task failed",
                    )),
                }
            }
            inner.tasks.wait().await;
            failures.extend(crate::sync::lock(&inner.cleanup_failures).drain(..));
            failures
        };
        let timeout = Duration::from_millis(inner.options.shutdown_timeout_ms.into());
        let outcome = tokio::time::timeout(timeout, everything).await;
        inner.link.close();
        match outcome {
            Err(_) => Err(LockError::new(
                LockErrorCode::CleanupTimeout,
                "shutdown passed shutdownTimeoutMs; cleanup goes on in the background and the lease TTL is the final expiry",
            )),
            Ok(failures) if failures.is_empty() => Ok(()),
            Ok(failures) => {
                let mut err = LockError::new(
                    LockErrorCode::CleanupFailed,
                    format!("shutdown could not confirm {} release(s); the lease TTL is the final expiry", failures.len()),
                );
                err.causes = failures;
                Err(err)
            }
        }
    }
}
