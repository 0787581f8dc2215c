// The chaos run (benchmarks/chaos, docs/CHAOS.md) in CI: one short seeded run per mode must
// hold every invariant, and the checker must catch a deliberately broken driver, or a
// passing run would prove nothing. The long runs and their figures are in docs/CHAOS.md.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { external } from './helpers/redis.mjs';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const mutantBuild = path.join(root, 'target', 'chaos-mutants', 'lock-redis.linux-x64-gnu.node');

// Each run's limit is about five times what it takes on a busy 2-core machine (standalone
// 38 s, Sentinel 50 s, Cluster up to 70 s); the mutant is caught within 15 s.
// A run that outlives `limitMs` is killed and reported with its last log lines, which name
// the phase it hung in: the test fails instead of holding the whole suite until CI's own limit.
// The run has a process group of its own, killed whole once it ends: a client process left
// behind (one stopped by the nemesis when the run died) would keep the pipes below open and,
// with them, this test process alive.
function chaos(args, limitMs) {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'dokebi-chaos-test-'));
  const out = path.join(dir, 'summary.json');
  return new Promise((resolve, reject) => {
    // --stuck-after: the run reports where it is stuck (exit code 3) before the kill below.
    const stuckAfter = String(Math.floor(limitMs / 1000) - 10);
    const child = spawn(process.execPath, ['benchmarks/chaos/run.mjs', ...args, '--stuck-after', stuckAfter, '--out', out], {
      cwd: root, stdio: ['ignore', 'pipe', 'pipe'], detached: true,
    });
    const killGroup = () => { try { process.kill(-child.pid, 'SIGKILL'); } catch { /* all gone */ } };
    let stdout = '';
    let stderr = '';
    let timedOut = false;
    const limit = setTimeout(() => { timedOut = true; killGroup(); }, limitMs);
    child.stdout.on('data', (c) => { stdout += c; });
    child.stderr.on('data', (c) => { stderr += c; });
    child.on('error', (err) => { clearTimeout(limit); reject(err); });
    child.on('exit', (code) => {
      clearTimeout(limit);
      killGroup();
      child.stdout.destroy();
      child.stderr.destroy();
      const summary = existsSync(out) ? JSON.parse(readFileSync(out, 'utf8')) : null;
      rmSync(dir, { recursive: true, force: true });
      resolve({ code, stdout, stderr, summary, timedOut, limitMs });
    });
  });
}

// The run ended by itself, within its limit, and did not report itself stuck (exit code 3).
function assertFinished(run) {
  assert.ok(!run.timedOut && run.code !== 3, `the run was stuck${run.timedOut ? ` and killed after ${run.limitMs / 1000} s` : ''}; its last lines:\n${run.stderr.slice(-3000)}\n${run.stdout.slice(-1000)}`);
}

const totalFaults = (s) => Object.values(s.faultsByKind).reduce((a, b) => a + b, 0);

// Half the leases obey their signal (decision 0156): none of their writes may follow an
// abort, and the overrunning ones among them (their lease runs out while they hold it) skip.
function assertSignalHolders(s) {
  const judged = s.invariants['no-write-after-signal-aborted'];
  assert.equal(judged.violations, 0, 'a holder that obeys the signal wrote after it aborted');
  assert.ok(judged.checked >= 20, `only ${judged.checked} writes of obeying holders judged`);
  assert.ok(s.signal.obeying.skips.total >= 1, 'no obeying holder skipped a write');
}

test('a short seeded standalone chaos run (server killed and restarted, stops, OOM, cut, stalled and silently dropped connections, killed clients) holds every invariant', { skip: external, timeout: 200_000 }, async () => {
  const run = await chaos(['--seconds', '30', '--seed', '16001', '--mode', 'standalone'], 190_000);
  assertFinished(run);
  assert.equal(run.code, 0, `the run failed:\n${run.stdout.slice(-6000)}\n${run.stderr.slice(-2000)}`);
  const s = run.summary;
  assert.equal(s.result, 'pass');
  assert.ok(s.acquisitions.granted >= 50, `only ${s.acquisitions.granted} leases granted`);
  assert.ok(totalFaults(s) >= 10, `only ${totalFaults(s)} faults injected`);
  assert.equal(s.invariants['fences-never-go-backwards'].documented, 0, 'standalone never excuses a fence going back');
  assertSignalHolders(s);
  // Silent cuts (decision 0173): flows dropped with no FIN or RST, each given up by its driver.
  assert.ok(s.silentCuts.givenUp >= 1, `no silently dropped flow given up: ${JSON.stringify(s.silentCuts)}`);
});

