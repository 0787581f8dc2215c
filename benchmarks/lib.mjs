// Helpers shared by the benchmarks (lock-contention, throughput and their workers):
// statistics, machine and version facts, CPU accounting from /proc.

import { execFileSync, fork } from 'node:child_process';
import { createHash } from 'node:crypto';
import { readFileSync, statSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

export const here = path.dirname(fileURLToPath(import.meta.url));
export const root = path.resolve(here, '..');

// ----------------------------------------------------------------- options ----

/**
 * A benchmark's command line by util.parseArgs (`options` in its format; values come back as
 * strings and booleans, `default`s applied), under the rules these scripts have always had:
 * only `--name value` and the `short` aliases given; `--name=value`, grouped short options,
 * `--`, positionals and names not in `options` throw `unknown argument <arg>`; a value may
 * start with a dash (`--seconds -1` reaches the script's own check, `--out --x` is a path);
 * the last of a repeated option wins. `help`, when given, is called at the first
 * `--help`/`-h` met before any unknown argument (it prints the usage and exits). A
 * value-taking option at the very end throws `<option> needs a value`, or with
 * `missingValue: 'undefined'` leaves that option undefined (what the older scripts did).
 * parseArgs runs with strict: false, and its tokens are checked here, because strict mode
 * rejects values that start with a dash, accepts `--name=value` and words its errors otherwise.
 */
export function parseOptions(argv, options, { help, missingValue = 'throw' } = {}) {
  const { values, tokens } = parseArgs({ args: argv, options, strict: false, allowPositionals: true, tokens: true });
  for (const t of tokens) {
    const arg = argv[t.index];
    if (t.kind !== 'option' || !Object.hasOwn(options, t.name) || t.inlineValue || arg !== t.rawName) throw new Error(`unknown argument ${arg}`);
    if (t.name === 'help' && help) help();
    if (options[t.name].type === 'string' && t.value === undefined) {
      if (missingValue === 'throw') throw new Error(`${arg} needs a value`);
      values[t.name] = undefined;
    }
  }
  return values;
}

// ------------------------------------------------------------------ numbers ----

/** Nearest-rank percentile of an ascending array (or typed array). */
export function percentile(sorted, p) {
  if (sorted.length === 0) return null;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i];
}

