// The checker: reads the whole recorded history of a chaos run after it ended and judges it
// against the invariants README promises. Pure: history and settings in, a verdict out, so
// that it can be tested on hand-written histories (checker.test.mjs).
//
// Times are milliseconds on CLOCK_MONOTONIC, stamped by the process that saw the event
// (decision 0056). A lease is valid from the moment its acquire resolved (grantAt) until
// the earliest of its local deadline (expiresAt, from `remainingMs`, moved by a renew),
// the moment release() was called, and the moment the driver said it is no longer valid.
//
// `probe` events (run.mjs --probe ioredis: a plain ioredis client writing beside the
// drivers) are never judged: they only feed `stats.gaps`, which sets the probe's longest
// gaps without a write beside the drivers' longest gaps without a lease.

/** Faults after which README says a lease or fence may be lost (failover, restart). */
const LOSS_FAULTS = new Set(['server-kill', 'failover', 'primary-kill', 'primary-kill-lagging']);
/**
 * Cluster faults after which a shard's replica may take over without the last writes
 * (asynchronous replication; README "Redis HA"), excused on that shard's keys only: from
 * the fault until its heal plus CLUSTER_REJOIN_MS, while the old master, continued or
 * restarted, may still answer as master before it learns it was demoted. A graceful
 * CLUSTER FAILOVER waits for the replica to catch up first, and a slot migration moves
 * the keys with their TTL: neither excuses anything.
 */
const CLUSTER_LOSS_FAULTS = new Set(['master-kill', 'master-stop', 'cluster-failover-force']);
const CLUSTER_REJOIN_MS = 2000;

/** How long before its first announcement a switch may already hand out leases (decision 0058). */
const PROMOTION_BEFORE_ANNOUNCEMENT_MS = 2000;

/** The codes each call may reject with under faults (README "Errors", CONTRACT.md). */
const ALLOWED = {
  acquire: new Set(['WAIT_TIMEOUT', 'PROVIDER_FAILED', 'OUTCOME_UNKNOWN', 'LOCK_BUSY']),
  renew: new Set(['LEASE_EXPIRED', 'LEASE_LOST', 'PROVIDER_FAILED', 'OUTCOME_UNKNOWN']),
  release: new Set(['PROVIDER_FAILED', 'OUTCOME_UNKNOWN']),
  shutdown: new Set([]),
  // A lease's signal.reason (CONTRACT "Lease signal and keep-alive"): the deadline or
  // release(), a renew's or a keep-alive renewal's error. SHUT_DOWN never: every worker
  // releases before its process shuts down.
  signal: new Set(['LEASE_EXPIRED', 'LEASE_LOST', 'OUTCOME_UNKNOWN', 'PROVIDER_FAILED']),
  keepAlive: new Set(['LEASE_EXPIRED']),
};
const REDIS_CAUSE = new Set(['PROVIDER_FAILED', 'OUTCOME_UNKNOWN']);

export const INVARIANTS = [
  'fences-never-go-backwards',
  'no-overlapping-valid-leases',
  'no-stale-write-accepted',
  'every-acquire-settles-in-bound',
  'recovery-after-last-fault',
  'clean-exits-no-keys-left',
  'only-contract-error-codes',
  'no-lease-lost-after-announced-switch',
  'no-lease-lost-outside-a-shard-failover',
  'no-write-after-signal-aborted',
  'silent-cut-flows-given-up',
];

/**
 * @param {object[]} history every event, any order
 * @param {object} run { mode, minReplicas, replicas (Sentinel: how many the primary has), leaseMs, waitTimeoutMs, commandTimeoutMs, replicaTimeoutMs,
 *   switchToleranceMs, recoveryBoundMs, settleSlackMs }
 */