test('a short seeded Sentinel chaos run with minReplicas 1 (failovers, killed and stopped primaries, lagging replicas) holds every invariant', { skip: external, timeout: 260_000 }, async () => {
  const run = await chaos(['--seconds', '40', '--seed', '16002', '--mode', 'sentinel', '--min-replicas', '1'], 250_000);
  assertFinished(run);
  assert.equal(run.code, 0, `the run failed:\n${run.stdout.slice(-6000)}\n${run.stderr.slice(-2000)}`);
  const s = run.summary;
  assert.equal(s.result, 'pass');
  assert.ok(s.switches >= 1, 'no failover happened in the run');
  assert.ok(s.acquisitions.granted >= 50, `only ${s.acquisitions.granted} leases granted`);
  assertSignalHolders(s);
});

test('a short seeded Cluster chaos run, both notification modes (masters killed and rejoining, forced and graceful failovers, a stopped master, a lock key\'s slot migrated) holds every invariant', { skip: external, timeout: 360_000 }, async () => {
  // mixed: even processes `namespace`, odd ones `per-key`, so one run covers both.
  const run = await chaos(['--seconds', '45', '--seed', '23001', '--mode', 'cluster', '--notifications', 'mixed'], 350_000);
  assertFinished(run);
  assert.equal(run.code, 0, `the run failed:\n${run.stdout.slice(-6000)}\n${run.stderr.slice(-2000)}`);
  const s = run.summary;
  assert.equal(s.result, 'pass');
  const shardFaults = ['master-kill', 'cluster-failover', 'cluster-failover-force', 'master-stop', 'slot-migrate'].reduce((n, k) => n + (s.faultsByKind[k] ?? 0), 0);
  assert.ok(shardFaults >= 3, `only ${shardFaults} topology faults injected`);
  assert.ok(s.acquisitions.granted >= 50, `only ${s.acquisitions.granted} leases granted`);
  assertSignalHolders(s);
});

test('the checker catches a driver whose release skips the owner check (mutant build), prints the seed and the history, and exits non-zero', { skip: external, timeout: 150_000 }, async () => {
  assert.ok(existsSync(mutantBuild), 'the mutant build is missing: npm run build:chaos-mutants (npm test runs it)');
  // Up to 60 s of faults, ended by the first violation the growing history shows: the
  // mutant is caught within seconds (a stale holder's release deletes the next holder's key
  // after its first overrunning lease), however slowly a busy machine gets there; the
  // verdict is the whole history's, as in any run.
  const run = await chaos(['--seconds', '60', '--seed', '16003', '--mode', 'standalone', '--mutant', 'release-without-owner-check', '--stop-at-violation'], 140_000);
  assertFinished(run);
  const s = run.summary;
  const seen = s && `granted ${s.acquisitions.granted} leases, faults ended early: ${JSON.stringify(s.stoppedAtViolation)}, `
    + `overlaps excused as wall-clock drift: ${s.overlapsWithinClockDrift} (allowance ${s.setup.clockDriftMs} ms), `
    + `violations: ${JSON.stringify(s.violationsByInvariant)}`;
  assert.equal(run.code, 1, `the mutant was not caught (${seen}):\n${run.stdout.slice(-4000)}\n${run.stderr.slice(-2000)}`);
  assert.ok(s.violationsByInvariant['no-overlapping-valid-leases'] > 0, seen);
  assert.match(run.stdout, /FAILED: seed 16003 .*mutant release-without-owner-check/);
  assert.match(run.stdout, /✗ no-overlapping-valid-leases: key chaos:key:\d: lease \S+ \(fence \d+\) granted while lease/);
  assert.match(run.stdout, /grant +op=/, 'the history excerpt is printed');
  assert.match(run.stdout, /rerun: npm run chaos -- --seconds 60 --seed 16003 .*--mutant release-without-owner-check --stop-at-violation/);
});

test('the shipped addon ignores DOKEBI_LOCK_REDIS_CHAOS_MUTANT: its release still checks the owner', { skip: external, timeout: 30_000 }, async (t) => {
  const { startRedis } = await import('./helpers/redis.mjs');
  const { createRequire } = await import('node:module');
  const { createRedisLockDriver } = createRequire(import.meta.url)('../index.js');
  const redis = await startRedis();
  t.after(() => redis.stop());
  process.env.DOKEBI_LOCK_REDIS_CHAOS_MUTANT = 'release-without-owner-check';
  t.after(() => { delete process.env.DOKEBI_LOCK_REDIS_CHAOS_MUTANT; });
  const driver = createRedisLockDriver(redis.url, { driver: 'redis', connection: 'main', namespace: 'mutant-check' });
  t.after(() => driver.shutdown());
  const lease = await driver.acquire('job');
  const [lockKey] = await redis.command('KEYS', 'mutant-check:lock:*');
  await redis.command('SET', lockKey, 'someone-else', 'PX', '10000'); // another owner took it over
  assert.equal(await lease.release(), false);
  assert.equal(await redis.command('GET', lockKey), 'someone-else');
});
