//! A standalone node's command connection of the driver's own (decision 0180): a caller
//! writes its packed command to the socket itself, at once, and queues where the reply
//! goes; one task per connection reads the replies and hands each to its caller in order.
//! With many replies awaited, callers leave their commands to the task instead, which
//! writes them together at the end of the runtime's turn (decision 0189).
//! redis-rs's multiplexed connection sends each command as a message through a channel to
//! its connection's task, with a copied buffer, a channel permit and one more task hand-off
//! on the runtime's thread per command (issue 37). RESP is still parsed by redis-rs
//! (`ValueCodec`).
//!
//! Only a plain TCP connection to the node the URL names takes this lane; TLS, Unix
//! sockets, Sentinel and Cluster keep redis-rs's connections. It speaks RESP2: the end of
//! the connection is seen by its own task, so no RESP3 push is needed to announce it.
//!
//! # Invariants
//! - `Queue::waiting` holds one entry per command whose bytes were written or are in
//!   `Queue::out`, in the order of those bytes: replies complete entries from the front.
//! - Bytes are written only under `Queue`'s mutex, by a caller when nothing is backed up in
//!   `out`, else by the task, so they reach the socket in the order of `waiting`.
//! - While `out` holds bytes, the task is woken for them or waits for the socket to take
//!   more: a caller that adds to them wakes nobody.
//! - Once `Queue::socket` is `None` the connection is over: nothing more is queued, and
//!   every entry has been dropped, so each caller still waiting sees the connection lost
//!   (outcome unknown, decision 0003).
//! - That mutex is the only lock here. It is never held across an await; a reply handed
//!   over under it wakes its caller's task, which takes no lock of this module to be woken.

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::BytesMut;
use futures::task::AtomicWaker;
use redis::{ConnectionInfo, RedisError, RedisResult, Value};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio_util::codec::Decoder;

/// A handle on the connection; the task ends, closing the socket, when the last one drops.
#[derive(Clone)]
pub(crate) struct Lane {
    shared: Arc<Shared>,
    _handles: Arc<Handles>,
}

struct Shared {
    queue: Mutex<Queue>,
    /// The task, woken when bytes are backed up in `out` or the last handle dropped.
    task: AtomicWaker,
    handles_gone: AtomicBool,
}

struct Queue {
    socket: Option<TcpStream>,
    /// Bytes the socket did not take yet, written by the task once it can.
    out: Vec<u8>,
    waiting: VecDeque<Waiting>,
}

enum Waiting {
    One(oneshot::Sender<Value>),
    Many { want: usize, got: Vec<Value>, to: oneshot::Sender<Vec<Value>> },
}

/// Dropped with the last [`Lane`]: tells the task to close the connection.
struct Handles(Arc<Shared>);

impl Drop for Handles {
    fn drop(&mut self) {
        self.0.handles_gone.store(true, Ordering::Release);
        self.0.task.wake();
    }
}

/// Whether a connection to `info` can take the lane: plain TCP.
pub(crate) fn fits(info: &ConnectionInfo) -> bool {
    matches!(info.addr(), redis::ConnectionAddr::Tcp(..))
}