export function check(history, run) {
  const events = [...history].sort((a, b) => a.at - b.at);
  const violations = [];
  const counts = Object.fromEntries(INVARIANTS.map((n) => [n, { checked: 0, violations: 0, documented: 0 }]));
  const violate = (invariant, detail, around) => {
    counts[invariant].violations += 1;
    violations.push({ invariant, detail, around });
  };

  // ------------------------------------------------------------ the record, rebuilt ----
  const leases = new Map();
  const starts = new Map();
  const ends = new Map();
  const faults = [];
  const heals = [];
  const announcements = [];
  const exits = [];
  const shutdowns = [];
  const storeWrites = [];
  const writes = [];
  const skips = [];
  const errors = [];
  const probeEvents = [];
  const deadEvents = [];
  const stalls = [];
  const givenUp = [];
  let runStartAt = null;
  let finalHealAt = null;
  let lockKeysLeft = null;
  // A keep-alive lease's deadline moves unseen (renewed on the addon's thread): each event
  // carries how long it had left when its holder looked, a lower bound of its deadline.
  const seen = (e) => {
    const l = leases.get(e.op);
    if (l?.keepAlive && e.seenExpiresAt > l.expiresAt) l.expiresAt = e.seenExpiresAt;
  };
  for (const e of events) {
    switch (e.k) {
      case 'acq-start': starts.set(e.op, e); break;
      case 'grant':
        ends.set(e.op, e);
        leases.set(e.op, {
          op: e.op, p: e.p, inc: e.inc, key: e.key, startAt: e.startAt, grantAt: e.at,
          fence: BigInt(e.fence), expiresAt: e.expiresAt, releaseAt: Infinity, invalidAt: Infinity, lost: null,
          obeys: e.obeys, keepAlive: e.keepAlive === true, abortAt: Infinity, abortCode: null,
        });
        break;
      case 'acq-fail':
        ends.set(e.op, e);
        errors.push({ call: 'acquire', e });
        break;
      case 'renew': {
        const l = leases.get(e.op);
        if (!l) break;
        if (e.ok) l.expiresAt = Math.max(l.expiresAt, e.expiresAt);
        else {
          errors.push({ call: 'renew', e });
          if (!e.valid) l.invalidAt = Math.min(l.invalidAt, e.endAt);
          // Lost only if Redis said so before the lease's deadline: a renew answered after it
          // (a stopped primary, a stall) may rightly find the key expired.
          if (e.err?.code === 'LEASE_LOST' && e.endAt < l.expiresAt) l.lost ??= { how: 'renew found another owner', at: e.endAt };
        }
        break;
      }
      case 'release-call': {
        const l = leases.get(e.op);
        if (l) l.releaseAt = Math.min(l.releaseAt, e.at);
        seen(e);
        break;
      }
      case 'release': {
        const l = leases.get(e.op);
        if (!l) break;
        l.releaseAt = Math.min(l.releaseAt, e.at);
        if (!e.ok) errors.push({ call: 'release', e });
        else if (e.released === false && e.endAt < l.expiresAt) l.lost ??= { how: 'released while valid, but the key was no longer ours', at: e.endAt };
        break;
      }
      case 'write': writes.push(e); seen(e); break;
      case 'skip': skips.push(e); seen(e); break;
      case 'signal': {
        const l = leases.get(e.op);
        if (l && l.abortAt === Infinity) { l.abortAt = e.at; l.abortCode = e.err?.code ?? null; }
        errors.push({ call: 'signal', e });
        break;
      }
      case 'keepalive': if (!e.ok) errors.push({ call: 'keepAlive', e }); break;
      case 'store': storeWrites.push(e); break;
      case 'fault': faults.push(e); break;
      case 'heal': heals.push(e); break;
      case 'announce': announcements.push(e); break;
      case 'exit': exits.push(e); break;
      case 'shutdown': shutdowns.push(e); if (!e.ok) errors.push({ call: 'shutdown', e }); break;
      case 'healed-all': finalHealAt = e.at; break;
      case 'lock-keys-left': lockKeysLeft = e.count; break;
      case 'probe': probeEvents.push(e); break;
      case 'dead': deadEvents.push(e); break;
      case 'stall': stalls.push(e); break;
      case 'flow-given-up': givenUp.push(e); break;
      case 'run-start': runStartAt = e.at; break;
      default: break;
    }
  }
  for (const l of leases.values()) {
    // The driver said the lease is over (its signal aborted) for a cause other than the
    // deadline or release(): no longer valid from then on, at the latest. A keep-alive
    // renewal that found another owner before the deadline lost the lease, as a renew does.
    if (l.abortAt < Infinity && l.abortCode !== 'LEASE_EXPIRED') {
      l.invalidAt = Math.min(l.invalidAt, l.abortAt);
      if (l.keepAlive && l.abortCode === 'LEASE_LOST' && l.abortAt < l.expiresAt) l.lost ??= { how: 'a keep-alive renewal found another owner', at: l.abortAt };
    }
    l.end = Math.min(l.expiresAt, l.releaseAt, l.invalidAt);
  }

  // A switch is announced by several Sentinels; the first announcement of each is what a
  // driver that follows the first announcement (issue 16, point 1) acts on.
  const switches = [];
  for (const a of announcements) {
    // Another Sentinel announcing the latest switch joins it; anything else is a new switch,
    // also the same pair again after a different one (Sentinels that flip the primary back
    // and forth move the drivers each time).
    const last = switches.at(-1);
    if (last && last.to === a.to && last.from === a.from && a.at - last.at < 10_000) { last.by.push(a.sentinel); continue; }
    switches.push({ at: a.at, from: a.from, to: a.to, by: [a.sentinel] });
  }
  // A failover Sentinel refused (no replica it deems ready yet) moved nothing.
  const refused = new Set(events.filter((e) => e.k === 'fault-refused').map((e) => e.id));
  // Each loss is a span: a fault at its moment; a switch from its promotion, which comes
  // before the announcements (the leader announces only when the failover ends, about a
  // second after the others, decision 0050, and a driver that connects meanwhile is
  // already sent to the new primary), to its first announcement.
  const lossKind = run.mode === 'standalone' ? 'server restart' : 'failover';
  const losses = [
    ...faults.filter((f) => LOSS_FAULTS.has(f.kind) && !refused.has(f.id)).map((f) => [f.at, f.at]),
    ...switches.map((s) => [s.at - PROMOTION_BEFORE_ANNOUNCEMENT_MS, s.at]),
  ];
  // Cluster: [from, to, keys] per fault, keys being those its shard served at the fault.
  const healAt = new Map(heals.map((h) => [h.id, h.at]));
  const shardLosses = run.mode === 'cluster'
    ? faults.filter((f) => CLUSTER_LOSS_FAULTS.has(f.kind) && !refused.has(f.id))
      .map((f) => [f.at, (healAt.get(f.id) ?? Infinity) + CLUSTER_REJOIN_MS, new Set(f.keys ?? [])])
    : [];
  const lossBetween = (from, to, key) => losses.some(([a, b]) => a <= to && b >= from)
    || shardLosses.some(([a, b, ks]) => a <= to && b >= from && ks.has(key));
  const lossKindBetween = (from, to, key) => (losses.some(([a, b]) => a <= to && b >= from) ? lossKind
    : shardLosses.some(([a, b, ks]) => a <= to && b >= from && ks.has(key)) ? 'shard failover' : null);
  const killedAt = new Map(); // `${p}.${inc}` → when the nemesis killed it
  for (const f of faults) if (f.kind === 'proc-kill') killedAt.set(`${f.target}.${f.inc}`, f.at);
  const stoppedSpans = faults.filter((f) => f.kind === 'proc-stop').map((f) => ({
    p: f.target, from: f.at, to: heals.find((h) => h.id === f.id)?.at ?? Infinity,
  }));

  const byKey = new Map();
  for (const l of leases.values()) {
    if (!byKey.has(l.key)) byKey.set(l.key, []);
    byKey.get(l.key).push(l);
  }

  // ------------------------------------------------------ fences never go backwards ----
  // Real-time order: a grant that completed before another acquire started must have the
  // smaller fence. Only a failover under Sentinel with minReplicas below the number of
  // replicas may lose fences (README "Limits of fencing", "Replica acknowledgements").
  for (const list of byKey.values()) {
    const byGrant = [...list].sort((a, b) => a.grantAt - b.grantAt);
    const byStart = [...list].sort((a, b) => a.startAt - b.startAt);
    let i = 0;
    let best = null;
    for (const l2 of byStart) {
      while (i < byGrant.length && byGrant[i].grantAt < l2.startAt) {
        if (!best || byGrant[i].fence > best.fence) best = byGrant[i];
        i += 1;
      }
      counts['fences-never-go-backwards'].checked += 1;
      // Counted once per fence handed out again (the first later grant at or below it),
      // not once per grant until the counter climbs past it again.
      if (best && l2.fence <= best.fence && !best.lost?.fence) {
        best.lost = { how: `a later lease drew fence ${l2.fence} ≤ its ${best.fence}`, at: l2.grantAt, fence: true };
        // README "Replica acknowledgements": a failover may promote a replica that did not
        // acknowledge unless minReplicas counts every replica (decision 0058).
        // In a Cluster the same per shard (one replica each).
        const documented = (run.mode === 'sentinel' || run.mode === 'cluster') && run.minReplicas < run.replicas && lossBetween(best.startAt, l2.grantAt, l2.key);
        if (documented) counts['fences-never-go-backwards'].documented += 1;
        else violate('fences-never-go-backwards', `key ${l2.key}: lease ${l2.op} drew fence ${l2.fence} after lease ${best.op} had been granted fence ${best.fence}`, { key: l2.key, from: best.startAt, to: l2.grantAt });
      }
    }
  }

  // --------------------------------------------------------- no overlapping leases ----
  let withinClockDrift = 0;
  for (const list of byKey.values()) {
    const sorted = [...list].sort((a, b) => a.grantAt - b.grantAt);
    const active = [];
    for (const l2 of sorted) {
      counts['no-overlapping-valid-leases'].checked += 1;
      for (let j = active.length - 1; j >= 0; j--) if (active[j].end <= l2.grantAt) active.splice(j, 1);
      // A lease that arrived already expired (its process was stopped while the reply came)
      // was never valid: it overlaps nothing.
      if (l2.end <= l2.grantAt) continue;
      for (const l1 of active) {
        if (l1.p === l2.p && l1.inc === l2.inc && l1.op === l2.op) continue;
        // Redis expires keys on the wall clock, the driver and this checker count on
        // CLOCK_MONOTONIC: a host whose wall clock runs fast (NTP slewing) expires a key
        // that much before the lease's local deadline. Measured by the run (clockDriftMs).
        if (l1.end - l2.grantAt <= (run.clockDriftMs ?? 0)) { withinClockDrift += 1; continue; }
        l1.lost ??= { how: `lease ${l2.op} was granted while it was valid`, at: l2.grantAt };
        if (lossBetween(l1.startAt, l2.grantAt, l1.key)) counts['no-overlapping-valid-leases'].documented += 1;
        else violate('no-overlapping-valid-leases', `key ${l1.key}: lease ${l2.op} (fence ${l2.fence}) granted while lease ${l1.op} (fence ${l1.fence}) was valid for ${(l1.end - l2.grantAt).toFixed(1)} ms more`, { key: l1.key, from: l1.startAt, to: l2.grantAt + 1 });
      }
      if (l2.end > l2.grantAt) active.push(l2);
    }
  }

  // ------------------------------------------------------- no stale write accepted ----
  const lastAccepted = new Map();
  const refusedBy = new Map(); // `${p}.${inc}.${wid}` of a refused write → the accepted write that refused it
  let staleCaught = 0;
  let refusedWhileValid = 0;
  for (const w of storeWrites) {
    counts['no-stale-write-accepted'].checked += 1;
    const fence = BigInt(w.fence);
    const last = lastAccepted.get(w.key);
    if (!w.ok && last && w.wid !== undefined) refusedBy.set(`${w.p}.${w.inc}.${w.wid}`, last);
    if (w.ok) {
      if (last && (fence < last.fence || (fence === last.fence && w.lease !== last.lease))) {
        violate('no-stale-write-accepted', `key ${w.key}: the store accepted fence ${fence} of lease ${w.lease} after fence ${last.fence} of lease ${last.lease}`, { key: w.key, from: w.at - 2000, to: w.at + 1 });
      }
      if (!last || fence >= last.fence) lastAccepted.set(w.key, { fence, lease: w.lease });
    }
  }
  for (const w of writes) {
    if (w.ok) continue;
    if (w.validBefore) refusedWhileValid += 1;
    else staleCaught += 1;
  }

  // ---------------------------------------------- every acquire settles in its bound ----
  const bound = run.waitTimeoutMs + run.commandTimeoutMs
    + (run.minReplicas > 0 ? run.replicaTimeoutMs + run.commandTimeoutMs : 0) + run.settleSlackMs;
  const settleMs = [];
  for (const s of starts.values()) {
    const end = ends.get(s.op);
    const died = killedAt.get(`${s.p}.${s.inc}`);
    if (!end) {
      // Its process was killed with it. The coordinator records the kill just before the
      // signal lands, so an acquire the process started in between is stamped after the
      // kill (seed 1617 with the probe: 22 µs after). Only an acquire already overdue when
      // its process died (not stopped meanwhile) is judged.
      if (died !== undefined && (died - s.at <= bound || stoppedSpans.some((sp) => sp.p === s.p && sp.from < died && sp.to > s.at))) continue;
      counts['every-acquire-settles-in-bound'].checked += 1;
      violate('every-acquire-settles-in-bound', `acquire ${s.op} on ${s.key} never settled`, { key: s.key, from: s.at - 500, to: s.at + bound });
      continue;
    }
    counts['every-acquire-settles-in-bound'].checked += 1;
    const took = end.at - s.at;
    if (stoppedSpans.some((sp) => sp.p === s.p && sp.from < end.at && sp.to > s.at)) continue; // its process was SIGSTOPped
    settleMs.push(took);
    if (took > bound) violate('every-acquire-settles-in-bound', `acquire ${s.op} on ${s.key} settled after ${took.toFixed(0)} ms (bound ${bound} ms)`, { key: s.key, from: s.at, to: end.at + 1 });
  }

  // ------------------------------------------------------ recovery after the last fault ----
  const grantsByTime = [...leases.values()].sort((a, b) => a.grantAt - b.grantAt);
  const firstGrantAfter = (t) => grantsByTime.find((l) => l.startAt >= t)?.grantAt;
  let finalRecoveryMs = null;
  counts['recovery-after-last-fault'].checked += 1;
  if (finalHealAt === null) violate('recovery-after-last-fault', 'the run never healed every fault', null);
  else {
    const g = firstGrantAfter(finalHealAt);
    finalRecoveryMs = g === undefined ? null : g - finalHealAt;
    if (finalRecoveryMs === null || finalRecoveryMs > run.recoveryBoundMs) {
      violate('recovery-after-last-fault', `no lease within ${run.recoveryBoundMs} ms after the last fault was healed (${finalRecoveryMs === null ? 'none at all' : `${finalRecoveryMs.toFixed(0)} ms`})`, { from: finalHealAt - 1000, to: finalHealAt + run.recoveryBoundMs });
    }
  }
  const recoveries = {};
  for (const h of heals) {
    const g = firstGrantAfter(h.at);
    if (g === undefined) continue;
    (recoveries[h.kind] ??= []).push(g - h.at);
  }

  // ----------------------------------------------------------------- clean exits ----
  for (const x of exits) {
    if (x.killedByNemesis) continue;
    counts['clean-exits-no-keys-left'].checked += 1;
    const sd = shutdowns.find((s) => s.p === x.p && s.inc === x.inc);
    if (!sd || !sd.ok || x.code !== 0) {
      violate('clean-exits-no-keys-left', `process ${x.p}.${x.inc} ended with code ${x.code ?? x.signal}${sd ? (sd.ok ? '' : `, shutdown rejected ${sd.err?.code}`) : ', no shutdown recorded'}${x.forced ? ' (did not exit on its own)' : ''}`, { p: x.p, from: x.at - 5000, to: x.at + 1 });
    }
  }
  counts['clean-exits-no-keys-left'].checked += 1;
  if (lockKeysLeft !== 0) violate('clean-exits-no-keys-left', `${lockKeysLeft ?? 'unknown'} lock keys left in Redis after every process shut down`, null);

  // ------------------------------------------------------ only the contract's codes ----
  const codes = {};
  for (const { call, e } of errors) {
    counts['only-contract-error-codes'].checked += 1;
    const code = e.err?.code;
    const tag = `${call}:${code ?? e.err?.name}`;
    codes[tag] = (codes[tag] ?? 0) + 1;
    const allowed = ALLOWED[call].has(code) || (call === 'acquire' && code === 'SHUT_DOWN' && e.stopping);
    const shaped = !REDIS_CAUSE.has(code) || e.err?.cause?.plugin === 'dokebi-redis';
    if (!e.err?.lockError || !allowed || !shaped) {
      violate('only-contract-error-codes', `${call} rejected with ${code ?? e.err?.name}${e.err?.lockError ? '' : ' (not a LockError)'}${shaped ? '' : ' without a dokebi-redis cause'}`, { p: e.p, from: e.at - 300, to: e.at + 1 });
    }
  }

  // ----------------------------------------- no lease lost after an announced switch ----
  if (run.mode === 'sentinel') {
    for (const l of leases.values()) {
      // The latest switch announced before this acquire started, if it started well after it.
      const s = switches.findLast((x) => x.at < l.startAt);
      if (!s || l.startAt - s.at <= run.switchToleranceMs || l.startAt - s.at > 15_000) continue;
      counts['no-lease-lost-after-announced-switch'].checked += 1;
      if (!l.lost) continue;
      if (lossBetween(l.startAt, l.end + 1000, l.key)) { counts['no-lease-lost-after-announced-switch'].documented += 1; continue; }
      violate('no-lease-lost-after-announced-switch', `lease ${l.op} on ${l.key} (fence ${l.fence}) started ${(l.startAt - s.at).toFixed(0)} ms after Sentinel ${s.by[0]} announced the switch ${s.from}→${s.to}, and was lost: ${l.lost.how}`, { key: l.key, from: s.at - 100, to: l.grantAt + 1 });
    }
  }

  // ------------------------------------ Cluster: no lease lost outside a shard failover ----
  // A Cluster announces nothing a driver follows: the slot map moves by MOVED and refreshes.
  // So every lease is judged, and a lost one is excused only by a loss fault on its own
  // key's shard while it lived (the Sentinel rule with minReplicas 0, per shard). With
  // minReplicas 1 (every replica) a lost fence is never excused, above.
  if (run.mode === 'cluster') {
    for (const l of leases.values()) {
      counts['no-lease-lost-outside-a-shard-failover'].checked += 1;
      if (!l.lost) continue;
      if (lossBetween(l.startAt, l.end + 1000, l.key)) { counts['no-lease-lost-outside-a-shard-failover'].documented += 1; continue; }
      violate('no-lease-lost-outside-a-shard-failover', `lease ${l.op} on ${l.key} (fence ${l.fence}) was lost with no failover of its shard while it lived: ${l.lost.how}`, { key: l.key, from: l.startAt - 500, to: (Number.isFinite(l.lost.at) ? l.lost.at : l.grantAt) + 1 });
    }
  }

  // ---------------------------------------------------------------- the lease signal ----
  // Holders that obey their signal skip a write once it aborted (decision 0156). (a) A write
  // by one of them after the abort is a violation; (b) a write the fence refused although
  // the signal had not aborted is a loss the signal missed, counted by cause; (c) a skip
  // whose lease had been superseded (a higher fence granted) or was over by its deadline
  // is a stale write the signal prevented before the fence had to stop it.
  let signalStats = null;
  if ([...leases.values()].some((l) => l.obeys !== undefined)) {
    const group = () => ({ leases: 0, keepAlive: 0, writes: 0, accepted: 0, fenced: 0, fencedAborted: 0, acceptedAborted: 0, fencedUnaborted: { total: 0, byCause: {} } });
    const obeying = { ...group(), skips: { total: 0, byReason: {} }, prevented: { total: 0, storeHadNewer: 0, supersededNotYetWritten: 0, overNoNewerHolder: 0 }, skipsNotStale: { total: 0, byReason: {} }, writesAfterAbort: 0 };
    const ignoring = group();
    const of = (l) => (l.obeys ? obeying : ignoring);
    for (const l of leases.values()) {
      if (l.obeys === undefined) continue;
      of(l).leases += 1;
      if (l.keepAlive) of(l).keepAlive += 1;
    }
    const bump = (o, k) => { o[k] = (o[k] ?? 0) + 1; };
    const causeOf = (w, l) => {
      const by = refusedBy.get(`${w.p}.${w.inc}.${w.wid}`);
      const b = by && leases.get(by.lease);
      // The checker's end of the lease (deadline, release, the driver's word) came before
      // the signal was read: it should have aborted. Expected never; the history tells.
      if (w.checkedAt > l.end) return 'lease over before the write by the checker\'s clock';
      if (w.storeAt > l.end) return 'lease ended while the write was in flight';
      const kind = lossKindBetween(Math.min(l.startAt, b?.startAt ?? Infinity), w.storeAt ?? w.at, l.key);
      // Fence drawn again: the refusing lease was granted first (a promoted replica's
      // counter behind); granted again: the key went to another holder while this one held it.
      if (kind) return `${kind}: ${b && b.grantAt < l.grantAt ? 'fence drawn again' : 'key granted again'}`;
      if (b && b.grantAt < l.end && l.end - b.grantAt <= (run.clockDriftMs ?? 0)) return 'wall-clock drift';
      return 'unexplained';
    };
    for (const w of writes) {
      const l = leases.get(w.op);
      if (!l || l.obeys === undefined) continue;
      const g = of(l);
      g.writes += 1;
      if (w.ok) g.accepted += 1; else g.fenced += 1;
      if (w.aborted && w.ok) g.acceptedAborted += 1;
      if (w.aborted && !w.ok) g.fencedAborted += 1;
      if (!w.aborted && !w.ok) { g.fencedUnaborted.total += 1; bump(g.fencedUnaborted.byCause, causeOf(w, l)); }
      if (l.obeys) {
        counts['no-write-after-signal-aborted'].checked += 1;
        if (w.aborted) {
          obeying.writesAfterAbort += 1;
          violate('no-write-after-signal-aborted', `lease ${w.op} on ${w.key} (fence ${l.fence}) wrote after its signal aborted (${w.reason}): its holder obeys the signal`, { key: w.key, from: l.grantAt, to: w.at + 1 });
        }
      }
    }
    for (const s of skips) {
      const l = leases.get(s.op);
      if (!l) continue;
      obeying.skips.total += 1;
      bump(obeying.skips.byReason, s.reason ?? 'none');
      const storeHadNewer = storeWrites.some((x) => x.ok && x.key === l.key && x.at <= s.at && BigInt(x.fence) > l.fence);
      const superseded = (byKey.get(l.key) ?? []).some((b) => b !== l && b.fence > l.fence && b.grantAt <= s.at);
      if (storeHadNewer) obeying.prevented.storeHadNewer += 1;
      else if (superseded) obeying.prevented.supersededNotYetWritten += 1;
      // Past its deadline with no newer holder yet: a stale write the store would still
      // have taken (no higher fence to compare with), so only the signal stops it.
      else if (s.at >= l.expiresAt) obeying.prevented.overNoNewerHolder += 1;
      else { obeying.skipsNotStale.total += 1; bump(obeying.skipsNotStale.byReason, s.reason ?? 'none'); continue; }
      obeying.prevented.total += 1;
    }
    const abortReasons = {};
    for (const l of leases.values()) if (l.abortCode !== null) bump(abortReasons, l.abortCode);
    signalStats = { obeyShare: 0.5, obeying, ignoring, abortReasons };
  }

  // ------------------------------------------------------------------ silent cuts ----
  // A flow a NAT dropped is dead for good: every connection the driver holds is watched
  // (CONTRACT.md "Connection liveness"), so each must be given up within the nemesis's watch
  // (15 s: 10x what an idle flow needs with pingIntervalMs 500 and commandTimeoutMs 1000); a
  // flow never given up is a connection the driver holds dead. Cuts the final heal ended before their watch ran out are not judged.
  const silentCuts = silentCutStats({
    faults, heals, healAt, givenUp, deadEvents, logs: events.filter((e) => e.k === 'log'), errors, killedAt, stoppedSpans, run,
    judge: (c, f) => {
      counts['silent-cut-flows-given-up'].checked += 1;
      violate('silent-cut-flows-given-up', `flow ${f.flow} (${f.use}) of process ${f.p}.${f.inc}, dropped silently${c.reset ? ' (RST to the next packet)' : ''} by fault ${c.id}, was still held ${((healAt.get(c.id) ?? c.at) - c.at).toFixed(0)} ms later`, { p: f.p, from: c.at - 200, to: (healAt.get(c.id) ?? c.at) + 1 });
    },
    pass: () => { counts['silent-cut-flows-given-up'].checked += 1; },
  });

  const unexplainedStalls = stalls.filter((e) => !stoppedSpans.some((sp) => sp.p === e.p && sp.from <= e.at && sp.to >= e.at - e.ms));
  const lost = [...leases.values()].filter((l) => l.lost);
  const faultsByKind = {};
  for (const f of faults) faultsByKind[f.kind] = (faultsByKind[f.kind] ?? 0) + 1;
  const stats = {
    acquisitions: { started: starts.size, granted: leases.size, failed: [...ends.values()].filter((e) => e.k === 'acq-fail').length },
    errorCodes: codes,
    writes: { sent: writes.length, accepted: writes.filter((w) => w.ok).length, staleWritersCaught: staleCaught, refusedWhileValid },
    leasesLost: { total: lost.length },
    faultsByKind,
    switches: switches.length,
    overlapsWithinClockDrift: withinClockDrift,
    clockDriftMs: run.clockDriftMs ?? 0,
    switchAnnouncementSpreadMs: spreadOf(announcements, switches),
    settleMs: summary(settleMs),
    acquireBoundMs: bound,
    finalRecoveryMs,
    recoveryAfterHealMs: Object.fromEntries(Object.entries(recoveries).map(([k, v]) => [k, summary(v)])),
    signal: signalStats,
    silentCuts,
    // Stretches of 0.5 s or more in which a process's event loop did not run, the nemesis's
    // SIGSTOPs left out (not judged).
    eventLoopStalls: {
      n: unexplainedStalls.length,
      longest: [...unexplainedStalls].sort((a, b) => b.ms - a.ms).slice(0, 5)
        .map((e) => ({ who: e.p === 'coordinator' ? 'coordinator' : `${e.p}.${e.inc}`, atS: Number(((e.at - (runStartAt ?? 0)) / 1000).toFixed(1)), ms: Number(e.ms.toFixed(0)) })),
    },
    gaps: gapStats({
      t0: runStartAt ?? events[0]?.at ?? 0, grants: [...leases.values()].map((l) => l.grantAt), probeEvents, minReplicas: run.minReplicas,
      acqFails: [...ends.values()].filter((e) => e.k === 'acq-fail'), logs: events.filter((e) => e.k === 'log'),
      announcements, faults, healAt, switches,
    }),
  };
  stats.leasesLost.byHow = countBy(lost, (l) => l.lost.how.replace(/[\d.]+/g, 'N').replace(/lease \S+/g, 'lease X'));
  return { ok: violations.length === 0, counts, violations, stats, events };
}

