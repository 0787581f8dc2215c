// Sporadic locks: one acquire/release pair now and then, the process idle in between (an app
// that guards a job or a request, not a tight loop). Each pair follows a pause of --gap ms,
// so every thread involved (the JS thread, the addon's runtime thread, Redis) has gone to
// sleep before it. Compares this driver with its defaults, with the runtime's thread parking
// at once after a reply (DOKEBI_LOCK_REDIS_STAY_AWAKE_US=0, decision 0041), and ioredis's
// SET NX PX then DEL on the same pattern: one round trip each, the floor.
//
//   node benchmarks/sporadic.bench.mjs [--pairs 500] [--gap 3] [--rounds 3] [--out DIR]
//
// A round runs each variant once, in a fresh process, in A B C order; medians of the
// rounds' p50s. Writes <date>-sporadic.{json,md} to --out (default: a temporary directory).

import { execFileSync, fork } from 'node:child_process';
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';

import { addonInfo, gitInfo, machineInfo, median, nextMessage, parseOptions, percentile, root, round, runMain, childProcesses } from './lib.mjs';

const require = createRequire(import.meta.url);
const children = childProcesses();

// ---------------------------------------------------------------- the child ----

async function child() {
  const { variant, url, pairs, gap } = await new Promise((resolve) => process.once('message', resolve));
  const times = { first: [], second: [], pair: [] };
  let pair;
  if (variant === 'ioredis') {
    const { default: Redis } = await import('ioredis');
    const client = new Redis(url);
    let i = 0;
    pair = async () => {
      const key = `sporadic:io:${i++}`;
      const t0 = performance.now();
      await client.set(key, 'x', 'PX', 10_000, 'NX');
      const t1 = performance.now();
      await client.del(key);
      return [t0, t1, performance.now()];
    };
    pair.close = () => client.disconnect();
  } else {
    const { createRedisLockDriver } = require(path.join(root, 'index.js'));
    const driver = createRedisLockDriver(url, { driver: 'redis', connection: 'sporadic', namespace: `sp${process.pid}`, leaseMs: 10_000 });
    let i = 0;
    pair = async () => {
      const t0 = performance.now();
      const lease = await driver.acquire(`sporadic:${i++}`);
      const t1 = performance.now();
      await lease.release();
      return [t0, t1, performance.now()];
    };
    pair.close = () => driver.shutdown();
  }
  for (let i = 0; i < pairs + 20; i++) {
    await sleep(gap);
    const [t0, t1, t2] = await pair();
    if (i < 20) continue; // connect, load scripts, warm up
    times.first.push((t1 - t0) * 1000);
    times.second.push((t2 - t1) * 1000);
    times.pair.push((t2 - t0) * 1000);
  }
  await pair.close();
  const p = (xs, q) => round(percentile([...xs].sort((a, b) => a - b), q), 1);
  process.send({ type: 'result', ...Object.fromEntries(Object.entries(times).map(([k, v]) => [k, { p50: p(v, 50), p90: p(v, 90) }])) });
}

// --------------------------------------------------------------- the parent ----

const VARIANTS = [
  { name: 'dokebi', env: {}, note: 'this driver, defaults (the runtime\'s thread polls for 100 µs after the last reply while few are due, decision 0041)' },
  { name: 'dokebi-stay-awake-0', env: { DOKEBI_LOCK_REDIS_STAY_AWAKE_US: '0' }, note: 'this driver, DOKEBI_LOCK_REDIS_STAY_AWAKE_US=0: the runtime\'s thread parks as soon as it has nothing to do' },
  { name: 'ioredis', env: {}, note: 'ioredis: SET key x PX 10000 NX, then DEL key (no script, no fence, no notification): one round trip each' },
];

