// Fan-out benchmark (issue 17): what release notifications cost Redis when many processes
// of a fleet subscribe.
//
//   node benchmarks/fanout.bench.mjs [--subscribers 0,10,100,400,800] [--modes namespace,per-key]
//     [--seconds 3] [--reps 3] [--inflight 64] [--cluster 0,100,800 | --cluster none]
//     [--per-key-channel '<ns>:lock-released:{<hash>}'] [--out DIR] [--tag NAME]
//
// One driver under test (its own process) runs acquire+release pairs over distinct keys,
// `--inflight` in flight, for `--seconds`, on a throwaway redis-server (never the machine's
// Redis). Meanwhile N idle connections, in ANOTHER process, subscribe as other processes
// with waiters would: in `namespace` mode (the default of the driver) to
// `<namespace>:lock-released`, where every release is published; in `per-key` mode
// (`notifications: 'per-key'`) to the per-key channels of OTHER keys (`--per-key-channel`,
// `<ns>` and `<hash>` = sha256 hex of the key replaced), so none of them is interested in
// any release of the run. Reported per point (medians of --reps repetitions, points
// interleaved in each repetition): pairs/s, redis-server CPU per pair (utime+stime from
// /proc/<pid>/stat around the window), bytes read per subscriber per release (the
// subscribers' socket.bytesRead), the driver process's CPU per pair.
//
// `--cluster`: the same on a 3-master Redis Cluster (cluster: true), Redis CPU summed over
// the three nodes per pair, and on a 1-master Cluster as the single-node baseline: `classic` (namespace mode: PUBLISH, which the cluster bus
// broadcasts to every node; subscribers spread over the nodes) and `sharded` (per-key
// mode: SPUBLISH; each subscriber SSUBSCRIBEs a per-key channel of another key on the node
// that owns its slot). A mode the built driver does not accept (`notifications` unknown) is
// skipped and said so. Writes benchmarks/results/<date>-fanout.json, .md and .svg.

import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';

import {
  childProcesses, commandVersion, gitInfo, here, machineBusy, machineInfo, median, packageDir, parseInfo,
  parseOptions, pkgVersion, processBusy, root, round, runMain,
  nextMessage,
  runStart,
} from './lib.mjs';
import { fanoutSvg } from './fanout-chart.mjs';
import { startClusterNodes, startWorker as startFleetWorker } from './fleet.mjs';

const require = createRequire(import.meta.url);
const NAMESPACE = 'bench';
const sha256hex = (s) => createHash('sha256').update(s, 'utf8').digest('hex');

function parseArgs(argv) {
  const v = parseOptions(argv, {
    subscribers: { type: 'string', default: '0,10,100,400,800' },
    modes: { type: 'string', default: 'namespace,per-key' },
    seconds: { type: 'string', default: '3' },
    reps: { type: 'string', default: '3' },
    inflight: { type: 'string', default: '64' },
    cluster: { type: 'string', default: '0,100,800' },
    'per-key-channel': { type: 'string', default: '<ns>:lock-released:{<hash>}' },
    out: { type: 'string' },
    tag: { type: 'string' },
    help: { type: 'boolean', short: 'h' },
  }, {
    help() {
      console.log('node benchmarks/fanout.bench.mjs [--subscribers 0,10,100,400,800] [--modes namespace,per-key] [--seconds 3] [--reps 3] [--inflight 64] [--cluster 0,100,800|none] [--per-key-channel \'<ns>:lock-released:{<hash>}\'] [--out DIR] [--tag NAME]');
      process.exit(0);
    },
  });
  const list = (s) => s.split(',').map((x) => x.trim()).filter(Boolean);
  const opts = {
    subscribers: list(v.subscribers).map(Number),
    modes: list(v.modes),
    seconds: Number(v.seconds),
    reps: Number(v.reps),
    inflight: Number(v.inflight),
    cluster: v.cluster === 'none' ? [] : list(v.cluster).map(Number),
    perKeyChannel: v['per-key-channel'],
    out: v.out === undefined ? path.join(here, 'results') : path.resolve(v.out),
    tag: v.tag,
  };
  if (!opts.subscribers.every((n) => Number.isInteger(n) && n >= 0)) throw new Error('--subscribers: non-negative integers');
  if (!opts.cluster.every((n) => Number.isInteger(n) && n >= 0)) throw new Error('--cluster: non-negative integers or none');
  if (!opts.modes.every((m) => ['namespace', 'per-key'].includes(m))) throw new Error('--modes: namespace and/or per-key');
  if (!(opts.seconds > 0)) throw new Error('--seconds must be > 0');
  if (!Number.isInteger(opts.reps) || opts.reps < 1) throw new Error('--reps must be an integer >= 1');
  if (!Number.isInteger(opts.inflight) || opts.inflight < 1) throw new Error('--inflight must be an integer >= 1');
  if (!opts.perKeyChannel.includes('<hash>')) throw new Error('--per-key-channel must contain <hash>');
  return opts;
}

