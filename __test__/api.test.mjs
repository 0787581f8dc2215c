// The public surface: exports, error codes, option and connection validation.

import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { after, before, describe, test } from 'node:test';
import { inspect } from 'node:util';
import { backend, failure, freePort, lockKeyOf, thrown, uniqueNamespace } from './helpers/lock.mjs';
import { startRedis } from './helpers/redis.mjs';

const lock = createRequire(import.meta.url)('../index.js');
const { createRedisLockDriver, parseRedisLockBackend, LockError, LockErrorCode } = lock;

const CODES = [
  'INVALID_OPTIONS', 'INVALID_KEY', 'LOCK_BUSY', 'WAIT_TIMEOUT', 'QUEUE_FULL', 'TOO_MANY_LEASES',
  'ABORTED', 'SHUT_DOWN', 'LEASE_EXPIRED', 'LEASE_LOST', 'PROVIDER_FAILED', 'OUTCOME_UNKNOWN',
  'CLEANUP_TIMEOUT', 'CLEANUP_FAILED',
];

const INT_FIELDS = [
  'leaseMs', 'waitTimeoutMs', 'pollIntervalMs', 'notifyPollIntervalMs', 'maxWaiters',
  'maxTrackedLeases', 'shutdownTimeoutMs', 'maxKeyBytes', 'minReplicas', 'replicaTimeoutMs',
];

// Everything an error exposes: own fields, message, stack and cause chain.
const everything = (err) => inspect(err, { depth: 10, showHidden: true });

/** Asserts an INVALID_OPTIONS LockError that names `field` and never shows `secret`. */
function assertInvalidOptions(err, { field, secret }, label) {
  assert.ok(err instanceof LockError, `${label}: not a LockError: ${inspect(err)}`);
  assert.ok(err instanceof Error, `${label}: not an Error`);
  assert.equal(err.name, 'LockError', label);
  assert.equal(err.code, 'INVALID_OPTIONS', `${label}: ${err.message}`);
  if (field) assert.ok(err.message.includes(field), `${label}: message does not name ${field}: ${err.message}`);
  if (secret) assert.ok(!everything(err).includes(secret), `${label}: the value leaked: ${err.message}`);
}

let redis;
before(async () => { redis = await startRedis(); });
after(() => redis?.stop());

describe('exports', () => {
  test('exports exactly createRedisLockDriver, parseRedisLockBackend, LockError and LockErrorCode', () => {
    assert.deepEqual(Object.keys(lock).sort(),
      ['LockError', 'LockErrorCode', 'createRedisLockDriver', 'parseRedisLockBackend']);
    assert.equal(typeof createRedisLockDriver, 'function');
    assert.equal(typeof parseRedisLockBackend, 'function');
    assert.equal(typeof LockError, 'function');
  });

  test('LockErrorCode holds the 14 contract codes, each mapped to itself, and cannot be changed', () => {
    assert.deepEqual({ ...LockErrorCode }, Object.fromEntries(CODES.map((c) => [c, c])));
    assert.ok(Object.isFrozen(LockErrorCode));
    assert.throws(() => { LockErrorCode.LOCK_BUSY = 'x'; }, TypeError);
    assert.throws(() => { LockErrorCode.NEW_CODE = 'NEW_CODE'; }, TypeError);
    assert.equal(LockErrorCode.LOCK_BUSY, 'LOCK_BUSY');
  });

  test('LockError is an Error carrying a code and an optional cause', () => {
    const cause = new Error('inner');
    const err = new LockError('LOCK_BUSY', 'busy', { cause });
    assert.ok(err instanceof Error);
    assert.equal(err.code, 'LOCK_BUSY');
    assert.equal(err.message, 'busy');
    assert.equal(err.cause, cause);
  });

  test("a driver reports driver === 'redis' and exposes acquire and shutdown", async () => {
    const d = createRedisLockDriver(redis.url, backend(uniqueNamespace('api')));
    try {
      assert.equal(d.driver, 'redis');
      assert.equal(typeof d.acquire, 'function');
      assert.equal(typeof d.shutdown, 'function');
    } finally {
      await d.shutdown();
    }
  });
});