async function main() {
  const v = parseOptions(process.argv.slice(2), {
    pairs: { type: 'string', default: '500' },
    gap: { type: 'string', default: '3' },
    rounds: { type: 'string', default: '3' },
    out: { type: 'string' },
  });
  const opts = { pairs: Number(v.pairs), gap: Number(v.gap), rounds: Number(v.rounds) };
  const out = v.out ? path.resolve(v.out) : mkdtempSync(path.join(os.tmpdir(), 'sporadic-'));
  mkdirSync(out, { recursive: true });
  const { startRedis } = await import('../__test__/helpers/redis.mjs');
  const server = await startRedis();
  const runs = Object.fromEntries(VARIANTS.map((x) => [x.name, []]));
  try {
    for (let r = 0; r < opts.rounds; r++) {
      for (const variant of VARIANTS) {
        const env = { ...process.env, ...variant.env };
        if (!variant.env.DOKEBI_LOCK_REDIS_STAY_AWAKE_US) delete env.DOKEBI_LOCK_REDIS_STAY_AWAKE_US;
        const c = fork(fileURLToPath(import.meta.url), ['--child'], { env, stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
        children.add(c);
        const result = nextMessage(c, 'result', opts.pairs * (opts.gap + 50) + 60_000);
        c.send({ variant: variant.name, url: server.url, pairs: opts.pairs, gap: opts.gap });
        const res = await result;
        runs[variant.name].push(res);
        console.log(`round ${r + 1}/${opts.rounds} ${variant.name.padEnd(17)} first p50 ${res.first.p50} µs, second ${res.second.p50} µs, pair ${res.pair.p50} µs`);
      }
    }
  } finally {
    await server.stop();
  }
  const med = (name, part) => round(median(runs[name].map((x) => x[part].p50)), 1);
  const command = ['node', path.relative(root, fileURLToPath(import.meta.url)), ...process.argv.slice(2)].join(' ');
  const redisVersion = execFileSync('redis-server', ['--version']).toString().trim();
  const result = {
    command, date: new Date().toISOString(), machine: machineInfo(), node: process.version, redis: redisVersion,
    addon: addonInfo(), git: gitInfo(), options: opts, variants: VARIANTS, runs,
    medians: Object.fromEntries(VARIANTS.map(({ name }) => [name, { first: med(name, 'first'), second: med(name, 'second'), pair: med(name, 'pair') }])),
  };
  const day = result.date.slice(0, 10);
  writeFileSync(path.join(out, `${day}-sporadic.json`), JSON.stringify(result, null, 2) + '\n');
  const p90 = (name) => round(median(runs[name].map((x) => x.second.p90)), 1);
  const rows = VARIANTS.map(({ name }) => `| ${name} | ${result.medians[name].first} | ${result.medians[name].second} / ${p90(name)} | ${result.medians[name].pair} | ${runs[name].map((x) => x.pair.p50).join(', ')} |`);
  const md = [
    `# Sporadic locks, ${day}`, '',
    `\`${command}\` — one pair every ${opts.gap} ms after a pause, ${opts.pairs} pairs per run, ${opts.rounds} rounds (variants in turn, each in a fresh process), medians of the runs' p50s; one throwaway ${redisVersion.split(' ').slice(0, 3).join(' ')} on loopback.`,
    `Machine: ${result.machine.cpu} × ${result.machine.cores}; Node ${process.version}. Addon: ${result.addon?.sha256 ?? '?'}…, git ${result.git?.head?.slice(0, 7) ?? '?'}${result.git?.dirty?.length ? ' with uncommitted changes' : ''}.`, '',
    '| variant | acquire (ioredis: SET) p50, µs | release (ioredis: DEL) p50 / p90, µs | pair p50, µs | pair p50 per round |',
    '|---|---:|---:|---:|---|',
    ...rows, '',
    ...VARIANTS.map(({ name, note }) => `- ${name}: ${note}`), '',
  ].join('\n');
  writeFileSync(path.join(out, `${day}-sporadic.md`), md);
  console.log(`\n${md}\nwrote ${path.relative(process.cwd(), path.join(out, `${day}-sporadic`))}.{json,md}`);
}

if (process.argv.includes('--child')) child().catch((err) => { console.error(err); process.exit(1); });
else runMain(main, children);
