// Contention benchmark of @dokebi/lock-redis against redlock and redis-semaphore.
//
//   node benchmarks/lock-contention.bench.mjs [--seconds N] [--reps N] [--shapes 4x8,16x4] [--only a,b]
//     [--variants 'name:ENV=V,...;...'] [--tag NAME] [--hold atomics|timer] [--out DIR]
//     [--max-other-cpu 0.15] [--retries 5] [--quiet-wait 180] [--resume]
// --resume goes on from benchmarks/results/lock-contention.partial.json (written after every
// accepted run, removed at the end) when it was made with the same settings and addon.
// The machine may be shared: before each run it waits (up to --quiet-wait s) until other
// processes use under half of --max-other-cpu of it, and a run during which they used more
// than --max-other-cpu is discarded (recorded under `discardedRuns`) and repeated.
//
// For each shape P×W (default 4 × 8 and 16 × 4: processes × concurrent waiters each) and
// each configuration, the processes contend for ONE key on ONE throwaway redis-server (never
// the machine's Redis); each waiter loops acquire → hold 2 ms → release for --seconds of
// wall time after a start barrier. Repeated --reps times (shapes and configurations
// interleaved within each repetition), medians per metric. `--variants` adds dokebi
// configurations with environment variables, for A/B in the same run. By default the
// configurations are dokebi-after, dokebi-perkey, js-driver (benchmarks/baseline/js-driver.mjs:
// the same protocol from JS, listed but not a peer), redlock-default, redlock-retry10 and
// semaphore-default (`--only` picks any, dokebi-before and semaphore-retry1 included). Writes
// benchmarks/results/<date>-lock-contention[-tag].json and .md, prints the tables and
// PASS/FAIL per part of issue 17's contention targets, judged on dokebi-after (and each
// variant) against the best peer with its defaults and, separately, against every peer run.
// See the worker for the hold and the clock. Needs a release build (npm run build) and the
// dev dependencies.

import { fork } from 'node:child_process';
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';

import {
  addonInfo, childProcesses, commandStats, gitInfo, here, machineBusy, median, parseInfo, percentile, pkgVersion, parseOptions, parseShape, processBusy, root, round,
  runMain,
  nextMessage,
} from './lib.mjs';

const now = () => performance.timeOrigin + performance.now();

// ------------------------------------------------------------------ options ----

function parseArgs(argv) {
  const v = parseOptions(argv, {
    seconds: { type: 'string', default: '10' },
    reps: { type: 'string', default: '3' },
    only: { type: 'string' },
    hold: { type: 'string', default: 'atomics' },
    out: { type: 'string' },
    'max-other-cpu': { type: 'string', default: '0.15' },
    retries: { type: 'string', default: '5' },
    'quiet-wait': { type: 'string', default: '180' },
    resume: { type: 'boolean' },
    shapes: { type: 'string', default: '4x8,16x4' },
    variants: { type: 'string' },
    tag: { type: 'string' },
    help: { type: 'boolean', short: 'h' },
  }, {
    help() {
      console.log('node benchmarks/lock-contention.bench.mjs [--seconds N=10] [--reps N=3] [--only name,name] [--shapes 4x8,16x4] [--variants \'name:ENV=V,...;...\'] [--tag NAME] [--hold atomics|timer] [--out DIR=benchmarks/results] [--max-other-cpu 0.15] [--retries 5] [--quiet-wait 180] [--resume]');
      process.exit(0);
    },
  });
  const opts = {
    seconds: Number(v.seconds),
    reps: Number(v.reps),
    only: v.only === undefined ? null : v.only.split(',').map((s) => s.trim()).filter(Boolean),
    hold: v.hold,
    out: v.out === undefined ? null : path.resolve(v.out),
    maxOtherCpu: Number(v['max-other-cpu']),
    retries: Number(v.retries),
    quietWaitMs: Number(v['quiet-wait']) * 1000,
  };
  if (v.resume) opts.resume = true;
  // processes × waiters per process, all on one key.
  opts.shapes = v.shapes.split(',').map((x) => x.trim()).filter(Boolean).map((name) => parseShape(name, '--shapes'));
  // A/B in one run: extra dokebi configurations `dokebi-<name>` with environment variables,
  // e.g. --variants 'hs0:DOKEBI_LOCK_REDIS_HEAD_START_US=0;hs600:DOKEBI_LOCK_REDIS_HEAD_START_US=600'.
  opts.variants = (v.variants ?? '').split(';').map((x) => x.trim()).filter(Boolean).map((spec) => {
    const [name, vars = ''] = spec.split(':');
    const env = Object.fromEntries(vars.split(',').filter(Boolean).map((kv) => kv.split('=')));
    return { name: `dokebi-${name}`, library: 'dokebi', env, inner: DOKEBI_INNER, note: `this driver with ${vars || 'no changes'} (A/B variant)` };
  });
  opts.tag = v.tag;
  if (!(opts.seconds > 0)) throw new Error('--seconds must be > 0');
  if (!Number.isInteger(opts.reps) || opts.reps < 1) throw new Error('--reps must be an integer >= 1');
  if (!['atomics', 'timer'].includes(opts.hold)) throw new Error('--hold must be atomics or timer');
  return opts;
}

const HOLD_MS = 2;
const LEASE_MS = 10_000;
const WAIT_MS = 30_000;

