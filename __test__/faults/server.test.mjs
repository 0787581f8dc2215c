// Fault matrix (OPS-002), the rows about *what the server does*: a restart that loses the
// data, a flushed script cache and a failover to a server without the scripts, error
// replies (OOM, READONLY, BUSY, LOADING), maxclients, refused credentials and ACLs, and an
// evicting maxmemory-policy. Real redis-servers on free ports, the public JS API only.

import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { after, before, describe, test } from 'node:test';
import {
  backend, eventually, failure, fenceKeyOf, lockKeyOf, uniqueNamespace, within,
} from '../helpers/lock.mjs';
import { startProxy } from '../helpers/proxy.mjs';
import { external, startRedis } from '../helpers/redis.mjs';
import {
  assertRedisFailure, errorStats, holdConnections, makeBusy, makeLoading, makeOom, replicaLinked,
  scriptCommands,
} from './support.mjs';

const { createRedisLockDriver } = createRequire(import.meta.url)('../../index.js');

const skip = external && 'needs throwaway redis-servers (REDIS_URL is set)';
const COMMAND_TIMEOUT_MS = 250;

let redis;
before(async () => { if (!external) redis = await startRedis(); });
after(() => redis?.stop());

function driverOn(t, url, ns, extra = {}, logger = undefined) {
  const d = createRedisLockDriver({ url, commandTimeoutMs: COMMAND_TIMEOUT_MS, connectTimeoutMs: 500 },
    backend(ns, { shutdownTimeoutMs: 500, ...extra }), logger);
  t.after(() => d.shutdown().catch(() => {}));
  return d;
}

async function serverFor(t, args = []) {
  const s = await startRedis({ args });
  t.after(() => s.stop());
  return s;
}

/**
 * Acquires, trying again (at most `tries` times) after a failure the caller may retry:
 * right after a restart the driver's first command can fail (see the outcome matrix).
 * Returns the lease and the codes of the failures it went through.
 */
async function acquireRetrying(d, key, { tries = 4, waitTimeoutMs = 2000 } = {}) {
  const failures = [];
  for (let i = 0; i < tries; i++) {
    try {
      return { lease: await d.acquire(key, { waitTimeoutMs }), failures };
    } catch (err) {
      if (!['OUTCOME_UNKNOWN', 'PROVIDER_FAILED'].includes(err.code)) throw err;
      failures.push(err.code);
    }
  }
  throw new Error(`no lease after ${tries} tries: ${failures.join(', ')}`);
}

const max = (values) => values.reduce((a, b) => (b > a ? b : a));

// ------------------------------------------------------------------------------------

describe('restart with the data lost', () => {
  test('fences stay strictly above every fence handed out before, across three restarts', { skip }, async (t) => {
    const server = await serverFor(t);
    const ns = uniqueNamespace('restart');
    const d = driverOn(t, server.url, ns);
    const keys = ['a', 'b', 'c'];
    /** Every fence handed out, per key (fences are per key: each key has its own counter). */
    const handedOut = new Map(keys.map((k) => [k, []]));
    const failuresSeen = [];
    const take = async (key) => {
      const { lease, failures } = await acquireRetrying(d, key);
      failuresSeen.push(...failures);
      const fence = BigInt(lease.fence);
      const earlier = handedOut.get(key);
      if (earlier.length) assert.ok(fence > max(earlier), `${key}: fence ${fence} is not above ${max(earlier)}`);
      earlier.push(fence);
      return lease;
    };
    for (let round = 0; round < 3; round++) {
      for (const key of keys) {
        for (let i = 0; i < 3; i++) assert.equal(await (await take(key)).release(), true);
      }
      // One lease is held across the restart: its key and counter vanish with the data.
      const held = await take('a');
      await server.restart(); // keepData: false — a new empty dataset on the same port
      assert.equal(await server.command('DBSIZE'), 0, 'the data is gone');
      for (const key of keys) assert.equal(await (await take(key)).release(), true); // asserts above every earlier fence
      assert.equal(await held.release(), false, 'the lease held across the restart is no longer ours');
    }
    // A driver that never talked to the old server starts above too.
    const fresh = driverOn(t, server.url, ns);
    for (const key of keys) {
      const lease = await fresh.acquire(key, { waitTimeoutMs: 0 });
      assert.ok(BigInt(lease.fence) > max(handedOut.get(key)));
      await lease.release();
    }
    t.diagnostic(`failures right after restarts (retried): ${failuresSeen.join(', ') || 'none'}`);
  });
});

