// How late lease renewals come while the JS thread is busy (issue 24, item 2): this driver's
// `lease.keepAlive({ maxHoldMs, everyMs })`, which renews on the addon's tokio threads, against
// redlock 5's `using()` (redlock 5.0.0-beta.2, the devDependency `redlock5`; redlock 4.2 has no
// `using()`), whose automatic extension is a JS timer.
//
//   node benchmarks/renewal-lateness.bench.mjs [--lease-ms 3000] [--every-ms ⌊leaseMs/3⌋]
//     [--busy 50,200,1000,2500] [--jitter 0.5] [--seed 1] [--round-seconds 6] [--reps 3] [--out DIR]
//     [--quick]
//
// One process, one throwaway redis-server (__test__/helpers/redis.mjs, never the machine's
// Redis), rounds alternating between the two libraries (their order flipped every other
// repetition). A round takes a fresh key, starts renewals (keepAlive with maxHoldMs past the
// round's end; using() with automaticExtensionThreshold = leaseMs − drift − everyMs, so that
// both schedule a renewal everyMs after the previous one was sent), then blocks the JS thread
// in busy-wait chunks of B ms ± jitter × B (uniform, seeded: both libraries meet the same chunk
// lengths in a repetition), yielding one turn of the event loop between chunks, for
// --round-seconds; then it ends the observation and releases.
//
// Measured on Redis's side, not with JS timestamps (which the busy loop would distort), by an
// observer child process (this file with --observer) on two connections of its own:
//   - MONITOR: Redis's own timestamp of every write of the key's expiry by a script (the
//     acquire's SET … PX, keepAlive's PEXPIRE, redlock's extend SET … PX). A renewal's
//     lateness is its gap to the previous write minus everyMs (both libraries schedule the
//     next renewal everyMs after the previous one's submission); the remaining TTL a renewal
//     found is the previous write + leaseMs − its time; the round's last segment runs to the
//     end of observation.
//   - a poller, every 5 ms once the acquire was seen: PTTL of the key (the smallest seen) and a
//     competitor's `SET key <own token> NX PX leaseMs`, which takes the key the moment it
//     expired (the lease is then lost), pipelined with TIME.
// The first renewal's gap counts from the acquire's write (keepAlive counts from its call,
// redlock from before the acquire was sent: both within a millisecond of it here).
//
// Writes benchmarks/results/<date>-renewal-lateness.{json,md}; --quick (busy 200,2500, 4 s
// rounds, 1 repetition) writes to a temporary directory unless --out is given. Needs a
// release build (npm run build).

import { fork } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  childProcesses, commandVersion, cpuWindow, gitInfo, machineInfo, nextMessage, parseOptions, percentile, pkgVersion, root, round, runMain, runStart,
} from './lib.mjs';

const SELF = fileURLToPath(import.meta.url);
const LIBRARIES = ['dokebi-keepAlive', 'redlock5-using'];
const NAMESPACE = 'renewal-bench';
const POLL_MS = 5;
const DRIFT_FACTOR = 0.01; // redlock's default

