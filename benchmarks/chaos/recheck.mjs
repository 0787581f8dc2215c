// Runs the checker again over a saved history: node benchmarks/chaos/recheck.mjs <summary.json> <history.jsonl>
// (a run writes them with --out and --history). The checker is a pure function of the
// history, so a fixed checker can judge an old run without running it again.

import { readFileSync } from 'node:fs';
import { check, excerpt, formatEvent, formatGaps, formatSignal, formatSilentCuts, INVARIANTS } from './checker.mjs';

const [summaryFile, historyFile] = process.argv.slice(2);
if (!summaryFile || !historyFile) {
  console.error('usage: node benchmarks/chaos/recheck.mjs <summary.json> <history.jsonl>');
  process.exit(2);
}
const s = JSON.parse(readFileSync(summaryFile, 'utf8'));
const history = readFileSync(historyFile, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
const run = {
  mode: s.mode, minReplicas: s.minReplicas, replicas: s.setup.replicas ?? (s.mode === 'sentinel' ? 2 : 0),
  leaseMs: s.setup.leaseMs, waitTimeoutMs: s.setup.waitTimeoutMs, commandTimeoutMs: s.setup.commandTimeoutMs,
  replicaTimeoutMs: s.setup.replicaTimeoutMs, switchToleranceMs: s.setup.switchToleranceMs ?? 250,
  settleSlackMs: 1500, recoveryBoundMs: 10_000, clockDriftMs: s.setup.clockDriftMs ?? 0, pingIntervalMs: s.setup.pingIntervalMs,
};
const v = check(history, run);
const t0 = Math.min(...history.map((e) => e.at));
console.log(JSON.stringify({
  rechecked: summaryFile, result: v.ok ? 'pass' : 'fail', invariants: v.counts, ...v.stats,
  violationsByInvariant: Object.fromEntries(INVARIANTS.map((n) => [n, v.counts[n].violations])),
  firstViolations: v.violations.slice(0, 10).map((x) => ({ invariant: x.invariant, detail: x.detail })),
}, null, 2));
console.log(`\n${formatSignal(v.stats.signal).join('\n')}`);
console.log(`\n${formatGaps(v.stats.gaps).join('\n')}`);
console.log(`\n${formatSilentCuts(v.stats.silentCuts).join('\n')}`);
for (const x of v.violations.slice(0, 6)) {
  console.log(`\n✗ ${x.invariant}: ${x.detail}`);
  for (const e of excerpt(v.events, x.around)) console.log(formatEvent(e, t0));
}
process.exitCode = v.ok ? 0 : 1;
