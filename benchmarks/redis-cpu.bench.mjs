// redis-server CPU per acquire: the acquire script before decision 0030 (EXISTS, EXISTS, INCR,
// SET; benchmarks/baseline/acquire-before-0030.lua) against src/scripts/acquire.lua (SET NX PX,
// then INCR; a counter INCR brings to 1 is seeded from TIME), without and with fenceTtlMs.
//
//   node benchmarks/redis-cpu.bench.mjs [--n 200000] [--reps 5] [--batch 1000] [--out DIR]
//     [--callgrind]
//
// One throwaway redis-server (__test__/helpers/redis.mjs). Each measurement pipelines --n
// EVALSHA of one script from one ioredis client (--batch commands per pipeline, two pipelines
// in flight) over keys shaped like the driver's, after FLUSHALL, in three scenarios:
// - new: neither lock nor counter exists (the first lock of a key: the counter is seeded);
// - known: the counter exists (written beforehand, not measured), the lock is free;
// - held: the lock is held (the busy reply: PTTL).
// Measured: redis-server utime+stime from /proc/<pid>/stat (10 ms ticks) over the run / n,
// and Redis's own `usec` of EVALSHA in INFO commandstats / n (script execution only, no I/O).
// Scripts alternate within each repetition (the starting one rotates); medians over --reps.
// --callgrind runs a second redis-server under valgrind --tool=callgrind and counts the
// instructions redis-server executes per acquire (a count the shared machine's noise does
// not change), with --n / 20 acquires per measurement.
// Writes benchmarks/results/<date>-redis-cpu.{json,md} (or into --out).

