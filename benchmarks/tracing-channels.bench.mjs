// What the tracing channels (dokebi:lock-redis:acquire / :release / :renew) cost (issue 13):
// uncontended acquire → release pairs over distinct keys, in four variants of the JS wrapper:
//
//   baseline    index.js from before the channels existed (git: the parent of the commit that
//               added `tracingChannel` to index.js), over the same binding and addon
//   none        this index.js, nobody subscribed: the channels are skipped (hasSubscribers)
//   noop        this index.js, a subscriber with empty functions for all five events of all
//               three channels: the price of the channel machinery itself
//   histogram   this index.js, a subscriber as an APM would have one: start time per context
//               in a WeakMap, durations into perf_hooks histograms at asyncEnd, errors counted
//
// A/B interleaved in one process: each child process loads both index.js files (they share
// the one addon) and runs short windows of the four variants in a rotated order, round after
// round (subscribing before a noop/histogram window and unsubscribing after it), so the
// shared machine's changing load hits every variant alike. A window runs `inflight` loops for
// --window seconds and then drains; CPU and pairs are counted from its start to the end of the
// drain, so no pair of one window is billed to another. The first round is a warm-up and is
// not counted. --reps child processes repeat it; medians over them.
//
// Measured per pair: CPU of the JS thread (process.threadCpuUsage: the event loop, where the
// channels run) and of the whole process (the rest is the tokio thread and libuv), pairs/s.
// Also the cost of the one check made without a subscriber (hasSubscribers), in ns, from a
// tight loop.
//
//   node benchmarks/tracing-channels.bench.mjs [--window S=0.5] [--rounds N=10] [--reps N=3]
//     [--inflight 1,64] [--out DIR] [--quick]
//
// One throwaway redis-server (__test__/helpers/redis.mjs), flushed before each child. A full
// run writes benchmarks/results/<date>-tracing-channels.{json,md}; --quick (3 rounds, 1 rep)
// writes to a temporary directory unless --out is given. Needs a release build (npm run build).

import { execFileSync, fork } from 'node:child_process';
import { tracingChannel } from 'node:diagnostics_channel';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { createHistogram } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  root, median, round, spread, addonInfo, gitInfo, machineInfo, cpuWindow, childProcesses, parseOptions, runMain,
} from './lib.mjs';

const SELF = fileURLToPath(import.meta.url);
const VARIANTS = ['baseline', 'none', 'noop', 'histogram'];
const NAMES = ['acquire', 'release', 'renew'];
const EVENTS = ['start', 'end', 'asyncStart', 'asyncEnd', 'error'];

function parseArgs(argv) {
  const v = parseOptions(argv, {
    window: { type: 'string', default: '0.5' },
    rounds: { type: 'string' }, // 10, or 3 with --quick
    reps: { type: 'string' }, // 3, or 1 with --quick
    inflight: { type: 'string', default: '1,64' },
    out: { type: 'string' },
    quick: { type: 'boolean', default: false },
    help: { type: 'boolean', short: 'h' },
  }, {
    help() {
      console.log('node benchmarks/tracing-channels.bench.mjs [--window S=0.5] [--rounds N=10] [--reps N=3] [--inflight 1,64] [--out DIR] [--quick]');
      process.exit(0);
    },
  });
  const quick = v.quick;
  const opts = {
    window: Number(v.window),
    rounds: v.rounds === undefined ? (quick ? 3 : 10) : Number(v.rounds),
    reps: v.reps === undefined ? (quick ? 1 : 3) : Number(v.reps),
    inflight: v.inflight.split(',').map(Number),
    out: v.out === undefined ? null : path.resolve(v.out),
    quick,
  };
  if (!(opts.window > 0) || !Number.isInteger(opts.reps) || opts.reps < 1 || !Number.isInteger(opts.rounds) || opts.rounds < 1) {
    throw new Error('--window > 0, --rounds and --reps integers >= 1');
  }
  if (!opts.inflight.every((n) => Number.isInteger(n) && n >= 1)) throw new Error('--inflight takes integers >= 1');
  return opts;
}

