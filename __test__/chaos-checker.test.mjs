// The chaos checker (benchmarks/chaos/checker.mjs) on hand-written histories: each
// invariant must fail on the history that breaks it, and what README documents as lost
// with a failover or a restart must be counted apart, not failed.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { check, excerpt, formatGaps } from '../benchmarks/chaos/checker.mjs';

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
  // The coordinator records the kill just before the signal lands: an acquire the process
  // started in between is stamped after the kill, and was cut by it all the same.
  const killedRacing = [{ k: 'fault', kind: 'proc-kill', id: 1, target: 0, inc: 1, at: 100 }, { k: 'acq-start', op: 'x', key: 'k', p: 0, inc: 1, at: 100.02 }];
  assert.deepEqual(violated(check([...killedRacing, ...ending(10_000)], run())), {});
  // One already overdue when its process was killed is still judged.
  const overdue = [...never, { k: 'fault', kind: 'proc-kill', id: 1, target: 0, inc: 1, at: 8000 }];
  assert.deepEqual(violated(check([...overdue, ...ending(10_000)], run())), { 'every-acquire-settles-in-bound': 1 });
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

// ------------------------------------------------------------- the lease signal ----
// Leases that obey their signal (decision 0156) or ignore it; a fenced write as both the
// store's verdict and the holder's record of it (joined by the write's id).
function signalLease(op, key, fence, start, grant, release, { obeys = true, keepAlive = false, p = 0, inc = 1 } = {}) {
  return lease(op, key, fence, start, grant, release, { p, inc }).map((e) => (e.k === 'grant' ? { ...e, obeys, keepAlive } : e));
}
let wid = 0;
function write(op, key, fence, at, { ok = true, aborted = false, reason, obeys = true, p = 0, inc = 1 } = {}) {
  wid += 1;
  return [
    { k: 'store', at: at + 1, key, fence: String(fence), lease: op, p, inc, wid, ok },
    { k: 'write', op, key, p, inc, at: at + 2, ok, validBefore: !aborted, checkedAt: at, storeAt: at + 1, wid, obeys, aborted, reason: aborted ? reason ?? 'LEASE_EXPIRED' : undefined },
  ];
}
const skip = (op, key, at, reason = 'LEASE_EXPIRED', p = 0) => ({ k: 'skip', op, key, p, inc: 1, at, reason });
const aborts = (op, key, at, code = 'LEASE_EXPIRED', p = 0) => ({ k: 'signal', op, key, p, inc: 1, at, err: { code, name: 'LockError', lockError: true } });

test('a holder that obeys its signal and still writes after it aborted is a violation; one that ignores it is counted, not failed', () => {
  // Lease a ran past its deadline (805) and wrote at 900 with its signal aborted.
  const base = [...signalLease('a', 'k', 10, 0, 5, 950), ...write('a', 'k', 10, 10)];
  const disobeying = check([...base, aborts('a', 'k', 805), ...write('a', 'k', 10, 900, { aborted: true }), ...ending(2000)], run());
  assert.deepEqual(violated(disobeying), { 'no-write-after-signal-aborted': 1 });
  assert.equal(disobeying.stats.signal.obeying.writesAfterAbort, 1);
  assert.match(disobeying.violations[0].detail, /lease a on k \(fence 10\) wrote after its signal aborted \(LEASE_EXPIRED\)/);
  const ignoringBase = [...signalLease('a', 'k', 10, 0, 5, 950, { obeys: false }), ...write('a', 'k', 10, 10, { obeys: false })];
  const ignoring = check([...ignoringBase, aborts('a', 'k', 805), ...write('a', 'k', 10, 900, { aborted: true, obeys: false }), ...ending(2000)], run());
  assert.deepEqual(violated(ignoring), {});
  assert.equal(ignoring.stats.signal.ignoring.acceptedAborted, 1, 'a stale write the store took: nobody newer had written');
  assert.equal(ignoring.counts['no-write-after-signal-aborted'].checked, 0);
});

