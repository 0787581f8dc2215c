// The price of minReplicas (issue 11): uncontended acquire → release pairs with minReplicas 1
// against minReplicas 0, one primary and one local replica, and how long WAIT takes.
//
//   node benchmarks/replicas.bench.mjs [--seconds N=3] [--reps N=5] [--inflight 1,64] [--out DIR]
//
// A throwaway primary (--repl-diskless-sync-delay 0) and a replica of it on free ports
// (__test__/helpers/redis.mjs, never the machine's Redis). Each measurement is a fresh driver
// running `inflight` loops of acquire → release over distinct keys for --seconds after a
// 0.5 s warm-up; configurations are interleaved (A B A B …, the order flipped every other
// repetition) and medians are taken over repetitions, because the machine is shared.
// Also: WAIT latency alone (SET + WAIT 1 <timeout> on one connection, sequentially), the
// number the default replicaTimeoutMs was chosen against (docs/decisions/0025).
// Writes benchmarks/results/<date>-replicas.json (machine, versions, command) unless --out.
// Needs a release build (npm run build).

import { createRequire } from 'node:module';
import { mkdirSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  Samples, addonInfo, commandStats, commandVersion, gitInfo, here, machineInfo, median, parseOptions, root, round, spread,
} from './lib.mjs';
import { encode, parseReply, startRedis } from '../__test__/helpers/redis.mjs';

const require = createRequire(import.meta.url);
const { createRedisLockDriver } = require(path.join(root, 'index.js'));

function parseArgs(argv) {
  const v = parseOptions(argv, {
    seconds: { type: 'string', default: '3' },
    reps: { type: 'string', default: '5' },
    inflight: { type: 'string', default: '1,64' },
    out: { type: 'string' },
  }, { missingValue: 'undefined' });
  // An option left without its value at the end of the line gives NaN (--out: undefined; --inflight: a TypeError from split), as it always has.
  return {
    seconds: Number(v.seconds),
    reps: Number(v.reps),
    inflight: v.inflight.split(',').map(Number),
    out: 'out' in v ? v.out : null,
  };
}

/** One connection that sends commands and reads replies in order (no client library). */
function rawConnection(port) {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, '127.0.0.1');
    let buf = Buffer.alloc(0);
    const waiting = [];
    socket.on('data', (chunk) => {
      buf = Buffer.concat([buf, chunk]);
      for (;;) {
        const parsed = parseReply(buf);
        if (!parsed) break;
        buf = buf.subarray(parsed[1]);
        waiting.shift()(parsed[0]);
      }
    });
    socket.once('error', reject);
    socket.once('connect', () => resolve({
      call: (...args) => new Promise((r) => { waiting.push(r); socket.write(encode(args)); }),
      close: () => socket.destroy(),
    }));
  });
}

async function replicaAcked(primary) {
  await primary.command('SET', 'bench-ready', '1');
  for (const end = Date.now() + 10_000; Date.now() < end; await sleep(10)) {
    const info = await primary.command('INFO', 'replication');
    if (Number(/^slave0:.*offset=(\d+)/m.exec(info)?.[1] ?? 0) > 0) return;
  }
  throw new Error('the replica never acknowledged its primary');
}

async function pairs(primary, minReplicas, inflight, seconds) {
  const ns = `bench-rep-${minReplicas}-${inflight}-${Math.random().toString(16).slice(2, 8)}`;
  const d = createRedisLockDriver(primary.url, { driver: 'redis', connection: 'main', namespace: ns, minReplicas, maxWaiters: 1024 });
  const latency = new Samples();
  let n = 0;
  let measuring = false;
  let stop = false;
  const loop = async (id) => {
    for (let i = 0; !stop; i++) {
      const t0 = performance.now();
      const lease = await d.acquire(`k-${id}-${i}`, { waitTimeoutMs: 0 });
      await lease.release();
      if (measuring) {
        latency.push(performance.now() - t0);
        n++;
      }
    }
  };
  const loops = Array.from({ length: inflight }, (_, id) => loop(id));
  await sleep(500);
  const before = commandStats(await primary.command('INFO', 'commandstats'));
  measuring = true;
  const t0 = performance.now();
  await sleep(seconds * 1000);
  measuring = false;
  const span = (performance.now() - t0) / 1000;
  const after = commandStats(await primary.command('INFO', 'commandstats'));
  stop = true;
  await Promise.all(loops);
  await d.shutdown();
  const waits = (after.wait ?? 0) - (before.wait ?? 0);
  return { pairsPerSecond: round(n / span, 1), pairMs: latency.summary(4), waitsPerPair: round(n ? waits / n : 0, 3) };
}

