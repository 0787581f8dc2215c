//! The channels a subscription holds, as plain state without I/O: which are pending, sent,
//! confirmed, when each is looked at again for idleness, and what is sent again after a
//! reconnect. The lifecycle task ([`super::lifecycle`]) does the I/O around it.
//!
//! Work is proportional to the keys it concerns: new keys wait in a queue, and the moments
//! a confirmed key is looked at again sit in an ordered map, so a batch, a confirmation or a
//! sweep touches only its own keys, never the whole set (issue 22, item 5).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a channel stays subscribed after the last waiter it serves left (decisions 0007
/// and 0061): a key contended now is likely contended again within a second.
pub(crate) const GRACE: Duration = Duration::from_secs(1);

/// One key's subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyState {
    /// Registered, not yet sent (it is in the queue).
    Pending,
    /// Sent, not yet confirmed.
    Sent,
    /// Confirmed.
    Live,
}

#[derive(Debug)]
struct Entry {
    state: KeyState,
    /// When the key was first seen unused (per key: its line gone).
    idle_since: Option<Instant>,
    /// Its place in `due` while it is live.
    due: Option<(Instant, u64)>,
}

/// Whether a key is still used, as its mode tells (see [`super::modes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Usage {
    InUse,
    /// Unused since this moment.
    IdleSince(Instant),
    /// Unused, since when is not known: counted from the first time it is seen so.
    Idle,
}

#[derive(Debug, Default)]
pub(super) struct Tracker {
    keys: HashMap<Arc<str>, Entry>,
    /// Keys registered and not yet sent; a key forgotten or sent meanwhile is skipped.
    pending: VecDeque<Arc<str>>,
    /// When each live key is looked at again.
    due: BTreeMap<(Instant, u64), Arc<str>>,
    next_seq: u64,
    live: usize,
}

impl Tracker {
    /// A waiter of `hash` really waits. True when the key went into the queue (it needs a
    /// SUBSCRIBE); a key confirmed already counts as used again.
    pub(super) fn register(&mut self, hash: &Arc<str>) -> bool {
        match self.keys.get_mut(hash) {
            None => {
                self.keys.insert(
                    hash.clone(),
                    Entry { state: KeyState::Pending, idle_since: None, due: None },
                );
                self.pending.push_back(hash.clone());
                true
            }
            Some(entry) => {
                entry.idle_since = None;
                false
            }
        }
    }

    /// Whether keys wait to be sent.
    pub(super) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Up to `max` keys registered and not yet sent, now marked sent; a key whose waiters
    /// are gone meanwhile (`in_use` false) is forgotten instead (a new waiter registers it
    /// again).
    pub(super) fn take_batch(
        &mut self,
        max: usize,
        in_use: impl Fn(&str) -> bool,
    ) -> Vec<Arc<str>> {
        let mut batch = Vec::new();
        while batch.len() < max {
            let Some(hash) = self.pending.pop_front() else { break };
            let Some(entry) = self.keys.get_mut(&hash) else { continue };
            if entry.state != KeyState::Pending {
                continue;
            }
            if in_use(&hash) {
                entry.state = KeyState::Sent;
                batch.push(hash);
            } else {
                self.keys.remove(&hash);
            }
        }
        batch
    }

    /// The server confirmed `hash`: live, looked at again a grace period from `now`. False
    /// when the key was not waiting for this confirmation (forgotten, or sent again).
    pub(super) fn confirmed(&mut self, hash: &Arc<str>, now: Instant) -> bool {
        let Some(entry) = self.keys.get_mut(hash) else { return false };
        if entry.state != KeyState::Sent {
            return false;
        }
        entry.state = KeyState::Live;
        self.live += 1;
        Self::schedule(&mut self.due, &mut self.next_seq, entry, hash, now + GRACE);
        true
    }