test('a skipped write whose lease was superseded or past its deadline is a stale write the signal prevented; a skip of a lease still current is not', () => {
  // a (fence 10) is past its deadline at 900; b (fence 11) is granted at 850 and writes at once.
  const superseded = [
    ...signalLease('a', 'k', 10, 0, 5, 950), ...write('a', 'k', 10, 10), aborts('a', 'k', 805),
    ...signalLease('b', 'k', 11, 810, 850, 1000, { p: 1 }), ...write('b', 'k', 11, 855, { p: 1 }),
    skip('a', 'k', 900),
  ];
  const v = check([...superseded, ...ending(2000)], run());
  assert.deepEqual(violated(v), {});
  assert.deepEqual(v.stats.signal.obeying.prevented, { total: 1, storeHadNewer: 1, supersededNotYetWritten: 0, overNoNewerHolder: 0 });
  assert.deepEqual(v.stats.signal.obeying.skips, { total: 1, byReason: { LEASE_EXPIRED: 1 } });
  // Nobody took the key yet: only the signal stopped that write (the store had no newer fence).
  const alone = [...signalLease('a', 'k', 10, 0, 5, 950), ...write('a', 'k', 10, 10), aborts('a', 'k', 805), skip('a', 'k', 900)];
  assert.equal(check([...alone, ...ending(2000)], run()).stats.signal.obeying.prevented.overNoNewerHolder, 1);
  // A renew that found the key gone (a restart emptied it) aborts the signal before the
  // deadline; nobody holds the key yet: the skipped write was not stale.
  const early = [...signalLease('a', 'k', 10, 0, 5, 400), ...write('a', 'k', 10, 10), aborts('a', 'k', 300, 'LEASE_LOST'), skip('a', 'k', 310, 'LEASE_LOST')];
  const notStale = check([...early, ...ending(2000)], run());
  assert.equal(notStale.stats.signal.obeying.prevented.total, 0);
  assert.deepEqual(notStale.stats.signal.obeying.skipsNotStale, { total: 1, byReason: { LEASE_LOST: 1 } });
});

test('a write the fence refused although its signal had not aborted is counted by cause: a restart, a fence drawn again in a failover, or unexplained', () => {
  // a (fence 10, valid until 805) writes at 300 with its signal not aborted, but the server
  // was killed at 100 and b (fence 11) got the key at 200 and wrote first.
  const regranted = [
    ...signalLease('a', 'k', 10, 0, 5, 400), ...write('a', 'k', 10, 10),
    ...signalLease('b', 'k', 11, 150, 200, 500, { p: 1 }), ...write('b', 'k', 11, 210, { p: 1 }),
    ...write('a', 'k', 10, 300, { ok: false }),
  ];
  const restart = check([...regranted, { k: 'fault', kind: 'server-kill', id: 1, at: 100 }, ...ending(2000)], run());
  assert.deepEqual(violated(restart), {});
  assert.deepEqual(restart.stats.signal.obeying.fencedUnaborted, { total: 1, byCause: { 'server restart: key granted again': 1 } });
  // With no loss in between it is unexplained, and the overlap behind it a violation.
  const none = check([...regranted, ...ending(2000)], run());
  assert.deepEqual(violated(none), { 'no-overlapping-valid-leases': 1 });
  assert.deepEqual(none.stats.signal.obeying.fencedUnaborted.byCause, { unexplained: 1 });
  // Sentinel: b held fence 20 on the old primary; after the failover a drew 15 from the
  // promoted replica's counter, which was behind: no signal could know.
  const behind = [
    ...signalLease('b', 'k', 20, 0, 5, 100, { p: 1 }), ...write('b', 'k', 20, 10, { p: 1 }),
    { k: 'fault', kind: 'primary-kill', id: 1, at: 150 },
    ...signalLease('a', 'k', 15, 200, 210, 400), ...write('a', 'k', 15, 220, { ok: false }),
  ];
  const failover = check([...behind, ...ending(2000)], run({ mode: 'sentinel', minReplicas: 0, replicas: 2 }));
  assert.deepEqual(violated(failover), {});
  assert.deepEqual(failover.stats.signal.obeying.fencedUnaborted.byCause, { 'failover: fence drawn again': 1 });
  // An ignoring holder's refused write with its signal aborted is one the signal would have prevented.
  const late = [
    ...signalLease('a', 'k', 10, 0, 5, 950, { obeys: false }), ...write('a', 'k', 10, 10, { obeys: false }), aborts('a', 'k', 805),
    ...signalLease('b', 'k', 11, 810, 850, 1000, { p: 1 }), ...write('b', 'k', 11, 855, { p: 1 }),
    ...write('a', 'k', 10, 900, { ok: false, aborted: true, obeys: false }),
  ];
  const ign = check([...late, ...ending(2000)], run()).stats.signal.ignoring;
  assert.equal(ign.fencedAborted, 1);
  assert.equal(ign.fencedUnaborted.total, 0);
});