// ----------------------------------------------------------------- silent cuts ----
// net-silent-cut (nemesis.mjs): a proxy dropped the flows open through it without a word, or
// with a RST to the next packet. Two times per cut, from the cut:
// - noticed: per process holding a dropped flow, the driver's first sign in that process:
//   deadConnections rose (a liveness PING went unanswered: `dead` events), the warn
//   LOCK_NOTIFY_UNAVAILABLE (a subscription failed), or a call that failed with the cause
//   COMMAND_TIMEOUT or CONNECTION_LOST (a command out on the flow). Under other faults at the
//   same time the sign may be theirs: `alone` counts only cuts with no other fault active
//   until the sign.
// - given up: per flow, when its client closed it or met the RST (the proxy saw it): the
//   driver no longer holds it.
// Judged: flows whose process is known and was neither stopped nor killed before it gave the
// flow up (a stopped process finds nothing; a killed one closes every socket).

const NOTICED_CAUSES = new Set(['COMMAND_TIMEOUT', 'CONNECTION_LOST']);
/**
 * A sign may reach the history after the last flow was given up (the fault's heal): the
 * driver counts a dead connection once it replaced it, the client reads the count every
 * 20 ms, and the event crosses IPC on a busy machine.
 */
const SIGN_AFTER_HEAL_MS = 250;

