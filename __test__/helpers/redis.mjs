// Throwaway redis-server processes for the Node tests.
//
// Why this exists: the machine (and CI) runs its own Redis on 6379, shared
// with whatever else runs there. Tests that flush, fill, pause or kill Redis
// must never touch it, so each test gets its own server on a free port, in its
// own temp dir, with persistence off. Set REDIS_URL to run the suite against
// an existing server instead; tests that need to break the server should
// `skip: external`.
//
// No dependencies on purpose: the harness must not share code (or bugs) with
// the client under test, so it speaks just enough RESP2 itself.

import { spawn } from 'node:child_process';
import { existsSync, readFileSync, rmSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

export const external = Boolean(process.env.REDIS_URL);

const HOST = '127.0.0.1';
const READY_TIMEOUT_MS = 10_000;
const COMMAND_TIMEOUT_MS = 5_000;
const PORT_ATTEMPTS = 5;

// setpriv (util-linux) makes the kernel SIGKILL redis when this process dies,
// even by SIGKILL or an unhandled signal, where process.on('exit') never runs.
// Node spawns from the main thread, which lives as long as the process.
const SETPRIV = ['/usr/bin/setpriv', '/bin/setpriv'].find((p) => existsSync(p));

// Every server this process started and has not stopped: killed on exit so a
// failing or forgetful test leaves nothing running.
const live = new Set();
process.on('exit', () => {
  for (const s of live) {
    try { s.child?.kill('SIGKILL'); } catch { /* already gone */ }
    try { rmSync(s.dir, { recursive: true, force: true }); } catch { /* best effort */ }
  }
});

// ---------------------------------------------------------------- RESP ----

export function encode(args) {
  const parts = [Buffer.from(`*${args.length}\r\n`)];
  for (const arg of args) {
    const b = Buffer.isBuffer(arg) ? arg : Buffer.from(String(arg));
    parts.push(Buffer.from(`$${b.length}\r\n`), b, Buffer.from('\r\n'));
  }
  return Buffer.concat(parts);
}

// Parses one reply at `start`. Returns [value, nextOffset], or undefined while
// the buffer does not yet hold the whole reply (TCP may split it anywhere).
// Error replies become Error values here; the caller decides whether to throw,
// so an error inside an array (EXEC) does not reject the whole command.
// Integers are JS numbers: fine for tests, lossy above 2^53.
export function parseReply(buf, start = 0) {
  const eol = buf.indexOf('\r\n', start);
  if (eol === -1) return undefined;
  const type = String.fromCharCode(buf[start]);
  const line = buf.toString('utf8', start + 1, eol);
  const next = eol + 2;
  switch (type) {
    case '+': return [line, next];
    case '-': return [new Error(line), next];
    case ':': return [Number(line), next];
    case '$': {
      const len = Number(line);
      if (len < 0) return [null, next];
      if (buf.length < next + len + 2) return undefined;
      return [buf.toString('utf8', next, next + len), next + len + 2];
    }
    case '*': {
      const n = Number(line);
      if (n < 0) return [null, next];
      const items = [];
      let off = next;
      for (let i = 0; i < n; i++) {
        const r = parseReply(buf, off);
        if (!r) return undefined;
        items.push(r[0]);
        off = r[1];
      }
      return [items, off];
    }
    default:
      throw new Error(`unexpected RESP type byte ${JSON.stringify(type)} (RESP3 is not supported here)`);
  }
}

// One connection per call: nothing is left open between tests to keep node
// alive, and no state (SELECT, CLIENT PAUSE...) leaks from one call to the
// next. Resolves with one reply per command; error replies are values.
function roundTrip({ host, port }, commands, timeoutMs) {
  return new Promise((resolve, reject) => {
    const replies = [];
    let buf = Buffer.alloc(0);
    let done = false;
    const socket = net.connect({ host, port });
    const finish = (err) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      socket.destroy();
      if (err) reject(err); else resolve(replies);
    };
    // A paused server still completes the TCP handshake (the kernel does it),
    // it just never answers, so only a deadline notices.
    const timer = setTimeout(() => {
      const names = commands.map((c) => c[0]).join(', ');
      const err = new Error(`redis at ${host}:${port} did not answer ${names} within ${timeoutMs} ms`);
      err.code = 'ETIMEDOUT';
      finish(err);
    }, timeoutMs);
    socket.on('data', (chunk) => {
      buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
      try {
        let r;
        while (replies.length < commands.length && (r = parseReply(buf))) {
          replies.push(r[0]);
          buf = buf.subarray(r[1]);
        }
      } catch (err) {
        finish(err);
        return;
      }
      if (replies.length === commands.length) finish();
    });
    socket.on('error', finish);
    socket.on('close', () => finish(new Error(`redis at ${host}:${port} closed the connection before replying`)));
    socket.write(Buffer.concat(commands.map(encode)));
  });
}

