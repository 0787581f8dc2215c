// npm run chaos -- --seconds N --seed S --mode standalone|sentinel|cluster --min-replicas N [--notifications namespace|per-key|mixed] [--probe ioredis] [--stop-at-violation]
//
// A seeded, time-bounded chaos run (issue 16): throwaway servers, several client processes
// each with one driver and several workers contending on a few keys through a fenced store
// held here, a nemesis injecting overlapping faults, and a checker over the whole recorded
// history. Prints a summary; a failing run prints its seed and the history around each
// violation, and exits 1. docs/CHAOS.md has the figures and what they mean.

import { fork, execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { writeFileSync, existsSync, readFileSync, readdirSync, readlinkSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import { Worker } from 'node:worker_threads';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { parseOptions, root } from '../lib.mjs';
import { startProxy } from '../../__test__/helpers/proxy.mjs';
import { encode, parseReply } from '../../__test__/helpers/redis.mjs';
import { admin, MASTER, startRedisCluster, startSentinelCluster, startStandalone } from './cluster.mjs';
import { check, excerpt, formatEvent, formatGaps, formatSignal, formatSilentCuts, INVARIANTS } from './checker.mjs';
import { createNemesis } from './nemesis.mjs';
import { now, rng } from './prng.mjs';

const MUTANT_BUILD = path.join(root, 'target', 'chaos-mutants', 'lock-redis.linux-x64-gnu.node');
const MUTANTS = ['release-without-owner-check', 'skip-wait', 'counter-restarts'];

const usage = () => {
  console.log(`usage: npm run chaos -- [--seconds 60] [--seed S] [--mode standalone|sentinel|cluster] [--min-replicas N]
       [--notifications namespace|per-key|mixed] (mixed: even processes namespace, odd ones per-key)
       [--procs 4] [--workers 4] [--keys 3] [--lease-ms 800] [--wait-ms 2000] [--quiet-seconds 4] [--ping-ms 500]
       [--mutant ${MUTANTS.join('|')}] [--out summary.json] [--history history.jsonl]
       [--stuck-after S] (a run with no verdict S s after its start says where it is stuck and exits 3;
       default: its seconds plus the quiet ones plus 180)
       [--stop-at-violation] (the faults end at the first safety violation the history shows, judged
       as it grows; healing, the quiet seconds and the verdict over the whole history follow as always)
       [--probe ioredis] (sentinel only: a plain ioredis client writes every 50 ms beside the drivers;
       the summary's \`gaps\` sets its longest gaps without a write beside the drivers' without a lease)
A mutant needs its build first: npm run build:chaos-mutants`);
  process.exit(0);
};
const o = parseOptions(process.argv.slice(2), {
  seconds: { type: 'string', default: '60' },
  seed: { type: 'string' },
  mode: { type: 'string', default: 'standalone' },
  'min-replicas': { type: 'string' },
  notifications: { type: 'string', default: 'namespace' },
  procs: { type: 'string', default: '4' },
  workers: { type: 'string', default: '4' },
  keys: { type: 'string', default: '3' },
  'lease-ms': { type: 'string', default: '800' },
  'wait-ms': { type: 'string', default: '2000' },
  'quiet-seconds': { type: 'string', default: '4' },
  'ping-ms': { type: 'string', default: '500' },
  'stuck-after': { type: 'string' },
  mutant: { type: 'string' },
  probe: { type: 'string' },
  'stop-at-violation': { type: 'boolean' },
  out: { type: 'string' },
  history: { type: 'string' },
  help: { type: 'boolean', short: 'h' },
}, { help: usage });

const int = (name, min) => {
  const v = Number(o[name]);
  if (!Number.isInteger(v) || v < min) throw new Error(`--${name} must be an integer ≥ ${min}`);
  return v;
};
if (!['standalone', 'sentinel', 'cluster'].includes(o.mode)) throw new Error('--mode must be standalone, sentinel or cluster');
if (!['namespace', 'per-key', 'mixed'].includes(o.notifications)) throw new Error('--notifications must be namespace, per-key or mixed');
if (o.mutant !== undefined && !MUTANTS.includes(o.mutant)) throw new Error(`--mutant must be one of ${MUTANTS.join(', ')}`);
if (o.probe !== undefined && o.probe !== 'ioredis') throw new Error('--probe must be ioredis');
if (o.probe !== undefined && o.mode !== 'sentinel') throw new Error('--probe ioredis needs --mode sentinel');
if (o.mutant && !existsSync(MUTANT_BUILD)) throw new Error('--mutant needs the mutant build: npm run build:chaos-mutants');
const mode = o.mode;
const seed = o.seed === undefined ? Math.floor(Math.random() * 2 ** 31) : int('seed', 0);
const minReplicas = o['min-replicas'] === undefined ? (mode === 'sentinel' ? 1 : 0) : int('min-replicas', 0);
if (mode === 'standalone' && minReplicas > 0) throw new Error('--min-replicas needs --mode sentinel (a standalone server has no replicas)');
const run = {
  mode, seed, minReplicas, mutant: o.mutant ?? null, notifications: o.notifications, probe: o.probe ?? null,
  stopAtViolation: o['stop-at-violation'] === true,
  seconds: int('seconds', 1), quietSeconds: int('quiet-seconds', 2),
  procs: int('procs', 2), workers: int('workers', 1), keys: int('keys', 1),
  leaseMs: int('lease-ms', 1), waitTimeoutMs: int('wait-ms', 0),
  // Per primary: Sentinel's has two, each Cluster master one.
  replicas: mode === 'sentinel' ? 2 : mode === 'cluster' ? 1 : 0,
  connectTimeoutMs: 1000, commandTimeoutMs: 1000, replicaTimeoutMs: 500,
  // The drivers' pingIntervalMs: a silently dropped flow is found within it plus
  // commandTimeoutMs once quiet (CONTRACT.md "Connection liveness"); the default 30 s would
  // outlast most of a run.
  pingIntervalMs: int('ping-ms', 0),
  stuckAfterSeconds: o['stuck-after'] === undefined ? null : int('stuck-after', 1),
  // Decision 0056: how long after the first Sentinel's announcement an acquire may still
  // start on the old primary (delivery of the message and the event loops of two processes).
  switchToleranceMs: 250,
  settleSlackMs: 1500,
  recoveryBoundMs: 10_000,
};
// The build under test: the commit at the start (the addon was built from it, or from a
// working tree that `dirty` says differs).
const commit = (() => { try { return execFileSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: root, encoding: 'utf8' }).trim(); } catch { return null; } })();
const dirty = (() => { try { return execFileSync('git', ['status', '--porcelain', '--', 'src', 'Cargo.toml', 'index.js'], { cwd: root, encoding: 'utf8' }).trim() !== ''; } catch { return null; } })();
const namespace = `chaos-${seed}`;
const keys = Array.from({ length: run.keys }, (_, i) => `chaos:key:${i}`);
// Cluster: each key's slot (its lock key's hash tag, README "Keys": `<namespace>:lock:{<hex>}`
// with the SHA-256 of the key, the fence key in the same slot), for the slot migrations and
// for the checker's per-shard judgment.
const keySlots = new Map();
const notificationsFor = (p) => (run.notifications === 'mixed' ? (p % 2 === 0 ? 'namespace' : 'per-key') : run.notifications);
const r = rng(seed, 0);