// ------------------------------------------------------------------------------------

describe('scripts missing on the server (NOSCRIPT → EVAL)', () => {
  test('SCRIPT FLUSH before renew, release and acquire: each falls back to EVAL once and works', { skip }, async (t) => {
    const proxy = await startProxy(redis.port);
    t.after(() => proxy.close());
    const ns = uniqueNamespace('flush');
    const d = driverOn(t, proxy.url, ns);
    const lease = await d.acquire('k');
    const noscript = (await errorStats(redis)).NOSCRIPT ?? 0;
    const from = proxy.commands.length; // the first acquire may have loaded its script already
    const evals = (script) => scriptCommands(proxy.commands.slice(from), script).filter((e) => e.name === 'EVAL').length;

    await redis.command('SCRIPT', 'FLUSH');
    await lease.renew();
    assert.equal(evals('renew'), 1);
    await redis.command('SCRIPT', 'FLUSH');
    assert.equal(await lease.release(), true);
    assert.equal(evals('release'), 1);
    await redis.command('SCRIPT', 'FLUSH');
    const again = await d.acquire('k', { waitTimeoutMs: 0 });
    assert.ok(BigInt(again.fence) > BigInt(lease.fence));
    assert.equal(evals('acquire'), 1);
    assert.equal((await errorStats(redis)).NOSCRIPT - noscript, 3, 'one NOSCRIPT per flush, each followed by one EVAL');
    assert.equal(await again.release(), true); // flushed by the third FLUSH as well
    assert.equal(evals('release'), 2);
    // An EVAL loads the script again: later calls are plain EVALSHAs.
    const third = await d.acquire('k', { waitTimeoutMs: 0 });
    assert.equal(await third.release(), true);
    assert.equal(evals('acquire'), 1);
    assert.equal(evals('release'), 2);
    assert.equal((await errorStats(redis)).NOSCRIPT - noscript, 4);
  });

  test('a failover to a fresh server without the scripts: NOSCRIPT → EVAL, the acquire works and its fence is above the old server’s', { skip }, async (t) => {
    const fresh = await serverFor(t);
    const proxy = await startProxy(redis.port);
    t.after(() => proxy.close());
    const ns = uniqueNamespace('failover');
    const d = driverOn(t, proxy.url, ns);
    const before = [];
    for (let i = 0; i < 3; i++) {
      const lease = await d.acquire('k');
      before.push(BigInt(lease.fence));
      assert.equal(await lease.release(), true);
    }
    const held = await d.acquire('held');
    before.push(BigInt(held.fence));

    const closed = new Promise((resolve) => proxy.events.once('close', resolve));
    proxy.retarget(fresh.port);
    proxy.killAll();
    await closed;
    const from = proxy.commands.length;
    const { lease, failures } = await acquireRetrying(d, 'k');
    t.diagnostic(`failures right after the failover (retried): ${failures.join(', ') || 'none'}`);
    assert.ok(BigInt(lease.fence) > max(before), 'the new server starts its counter above the old fences');
    const after = proxy.commands.slice(from);
    const acquires = scriptCommands(after, 'acquire');
    assert.ok(acquires.some((e) => e.name === 'EVALSHA'), 'tried by SHA first');
    assert.ok(acquires.some((e) => e.name === 'EVAL'), 'then sent the script');
    assert.ok(((await errorStats(fresh)).NOSCRIPT ?? 0) >= 1, 'the fresh server answered NOSCRIPT');
    assert.equal(await fresh.command('GET', lockKeyOf(ns, 'k')) !== null, true, 'the lock lives on the new server');
    assert.equal(await lease.release(), true);
    assert.equal(await held.release(), false, 'the lease from the old server is not on the new one');
  });
});

// ------------------------------------------------------------------------------------

