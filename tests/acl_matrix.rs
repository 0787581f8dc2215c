//! The ACL fault matrix (issue 34): every command a Lua script runs, denied alone to docs/operations.md's
//! least-privilege user, under the operation that runs that script. CONTRACT.md: a script
//! never answers with an error after it wrote, and refused permissions fail at once. So each
//! cell's operation either runs as it does with the whole rule, or fails PROVIDER_FAILED
//! (cause `rejected`, at once even while waiting) with the key space as it found it; and no
//! fence is ever drawn from an unseeded counter.
//!
//! The cells are checked against the scripts themselves: a command added to a script without
//! a cell here, or a script added without its operations, fails
//! `every_command_of_every_script_has_a_cell`.

mod common;
mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{driver, hash, notifying_driver, url, value};
use dokebi_lock_redis::{Driver, Lease, LockError, LockErrorCode, Outcome, RedisErrorCode};
use support::RedisServer;
use tokio_util::sync::CancellationToken;

/// The scripts as the driver embeds them (src/scripts.rs includes the same files).
const SCRIPTS: &[(&str, &str)] = &[
    ("acquire", include_str!("../src/scripts/acquire.lua")),
    ("release", include_str!("../src/scripts/release.lua")),
    ("release_keyed", include_str!("../src/scripts/release_keyed.lua")),
    ("renew", include_str!("../src/scripts/renew.lua")),
    ("confirm", include_str!("../src/scripts/confirm.lua")),
];

fn source(script: &str) -> &'static str {
    SCRIPTS.iter().find(|(name, _)| *name == script).expect("a script").1
}

/// An operation that runs a script, from a state it sets up itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// acquire of a key never locked: no lease, no counter (the seed branch).
    AcquireNew,
    /// The same with `fenceTtlMs`: the counter is seeded with an expiry.
    AcquireNewWithFenceTtl,
    /// acquire of a free key whose counter exists (the common path).
    AcquireCounter,
    /// acquire with a counter past 2^53 (read back exactly).
    AcquireBigCounter,
    /// acquire of a key another token holds.
    AcquireHeld,
    /// release, `notifications: 'namespace'` (release.lua).
    Release,
    /// release, `notifications: 'per-key'` (release_keyed.lua).
    ReleasePerKey,
    /// release_keyed.lua as a Cluster's driver sends it (sharded: SPUBLISH first), by EVAL:
    /// on a single server the driver never asks for SPUBLISH.
    ReleaseKeyedSharded,
    /// renew.
    Renew,
    /// confirm.lua as a Cluster's minReplicas round sends it, by EVAL (decision 0142): it
    /// runs only in a Cluster with replicas.
    Confirm,
}

use Op::*;

/// The operations that run each script.
fn ops_of(script: &str) -> &'static [Op] {
    match script {
        "acquire" => {
            &[AcquireNew, AcquireNewWithFenceTtl, AcquireCounter, AcquireBigCounter, AcquireHeld]
        }
        "release" => &[Release],
        "release_keyed" => &[ReleasePerKey, ReleaseKeyedSharded],
        "renew" => &[Renew],
        "confirm" => &[Confirm],
        other => panic!("no operations listed for script {other}"),
    }
}

/// Denying `command` to `script`'s user refuses the operations in `refuses`; the others run
/// as they do with the whole rule (the command is not reached, or refused under pcall).
struct Cell {
    script: &'static str,
    command: &'static str,
    refuses: &'static [Op],
}

const SEEDING: &[Op] = &[AcquireNew, AcquireNewWithFenceTtl];
const FREE_KEY: &[Op] = &[AcquireNew, AcquireNewWithFenceTtl, AcquireCounter, AcquireBigCounter];