// command(...args) with an optional trailing { timeout } (ms).
function makeCommand(target, prelude = []) {
  return async function command(...args) {
    let timeout = COMMAND_TIMEOUT_MS;
    const last = args.at(-1);
    if (last !== null && typeof last === 'object' && !Buffer.isBuffer(last)) {
      ({ timeout = timeout } = args.pop());
    }
    if (args.length === 0) throw new TypeError('command() needs at least a command name');
    const replies = await roundTrip(target, [...prelude, args], timeout);
    for (const r of replies) if (r instanceof Error) throw r; // AUTH/SELECT too
    return replies.at(-1);
  };
}

// ------------------------------------------------------------- servers ----

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, HOST, () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

// A test process killed by SIGKILL cannot clean up its temp dir; the next one
// does. The owner's pid is in the dir name; dirs of live processes are left.
let swept = false;
async function sweepStaleDirs() {
  if (swept) return;
  swept = true;
  for (const name of await readdir(os.tmpdir()).catch(() => [])) {
    const owner = Number(/^dokebi-redis-(\d+)-/.exec(name)?.[1]);
    if (!owner || owner === process.pid) continue;
    try {
      process.kill(owner, 0);
    } catch (err) {
      if (err.code === 'ESRCH') await rm(path.join(os.tmpdir(), name), { recursive: true, force: true });
    }
  }
}

const exited = (child) => child.exitCode !== null || child.signalCode !== null;

function processState(pid) {
  try {
    // Field 3 of /proc/<pid>/stat, after the parenthesised command name.
    return readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.[0];
  } catch {
    return undefined;
  }
}

async function logTail(file) {
  try {
    return (await readFile(file, 'utf8')).trim().split('\n').slice(-5).join('\n');
  } catch {
    return '(no log)';
  }
}

// Spawns redis-server on `port` and waits until it answers PING. Throws an
// Error with code 'EADDRINUSE' when the port turned out to be taken, so the
// caller can pick another (or wait, when the port must stay the same).
async function launch(port, dir, extraArgs) {
  const logFile = path.join(dir, 'redis.log');
  const argv = [
    '--port', String(port), '--bind', HOST,
    '--save', '', '--appendonly', 'no',
    '--dir', dir, '--logfile', logFile, '--daemonize', 'no',
    ...extraArgs,
  ];
  const [cmd, args] = SETPRIV
    ? [SETPRIV, ['--pdeathsig', 'KILL', 'redis-server', ...argv]]
    : ['redis-server', argv];
  const child = spawn(cmd, args, { stdio: 'ignore' });
  // The child must not keep the test process alive; the exit hook and
  // pdeathsig take care of it instead.
  child.unref();
  let spawnError;
  child.on('error', (err) => { spawnError = err; });

  const deadline = Date.now() + READY_TIMEOUT_MS;
  for (;;) {
    if (spawnError) {
      throw new Error(`could not run redis-server (${spawnError.message}); install it: apt-get install redis-server`);
    }
    if (exited(child)) {
      const tail = child.exitCode === 127 // setpriv could not exec it
        ? 'redis-server not found on PATH; install it: apt-get install redis-server'
        : await logTail(logFile);
      const err = new Error(`redis-server on port ${port} exited early (${child.exitCode ?? child.signalCode}):\n${tail}`);
      if (tail.includes('Address already in use')) err.code = 'EADDRINUSE';
      throw err;
    }
    try {
      // INFO's process_id proves the answer came from our child and not from
      // some other server that already held the port.
      const [pong, info] = await roundTrip({ host: HOST, port }, [['PING'], ['INFO', 'server']], 1000);
      if (pong === 'PONG') {
        if (typeof info === 'string' && info.includes(`process_id:${child.pid}\r\n`)) return child;
        child.kill('SIGKILL');
        const err = new Error(`port ${port} is already served by another process`);
        err.code = 'EADDRINUSE';
        throw err;
      }
    } catch (err) {
      if (err.code === 'EADDRINUSE') throw err;
      // Not listening yet, or still loading: try again shortly.
    }
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`redis-server on port ${port} did not answer PING within ${READY_TIMEOUT_MS} ms:\n${await logTail(logFile)}`);
    }
    await sleep(20);
  }
}

/**
 * Starts a throwaway redis-server (or wraps REDIS_URL, see `external`).
 * @param {{ args?: string[] }} [opts] extra redis-server arguments
 */
