// Redis failures: classification (PROVIDER_FAILED / OUTCOME_UNKNOWN), their RedisError
// causes, background cleanup of unknown outcomes, the logger, and what errors never show.

import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { after, before, describe, test } from 'node:test';
import { inspect } from 'node:util';
import {
  backend, commandCalls, eventually, failure, fenceKeyOf, freePort, lockKeyOf, scriptCalls,
  uniqueNamespace, within,
} from './helpers/lock.mjs';
import { external, startRedis } from './helpers/redis.mjs';

const { createRedisLockDriver, LockError } = createRequire(import.meta.url)('../index.js');

const skip = external && 'needs a throwaway redis-server (REDIS_URL is set)';

// Everything this file saw come out of the driver, searched for secrets at the end.
const seenErrors = [];
const seenLogs = [];
const secrets = new Set(['hunter2', 'secret-key']);
let keyCounter = 0;
/** A key whose text must never appear in an error. */
const secretKey = () => `secret-key-${++keyCounter}`;

let redis;
before(async () => { redis = await startRedis(); });
after(() => redis?.stop());

function driverOn(t, connection, namespace, extra = {}, logger = undefined) {
  const d = createRedisLockDriver(connection, backend(namespace, extra), logger);
  t.after(() => d.shutdown().catch((err) => { seenErrors.push(err); }));
  return d;
}

async function caught(promise) {
  const err = await failure(promise);
  seenErrors.push(err);
  return err;
}

function assertRedisCause(err, { lockCode, code, outcome, retryable, serverCode }) {
  assert.ok(err instanceof LockError, `not a LockError: ${inspect(err)}`);
  assert.equal(err.code, lockCode, err.message);
  const cause = err.cause;
  assert.ok(cause instanceof Error, `cause is not an Error: ${inspect(cause)}`);
  assert.equal(cause.name, 'RedisError');
  assert.equal(cause.plugin, 'dokebi-redis');
  assert.equal(cause.code, code);
  assert.equal(cause.outcome, outcome);
  if (retryable !== undefined) {
    assert.equal(cause.retryable, retryable);
    assert.equal(cause.status, retryable ? 503 : undefined);
  }
  if (serverCode !== undefined) assert.equal(cause.serverCode, serverCode);
  assert.equal(typeof cause.message, 'string');
}

describe('nothing listening', () => {
  test('waitTimeoutMs 0 rejects PROVIDER_FAILED at once, caused by a retryable CONNECTION_FAILED', async (t) => {
    const port = await freePort();
    secrets.add(`:${port}`);
    const d = driverOn(t, `redis://:hunter2@127.0.0.1:${port}`, uniqueNamespace('refused'));
    const started = performance.now();
    const err = await caught(d.acquire(secretKey(), { waitTimeoutMs: 0 }));
    assert.ok(performance.now() - started < 1000, 'failed fast');
    assertRedisCause(err, {
      lockCode: 'PROVIDER_FAILED', code: 'CONNECTION_FAILED', outcome: 'not-submitted', retryable: true,
    });
  });

  test('a waiting acquire keeps trying and rejects PROVIDER_FAILED after about its wait, never hanging', async (t) => {
    const port = await freePort();
    secrets.add(`:${port}`);
    const d = driverOn(t, { url: `redis://:hunter2@127.0.0.1:${port}` }, uniqueNamespace('refused-wait'));
    const started = performance.now();
    const err = await within(5000, caught(d.acquire(secretKey(), { waitTimeoutMs: 300 })), 'the acquire');
    const took = performance.now() - started;
    assert.ok(took >= 250 && took < 1500, `took ${took} ms`);
    assertRedisCause(err, { lockCode: 'PROVIDER_FAILED', code: 'CONNECTION_FAILED', outcome: 'not-submitted', retryable: true });
  });

  test('a waiting acquire succeeds once Redis comes back during the wait', { skip }, async (t) => {
    const server = await startRedis();
    t.after(() => server.stop());
    await server.kill();
    const ns = uniqueNamespace('comes-back');
    const d = driverOn(t, server.url, ns);
    const key = secretKey();
    const waiting = d.acquire(key, { waitTimeoutMs: 8000 });
    await server.restart();
    const lease = await within(8000, waiting, 'the acquire');
    assert.equal(lease.valid, true);
    secrets.add(await server.command('GET', lockKeyOf(ns, key)));
    assert.equal(await lease.release(), true);
  });
});