const history = [];
const record = (ev) => history.push(ev);
const t0 = now();
// The run's origin: the summary's gap times (checker `gaps`) count from here, as the printout does.
record({ k: 'run-start', at: t0 });
let phase = 'starting';
const log = (msg) => {
  phase = msg;
  process.stderr.write(`[chaos +${((now() - t0) / 1000).toFixed(1)}s] ${msg}\n`);
};

// A run that overstays its length by far is stuck: it says where and ends with exit code 3
// (its servers and clients die with it) rather than hold a test suite until CI's limit.
// The bound is far past the slowest healthy run (a failover's recovery, healing, stopping).
// What it says of the faults and clients, once they exist (set below, with the nemesis).
let state = () => 'no clients yet';
const watchdog = setTimeout(() => {
  process.stderr.write(`[chaos] STUCK ${(now() - t0) / 1000 | 0} s after the start; last phase: ${phase}; ${state()}\n`);
  process.exit(3);
}, (run.stuckAfterSeconds ?? run.seconds + run.quietSeconds + 180) * 1000);
watchdog.unref();

// ------------------------------------------------------------------ servers ----
log(`seed ${seed}, mode ${mode}, minReplicas ${minReplicas}${run.mutant ? `, MUTANT ${run.mutant}` : ''}, ${run.seconds} s`);
// Cluster: each node announces a front proxy as its address (startRedisCluster), so every
// connection a driver opens to a node it learned goes through one: net-silent-cut drops them
// (the other network faults stay on the seed proxies below).
const cluster = mode === 'sentinel' ? await startSentinelCluster()
  : mode === 'cluster' ? await startRedisCluster({ front: () => startProxy(1) }) : await startStandalone();