describe('server error replies', () => {
  test('OOM (maxmemory + noeviction): PROVIDER_FAILED, COMMAND_REJECTED, not retryable; a waiting acquire rides it out', { skip }, async (t) => {
    const server = await serverFor(t);
    const ns = uniqueNamespace('oom');
    const d = driverOn(t, server.url, ns, { pollIntervalMs: 20 });
    const oom = await makeOom(server);
    const err = await failure(d.acquire('k', { waitTimeoutMs: 0 }));
    assertRedisFailure(assert, err, { lockCode: 'PROVIDER_FAILED', code: 'COMMAND_REJECTED', outcome: 'rejected', serverCode: 'OOM', retryable: false });
    assert.equal(await server.command('EXISTS', lockKeyOf(ns, 'k')), 0, 'nothing was written');
    const refused = (await errorStats(server)).OOM;
    const waiting = d.acquire('k', { waitTimeoutMs: 5000 });
    await eventually('the waiter to be refused again', async () => (await errorStats(server)).OOM >= refused + 2);
    await oom.restore();
    const lease = await within(5000, waiting, 'the waiting acquire');
    assert.equal(await lease.release(), true);
  });

  test('READONLY (a replica): PROVIDER_FAILED, COMMAND_REJECTED, retryable 503; a waiting acquire gets the lock once the replica is promoted, above the master’s fences', { skip }, async (t) => {
    // No 5 s wait for more replicas before the first sync; no wait for replicas on SIGTERM.
    const master = await serverFor(t, ['--repl-diskless-sync-delay', '0', '--shutdown-timeout', '0']);
    const replica = await serverFor(t, ['--shutdown-timeout', '0', '--replicaof', '127.0.0.1', String(master.port)]);
    await replicaLinked(replica);
    const ns = uniqueNamespace('readonly');
    const onMaster = driverOn(t, master.url, ns);
    const first = await onMaster.acquire('k');
    assert.equal(await first.release(), true);
    await master.command('WAIT', '1', '2000'); // the counter reached the replica

    const d = driverOn(t, replica.url, ns, { pollIntervalMs: 20 });
    const err = await failure(d.acquire('k', { waitTimeoutMs: 0 }));
    assertRedisFailure(assert, err, { lockCode: 'PROVIDER_FAILED', code: 'COMMAND_REJECTED', outcome: 'rejected', serverCode: 'READONLY', retryable: true });
    const started = performance.now();
    const timedOut = await failure(d.acquire('k', { waitTimeoutMs: 300 }));
    assert.ok(performance.now() - started >= 280, 'rode it out until the wait ended');
    assertRedisFailure(assert, timedOut, { lockCode: 'PROVIDER_FAILED', serverCode: 'READONLY', retryable: true });

    const refused = (await errorStats(replica)).READONLY;
    const waiting = d.acquire('k', { waitTimeoutMs: 5000 });
    await eventually('the waiter to be refused again', async () => (await errorStats(replica)).READONLY >= refused + 2);
    await replica.command('REPLICAOF', 'NO', 'ONE');
    const lease = await within(5000, waiting, 'the waiting acquire');
    assert.ok(BigInt(lease.fence) > BigInt(first.fence), 'the promoted replica continues the replicated counter');
    assert.equal(await lease.release(), true);
  });

  test('BUSY (a script past busy-reply-threshold): PROVIDER_FAILED, COMMAND_REJECTED, at once and not retryable (not in the contract list); works after SCRIPT KILL', { skip }, async (t) => {
    const server = await serverFor(t);
    const ns = uniqueNamespace('busy');
    const warm = driverOn(t, server.url, ns);
    await (await warm.acquire('warm-up')).release();
    const busy = await makeBusy(server);
    t.after(() => busy.kill());
    const started = performance.now();
    const onOpen = await within(3000, failure(warm.acquire('k', { waitTimeoutMs: 2000 })), 'the acquire');
    assert.ok(performance.now() - started < 1000, 'no waiting on BUSY');
    assertRedisFailure(assert, onOpen, { lockCode: 'PROVIDER_FAILED', code: 'COMMAND_REJECTED', outcome: 'rejected', serverCode: 'BUSY', retryable: false });
    const fresh = driverOn(t, server.url, ns);
    const onNew = await within(3000, failure(fresh.acquire('k', { waitTimeoutMs: 0 })), 'the acquire on a new connection');
    assertRedisFailure(assert, onNew, { lockCode: 'PROVIDER_FAILED', code: 'COMMAND_REJECTED', outcome: 'rejected', serverCode: 'BUSY' });
    await busy.kill();
    assert.match(await busy.ended, /killed/i);
    const lease = await warm.acquire('k', { waitTimeoutMs: 0 });
    assert.equal(await lease.release(), true);
  });

  test('LOADING (a reload in progress): PROVIDER_FAILED, COMMAND_REJECTED, retryable 503; a waiting acquire gets the lock once loaded', { skip }, async (t) => {
    const server = await serverFor(t, ['--enable-debug-command', 'yes']);
    const ns = uniqueNamespace('loading');
    const warm = driverOn(t, server.url, ns, { pollIntervalMs: 20 });
    await (await warm.acquire('warm-up')).release();
    const loading = await makeLoading(server);
    const onOpen = await failure(warm.acquire('k', { waitTimeoutMs: 0 }));
    const fresh = driverOn(t, server.url, ns);
    const onNew = await failure(fresh.acquire('k', { waitTimeoutMs: 0 }));
    const waiting = warm.acquire('k', { waitTimeoutMs: 10_000 });
    assertRedisFailure(assert, onOpen, { lockCode: 'PROVIDER_FAILED', code: 'COMMAND_REJECTED', outcome: 'rejected', serverCode: 'LOADING', retryable: true });
    assertRedisFailure(assert, onNew, { lockCode: 'PROVIDER_FAILED', outcome: 'rejected', serverCode: 'LOADING', retryable: true });
    await within(20_000, loading.done, 'the reload');
    const lease = await within(5000, waiting, 'the waiting acquire');
    assert.equal(lease.valid, true);
    assert.equal(await lease.release(), true);
  });
});