const children = childProcesses();

const startWorker = (init) => startFleetWorker(children, path.join(here, 'fanout.worker.mjs'), init);

/** Whether the built driver accepts `notifications: value` (creating connects nothing). */
function driverAccepts(value) {
  const { createRedisLockDriver } = require(path.join(packageDir, 'index.js'));
  try {
    const d = createRedisLockDriver('redis://127.0.0.1:1', { driver: 'redis', connection: 'probe', namespace: 'probe', notifications: value });
    d.shutdown().catch(() => {});
    return true;
  } catch (err) {
    return `the built driver refuses notifications: '${value}' (${err.code ?? err.message})`;
  }
}

// ------------------------------------------------------------ deployments ----

async function standalone() {
  const { startRedis } = await import('../__test__/helpers/redis.mjs');
  const server = await startRedis();
  const info = parseInfo(await server.command('INFO', 'server'));
  return {
    kind: 'standalone', version: info.redis_version, url: server.url, cluster: false,
    pids: () => [server.pid],
    nodes: [{ host: '127.0.0.1', port: server.port, command: server.command }],
    flush: () => server.command('FLUSHALL'),
    // Every idle subscriber on the one server.
    subscriptions: async (mode, n, channelOf) => Array.from({ length: n }, (_, i) => ({
      host: '127.0.0.1', port: server.port,
      command: mode === 'namespace' ? ['SUBSCRIBE', `${NAMESPACE}:lock-released`] : ['SUBSCRIBE', channelOf(`idle:${i}`)],
    })),
    stop: () => server.stop(),
  };
}

// A Cluster of `masters` nodes, no replicas. One master (the baseline "single node" of a
// Cluster: the same cluster-enabled bookkeeping per key, no cluster bus traffic) gets every
// slot by CLUSTER ADDSLOTSRANGE, as redis-cli --cluster create wants 3 masters at least.
async function cluster(masters) {
  const servers = await startClusterNodes(masters);
  const info = parseInfo(await servers[0].command('INFO', 'server'));
  // Slot → node, for SSUBSCRIBE on the node that owns a channel's slot.
  const slots = await servers[0].command('CLUSTER', 'SLOTS');
  const ownerOfSlot = (slot) => {
    const range = slots.find(([from, to]) => slot >= from && slot <= to);
    return servers.find((s) => s.port === Number(range[2][1]));
  };
  const { default: Redis } = await import('ioredis');
  return {
    kind: masters === 1 ? 'cluster-1' : 'cluster', version: info.redis_version, url: servers[0].url, cluster: true,
    pids: () => servers.map((s) => s.pid),
    nodes: servers.map((s) => ({ host: '127.0.0.1', port: s.port, command: s.command })),
    // FLUSHALL runs on one node only in a cluster: every master.
    flush: () => Promise.all(servers.map((s) => s.command('FLUSHALL'))),
    subscriptions: async (mode, n, channelOf) => {
      if (mode === 'namespace') {
        // Classic pub/sub: a fleet's processes connect wherever; spread over the nodes.
        return Array.from({ length: n }, (_, i) => ({ host: '127.0.0.1', port: servers[i % masters].port, command: ['SUBSCRIBE', `${NAMESPACE}:lock-released`] }));
      }
      const admin = new Redis(servers[0].port, { lazyConnect: true });
      await admin.connect();
      try {
        const channels = Array.from({ length: n }, (_, i) => channelOf(`idle:${i}`));
        const p = admin.pipeline();
        for (const c of channels) p.cluster('KEYSLOT', c);
        const replies = await p.exec();
        return channels.map((c, i) => ({ host: '127.0.0.1', port: ownerOfSlot(replies[i][1]).port, command: ['SSUBSCRIBE', c] }));
      } finally {
        admin.disconnect();
      }
    },
    stop: async () => { for (const s of servers) await s.stop(); },
  };
}

