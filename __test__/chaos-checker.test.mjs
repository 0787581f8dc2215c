// The chaos checker (benchmarks/chaos/checker.mjs) on hand-written histories: each
// invariant must fail on the history that breaks it, and what README documents as lost
// with a failover or a restart must be counted apart, not failed.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { check } from '../benchmarks/chaos/checker.mjs';

const run = (over = {}) => ({
  mode: 'standalone', minReplicas: 0, replicas: 0, leaseMs: 800, waitTimeoutMs: 2000, commandTimeoutMs: 1000,
  replicaTimeoutMs: 500, switchToleranceMs: 250, recoveryBoundMs: 10_000, settleSlackMs: 1500, ...over,
});

// A lease: acquire from `start`, granted at `grant`, released at `release`, valid until
// grant + 800 at most.
function lease(op, key, fence, start, grant, release, { released = true, p = 0, inc = 1 } = {}) {
  const out = [
    { k: 'acq-start', op, key, p, inc, at: start },
    { k: 'grant', op, key, p, inc, at: grant, startAt: start, fence: String(fence), expiresAt: grant + 800 },
  ];
  if (release !== undefined) out.push({ k: 'release', op, key, p, inc, at: release, endAt: release + 1, ok: true, released, validBefore: release < grant + 800 });
  return out;
}
const ending = (at) => [
  { k: 'healed-all', at },
  ...lease('z', 'k', 999, at + 1, at + 5, at + 10),
  { k: 'shutdown', p: 0, inc: 1, at: at + 20, endAt: at + 21, ok: true },
  { k: 'exit', p: 0, inc: 1, at: at + 30, code: 0, killedByNemesis: false },
  { k: 'lock-keys-left', at: at + 40, count: 0 },
];
const violated = (v) => Object.fromEntries(Object.entries(v.counts).filter(([, c]) => c.violations > 0).map(([n, c]) => [n, c.violations]));

test('a clean history passes every invariant', () => {
  const v = check([...lease('a', 'k', 10, 0, 5, 100), ...lease('b', 'k', 11, 50, 101, 200), ...ending(1000)], run());
  assert.deepEqual(violated(v), {});
  assert.equal(v.ok, true);
});

test('a lease granted while another was valid is a violation, unless the server was killed in between (README: lost with a restart)', () => {
  const overlap = [...lease('a', 'k', 10, 0, 5, 500), ...lease('b', 'k', 11, 50, 200, 300, { p: 1 })];
  assert.deepEqual(violated(check([...overlap, ...ending(1000)], run())), { 'no-overlapping-valid-leases': 1 });
  const withKill = check([...overlap, { k: 'fault', kind: 'server-kill', id: 1, at: 100 }, ...ending(1000)], run());
  assert.deepEqual(violated(withKill), {});
  assert.equal(withKill.counts['no-overlapping-valid-leases'].documented, 1);
});

test('a smaller fence after a completed grant is a violation in standalone even across a restart, and under Sentinel when minReplicas counts every replica', () => {
  const back = [...lease('a', 'k', 10, 0, 5, 100), { k: 'fault', kind: 'server-kill', id: 1, at: 150 }, ...lease('b', 'k', 3, 200, 210, 300)];
  assert.deepEqual(violated(check([...back, ...ending(1000)], run())), { 'fences-never-go-backwards': 1 });
  const sentinelBack = [...lease('a', 'k', 10, 0, 5, 100), { k: 'fault', kind: 'failover', id: 1, at: 150 }, ...lease('b', 'k', 3, 200, 210, 300)];
  assert.deepEqual(violated(check([...sentinelBack, ...ending(1000)], run({ mode: 'sentinel', minReplicas: 2, replicas: 2 }))), { 'fences-never-go-backwards': 1 });
  // Below that a failover may promote a replica that did not acknowledge (README "Replica
  // acknowledgements"): counted apart, and only across a failover.
  for (const minReplicas of [0, 1]) {
    const documented = check([...sentinelBack, ...ending(1000)], run({ mode: 'sentinel', minReplicas, replicas: 2 }));
    assert.deepEqual(violated(documented), {});
    assert.equal(documented.counts['fences-never-go-backwards'].documented, 1);
  }
  const noFailover = sentinelBack.filter((e) => e.k !== 'fault');
  assert.deepEqual(violated(check([...noFailover, ...ending(1000)], run({ mode: 'sentinel', minReplicas: 1, replicas: 2 }))), { 'fences-never-go-backwards': 1 });
});