// ------------------------------------------------------------------------------------

describe('connections and credentials', () => {
  test('maxclients reached: PROVIDER_FAILED CONNECTION_FAILED (retryable, no hang); a waiting acquire gets the lock once a slot frees', { skip }, async (t) => {
    const server = await serverFor(t, ['--maxclients', '1']);
    const hold = await holdConnections(server.port, 1);
    t.after(() => hold.close());
    const ns = uniqueNamespace('maxclients');
    const d = driverOn(t, server.url, ns, { pollIntervalMs: 20 });
    const err = await within(3000, failure(d.acquire('k', { waitTimeoutMs: 0 })), 'the acquire');
    assertRedisFailure(assert, err, { lockCode: 'PROVIDER_FAILED', code: 'CONNECTION_FAILED', outcome: 'not-submitted', retryable: true });
    const started = performance.now();
    const timedOut = await within(3000, failure(d.acquire('k', { waitTimeoutMs: 300 })), 'the waiting acquire');
    assert.ok(performance.now() - started < 1500);
    assert.equal(timedOut.code, 'PROVIDER_FAILED');
    const waiting = d.acquire('k', { waitTimeoutMs: 5000 });
    hold.close();
    const lease = await within(5000, waiting, 'the waiting acquire');
    assert.equal(await lease.release(), true);
  });

  test('AUTH with a wrong password (requirepass): PROVIDER_FAILED, not retryable, at once even with a wait', { skip }, async (t) => {
    const server = await serverFor(t);
    const ns = uniqueNamespace('auth');
    const right = driverOn(t, `redis://:right-pass-1@127.0.0.1:${server.port}`, ns);
    // The harness cannot start with --requirepass (its readiness PING is unauthenticated);
    // CONFIG SET requirepass is the same server setting.
    await server.command('CONFIG', 'SET', 'requirepass', 'right-pass-1');
    const wrong = driverOn(t, `redis://:wrong-pass-2@127.0.0.1:${server.port}`, ns);
    let started = performance.now();
    const err = await within(3000, failure(wrong.acquire('k', { waitTimeoutMs: 2000 })), 'the acquire');
    assert.ok(performance.now() - started < 1000, 'no waiting on refused credentials');
    assertRedisFailure(assert, err, { lockCode: 'PROVIDER_FAILED', code: 'CONNECTION_FAILED', outcome: 'not-submitted', retryable: false, serverCode: 'WRONGPASS' });
    assert.ok(!err.message.includes('wrong-pass-2') && !err.message.includes('right-pass-1'));

    const none = driverOn(t, `redis://127.0.0.1:${server.port}`, ns);
    started = performance.now();
    const noauth = await within(3000, failure(none.acquire('k', { waitTimeoutMs: 2000 })), 'the acquire');
    assert.ok(performance.now() - started < 1000);
    // The driver speaks RESP3, so the refusal comes at the handshake (HELLO), before any command.
    assertRedisFailure(assert, noauth, { lockCode: 'PROVIDER_FAILED', code: 'CONNECTION_FAILED', outcome: 'not-submitted', retryable: false, serverCode: 'NOAUTH' });

    const lease = await right.acquire('k', { waitTimeoutMs: 0 });
    assert.equal(await lease.release(), true);
  });

  test('ACL users without the needed key patterns or commands: PROVIDER_FAILED at once, not retryable', { skip }, async (t) => {
    const users = {
      'no-keys': ['~other:*', '&*', '+@all'],
      'eval-only': ['~*', '&*', '-@all', '+evalsha', '+eval'],
      nothing: ['~*', '&*', '-@all'],
    };
    for (const [user, rules] of Object.entries(users)) {
      await redis.command('ACL', 'SETUSER', user, 'on', `>pw-${user}`, ...rules);
      t.after(() => redis.command('ACL', 'DELUSER', user));
      const ns = uniqueNamespace(`acl-${user}`);
      const d = driverOn(t, `redis://${user}:pw-${user}@127.0.0.1:${redis.port}`, ns);
      const started = performance.now();
      const err = await within(3000, failure(d.acquire('k', { waitTimeoutMs: 2000 })), `the acquire as ${user}`);
      assert.ok(performance.now() - started < 1000, `${user}: no waiting on a refusal`);
      assertRedisFailure(assert, err, { lockCode: 'PROVIDER_FAILED', code: 'COMMAND_REJECTED', outcome: 'rejected', retryable: false });
      assert.ok(['NOPERM', 'ERR'].includes(err.cause.serverCode), `${user}: serverCode ${err.cause.serverCode}`);
      assert.ok(!err.message.includes(user) && !err.message.includes(`pw-${user}`), err.message);
      assert.equal(await redis.command('EXISTS', lockKeyOf(ns, 'k')), 0, `${user}: nothing was left behind`);
    }
  });

  test('an ACL that allows SET but denies INCR and DEL: the failed acquire leaves no lock behind', {
    skip,
  }, async (t) => {
    await redis.command('ACL', 'SETUSER', 'half', 'on', '>pw-half', '~*', '&*', '+@all', '-incr', '-del');
    t.after(() => redis.command('ACL', 'DELUSER', 'half'));
    const ns = uniqueNamespace('acl-half');
    const d = driverOn(t, `redis://half:pw-half@127.0.0.1:${redis.port}`, ns);
    const err = await failure(d.acquire('k', { waitTimeoutMs: 0 }));
    assert.equal(err.code, 'PROVIDER_FAILED');
    assert.equal(await redis.command('EXISTS', lockKeyOf(ns, 'k')), 0, 'PROVIDER_FAILED promises nothing took effect');
  });
});

