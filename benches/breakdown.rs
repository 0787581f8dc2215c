//! The layers under one acquire and one release at 1 in flight, measured from inside tokio
//! (issue 37, item 1): run by `benchmarks/breakdown.bench.mjs`, which starts the server and
//! prints these rows beside the ones it measures from JS.
//!
//!   cargo bench --no-default-features --bench breakdown -- --url URL [--calls N] [--reps N]
//!
//! The loop runs as a task on a one-worker runtime, as the addon's runtime is built, so no
//! step crosses from another thread:
//! - `socket-*`: the script's EVALSHA packed by redis-rs, written to a plain tokio socket and
//!   its reply read and parsed: the socket, Redis, and one wake-up for the reply;
//! - `redis-rs-*`: the same command on redis-rs's multiplexed connection (its channel to the
//!   connection's task and back);
//! - `driver-*`: the driver's own acquire and release (key names, token, the wait line, the
//!   attempt's task, the lease's bookkeeping, the release's task).
//!
//! Prints one JSON line: per step the latency p50/p90 in µs, and per thread (`runtime`: the
//! runtime's one thread, which runs the measuring task and redis-rs's connection task;
//! `other`: every other thread of the process) CPU µs and voluntary context switches
//! (wake-ups) per call.

use std::fs;
use std::time::Instant;

use redis::aio::MultiplexedConnection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use dokebi_lock_redis::{parse_backend, parse_connection, Driver, Raw};

const ACQUIRE: &str = include_str!("../src/scripts/acquire.lua");
const RELEASE: &str = include_str!("../src/scripts/release.lua");

struct Args {
    url: String,
    calls: usize,
    reps: usize,
}

fn args() -> Args {
    let mut args = Args { url: String::new(), calls: 2000, reps: 5 };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--url" => args.url = it.next().expect("--url needs a value"),
            "--calls" => args.calls = it.next().and_then(|v| v.parse().ok()).expect("--calls N"),
            "--reps" => args.reps = it.next().and_then(|v| v.parse().ok()).expect("--reps N"),
            // cargo bench passes --bench to every bench binary
            _ => {}
        }
    }
    assert!(!args.url.is_empty(), "--url is required");
    args
}

/// CPU ns and voluntary context switches of one thread of this process.
fn thread_counters(tid: &str) -> (u64, u64) {
    let schedstat = fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).unwrap();
    let status = fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
    let cpu = schedstat.split(' ').next().unwrap().parse().unwrap();
    let sleeps = status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap();
    (cpu, sleeps)
}

fn current_tid() -> String {
    let link = fs::read_link("/proc/thread-self").unwrap();
    link.file_name().unwrap().to_string_lossy().into_owned()
}

/// Every thread of the process but `except`, summed.
fn others(except: &str) -> (u64, u64) {
    let mut sum = (0, 0);
    for entry in fs::read_dir("/proc/self/task").unwrap() {
        let tid = entry.unwrap().file_name().to_string_lossy().into_owned();
        if tid != except {
            if let Ok((cpu, sleeps)) = std::panic::catch_unwind(|| thread_counters(&tid)) {
                sum.0 += cpu;
                sum.1 += sleeps;
            }
        }
    }
    sum
}

#[derive(Default)]
struct Rep {
    p50: f64,
    p90: f64,
    caller_cpu: f64,
    caller_wake: f64,
    worker_cpu: f64,
    worker_wake: f64,
}

/// Counters of the runtime's thread and of the others, at the start of a step.
struct Mark {
    tid: String,
    runtime: (u64, u64),
    other: (u64, u64),
}

impl Mark {
    fn now() -> Self {
        let tid = current_tid();
        let (runtime, other) = (thread_counters(&tid), others(&tid));
        Self { tid, runtime, other }
    }

    /// The step's rep, from its latencies (µs) and the counters now.
    fn rep(self, mut lat: Vec<f64>) -> Rep {
        let (r1, o1) = (thread_counters(&self.tid), others(&self.tid));
        lat.sort_by(f64::total_cmp);
        let n = lat.len() as f64;
        Rep {
            p50: lat[lat.len() / 2],
            p90: lat[lat.len() * 9 / 10],
            caller_cpu: (r1.0 - self.runtime.0) as f64 / 1000.0 / n,
            caller_wake: (r1.1 - self.runtime.1) as f64 / n,
            worker_cpu: (o1.0 - self.other.0) as f64 / 1000.0 / n,
            worker_wake: (o1.1 - self.other.1) as f64 / n,
        }
    }
}

/// Times `$calls` calls of `$body` (an awaited expression of `$i`), one at a time. A macro,
/// not a closure: the bodies borrow the socket and the leases mutably across the await.
macro_rules! measure {
    ($calls:expr, |$i:ident| $body:expr) => {{
        let mark = Mark::now();
        let mut lat = Vec::with_capacity($calls);
        for $i in 0..$calls {
            let start = Instant::now();
            $body;
            lat.push(start.elapsed().as_secs_f64() * 1e6);
        }
        mark.rep(lat)
    }};
}

fn evalsha(sha: &str, keys: &[&str], args: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha).arg(keys.len()).arg(keys).arg(args);
    cmd
}

