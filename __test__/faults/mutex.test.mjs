// The mutual-exclusion check of OPS-002: several processes take one key many times while
// faults are injected (connection cuts, a cut mid-reply, restarts of the lock server with
// its data lost, pauses of Redis and of a holder past its lease, latency). Each holder
// writes through a fenced store on a SEPARATE redis-server that accepts a write only with a
// fence at least the highest it accepted, and records every write. The analysis counts the
// overlapping holds the fences caught and the ones they would have missed (definitions in
// __test__/mutex-check/store.mjs and docs/OPS-002.md); the second number must be zero.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { after, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { fenceKeyOf, uniqueNamespace, within } from '../helpers/lock.mjs';
import { startProxy } from '../helpers/proxy.mjs';
import { external, startRedis } from '../helpers/redis.mjs';
import { analyze } from '../mutex-check/store.mjs';

const skip = external && 'needs throwaway redis-servers (REDIS_URL is set)';
const PACKAGE = fileURLToPath(new URL('../../index.js', import.meta.url));
const WORKER = fileURLToPath(new URL('../mutex-check/worker.mjs', import.meta.url));

const WORKERS = Number(process.env.MUTEX_WORKERS ?? 4);
const HOLDS_EACH = Number(process.env.MUTEX_HOLDS_EACH ?? 50);
const LEASE_MS = 400;
const KEY = 'the-one-key';
/**
 * Mutation check of the checker (not for CI): after each restart, plant a fencing counter
 * of 0, as a driver whose counter restarts from scratch after data loss would (0.1.1). The
 * check must then report missed overlaps and inversions.
 */
const SIMULATE_COUNTER_RESET = process.env.MUTEX_SIMULATE_COUNTER_RESET === '1';
/** A fault every this many holds, taking turns through FAULTS. */
const FAULT_EVERY = 10;

test('the checker is not vacuous: planted fence reuse, a planted inversion and a stale accepted write count as missed', () => {
  const hold = (lease, fence, tCall, tRes, tEnd) => ({ lease, fence, tCall, tRes, tEnd });
  const w = (seq, lease, fence, accepted) => ({ seq, lease, fence, accepted, valid: true });
  // Caught: B (newer, larger fence) writes, then A's stale write is rejected.
  const caught = analyze({
    holds: [hold('A', '10', 0, 1, 100), hold('B', '11', 50, 60, 120)],
    writes: [w(1, 'A', '10', true), w(2, 'B', '11', true), w(3, 'A', '10', false), w(4, 'B', '11', true)],
  });
  assert.deepEqual([caught.overlappingPairs, caught.caught, caught.missed], [1, 1, 0]);
  // Missed: two leases with the same fence, interleaved.
  const reuse = analyze({
    holds: [hold('A', '10', 0, 1, 100), hold('B', '10', 50, 60, 120)],
    writes: [w(1, 'A', '10', true), w(2, 'B', '10', true), w(3, 'A', '10', true)],
  });
  assert.deepEqual([reuse.missed, reuse.duplicateFences], [1, 1]);
  // Missed: A was surely granted first (resolved before B was called) but has the larger fence.
  const inverted = analyze({
    holds: [hold('A', '20', 0, 1, 100), hold('B', '11', 50, 60, 120)],
    writes: [w(1, 'A', '20', true), w(2, 'B', '11', false), w(3, 'A', '20', true)],
  });
  assert.deepEqual([inverted.missed, inverted.inversions], [1, 1]);
  // Missed: a broken store that accepts a lower fence after a higher one.
  const broken = analyze({
    holds: [hold('A', '10', 0, 1, 100), hold('B', '11', 50, 60, 120)],
    writes: [w(1, 'B', '11', true), w(2, 'A', '10', true)],
  });
  assert.equal(broken.missed, 1);
  // Harmless: they overlap in time, but A wrote nothing after B's first write.
  const harmless = analyze({
    holds: [hold('A', '10', 0, 1, 100), hold('B', '11', 50, 60, 120)],
    writes: [w(1, 'A', '10', true), w(2, 'A', '10', true), w(3, 'B', '11', true)],
  });
  assert.deepEqual([harmless.harmless, harmless.caught, harmless.missed], [1, 0, 0]);
});

// ------------------------------------------------------------------------------------

const live = new Set();
after(() => {
  for (const child of live) {
    try { child.kill('SIGCONT'); child.kill('SIGKILL'); } catch { /* gone */ }
  }
});

function startWorker(id, env, onEvent) {
  const child = spawn(process.execPath, [WORKER], {
    env: { ...process.env, ...env, WORKER_ID: String(id) },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  live.add(child);
  let buffered = '';
  let stderr = '';
  child.stdout.on('data', (chunk) => {
    buffered += chunk;
    let nl;
    while ((nl = buffered.indexOf('\n')) !== -1) {
      const line = buffered.slice(0, nl);
      buffered = buffered.slice(nl + 1);
      if (line.trim()) onEvent(JSON.parse(line));
    }
  });
  child.stderr.on('data', (d) => { stderr += d; });
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => {
    live.delete(child);
    resolve({ code, signal, stderr });
  }));
  return { child, exited };
}

