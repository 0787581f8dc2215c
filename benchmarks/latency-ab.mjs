// A/B latency at 1 in flight in one process (issue 12, target 4): two copies of this build's
// addon, each with its own tokio runtime, configured through environment variables read
// when that copy's runtime starts, measured in interleaved windows against one throwaway
// redis-server. Reports per variant the median (and range) over windows of the pair p50
// and of the whole process's CPU per pair.
//
//   node benchmarks/latency-ab.mjs [--windows 10] [--seconds 1] [--inflight 1] A_ENV B_ENV
//   e.g. node benchmarks/latency-ab.mjs 'DOKEBI_LOCK_REDIS_PARK_SPIN_US=0' 'DOKEBI_LOCK_REDIS_PARK_SPIN_US=200'
import { copyFileSync, mkdtempSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { startRedis } from '../__test__/helpers/redis.mjs';
import { root, median } from './lib.mjs';

const require = createRequire(import.meta.url);
const args = process.argv.slice(2);
const opt = (name, fallback) => {
  const i = args.indexOf(`--${name}`);
  if (i < 0) return fallback;
  const [, value] = args.splice(i, 2);
  return Number(value);
};
const windows = opt('windows', 10);
const seconds = opt('seconds', 1);
const inflight = opt('inflight', 1);
const variants = args.length ? args : ['', ''];

const server = await startRedis();
const drivers = [];
for (const [i, env] of variants.entries()) {
  const dir = mkdtempSync(path.join(os.tmpdir(), `dokebi-ab-${i}-`));
  for (const f of ['index.js', 'binding.js', 'package.json', 'lock-redis.linux-x64-gnu.node']) copyFileSync(path.join(root, f), path.join(dir, f));
  for (const pair of env.split(/\s+/).filter(Boolean)) {
    const [k, v] = pair.split('=');
    process.env[k] = v;
  }
  const { createRedisLockDriver } = require(path.join(dir, 'index.js'));
  const driver = createRedisLockDriver(server.url, { driver: 'redis', connection: 'ab', namespace: `ab${i}`, leaseMs: 10_000, maxWaiters: 1024 });
  // The first acquire starts this copy's runtime, which reads the environment now.
  await (await driver.acquire('warm')).release();
  drivers.push({ env: env || '(none)', driver, p50: [], cpu: [] });
}

async function window(v, n) {
  const lat = [];
  const cpu0 = process.cpuUsage();
  const end = performance.now() + seconds * 1000;
  let i = 0;
  async function loop() {
    while (performance.now() < end) {
      const t = performance.now();
      const lease = await v.driver.acquire(`k${n}:${i++}`);
      await lease.release();
      lat.push(performance.now() - t);
    }
  }
  await Promise.all(Array.from({ length: inflight }, loop));
  const c = process.cpuUsage(cpu0);
  lat.sort((a, b) => a - b);
  v.p50.push(lat[lat.length >> 1] * 1000);
  v.cpu.push((c.user + c.system) / lat.length);
}

for (const v of drivers) await window(v, -1); // warm-up
for (let w = 0; w < windows; w++) {
  const order = w % 2 ? [...drivers].reverse() : drivers;
  for (const v of order) await window(v, w);
}
for (const v of drivers) {
  const r = (xs) => `${median(xs).toFixed(1)} [${Math.min(...xs).toFixed(1)}–${Math.max(...xs).toFixed(1)}]`;
  console.log(`${v.env} (${inflight} in flight): pair p50 µs ${r(v.p50)}; process CPU µs/pair ${r(v.cpu)}`);
}
for (const v of drivers) await v.driver.shutdown();
await server.stop?.();
process.exit(0);