// `inner`: commands the library only ever runs inside its Lua scripts. Redis 7.0 counts
// those in total_commands_processed and INFO commandstats like any other command, so
// "client commands" (requests sent over the wire: round trips) = every command but these
// (and the benchmark's own INFO/CONFIG/PUBSUB).
const DOKEBI_INNER = ['set', 'pttl', 'exists', 'time', 'incr', 'get', 'del', 'publish', 'pexpire'];
const CONFIGS = [
  { name: 'dokebi-after', library: 'dokebi', env: {}, inner: DOKEBI_INNER,
    note: 'this driver, release notifications on (defaults: notifyPollIntervalMs 250)' },
  { name: 'dokebi-perkey', library: 'dokebi', env: {}, notifications: 'per-key', inner: DOKEBI_INNER,
    note: 'this driver with notifications: \'per-key\' (a channel per key; the listener count is per key)' },
  { name: 'dokebi-before', library: 'dokebi', env: { DOKEBI_LOCK_REDIS_NOTIFICATIONS: '0' }, inner: DOKEBI_INNER,
    note: 'this driver, DOKEBI_LOCK_REDIS_NOTIFICATIONS=0: polling only (pollIntervalMs 25)' },
  { name: 'js-driver', library: 'js-driver', inner: DOKEBI_INNER,
    note: 'the same protocol from JS, not a peer for the verdicts: benchmarks/baseline/js-driver.mjs on ioredis (the same keys, scripts and release notification, a FIFO line per key in each process, notifyPollIntervalMs 250; no head start between processes)' },
  { name: 'redlock-default', library: 'redlock', peer: {}, inner: ['exists', 'set', 'get', 'del', 'pexpire'],
    note: 'redlock, retryDelay 200, retryJitter 100 (defaults), retryCount 150' },
  { name: 'redlock-retry10', library: 'redlock', peer: { retryDelay: 10, retryJitter: 5 }, inner: ['exists', 'set', 'get', 'del', 'pexpire'],
    note: 'redlock, retryDelay 10, retryJitter 5 (the default 2:1 delay:jitter ratio; jitter 100 would make half the retries immediate), retryCount 3000' },
  { name: 'semaphore-default', library: 'semaphore', peer: {}, inner: ['get', 'del', 'pexpire'],
    note: 'redis-semaphore Mutex, retryInterval 10 (default), acquireTimeout 30000' },
  { name: 'semaphore-retry1', library: 'semaphore', peer: { retryInterval: 1 }, inner: ['get', 'del', 'pexpire'],
    note: 'redis-semaphore Mutex, retryInterval 1, acquireTimeout 30000' },
];
const ADMIN = (cmd) => cmd === 'info' || cmd.startsWith('config') || cmd.startsWith('pubsub');

// ------------------------------------------------------------------ helpers ----

// INFO's fields and its commandstats calls.
const infoOf = (text) => ({ fields: parseInfo(text), commands: commandStats(text) });
const sortNum = (a) => a.sort((x, y) => x - y);

// ---------------------------------------------------------------- one run ----

// Waits until the machine is quiet: 3 consecutive 1 s windows in which processes other
// than ours used less than `share` of it. Gives up after `maxMs` (the run is then judged
// by its own CPU accounting).
async function waitForQuiet(ours, share, maxMs) {
  const until = Date.now() + maxMs;
  let quiet = 0;
  while (quiet < 3 && Date.now() < until) {
    const m0 = machineBusy().busy, o0 = processBusy(ours);
    await sleep(1000);
    const other = (machineBusy().busy - m0 - (processBusy(ours) - o0)) / os.cpus().length;
    quiet = other < share ? quiet + 1 : 0;
  }
  return quiet >= 3;
}

const children = childProcesses();

