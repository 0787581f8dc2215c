// Hand-off stages: where the time between one holder's release and the next holder's
// acquire goes, when processes contend for one key (the workload of
// benchmarks/lock-contention.bench.mjs, 4 × 8 by default, this driver only).
//
//   node benchmarks/handoff-stages.mjs [--modes namespace,per-key] [--shape 4x8] [--seconds 4]
//
// DOKEBI_BENCH_PACKAGE=<package dir> runs another build. Redis's MONITOR stamps each command
// with the server's wall clock (µs); the workers stamp release called and acquire resolved
// with theirs (performance.timeOrigin + performance.now(), the same machine's clock). With
// one key, the first acquire script Redis runs after a release script is the one that wins
// the key, so each hand-off to another process splits into:
//   release: release called in JS → the release script runs in Redis,
//   notify:  the release script ran → the winner's acquire script runs (the notification
//            reaches the other process, which wakes and sends its attempt),
//   settle:  the acquire script ran → the acquire resolves in the winner's JS.
// MONITOR slows Redis a little; compare modes and builds within one run.

import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

import { childProcesses, contentionWorkers, here, monitorLines, nextMessage, parseOptions, parseShape, percentile, round, runMain } from './lib.mjs';

const now = () => performance.timeOrigin + performance.now();
const children = childProcesses();

/** MONITOR's EVALSHA lines until `stop()`: [server time ms, sha]. */
function monitor(port) {
  const seen = [];
  const lines = monitorLines(port, (line) => {
    const m = /^\+(\d+\.\d+) \[\d+ [^\]]+\] "evalsha" "([0-9a-f]{40})"/i.exec(line);
    if (m) seen.push([Number(m[1]) * 1000, m[2]]);
  });
  return { stop: () => { lines.stop(); return seen; } };
}

const stats = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return { p50: round(percentile(s, 50), 3), p90: round(percentile(s, 90), 3) };
};

async function probe(mode, shape, seconds, scripts) {
  const { startRedis } = await import('../__test__/helpers/redis.mjs');
  const server = await startRedis();
  try {
    const key = 'contention:stages';
    const procs = await contentionWorkers(children, { ...shape, mode, url: server.url, key });
    const startAt = now() + 150;
    const endAt = startAt + seconds * 1000;
    const results = procs.map((c) => nextMessage(c, 'result', seconds * 1000 + 60_000));
    const mon = monitor(server.port);
    for (const c of procs) c.send({ type: 'go', startAt, endAt });
    await sleep(Math.max(0, endAt - now()));
    const evals = mon.stop();
    const outs = await Promise.all(results);

    // Release scripts then the acquire that follows each: the acquire script's SHA is the one
    // that comes right after the other (its first use in the window is an attempt).
    const releaseSha = scripts.release, acquireSha = scripts.acquire;
    const served = [];
    for (let i = 0; i < evals.length; i++) {
      if (evals[i][1] !== releaseSha) continue;
      const next = evals.slice(i + 1).find(([, sha]) => sha === acquireSha || sha === releaseSha);
      if (next?.[1] === acquireSha) served.push({ releasedAt: evals[i][0], acquiredAt: next[0] });
    }
    const all = outs.flatMap((o) => o.records.map(([w, t0, t1, t2, t3]) => ({ proc: o.proc, w, t1, t2, t3 }))).sort((a, b) => a.t1 - b.t1);
    const stages = { gap: [], release: [], notify: [], settle: [] };
    for (let i = 1; i < all.length; i++) {
      const [prev, cur] = [all[i - 1], all[i]];
      if (cur.t1 < startAt + 200 || cur.t1 >= endAt || cur.proc === prev.proc) continue;
      // The release script that ran after prev's release was called, and the acquire after it.
      const s = served.find((x) => x.releasedAt >= prev.t2 && x.acquiredAt <= cur.t1);
      if (!s) continue;
      stages.gap.push(cur.t1 - prev.t2);
      stages.release.push(s.releasedAt - prev.t2);
      stages.notify.push(s.acquiredAt - s.releasedAt);
      stages.settle.push(cur.t1 - s.acquiredAt);
    }
    return {
      mode, shape: `${shape.processes}x${shape.waiters}`, seconds, handOffs: stages.gap.length,
      ms: Object.fromEntries(Object.entries(stages).map(([k, v]) => [k, stats(v)])),
    };
  } finally {
    await server.stop();
  }
}

async function main() {
  const v = parseOptions(process.argv.slice(2), {
    modes: { type: 'string', default: 'namespace,per-key' },
    shape: { type: 'string', default: '4x8' },
    seconds: { type: 'string', default: '4' },
  });
  const shape = parseShape(v.shape, '--shape');
  const { createHash } = await import('node:crypto');
  const { readFileSync } = await import('node:fs');
  const sha = (f) => createHash('sha1').update(readFileSync(path.join(here, '..', 'src', 'scripts', f))).digest('hex');
  const scripts = { acquire: sha('acquire.lua'), release: sha('release.lua') };
  for (const mode of v.modes.split(',')) {
    const out = await probe(mode, shape, Number(v.seconds), { ...scripts, release: mode === 'namespace' ? scripts.release : sha('release_keyed.lua') });
    console.log(JSON.stringify(out));
  }
}

runMain(main, children);
