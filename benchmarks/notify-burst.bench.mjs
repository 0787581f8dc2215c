// Release-burst benchmark (issue 22): how long it takes, and what it costs, to hand N keys
// from one backend to another that waits on all of them at once.
//
//   node benchmarks/notify-burst.bench.mjs [--sizes 1000,5000,10000,50000] [--modes namespace,per-key]
//     [--reps 3] [--bound 60] [--setup-bound 120] [--pubsub-limit '64mb 16mb 60' | --pubsub-limit default]
//     [--command-timeout-ms MS] [--out DIR] [--tag NAME] [--render RESULTS.json]
//
// Each run is one fresh process (benchmarks/notify-burst.worker.mjs) with two backends on one
// throwaway redis-server (never the machine's Redis): A holds N distinct keys, B waits on all
// N at once (N concurrent acquire(key, { waitTimeoutMs }) that each heard "busy" once; its
// subscription confirmed: per key, all N channels, checked in CLIENT LIST), then A releases
// all N at once. Measured from the start of the release burst until every one of B's
// acquires has settled: the hand-over time, the process's CPU over that span
// (process.cpuUsage: every thread; process.threadCpuUsage: the JS thread; the difference is
// the addon's tokio threads and Node's helpers), CPU per key, redis-server's CPU, errors by
// code (A's releases, B's acquires), and what stats() counted (notifications received,
// acquire attempts). maxWaiters and maxTrackedLeases are N + 16; everything else is the
// default (commandTimeoutMs 2000, notifyPollIntervalMs 250).
//
// --command-timeout-ms sets the connection's commandTimeoutMs for both backends, in every
// size and mode alike (recorded in the JSON). It exists because the setup submits N acquires
// at once and commandTimeoutMs counts from submission: at 50,000 keys the queue alone
// outlasts 2000 ms in either mode, so the run measures the client's queue, not a hand-over.
//
// A run whose hand-over has not ended after --bound seconds is recorded with
// `timedOut: true` (and what had settled by then) and its process killed; the remaining
// repetitions of that size and mode are skipped (said so), so a slow configuration costs
// the matrix one bound, not --reps of them. Sizes and modes are interleaved within each
// repetition; medians over the repetitions that ended.
//
// The server runs with `--maxclients 10000` and `client-output-buffer-limit pubsub` set by
// --pubsub-limit (default '64mb 16mb 60'; 'default' keeps Redis's 32mb 8mb 60): a burst of
// N notifications queues about 100 bytes each for B's subscribe connection, and a client
// over the limit is disconnected (counted: INFO stats client_output_buffer_limit_disconnections
// where the server has it, and the runs' errors). Writes
// benchmarks/results/<date>-notify-burst[-tag].json and .md. Needs a release build (npm run build).

import { fork } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

import {
  childProcesses, commandVersion, gitInfo, here, machineInfo, median, packageDir, parseInfo, parseOptions,
  root, round, runMain, spread,
  nextMessage,
  runStart,
} from './lib.mjs';