impl Lane {
    /// Connects, says HELLO (authenticating) and selects the database `info` names, then starts
    /// the task. `closed` is set when the connection ends. Bounded by the caller's connect
    /// timeout.
    pub(crate) async fn open(info: &ConnectionInfo, closed: Arc<AtomicBool>) -> RedisResult<Self> {
        let redis::ConnectionAddr::Tcp(host, port) = info.addr() else {
            return Err(RedisError::from((redis::ErrorKind::InvalidClientConfig, "not plain TCP")));
        };
        let socket = TcpStream::connect((host.as_str(), *port)).await?;
        // As redis-rs sets its own sockets (Nagle on, unless the settings say otherwise).
        socket.set_nodelay(info.tcp_settings().nodelay())?;
        let mut replies = Replies::default();
        let settings = info.redis_settings();
        // HELLO, as redis-rs's handshake, but staying on RESP2: "connected" means the server
        // answered (one that accepts TCP and never answers is a connect that times out, with
        // nothing sent, decision 0004), and a server busy with a script or loading its data
        // still answers HELLO, so that state reaches the first script as its own refusal.
        let mut hello = redis::cmd("HELLO");
        hello.arg(2);
        if let Some(password) = settings.password() {
            hello.arg("AUTH").arg(settings.username().unwrap_or("default")).arg(password);
        }
        match replies.handshake(&socket, &hello).await {
            // A server older than HELLO (Redis 5): AUTH alone.
            Err(err) if super::is_no_resp3(&err) => {
                if let Some(password) = settings.password() {
                    let mut auth = redis::cmd("AUTH");
                    if let Some(username) = settings.username() {
                        auth.arg(username);
                    }
                    auth.arg(password);
                    replies.handshake(&socket, &auth).await?;
                }
            }
            other => other?,
        }
        if settings.db() != 0 {
            replies.handshake(&socket, redis::cmd("SELECT").arg(settings.db())).await?;
        }
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                socket: Some(socket),
                out: Vec::new(),
                waiting: VecDeque::new(),
            }),
            task: AtomicWaker::new(),
            handles_gone: AtomicBool::new(false),
        });
        tokio::spawn(replies.run(shared.clone(), closed));
        Ok(Self { _handles: Arc::new(Handles(shared.clone())), shared })
    }

    /// Sends one command and returns its reply (a server error as `Value::ServerError`).
    pub(crate) async fn send(&self, cmd: &redis::Cmd) -> RedisResult<Value> {
        self.send_packed(|out| cmd.write_packed_command(out)).await
    }

    /// [`send`](Self::send) of the one command `pack` writes.
    pub(crate) async fn send_packed(&self, pack: impl FnOnce(&mut Vec<u8>)) -> RedisResult<Value> {
        let (to, reply) = oneshot::channel();
        self.queue(pack, Waiting::One(to))?;
        reply.await.map_err(|_| lost())
    }

    /// Sends `pipe`'s commands in one write and returns their `count` replies.
    pub(crate) async fn send_all(
        &self,
        pipe: &redis::Pipeline,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let (to, replies) = oneshot::channel();
        let waiting = Waiting::Many { want: count, got: Vec::with_capacity(count), to };
        self.queue(|out| out.extend_from_slice(&pipe.get_packed_pipeline()), waiting)?;
        replies.await.map_err(|_| lost())
    }

    fn queue(&self, pack: impl FnOnce(&mut Vec<u8>), waiting: Waiting) -> RedisResult<()> {
        {
            let mut queue = crate::sync::lock(&self.shared.queue);
            let Queue { socket: Some(socket), out, waiting: queued } = &mut *queue else {
                return Err(lost());
            };
            // Behind bytes not written yet, this command waits for the task too.
            let backed_up = !out.is_empty();
            pack(out);
            queued.push_back(waiting);
            if backed_up {
                return Ok(());
            }
            if queued.len() <= WRITE_AT_ONCE_UP_TO && matches!(write(socket, out), Ok(true)) {
                return Ok(());
            }
        }
        // The rest, a write error, or a command left for the end of the turn is the task's.
        self.shared.task.wake();
        Ok(())
    }
}

/// With more replies than this awaited, a caller leaves its command to the task, which writes
/// every command queued in one `send` at the end of the runtime's turn: Redis has that many
/// commands ahead of it, so it does not wait for them. Measured, not derived: a lower bound
/// cost pairs/s at 64 in flight (decision 0189).
const WRITE_AT_ONCE_UP_TO: usize = 32;

