//! One acquire attempt's life: the script runs on a connection the waiter already holds, so
//! nothing is sent for a caller that left while connecting, and a reply that arrives after
//! the caller gave up is still seen and cleaned up (decisions 0004, 0005). The waiter runs
//! the attempt inline while it awaits the reply ([`Inline`]); from the moment it stops
//! awaiting (shutdown, its signal, a dropped acquire) or has its answer, what is left of
//! the attempt (a late reply's chase) goes on as a tracked task of its own.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use futures::FutureExt;
use smallvec::smallvec;
use tokio::sync::oneshot;
use tokio_util::task::task_tracker::TaskTrackerToken;
use tokio_util::task::TaskTracker;

use super::Driver;
use crate::clock::{self, Instant};
use crate::connection::{Conn, ScriptCall};
use crate::error::{LockError, LockErrorCode, Outcome, RedisFailure};
use crate::keys::KeyNames;
use crate::lease::{key_expiry, new_token, Lease};
use crate::replicas::Claim;
use crate::scripts::{self, AcquireReply};

/// What one acquire attempt came to.
pub(crate) enum Attempt {
    Acquired(Arc<Lease>),
    Busy(Option<i64>),
    Failed(RedisFailure),
}

/// Whether a reply to an acquire may mean it took the key: anything but a plain "busy"
/// or a refusal before the script ran (an error after a stall, a cut or unparseable reply).
fn may_have_won(reply: &Result<redis::Value, RedisFailure>) -> bool {
    match reply {
        Ok(value) => !matches!(scripts::parse_acquire(value), Some(AcquireReply::Busy(_))),
        Err(failure) => !failure.surely_not_applied(),
    }
}

impl Driver {
    /// One acquire script on `conn`, to be run inline by the waiter that awaits its answer
    /// on the receiver. If the waiter left before it got to send it, nothing is sent.
    pub(crate) fn attempt(
        &self,
        conn: Conn,
        keys: Arc<KeyNames>,
    ) -> (Inline, oneshot::Receiver<Attempt>) {
        let (tx, rx) = oneshot::channel();
        let this = self.clone();
        // Boxed by Inline: moved into a task of its own when the waiter stops awaiting it,
        // and large (the script, its timeout and the chase of a late reply).
        let attempt = Inline::new(&self.inner.tasks, async move {
            if tx.is_closed() {
                return; // aborted, timed out or shut down before submission: never submitted
            }
            let link = &this.inner.link;
            let lease_ms = this.inner.options.lease_ms;
            let token = new_token();
            let submitted = clock::now();
            // In a block of its own: the call borrows the key names and the token, which
            // the cleanup below takes over.
            let reply = {
                let call = ScriptCall {
                    script: scripts::acquire(),
                    keys: smallvec![&*keys.lock, &*keys.fence],
                    args: this.inner.acquire_args.with_token(&token),
                };
                let eval = link.eval(&conn, &call);
                tokio::pin!(eval);
                tokio::select! {
                    reply = &mut eval => reply,
                    _ = tokio::time::sleep(link.command_timeout) => {
                        link.stalled(&conn, &keys.lock);
                        let _ = tx.send(Attempt::Failed(RedisFailure::command_timeout()));
                        // We stop waiting now: a key it set lives until now + leaseMs, if the
                        // command ran by now (decision 0005 on a reply that never comes).
                        let gone_by = key_expiry(clock::now(), lease_ms);
                        return this.chase_late_reply(eval, &conn, &keys, &token, gone_by).await;
                    }
                }
            };
            let answered = clock::now();
            let attempt = match reply {
                Ok(value) => match scripts::parse_acquire(&value) {
                    Some(AcquireReply::Acquired(fence)) => {
                        let lease = Lease::new(
                            keys.clone(),
                            token.clone(),
                            fence,
                            lease_ms,
                            submitted,
                            answered,
                        );
                        lease.wrote_in(conn.epoch());
                        this.won(&conn, lease).await
                    }
                    Some(AcquireReply::Busy(pttl)) => Attempt::Busy(pttl),
                    None => Attempt::Failed(RedisFailure::unexpected_reply()),
                },
                Err(failure) => Attempt::Failed(failure),
            };
            // An unknown outcome may have left our token in Redis: take it back by token
            // once Redis answers, so it does not block the key for a whole lease.
            let unknown = matches!(&attempt, Attempt::Failed(f) if f.outcome == Outcome::Unknown);
            let unclaimed = tx.send(attempt).err();
            if unknown || matches!(unclaimed, Some(Attempt::Acquired(_))) {
                this.spawn_cleanup(keys, token, key_expiry(answered, lease_ms));
            }
        });
        (attempt, rx)
    }