function silentCutStats({ faults, heals, healAt, givenUp, deadEvents, logs, errors, killedAt, stoppedSpans, run, judge = () => {}, pass = () => {} }) {
  const cuts = faults.filter((f) => f.kind === 'net-silent-cut');
  if (cuts.length === 0) return null;
  const out = {
    pingIntervalMs: run.pingIntervalMs ?? null, commandTimeoutMs: run.commandTimeoutMs,
    cuts: cuts.length, withReset: cuts.filter((c) => c.reset).length, cutsWithFlows: 0,
    flows: 0, flowsByUse: {}, unowned: 0, excused: { processStopped: 0, processKilled: 0 }, judged: 0,
    givenUp: 0, givenUpHow: {}, notGivenUp: 0, cutShortByTheEnd: 0,
    noticed: { judged: 0, by: {}, none: 0 },
    noticedMs: null, givenUpMs: null,
    deadConnections: deadEvents.reduce((n, e) => n + (e.total - (e.was ?? 0)), 0),
    slowest: [],
  };
  // Each sign: [at, p.inc, what].
  const signs = [
    ...deadEvents.map((e) => [e.at, `${e.p}.${e.inc}`, 'deadConnections']),
    ...logs.filter((e) => e.code === 'LOCK_NOTIFY_UNAVAILABLE').map((e) => [e.at, `${e.p}.${e.inc}`, 'LOCK_NOTIFY_UNAVAILABLE']),
    ...errors.filter(({ e }) => NOTICED_CAUSES.has(e.err?.cause?.code))
      .map(({ call, e }) => [e.endAt ?? e.at, `${e.p}.${e.inc}`, `${call} ${e.err.cause.code}`]),
  ].sort((a, b) => a[0] - b[0]);
  const healOf = new Map(heals.map((h) => [h.id, h]));
  const series = () => ({ all: [], alone: [], silent: [], reset: [], subscription: [], commands: [] });
  const noticed = series();
  const gone = series();
  const rows = [];
  for (const c of cuts) {
    const flows = c.flows ?? [];
    if (flows.length > 0) out.cutsWithFlows += 1;
    const until = healAt.get(c.id) ?? Infinity;
    const judgedProcs = new Map(); // p.inc → its judged flows' uses
    for (const f of flows) {
      out.flows += 1;
      out.flowsByUse[f.use] = (out.flowsByUse[f.use] ?? 0) + 1;
      const g = givenUp.find((x) => x.id === c.id && x.flow === f.flow);
      const end = g?.at ?? until;
      if (f.p === null || f.p === undefined) { out.unowned += 1; continue; }
      const killed = killedAt.get(`${f.p}.${f.inc}`);
      if (killed !== undefined && killed >= c.at && killed <= end) { out.excused.processKilled += 1; continue; }
      if (stoppedSpans.some((sp) => sp.p === f.p && sp.from < end && sp.to > c.at)) { out.excused.processStopped += 1; continue; }
      out.judged += 1;
      const key = `${f.p}.${f.inc}`;
      if (!judgedProcs.has(key)) judgedProcs.set(key, new Set());
      judgedProcs.get(key).add(f.use);
      if (!g) {
        // The heal says whether the watch ran out or the run's end cut it short.
        if ((healOf.get(c.id)?.ended ?? 'watch') !== 'watch') { out.cutShortByTheEnd += 1; continue; }
        out.notGivenUp += 1;
        judge(c, f);
        rows.push({ cut: c.id, flow: f.flow, use: f.use, p: f.p, reset: c.reset, givenUpMs: null });
        continue;
      }
      pass(c, f);
      out.givenUp += 1;
      out.givenUpHow[g.how] = (out.givenUpHow[g.how] ?? 0) + 1;
      const ms = g.at - c.at;
      for (const k of ['all', c.reset ? 'reset' : 'silent', f.use]) gone[k]?.push(ms);
      rows.push({ cut: c.id, flow: f.flow, use: f.use, p: f.p, reset: c.reset, how: g.how, givenUpMs: Number(ms.toFixed(1)) });
    }
    for (const [proc, uses] of judgedProcs) {
      out.noticed.judged += 1;
      const sign = signs.find(([at, pi]) => pi === proc && at >= c.at && at <= until + SIGN_AFTER_HEAL_MS);
      if (!sign) { out.noticed.none += 1; continue; }
      out.noticed.by[sign[2]] = (out.noticed.by[sign[2]] ?? 0) + 1;
      const ms = sign[0] - c.at;
      const alone = !faults.some((f) => f !== c && f.at < sign[0] && (healAt.get(f.id) ?? Infinity) > c.at);
      const use = uses.has('commands') ? 'commands' : 'subscription';
      for (const k of ['all', c.reset ? 'reset' : 'silent', use, ...(alone ? ['alone'] : [])]) noticed[k].push(ms);
    }
  }
  const withMin = (v) => (v.length === 0 ? { n: 0 } : { min: Number(Math.min(...v).toFixed(1)), ...summary(v) });
  const sum = (x) => Object.fromEntries(Object.entries(x).map(([k, v]) => [k, withMin(v)]));
  out.noticedMs = sum(noticed);
  out.givenUpMs = sum(gone);
  out.slowest = rows.sort((a, b) => (b.givenUpMs ?? Infinity) - (a.givenUpMs ?? Infinity)).slice(0, 5);
  return out;
}

