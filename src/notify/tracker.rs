//! The channels a subscription holds, as plain state without I/O: which are pending, sent,
//! confirmed, when each is looked at again for idleness, and what is sent again after a
//! reconnect. The lifecycle task ([`super::lifecycle`]) does the I/O around it.
//!
//! Work is proportional to the keys it concerns: new keys wait in a queue, and the moments
//! a confirmed key is looked at again sit in an ordered map, so a batch, a confirmation or a
//! sweep touches only its own keys, never the whole set (issue 22, item 5).
//!
//! Size is bounded by the keys waited on, whatever the subscription's state (issue 34, item
//! 4; decision 0168): a key is forgotten the moment its last waiter leaves unless something
//! of it is on a connection (a SUBSCRIBE in flight, a subscription or a verdict), and such a
//! key is let go by the sweep, or at once when the connection goes.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a channel stays subscribed after the last waiter it serves left (decisions 0007
/// and 0061): a key contended now is likely contended again within a second.
pub(crate) const GRACE: Duration = Duration::from_secs(1);

/// How often a key heard only through classic pub/sub, or not at all, is judged again while
/// it is waited on (decision 0160): its slot may have moved to a node that judges otherwise,
/// and no push says so.
pub(crate) const REJUDGE: Duration = Duration::from_secs(5);

/// Forgotten keys the send queue may keep beyond twice the keys tracked before it is cleaned.
const PENDING_SLACK: usize = 16;

/// Which pub/sub carries a key's releases to this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Via {
    /// SSUBSCRIBE at the slot's owner (a Cluster whose node has sharded pub/sub).
    Sharded,
    /// SUBSCRIBE: a single server, or a Cluster node whose release script PUBLISHes.
    Classic,
}

/// What judging a key found (decision 0160).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Confirmed: its releases are heard.
    Live(Via),
    /// Its node publishes where this process cannot subscribe (SPUBLISH accepted, SSUBSCRIBE
    /// refused; or no SUBSCRIBE either): its releases cannot be heard, its waiters poll.
    Deaf,
}

/// Subscriptions that may be in place for a key on this connection: what is undone when
/// the key is let go.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Held {
    pub(super) sharded: bool,
    pub(super) classic: bool,
}

impl Held {
    pub(super) fn any(self) -> bool {
        self.sharded || self.classic
    }
}

/// Where a key's SUBSCRIBE stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    /// Nothing to send.
    Idle,
    /// To be sent (it is in the queue).
    Pending,
    /// Sent, not yet answered.
    Sent,
}

#[derive(Debug)]
struct Entry {
    /// The last verdict; None before the first, or once its subscription ended.
    heard: Option<Verdict>,
    queue: Queue,
    held: Held,
    /// When the key was first seen unused (per key: its line gone).
    idle_since: Option<Instant>,
    /// Its place in `due` once it has a verdict.
    due: Option<(Instant, u64)>,
    /// When it is judged again (classic or deaf only).
    rejudge_at: Option<Instant>,
    /// Its last waiter left while it was on the connection: forgotten when the connection
    /// goes, if no waiter registered it again meanwhile.
    unwaited: bool,
}

impl Entry {
    fn new() -> Self {
        Self {
            heard: None,
            queue: Queue::Pending,
            held: Held::default(),
            idle_since: None,
            due: None,
            rejudge_at: None,
            unwaited: false,
        }
    }

    /// Nothing of it is on a connection: forgetting it undoes nothing and loses no answer.
    fn off_connection(&self) -> bool {
        self.queue != Queue::Sent && !self.held.any() && self.heard.is_none()
    }
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
    /// Keys to be sent; a key forgotten or sent meanwhile is skipped.
    pending: VecDeque<Arc<str>>,
    /// When each key with a verdict is looked at again for idleness.
    due: BTreeMap<(Instant, u64), Arc<str>>,
    /// When classic and deaf keys are judged again, in order (one delay for all); an entry
    /// whose key was judged since is skipped.
    rejudge: VecDeque<(Instant, Arc<str>)>,
    next_seq: u64,
    live: usize,
    deaf: usize,
}

