// The coordinator's throwaway servers: standalone (one redis-server the nemesis kills and
// restarts without persistence), Sentinel (a primary, two replicas, three Sentinels) or a
// Redis Cluster (three masters with a replica each), and
// a small admin client for them. Data nodes come from the test harness
// (__test__/helpers/redis.mjs: free ports, temp dirs, kill/pause/restart on the same port,
// killed with the coordinator); Sentinels need a config file first on the command line,
// which that harness does not do, so they are started here the same way.

import { execFile, execFileSync, spawn } from 'node:child_process';
import { promisify } from 'node:util';
import { existsSync, rmSync, writeFileSync } from 'node:fs';
import { mkdtemp } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { encode, parseReply, startRedis } from '../../__test__/helpers/redis.mjs';

const HOST = '127.0.0.1';
export const MASTER = 'chaos';
const SETPRIV = ['/usr/bin/setpriv', '/bin/setpriv'].find((p) => existsSync(p));

/** One command on a fresh connection; error replies are thrown. */
export function admin(port, args, timeoutMs = 2000) {
  return new Promise((resolve, reject) => {
    let buf = Buffer.alloc(0);
    const socket = net.connect({ host: HOST, port });
    const timer = setTimeout(() => { socket.destroy(); reject(new Error(`${args[0]} timed out`)); }, timeoutMs);
    socket.on('error', (err) => { clearTimeout(timer); reject(err); });
    socket.on('data', (chunk) => {
      buf = Buffer.concat([buf, chunk]);
      const r = parseReply(buf);
      if (!r) return;
      clearTimeout(timer);
      socket.destroy();
      if (r[0] instanceof Error) reject(r[0]); else resolve(r[0]);
    });
    socket.write(encode(args));
  });
}

const freePort = () => new Promise((resolve, reject) => {
  const srv = net.createServer();
  srv.on('error', reject);
  srv.listen(0, HOST, () => { const { port } = srv.address(); srv.close(() => resolve(port)); });
});

const started = new Set();
process.on('exit', () => {
  for (const s of started) {
    try { s.child.kill('SIGKILL'); } catch { /* gone */ }
    try { rmSync(s.dir, { recursive: true, force: true }); } catch { /* best effort */ }
  }
});

async function startSentinel(primaryPort, quorum) {
  const dir = await mkdtemp(path.join(os.tmpdir(), `dokebi-redis-${process.pid}-sentinel-`));
  for (let attempt = 1; ; attempt++) {
    const port = await freePort();
    const conf = path.join(dir, 'sentinel.conf');
    writeFileSync(conf, [
      `port ${port}`, `bind ${HOST}`, `dir ${dir}`, `logfile ${path.join(dir, 'sentinel.log')}`,
      `sentinel monitor ${MASTER} ${HOST} ${primaryPort} ${quorum}`,
      `sentinel down-after-milliseconds ${MASTER} 500`,
      `sentinel failover-timeout ${MASTER} 3000`,
    ].join('\n') + '\n');
    const argv = [conf, '--sentinel'];
    const [cmd, args] = SETPRIV ? [SETPRIV, ['--pdeathsig', 'KILL', 'redis-server', ...argv]] : ['redis-server', argv];
    const child = spawn(cmd, args, { stdio: 'ignore' });
    child.unref();
    const entry = { child, dir, port };
    started.add(entry);
    const deadline = Date.now() + 10_000;
    while (Date.now() < deadline && child.exitCode === null) {
      try {
        if ((await admin(port, ['PING'], 500)) === 'PONG') return entry;
      } catch { /* not up yet */ }
      await sleep(20);
    }
    child.kill('SIGKILL');
    started.delete(entry);
    if (attempt === 3) throw new Error('a Sentinel did not start');
  }
}

async function until(what, check, timeoutMs = 20_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try { if (await check()) return; } catch { /* not yet */ }
    if (Date.now() > deadline) throw new Error(`${what}: not within ${timeoutMs} ms`);
    await sleep(50);
  }
}

