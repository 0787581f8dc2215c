//! The wait line: per key, the waiters of this backend queue up and only the first asks
//! Redis, so a crowd of waiters costs Redis one attempt at a time.

mod turns;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Notify;

use crate::error::{LockError, LockErrorCode};
use turns::{Remembered, Turns};

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
    /// What lines learned about their keys, kept a while after they emptied (locked only
    /// inside `lines`: lock order `lines`, then `learned`).
    learned: Mutex<Remembered>,
    /// Staggered head-start steps given (decision 0070): what fairness cost this backend's
    /// hand-offs, for tests and experiments.
    steps_given: AtomicU64,
    /// Head starts given, of either kind.
    head_starts_given: AtomicU64,
}

impl Default for Lines {
    fn default() -> Self {
        Self {
            lines: Mutex::default(),
            next_ticket: AtomicU64::default(),
            waiting: Mutex::new((0, Some(Instant::now()))),
            changed: Notify::new(),
            others_listening: AtomicU64::new(0),
            learned: Mutex::default(),
            steps_given: AtomicU64::new(0),
            head_starts_given: AtomicU64::new(0),
        }
    }
}

/// One key's line.
#[derive(Default)]
pub(crate) struct Line {
    queue: Mutex<VecDeque<(u64, Arc<Notify>)>>,
    /// Wakes the first waiter early: a release notification, or a new subscription.
    pub wake: Notify,
    /// The previous first waiter acquired the key: the next one need not ask Redis until a
    /// release is announced.
    held_here: AtomicBool,
    /// Taking turns with other processes.
    turns: Turns,
}

impl Line {
    pub(crate) fn mark_held_here(&self) {
        self.held_here.store(true, Ordering::Release);
        self.turns.acquired();
    }

    pub(crate) fn held_here(&self) -> bool {
        self.held_here.load(Ordering::Acquire)
    }

    /// A head start owed to a release whose notification never came is void: it must not
    /// delay a later, unrelated wake.
    pub(crate) fn forget_head_start(&self) {
        self.turns.forget();
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<(u64, Arc<Notify>)>> {
        crate::sync::lock(&self.queue)
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
        let line = map
            .entry(hash.clone())
            .or_insert_with(|| {
                let learned = self.remembered().take(hash, Instant::now());
                let turns = learned.map_or_else(Turns::default, Turns::with_learned);
                Arc::new(Line { turns, ..Line::default() })
            })
            .clone();
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

    fn remembered(&self) -> std::sync::MutexGuard<'_, Remembered> {
        crate::sync::lock(&self.learned)
    }

    /// The head start a first waiter woken by a release gives before it tries (see
    /// [`Line::head_start`]), counted in [`steps_given`](Self::steps_given).
    pub(crate) fn head_start(&self, line: &Line) -> Option<std::time::Duration> {
        let (head_start, steps) = line.turns.head_start(self.others_listening());
        if steps > 0 {
            self.steps_given.fetch_add(steps.into(), Ordering::Relaxed);
        }
        if head_start.is_some() {
            self.head_starts_given.fetch_add(1, Ordering::Relaxed);
        }
        head_start
    }

    /// Staggered head-start steps given since the backend started (decision 0070).
    pub(crate) fn steps_given(&self) -> u64 {
        self.steps_given.load(Ordering::Relaxed)
    }

    /// Head starts given since the backend started, of either kind (decisions 0010, 0070).
    pub(crate) fn head_starts_given(&self) -> u64 {
        self.head_starts_given.load(Ordering::Relaxed)
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
                line.turns.yield_next_wake();
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
            l.turns.announced();
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
            if let Some(learned) = self.line.turns.learned() {
                self.lines.remembered().keep(self.hash.clone(), learned, Instant::now());
            }
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

    use turns::TURNS_WINDOW;

    /// Acquisitions of `lines`' line of `hash` by waiters that take turns inside this
    /// process, nobody else coming, until the line has learned it; the line then empties.
    fn learn_nobody_else_comes(lines: &Arc<Lines>, hash: &Arc<str>) {
        let place = lines.join(hash, false).unwrap();
        for _ in 0..=TURNS_WINDOW {
            place.line.mark_held_here();
            place.line.turns.announced(); // our own release, heard by the next waiter of ours
        }
        assert_eq!(lines.head_start(&place.line), None, "learned: nobody is owed a turn");
        drop(place);
        assert_eq!(lines.len(), 0);
    }

    #[test]
    fn a_line_that_empties_for_a_moment_keeps_what_it_learned() {
        let lines = Arc::new(Lines::default());
        lines.heard_release(5); // five other processes listen on the namespace
        let hash: Arc<str> = "k".into();
        learn_nobody_else_comes(&lines, &hash);
        // The next waiter of ours joins a new line, acquires, and hands over to another.
        let place = lines.join(&hash, false).unwrap();
        place.line.mark_held_here();
        place.line.turns.announced();
        assert_eq!(lines.head_start(&place.line), None, "nobody else comes: no head start");
        assert_eq!(lines.steps_given(), 0);
    }

    #[test]
    fn a_new_line_counts_every_listener_until_it_learns() {
        let lines = Arc::new(Lines::default());
        lines.heard_release(5);
        let place = lines.join(&"k".into(), false).unwrap();
        place.line.mark_held_here();
        place.line.turns.announced();
        assert_eq!(lines.head_start(&place.line), Some(turns::stagger_step() * 5));
        assert_eq!(lines.steps_given(), 5);
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