/** The silent cuts' figures as lines of the run's text report. */
export function formatSilentCuts(sc) {
  if (!sc) return ['silent cuts: none in this run'];
  const ms = (x) => (x?.n ? `min ${x.min} / median ${x.p50} / max ${x.max} ms (n ${x.n})` : '—');
  const by = (o) => Object.entries(o).map(([k, n]) => `${k} ${n}`).join(', ') || 'none';
  const series = (x) => [
    `    silent: ${ms(x.silent)}; with a RST: ${ms(x.reset)}`,
    `    holding a command flow: ${ms(x.commands)}; subscriptions only: ${ms(x.subscription)}`,
  ];
  return [
    `silent cuts (pingIntervalMs ${sc.pingIntervalMs}, commandTimeoutMs ${sc.commandTimeoutMs}): ${sc.cuts} (${sc.withReset} answering with a RST), ${sc.cutsWithFlows} with open flows; ${sc.flows} flows dropped (${by(sc.flowsByUse)}), ${sc.judged} judged (${sc.unowned} of no known process, ${sc.excused.processStopped} of a stopped and ${sc.excused.processKilled} of a killed process left out)`,
    `  noticed by the driver (per process): ${sc.noticed.judged - sc.noticed.none} of ${sc.noticed.judged} (${by(sc.noticed.by)}); cut → noticed: ${ms(sc.noticedMs.all)}`,
    `    with no other fault active: ${ms(sc.noticedMs.alone)}`,
    ...series(sc.noticedMs),
    `  given up by the client (per flow): ${sc.givenUp} of ${sc.judged} (${by(sc.givenUpHow)}; held past the watch: ${sc.notGivenUp}; watch cut short by the run's end: ${sc.cutShortByTheEnd}); cut → given up: ${ms(sc.givenUpMs.all)}`,
    ...series(sc.givenUpMs),
    `  deadConnections rose by ${sc.deadConnections} in the run (all causes)`,
  ];
}