    /// A SUBSCRIBE of `hash` failed, or the server ended its subscription: it goes into the
    /// queue again.
    pub(super) fn resend(&mut self, hash: &str) {
        let Some((hash, entry)) = self.keys.get_key_value(hash) else { return };
        if entry.state == KeyState::Pending {
            return;
        }
        let hash = hash.clone();
        let entry = self.keys.get_mut(&hash).expect("just found");
        if entry.state == KeyState::Live {
            self.live -= 1;
        }
        entry.state = KeyState::Pending;
        if let Some(due) = entry.due.take() {
            self.due.remove(&due);
        }
        self.pending.push_back(hash);
    }

    /// A new connection: every key is sent again (once each).
    pub(super) fn resend_all(&mut self) {
        self.due.clear();
        self.pending.clear();
        self.live = 0;
        for (hash, entry) in &mut self.keys {
            entry.state = KeyState::Pending;
            entry.due = None;
            self.pending.push_back(hash.clone());
        }
    }

    /// When the next live key is to be looked at.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.due.first_key_value().map(|((at, _), _)| *at)
    }

    /// `hash` is to be looked at now (its use changed).
    pub(super) fn look_again(&mut self, hash: &str, now: Instant) {
        if let Some((hash, _)) = self.keys.get_key_value(hash) {
            let hash = hash.clone();
            let entry = self.keys.get_mut(&hash).expect("just found");
            if entry.state == KeyState::Live {
                Self::schedule(&mut self.due, &mut self.next_seq, entry, &hash, now);
            }
        }
    }

    /// Looks at the live keys that are due at `now`; forgets and returns those unused for a
    /// whole grace period. Touches only the keys due.
    pub(super) fn sweep(&mut self, now: Instant, usage: impl Fn(&str) -> Usage) -> Vec<Arc<str>> {
        let mut idle = Vec::new();
        while let Some(entry) = self.due.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let hash = entry.remove();
            let Some(key) = self.keys.get_mut(&hash) else { continue };
            key.due = None;
            let since = match usage(&hash) {
                Usage::InUse => {
                    key.idle_since = None;
                    // It may become unused at any moment: look again a grace period later.
                    Self::schedule(&mut self.due, &mut self.next_seq, key, &hash, now + GRACE);
                    continue;
                }
                Usage::IdleSince(since) => since,
                Usage::Idle => *key.idle_since.get_or_insert(now),
            };
            if now.saturating_duration_since(since) >= GRACE {
                self.keys.remove(&hash);
                self.live -= 1;
                idle.push(hash);
            } else {
                Self::schedule(&mut self.due, &mut self.next_seq, key, &hash, since + GRACE);
            }
        }
        idle
    }

    fn schedule(
        due: &mut BTreeMap<(Instant, u64), Arc<str>>,
        next_seq: &mut u64,
        entry: &mut Entry,
        hash: &Arc<str>,
        at: Instant,
    ) {
        if let Some(old) = entry.due.take() {
            due.remove(&old);
        }
        *next_seq += 1;
        entry.due = Some((at, *next_seq));
        due.insert((at, *next_seq), hash.clone());
    }

    pub(super) fn is_live(&self, hash: &str) -> bool {
        self.keys.get(hash).is_some_and(|e| e.state == KeyState::Live)
    }

    /// Keys confirmed now.
    pub(super) fn live(&self) -> usize {
        self.live
    }

    pub(super) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub(super) fn clear(&mut self) {
        *self = Self { next_seq: self.next_seq, ..Self::default() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::advance;

    fn now() -> Instant {
        tokio::time::Instant::now().into_std()
    }

    fn key(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    /// Registers and confirms `keys` at `now()`.
    fn live(tracker: &mut Tracker, keys: &[&str]) {
        for k in keys {
            tracker.register(&key(k));
        }
        for k in tracker.take_batch(usize::MAX, |_| true) {
            assert!(tracker.confirmed(&k, now()));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_new_keys_goes_out_in_one_batch_and_each_key_once() {
        let mut t = Tracker::default();
        assert!(t.register(&key("a")));
        assert!(t.register(&key("b")));
        assert!(!t.register(&key("a")), "registered twice, sent once");
        assert_eq!(t.take_batch(usize::MAX, |_| true), vec![key("a"), key("b")]);
        assert!(!t.has_pending());
        assert!(t.take_batch(usize::MAX, |_| true).is_empty());
        assert!(t.confirmed(&key("a"), now()));
        assert!(t.is_live("a") && !t.is_live("b"), "b is sent, not confirmed");
        assert_eq!(t.live(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_whose_waiters_left_before_it_was_sent_is_forgotten_not_sent() {
        let mut t = Tracker::default();
        t.register(&key("gone"));
        t.register(&key("here"));
        assert_eq!(t.take_batch(usize::MAX, |k| k == "here"), vec![key("here")]);
        assert!(t.register(&key("gone")), "a new waiter registers it again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_takes_at_most_its_size_and_the_rest_follows() {
        let mut t = Tracker::default();
        for i in 0..5 {
            t.register(&key(&i.to_string()));
        }
        assert_eq!(t.take_batch(3, |_| true).len(), 3);
        assert!(t.has_pending());
        assert_eq!(t.take_batch(3, |_| true).len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unused_key_is_let_go_a_grace_period_after_it_is_first_seen_unused() {
        let mut t = Tracker::default();
        live(&mut t, &["a", "b"]);
        assert_eq!(t.next_due(), Some(now() + GRACE));
        advance(GRACE).await;
        // a is unused from here; b still has waiters.
        let usage = |k: &str| if k == "a" { Usage::Idle } else { Usage::InUse };
        assert!(t.sweep(now(), usage).is_empty(), "first seen unused: not yet");
        advance(GRACE / 2).await;
        assert!(t.sweep(now(), usage).is_empty(), "nothing due");
        advance(GRACE / 2).await;
        assert_eq!(t.sweep(now(), usage), vec![key("a")]);
        assert!(!t.is_live("a") && t.is_live("b"));
        assert_eq!(t.live(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_waited_on_again_within_the_grace_period_stays() {
        let mut t = Tracker::default();
        live(&mut t, &["a"]);
        advance(GRACE).await;
        assert!(t.sweep(now(), |_| Usage::Idle).is_empty());
        advance(GRACE / 2).await;
        assert!(!t.register(&key("a")), "no new SUBSCRIBE");
        advance(GRACE / 2).await;
        assert!(t.sweep(now(), |_| Usage::InUse).is_empty());
        assert!(t.is_live("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_known_idle_moment_counts_from_then_and_looking_again_is_at_once() {
        let mut t = Tracker::default();
        live(&mut t, &["ns"]);
        let left = now();
        advance(GRACE / 4).await;
        t.look_again("ns", now());
        assert_eq!(t.next_due(), Some(now()));
        assert!(t.sweep(now(), |_| Usage::IdleSince(left)).is_empty());
        assert_eq!(t.next_due(), Some(left + GRACE), "due exactly a grace period after");
        advance(GRACE).await;
        assert_eq!(t.sweep(now(), |_| Usage::IdleSince(left)), vec![key("ns")]);
        assert!(t.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_sweep_touches_only_the_keys_due() {
        let mut t = Tracker::default();
        live(&mut t, &["early"]);
        advance(GRACE / 2).await;
        live(&mut t, &["late"]);
        advance(GRACE / 2).await;
        let looked = std::cell::RefCell::new(Vec::new());
        t.sweep(now(), |k| {
            looked.borrow_mut().push(k.to_owned());
            Usage::InUse
        });
        assert_eq!(looked.into_inner(), vec!["early".to_owned()]);
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_reconnect_every_key_is_sent_again_and_a_moved_key_alone() {
        let mut t = Tracker::default();
        live(&mut t, &["a", "b"]);
        t.resend("a");
        assert!(!t.is_live("a") && t.live() == 1);
        t.resend("a");
        assert_eq!(t.take_batch(usize::MAX, |_| true), vec![key("a")], "queued once");
        t.resend_all();
        assert_eq!(t.live(), 0);
        assert_eq!(t.next_due(), None);
        let mut again = t.take_batch(usize::MAX, |_| true);
        again.sort();
        assert_eq!(again, vec![key("a"), key("b")]);
        assert!(!t.confirmed(&key("c"), now()), "never registered");
    }
}
