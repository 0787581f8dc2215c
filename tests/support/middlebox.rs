//! A TCP relay in front of a redis-server that drops flows the way a NAT, a cloud load
//! balancer or a partition does after its idle timeout: without a word (no FIN, no RST: the
//! flow just stops carrying anything, both ways), or by answering the next packet from the
//! client with a RST. Flows opened after the cut pass, as a new NAT mapping would.
//!
//! It runs on its own thread and runtime, so a test's runtime being busy or paused does not
//! change what the wire does.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How a cut flow ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Drop {
    /// Nothing more passes either way, and neither side hears of it.
    Silently,
    /// The client's next bytes are answered with a RST (the upstream side is closed).
    WithResetOnNextPacket,
}

/// Which open flows a cut takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flows {
    All,
    /// Those whose client sent a SUBSCRIBE or SSUBSCRIBE (a subscription's connection).
    Subscribers,
}

#[derive(Default)]
struct Shared {
    next_id: AtomicU64,
    open: Mutex<HashSet<u64>>,
    subscribers: Mutex<HashSet<u64>>,
    cut: Mutex<Vec<(u64, Drop)>>,
    /// PINGs the clients sent on flows already cut.
    pings_into_cut: AtomicU64,
    accepted: AtomicU64,
}

impl Shared {
    fn cut_as(&self, id: u64) -> Option<Drop> {
        self.cut.lock().unwrap().iter().find(|(i, _)| *i == id).map(|(_, how)| *how)
    }
}

pub(crate) struct Middlebox {
    port: u16,
    shared: Arc<Shared>,
}

impl Middlebox {
    /// Relays its own port to the server on `127.0.0.1:<upstream>`.
    pub(crate) fn start(upstream: u16) -> Self {
        let upstream = format!("127.0.0.1:{upstream}");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared::default());
        let state = shared.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let listener = TcpListener::from_std(listener).unwrap();
                loop {
                    let Ok((client, _)) = listener.accept().await else { continue };
                    state.accepted.fetch_add(1, Ordering::Relaxed);
                    let (state, upstream) = (state.clone(), upstream.clone());
                    tokio::spawn(async move {
                        if let Ok(server) = TcpStream::connect(&upstream).await {
                            relay(state, client, server).await;
                        }
                    });
                }
            });
        });
        Self { port, shared }
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// `url` with its host and port replaced by the middlebox's.
    pub(crate) fn url_for(&self, url: &str) -> String {
        let (scheme, rest) = url.split_once("://").unwrap();
        let (auth, rest) = match rest.rsplit_once('@') {
            Some((auth, rest)) => (format!("{auth}@"), rest),
            None => (String::new(), rest),
        };
        let path = rest.find('/').map_or("", |i| &rest[i..]);
        format!("{scheme}://{auth}127.0.0.1:{}{path}", self.port)
    }

    /// Cuts the flows open now; later ones pass.
    pub(crate) fn cut(&self, flows: Flows, how: Drop) -> usize {
        let open: Vec<u64> = self.shared.open.lock().unwrap().iter().copied().collect();
        let subscribers = self.shared.subscribers.lock().unwrap().clone();
        let mut cut = self.shared.cut.lock().unwrap();
        let mut n = 0;
        for id in open {
            if flows == Flows::All || subscribers.contains(&id) {
                cut.push((id, how));
                n += 1;
            }
        }
        n
    }

    /// PINGs sent into flows already cut: a client asking whether its connection lives.
    pub(crate) fn pings_into_cut(&self) -> u64 {
        self.shared.pings_into_cut.load(Ordering::Relaxed)
    }

    /// Connections accepted so far.
    pub(crate) fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }

    /// Open flows that carry a subscription and are not cut.
    pub(crate) fn live_subscribers(&self) -> usize {
        let cut: HashSet<u64> = self.shared.cut.lock().unwrap().iter().map(|(id, _)| *id).collect();
        let open = self.shared.open.lock().unwrap();
        let subscribers = self.shared.subscribers.lock().unwrap();
        subscribers.iter().filter(|id| open.contains(id) && !cut.contains(id)).count()
    }
}

async fn relay(shared: Arc<Shared>, mut client: TcpStream, mut server: TcpStream) {
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    shared.open.lock().unwrap().insert(id);
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut up, mut down) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        tokio::select! {
            read = client.read(&mut up) => {
                let n = match read { Ok(0) | Err(_) => break, Ok(n) => n };
                let chunk = &up[..n];
                match shared.cut_as(id) {
                    None => {
                        if contains(chunk, b"SUBSCRIBE") {
                            shared.subscribers.lock().unwrap().insert(id);
                        }
                        if server.write_all(chunk).await.is_err() {
                            break;
                        }
                    }
                    Some(how) => {
                        if contains(chunk, b"PING") {
                            shared.pings_into_cut.fetch_add(1, Ordering::Relaxed);
                        }
                        if how == Drop::WithResetOnNextPacket {
                            // The client gets a RST, as from a load balancer that forgot
                            // the flow.
                            // Linger 0 closes at once (the deprecation is about a linger > 0
                            // blocking the thread on drop).
                            #[allow(deprecated)]
                            let _ = client.set_linger(Some(std::time::Duration::ZERO));
                            break;
                        }
                    }
                }
            }
            read = server.read(&mut down) => {
                let n = match read { Ok(0) | Err(_) => break, Ok(n) => n };
                if shared.cut_as(id).is_none() && client.write_all(&down[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    shared.open.lock().unwrap().remove(&id);
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w.eq_ignore_ascii_case(needle))
}
