// Where one acquire and one release spend their time at 1 in flight, layer by layer, and
// how many times each thread is put to sleep and woken per call (issue 37, item 1).
//
//   node benchmarks/breakdown.bench.mjs [--calls N=2000] [--reps N=5] [--out DIR] [--no-rust]
//
// ONE throwaway redis-server serves every step; steps are interleaved within each repetition
// and medians taken over repetitions. Each step is N calls, one at a time, on distinct keys:
//   napi-sync        a synchronous native call (the `namespace` getter): the napi call alone
//   crossing         the native acquire with an empty key: JS → tokio → JS with no Redis work
//                    (the key is refused inside the task's reply, so the promise is made,
//                    handed to the runtime, settled through the threadsafe function, resolved)
//   ioredis-ping     PING from ioredis on the JS thread: socket + Redis + event loop
//   ioredis-acquire  EVALSHA of the driver's own acquire script from ioredis
//   ioredis-release  EVALSHA of the driver's own release script from ioredis
//   native-acquire   the addon's acquire (binding, without index.js's Lease wrapper)
//   native-release   the addon's release of that lease
//   acquire/release  the public driver's acquire and lease.release()
// Per step: latency p50/p90 (µs) and, per thread, CPU µs per call (/proc/self/task/*/schedstat,
// nanoseconds) and voluntary context switches per call (each is a sleep the thread is woken
// from: a wake-up). Threads: `js` (the main thread), `tokio` (the addon's runtime), `other`.
//
// Unless --no-rust, `cargo bench --no-default-features --bench breakdown` measures the same
// scripts from inside tokio against the same server (benches/breakdown.rs): a raw socket,
// redis-rs's multiplexed connection, and the driver's own acquire and release, so the layers
// between the socket and the JS promise can be told apart. Writes breakdown.{json,md} to
// --out (default: a temporary directory).

import { createRequire } from 'node:module';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startRedis } from '../__test__/helpers/redis.mjs';
import { root, packageDir, median, round, parseOptions, gitInfo, machineInfo, runMain } from './lib.mjs';

const require = createRequire(import.meta.url);

const parsed = parseOptions(process.argv.slice(2), {
  calls: { type: 'string', default: '2000' },
  reps: { type: 'string', default: '5' },
  out: { type: 'string' },
  'no-rust': { type: 'boolean', default: false },
});
const options = { ...parsed, calls: Number(parsed.calls), reps: Number(parsed.reps) };

/** Per-thread CPU (ns) and voluntary switches of this process, by role. */
function threads() {
  const out = { js: { cpu: 0, sleeps: 0 }, tokio: { cpu: 0, sleeps: 0 }, other: { cpu: 0, sleeps: 0 } };
  const dir = '/proc/self/task';
  for (const tid of readdirSync(dir)) {
    let comm, schedstat, status;
    try {
      comm = readFileSync(`${dir}/${tid}/comm`, 'utf8').trim();
      schedstat = readFileSync(`${dir}/${tid}/schedstat`, 'utf8');
      status = readFileSync(`${dir}/${tid}/status`, 'utf8');
    } catch {
      continue; // a thread that ended meanwhile
    }
    const role = Number(tid) === process.pid ? 'js' : comm.startsWith('dokebi-lock') ? 'tokio' : 'other';
    out[role].cpu += Number(schedstat.split(' ')[0]);
    out[role].sleeps += Number(/voluntary_ctxt_switches:\s+(\d+)/.exec(status)[1]);
  }
  return out;
}

function diff(a, b, n) {
  const out = {};
  for (const role of Object.keys(a)) {
    out[role] = { cpuUs: (b[role].cpu - a[role].cpu) / 1000 / n, wakeUps: (b[role].sleeps - a[role].sleeps) / n };
  }
  return out;
}

function pct(sorted, p) {
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))];
}