const fronts = mode === 'cluster' ? cluster.nodes.map((n) => n.front) : [];
const proxies = [];
// Cluster: the three first masters are the URL's seed nodes, each behind one proxy shared by
// every process. Only the seed connections go through them: the driver learns the real
// node addresses from the Cluster (CLUSTER SLOTS, MOVED, ASK), and no proxy stands there.
const seedNodes = mode === 'cluster' ? (await cluster.masters()).map((m) => m.node) : [];
if (mode === 'sentinel') {
  for (const s of cluster.sentinels) proxies.push(await startProxy(s.port));
} else if (mode === 'cluster') {
  for (const n of seedNodes) proxies.push(await startProxy(n.port));
} else {
  const primary = await cluster.primary();
  for (let p = 0; p < run.procs; p++) proxies.push(await startProxy(primary.port));
}
if (mode === 'cluster') {
  for (const k of keys) {
    const lockKey = `${namespace}:lock:{${createHash('sha256').update(k).digest('hex')}}`;
    keySlots.set(k, Number(await admin(seedNodes[0].port, ['CLUSTER', 'KEYSLOT', lockKey], 1000)));
  }
  log(`key slots: ${[...keySlots].map(([k, s]) => `${k}=${s}`).join(' ')}`);
}
const urlFor = (p) => {
  if (mode === 'standalone') return `redis://127.0.0.1:${proxies[p].port}/0`;
  if (mode === 'cluster') {
    // The same first seed for every process (the node the nemesis kills a third of the
    // time while it is a master), the other two in each process's own order.
    const [first, ...rest] = proxies.map((x) => `127.0.0.1:${x.port}`);
    return `redis://${[first, ...rng(seed, 500 + p).shuffle(rest)].join(',')}/0`;
  }
  // Each process lists the Sentinels in its own order, so any of them may be the one a
  // driver hears first.
  const order = rng(seed, 500 + p).shuffle(proxies.map((x) => `127.0.0.1:${x.port}`));
  return `redis-sentinel://${order.join(',')}/0#${MASTER}`;
};

// The coordinator hears every Sentinel's +switch-master directly (not through the proxies).
const subscriptions = [];
if (mode === 'sentinel') {
  cluster.sentinels.forEach((s, i) => {
    const socket = net.connect({ host: '127.0.0.1', port: s.port });
    let buf = Buffer.alloc(0);
    socket.on('data', (chunk) => {
      const at = now();
      buf = Buffer.concat([buf, chunk]);
      let reply;
      while ((reply = parseReply(buf))) {
        buf = buf.subarray(reply[1]);
        const [kind, channel, payload] = reply[0];
        if (kind === 'message' && channel === '+switch-master') {
          const [, , fromPort, , toPort] = payload.split(' ');
          record({ k: 'announce', at, sentinel: i, from: Number(fromPort), to: Number(toPort) });
          log(`Sentinel ${i} announced ${fromPort} → ${toPort}`);
        }
      }
    });
    socket.on('error', () => {});
    socket.write(encode(['SUBSCRIBE', '+switch-master']));
    subscriptions.push(socket);
  });
  await sleep(100);
}

// ---------------------------------------------------------------- the store ----
// Accepts a write only with a fence above the last accepted one for its key (or the same
// lease writing again): what `UPDATE … WHERE fence < $1` does in README "Limits of fencing".
const store = new Map();
function storeWrite(msg) {
  const fence = BigInt(msg.fence);
  const last = store.get(msg.key);
  const ok = !last || fence > last.fence || (fence === last.fence && msg.lease === last.lease);
  if (ok) store.set(msg.key, { fence, lease: msg.lease });
  const at = now();
  // wid: the client's id of the write, so the checker joins the store's verdict to the
  // holder's record of it (what its signal said when it wrote).
  record({ k: 'store', at, key: msg.key, fence: msg.fence, lease: msg.lease, p: msg.p, inc: msg.inc, wid: msg.id, ok });
  return { ok, at };
}

