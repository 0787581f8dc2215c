// `notifications: 'per-key'` through the public JS API (issue 17): the option's validation,
// a release waking a waiter of its key only, on the key's own channel, and the namespace
// default left exactly as it was. (tests/per_key.rs proves batching, the grace period, the
// migration mode and a mixed fleet from Rust.)

import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { after, before, test } from 'node:test';
import {
  backend, driverFor, eventually, sha256hex, subscribe, thrown, uniqueNamespace,
} from './helpers/lock.mjs';
import { startRedis } from './helpers/redis.mjs';

const { createRedisLockDriver, parseRedisLockBackend, LockError } =
  createRequire(import.meta.url)('../index.js');

/** Both safety intervals so slow that only a notification explains a quick wake-up. */
const SLOW_POLLS = { pollIntervalMs: 5000, notifyPollIntervalMs: 5000 };

let redis;
before(async () => { redis = await startRedis(); });
after(() => redis?.stop());

const keyChannel = (namespace, key) => `${namespace}:lock-released:{${sha256hex(key)}}`;

/** PUBSUB CHANNELS matching the namespace, sorted. */
async function channels(namespace) {
  const list = await redis.command('PUBSUB', 'CHANNELS', `${namespace}:*`);
  return [...list].sort();
}

test('notifications defaults to namespace and accepts per-key and both', () => {
  assert.equal(parseRedisLockBackend(backend('svc')).notifications, 'namespace');
  for (const mode of ['namespace', 'per-key', 'both']) {
    assert.equal(parseRedisLockBackend(backend('svc', { notifications: mode })).notifications, mode);
  }
});

test('a bad notifications value is INVALID_OPTIONS naming the field and the rule, not the value', () => {
  for (const bad of ['perkey-secret', 'PER-KEY', '', null, 1, true, ['per-key']]) {
    const err = thrown(() => parseRedisLockBackend(backend('svc', { notifications: bad })));
    assert.ok(err instanceof LockError);
    assert.equal(err.code, 'INVALID_OPTIONS');
    assert.match(err.message, /options\.notifications must be 'namespace', 'per-key' or 'both'/);
    assert.doesNotMatch(err.message, /secret/);
    const created = thrown(() => createRedisLockDriver(redis.url, backend('svc', { notifications: bad })));
    assert.equal(created.code, 'INVALID_OPTIONS');
  }
});

test('per-key: a release wakes the waiter of its key from the key channel, well before the safety poll', async (t) => {
  const namespace = uniqueNamespace('pk');
  const holder = driverFor(t, createRedisLockDriver, redis.url, namespace, { notifications: 'per-key' });
  const waiting = driverFor(t, createRedisLockDriver, redis.url, namespace, { notifications: 'per-key', ...SLOW_POLLS });
  const held = await holder.acquire('job');
  const acquiring = waiting.acquire('job', { waitTimeoutMs: 8000 });
  await eventually('the key subscription', async () => (await channels(namespace)).length === 1);
  assert.deepEqual(await channels(namespace), [keyChannel(namespace, 'job')]);
  // An outside subscriber of the key's channel hears the key's hash, as on the namespace channel.
  const outside = await subscribe(redis.port, keyChannel(namespace, 'job'));
  t.after(() => outside.close());
  await eventually('the live subscription', () => waiting.stats().subscription === 'live');
  const releasedAt = performance.now();
  assert.equal(await held.release(), true);
  const lease = await acquiring;
  assert.ok(performance.now() - releasedAt < 1500, `woke after ${performance.now() - releasedAt} ms`);
  await eventually('the outside subscriber hearing it', () => outside.messages.length === 1);
  assert.deepEqual(outside.messages, [sha256hex('job')]);
  assert.ok(waiting.stats().notificationsReceived >= 1);
  await lease.release();
});

test('per-key: releases of other keys reach no one', async (t) => {
  const namespace = uniqueNamespace('pkq');
  const busy = driverFor(t, createRedisLockDriver, redis.url, namespace, { notifications: 'per-key' });
  const waiting = driverFor(t, createRedisLockDriver, redis.url, namespace, { notifications: 'per-key', ...SLOW_POLLS });
  const held = await busy.acquire('a');
  const acquiring = waiting.acquire('a', { waitTimeoutMs: 8000 });
  await eventually('the subscription to a', async () => (await channels(namespace)).length === 1);
  await eventually('the live subscription', () => waiting.stats().subscription === 'live');
  for (let i = 0; i < 20; i++) await (await busy.acquire(`b-${i}`)).release();
  assert.equal(waiting.stats().notificationsReceived, 0);
  await held.release();
  const lease = await acquiring;
  // Counted before the waiter's own release, which it hears too while still subscribed.
  assert.equal(waiting.stats().notificationsReceived, 1);
  await lease.release();
});

test('the namespace default still publishes on <namespace>:lock-released only', async (t) => {
  const namespace = uniqueNamespace('ns');
  const d = driverFor(t, createRedisLockDriver, redis.url, namespace);
  const onNamespace = await subscribe(redis.port, `${namespace}:lock-released`);
  const onKey = await subscribe(redis.port, keyChannel(namespace, 'k'));
  t.after(() => { onNamespace.close(); onKey.close(); });
  await (await d.acquire('k')).release();
  await eventually('the namespace channel hearing it', () => onNamespace.messages.length === 1);
  assert.deepEqual(onNamespace.messages, [sha256hex('k')]);
  await new Promise((r) => setTimeout(r, 100));
  assert.deepEqual(onKey.messages, []);
});
