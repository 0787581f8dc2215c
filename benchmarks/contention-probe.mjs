// Contention probe: what Redis sees while processes contend for one key (the workload of
// benchmarks/lock-contention.bench.mjs, one configuration of this driver, one repetition),
// to tell why one notification mode hands a key over later than another.
//
//   node benchmarks/contention-probe.mjs [--modes namespace,per-key] [--shape 4x8] [--seconds 6]
//
// DOKEBI_BENCH_PACKAGE=<package dir> runs another build (as the contention benchmark's variants do).
// Per mode, on a throwaway redis-server: acquisitions, utilization, the hand-off gap to
// another process (p50/p90/p99 and a histogram), acquire attempts and notifications
// received per acquisition (the workers' stats()), INFO commandstats for SUBSCRIBE,
// UNSUBSCRIBE, PUBLISH and EVALSHA over the window (are subscriptions dropped and made again
// between hand-offs?), PUBSUB NUMSUB of the channel and the subscribe connections' ids and
// ages once a second (the release script's reply is 1 + NUMSUB), and one second of MONITOR
// counted by command. Prints one JSON object per mode.

import { createHash } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';

import { childProcesses, commandStats, contentionWorkers, monitorLines, nextMessage, parseOptions, parseShape, percentile, round, runMain } from './lib.mjs';

const now = () => performance.timeOrigin + performance.now();
const children = childProcesses();

/** Commands seen by MONITOR for `ms`, by name (`lua:` for those run inside scripts). */
function monitor(port, ms) {
  return new Promise((resolve) => {
    const counts = {};
    const lines = monitorLines(port, (line) => {
      const m = /\[\d+ (lua|[^\]]+)\] "([^"]+)"/.exec(line);
      if (m) {
        const k = (m[1] === 'lua' ? 'lua:' : '') + m[2].toUpperCase();
        counts[k] = (counts[k] ?? 0) + 1;
      }
    });
    setTimeout(() => { lines.stop(); resolve(counts); }, ms);
  });
}

async function probe(mode, shape, seconds) {
  const { startRedis } = await import('../__test__/helpers/redis.mjs');
  const server = await startRedis();
  try {
    const key = 'contention:probe';
    const hash = createHash('sha256').update(key).digest('hex');
    const channel = mode === 'namespace' ? 'bench:lock-released' : `bench:lock-released:{${hash}}`;
    const procs = await contentionWorkers(children, { ...shape, mode, url: server.url, key });
    await server.command('CONFIG', 'RESETSTAT');
    const startAt = now() + 150;
    const endAt = startAt + seconds * 1000;
    const results = procs.map((c) => nextMessage(c, 'result', seconds * 1000 + 60_000));
    for (const c of procs) c.send({ type: 'go', startAt, endAt });
    const samples = [];
    let monitored = null;
    for (let t = 1; t < seconds; t++) {
      await sleep(Math.max(0, startAt + t * 1000 - now()));
      const subscribers = String(await server.command('CLIENT', 'LIST')).split('\n').filter((l) => / sub=[1-9]/.test(l))
        .map((l) => `id ${/id=(\d+)/.exec(l)[1]} age ${/age=(\d+)/.exec(l)[1]}s`);
      const [, numsub] = await server.command('PUBSUB', 'NUMSUB', channel);
      samples.push({ second: t, numsub, subscribeConnections: subscribers.sort() });
      if (t === 2) monitored = await monitor(server.port, 1000);
    }
    const outs = await Promise.all(results);
    const stats = commandStats(await server.command('INFO', 'commandstats'));

    const all = outs.flatMap((o) => o.records.map(([w, t0, t1, t2]) => ({ proc: o.proc, w, t0, t1, t2 }))).sort((a, b) => a.t1 - b.t1);
    const inWindow = all.filter((r) => r.t1 >= startAt && r.t1 < endAt);
    let held = 0;
    for (const r of all) held += Math.max(0, Math.min(r.t2, endAt) - Math.max(r.t1, startAt));
    const edges = [0.5, 1, 2, 3, 5, 25, Infinity];
    const histogram = Object.fromEntries(edges.map((e) => [e === Infinity ? '>25' : `<=${e}`, 0]));
    const gaps = [];
    for (let i = 1; i < all.length; i++) {
      const [prev, cur] = [all[i - 1], all[i]];
      if (cur.t1 < startAt || cur.t1 >= endAt || cur.proc === prev.proc) continue;
      const gap = cur.t1 - prev.t2;
      gaps.push(gap);
      const e = edges.find((x) => gap <= x);
      histogram[e === Infinity ? '>25' : `<=${e}`]++;
    }
    gaps.sort((a, b) => a - b);
    const sum = (k) => outs.reduce((s, o) => s + (o.driverStats?.[k] ?? 0), 0);
    return {
      mode, shape: `${shape.processes}x${shape.waiters}`, seconds, package: process.env.DOKEBI_BENCH_PACKAGE ? 'DOKEBI_BENCH_PACKAGE' : 'this checkout',
      acquisitions: inWindow.length, acquisitionsPerSecond: round(inWindow.length / seconds, 1), utilization: round(held / (endAt - startAt), 3),
      handOffToAnotherProcessMs: { p50: round(percentile(gaps, 50), 3), p90: round(percentile(gaps, 90), 3), p99: round(percentile(gaps, 99), 3), histogram },
      attemptsPerAcquisition: round(sum('redisAttempts') / inWindow.length, 2),
      notificationsReceivedPerAcquisition: round(sum('notificationsReceived') / inWindow.length, 2),
      commandstats: { subscribe: stats.subscribe ?? 0, unsubscribe: stats.unsubscribe ?? 0, publish: stats.publish ?? 0, evalsha: stats.evalsha ?? 0 },
      monitorOneSecond: monitored,
      samples,
    };
  } finally {
    await server.stop();
  }
}

async function main() {
  const v = parseOptions(process.argv.slice(2), {
    modes: { type: 'string', default: 'namespace,per-key' },
    shape: { type: 'string', default: '4x8' },
    seconds: { type: 'string', default: '6' },
    help: { type: 'boolean', short: 'h' },
  }, { help() { console.log('node benchmarks/contention-probe.mjs [--modes namespace,per-key] [--shape 4x8] [--seconds 6]'); process.exit(0); } });
  const shape = parseShape(v.shape, '--shape');
  const seconds = Number(v.seconds);
  if (!(Number.isInteger(seconds) && seconds >= 3)) throw new Error('--seconds: an integer >= 3');
  for (const mode of v.modes.split(',').map((m) => m.trim()).filter(Boolean)) {
    if (!['namespace', 'per-key'].includes(mode)) throw new Error('--modes: namespace and/or per-key');
    console.log(JSON.stringify(await probe(mode, shape, seconds), null, 2));
  }
}

runMain(main, children);