describe('parseRedisLockBackend', () => {
  test('fills in the contract defaults for every omitted field', () => {
    assert.deepEqual({ ...parseRedisLockBackend({ driver: 'redis', connection: 'main', namespace: 'svc' }) }, {
      driver: 'redis',
      connection: 'main',
      namespace: 'svc',
      leaseMs: 10000,
      waitTimeoutMs: 5000,
      pollIntervalMs: 25,
      notifyPollIntervalMs: 250,
      maxWaiters: 128,
      maxTrackedLeases: 10000,
      shutdownTimeoutMs: 5000,
      maxKeyBytes: 1024,
      minReplicas: 0,
      replicaTimeoutMs: 500,
      notifications: 'namespace',
    });
  });

  test('keeps given values at the edges of their ranges, and undefined counts as omitted', () => {
    const parsed = parseRedisLockBackend({
      driver: 'redis', connection: 'main', namespace: 'svc',
      leaseMs: 1, waitTimeoutMs: 0, pollIntervalMs: 1, notifyPollIntervalMs: 2 ** 31 - 1,
      maxWaiters: 1, maxTrackedLeases: 1, shutdownTimeoutMs: 0, maxKeyBytes: undefined,
    });
    assert.equal(parsed.leaseMs, 1);
    assert.equal(parsed.waitTimeoutMs, 0);
    assert.equal(parsed.pollIntervalMs, 1);
    assert.equal(parsed.notifyPollIntervalMs, 2 ** 31 - 1);
    assert.equal(parsed.maxWaiters, 1);
    assert.equal(parsed.maxTrackedLeases, 1);
    assert.equal(parsed.shutdownTimeoutMs, 0);
    assert.equal(parsed.maxKeyBytes, 1024);
  });

  test('rejects an unknown field, naming the field but not its value', () => {
    const err = thrown(() => parseRedisLockBackend(backend('svc', { leaseMS: 987654 })));
    assertInvalidOptions(err, { field: 'leaseMS', secret: '987654' }, 'leaseMS');
  });

  test('rejects missing driver, connection or namespace: none gets a default', () => {
    for (const missing of ['driver', 'connection', 'namespace']) {
      const input = backend('svc');
      delete input[missing];
      assertInvalidOptions(thrown(() => parseRedisLockBackend(input)), { field: missing }, `without ${missing}`);
    }
  });

  test("rejects a driver other than 'redis' without echoing it", () => {
    for (const driver of ['sekrit', 'REDIS', 987654, null, undefined]) {
      const err = thrown(() => parseRedisLockBackend(backend('svc', { driver })));
      const secret = typeof driver === 'string' || typeof driver === 'number' ? String(driver) : undefined;
      assertInvalidOptions(err, { field: 'driver', secret }, `driver ${driver}`);
    }
  });

  test('rejects an empty or non-string connection name', () => {
    for (const connection of ['', 987654, null, {}]) {
      const err = thrown(() => parseRedisLockBackend(backend('svc', { connection })));
      assertInvalidOptions(err, { field: 'connection', secret: connection === 987654 ? '987654' : undefined }, `connection ${inspect(connection)}`);
    }
  });

  test('rejects a namespace with whitespace, braces or control characters, without echoing it', () => {
    const bad = ['sekrit ns', 'sekrit\tns', 'sekrit\nns', 'sekrit\u00a0ns', 'sekrit{ns', 'sekrit}ns',
      '{sekrit}', 'sekrit\u0000ns', 'sekrit\u0007ns', 'sekrit\u007fns', 'sekrit\u0085ns'];
    for (const namespace of bad) {
      const err = thrown(() => parseRedisLockBackend(backend(namespace)));
      assertInvalidOptions(err, { field: 'namespace', secret: 'sekrit' }, `namespace ${JSON.stringify(namespace)}`);
    }
    for (const namespace of ['', 987654, null, ['svc']]) {
      const err = thrown(() => parseRedisLockBackend(backend(namespace)));
      assertInvalidOptions(err, { field: 'namespace' }, `namespace ${inspect(namespace)}`);
    }
  });

  test('accepts namespaces with colons, dots, dashes and non-ASCII letters', () => {
    for (const namespace of ['my-service', 'app:v2.locks', 'dienst-é', '서비스']) {
      assert.equal(parseRedisLockBackend(backend(namespace)).namespace, namespace);
    }
  });

  test('rejects non-integers, NaN, Infinity, negatives and out-of-range numbers in every integer field, naming the field and not the value', () => {
    const cases = [
      [987654.5, '987654'],
      [Number.NaN, 'NaN'],
      [Number.POSITIVE_INFINITY, 'Infinity'],
      [Number.NEGATIVE_INFINITY, 'Infinity'],
      [-987654, '987654'],
      [2 ** 31, String(2 ** 31)],
      [9876543210, '9876543210'],
      ['987654', '987654'],
      [true, 'true'],
      [null, undefined],
      [{ value: 987654 }, '987654'],
      [987654n, '987654'],
    ];
    for (const field of INT_FIELDS) {
      for (const [value, secret] of cases) {
        const err = thrown(() => parseRedisLockBackend(backend('svc', { [field]: value })));
        assertInvalidOptions(err, { field, secret }, `${field}: ${inspect(value)}`);
      }
    }
  });

  test('rejects zero where the minimum is 1, but accepts it for waitTimeoutMs, shutdownTimeoutMs and minReplicas', () => {
    for (const field of INT_FIELDS) {
      if (field === 'waitTimeoutMs' || field === 'shutdownTimeoutMs' || field === 'minReplicas') {
        assert.equal(parseRedisLockBackend(backend('svc', { [field]: 0 }))[field], 0);
      } else {
        assertInvalidOptions(thrown(() => parseRedisLockBackend(backend('svc', { [field]: 0 }))), { field }, `${field}: 0`);
      }
    }
  });

  test('rejects options that are not an object', () => {
    for (const input of [undefined, null, 'sekrit', 987654, ['redis'], () => {}]) {
      assertInvalidOptions(thrown(() => parseRedisLockBackend(input)), { secret: typeof input === 'string' ? 'sekrit' : undefined }, inspect(input));
    }
  });
});

