// Tracing channels for APM: dokebi:lock-redis:acquire, :release and :renew publish Node's
// tracePromise events with a context that carries key, namespace and the lease — and never a
// token, a password or an address.

import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { tracingChannel } from 'node:diagnostics_channel';
import { createRequire } from 'node:module';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { inspect, promisify } from 'node:util';
import { backend, failure, freePort, lockKeyOf, uniqueNamespace, driverFor as sharedDriverFor } from './helpers/lock.mjs';
import { external, startRedis } from './helpers/redis.mjs';

const { createRedisLockDriver, LockError } = createRequire(import.meta.url)('../index.js');

const NAMES = ['acquire', 'release', 'renew'];
const EVENTS = ['start', 'end', 'asyncStart', 'asyncEnd', 'error'];
const SUCCESS = ['start', 'end', 'asyncStart', 'asyncEnd'];
const FAILURE = ['start', 'end', 'error', 'asyncStart', 'asyncEnd'];

/**
 * Subscribes to every event of the three channels until the test ends. Each record keeps the
 * context object and what it held at that moment (contexts are filled in as the call goes).
 */
function record(t) {
  const seen = [];
  for (const name of NAMES) {
    const channel = tracingChannel(`dokebi:lock-redis:${name}`);
    const handlers = Object.fromEntries(EVENTS.map((event) => [event, (ctx) => {
      seen.push({ name, event, ctx, fields: Object.keys(ctx).sort(), result: ctx.result, error: ctx.error });
    }]));
    channel.subscribe(handlers);
    t.after(() => channel.unsubscribe(handlers));
  }
  return {
    /** Records of one channel for `namespace` (other tests' drivers publish too). */
    of: (name, namespace) => seen.filter((r) => r.name === name && r.ctx.namespace === namespace),
    all: () => seen,
  };
}

let redis;
before(async () => { redis = await startRedis(); });
after(() => redis?.stop());

const driverFor = (t, namespace, extra, connection = redis.url) =>
  sharedDriverFor(t, createRedisLockDriver, connection, namespace, extra);

/** Asserts one traced call: the events in order, all on one context object. */
function oneCall(records, events) {
  assert.deepEqual(records.map((r) => r.event), events);
  for (const r of records) assert.equal(r.ctx, records[0].ctx, 'one context object per call');
  return records[0].ctx;
}

describe('acquire channel', () => {
  test('a successful acquire publishes start, end, asyncStart, asyncEnd; the result is the lease, with its fence', async (t) => {
    const trace = record(t);
    const ns = uniqueNamespace('trace-acquire');
    const d = driverFor(t, ns);
    const lease = await d.acquire('orders:42');
    const records = trace.of('acquire', ns);
    const ctx = oneCall(records, SUCCESS);
    assert.equal(ctx.key, 'orders:42');
    assert.equal(ctx.namespace, ns);
    assert.deepEqual(records[0].fields, ['key', 'namespace'], 'start: key and namespace only');
    assert.equal(records[1].result, undefined, 'end comes before the acquire has settled');
    assert.equal(records[2].result, lease, 'asyncStart: the very lease acquire resolved with');
    assert.equal(ctx.result.fence, lease.fence);
    assert.equal(ctx.error, undefined);
    await lease.release();
  });

  test('a failed acquire publishes start, end, error, asyncStart, asyncEnd; error is the LockError the caller got', async (t) => {
    const trace = record(t);
    const ns = uniqueNamespace('trace-busy');
    const d = driverFor(t, ns);
    const held = await d.acquire('k');
    const err = await failure(d.acquire('k', { waitTimeoutMs: 0 }));
    assert.ok(err instanceof LockError);
    assert.equal(err.code, 'LOCK_BUSY');
    const busy = trace.of('acquire', ns).slice(4); // after the first acquire's four events
    const ctx = oneCall(busy, FAILURE);
    assert.equal(ctx.error, err, 'the same error object');
    assert.equal(busy[2].error, err, 'set by the error event');
    assert.equal('result' in ctx, false);
    await held.release();
  });

  test('input errors (INVALID_KEY, INVALID_OPTIONS) are traced as failures too', async (t) => {
    const trace = record(t);
    const ns = uniqueNamespace('trace-invalid');
    const d = driverFor(t, ns);
    const badKey = await failure(d.acquire(''));
    const badOptions = await failure(d.acquire('k', { waitTimeout: 1 }));
    const records = trace.of('acquire', ns);
    assert.equal(oneCall(records.slice(0, 5), FAILURE).error, badKey);
    assert.equal(oneCall(records.slice(5), FAILURE).error, badOptions);
    assert.deepEqual([badKey.code, badOptions.code], ['INVALID_KEY', 'INVALID_OPTIONS']);
  });
});