// ------------------------------------------------------------------ points ----

async function measure(deployment, driver, subscribers, n, opts, tag) {
  await deployment.flush();
  if (subscribers) await subscribers.ask({ type: 'reset' }, 'reset');
  const pids = deployment.pids();
  const cpu0 = processBusy(pids);
  const perNode0 = pids.map((p) => processBusy([p]));
  const m0 = machineBusy();
  const t0 = performance.now();
  const done = await driver.ask({ type: 'go', seconds: opts.seconds, tag }, 'done', opts.seconds * 1000 + 60_000);
  const span = (performance.now() - t0) / 1000;
  const cpu1 = processBusy(pids);
  const perNode = pids.map((p, i) => round(processBusy([p]) - perNode0[i], 2));
  const m1 = machineBusy();
  const bytes = subscribers ? await subscribers.ask({ type: 'bytes' }, 'bytes') : { bytes: 0, connections: 0 };
  const redisCpuS = cpu1 - cpu0;
  return {
    subscribers: n,
    pairs: done.pairs,
    seconds: round(done.ms / 1000, 3),
    pairsPerSec: round(done.pairs / (done.ms / 1000), 1),
    redisCpuSeconds: round(redisCpuS, 2),
    redisCpuPerNodeSeconds: perNode,
    redisCpuUsPerPair: round((redisCpuS * 1e6) / done.pairs, 2),
    driverCpuUsPerPair: round(done.cpuUs / done.pairs, 2),
    bytesPerSubscriberPerRelease: n ? round(bytes.bytes / n / done.pairs, 2) : null,
    subscriberBytes: bytes.bytes,
    machineBusyShare: round((m1.busy - m0.busy) / (span * os.cpus().length), 3),
  };
}

const METRICS = ['pairsPerSec', 'redisCpuUsPerPair', 'driverCpuUsPerPair', 'bytesPerSubscriberPerRelease', 'machineBusyShare'];
function medians(reps) {
  const out = {};
  for (const k of METRICS) {
    const v = reps.map((r) => r[k]);
    out[k] = median(v);
    out[`${k}Range`] = v.some((x) => x === null) ? null : [Math.min(...v), Math.max(...v)];
  }
  return out;
}

