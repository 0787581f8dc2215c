//! The wait line: per key, the waiters of this backend queue up and only the first asks
//! Redis, so a crowd of waiters costs Redis one attempt at a time.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Notify;

use crate::error::{LockError, LockErrorCode};

pub(crate) struct Lines {
    lines: Mutex<HashMap<Arc<str>, Arc<Line>>>,
    next_ticket: AtomicU64,
    /// Acquires that really wait (see [`Place::mark_waiting`]), and when the last of them
    /// left (`None` while any waits). Uncontended acquires never count: a steady stream of
    /// them must not keep a subscription open.
    waiting: Mutex<(usize, Option<Instant>)>,
    /// Signalled when the backend goes from idle to waiting or back.
    changed: Notify,
    /// How many other processes heard this backend's last release: then its own next
    /// waiter gives them a head start after its next release (decision 0010), and with
    /// staggered head starts (decision 0070) the count sizes them.
    others_listening: AtomicU64,
}

impl Default for Lines {
    fn default() -> Self {
        Self {
            lines: Mutex::default(),
            next_ticket: AtomicU64::default(),
            waiting: Mutex::new((0, Some(Instant::now()))),
            changed: Notify::new(),
            others_listening: AtomicU64::new(0),
        }
    }
}

/// One key's line.
pub(crate) struct Line {
    queue: Mutex<VecDeque<(u64, Arc<Notify>)>>,
    /// Wakes the first waiter early: a release notification, or a new subscription.
    pub wake: Notify,
    /// The previous first waiter acquired the key: the next one need not ask Redis until a
    /// release is announced.
    held_here: AtomicBool,
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

impl Default for Line {
    fn default() -> Self {
        Self {
            queue: Mutex::default(),
            wake: Notify::new(),
            held_here: AtomicBool::new(false),
            yield_next_wake: AtomicBool::new(false),
            heard_since_acquired: AtomicU32::new(u32::MAX),
            notified: AtomicBool::new(false),
            competitors: AtomicU32::new(u32::MAX),
            window: Mutex::new((0, 0)),
        }
    }
}

/// A waiter's place in its line; leaving (drop) passes the turn on.
pub(crate) struct Place {
    lines: Arc<Lines>,
    hash: Arc<str>,
    pub line: Arc<Line>,
    ticket: u64,
    turn: Arc<Notify>,
    waiting: AtomicBool,
}

impl Lines {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Arc<Line>>> {
        crate::sync::lock(&self.lines)
    }