// ------------------------------------------------------------------- child ----

/** The variant's subscriber, subscribed on `on()` and unsubscribed on `off()`. */
function subscriber(variant) {
  let handlers;
  let report = () => null;
  if (variant === 'noop') {
    let calls = 0;
    const h = Object.fromEntries(EVENTS.map((e) => [e, e === 'asyncEnd' ? () => { calls++; } : () => {}]));
    handlers = Object.fromEntries(NAMES.map((n) => [n, h]));
    report = () => ({ asyncEnds: calls });
  } else if (variant === 'histogram') {
    const started = new WeakMap();
    const histograms = Object.fromEntries(NAMES.map((n) => [n, createHistogram()]));
    const errors = {};
    handlers = Object.fromEntries(NAMES.map((name) => [name, {
      start(ctx) { started.set(ctx, process.hrtime.bigint()); },
      end() {},
      asyncStart() {},
      asyncEnd(ctx) {
        const t0 = started.get(ctx);
        if (t0 !== undefined) histograms[name].record(process.hrtime.bigint() - t0 || 1n);
      },
      error(ctx) { errors[ctx.error?.code] = (errors[ctx.error?.code] ?? 0) + 1; },
    }]));
    report = () => ({ asyncEnds: histograms.acquire.count + histograms.release.count, acquireP50Us: round(histograms.acquire.percentile(50) / 1000, 1), errors });
  }
  const each = (method) => { if (handlers) for (const n of NAMES) tracingChannel(`dokebi:lock-redis:${n}`)[method](handlers[n]); };
  return { on: () => each('subscribe'), off: () => each('unsubscribe'), report };
}

/** One window: `inflight` loops of acquire → release for `seconds`, then drained. */
async function window(driver, prefix, inflight, seconds) {
  let seq = 0;
  let pairs = 0;
  let stop = false;
  async function loop() {
    while (!stop) {
      const lease = await driver.acquire(prefix + seq++);
      await lease.release();
      pairs++;
    }
  }
  const thread0 = process.threadCpuUsage();
  const process0 = process.cpuUsage();
  const t0 = performance.now();
  const loops = Promise.all(Array.from({ length: inflight }, loop));
  const timer = setTimeout(() => { stop = true; }, seconds * 1000);
  try {
    await loops;
  } finally {
    clearTimeout(timer);
    stop = true;
  }
  const us = (c) => c.user + c.system;
  return { pairs, ms: performance.now() - t0, threadUs: us(process.threadCpuUsage(thread0)), processUs: us(process.cpuUsage(process0)) };
}

async function child(init) {
  const send = (m) => new Promise((resolve) => process.send(m, resolve));
  const load = (dir) => createRequire(SELF)(path.join(dir, 'index.js')).createRedisLockDriver;
  const options = { driver: 'redis', connection: 'bench', namespace: 'tc', leaseMs: 10_000, maxWaiters: 1024 };
  const drivers = { baseline: load(init.baselineDir)(init.url, options), current: load(root)(init.url, options) };
  const subscribers = Object.fromEntries(VARIANTS.map((v) => [v, subscriber(v)]));
  const totals = Object.fromEntries(VARIANTS.map((v) => [v, { pairs: 0, ms: 0, threadUs: 0, processUs: 0, windows: [] }]));
  for (const d of Object.values(drivers)) await (await d.acquire(`first:${init.rep}:${Math.random()}`)).release();

  await send({ type: 'window-start' });
  for (let round = 0; round <= init.rounds; round++) {
    const order = VARIANTS.map((_, i) => VARIANTS[(i + round + init.rep) % VARIANTS.length]);
    for (const variant of order) {
      const driver = variant === 'baseline' ? drivers.baseline : drivers.current;
      subscribers[variant].on();
      const w = await window(driver, `${variant}:${init.inflight}:${init.rep}:${round}:`, init.inflight, init.window);
      subscribers[variant].off();
      if (round === 0) continue; // warm-up: JIT, connections, Redis's first keys
      const t = totals[variant];
      t.pairs += w.pairs; t.ms += w.ms; t.threadUs += w.threadUs; t.processUs += w.processUs;
      t.windows.push({ round, jsThreadCpuPerPairUs: round3(w.threadUs / w.pairs), pairsPerSec: Math.round(w.pairs / (w.ms / 1000)) });
    }
  }
  await send({ type: 'window-end' });
  await Promise.all(Object.values(drivers).map((d) => d.shutdown()));
  return Object.fromEntries(VARIANTS.map((v) => {
    const t = totals[v];
    return [v, {
      pairs: t.pairs, seconds: round(t.ms / 1000, 2), pairsPerSec: round(t.pairs / (t.ms / 1000), 1),
      jsThreadCpuPerPairUs: round3(t.threadUs / t.pairs),
      processCpuPerPairUs: round3(t.processUs / t.pairs),
      otherThreadsCpuPerPairUs: round3((t.processUs - t.threadUs) / t.pairs),
      subscriber: subscribers[v].report(),
      windows: t.windows,
    }];
  }));
}
const round3 = (x) => round(x, 3);

