//! The floor of this design at 1 in flight, for `benchmarks/pair-floor.mjs` (issue 37): a
//! command's packed bytes written to a plain tokio socket and its reply awaited, through the
//! same crossing every call takes (a promise of the settler, the dispatcher, the stay-awake
//! spin), with no client and no driver code. What a pair costs above it is this crate's
//! own; what it costs above a socket read on the JS thread is the crossing, which the
//! product's design (Redis I/O in Rust on tokio) cannot drop.
//!
//! At many calls in flight the same build measures the driver's own connection (`Lane`,
//! decision 0180) with no driver on it: the acquire and release scripts packed on the
//! runtime's thread and sent on it, with no key hashing, wait line, lease, timer or reply
//! read. `benchmarks/floor-driver.cjs` drives them in the shape of the driver, so
//! `benchmarks/throughput-ab.mjs` can run them against a build. Below both, a call that
//! crosses and is settled with no I/O at all measures the crossing alone (decision 0187).
//!
//! Built only by `npm run build:bench-floor` (feature `bench-floor`, written to
//! target/bench-floor/): never the published addon.

use std::io;
use std::sync::{Arc, Mutex};

use napi::bindgen_prelude::*;
use napi_derive::napi;
use tokio::net::TcpStream;

/// The one connection of the process: the benchmark makes one call at a time.
static SOCKET: Mutex<Option<Arc<TcpStream>>> = Mutex::new(None);

fn socket() -> Result<Arc<TcpStream>> {
    crate::sync::lock(&SOCKET).clone().ok_or_else(|| Error::from_reason("floorConnect() first"))
}

/// Connects the floor's socket to 127.0.0.1:`port`, with TCP_NODELAY as the JS socket's.
#[napi]
pub fn floor_connect(env: &Env, port: u32) -> Result<PromiseRaw<'_, bool>> {
    let port = u16::try_from(port).map_err(|_| Error::from_reason("not a port"))?;
    super::settle::spawn(
        env,
        super::runtime(),
        async move {
            let Ok(socket) = TcpStream::connect(("127.0.0.1", port)).await else {
                return false;
            };
            let _ = socket.set_nodelay(true);
            *crate::sync::lock(&SOCKET) = Some(Arc::new(socket));
            true
        },
        || false,
    )
}

/// Writes `command` (one packed command) and resolves with true once its reply has arrived:
/// bytes ending a RESP line, which a short reply on loopback is, read in one piece.
/// `js_writes`: the JS thread writes the bytes itself and the runtime only reads the
/// reply, one hop instead of two (issue 37's "one thread hop per call").
#[napi]
pub fn floor_round_trip(
    env: &Env,
    command: Buffer,
    js_writes: bool,
) -> Result<PromiseRaw<'_, bool>> {
    let socket = socket()?;
    let mut unwritten: Vec<u8> = command.to_vec();
    if js_writes {
        // What the socket does not take now is written on the runtime, below.
        let written = socket.try_write(&unwritten).unwrap_or(0);
        unwritten.drain(..written);
    }
    super::settle::spawn(
        env,
        super::runtime(),
        async move { round_trip(&socket, &unwritten).await.is_ok() },
        || false,
    )
}