    /// Joins the line of `hash`. With `only_if_empty` (waitTimeoutMs 0) a waiter never
    /// jumps the line: LOCK_BUSY at once, without asking Redis, when someone is waiting.
    pub(crate) fn join(
        self: &Arc<Self>,
        hash: &Arc<str>,
        only_if_empty: bool,
    ) -> Result<Place, LockError> {
        let mut map = self.map();
        let line = map.entry(hash.clone()).or_default().clone();
        let mut queue = line.queue();
        if only_if_empty && !queue.is_empty() {
            return Err(LockError::new(
                LockErrorCode::LockBusy,
                "the lock is busy: this process already waits for it",
            ));
        }
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let turn = Arc::new(Notify::new());
        let behind_others = !queue.is_empty();
        if !behind_others {
            turn.notify_one();
        }
        queue.push_back((ticket, turn.clone()));
        drop(queue);
        drop(map);
        let place = Place {
            lines: self.clone(),
            hash: hash.clone(),
            line,
            ticket,
            turn,
            waiting: AtomicBool::new(false),
        };
        if behind_others {
            place.mark_waiting();
        }
        Ok(place)
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, (usize, Option<Instant>)> {
        crate::sync::lock(&self.waiting)
    }

    fn start_waiting(&self) {
        let mut waiting = self.waiting();
        waiting.0 += 1;
        if waiting.0 == 1 {
            waiting.1 = None;
            self.changed.notify_one();
        }
    }

    fn stop_waiting(&self) {
        let mut waiting = self.waiting();
        waiting.0 = waiting.0.saturating_sub(1);
        if waiting.0 == 0 {
            waiting.1 = Some(Instant::now());
            self.changed.notify_one();
        }
    }

    /// When the last acquire of this backend that really waited left, or `None` while one
    /// waits.
    pub(crate) fn idle_since(&self) -> Option<Instant> {
        self.waiting().1
    }

    /// Resolves when the backend went from idle to waiting or back.
    pub(crate) async fn changed(&self) {
        self.changed.notified().await;
    }

    /// This backend is releasing `hash`: its line (if any) no longer holds it.
    pub(crate) fn releasing(&self, hash: &str) {
        if let Some(line) = self.map().get(hash).cloned() {
            line.held_here.store(false, Ordering::Release);
            if self.others_listening.load(Ordering::Acquire) > 0 {
                line.yield_next_wake.store(true, Ordering::Release);
            }
        }
    }

    /// A release by this backend was heard by `others` other processes.
    pub(crate) fn heard_release(&self, others: u64) {
        self.others_listening.store(others, Ordering::Release);
    }

    pub(crate) fn others_listening(&self) -> u64 {
        self.others_listening.load(Ordering::Acquire)
    }

    /// A release of `hash` was announced: wakes the first waiter of its line, if there is one.
    pub(crate) fn wake(&self, hash: &str) -> bool {
        let line = self.map().get(hash).cloned();
        line.map(|l| {
            l.announced();
            l.wake.notify_one()
        })
        .is_some()
    }

    /// Wakes the first waiter of the line of `hash` to check once more, without a release
    /// announced (a new subscription to the key).
    pub(crate) fn check_again(&self, hash: &str) {
        if let Some(line) = self.map().get(hash).cloned() {
            line.wake.notify_one();
        }
    }

    /// Wakes the first waiter of every line.
    pub(crate) fn wake_all(&self) {
        let lines: Vec<_> = self.map().values().cloned().collect();
        for line in lines {
            line.wake.notify_one();
        }
    }

    /// Whether the key of `hash` has a line (an acquire in progress).
    pub(crate) fn contains(&self, hash: &str) -> bool {
        self.map().contains_key(hash)
    }

    /// Waiters of this backend, over all lines.
    pub(crate) fn waiters(&self) -> usize {
        self.map().values().map(|l| l.queue().len()).sum()
    }

    pub(crate) fn len(&self) -> usize {
        self.map().len()
    }
}

/// How long other processes get to answer this backend's own release of a key first, from
/// the moment its own notification arrives (they hear the same PUBLISH): about what waking
/// a sleeping process and sending one command takes on a busy 2-core machine (decision
/// 0010). `DOKEBI_LOCK_REDIS_HEAD_START_US` sets it for experiments; 0 turns it off.
fn head_start() -> std::time::Duration {
    crate::switches::head_start()
}

/// The step of the staggered head start (decision 0070): a first waiter woken by a release
/// waits this much for every other listening process that, by the count of releases it
/// heard since it last held the key, may not have had its turn yet.
/// `DOKEBI_LOCK_REDIS_STAGGER_US` sets it for experiments; 0 returns to decision 0010's
/// head start for the releasing process alone.
fn stagger_step() -> std::time::Duration {
    crate::switches::stagger_step()
}

/// Acquisitions over which a line takes the most other turns it saw as its count.
const TURNS_WINDOW: u32 = 8;

/// Other processes counted at most, so that one key's hand-offs are not slowed by a large
/// fleet listening on the namespace for other keys.
const STAGGER_MAX_OTHERS: u64 = 16;

impl Line {
    /// A release of the key was announced.
    fn announced(&self) {
        let _ = self
            .heard_since_acquired
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some(n.saturating_add(1)));
        self.notified.store(true, Ordering::Release);
    }

