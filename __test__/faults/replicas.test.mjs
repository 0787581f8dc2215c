// Redis HA, replica acknowledgements (issue 11): minReplicas through the public JS API, with
// a real primary and replica on free ports; SIGSTOP on the replica stands for a lost one.
// The Rust suite (tests/replicas.rs) covers riding it out, renews and the WAIT stall bound.

import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { describe, test } from 'node:test';
import { backend, commandCalls, eventually, failure, fenceKeyOf, lockKeyOf, uniqueNamespace } from '../helpers/lock.mjs';
import { external, startRedis } from '../helpers/redis.mjs';
import { assertRedisFailure, replicaLinked } from './support.mjs';

const { createRedisLockDriver } = createRequire(import.meta.url)('../../index.js');

const skip = external && 'needs throwaway redis-servers (REDIS_URL is set)';

/** A primary and a replica it counts for WAIT (Redis 7.0 does from the replica's first ACK). */
async function primaryAndReplica(t) {
  const primary = await startRedis({ args: ['--repl-diskless-sync-delay', '0'] });
  t.after(() => primary.stop());
  const replica = await startRedis({ args: ['--replicaof', '127.0.0.1', String(primary.port)] });
  t.after(() => replica.stop());
  await replicaLinked(replica);
  await primary.command('SET', 'replica-ready', '1');
  await eventually('the replica acknowledges a write', async () => {
    const info = await primary.command('INFO', 'replication');
    return Number(/^slave0:.*offset=(\d+)/m.exec(info)?.[1] ?? 0) > 0;
  }, { timeoutMs: 10_000 });
  return { primary, replica };
}

describe('minReplicas', { skip }, () => {
  test('with a linked replica the fence is on the replica when the lease resolves', async (t) => {
    const { primary, replica } = await primaryAndReplica(t);
    const ns = uniqueNamespace('rep');
    const d = createRedisLockDriver(primary.url, backend(ns, { minReplicas: 1 }));
    t.after(() => d.shutdown().catch(() => {}));
    const lease = await d.acquire('job', { waitTimeoutMs: 0 });
    assert.equal(await replica.command('GET', fenceKeyOf(ns, 'job')), lease.fence);
    assert.equal(await replica.command('EXISTS', lockKeyOf(ns, 'job')), 1);
    await lease.renew();
    assert.equal(await commandCalls(primary, 'wait'), 2);
    assert.equal(await lease.release(), true);
  });

  test('a stopped replica: PROVIDER_FAILED with a retryable NOREPLICAS cause, and no lock left on the primary', async (t) => {
    const { primary, replica } = await primaryAndReplica(t);
    const ns = uniqueNamespace('rep-stop');
    const d = createRedisLockDriver(primary.url, backend(ns, { minReplicas: 1, replicaTimeoutMs: 200 }));
    t.after(() => d.shutdown().catch(() => {}));
    await replica.pause();
    t.after(() => replica.resume().catch(() => {}));
    const err = await failure(d.acquire('job', { waitTimeoutMs: 0 }));
    assertRedisFailure(assert, err, {
      lockCode: 'PROVIDER_FAILED', code: 'COMMAND_REJECTED', outcome: 'rejected', retryable: true, serverCode: 'NOREPLICAS',
    });
    // The script won on the primary; the driver releases it by token in the background.
    await eventually('the lock key is gone from the primary', async () => (await primary.command('EXISTS', lockKeyOf(ns, 'job'))) === 0);
    await d.shutdown();
    await replica.resume();
  });

  test('minReplicas with a cluster connection is accepted (decision 0142)', () => {
    const d = createRedisLockDriver({ url: 'redis://127.0.0.1:1', cluster: true }, backend('c', { minReplicas: 1 }));
    return d.shutdown();
  });

  test('with minReplicas, a replicaTimeoutMs not below commandTimeoutMs is INVALID_OPTIONS naming both, never a value (decision 0130)', () => {
    for (const replicaTimeoutMs of [1234, 4321]) {
      assert.throws(
        () => createRedisLockDriver({ url: 'redis://127.0.0.1:1', commandTimeoutMs: 1234 }, backend('w', { minReplicas: 1, replicaTimeoutMs })),
        (err) => err.code === 'INVALID_OPTIONS' && err.message.includes('options.replicaTimeoutMs')
          && err.message.includes('connection.commandTimeoutMs') && !/1234|4321/.test(err.message),
      );
    }
    // Without minReplicas no WAIT is sent: any replicaTimeoutMs is accepted.
    const d = createRedisLockDriver({ url: 'redis://127.0.0.1:1', commandTimeoutMs: 100 }, backend('w', { replicaTimeoutMs: 500 }));
    return d.shutdown();
  });
});