async function onlineReplicas(port) {
  const info = await admin(port, ['INFO', 'replication'], 1000);
  return info.split('\r\n').filter((l) => /^slave\d+:/.test(l) && l.includes('state=online')).length;
}

export async function startStandalone() {
  const node = await startRedis({ args: ['--maxmemory-policy', 'noeviction'] });
  return {
    mode: 'standalone',
    nodes: [node],
    async primary() { return node; },
    async healthy() { return (await admin(node.port, ['PING'], 500)) === 'PONG'; },
    async stop() { await node.stop(); },
  };
}

export async function startSentinelCluster() {
  const dataArgs = ['--maxmemory-policy', 'noeviction', '--repl-diskless-sync-delay', '0'];
  const first = await startRedis({ args: dataArgs });
  const replicas = [];
  for (let i = 0; i < 2; i++) {
    replicas.push(await startRedis({ args: [...dataArgs, '--replicaof', HOST, String(first.port)] }));
  }
  const nodes = [first, ...replicas];
  await until('2 replicas online', async () => (await onlineReplicas(first.port)) === 2);
  const sentinels = [];
  for (let i = 0; i < 3; i++) sentinels.push(await startSentinel(first.port, 2));
  const byPort = (port) => nodes.find((n) => n.port === port);
  const named = async (s) => Number((await admin(s.port, ['SENTINEL', 'GET-MASTER-ADDR-BY-NAME', MASTER], 1000))[1]);
  const cluster = {
    mode: 'sentinel',
    nodes,
    sentinels,
    /** The node the first Sentinel that answers names. */
    async primary() {
      for (const s of sentinels) {
        try { return byPort(await named(s)); } catch { /* next */ }
      }
      return undefined;
    },
    /** Every Sentinel names the same node, which says it is master and has both replicas online. */
    async healthy() {
      const ports = await Promise.all(sentinels.map(named));
      if (!ports.every((p) => p === ports[0])) return false;
      const role = await admin(ports[0], ['ROLE'], 1000);
      if (role[0] !== 'master') return false;
      if ((await onlineReplicas(ports[0])) < 2) return false;
      // Every Sentinel must also know both replicas, or a failover it leads has no candidate.
      for (const s of sentinels) {
        const reps = await admin(s.port, ['SENTINEL', 'REPLICAS', MASTER], 1000);
        const up = reps.filter((r) => {
          const flags = r[r.indexOf('flags') + 1];
          return flags === 'slave';
        });
        if (up.length < 2) return false;
      }
      return true;
    },
    async stop() {
      for (const s of sentinels) {
        s.child.kill('SIGKILL');
        started.delete(s);
        rmSync(s.dir, { recursive: true, force: true });
      }
      for (const n of nodes) await n.stop();
    },
  };
  await until('the Sentinels see both replicas', () => cluster.healthy(), 30_000);
  return cluster;
}

export { until };

// ------------------------------------------------------------ Redis Cluster ----
// Three masters with one replica each (issue 23 item 3). Every node keeps its own dir for
// the whole run, so a node killed with -9 restarts on the same port with its nodes.conf
// and rejoins as a replica of whoever took its slots over (no data: no persistence).
// cluster-node-timeout 1000 makes a failover take about 2–3 s; replica-validity-factor 0
// lets a replica take over however long it was cut off (a stopped replica may lag); no
// replica migration keeps the shape 3 × 1, which `healthy()` asks for.
const CLUSTER_NODES = 6;

/** `CLUSTER NODES` of one node, parsed: id, port, flags, master id, slot ranges. */
export async function clusterNodes(port) {
  const text = await admin(port, ['CLUSTER', 'NODES'], 1000);
  return String(text).trim().split('\n').map((line) => {
    const [id, addr, flags, master, , , , link, ...slots] = line.split(' ');
    return {
      id, port: Number(addr.split('@')[0].split(':').pop()), flags: flags.split(','), master, link,
      slots: slots.filter((s) => !s.startsWith('[')).map((s) => s.split('-').map(Number)),
    };
  });
}