if (process.argv[2] === '--child') {
  process.once('message', (init) => {
    child(init).then(
      (result) => process.send({ type: 'result', result }, () => process.exit(0)),
      (err) => process.send({ type: 'error', message: String(err?.stack ?? err) }, () => process.exit(1)),
    );
  });
} else {
  const children = childProcesses();
  runMain(() => main(children), children);
}

// ------------------------------------------------------------------ parent ----

function measure(children, server, init, timeoutMs) {
  return new Promise((resolve, reject) => {
    const env = { ...process.env };
    delete env.DOKEBI_LOCK_REDIS_NOTIFICATIONS;
    const c = children.add(fork(SELF, ['--child'], { env, stdio: ['ignore', 'inherit', 'inherit', 'ipc'] }));
    let window = null;
    let cpu = null;
    const timer = setTimeout(() => { c.kill('SIGKILL'); reject(new Error(`rep ${init.rep} did not finish in ${timeoutMs} ms`)); }, timeoutMs);
    c.on('message', (m) => {
      if (m.type === 'window-start') window = cpuWindow([process.pid, c.pid, server.pid], server.pid);
      else if (m.type === 'window-end') cpu = window?.end() ?? null;
      else if (m.type === 'result') { clearTimeout(timer); resolve({ variants: m.result, otherCpuShare: cpu?.otherCpuShare, stealShare: cpu?.stealShare }); }
      else if (m.type === 'error') { clearTimeout(timer); reject(new Error(`rep ${init.rep}: ${m.message}`)); }
    });
    c.on('exit', (code) => { clearTimeout(timer); reject(new Error(`rep ${init.rep} exited ${code} before its result`)); });
    c.send({ ...init, url: server.url });
  });
}

/** index.js as it was before the channels, next to symlinks of this build's binding and addon. */
function baselinePackage() {
  const git = (...a) => execFileSync('git', a, { cwd: root, encoding: 'utf8' }).trim();
  const added = git('log', '--format=%H', '--reverse', '-S', 'tracingChannel', '--', 'index.js').split('\n')[0];
  if (!added) throw new Error('no commit adds tracingChannel to index.js: nothing to compare with');
  const rev = git('rev-parse', `${added}^`);
  const dir = mkdtempSync(path.join(os.tmpdir(), 'dokebi-tc-baseline-'));
  writeFileSync(path.join(dir, 'index.js'), git('show', `${rev}:index.js`) + '\n');
  for (const f of ['binding.js', 'lock-redis.linux-x64-gnu.node', 'package.json']) symlinkSync(path.join(root, f), path.join(dir, f));
  return { dir, rev };
}

/** ns per `hasSubscribers` read with nobody subscribed: the whole cost of an untraced call. */
function checkCostNs() {
  const channel = tracingChannel('dokebi:lock-redis:bench-check');
  const n = 10_000_000;
  let hits = 0;
  const runs = [];
  for (let r = 0; r < 5; r++) {
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < n; i++) if (channel.hasSubscribers) hits++;
    runs.push(Number(process.hrtime.bigint() - t0) / n);
  }
  if (hits) throw new Error('unexpected subscriber');
  return round(median(runs), 2);
}