const CELLS: &[Cell] = &[
    // A refused SET on a held key still answers the holder's PTTL (EXISTS, PTTL).
    Cell { script: "acquire", command: "set", refuses: FREE_KEY },
    // Only after a refused SET.
    Cell { script: "acquire", command: "exists", refuses: &[] },
    Cell { script: "acquire", command: "pttl", refuses: &[AcquireHeld] },
    Cell { script: "acquire", command: "incr", refuses: FREE_KEY },
    Cell { script: "acquire", command: "time", refuses: SEEDING },
    Cell { script: "acquire", command: "get", refuses: &[AcquireBigCounter] },
    // Only where SET refuses to take a write back.
    Cell { script: "acquire", command: "del", refuses: &[] },
    Cell { script: "release", command: "get", refuses: &[Release] },
    Cell { script: "release", command: "del", refuses: &[Release] },
    Cell { script: "release", command: "publish", refuses: &[] },
    Cell {
        script: "release_keyed",
        command: "get",
        refuses: &[ReleasePerKey, ReleaseKeyedSharded],
    },
    Cell {
        script: "release_keyed",
        command: "del",
        refuses: &[ReleasePerKey, ReleaseKeyedSharded],
    },
    Cell { script: "release_keyed", command: "spublish", refuses: &[] },
    Cell { script: "release_keyed", command: "publish", refuses: &[] },
    Cell { script: "renew", command: "get", refuses: &[Renew] },
    Cell { script: "renew", command: "pexpire", refuses: &[Renew] },
    Cell { script: "confirm", command: "get", refuses: &[Confirm] },
    Cell { script: "confirm", command: "set", refuses: &[Confirm] },
];

/// The commands a script calls: the first argument of each `redis.call`, `redis.pcall` and
/// `pcall(redis.call, …)`, comments left out. Lowercase, as ACL rules name them.
fn commands_run_by(source: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in source.lines() {
        let code = line.split("--").next().unwrap_or_default();
        for (at, _) in code.match_indices("call") {
            let rest = code[at + 4..].trim_start_matches(['(', ',', ' ']);
            let Some(quoted) = rest.strip_prefix('\'') else { continue };
            let name = &quoted[..quoted.find('\'').expect("a closed string")];
            assert!(name.bytes().all(|b| b.is_ascii_uppercase()), "a command name: {name:?}");
            found.insert(name.to_ascii_lowercase());
        }
    }
    found
}

#[test]
fn every_command_of_every_script_has_a_cell() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/scripts");
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let mut listed: Vec<String> = SCRIPTS.iter().map(|(name, _)| format!("{name}.lua")).collect();
    listed.sort();
    assert_eq!(files, listed, "src/scripts/ and this matrix's scripts");
    for (script, source) in SCRIPTS {
        let run = commands_run_by(source);
        let cells: BTreeSet<String> =
            CELLS.iter().filter(|c| c.script == *script).map(|c| c.command.to_owned()).collect();
        assert_eq!(run, cells, "{script}.lua's commands and its cells");
        for cell in CELLS.iter().filter(|c| c.script == *script) {
            for op in cell.refuses {
                assert!(ops_of(script).contains(op), "{script}/{}: {op:?}", cell.command);
            }
        }
    }
    // The parser finds what it is meant to: all three forms.
    assert!(commands_run_by(source("acquire")).contains("time"));
    assert!(commands_run_by(source("release_keyed")).contains("spublish"));
}

/// What an operation came to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Got {
    Acquired(String),
    Busy,
    Released(bool),
    Renewed,
    /// A script run by EVAL answered this integer.
    Replied(i64),
    /// PROVIDER_FAILED, cause COMMAND_REJECTED `rejected`, not retryable (or, by EVAL, an
    /// error reply), with the server's code.
    Refused(String),
    Other(String),
}

fn from_error(err: &LockError) -> Got {
    if err.code == LockErrorCode::LockBusy {
        return Got::Busy;
    }
    match &err.cause {
        Some(cause)
            if err.code == LockErrorCode::ProviderFailed
                && cause.code == RedisErrorCode::CommandRejected
                && cause.outcome == Outcome::Rejected
                && !cause.retryable() =>
        {
            Got::Refused(cause.server_code.clone().unwrap_or_default())
        }
        _ => Got::Other(format!("{err:?}")),
    }
}