test('a keep-alive lease is valid as long as its holder saw it valid, and a keep-alive renewal that found another owner lost it', () => {
  // Granted at 5 (deadline 805 unless renewed); its holder saw it valid until 1500 at 1000.
  const kept = [
    ...signalLease('a', 'k', 10, 0, 5, 1300, { keepAlive: true }),
    { k: 'write', op: 'a', key: 'k', p: 0, inc: 1, at: 1002, ok: true, checkedAt: 1000, obeys: true, aborted: false, seenExpiresAt: 1500 },
    ...signalLease('b', 'k', 11, 900, 1200, 1400, { p: 1 }),
  ];
  assert.deepEqual(violated(check([...kept, ...ending(3000)], run())), { 'no-overlapping-valid-leases': 1 });
  const unseen = kept.map((e) => (e.k === 'write' ? { ...e, seenExpiresAt: undefined } : e));
  assert.deepEqual(violated(check([...unseen, ...ending(3000)], run())), {});
  // Its renewal found another owner at 600, before the deadline: the lease ended there, lost.
  const lostKa = [...signalLease('a', 'k', 10, 0, 5, 700, { keepAlive: true }), aborts('a', 'k', 600, 'LEASE_LOST'), ...signalLease('b', 'k', 11, 610, 650, 800, { p: 1 })];
  const v = check([...lostKa, ...ending(3000)], run());
  assert.deepEqual(violated(v), {});
  assert.deepEqual(v.stats.leasesLost.byHow, { 'a keep-alive renewal found another owner': 1 });
});

test('a signal reason outside the contract, or not a LockError, is a violation', () => {
  const h = [
    ...signalLease('a', 'k', 10, 0, 5, 100), { ...aborts('a', 'k', 100, 'SHUT_DOWN') },
    ...signalLease('b', 'k', 11, 200, 205, 300), { k: 'signal', op: 'b', key: 'k', p: 0, inc: 1, at: 300, err: { code: null, name: 'DOMException', lockError: false } },
  ];
  assert.deepEqual(violated(check([...h, ...ending(2000)], run())), { 'only-contract-error-codes': 2 });
});

test('a history recorded before the signal holders has no signal figures and no signal verdicts', () => {
  const v = check([...lease('a', 'k', 10, 0, 5, 100), ...ending(1000)], run());
  assert.equal(v.stats.signal, null);
  assert.equal(v.counts['no-write-after-signal-aborted'].checked, 0);
});