    /// The acquire's reply on `conn` was parsed as a win. It is handed out only once
    /// minReplicas replicas acknowledged it (and its fence) on this same connection; too few,
    /// and the win is taken back by token here, since the caller sees only a failure
    /// (decision 0026). A lease that is not handed over for other reasons is cleaned up by
    /// the caller.
    async fn won(&self, conn: &Conn, lease: Lease) -> Attempt {
        let claim = Claim::of(&lease.keys, &lease.token);
        match self.inner.replicas.confirm(&self.inner.link, conn, claim).await {
            Ok(()) => Attempt::Acquired(Arc::new(lease)),
            Err(failure) => {
                self.spawn_cleanup(lease.keys.clone(), lease.token.clone(), lease.latest_expiry());
                Attempt::Failed(failure)
            }
        }
    }

    /// After giving up on an attempt in flight: closing the channel makes the attempt task
    /// see the waiter gone (before submission it sends nothing; after, it cleans up any
    /// lease still to come); a lease that had already arrived is cleaned up here, so none
    /// is dropped on the floor.
    pub(crate) fn salvage(&self, mut reply: oneshot::Receiver<Attempt>) {
        reply.close();
        if let Ok(Attempt::Acquired(lease)) = reply.try_recv() {
            self.spawn_cleanup(lease.keys.clone(), lease.token.clone(), lease.latest_expiry());
        }
    }

    /// After an acquire timed out: its reply may still come on the stalled connection, or
    /// never (a reply dropped on the way). Until `gone_by`, release the token on a fresh
    /// connection now and then; a release that deleted our token ends it (the acquire ran
    /// already). Past `gone_by` a key it set before the timeout has expired, but a Redis
    /// stalled that long (a slow script, a long fork) runs the acquire when it wakes: only
    /// its reply tells, so it is awaited for as long as the connection lives (decision
    /// 0167), and released by token if it may be a win. A flow a middlebox dropped without
    /// a word looks alive forever; it is told apart by [`RedisLink::carries_nothing`], and
    /// then nothing sent on it will ever run: the chase ends.
    async fn chase_late_reply(
        &self,
        mut eval: Pin<&mut impl Future<Output = Result<redis::Value, RedisFailure>>>,
        conn: &Conn,
        keys: &Arc<KeyNames>,
        token: &str,
        gone_by: Instant,
    ) {
        let mut backoff = self.backoff();
        loop {
            tokio::select! {
                reply = &mut eval => return self.late_reply(reply, keys, token).await,
                _ = tokio::time::sleep(backoff.next()) => {}
            }
            if clock::now() >= gone_by {
                break;
            }
            if let Ok(true) = self.release_token(keys, token).await {
                return;
            }
        }
        let Some(_awaited) = Awaited::enter(&self.inner.late_replies) else {
            // Shutdown must not call this cleanup confirmed; before shutdown nobody waits
            // on it, and the key, if the acquire runs at all, expires by itself.
            self.note_cleanup_failure(LockError::new(
                LockErrorCode::CleanupFailed,
                "too many acquire replies were overdue to wait for one more; its key, if Redis runs it late, expires by itself",
            ));
            return;
        };
        let link = &self.inner.link;
        loop {
            tokio::select! {
                reply = &mut eval => return self.late_reply(reply, keys, token).await,
                _ = tokio::time::sleep(link.command_timeout) => {}
            }
            if link.carries_nothing(conn).await {
                return;
            }
        }
    }