import { execFileSync, spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { root, median, round, spread, parseInfo, commandStats, pkgVersion, gitInfo, machineInfo, commandVersion, processBusy, machineBusy, childProcesses, parseOptions, runMain } from './lib.mjs';

function parseArgs(argv) {
  const v = parseOptions(argv, {
    n: { type: 'string', default: '200000' },
    reps: { type: 'string', default: '5' },
    batch: { type: 'string', default: '1000' },
    out: { type: 'string' },
    callgrind: { type: 'boolean', default: false },
  }, { missingValue: 'undefined' });
  // An option left without its value at the end of the line gives NaN (undefined for --out), as it always has.
  return {
    n: Number(v.n),
    reps: Number(v.reps),
    batch: Number(v.batch),
    out: 'out' in v ? v.out : null,
    callgrind: v.callgrind,
  };
}
const opts = parseArgs(process.argv.slice(2));

const LEASE_MS = '10000';
const FENCE_TTL_MS = '86400000';
const TOKEN = 'f'.repeat(32);
const SCRIPTS = [
  { name: 'before-0030', file: 'benchmarks/baseline/acquire-before-0030.lua', extra: [] },
  { name: 'set-first', file: 'src/scripts/acquire.lua', extra: [] },
  { name: 'set-first+fenceTtlMs', file: 'src/scripts/acquire.lua', extra: [FENCE_TTL_MS] },
];
const SCENARIOS = ['new', 'known', 'held'];

const hex = (run, i) => `${run.toString(16).padStart(8, '0')}${i.toString(16).padStart(56, '0')}`;
const lockKey = (h) => `bench:lock:{${h}}`;
const fenceKey = (h) => `bench:lock-fence:{${h}}`;

async function client(port) {
  const { default: Redis } = await import('ioredis');
  const c = new Redis({ host: '127.0.0.1', port, lazyConnect: true, maxRetriesPerRequest: 1, enableOfflineQueue: true });
  c.on('error', () => {});
  await c.connect();
  return c;
}

/** Sends `count` commands made by `make(i)` in pipelines of opts.batch, two in flight. */
async function pipelined(c, count, make) {
  const replies = { string: 0, integer: 0, error: 0 };
  let next = 0;
  async function lane() {
    while (next < count) {
      const from = next;
      const to = Math.min(count, from + opts.batch);
      next = to;
      const p = c.pipeline();
      for (let i = from; i < to; i++) p.call(...make(i));
      for (const [err, v] of await p.exec()) {
        if (err) replies.error++;
        else if (typeof v === 'string') replies.string++;
        else replies.integer++;
      }
    }
  }
  await Promise.all([lane(), lane()]);
  return replies;
}

let runId = 0;
async function measure(c, pid, script, sha, scenario, n) {
  const run = ++runId;
  await c.flushall();
  if (scenario === 'known') await pipelined(c, n, (i) => ['set', fenceKey(hex(run, i)), '1764672000000001']);
  if (scenario === 'held') await pipelined(c, n, (i) => ['set', lockKey(hex(run, i)), 'other', 'px', LEASE_MS]);
  await c.config('resetstat');
  const cpu0 = processBusy([pid]);
  const m0 = machineBusy();
  const t0 = performance.now();
  const replies = await pipelined(c, n, (i) => {
    const h = hex(run, i);
    return ['evalsha', sha, '2', lockKey(h), fenceKey(h), TOKEN, LEASE_MS, ...script.extra];
  });
  const seconds = (performance.now() - t0) / 1000;
  const cpu = processBusy([pid]) - cpu0;
  const m1 = machineBusy();
  const stats = await c.info('commandstats');
  const usec = Number(/cmdstat_evalsha:calls=\d+,usec=(\d+)/.exec(stats)?.[1]);
  return {
    script: script.name, scenario, n, seconds: round(seconds, 3), replies,
    redisCpuUsPerAcquire: round((cpu * 1e6) / n, 3),
    evalshaUsecPerAcquire: round(usec / n, 3),
    machineBusyShare: round((m1.busy - m0.busy) / (seconds * os.cpus().length), 3),
  };
}

// ------------------------------------------------------------- callgrind ----

/** redlock's lock and unlock scripts, as the throughput benchmark's peer sends them. */
function redlockScripts() {
  const { createRequire } = process.getBuiltinModule('node:module');
  const Redlock = createRequire(import.meta.url)('redlock');
  const scripts = new Redlock([{}], { retryCount: 0 }).scripts;
  return { lockScript: scripts.lockScript.value, unlockScript: scripts.unlockScript.value };
}

/** Instructions redis-server runs per acquire, from callgrind dumps taken around each run. */
async function callgrindRuns(children, shas) {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'dokebi-callgrind-'));
  const port = 20000 + Math.floor(Math.random() * 20000);
  const child = children.add(spawn('valgrind', ['--tool=callgrind', `--callgrind-out-file=${dir}/cg.%p`, 'redis-server', '--port', String(port), '--save', '', '--appendonly', 'no', '--bind', '127.0.0.1', '--dir', dir], { stdio: 'ignore' }));
  let c;
  for (let i = 0; ; i++) {
    try { c = await client(port); await c.ping(); break; } catch { if (i > 200) throw new Error('valgrind redis-server did not start'); await sleep(100); }
  }
  const n = Math.max(1000, Math.floor(opts.n / 20));
  for (const s of SCRIPTS) await c.script('LOAD', readFileSync(path.join(root, s.file), 'utf8'));
  const dump = () => {
    execFileSync('callgrind_control', ['--dump', String(child.pid)], { stdio: 'ignore' });
    const files = readdirSync(dir).filter((f) => f.startsWith(`cg.${child.pid}.`)).sort((a, b) => Number(a.split('.').pop()) - Number(b.split('.').pop()));
    const text = readFileSync(path.join(dir, files.at(-1)), 'utf8');
    return Number(/^summary: (\d+)/m.exec(text)?.[1] ?? /^totals: (\d+)/m.exec(text)?.[1]);
  };
  const results = [];
  const measureIr = async (scenario, name, prepare, commands) => {
    await c.flushall();
    const run = ++runId;
    await prepare(run);
    dump();
    for (const make of commands) await pipelined(c, n, (i) => make(hex(run, i)));
    const ir = dump();
    results.push({ script: name, scenario, n, instructionsPerAcquire: Math.round(ir / n) });
    console.error(`callgrind ${scenario.padEnd(6)} ${name.padEnd(22)} ${Math.round(ir / n)} instructions per ${scenario === 'pair' ? 'pair' : 'acquire'}`);
  };
  for (const scenario of SCENARIOS) {
    for (const s of SCRIPTS) {
      const prepare = async (run) => {
        if (scenario === 'known') await pipelined(c, n, (i) => ['set', fenceKey(hex(run, i)), '1764672000000001']);
        if (scenario === 'held') await pipelined(c, n, (i) => ['set', lockKey(hex(run, i)), 'other', 'px', LEASE_MS]);
      };
      await measureIr(scenario, s.name, prepare, [(h) => ['evalsha', shas[s.name], '2', lockKey(h), fenceKey(h), TOKEN, LEASE_MS, ...s.extra]]);
    }
  }
  // Target 3 of issue 12 compares a whole acquire + release on a new key with redlock's.
  const release = await c.script('LOAD', readFileSync(path.join(root, 'src/scripts/release.lua'), 'utf8'));
  const none = async () => {};
  for (const s of SCRIPTS.filter((x) => !x.extra.length)) {
    await measureIr('pair', `${s.name} + release`, none, [
      (h) => ['evalsha', shas[s.name], '2', lockKey(h), fenceKey(h), TOKEN, LEASE_MS],
      (h) => ['evalsha', release, '1', lockKey(h), TOKEN, 'bench:lock-released', h],
    ]);
  }
  const { lockScript, unlockScript } = redlockScripts();
  const [lock, unlock] = [await c.script('LOAD', lockScript), await c.script('LOAD', unlockScript)];
  await measureIr('pair', `redlock ${pkgVersion('redlock')}`, none, [
    (h) => ['evalsha', lock, '1', `bench:${h}`, TOKEN, LEASE_MS],
    (h) => ['evalsha', unlock, '1', `bench:${h}`, TOKEN],
  ]);
  c.disconnect();
  child.kill('SIGTERM');
  await new Promise((r) => child.once('exit', r));
  rmSync(dir, { recursive: true, force: true });
  return { n, results };
}

