//! Throwaway redis-server processes for the integration tests.
//!
//! Why: the machine (and CI) runs a shared Redis on 6379. Tests that flush,
//! pause or restart Redis must never touch it, so each test starts its own
//! server on a free port, in its own temp dir, with persistence off, and the
//! server dies with the `RedisServer` (or with the test process). Set
//! `REDIS_URL` to run against an existing server instead; tests that need to
//! break the server should return early when [`external()`] is true.
//!
//! Only std: the harness must not share code (or bugs) with the client under
//! test, so it speaks just enough RESP itself.

#![allow(dead_code)] // each test binary uses a different part of this

pub(crate) mod middlebox;

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex, Once, OnceLock};
use std::time::{Duration, Instant};
use std::{env, fs, process, thread};

const HOST: &str = "127.0.0.1";
const READY_TIMEOUT: Duration = Duration::from_secs(10);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
const PORT_ATTEMPTS: usize = 5;

/// True when `REDIS_URL` is set: fault-injecting tests should skip.
pub(crate) fn external() -> bool {
    env::var_os("REDIS_URL").is_some()
}

pub(crate) struct RedisServer {
    pub port: u16,
    url: String,
    host: String,
    /// AUTH / SELECT sent ahead of every command (external servers only),
    /// because each command uses a fresh connection.
    prelude: Vec<Vec<String>>,
    /// None for an external server.
    local: Option<Local>,
}

struct Local {
    child: Option<Child>,
    dir: PathBuf,
    args: Vec<String>,
    /// A config file given before the arguments (a Sentinel's: it rewrites it).
    conf: Option<PathBuf>,
}

impl RedisServer {
    /// A fresh server on a free port, or the `REDIS_URL` one.
    pub(crate) fn start() -> Self {
        Self::start_with_args(&[])
    }

    /// Like [`start`](Self::start) with extra redis-server arguments, e.g.
    /// `&["--maxmemory-policy", "allkeys-lru"]`.
    pub(crate) fn start_with_args(args: &[&str]) -> Self {
        if let Ok(url) = env::var("REDIS_URL") {
            assert!(
                args.is_empty(),
                "start_with_args needs a throwaway server, but REDIS_URL is set"
            );
            return Self::for_url(url);
        }
        Self::launch_fresh(args, |_| None)
    }

    /// A throwaway replica of `primary`. Every node of an HA test syncs at once
    /// (`repl-diskless-sync-delay 0`), or a replica's first sync waits 5 s.
    pub(crate) fn start_replica_of(primary: &RedisServer) -> Self {
        let port = primary.port.to_string();
        Self::launch_fresh(&["--replicaof", HOST, &port, "--repl-diskless-sync-delay", "0"], |_| {
            None
        })
    }

    /// A throwaway primary for replicas and Sentinels to follow.
    pub(crate) fn start_primary() -> Self {
        Self::launch_fresh(&["--repl-diskless-sync-delay", "0"], |_| None)
    }