test('probe events (an ioredis client writing beside the drivers) are never judged; the gaps set its longest gap without a write beside the drivers\' without a lease', () => {
  // Leases every 100 ms, then none from 1000 to 4000 ms. The probe writes every 50 ms, fails
  // from 1000 to 2000 ms (the servers' part), then writes again while the drivers still get
  // nothing until 4000 ms (the driver's part). Its events carry no key and no process.
  const leases = [];
  for (let t = 0; t <= 1000; t += 100) leases.push(...lease(`a${t}`, 'k', 10 + t / 100, t, t + 1, t + 50));
  for (let t = 4000; t <= 4500; t += 100) leases.push(...lease(`b${t}`, 'k', 10 + t / 100, t - 1, t, t + 50));
  const probe = [{ k: 'run-start', at: -500 }];
  for (let t = 0; t <= 4500; t += 50) {
    const ok = t <= 1000 || t >= 2000;
    probe.push({ k: 'probe', ev: 'write', at: t, startAt: t - 1, n: t / 50, ok, port: t < 1500 ? 7001 : 7002, acks: ok ? 1 : undefined, err: ok ? undefined : { name: 'Error', msg: 'Connection is closed.' } });
  }
  probe.push({ k: 'probe', ev: 'error', at: 1500, err: { name: 'Error', msg: 'All sentinels are unreachable.' } });
  probe.push({ k: 'probe', ev: 'exit', at: 9000, code: 1 }); // not a driver's exit: not judged
  // The coordinator's view of the cluster, recorded when it changed.
  probe.push({ k: 'probe', ev: 'view', at: 200, view: 'named 7001,7001,7001; 7001 master, 7002 slave→7001 connected' });
  probe.push({ k: 'probe', ev: 'view', at: 1200, view: 'named 7001,?,7002; 7001 down, 7002 slave→7001 connect' });
  probe.push({ k: 'probe', ev: 'view', at: 1900, view: 'named 7002,7002,7002; 7001 down, 7002 master' });
  const base = [...leases, ...ending(4600)];
  const without = check(base, run({ mode: 'sentinel', minReplicas: 1, replicas: 2 }));
  const v = check([...base, ...probe], run({ mode: 'sentinel', minReplicas: 1, replicas: 2 }));
  assert.deepEqual(violated(v), {});
  assert.deepEqual(v.counts, without.counts, 'probe events change no invariant\'s figures');
  assert.equal(without.stats.gaps.probe, null);

  const [drivers] = v.stats.gaps.leases.longest;
  assert.equal(drivers.ms, 2999); // granted at 1001, next at 4000
  assert.equal(drivers.fromS, 1.5); // from run-start
  assert.equal(drivers.probe.longestOverlappingMs, 1000); // the probe failed for 1 s of the 3
  assert.equal(drivers.probe.okWithin, 40); // and wrote from 2000 to 3950
  assert.equal(drivers.probe.downShare, Number((999 / 2999).toFixed(3)));
  assert.equal(drivers.probeReplicated.longestOverlappingMs, 1000);

  const p = v.stats.gaps.probe;
  assert.deepEqual(p.writes, { sent: 91, ok: 72, failed: 19, replicated: 72 });
  assert.equal(p.primaries, 2);
  const [probeGap] = p.longest;
  assert.deepEqual([probeGap.ms, probeGap.portBefore, probeGap.portAfter], [1000, 7001, 7002]);
  assert.deepEqual(probeGap.writesFailed, { 'Connection is closed.': 19 });
  assert.deepEqual(probeGap.clientErrors, { 'All sentinels are unreachable.': 1 });
  assert.equal(probeGap.leases.okWithin, 1); // the last lease before the drivers' gap, at 1001
  assert.equal(probeGap.leases.downShare, 0.999); // the drivers were down all the rest of it too
  assert.equal(probeGap.leases.longestOverlappingMs, 2999);
  assert.deepEqual(probeGap.cluster, { changes: 2, shown: [
    '+0.7s named 7001,7001,7001; 7001 master, 7002 slave→7001 connected',
    '+1.7s named 7001,?,7002; 7001 down, 7002 slave→7001 connect',
    '+2.4s named 7002,7002,7002; 7001 down, 7002 master',
  ] });
  assert.deepEqual(v.stats.gaps.switchesMostIn10s, { n: 0 });
  // Switches (announcements grouped) flipping the primary: the most in any 10 s.
  const flips = [0, 1000, 2000, 13_000].map((at, i) => ({ k: 'announce', at, sentinel: 0, from: 7001 + (i % 2), to: 7002 - (i % 2) }));
  assert.deepEqual(check([...base, ...flips], run({ mode: 'sentinel', minReplicas: 1, replicas: 2 })).stats.gaps.switchesMostIn10s, { n: 3, fromS: 0, toS: 2 });
  const text = formatGaps(v.stats.gaps).join('\n');
  assert.match(text, /\n {13}\+1\.7s named 7001,\?,7002/); // under the drivers' 3 s gap
  assert.match(text, /2999 ms \+1\.5s…\+4\.5s/);
  assert.match(text, /probe: 40 writes ok inside \(ports 7002 40\), its longest overlapping gap 1000 ms, down 33 % of the window/);

  // A violation's excerpt never drowns in probe writes.
  const overlap = check([...lease('x', 'k2', 5, 0, 5, 500), ...lease('y', 'k2', 6, 50, 200, 300, { p: 1 }), ...probe, ...ending(10_000)], run());
  assert.equal(overlap.counts['no-overlapping-valid-leases'].violations, 1);
  const shown = excerpt(overlap.events, overlap.violations[0].around);
  assert.ok(shown.length > 0 && shown.every((e) => e.k !== 'probe'));
});