// ------------------------------------------------------------------ main ----

const children = childProcesses();

async function main() {
  const { startRedis } = await import('../__test__/helpers/redis.mjs');
  const server = await startRedis();
  const c = await client(server.port);
  const shas = {};
  for (const s of SCRIPTS) shas[s.name] = await c.script('LOAD', readFileSync(path.join(root, s.file), 'utf8'));
  const serverInfo = parseInfo(await c.info('server'));
  const commandLine = ['node', path.relative(root, fileURLToPath(import.meta.url)), ...process.argv.slice(2)].join(' ');
  console.error(`redis-server ${serverInfo.redis_version} pid ${server.pid}; n ${opts.n} × ${opts.reps} reps`);

  // One unmeasured round so that allocator and dict sizes settle.
  for (const s of SCRIPTS) await measure(c, server.pid, s, shas[s.name], 'new', Math.min(opts.n, 20_000));
  const runs = [];
  for (let rep = 1; rep <= opts.reps; rep++) {
    for (const scenario of SCENARIOS) {
      const order = SCRIPTS.map((_, i) => SCRIPTS[(i + rep) % SCRIPTS.length]);
      for (const s of order) {
        const r = await measure(c, server.pid, s, shas[s.name], scenario, opts.n);
        runs.push({ rep, ...r });
        console.error(`rep ${rep} ${scenario.padEnd(6)} ${s.name.padEnd(22)} redis ${r.redisCpuUsPerAcquire.toFixed(2)} µs/acquire  evalsha usec ${r.evalshaUsecPerAcquire.toFixed(2)}  machine ${Math.round(100 * r.machineBusyShare)}%  replies ${JSON.stringify(r.replies)}`);
      }
    }
  }
  c.disconnect();
  await server.stop();

  const summary = [];
  for (const scenario of SCENARIOS) {
    const base = runs.filter((r) => r.scenario === scenario && r.script === 'before-0030');
    for (const s of SCRIPTS) {
      const rs = runs.filter((r) => r.scenario === scenario && r.script === s.name);
      const cpu = median(rs.map((r) => r.redisCpuUsPerAcquire));
      const usec = median(rs.map((r) => r.evalshaUsecPerAcquire));
      // Ratio per repetition (same rep, back to back), then the median of those ratios.
      const ratio = median(rs.map((r) => r.redisCpuUsPerAcquire / base.find((b) => b.rep === r.rep).redisCpuUsPerAcquire));
      summary.push({
        scenario, script: s.name, redisCpuUsPerAcquire: round(cpu, 2), min: round(Math.min(...rs.map((r) => r.redisCpuUsPerAcquire)), 2),
        max: round(Math.max(...rs.map((r) => r.redisCpuUsPerAcquire)), 2), spread: round(spread(rs.map((r) => r.redisCpuUsPerAcquire)), 3),
        vsBefore: round(ratio, 3), evalshaUsecPerAcquire: round(usec, 2),
      });
    }
  }
  const callgrind = opts.callgrind ? await callgrindRuns(children, shas) : null;

  const date = new Date().toISOString().slice(0, 10);
  const outDir = opts.out ? path.resolve(opts.out) : path.join(root, 'benchmarks', 'results');
  mkdirSync(outDir, { recursive: true });
  const meta = {
    command: commandLine, date: new Date().toISOString(), machine: machineInfo(), loadAverageAfter: os.loadavg(),
    versions: { node: process.version, redisServer: serverInfo.redis_version, ioredis: pkgVersion('ioredis'), valgrind: opts.callgrind ? commandVersion('valgrind') : undefined },
    git: gitInfo(), options: { ...opts, leaseMs: Number(LEASE_MS), fenceTtlMs: Number(FENCE_TTL_MS) },
    method: {
      redisCpuUsPerAcquire: 'redis-server utime+stime (/proc/<pid>/stat, 10 ms ticks) over the pipelined run / n (includes reading, parsing and replying)',
      evalshaUsecPerAcquire: 'INFO commandstats usec of evalsha / n: time inside the script call, by Redis’s own clock',
      vsBefore: 'median over repetitions of (this script / before-0030) measured back to back in the same repetition',
      callgrind: 'redis-server under valgrind --tool=callgrind: instructions between two callgrind_control --dump calls around the run / n',
    },
  };
  writeFileSync(path.join(outDir, `${date}-redis-cpu.json`), JSON.stringify({ ...meta, summary, callgrind, runs }, null, 2) + '\n');
  const lines = [
    `# redis-server CPU per acquire (${date})`, '',
    `\`${commandLine}\` — Redis ${serverInfo.redis_version}, Node ${process.version}, ${meta.machine.cpu} × ${meta.machine.cores} (shared), ${opts.n} pipelined EVALSHA per measurement, ${opts.reps} repetitions, medians.`, '',
    '| scenario | script | redis-server CPU µs/acquire (median, min–max) | vs before-0030 | EVALSHA usec/acquire |' + (callgrind ? ' instructions/acquire (callgrind) |' : ''),
    '|---|---|---:|---:|---:|' + (callgrind ? '---:|' : ''),
    ...summary.map((s) => {
      const ir = callgrind?.results.find((r) => r.scenario === s.scenario && r.script === s.script)?.instructionsPerAcquire;
      return `| ${s.scenario} | ${s.script} | ${s.redisCpuUsPerAcquire} (${s.min}–${s.max}) | ${s.vsBefore}× | ${s.evalshaUsecPerAcquire} |` + (callgrind ? ` ${ir} |` : '');
    }),
    '',
    ...(callgrind ? [
      `Acquire + release of a new key (callgrind, ${callgrind.n} pairs; redlock: its lock and unlock scripts):`, '',
      '| pair | instructions/pair | vs redlock |', '|---|---:|---:|',
      ...(() => {
        const pairs = callgrind.results.filter((r) => r.scenario === 'pair');
        const redlock = pairs.find((r) => r.script.startsWith('redlock')).instructionsPerAcquire;
        return pairs.map((r) => `| ${r.script} | ${r.instructionsPerAcquire} | ${round(r.instructionsPerAcquire / redlock, 3)}× |`);
      })(),
      '',
    ] : []),
  ];
  writeFileSync(path.join(outDir, `${date}-redis-cpu.md`), lines.join('\n'));
  console.log(lines.join('\n'));
}

runMain(main, children);