function parseArgs(argv) {
  const usage = 'node benchmarks/notify-burst.bench.mjs [--sizes 1000,5000,10000,50000] [--modes namespace,per-key] [--reps 3] [--bound 60] [--setup-bound 120] [--pubsub-limit \'64mb 16mb 60\'|default] [--command-timeout-ms MS] [--out DIR] [--tag NAME] [--render RESULTS.json]';
  const v = parseOptions(argv, {
    sizes: { type: 'string', default: '1000,5000,10000,50000' },
    modes: { type: 'string', default: 'namespace,per-key' },
    reps: { type: 'string', default: '3' },
    bound: { type: 'string', default: '60' },
    'setup-bound': { type: 'string', default: '120' },
    'pubsub-limit': { type: 'string', default: '64mb 16mb 60' },
    'command-timeout-ms': { type: 'string' },
    out: { type: 'string' },
    tag: { type: 'string' },
    render: { type: 'string' },
    help: { type: 'boolean', short: 'h' },
  }, { help() { console.log(usage); process.exit(0); } });
  const list = (s) => s.split(',').map((x) => x.trim()).filter(Boolean);
  const opts = {
    sizes: list(v.sizes).map(Number),
    modes: list(v.modes),
    reps: Number(v.reps),
    boundMs: Number(v.bound) * 1000,
    setupBoundMs: Number(v['setup-bound']) * 1000,
    pubsubLimit: v['pubsub-limit'],
    commandTimeoutMs: v['command-timeout-ms'] === undefined ? null : Number(v['command-timeout-ms']),
    out: v.out === undefined ? path.join(here, 'results') : path.resolve(v.out),
    tag: v.tag,
    render: v.render === undefined ? null : path.resolve(v.render),
  };
  if (!opts.sizes.length || !opts.sizes.every((n) => Number.isInteger(n) && n >= 1)) throw new Error('--sizes: positive integers');
  if (!opts.modes.length || !opts.modes.every((m) => ['namespace', 'per-key'].includes(m))) throw new Error('--modes: namespace and/or per-key');
  if (!Number.isInteger(opts.reps) || opts.reps < 1) throw new Error('--reps must be an integer >= 1');
  if (!(opts.boundMs > 0)) throw new Error('--bound must be > 0 (seconds)');
  if (!(opts.setupBoundMs > 0)) throw new Error('--setup-bound must be > 0 (seconds)');
  if (opts.commandTimeoutMs !== null && !(Number.isInteger(opts.commandTimeoutMs) && opts.commandTimeoutMs > 0)) throw new Error('--command-timeout-ms must be a positive integer');
  if (opts.pubsubLimit !== 'default' && !/^\S+ \S+ \d+$/.test(opts.pubsubLimit)) throw new Error('--pubsub-limit: \'<hard> <soft> <seconds>\' or default');
  return opts;
}

const children = childProcesses();

/** The most channels one client of the server is subscribed to (CLIENT LIST `sub=`). */
async function mostSubscriptions(server) {
  const list = String(await server.command('CLIENT', 'LIST'));
  let most = 0;
  for (const m of list.matchAll(/ sub=(\d+)/g)) most = Math.max(most, Number(m[1]));
  return most;
}

async function runOne(server, mode, size, rep, opts) {
  await server.command('FLUSHALL');
  const info0 = parseInfo(await server.command('INFO', 'stats'));
  const env = { ...process.env };
  delete env.REDIS_URL;
  const child = children.add(fork(path.join(here, 'notify-burst.worker.mjs'), [], { env, stdio: ['ignore', 'inherit', 'inherit', 'ipc'] }));
  const exited = new Promise((r) => (child.exitCode !== null ? r() : child.once('exit', r)));
  try {
    const waiting = nextMessage(child, 'waiting', opts.setupBoundMs + 30_000);
    child.send({
      url: server.url, redisPid: server.pid, packageDir, namespace: `burst${rep}`, size,
      notifications: mode === 'namespace' ? undefined : mode, leaseMs: 600_000, commandTimeoutMs: opts.commandTimeoutMs,
      // Longer than the bound: a hand-over that takes too long is cut by the bound, not by
      // WAIT_TIMEOUT.
      waitTimeoutMs: opts.boundMs + opts.setupBoundMs + 60_000,
      boundMs: opts.boundMs, setupBoundMs: opts.setupBoundMs, settleMs: 300,
    });
    const w = await waiting;
    // B's subscriptions as Redis sees them: per key, one channel for each key. Acquires that
    // already failed during the setup (their first attempt can outlast commandTimeoutMs when
    // N are submitted at once) never subscribe: the wait also ends when the count has not
    // moved for 2 s, and the count is recorded.
    const want = mode === 'namespace' ? 1 : size;
    const until = performance.now() + opts.setupBoundMs;
    let subscribed = await mostSubscriptions(server);
    let movedAt = performance.now();
    while (subscribed < want && performance.now() < until && performance.now() - movedAt < 2000) {
      await sleep(50);
      const now = await mostSubscriptions(server);
      if (now !== subscribed) movedAt = performance.now();
      subscribed = now;
    }
    const result = nextMessage(child, 'result', opts.boundMs + 60_000);
    child.send({ type: 'release' });
    const r = await result;
    const info1 = parseInfo(await server.command('INFO', 'stats'));
    const disconnections = info1.client_output_buffer_limit_disconnections === undefined ? null
      : Number(info1.client_output_buffer_limit_disconnections) - Number(info0.client_output_buffer_limit_disconnections ?? 0);
    if (r.timedOut) child.kill('SIGKILL');
    await Promise.race([exited, sleep(15_000)]);
    return {
      mode, size, rep, timedOut: r.timedOut,
      setupMs: round(w.setupMs, 1), heldByA: w.heldByA, subscribedChannelsBeforeBurst: subscribed,
      handOverMs: round(r.handOverMs, 1), releasesDoneMs: round(r.releasesDoneMs, 1),
      keyHandedAfterMs: Object.fromEntries(Object.entries(r.keyHandedAfterMs).map(([k, x]) => [k, round(x, 1)])),
      cpuS: round(r.cpu.processUs / 1e6, 3), jsThreadCpuS: round(r.cpu.jsThreadUs / 1e6, 3),
      otherThreadsCpuS: round(r.cpu.otherThreadsUs / 1e6, 3), cpuUsPerKey: round(r.cpu.processUs / size, 1),
      redisServerCpuS: round(r.cpu.redisServerS, 2),
      releases: r.releases, acquires: r.acquires,
      errors: mergeErrors(r.releases.errors, r.acquires.errors),
      calls: r.releases.called + size,
      statsA: r.statsA, statsB: r.statsB, bSubscriptionAtEnd: r.bSubscription,
      setupErrors: { ...w.setupErrors, ...r.setupErrors }, outputBufferDisconnections: disconnections,
    };
  } finally {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  }
}