// net-silent-cut: a proxy drops the open flows without a word (nemesis.mjs). The driver must
// give each one up (close it, or meet the RST) within the nemesis's watch; the summary times
// from the cut to the driver's first sign in each holding process and to each flow given up.
test('a silently dropped flow its driver never gives up within the watch is a violation; the times from cut to noticed and to given up are reported', () => {
  const flows = [{ flow: 1, use: 'commands', p: 0, inc: 1 }, { flow: 2, use: 'subscription', p: 1, inc: 1 }];
  const cut = (ended, given = [1, 2]) => [
    { k: 'fault', id: 1, kind: 'net-silent-cut', target: 0, at: 100, reset: false, flows },
    // Process 0's acquire timed out on the dead command flow; process 1's PING went unanswered.
    { k: 'acq-start', op: 'x', key: 'k', p: 0, inc: 1, at: 90 },
    { k: 'acq-fail', op: 'x', key: 'k', p: 0, inc: 1, at: 1090, startAt: 90, err: { code: 'OUTCOME_UNKNOWN', lockError: true, cause: { plugin: 'dokebi-redis', code: 'COMMAND_TIMEOUT' } } },
    { k: 'dead', p: 1, inc: 1, at: 1600, total: 1, was: 0 },
    ...given.map((flow) => ({ k: 'flow-given-up', id: 1, flow, how: 'closed', at: flow === 1 ? 2100 : 1610 })),
    { k: 'heal', id: 1, kind: 'net-silent-cut', target: 0, at: ended === 'given-up' ? 2100 : 15_100, ended },
  ];
  const found = check([...cut('given-up'), ...ending(20_000)], run({ pingIntervalMs: 500 }));
  assert.deepEqual(violated(found), {});
  assert.equal(found.counts['silent-cut-flows-given-up'].checked, 2);
  const sc = found.stats.silentCuts;
  assert.equal(sc.judged, 2);
  assert.deepEqual(sc.noticed.by, { 'acquire COMMAND_TIMEOUT': 1, deadConnections: 1 });
  assert.deepEqual([sc.noticedMs.all.min, sc.noticedMs.all.max], [990, 1500]);
  assert.deepEqual([sc.noticedMs.commands.max, sc.noticedMs.subscription.max], [990, 1500]);
  assert.deepEqual([sc.givenUpMs.all.min, sc.givenUpMs.all.max], [1510, 2000]);
  assert.equal(sc.deadConnections, 1);

  const held = check([...cut('watch', [1]), ...ending(20_000)], run({ pingIntervalMs: 500 }));
  assert.deepEqual(violated(held), { 'silent-cut-flows-given-up': 1 });
  assert.match(held.violations[0].detail, /flow 2 \(subscription\) of process 1\.1/);

  // The run's end healed the cut before its watch ran out: not judged.
  const cutShort = check([...cut('heal-all', [1]), ...ending(20_000)], run({ pingIntervalMs: 500 }));
  assert.deepEqual(violated(cutShort), {});
  assert.equal(cutShort.stats.silentCuts.cutShortByTheEnd, 1);
  // A process stopped meanwhile finds nothing: its flow is left out.
  const stopped = check([...cut('watch', [1]), { k: 'fault', id: 2, kind: 'proc-stop', target: 1, at: 200, inc: 1 }, { k: 'heal', id: 2, kind: 'proc-stop', target: 1, at: 2000 }, ...ending(20_000)], run({ pingIntervalMs: 500 }));
  assert.deepEqual(violated(stopped), {});
  assert.equal(stopped.stats.silentCuts.excused.processStopped, 1);
});
