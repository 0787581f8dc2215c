//! The one way this crate takes a `std::sync::Mutex`.

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, also when a thread panicked while holding it: every value kept under
/// these locks stays consistent between statements (a panic there is an internal error
/// the caller already reports), and a poisoned lock must not turn every later call into
/// a second panic.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