describe('release and renew channels', () => {
  test('release publishes its events with the lease and what release() resolved with', async (t) => {
    const trace = record(t);
    const ns = uniqueNamespace('trace-release');
    const d = driverFor(t, ns);
    const lease = await d.acquire('k');
    assert.equal(await lease.release(), true);
    assert.equal(await lease.release(), false);
    const records = trace.of('release', ns);
    const first = oneCall(records.slice(0, 4), SUCCESS);
    const second = oneCall(records.slice(4), SUCCESS);
    assert.notEqual(first, second);
    assert.deepEqual(records[0].fields, ['key', 'lease', 'namespace']);
    assert.equal(first.lease, lease);
    assert.equal(first.key, 'k');
    assert.deepEqual([first.result, second.result], [true, false]);
  });

  test('renew publishes success, and LEASE_EXPIRED as an error event', async (t) => {
    const trace = record(t);
    const ns = uniqueNamespace('trace-renew');
    const d = driverFor(t, ns);
    const lease = await d.acquire('k');
    await lease.renew();
    await lease.release();
    const err = await failure(lease.renew());
    assert.equal(err.code, 'LEASE_EXPIRED');
    const records = trace.of('renew', ns);
    const ok = oneCall(records.slice(0, 4), SUCCESS);
    assert.equal(ok.lease, lease);
    assert.equal(ok.error, undefined);
    assert.equal(oneCall(records.slice(4), FAILURE).error, err);
  });

  test('`await using` disposal is traced as a release', async (t) => {
    const trace = record(t);
    const ns = uniqueNamespace('trace-dispose');
    const d = driverFor(t, ns);
    {
      await using lease = await d.acquire('k');
      void lease;
    }
    assert.equal(oneCall(trace.of('release', ns), SUCCESS).result, true);
  });
});