    /// `conf` writes a config file into the server's dir before it starts.
    fn launch_fresh(args: &[&str], conf: impl Fn(&Path) -> Option<PathBuf>) -> Self {
        assert!(!external(), "HA tests need throwaway servers, but REDIS_URL is set");
        let dir = fresh_dir();
        let conf = conf(&dir);
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let mut attempt = 1;
        loop {
            // Another process may take the port between our probe and redis'
            // bind; then we simply pick another.
            let port = free_port();
            match launch(port, &dir, conf.as_deref(), &args) {
                Ok(child) => {
                    return RedisServer {
                        port,
                        url: format!("redis://{HOST}:{port}"),
                        host: HOST.to_string(),
                        prelude: Vec::new(),
                        local: Some(Local { child: Some(child), dir, args, conf }),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::AddrInUse && attempt < PORT_ATTEMPTS => {
                    attempt += 1
                }
                Err(e) => {
                    let _ = fs::remove_dir_all(&dir);
                    panic!("could not start redis-server: {e}");
                }
            }
        }
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// The server's temp dir (holds redis.log); None for an external server.
    pub(crate) fn dir(&self) -> Option<&Path> {
        self.local.as_ref().map(|l| l.dir.as_path())
    }

    /// The redis-server process id, while it runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.local.as_ref()?.child.as_ref().map(Child::id)
    }

    /// SIGSTOP: connections are still accepted (the kernel does that) but
    /// nothing is answered, like a server stuck or a network black hole.
    pub(crate) fn pause(&self) {
        let pid = self.running_pid("pause");
        signal(pid, "STOP");
        wait_for_state(pid, |s| s == 'T');
    }

    pub(crate) fn resume(&self) {
        let pid = self.running_pid("resume");
        signal(pid, "CONT");
        wait_for_state(pid, |s| s != 'T');
    }

    /// Abrupt death, as in a crash. `restart()` brings it back.
    pub(crate) fn kill(&mut self) {
        let local = self.local_mut("kill");
        if let Some(mut child) = local.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server and starts a new one on the same port (clients
    /// reconnect to the address they know), with all data gone.
    pub(crate) fn restart(&mut self) {
        let port = self.port;
        let local = self.local_mut("restart");
        if let Some(mut child) = local.child.take() {
            stop_gracefully(&mut child);
        }
        let _ = fs::remove_dir_all(&local.dir);
        fs::create_dir_all(&local.dir).expect("recreate redis dir");
        // The port is ours to wait for, not to swap.
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match launch(port, &local.dir, local.conf.as_deref(), &local.args) {
                Ok(child) => {
                    local.child = Some(child);
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                    thread::sleep(Duration::from_millis(100))
                }
                Err(e) => panic!("could not restart redis-server on port {port}: {e}"),
            }
        }
    }

    /// Sends one command and returns the raw RESP reply as text, e.g.
    /// `"+PONG\r\n"`, `"$3\r\nbar\r\n"`, `"$-1\r\n"`, `":1\r\n"`, `"-ERR ...\r\n"`
    /// or a whole `INFO` bulk. Error replies are returned, not panicked on, so
    /// tests can assert them. Panics on I/O errors or after 5 s.
    pub(crate) fn command(&self, args: &[&str]) -> String {
        self.try_command(args, COMMAND_TIMEOUT)
            .unwrap_or_else(|e| panic!("redis {:?} on {}: {e}", args, self.url))
    }

    /// Like [`command`](Self::command) but returns I/O errors; a reply that
    /// does not come within `timeout` is `ErrorKind::TimedOut`.
    pub(crate) fn try_command(&self, args: &[&str], timeout: Duration) -> io::Result<String> {
        let addr = (self.host.as_str(), self.port)
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| io::Error::other("no address"))?;
        let prelude: Vec<Vec<&str>> =
            self.prelude.iter().map(|c| c.iter().map(String::as_str).collect()).collect();
        let mut commands = prelude;
        commands.push(args.to_vec());
        let mut replies = round_trip(addr, &commands, timeout)?;
        let reply = replies.pop().expect("one reply per command");
        if let Some(err) = replies.iter().find(|r| r.starts_with('-')) {
            return Err(io::Error::other(format!("AUTH/SELECT failed: {}", err.trim_end())));
        }
        Ok(reply)
    }

    fn for_url(url: String) -> Self {
        let rest = url.strip_prefix("redis://").unwrap_or_else(|| {
            panic!("REDIS_URL: only redis:// is supported by the test harness, got {url}")
        });
        // redis://[[user]:password@]host[:port][/db]; no percent-decoding.
        let (authority, db) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p)) if !h.is_empty() => (h, p.parse().expect("REDIS_URL port")),
            _ => (hostport, 6379),
        };
        let mut prelude = Vec::new();
        match userinfo.map(|u| u.split_once(':').unwrap_or(("", u))) {
            Some(("", pass)) if !pass.is_empty() => prelude.push(vec!["AUTH".into(), pass.into()]),
            Some((user, pass)) if !pass.is_empty() => {
                prelude.push(vec!["AUTH".into(), user.into(), pass.into()])
            }
            _ => {}
        }
        if !db.is_empty() && db != "0" {
            prelude.push(vec!["SELECT".into(), db.into()]);
        }
        let server = RedisServer {
            port,
            url: url.clone(),
            host: host.trim_start_matches('[').trim_end_matches(']').to_string(),
            prelude,
            local: None,
        };
        // Fail here, clearly, rather than in the middle of the first test.
        let pong = server.command(&["PING"]);
        assert_eq!(pong, "+PONG\r\n", "REDIS_URL={url} did not answer PING");
        server
    }

    fn local_mut(&mut self, what: &str) -> &mut Local {
        self.local.as_mut().unwrap_or_else(|| refuse(what))
    }

    fn running_pid(&self, what: &str) -> u32 {
        let local = self.local.as_ref().unwrap_or_else(|| refuse(what));
        match &local.child {
            Some(child) => child.id(),
            None => panic!("{what}(): redis-server on port {} is not running", self.port),
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(local) = &mut self.local {
            if let Some(mut child) = local.child.take() {
                let _ = child.kill(); // SIGKILL also ends a paused server
                let _ = child.wait();
            }
            let _ = fs::remove_dir_all(&local.dir);
        }
    }
}