test(`${WORKERS} processes × ${HOLDS_EACH} leases of one key under cuts, restarts with data loss and pauses: the fences miss no overlap`, {
  skip, timeout: 120_000,
}, async (t) => {
  const lockServer = await startRedis();
  const storeServer = await startRedis();
  const proxy = await startProxy(lockServer.port);
  t.after(async () => {
    await proxy.close();
    await lockServer.stop();
    await storeServer.stop();
  });

  const ns = uniqueNamespace('mutex');
  const holdListeners = new Set();
  const done = new Map();
  let holdsSeen = 0;
  const workers = new Map();
  const onEvent = (ev) => {
    if (ev.ev === 'hold') {
      holdsSeen += 1;
      for (const fn of [...holdListeners]) fn(ev);
    } else if (ev.ev === 'done') {
      done.set(ev.worker, ev);
    }
  };

  /** The next hold by a worker other than `notWorker` (null after timeoutMs). */
  const nextHold = (notWorker, timeoutMs) => new Promise((resolve) => {
    const timer = setTimeout(() => { holdListeners.delete(on); resolve(null); }, timeoutMs);
    const on = (ev) => {
      if (ev.worker === notWorker) return;
      clearTimeout(timer);
      holdListeners.delete(on);
      resolve(ev);
    };
    holdListeners.add(on);
  });
  /** Until the store accepted a fence above `fence` (the newer holder has written). */
  const storeAbove = async (fence, timeoutMs) => {
    const deadline = performance.now() + timeoutMs;
    while (performance.now() < deadline) {
      const last = await storeServer.command('GET', 'store:last');
      if (last !== null && BigInt(last) > BigInt(fence)) return true;
      await sleep(2);
    }
    return false;
  };

  /** Stops the holder, runs `during`, lets another worker take over and write, resumes it. */
  async function freezeHolder(ev, during) {
    const { child } = workers.get(ev.worker);
    child.kill('SIGSTOP');
    try {
      await during?.();
      const next = await nextHold(ev.worker, 4000);
      if (next) await storeAbove(ev.fence, 1000);
    } finally {
      child.kill('SIGCONT');
    }
  }

  const injected = {};
  const FAULTS = [
    ['pause a holder past its lease', (ev) => freezeHolder(ev)],
    ['cut every connection', () => proxy.killAll()],
    ['restart the lock server with its data lost, a holder frozen', (ev) => freezeHolder(ev, async () => {
      await lockServer.restart();
      if (SIMULATE_COUNTER_RESET) await lockServer.command('SET', fenceKeyOf(ns, KEY), '0');
    })],
    ['cut the next script reply mid-way', () => { proxy.cutMidReply({ after: 'EVALSHA' }); }],
    ['pause the lock server past commandTimeoutMs', async () => {
      await lockServer.pause();
      await sleep(400);
      await lockServer.resume();
    }],
    ['cut every connection with RST', () => proxy.killAll({ reset: true })],
    ['latency 20 ms each way for 5 holds', async () => {
      proxy.latency(20);
      for (let i = 0; i < 5; i++) await nextHold(undefined, 2000);
      proxy.latency(0);
    }],
  ];
  let faultBusy = false;
  let faultIndex = 0;
  const faultsDone = [];
  holdListeners.add(function scheduler(ev) {
    if (faultBusy || holdsSeen % FAULT_EVERY !== FAULT_EVERY / 2) return;
    if (holdsSeen > WORKERS * HOLDS_EACH - FAULT_EVERY) return; // let the run finish clean
    const [name, inject] = FAULTS[faultIndex++ % FAULTS.length];
    faultBusy = true;
    injected[name] = (injected[name] ?? 0) + 1;
    faultsDone.push(Promise.resolve().then(() => inject(ev)).finally(() => { faultBusy = false; }));
  });

  const started = performance.now();
  for (let id = 1; id <= WORKERS; id++) {
    workers.set(String(id), startWorker(id, {
      LOCK_PACKAGE: PACKAGE, LOCK_URL: proxy.url, STORE_PORT: String(storeServer.port), NS: ns,
      KEY, HOLDS: String(HOLDS_EACH), LEASE_MS: String(LEASE_MS), DEADLINE_MS: '60000',
    }, onEvent));
  }
  const exits = await within(90_000, Promise.all([...workers.values()].map((w) => w.exited)), 'the workers');
  await Promise.all(faultsDone);
  for (const exit of exits) assert.equal(exit.code, 0, `a worker failed: ${exit.stderr}`);

  const holds = [...done.values()].flatMap((d) => d.holds);
  const writes = (await storeServer.command('LRANGE', 'store:writes', '0', '-1')).map((line) => JSON.parse(line));
  const errors = {};
  for (const d of done.values()) for (const [code, n] of Object.entries(d.errors)) errors[code] = (errors[code] ?? 0) + n;
  const result = analyze({ holds, writes });
  const { details, ...counts } = result;
  const report = {
    ...counts,
    seconds: Number(((performance.now() - started) / 1000).toFixed(1)),
    faults: injected,
    workerErrors: errors,
  };
  t.diagnostic(`mutual-exclusion check: ${JSON.stringify(report)}`);
  if (process.env.MUTEX_REPORT) console.log(JSON.stringify({ report, details }, null, 2));

  assert.equal(result.holds, WORKERS * HOLDS_EACH, 'every worker completed its leases');
  assert.equal(result.missed, 0, `overlaps the fences would have missed: ${JSON.stringify(details.missed)}`);
  assert.equal(result.duplicateFences, 0, 'no two leases share a fence');
  assert.equal(result.inversions, 0, 'a lease granted later always has the larger fence');
  assert.ok(result.caught >= 1, 'the injected faults produced overlapping holds that the fences had to stop');
  assert.equal(result.unexplainedRejections, 0, 'every rejected write is the stale side of a caught overlap');
});