/// The lock key and the fence counter, read as the admin: values and PTTLs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Snapshot {
    lock: Option<String>,
    lock_pttl: i64,
    fence: Option<String>,
    fence_pttl: i64,
}

fn read(reply: &str) -> Option<String> {
    (!reply.starts_with("$-1")).then(|| value(reply))
}

/// A key that was alive stays alive, no longer than it was; a missing or persistent one
/// stays so.
fn ttl_kept(before: i64, after: i64) -> bool {
    if before > 0 {
        after > 0 && after <= before
    } else {
        after == before
    }
}

const LEASE_MS: u32 = 60_000;
const FENCE_TTL_MS: u32 = 3_600_000;
/// Renew is tried on a lease brought down to this, so a renew that ran shows.
const SHORTENED_MS: &str = "30000";
/// What a waiting acquire is given: a refusal ridden out would take all of it.
const WAIT_MS: u32 = 10_000;
/// A refusal "at once" comes within this (it needs one round trip; the wait is 5x longer).
const AT_ONCE: Duration = Duration::from_secs(2);
const BIG_COUNTER: &str = "9007199254740993000";

struct Lab {
    redis: RedisServer,
}

/// One operation's run: its key, user rule and driver.
struct Run<'a> {
    lab: &'a Lab,
    op: Op,
    key: String,
    lock: String,
    fence: String,
    rule: Vec<String>,
    driver: Option<Driver>,
    /// Server TIME (seconds) when the cell began: every fence is at least this x 10^6.
    floor: u128,
}

impl Lab {
    fn start() -> Option<Self> {
        if support::external() {
            return None;
        }
        Some(Self { redis: RedisServer::start_with_args(&["--maxmemory-policy", "noeviction"]) })
    }

    fn user_url(&self) -> String {
        self.redis.url().replace("redis://", "redis://locker:s3cret@")
    }

    fn set_user(&self, rule: &[String], extra: &[String]) {
        let mut setuser = vec!["ACL", "SETUSER", "locker", "reset"];
        setuser.extend(rule.iter().map(String::as_str));
        setuser.extend(extra.iter().map(String::as_str));
        let reply = self.redis.command(&setuser);
        assert!(reply.starts_with("+OK"), "{setuser:?}: {reply}");
    }

    fn now_secs(&self) -> u128 {
        value(&self.redis.command(&["TIME"])).parse().unwrap()
    }

    fn run(&self, op: Op, name: &str) -> Run<'_> {
        let key = format!("{op:?}-{name}");
        let h = hash(&key);
        let mut rule: Vec<String> =
            common::LEAST_PRIVILEGE_RULE.iter().map(|s| s.to_string()).collect();
        let per_key = |rule: &mut Vec<String>| {
            for word in rule.iter_mut() {
                if word == "&locks:lock-released" {
                    *word = "&locks:lock-released*".into();
                }
            }
            rule.push("+unsubscribe".into());
        };
        match op {
            ReleasePerKey => per_key(&mut rule),
            ReleaseKeyedSharded => {
                per_key(&mut rule);
                rule.extend(common::CLUSTER_PRIVILEGE_ADDITIONS.iter().map(|s| s.to_string()));
            }
            Confirm => {
                rule.extend(common::CLUSTER_PRIVILEGE_ADDITIONS.iter().map(|s| s.to_string()));
                rule.push("+wait".into());
            }
            _ => {}
        }
        self.set_user(&rule, &[]);
        let lease = ("leaseMs", f64::from(LEASE_MS));
        let driver = match op {
            ReleaseKeyedSharded | Confirm => None,
            ReleasePerKey => {
                Some(notifying_driver(url(&self.user_url()), "locks", "per-key", &[lease]))
            }
            AcquireNewWithFenceTtl => Some(driver(
                url(&self.user_url()),
                "locks",
                &[lease, ("fenceTtlMs", f64::from(FENCE_TTL_MS))],
            )),
            _ => Some(driver(url(&self.user_url()), "locks", &[lease])),
        };
        Run {
            lab: self,
            op,
            lock: format!("locks:lock:{{{h}}}"),
            fence: format!("locks:lock-fence:{{{h}}}"),
            key,
            rule,
            driver,
            floor: self.now_secs() * 1_000_000,
        }
    }
}

