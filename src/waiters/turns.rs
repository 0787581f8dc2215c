//! Taking turns with other processes (decisions 0010, 0070, 0071): how long a first waiter
//! woken by a release gives other processes before it tries, from what its line heard and
//! learned. A wait line kept by each process for itself, from facts it already has: no
//! Redis command, key or reply depends on it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long other processes get to answer this backend's own release of a key first, from
/// the moment its own notification arrives (they hear the same PUBLISH): about what waking
/// a sleeping process and sending one command takes on a busy 2-core machine (decision
/// 0010). `DOKEBI_LOCK_REDIS_HEAD_START_US` sets it for experiments; 0 turns it off.
fn head_start() -> Duration {
    crate::switches::head_start()
}

/// The step of the staggered head start (decision 0070): a first waiter woken by a release
/// waits this much for every other listening process that, by the count of releases it
/// heard since it last held the key, may not have had its turn yet.
/// `DOKEBI_LOCK_REDIS_STAGGER_US` sets it for experiments; 0 returns to decision 0010's
/// head start for the releasing process alone.
pub(super) fn stagger_step() -> Duration {
    crate::switches::stagger_step()
}

/// Acquisitions over which a line takes the most other turns it saw as its count.
pub(super) const TURNS_WINDOW: u32 = 8;

/// Other processes counted at most, so that one key's hand-offs are not slowed by a large
/// fleet listening on the namespace for other keys.
const STAGGER_MAX_OTHERS: u64 = 16;

/// The turn-taking state of one key's line (decisions 0010, 0070, 0071): plain state, no
/// I/O, so every rule is unit-tested below.
pub(super) struct Turns {
    /// This backend released the key while other processes listen: its own first waiter,
    /// when the notification wakes it, holds back a moment (decision 0010).
    yield_next_wake: AtomicBool,
    /// Releases of the key announced since this line last acquired it (saturating; a new
    /// line starts "long ago"): the staggered head start of decision 0070.
    heard_since_acquired: AtomicU32,
    /// A release notification woke the first waiter (not a subscription change).
    notified: AtomicBool,
    /// How many other processes take turns with this line, as far as it learned: the most
    /// other turns it saw between two of its acquisitions, over its last
    /// [`TURNS_WINDOW`] acquisitions (decision 0070). `u32::MAX`: not learned yet, every
    /// other listener counts.
    competitors: AtomicU32,
    /// The window being observed: (most turns seen, acquisitions counted).
    window: Mutex<(u32, u32)>,
}

impl Default for Turns {
    fn default() -> Self {
        Self {
            yield_next_wake: AtomicBool::new(false),
            heard_since_acquired: AtomicU32::new(u32::MAX),
            notified: AtomicBool::new(false),
            competitors: AtomicU32::new(u32::MAX),
            window: Mutex::new((0, 0)),
        }
    }
}

impl Turns {
    /// A new line for a key whose previous line emptied lately: it knows who competes, but
    /// like any new line it has heard no release since an acquisition of its own.
    pub(super) fn with_learned(learned: Learned) -> Self {
        Self {
            competitors: AtomicU32::new(learned.competitors),
            window: Mutex::new(learned.window),
            ..Self::default()
        }
    }

    /// What this line learned, if anything.
    pub(super) fn learned(&self) -> Option<Learned> {
        let window = *crate::sync::lock(&self.window);
        let competitors = self.competitors.load(Ordering::Acquire);
        (competitors != u32::MAX || window.1 > 0).then_some(Learned { competitors, window })
    }

    /// This backend is releasing the key while other processes listen.
    pub(super) fn yield_next_wake(&self) {
        self.yield_next_wake.store(true, Ordering::Release);
    }