// ------------------------------------------------------------------------ gaps ----
// Whose delay is a stretch without leases (issue 23 item 3, the seed-1617 question)? The
// drivers' longest gaps between two granted leases (any key, any process) and, with a probe,
// its longest gaps between two successful writes, each set beside the other series over the
// same window: a gap the probe shared is the servers' and Sentinels' (no client could
// write), a gap while the probe kept writing is the driver's.

/** How many of the longest gaps of each series the summary lists. */
const GAPS_LISTED = 5;
/** A gap longer than this counts as "down" in a window's downShare (the probe writes every 50 ms). */
const DOWN_MS = 500;
/** How many of the cluster views inside a gap its row shows. */
const VIEWS_LISTED = 8;

/** The intervals between consecutive times, longest first. */
function intervals(times) {
  const t = [...times].sort((a, b) => a - b);
  const out = [];
  for (let i = 1; i < t.length; i++) out.push({ from: t[i - 1], to: t[i], ms: t[i] - t[i - 1] });
  return out;
}

/** The other series over [from, to]: successes inside, its longest gap overlapping, how much of the window its gaps > DOWN_MS cover. */
function overlapOf(gaps, times, from, to, t0) {
  const r1 = (x) => Number(x.toFixed(1));
  const over = gaps.filter((g) => g.from < to && g.to > from);
  const longest = over.reduce((a, g) => (!a || g.ms > a.ms ? g : a), null);
  const down = over.filter((g) => g.ms > DOWN_MS).reduce((s, g) => s + Math.min(g.to, to) - Math.max(g.from, from), 0);
  return {
    okWithin: times.filter((t) => t > from && t < to).length,
    longestOverlappingMs: longest ? r1(longest.ms) : null,
    longestOverlapping: longest ? { fromS: r1((longest.from - t0) / 1000), toS: r1((longest.to - t0) / 1000) } : null,
    downShare: to > from ? Number((down / (to - from)).toFixed(3)) : null,
  };
}