fn refuse(what: &str) -> ! {
    panic!("{what}() needs a throwaway server, but REDIS_URL points at an external one; skip this test when support::external() is true")
}

fn free_port() -> u16 {
    let listener = TcpListener::bind((HOST, 0)).expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local_addr").port()
}

/// `dokebi-redis-<pid>-...`, named like the Node harness's dirs so that both
/// harnesses sweep what a SIGKILLed test process (no Drop ran) left behind.
fn fresh_dir() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    static SWEEP: Once = Once::new();
    SWEEP.call_once(sweep_stale_dirs);
    let dir = env::temp_dir().join(format!(
        "dokebi-redis-{}-rs{}",
        process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::remove_dir_all(&dir); // left by an earlier process with our pid
    fs::create_dir_all(&dir).expect("create redis dir");
    dir
}

/// Removes dirs whose owner process is gone; dirs of live processes stay.
fn sweep_stale_dirs() {
    let Ok(entries) = fs::read_dir(env::temp_dir()) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let owner = name
            .strip_prefix("dokebi-redis-")
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(owner) = owner {
            if owner != process::id() && !Path::new(&format!("/proc/{owner}")).exists() {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// Spawns redis-server and waits until it answers PING. `AddrInUse` means the
/// port was taken; other errors are final.
fn launch(port: u16, dir: &Path, conf: Option<&Path>, extra: &[String]) -> io::Result<Child> {
    let log = dir.join("redis.log");
    let mut cmd = if Path::new("/usr/bin/setpriv").exists() {
        // The kernel SIGKILLs redis when its parent dies, even when the test
        // binary is SIGKILLed and no Drop runs.
        let mut c = Command::new("/usr/bin/setpriv");
        c.args(["--pdeathsig", "KILL", "redis-server"]);
        c
    } else {
        Command::new("redis-server")
    };
    // A config file must come first.
    cmd.args(conf);
    cmd.args(["--port", &port.to_string(), "--bind", HOST, "--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(&log)
        .args(["--daemonize", "no"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = spawn_from_long_lived_thread(cmd).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot run redis-server ({e}); install it: apt-get install redis-server"),
        )
    })?;

    let addr: SocketAddr = (HOST, port).to_socket_addrs()?.next().unwrap();
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait()? {
            let tail = fs::read_to_string(&log).unwrap_or_default();
            let kind = if tail.contains("Address already in use") {
                io::ErrorKind::AddrInUse
            } else {
                io::ErrorKind::Other
            };
            let hint = if status.code() == Some(127) {
                "redis-server not found on PATH; install it: apt-get install redis-server"
            } else {
                tail.trim_end()
            };
            return Err(io::Error::new(
                kind,
                format!("redis-server on port {port} exited early ({status}):\n{hint}"),
            ));
        }
        // INFO's process_id proves the answer came from our child and not
        // from some other process that already held the port.
        if let Ok(replies) =
            round_trip(addr, &[vec!["PING"], vec!["INFO", "server"]], Duration::from_secs(1))
        {
            if replies[0] == "+PONG\r\n" {
                if replies[1].contains(&format!("process_id:{}\r\n", child.id())) {
                    return Ok(child);
                }
                let _ = child.kill();
                let _ = child.wait();
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("port {port} is served by another process"),
                ));
            }
            // e.g. -LOADING: not ready yet
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let tail = fs::read_to_string(&log).unwrap_or_default();
            return Err(io::Error::other(format!(
                "redis-server on port {port} did not answer PING within {READY_TIMEOUT:?}:\n{tail}"
            )));
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// pdeathsig fires when the *thread* that spawned the child exits, and cargo
/// runs each test on its own short-lived thread. Spawning from one thread
/// that lives as long as the process lets a server outlive the test thread
/// that started it (a shared server in a static, say) yet still die with the
/// process.
fn spawn_from_long_lived_thread(cmd: Command) -> io::Result<Child> {
    type Job = (Command, mpsc::Sender<io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        thread::Builder::new()
            .name("redis-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("spawn redis-spawner thread");
        Mutex::new(tx)
    });
    let (tx, rx) = mpsc::channel();
    spawner.lock().unwrap_or_else(|e| e.into_inner()).send((cmd, tx)).expect("redis-spawner alive");
    rx.recv().expect("redis-spawner replied")
}

fn stop_gracefully(child: &mut Child) {
    let pid = child.id();
    signal(pid, "TERM");
    signal(pid, "CONT"); // a paused redis cannot act on SIGTERM
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid} failed");
}

/// Waits until /proc/<pid>/stat shows a state we want, so pause() returns
/// only once the server really stopped.
fn wait_for_state(pid: u32, want: impl Fn(char) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let stat = match fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(s) => s,
            Err(_) => return, // no /proc: trust the signal
        };
        // The state follows the parenthesised command name.
        let state = stat.rsplit_once(") ").and_then(|(_, r)| r.chars().next());
        if state.is_some_and(&want) {
            return;
        }
        thread::sleep(Duration::from_millis(5));
    }
    panic!("redis-server {pid} did not change state");
}

/// One fresh connection: writes all commands, returns one raw reply each.
fn round_trip(
    addr: SocketAddr,
    commands: &[Vec<&str>],
    timeout: Duration,
) -> io::Result<Vec<String>> {
    let stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut out = Vec::new();
    for args in commands {
        out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in args {
            out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
    }
    (&stream).write_all(&out)?;
    let mut reader = BufReader::new(&stream);
    commands
        .iter()
        .map(|_| {
            let mut raw = Vec::new();
            read_reply(&mut reader, &mut raw).map_err(|e| match e.kind() {
                // A read timeout surfaces as EAGAIN on Linux.
                io::ErrorKind::WouldBlock => {
                    io::Error::new(io::ErrorKind::TimedOut, format!("no reply within {timeout:?}"))
                }
                _ => e,
            })?;
            Ok(String::from_utf8_lossy(&raw).into_owned())
        })
        .collect()
}

/// Copies exactly one RESP2 reply into `raw`, recursing into arrays; the
/// framing is all it needs to know to stop at the right byte.
fn read_reply(reader: &mut impl BufRead, raw: &mut Vec<u8>) -> io::Result<()> {
    let start = raw.len();
    if reader.read_until(b'\n', raw)? == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed before reply"));
    }
    let line = String::from_utf8_lossy(&raw[start..]).trim_end().to_string();
    let len = || -> io::Result<i64> {
        line[1..].parse().map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidData, format!("bad RESP line {line:?}"))
        })
    };
    match line.as_bytes().first() {
        Some(b'+' | b'-' | b':') => Ok(()),
        Some(b'$') => {
            let n = len()?;
            if n >= 0 {
                let at = raw.len();
                raw.resize(at + n as usize + 2, 0);
                reader.read_exact(&mut raw[at..])?;
            }
            Ok(())
        }
        Some(b'*') => {
            for _ in 0..len()?.max(0) {
                read_reply(reader, raw)?;
            }
            Ok(())
        }
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected RESP line {line:?}"),
        )),
    }
}