    /// A release of the key was announced.
    pub(super) fn announced(&self) {
        let _ = self
            .heard_since_acquired
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some(n.saturating_add(1)));
        self.notified.store(true, Ordering::Release);
    }

    /// The line acquired the key.
    pub(super) fn acquired(&self) {
        let heard = self.heard_since_acquired.swap(0, Ordering::AcqRel);
        if heard == u32::MAX {
            return; // a new line: no turns counted since an acquisition of ours
        }
        // Other processes' turns since our last acquisition. In namespace mode the listener
        // count includes processes waiting on other keys, which never take a turn here: the
        // most turns seen lately is the better count. It rises at once and falls only after
        // a whole window without that many, so a fast process that happened to win again
        // soon does not talk itself into competing early (one lucky hand-off is no evidence).
        let turns = heard.saturating_sub(1);
        let mut window = crate::sync::lock(&self.window);
        window.0 = window.0.max(turns);
        window.1 += 1;
        let known = self.competitors.load(Ordering::Acquire);
        if window.1 >= TURNS_WINDOW {
            self.competitors.store(window.0, Ordering::Release);
            *window = (0, 0);
        } else if known != u32::MAX && turns > known {
            self.competitors.store(turns, Ordering::Release);
        }
    }

    /// The head start to give other processes before trying, once, after a release woke
    /// the first waiter: decision 0010's for this backend's own release, or with a stagger
    /// step (decision 0070) one step per other process that may be owed a turn before us;
    /// with the number of such steps.
    pub(super) fn head_start(&self, others: u64) -> (Option<Duration>, u32) {
        let own = self.yield_next_wake.swap(false, Ordering::AcqRel);
        let notified = self.notified.swap(false, Ordering::AcqRel);
        let step = stagger_step();
        if !step.is_zero() {
            if !notified || others == 0 {
                return (None, 0);
            }
            // Releases heard since we held the key, our own release not counted: the
            // processes that had their turn since ours.
            let turns =
                u64::from(self.heard_since_acquired.load(Ordering::Acquire)).saturating_sub(1);
            let counted = u64::from(self.competitors.load(Ordering::Acquire))
                .min(others)
                .min(STAGGER_MAX_OTHERS);
            let owed = counted.saturating_sub(turns) as u32;
            if owed > 0 {
                return (Some(step * owed), owed);
            }
            // Our own release, nobody known to be owed a turn: decision 0010's head start.
        }
        let head_start = head_start();
        ((own && !head_start.is_zero()).then_some(head_start), 0)
    }

    /// A head start owed to a release whose notification never came is void.
    pub(super) fn forget(&self) {
        self.yield_next_wake.store(false, Ordering::Release);
        self.notified.store(false, Ordering::Release);
    }
}

/// How long what a line learned outlives it. A line empties whenever its last waiter
/// acquires before the next one has joined (a loop that releases and acquires again races
/// its own notification): the key's contention has not changed, and starting over from
/// "every listener counts" made each such gap cost up to [`TURNS_WINDOW`] slow hand-offs
/// (issue 21). A key left alone for longer starts over.
pub(super) const LEARNED_FOR: Duration = Duration::from_secs(1);

/// A line's count of competitors and the window observing it (decision 0070).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Learned {
    competitors: u32,
    window: (u32, u32),
}

/// The learning of lines that emptied lately. Bounded by the keys contended within
/// [`LEARNED_FOR`]: stale entries are dropped whenever the map doubles, so each costs O(1).
pub(super) struct Remembered {
    keys: HashMap<Arc<str>, (Learned, Instant)>,
    purge_at: usize,
}

impl Default for Remembered {
    fn default() -> Self {
        Self { keys: HashMap::new(), purge_at: 64 }
    }
}

impl Remembered {
    pub(super) fn keep(&mut self, hash: Arc<str>, learned: Learned, now: Instant) {
        self.keys.insert(hash, (learned, now));
        if self.keys.len() >= self.purge_at {
            self.keys.retain(|_, (_, at)| now.duration_since(*at) < LEARNED_FOR);
            self.purge_at = (self.keys.len() * 2).max(64);
        }
    }

