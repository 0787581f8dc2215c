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

import { createRequire } from 'node:module';
import net from 'node:net';

import { encode } from '../__test__/helpers/redis.mjs';

const require = createRequire(import.meta.url);
const now = () => performance.now();

async function driverRole(init) {
  const { createRedisLockDriver } = require(init.packageDir ? `${init.packageDir}/index.js` : '../index.js');
  const connection = init.cluster ? { url: init.url, cluster: true } : init.url;
  const options = { driver: 'redis', connection: 'bench', namespace: init.namespace, leaseMs: 10_000, waitTimeoutMs: 0 };
  if (init.notifications) options.notifications = init.notifications;
  const driver = createRedisLockDriver(connection, options);
  let n = 0;
  const pair = async (prefix) => {
    const lease = await driver.acquire(`${prefix}:${n++}`);
    await lease.release();
  };
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
        await driver.shutdown().catch(() => {});
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