fn acquire_cmd(sha: &str, key: &str) -> redis::Cmd {
    evalsha(
        sha,
        &[&format!("bd:lock:{{{key}}}"), &format!("bd:lock-fence:{{{key}}}")],
        &["tok", "10000"],
    )
}

fn release_cmd(sha: &str, key: &str) -> redis::Cmd {
    evalsha(sha, &[&format!("bd:lock:{{{key}}}")], &["tok", "bd:released", key])
}

/// One command written to a plain socket and its one reply read back.
async fn round_trip(socket: &mut TcpStream, buf: &mut Vec<u8>, cmd: &redis::Cmd) {
    socket.write_all(&cmd.get_packed_command()).await.unwrap();
    buf.clear();
    loop {
        let mut chunk = [0u8; 512];
        let n = socket.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the server closed the socket");
        buf.extend_from_slice(&chunk[..n]);
        if redis::parse_redis_value(buf).is_ok() {
            return;
        }
    }
}

type Steps = Vec<(&'static str, Vec<Rep>)>;

async fn run(args: &Args) -> Steps {
    let client = redis::Client::open(args.url.as_str()).unwrap();
    let mut mux: MultiplexedConnection = client.get_multiplexed_async_connection().await.unwrap();
    let load = |source: &str| redis::cmd("SCRIPT").arg("LOAD").arg(source).clone();
    let acquire_sha: String = load(ACQUIRE).query_async(&mut mux).await.unwrap();
    let release_sha: String = load(RELEASE).query_async(&mut mux).await.unwrap();
    let addr = args.url.trim_start_matches("redis://").trim_end_matches('/').to_owned();
    let mut socket = TcpStream::connect(addr).await.unwrap();
    socket.set_nodelay(true).unwrap();
    let backend = Raw::Object(vec![
        ("driver".into(), Raw::String("redis".into())),
        ("connection".into(), Raw::String("main".into())),
        ("namespace".into(), Raw::String("bd-rust".into())),
        ("leaseMs".into(), Raw::Number(10_000.0)),
    ]);
    let driver = Driver::new(
        &parse_connection(&Raw::String(args.url.clone())).unwrap(),
        parse_backend(&backend).unwrap(),
    )
    .unwrap();
    let mut steps: Steps = [
        "socket-acquire",
        "socket-release",
        "redis-rs-acquire",
        "redis-rs-release",
        "driver-acquire",
        "driver-release",
    ]
    .into_iter()
    .map(|name| (name, Vec::new()))
    .collect();
    let mut buf = Vec::new();
    let mut serial = 0usize;
    for rep in 0..=args.reps {
        // Repetition 0 warms every path and is not kept.
        let calls = if rep == 0 { 500 } else { args.calls };
        let base = serial;
        serial += calls;
        let key = |prefix: &str, i: usize| format!("{prefix}-{}", base + i);
        let mut reps = Vec::new();
        reps.push(measure!(calls, |i| {
            round_trip(&mut socket, &mut buf, &acquire_cmd(&acquire_sha, &key("s", i))).await
        }));
        reps.push(measure!(calls, |i| {
            round_trip(&mut socket, &mut buf, &release_cmd(&release_sha, &key("s", i))).await
        }));
        reps.push(measure!(calls, |i| {
            let _: redis::Value =
                mux.send_packed_command(&acquire_cmd(&acquire_sha, &key("m", i))).await.unwrap();
        }));
        reps.push(measure!(calls, |i| {
            let _: redis::Value =
                mux.send_packed_command(&release_cmd(&release_sha, &key("m", i))).await.unwrap();
        }));
        let mut leases = Vec::with_capacity(calls);
        reps.push(measure!(calls, |i| {
            let acquiring = driver.acquire(&key("d", i), Some(1000), CancellationToken::new());
            leases.push(acquiring.await.unwrap());
        }));
        let mut leases = leases.into_iter();
        reps.push(measure!(calls, |_i| {
            assert!(driver.release(&leases.next().unwrap()).await.unwrap());
        }));
        if rep > 0 {
            for ((_, kept), r) in steps.iter_mut().zip(reps) {
                kept.push(r);
            }
        }
    }
    driver.shutdown().await.unwrap();
    steps
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    (values[values.len() / 2] * 100.0).round() / 100.0
}

fn main() {
    let args = args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("dokebi-lock-redis")
        .enable_all()
        .build()
        .unwrap();
    let steps = runtime.block_on(async {
        let args = args;
        tokio::spawn(async move { run(&args).await }).await.unwrap()
    });
    let rows: Vec<String> = steps
        .into_iter()
        .map(|(name, reps)| {
            let m = |f: fn(&Rep) -> f64| median(reps.iter().map(f).collect());
            format!(
                "\"{name}\":{{\"p50Us\":{},\"p90Us\":{},\"cpuUsPerCall\":{{\"runtime\":{},\"other\":{}}},\"wakeUpsPerCall\":{{\"runtime\":{},\"other\":{}}}}}",
                m(|r| r.p50),
                m(|r| r.p90),
                m(|r| r.caller_cpu),
                m(|r| r.worker_cpu),
                m(|r| r.caller_wake),
                m(|r| r.worker_wake),
            )
        })
        .collect();
    println!("{{\"steps\":{{{}}}}}", rows.join(","));
}