/// A throwaway Sentinel (`redis-server <conf> --sentinel`) monitoring one primary under
/// `name` with quorum 1, quick to notice a dead primary (`down-after-milliseconds 500`).
pub(crate) struct Sentinel {
    pub server: RedisServer,
    pub name: String,
}

impl Sentinel {
    /// `extra_conf`: more sentinel.conf lines, e.g. an ACL `user` line.
    pub(crate) fn start(name: &str, primary: &RedisServer, extra_conf: &[&str]) -> Self {
        Self::start_for_port(name, primary.port, extra_conf)
    }

    /// Monitors the primary at `port` (e.g. its TLS port, with `tls-replication yes`).
    pub(crate) fn start_for_port(name: &str, port: u16, extra_conf: &[&str]) -> Self {
        let mut lines = vec![
            format!("sentinel monitor {name} {HOST} {port} 1"),
            format!("sentinel down-after-milliseconds {name} 500"),
            format!("sentinel failover-timeout {name} 3000"),
        ];
        lines.extend(extra_conf.iter().map(|l| l.to_string()));
        let server = RedisServer::launch_fresh(&["--sentinel"], |dir| {
            let conf = dir.join("sentinel.conf");
            fs::write(&conf, lines.join("\n") + "\n").expect("write sentinel.conf");
            Some(conf)
        });
        Sentinel { server, name: name.to_owned() }
    }