function parseArgs(argv) {
  const usage = 'node benchmarks/renewal-lateness.bench.mjs [--lease-ms 3000] [--every-ms N] [--busy 50,200,1000,2500] [--jitter 0.5] [--seed 1] [--round-seconds 6] [--reps 3] [--out DIR] [--quick]';
  const v = parseOptions(argv, {
    'lease-ms': { type: 'string', default: '3000' },
    'every-ms': { type: 'string' },
    busy: { type: 'string' },
    'round-seconds': { type: 'string' },
    jitter: { type: 'string', default: '0.5' },
    seed: { type: 'string', default: '1' },
    reps: { type: 'string' },
    out: { type: 'string' },
    quick: { type: 'boolean', default: false },
    help: { type: 'boolean', short: 'h' },
  }, { help() { console.log(usage); process.exit(0); } });
  const quick = v.quick;
  const leaseMs = Number(v['lease-ms']);
  const opts = {
    leaseMs,
    everyMs: v['every-ms'] === undefined ? Math.floor(leaseMs / 3) : Number(v['every-ms']),
    busy: (v.busy ?? (quick ? '200,2500' : '50,200,1000,2500')).split(',').map(Number),
    roundSeconds: Number(v['round-seconds'] ?? (quick ? 4 : 6)),
    reps: Number(v.reps ?? (quick ? 1 : 3)),
    jitter: Number(v.jitter),
    seed: Number(v.seed),
    out: v.out === undefined ? null : path.resolve(v.out),
    quick,
  };
  if (!Number.isInteger(opts.leaseMs) || opts.leaseMs < 200) throw new Error('--lease-ms: an integer >= 200');
  if (!Number.isInteger(opts.everyMs) || opts.everyMs < 1 || opts.everyMs >= opts.leaseMs) throw new Error('--every-ms: an integer, 1 <= everyMs < leaseMs');
  if (redlockThreshold(opts) > opts.leaseMs - 100 || redlockThreshold(opts) < 0) throw new Error('redlock needs leaseMs − drift − everyMs between 0 and leaseMs − 100');
  if (!opts.busy.every((b) => Number.isInteger(b) && b >= 1)) throw new Error('--busy takes integers >= 1 (ms)');
  if (!(opts.jitter >= 0 && opts.jitter < 1)) throw new Error('--jitter: 0 <= j < 1');
  if (!Number.isInteger(opts.seed)) throw new Error('--seed: an integer');
  if (!(opts.roundSeconds > 0 && opts.roundSeconds <= 60)) throw new Error('--round-seconds: 0 < s <= 60');
  if (!Number.isInteger(opts.reps) || opts.reps < 1 || opts.reps > 10) throw new Error('--reps: an integer, 1 .. 10');
  return opts;
}

/** redlock's drift for a lock of `leaseMs` (its own formula) and the threshold that makes it extend everyMs after the previous extend began. */
const redlockDrift = (leaseMs) => Math.round(DRIFT_FACTOR * leaseMs) + 2;
const redlockThreshold = ({ leaseMs, everyMs }) => leaseMs - redlockDrift(leaseMs) - everyMs;

// ------------------------------------------------------------------ RESP ----

function encode(args) {
  const parts = [Buffer.from(`*${args.length}\r\n`)];
  for (const a of args) {
    const b = Buffer.from(String(a));
    parts.push(Buffer.from(`$${b.length}\r\n`), b, Buffer.from('\r\n'));
  }
  return Buffer.concat(parts);
}

// ---------------------------------------------------------------- observer ----

