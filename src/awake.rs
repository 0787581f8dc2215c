//! Which pending acquires wait rather than await a reply, for the binding's stay-awake spin
//! (decisions 0041, 0184).
//!
//! The binding keeps the runtime's thread polling while few replies are due, so a reply finds
//! it awake. It counts pending promises; an acquire that waits (for its turn in this process,
//! or between two attempts) is one of them but expects no reply, and counted as due it kept
//! the spin off wherever a lock had waiters, exactly where a hand-off's two round trips are.
//! Waiting acquires hold a [`Waiting`] guard, which the binding subtracts; when one stops
//! waiting to make an attempt, the hook the binding registered runs, so the attempt's reply
//! too finds the thread awake.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Acquires waiting now, over every driver of the process.
static WAITING: AtomicUsize = AtomicUsize::new(0);

/// What runs when an acquire stops waiting (the binding's spin), once registered.
static ON_ATTEMPT: OnceLock<fn()> = OnceLock::new();

/// Acquires that wait now: no reply of theirs is due.
#[cfg_attr(not(all(feature = "node", not(test))), allow(dead_code))] // read by the binding
pub(crate) fn waiting() -> usize {
    WAITING.load(Ordering::Relaxed)
}

/// Sets what runs when a waiting acquire is about to make an attempt. The first call wins.
#[cfg_attr(not(all(feature = "node", not(test))), allow(dead_code))] // set by the binding
pub(crate) fn on_attempt(hook: fn()) {
    let _ = ON_ATTEMPT.set(hook);
}

/// Held by an acquire while it waits; dropped when it stops, to attempt or to give up.
pub(crate) struct Waiting(());

impl Waiting {
    pub(crate) fn begin() -> Self {
        WAITING.fetch_add(1, Ordering::Relaxed);
        Waiting(())
    }

    /// Stops waiting to make an attempt now: its reply will be due.
    pub(crate) fn attempt(self) {
        drop(self);
        if let Some(hook) = ON_ATTEMPT.get() {
            hook();
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        WAITING.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test touches the process-wide count, so parallel tests cannot disturb it.
    #[test]
    fn a_waiter_counts_until_it_attempts_or_leaves() {
        let before = waiting();
        let first = Waiting::begin();
        let second = Waiting::begin();
        assert_eq!(waiting(), before + 2);
        first.attempt();
        assert_eq!(waiting(), before + 1);
        drop(second);
        assert_eq!(waiting(), before);
    }
}