describe('secrets', () => {
  const USER = 'tracer-Hn3d';
  const PASSWORD = 'Trace-Pw-4kq9-secret';
  const skip = external && 'needs a throwaway redis-server with a password (REDIS_URL is set)';

  /** Every string reachable from `value`: inspect (hidden and symbol keys, causes) and JSON. */
  function everything(value) {
    const texts = [inspect(value, { depth: Infinity, showHidden: true, getters: true, customInspect: false, maxArrayLength: Infinity, maxStringLength: Infinity })];
    const seen = new WeakSet();
    const walk = (v) => {
      if (v === null || (typeof v !== 'object' && typeof v !== 'function')) {
        texts.push(String(v));
        return;
      }
      if (seen.has(v)) return;
      seen.add(v);
      if (v instanceof Error) texts.push(String(v.message), String(v.stack));
      // The lease's getters live on its prototype: read them too.
      for (const name of ['key', 'fence', 'valid', 'remainingMs']) if (name in v && typeof v !== 'function') texts.push(String(v[name]));
      for (const k of Reflect.ownKeys(v)) {
        const d = Object.getOwnPropertyDescriptor(v, k);
        walk('value' in d ? d.value : d.get?.call(v));
      }
    };
    walk(value);
    return texts.join('\n');
  }

  test('no context of any event holds an owner token, the password or the address', { skip }, async (t) => {
    // The driver logs in as an ACL user with a password; the harness stays the default user.
    const server = await startRedis();
    t.after(() => server.stop());
    await server.command('ACL', 'SETUSER', USER, 'on', `>${PASSWORD}`, '~*', '&*', '+@all');
    const trace = record(t);
    const ns = uniqueNamespace('trace-secrets');
    const url = `redis://${USER}:${PASSWORD}@127.0.0.1:${server.port}`;
    const d = driverFor(t, ns, { leaseMs: 5000 }, { url, connectTimeoutMs: 500, commandTimeoutMs: 500 });
    const tokens = [];
    const tokenOf = async (key) => {
      const token = await server.command('GET', lockKeyOf(ns, key));
      assert.match(token, /^[0-9a-f]{16,}$/, 'the token Redis holds');
      tokens.push(token);
    };

    // Success paths of all three channels, and their failures.
    const a = await d.acquire('a');
    await tokenOf('a');
    await a.renew();
    await failure(d.acquire('a', { waitTimeoutMs: 0 })); // LOCK_BUSY while held
    assert.equal(await a.release(), true);
    const b = await d.acquire('b');
    await tokenOf('b');
    await server.command('DEL', lockKeyOf(ns, 'b'));
    assert.equal((await failure(b.renew())).code, 'LEASE_LOST');
    assert.equal(await b.release(), false);
    // Connection failures carry a RedisError cause: a wrong password, and nothing listening.
    const wrong = driverFor(t, ns, { waitTimeoutMs: 0 }, { url: `redis://${USER}:wrong-${PASSWORD}@127.0.0.1:${server.port}`, connectTimeoutMs: 500 });
    const refused = await failure(wrong.acquire('c'));
    const closedPort = await freePort();
    const nobody = driverFor(t, ns, { waitTimeoutMs: 0 }, { url: `redis://${USER}:${PASSWORD}@127.0.0.1:${closedPort}`, connectTimeoutMs: 500 });
    const unreachable = await failure(nobody.acquire('d'));
    assert.equal(refused.code, 'PROVIDER_FAILED');
    assert.equal(unreachable.code, 'PROVIDER_FAILED');

    const records = trace.all().filter((r) => r.ctx.namespace === ns);
    assert.deepEqual([...new Set(records.map((r) => r.name))].sort(), NAMES);
    assert.ok(records.some((r) => r.event === 'error' && r.ctx.error?.cause), 'some contexts carry a Redis failure as the cause');
    const text = everything(records.map((r) => r.ctx));
    assert.equal(tokens.length, 2);
    for (const token of tokens) assert.ok(!text.includes(token), 'an owner token is in a context');
    for (const [what, secret] of [['the password', PASSWORD], ['the user', USER], ['the host', '127.0.0.1'], ['the port', `:${server.port}`], ['the port', `:${closedPort}`], ['the URL', 'redis://']]) {
      assert.ok(!text.includes(secret), `a context holds ${what}`);
    }
    // The walk did reach what a context legitimately holds.
    assert.ok(text.includes(ns) && text.includes(a.fence) && text.includes('LOCK_BUSY'));
  });
});


describe('examples/16-tracing-channels', () => {
  test('runs against a throwaway Redis and turns the channels into nested spans and histograms', async () => {
    const example = fileURLToPath(new URL('../examples/16-tracing-channels/index.mjs', import.meta.url));
    const { stdout } = await promisify(execFile)(process.execPath, [example], { env: { ...process.env, REDIS_URL: redis.url }, timeout: 30_000 });
    assert.match(stdout, /^ {2}span #\d+ lock\.acquire .* ok .*"lock\.fence":"[1-9][0-9]*".*\(child of #\d+\)$/m);
    assert.match(stdout, /lock\.release .*"lock\.deleted":true/);
    assert.match(stdout, /lock\.renew .* ok/);
    assert.match(stdout, /"lock\.error":"LOCK_BUSY"/);
    assert.match(stdout, /^lock wait \(acquire\) ms: n=4 /m);
    assert.match(stdout, /^lock hold ms: n=4 /m);
    assert.match(stdout, /^spans: 16$/m);
  });
});
