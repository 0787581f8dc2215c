// A process of benchmarks/fanout.bench.mjs (forked by it, never run by hand), in one of two
// roles:
//
// - `driver`: the driver under test. One backend; acquire+release pairs over distinct keys
//   with `inflight` pairs in flight. Parent → {type:'go', seconds}; worker → {type:'done',
//   pairs, ms, cpuUs} after the window.
// - `subscribers`: idle connections that subscribe as other processes with waiters would
//   (SUBSCRIBE or SSUBSCRIBE, one channel each, given by the parent) and never send
//   anything else. They read what Redis pushes; `bytes` answers the bytes read since the
//   subscriptions were confirmed (socket.bytesRead, so nothing is parsed per message).
//
// Protocol (IPC): parent → {type:'init', role, ...}; worker → {type:'ready'}; then the
// role's messages; parent → {type:'close'} ends the worker.

import { createHash } from 'node:crypto';
import { createRequire } from 'node:module';
import net from 'node:net';

import { encode } from '../__test__/helpers/redis.mjs';

const require = createRequire(import.meta.url);
const now = () => performance.now();

// The pairs' client: this driver, or (`client: 'redis-semaphore'`, cluster-cost.bench.mjs's
// baseline) a peer library's Mutex on one ioredis client, a Cluster client with `cluster`.
async function pairClient(init) {
  if (init.client === 'redis-semaphore') {
    const { default: Redis, Cluster } = await import('ioredis');
    const { Mutex } = await import('redis-semaphore');
    const { hostname, port } = new URL(init.url);
    const client = init.cluster
      ? new Cluster([{ host: hostname, port: Number(port) }], { lazyConnect: true })
      : new Redis(init.url, { lazyConnect: true });
    client.on('error', () => {});
    await client.connect();
    return {
      // refreshInterval 0: no refresh timer, as the driver's pairs renew nothing.
      pair: async (key) => {
        const m = new Mutex(client, `${init.namespace}:${key}`, { lockTimeout: 10_000, acquireTimeout: 1000, refreshInterval: 0 });
        await m.acquire();
        await m.release();
      },
      close: () => client.disconnect(),
    };
  }
  const { createRedisLockDriver } = require(init.packageDir ? `${init.packageDir}/index.js` : '../index.js');
  const options = { driver: 'redis', connection: 'bench', namespace: init.namespace, leaseMs: 10_000, waitTimeoutMs: 0 };
  if (init.notifications) options.notifications = init.notifications;
  // `urls`: one driver per standalone server, the pairs dealt out in turn (cluster-cost's
  // standalone-3: a load spread over three servers without a Cluster).
  const drivers = init.urls
    ? init.urls.map((url) => createRedisLockDriver(url, options))
    : [createRedisLockDriver(init.cluster ? { url: init.url, cluster: true } : init.url, options)];
  let turn = 0;
  return {
    pair: async (key) => {
      const lease = await drivers[turn++ % drivers.length].acquire(key);
      await lease.release();
    },
    close: () => Promise.all(drivers.map((d) => d.shutdown().catch(() => {}))),
  };
}

// With `slots: [first, last]`, only keys whose Redis key lands in those slots (one master's
// share of a Cluster): the driver's lock key is tagged with the SHA-256 hex of the key
// (README, key layout), the peer's Mutex key is the key itself.
function slotFilter(init) {
  if (!init.slots) return () => true;
  const [first, last] = init.slots;
  const slotOf = require('cluster-key-slot');
  const tagOf = init.client === 'redis-semaphore'
    ? (key) => `${init.namespace}:${key}`
    : (key) => createHash('sha256').update(key).digest('hex');
  return (key) => { const slot = slotOf(tagOf(key)); return slot >= first && slot <= last; };
}

async function driverRole(init) {
  const client = await pairClient(init);
  const inSlots = slotFilter(init);
  let n = 0;
  const nextKey = (prefix) => {
    for (;;) {
      const key = `${prefix}:${n++}`;
      if (inSlots(key)) return key;
    }
  };
  const pair = (prefix) => client.pair(nextKey(prefix));
  async function run(prefix, until, count) {
    let pairs = 0;
    const loop = async () => {
      while (count !== undefined ? pairs < count : now() < until) {
        await pair(prefix);
        pairs++;
      }
    };
    await Promise.all(Array.from({ length: init.inflight }, loop));
    return pairs;
  }
  // Warm up: connection open, scripts loaded.
  await run('warm', Infinity, 2000);
  process.send({ type: 'ready' });
  process.on('message', async (m) => {
    try {
      if (m.type === 'go') {
        const cpu0 = process.cpuUsage();
        const t0 = now();
        const pairs = await run(`fan:${m.tag}`, t0 + m.seconds * 1000);
        const ms = now() - t0;
        const cpu = process.cpuUsage(cpu0);
        process.send({ type: 'done', pairs, ms, cpuUs: cpu.user + cpu.system });
      } else if (m.type === 'close') {
        await client.close();
        process.exit(0);
      }
    } catch (err) {
      process.send({ type: 'error', message: String(err?.stack ?? err) }, () => process.exit(1));
    }
  });
}

async function subscribersRole(init) {
  // init.subscriptions: [{ host, port, command: [SUBSCRIBE|SSUBSCRIBE, channel] }]
  const sockets = [];
  const confirm = [];
  for (const s of init.subscriptions) {
    const socket = net.connect({ host: s.host, port: s.port });
    socket.setNoDelay(true);
    sockets.push(socket);
    confirm.push(new Promise((resolve, reject) => {
      let seen = Buffer.alloc(0);
      const onData = (chunk) => {
        seen = Buffer.concat([seen, chunk]);
        // The confirmation is an array whose first element names the command; an error
        // (-MOVED for a shard channel on the wrong node) starts with '-'.
        if (seen[0] === 0x2d) { reject(new Error(`${s.command[0]} refused: ${seen.toString().trim()}`)); return; }
        if (seen.includes('subscribe')) { socket.off('data', onData); socket.on('data', () => {}); resolve(); }
      };
      socket.on('data', onData);
      socket.once('error', reject);
    }));
    socket.write(encode(s.command));
  }
  await Promise.all(confirm);
  let base = sockets.map((s) => s.bytesRead);
  process.send({ type: 'ready' });
  process.on('message', (m) => {
    if (m.type === 'bytes') {
      const read = sockets.reduce((sum, s, i) => sum + s.bytesRead - base[i], 0);
      process.send({ type: 'bytes', bytes: read, connections: sockets.length });
    } else if (m.type === 'reset') {
      base = sockets.map((s) => s.bytesRead);
      process.send({ type: 'reset' });
    } else if (m.type === 'close') {
      for (const s of sockets) s.destroy();
      process.exit(0);
    }
  });
}

const init = await new Promise((resolve) => process.once('message', resolve));
try {
  if (init.role === 'driver') await driverRole(init);
  else await subscribersRole(init);
} catch (err) {
  process.send?.({ type: 'error', message: String(err?.stack ?? err) }, () => process.exit(1));
}