test('concurrent acquires are not ordered: a smaller fence granted to an acquire that started before the other was granted is fine', () => {
  const v = check([...lease('a', 'k', 11, 0, 100, 150), ...lease('b', 'k', 10, 50, 60, 90, { p: 1 }), ...ending(1000)], run());
  assert.equal(v.counts['fences-never-go-backwards'].violations, 0);
});

test('a write the store accepted below a fence it had already accepted is a violation', () => {
  const writes = [
    { k: 'store', at: 10, key: 'k', fence: '11', lease: 'b', ok: true },
    { k: 'store', at: 20, key: 'k', fence: '10', lease: 'a', ok: true },
  ];
  assert.deepEqual(violated(check([...writes, ...ending(1000)], run())), { 'no-stale-write-accepted': 1 });
});

test('an acquire that never settles, or settles past its bound, is a violation unless its process was killed or stopped', () => {
  const never = [{ k: 'acq-start', op: 'x', key: 'k', p: 0, inc: 1, at: 0 }];
  assert.deepEqual(violated(check([...never, ...ending(10_000)], run())), { 'every-acquire-settles-in-bound': 1 });
  const killed = [...never, { k: 'fault', kind: 'proc-kill', id: 1, target: 0, inc: 1, at: 100 }];
  assert.deepEqual(violated(check([...killed, ...ending(10_000)], run())), {});
  const late = [...never, { k: 'acq-fail', op: 'x', key: 'k', p: 0, inc: 1, at: 6000, startAt: 0, err: { code: 'WAIT_TIMEOUT', lockError: true } }];
  assert.deepEqual(violated(check([...late, ...ending(10_000)], run())), { 'every-acquire-settles-in-bound': 1 });
  const stopped = [...late, { k: 'fault', kind: 'proc-stop', id: 2, target: 0, at: 100 }, { k: 'heal', kind: 'proc-stop', id: 2, target: 0, at: 5000 }];
  assert.deepEqual(violated(check([...stopped, ...ending(10_000)], run())), {});
});

test('codes outside the contract, a Redis failure without its dokebi-redis cause, a rejected shutdown and keys left behind are violations', () => {
  const bad = [
    { k: 'acq-start', op: 'x', key: 'k', p: 0, inc: 1, at: 0 },
    { k: 'acq-fail', op: 'x', key: 'k', p: 0, inc: 1, at: 10, startAt: 0, err: { code: 'QUEUE_FULL', lockError: true } },
    { k: 'acq-start', op: 'y', key: 'k', p: 0, inc: 1, at: 20 },
    { k: 'acq-fail', op: 'y', key: 'k', p: 0, inc: 1, at: 30, startAt: 20, err: { code: 'PROVIDER_FAILED', lockError: true, cause: {} } },
  ];
  assert.deepEqual(violated(check([...bad, ...ending(1000)], run())), { 'only-contract-error-codes': 2 });
  const end = ending(1000).map((e) => (e.k === 'shutdown' ? { ...e, ok: false, err: { code: 'CLEANUP_TIMEOUT', lockError: true } } : e.k === 'lock-keys-left' ? { ...e, count: 2 } : e));
  assert.deepEqual(violated(check(end, run())), { 'clean-exits-no-keys-left': 2, 'only-contract-error-codes': 1 });
});

test('no lease after the last heal within the bound fails recovery', () => {
  const history = ending(1000).filter((e) => e.op !== 'z' || e.k === 'x');
  assert.deepEqual(violated(check(history, run())), { 'recovery-after-last-fault': 1 });
});