impl Run<'_> {
    fn admin(&self, args: &[&str]) -> String {
        self.lab.redis.command(args)
    }

    fn snapshot(&self) -> Snapshot {
        let pttl = |key: &str| value(&self.admin(&["PTTL", key])).parse().unwrap();
        Snapshot {
            lock: read(&self.admin(&["GET", &self.lock])),
            lock_pttl: pttl(&self.lock),
            fence: read(&self.admin(&["GET", &self.fence])),
            fence_pttl: pttl(&self.fence),
        }
    }

    fn driver(&self) -> &Driver {
        self.driver.as_ref().expect("a driver operation")
    }

    /// A seeded counter, as an earlier acquire left it.
    fn seeded_counter(&self) -> u128 {
        let counter = self.floor + 41;
        self.admin(&["SET", &self.fence, &counter.to_string()]);
        counter
    }

    /// The state the operation starts from, made with the whole rule; the lease where the
    /// operation needs one.
    async fn set_up(&self) -> Option<Arc<Lease>> {
        let lease_ms = LEASE_MS.to_string();
        match self.op {
            AcquireNew | AcquireNewWithFenceTtl => None,
            AcquireCounter => {
                self.seeded_counter();
                None
            }
            AcquireBigCounter => {
                self.admin(&["SET", &self.fence, BIG_COUNTER]);
                None
            }
            AcquireHeld => {
                self.seeded_counter();
                self.admin(&["SET", &self.lock, "another-owner", "PX", &lease_ms]);
                None
            }
            Release | ReleasePerKey | Renew => {
                let lease = self.acquire(0).await.expect("the lease, with the whole rule");
                if self.op == Renew {
                    self.admin(&["PEXPIRE", &self.lock, SHORTENED_MS]);
                }
                Some(lease)
            }
            ReleaseKeyedSharded | Confirm => {
                self.seeded_counter();
                self.admin(&["SET", &self.lock, "our-token", "PX", &lease_ms]);
                None
            }
        }
    }

    async fn acquire(&self, wait_ms: u32) -> Result<Arc<Lease>, LockError> {
        self.driver().acquire(&self.key, Some(wait_ms), CancellationToken::new()).await
    }

    /// Runs the operation once (an acquire waits `wait_ms`).
    async fn go(&self, lease: &Option<Arc<Lease>>, wait_ms: u32) -> Got {
        let result = match self.op {
            AcquireNew
            | AcquireNewWithFenceTtl
            | AcquireCounter
            | AcquireBigCounter
            | AcquireHeld => self.acquire(wait_ms).await.map(|l| Got::Acquired(l.fence.clone())),
            Release | ReleasePerKey => {
                self.driver().release(lease.as_ref().unwrap()).await.map(Got::Released)
            }
            Renew => self.driver().renew(lease.as_ref().unwrap()).await.map(|()| Got::Renewed),
            ReleaseKeyedSharded => {
                let channel = format!("locks:lock-released:{{{}}}", hash(&self.key));
                let args = ["our-token", &channel, &hash(&self.key), "1"];
                return self.eval(source("release_keyed"), &args).await;
            }
            Confirm => return self.eval(source("confirm"), &["our-token"]).await,
        };
        result.unwrap_or_else(|err| from_error(&err))
    }

    /// A script by EVAL as the user, with the lock key, as the driver sends it.
    async fn eval(&self, source: &str, args: &[&str]) -> Got {
        let client = redis::Client::open(self.lab.user_url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let reply: redis::RedisResult<redis::Value> = redis::cmd("EVAL")
            .arg(source)
            .arg(1)
            .arg(&self.lock)
            .arg(args)
            .query_async(&mut conn)
            .await;
        match reply {
            Ok(redis::Value::Int(n)) => Got::Replied(n),
            Ok(redis::Value::ServerError(e)) => Got::Refused(e.code().to_owned()),
            Err(e) if e.code().is_some() => Got::Refused(e.code().unwrap().to_owned()),
            other => Got::Other(format!("{other:?}")),
        }
    }

    /// What the operation comes to with the whole rule, and the key space after it.
    fn check_as_with_the_whole_rule(
        &self,
        got: &Got,
        before: &Snapshot,
        after: &Snapshot,
    ) -> Result<(), String> {
        let fail = |what: &str| Err(format!("{got:?}, {before:?} -> {after:?}: {what}"));
        match (self.op, got) {
            (
                AcquireNew | AcquireNewWithFenceTtl | AcquireCounter | AcquireBigCounter,
                Got::Acquired(fence),
            ) => {
                self.check_fence(fence)?;
                let expected = match self.op {
                    AcquireCounter => Some(
                        (before.fence.as_ref().unwrap().parse::<u128>().unwrap() + 1).to_string(),
                    ),
                    AcquireBigCounter => Some("9007199254740993001".to_owned()),
                    _ => None,
                };
                if expected.is_some_and(|e| &e != fence) {
                    return fail("not the counter's next fence");
                }
                if after.fence.as_ref() != Some(fence) {
                    return fail("the counter is not the fence handed out");
                }
                let fence_ttl_ok = match self.op {
                    AcquireNewWithFenceTtl => {
                        after.fence_pttl > 0 && after.fence_pttl <= i64::from(FENCE_TTL_MS)
                    }
                    _ => after.fence_pttl == -1,
                };
                if after.lock.is_none()
                    || after.lock_pttl <= 0
                    || after.lock_pttl > i64::from(LEASE_MS)
                    || !fence_ttl_ok
                {
                    return fail("not the lease and counter an acquire leaves");
                }
                Ok(())
            }
            (AcquireHeld, Got::Busy) if self.unchanged(before, after) => Ok(()),
            (Release | ReleasePerKey, Got::Released(true))
            | (ReleaseKeyedSharded, Got::Replied(1..)) => {
                if after.lock.is_some() || after.fence != before.fence {
                    return fail("the release left the lease, or moved the counter");
                }
                Ok(())
            }
            (Renew, Got::Renewed) => {
                if after.lock != before.lock || after.lock_pttl <= SHORTENED_MS.parse().unwrap() {
                    return fail("the renew did not extend the lease");
                }
                Ok(())
            }
            (Confirm, Got::Replied(1)) if self.unchanged(before, after) => Ok(()),
            _ => fail("not what the whole rule gives"),
        }
    }

    fn unchanged(&self, before: &Snapshot, after: &Snapshot) -> bool {
        before.lock == after.lock
            && before.fence == after.fence
            && ttl_kept(before.lock_pttl, after.lock_pttl)
            && ttl_kept(before.fence_pttl, after.fence_pttl)
    }

    /// A fence handed out is never drawn from an unseeded counter.
    fn check_fence(&self, fence: &str) -> Result<(), String> {
        let n: u128 = fence.parse().map_err(|_| format!("fence {fence:?}"))?;
        if n < self.floor {
            return Err(format!(
                "fence {fence} drawn from an unseeded counter (TIME x 10^6 was {})",
                self.floor
            ));
        }
        Ok(())
    }

    /// A refused operation left the key space as it found it. A refused GET of a counter past
    /// 2^53 leaves the step INCR drew (a fence no one holds; decision 0164).
    fn check_untouched(
        &self,
        denied: &str,
        before: &Snapshot,
        after: &Snapshot,
    ) -> Result<(), String> {
        let mut expected = before.clone();
        if self.op == AcquireBigCounter && denied == "get" {
            let drawn = before.fence.as_ref().and_then(|f| f.parse::<u128>().ok()).map(|f| f + 1);
            expected.fence = drawn.map(|f| f.to_string());
        }
        if self.unchanged(&expected, after) {
            Ok(())
        } else {
            Err(format!("the key space changed: {before:?} -> {after:?}"))
        }
    }

    async fn shut_down(self) {
        if let Some(d) = self.driver {
            // A refused release or renew may leave shutdown a lease it cannot release.
            let _ = d.shutdown().await;
        }
    }
}

