//! Hands the JS thread's acquires and releases to the runtime in batches: one long-lived
//! task polls them all, instead of one tokio task spawned per call.
//!
//! A spawn from the JS thread registers the task with the runtime (a lock), pushes it on
//! the runtime's shared queue (another) and may wake the worker (a syscall), and the worker
//! then schedules it like any task. Here the JS thread pushes the call on a queue, and
//! wakes the dispatcher only when the queue stops being empty; the dispatcher moves what
//! it finds into a `FuturesUnordered` and polls the calls there, where a reply wakes only
//! its own call (issue 37, docs/decisions/0179).
//!
//! Only with one worker thread (the default): the dispatcher is one task, so with more
//! workers it would run every call on one of them, and calls are spawned as before.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, LazyLock, Mutex};
use std::task::{Context, Poll};

use futures::stream::{FuturesUnordered, StreamExt};
use futures::task::AtomicWaker;
use futures::FutureExt;

type Call = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What the JS threads share with the dispatcher task.
struct Queue {
    calls: Mutex<Vec<Call>>,
    /// The dispatcher, woken when `calls` stops being empty.
    waker: AtomicWaker,
}

static QUEUE: LazyLock<Arc<Queue>> =
    LazyLock::new(|| Arc::new(Queue { calls: Mutex::new(Vec::new()), waker: AtomicWaker::new() }));

/// Started on first use; it runs as long as the runtime (the process).
static STARTED: std::sync::Once = std::sync::Once::new();

/// Runs `call` on `runtime`: through the dispatcher with one worker thread, else as a
/// task of its own.
pub fn run(call: impl Future<Output = ()> + Send + 'static, runtime: &tokio::runtime::Handle) {
    static SPAWN_EACH: LazyLock<bool> = LazyLock::new(|| crate::switches::worker_threads() != 1);
    if *SPAWN_EACH {
        runtime.spawn(call);
        return;
    }
    STARTED.call_once(|| {
        runtime.spawn(Dispatcher { queue: QUEUE.clone(), running: FuturesUnordered::new() });
    });
    // A call's own panic is caught where its promise is settled (settle.rs); this one
    // guards the dispatcher itself, which every later call needs.
    let call: Call = Box::pin(AssertUnwindSafe(call).catch_unwind().map(|_| ()));
    let first = {
        let mut calls = crate::sync::lock(&QUEUE.calls);
        calls.push(call);
        calls.len() == 1
    };
    if first {
        QUEUE.waker.wake();
    }
}

/// The most calls the dispatcher takes in, and the most it sees finish, in one turn.
const TURN: usize = 256;

/// The one task that polls every call handed to [`run`]. It never ends.
struct Dispatcher {
    queue: Arc<Queue>,
    running: FuturesUnordered<Call>,
}

impl Future for Dispatcher {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        // Registered before the queue is read: a call pushed after the read wakes us.
        this.queue.waker.register(cx.waker());
        let more_queued = {
            let mut calls = crate::sync::lock(&this.queue.calls);
            let taken = calls.len().min(TURN);
            this.running.extend(calls.drain(..taken));
            !calls.is_empty()
        };
        // Pending when no call is ready, or when FuturesUnordered yields after a long turn
        // (it then wakes us itself).
        let mut finished = 0;
        while let Poll::Ready(Some(())) = this.running.poll_next_unpin(cx) {
            finished += 1;
            if finished == TURN {
                break;
            }
        }
        if more_queued || finished == TURN {
            // A burst of calls (thousands at once) is taken in turns, so the keep-alive
            // renewals and timers of the same thread are not held up behind all of it.
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}