async function runOne(server, cfg, rep, opts, shape) {
  await server.command('FLUSHALL');
  const key = `contention:${shape.name}:${cfg.name}:${rep}`;
  const env = { ...process.env, ...cfg.env };
  if (!cfg.env?.DOKEBI_LOCK_REDIS_NOTIFICATIONS) delete env.DOKEBI_LOCK_REDIS_NOTIFICATIONS;
  delete env.REDIS_URL;

  const procs = [];
  for (let p = 0; p < shape.processes; p++) {
    const child = fork(path.join(here, 'lock-contention.worker.mjs'), [], { env, stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
    children.add(child);
    procs.push(child);
  }
  const exited = procs.map((c) => new Promise((r) => (c.exitCode !== null ? r() : c.once('exit', r))));
  try {
    const ready = procs.map((c) => nextMessage(c, 'ready', 30_000));
    procs.forEach((c, proc) => c.send({
      type: 'init', library: cfg.library, peer: cfg.peer ?? {}, notifications: cfg.notifications, url: server.url, key, proc,
      waiters: shape.waiters, holdMs: HOLD_MS, holdMode: opts.hold, leaseMs: LEASE_MS, waitMs: WAIT_MS,
    }));
    await Promise.all(ready);

    await server.command('CONFIG', 'RESETSTAT');
    const before = infoOf(await server.command('INFO', 'stats', 'commandstats'));
    const startAt = now() + 150;
    const endAt = startAt + opts.seconds * 1000;
    const results = procs.map((c) => nextMessage(c, 'result', opts.seconds * 1000 + 30_000));
    const ours = [process.pid, server.pid, ...procs.map((c) => c.pid)];
    const cpu0 = { machine: machineBusy(), ours: processBusy(ours) };
    for (const c of procs) c.send({ type: 'go', startAt, endAt });

    // Who listens for releases, a second in (dokebi-after: one subscription per process).
    await sleep(Math.max(0, startAt + Math.min(1000, opts.seconds * 500) - now()));
    const numsub = await server.command('PUBSUB', 'NUMSUB', 'bench:lock-released');
    const connected = infoOf(await server.command('INFO', 'clients')).fields.connected_clients;

    await sleep(Math.max(0, endAt - now()));
    const sampledAt = now();
    const after = infoOf(await server.command('INFO', 'stats', 'commandstats'));
    const cpu1 = { machine: machineBusy(), ours: processBusy(ours) };
    const span = (sampledAt - startAt + 150) / 1000;
    const cores = os.cpus().length;
    const cpu = {
      ourCpuShare: round((cpu1.ours - cpu0.ours) / (span * cores), 3),
      otherCpuShare: round(Math.max(0, (cpu1.machine.busy - cpu0.machine.busy) - (cpu1.ours - cpu0.ours)) / (span * cores), 3),
      stealShare: round((cpu1.machine.steal - cpu0.machine.steal) / (span * cores), 3),
    };
    const outs = await Promise.all(results);
    await Promise.race([Promise.all(exited), sleep(5000)]);
    return summarize(cfg, shape, { startAt, endAt, sampledAt, before, after, outs, numsub: Number(numsub[1]), connected: Number(connected), cpu });
  } finally {
    for (const c of procs) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  }
}

// ----------------------------------------------------------------- metrics ----

function summarize(cfg, shape, run) {
  const { startAt, endAt, outs } = run;
  const windowMs = endAt - startAt;
  const all = [];
  const perProcess = [];
  const perWaiter = [];
  const failures = {};
  const clientCommandsSeen = {};
  let pendingOldest = null;
  for (const out of outs) {
    let n = 0;
    const waiterCounts = new Array(shape.waiters).fill(0);
    for (const [w, t0, t1, t2, t3] of out.records) {
      all.push({ proc: out.proc, w, t0, t1, t2, t3 });
      if (t1 >= startAt && t1 < endAt) { n++; waiterCounts[w]++; }
    }
    perProcess[out.proc] = n;
    perWaiter.push(...waiterCounts);
    for (const [k, v] of Object.entries(out.failures)) failures[k] = (failures[k] ?? 0) + v;
    for (const [k, v] of Object.entries(out.clientCommands)) clientCommandsSeen[k] = (clientCommandsSeen[k] ?? 0) + v;
    for (const t of out.pending) if (t !== null) pendingOldest = pendingOldest === null ? t : Math.min(pendingOldest, t);
  }
  all.sort((a, b) => a.t1 - b.t1);
  const inWindow = all.filter((r) => r.t1 >= startAt && r.t1 < endAt);
  const acquisitions = inWindow.length;

  let held = 0;
  for (const r of all) held += Math.max(0, Math.min(r.t2, endAt) - Math.max(r.t1, startAt));

  // Hand-offs: each acquisition against the one before it, all processes merged by time.
  const gaps = [];
  // The same gap where the next holder is another waiter than the previous holder (issue 12,
  // target 6): a waiter that re-acquires right after its own release hands nothing off.
  const gapsOtherWaiter = [];
  const gapsOtherProcess = [];
  const releaseRtt = []; // previous holder: release called → release resolved
  const afterRelease = []; // release resolved → next acquire resolved
  let sameProcess = 0;
  let sameWaiter = 0;
  let overlaps = 0;
  for (let i = 1; i < all.length; i++) {
    const prev = all[i - 1];
    const cur = all[i];
    if (cur.t1 < startAt || cur.t1 >= endAt) continue;
    const gap = cur.t1 - prev.t2;
    if (gap < 0) overlaps++;
    gaps.push(gap);
    if (Number.isFinite(prev.t3)) {
      releaseRtt.push(prev.t3 - prev.t2);
      afterRelease.push(cur.t1 - prev.t3);
    }
    if (cur.proc === prev.proc) sameProcess++;
    else gapsOtherProcess.push(gap);
    if (cur.proc === prev.proc && cur.w === prev.w) sameWaiter++;
    else gapsOtherWaiter.push(gap);
  }
  sortNum(gaps); sortNum(gapsOtherWaiter); sortNum(gapsOtherProcess); sortNum(releaseRtt); sortNum(afterRelease);
  const waits = sortNum(inWindow.map((r) => r.t1 - r.t0));
  const holds = sortNum(inWindow.map((r) => r.t2 - r.t1));

  // Gap histogram, to see whether hand-offs ride notifications or safety-interval sleeps.
  const edges = [0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500, Infinity];
  const gapHistogram = {};
  for (const e of edges) gapHistogram[e === Infinity ? '>500' : `<=${e}`] = 0;
  for (const g of gaps) {
    const e = edges.find((x) => g <= x);
    gapHistogram[e === Infinity ? '>500' : `<=${e}`]++;
  }

  // Redis side. total_commands_processed counts the commands run inside Lua scripts too.
  const commandDelta = {};
  for (const [k, v] of Object.entries(run.after.commands)) {
    const d = v - (run.before.commands[k] ?? 0);
    if (d > 0) commandDelta[k] = d;
  }
  const adminCalls = Object.entries(commandDelta).filter(([k]) => ADMIN(k)).reduce((s, [, v]) => s + v, 0);
  const totalDelta = Number(run.after.fields.total_commands_processed) - Number(run.before.fields.total_commands_processed);
  const serverCommands = totalDelta - adminCalls;
  const clientCommands = Object.entries(commandDelta)
    .filter(([k]) => !ADMIN(k) && !cfg.inner.includes(k))
    .reduce((s, [, v]) => s + v, 0);
  const perAcq = (x) => (acquisitions ? x / acquisitions : null);
  const d = (k) => commandDelta[k] ?? 0;
  // Acquire attempts (Redis round trips that try to take the lock), from the scripts' bodies.
  const attempts = cfg.library === 'dokebi' || cfg.library === 'js-driver' ? d('pttl') + d('incr') // busy → PTTL, acquired → INCR
    : cfg.library === 'redlock' ? d('exists') // lockScript starts with EXISTS
      : d('set'); // redis-semaphore: a top-level SET NX PX per attempt
  const commandsPerAcquisition = {};
  for (const [k, v] of Object.entries(commandDelta).sort((a, b) => b[1] - a[1])) {
    if (ADMIN(k)) continue;
    commandsPerAcquisition[cfg.inner.includes(k) ? `${k} (in script)` : k] = round(perAcq(v), 3);
  }
  const clientSeen = Object.values(clientCommandsSeen).reduce((s, v) => s + v, 0);
  // dokebi only, from driver.stats() when the build has it: per process, window deltas.
  const driverStats = outs.every((o) => o.driverStats) ? outs.map((o) => ({ proc: o.proc, ...o.driverStats })) : null;
  const sumStats = (k) => driverStats?.reduce((s, x) => s + x[k], 0);

  const minProc = Math.min(...perProcess);
  const maxProc = Math.max(...perProcess);
  return {
    acquisitions,
    acquisitionsPerSec: round(acquisitions / (windowMs / 1000), 1),
    utilization: round(held / windowMs, 4),
    holdMs: { p50: round(percentile(holds, 50)), p99: round(percentile(holds, 99)) },
    handoffGapMs: {
      p50: round(percentile(gaps, 50)), p90: round(percentile(gaps, 90)), p99: round(percentile(gaps, 99)),
      max: round(gaps.at(-1) ?? null), min: round(gaps[0] ?? null),
      mean: round(gaps.length ? gaps.reduce((s, x) => s + x, 0) / gaps.length : null),
      overlaps,
    },
    handoffGapToOtherWaiterMs: {
      n: gapsOtherWaiter.length, p50: round(percentile(gapsOtherWaiter, 50)), p90: round(percentile(gapsOtherWaiter, 90)), p99: round(percentile(gapsOtherWaiter, 99)),
    },
    handoffGapToOtherProcessMs: {
      n: gapsOtherProcess.length, p50: round(percentile(gapsOtherProcess, 50)), p90: round(percentile(gapsOtherProcess, 90)), p99: round(percentile(gapsOtherProcess, 99)),
    },
    handoffBreakdownMs: {
      releaseCalledToResolved: { p50: round(percentile(releaseRtt, 50)), p99: round(percentile(releaseRtt, 99)) },
      releaseResolvedToNextAcquired: { p50: round(percentile(afterRelease, 50)), p99: round(percentile(afterRelease, 99)) },
    },
    gapHistogram,
    sameProcessHandoffs: round(gaps.length ? sameProcess / gaps.length : null, 3),
    sameWaiterHandoffs: round(gaps.length ? sameWaiter / gaps.length : null, 3),
    waitMs: { p50: round(percentile(waits, 50)), p99: round(percentile(waits, 99)), max: round(waits.at(-1) ?? null) },
    longestWaitMs: round(Math.max(waits.at(-1) ?? 0, pendingOldest === null ? 0 : endAt - pendingOldest)),
    longestWaitStillPendingAtEndMs: pendingOldest === null ? null : round(endAt - pendingOldest),
    perProcess,
    fairness: minProc === 0 ? Infinity : round(maxProc / minProc, 3),
    perWaiterMin: Math.min(...perWaiter),
    perWaiterMax: Math.max(...perWaiter),
    starvedWaiters: perWaiter.filter((n) => n === 0).length,
    cpu: run.cpu,
    failures,
    failureCount: Object.values(failures).reduce((s, v) => s + v, 0),
    redis: {
      totalCommandsProcessedDelta: totalDelta,
      benchmarkOwnCommands: adminCalls,
      serverCommands,
      serverCommandsPerAcquisition: round(perAcq(serverCommands), 3),
      clientCommands,
      clientCommandsPerAcquisition: round(perAcq(clientCommands), 3),
      clientCommandsCountedByWorkers: cfg.library === 'dokebi' ? null : clientSeen,
      attempts,
      attemptsPerAcquisition: round(perAcq(attempts), 3),
      commandsPerAcquisition,
      commandDelta,
      driverStats: driverStats && {
        perProcess: driverStats,
        redisAttemptsPerAcquisition: round(perAcq(sumStats('redisAttempts')), 3),
        notificationsReceivedPerAcquisition: round(perAcq(sumStats('notificationsReceived')), 3),
      },
      subscribersOneSecondIn: run.numsub,
      connectedClientsOneSecondIn: run.connected,
      sampleLateMs: round(run.sampledAt - endAt),
    },
  };
}

// --------------------------------------------------------------- reporting ----

const METRICS = {
  acquisitionsPerSec: (m) => m.acquisitionsPerSec,
  utilization: (m) => m.utilization,
  gapP50: (m) => m.handoffGapMs.p50,
  gapP99: (m) => m.handoffGapMs.p99,
  otherWaiterGapP50: (m) => m.handoffGapToOtherWaiterMs?.p50 ?? null,
  otherWaiterGapP99: (m) => m.handoffGapToOtherWaiterMs?.p99 ?? null,
  otherWaiterHandoffs: (m) => m.handoffGapToOtherWaiterMs?.n ?? null,
  otherProcessGapP50: (m) => m.handoffGapToOtherProcessMs?.p50 ?? null,
  otherProcessHandoffs: (m) => m.handoffGapToOtherProcessMs?.n ?? null,
  waitP50: (m) => m.waitMs.p50,
  clientCmdsPerAcq: (m) => m.redis.clientCommandsPerAcquisition,
  serverCmdsPerAcq: (m) => m.redis.serverCommandsPerAcquisition,
  attemptsPerAcq: (m) => m.redis.attemptsPerAcquisition,
  fairness: (m) => m.fairness,
  perWaiterMin: (m) => m.perWaiterMin,
  starvedWaiters: (m) => m.starvedWaiters,
  longestWaitMs: (m) => m.longestWaitMs,
  failures: (m) => m.failureCount,
  waitP99: (m) => m.waitMs.p99,
  sameProcessHandoffs: (m) => m.sameProcessHandoffs,
  sameWaiterHandoffs: (m) => m.sameWaiterHandoffs,
  releaseRttP50: (m) => m.handoffBreakdownMs.releaseCalledToResolved.p50,
  ourCpuShare: (m) => m.cpu.ourCpuShare,
  otherCpuShare: (m) => m.cpu.otherCpuShare,
};

function medians(reps) {
  const out = {};
  for (const [k, f] of Object.entries(METRICS)) out[k] = median(reps.map(f));
  // "Nobody starved" must hold in every repetition, not in the median one.
  out.starvedWaitersWorstRep = Math.max(...reps.map((m) => m.starvedWaiters));
  out.failuresTotal = reps.reduce((s, m) => s + m.failureCount, 0);
  out.fairnessReps = reps.map((m) => m.fairness);
  return out;
}

const fmt = (x, d = 2) => (x === null || x === undefined ? '–' : x === Infinity ? '∞' : Number(x).toFixed(d));

function table(rows) {
  const head = '| configuration | acq/s | utilization | hand-off gap p50 / p99 (ms) | to another waiter p50 / p99 (ms) | to another process p50 (ms) | client cmds/acq | server cmds/acq (incl. Lua) | attempts/acq | fairness proc max/min | per-waiter min | starved waiters (worst rep) | wait p50 / p99 (ms) | longest wait (ms) | same-process / same-waiter hand-offs | failures |';
  const sep = '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|';
  const lines = rows.map(({ name, med }) => `| ${name} | ${fmt(med.acquisitionsPerSec, 1)} | ${fmt(med.utilization, 3)} | ${fmt(med.gapP50, 3)} / ${fmt(med.gapP99, 2)} | ${fmt(med.otherWaiterGapP50, 3)} / ${fmt(med.otherWaiterGapP99, 2)} | ${fmt(med.otherProcessGapP50, 3)} | ${fmt(med.clientCmdsPerAcq)} | ${fmt(med.serverCmdsPerAcq)} | ${fmt(med.attemptsPerAcq)} | ${fmt(med.fairness)} | ${fmt(med.perWaiterMin, 0)} | ${fmt(med.starvedWaitersWorstRep, 0)} | ${fmt(med.waitP50, 2)} / ${fmt(med.waitP99, 1)} | ${fmt(med.longestWaitMs, 0)} | ${fmt(med.sameProcessHandoffs)} / ${fmt(med.sameWaiterHandoffs)} | ${fmt(med.failuresTotal, 0)} |`);
  return [head, sep, ...lines].join('\n');
}

// Issue 17's contention targets, judged per shape on `dokebi-after` (or the configuration
// given) from the medians of one run. "Best peer" is judged twice: among the peers with
// their defaults (redlock-default, semaphore-default: issue 12's reading), and among every
// peer run, tuned ones included.
const DEFAULT_PEERS = ['redlock-default', 'semaphore-default'];
// Measured and listed, never a peer: the same protocol from JS is what this driver is
// compared with, not what users switch from.
const NOT_PEERS = ['js-driver'];

function targets(byName, shape, subject = 'dokebi-after') {
  const after = byName[subject];
  if (!after) return [];
  const allPeers = Object.entries(byName).filter(([n]) => !n.startsWith('dokebi-') && !NOT_PEERS.includes(n));
  const defaults = allPeers.filter(([n]) => DEFAULT_PEERS.includes(n));
  const out = [];
  const others = Object.entries(byName).filter(([n]) => NOT_PEERS.includes(n));
  const listed = (metric, d, unit) => [...allPeers, ...others].map(([n, m]) => `${n}${NOT_PEERS.includes(n) ? ' (not a peer)' : ''} ${fmt(m[metric], d)}${unit}`).join(', ') || 'no peers run';
  // best: the peer with the best value of `metric` among `peers` (lower or higher is better).
  const best = (peers, metric, lower) => peers.filter(([, m]) => m[metric] !== null)
    .sort((x, y) => (lower ? x[1][metric] - y[1][metric] : y[1][metric] - x[1][metric]))[0];
  const judged = (metric, lower, pass, d, unit) => {
    const verdict = (peers) => {
      const b = best(peers, metric, lower);
      if (!b || after[metric] === null) return { result: 'N/A', text: 'no peer' };
      return { result: pass(after[metric], b[1][metric]) ? 'PASS' : 'FAIL', text: `${b[0]} ${fmt(b[1][metric], d)}${unit}, ratio ${fmt(after[metric] / b[1][metric], 3)}` };
    };
    const vd = verdict(defaults);
    const va = verdict(allPeers);
    return { result: vd.result, resultWithTuned: va.result, detail: `${fmt(after[metric], d)}${unit}; best default peer ${vd.text}; best of all peers ${va.text} (${va.result}); ${listed(metric, d, unit)}` };
  };
  const add = (target, v) => out.push({ target: `${shape.name}: ${target}`, ...v });

  const fair = after.fairness !== null && after.fairness <= 1.3 && after.starvedWaitersWorstRep === 0 ? 'PASS' : 'FAIL';
  add('fairness: per-process max/min <= 1.3 and nobody starved (every waiter acquired, every rep)', {
    result: fair, resultWithTuned: fair,
    detail: `max/min ${fmt(after.fairness, 3)} (reps ${after.fairnessReps.map((x) => fmt(x, 2)).join(', ')}), starved ${after.starvedWaitersWorstRep} (worst rep), per-waiter min ${fmt(after.perWaiterMin, 0)}; ${listed('fairness', 2, '')}`,
  });
  add('wait p99 <= 0.25x the best peer\'s', judged('waitP99', true, (a, b) => a <= 0.25 * b, 1, ' ms'));
  add('hand-off to a waiter in another process p50 <= the best peer\'s', judged('otherProcessGapP50', true, (a, b) => a <= b, 3, ' ms'));
  add('utilization >= 0.95x the best peer\'s', judged('utilization', false, (a, b) => a >= 0.95 * b, 3, ''));
  const cap = shape.processes + 1;
  const req = after.clientCmdsPerAcq !== null && after.clientCmdsPerAcq <= cap ? 'PASS' : 'FAIL';
  add(`Redis requests per acquisition <= processes + 1 (${cap})`, {
    result: req, resultWithTuned: req,
    detail: `${fmt(after.clientCmdsPerAcq, 3)} requests sent per acquisition (attempts ${fmt(after.attemptsPerAcq, 2)}; with the commands inside Lua ${fmt(after.serverCmdsPerAcq, 2)}); ${listed('clientCmdsPerAcq', 2, '')}`,
  });
  return out;
}

// --------------------------------------------------------------------- main ----

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const known = [...CONFIGS, ...opts.variants];
  const configs = opts.only ? known.filter((c) => opts.only.includes(c.name)) : [...CONFIGS.filter((c) => c.name !== 'semaphore-retry1' && c.name !== 'dokebi-before'), ...opts.variants];
  if (opts.only) {
    const unknown = opts.only.filter((n) => !known.some((c) => c.name === n));
    if (unknown.length) throw new Error(`unknown configuration(s): ${unknown.join(', ')}; known: ${known.map((c) => c.name).join(', ')}`);
  }
  // The harness wraps REDIS_URL when set; this benchmark always wants its own server.
  delete process.env.REDIS_URL;
  const { startRedis } = await import('../__test__/helpers/redis.mjs');
  const startedAt = new Date();
  const date = startedAt.toISOString().slice(0, 10);
  const commandLine = ['node', path.relative(root, fileURLToPath(import.meta.url)), ...process.argv.slice(2)].join(' ');
  const loadBefore = os.loadavg();

  const addonAtStart = addonInfo();
  const git = gitInfo();
  if (addonAtStart.build !== 'release') console.error(`WARNING: ${addonAtStart.file} is a ${addonAtStart.build ?? 'missing'} build; run npm run build (release) first`);

  // The harness already passes --save "" --appendonly no.
  const server = await startRedis();
  try {
    const serverInfo = infoOf(await server.command('INFO', 'server')).fields;
    const persistence = {
      save: (await server.command('CONFIG', 'GET', 'save'))[1],
      appendonly: (await server.command('CONFIG', 'GET', 'appendonly'))[1],
    };
    const id = (shape, cfg) => `${shape.name}/${cfg.name}`;
    const raw = {};
    for (const shape of opts.shapes) for (const c of configs) raw[id(shape, c)] = [];
    let discarded = [];
    // Every accepted run is saved at once, so a run that is interrupted (the machine may be
    // shared) can go on with --resume instead of starting over.
    const resultsDir = opts.out ?? path.join(here, 'results');
    mkdirSync(resultsDir, { recursive: true });
    const partialFile = path.join(resultsDir, 'lock-contention.partial.json');
    const settings = { seconds: opts.seconds, hold: opts.hold, shapes: opts.shapes.map((x) => x.name), configs: configs.map((c) => [c.name, c.env ?? {}]), addon: addonAtStart.sha256 };
    if (opts.resume) {
      try {
        const saved = JSON.parse(readFileSync(partialFile, 'utf8'));
        if (JSON.stringify(saved.settings) === JSON.stringify(settings)) {
          for (const [n, reps] of Object.entries(saved.raw)) raw[n] = reps.slice(0, opts.reps);
          discarded = saved.discarded ?? [];
          console.error(`resuming: ${Object.entries(raw).map(([n, r]) => `${n} ${r.length}`).join(', ')} run(s) done`);
        } else console.error(`--resume: ${partialFile} has other settings (${JSON.stringify(saved.settings)}); starting over`);
      } catch (err) {
        console.error(`--resume: nothing to resume (${err.message})`);
      }
    }
    // Shapes and configurations interleaved within each repetition, so a noisy spell of the
    // shared machine spreads over all of them.
    for (let rep = 1; rep <= opts.reps; rep++) {
      for (const shape of opts.shapes) {
        for (const cfg of configs) {
          if (raw[id(shape, cfg)].length >= rep) continue;
          const t = Date.now();
          let m;
          // The machine may be shared: wait for quiet; a run during which other processes used
          // more than --max-other-cpu of it is discarded (and recorded) and run again.
          for (let attempt = 1; ; attempt++) {
            if (!(await waitForQuiet([process.pid, server.pid], opts.maxOtherCpu / 2, opts.quietWaitMs))) {
              console.error(`rep ${rep}/${opts.reps} ${id(shape, cfg)}: the machine did not get quiet within ${opts.quietWaitMs / 1000} s; running anyway`);
            }
            m = await runOne(server, cfg, rep, opts, shape);
            if (m.cpu.otherCpuShare <= opts.maxOtherCpu) break;
            if (attempt > opts.retries) { m.contaminated = true; break; }
            console.error(`rep ${rep}/${opts.reps} ${id(shape, cfg)}: discarded, other processes used ${m.cpu.otherCpuShare} of the machine; again when quiet`);
            discarded.push({ rep, shape: shape.name, configuration: cfg.name, attempt, cpu: m.cpu, acquisitionsPerSec: m.acquisitionsPerSec, gapP50: m.handoffGapMs.p50, fairness: m.fairness });
          }
          raw[id(shape, cfg)].push(m);
          writeFileSync(partialFile, JSON.stringify({ settings, raw, discarded }, (k, v) => (v === Infinity ? 1e308 : v)));
          console.error(`rep ${rep}/${opts.reps} ${id(shape, cfg).padEnd(22)} ${String(m.acquisitionsPerSec).padStart(7)} acq/s  util ${m.utilization}  gap→proc p50 ${m.handoffGapToOtherProcessMs.p50} ms  wait p99 ${m.waitMs.p99}  client cmds/acq ${m.redis.clientCommandsPerAcquisition}  fairness ${m.fairness} ${JSON.stringify(m.perProcess)}  same-proc ${m.sameProcessHandoffs}  starved ${m.starvedWaiters}  failures ${m.failureCount}  cpu ours ${m.cpu.ourCpuShare} other ${m.cpu.otherCpuShare}  (${((Date.now() - t) / 1000).toFixed(1)} s)`);
        }
      }
    }
    const addonAtEnd = addonInfo();
    const addonChanged = addonAtEnd.sha256 !== addonAtStart.sha256;
    if (addonChanged) console.error(`WARNING: ${addonAtStart.file} changed during the run (${addonAtStart.sha256} → ${addonAtEnd.sha256}); the dokebi numbers may mix two builds`);
    const perShape = opts.shapes.map((shape) => {
      const byName = Object.fromEntries(configs.map((c) => [c.name, medians(raw[id(shape, c)])]));
      const subjects = configs.filter((c) => c.library === 'dokebi' && c.name !== 'dokebi-before').map((c) => c.name);
      return {
        shape, byName,
        rows: configs.map((c) => ({ name: c.name, med: byName[c.name] })),
        verdicts: targets(byName, shape),
        // Every dokebi variant judged the same way, for the A/B.
        variantVerdicts: Object.fromEntries(subjects.filter((n) => n !== 'dokebi-after').map((n) => [n, targets(byName, shape, n)])),
      };
    });

    const meta = {
      benchmark: 'lock-contention',
      date,
      startedAt: startedAt.toISOString(),
      finishedAt: new Date().toISOString(),
      command: commandLine,
      machine: {
        cpu: os.cpus()[0]?.model, cpus: os.cpus().length, totalMemoryBytes: os.totalmem(),
        kernel: `${os.type()} ${os.release()} ${os.version()}`, arch: os.arch(),
        loadAverageBefore: loadBefore.map((x) => round(x, 2)), loadAverageAfter: os.loadavg().map((x) => round(x, 2)),
      },
      node: process.version,
      discardedRuns: discarded,
      contaminatedRuns: Object.entries(raw).flatMap(([n, reps]) => reps.map((m, i) => (m.contaminated ? `${n} rep ${i + 1}` : null)).filter(Boolean)),
      addon: { ...addonAtStart, changedDuringRun: addonChanged, ...(addonChanged ? { atEnd: addonAtEnd } : {}) },
      git,
      redisServer: { version: serverInfo.redis_version, persistence, note: 'throwaway redis-server from __test__/helpers/redis.mjs' },
      packages: {
        '@dokebi/lock-redis': JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8')).version,
        ioredis: pkgVersion('ioredis'), redlock: pkgVersion('redlock'), 'redis-semaphore': pkgVersion('redis-semaphore'),
      },
      setup: {
        shapes: opts.shapes, keys: 1, holdMs: HOLD_MS, hold: opts.hold === 'atomics'
          ? 'Atomics.wait on a SharedArrayBuffer for 2 ms (precise; blocks the holder process\'s JS thread)'
          : 'await setTimeout(2) (2 to 3+ ms)',
        leaseMs: LEASE_MS, waitMs: WAIT_MS, seconds: opts.seconds, reps: opts.reps,
        maxOtherCpu: opts.maxOtherCpu, retries: opts.retries, quietWaitSeconds: opts.quietWaitMs / 1000,
        clock: 'performance.timeOrigin + performance.now() in every process',
        configurations: Object.fromEntries(configs.map((c) => [c.name, { note: c.note, env: c.env ?? {}, peer: c.peer ?? null }])),
        definitions: {
          utilization: 'sum of holds (acquire resolved → release called) clipped to the window / window',
          handoffGap: 'next acquire resolved − previous release called, all processes merged by time',
          handoffGapToOtherWaiter: 'the same gap, only where the next holder is another waiter (process, waiter) than the previous holder',
          handoffGapToOtherProcess: 'the same gap, only where the next holder is in another process than the previous holder',
          wait: 'acquire called → resolved, acquisitions resolved inside the window',
          clientCommands: 'INFO commandstats delta of the commands a client sends (not run inside a Lua script), per acquisition',
          serverCommands: 'INFO stats total_commands_processed delta minus the benchmark\'s own INFO/CONFIG/PUBSUB, per acquisition; Redis 7.0 counts every redis.call inside a script here too',
          attempts: 'acquire attempts (round trips trying to take the lock) per acquisition, derived from the scripts\' inner commands',
          fairness: 'max/min acquisitions per process (∞ when a process got none)',
          starvedWaiters: 'waiters with zero acquisitions in the window',
          longestWait: 'longest acquire call → resolved, including waits still pending at the end',
        },
      },
    };
    const json = (x) => JSON.stringify(x, (k, v) => (v === Infinity ? 'Infinity' : v), 2) + '\n';
    const base = path.join(resultsDir, `${date}-lock-contention${opts.tag ? `-${opts.tag}` : ''}`);
    writeFileSync(`${base}.json`, json({
      ...meta,
      shapes: Object.fromEntries(perShape.map(({ shape, byName, verdicts, variantVerdicts }) => [shape.name, {
        processes: shape.processes, waitersPerProcess: shape.waiters,
        configurations: Object.fromEntries(configs.map((c) => [c.name, { note: c.note, medians: byName[c.name], repetitions: raw[id(shape, c)] }])),
        targets: verdicts, variantTargets: variantVerdicts,
      }])),
    }));
    const verdictRows = (vs) => ['| target | result (default peers) | with tuned peers | measured |', '|---|---|---|---|', ...vs.map((v) => `| ${v.target} | ${v.result} | ${v.resultWithTuned} | ${v.detail} |`)];
    const md = [
      `# Lock contention, ${date}`,
      '',
      `\`${commandLine}\` — ${opts.shapes.map((x) => `${x.processes} processes × ${x.waiters} waiters`).join(' and ')}, one key, hold ${HOLD_MS} ms (${opts.hold}), leaseMs ${LEASE_MS}, ${opts.seconds} s × ${opts.reps} reps (shapes and configurations interleaved), medians.`,
      `Machine: ${meta.machine.cpu} × ${meta.machine.cpus}, ${(meta.machine.totalMemoryBytes / 2 ** 30).toFixed(0)} GiB, ${os.type()} ${os.release()}; Node ${process.version}; redis-server ${serverInfo.redis_version}; ` +
        Object.entries(meta.packages).map(([k, v]) => `${k} ${v}`).join(', ') + '.',
      `Addon: ${addonAtStart.build} build, sha256 ${addonAtStart.sha256}…, git ${git.head?.slice(0, 7)}${git.dirty?.length ? ` + uncommitted changes in ${git.dirty.map((l) => l.slice(3)).join(', ')}` : ''}${addonChanged ? ' — CHANGED DURING THE RUN' : ''}.`,
      '',
      ...perShape.flatMap(({ shape, rows, verdicts, variantVerdicts }) => [
        `## ${shape.processes} processes × ${shape.waiters} waiters`, '',
        table(rows), '',
        `CPU during the runs, share of all ${os.cpus().length} cores (median): ` + rows.map(({ name, med }) => `${name} ours ${fmt(med.ourCpuShare)} / other processes ${fmt(med.otherCpuShare)}`).join('; ') + '.',
        '',
        ...verdictRows(verdicts), '',
        ...Object.entries(variantVerdicts).flatMap(([n, vs]) => [`${n}, judged the same way:`, '', ...verdictRows(vs), '']),
      ]),
      'Client commands = requests sent to Redis (EVALSHA, SET, SUBSCRIBE, ...); server commands also count each redis.call inside a Lua script (Redis 7.0 total_commands_processed). Hand-off gap = next acquire resolved − previous release called, across processes; "to another waiter" keeps only hand-offs whose next holder is not the previous holder, "to another process" only those whose next holder is in another process.',
      '',
      ...configs.map((c) => `- ${c.name}: ${c.note}`),
      '',
    ].join('\n');
    writeFileSync(`${base}.md`, md);

    rmSync(partialFile, { force: true });
    for (const { shape, rows, verdicts } of perShape) {
      console.log(`\n${shape.name}`);
      console.log(table(rows));
      for (const v of verdicts) console.log(`${v.result.padEnd(4)} (${v.resultWithTuned} with tuned)  ${v.target}: ${v.detail}`);
    }
    console.log(`\nwrote ${path.relative(process.cwd(), base)}.{json,md}`);
  } finally {
    await server.stop();
  }
}

runMain(main, children);