// ------------------------------------------------------------------------------------

describe('eviction policy', () => {
  // allkeys-lru is covered by __test__/errors.test.mjs ('an evicting maxmemory-policy logs
  // error REDIS_EVICTION_UNSAFE …'); here a volatile policy, which evicts lock keys too
  // (they have a TTL).
  test('volatile-ttl logs error REDIS_EVICTION_UNSAFE once, with the policy, and the lock still works', { skip }, async (t) => {
    const server = await serverFor(t, ['--maxmemory-policy', 'volatile-ttl']);
    const calls = [];
    let heard;
    const logged = new Promise((resolve) => { heard = resolve; });
    const logger = Object.fromEntries(['debug', 'info', 'warn', 'error'].map((level) => [level, (fields, msg) => {
      calls.push({ level, fields, msg });
      if (fields?.code === 'REDIS_EVICTION_UNSAFE') heard();
    }]));
    const d = driverOn(t, server.url, uniqueNamespace('evict'), {}, logger);
    const lease = await d.acquire('k');
    await within(3000, logged, 'the REDIS_EVICTION_UNSAFE event');
    assert.equal(await lease.release(), true);
    await (await d.acquire('k')).release();
    const events = calls.filter((c) => c.fields?.code === 'REDIS_EVICTION_UNSAFE');
    assert.equal(events.length, 1, 'once per driver');
    assert.equal(events[0].level, 'error');
    assert.equal(events[0].fields.policy, 'volatile-ttl');
  });
});