describe('a stalled Redis', () => {
  test('a reply later than commandTimeoutMs rejects OUTCOME_UNKNOWN at once, and the late acquire is released by token in the background', { skip }, async (t) => {
    const ns = uniqueNamespace('stalled');
    const d = driverOn(t, { url: redis.url, commandTimeoutMs: 200 }, ns);
    const warm = await d.acquire('warm-up'); // the connection is open before Redis stalls
    await warm.release();
    const key = secretKey();

    await redis.pause();
    let resumed = false;
    t.after(() => (resumed ? undefined : redis.resume()));
    const started = performance.now();
    const err = await within(3000, caught(d.acquire(key)), 'the acquire'); // default 5 s wait
    const took = performance.now() - started;
    assert.ok(took >= 150 && took < 1000, `took ${took} ms with commandTimeoutMs 200`);
    assertRedisCause(err, { lockCode: 'OUTCOME_UNKNOWN', code: 'COMMAND_TIMEOUT', outcome: 'unknown', retryable: true });

    await redis.resume();
    resumed = true;
    // Redis runs the acquire it had queued (its fence counter appears), and the
    // driver deletes the orphan lock by token long before its 10 s lease.
    await eventually('the late acquire to run and be cleaned up', async () => {
      const [fence, lock] = await Promise.all([
        redis.command('EXISTS', fenceKeyOf(ns, key)), redis.command('EXISTS', lockKeyOf(ns, key)),
      ]);
      return fence === 1 && lock === 0;
    }, { timeoutMs: 3000 });

    const lease = await d.acquire(key, { waitTimeoutMs: 0 });
    assert.equal(lease.valid, true);
    assert.equal(await lease.release(), true);
  });

  test('an acquire aborted while its command is stalled is released by token once Redis answers', { skip }, async (t) => {
    const ns = uniqueNamespace('stalled-abort');
    const d = driverOn(t, { url: redis.url, commandTimeoutMs: 2000 }, ns);
    await (await d.acquire('warm-up')).release();
    const key = secretKey();
    await redis.pause();
    let resumed = false;
    t.after(() => (resumed ? undefined : redis.resume()));
    const controller = new AbortController();
    const pending = caught(d.acquire(key, { signal: controller.signal }));
    setTimeout(() => controller.abort(), 50);
    const err = await within(1000, pending, 'the aborted acquire');
    assert.equal(err.code, 'ABORTED');
    await redis.resume();
    resumed = true;
    await eventually('the late acquire to run and be cleaned up', async () => {
      const [fence, lock] = await Promise.all([
        redis.command('EXISTS', fenceKeyOf(ns, key)), redis.command('EXISTS', lockKeyOf(ns, key)),
      ]);
      return fence === 1 && lock === 0;
    }, { timeoutMs: 3000 });
  });
});

