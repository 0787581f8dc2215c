// What the tracing channels (dokebi:lock-redis:acquire / :release / :renew) cost (issue 13):
// uncontended acquire → release pairs over distinct keys, in four variants of the JS wrapper:
//
//   baseline    index.js from before the channels existed (git: the parent of the commit that
//               added `tracingChannel` to index.js), same binding and addon
//   none        this index.js, nobody subscribed: the channels are skipped (hasSubscribers)
//   noop        this index.js, a subscriber with empty functions for all five events of all
//               three channels: the price of the channel machinery itself
//   histogram   this index.js, a subscriber as an APM would have one: start time per context
//               in a WeakMap, durations into perf_hooks histograms at asyncEnd, errors counted
//
// Measured per pair: CPU of the JS thread (process.threadCpuUsage: the event loop, where the
// channels run) and of the whole process (the rest is the tokio thread and libuv), pairs/s,
// pair p50. Also: the cost of the one check made without a subscriber (hasSubscribers), in
// ns, from a tight loop.
//
//   node benchmarks/tracing-channels.bench.mjs [--seconds N=5] [--reps N=3] [--inflight 1,64]
//     [--warmup S=1] [--out DIR] [--quick]
//
// One throwaway redis-server (__test__/helpers/redis.mjs), flushed before each measurement;
// each measurement in a fresh child process; within a repetition the variants run in a
// rotated order (A/B interleaved), and medians are taken over repetitions. A full run writes
// benchmarks/results/<date>-tracing-channels.{json,md}; --quick (1 s, 1 rep) writes to a
// temporary directory unless --out is given. Needs a release build (npm run build).

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
  root, median, round, spread, Samples, addonInfo, gitInfo, machineInfo, cpuWindow, childProcesses, runMain,
} from './lib.mjs';

const SELF = fileURLToPath(import.meta.url);
const VARIANTS = ['baseline', 'none', 'noop', 'histogram'];
const NAMES = ['acquire', 'release', 'renew'];
const EVENTS = ['start', 'end', 'asyncStart', 'asyncEnd', 'error'];

function parseArgs(argv) {
  const opts = { seconds: null, reps: null, inflight: [1, 64], warmup: null, out: null, quick: false };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const value = () => {
      const v = argv[++i];
      if (v === undefined) throw new Error(`${a} needs a value`);
      return v;
    };
    if (a === '--seconds') opts.seconds = Number(value());
    else if (a === '--reps') opts.reps = Number(value());
    else if (a === '--inflight') opts.inflight = value().split(',').map(Number);
    else if (a === '--warmup') opts.warmup = Number(value());
    else if (a === '--out') opts.out = path.resolve(value());
    else if (a === '--quick') opts.quick = true;
    else if (a === '--help' || a === '-h') {
      console.log('node benchmarks/tracing-channels.bench.mjs [--seconds N=5] [--reps N=3] [--inflight 1,64] [--warmup S=1] [--out DIR] [--quick]');
      process.exit(0);
    } else throw new Error(`unknown argument ${a}`);
  }
  opts.seconds ??= opts.quick ? 1 : 5;
  opts.reps ??= opts.quick ? 1 : 3;
  opts.warmup ??= opts.quick ? 0.5 : 1;
  if (!(opts.seconds > 0) || !Number.isInteger(opts.reps) || opts.reps < 1) throw new Error('--seconds > 0 and --reps >= 1 integer');
  if (!opts.inflight.every((n) => Number.isInteger(n) && n >= 1)) throw new Error('--inflight takes integers >= 1');
  return opts;
}

// ------------------------------------------------------------------- child ----

/** Subscribes the variant's subscriber; returns a function reporting what it saw. */
function subscribe(variant) {
  if (variant === 'noop') {
    let calls = 0;
    const handlers = Object.fromEntries(EVENTS.map((e) => [e, e === 'asyncEnd' ? () => { calls++; } : () => {}]));
    for (const name of NAMES) tracingChannel(`dokebi:lock-redis:${name}`).subscribe(handlers);
    return () => ({ asyncEnds: calls });
  }
  if (variant === 'histogram') {
    const started = new WeakMap();
    const histograms = Object.fromEntries(NAMES.map((n) => [n, createHistogram()]));
    const errors = {};
    for (const name of NAMES) {
      const histogram = histograms[name];
      tracingChannel(`dokebi:lock-redis:${name}`).subscribe({
        start(ctx) { started.set(ctx, process.hrtime.bigint()); },
        end() {},
        asyncStart() {},
        asyncEnd(ctx) {
          const t0 = started.get(ctx);
          if (t0 !== undefined) histogram.record(process.hrtime.bigint() - t0 || 1n);
        },
        error(ctx) { errors[ctx.error?.code] = (errors[ctx.error?.code] ?? 0) + 1; },
      });
    }
    return () => ({ asyncEnds: histograms.acquire.count + histograms.release.count, acquireP50Us: round(histograms.acquire.percentile(50) / 1000, 1), errors });
  }
  return () => null;
}