    pub(crate) fn mark_held_here(&self) {
        self.held_here.store(true, Ordering::Release);
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

    pub(crate) fn held_here(&self) -> bool {
        self.held_here.load(Ordering::Acquire)
    }

    /// The head start to give other processes before trying, once, after a release woke
    /// the first waiter: decision 0010's for this backend's own release, or with a stagger
    /// step (decision 0070) one step per other process that may be owed a turn before us.
    pub(crate) fn head_start(&self, others: u64) -> Option<std::time::Duration> {
        let own = self.yield_next_wake.swap(false, Ordering::AcqRel);
        let notified = self.notified.swap(false, Ordering::AcqRel);
        let step = stagger_step();
        if !step.is_zero() {
            if !notified || others == 0 {
                return None;
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
                return Some(step * owed);
            }
            // Our own release, nobody known to be owed a turn: decision 0010's head start.
        }
        let head_start = head_start();
        (own && !head_start.is_zero()).then_some(head_start)
    }

    pub(crate) fn forget_head_start(&self) {
        self.yield_next_wake.store(false, Ordering::Release);
        self.notified.store(false, Ordering::Release);
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<(u64, Arc<Notify>)>> {
        crate::sync::lock(&self.queue)
    }
}

impl Place {
    /// Resolves once this waiter is first in its line.
    pub(crate) async fn turn(&self) {
        self.turn.notified().await;
    }

    /// This acquire really waits: it queued behind another, or Redis said busy. Until the
    /// last such acquire leaves, the backend is not idle (the subscription stays).
    pub(crate) fn mark_waiting(&self) {
        if !self.waiting.swap(true, Ordering::AcqRel) {
            self.lines.start_waiting();
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if *self.waiting.get_mut() {
            self.lines.stop_waiting();
        }
        let mut map = self.lines.map();
        let mut queue = self.line.queue();
        let Some(pos) = queue.iter().position(|(t, _)| *t == self.ticket) else { return };
        queue.remove(pos);
        if pos == 0 {
            if let Some((_, next)) = queue.front() {
                next.notify_one();
            }
        }
        if queue.is_empty() {
            drop(queue);
            map.remove(&self.hash);
        }
    }
}

/// Counts the acquires in progress on a backend (`maxWaiters`).
#[derive(Default)]
pub(crate) struct InProgress(Arc<AtomicUsize>);

/// One acquire in progress; dropping it frees the slot.
pub(crate) struct InProgressGuard(Arc<AtomicUsize>);

impl InProgress {
    pub(crate) fn enter(&self, max: usize) -> Result<InProgressGuard, LockError> {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
            .map(|_| InProgressGuard(self.0.clone()))
            .map_err(|_| {
                LockError::new(
                    LockErrorCode::QueueFull,
                    format!("maxWaiters ({max}) acquires are already in progress"),
                )
            })
    }

    pub(crate) fn count(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

impl Drop for InProgressGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::time::timeout;

    async fn is_first(place: &Place) -> bool {
        timeout(Duration::from_millis(20), place.turn()).await.is_ok()
    }

    #[tokio::test]
    async fn waiters_take_turns_in_arrival_order() {
        let lines = Arc::new(Lines::default());
        let a = lines.join(&"k".into(), false).unwrap();
        let b = lines.join(&"k".into(), false).unwrap();
        let c = lines.join(&"k".into(), false).unwrap();
        assert!(is_first(&a).await);
        assert!(!is_first(&b).await);
        drop(a);
        assert!(is_first(&b).await);
        assert!(!is_first(&c).await);
        drop(b);
        assert!(is_first(&c).await);
    }

    #[tokio::test]
    async fn leaving_from_the_middle_keeps_the_line_intact() {
        let lines = Arc::new(Lines::default());
        let a = lines.join(&"k".into(), false).unwrap();
        let b = lines.join(&"k".into(), false).unwrap();
        let c = lines.join(&"k".into(), false).unwrap();
        drop(b);
        assert!(!is_first(&c).await, "c must not jump ahead of a");
        drop(a);
        assert!(is_first(&c).await);
        drop(c);
        assert_eq!(lines.len(), 0, "an empty line is forgotten");
    }

    #[tokio::test]
    async fn zero_wait_never_jumps_a_line_and_keys_have_their_own_lines() {
        let lines = Arc::new(Lines::default());
        let _a = lines.join(&"k".into(), false).unwrap();
        assert_eq!(
            lines.join(&"k".into(), true).err().map(|e| e.code),
            Some(LockErrorCode::LockBusy)
        );
        let other = lines.join(&"other".into(), true).unwrap();
        assert!(is_first(&other).await);
        assert_eq!(lines.waiters(), 2);
    }

    /// A line that acquired, then heard `releases` announced (its own first).
    fn line_after(releases: u32) -> Line {
        let line = Line::default();
        line.mark_held_here();
        for _ in 0..releases {
            line.announced();
        }
        line
    }

    /// The head start of a first waiter woken by the last release `line` heard.
    fn woken(line: &Line, others: u64) -> Option<Duration> {
        line.head_start(others)
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
        let fresh = Line::default();
        fresh.announced();
        assert_eq!(woken(&fresh, 15), None, "a waiter new to the key is owed, not owing");
        assert_eq!(woken(&line_after(1), 0), None, "nobody else listens");
        let line = line_after(1);
        assert!(woken(&line, 3).is_some());
        assert_eq!(line.head_start(3), None, "woken again, by a new subscription, not a release");
    }

    /// `line` hears `turns` releases of other processes, then acquires.
    fn acquires_after(line: &Line, turns: u32) {
        for _ in 0..turns {
            line.announced();
        }
        line.mark_held_here();
    }

    /// `line` hears its own release: the head start of its next first waiter.
    fn own_release(line: &Line, others: u64) -> Option<Duration> {
        line.announced();
        line.head_start(others)
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
        assert_eq!(line.head_start(8), None);
        // More come back: counted at once.
        acquires_after(&line, 5);
        assert_eq!(own_release(&line, 8), Some(step * 5));
    }

    #[test]
    fn in_progress_is_bounded() {
        let p = InProgress::default();
        let g1 = p.enter(2).unwrap();
        let _g2 = p.enter(2).unwrap();
        assert_eq!(p.enter(2).err().map(|e| e.code), Some(LockErrorCode::QueueFull));
        drop(g1);
        assert!(p.enter(2).is_ok());
    }
}
