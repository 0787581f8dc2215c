//! The pause between tries of a retry loop that keeps failing: it doubles from a first
//! pause up to a cap, and starts over after a success. Shared by the background release,
//! the chase of a late acquire reply, each Sentinel's watcher and the shard re-subscription.

use std::time::Duration;

#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub(crate) const fn new(first: Duration, max: Duration) -> Self {
        Self { first, max, next: first }
    }

    /// The pause [`next`](Self::next) will return.
    pub(crate) fn peek(&self) -> Duration {
        self.next
    }

    /// The pause to take now; the one after it is twice as long, up to the cap.
    pub(crate) fn next(&mut self) -> Duration {
        let now = self.next;
        self.next = (self.next * 2).min(self.max);
        now
    }

    /// A try succeeded: the next failure pauses the first pause again.
    pub(crate) fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_the_cap_and_start_over_after_a_reset() {
        let ms = Duration::from_millis;
        let mut backoff = Backoff::new(ms(100), ms(350));
        assert_eq!(backoff.peek(), ms(100));
        let pauses: Vec<_> = (0..4).map(|_| backoff.next()).collect();
        assert_eq!(pauses, [ms(100), ms(200), ms(350), ms(350)]);
        backoff.reset();
        assert_eq!(backoff.next(), ms(100));
    }
}