async function runDeployment(deployment, modes, levels, opts, skipped) {
  const rows = {};
  const drivers = {};
  const channelOf = (key) => opts.perKeyChannel.replace('<ns>', NAMESPACE).replace('<hash>', sha256hex(key));
  try {
    for (const mode of modes) {
      drivers[mode] = await startWorker({
        role: 'driver', url: deployment.url, cluster: deployment.cluster, namespace: NAMESPACE, inflight: opts.inflight,
        notifications: mode === 'namespace' ? undefined : mode, packageDir,
      });
      for (const n of levels) rows[`${mode}:${n}`] = { mode, subscribers: n, reps: [] };
    }
    for (let rep = 1; rep <= opts.reps; rep++) {
      for (const n of levels) {
        for (const mode of modes) {
          const subs = n ? await startWorker({ role: 'subscribers', subscriptions: await deployment.subscriptions(mode, n, channelOf) }) : null;
          try {
            const m = await measure(deployment, drivers[mode], subs, n, opts, `${mode}:${n}:${rep}`);
            rows[`${mode}:${n}`].reps.push(m);
            console.error(`${deployment.kind} rep ${rep}/${opts.reps} ${mode.padEnd(9)} N=${String(n).padStart(3)}: ${m.pairsPerSec} pairs/s, redis ${m.redisCpuUsPerPair} µs/pair, ${m.bytesPerSubscriberPerRelease ?? '–'} B/sub/release, driver ${m.driverCpuUsPerPair} µs/pair, machine busy ${m.machineBusyShare}`);
          } finally {
            await subs?.close();
          }
        }
      }
    }
  } finally {
    for (const d of Object.values(drivers)) await d.close();
  }
  for (const r of Object.values(rows)) r.medians = medians(r.reps);
  return { kind: deployment.kind, redisVersion: deployment.version, skipped, rows: Object.values(rows) };
}

// --------------------------------------------------------------- reporting ----

const fmt = (x, d = 1) => (x === null || x === undefined ? '–' : Number(x).toFixed(d));
const k = (x) => (x >= 1000 ? `${(x / 1000).toFixed(1)}k` : fmt(x, 0));