    /// A late acquire reply came: a win, or what may hide one, is released by token.
    async fn late_reply(
        &self,
        reply: Result<redis::Value, RedisFailure>,
        keys: &KeyNames,
        token: &str,
    ) {
        if may_have_won(&reply) {
            // The script ran before its reply came: its key is gone leaseMs after now.
            let gone_by = key_expiry(clock::now(), self.inner.options.lease_ms);
            if let Err(err) = self.clean_up(keys, token, gone_by).await {
                self.note_cleanup_failure(err);
            }
        }
    }

    #[doc(hidden)] // for the crate's tests, not API
    /// Acquire replies awaited now past the moment their key would have expired.
    pub fn overdue_acquire_replies(&self) -> usize {
        self.inner.late_replies.load(Ordering::Relaxed)
    }
}

/// An attempt run inline by its waiter, which saves a task and a wake-up per acquire
/// (benchmarks/results/2026-12-06-where-it-goes.md). Dropped before it finished, it goes on
/// as a tracked task on the runtime it was made on, so a reply the waiter no longer awaits
/// is still seen and cleaned up. Until it finishes it counts as one of the driver's tasks
/// (a tracker token), so a shutdown that begins while it runs inline waits for it as for a
/// task: the token is let go only after the task that carries it on was spawned. A panic in
/// it ends it; its sender is dropped, which the waiter reads as an internal error.
pub(crate) struct Inline {
    attempt: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    tasks: TaskTracker,
    counted: Option<TaskTrackerToken>,
    runtime: tokio::runtime::Handle,
}

impl Inline {
    fn new(tasks: &TaskTracker, attempt: impl Future<Output = ()> + Send + 'static) -> Self {
        // One allocation, the panic guard inside it.
        let attempt = Box::pin(AssertUnwindSafe(attempt).catch_unwind().map(|_| ()));
        let runtime = tokio::runtime::Handle::current();
        let counted = Some(tasks.token());
        Self { attempt: Some(attempt), tasks: tasks.clone(), counted, runtime }
    }

    /// Whether the attempt ran to its end.
    pub(crate) fn is_done(&self) -> bool {
        self.attempt.is_none()
    }
}

impl Future for Inline {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(attempt) = self.attempt.as_mut() else { return Poll::Ready(()) };
        ready!(attempt.as_mut().poll(cx));
        self.attempt = None;
        self.counted = None;
        Poll::Ready(())
    }
}

impl Drop for Inline {
    fn drop(&mut self) {
        if let Some(attempt) = self.attempt.take() {
            // On a runtime that is shutting down the task is dropped unrun, as a task
            // spawned before the shutdown would be.
            self.tasks.spawn_on(attempt, &self.runtime);
        }
        // Only now: the spawned task counts from here on.
        self.counted = None;
    }
}

/// At most this many overdue acquire replies are awaited per backend. Each costs a task
/// and a pending reply, a few hundred bytes; a stall makes at most the acquires in flight
/// on the stalled connection overdue (it is dropped for new commands at once), but a
/// Cluster keeps sending to a stalled node's slots, one overdue reply per timed-out
/// attempt. Past the bound a chase gives up as it did before decision 0167.
const MAX_OVERDUE_REPLIES: usize = 4096;

/// One overdue acquire reply counted while it is awaited.
struct Awaited<'a>(&'a AtomicUsize);

impl<'a> Awaited<'a> {
    fn enter(count: &'a AtomicUsize) -> Option<Self> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_OVERDUE_REPLIES).then_some(n + 1)
            })
            .ok()
            .map(|_| Self(count))
    }
}

impl Drop for Awaited<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::RedisErrorCode;

    #[test]
    fn only_a_plain_busy_or_a_refusal_is_surely_not_a_win() {
        let busy = redis::Value::Int(1200);
        assert!(!may_have_won(&Ok(busy)));
        assert!(may_have_won(&Ok(redis::Value::BulkString(b"17".to_vec()))));
        assert!(
            may_have_won(&Ok(redis::Value::SimpleString("what".into()))),
            "an unparseable reply may be a win"
        );
        let lost = RedisFailure::new(RedisErrorCode::ConnectionLost, Outcome::Unknown, "lost");
        assert!(may_have_won(&Err(lost)), "a connection reset after a stall may hide a win");
        let rejected = RedisFailure::new(RedisErrorCode::CommandRejected, Outcome::Rejected, "no");
        assert!(!may_have_won(&Err(rejected)));
    }
}