describe('a stalled Redis during renew and release', () => {
  test('a renew without a reply within commandTimeoutMs rejects OUTCOME_UNKNOWN and leaves the lease invalid for good', { skip }, async (t) => {
    const ns = uniqueNamespace('stalled-renew');
    const d = driverOn(t, { url: redis.url, commandTimeoutMs: 200 }, ns);
    const key = secretKey();
    const lease = await d.acquire(key);
    await redis.pause();
    let resumed = false;
    t.after(() => (resumed ? undefined : redis.resume()));
    const err = await within(3000, caught(lease.renew()), 'the renew');
    assertRedisCause(err, { lockCode: 'OUTCOME_UNKNOWN', code: 'COMMAND_TIMEOUT', outcome: 'unknown', retryable: true });
    assert.equal(lease.valid, false);
    assert.equal(lease.remainingMs, 0);
    await redis.resume();
    resumed = true;
    const again = await caught(lease.renew());
    assert.equal(again.code, 'LEASE_EXPIRED', 'an unknown outcome never becomes valid again');
    assert.equal(lease.valid, false);
  });

  test('a release without a reply rejects OUTCOME_UNKNOWN, and shutdown after Redis recovers still frees the key', { skip }, async (t) => {
    const ns = uniqueNamespace('stalled-release');
    const d = createRedisLockDriver({ url: redis.url, commandTimeoutMs: 200 }, backend(ns));
    const key = secretKey();
    const lease = await d.acquire(key);
    await redis.pause();
    let resumed = false;
    t.after(() => (resumed ? undefined : redis.resume()));
    const err = await within(3000, caught(lease.release()), 'the release');
    assertRedisCause(err, { lockCode: 'OUTCOME_UNKNOWN', code: 'COMMAND_TIMEOUT', outcome: 'unknown', retryable: true });
    assert.equal(lease.valid, false);
    await redis.resume();
    resumed = true;
    await d.shutdown();
    assert.equal(await redis.command('EXISTS', lockKeyOf(ns, key)), 0);
  });
});

