// The fenced store of the mutual-exclusion check (docs/OPS-002.md), and the analysis of
// what it recorded.
//
// The store is three plain keys on its OWN redis-server (never the lock server, never
// faulted): one Lua script accepts a write only when its fence is at least the highest fence
// it accepted so far (equal: the same lease writing again), atomically, and appends every
// write — accepted or not — to a log in the order the store saw them.

/**
 * KEYS[1] highest accepted fence, KEYS[2] the write log (a list), KEYS[3] a sequence.
 * ARGV[1] fence (decimal string), ARGV[2] lease id, ARGV[3] kind ('begin' | 'end'),
 * ARGV[4] '1' when the lease said valid at the moment of the write.
 * Returns 1 when accepted, 0 when rejected. Fences are compared as decimal strings
 * (length, then lexicographically), never as Lua doubles.
 */
export const FENCED_WRITE = `
local last = redis.call('GET', KEYS[1])
local f = ARGV[1]
local ok
if not last then ok = true
elseif #f ~= #last then ok = #f > #last
else ok = f >= last end
if ok then redis.call('SET', KEYS[1], f) end
local seq = redis.call('INCR', KEYS[3])
redis.call('RPUSH', KEYS[2], cjson.encode({
  seq = seq, fence = f, lease = ARGV[2], kind = ARGV[3], valid = ARGV[4] == '1',
  accepted = ok, last = last or ''
}))
if ok then return 1 else return 0 end
`;

export const STORE_KEYS = ['store:last', 'store:writes', 'store:seq'];

/** Two holds' clocks (different processes) may disagree by this much; orders closer than it are "unknown". */
export const CLOCK_MARGIN_MS = 2;

const overlaps = (a, b) => a.tRes < b.tEnd && b.tRes < a.tEnd;

/**
 * Counts what the fences did. `holds`: one per lease, `{ lease, fence, tCall, tRes, tEnd }`
 * (tCall: acquire() called; tRes: it resolved; tEnd: the lease's last write returned; all
 * wall-clock ms). `writes`: the store's log, `{ seq, fence, lease, accepted, valid }`.
 *
 * - overlapping pair: two leases whose [tRes, tEnd] intervals intersect.
 * - caught: an overlapping pair where the lower-fence lease tried to write after the
 *   higher-fence lease's first accepted write, and the store rejected it.
 * - missed: an overlapping pair where the fences failed to order the two leases: equal
 *   fences; or the lease that was surely granted first (its acquire resolved before the
 *   other's acquire was even called) has the larger fence, so the stale holder would win;
 *   or a lower-fence write was accepted after a higher-fence write (a broken store).
 * - harmless: the other overlapping pairs (the older lease wrote nothing after the newer
 *   one's first write: there was nothing for the fences to stop).
 * - inversions / duplicateFences: the same fence checks over all pairs, overlapping or not.
 * - unexplainedRejections: rejected writes of a lease that is not the stale side of any
 *   caught pair (a rejection the overlap analysis cannot account for).
 */
export function analyze({ holds, writes }) {
  const byLease = new Map();
  for (const w of writes) {
    if (!byLease.has(w.lease)) byLease.set(w.lease, []);
    byLease.get(w.lease).push(w);
  }
  const firstAccepted = (lease) => {
    let min = Infinity;
    for (const w of byLease.get(lease) ?? []) if (w.accepted && w.seq < min) min = w.seq;
    return min;
  };
  const surelyFirst = (a, b) => a.tRes + CLOCK_MARGIN_MS < b.tCall;

  const out = {
    holds: holds.length,
    writes: writes.length,
    accepted: writes.filter((w) => w.accepted).length,
    rejected: writes.filter((w) => !w.accepted).length,
    rejectedWhileValid: writes.filter((w) => !w.accepted && w.valid).length,
    overlappingPairs: 0,
    caught: 0,
    harmless: 0,
    missed: 0,
    inversions: 0,
    duplicateFences: 0,
    details: { missed: [], caught: [] },
  };
  for (let i = 0; i < holds.length; i++) {
    for (let j = i + 1; j < holds.length; j++) {
      const a = holds[i];
      const b = holds[j];
      const fa = BigInt(a.fence);
      const fb = BigInt(b.fence);
      const duplicate = fa === fb;
      const inverted = (surelyFirst(a, b) && fa >= fb) || (surelyFirst(b, a) && fb >= fa);
      if (duplicate) out.duplicateFences += 1;
      if (inverted) out.inversions += 1;
      if (!overlaps(a, b)) continue;
      out.overlappingPairs += 1;
      const [lo, hi] = fa < fb ? [a, b] : [b, a];
      const hiFirst = firstAccepted(hi.lease);
      const stale = (byLease.get(lo.lease) ?? []).filter((w) => w.seq > hiFirst);
      const staleAccepted = !duplicate && stale.some((w) => w.accepted);
      if (duplicate || inverted || staleAccepted) {
        out.missed += 1;
        out.details.missed.push({ lo: lo.lease, hi: hi.lease, duplicate, inverted, staleAccepted });
      } else if (stale.some((w) => !w.accepted)) {
        out.caught += 1;
        out.details.caught.push({ stale: lo.lease, newer: hi.lease, rejected: stale.filter((w) => !w.accepted).length });
      } else {
        out.harmless += 1;
      }
    }
  }
  const stale = new Set(out.details.caught.map((c) => c.stale));
  out.unexplainedRejections = writes.filter((w) => !w.accepted && !stale.has(w.lease)).length;
  return out;
}
