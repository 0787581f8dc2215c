// The floor under issue 37's two latency targets at 1 in flight: pair p50 ≤ 0.75× the
// reference build's, and ≤ 1.0× the best peer's. Two builds of this package, the best peer and
// the pair's two scripts alone, in one process against one throwaway redis-server, in
// interleaved windows at 1 in flight:
//   A, B   the public driver of each build: acquire() then lease.release(), distinct keys
//   redis-semaphore
//          its Mutex, acquire() then release(), distinct keys
//   raw    the same two scripts (src/scripts/acquire.lua, release.lua) as EVALSHA from ioredis
//          on the JS thread, awaited one after the other: no driver logic and no thread
//          crossing, the least any client that awaits Redis's reply without blocking the event
//          loop can spend on a pair through a JS client
//   socket the same two commands packed once by ioredis and written to a plain net.Socket,
//          each awaited until its reply's first bytes arrive (nothing parsed): the pair's
//          round trips and the JS thread's wake-ups alone, the floor of a design that reads
//          the socket on the JS thread's event loop with no client code at all
//   tokio  with --floor: the same packed commands written to a plain tokio socket of the
//          floor build (src/binding/floor.rs) and each reply awaited there, settled through
//          the crossing every call of this package takes (settler, dispatcher, stay-awake
//          spin): the floor of this package's design, Redis I/O on tokio, with no client code
//   tokio, JS writes
//          the same, but the JS thread writes the command and the runtime only reads the
//          reply: the floor of one thread hop per call
// Per window: the pair p50, and the JS thread's sleeps per pair (voluntary context switches of
// the main thread: each is a wake-up it waited for). Reports the median over windows of each
// and each variant's ratio to A: FLOOR when even the bare socket is above the target (no
// design that awaits Redis without blocking the event loop reaches it here), DESIGN FLOOR when
// the socket is below it but the tokio floor is not (no build whose Redis I/O runs on tokio
// reaches it), FAIL when B is above it and the tokio floor is not, or was not measured.
//
//   node benchmarks/pair-floor.mjs --a DIR --b DIR [--label-a A] [--label-b B]
//     [--floor target/bench-floor] [--windows 12] [--seconds 1] [--out DIR]
//
// --floor names the folder of `npm run build:bench-floor`. Three copies of the addon in one
// process need more of glibc's static TLS than it keeps spare, so with --floor the script runs
// itself again with GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384.
//
// DIR holds index.js, binding.js and lock-redis.linux-x64-gnu.node (a checkout or worktree
// after `npm run build`). Writes <date>-pair-floor.{json,md} to --out (default: a temporary
// directory).

import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { startRedis } from '../__test__/helpers/redis.mjs';
import { buildInfo, buildLine, commandVersion, machineInfo, median, parseOptions, round, root, runStart } from './lib.mjs';

const require = createRequire(import.meta.url);
const o = parseOptions(process.argv.slice(2), {
  a: { type: 'string' },
  b: { type: 'string' },
  'label-a': { type: 'string', default: 'A' },
  'label-b': { type: 'string', default: 'B' },
  windows: { type: 'string', default: '12' },
  seconds: { type: 'string', default: '1' },
  floor: { type: 'string' },
  out: { type: 'string' },
});
if (!o.a || !o.b) throw new Error('--a DIR and --b DIR are required');
if (o.floor && !process.env.GLIBC_TUNABLES?.includes('optional_static_tls')) {
  const env = { ...process.env, GLIBC_TUNABLES: 'glibc.rtld.optional_static_tls=16384' };
  const args = [...process.execArgv, ...process.argv.slice(1)];
  process.exit(spawnSync(process.execPath, args, { stdio: 'inherit', env }).status ?? 1);
}
const start = runStart(import.meta.url);
const windows = Number(o.windows);
const seconds = Number(o.seconds);
const TARGET = 0.75;

/** The main thread's voluntary context switches so far: the sleeps it was woken from. */
function jsSleeps() {
  const status = readFileSync(`/proc/self/task/${process.pid}/status`, 'utf8');
  return Number(/voluntary_ctxt_switches:\s+(\d+)/.exec(status)[1]);
}