describe('server error replies', () => {
  test('an OOM reply rejects PROVIDER_FAILED with a rejected COMMAND_REJECTED cause', { skip }, async (t) => {
    const server = await startRedis({ args: ['--maxmemory', '1mb', '--maxmemory-policy', 'noeviction'] });
    t.after(() => server.stop());
    // Fill up to the limit with ever smaller values, so that even a small write is refused.
    let n = 0;
    for (const size of [16384, 1024, 64]) {
      for (let refused = false; !refused;) {
        try {
          await server.command('SET', `fill:${n++}`, 'x'.repeat(size));
        } catch (err) {
          assert.match(err.message, /^OOM/);
          refused = true;
        }
      }
    }
    const ns = uniqueNamespace('oom');
    const d = driverOn(t, server.url, ns);
    const key = secretKey();
    const err = await caught(d.acquire(key, { waitTimeoutMs: 0 }));
    assertRedisCause(err, { lockCode: 'PROVIDER_FAILED', code: 'COMMAND_REJECTED', outcome: 'rejected', serverCode: 'OOM' });
    assert.equal(await server.command('EXISTS', lockKeyOf(ns, key)), 0);

    // A waiting acquire rides OOM out: once Redis has room again it gets the lock.
    const base = await scriptCalls(server);
    const waiting = d.acquire(key, { waitTimeoutMs: 5000 });
    await eventually('the waiter to be refused once', async () => (await scriptCalls(server)) > base);
    await server.command('CONFIG', 'SET', 'maxmemory', '0');
    const lease = await within(5000, waiting, 'the waiting acquire');
    assert.equal(lease.valid, true);
    secrets.add(await server.command('GET', lockKeyOf(ns, key)));
    await lease.release();
  });

  test('a waiting acquire that stays OOM rejects PROVIDER_FAILED when its wait ends', { skip }, async (t) => {
    const server = await startRedis({ args: ['--maxmemory', '1mb', '--maxmemory-policy', 'noeviction'] });
    t.after(() => server.stop());
    await server.command('CONFIG', 'SET', 'maxmemory', '1'); // every write is refused
    const d = driverOn(t, server.url, uniqueNamespace('oom-wait'));
    const started = performance.now();
    const err = await caught(d.acquire(secretKey(), { waitTimeoutMs: 300 }));
    const took = performance.now() - started;
    assert.ok(took >= 250 && took < 1500, `took ${took} ms`);
    assertRedisCause(err, { lockCode: 'PROVIDER_FAILED', code: 'COMMAND_REJECTED', outcome: 'rejected', serverCode: 'OOM' });
  });

  test('a permission refusal (NOPERM) fails at once even with a wait', { skip }, async (t) => {
    await redis.command('ACL', 'SETUSER', 'locker', 'on', '>hunter2-acl', '~*', '&*', '+@all', '-evalsha', '-eval');
    t.after(() => redis.command('ACL', 'DELUSER', 'locker'));
    const url = `redis://locker:hunter2-acl@127.0.0.1:${redis.port}`;
    const d = driverOn(t, url, uniqueNamespace('noperm'));
    const started = performance.now();
    const err = await caught(d.acquire(secretKey(), { waitTimeoutMs: 3000 }));
    assert.ok(performance.now() - started < 1000, 'no waiting on a refusal');
    assertRedisCause(err, { lockCode: 'PROVIDER_FAILED', code: 'COMMAND_REJECTED', outcome: 'rejected', serverCode: 'NOPERM', retryable: false });
  });

  test('a wrong password fails at once even with a wait, as a non-retryable PROVIDER_FAILED', { skip }, async (t) => {
    await redis.command('ACL', 'SETUSER', 'guarded', 'on', '>right-pass', '~*', '&*', '+@all');
    t.after(() => redis.command('ACL', 'DELUSER', 'guarded'));
    const d = driverOn(t, `redis://guarded:hunter2@127.0.0.1:${redis.port}`, uniqueNamespace('wrongpass'));
    const started = performance.now();
    const err = await caught(d.acquire(secretKey(), { waitTimeoutMs: 3000 }));
    assert.ok(performance.now() - started < 1000, 'no waiting on refused credentials');
    assertRedisCause(err, { lockCode: 'PROVIDER_FAILED', code: 'CONNECTION_FAILED', outcome: 'not-submitted', retryable: false });
  });

  test('an acquire whose fence INCR fails leaves no lock behind and rejects PROVIDER_FAILED', async (t) => {
    const ns = uniqueNamespace('bad-fence');
    const d = driverOn(t, redis.url, ns);
    const key = secretKey();
    await redis.command('LPUSH', fenceKeyOf(ns, key), 'not-a-counter'); // a foreign write of the wrong type
    const err = await caught(d.acquire(key, { waitTimeoutMs: 0 }));
    assertRedisCause(err, { lockCode: 'PROVIDER_FAILED', code: 'COMMAND_REJECTED', outcome: 'rejected', serverCode: 'WRONGTYPE' });
    assert.equal(await redis.command('EXISTS', lockKeyOf(ns, key)), 0, 'the SET was undone');
  });

  test('a flushed script cache falls back to EVAL once and the acquire works', { skip }, async (t) => {
    const d = driverOn(t, redis.url, uniqueNamespace('noscript'));
    await (await d.acquire('warm-up')).release();
    await redis.command('SCRIPT', 'FLUSH');
    const evals = await commandCalls(redis, 'eval');
    const lease = await d.acquire(secretKey(), { waitTimeoutMs: 0 });
    assert.equal(await commandCalls(redis, 'eval'), evals + 1);
    assert.equal(await lease.release(), true);
  });

  test('a lock key without expiry (a foreign write) makes a waiter time out, not fail or hang', async (t) => {
    const ns = uniqueNamespace('no-expiry');
    const d = driverOn(t, redis.url, ns);
    const key = secretKey();
    await redis.command('SET', lockKeyOf(ns, key), 'someone-else');
    const started = performance.now();
    const err = await caught(d.acquire(key, { waitTimeoutMs: 200 }));
    assert.equal(err.code, 'WAIT_TIMEOUT');
    assert.ok(performance.now() - started < 1500);
    assert.equal(await redis.command('GET', lockKeyOf(ns, key)), 'someone-else');
  });
});