/// Writes what `out` holds without waiting; false when the socket takes no more now.
fn write(socket: &TcpStream, out: &mut Vec<u8>) -> io::Result<bool> {
    let mut written = 0;
    let all = loop {
        if written == out.len() {
            break true;
        }
        match socket.try_write(&out[written..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break false,
            Err(e) => return Err(e),
        }
    };
    out.drain(..written);
    Ok(all)
}

/// The connection ended with the command's reply unread: like redis-rs's, an I/O error, so
/// the outcome is unknown.
fn lost() -> RedisError {
    io::Error::new(io::ErrorKind::ConnectionReset, "the connection to Redis ended").into()
}

/// What was read and not parsed yet, the parser's state, and the wait for the end of the
/// runtime's turn before queued commands are written.
#[derive(Default)]
struct Replies {
    read: BytesMut,
    codec: redis::ValueCodec,
    turn_end: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl Replies {
    /// One command of the handshake, before the task starts: its reply, or its refusal.
    async fn handshake(&mut self, socket: &TcpStream, cmd: &redis::Cmd) -> RedisResult<()> {
        let mut out = cmd.get_packed_command();
        while !write(socket, &mut out)? {
            socket.writable().await?;
        }
        loop {
            if let Some(value) = self.codec.decode(&mut self.read)? {
                return value.extract_error().map(drop);
            }
            socket.readable().await?;
            match socket.try_read_buf(&mut self.read) {
                Ok(0) => return Err(lost()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    async fn run(mut self, shared: Arc<Shared>, closed: Arc<AtomicBool>) {
        poll_fn(|cx| self.poll(cx, &shared)).await;
        closed.store(true, Ordering::Release);
        let mut queue = crate::sync::lock(&shared.queue);
        // Closes the socket; every caller still waiting learns the connection was lost.
        queue.socket = None;
        queue.out = Vec::new();
        queue.waiting.clear();
    }

    /// Writes what is backed up and reads what arrived until neither can go on; Ready when
    /// the connection is over (closed by Redis, failed, or no handle left).
    fn poll(&mut self, cx: &mut Context<'_>, shared: &Shared) -> Poll<()> {
        loop {
            // Registered before the queue is looked at, so nothing backed up after is missed.
            shared.task.register(cx.waker());
            if shared.handles_gone.load(Ordering::Acquire) {
                return Poll::Ready(());
            }
            let mut queue = crate::sync::lock(&shared.queue);
            let Queue { socket: Some(socket), out, waiting } = &mut *queue else {
                return Poll::Ready(());
            };
            let mut progress = false;
            // Queued commands wait for the task to run again after a yield: tokio runs it once
            // every task ready now has run and the I/O driver was polled, so what the callers
            // of this turn queue goes out in the same `send`. Replies read meanwhile end the
            // wait sooner (a yielded future is ready at its next poll).
            if !out.is_empty() {
                let turn = self.turn_end.get_or_insert_with(|| Box::pin(tokio::task::yield_now()));
                if turn.as_mut().poll(cx).is_ready() {
                    self.turn_end = None;
                }
            }
            if !out.is_empty() && self.turn_end.is_none() {
                match write(socket, out) {
                    Err(_) => return Poll::Ready(()),
                    Ok(true) => {}
                    Ok(false) => match socket.poll_write_ready(cx) {
                        Poll::Ready(Ok(())) => progress = true,
                        Poll::Ready(Err(_)) => return Poll::Ready(()),
                        Poll::Pending => {}
                    },
                }
            }
            if self.read.capacity() - self.read.len() < 4096 {
                self.read.reserve(16 * 1024);
            }
            match socket.poll_read_ready(cx) {
                Poll::Ready(Ok(())) => match socket.try_read_buf(&mut self.read) {
                    Ok(0) => return Poll::Ready(()),
                    Ok(_) => {
                        if self.hand_over(waiting).is_err() {
                            return Poll::Ready(());
                        }
                        progress = true;
                    }
                    // Readiness was stale and is cleared now: poll again to wait for it.
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => progress = true,
                    Err(_) => return Poll::Ready(()),
                },
                Poll::Ready(Err(_)) => return Poll::Ready(()),
                Poll::Pending => {}
            }
            if !progress {
                return Poll::Pending;
            }
        }
    }

    /// Hands every complete reply read to its caller, in order. A reply nobody waits for, or
    /// one that does not parse, ends the connection: what follows could not be matched.
    fn hand_over(&mut self, waiting: &mut VecDeque<Waiting>) -> Result<(), ()> {
        while let Some(value) = self.codec.decode(&mut self.read).map_err(drop)? {
            match waiting.pop_front().ok_or(())? {
                // A caller that stopped waiting (its timeout) drops the reply.
                Waiting::One(to) => drop(to.send(value)),
                Waiting::Many { want, mut got, to } => {
                    got.push(value);
                    if got.len() == want {
                        drop(to.send(got));
                    } else {
                        waiting.push_front(Waiting::Many { want, got, to });
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replies(bytes: &[u8]) -> Replies {
        Replies { read: BytesMut::from(bytes), ..Replies::default() }
    }

    #[test]
    fn replies_go_to_their_callers_in_order_and_a_pipeline_gets_all_of_its_own() {
        let (one, mut one_reply) = oneshot::channel();
        let (many, mut many_replies) = oneshot::channel();
        let (last, mut last_reply) = oneshot::channel();
        let mut waiting: VecDeque<Waiting> = VecDeque::from([
            Waiting::One(one),
            Waiting::Many { want: 2, got: Vec::new(), to: many },
            Waiting::One(last),
        ]);
        let mut read = replies(b"+OK\r\n:1\r\n-ERR no\r\n:7");
        assert!(read.hand_over(&mut waiting).is_ok());
        assert_eq!(one_reply.try_recv().unwrap(), Value::Okay);
        let many = many_replies.try_recv().unwrap();
        assert_eq!(many[0], Value::Int(1));
        assert!(matches!(many[1], Value::ServerError(_)));
        // Half a reply stays read until the rest comes.
        assert!(last_reply.try_recv().is_err());
        read.read.extend_from_slice(b"\r\n");
        assert!(read.hand_over(&mut waiting).is_ok());
        assert_eq!(last_reply.try_recv().unwrap(), Value::Int(7));
        assert!(waiting.is_empty());
    }

    #[test]
    fn a_reply_nobody_waits_for_or_one_that_does_not_parse_ends_the_connection() {
        assert!(replies(b":1\r\n").hand_over(&mut VecDeque::new()).is_err());
        let (one, _reply) = oneshot::channel();
        let mut waiting = VecDeque::from([Waiting::One(one)]);
        assert!(replies(b"?what\r\n").hand_over(&mut waiting).is_err());
    }

    #[test]
    fn a_caller_that_stopped_waiting_leaves_the_next_reply_to_the_next_caller() {
        let (gone, reply) = oneshot::channel();
        drop(reply);
        let (next, mut next_reply) = oneshot::channel();
        let mut waiting = VecDeque::from([Waiting::One(gone), Waiting::One(next)]);
        assert!(replies(b":1\r\n:2\r\n").hand_over(&mut waiting).is_ok());
        assert_eq!(next_reply.try_recv().unwrap(), Value::Int(2));
    }
}