function mergeErrors(...maps) {
  const out = {};
  for (const m of maps) for (const [k, v] of Object.entries(m)) out[k] = (out[k] ?? 0) + v;
  return out;
}

const METRICS = ['handOverMs', 'cpuS', 'jsThreadCpuS', 'otherThreadsCpuS', 'cpuUsPerKey', 'redisServerCpuS'];
function summarize(row) {
  const ended = row.reps.filter((r) => !r.timedOut);
  const out = { ended: ended.length, timedOut: row.reps.length - ended.length };
  for (const k of METRICS) {
    const v = ended.map((r) => r[k]);
    out[k] = median(v);
    out[`${k}Range`] = v.length ? [Math.min(...v), Math.max(...v)] : null;
  }
  out.handOverSpread = round(spread(ended.map((r) => r.handOverMs)), 3);
  out.errorsWorstRep = row.reps.reduce((worst, r) => {
    const n = Object.values(r.errors).reduce((s, x) => s + x, 0);
    return n > worst.n ? { n, errors: r.errors, calls: r.calls } : worst;
  }, { n: 0, errors: {}, calls: row.reps[0]?.calls ?? 0 });
  return out;
}

// --------------------------------------------------------------- reporting ----

const fmt = (x, d = 0) => (x === null || x === undefined ? '–' : Number(x).toLocaleString('en-US', { minimumFractionDigits: d, maximumFractionDigits: d }));
const range = (r, d = 0) => (r ? (r[0] === r[1] ? fmt(r[0], d) : `${fmt(r[0], d)}–${fmt(r[1], d)}`) : '–');

function table(rows, opts) {
  const lines = [
    '| mode | keys | hand-over (ms), median [range] | B\'s acquires failed before the burst (worst rep) | B holds at the end (worst rep) | process CPU (s) | of it JS thread / other threads (s) | CPU per key (µs) | redis-server CPU (s) | errors, worst rep: A\'s releases / B\'s acquires | B: notifications heard / attempts (median) | runs ended / timed out |',
    '|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|',
  ];
  for (const row of rows) {
    const s = row.summary;
    const timedOut = row.reps.filter((r) => r.timedOut);
    const hand = s.ended ? `${fmt(s.handOverMs)} [${range(s.handOverMsRange)}]` : `> ${fmt(opts.boundMs)} (bound)`;
    const src = s.ended ? s : { cpuS: median(timedOut.map((r) => r.cpuS)), jsThreadCpuS: median(timedOut.map((r) => r.jsThreadCpuS)), otherThreadsCpuS: median(timedOut.map((r) => r.otherThreadsCpuS)), cpuUsPerKey: null, redisServerCpuS: median(timedOut.map((r) => r.redisServerCpuS)) };
    const worst = row.reps.reduce((w, r) => (errorCount(r) > errorCount(w) ? r : w), row.reps[0]);
    const held = Math.min(...row.reps.map((r) => r.acquires.held));
    const errs = worst ? `${errorsText(worst.releases.errors)} / ${errorsText(worst.acquires.errors)} (of ${fmt(worst.size)} each)` : '–';
    const heard = `${fmt(median(row.reps.map((r) => r.statsB.notificationsReceived)))} / ${fmt(median(row.reps.map((r) => r.statsB.redisAttempts)))}`;
    const early = Math.max(...row.reps.map((r) => r.acquires.settledBeforeBurst));
    lines.push(`| ${row.mode} | ${fmt(row.size)} | ${hand} | ${fmt(early)} | ${fmt(held)} | ${fmt(src.cpuS, 2)}${s.ended ? '' : ' (to the bound)'} | ${fmt(src.jsThreadCpuS, 2)} / ${fmt(src.otherThreadsCpuS, 2)} | ${fmt(src.cpuUsPerKey, 1)} | ${fmt(src.redisServerCpuS, 2)} | ${errs} | ${heard} | ${s.ended} / ${s.timedOut}${row.skipped ? ` (${row.skipped} skipped)` : ''} |`);
  }
  return lines;
}

