// Throughput A/B of two builds of this package under one harness: throughput.bench.mjs's
// uncontended acquire → release pairs (the dokebi configurations at 1, 64 and 256 in flight),
// run alternately for build A and build B in ABBA order, so drift on the shared machine falls
// on both. Reports per in-flight level the median of each build, the ratio of medians B / A,
// and B / A of each consecutive pair of runs, for pairs/s, JS-thread CPU per pair and the
// whole process's CPU per pair (every thread), and the other threads' (the addon's runtime).
//
//   node benchmarks/throughput-ab.mjs --a DIR --b DIR [--label-a before] [--label-b after]
//     [--rounds 4] [--seconds 2] [--keys distinct|reused] [--purpose TEXT] [--out DIR]
//
// DIR holds index.js, binding.js and lock-redis.linux-x64-gnu.node (a checkout or worktree
// after `npm run build`). A round is A B B A; each run is one throughput.bench.mjs --quick
// --only dokebi (discard rule off, so each run's other-CPU and steal shares are kept instead).
// Writes <date>-throughput-ab.{json,md} to --out (default: a temporary directory).

import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { buildInfo, buildLine, machineInfo, median, parseOptions, round, root, runStart } from './lib.mjs';

const o = parseOptions(process.argv.slice(2), {
  a: { type: 'string' },
  b: { type: 'string' },
  'label-a': { type: 'string', default: 'A' },
  'label-b': { type: 'string', default: 'B' },
  rounds: { type: 'string', default: '4' },
  seconds: { type: 'string', default: '2' },
  keys: { type: 'string', default: 'distinct' },
  purpose: { type: 'string', default: '' },
  out: { type: 'string' },
});
if (!o.a || !o.b) throw new Error('--a DIR and --b DIR are required');
if (!['distinct', 'reused'].includes(o.keys)) throw new Error('--keys is distinct or reused');
const rounds = Number(o.rounds);
const LEVELS = [1, 64, 256];
const METRICS = [
  ['pairsPerSec', 'pairs/s', (m) => m.pairsPerSec.median],
  ['jsCpuPerPairUs', 'JS-thread CPU per pair (µs)', (m) => m.jsCpuPerPairUs],
  ['cpuPerPairUs', 'process CPU per pair (µs)', (m) => m.cpuPerPairUs],
  // Every thread but the JS thread: the addon's runtime, and Node's own helpers (GC, libuv).
  ['otherThreadsCpuPerPairUs', "other threads' CPU per pair (µs)", (m) => m.otherThreadsCpuPerPairUs],
];

const start = runStart(import.meta.url);
const builds = { a: path.resolve(o.a), b: path.resolve(o.b) };
const label = { a: o['label-a'], b: o['label-b'] };
function runOnce(which) {
  const out = mkdtempSync(path.join(os.tmpdir(), `dokebi-ab-${which}-`));
  const args = ['benchmarks/throughput.bench.mjs', '--quick', '--only', 'dokebi', '--keys', o.keys, '--seconds', o.seconds,
    '--max-other-cpu', '1.5', '--retries', '0', '--out', out];
  execFileSync(process.execPath, args, { cwd: root, env: { ...process.env, DOKEBI_BENCH_PACKAGE: builds[which] }, stdio: ['ignore', 'ignore', 'inherit'] });
  const file = readdirSync(out).find((f) => f.endsWith('-throughput.json'));
  const result = JSON.parse(readFileSync(path.join(out, file), 'utf8'));
  const levels = {};
  for (const n of LEVELS) {
    const m = result.results[o.keys === 'reused' ? `dokebi-reused-${n}` : `dokebi-${n}`].medians;
    levels[n] = Object.fromEntries(METRICS.map(([key, , get]) => [key, round(get(m), 2)]));
    levels[n].failures = m.failures;
    levels[n].otherCpuShare = m.otherCpuShare;
    levels[n].stealShare = m.stealShare;
  }
  return { build: which, loadAverageBefore: os.loadavg().map((x) => round(x, 2)), levels };
}

const runs = [];
for (let r = 0; r < rounds; r++) {
  for (const which of ['a', 'b', 'b', 'a']) {
    runs.push(runOnce(which));
    console.error(`round ${r + 1}/${rounds}: ${label[which]} done`);
  }
}

// Consecutive runs of the two builds, in order: (A,B), (B,A), … — B / A of each.
const pairs = [];
for (let i = 0; i + 1 < runs.length; i += 2) {
  const [x, y] = [runs[i], runs[i + 1]];
  pairs.push(x.build === 'a' ? [x, y] : [y, x]);
}
const summary = {};
for (const n of LEVELS) {
  summary[n] = {};
  for (const [key] of METRICS) {
    const of = (which) => runs.filter((r) => r.build === which).map((r) => r.levels[n][key]);
    const [ma, mb] = [median(of('a')), median(of('b'))];
    summary[n][key] = {
      [label.a]: round(ma, 2), [label.b]: round(mb, 2),
      ratioOfMedians: round(mb / ma, 3),
      pairedRatios: pairs.map(([a, b]) => round(b.levels[n][key] / a.levels[n][key], 2)),
    };
  }
  summary[n].failures = runs.reduce((sum, r) => sum + r.levels[n].failures, 0);
}

const date = start.date;
const json = {
  benchmark: 'throughput-ab', date, purpose: o.purpose, command: start.commandLine,
  machine: { ...machineInfo(), loadAverageBefore: start.loadBefore.map((x) => round(x, 2)) },
  versions: { node: process.version, redisServer: execFileSync('redis-server', ['--version'], { encoding: 'utf8' }).trim(), '@dokebi/lock-redis': JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8')).version },
  builds: { [label.a]: buildInfo(builds.a), [label.b]: buildInfo(builds.b) },
  order: 'A B B A per round; pairedRatios are B / A of each consecutive pair of runs',
  summary, runs,
};
const dir = o.out ?? mkdtempSync(path.join(os.tmpdir(), 'dokebi-ab-'));
mkdirSync(dir, { recursive: true }); // a given --out that does not exist yet: hours of runs must not be lost at the end
const base = path.join(dir, `${date}-throughput-ab`);
writeFileSync(`${base}.json`, `${JSON.stringify(json, null, 1)}\n`);
const md = [
  `# Throughput A/B: ${label.a} → ${label.b}`, '', o.purpose, '',
  `Builds: ${buildLine(label.a, json.builds[label.a])}, ${buildLine(label.b, json.builds[label.b])}; ${rounds} rounds of A B B A, ${o.seconds} s windows, ${o.keys} keys. ${json.machine.cpu}, ${json.machine.cores} cores; Node ${process.version}; ${json.versions.redisServer.split(' ').slice(0, 3).join(' ')}.`,
  '', '    ' + start.commandLine, '',
  `| in flight | metric | ${label.a} (median) | ${label.b} (median) | ${label.b} / ${label.a} | paired ${label.b} / ${label.a} |`,
  '|---:|---|---:|---:|---:|---|',
  ...LEVELS.flatMap((n) => METRICS.map(([key, name]) => {
    const s = summary[n][key];
    return `| ${n} | ${name} | ${s[label.a]} | ${s[label.b]} | **${s.ratioOfMedians}** | ${s.pairedRatios.join(', ')} |`;
  })),
  '', `Failures: ${LEVELS.map((n) => `${n} in flight ${summary[n].failures}`).join(', ')}.`, '',
];
writeFileSync(`${base}.md`, md.join('\n'));
console.log(md.join('\n'));
console.log(`wrote ${path.relative(root, base)}.{json,md}`);