function gapStats({ t0, grants, probeEvents, minReplicas, acqFails, logs, announcements, faults, healAt, switches = [] }) {
  const r1 = (x) => Number(x.toFixed(1));
  // A storm of flip-flops (seed 1617's first ten-minute run: about one switch a second for
  // 10 s): the most switches in any 10 s.
  let storm = { n: 0 };
  for (let i = 0, j = 0; j < switches.length; j++) {
    while (switches[j].at - switches[i].at > 10_000) i += 1;
    if (j - i + 1 > storm.n) storm = { n: j - i + 1, fromS: r1((switches[i].at - t0) / 1000), toS: r1((switches[j].at - t0) / 1000) };
  }
  const within = (list, from, to) => list.filter((e) => e.at > from && e.at < to);
  const tally = (list, f) => countBy(list, f);
  const faultsIn = (from, to) => tally(faults.filter((f) => f.at < to && (healAt.get(f.id) ?? Infinity) > from), (f) => f.kind);
  // The primaries the Sentinels announced inside the window, in order (each switch once).
  const announcedTo = (from, to) => within(announcements, from, to).map((a) => a.to).filter((p, i, all) => i === 0 || all[i - 1] !== p);
  // With a probe, the coordinator's view of the cluster (what each Sentinel named, each data
  // node's ROLE), recorded when it changed: the one in force at the window's start, then each
  // change inside it (at most VIEWS_LISTED, the first and the last ones).
  const views = probeEvents.filter((e) => e.ev === 'view');
  const viewsIn = (from, to) => {
    if (views.length === 0) return undefined;
    const first = views.findLast((e) => e.at <= from);
    const inside = within(views, from, to);
    const all = [...(first ? [first] : []), ...inside].map((e) => `+${r1((e.at - t0) / 1000)}s ${e.view}`);
    const shown = all.length <= VIEWS_LISTED ? all : [...all.slice(0, VIEWS_LISTED / 2), `… ${all.length - VIEWS_LISTED} more …`, ...all.slice(-VIEWS_LISTED / 2)];
    return { changes: inside.length, shown };
  };
  const context = (from, to) => ({
    announcements: within(announcements, from, to).length,
    announcedTo: announcedTo(from, to),
    faults: faultsIn(from, to),
    cluster: viewsIn(from, to),
  });
  const grantGaps = intervals(grants);
  const probeWrites = probeEvents.filter((e) => e.ev === 'write');
  const okTimes = probeWrites.filter((e) => e.ok).map((e) => e.at);
  // With minReplicas, the driver hands out a lease only once replicas acknowledged it: the
  // probe's writes that WAIT confirmed on as many replicas are the fair comparison.
  const replicatedTimes = minReplicas > 0 ? probeWrites.filter((e) => e.ok && e.acks >= minReplicas).map((e) => e.at) : null;
  const probeGaps = intervals(okTimes);
  const replicatedGaps = replicatedTimes ? intervals(replicatedTimes) : null;
  const hasProbe = probeWrites.length > 0;

  const leases = {
    granted: grants.length,
    longest: [...grantGaps].sort((a, b) => b.ms - a.ms).slice(0, GAPS_LISTED).map((g) => ({
      fromS: r1((g.from - t0) / 1000), toS: r1((g.to - t0) / 1000), ms: r1(g.ms),
      // Where the probe's writes inside went: a primary the drivers held off from
      // (decision 0051) or one the Sentinels had not named yet shows here.
      probe: hasProbe ? { ...overlapOf(probeGaps, okTimes, g.from, g.to, t0), ports: tally(within(probeWrites, g.from, g.to).filter((e) => e.ok), (e) => e.port) } : undefined,
      probeReplicated: hasProbe && replicatedGaps ? overlapOf(replicatedGaps, replicatedTimes, g.from, g.to, t0) : undefined,
      acquiresFailed: tally(within(acqFails, g.from, g.to), (e) => [e.err?.code, e.err?.cause?.code, e.err?.cause?.serverCode].filter(Boolean).join('/')),
      driverLogs: tally(within(logs, g.from, g.to), (e) => `${e.level}:${e.code}`),
      ...context(g.from, g.to),
    })),
  };
  if (!hasProbe) return { t0: 'run-start', downMs: DOWN_MS, switchesMostIn10s: storm, leases, probe: null };

  const portAt = (t, dir) => (dir < 0 ? probeWrites.findLast((e) => e.at <= t && e.ok) : probeWrites.find((e) => e.at >= t && e.ok))?.port ?? null;
  const probeRow = (g, gapsOther, timesOther) => ({
    fromS: r1((g.from - t0) / 1000), toS: r1((g.to - t0) / 1000), ms: r1(g.ms),
    portBefore: portAt(g.from, -1), portAfter: portAt(g.to, 1),
    writesFailed: tally(within(probeWrites, g.from, g.to).filter((e) => !e.ok), (e) => e.err?.msg ?? 'unknown'),
    writesUnreplicated: minReplicas > 0 ? within(probeWrites, g.from, g.to).filter((e) => e.ok && !(e.acks >= minReplicas)).length : undefined,
    clientErrors: tally(within(probeEvents.filter((e) => e.ev === 'error'), g.from, g.to), (e) => e.err?.msg ?? 'unknown'),
    leases: overlapOf(gapsOther, timesOther, g.from, g.to, t0),
    ...context(g.from, g.to),
  });
  const failed = probeWrites.filter((e) => !e.ok);
  const probe = {
    client: 'ioredis',
    writes: { sent: probeWrites.length, ok: okTimes.length, failed: failed.length, replicated: replicatedTimes?.length },
    failures: tally(failed, (e) => e.err?.msg ?? 'unknown'),
    primaries: new Set(probeWrites.filter((e) => e.ok && e.port).map((e) => e.port)).size,
    // Its connection to a primary became ready (the first, then each reconnection), and errors
    // of its failover detector's Sentinel connections (ioredis prints them; the probe records them).
    connections: { ready: probeEvents.filter((e) => e.ev === 'ready').length, sentinelErrors: probeEvents.filter((e) => e.ev === 'sentinel-error').length },
    longest: [...probeGaps].sort((a, b) => b.ms - a.ms).slice(0, GAPS_LISTED).map((g) => probeRow(g, grantGaps, grants)),
    longestReplicated: replicatedGaps
      ? [...replicatedGaps].sort((a, b) => b.ms - a.ms).slice(0, GAPS_LISTED).map((g) => probeRow(g, grantGaps, grants))
      : undefined,
  };
  return { t0: 'run-start', downMs: DOWN_MS, switchesMostIn10s: storm, leases, probe };
}

