// What the benchmarks that run a driver in its own process share: forking a worker and
// talking to it over IPC, and a throwaway Redis Cluster to run it against.

import { execFileSync, fork } from 'node:child_process';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

import { nextMessage } from './lib.mjs';

/**
 * Forks `file` (a worker of this folder), sends it `init` and waits for its `ready`. The
 * handle asks it questions (`ask`: send a message, await the reply of a type) and closes it.
 */
export async function startWorker(children, file, init) {
  const env = { ...process.env };
  delete env.REDIS_URL;
  const child = children.add(fork(file, [], { env, stdio: ['ignore', 'inherit', 'inherit', 'ipc'] }));
  const ready = nextMessage(child, 'ready', 120_000);
  child.send(init);
  await ready;
  return {
    child,
    async ask(msg, reply, timeoutMs = 60_000) { const r = nextMessage(child, reply, timeoutMs); child.send(msg); return r; },
    async close() {
      const gone = new Promise((r) => (child.exitCode !== null ? r() : child.once('exit', r)));
      child.send({ type: 'close' });
      await Promise.race([gone, sleep(5000)]);
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    },
  };
}

/**
 * A Cluster of `masters` throwaway nodes, no replicas, once every node says
 * `cluster_state:ok`. One master gets every slot by CLUSTER ADDSLOTSRANGE (the single-node
 * baseline: the same cluster-enabled bookkeeping per key, no cluster bus traffic), as
 * redis-cli --cluster create wants 3 masters at least.
 */
export async function startClusterNodes(masters) {
  const { startRedis } = await import('../__test__/helpers/redis.mjs');
  const { freePort } = await import('../__test__/helpers/lock.mjs');
  const servers = [];
  try {
    for (let i = 0; i < masters; i++) {
      // announce-ip: a lone node that never met another lists its own address as "" in CLUSTER
      // SLOTS, which ioredis cannot follow (the --client redis-semaphore baseline).
      servers.push(await startRedis({ args: ['--cluster-enabled', 'yes', '--cluster-port', String(await freePort()), '--cluster-node-timeout', '5000', '--cluster-announce-ip', '127.0.0.1'] }));
    }
    if (masters === 1) await servers[0].command('CLUSTER', 'ADDSLOTSRANGE', '0', '16383');
    else execFileSync('redis-cli', ['--cluster', 'create', ...servers.map((s) => `127.0.0.1:${s.port}`), '--cluster-replicas', '0', '--cluster-yes'], { stdio: 'ignore' });
    const until = Date.now() + 20_000;
    for (;;) {
      const ok = await Promise.all(servers.map(async (s) => String(await s.command('CLUSTER', 'INFO')).includes('cluster_state:ok')));
      if (ok.every(Boolean)) break;
      if (Date.now() > until) throw new Error('the cluster did not become ok');
      await sleep(100);
    }
  } catch (err) {
    for (const s of servers) await s.stop();
    throw err;
  }
  return servers;
}