// The child: MONITOR on one connection, the poller on another. Times are Redis's, in ms since
// the observer started (its first TIME), so that doubles keep microseconds.
async function observer() {
  const { parseReply } = await import('../__test__/helpers/redis.mjs');
  const port = Number(process.argv[3]);
  const send = (m) => new Promise((resolve) => process.send(m, resolve));
  const connect = () => new Promise((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1');
    s.once('connect', () => resolve(s));
    s.once('error', reject);
  });

  // Poller: pipelined calls, replies in order.
  const poll = await connect();
  let pbuf = Buffer.alloc(0);
  const waiting = [];
  poll.on('data', (chunk) => {
    pbuf = Buffer.concat([pbuf, chunk]);
    for (let r; (r = parseReply(pbuf));) {
      pbuf = pbuf.subarray(r[1]);
      waiting.shift()(r[0]);
    }
  });
  const call = (...cmds) => Promise.all(cmds.map((c) => new Promise((resolve) => { waiting.push(resolve); poll.write(encode(c)); })));
  const [[baseSec]] = await call(['TIME']);
  const ms = (sec, usec) => (Number(sec) - Number(baseSec)) * 1000 + Number(usec) / 1000;

  // MONITOR lines: `+<sec>.<usec> [<db> lua] "<cmd>" "<key>" …`; a script's write of the key's expiry.
  const mon = await connect();
  let text = '';
  let round = null;
  let markerSeen = null;
  const WRITE = /^\+(\d+)\.(\d+) \[\d+ lua\] "(set|pexpire)" "([^"]*)"/i;
  mon.on('data', (chunk) => {
    text += chunk.toString('latin1');
    let i;
    while ((i = text.indexOf('\r\n')) !== -1) {
      const line = text.slice(0, i);
      text = text.slice(i + 2);
      if (!round) continue;
      const m = WRITE.exec(line);
      if (m && m[4] === round.redisKey) {
        round.writes.push(ms(m[1], m[2]));
        if (!round.armed) { round.armed = true; pollLoop(round); }
      } else if (markerSeen && line.includes(` "${round.marker}"`)) {
        round.markerAt = ms(...line.slice(1, line.indexOf(' ')).split('.'));
        markerSeen();
      }
    }
  });
  await new Promise((resolve, reject) => {
    mon.once('error', reject);
    mon.write(encode(['MONITOR']));
    const onData = (d) => { if (d.toString().startsWith('+OK')) { mon.off('data', onData); resolve(); } };
    mon.on('data', onData);
  });

  async function pollLoop(r) {
    const token = randomBytes(16).toString('hex');
    while (!r.stopped) {
      const [pttl, set, time] = await call(['PTTL', r.redisKey], ['SET', r.redisKey, token, 'NX', 'PX', String(r.leaseMs)], ['TIME']);
      if (r.stopped) break;
      const at = ms(...time);
      r.samples++;
      if (pttl >= 0) r.minPttl = Math.min(r.minPttl, pttl);
      if (pttl === -2 && r.missingAt === null) r.missingAt = at;
      if (set === 'OK' && r.takenAt === null) r.takenAt = at;
      await sleep(POLL_MS);
    }
  }

  process.on('message', async (m) => {
    try {
      if (m.type === 'watch') {
        round = { redisKey: m.redisKey, leaseMs: m.leaseMs, marker: `end-${randomBytes(6).toString('hex')}`, writes: [], armed: false, stopped: false, samples: 0, minPttl: Infinity, missingAt: null, takenAt: null, markerAt: null };
        await send({ type: 'watching' });
      } else if (m.type === 'end') {
        round.stopped = true;
        // Every MONITOR line before the marker's has been read once the marker's arrives.
        const seen = new Promise((resolve) => { markerSeen = resolve; });
        await call(['ECHO', round.marker]);
        await seen;
        markerSeen = null;
        const r = round;
        round = null;
        await send({
          type: 'round',
          writes: r.writes, markerAt: r.markerAt, samples: r.samples,
          minPttl: Number.isFinite(r.minPttl) ? r.minPttl : null, missingAt: r.missingAt, takenAt: r.takenAt,
        });
      } else if (m.type === 'quit') {
        poll.destroy();
        mon.destroy();
        process.exit(0);
      }
    } catch (err) {
      await send({ type: 'error', message: String(err?.stack ?? err) });
    }
  });
  await send({ type: 'ready' });
}

// ------------------------------------------------------------------ rounds ----

/** A seeded PRNG in [0, 1) (mulberry32), so that both libraries meet the same chunk lengths in a repetition. */
function prng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * Blocks the JS thread for `totalMs` in busy-wait chunks of `chunkMs` ± jitter × chunkMs
 * (uniform, from `random`), one turn of the event loop (timers, I/O, setImmediate) between
 * chunks. Jitter keeps a timer from locking onto the chunks' phase (with fixed chunks every
 * renewal would be late by the same ⌈everyMs / B⌉ × B − everyMs).
 */
async function busy(totalMs, chunkMs, jitter, random) {
  const end = performance.now() + totalMs;
  const lengths = [];
  while (performance.now() < end) {
    const length = chunkMs * (1 - jitter + 2 * jitter * random());
    const stop = performance.now() + length;
    while (performance.now() < stop) { /* spin */ }
    lengths.push(round(length, 1));
    await new Promise((resolve) => setImmediate(resolve));
  }
  return lengths;
}

