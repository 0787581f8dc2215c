// What a caller gets from a bug in the driver (issue 10 point 7): a panicking task settles
// its promise with a LockError that has a code and says an internal error happened, never a
// bare Error and never a pending promise that keeps Node alive.
//
// DOKEBI_LOCK_REDIS_TEST_PANIC is read once by the addon, so it is set before the package
// is loaded; node --test runs this file in its own process.

import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { test } from 'node:test';
import { backend, failure, freePort, uniqueNamespace, within } from './helpers/lock.mjs';

process.env.DOKEBI_LOCK_REDIS_TEST_PANIC = 'acquire';
const { createRedisLockDriver, LockError } = createRequire(import.meta.url)('../index.js');

test('an acquire whose task panics rejects with a LockError OUTCOME_UNKNOWN that says an internal error happened', async () => {
  // Nothing listens there: the panic comes before any Redis work.
  const d = createRedisLockDriver(`redis://127.0.0.1:${await freePort()}`, backend(uniqueNamespace('panic')));
  const err = await within(3000, failure(d.acquire('k')), 'the panicking acquire');
  assert.ok(err instanceof LockError, `a LockError, not ${err?.name}: ${err?.message}`);
  assert.equal(err.code, 'OUTCOME_UNKNOWN');
  assert.match(err.message, /internal error/);
  assert.doesNotMatch(err.message, /Redis sent|never produce/);
  // The calls after it still run, also several handed over at once.
  const later = await within(3000, Promise.all(['a', 'b', 'c'].map((k) => failure(d.acquire(k)))), 'the acquires after a panic');
  for (const e of later) assert.equal(e.code, 'OUTCOME_UNKNOWN');
  await d.shutdown();
});