    pub(crate) fn port(&self) -> u16 {
        self.server.port
    }

    pub(crate) fn command(&self, args: &[&str]) -> String {
        self.server.command(args)
    }

    /// The port of the primary this Sentinel names now.
    pub(crate) fn primary_port(&self) -> Option<u16> {
        let reply = self.command(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", &self.name]);
        reply
            .split("\r\n")
            .filter(|l| !l.starts_with(['*', '$']))
            .nth(1)
            .and_then(|p| p.parse().ok())
    }

    /// How many replicas of the primary this Sentinel knows and sees up.
    pub(crate) fn replicas_up(&self) -> usize {
        let reply = self.command(&["SENTINEL", "REPLICAS", &self.name]);
        let fields: Vec<&str> =
            reply.split("\r\n").filter(|l| !l.starts_with(['*', '$']) && !l.is_empty()).collect();
        fields.windows(2).filter(|w| w[0] == "flags" && w[1] == "slave").count()
    }

    /// `SENTINEL FAILOVER`, asked again while Sentinel has no replica it deems ready
    /// (it learns of replicas and their state on its INFO rounds).
    pub(crate) fn failover(&self, within: Duration) {
        let end = Instant::now() + within;
        loop {
            let reply = self.command(&["SENTINEL", "FAILOVER", &self.name]);
            if reply == "+OK\r\n" {
                return;
            }
            assert!(Instant::now() < end, "SENTINEL FAILOVER kept answering {reply:?}");
            thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The role a server reports: "master", "slave", "sentinel".
pub(crate) fn role(server: &RedisServer) -> String {
    let reply = server.command(&["ROLE"]);
    reply.split("\r\n").find(|l| !l.starts_with(['*', '$'])).unwrap_or_default().to_owned()
}

/// Blocks until `primary` has `replicas` replicas online (their first sync done) that have
/// acknowledged a write: after a sync, Redis 7.0 streams to a replica, and so counts it for
/// WAIT, only from its first REPLCONF ACK (sent once a second). Without that, a
/// `minReplicas` write made right after the sync can be refused NOREPLICAS on a busy machine.
pub(crate) fn wait_for_replicas(primary: &RedisServer, replicas: usize, within: Duration) {
    let end = Instant::now() + within;
    // Polls `INFO replication` until `enough` of its replica lines pass `ready`.
    let poll = |what: &str, ready: &dyn Fn(&str) -> bool| loop {
        let info = primary.command(&["INFO", "replication"]);
        let passed = info.lines().filter(|l| l.starts_with("slave") && ready(l)).count();
        if passed >= replicas {
            return;
        }
        assert!(Instant::now() < end, "{replicas} replica(s) {what} within {within:?}:\n{info}");
        thread::sleep(Duration::from_millis(20));
    };
    poll("not online", &|line| line.contains("state=online"));
    primary.command(&["SET", "replicas-acknowledged", "1"]);
    let written = primary
        .command(&["INFO", "replication"])
        .lines()
        .find_map(|l| l.strip_prefix("master_repl_offset:"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    poll("did not acknowledge a write", &|line| {
        line.split(',')
            .find_map(|f| f.strip_prefix("offset="))
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|offset| offset >= written)
    });
}
