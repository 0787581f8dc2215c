// What a user notices when one Cluster master refuses SSUBSCRIBE (issue 23 item 5,
// decision 0160): the hand-off time of a per-key lock, with the default safety intervals
// (pollIntervalMs 25, notifyPollIntervalMs 250).
//
//   node benchmarks/notify-nodes.bench.mjs [--trials 20] [--out DIR] [--tag NAME]
//   DOKEBI_BENCH_PACKAGE=/path/to/other/checkout node benchmarks/notify-nodes.bench.mjs --tag before
//
// Two 3-master Clusters in the same run: a healthy one (the baseline) and one whose master 0
// has SSUBSCRIBE renamed away (SPUBLISH still works there, as on the others). On each, for a
// key of master 0 and then a key of master 1: one driver holds the key, a second driver's
// acquire waits on it (the same two drivers for both keys); once its subscription is judged and a random 300–550 ms have
// passed (so the release falls anywhere in the waiter's safety sleep), the holder releases.
// Measured: release() called → the waiter's acquire resolved, and whether the waiter heard a
// notification. Reported: medians and p90 per case, and each case's median over the healthy
// Cluster's median for the same master (the ratio). Writes
// benchmarks/results/<date>-notify-nodes[-<tag>].json.

import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdirSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

import { commandVersion, gitInfo, here, machineInfo, median, packageDir, parseOptions, percentile, round, runStart } from './lib.mjs';

const require = createRequire(import.meta.url);
const NAMESPACE = 'nodes';

function parseArgs(argv) {
  const v = parseOptions(argv, {
    trials: { type: 'string', default: '20' },
    out: { type: 'string', default: path.join(here, 'results') },
    tag: { type: 'string' },
  }, { help: () => console.log('node benchmarks/notify-nodes.bench.mjs [--trials 20] [--out DIR] [--tag NAME]') });
  const trials = Number(v.trials);
  if (!Number.isInteger(trials) || trials < 1) throw new Error('--trials must be an integer >= 1');
  return { trials, out: v.out, tag: v.tag };
}

async function startCluster(refusing) {
  const { startRedis } = await import('../__test__/helpers/redis.mjs');
  const { freePort } = await import('../__test__/helpers/lock.mjs');
  const servers = [];
  for (let i = 0; i < 3; i++) {
    const args = ['--cluster-enabled', 'yes', '--cluster-port', String(await freePort()), '--cluster-node-timeout', '5000'];
    if (refusing && i === 0) args.push('--rename-command', 'SSUBSCRIBE', '');
    servers.push(await startRedis({ args }));
  }
  execFileSync('redis-cli', ['--cluster', 'create', ...servers.map((s) => `127.0.0.1:${s.port}`), '--cluster-replicas', '0', '--cluster-yes'], { stdio: 'ignore' });
  for (const until = Date.now() + 20_000; ;) {
    const ok = await Promise.all(servers.map(async (s) => String(await s.command('CLUSTER', 'INFO')).includes('cluster_state:ok')));
    if (ok.every(Boolean)) break;
    if (Date.now() > until) throw new Error('the cluster did not become ok');
    await sleep(100);
  }
  return servers;
}

/** A key whose lock key master `master` serves (the others answer MOVED). */
async function keyOf(servers, master) {
  for (let i = 0; ; i++) {
    const key = `job-${i}`;
    const lock = `${NAMESPACE}:lock:{${createHash('sha256').update(key).digest('hex')}}`;
    try {
      await servers[master].command('EXISTS', lock);
      return key;
    } catch { /* MOVED: another master's */ }
  }
}

async function handOffs(servers, { holder, waiter }, master, trials) {
  const key = await keyOf(servers, master);
  const ms = [];
  let heard = 0;
  const states = new Set();
  {
    for (let t = 0; t < trials; t++) {
      const held = await holder.acquire(key);
      const waiting = waiter.acquire(key, { waitTimeoutMs: 5_000 });
      for (const until = Date.now() + 5_000; ;) {
        const s = waiter.stats();
        if (s.waiters === 1 && (s.subscription === 'live' || s.subscription === 'partial')) break;
        if (Date.now() > until) throw new Error(`no judged subscription: ${s.subscription}`);
        await sleep(5);
      }
      await sleep(300 + Math.random() * 250);
      states.add(waiter.stats().subscription);
      const before = waiter.stats().notificationsReceived;
      const t0 = performance.now();
      await held.release();
      const lease = await waiting;
      ms.push(performance.now() - t0);
      if (waiter.stats().notificationsReceived > before) heard++;
      await lease.release();
    }
  }
  const sorted = [...ms].sort((a, b) => a - b);
  return { master, trials, medianMs: round(median(ms)), p90Ms: round(percentile(sorted, 90)), maxMs: round(sorted.at(-1)), heardByNotification: heard, subscriptionStates: [...states] };
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const start = runStart(import.meta.url);
  const cases = {};
  for (const [name, refusing] of [['healthy', false], ['master0-refuses-ssubscribe', true]]) {
    const servers = await startCluster(refusing);
    // One pair of drivers per Cluster, master 0's key first: before decision 0160 the
    // waiter's first refusal switched its keys on every master to classic pub/sub.
    const { createRedisLockDriver } = require(`${packageDir}/index.js`);
    const connection = { url: `redis://127.0.0.1:${servers[0].port}`, cluster: true };
    const options = { driver: 'redis', connection: 'bench', namespace: NAMESPACE, notifications: 'per-key', leaseMs: 10_000 };
    const drivers = { holder: createRedisLockDriver(connection, options), waiter: createRedisLockDriver(connection, options) };
    try {
      for (const master of [0, 1]) {
        const r = await handOffs(servers, drivers, master, opts.trials);
        cases[`${name}/master${master}`] = r;
        console.log(name, `master ${master}:`, JSON.stringify(r));
      }
    } finally {
      await drivers.waiter.shutdown();
      await drivers.holder.shutdown();
      for (const s of servers) await s.stop();
    }
  }
  const ratios = {};
  for (const master of [0, 1]) {
    ratios[`master${master}`] = round(cases[`master0-refuses-ssubscribe/master${master}`].medianMs / cases[`healthy/master${master}`].medianMs, 2);
  }
  console.log('median hand-off, refusing / healthy:', JSON.stringify(ratios));
  const result = {
    benchmark: 'notify-nodes', date: start.startedAt.toISOString(), commandLine: start.commandLine,
    packageDir, addon: start.addon, git: gitInfo(), machine: machineInfo(), node: process.version,
    redis: commandVersion('redis-server'), loadBefore: start.loadBefore,
    intervals: { pollIntervalMs: 25, notifyPollIntervalMs: 250 }, cases, medianRatioRefusingOverHealthy: ratios,
  };
  mkdirSync(opts.out, { recursive: true });
  const file = path.join(opts.out, `${start.date}-notify-nodes${opts.tag ? `-${opts.tag}` : ''}.json`);
  writeFileSync(file, `${JSON.stringify(result, null, 2)}\n`);
  console.log('wrote', path.relative(process.cwd(), file));
}

main().then(() => process.exit(0), (err) => {
  console.error(err);
  process.exit(1);
});
