// The "Least privilege" rule of docs/operations.md, read from the page itself, as the driver's only user:
// a whole acquire / wait / renew / release / shutdown cycle through the package leaves
// `ACL LOG` empty (decision 0075). Run on every server of the matrix (npm run
// test:servers): Redis 7.2+ and Valkey know CLIENT SETINFO, which redis-rs would send on
// each connection and this rule does not grant.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { test } from 'node:test';
import { backend, eventually, within } from './helpers/lock.mjs';
import { external, startRedis } from './helpers/redis.mjs';

const require = createRequire(import.meta.url);
const { createRedisLockDriver } = require('../index.js');

const guide = readFileSync(new URL('../docs/operations.md', import.meta.url), 'utf8');
// `ACL SETUSER locker on >password … +ping`, with the guide's namespace `my-service`.
const rule = /^ACL SETUSER locker .*$/m.exec(guide)?.[0];

test("the operations guide's least-privilege user runs the whole cycle without one ACL denial", {
  skip: external && 'needs a throwaway server to add an ACL user to',
}, async (t) => {
  assert.ok(rule, 'docs/operations.md has the ACL SETUSER line');
  const redis = await startRedis();
  t.after(() => redis.stop());
  assert.equal(await redis.command(...rule.split(' ')), 'OK');
  assert.equal(await redis.command('ACL', 'LOG', 'RESET'), 'OK');

  const complaints = [];
  const record = (level) => (fields, msg) => complaints.push({ level, ...fields, msg });
  const logger = { warn: record('warn'), error: record('error') };
  const d = createRedisLockDriver(
    redis.url.replace('redis://', 'redis://locker:password@'),
    // Polls far apart: the waiter must be woken by the release notification.
    backend('my-service', { pollIntervalMs: 20_000, notifyPollIntervalMs: 20_000 }),
    logger,
  );
  try {
    const held = await d.acquire('report', { waitTimeoutMs: 0 });
    await held.renew();
    const waiting = d.acquire('report', { waitTimeoutMs: 10_000 });
    await eventually('the subscription is live', () => d.stats().subscription === 'live');
    assert.equal(await held.release(), true);
    const next = await within(5_000, waiting, 'the waiter, woken by the notification');
    assert.ok(BigInt(next.fence) > BigInt(held.fence));
    assert.equal(await next.release(), true);
  } finally {
    await d.shutdown();
  }

  assert.deepEqual(await redis.command('ACL', 'LOG'), [], 'ACL LOG has denials');
  assert.deepEqual(complaints, [], 'the driver warned');
});
