// How often each thread sleeps and is woken, is preempted, and how much CPU it spends, per
// acquire+release pair, for this driver and the JS libraries (issue 37, item 1). On a VM
// every sleep of a thread whose vCPU then halts costs tens of µs to wake from, and a third
// busy thread on two cores is preempted: the counts show which design pays that, and where.
//
//   node benchmarks/thread-wakeups.bench.mjs [--inflight 1,64,256] [--pairs N=200000] [--reps N=3] [--out DIR]
//
// One throwaway redis-server; each (library, in flight) runs in a fresh child process, reps
// interleaved, medians kept. Per thread role (`js`: the main thread; `addon`: this driver's
// runtime threads; `other`: V8 and libuv helpers), from /proc/self/task/*/{status,schedstat}:
// voluntary context switches (sleeps, each ended by a wake-up), involuntary ones (preempted
// while runnable) and CPU µs, per pair. Writes thread-wakeups.{json,md} to --out (default: a
// temporary directory).

import { fork } from 'node:child_process';
import { createRequire } from 'node:module';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startRedis } from '../__test__/helpers/redis.mjs';
import { packageDir, median, round, parseOptions, gitInfo, machineInfo, runMain } from './lib.mjs';
import { createJsLockDriver } from './baseline/js-driver.mjs';

const require = createRequire(import.meta.url);
const LIBRARIES = ['dokebi', 'semaphore', 'js-driver'];

function threads() {
  const out = {};
  for (const tid of readdirSync('/proc/self/task')) {
    let comm, status, schedstat;
    try {
      comm = readFileSync(`/proc/self/task/${tid}/comm`, 'utf8').trim();
      status = readFileSync(`/proc/self/task/${tid}/status`, 'utf8');
      schedstat = readFileSync(`/proc/self/task/${tid}/schedstat`, 'utf8');
    } catch {
      continue;
    }
    const role = Number(tid) === process.pid ? 'js' : comm.startsWith('dokebi-lock') ? 'addon' : 'other';
    const t = (out[role] ??= { sleeps: 0, preempted: 0, cpuNs: 0 });
    t.sleeps += Number(/^voluntary_ctxt_switches:\s+(\d+)/m.exec(status)[1]);
    t.preempted += Number(/^nonvoluntary_ctxt_switches:\s+(\d+)/m.exec(status)[1]);
    t.cpuNs += Number(schedstat.split(' ')[0]);
  }
  return out;
}

async function client(library, url) {
  if (library === 'dokebi') {
    const { createRedisLockDriver } = require(path.join(packageDir, 'index.js'));
    const driver = createRedisLockDriver(url, { driver: 'redis', connection: 'w', namespace: `w${process.pid}`, leaseMs: 10_000, maxWaiters: 1024 });
    return { pair: async (key) => (await driver.acquire(key)).release(), close: () => driver.shutdown() };
  }
  if (library === 'js-driver') {
    const driver = await createJsLockDriver(url, { namespace: `w${process.pid}`, leaseMs: 10_000, maxWaiters: 1024 });
    return { pair: async (key) => (await driver.acquire(key)).release(), close: () => driver.close() };
  }
  if (library === 'semaphore') {
    const Redis = require('ioredis');
    const redis = new Redis(url);
    const { Mutex } = require('redis-semaphore');
    return {
      pair: async (key) => {
        const m = new Mutex(redis, key, { lockTimeout: 10_000, refreshInterval: 0 });
        await m.acquire();
        await m.release();
      },
      close: () => redis.disconnect(),
    };
  }
  throw new Error(`unknown library ${library}`);
}