impl Tracker {
    /// A waiter of `hash` really waits. True when the key went into the queue (it needs a
    /// SUBSCRIBE); a key known already counts as used again.
    pub(super) fn register(&mut self, hash: &Arc<str>) -> bool {
        match self.keys.get_mut(hash) {
            None => {
                self.keys.insert(hash.clone(), Entry::new());
                self.pending.push_back(hash.clone());
                true
            }
            Some(entry) => {
                entry.idle_since = None;
                entry.unwaited = false;
                false
            }
        }
    }

    /// The last waiter of `hash` left. Forgotten at once when nothing of it is on a
    /// connection: while the subscription is down nothing else would ever let it go (issue
    /// 34). Otherwise the sweep lets it go a grace period later, or the connection's end.
    pub(super) fn left(&mut self, hash: &str) {
        let Some(entry) = self.keys.get_mut(hash) else { return };
        if !entry.off_connection() {
            entry.unwaited = true;
            return;
        }
        self.remove(hash);
        // The queue keeps a forgotten key until a batch skips it, and no batch is taken
        // while the subscription is down: drop such leftovers once they outnumber the keys.
        if self.pending.len() > 2 * self.keys.len() + PENDING_SLACK {
            let (keys, mut seen) = (&self.keys, HashSet::new());
            self.pending.retain(|hash| {
                keys.get(hash).is_some_and(|e| e.queue == Queue::Pending)
                    && seen.insert(hash.clone())
            });
        }
    }

    /// Whether keys wait to be sent.
    pub(super) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Up to `max` keys to be sent, now marked sent, with what they hold. A key whose
    /// waiters are gone meanwhile (`in_use` false) is not sent: forgotten when it holds
    /// nothing (a new waiter registers it again), otherwise looked at now by the idle sweep,
    /// which lets its subscriptions go.
    pub(super) fn take_batch(
        &mut self,
        max: usize,
        now: Instant,
        in_use: impl Fn(&str) -> bool,
    ) -> Vec<(Arc<str>, Held)> {
        let mut batch = Vec::new();
        while batch.len() < max {
            let Some(hash) = self.pending.pop_front() else { break };
            let Some(entry) = self.keys.get_mut(&hash) else { continue };
            if entry.queue != Queue::Pending {
                continue;
            }
            if in_use(&hash) {
                entry.queue = Queue::Sent;
                batch.push((hash, entry.held));
            } else if entry.held.any() {
                entry.queue = Queue::Idle;
                Self::schedule(&mut self.due, &mut self.next_seq, entry, &hash, now);
            } else {
                self.remove(&hash);
            }
        }
        batch
    }

    /// The answer to a key sent: `verdict` (None: it failed, and goes into the queue again),
    /// and what it holds now. True when its first waiter is to check once more: it is heard
    /// now and was not (a release meanwhile was missed), or it was heard and no longer is
    /// (its waiter sleeps the long interval). Ignored for a key not waiting for an answer.
    pub(super) fn judged(
        &mut self,
        hash: &Arc<str>,
        verdict: Option<Verdict>,
        held: Held,
        now: Instant,
    ) -> bool {
        let Some(entry) = self.keys.get_mut(hash) else { return false };
        if entry.queue != Queue::Sent {
            return false;
        }
        entry.held = held;
        let Some(verdict) = verdict else {
            entry.queue = Queue::Pending;
            self.pending.push_back(hash.clone());
            return false;
        };
        entry.queue = Queue::Idle;
        let was = entry.heard.replace(verdict);
        Self::count(&mut self.live, &mut self.deaf, was, -1);
        Self::count(&mut self.live, &mut self.deaf, Some(verdict), 1);
        if entry.due.is_none() {
            Self::schedule(&mut self.due, &mut self.next_seq, entry, hash, now + GRACE);
        }
        entry.rejudge_at = None;
        if verdict != Verdict::Live(Via::Sharded) {
            // A sharded key hears of a slot move from the server itself (`ended`).
            entry.rejudge_at = Some(now + REJUDGE);
            self.rejudge.push_back((now + REJUDGE, hash.clone()));
        }
        let heard = |v: Option<Verdict>| matches!(v, Some(Verdict::Live(_)));
        (heard(Some(verdict)) || heard(was)) && was != Some(verdict)
    }