// ------------------------------------------------------------------ clients ----
const childEnv = { ...process.env };
delete childEnv.DOKEBI_LOCK_REDIS_CHAOS_MUTANT;
if (run.mutant) {
  childEnv.NAPI_RS_NATIVE_LIBRARY_PATH = MUTANT_BUILD;
  childEnv.DOKEBI_LOCK_REDIS_CHAOS_MUTANT = run.mutant;
}
const clients = Array.from({ length: run.procs }, () => ({ child: null, inc: 0, exited: null }));
const killedByNemesis = new Set();
function spawnClient(p) {
  const c = clients[p];
  c.inc += 1;
  const inc = c.inc;
  const cfg = {
    proc: p, incarnation: inc, workers: run.workers, keys, leaseMs: run.leaseMs, waitTimeoutMs: run.waitTimeoutMs,
    seed, url: urlFor(p), cluster: mode === 'cluster', notifications: notificationsFor(p), namespace, minReplicas: run.minReplicas, replicaTimeoutMs: run.replicaTimeoutMs,
    connectTimeoutMs: run.connectTimeoutMs, commandTimeoutMs: run.commandTimeoutMs, pingIntervalMs: run.pingIntervalMs,
  };
  const child = fork(path.join(import.meta.dirname, 'client.mjs'), [], {
    env: { ...childEnv, CHAOS_CLIENT: JSON.stringify(cfg) }, stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  c.child = child;
  c.exited = new Promise((resolve) => child.once('exit', (code, signal) => {
    record({ k: 'exit', at: now(), p, inc, code, signal, killedByNemesis: killedByNemesis.has(`${p}.${inc}`), forced: c.forced === inc });
    if (c.child === child) c.child = null;
    resolve();
  }));
  child.on('message', (msg) => {
    if (msg.t === 'ev') record(msg.ev);
    else if (msg.t === 'write') {
      const { ok, at } = storeWrite(msg);
      if (child.connected) child.send({ t: 'ack', id: msg.id, ok, at });
    }
  });
  child.on('error', () => {});
}
for (let p = 0; p < run.procs; p++) spawnClient(p);

// ------------------------------------------------------------------- probe ----
// `--probe ioredis`: a plain ioredis Sentinel client (probe.mjs) through the same Sentinel
// proxies, writing every 50 ms; its `probe` events are not judged, only set beside the
// drivers' gaps. Not a nemesis target: it is the witness of what the servers allowed.
let probe = null;
if (run.probe) {
  const order = rng(seed, 900).shuffle(proxies.map((x) => ({ host: '127.0.0.1', port: x.port })));
  const cfg = {
    sentinels: order, name: MASTER, prefix: `${namespace}-probe`, minReplicas: run.minReplicas, replicaTimeoutMs: run.replicaTimeoutMs,
    connectTimeoutMs: run.connectTimeoutMs, commandTimeoutMs: run.commandTimeoutMs,
  };
  const child = fork(path.join(import.meta.dirname, 'probe.mjs'), [], {
    env: { ...childEnv, CHAOS_PROBE: JSON.stringify(cfg) }, stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  child.on('message', (msg) => { if (msg.t === 'ev') record(msg.ev); });
  child.on('error', () => {});
  probe = { child, exited: new Promise((resolve) => child.once('exit', (code, signal) => { record({ k: 'probe', ev: 'exit', at: now(), code, signal }); resolve(); })) };
  // And what the cluster said, from here (not through the proxies), every 250 ms, recorded
  // when it changed: the node each Sentinel names, and each data node's ROLE. A gap the probe
  // shares then shows whether the Sentinels named nobody, disagreed, or named a non-master.
  const roleOf = async (n) => {
    try {
      const role = await admin(n.port, ['ROLE'], 200);
      return role[0] === 'master' ? 'master' : `${role[0]}→${role[2]} ${role[3]}`;
    } catch (err) {
      return err?.code === 'ECONNREFUSED' ? 'down' : 'no answer';
    }
  };
  const namedBy = async (x) => {
    try { return String((await admin(x.port, ['SENTINEL', 'GET-MASTER-ADDR-BY-NAME', MASTER], 200))[1]); } catch { return '?'; }
  };
  let lastView = null;
  probe.viewing = (async () => {
    while (!probe.stopViewing) {
      const at = now();
      const [named, roles] = await Promise.all([Promise.all(cluster.sentinels.map(namedBy)), Promise.all(cluster.nodes.map(roleOf))]);
      const view = `named ${named.join(',')}; ${cluster.nodes.map((n, i) => `${n.port} ${roles[i]}`).join(', ')}`;
      if (view !== lastView) record({ k: 'probe', ev: 'view', at, view });
      lastView = view;
      await sleep(Math.max(0, at + 250 - now()));
    }
  })();
}

// A client leaves when its IPC channel closes, but one the nemesis stopped (SIGSTOP) cannot:
// were this process to end (a crash, the watchdog) while one is stopped, it would stay stopped
// for good and keep the pipes it inherited open, which holds whoever reads them.
process.on('exit', () => {
  for (const c of clients) c.child?.kill('SIGKILL');
  probe?.child.kill('SIGKILL');
});

// Whose flow the proxy dropped (net-silent-cut): the client process holding the socket whose
// local port is the flow's client port, from /proc (Linux): the socket's inode in
// /proc/net/tcp, then which client process has it open.
// Both ends are matched: Linux may give two sockets to different peers the same local port.
function ownersOf(proxyPort, ports) {
  const inodeOf = new Map();
  try {
    for (const line of readFileSync('/proc/net/tcp', 'utf8').split('\n').slice(1)) {
      const f = line.trim().split(/\s+/);
      if (f.length < 10) continue;
      const port = parseInt(f[1].split(':')[1], 16);
      if (ports.includes(port) && parseInt(f[2].split(':')[1], 16) === proxyPort) inodeOf.set(`socket:[${f[9]}]`, port);
    }
  } catch { /* not Linux: owners unknown */ }
  const owners = new Map();
  clients.forEach((c, p) => {
    const pid = c.child?.pid;
    if (!pid || inodeOf.size === 0) return;
    try {
      for (const fd of readdirSync(`/proc/${pid}/fd`)) {
        let link;
        try { link = readlinkSync(`/proc/${pid}/fd/${fd}`); } catch { continue; }
        const port = inodeOf.get(link);
        if (port !== undefined) owners.set(port, { p, inc: c.inc });
      }
    } catch { /* exited meanwhile */ }
  });
  return owners;
}

const nemesis = createNemesis({
  cluster, proxies, fronts, record, r, keySlots, seedNode: seedNodes[0] ?? null,
  clients: {
    count: run.procs,
    ownersOf,
    pid: (p) => clients[p].child?.pid ?? null,
    incarnation: (p) => clients[p].inc,
    kill: (p) => {
      killedByNemesis.add(`${p}.${clients[p].inc}`);
      clients[p].child?.kill('SIGKILL');
    },
    restart: async (p) => {
      await clients[p].exited;
      spawnClient(p);
    },
  },
});
state = () => `${nemesis.describe()}; clients alive: ${clients.filter((c) => c.child).length} of ${run.procs}`;

// ---------------------------------------------------------------- the run ----
// The wall clock's rate against CLOCK_MONOTONIC, sampled every second: Redis expires keys on
// the wall clock, the driver's deadlines are monotonic. On a host slewing its clock (this
// one ran 4.8 ms/s fast during the first Cluster runs) a key expires up to leaseMs × that
// rate before its lease's deadline; the checker allows exactly that (CHAOS.md).
// The coordinator's own event loop, as the clients watch theirs (client.mjs): every proxy runs
// on it, so while it does not run, no client reaches Redis.
let lastTick = now();
const stallTimer = setInterval(() => {
  const t = now();
  if (t - lastTick > 500) record({ k: 'stall', at: t, ms: t - lastTick, p: 'coordinator' });
  lastTick = t;
}, 100);
const clockSamples = [];
const clockTimer = setInterval(() => clockSamples.push([now(), Date.now()]), 1000);
clockSamples.push([now(), Date.now()]);
// The fastest rate over any 10 s (Date.now() has 1 ms steps: shorter spans are noise), as
// ms per lease: how much earlier than its local deadline Redis may expire a key.
function clockDriftMs(samples) {
  let fastest = 0;
  for (let i = 0; i < samples.length; i++) {
    for (let j = i + 1; j < samples.length; j++) {
      const mono = samples[j][0] - samples[i][0];
      if (mono < 10_000) continue;
      fastest = Math.max(fastest, (samples[j][1] - samples[i][1] - 2) / mono - 1);
      break;
    }
  }
  return { fastest, ms: Number((Math.max(0, fastest) * run.leaseMs).toFixed(2)) };
}

// --stop-at-violation: the history so far is judged every second, up to 1 s ago (an event
// comes over IPC from its client, so the last second may still be missing some), in a worker
// thread (the coordinator's loop runs every proxy), and the faults end at the first violation
// of an invariant about what already happened. A partial history may show a violation the
// whole one explains: this only ends the faults early, the verdict below is the whole
// history's, as in any run. The nemesis draws from its own seeded stream, so the faults up to
// the stop are those of the full-length run.
const EARLY_INVARIANTS = ['no-overlapping-valid-leases', 'fences-never-go-backwards', 'no-stale-write-accepted', 'no-write-after-signal-aborted'];
let seenViolation = null;
let judge = null;
let violationWatch = null;
if (run.stopAtViolation) {
  judge = new Worker(path.join(import.meta.dirname, 'early-check.mjs'));
  let judging = false;
  judge.on('message', (first) => {
    judging = false;
    if (!first || seenViolation) return;
    seenViolation = { at: now(), invariant: first.invariant };
    record({ k: 'stop-at-violation', ...seenViolation });
    log(`stopping the faults: the history so far shows ${first.invariant}: ${first.detail}`);
  });
  judge.on('error', (err) => log(`the early check failed (the run goes on to its end): ${err.message}`));
  violationWatch = setInterval(() => {
    if (judging || seenViolation) return;
    judging = true;
    const upTo = now() - 1000;
    judge.postMessage({
      history: history.filter((e) => e.at <= upTo),
      run: { ...run, clockDriftMs: clockDriftMs(clockSamples).ms },
      invariants: EARLY_INVARIANTS,
    });
  }, 1000);
}
await sleep(500);
log('nemesis on');
await nemesis.run(now() + run.seconds * 1000, () => seenViolation !== null);
clearInterval(violationWatch);
await judge?.terminate();
log('nemesis off: healing every fault');
await nemesis.healAll();
log(`healed; ${run.quietSeconds} s without faults`);
await sleep(run.quietSeconds * 1000);

log('stopping the clients');
const stopBy = run.waitTimeoutMs + run.commandTimeoutMs * 2 + run.replicaTimeoutMs + 10_000;
await Promise.all([...clients.map(async (c, p) => {
  if (!c.child) return;
  c.child.send({ t: 'stop' });
  const t = setTimeout(() => { c.forced = c.inc; c.child?.kill('SIGKILL'); }, stopBy);
  await c.exited;
  clearTimeout(t);
}), (async () => {
  if (!probe) return;
  probe.stopViewing = true;
  await probe.viewing;
  if (probe.child.connected) probe.child.send({ t: 'stop' });
  const t = setTimeout(() => probe.child.kill('SIGKILL'), 10_000);
  await probe.exited;
  clearTimeout(t);
})()]);
let left = null;
try {
  const holders = mode === 'cluster' ? (await cluster.masters()).map((m) => m.node) : [await cluster.primary()];
  left = 0;
  for (const n of holders) left += (await admin(n.port, ['KEYS', `${namespace}:lock:*`], 2000)).length;
} catch (err) {
  log(`could not count the lock keys: ${err.message}`);
}
record({ k: 'lock-keys-left', at: now(), count: left });

for (const s of subscriptions) s.destroy();
for (const x of [...proxies, ...fronts]) await x.close();
await cluster.stop();

// -------------------------------------------------------------- the verdict ----
clearInterval(clockTimer);
clearInterval(stallTimer);
clockSamples.push([now(), Date.now()]);
const { fastest, ms: driftMs } = clockDriftMs(clockSamples);
run.clockDriftMs = driftMs;
log(`wall clock vs monotonic: up to ${(fastest * 1000).toFixed(2)} ms/s fast, ${run.clockDriftMs} ms per lease`);
// Logged first: a run stuck from here on (no answer to its own watchdog) is stuck judging.
log(`judging the history: ${history.length} events`);
const verdict = check(history, run);
// The watchdog stays armed (unref'd): a process still alive after its verdict is stuck too.
phase = 'after the verdict, something kept the process alive';
const redisVersion = (() => { try { return execFileSync('redis-server', ['--version'], { encoding: 'utf8' }).match(/v=(\S+)/)?.[1]; } catch { return null; } })();
const summary = {
  // The files' names only: a summary is committed, and no path of this machine may be in it.
  command: `npm run chaos -- ${process.argv.slice(2).map((x, i, all) => (['--out', '--history'].includes(all[i - 1]) ? path.basename(x) : x)).join(' ')}`,
  seed, mode, minReplicas, notifications: run.notifications, mutant: run.mutant, probe: run.probe ?? undefined, seconds: run.seconds,
  // --stop-at-violation: when (s after the run's start) and by what the faults ended early; null: they ran the whole time.
  stoppedAtViolation: run.stopAtViolation ? (seenViolation && { afterS: Number(((seenViolation.at - t0) / 1000).toFixed(1)), invariant: seenViolation.invariant }) : undefined,
  keySlots: mode === 'cluster' ? Object.fromEntries(keySlots) : undefined,
  setup: { replicas: run.replicas, procs: run.procs, workersPerProc: run.workers, keys: run.keys, leaseMs: run.leaseMs, waitTimeoutMs: run.waitTimeoutMs, commandTimeoutMs: run.commandTimeoutMs, replicaTimeoutMs: run.replicaTimeoutMs, pingIntervalMs: run.pingIntervalMs, switchToleranceMs: run.switchToleranceMs, clockDriftMs: run.clockDriftMs },
  result: verdict.ok ? 'pass' : 'fail',
  invariants: verdict.counts,
  ...verdict.stats,
  violationsByInvariant: Object.fromEntries(INVARIANTS.map((n) => [n, verdict.counts[n].violations])),
  firstViolations: verdict.violations.slice(0, 10).map((v) => ({ invariant: v.invariant, detail: v.detail })),
  machine: { cpus: os.cpus().length, model: os.cpus()[0]?.model, node: process.version, redis: redisVersion, commit, dirty, date: new Date().toISOString() },
};
if (o.out) writeFileSync(o.out, JSON.stringify(summary, null, 2) + '\n');
if (o.history) writeFileSync(o.history, history.map((e) => JSON.stringify(e, (_, v) => (typeof v === 'bigint' ? String(v) : v))).join('\n') + '\n');

console.log(JSON.stringify(summary, null, 2));
console.log(`\n${formatSignal(verdict.stats.signal).join('\n')}`);
console.log(`\n${formatGaps(verdict.stats.gaps).join('\n')}`);
console.log(`\n${formatSilentCuts(verdict.stats.silentCuts).join('\n')}`);
if (!verdict.ok) {
  const shown = new Map();
  console.log(`\nFAILED: seed ${seed} (${mode}, minReplicas ${minReplicas}, notifications ${run.notifications}${run.mutant ? `, mutant ${run.mutant}` : ''}): ${verdict.violations.length} violation(s)`);
  for (const v of verdict.violations) {
    const n = shown.get(v.invariant) ?? 0;
    shown.set(v.invariant, n + 1);
    if (n >= 2) continue;
    console.log(`\n✗ ${v.invariant}: ${v.detail}`);
    for (const e of excerpt(verdict.events, v.around)) console.log(formatEvent(e, t0));
  }
  console.log(`\nrerun: npm run chaos -- --seconds ${run.seconds} --seed ${seed} --mode ${mode} --min-replicas ${minReplicas}${run.notifications !== 'namespace' ? ` --notifications ${run.notifications}` : ''}${run.mutant ? ` --mutant ${run.mutant}` : ''}${run.probe ? ` --probe ${run.probe}` : ''}${run.stopAtViolation ? ' --stop-at-violation' : ''}`);
  process.exitCode = 1;
} else {
  console.log(`\nPASSED: seed ${seed}, every invariant held.`);
}