/// One cell for one operation: the operation with `denied` denied, judged as a refusal (then
/// again waiting, and the next acquire with the command granted again) or against what the
/// whole rule gives. Returns what went wrong.
async fn cell(lab: &Lab, op: Op, denied: &str, refuses: bool) -> Result<(), String> {
    let run = lab.run(op, denied);
    let lease = run.set_up().await;
    let deny = format!("-{denied}");
    lab.set_user(&run.rule, &[deny]);
    let is_acquire = run.driver.is_some() && lease.is_none();
    let before = run.snapshot();
    let got = run.go(&lease, 0).await;
    let after = run.snapshot();
    let result = if !refuses {
        run.check_as_with_the_whole_rule(&got, &before, &after)
    } else if !matches!(&got, Got::Refused(code) if code == "ERR" || code == "NOPERM") {
        Err(format!("{got:?}, not refused (ERR or NOPERM)"))
    } else {
        let mut checked = run.check_untouched(denied, &before, &after);
        if checked.is_ok() && is_acquire {
            // Refused permissions are not ridden out by a waiting acquire.
            let before = run.snapshot();
            let started = Instant::now();
            let waited = run.go(&None, WAIT_MS).await;
            let took = started.elapsed();
            let after = run.snapshot();
            checked = if !matches!(waited, Got::Refused(_)) || took > AT_ONCE {
                Err(format!("waiting {WAIT_MS} ms: {waited:?} after {took:?}"))
            } else {
                run.check_untouched(denied, &before, &after)
            };
        }
        if checked.is_ok() && is_acquire {
            // With the command granted again, the next acquire is what it would have been:
            // the key free, the counter seeded.
            lab.set_user(&run.rule, &[]);
            let next = run.go(&None, 0).await;
            checked = match (&next, op) {
                (Got::Busy, AcquireHeld) => Ok(()),
                (Got::Acquired(fence), _) if op != AcquireHeld => run.check_fence(fence),
                _ => Err(format!("granted again, the next acquire: {next:?}")),
            };
        }
        checked
    };
    run.shut_down().await;
    result.map_err(|e| format!("{op:?} without {denied}: {e}"))
}

/// Every cell of `script`, all run, the failures reported together.
async fn matrix(script: &str) {
    let Some(lab) = Lab::start() else { return };
    let mut failures = Vec::new();
    let mut ran = 0;
    for c in CELLS.iter().filter(|c| c.script == script) {
        for &op in ops_of(script) {
            ran += 1;
            if let Err(e) = cell(&lab, op, c.command, c.refuses.contains(&op)).await {
                failures.push(e);
            }
        }
    }
    assert!(ran > 0);
    assert!(
        failures.is_empty(),
        "{} of {ran} cells failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_denied_any_one_command_answers_no_error_after_it_wrote_and_hands_out_no_unseeded_fence(
) {
    matrix("acquire").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_denied_any_one_command_keeps_the_lease_or_reports_the_release() {
    matrix("release").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_release_denied_any_one_command_keeps_the_lease_or_reports_the_release() {
    matrix("release_keyed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_denied_any_one_command_leaves_the_lease_as_it_was() {
    matrix("renew").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_denied_any_one_command_leaves_the_lease_as_it_was() {
    matrix("confirm").await;
}