    /// The server ended `hash`'s sharded subscription (its slot moved away): not heard until
    /// it is judged again, at once.
    pub(super) fn ended(&mut self, hash: &str) {
        let Some((hash, _)) = self.keys.get_key_value(hash) else { return };
        let hash = hash.clone();
        let entry = self.keys.get_mut(&hash).expect("just found");
        entry.held.sharded = false;
        let was = entry.heard.take();
        Self::count(&mut self.live, &mut self.deaf, was, -1);
        entry.rejudge_at = None;
        if entry.queue == Queue::Idle {
            entry.queue = Queue::Pending;
            self.pending.push_back(hash);
        }
    }

    /// One node's connection ended (which keys were on it is not said): every key is not
    /// heard until it is judged again, and each is sent again (once). What they held may
    /// still be in place elsewhere.
    pub(super) fn resend_all(&mut self) {
        self.pending.clear();
        self.rejudge.clear();
        self.live = 0;
        self.deaf = 0;
        for (hash, entry) in &mut self.keys {
            entry.heard = None;
            entry.queue = Queue::Pending;
            entry.rejudge_at = None;
            self.pending.push_back(hash.clone());
        }
    }

    /// A new connection: nothing is held on it, and every key is sent again.
    pub(super) fn new_connection(&mut self) {
        self.connection_lost();
    }

    /// The connection is gone: nothing is held, a key whose waiters left is forgotten, and
    /// every other key is sent again on the next connection.
    pub(super) fn connection_lost(&mut self) {
        self.keys.retain(|_, entry| !entry.unwaited);
        self.resend_all();
        self.due.clear();
        for entry in self.keys.values_mut() {
            entry.held = Held::default();
            entry.due = None;
        }
    }

    /// When the next classic or deaf key is to be judged again (possibly one judged since:
    /// [`Self::rejudge_due`] skips it).
    pub(super) fn next_rejudge(&self) -> Option<Instant> {
        self.rejudge.front().map(|(at, _)| *at)
    }

    /// Queues the classic and deaf keys due at `now` to be judged again; they keep their
    /// verdict meanwhile. True when any was queued.
    pub(super) fn rejudge_due(&mut self, now: Instant) -> bool {
        let mut queued = false;
        while let Some((at, _)) = self.rejudge.front() {
            if *at > now {
                break;
            }
            let (at, hash) = self.rejudge.pop_front().expect("just looked");
            let Some(entry) = self.keys.get_mut(&hash) else { continue };
            if entry.rejudge_at != Some(at) || entry.queue != Queue::Idle {
                continue;
            }
            entry.rejudge_at = None;
            entry.queue = Queue::Pending;
            self.pending.push_back(hash);
            queued = true;
        }
        queued
    }