function table(result, label) {
  if (!result.rows.length) return [`(${label}: not run${result.skipped.length ? `; ${result.skipped.join('; ')}` : ''})`];
  const levels = [...new Set(result.rows.map((r) => r.subscribers))];
  const modes = [...new Set(result.rows.map((r) => r.mode))];
  const get = (mode, n) => result.rows.find((r) => r.mode === mode && r.subscribers === n)?.medians;
  const lines = [`| ${label} | ${levels.map((n) => `${n}`).join(' | ')} |`, `|---|${levels.map(() => '---:').join('|')}|`];
  const base = (mode) => get(mode, levels[0])?.redisCpuUsPerPair;
  for (const mode of modes) {
    lines.push(`| ${mode}: Redis CPU per pair (µs) | ${levels.map((n) => fmt(get(mode, n)?.redisCpuUsPerPair)).join(' | ')} |`);
    lines.push(`| ${mode}: × the ${levels[0]}-subscriber cost | ${levels.map((n) => fmt(get(mode, n)?.redisCpuUsPerPair / base(mode), 2)).join(' | ')} |`);
    lines.push(`| ${mode}: pairs/s | ${levels.map((n) => k(get(mode, n)?.pairsPerSec)).join(' | ')} |`);
    lines.push(`| ${mode}: bytes per subscriber per release | ${levels.map((n) => (n ? fmt(get(mode, n)?.bytesPerSubscriberPerRelease, 1) : '–')).join(' | ')} |`);
  }
  return lines;
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const { startedAt, date, commandLine, addon, loadBefore } = runStart(import.meta.url);

  const modes = [];
  const skipped = [];
  for (const m of opts.modes) {
    const ok = m === 'namespace' ? true : driverAccepts(m);
    if (ok === true) modes.push(m); else { skipped.push(ok); console.error(`skipping ${m}: ${ok}`); }
  }

  const results = {};
  if (opts.subscribers.length) {
    const d = await standalone();
    try { results.standalone = await runDeployment(d, modes, opts.subscribers, opts, skipped); } finally { await d.stop(); }
  }
  if (opts.cluster.length) {
    const d = await cluster(3);
    try { results.cluster = await runDeployment(d, modes, opts.cluster, opts, skipped); } finally { await d.stop(); }
    const one = await cluster(1);
    try { results.clusterSingleNode = await runDeployment(one, modes, opts.cluster, opts, skipped); } finally { await one.stop(); }
  }

  // Targets (issue 17), from the medians of this run.
  const verdicts = [];
  const st = results.standalone;
  const row = (res, mode, n) => res?.rows.find((r) => r.mode === mode && r.subscribers === n)?.medians;
  const top = Math.max(...opts.subscribers);
  if (st && top > 0 && row(st, 'per-key', 0) && row(st, 'per-key', top)) {
    const ratio = row(st, 'per-key', top).redisCpuUsPerPair / row(st, 'per-key', 0).redisCpuUsPerPair;
    verdicts.push({ target: `per-key: Redis CPU per pair with ${top} subscribers on other keys <= 1.2x the 0-subscriber cost`, result: ratio <= 1.2 ? 'PASS' : 'FAIL', detail: `${fmt(row(st, 'per-key', top).redisCpuUsPerPair, 2)} vs ${fmt(row(st, 'per-key', 0).redisCpuUsPerPair, 2)} µs: ${fmt(ratio, 3)}x${row(st, 'namespace', top) ? ` (namespace mode: ${fmt(row(st, 'namespace', top).redisCpuUsPerPair / row(st, 'namespace', 0)?.redisCpuUsPerPair, 2)}x)` : ''}` });
    const bytes = Math.max(...st.rows.filter((r) => r.mode === 'per-key' && r.subscribers > 0).map((r) => Math.max(...r.reps.map((x) => x.bytesPerSubscriberPerRelease))));
    verdicts.push({ target: 'per-key: bytes read per uninterested subscriber per release = 0', result: bytes === 0 ? 'PASS' : 'FAIL', detail: `max over every repetition: ${bytes}` });
  }
  const cl = results.cluster;
  const one = results.clusterSingleNode;
  if (cl && one) {
    for (const n of opts.cluster) {
      const sharded = row(cl, 'per-key', n);
      const single = row(one, 'per-key', n);
      if (sharded && single) {
        const ratio = sharded.redisCpuUsPerPair / single.redisCpuUsPerPair;
        const classic = row(cl, 'namespace', n);
        const classicOne = row(one, 'namespace', n);
        const standalone = row(st, 'per-key', n);
        verdicts.push({ target: `cluster, per-key sharded, ${n} subscribers: Redis CPU per pair summed over 3 masters <= 1.2x a single node's`, result: ratio <= 1.2 ? 'PASS' : 'FAIL', detail: `${fmt(sharded.redisCpuUsPerPair, 2)} vs ${fmt(single.redisCpuUsPerPair, 2)} µs (a 1-master Cluster, per-key, ${n} subscribers): ${fmt(ratio, 3)}x; classic PUBLISH: ${fmt(classic?.redisCpuUsPerPair, 2)} vs ${fmt(classicOne?.redisCpuUsPerPair, 2)} µs (${fmt(classic?.redisCpuUsPerPair / classicOne?.redisCpuUsPerPair, 3)}x)${standalone ? `; standalone (not cluster-enabled) per-key: ${fmt(standalone.redisCpuUsPerPair, 2)} µs (${fmt(sharded.redisCpuUsPerPair / standalone.redisCpuUsPerPair, 3)}x)` : ''}` });
      }
    }
  }

  const meta = {
    benchmark: 'fanout', date, startedAt: startedAt.toISOString(), finishedAt: new Date().toISOString(), command: commandLine,
    machine: { ...machineInfo(), loadAverageBefore: loadBefore.map((x) => round(x, 2)), loadAverageAfter: os.loadavg().map((x) => round(x, 2)) },
    node: process.version, redisServer: commandVersion('redis-server'), addon, git: gitInfo(),
    packages: { '@dokebi/lock-redis': JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8')).version, ioredis: pkgVersion('ioredis') },
    setup: {
      seconds: opts.seconds, reps: opts.reps, inflight: opts.inflight, namespace: NAMESPACE, perKeyChannel: opts.perKeyChannel,
      definitions: {
        redisCpuUsPerPair: 'redis-server utime+stime (/proc/<pid>/stat, 10 ms ticks) over the window / pairs completed; cluster: summed over the 3 masters',
        bytesPerSubscriberPerRelease: 'bytes the idle subscriber connections read during the window (socket.bytesRead) / subscribers / releases (every release deletes its key and publishes)',
        subscribers: 'idle connections in a separate process; namespace: SUBSCRIBE <namespace>:lock-released; per-key: SUBSCRIBE (cluster: SSUBSCRIBE on the slot owner) a per-key channel of another key',
        driverCpuUsPerPair: 'the driver process\'s process.cpuUsage() over the window / pairs',
      },
    },
  };
  const out = { ...meta, results, targets: verdicts };
  mkdirSync(opts.out, { recursive: true });
  const base = path.join(opts.out, `${date}-fanout${opts.tag ? `-${opts.tag}` : ''}`);
  writeFileSync(`${base}.json`, JSON.stringify(out, null, 2) + '\n');
  const md = [
    `# Release fan-out, ${date}`, '',
    `\`${commandLine}\` — one driver, acquire+release pairs over distinct keys, ${opts.inflight} in flight, ${opts.seconds} s × ${opts.reps} reps (medians), N idle subscriber connections in another process.`,
    `Machine: ${meta.machine.cpu} × ${meta.machine.cores}; Node ${process.version}; ${meta.redisServer}; addon ${addon.build} ${addon.sha256}, git ${meta.git.head?.slice(0, 7)}${meta.git.dirty?.length ? ' + uncommitted changes' : ''}.`,
    '', '## Standalone', '', ...table(results.standalone ?? { rows: [], skipped }, 'subscribers'),
    '', '## 3-master Cluster (Redis CPU summed over the nodes; namespace = classic PUBLISH, per-key = sharded SPUBLISH)', '', ...table(results.cluster ?? { rows: [], skipped }, 'subscribers'),
    '', '## 1-master Cluster (every slot on one node: the single-node baseline of the Cluster target)', '', ...table(results.clusterSingleNode ?? { rows: [], skipped }, 'subscribers'),
    '', ...(verdicts.length ? ['## Targets', '', '| target | result | measured |', '|---|---|---|', ...verdicts.map((v) => `| ${v.target} | ${v.result} | ${v.detail} |`)] : []),
    '', ...(skipped.length ? [`Skipped: ${skipped.join('; ')}.`] : []), '',
  ].join('\n');
  writeFileSync(`${base}.md`, md);
  if (results.standalone?.rows.length) {
    writeFileSync(`${base}.svg`, fanoutSvg({
      title: 'redis-server CPU per acquire+release pair vs subscribed processes',
      subtitle: [`one driver, ${opts.inflight} in flight, distinct keys; idle subscribers in another process; medians of ${opts.reps} × ${opts.seconds} s (whiskers min–max)`,
        `${meta.machine.cpu} × ${meta.machine.cores}, ${meta.redisServer?.split(' ').slice(0, 3).join(' ')}, ${date}`],
      series: [...new Set(results.standalone.rows.map((r) => r.mode))].map((mode) => ({
        label: mode === 'namespace' ? 'namespace channel (default)' : `${mode} channels (subscribers on other keys)`,
        color: mode === 'namespace' ? '#d97706' : '#2563eb',
        points: results.standalone.rows.filter((r) => r.mode === mode).map((r) => ({ x: r.subscribers, y: r.medians.redisCpuUsPerPair, min: r.medians.redisCpuUsPerPairRange?.[0], max: r.medians.redisCpuUsPerPairRange?.[1] })),
      })),
    }));
  }
  console.log(md);
  console.log(`wrote ${path.relative(process.cwd(), base)}.{json,md${results.standalone?.rows.length ? ',svg' : ''}}`);
}

runMain(main, children);