test('under Sentinel, a lease that starts well after the first Sentinel announced a switch and is then lost is a violation; one that starts within the tolerance is not judged', () => {
  const announce = [
    { k: 'announce', at: 1000, sentinel: 1, from: 7001, to: 7002 },
    { k: 'announce', at: 2000, sentinel: 0, from: 7001, to: 7002 },
  ];
  // Granted on the deposed primary 400 ms after the first announcement; the new primary
  // hands the key out again while it is valid, and its release finds the key gone.
  const lost = [...lease('old', 'k', 20, 1400, 1410, 1700, { released: false }), ...lease('new', 'k', 15, 1500, 1510, 1600, { p: 1 })];
  const v = check([...announce, ...lost, ...ending(5000)], run({ mode: 'sentinel', minReplicas: 0 }));
  assert.equal(v.counts['no-lease-lost-after-announced-switch'].violations, 1);
  assert.match(v.violations.find((x) => x.invariant === 'no-lease-lost-after-announced-switch').detail, /started 400 ms after Sentinel 1 announced the switch 7001→7002/);
  const early = [...lease('old', 'k', 20, 1100, 1110, 1700, { released: false }), ...lease('new', 'k', 15, 1500, 1510, 1600, { p: 1 })];
  assert.equal(check([...announce, ...early, ...ending(5000)], run({ mode: 'sentinel', minReplicas: 0 })).counts['no-lease-lost-after-announced-switch'].violations, 0);
});

test('a fence handed out again counts once, not once per later grant below it', () => {
  const history = [...lease('a', 'k', 10, 0, 5, 100), ...lease('b', 'k', 3, 200, 210, 300), ...lease('c', 'k', 4, 400, 410, 500), ...lease('d', 'k', 5, 600, 610, 700)];
  assert.deepEqual(violated(check([...history, ...ending(1000)], run())), { 'fences-never-go-backwards': 1 });
});

test('a renew or a release answered after the lease deadline may find the key expired: that is not a lost lease', () => {
  const announce = [{ k: 'announce', at: 0, sentinel: 0, from: 7001, to: 7002 }];
  const late = [
    ...lease('a', 'k', 10, 1000, 1010, undefined),
    { k: 'renew', op: 'a', key: 'k', p: 0, inc: 1, at: 1200, endAt: 2500, ok: false, valid: false, err: { code: 'LEASE_LOST', lockError: true } },
    { k: 'release-call', op: 'a', key: 'k', p: 0, inc: 1, at: 2600 },
    { k: 'release', op: 'a', key: 'k', p: 0, inc: 1, at: 2600, endAt: 2601, ok: true, released: false, validBefore: false },
  ];
  const v = check([...announce, ...late, ...ending(5000)], run({ mode: 'sentinel', minReplicas: 1, replicas: 2 }));
  assert.deepEqual(violated(v), {});
  assert.equal(v.stats.leasesLost.total, 0);
  const early = late.map((e) => (e.k === 'renew' ? { ...e, endAt: 1300 } : e));
  assert.equal(check([...announce, ...early, ...ending(5000)], run({ mode: 'sentinel', minReplicas: 1, replicas: 2 })).counts['no-lease-lost-after-announced-switch'].violations, 1);
});

test('a release called by a process killed before it answered ends the lease at the call (Redis may run it after the process died)', () => {
  const killedMidRelease = [
    ...lease('a', 'k', 10, 0, 5, undefined),
    { k: 'release-call', op: 'a', key: 'k', p: 0, inc: 1, at: 100 },
    ...lease('b', 'k', 11, 50, 300, 400, { p: 1 }),
  ];
  assert.deepEqual(violated(check([...killedMidRelease, ...ending(1000)], run())), {});
  const noCall = killedMidRelease.filter((e) => e.k !== 'release-call');
  assert.deepEqual(violated(check([...noCall, ...ending(1000)], run())), { 'no-overlapping-valid-leases': 1 });
});