async function main(children) {
  const opts = parseArgs(process.argv.slice(2));
  delete process.env.REDIS_URL;
  const { startRedis } = await import('../__test__/helpers/redis.mjs');
  const startedAt = new Date();
  const addon = addonInfo();
  if (addon.build !== 'release') console.error(`WARNING: ${addon.file} is a ${addon.build ?? 'missing'} build; run npm run build (release) first`);
  const baseline = baselinePackage();
  const server = await startRedis();
  const loadBefore = os.loadavg();
  const raw = [];
  try {
    const redisVersion = /redis_version:(\S+)/.exec(await server.command('INFO', 'server'))?.[1];
    console.error(`redis-server ${redisVersion} on port ${server.port}; baseline index.js from ${baseline.rev.slice(0, 7)}; ${opts.rounds} rounds of ${opts.window} s windows × ${opts.reps} process(es)`);
    const checkNs = checkCostNs();
    console.error(`hasSubscribers with nobody subscribed: ${checkNs} ns per check`);
    for (let rep = 1; rep <= opts.reps; rep++) {
      for (const inflight of opts.inflight) {
        await server.command('FLUSHALL');
        const init = { inflight, rep, window: opts.window, rounds: opts.rounds, baselineDir: baseline.dir };
        const r = await measure(children, server, init, (opts.rounds + 1) * VARIANTS.length * (opts.window + 5) * 1000 + 60_000);
        for (const variant of VARIANTS) {
          const v = r.variants[variant];
          raw.push({ variant, inflight, rep, otherCpuShare: r.otherCpuShare, stealShare: r.stealShare, ...v });
          console.error(`rep ${rep} ${String(inflight).padStart(3)} in flight ${variant.padEnd(9)} ${String(Math.round(v.pairsPerSec)).padStart(6)} pairs/s  JS thread ${v.jsThreadCpuPerPairUs.toFixed(2)} µs/pair  process ${v.processCpuPerPairUs.toFixed(2)} µs/pair  other cpu ${r.otherCpuShare} steal ${r.stealShare}`);
        }
      }
    }

    const summary = [];
    for (const inflight of opts.inflight) {
      const of = (v) => raw.filter((r) => r.inflight === inflight && r.variant === v);
      // Paired within a process (the variants alternated there): what differs between
      // processes (placement, JIT, the machine's load at the time) cancels out.
      const baseOf = (rep) => of('baseline').find((r) => r.rep === rep);
      for (const variant of VARIANTS) {
        const reps = of(variant);
        const js = reps.map((r) => r.jsThreadCpuPerPairUs);
        const pps = reps.map((r) => r.pairsPerSec);
        const pairedJs = reps.map((r) => r.jsThreadCpuPerPairUs - baseOf(r.rep).jsThreadCpuPerPairUs);
        const pairedJsPercent = reps.map((r) => (r.jsThreadCpuPerPairUs / baseOf(r.rep).jsThreadCpuPerPairUs - 1) * 100);
        const pairedPps = reps.map((r) => (r.pairsPerSec / baseOf(r.rep).pairsPerSec - 1) * 100);
        const range = (values, d) => ({ median: round(median(values), d), min: round(Math.min(...values), d), max: round(Math.max(...values), d) });
        summary.push({
          variant, inflight,
          pairsPerSec: round(median(pps), 0), pairsPerSecSpread: round(spread(pps), 3),
          pairsPerSecPairedDeltaPercent: range(pairedPps, 1),
          jsThreadCpuPerPairUs: round(median(js), 2), jsThreadCpuSpread: round(spread(js), 3),
          jsThreadCpuPairedDeltaUs: range(pairedJs, 2),
          jsThreadCpuPairedDeltaPercent: range(pairedJsPercent, 1),
          processCpuPerPairUs: round(median(reps.map((r) => r.processCpuPerPairUs)), 2),
          otherThreadsCpuPerPairUs: round(median(reps.map((r) => r.otherThreadsCpuPerPairUs)), 2),
          otherCpuShare: median(reps.map((r) => r.otherCpuShare)), stealShare: median(reps.map((r) => r.stealShare)),
        });
      }
    }

    const date = startedAt.toISOString().slice(0, 10);
    const full = !opts.quick && !opts.out;
    const outDir = opts.out ?? (opts.quick ? mkdtempSync(path.join(os.tmpdir(), 'dokebi-tc-')) : path.join(root, 'benchmarks', 'results'));
    mkdirSync(outDir, { recursive: true });
    const result = {
      benchmark: 'tracing-channels',
      date, startedAt: startedAt.toISOString(), finishedAt: new Date().toISOString(),
      command: ['node', path.relative(root, SELF), ...process.argv.slice(2)].join(' '),
      machine: { ...machineInfo(), loadAverageBefore: loadBefore.map((x) => round(x, 2)), loadAverageAfter: os.loadavg().map((x) => round(x, 2)) },
      note: 'A 2-core machine shared with several other builds and test runs at the time (otherCpuShare: CPU of other processes during each child, as a share of all cores): read differences against the paired ranges.',
      versions: { node: process.version, redisServer: redisVersion, '@dokebi/lock-redis': JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8')).version },
      addon, git: gitInfo(), baselineIndexJsFrom: baseline.rev,
      setup: { windowS: opts.window, rounds: opts.rounds, warmupRounds: 1, reps: opts.reps, inflight: opts.inflight, variants: VARIANTS, driverOptions: { leaseMs: 10_000, maxWaiters: 1024 } },
      hasSubscribersCheckNs: checkNs,
      summary, raw,
    };
    const base = path.join(outDir, `${full ? date + '-' : ''}tracing-channels`);
    writeFileSync(`${base}.json`, JSON.stringify(result, null, 2) + '\n');
    writeFileSync(`${base}.md`, markdown(result));
    console.error(`\n${markdown(result)}\nwritten: ${base}.json, ${base}.md`);
  } finally {
    await server.stop();
    rmSync(baseline.dir, { recursive: true, force: true });
  }
}

function markdown(r) {
  const sign = (x) => (x > 0 ? `+${x}` : `${x}`);
  const range = (d, f) => (d.min === d.max ? f(d.median) : `${f(d.median)} (${f(d.min)} … ${f(d.max)})`);
  return [
    `# Tracing channels: price per acquire+release pair (${r.date})`, '',
    `\`${r.command}\` — ${r.machine.cores} cores (${r.machine.cpu}), Node ${r.versions.node}, redis-server ${r.versions.redisServer}, ${r.addon.build} addon ${r.addon.sha256}, git ${r.git.head?.slice(0, 7)}; baseline index.js from ${r.baselineIndexJsFrom.slice(0, 7)}. In each of ${r.setup.reps} processes, ${r.setup.rounds} rounds (after 1 warm-up round) of ${r.setup.windowS} s windows, the four variants alternating in a rotated order. ${r.note}`, '',
    `Without a subscriber an untraced call costs one \`hasSubscribers\` check: ${r.hasSubscribersCheckNs} ns.`, '',
    'Medians over the processes; "vs baseline": the median (min … max) over the processes of the variant minus the baseline measured alongside it in the same process.',
    '',
    '| in flight | variant | pairs/s | vs baseline (%) | JS thread CPU per pair (µs) | vs baseline (µs) | vs baseline (%) | process CPU per pair (µs) | other CPU share |',
    '|---:|---|---:|---:|---:|---:|---:|---:|---:|',
    ...r.summary.map((s) => `| ${s.inflight} | ${s.variant} | ${s.pairsPerSec.toLocaleString('en')} | ${range(s.pairsPerSecPairedDeltaPercent, sign)} | ${s.jsThreadCpuPerPairUs} | ${range(s.jsThreadCpuPairedDeltaUs, sign)} | ${range(s.jsThreadCpuPairedDeltaPercent, sign)} | ${s.processCpuPerPairUs} | ${s.otherCpuShare} |`),
    '',
  ].join('\n');
}