export async function startRedis(opts = {}) {
  if (external) return externalServer(process.env.REDIS_URL, opts);
  const extraArgs = opts.args ?? [];
  await sweepStaleDirs();
  const dir = await mkdtemp(path.join(os.tmpdir(), `dokebi-redis-${process.pid}-`));
  const entry = { child: undefined, dir };
  live.add(entry);

  let port;
  for (let attempt = 1; ; attempt++) {
    port = await freePort();
    try {
      entry.child = await launch(port, dir, extraArgs);
      break;
    } catch (err) {
      // Another process may grab the port between freePort() and the bind.
      if (err.code !== 'EADDRINUSE' || attempt === PORT_ATTEMPTS) {
        live.delete(entry);
        await rm(dir, { recursive: true, force: true });
        throw err;
      }
    }
  }

  const command = makeCommand({ host: HOST, port });

  const running = () => {
    if (!entry.child || exited(entry.child)) throw new Error(`redis-server on port ${port} is not running`);
    return entry.child;
  };

  // Ends the current child and waits for it, escalating to SIGKILL.
  async function terminate(signal) {
    const child = entry.child;
    if (!child || exited(child)) return;
    child.ref(); // otherwise node could exit while we wait for the 'exit' event
    const gone = new Promise((resolve) => child.once('exit', resolve));
    child.kill(signal);
    if (signal !== 'SIGKILL') child.kill('SIGCONT'); // a paused redis cannot act on SIGTERM
    const escalate = setTimeout(() => child.kill('SIGKILL'), 5_000);
    await gone;
    clearTimeout(escalate);
  }

  async function waitForState(pid, want) {
    const deadline = Date.now() + 2_000;
    while (Date.now() < deadline) {
      const s = processState(pid);
      if (s === undefined || want(s)) return;
      await sleep(5);
    }
    throw new Error(`redis-server ${pid} did not change state`);
  }

  return {
    port,
    url: `redis://${HOST}:${port}`,
    dir,
    get pid() { return entry.child?.pid; },
    command,

    async stop() {
      await terminate('SIGTERM');
      live.delete(entry);
      await rm(dir, { recursive: true, force: true });
    },

    // Abrupt death, as in a crash: no shutdown, clients see resets.
    async kill() {
      await terminate('SIGKILL');
    },

    // SIGSTOP: the port still accepts connections but nothing is answered,
    // like a server stuck in a long command or a network black hole.
    async pause() {
      const { pid } = running();
      process.kill(pid, 'SIGSTOP');
      await waitForState(pid, (s) => s === 'T');
    },

    async resume() {
      const { pid } = running();
      process.kill(pid, 'SIGCONT');
      await waitForState(pid, (s) => s !== 'T');
    },

    // Same port on purpose: clients reconnect to the address they know.
    async restart({ keepData = false } = {}) {
      if (entry.child && !exited(entry.child)) {
        if (keepData) {
          entry.child.kill('SIGCONT');
          await command('SAVE'); // startup loads dump.rdb even with save ""
        }
        await terminate('SIGTERM');
      }
      if (!keepData) await rm(dir, { recursive: true, force: true });
      await mkdir(dir, { recursive: true });
      live.add(entry);
      // The port may linger in another process for a moment; it is ours to
      // wait for rather than to swap.
      const deadline = Date.now() + READY_TIMEOUT_MS;
      for (;;) {
        try {
          entry.child = await launch(port, dir, extraArgs);
          return;
        } catch (err) {
          if (err.code !== 'EADDRINUSE' || Date.now() > deadline) throw err;
          await sleep(100);
        }
      }
    },
  };
}

async function externalServer(urlText, opts) {
  if (opts.args?.length) {
    throw new Error('startRedis({ args }) needs a throwaway server; REDIS_URL points at an external one');
  }
  const u = new URL(urlText);
  if (u.protocol !== 'redis:') throw new Error(`REDIS_URL: only redis:// is supported by the test harness, got ${u.protocol}`);
  const target = { host: u.hostname.replace(/^\[|\]$/g, '') || HOST, port: Number(u.port || 6379) };
  // Fresh connection per command, so authenticate and select every time.
  const prelude = [];
  if (u.password) {
    prelude.push(u.username
      ? ['AUTH', decodeURIComponent(u.username), decodeURIComponent(u.password)]
      : ['AUTH', decodeURIComponent(u.password)]);
  }
  const db = u.pathname.replace(/^\//, '');
  if (db && db !== '0') prelude.push(['SELECT', db]);
  const command = makeCommand(target, prelude);
  await command('PING'); // fail here, clearly, rather than in the first test

  const refuse = (name) => async () => {
    throw new Error(`${name}() needs a throwaway server, but REDIS_URL points at an external one; skip this test when \`external\` is true`);
  };
  return {
    port: target.port,
    url: urlText,
    dir: undefined,
    pid: undefined,
    command,
    // Deliberately harmless rather than refused: every test's cleanup calls
    // stop(), and the server is not ours to stop.
    stop: async () => {},
    kill: refuse('kill'),
    pause: refuse('pause'),
    resume: refuse('resume'),
    restart: refuse('restart'),
  };
}

export function flushAll(server) {
  return server.command('FLUSHALL');
}