export function median(values) {
  const v = values.filter((x) => x !== null && x !== undefined && !Number.isNaN(x)).sort((a, b) => a - b);
  if (v.length === 0) return null;
  const m = Math.floor(v.length / 2);
  return v.length % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

export const round = (x, d = 3) => (x === null || x === undefined ? x : Number.isFinite(x) ? Number(x.toFixed(d)) : x);

/** Spread of repetitions: (max − min) / median, to show how noisy a configuration was. */
export function spread(values) {
  const v = values.filter((x) => Number.isFinite(x));
  if (v.length < 2) return null;
  const m = median(v);
  return m ? (Math.max(...v) - Math.min(...v)) / m : null;
}

/**
 * Growable Float64 sample buffer: latencies are kept without boxing so that recording
 * them does not itself feed the garbage collector the benchmark is measuring around.
 */
export class Samples {
  constructor(capacity = 1 << 16) {
    this.data = new Float64Array(capacity);
    this.length = 0;
  }
  push(x) {
    if (this.length === this.data.length) {
      const bigger = new Float64Array(this.data.length * 2);
      bigger.set(this.data);
      this.data = bigger;
    }
    this.data[this.length++] = x;
  }
  sorted() {
    return this.data.subarray(0, this.length).sort();
  }
  summary(digits = 4) {
    const s = this.sorted();
    let sum = 0;
    for (let i = 0; i < s.length; i++) sum += s[i];
    return {
      n: s.length,
      p50: round(percentile(s, 50), digits), p90: round(percentile(s, 90), digits),
      p99: round(percentile(s, 99), digits), max: round(s.length ? s[s.length - 1] : null, digits),
      mean: round(s.length ? sum / s.length : null, digits),
    };
  }
}

// ------------------------------------------------------------------- facts ----

export function parseInfo(text) {
  const fields = {};
  for (const line of text.split('\r\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.indexOf(':');
    fields[line.slice(0, i)] = line.slice(i + 1);
  }
  return fields;
}

/** `calls=` per command of an INFO commandstats section, by lowercase command name. */
export function commandStats(text) {
  const commands = {};
  for (const m of text.matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm)) commands[m[1]] = Number(m[2]);
  return commands;
}

export function pkgVersion(name) {
  try {
    return JSON.parse(readFileSync(path.join(root, 'node_modules', name, 'package.json'), 'utf8')).version;
  } catch {
    return null;
  }
}

// Section names of an ELF64 little-endian file (enough to tell a debug build: .debug_info).
function elfSections(buf) {
  if (buf.readUInt32BE(0) !== 0x7f454c46 || buf[4] !== 2 || buf[5] !== 1) return [];
  const shoff = Number(buf.readBigUInt64LE(0x28));
  const shentsize = buf.readUInt16LE(0x3a);
  const shnum = buf.readUInt16LE(0x3c);
  const shstrndx = buf.readUInt16LE(0x3e);
  const header = (i) => shoff + i * shentsize;
  const strOff = Number(buf.readBigUInt64LE(header(shstrndx) + 0x18));
  const names = [];
  for (let i = 0; i < shnum; i++) {
    const nameOff = strOff + buf.readUInt32LE(header(i));
    names.push(buf.toString('latin1', nameOff, buf.indexOf(0, nameOff)));
  }
  return names;
}

/** The package directory whose addon the dokebi configurations load. */
export const packageDir = process.env.DOKEBI_BENCH_PACKAGE ? path.resolve(process.env.DOKEBI_BENCH_PACKAGE) : root;

/**
 * The addon this run measures (the repo is shared: it may be rebuilt under us), and whether
 * it embeds `acquireScript` (src/scripts/acquire.lua, which the ceiling runs) byte for byte:
 * the scripts are compiled in with include_str!, so an edited but unbuilt script shows here.
 */
export function addonInfo(acquireScript) {
  const file = path.join(packageDir, 'lock-redis.linux-x64-gnu.node');
  try {
    const buf = readFileSync(file);
    const sections = elfSections(buf);
    return {
      file: path.relative(root, file) || file, bytes: buf.length, mtime: statSync(file).mtime.toISOString(),
      embedsAcquireScript: acquireScript === undefined ? undefined : buf.includes(Buffer.from(acquireScript)),
      sha256: createHash('sha256').update(buf).digest('hex').slice(0, 16),
      build: sections.includes('.debug_info') ? 'debug' : 'release',
      symbols: sections.includes('.symtab'),
    };
  } catch (err) {
    return { file: path.basename(file), error: String(err.message) };
  }
}

export function gitInfo() {
  const git = (...a) => { try { return execFileSync('git', a, { cwd: root, encoding: 'utf8' }); } catch { return null; } };
  return {
    head: git('rev-parse', 'HEAD')?.trim() ?? null,
    // Porcelain lines are "XY path": keep the leading status column (no trim).
    dirty: git('status', '--porcelain', '--', 'src', 'Cargo.toml', 'Cargo.lock', 'index.js', 'binding.js')?.split('\n').filter(Boolean) ?? null,
  };
}

/**
 * Which build a package directory holds (the A/B benchmarks load two): its commit, whether its
 * src or Cargo files differ from that commit (a build of uncommitted work), and its addon's
 * hash. `git` is null for a copied build that is not a checkout.
 */
export function buildInfo(dir) {
  const git = (...args) => { try { return execFileSync('git', args, { cwd: dir, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim(); } catch { return null; } };
  const addon = readFileSync(path.join(dir, 'lock-redis.linux-x64-gnu.node'));
  const commit = git('rev-parse', '--short', 'HEAD');
  return {
    dir: path.resolve(dir), git: commit,
    srcChanged: commit !== null && Boolean(git('status', '--porcelain', '--', 'src', 'Cargo.toml', 'Cargo.lock')),
    addonSha256: createHash('sha256').update(addon).digest('hex').slice(0, 16),
  };
}

/** A build of `buildInfo` in one line of a results file: `label commit (addon hash)`. */
export function buildLine(label, info) {
  const commit = info.git ?? '(a copied build, not a checkout)';
  return `${label} ${commit}${info.srcChanged ? ' with uncommitted src changes' : ''} (addon ${info.addonSha256})`;
}

export function machineInfo() {
  const cpus = os.cpus();
  return {
    cpu: cpus[0]?.model, cores: cpus.length, totalMemoryBytes: os.totalmem(),
    kernel: `${os.type()} ${os.release()} ${os.version()}`, arch: os.arch(),
  };
}

export function commandVersion(cmd, args = ['--version']) {
  try {
    return execFileSync(cmd, args, { encoding: 'utf8' }).trim();
  } catch {
    return null;
  }
}

// -------------------------------------------------------------------- CPU ----

// CPU seconds from /proc: the whole machine's busy time and given processes' own (all
// their threads), to show how much of the shared machine something else used.
const TICK = 100; // USER_HZ
export function machineBusy() {
  const f = readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number);
  const [user, nice, system, , , irq, softirq, steal] = f;
  return { busy: (user + nice + system + irq + softirq) / TICK, steal: (steal ?? 0) / TICK };
}

// A /proc .../stat file's utime and stime, in seconds; null when the task is gone.
function cpuTimes(file) {
  try {
    const f = readFileSync(file, 'utf8').split(') ')[1].split(' ');
    return { user: Number(f[11]) / TICK, system: Number(f[12]) / TICK };
  } catch {
    return null;
  }
}

export function processBusy(pids) {
  let s = 0;
  for (const pid of pids) {
    if (!pid) continue;
    const t = cpuTimes(`/proc/${pid}/stat`);
    if (t) s += t.user + t.system;
  }
  return s;
}

/** A process's kernel-mode CPU seconds (its stime), 0 when it is gone. */
export function processKernel(pid) {
  return cpuTimes(`/proc/${pid}/stat`)?.system ?? 0;
}

/**
 * CPU microseconds of this process's main thread alone, the one that runs JS: its
 * /proc/self/task/<pid>/stat (10 ms ticks), where process.cpuUsage() counts every thread
 * (libuv's pool, V8's helpers, the addon's tokio runtime). Null where /proc is missing.
 */
export function jsThreadCpuUs() {
  const t = cpuTimes(`/proc/self/task/${process.pid}/stat`);
  return t ? (t.user + t.system) * 1e6 : null;
}

/**
 * Starts a CPU window over `pids` (ours: this process, the worker, redis-server) and the
 * machine; `.end()` gives each as a share of all cores, and redis-server's own seconds.
 */
export function cpuWindow(pids, redisPid) {
  const t0 = performance.now();
  const m0 = machineBusy();
  const o0 = processBusy(pids);
  const r0 = processBusy([redisPid]);
  return {
    end() {
      const span = (performance.now() - t0) / 1000;
      const m1 = machineBusy();
      const ours = Math.max(0, processBusy(pids) - o0);
      const cores = os.cpus().length;
      return {
        seconds: round(span, 3),
        redisCpuSeconds: round(processBusy([redisPid]) - r0, 3),
        ourCpuShare: round(ours / (span * cores), 3),
        otherCpuShare: round(Math.max(0, (m1.busy - m0.busy) - ours) / (span * cores), 3),
        stealShare: round((m1.steal - m0.steal) / (span * cores), 3),
      };
    },
  };
}

// --------------------------------------------------------------- running ----

/**
 * The child processes of a benchmark run (workers, redis-benchmark): killed if the run exits
 * or is interrupted before they end. `add(child)` tracks one until it exits.
 */
export function childProcesses() {
  const children = new Set();
  const killAll = () => {
    for (const c of children) {
      try { c.kill('SIGKILL'); } catch { /* gone */ }
    }
  };
  process.on('exit', killAll);
  for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => { killAll(); process.exit(130); });
  return {
    add(child) {
      children.add(child);
      child.once('exit', () => children.delete(child));
      return child;
    },
    killAll,
  };
}

/**
 * What a benchmark's results file records of its run, taken at its start: when, the command
 * that produced it (`metaUrl`: the benchmark's import.meta.url), the addon it loads (with a
 * warning when that is not a release build) and the load average before.
 */
export function runStart(metaUrl) {
  delete process.env.REDIS_URL;
  const startedAt = new Date();
  const addon = addonInfo();
  if (addon.build !== 'release') console.error(`WARNING: ${addon.file} is a ${addon.build ?? 'missing'} build; run npm run build (release) first`);
  return {
    startedAt,
    date: startedAt.toISOString().slice(0, 10),
    commandLine: ['node', path.relative(root, fileURLToPath(metaUrl)), ...process.argv.slice(2)].join(' '),
    addon,
    loadBefore: os.loadavg(),
  };
}

/** Runs a benchmark's `main`: exit 0 when it is done; on failure print it, kill the children, exit 1. */
export function runMain(main, children) {
  main().then(() => process.exit(0), (err) => {
    console.error(err);
    children.killAll();
    process.exit(1);
  });
}

/** The "## Targets" section of a results .md, or nothing without verdicts. */
export function targetsSection(verdicts) {
  if (!verdicts.length) return [];
  return ['## Targets', '', '| target | result | measured |', '|---|---|---|', ...verdicts.map((v) => `| ${v.target} | ${v.result} | ${v.detail} |`), ''];
}

/** One verdict as the console shows it: `PASS  target: detail`. */
export const verdictLine = (v) => `${v.result.padEnd(4)}  ${v.target}: ${v.detail}`;

/** The next IPC message of `type` from a worker process; rejects on an `error` message, its exit, or after `timeoutMs`. */
export function nextMessage(child, type, timeoutMs) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => { cleanup(); reject(new Error(`worker did not send ${type} within ${timeoutMs} ms`)); }, timeoutMs);
    const onMessage = (m) => {
      if (m?.type === 'error') { cleanup(); reject(new Error(`worker failed: ${m.message}`)); } else if (m?.type === type) { cleanup(); resolve(m); }
    };
    const onExit = (code, signal) => { cleanup(); reject(new Error(`worker exited (${code ?? signal}) before ${type}`)); };
    const cleanup = () => { clearTimeout(timer); child.off('message', onMessage); child.off('exit', onExit); };
    child.on('message', onMessage);
    child.on('exit', onExit);
  });
}