    pub(super) fn take(&mut self, hash: &str, now: Instant) -> Option<Learned> {
        let (learned, at) = self.keys.remove(hash)?;
        (now.duration_since(at) < LEARNED_FOR).then_some(learned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line that acquired, then heard `releases` announced (its own first).
    fn line_after(releases: u32) -> Turns {
        let line = Turns::default();
        line.acquired();
        for _ in 0..releases {
            line.announced();
        }
        line
    }

    /// The head start of a first waiter woken by the last release `line` heard.
    fn woken(line: &Turns, others: u64) -> Option<Duration> {
        line.head_start(others).0
    }

    #[test]
    fn a_waiter_gives_way_one_step_per_other_process_that_has_not_had_its_turn_since_ours() {
        let step = stagger_step();
        // Our own release: all three others are owed a turn before us.
        assert_eq!(woken(&line_after(1), 3), Some(step * 3));
        // Two others took theirs since: one left.
        assert_eq!(woken(&line_after(3), 3), Some(step));
        // Everyone had a turn since ours: we go at once.
        assert_eq!(woken(&line_after(4), 3), None);
        // A crowd counts up to a bound, so a namespace full of other keys' waiters cannot
        // hold a hand-off for long.
        assert_eq!(woken(&line_after(1), 500), Some(step * STAGGER_MAX_OTHERS as u32));
    }

    #[test]
    fn a_line_that_never_held_the_key_or_hears_nobody_else_does_not_wait() {
        let fresh = Turns::default();
        fresh.announced();
        assert_eq!(woken(&fresh, 15), None, "a waiter new to the key is owed, not owing");
        assert_eq!(woken(&line_after(1), 0), None, "nobody else listens");
        let line = line_after(1);
        assert!(woken(&line, 3).is_some());
        assert_eq!(woken(&line, 3), None, "woken again, by a new subscription, not a release");
    }

    /// `line` hears `turns` releases of other processes, then acquires.
    fn acquires_after(line: &Turns, turns: u32) {
        for _ in 0..turns {
            line.announced();
        }
        line.acquired();
    }

    /// `line` hears its own release: the head start of its next first waiter.
    fn own_release(line: &Turns, others: u64) -> Option<Duration> {
        line.announced();
        woken(line, others)
    }

    #[test]
    fn a_line_counts_the_processes_that_really_take_turns_not_every_listener() {
        let step = stagger_step();
        let line = line_after(0);
        // Eight listeners, but only two others take turns between our acquisitions.
        for _ in 0..TURNS_WINDOW {
            assert_eq!(own_release(&line, 8), Some(step * 8), "not learned yet: all count");
            acquires_after(&line, 2);
        }
        assert_eq!(own_release(&line, 8), Some(step * 2));
        // One quick turn of ours proves nothing: the count stays for the window.
        acquires_after(&line, 0);
        assert_eq!(own_release(&line, 8), Some(step * 2));
        // A whole window in which nobody else took a turn: nobody is waited for.
        for _ in 0..TURNS_WINDOW {
            acquires_after(&line, 0);
            line.announced(); // our own release again
        }
        assert_eq!(woken(&line, 8), None);
        // More come back: counted at once.
        acquires_after(&line, 5);
        assert_eq!(own_release(&line, 8), Some(step * 5));
    }

    #[test]
    fn what_a_line_learned_is_kept_for_a_while_then_a_key_starts_over() {
        let mut remembered = Remembered::default();
        let at = Instant::now();
        let learned = Learned { competitors: 0, window: (0, 0) };
        remembered.keep("old".into(), learned, at);
        assert_eq!(remembered.take("old", at + LEARNED_FOR), None);
        remembered.keep("old".into(), learned, at);
        assert_eq!(remembered.take("old", at + LEARNED_FOR / 2), Some(learned));
    }

    #[test]
    fn what_lines_learned_is_forgotten_once_stale_so_memory_stays_bounded() {
        let mut remembered = Remembered::default();
        let start = Instant::now();
        let learned = Learned { competitors: 1, window: (1, 1) };
        for i in 0..10_000u32 {
            // One key every millisecond: at most about a second's worth stays.
            let now = start + std::time::Duration::from_millis(i.into());
            remembered.keep(i.to_string().into(), learned, now);
        }
        assert!(remembered.keys.len() <= 2 * 1000 + 64, "{} kept", remembered.keys.len());
    }
}