export async function startRedisCluster({ front } = {}) {
  const nodes = [];
  for (let i = 0; i < CLUSTER_NODES; i++) {
    // `front()`: a fault proxy each node announces as its address (cluster-announce-port; the
    // bus stays direct on cluster-port), so that clients reach every node through one. Its
    // port is known before the node starts, and a restart keeps announcing it.
    const proxy = front ? await front() : null;
    const node = await startRedis({
      args: ['--maxmemory-policy', 'noeviction', '--repl-diskless-sync-delay', '0',
        '--cluster-enabled', 'yes', '--cluster-port', String(await freePort()), '--cluster-node-timeout', '1000',
        '--cluster-replica-validity-factor', '0', '--cluster-allow-replica-migration', 'no',
        ...(proxy ? ['--cluster-announce-port', String(proxy.port)] : [])],
    });
    if (proxy) {
      proxy.retarget(node.port);
      node.front = proxy;
    }
    nodes.push(node);
  }
  // Not execFileSync: redis-cli and the replicas reach the nodes at their announced addresses,
  // through the front proxies, which run on this process's event loop. Bounded: redis-cli
  // waits for the nodes to join with no limit of its own.
  await promisify(execFile)('redis-cli', ['--cluster', 'create', ...nodes.map((n) => `${HOST}:${n.port}`), '--cluster-replicas', '1', '--cluster-yes'], { timeout: 60_000, killSignal: 'SIGKILL' });
  // A node by its own port or the one it announces (its front proxy's).
  const byPort = (port) => nodes.find((n) => n.port === port || n.front?.port === port);
  // The masters as the first node that answers sees them (with their slots and node ids).
  async function view() {
    for (const n of nodes) {
      try { return await clusterNodes(n.port); } catch { /* next */ }
    }
    return [];
  }
  const cluster = {
    mode: 'cluster',
    nodes,
    /** The nodes that hold slots, as one node sees them: [{ node, id, slots, replicas: [node] }]. */
    async masters() {
      const all = await view();
      return all.filter((x) => x.flags.includes('master') && !x.flags.includes('fail') && x.slots.length > 0 && byPort(x.port))
        .map((x) => ({ node: byPort(x.port), id: x.id, slots: x.slots, replicas: all.filter((y) => y.master === x.id).map((y) => byPort(y.port)).filter(Boolean) }));
    },
    /** Any master (the nemesis's CLIENT KILL, DEBUG SLEEP, OOM pick among `masters()`). */
    async primary() { return (await cluster.masters())[0]?.node; },
    /** The master that serves `slot` now. */
    async ownerOf(slot) {
      return (await cluster.masters()).find((m) => m.slots.some(([a, b = a]) => slot >= a && slot <= b));
    },
    /**
     * Whole: every node says cluster_state:ok and sees no node failing, 3 masters own all
     * the slots, and each has its replica online.
     */
    async healthy() {
      for (const n of nodes) {
        const info = String(await admin(n.port, ['CLUSTER', 'INFO'], 1000));
        if (!info.includes('cluster_state:ok') || !info.includes('cluster_slots_ok:16384')) return false;
        const seen = await clusterNodes(n.port);
        if (seen.length !== CLUSTER_NODES || seen.some((x) => x.flags.some((f) => f === 'fail' || f === 'fail?' || f === 'handshake' || f === 'noaddr'))) return false;
      }
      const masters = await cluster.masters();
      if (masters.length !== 3) return false;
      for (const m of masters) {
        const role = await admin(m.node.port, ['ROLE'], 1000);
        if (role[0] !== 'master') return false;
        if ((await onlineReplicas(m.node.port)) < 1) return false;
      }
      return true;
    },
    async stop() { for (const n of nodes) await n.stop(); },
  };
  await until('the Cluster is whole', () => cluster.healthy(), 30_000);
  return cluster;
}