/** A contention shape, `<processes>x<waiters>` (all on one key), from the command line's `option`. */
export function parseShape(name, option) {
  const [processes, waiters] = name.split('x').map(Number);
  if (!(Number.isInteger(processes) && processes >= 2 && Number.isInteger(waiters) && waiters >= 1)) throw new Error(`${option}: ${name} is not <processes>x<waiters>`);
  return { name, processes, waiters };
}

/**
 * `processes` lock-contention workers of this driver (lock-contention.worker.mjs) on one key of
 * the server at `url`, `waiters` each, every holder keeping the key 2 ms; resolves with them
 * once all are ready. `mode`: 'namespace' (the default notifications) or 'per-key'.
 */
export async function contentionWorkers(children, { processes, waiters, mode, url, key }) {
  const env = { ...process.env };
  delete env.REDIS_URL;
  const procs = Array.from({ length: processes }, () => children.add(fork(path.join(here, 'lock-contention.worker.mjs'), [], { env, stdio: ['ignore', 'inherit', 'inherit', 'ipc'] })));
  const ready = procs.map((c) => nextMessage(c, 'ready', 60_000));
  procs.forEach((c, proc) => c.send({
    type: 'init', library: 'dokebi', peer: {}, notifications: mode === 'namespace' ? undefined : mode, url, key, proc,
    waiters, holdMs: 2, holdMode: 'atomics', leaseMs: 10_000, waitMs: 30_000,
  }));
  await Promise.all(ready);
  return procs;
}

/** Calls `onLine` with each line MONITOR prints on the server at `port` until `stop()`. */
export function monitorLines(port, onLine) {
  const s = net.connect(port, '127.0.0.1', () => s.write('MONITOR\r\n'));
  let buf = '';
  s.on('data', (d) => {
    buf += d;
    let i;
    while ((i = buf.indexOf('\r\n')) >= 0) {
      const line = buf.slice(0, i);
      buf = buf.slice(i + 2);
      onLine(line);
    }
  });
  s.on('error', () => {});
  return { stop: () => s.destroy() };
}