/** The gaps, side by side, as lines of the run's text report. */
export function formatGaps(gaps) {
  if (!gaps) return ['gaps: not recorded'];
  const span = (x) => `+${x.fromS.toFixed(1)}s…+${x.toS.toFixed(1)}s`;
  const share = (x) => (x.downShare === null ? '—' : `${Math.round(x.downShare * 100)} %`);
  const tallied = (o) => Object.entries(o).sort((a, b) => b[1] - a[1]).map(([k, n]) => `${k} ${n}`).join(', ') || 'none';
  // The cluster's views inside a gap of 2 s or more (with a probe).
  const views = (g) => (g.cluster && g.ms >= 2000 ? g.cluster.shown.map((v) => `             ${v}`) : []);
  const st = gaps.switchesMostIn10s;
  const out = [`most switches in 10 s: ${st?.n ?? '—'}${st?.n ? ` (+${st.fromS.toFixed(1)}s…+${st.toS.toFixed(1)}s)` : ''}`, `longest gaps without a lease (drivers, ${gaps.leases.granted} granted)${gaps.probe ? ', and the ioredis probe over the same window' : ''}:`];
  for (const g of gaps.leases.longest) {
    out.push(`  ${String(g.ms.toFixed(0)).padStart(6)} ms ${span(g)}  faults: ${tallied(g.faults)}; announcements ${g.announcements}${g.announcedTo.length ? ` (to ${g.announcedTo.join('→')})` : ''}; acquires failed: ${tallied(g.acquiresFailed)}`);
    if (g.probe) {
      out.push(`           probe: ${g.probe.okWithin} writes ok inside${g.probe.okWithin ? ` (ports ${tallied(g.probe.ports)})` : ''}, its longest overlapping gap ${g.probe.longestOverlappingMs ?? '—'} ms, down ${share(g.probe)} of the window`
        + (g.probeReplicated ? `; replicated: ${g.probeReplicated.okWithin} ok, longest ${g.probeReplicated.longestOverlappingMs ?? '—'} ms, down ${share(g.probeReplicated)}` : ''));
    }
    out.push(...views(g));
  }
  if (!gaps.probe) return out;
  const p = gaps.probe;
  out.push(`longest gaps without a write (ioredis probe: ${p.writes.ok} of ${p.writes.sent} writes ok${p.writes.replicated !== undefined ? `, ${p.writes.replicated} replicated` : ''}, on ${p.primaries} primaries), and the drivers over the same window:`);
  for (const [title, list] of [['writes', p.longest], ['replicated writes', p.longestReplicated]]) {
    if (!list) continue;
    out.push(`  ${title}:`);
    for (const g of list) {
      out.push(`  ${String(g.ms.toFixed(0)).padStart(6)} ms ${span(g)}  port ${g.portBefore}→${g.portAfter}; failed: ${tallied(g.writesFailed)}; faults: ${tallied(g.faults)}; announcements ${g.announcements}${g.announcedTo.length ? ` (to ${g.announcedTo.join('→')})` : ''}`);
      out.push(`           drivers: ${g.leases.okWithin} leases granted inside, their longest overlapping gap ${g.leases.longestOverlappingMs ?? '—'} ms, down ${share(g.leases)} of the window`);
      out.push(...views(g));
    }
  }
  return out;
}

/** The lease signal's figures as lines of the run's text report. */
export function formatSignal(sig) {
  if (!sig) return ['lease signal: not recorded in this history'];
  const causes = (c) => (c.total === 0 ? '0' : `${c.total} (${Object.entries(c.byCause).map(([k, n]) => `${k}: ${n}`).join('; ')})`);
  const reasons = (o) => Object.entries(o).map(([k, n]) => `${k} ${n}`).join(', ') || 'none';
  const { obeying: o, ignoring: i } = sig;
  return [
    `lease signal: ${o.leases} leases obeyed it (${o.keepAlive} with keepAlive), ${i.leases} ignored it`,
    `  obeying: ${o.writes} writes, ${o.skips.total} skipped (${reasons(o.skips.byReason)}); stale writes the signal prevented: ${o.prevented.total} (the store already had a newer fence: ${o.prevented.storeHadNewer}, a newer lease granted but not yet written: ${o.prevented.supersededNotYetWritten}, past the deadline with no newer holder: ${o.prevented.overNoNewerHolder}); skips of a lease not yet stale: ${o.skipsNotStale.total}`,
    `  obeying: writes after the signal aborted: ${o.writesAfterAbort} (must be 0); fenced with the signal not aborted: ${causes(o.fencedUnaborted)}`,
    `  ignoring: ${i.writes} writes, ${i.fenced} fenced: ${i.fencedAborted} with the signal already aborted (it would have prevented them), ${causes(i.fencedUnaborted)} not; ${i.acceptedAborted} accepted with the signal aborted (stale, no newer fence to stop them)`,
  ];
}

function countBy(items, f) {
  const out = {};
  for (const x of items) { const k = f(x); out[k] = (out[k] ?? 0) + 1; }
  return out;
}

function spreadOf(announcements, switches) {
  // How long after the first Sentinel the last one announced each switch: the window
  // a driver listening to only one Sentinel can lose.
  const spreads = switches.map((s) => {
    const same = announcements.filter((a) => a.from === s.from && a.to === s.to && a.at >= s.at && a.at - s.at < 10_000);
    return Math.max(...same.map((a) => a.at)) - s.at;
  });
  return summary(spreads);
}

export function summary(values) {
  if (values.length === 0) return { n: 0 };
  const v = [...values].sort((a, b) => a - b);
  const at = (p) => v[Math.min(v.length - 1, Math.max(0, Math.ceil((p / 100) * v.length) - 1))];
  const r = (x) => Number(x.toFixed(1));
  return { n: v.length, p50: r(at(50)), p95: r(at(95)), p99: r(at(99)), max: r(v.at(-1)) };
}

/** The events around a violation, for the report: same key (or process) and time span. */
export function excerpt(events, around, limit = 14) {
  if (!around) return [];
  const pad = 50;
  const pick = events.filter((e) => e.k !== 'probe' && e.k !== 'run-start' && e.at >= around.from - pad && e.at <= around.to + pad
    && (around.key === undefined || e.key === around.key || e.key === undefined)
    && (around.p === undefined || e.p === around.p || e.p === undefined));
  const interesting = pick.filter((e) => e.k !== 'store');
  if (interesting.length <= limit) return interesting;
  const keep = interesting.filter((e) => ['grant', 'release', 'fault', 'heal', 'announce', 'renew', 'stall'].includes(e.k));
  return (keep.length <= limit ? keep : [...keep.slice(0, limit / 2), ...keep.slice(-limit / 2)]);
}

export function formatEvent(e, t0) {
  const { k, at, ...rest } = e;
  const fields = Object.entries(rest).filter(([f, v]) => v !== undefined && !['inc'].includes(f))
    .map(([f, v]) => {
      if (f.endsWith('At') && typeof v === 'number') return `${f}=+${(v - t0).toFixed(1)}`; // same clock as `at`
      return `${f}=${typeof v === 'object' ? JSON.stringify(v) : typeof v === 'number' ? Number(v.toFixed(1)) : v}`;
    });
  return `  +${(at - t0).toFixed(1).padStart(9)} ms  ${k.padEnd(12)} ${fields.join(' ')}`;
}
