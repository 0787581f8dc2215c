// What a Redis Cluster costs Redis per acquire+release pair over one node (issue 23, item 6),
// and where it goes.
//
//   node benchmarks/cluster-cost.bench.mjs [--seconds 5] [--reps 3] [--inflight 64] [--notifications namespace|per-key]
//     [--client driver|redis-semaphore] [--out DIR] [--tag NAME]
//
// One driver (its own process, benchmarks/fanout.worker.mjs, `--notifications` mode, no
// subscribers) runs acquire+release pairs over distinct keys on three deployments: a plain
// standalone server, a 1-master Cluster (every slot on one node) and a 3-master Cluster; and
// on the same 3-master Cluster with only keys of its first master (cluster-3-one-shard), to
// tell what three masters cost from what spreading the load over three busy processes costs;
// and on three standalone servers with a driver each (standalone-3, `--client driver` only),
// the same spread with no Cluster.
// Each repetition measures, per deployment, an IDLE window (the driver connected, sending
// nothing) and then a BUSY window of the same length, and per node: redis-server CPU
// (utime+stime from /proc), the commands Redis ran (INFO commandstats), the bytes it read
// and wrote (INFO stats) and the cluster bus messages (CLUSTER INFO). Reported: Redis CPU
// per pair summed over the nodes, the same less what the same nodes burn idle over the
// window (cluster cron and bus, the client's pings), and commands, bytes and bus messages
// per pair. Writes benchmarks/results/<date>-cluster-cost.json and .md.
//
// `--client redis-semaphore` runs the same pairs with a peer library instead (a Mutex's
// acquire and release on one ioredis client, `new Cluster([url's node])` on a Cluster): the
// baseline for what splitting the same load over three masters costs any client.