describe('createRedisLockDriver', () => {
  test('validates the options again, with the same INVALID_OPTIONS errors', () => {
    const bad = [
      [{ leaseMs: 987654.5 }, 'leaseMs', '987654'],
      [{ maxWaiters: -987654 }, 'maxWaiters', '987654'],
      [{ namespace: 'sekrit space' }, 'namespace', 'sekrit'],
      [{ namespace: undefined }, 'namespace', undefined],
      [{ extra: 987654 }, 'extra', '987654'],
      [{ driver: 'memory' }, 'driver', 'memory'],
    ];
    for (const [extra, field, secret] of bad) {
      const err = thrown(() => createRedisLockDriver(redis.url, backend('svc', extra)));
      assertInvalidOptions(err, { field, secret }, inspect(extra));
    }
    assertInvalidOptions(thrown(() => createRedisLockDriver(redis.url, undefined)), {}, 'no options');
  });

  test('accepts a URL string and a connection object, and both reach Redis', async () => {
    const forms = [
      redis.url,
      // The same server with its database named in the path (REDIS_URL may already name one).
      new URL(redis.url).pathname.length > 1 ? redis.url : `${redis.url}/0`,
      { url: redis.url },
      { url: redis.url, name: 'main', connectTimeoutMs: 1000, commandTimeoutMs: 1000 },
      { url: redis.url, pingIntervalMs: 0 }, { url: redis.url, pingIntervalMs: 1000 },
    ];
    for (const connection of forms) {
      const ns = uniqueNamespace('api-conn');
      const d = createRedisLockDriver(connection, backend(ns));
      try {
        const lease = await d.acquire('k', { waitTimeoutMs: 0 });
        assert.equal(await redis.command('EXISTS', lockKeyOf(ns, 'k')), 1, inspect(connection));
        assert.equal(await lease.release(), true);
      } finally {
        await d.shutdown();
      }
    }
  });

  test('rejects a bad scheme, garbage, an empty or a non-string URL with INVALID_OPTIONS', () => {
    const bad = [
      'http://127.0.0.1:6379', 'https://127.0.0.1', 'garbage', '127.0.0.1:6379', '', ' ',
      42, null, undefined, true, ['redis://127.0.0.1'], {},
      { url: '' }, { url: 42 }, { url: 'ftp://x' }, { name: 'main' },
      { url: redis.url, connectTimeoutMs: -1 }, { url: redis.url, connectTimeoutMs: 0 },
      { url: redis.url, commandTimeoutMs: 1.5 }, { url: redis.url, commandTimeoutMs: Number.NaN },
      { url: redis.url, commandTimeoutMs: '100' }, { url: redis.url, name: '' },
      { url: redis.url, pingIntervalMs: -1 }, { url: redis.url, pingIntervalMs: 2.5 },
      { url: redis.url, pingIntervalMs: '30000' },
      { url: redis.url, bogus: true },
    ];
    for (const connection of bad) {
      const err = thrown(() => createRedisLockDriver(connection, backend('svc')));
      assertInvalidOptions(err, {}, inspect(connection));
    }
  });

  test('never shows the password of a URL in a validation error', () => {
    const urls = [
      'http://:hunter2@127.0.0.1:1',
      'redis://:hunter2@127.0.0.1:notaport',
      'redis://user:hunter2@[::1:1',
      'hunter2',
      'redis:/:hunter2@127.0.0.1',
    ];
    for (const url of urls) {
      for (const connection of [url, { url }, { url, commandTimeoutMs: -5 }]) {
        const err = thrown(() => createRedisLockDriver(connection, backend('svc')));
        assertInvalidOptions(err, { secret: 'hunter2' }, inspect(connection));
      }
    }
    const err = thrown(() => createRedisLockDriver({ url: 'redis://:hunter2@127.0.0.1:1', connectTimeoutMs: 'x' }, backend('svc')));
    assertInvalidOptions(err, { field: 'connectTimeoutMs', secret: 'hunter2' }, 'bad connectTimeoutMs');
  });

  test('never shows the password or the address when Redis cannot be reached', async () => {
    const port = await freePort();
    const d = createRedisLockDriver(`redis://:hunter2@127.0.0.1:${port}`, backend(uniqueNamespace('api-pw')));
    try {
      const err = await failure(d.acquire('k', { waitTimeoutMs: 0 }));
      assert.equal(err.code, 'PROVIDER_FAILED');
      const shown = everything(err);
      for (const secret of ['hunter2', '127.0.0.1', `:${port}`]) {
        assert.ok(!shown.includes(secret), `${secret} leaked: ${shown}`);
      }
    } finally {
      await d.shutdown();
    }
  });
});