async function main() {
  const server = await startRedis();
  const url = server.url;
  const Redis = require('ioredis');
  const native = require(path.join(packageDir, 'binding.js'));
  const { createRedisLockDriver } = require(path.join(packageDir, 'index.js'));
  const source = (name) => readFileSync(path.join(root, 'src', 'scripts', `${name}.lua`), 'utf8');
  const redis = new Redis(url, { enableAutoPipelining: false, lazyConnect: false });
  const acquireSha = await redis.script('LOAD', source('acquire'));
  const releaseSha = await redis.script('LOAD', source('release'));

  const backendOptions = { driver: 'redis', connection: 'main', namespace: 'bd', leaseMs: 10_000 };
  const nd = native.createDriver({ url }, backendOptions, undefined, false);
  const driver = createRedisLockDriver({ url }, { ...backendOptions, namespace: 'bd-public' });
  // Warm every path (connection, scripts loaded, JIT).
  for (let i = 0; i < 500; i++) {
    const l = await nd.acquire(`warm-${i}`);
    await nd.release(l.id);
    await (await driver.acquire(`warm-${i}`)).release();
    await redis.ping();
  }

  let serial = 0;
  const token = () => `t${process.pid}-${serial}`;
  // Each step: (i) => one call, awaited. Pairs' second halves read what the first left.
  const held = [];
  const steps = {
    'napi-sync': async () => { nd.namespace; },
    crossing: async () => { await nd.acquire(''); },
    'ioredis-ping': async () => { await redis.ping(); },
    'ioredis-acquire': async () => {
      const key = `raw-${++serial}`;
      await redis.evalsha(acquireSha, 2, `bd:lock:{${key}}`, `bd:lock-fence:{${key}}`, token(), 10000);
      held.push(key);
    },
    'ioredis-release': async () => {
      const key = held.shift();
      await redis.evalsha(releaseSha, 1, `bd:lock:{${key}}`, token(), 'bd:released', key);
    },
    'native-acquire': async () => { held.push((await nd.acquire(`n-${++serial}`)).id); },
    'native-release': async () => { await nd.release(held.shift()); },
    acquire: async () => { held.push(await driver.acquire(`p-${++serial}`)); },
    release: async () => { await held.shift().release(); },
  };
  // The releases undo what the acquire before them left; run them in that order.
  const order = [['napi-sync'], ['crossing'], ['ioredis-ping'], ['ioredis-acquire', 'ioredis-release'], ['native-acquire', 'native-release'], ['acquire', 'release']];
  const results = Object.fromEntries(Object.keys(steps).map((s) => [s, []]));
  const n = options.calls;
  for (let rep = 0; rep < options.reps; rep++) {
    // Rotate the order each repetition so no step always follows the same one.
    const rotated = order.slice(rep % order.length).concat(order.slice(0, rep % order.length));
    for (const group of rotated) {
      if (group.length === 2) {
        // acquire N, then release N: each half measured on its own.
        for (const name of group) results[name].push(await measure(steps[name], n));
      } else {
        results[group[0]].push(await measure(steps[group[0]], n));
      }
    }
  }
  redis.disconnect();
  await driver.shutdown();
  await nd.shutdown();

  const summary = {};
  for (const [name, reps] of Object.entries(results)) {
    const m = (f) => round(median(reps.map(f)), 2);
    summary[name] = {
      p50Us: m((r) => r.p50),
      p90Us: m((r) => r.p90),
      cpuUsPerCall: { js: m((r) => r.threads.js.cpuUs), tokio: m((r) => r.threads.tokio.cpuUs), other: m((r) => r.threads.other.cpuUs) },
      wakeUpsPerCall: { js: m((r) => r.threads.js.wakeUps), tokio: m((r) => r.threads.tokio.wakeUps), other: m((r) => r.threads.other.wakeUps) },
    };
  }
  let rust = null;
  if (!options['no-rust']) rust = runRust(url);
  await server.stop();
  return report(summary, rust);
}

async function measure(step, n) {
  const lat = new Float64Array(n);
  const t0 = threads();
  for (let i = 0; i < n; i++) {
    const s = performance.now();
    await step(i);
    lat[i] = (performance.now() - s) * 1000;
  }
  const t1 = threads();
  lat.sort();
  return { p50: pct(lat, 0.5), p90: pct(lat, 0.9), threads: diff(t0, t1, n) };
}

function runRust(url) {
  const run = spawnSync('cargo', ['bench', '--quiet', '--no-default-features', '--bench', 'breakdown', '--', '--url', url, '--calls', String(options.calls), '--reps', String(options.reps)], { cwd: root, encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });
  if (run.status !== 0) throw new Error(`cargo bench --bench breakdown failed (${run.status})`);
  return JSON.parse(run.stdout.trim().split('\n').at(-1));
}

function report(js, rust) {
  const line = (name, s) => `| ${name} | ${s.p50Us} | ${s.p90Us} | ${s.cpuUsPerCall.js} / ${s.cpuUsPerCall.tokio} / ${s.cpuUsPerCall.other} | ${s.wakeUpsPerCall.js} / ${s.wakeUpsPerCall.tokio} / ${s.wakeUpsPerCall.other} |`;
  const md = [
    '| step (1 in flight) | p50 µs | p90 µs | CPU µs per call: JS / tokio / other threads | wake-ups per call: JS / tokio / other |',
    '|---|---:|---:|---|---|',
    ...Object.entries(js).map(([name, s]) => line(name, s)),
  ];
  if (rust) {
    md.push('', '| inside tokio (benches/breakdown.rs) | p50 µs | p90 µs | CPU µs per call: runtime thread / other threads | wake-ups per call: runtime / other |', '|---|---:|---:|---|---|');
    for (const [name, s] of Object.entries(rust.steps)) {
      md.push(`| ${name} | ${s.p50Us} | ${s.p90Us} | ${s.cpuUsPerCall.runtime} / ${s.cpuUsPerCall.other} | ${s.wakeUpsPerCall.runtime} / ${s.wakeUpsPerCall.other} |`);
    }
  }
  const result = {
    command: `node benchmarks/breakdown.bench.mjs ${process.argv.slice(2).join(' ')}`.trim(),
    date: new Date().toISOString(), machine: machineInfo(), git: gitInfo(), node: process.version, calls: options.calls, reps: options.reps,
    js, rust,
  };
  const out = options.out || mkdtempSync(path.join(os.tmpdir(), 'breakdown-'));
  mkdirSync(out, { recursive: true });
  writeFileSync(path.join(out, 'breakdown.json'), JSON.stringify(result, null, 2) + '\n');
  writeFileSync(path.join(out, 'breakdown.md'), md.join('\n') + '\n');
  console.log(md.join('\n'));
  console.log(`\nwritten to ${out}`);
}

runMain(main, { killAll() {} });