const server = await startRedis();
const Redis = require('ioredis');
const redis = new Redis(server.url, { enableAutoPipelining: false });
const script = (name) => readFileSync(path.join(root, 'src', 'scripts', `${name}.lua`), 'utf8');
const acquireSha = await redis.script('LOAD', script('acquire'));
const releaseSha = await redis.script('LOAD', script('release'));

const variants = [];
for (const [label, dir] of [[o['label-a'], o.a], [o['label-b'], o.b]]) {
  const { createRedisLockDriver } = require(path.resolve(dir, 'index.js'));
  const driver = createRedisLockDriver(server.url, { driver: 'redis', connection: label, namespace: `pf-${label}`, leaseMs: 10_000 });
  variants.push({ label, dir, build: buildInfo(dir), driver, pair: async (key) => (await driver.acquire(key)).release() });
}
let serial = 0;
/** EVALSHA arguments of one pair on `key`, as the driver sends them, with a fresh token. */
function pairArgs(key) {
  const token = `${process.pid.toString(16)}${(++serial).toString(16).padStart(26, '0')}`;
  const lock = `pf:lock:{${key}}`;
  return [[acquireSha, 2, lock, `pf:lock-fence:{${key}}`, token, 10_000], [releaseSha, 1, lock, token, 'pf:lock-released', key]];
}
variants.push({
  label: 'raw',
  pair: async (key) => {
    const [acquire, release] = pairArgs(key);
    await redis.evalsha(...acquire);
    await redis.evalsha(...release);
  },
});
// The best peer at 1 in flight wherever issue 37 was measured: its acquire is a SET NX PX, its
// release a script. Options as in throughput.worker.mjs.
const peer = new Redis(server.url, { enableAutoPipelining: false });
const { Mutex } = await import('redis-semaphore');
variants.push({
  label: 'redis-semaphore',
  pair: async (key) => {
    const mutex = new Mutex(peer, `pf-sem:${key}`, { lockTimeout: 10_000, refreshInterval: 0 });
    await mutex.acquire();
    await mutex.release();
  },
});
const net = require('node:net');
const { port, hostname } = new URL(server.url);
const socket = net.connect(Number(port), hostname);
await new Promise((resolve, reject) => socket.once('connect', resolve).once('error', reject));
socket.setNoDelay(true);
let replied = null;
socket.on('data', () => replied?.());
const send = (args) => new Promise((resolve) => {
  replied = resolve;
  socket.write(new Redis.Command('evalsha', args).toWritable(socket));
});
variants.push({
  label: 'socket',
  pair: async (key) => {
    const [acquire, release] = pairArgs(key);
    await send(acquire);
    await send(release);
  },
});
if (o.floor) {
  const floor = require(path.resolve(o.floor, 'lock-redis.linux-x64-gnu.node'));
  if (!(await floor.floorConnect(Number(port)))) throw new Error('the floor build could not connect');
  const packed = (args) => Buffer.from(new Redis.Command('evalsha', args).toWritable(socket));
  for (const [label, jsWrites] of [['tokio', false], ['tokio, JS writes', true]]) {
    variants.push({
      label,
      pair: async (key) => {
        const [acquire, release] = pairArgs(key);
        if (!(await floor.floorRoundTrip(packed(acquire), jsWrites))) throw new Error('acquire failed');
        if (!(await floor.floorRoundTrip(packed(release), jsWrites))) throw new Error('release failed');
      },
    });
  }
}
for (const v of variants) Object.assign(v, { p50: [], sleeps: [] });

async function window(v, w) {
  const lat = [];
  const before = jsSleeps();
  const end = performance.now() + seconds * 1000;
  for (let i = 0; performance.now() < end; i++) {
    const t = performance.now();
    await v.pair(`w${w}:${i}`);
    lat.push(performance.now() - t);
  }
  const sleeps = (jsSleeps() - before) / lat.length;
  lat.sort((x, y) => x - y);
  if (w >= 0) {
    v.p50.push(lat[lat.length >> 1] * 1000);
    v.sleeps.push(sleeps);
  }
}