const sha256Of = (file) => { try { return createHash('sha256').update(readFileSync(file)).digest('hex'); } catch { return null; } };

const lockKeyOf = (key) => `${NAMESPACE}:lock:{${createHash('sha256').update(key, 'utf8').digest('hex')}}`;

async function round_(ctx, library, busyMs, label, seed, roundMs = ctx.opts.roundSeconds * 1000) {
  const random = prng(seed);
  const { obs, opts, driver, redlock, server } = ctx;
  const key = `${label}-${randomBytes(4).toString('hex')}`;
  const redisKey = library === 'dokebi-keepAlive' ? lockKeyOf(key) : key;
  obs.send({ type: 'watch', redisKey, leaseMs: opts.leaseMs });
  await nextMessage(obs, 'watching', 5000);
  const cpu = cpuWindow([process.pid, obs.pid], server.pid);
  const endObservation = async () => {
    obs.send({ type: 'end' });
    return nextMessage(obs, 'round', 10_000);
  };
  let seen;
  let chunks;
  let verdict;
  if (library === 'dokebi-keepAlive') {
    const lease = await driver.acquire(key, { waitTimeoutMs: 0 });
    const signal = lease.signal; // made before the busy loop, read after it
    lease.keepAlive({ maxHoldMs: roundMs + 10 * opts.leaseMs, everyMs: opts.everyMs });
    chunks = await busy(roundMs, busyMs, ctx.opts.jitter, random);
    seen = await endObservation();
    const aborted = signal.aborted;
    const reason = aborted ? signal.reason?.code ?? String(signal.reason) : null;
    const released = await lease.release().catch((err) => `rejected ${err.code}`);
    verdict = { signalAborted: aborted, abortReason: reason, released };
  } else {
    let aborted = false;
    let reason = null;
    let releaseError = null;
    await redlock.using([key], opts.leaseMs, { automaticExtensionThreshold: redlockThreshold(opts) }, async (signal) => {
      chunks = await busy(roundMs, busyMs, ctx.opts.jitter, random);
      seen = await endObservation();
      aborted = signal.aborted;
      reason = aborted ? signal.error?.message ?? 'aborted' : null;
    }).catch((err) => { releaseError = err?.message ?? String(err); });
    verdict = { signalAborted: aborted, abortReason: reason, released: releaseError ? `rejected: ${releaseError}` : true };
  }
  const load = cpu.end();
  return { library, busyMs, seed, chunks: chunks.length, longestChunkMs: Math.max(...chunks), ...analyse(seen, opts), verdict, cpu: load };
}

function analyse(seen, { leaseMs, everyMs }) {
  const w = seen.writes;
  const lateness = [];
  // Segments between writes of the key's expiry, and the last one to the end of observation:
  // a lease not renewed within leaseMs ran out there.
  const segments = [];
  for (let i = 1; i < w.length; i++) {
    segments.push(w[i] - w[i - 1]);
    lateness.push(w[i] - w[i - 1] - everyMs);
  }
  if (w.length) segments.push(seen.markerAt - w.at(-1));
  const minRemaining = Math.min(...segments.map((g) => leaseMs - g));
  const start = w[0] ?? 0;
  return {
    renewals: Math.max(0, w.length - 1),
    observedMs: w.length ? round(seen.markerAt - start, 1) : null,
    latenessMs: lateness.map((x) => round(x, 3)),
    minRemainingTtlMs: w.length ? round(Math.max(0, minRemaining), 1) : null,
    expiredAtRedis: segments.some((g) => g > leaseMs),
    expiredForMs: round(segments.reduce((sum, g) => sum + Math.max(0, g - leaseMs), 0), 1),
    pttlSamples: seen.samples,
    minPttlSampledMs: seen.minPttl,
    keyMissingSeenAfterMs: seen.missingAt === null ? null : round(seen.missingAt - start, 1),
    takenByCompetitorAfterMs: seen.takenAt === null ? null : round(seen.takenAt - start, 1),
  };
}