const errorCount = (r) => Object.values(r.errors).reduce((s, x) => s + x, 0);
const errorsText = (e) => (Object.keys(e).length ? Object.entries(e).map(([k, v]) => `${k} ${fmt(v)}`).join(', ') : '0');

function markdown(out, opts) {
  const { results: rows, machine, redis, addon, git, command } = out;
  const disconnections = rows.flatMap((r) => r.reps.map((x) => x.outputBufferDisconnections)).filter((x) => x !== null && x !== undefined);
  return [
    `# Release burst, ${out.date}`, '',
    `\`${command}\` — one process, two backends on one throwaway redis-server: A holds N distinct keys, B waits on all N at once, A releases them all at once; ${opts.reps} reps (sizes and modes interleaved), medians of the runs that ended, each run bounded at ${opts.boundMs / 1000} s; commandTimeoutMs ${opts.commandTimeoutMs ?? 'default (2000)'} for both backends in every size and mode.`,
    `Machine: ${machine.cpu} × ${machine.cores} (shared), load average before ${machine.loadAverageBefore.join(' ')}, after ${machine.loadAverageAfter.join(' ')}; Node ${out.node}; redis-server ${redis?.version} (\`${redis?.args.join(' ')}\`; \`client-output-buffer-limit\` ${redis?.clientOutputBufferLimit}); addon ${addon.build} ${addon.sha256}, git ${git.head?.slice(0, 7)}${git.dirty?.length ? ' + uncommitted changes' : ''}.`,
    '', ...table(rows, opts), '',
    'Hand-over: from the first of A\'s release() calls until the last of B\'s acquires settled (resolved or rejected: read it with the holds and errors beside it). CPU: process.cpuUsage() over that span, JS thread by process.threadCpuUsage(), other threads = the difference (the addon\'s tokio runtime, mostly).',
    `Clients closed for their output buffer: INFO stats client_output_buffer_limit_disconnections ${disconnections.length ? disconnections.reduce((s, x) => s + x, 0) : 'not reported by this server'}; redis.log ${redis?.outputBufferClosuresLogged ?? 'not read'}.`,
    '',
  ].join('\n');
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  if (opts.render) {
    // Only the .md again, from a results JSON (after a change of this script's tables).
    const out = JSON.parse(readFileSync(opts.render, 'utf8'));
    const s = out.setup;
    const md = markdown(out, { reps: s.reps, boundMs: s.boundMs, commandTimeoutMs: typeof s.commandTimeoutMs === 'number' ? s.commandTimeoutMs : null });
    writeFileSync(opts.render.replace(/\.json$/, '.md'), md);
    console.log(md);
    return;
  }
  const { startedAt, date, commandLine, addon, loadBefore } = runStart(import.meta.url);

  const { startRedis } = await import('../__test__/helpers/redis.mjs');
  const args = ['--maxclients', '10000'];
  if (opts.pubsubLimit !== 'default') args.push('--client-output-buffer-limit', `pubsub ${opts.pubsubLimit}`);
  const server = await startRedis({ args });
  const rows = [];
  let redis;
  try {
    const info = parseInfo(await server.command('INFO', 'server'));
    const [, limits] = await server.command('CONFIG', 'GET', 'client-output-buffer-limit');
    redis = { version: info.redis_version, args, clientOutputBufferLimit: limits };
    for (const mode of opts.modes) for (const size of opts.sizes) rows.push({ mode, size, reps: [], skipped: 0 });
    for (let rep = 1; rep <= opts.reps; rep++) {
      for (const size of opts.sizes) {
        for (const mode of opts.modes) {
          const row = rows.find((r) => r.mode === mode && r.size === size);
          if (row.reps.some((r) => r.timedOut)) { row.skipped++; console.error(`rep ${rep}/${opts.reps} ${mode.padEnd(9)} N=${size}: skipped (an earlier repetition hit the bound)`); continue; }
          const r = await runOne(server, mode, size, rep, opts);
          row.reps.push(r);
          const errs = Object.entries(r.errors).map(([k, v]) => `${k} ${v}`).join(', ') || 'no errors';
          console.error(`rep ${rep}/${opts.reps} ${mode.padEnd(9)} N=${String(size).padStart(5)}: ${r.timedOut ? `TIMED OUT after ${r.handOverMs} ms` : `hand-over ${r.handOverMs} ms`}, B holds ${r.acquires.held}, CPU ${r.cpuS} s (JS ${r.jsThreadCpuS}, other ${r.otherThreadsCpuS}), ${r.cpuUsPerKey} µs/key, redis ${r.redisServerCpuS} s, ${errs}; B heard ${r.statsB.notificationsReceived} notifications, made ${r.statsB.redisAttempts} attempts; setup ${r.setupMs} ms`);
        }
      }
    }
    // Redis 7.0 has no INFO counter for it, but logs every client it closes for its output
    // buffer (a subscriber that fell too far behind the burst).
    try {
      redis.outputBufferClosuresLogged = readFileSync(path.join(server.dir, 'redis.log'), 'utf8').split('\n').filter((l) => l.includes('output buffer limits')).length;
    } catch { redis.outputBufferClosuresLogged = null; }
  } finally {
    await server.stop();
  }
  for (const row of rows) row.summary = summarize(row);

  const meta = {
    benchmark: 'notify-burst', date, startedAt: startedAt.toISOString(), finishedAt: new Date().toISOString(), command: commandLine,
    machine: { ...machineInfo(), loadAverageBefore: loadBefore.map((x) => round(x, 2)), loadAverageAfter: os.loadavg().map((x) => round(x, 2)) },
    node: process.version, redisServer: commandVersion('redis-server'), redis, addon, git: gitInfo(),
    packages: { '@dokebi/lock-redis': JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8')).version },
    setup: {
      sizes: opts.sizes, modes: opts.modes, reps: opts.reps, boundMs: opts.boundMs, setupBoundMs: opts.setupBoundMs,
      commandTimeoutMs: opts.commandTimeoutMs ?? 'default (2000)',
      driverOptions: `leaseMs 600000, maxWaiters and maxTrackedLeases N + 16, commandTimeoutMs ${opts.commandTimeoutMs ?? 'default (2000)'} (both backends, every size and mode), other options default; B waitTimeoutMs = bound + setup bound + 60 s`,
      definitions: {
        handOverMs: 'from the first of A\'s N release() calls to the moment the last of B\'s N acquires settled (resolved or rejected)',
        cpuS: 'process.cpuUsage() (user + system, every thread) over the hand-over',
        jsThreadCpuS: 'process.threadCpuUsage() over the hand-over: the main thread, which runs JS',
        otherThreadsCpuS: 'cpuS − jsThreadCpuS: the addon\'s tokio threads, libuv\'s pool and V8\'s helpers',
        cpuUsPerKey: 'cpuS / N',
        redisServerCpuS: 'redis-server utime + stime (/proc/<pid>/stat, 10 ms ticks) over the hand-over',
        errors: 'A\'s releases and B\'s acquires that rejected, by LockError code (calls = releases + acquires)',
        keyHandedAfterMs: 'per key, from the start of the burst to B\'s acquire settling: percentiles',
      },
    },
  };
  const out = { ...meta, results: rows };
  mkdirSync(opts.out, { recursive: true });
  const base = path.join(opts.out, `${date}-notify-burst${opts.tag ? `-${opts.tag}` : ''}`);
  writeFileSync(`${base}.json`, JSON.stringify(out, null, 2) + '\n');
  const md = markdown(out, opts);
  writeFileSync(`${base}.md`, md);
  console.log(md);
  console.log(`wrote ${path.relative(process.cwd(), base)}.{json,md}`);
}

runMain(main, children);