for (const v of variants) await window(v, -1); // warm-up: connections, scripts, JIT
for (let w = 0; w < windows; w++) {
  // Each window in another order, so no variant always runs right after the same one.
  const order = variants.slice(w % variants.length).concat(variants.slice(0, w % variants.length));
  for (const v of w % 2 ? order.reverse() : order) await window(v, w);
  process.stdout.write(`window ${w + 1}/${windows}\r`);
}
for (const v of variants) await v.driver?.shutdown();
redis.disconnect();
peer.disconnect();
socket.destroy();
await server.stop?.();

const [a, b, raw, best, bare, tokio] = variants;
const p50 = (v) => median(v.p50);
const rows = variants.map((v) => ({
  label: v.label, build: v.build ?? null, pairP50Us: round(p50(v), 1),
  windowsMinUs: round(Math.min(...v.p50), 1), windowsMaxUs: round(Math.max(...v.p50), 1),
  jsSleepsPerPair: round(median(v.sleeps), 2),
}));
const ratioB = p50(b) / p50(a);
const ratioRaw = p50(raw) / p50(a);
const ratioBare = p50(bare) / p50(a);
const ratioTokio = tokio ? p50(tokio) / p50(a) : null;
/** PASS, FLOOR (even the bare socket misses), DESIGN FLOOR (the tokio floor misses) or FAIL. */
const judge = (ratio) => (ratio(b) <= 1 ? 'PASS'
  : ratio(bare) > 1 ? 'FLOOR'
    : tokio && ratio(tokio) > 1 ? 'DESIGN FLOOR' : 'FAIL');
const targets = [
  { text: `c=1 pair p50 of ${b.label} ≤ ${TARGET}× ${a.label}'s`, against: a, bound: TARGET },
  { text: `c=1 pair p50 of ${b.label} ≤ 1.0× the best peer's (${best.label})`, against: best, bound: 1 },
].map((t) => {
  const ratio = (v) => p50(v) / p50(t.against) / t.bound;
  const of = (v) => round(p50(v) / p50(t.against));
  return {
    text: t.text, verdict: judge(ratio),
    ratios: { [b.label]: of(b), raw: of(raw), socket: of(bare), ...(tokio ? { tokio: of(tokio) } : {}) },
  };
});
const result = {
  benchmark: 'pair-floor', date: start.date, commandLine: start.commandLine, machine: machineInfo(),
  node: process.version, redis: commandVersion('redis-server'), windows, seconds,
  rows, ratios: { bOverA: round(ratioB), rawOverA: round(ratioRaw), socketOverA: round(ratioBare), tokioOverA: ratioTokio === null ? null : round(ratioTokio) },
  target: targets[0], targets,
};
const md = [
  `# Pair floor at 1 in flight: ${a.label} → ${b.label}`, '',
  `Builds: ${[a, b].map((v) => buildLine(v.label, v.build)).join(', ')}. ${result.machine.cpu}, ${result.machine.cores} cores; Node ${result.node}; ${result.redis}. ${windows} interleaved windows of ${seconds} s per variant, one process, one throwaway redis-server.`, '',
  `    ${start.commandLine}`, '',
  '| variant | pair p50 µs (median of windows) | windows min–max | JS-thread sleeps per pair | ÷ ' + a.label + ' |',
  '|---|---:|---:|---:|---:|',
  ...rows.map((r) => `| ${r.label} | ${r.pairP50Us} | ${r.windowsMinUs}–${r.windowsMaxUs} | ${r.jsSleepsPerPair} | ${round(r.pairP50Us / rows[0].pairP50Us)} |`), '',
  ...targets.map((t) => `Target: ${t.text}: **${t.verdict}** (${b.label} ${t.ratios[b.label]}×; the two scripts through ioredis ${t.ratios.raw}×, on a bare socket ${t.ratios.socket}×${tokio ? `, on a bare tokio socket ${t.ratios.tokio}×` : ''}).\n`), '',
].join('\n');
console.log(`\n${md}`);
const out = o.out ?? mkdtempSync(path.join(os.tmpdir(), 'pair-floor-'));
mkdirSync(out, { recursive: true });
writeFileSync(path.join(out, `${start.date}-pair-floor.json`), `${JSON.stringify(result, null, 2)}\n`);
writeFileSync(path.join(out, `${start.date}-pair-floor.md`), md);
console.log(`wrote ${path.join(out, `${start.date}-pair-floor`)}.{json,md}`);
process.exit(0);