describe('logger', () => {
  test('an evicting maxmemory-policy logs error REDIS_EVICTION_UNSAFE with the policy after the first acquire', { skip }, async (t) => {
    const server = await startRedis({ args: ['--maxmemory-policy', 'allkeys-lru'] });
    t.after(() => server.stop());
    let logged;
    const heard = new Promise((resolve) => { logged = resolve; });
    const calls = [];
    const logger = {
      error(fields, msg) { calls.push(['error', fields, msg]); seenLogs.push(fields, msg); logged(); },
      warn(fields, msg) { calls.push(['warn', fields, msg]); seenLogs.push(fields, msg); },
      info(fields, msg) { calls.push(['info', fields, msg]); seenLogs.push(fields, msg); },
      debug(fields, msg) { calls.push(['debug', fields, msg]); seenLogs.push(fields, msg); },
    };
    const d = driverOn(t, server.url, uniqueNamespace('evict'), {}, logger);
    const lease = await d.acquire(secretKey());
    await within(3000, heard, 'the REDIS_EVICTION_UNSAFE log');
    assert.equal(calls.length, 1);
    const [level, fields, msg] = calls[0];
    assert.equal(level, 'error');
    assert.deepEqual({ ...fields }, { code: 'REDIS_EVICTION_UNSAFE', policy: 'allkeys-lru' });
    assert.equal(typeof msg, 'string');
    await lease.release();
  });

  test('with noeviction nothing is logged', { skip }, async (t) => {
    const logs = [];
    const record = (level) => (fields, msg) => { logs.push([level, fields, msg]); seenLogs.push(fields, msg); };
    const logger = { error: record('error'), warn: record('warn'), info: record('info'), debug: record('debug') };
    assert.equal(await redis.command('CONFIG', 'GET', 'maxmemory-policy').then((r) => r[1]), 'noeviction');
    let reads = 0;
    const infoBefore = await commandCalls(redis, 'info');
    reads += 1;
    const d = driverOn(t, redis.url, uniqueNamespace('noevict'), {}, logger);
    await (await d.acquire(secretKey())).release();
    // Wait until the driver's policy check (an INFO of its own) has been answered.
    await eventually('the driver to read the policy', async () => {
      const now = await commandCalls(redis, 'info');
      reads += 1;
      return now - infoBefore - (reads - 1) >= 1;
    });
    await (await d.acquire(secretKey())).release();
    await new Promise((resolve) => setTimeout(resolve, 50)); // let a log call, if any, cross to JS
    assert.deepEqual(logs, []);
  });

  test('a logger without methods, or one that throws, never breaks acquire', { skip }, async (t) => {
    const server = await startRedis({ args: ['--maxmemory-policy', 'allkeys-lru'] });
    t.after(() => server.stop());
    let thrown;
    const threw = new Promise((resolve) => { thrown = resolve; });
    const loggers = [
      {},
      Object.create(null),
      { error: 'not a function', warn: 42 },
      { error() { thrown(); throw new Error('logger exploded'); } },
    ];
    for (const logger of loggers) {
      const ns = uniqueNamespace('bad-logger');
      const d = driverOn(t, server.url, ns, {}, logger);
      const lease = await d.acquire(secretKey());
      assert.equal(lease.valid, true);
      assert.equal(await lease.release(), true);
    }
    await within(3000, threw, 'the throwing logger to be called');
    // After the logger threw, the driver still works.
    const d = driverOn(t, server.url, uniqueNamespace('bad-logger-after'), {}, loggers[3]);
    const lease = await d.acquire(secretKey());
    assert.equal(await lease.release(), true);
  });

  test('a logger that is not an object rejects INVALID_OPTIONS', () => {
    for (const logger of ['console', 42, true]) {
      const err = (() => { try { createRedisLockDriver(redis.url, backend('svc'), logger); } catch (e) { return e; } })();
      assert.ok(err instanceof LockError);
      assert.equal(err.code, 'INVALID_OPTIONS');
    }
  });
});

describe('secrecy', () => {
  test('no error or log of this file shows a key, a token, a URL, a password or an address', () => {
    assert.ok(seenErrors.length >= (external ? 2 : 12), `only ${seenErrors.length} errors were collected`);
    secrets.add('127.0.0.1');
    secrets.add('redis://');
    for (const err of seenErrors) {
      const shown = `${inspect(err, { depth: 10, showHidden: true })}\n${JSON.stringify(err)}\n${err.cause?.message ?? ''}`;
      for (const secret of secrets) {
        assert.ok(!shown.includes(secret), `${JSON.stringify(secret)} appears in: ${shown}`);
      }
    }
    const logged = inspect(seenLogs, { depth: 10 });
    for (const secret of secrets) assert.ok(!logged.includes(secret), `${secret} appears in a log: ${logged}`);
  });
});
