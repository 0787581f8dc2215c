// Fault matrix (OPS-002), shutdown while Redis stalls: CLEANUP_TIMEOUT at shutdownTimeoutMs,
// never a false success, late replies still cleaned up, and a process that exits by itself.
// (__test__/shutdown.test.mjs covers the same with a SIGSTOPped server; here the faults come
// from the proxy, which can hold replies while letting commands through, or drop them.)

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { backend, eventually, failure, lockKeyOf, uniqueNamespace, within } from '../helpers/lock.mjs';
import { proxyFor } from '../helpers/proxy.mjs';
import { external, startRedis } from '../helpers/redis.mjs';
import { loadScripts } from './support.mjs';

const PACKAGE = fileURLToPath(new URL('../../index.js', import.meta.url));
const { createRedisLockDriver } = createRequire(import.meta.url)(PACKAGE);

const skip = external && 'needs throwaway redis-servers and a proxy (REDIS_URL is set)';

let redis;
before(async () => {
  if (external) return;
  redis = await startRedis();
  await loadScripts(redis); // faults aimed at a script's reply must not hit a NOSCRIPT instead
});
after(() => redis?.stop());


const exists = (key) => redis.command('EXISTS', key);

describe('shutdown while Redis stalls', () => {
  test('replies held: CLEANUP_TIMEOUT at shutdownTimeoutMs, the acquire in flight gets SHUT_DOWN, and its late lock is released once replies flow', { skip }, async (t) => {
    const proxy = await proxyFor(t, redis.port);
    const ns = uniqueNamespace('sd-stall');
    const d = createRedisLockDriver({ url: proxy.url, commandTimeoutMs: 250 }, backend(ns, { shutdownTimeoutMs: 400, leaseMs: 20_000 }));
    const held = await d.acquire('held');
    proxy.stallAfterWrite();
    const inFlight = failure(d.acquire('late'));
    await proxy.nextCommand('EVALSHA'); // the acquire of 'late' is on the wire
    const started = performance.now();
    const [acquireErr, shutdownErr] = await within(3000, Promise.all([inFlight, failure(d.shutdown())]), 'shutdown');
    const took = performance.now() - started;
    assert.equal(acquireErr.code, 'SHUT_DOWN');
    assert.equal(shutdownErr.code, 'CLEANUP_TIMEOUT', 'never reported as success');
    assert.ok(took >= 380 && took < 1200, `CLEANUP_TIMEOUT after ${took.toFixed(0)} ms with shutdownTimeoutMs 400`);
    assert.equal(held.valid, false);
    assert.equal(await exists(lockKeyOf(ns, 'late')), 1, "the in-flight acquire took effect in Redis");
    proxy.release();
    await eventually('the late lock to be released by token', async () => (await exists(lockKeyOf(ns, 'late'))) === 0, { timeoutMs: 3000 });
    assert.equal(await exists(lockKeyOf(ns, 'held')), 0, 'the tracked lease was released');
    assert.equal((await failure(d.shutdown())).code, 'CLEANUP_TIMEOUT', 'a second call repeats the result');
  });

  test('Redis unreachable: the release is retried past CLEANUP_TIMEOUT and lands once Redis is back', { skip }, async (t) => {
    const proxy = await proxyFor(t, redis.port);
    const ns = uniqueNamespace('sd-refused');
    const d = createRedisLockDriver({ url: proxy.url, commandTimeoutMs: 250, connectTimeoutMs: 250 },
      backend(ns, { shutdownTimeoutMs: 400, leaseMs: 20_000, pollIntervalMs: 20 }));
    await d.acquire('held');
    proxy.refuse();
    proxy.killAll();
    const err = await within(3000, failure(d.shutdown()), 'shutdown');
    assert.equal(err.code, 'CLEANUP_TIMEOUT');
    assert.equal(await exists(lockKeyOf(ns, 'held')), 1, 'not released yet: nothing could reach Redis');
    proxy.accept();
    await eventually('the release to land', async () => (await exists(lockKeyOf(ns, 'held'))) === 0, { timeoutMs: 4000 });
  });
});