function summarise(rounds, opts) {
  const out = [];
  for (const busyMs of opts.busy) {
    const row = { busyMs };
    for (const library of LIBRARIES) {
      const rs = rounds.filter((r) => r.library === library && r.busyMs === busyMs);
      const late = rs.flatMap((r) => r.latenessMs).sort((a, b) => a - b);
      row[library] = {
        rounds: rs.length,
        renewals: rs.reduce((s, r) => s + r.renewals, 0),
        renewalsPerRound: rs.map((r) => r.renewals),
        latenessMs: { p50: round(percentile(late, 50), 1), p99: round(percentile(late, 99), 1), max: round(late.at(-1) ?? null, 1) },
        minRemainingTtlMs: round(Math.min(...rs.map((r) => r.minRemainingTtlMs ?? 0)), 1),
        minPttlSampledMs: rs.some((r) => r.minPttlSampledMs !== null) ? Math.min(...rs.filter((r) => r.minPttlSampledMs !== null).map((r) => r.minPttlSampledMs)) : null,
        roundsExpiredAtRedis: rs.filter((r) => r.expiredAtRedis).length,
        expiredForMs: round(rs.reduce((sum, r) => sum + r.expiredForMs, 0), 1),
        roundsTakenByCompetitor: rs.filter((r) => r.takenByCompetitorAfterMs !== null).length,
        roundsSignalAborted: rs.filter((r) => r.verdict.signalAborted).length,
      };
    }
    const d = row['dokebi-keepAlive'].latenessMs;
    const r = row['redlock5-using'].latenessMs;
    const ratio = (a, b) => (a > 0 && b !== null ? round(b / a, 1) : null);
    row.redlockOverDokebi = { p50: ratio(d.p50, r.p50), p99: ratio(d.p99, r.p99), max: ratio(d.max, r.max) };
    out.push(row);
  }
  // keepAlive's lateness should not depend on B: pooled over every B too (more renewals, so a p99 that is not just the max).
  const pooled = {};
  for (const library of LIBRARIES) {
    const late = rounds.filter((r) => r.library === library).flatMap((r) => r.latenessMs).sort((a, b) => a - b);
    pooled[library] = { renewals: late.length, latenessMs: { p50: round(percentile(late, 50), 1), p99: round(percentile(late, 99), 1), max: round(late.at(-1) ?? null, 1) } };
  }
  return { byBusy: out, pooledOverBusy: pooled };
}

// -------------------------------------------------------------------- main ----