import { readFileSync, mkdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

import {
  childProcesses, commandStats, commandVersion, gitInfo, here, machineInfo, median, packageDir, parseInfo,
  parseOptions, pkgVersion, processBusy, processKernel, root, round, runMain, targetsSection,
  runStart,
} from './lib.mjs';
import { startClusterNodes, startWorker } from './fleet.mjs';

const NAMESPACE = 'bench';
const children = childProcesses();

function parseArgs(argv) {
  const v = parseOptions(argv, {
    seconds: { type: 'string', default: '5' },
    reps: { type: 'string', default: '3' },
    inflight: { type: 'string', default: '64' },
    notifications: { type: 'string', default: 'namespace' },
    client: { type: 'string', default: 'driver' },
    out: { type: 'string', default: path.join(here, 'results') },
    tag: { type: 'string' },
  }, { help: () => console.log('node benchmarks/cluster-cost.bench.mjs [--seconds 5] [--reps 3] [--inflight 64] [--notifications namespace|per-key] [--client driver|redis-semaphore] [--out DIR] [--tag NAME]') });
  const opts = { seconds: Number(v.seconds), reps: Number(v.reps), inflight: Number(v.inflight), out: v.out, tag: v.tag, notifications: v.notifications, client: v.client };
  if (!['driver', 'redis-semaphore'].includes(opts.client)) throw new Error('--client must be driver or redis-semaphore');
  if (!['namespace', 'per-key'].includes(opts.notifications)) throw new Error('--notifications must be namespace or per-key');
  if (!(opts.seconds > 0)) throw new Error('--seconds must be > 0');
  if (!Number.isInteger(opts.reps) || opts.reps < 1) throw new Error('--reps must be an integer >= 1');
  if (!Number.isInteger(opts.inflight) || opts.inflight < 1) throw new Error('--inflight must be an integer >= 1');
  return opts;
}

async function deployment(kind) {
  if (kind === 'standalone' || kind === 'standalone-3') {
    const { startRedis } = await import('../__test__/helpers/redis.mjs');
    const servers = [];
    for (let i = kind === 'standalone' ? 1 : 3; i > 0; i--) servers.push(await startRedis());
    return { kind, cluster: false, servers };
  }
  const servers = await startClusterNodes(kind === 'cluster-1' ? 1 : 3);
  return { kind, cluster: true, servers };
}

/** The slots the first node of a Cluster serves, as [first, last] (one range: redis-cli's split). */
async function firstNodeSlots(servers) {
  const id = String(await servers[0].command('CLUSTER', 'MYID'));
  const ranges = (await servers[0].command('CLUSTER', 'SLOTS')).filter((r) => String(r[2][2]) === id);
  if (ranges.length !== 1) throw new Error(`the first node serves ${ranges.length} slot ranges, not one`);
  return [Number(ranges[0][0]), Number(ranges[0][1])];
}

/** How often a process was preempted: another process took its core (/proc). */
function preemptions(pid) {
  try {
    return Number(/^nonvoluntary_ctxt_switches:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? 0);
  } catch {
    return 0;
  }
}

/** Counters of one node now: CPU seconds, commands by name, bytes in and out, bus messages. */
async function counters(server) {
  const stats = parseInfo(await server.command('INFO', 'stats'));
  const bus = server.cluster ? parseInfo(await server.command('CLUSTER', 'INFO')) : {};
  return {
    cpu: processBusy([server.pid]),
    stime: processKernel(server.pid),
    preempted: preemptions(server.pid),
    commands: commandStats(await server.command('INFO', 'commandstats')),
    bytesIn: Number(stats.total_net_input_bytes),
    bytesOut: Number(stats.total_net_output_bytes),
    // Socket reads and writes: how many commands Redis gets per wake-up (its batching).
    reads: Number(stats.total_reads_processed ?? 0),
    writes: Number(stats.total_writes_processed ?? 0),
    busMessages: Number(bus.cluster_stats_messages_sent ?? 0) + Number(bus.cluster_stats_messages_received ?? 0),
  };
}

function delta(after, before) {
  const commands = {};
  for (const [name, calls] of Object.entries(after.commands)) {
    const d = calls - (before.commands[name] ?? 0);
    if (d > 0) commands[name] = d;
  }
  // The INFO and CLUSTER INFO asked here are ours, not the driver's.
  commands.info = (commands.info ?? 0) - 2;
  if (commands.cluster) commands.cluster -= 1;
  for (const name of Object.keys(commands)) if (commands[name] <= 0) delete commands[name];
  return {
    cpu: after.cpu - before.cpu, commands,
    stime: after.stime - before.stime, preempted: after.preempted - before.preempted,
    bytesIn: after.bytesIn - before.bytesIn, bytesOut: after.bytesOut - before.bytesOut,
    reads: after.reads - before.reads, writes: after.writes - before.writes,
    busMessages: after.busMessages - before.busMessages,
  };
}

async function window(servers, run) {
  const before = await Promise.all(servers.map(counters));
  const t0 = performance.now();
  const result = await run();
  const seconds = (performance.now() - t0) / 1000;
  const after = await Promise.all(servers.map(counters));
  return { seconds, result, nodes: after.map((a, i) => delta(a, before[i])) };
}

const sum = (xs) => xs.reduce((a, b) => a + b, 0);

async function measure(d, driver, opts, tag) {
  await Promise.all(d.servers.map((s) => s.command('FLUSHALL')));
  const idle = await window(d.servers, () => sleep(opts.seconds * 1000));
  const busy = await window(d.servers, () => driver.ask({ type: 'go', seconds: opts.seconds, tag }, 'done', opts.seconds * 1000 + 60_000));
  const pairs = busy.result.pairs;
  const idleCpuPerSecond = sum(idle.nodes.map((n) => n.cpu)) / idle.seconds;
  const busyCpu = sum(busy.nodes.map((n) => n.cpu));
  const commands = {};
  for (const n of busy.nodes) for (const [name, calls] of Object.entries(n.commands)) commands[name] = (commands[name] ?? 0) + calls;
  const idleCommands = {};
  for (const n of idle.nodes) for (const [name, calls] of Object.entries(n.commands)) idleCommands[name] = (idleCommands[name] ?? 0) + calls;
  return {
    pairs,
    pairsPerSec: round(pairs / busy.seconds, 1),
    redisCpuUsPerPair: round((busyCpu * 1e6) / pairs, 2),
    idleRedisCpuUsPerSecond: round(idleCpuPerSecond * 1e6, 0),
    redisCpuUsPerPairLessIdle: round(((busyCpu - idleCpuPerSecond * busy.seconds) * 1e6) / pairs, 2),
    redisCpuPerNodeSeconds: busy.nodes.map((n) => round(n.cpu, 2)),
    commandsPerPair: Object.fromEntries(Object.entries(commands).map(([k, v]) => [k, round(v / pairs, 4)])),
    idleCommandsPerSecond: Object.fromEntries(Object.entries(idleCommands).map(([k, v]) => [k, round(v / idle.seconds, 2)])),
    bytesInPerPair: round(sum(busy.nodes.map((n) => n.bytesIn)) / pairs, 1),
    bytesOutPerPair: round(sum(busy.nodes.map((n) => n.bytesOut)) / pairs, 1),
    socketReadsPerPair: round(sum(busy.nodes.map((n) => n.reads)) / pairs, 3),
    socketWritesPerPair: round(sum(busy.nodes.map((n) => n.writes)) / pairs, 3),
    kernelCpuUsPerPair: round((sum(busy.nodes.map((n) => n.stime)) * 1e6) / pairs, 2),
    preemptionsPerThousandPairs: round((sum(busy.nodes.map((n) => n.preempted)) * 1000) / pairs, 2),
    busMessagesPerSecondIdle: round(sum(idle.nodes.map((n) => n.busMessages)) / idle.seconds, 1),
    busMessagesPerSecondBusy: round(sum(busy.nodes.map((n) => n.busMessages)) / busy.seconds, 1),
    driverCpuUsPerPair: round(busy.result.cpuUs / pairs, 2),
  };
}

const METRICS = ['pairsPerSec', 'redisCpuUsPerPair', 'redisCpuUsPerPairLessIdle', 'idleRedisCpuUsPerSecond', 'bytesInPerPair', 'bytesOutPerPair', 'socketReadsPerPair', 'socketWritesPerPair', 'kernelCpuUsPerPair', 'preemptionsPerThousandPairs', 'busMessagesPerSecondIdle', 'busMessagesPerSecondBusy', 'driverCpuUsPerPair'];

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const { startedAt, date, commandLine, addon, loadBefore } = runStart(import.meta.url);

  // cluster-3-one-shard: the same 3-master Cluster as cluster-3, every key on its first
  // master: one busy node, as in cluster-1, with the others idle beside it.
  // standalone-3: three standalone servers, one driver each in the same process, the pairs
  // dealt out in turn: the same load spread over three busy servers with no Cluster at all.
  const kinds = ['standalone', ...(opts.client === 'driver' ? ['standalone-3'] : []), 'cluster-1', 'cluster-3', 'cluster-3-one-shard'];
  const deployments = {};
  const drivers = {};
  const reps = Object.fromEntries(kinds.map((k) => [k, []]));
  try {
    for (const kind of kinds) {
      const shared = kind === 'cluster-3-one-shard';
      deployments[kind] = shared ? deployments['cluster-3'] : await deployment(kind);
      for (const s of deployments[kind].servers) s.cluster = deployments[kind].cluster;
      drivers[kind] = await startWorker(children, path.join(here, 'fanout.worker.mjs'), {
        role: 'driver', url: deployments[kind].servers[0].url,
        urls: kind === 'standalone-3' ? deployments[kind].servers.map((s) => s.url) : undefined, cluster: deployments[kind].cluster, namespace: NAMESPACE, inflight: opts.inflight, packageDir, client: opts.client,
        notifications: opts.notifications === 'namespace' ? undefined : opts.notifications,
        slots: shared ? await firstNodeSlots(deployments[kind].servers) : undefined,
      });
    }
    // Interleaved, so a change in what else the machine runs falls on every deployment.
    for (let rep = 1; rep <= opts.reps; rep++) {
      for (const kind of kinds) {
        const m = await measure(deployments[kind], drivers[kind], opts, `${kind}:${rep}`);
        reps[kind].push(m);
        console.error(`${kind.padEnd(10)} rep ${rep}/${opts.reps}: ${m.pairsPerSec} pairs/s, Redis ${m.redisCpuUsPerPair} µs/pair (${m.redisCpuUsPerPairLessIdle} less idle; idle ${m.idleRedisCpuUsPerSecond} µs/s), ${m.bytesInPerPair} B in, ${m.bytesOutPerPair} B out, bus ${m.busMessagesPerSecondBusy}/s, commands ${JSON.stringify(m.commandsPerPair)}`);
      }
    }
  } finally {
    for (const d of Object.values(drivers)) await d.close();
    for (const d of new Set(Object.values(deployments))) for (const s of d.servers) await s.stop();
  }

  const results = {};
  for (const kind of kinds) {
    const medians = {};
    for (const k of METRICS) medians[k] = median(reps[kind].map((r) => r[k]));
    results[kind] = { medians, reps: reps[kind] };
  }
  const m = (kind, k) => results[kind].medians[k];
  const ratio = m('cluster-3', 'redisCpuUsPerPair') / m('cluster-1', 'redisCpuUsPerPair');
  const ratioLessIdle = m('cluster-3', 'redisCpuUsPerPairLessIdle') / m('cluster-1', 'redisCpuUsPerPairLessIdle');
  const verdicts = [{
    target: '3-master Cluster: Redis CPU per pair summed over the masters <= 1.2x a single node\'s (a 1-master Cluster)',
    result: ratio <= 1.2 ? 'PASS' : 'FAIL',
    detail: `${m('cluster-3', 'redisCpuUsPerPair')} vs ${m('cluster-1', 'redisCpuUsPerPair')} µs: ${round(ratio, 3)}x; less what the same nodes burn idle: ${m('cluster-3', 'redisCpuUsPerPairLessIdle')} vs ${m('cluster-1', 'redisCpuUsPerPairLessIdle')} µs, ${round(ratioLessIdle, 3)}x`,
  }];
  const spread = () => m('cluster-3', 'redisCpuUsPerPair') / m('standalone-3', 'redisCpuUsPerPair');
  const spreadAlone = () => m('standalone-3', 'redisCpuUsPerPair') / m('standalone', 'redisCpuUsPerPair');
  if (results['standalone-3']) verdicts.push({
    target: 'what the Cluster adds to a spread load: 3-master Cluster over three standalone servers carrying the same pairs (no target; for reading the one above)',
    result: 'INFO',
    detail: `${m('cluster-3', 'redisCpuUsPerPair')} vs ${m('standalone-3', 'redisCpuUsPerPair')} µs: ${round(spread(), 3)}x; three standalone servers over one: ${round(spreadAlone(), 3)}x`,
  });

  const out = {
    benchmark: 'cluster-cost', date, startedAt: startedAt.toISOString(), finishedAt: new Date().toISOString(), command: commandLine,
    machine: { ...machineInfo(), loadAverageBefore: loadBefore.map((x) => round(x, 2)), loadAverageAfter: os.loadavg().map((x) => round(x, 2)) },
    node: process.version, redisServer: commandVersion('redis-server'), addon, git: gitInfo(),
    packages: {
      '@dokebi/lock-redis': JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8')).version,
      ...(opts.client === 'redis-semaphore' ? { ioredis: pkgVersion('ioredis'), 'redis-semaphore': pkgVersion('redis-semaphore') } : {}),
    },
    setup: {
      seconds: opts.seconds, reps: opts.reps, inflight: opts.inflight, namespace: NAMESPACE, client: opts.client,
      notifications: opts.client === 'driver' ? opts.notifications : undefined,
      definitions: {
        redisCpuUsPerPair: 'redis-server utime+stime (/proc/<pid>/stat, 10 ms ticks) over the busy window, summed over the nodes, / pairs completed',
        redisCpuUsPerPairLessIdle: 'the same less the nodes\' CPU per second in the idle window just before (driver connected, sending nothing) times the busy window\'s length',
        commandsPerPair: 'INFO commandstats calls over the busy window, summed over the nodes, / pairs (the benchmark\'s own INFO and CLUSTER INFO taken out)',
        kernelCpuUsPerPair: 'redis-server stime over the busy window (/proc/<pid>/stat), summed over the nodes, / pairs: the system calls\' share of the CPU per pair',
        preemptionsPerThousandPairs: 'nonvoluntary_ctxt_switches of the redis-servers (/proc/<pid>/status) over the busy window, per 1000 pairs: how often another process took the core from a busy node',
        socketReadsPerPair: 'INFO stats total_reads_processed over the busy window, summed over the nodes, / pairs: fewer commands per read means less batching per wake-up (the same for writes)',
        busMessages: 'CLUSTER INFO cluster_stats_messages_sent + _received, summed over the nodes, per second',
      },
    },
    results, targets: verdicts,
  };
  mkdirSync(opts.out, { recursive: true });
  const base = path.join(opts.out, `${date}-cluster-cost${opts.tag ? `-${opts.tag}` : ''}`);
  writeFileSync(`${base}.json`, JSON.stringify(out, null, 2) + '\n');
  const row = (label, k) => `| ${label} | ${kinds.map((kind) => m(kind, k)).join(' | ')} |`;
  const commandNames = [...new Set(kinds.flatMap((kind) => Object.keys(results[kind].reps.at(-1).commandsPerPair)))].sort();
  const md = [
    `# What a Cluster costs Redis per pair, ${date}`, '',
    `\`${commandLine}\` — ${opts.client === 'driver' ? `one driver, notifications '${opts.notifications}' and no subscriber` : 'redis-semaphore Mutex on one ioredis client (the peer baseline)'}, acquire+release pairs over distinct keys, ${opts.inflight} in flight; per repetition an idle window, then a busy one, ${opts.seconds} s each, × ${opts.reps} reps (medians).`,
    `Machine: ${out.machine.cpu} × ${out.machine.cores}; Node ${process.version}; ${out.redisServer}; addon ${addon.build} ${addon.sha256}, git ${out.git.head?.slice(0, 7)}${out.git.dirty?.length ? ' + uncommitted changes' : ''}.`,
    '', `| | ${kinds.join(' | ')} |`, `|---|${kinds.map(() => '---:').join('|')}|`,
    row('pairs/s', 'pairsPerSec'),
    row('Redis CPU per pair, µs (summed over the nodes)', 'redisCpuUsPerPair'),
    row('the same less idle CPU, µs', 'redisCpuUsPerPairLessIdle'),
    row('idle Redis CPU, µs per second', 'idleRedisCpuUsPerSecond'),
    row('bytes Redis read per pair', 'bytesInPerPair'),
    row('bytes Redis wrote per pair', 'bytesOutPerPair'),
    row('socket reads per pair (summed over the nodes)', 'socketReadsPerPair'),
    row('socket writes per pair (summed over the nodes)', 'socketWritesPerPair'),
    row('kernel CPU per pair, µs', 'kernelCpuUsPerPair'),
    row('redis-server preemptions per 1000 pairs', 'preemptionsPerThousandPairs'),
    row('cluster bus messages per second, idle', 'busMessagesPerSecondIdle'),
    row('cluster bus messages per second, busy', 'busMessagesPerSecondBusy'),
    row('driver process CPU per pair, µs', 'driverCpuUsPerPair'),
    ...commandNames.map((name) => `| commands per pair: ${name} (last rep) | ${kinds.map((kind) => results[kind].reps.at(-1).commandsPerPair[name] ?? 0).join(' | ')} |`),
    '', ...targetsSection(verdicts),
  ].join('\n');
  writeFileSync(`${base}.md`, md + '\n');
  console.log(md);
}

runMain(main, children);