async fn round_trip(socket: &TcpStream, mut unwritten: &[u8]) -> io::Result<()> {
    while !unwritten.is_empty() {
        socket.writable().await?;
        match socket.try_write(unwritten) {
            Ok(n) => unwritten = &unwritten[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    let mut reply = Vec::with_capacity(256);
    loop {
        socket.readable().await?;
        match socket.try_read_buf(&mut reply) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(_) if reply.ends_with(b"\r\n") => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
}

/// Crosses to the runtime's thread and back with no I/O and no work: what the crossing alone
/// (the settler's promise, the dispatcher, the settle) costs per call, below any connection.
#[napi]
pub fn floor_crossing(env: &Env) -> Result<PromiseRaw<'_, bool>> {
    super::settle::spawn(env, super::runtime(), async { true }, || false)
}

/// The driver's own connection of the process and its key prefix, for the lane's floor.
static LANE: Mutex<Option<(crate::connection::Lane, Arc<str>)>> = Mutex::new(None);

/// Opens the driver's own connection to 127.0.0.1:`port`, as a driver would, and loads the
/// acquire and release scripts; keys are named under `namespace` as the driver names them.
#[napi]
pub fn floor_lane_connect(env: &Env, port: u32, namespace: String) -> Result<PromiseRaw<'_, bool>> {
    let url = format!("redis://127.0.0.1:{port}");
    let info = redis::IntoConnectionInfo::into_connection_info(url.as_str())
        .map_err(|_| Error::from_reason("not a port"))?;
    super::settle::spawn(
        env,
        super::runtime(),
        async move {
            let closed = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let Ok(lane) = crate::connection::Lane::open(&info, closed).await else {
                return false;
            };
            for script in [&*crate::scripts::ACQUIRE, &*crate::scripts::RELEASE] {
                let load = redis::cmd("SCRIPT").arg("LOAD").arg(script.source).clone();
                if !answered(lane.send(&load).await) {
                    return false;
                }
            }
            *crate::sync::lock(&LANE) = Some((lane, namespace.into()));
            true
        },
        || false,
    )
}

fn lane() -> Result<(crate::connection::Lane, Arc<str>)> {
    crate::sync::lock(&LANE).clone().ok_or_else(|| Error::from_reason("floorLaneConnect() first"))
}

fn answered(reply: redis::RedisResult<redis::Value>) -> bool {
    matches!(reply, Ok(value) if !matches!(value, redis::Value::ServerError(_)))
}

/// One RESP command of bulk strings into `out`.
fn pack(out: &mut Vec<u8>, args: &[&[u8]]) {
    let mut digits = itoa::Buffer::new();
    out.push(b'*');
    out.extend_from_slice(digits.format(args.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    for arg in args {
        out.push(b'$');
        out.extend_from_slice(digits.format(arg.len()).as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

/// The token of the `serial`th acquire of this process, as long as the driver's. The pid is
/// read once: glibc asks the kernel on every `getpid`, which the driver never does per call
/// (3 % of the runtime's thread in a profile of the floor before).
fn token(serial: u32) -> String {
    static PID: std::sync::LazyLock<u32> = std::sync::LazyLock::new(std::process::id);
    format!("{:x}{serial:026x}", *PID)
}

/// Runs acquire.lua for `key` by EVALSHA on the lane, packed on the runtime's thread as the
/// driver packs it, with the token of `serial`: whether Redis answered without an error.
#[napi]
pub fn floor_lane_acquire(env: &Env, key: String, serial: u32) -> Result<PromiseRaw<'_, bool>> {
    lane_script(env, &crate::scripts::ACQUIRE, "2", move |namespace| {
        let lock = format!("{namespace}:lock:{{{key}}}");
        [lock, format!("{namespace}:lock-fence:{{{key}}}"), token(serial), "30000".into()]
    })
}

/// Runs release.lua for `key` and the token of `serial`, as [`floor_lane_acquire`] runs
/// acquire.lua.
#[napi]
pub fn floor_lane_release(env: &Env, key: String, serial: u32) -> Result<PromiseRaw<'_, bool>> {
    lane_script(env, &crate::scripts::RELEASE, "1", move |namespace| {
        let lock = format!("{namespace}:lock:{{{key}}}");
        [lock, token(serial), format!("{namespace}:lock-released"), key]
    })
}

/// EVALSHA of `script` with `numkeys` and the four keys and arguments `args` makes from the
/// namespace, made and packed on the runtime's thread, sent on the lane.
fn lane_script<'env>(
    env: &'env Env,
    script: &'static crate::scripts::LuaScript,
    numkeys: &'static str,
    args: impl FnOnce(&str) -> [String; 4] + Send + 'static,
) -> Result<PromiseRaw<'env, bool>> {
    let (lane, namespace) = lane()?;
    super::settle::spawn(
        env,
        super::runtime(),
        async move {
            let [a, b, c, d] = args(&namespace);
            let all: [&[u8]; 7] = [
                b"EVALSHA",
                script.sha().as_bytes(),
                numkeys.as_bytes(),
                a.as_bytes(),
                b.as_bytes(),
                c.as_bytes(),
                d.as_bytes(),
            ];
            answered(lane.send_packed(|out| pack(out, &all)).await)
        },
        || false,
    )
}