async function main(children) {
  const opts = parseArgs(process.argv.slice(2));
  const start = runStart(import.meta.url);
  const { startRedis } = await import('../__test__/helpers/redis.mjs');
  const require = createRequire(import.meta.url);
  const { createRedisLockDriver } = require(path.join(root, 'index.js'));
  const Redis = require('ioredis');
  const Redlock = require('redlock5').default;

  const server = await startRedis();
  let client;
  let driver;
  try {
    const redisVersion = /redis_version:(\S+)/.exec(await server.command('INFO', 'server'))?.[1];
    const obs = children.add(fork(SELF, ['--observer', String(server.port)], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] }));
    await nextMessage(obs, 'ready', 10_000);
    driver = createRedisLockDriver(server.url, { driver: 'redis', connection: 'main', namespace: NAMESPACE, leaseMs: opts.leaseMs });
    client = new Redis(server.port, '127.0.0.1', { lazyConnect: false });
    // retryCount 0: the acquire takes a fresh key, an extend here fails only on a lock that is
    // already expired (which redlock does not retry), and a release of a lost lock fails at once.
    const redlock = new Redlock([client], { retryCount: 0 });
    const ctx = { obs, opts, driver, redlock, server };
    console.error(`redis-server ${redisVersion}; leaseMs ${opts.leaseMs}, everyMs ${opts.everyMs} (redlock automaticExtensionThreshold ${redlockThreshold(opts)}, drift ${redlockDrift(opts.leaseMs)}); busy chunks ${opts.busy.join(', ')} ms; ${opts.roundSeconds} s rounds × ${opts.reps} repetitions`);

    // Warm-up (not counted): loads both libraries' scripts, renewals included, with an idle loop.
    for (const library of LIBRARIES) await round_(ctx, library, 1, `warmup-${library}`, 0, opts.everyMs + 300);

    const rounds = [];
    for (let rep = 1; rep <= opts.reps; rep++) {
      const order = rep % 2 ? LIBRARIES : [...LIBRARIES].reverse();
      for (const busyMs of opts.busy) {
        for (const library of order) {
          const r = await round_(ctx, library, busyMs, `${library}-b${busyMs}-r${rep}`, opts.seed + rep * 100_003 + busyMs);
          rounds.push({ rep, ...r });
          const late = [...r.latenessMs].sort((a, b) => a - b);
          console.error(`rep ${rep} busy ${String(busyMs).padStart(4)} ms ${library.padEnd(16)} renewals ${String(r.renewals).padStart(2)}  lateness p50 ${round(percentile(late, 50), 1)} max ${round(late.at(-1) ?? null, 1)} ms  min TTL left ${r.minRemainingTtlMs} ms (PTTL ${r.minPttlSampledMs})  expired ${r.expiredAtRedis} taken ${r.takenByCompetitorAfterMs ?? '-'}  signal ${r.verdict.abortReason ?? '-'}  other cpu ${r.cpu.otherCpuShare}`);
          await sleep(100);
        }
      }
    }
    obs.send({ type: 'quit' });

    const summary = summarise(rounds, opts);
    const full = !opts.quick && !opts.out;
    const outDir = opts.out ?? (opts.quick ? mkdtempSync(path.join(os.tmpdir(), 'dokebi-renewal-')) : path.join(root, 'benchmarks', 'results'));
    mkdirSync(outDir, { recursive: true });
    const result = {
      benchmark: 'renewal-lateness',
      date: start.date, startedAt: start.startedAt.toISOString(), finishedAt: new Date().toISOString(),
      command: start.commandLine,
      machine: { ...machineInfo(), loadAverageBefore: start.loadBefore.map((x) => round(x, 2)), loadAverageAfter: os.loadavg().map((x) => round(x, 2)) },
      versions: {
        node: process.version, redisServer: redisVersion, redisServerBinary: commandVersion('redis-server'),
        '@dokebi/lock-redis': JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8')).version,
        redlock: pkgVersion('redlock5'), ioredis: pkgVersion('ioredis'),
      },
      addon: { ...start.addon, sha256Full: sha256Of(path.join(root, start.addon.file)) }, git: gitInfo(),
      setup: {
        leaseMs: opts.leaseMs, everyMs: opts.everyMs, busyChunksMs: opts.busy, chunkJitter: opts.jitter, seed: opts.seed, roundSeconds: opts.roundSeconds, reps: opts.reps,
        keepAlive: { everyMs: opts.everyMs, maxHoldMs: `round + ${10 * opts.leaseMs}` },
        redlock: { version: pkgVersion('redlock5'), automaticExtensionThreshold: redlockThreshold(opts), driftFactor: DRIFT_FACTOR, drift: redlockDrift(opts.leaseMs), retryCount: 0, clients: 1 },
        observer: { pollMs: POLL_MS, how: 'MONITOR timestamps of the key\'s expiry writes by scripts; PTTL + competing SET NX PX every 5 ms from a child process' },
        order: 'per repetition, for each busy value, both libraries in turn; the libraries\' order flipped every other repetition; one warm-up round each, not counted',
      },
      summary, rounds,
    };
    const base = path.join(outDir, `${full ? `${start.date}-` : ''}renewal-lateness`);
    writeFileSync(`${base}.json`, `${JSON.stringify(result, null, 2)}\n`);
    writeFileSync(`${base}.md`, markdown(result));
    console.error(`\n${markdown(result)}\nwritten: ${path.relative(root, base)}.json, .md`);
  } finally {
    await client?.quit().catch(() => {});
    await driver?.shutdown().catch(() => {});
    children.killAll();
    await server.stop();
  }
}

