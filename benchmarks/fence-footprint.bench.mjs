// Redis footprint of fence counters over many unique lock keys, without and with fenceTtlMs
// (decision 0031).
//
//   node benchmarks/fence-footprint.bench.mjs [--keys 1000000] [--inflight 64] [--fence-ttl-ms 1000]
//     [--checkpoints 10] [--out DIR]
//
// For each variant a fresh throwaway redis-server (__test__/helpers/redis.mjs) and one driver
// (the release build in this checkout) acquire and release --keys distinct keys, --inflight at
// a time. At every checkpoint (each --keys / --checkpoints pairs) and after the run: Redis
// used_memory, DBSIZE and expired_keys. With fenceTtlMs the run ends by waiting (on DBSIZE,
// up to fenceTtlMs + 10 s) for the last counters to expire. Writes
// benchmarks/results/<date>-fence-footprint.{json,md} (or into --out).

import { mkdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { root, round, parseInfo, gitInfo, machineInfo, addonInfo, childProcesses, parseOptions, runMain } from './lib.mjs';

function parseArgs(argv) {
  const v = parseOptions(argv, {
    keys: { type: 'string', default: '1000000' },
    inflight: { type: 'string', default: '64' },
    'fence-ttl-ms': { type: 'string', default: '1000' },
    checkpoints: { type: 'string', default: '10' },
    out: { type: 'string' },
  }, { missingValue: 'undefined' });
  // An option left without its value at the end of the line gives NaN (undefined for --out), as it always has.
  return {
    keys: Number(v.keys),
    inflight: Number(v.inflight),
    fenceTtlMs: Number(v['fence-ttl-ms']),
    checkpoints: Number(v.checkpoints),
    out: 'out' in v ? v.out : null,
  };
}
const opts = parseArgs(process.argv.slice(2));

const MiB = 2 ** 20;
const lock = createRequire(import.meta.url)(root);

async function facts(server) {
  const memory = parseInfo(await server.command('INFO', 'memory'));
  const stats = parseInfo(await server.command('INFO', 'stats'));
  return {
    usedMemoryMiB: round(Number(memory.used_memory) / MiB, 2),
    dbsize: Number(await server.command('DBSIZE')),
    expiredKeys: Number(stats.expired_keys),
  };
}

async function variant(startRedis, name, extra) {
  const server = await startRedis();
  const driver = lock.createRedisLockDriver(server.url, { driver: 'redis', connection: 'main', namespace: 'fp', leaseMs: 10_000, ...extra });
  await (await driver.acquire('warm-up')).release();
  const points = [{ pairs: 0, seconds: 0, ...(await facts(server)) }];
  const every = Math.ceil(opts.keys / opts.checkpoints);
  const t0 = performance.now();
  let next = 0;
  let failures = 0;
  async function loop() {
    while (next < opts.keys) {
      const i = next++;
      try {
        await (await driver.acquire(`key-${i}`)).release();
      } catch {
        failures++;
      }
    }
  }
  const loops = Array.from({ length: opts.inflight }, loop);
  for (let at = every; at <= opts.keys; at += every) {
    while (next < at && next < opts.keys) await sleep(50);
    points.push({ pairs: Math.min(at, next), seconds: round((performance.now() - t0) / 1000, 1), ...(await facts(server)) });
    console.error(`${name.padEnd(22)} ${String(points.at(-1).pairs).padStart(8)} pairs  used_memory ${points.at(-1).usedMemoryMiB} MiB  dbsize ${points.at(-1).dbsize}  expired ${points.at(-1).expiredKeys}`);
  }
  await Promise.all(loops);
  const seconds = (performance.now() - t0) / 1000;
  const end = { pairs: opts.keys, seconds: round(seconds, 1), ...(await facts(server)) };
  let settled = null;
  if (extra.fenceTtlMs) {
    const deadline = performance.now() + extra.fenceTtlMs + 10_000;
    while (Number(await server.command('DBSIZE')) > 0 && performance.now() < deadline) await sleep(100);
    settled = { seconds: round((performance.now() - t0) / 1000, 1), ...(await facts(server)) };
    console.error(`${name.padEnd(22)} settled: used_memory ${settled.usedMemoryMiB} MiB  dbsize ${settled.dbsize}`);
  }
  await driver.shutdown();
  const version = parseInfo(await server.command('INFO', 'server')).redis_version;
  await server.stop();
  return { name, options: extra, pairsPerSec: Math.round(opts.keys / seconds), failures, points, end, settled, redisVersion: version };
}

const children = childProcesses();

async function main() {
  const { startRedis } = await import('../__test__/helpers/redis.mjs');
  const commandLine = ['node', path.relative(root, fileURLToPath(import.meta.url)), ...process.argv.slice(2)].join(' ');
  const variants = [
    await variant(startRedis, 'counters never expire', {}),
    await variant(startRedis, `fenceTtlMs ${opts.fenceTtlMs}`, { fenceTtlMs: opts.fenceTtlMs }),
  ];
  const date = new Date().toISOString().slice(0, 10);
  const outDir = opts.out ? path.resolve(opts.out) : path.join(root, 'benchmarks', 'results');
  mkdirSync(outDir, { recursive: true });
  const meta = {
    command: commandLine, date: new Date().toISOString(), machine: machineInfo(), loadAverageAfter: os.loadavg(),
    versions: { node: process.version, redisServer: variants[0].redisVersion }, git: gitInfo(), addon: addonInfo(), options: opts,
  };
  writeFileSync(path.join(outDir, `${date}-fence-footprint.json`), JSON.stringify({ ...meta, variants }, null, 2) + '\n');
  const lines = [
    `# Fence counters in Redis over ${opts.keys.toLocaleString('en-US')} unique keys (${date})`, '',
    `\`${commandLine}\` — Redis ${variants[0].redisVersion}, Node ${process.version}, ${meta.machine.cpu} × ${meta.machine.cores} (shared); acquire + release of each key once, ${opts.inflight} in flight, a fresh redis-server per variant.`, '',
    '| variant | pairs/s | used_memory before → after (MiB) | DBSIZE after | expired keys | after the last counters expired |',
    '|---|---:|---:|---:|---:|---|',
    ...variants.map((v) => `| ${v.name} | ${v.pairsPerSec} | ${v.points[0].usedMemoryMiB} → ${v.end.usedMemoryMiB} | ${v.end.dbsize} | ${v.end.expiredKeys} | ${v.settled ? `${v.settled.usedMemoryMiB} MiB, DBSIZE ${v.settled.dbsize}` : '—'} |`),
    '', '| pairs | ' + variants.map((v) => `${v.name}: used_memory MiB (DBSIZE)`).join(' | ') + ' |',
    '|---:|' + variants.map(() => '---:').join('|') + '|',
    ...variants[0].points.map((p, i) => `| ${p.pairs} | ` + variants.map((v) => `${v.points[i]?.usedMemoryMiB} (${v.points[i]?.dbsize})`).join(' | ') + ' |'),
    '',
  ];
  writeFileSync(path.join(outDir, `${date}-fence-footprint.md`), lines.join('\n'));
  console.log(lines.join('\n'));
}

runMain(main, children);