async function child(init) {
  const send = (m) => new Promise((resolve) => process.send(m, resolve));
  const dir = init.variant === 'baseline' ? init.baselineDir : root;
  const { createRedisLockDriver } = createRequire(SELF)(path.join(dir, 'index.js'));
  const seen = subscribe(init.variant);
  const driver = createRedisLockDriver(init.url, { driver: 'redis', connection: 'bench', namespace: 'tc', leaseMs: 10_000, maxWaiters: 1024 });
  const prefix = `${init.variant}:${init.inflight}:${init.rep}:`;
  await (await driver.acquire(`${prefix}first`)).release();

  const pairMs = new Samples(1 << 17);
  let seq = 0;
  let stop = false;
  let windowStart = Infinity;
  let windowEnd = Infinity;
  let done = 0;
  async function loop() {
    while (!stop) {
      const t0 = performance.now();
      const lease = await driver.acquire(prefix + seq++);
      await lease.release();
      const t1 = performance.now();
      if (t0 >= windowStart && t1 < windowEnd) {
        done++;
        pairMs.push(t1 - t0);
      }
    }
  }
  const loops = Promise.all(Array.from({ length: init.inflight }, loop));
  const failed = loops.then(() => null, (err) => err);
  await Promise.race([sleep(init.warmupS * 1000), failed]);

  await send({ type: 'window-start' });
  const process0 = process.cpuUsage();
  const thread0 = process.threadCpuUsage();
  windowStart = performance.now();
  await Promise.race([sleep(init.seconds * 1000), failed]);
  windowEnd = performance.now();
  const thread = process.threadCpuUsage(thread0);
  const whole = process.cpuUsage(process0);
  await send({ type: 'window-end' });
  stop = true;
  const err = await failed;
  if (err) throw err;
  await driver.shutdown();

  const us = (c) => c.user + c.system;
  const windowMs = windowEnd - windowStart;
  const s = pairMs.summary(4);
  return {
    pairs: done, windowMs: round(windowMs, 1), pairsPerSec: round(done / (windowMs / 1000), 1),
    pairP50Ms: s.p50, pairP99Ms: s.p99,
    jsThreadCpuPerPairUs: round(us(thread) / done, 3),
    processCpuPerPairUs: round(us(whole) / done, 3),
    otherThreadsCpuPerPairUs: round((us(whole) - us(thread)) / done, 3),
    subscriber: seen(),
  };
}

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
    const timer = setTimeout(() => { c.kill('SIGKILL'); reject(new Error(`${init.variant} did not finish in ${timeoutMs} ms`)); }, timeoutMs);
    c.on('message', (m) => {
      if (m.type === 'window-start') window = cpuWindow([process.pid, c.pid, server.pid], server.pid);
      else if (m.type === 'window-end') cpu = window?.end() ?? null;
      else if (m.type === 'result') { clearTimeout(timer); resolve({ ...m.result, otherCpuShare: cpu?.otherCpuShare, stealShare: cpu?.stealShare }); }
      else if (m.type === 'error') { clearTimeout(timer); reject(new Error(`${init.variant}: ${m.message}`)); }
    });
    c.on('exit', (code) => { clearTimeout(timer); reject(new Error(`${init.variant} exited ${code} before its result`)); });
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
    console.error(`redis-server ${redisVersion} on port ${server.port}; baseline index.js from ${baseline.rev.slice(0, 7)}; ${opts.seconds} s × ${opts.reps} rep(s)`);
    const checkNs = checkCostNs();
    console.error(`hasSubscribers with nobody subscribed: ${checkNs} ns per check`);
    for (let rep = 1; rep <= opts.reps; rep++) {
      for (const inflight of opts.inflight) {
        // Rotated each repetition so no variant always runs first (or right after another).
        const order = VARIANTS.map((_, i) => VARIANTS[(i + rep - 1 + inflight) % VARIANTS.length]);
        for (const variant of order) {
          await server.command('FLUSHALL');
          const init = { variant, inflight, rep, seconds: opts.seconds, warmupS: opts.warmup, baselineDir: baseline.dir };
          const r = await measure(children, server, init, (opts.seconds + opts.warmup) * 1000 + 60_000);
          raw.push({ variant, inflight, rep, ...r });
          console.error(`rep ${rep} ${String(inflight).padStart(3)} in flight ${variant.padEnd(9)} ${String(Math.round(r.pairsPerSec)).padStart(6)} pairs/s  JS thread ${r.jsThreadCpuPerPairUs.toFixed(2)} µs/pair  process ${r.processCpuPerPairUs.toFixed(2)} µs/pair  p50 ${r.pairP50Ms} ms  other cpu ${r.otherCpuShare} steal ${r.stealShare}`);
        }
      }
    }

    const summary = [];
    for (const inflight of opts.inflight) {
      const of = (v) => raw.filter((r) => r.inflight === inflight && r.variant === v);
      const base = median(of('baseline').map((r) => r.jsThreadCpuPerPairUs));
      const basePps = median(of('baseline').map((r) => r.pairsPerSec));
      for (const variant of VARIANTS) {
        const reps = of(variant);
        const js = reps.map((r) => r.jsThreadCpuPerPairUs);
        const pps = reps.map((r) => r.pairsPerSec);
        summary.push({
          variant, inflight,
          pairsPerSec: round(median(pps), 0), pairsPerSecSpread: round(spread(pps), 3),
          pairsPerSecVsBaselinePercent: round((median(pps) / basePps - 1) * 100, 1),
          jsThreadCpuPerPairUs: round(median(js), 2), jsThreadCpuSpread: round(spread(js), 3),
          jsThreadCpuVsBaselineUs: round(median(js) - base, 2),
          jsThreadCpuVsBaselinePercent: round((median(js) / base - 1) * 100, 1),
          processCpuPerPairUs: round(median(reps.map((r) => r.processCpuPerPairUs)), 2),
          otherThreadsCpuPerPairUs: round(median(reps.map((r) => r.otherThreadsCpuPerPairUs)), 2),
          pairP50Ms: round(median(reps.map((r) => r.pairP50Ms)), 4),
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
      note: 'A 2-core machine shared with several other builds and test runs at the time: read differences against the spread of the repetitions (otherCpuShare: CPU of other processes during each window, as a share of all cores).',
      versions: { node: process.version, redisServer: redisVersion, '@dokebi/lock-redis': JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8')).version },
      addon, git: gitInfo(), baselineIndexJsFrom: baseline.rev,
      setup: { seconds: opts.seconds, warmupS: opts.warmup, reps: opts.reps, inflight: opts.inflight, variants: VARIANTS, driverOptions: { leaseMs: 10_000, maxWaiters: 1024 } },
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
  return [
    `# Tracing channels: price per acquire+release pair (${r.date})`, '',
    `\`${r.command}\` — ${r.machine.cores} cores (${r.machine.cpu}), Node ${r.versions.node}, redis-server ${r.versions.redisServer}, ${r.addon.build} addon ${r.addon.sha256}, git ${r.git.head?.slice(0, 7)}; baseline index.js from ${r.baselineIndexJsFrom.slice(0, 7)}. ${r.setup.seconds} s × ${r.setup.reps} repetitions, medians, variants interleaved. ${r.note}`, '',
    `Without a subscriber an untraced call costs one \`hasSubscribers\` check: ${r.hasSubscribersCheckNs} ns.`, '',
    '| in flight | variant | pairs/s | vs baseline | JS thread CPU per pair (µs) | vs baseline (µs) | spread (JS CPU) | process CPU per pair (µs) | pair p50 (ms) | other CPU share |',
    '|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|',
    ...r.summary.map((s) => `| ${s.inflight} | ${s.variant} | ${s.pairsPerSec.toLocaleString('en')} | ${sign(s.pairsPerSecVsBaselinePercent)} % | ${s.jsThreadCpuPerPairUs} | ${sign(s.jsThreadCpuVsBaselineUs)} | ${s.jsThreadCpuSpread} | ${s.processCpuPerPairUs} | ${s.pairP50Ms} | ${s.otherCpuShare} |`),
    '',
  ].join('\n');
}
