// One process of the mutual-exclusion check (docs/OPS-002.md, __test__/faults/mutex.test.mjs).
//
// Acquires one key again and again through the fault proxy, and for each lease writes
// 'begin' and 'end' through the fenced store (its own redis-server) with the lease's fence,
// whatever `lease.valid` says (a worst-case client: the fences alone must keep it safe).
// Prints one JSON line per event on stdout: { ev: 'hold' } when it got a lease, and
// { ev: 'done', holds, errors } at the end. Bounded by HOLDS and DEADLINE_MS.
//
// Environment: LOCK_PACKAGE, LOCK_URL, STORE_PORT, NS, KEY, WORKER_ID, HOLDS, LEASE_MS,
// DEADLINE_MS.

import { createRequire } from 'node:module';
import { setTimeout as sleep } from 'node:timers/promises';
import { rawClient } from '../faults/support.mjs';
import { FENCED_WRITE, STORE_KEYS } from './store.mjs';

const env = process.env;
const { createRedisLockDriver } = createRequire(import.meta.url)(env.LOCK_PACKAGE);
const now = () => performance.timeOrigin + performance.now();
const target = Number(env.HOLDS);
const deadline = now() + Number(env.DEADLINE_MS);
const emit = (event) => process.stdout.write(`${JSON.stringify(event)}\n`);

const store = await rawClient(Number(env.STORE_PORT), { keepAlive: true });
const driver = createRedisLockDriver(
  { url: env.LOCK_URL, commandTimeoutMs: 250, connectTimeoutMs: 250 },
  {
    driver: 'redis', connection: 'main', namespace: env.NS, leaseMs: Number(env.LEASE_MS),
    waitTimeoutMs: 3000, pollIntervalMs: 10, notifyPollIntervalMs: 50, shutdownTimeoutMs: 1000,
  },
);

async function write(fence, lease, kind, valid) {
  const reply = await store.call('EVAL', FENCED_WRITE, String(STORE_KEYS.length), ...STORE_KEYS,
    fence, lease, kind, valid ? '1' : '0');
  return reply === 1;
}

const holds = [];
const errors = {};
const count = (code) => { errors[code] = (errors[code] ?? 0) + 1; };
let n = 0;
let attempts = 0;
while (holds.length < target && now() < deadline && attempts < target * 20) {
  attempts += 1;
  const tCall = now();
  let lease;
  try {
    lease = await driver.acquire(env.KEY);
  } catch (err) {
    count(err.code ?? String(err));
    await sleep(5 + Math.random() * 10);
    continue;
  }
  const tRes = now();
  const id = `${env.WORKER_ID}:${++n}`;
  emit({ ev: 'hold', worker: env.WORKER_ID, lease: id, fence: lease.fence });
  const begin = await write(lease.fence, id, 'begin', lease.valid);
  await sleep(5 + Math.random() * 20);
  const validAtEnd = lease.valid;
  const end = await write(lease.fence, id, 'end', validAtEnd);
  const tEnd = now();
  let released;
  try {
    released = await lease.release();
  } catch (err) {
    released = err.code;
    count(`release:${err.code}`);
  }
  holds.push({ lease: id, worker: env.WORKER_ID, fence: lease.fence, tCall, tRes, tEnd, accepted: [begin, end], validAtEnd, released });
  await sleep(Math.random() * 5);
}
emit({ ev: 'done', worker: env.WORKER_ID, holds, errors });
await driver.shutdown().catch((err) => count(`shutdown:${err.code}`));
store.close();