    /// When the next key is to be looked at for idleness.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.due.first_key_value().map(|((at, _), _)| *at)
    }

    /// `hash` is to be looked at now (its use changed).
    pub(super) fn look_again(&mut self, hash: &str, now: Instant) {
        if let Some((hash, _)) = self.keys.get_key_value(hash) {
            let hash = hash.clone();
            let entry = self.keys.get_mut(&hash).expect("just found");
            if entry.due.is_some() {
                Self::schedule(&mut self.due, &mut self.next_seq, entry, &hash, now);
            }
        }
    }

    /// Looks at the keys that are due at `now`; forgets and returns, with what they hold,
    /// those unused for a whole grace period. Touches only the keys due.
    pub(super) fn sweep(
        &mut self,
        now: Instant,
        usage: impl Fn(&str) -> Usage,
    ) -> Vec<(Arc<str>, Held)> {
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
                let held = key.held;
                self.remove(&hash);
                idle.push((hash, held));
            } else {
                Self::schedule(&mut self.due, &mut self.next_seq, key, &hash, since + GRACE);
            }
        }
        idle
    }

    fn remove(&mut self, hash: &str) {
        if let Some(entry) = self.keys.remove(hash) {
            Self::count(&mut self.live, &mut self.deaf, entry.heard, -1);
            if let Some(due) = entry.due {
                self.due.remove(&due);
            }
        }
    }

    fn count(live: &mut usize, deaf: &mut usize, verdict: Option<Verdict>, by: isize) {
        let counter = match verdict {
            Some(Verdict::Live(_)) => live,
            Some(Verdict::Deaf) => deaf,
            None => return,
        };
        *counter = counter.wrapping_add_signed(by);
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
        self.keys.get(hash).is_some_and(|e| matches!(e.heard, Some(Verdict::Live(_))))
    }

    /// Keys heard now.
    pub(super) fn live(&self) -> usize {
        self.live
    }

    /// Keys whose releases cannot be heard now (their waiters poll).
    pub(super) fn deaf(&self) -> usize {
        self.deaf
    }

    pub(super) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Keys tracked.
    pub(super) fn len(&self) -> usize {
        self.keys.len()
    }

    /// Entries over all its collections (keys, the send queue, the timers): what its memory
    /// grows with.
    pub(super) fn footprint(&self) -> usize {
        self.keys.len() + self.pending.len() + self.due.len() + self.rejudge.len()
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

    const SHARDED: Verdict = Verdict::Live(Via::Sharded);
    const CLASSIC: Verdict = Verdict::Live(Via::Classic);
    const HELD_SHARDED: Held = Held { sharded: true, classic: false };
    const HELD_CLASSIC: Held = Held { sharded: false, classic: true };

    fn sent(t: &mut Tracker) -> Vec<Arc<str>> {
        t.take_batch(usize::MAX, now(), |_| true).into_iter().map(|(k, _)| k).collect()
    }

    /// Registers and confirms `keys` (sharded) at `now()`.
    fn live(t: &mut Tracker, keys: &[&str]) {
        for k in keys {
            t.register(&key(k));
        }
        for k in sent(t) {
            assert!(t.judged(&k, Some(SHARDED), HELD_SHARDED, now()));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_new_keys_goes_out_in_one_batch_and_each_key_once() {
        let mut t = Tracker::default();
        assert!(t.register(&key("a")));
        assert!(t.register(&key("b")));
        assert!(!t.register(&key("a")), "registered twice, sent once");
        assert_eq!(sent(&mut t), vec![key("a"), key("b")]);
        assert!(!t.has_pending());
        assert!(sent(&mut t).is_empty());
        assert!(t.judged(&key("a"), Some(SHARDED), HELD_SHARDED, now()));
        assert!(t.is_live("a") && !t.is_live("b"), "b is sent, not confirmed");
        assert_eq!(t.live(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_whose_waiters_left_before_it_was_sent_is_forgotten_not_sent() {
        let mut t = Tracker::default();
        t.register(&key("gone"));
        t.register(&key("here"));
        let batch = t.take_batch(usize::MAX, now(), |k| k == "here");
        assert_eq!(batch, vec![(key("here"), Held::default())]);
        assert!(t.register(&key("gone")), "a new waiter registers it again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_takes_at_most_its_size_and_the_rest_follows() {
        let mut t = Tracker::default();
        for i in 0..5 {
            t.register(&key(&i.to_string()));
        }
        assert_eq!(t.take_batch(3, now(), |_| true).len(), 3);
        assert!(t.has_pending());
        assert_eq!(t.take_batch(3, now(), |_| true).len(), 2);
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
        assert_eq!(t.sweep(now(), usage), vec![(key("a"), HELD_SHARDED)]);
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
        assert_eq!(t.sweep(now(), |_| Usage::IdleSince(left)), vec![(key("ns"), HELD_SHARDED)]);
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
    async fn after_a_node_is_lost_every_key_is_sent_again_and_a_moved_key_alone() {
        let mut t = Tracker::default();
        live(&mut t, &["a", "b"]);
        t.ended("a");
        assert!(!t.is_live("a") && t.live() == 1);
        t.ended("a");
        assert_eq!(sent(&mut t), vec![key("a")], "queued once");
        t.resend_all();
        assert_eq!(t.live(), 0);
        let mut again = t.take_batch(usize::MAX, now(), |_| true);
        again.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(again[0], (key("a"), Held::default()), "the server ended a's subscription");
        assert_eq!(again[1], (key("b"), HELD_SHARDED), "b's may be in place still");
        assert!(!t.judged(&key("c"), Some(SHARDED), HELD_SHARDED, now()), "never registered");
    }

    #[tokio::test(start_paused = true)]
    async fn keys_of_one_node_can_be_deaf_while_the_others_are_heard() {
        let mut t = Tracker::default();
        t.register(&key("a"));
        t.register(&key("b"));
        t.register(&key("c"));
        sent(&mut t);
        assert!(t.judged(&key("a"), Some(SHARDED), HELD_SHARDED, now()));
        assert!(!t.judged(&key("b"), Some(Verdict::Deaf), Held::default(), now()), "never heard");
        assert!(t.judged(&key("c"), Some(CLASSIC), HELD_CLASSIC, now()));
        assert!(t.is_live("a") && !t.is_live("b") && t.is_live("c"));
        assert_eq!((t.live(), t.deaf()), (2, 1));
        // Deaf keys are let go when idle too, and nothing of theirs is unsubscribed.
        advance(GRACE).await;
        let usage = |k: &str| if k == "b" { Usage::Idle } else { Usage::InUse };
        t.sweep(now(), usage);
        advance(GRACE).await;
        assert_eq!(t.sweep(now(), usage), vec![(key("b"), Held::default())]);
        assert_eq!(t.deaf(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn classic_and_deaf_keys_are_judged_again_and_keep_their_verdict_meanwhile() {
        let mut t = Tracker::default();
        t.register(&key("c"));
        t.register(&key("d"));
        t.register(&key("s"));
        sent(&mut t);
        t.judged(&key("c"), Some(CLASSIC), HELD_CLASSIC, now());
        t.judged(&key("d"), Some(Verdict::Deaf), Held::default(), now());
        t.judged(&key("s"), Some(SHARDED), HELD_SHARDED, now());
        assert_eq!(t.next_rejudge(), Some(now() + REJUDGE), "a sharded key is not");
        advance(REJUDGE - Duration::from_millis(1)).await;
        assert!(!t.rejudge_due(now()));
        advance(Duration::from_millis(1)).await;
        assert!(t.rejudge_due(now()));
        let again = t.take_batch(usize::MAX, now(), |_| true);
        assert_eq!(again, vec![(key("c"), HELD_CLASSIC), (key("d"), Held::default())]);
        assert!(t.is_live("c"), "still heard while it is judged again");
        assert_eq!(t.deaf(), 1);
        // c's slot moved to a node with sharded pub/sub; d's node still refuses.
        assert!(t.judged(&key("c"), Some(SHARDED), HELD_SHARDED, now()), "checks once more");
        assert!(!t.judged(&key("d"), Some(Verdict::Deaf), Held::default(), now()));
        assert_eq!((t.live(), t.deaf()), (2, 1));
        assert_eq!(t.next_rejudge(), Some(now() + REJUDGE), "d only");
        advance(REJUDGE).await;
        assert!(t.rejudge_due(now()));
        assert_eq!(sent(&mut t), vec![key("d")]);
        // A failed judgment keeps the verdict and goes out again.
        assert!(!t.judged(&key("d"), None, Held::default(), now()));
        assert_eq!(t.deaf(), 1);
        assert!(t.has_pending());
    }

    #[tokio::test(start_paused = true)]
    async fn a_heard_key_that_turns_deaf_wakes_its_waiter() {
        let mut t = Tracker::default();
        t.register(&key("c"));
        sent(&mut t);
        t.judged(&key("c"), Some(CLASSIC), HELD_CLASSIC, now());
        advance(REJUDGE).await;
        t.rejudge_due(now());
        sent(&mut t);
        assert!(t.judged(&key("c"), Some(Verdict::Deaf), Held::default(), now()));
        assert!(!t.is_live("c"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_left_while_it_holds_a_subscription_is_let_go_by_the_sweep_not_forgotten() {
        let mut t = Tracker::default();
        t.register(&key("c"));
        sent(&mut t);
        t.judged(&key("c"), Some(CLASSIC), HELD_CLASSIC, now());
        advance(REJUDGE).await;
        t.rejudge_due(now());
        assert!(t.take_batch(usize::MAX, now(), |_| false).is_empty(), "not judged again");
        assert_eq!(t.next_due(), Some(now()));
        t.sweep(now(), |_| Usage::Idle);
        advance(GRACE).await;
        assert_eq!(t.sweep(now(), |_| Usage::Idle), vec![(key("c"), HELD_CLASSIC)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_whose_last_waiter_left_before_it_was_sent_is_forgotten_at_once() {
        let mut t = Tracker::default();
        t.register(&key("gone"));
        t.register(&key("here"));
        t.left("gone");
        assert_eq!(t.len(), 1);
        assert!(t.register(&key("gone")), "a new waiter registers it again, as new");
        let mut batch = sent(&mut t);
        batch.sort();
        assert_eq!(batch, vec![key("gone"), key("here")], "each sent once");
    }

    /// Issue 34: with the subscription down (maxclients, a proxy's error) no batch is taken
    /// and no sweep runs, yet each key goes with its last waiter, and the send queue does
    /// not keep what was forgotten.
    #[tokio::test(start_paused = true)]
    async fn ten_thousand_keys_waited_on_one_after_another_while_the_subscription_is_down_leave_nothing_behind(
    ) {
        let mut t = Tracker::default();
        t.connection_lost();
        const AT_ONCE: usize = 4;
        let mut most = 0;
        for i in 0..10_000 {
            t.register(&key(&i.to_string()));
            if i % 500 == 0 {
                // The retry 5 s after a failure, which fails again.
                t.connection_lost();
            }
            if i >= AT_ONCE - 1 {
                t.left(&(i + 1 - AT_ONCE).to_string());
            }
            assert!(t.len() <= AT_ONCE, "{} keys tracked with {AT_ONCE} waited on", t.len());
            most = most.max(t.footprint());
        }
        for i in 10_000 - (AT_ONCE - 1)..10_000 {
            t.left(&i.to_string());
        }
        assert!(t.is_empty());
        assert!(most <= 2 * AT_ONCE + 2 * AT_ONCE + PENDING_SLACK + 1, "footprint {most}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_left_while_its_subscribe_is_in_flight_keeps_its_answer_and_goes_with_the_connection(
    ) {
        let mut t = Tracker::default();
        t.register(&key("a"));
        sent(&mut t);
        t.left("a");
        assert_eq!(t.len(), 1, "its SUBSCRIBE's answer is still to come");
        assert!(t.judged(&key("a"), Some(CLASSIC), HELD_CLASSIC, now()));
        t.connection_lost();
        assert!(t.is_empty(), "its subscription went with the connection");

        t.register(&key("b"));
        sent(&mut t);
        t.left("b");
        t.connection_lost();
        assert!(t.is_empty(), "the connection went before the answer");
        assert!(!t.judged(&key("b"), Some(CLASSIC), HELD_CLASSIC, now()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_waited_on_again_before_the_connection_goes_is_sent_again_on_the_next() {
        let mut t = Tracker::default();
        t.register(&key("a"));
        sent(&mut t);
        t.left("a");
        assert!(!t.register(&key("a")), "known: no second SUBSCRIBE");
        t.connection_lost();
        assert_eq!(t.take_batch(usize::MAX, now(), |_| true), vec![(key("a"), Held::default())]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_subscribed_key_whose_waiters_left_is_let_go_by_the_sweep_a_grace_period_later() {
        let mut t = Tracker::default();
        live(&mut t, &["a"]);
        t.left("a");
        assert!(t.is_live("a"), "a waiter within the grace period needs no SUBSCRIBE");
        advance(GRACE).await;
        assert!(t.sweep(now(), |_| Usage::Idle).is_empty());
        advance(GRACE).await;
        assert_eq!(t.sweep(now(), |_| Usage::Idle), vec![(key("a"), HELD_SHARDED)]);
        assert!(t.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_connection_holds_nothing_and_its_keys_still_waited_on_go_out_again() {
        let mut t = Tracker::default();
        live(&mut t, &["a"]);
        t.connection_lost();
        assert_eq!((t.live(), t.next_due()), (0, None));
        assert_eq!(t.take_batch(usize::MAX, now(), |_| true), vec![(key("a"), Held::default())]);
    }
}