function markdown(r) {
  const s = r.setup;
  const cell = (x) => (x === null || x === undefined ? '–' : x);
  const lines = [
    `# Renewal lateness under a busy event loop (${r.date})`, '',
    `\`${r.command}\` — ${r.machine.cores} cores (${r.machine.cpu}), load average before ${r.machine.loadAverageBefore.join(' ')}, after ${r.machine.loadAverageAfter.join(' ')}; Node ${r.versions.node}, redis-server ${r.versions.redisServer}, ${r.addon.build} addon ${r.addon.sha256}, git ${r.git.head?.slice(0, 7)}; redlock ${r.versions.redlock} with ioredis ${r.versions.ioredis}.`, '',
    `leaseMs ${s.leaseMs}, a renewal every ${s.everyMs} ms: \`lease.keepAlive({ everyMs: ${s.everyMs} })\` against redlock's \`using()\` with automaticExtensionThreshold ${s.redlock.automaticExtensionThreshold} (leaseMs − its drift ${s.redlock.drift} − ${s.everyMs}, so that it too extends ${s.everyMs} ms after the previous extend began). Each round blocks the JS thread for ${s.roundSeconds} s in busy-wait chunks of B ms ± ${s.chunkJitter * 100} % (uniform, the same seeded lengths for both libraries) with one event-loop turn between them; ${s.reps} rounds per library and B, alternating. Times are Redis's: MONITOR timestamps of the key's expiry writes, and PTTL plus a competing \`SET NX\` every ${s.observer.pollMs} ms from a separate process.`, '',
    'Lateness: a renewal\'s gap to the previous write minus everyMs (pooled over the rounds). Min TTL left: the least remaining time-to-live a renewal found, or that the key had at the end of observation (0: it expired; "expired for": how long the key was gone, summed over the rounds). Lost: rounds where the key expired at Redis / was taken by the competing process / the library\'s signal was aborted.', '',
    '| B (ms) | library | renewals | lateness p50 (ms) | p99 | max | min TTL left (ms) | min PTTL sampled | lost: expired / taken / signal |',
    '|---:|---|---:|---:|---:|---:|---:|---:|---|',
  ];
  for (const row of r.summary.byBusy) {
    for (const lib of LIBRARIES) {
      const x = row[lib];
      lines.push(`| ${row.busyMs} | ${lib} | ${x.renewals} | ${cell(x.latenessMs.p50)} | ${cell(x.latenessMs.p99)} | ${cell(x.latenessMs.max)} | ${x.minRemainingTtlMs}${x.expiredForMs ? ` (expired for ${x.expiredForMs})` : ''} | ${cell(x.minPttlSampledMs)} | ${x.roundsExpiredAtRedis} / ${x.roundsTakenByCompetitor} / ${x.roundsSignalAborted} of ${x.rounds} |`);
    }
  }
  for (const lib of LIBRARIES) {
    const x = r.summary.pooledOverBusy[lib];
    lines.push(`| all | ${lib} | ${x.renewals} | ${cell(x.latenessMs.p50)} | ${cell(x.latenessMs.p99)} | ${cell(x.latenessMs.max)} | | | |`);
  }
  lines.push('', 'Ratios within the run (same B, same chunk lengths):', '', '| B (ms) | redlock p50 / dokebi p50 | p99 / p99 | max / max |', '|---:|---:|---:|---:|');
  for (const row of r.summary.byBusy) lines.push(`| ${row.busyMs} | ${cell(row.redlockOverDokebi.p50)} | ${cell(row.redlockOverDokebi.p99)} | ${cell(row.redlockOverDokebi.max)} |`);
  lines.push('');
  return lines.join('\n');
}

if (process.argv[2] === '--observer') {
  observer().catch((err) => { console.error(err); process.exit(1); });
} else {
  const children = childProcesses();
  runMain(() => main(children), children);
}
