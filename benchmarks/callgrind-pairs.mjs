// Instructions per acquire+release pair, per thread, independent of machine noise
// (docs/perf/README.md "Instructions per pair"). Run by benchmarks/callgrind-pairs.sh under
// valgrind --tool=callgrind --separate-threads=yes, once with --pairs N and once with
// --pairs 0; the difference over N is the steady cost of a pair.
//
//   node benchmarks/callgrind-pairs.mjs --url redis://127.0.0.1:PORT --pairs 5000 [--inflight 64]
import path from 'node:path';
import { createRequire } from 'node:module';
import { packageDir } from './lib.mjs';

const require = createRequire(import.meta.url);
const arg = (name, fallback) => {
  const i = process.argv.indexOf(`--${name}`);
  return i < 0 ? fallback : process.argv[i + 1];
};
const url = arg('url');
const pairs = Number(arg('pairs', 5000));
const inflight = Number(arg('inflight', 64));
const warmup = Number(arg('warmup', 2000));

const { createRedisLockDriver } = require(path.join(packageDir, 'index.js'));
const driver = createRedisLockDriver(url, {
  driver: 'redis', connection: 'cg', namespace: `cg${process.pid}`, leaseMs: 10_000, maxWaiters: 1024,
});

async function run(count, prefix) {
  let next = 0;
  async function loop() {
    while (next < count) {
      const lease = await driver.acquire(`${prefix}:${next++}`);
      void lease.fence;
      await lease.release();
    }
  }
  await Promise.all(Array.from({ length: Math.min(inflight, Math.max(count, 1)) }, loop));
}

await run(warmup, 'w');
await run(pairs, 'm');
await driver.shutdown();