describe('a process that shuts down while Redis stalls', () => {
  /** Runs a child that holds a lease, waits for 'go' on stdin, then shuts down while an acquire is in flight. */
  function runChild(url, ns) {
    const source = `
      import { createRequire } from 'node:module';
      const { createRedisLockDriver } = createRequire(process.env.LOCK_PACKAGE)(process.env.LOCK_PACKAGE);
      const d = createRedisLockDriver({ url: process.env.LOCK_URL, commandTimeoutMs: 250 },
        { driver: 'redis', connection: 'main', namespace: process.env.LOCK_NS, shutdownTimeoutMs: 500, leaseMs: 3000 });
      const held = await d.acquire('held');
      console.log(JSON.stringify({ ev: 'held', fence: held.fence }));
      process.stdin.once('data', async () => {
        const late = d.acquire('late').then(() => 'lease', (e) => e.code);
        const started = performance.now();
        const shutdown = await d.shutdown().then(() => 'resolved', (e) => e.code);
        const took = performance.now() - started;
        console.log(JSON.stringify({ ev: 'result', shutdown, took, acquire: await late }));
      });
    `;
    const child = spawn(process.execPath, ['--input-type=module', '-e', source], {
      env: { ...process.env, LOCK_PACKAGE: PACKAGE, LOCK_URL: url, LOCK_NS: ns },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    const lines = [];
    let waiting = [];
    let stderr = '';
    let buf = '';
    child.stdout.on('data', (d) => {
      buf += d;
      let nl;
      while ((nl = buf.indexOf('\n')) !== -1) {
        lines.push(JSON.parse(buf.slice(0, nl)));
        buf = buf.slice(nl + 1);
        for (const fn of waiting.splice(0)) fn();
      }
    });
    child.stderr.on('data', (d) => { stderr += d; });
    const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal, at: performance.now() })));
    const line = (ev) => within(5000, (async () => {
      for (;;) {
        const found = lines.find((l) => l.ev === ev);
        if (found) return found;
        await new Promise((resolve) => waiting.push(resolve));
      }
    })(), `the child's ${ev} line (stderr: ${stderr})`);
    return { child, line, exited, stderr: () => stderr };
  }

  for (const mode of ['held', 'dropped']) {
    test(`replies ${mode}: shutdown rejects CLEANUP_TIMEOUT at shutdownTimeoutMs and the process exits by itself`, { skip }, async (t) => {
      const proxy = await proxyFor(t, redis.port);
      const ns = uniqueNamespace(`sd-child-${mode}`);
      const run = runChild(proxy.url, ns);
      t.after(() => run.child.kill('SIGKILL'));
      await run.line('held');
      proxy.stallAfterWrite({ drop: mode === 'dropped' });
      run.child.stdin.end('go\n'); // also closes stdin, which must not keep the child alive
      const result = await run.line('result');
      const resultAt = performance.now();
      const exit = await within(3000, run.exited, 'the child to exit by itself');
      assert.equal(exit.code, 0, run.stderr());
      assert.equal(result.shutdown, 'CLEANUP_TIMEOUT', 'never a false success');
      assert.ok(result.took >= 480 && result.took < 1500, `shutdown took ${result.took.toFixed(0)} ms with shutdownTimeoutMs 500`);
      assert.equal(result.acquire, 'SHUT_DOWN');
      assert.ok(exit.at - resultAt < 1500, `exited ${(exit.at - resultAt).toFixed(0)} ms after shutdown settled`);
      // The process is gone; what it could not confirm is left to the lease TTL (3000 ms).
      const pttl = await redis.command('PTTL', lockKeyOf(ns, 'late'));
      assert.ok(pttl === -2 || (pttl > 0 && pttl <= 3000), `PTTL ${pttl}`);
    });
  }
});