async function child() {
  const { library, url, inflight, pairs } = JSON.parse(process.argv[3]);
  const c = await client(library, url);
  const run = async (count, prefix) => {
    let next = 0;
    const loop = async () => {
      while (next < count) await c.pair(`${prefix}:${next++}`);
    };
    await Promise.all(Array.from({ length: inflight }, loop));
  };
  await run(Math.min(20_000, pairs), 'warm');
  const a = threads();
  const t0 = performance.now();
  await run(pairs, 'm');
  const seconds = (performance.now() - t0) / 1000;
  const b = threads();
  const roles = {};
  for (const role of Object.keys(b)) {
    const d = (f) => (b[role][f] - (a[role]?.[f] ?? 0)) / pairs;
    roles[role] = { sleeps: d('sleeps'), preempted: d('preempted'), cpuUs: d('cpuNs') / 1000 };
  }
  await c.close();
  process.send({ pairsPerSecond: pairs / seconds, roles }, () => process.exit(0));
}

async function main() {
  const o = parseOptions(process.argv.slice(2), {
    inflight: { type: 'string', default: '1,64,256' },
    pairs: { type: 'string', default: '200000' },
    reps: { type: 'string', default: '3' },
    out: { type: 'string' },
  });
  const inflights = o.inflight.split(',').map(Number);
  const server = await startRedis();
  const runs = {};
  for (let rep = 0; rep < Number(o.reps); rep++) {
    for (const inflight of inflights) {
      const libraries = rep % 2 ? [...LIBRARIES].reverse() : LIBRARIES;
      for (const library of libraries) {
        // At 1 in flight a pair takes ~0.1-0.2 ms: fewer pairs keep the run short.
        const pairs = inflight === 1 ? Math.min(10_000, Number(o.pairs)) : Number(o.pairs);
        const me = fileURLToPath(import.meta.url);
        const result = await new Promise((resolve, reject) => {
          const p = fork(me, ['--child', JSON.stringify({ library, url: server.url, inflight, pairs })]);
          p.once('message', resolve);
          p.once('exit', (code) => code && reject(new Error(`${library} at ${inflight} exited ${code}`)));
        });
        (runs[`${library}-${inflight}`] ??= []).push(result);
      }
    }
  }
  await server.stop();
  const rows = {};
  const md = ['| library | in flight | pairs/s | JS thread: sleeps / preempted / CPU µs per pair | addon threads: sleeps / preempted / CPU µs per pair | other threads CPU µs per pair |', '|---|---:|---:|---|---|---:|'];
  for (const [name, results] of Object.entries(runs)) {
    const m = (f) => round(median(results.map(f)), 3);
    const role = (r) => ({ sleeps: m((x) => x.roles[r]?.sleeps ?? 0), preempted: m((x) => x.roles[r]?.preempted ?? 0), cpuUs: m((x) => x.roles[r]?.cpuUs ?? 0) });
    rows[name] = { pairsPerSecond: Math.round(m((x) => x.pairsPerSecond)), js: role('js'), addon: role('addon'), other: role('other') };
    const [library, inflight] = [name.slice(0, name.lastIndexOf('-')), name.slice(name.lastIndexOf('-') + 1)];
    const r = rows[name];
    const cell = (t) => `${t.sleeps} / ${t.preempted} / ${round(t.cpuUs, 1)}`;
    md.push(`| ${library} | ${inflight} | ${r.pairsPerSecond} | ${cell(r.js)} | ${library === 'dokebi' ? cell(r.addon) : '—'} | ${round(r.other.cpuUs, 1)} |`);
  }
  const out = o.out || mkdtempSync(path.join(os.tmpdir(), 'thread-wakeups-'));
  mkdirSync(out, { recursive: true });
  const command = `node benchmarks/thread-wakeups.bench.mjs ${process.argv.slice(2).join(' ')}`.trim();
  writeFileSync(path.join(out, 'thread-wakeups.json'), JSON.stringify({ command, date: new Date().toISOString(), machine: machineInfo(), git: gitInfo(), node: process.version, rows }, null, 2) + '\n');
  writeFileSync(path.join(out, 'thread-wakeups.md'), md.join('\n') + '\n');
  console.log(md.join('\n'));
  console.log(`\nwritten to ${out}`);
}

if (process.argv[2] === '--child') child();
else runMain(main, { killAll() {} });