test('a lease that arrived already expired was never valid and overlaps nothing', () => {
  const history = [
    ...lease('a', 'k', 11, 0, 5, 500),
    { k: 'acq-start', op: 'b', key: 'k', p: 1, inc: 1, at: 1 },
    { k: 'grant', op: 'b', key: 'k', p: 1, inc: 1, at: 200, startAt: 1, fence: '10', expiresAt: 200 },
  ];
  assert.deepEqual(violated(check([...history, ...ending(1000)], run())), {});
});

test('in a Cluster a loss is excused only on the shard that failed over, while the failover lasts and shortly after; a graceful failover or a slot migration excuses nothing', () => {
  const cluster = (over = {}) => run({ mode: 'cluster', replicas: 1, ...over });
  // Lease a on k is overlapped by b: a kill of k's master excuses it; of another shard's, not.
  const overlap = [...lease('a', 'k', 10, 0, 5, 500), ...lease('b', 'k', 11, 50, 200, 300, { p: 1 })];
  const fault = (kind, keys, at = 100, healAt = 150) => [{ k: 'fault', kind, id: 1, at, keys }, { k: 'heal', kind, id: 1, at: healAt }];
  const own = check([...overlap, ...fault('master-kill', ['k']), ...ending(5000)], cluster());
  assert.deepEqual(violated(own), {});
  assert.equal(own.counts['no-overlapping-valid-leases'].documented, 1);
  assert.equal(own.counts['no-lease-lost-outside-a-shard-failover'].documented, 1);
  assert.deepEqual(violated(check([...overlap, ...fault('master-kill', ['other']), ...ending(5000)], cluster())),
    { 'no-overlapping-valid-leases': 1, 'no-lease-lost-outside-a-shard-failover': 1 });
  for (const kind of ['cluster-failover', 'slot-migrate']) {
    assert.deepEqual(violated(check([...overlap, ...fault(kind, ['k']), ...ending(5000)], cluster())),
      { 'no-overlapping-valid-leases': 1, 'no-lease-lost-outside-a-shard-failover': 1 }, kind);
  }
  // A stopped master continued after its replica took over may answer as master a moment
  // longer: the span runs to its heal plus 2 s, no further.
  const late = [...lease('a', 'k', 10, 3000, 3005, 3500), ...lease('b', 'k', 11, 3050, 3200, 3300, { p: 1 })];
  assert.deepEqual(violated(check([...late, ...fault('master-stop', ['k'], 100, 1500), ...ending(5000)], cluster())), {});
  assert.deepEqual(violated(check([...late, ...fault('master-stop', ['k'], 100, 500), ...ending(5000)], cluster())),
    { 'no-overlapping-valid-leases': 1, 'no-lease-lost-outside-a-shard-failover': 1 });
  // A fence drawn again across the shard's failover: documented with minReplicas 0, a
  // violation with minReplicas 1 (its one replica acknowledged every lease).
  const back = [...lease('a', 'k', 10, 0, 5, 100), ...fault('master-kill', ['k'], 150, 160), ...lease('b', 'k', 3, 200, 210, 300)];
  assert.deepEqual(violated(check([...back, ...ending(5000)], cluster())), {});
  assert.deepEqual(violated(check([...back, ...ending(5000)], cluster({ minReplicas: 1 }))), { 'fences-never-go-backwards': 1 });
});

test('an overlap no longer than the measured wall-clock drift is Redis expiring on a fast wall clock, not a lost lease', () => {
  // a is valid until 805 on the monotonic clock; b is granted 3 ms before that.
  const h = [...lease('a', 'k', 10, 0, 5), ...lease('b', 'k', 11, 50, 802, 900, { p: 1 }), ...ending(2000)];
  assert.deepEqual(violated(check(h, run())), { 'no-overlapping-valid-leases': 1 });
  const v = check(h, run({ clockDriftMs: 3.9 }));
  assert.deepEqual(violated(v), {});
  assert.equal(v.stats.overlapsWithinClockDrift, 1);
});