async function waitLatency(primary, count) {
  const conn = await rawConnection(primary.port);
  const ms = new Samples();
  for (let i = 0; i < count; i++) {
    await conn.call('SET', 'bench-wait', String(i));
    const t0 = performance.now();
    const acked = await conn.call('WAIT', '1', '500');
    ms.push(performance.now() - t0);
    if (acked !== 1) throw new Error(`WAIT answered ${acked}`);
  }
  conn.close();
  return ms.summary(4);
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const primary = await startRedis({ args: ['--repl-diskless-sync-delay', '0'] });
  const replica = await startRedis({ args: ['--replicaof', '127.0.0.1', String(primary.port)] });
  try {
    await replicaAcked(primary);
    const configs = opts.inflight.flatMap((inflight) => [0, 1].map((minReplicas) => ({ minReplicas, inflight })));
    const runs = Object.fromEntries(configs.map((c) => [`minReplicas${c.minReplicas}-inflight${c.inflight}`, []]));
    const waits = [];
    for (let rep = 0; rep < opts.reps; rep++) {
      const order = rep % 2 ? [...configs].reverse() : configs;
      for (const c of order) {
        const r = await pairs(primary, c.minReplicas, c.inflight, opts.seconds);
        runs[`minReplicas${c.minReplicas}-inflight${c.inflight}`].push(r);
        console.log(`rep ${rep + 1} minReplicas ${c.minReplicas} inflight ${c.inflight}: ${r.pairsPerSecond} pairs/s, p50 ${r.pairMs.p50} ms, p99 ${r.pairMs.p99} ms, WAITs/pair ${r.waitsPerPair}`);
      }
      waits.push(await waitLatency(primary, 2000));
      console.log(`rep ${rep + 1} WAIT alone: p50 ${waits.at(-1).p50} ms, p99 ${waits.at(-1).p99} ms, max ${waits.at(-1).max} ms`);
    }
    const summary = Object.fromEntries(Object.entries(runs).map(([name, rs]) => [name, {
      pairsPerSecond: round(median(rs.map((r) => r.pairsPerSecond)), 1),
      pairsPerSecondSpread: round(spread(rs.map((r) => r.pairsPerSecond)), 3),
      pairP50Ms: round(median(rs.map((r) => r.pairMs.p50)), 4),
      pairP99Ms: round(median(rs.map((r) => r.pairMs.p99)), 4),
      waitsPerPair: round(median(rs.map((r) => r.waitsPerPair)), 3),
    }]));
    const waitSummary = {
      p50Ms: round(median(waits.map((w) => w.p50)), 4), p99Ms: round(median(waits.map((w) => w.p99)), 4),
      maxMs: round(Math.max(...waits.map((w) => w.max)), 4),
    };
    console.log(JSON.stringify({ summary, waitAlone: waitSummary }, null, 2));
    const result = {
      benchmark: 'replicas', date: new Date().toISOString(),
      command: `node benchmarks/replicas.bench.mjs ${process.argv.slice(2).join(' ')}`.trim(),
      options: opts, machine: machineInfo(), node: process.version,
      redis: commandVersion('redis-server'), addon: addonInfo(), git: gitInfo(),
      summary, waitAlone: waitSummary, runs, waitRuns: waits,
    };
    const dir = opts.out ?? path.join(here, 'results');
    mkdirSync(dir, { recursive: true });
    const file = path.join(dir, `${result.date.slice(0, 10)}-replicas.json`);
    writeFileSync(file, `${JSON.stringify(result, null, 2)}\n`);
    console.log(`wrote ${path.relative(root, file)}`);
  } finally {
    await replica.stop();
    await primary.stop();
  }
}

main().then(() => process.exit(0), (err) => { console.error(err); process.exit(1); });
