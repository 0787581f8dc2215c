// Fault-making helpers shared by the fault matrix, the secrets test and the mutual-exclusion
// check: a persistent RESP client (for MONITOR and for holding a connection), the lock
// scripts' SHA-1s (to tell acquire from release in a command log), and servers in the
// states the matrix needs (OOM, a read-only replica, BUSY, LOADING).
//
// Like the other helpers it does not load the package under test.

import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { encode, parseReply } from '../helpers/redis.mjs';

const HOST = '127.0.0.1';

// ---------------------------------------------------------------- RESP ----

// The harness's RESP encoder and parser (RESP2 only, test-only).

/**
 * One persistent connection: `call(...args)` resolves with the reply (rejects on an error
 * reply), in order. `onPush` receives replies nobody asked for (MONITOR lines). Unref'd
 * unless `keepAlive`: by default it never keeps the test process alive.
 */
export function rawClient(port, { host = HOST, onPush, keepAlive = false } = {}) {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host, port, noDelay: true });
    const pending = [];
    let buf = Buffer.alloc(0);
    let closed = false;
    const fail = (err) => {
      closed = true;
      for (const p of pending.splice(0)) p.reject(err);
    };
    socket.on('error', (err) => {
      if (!client.connected) reject(err);
      fail(err);
    });
    socket.on('close', () => fail(new Error('connection closed')));
    socket.on('data', (chunk) => {
      buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
      let r;
      while ((r = parseReply(buf))) {
        buf = buf.subarray(r[1]);
        const p = pending.shift();
        if (p) {
          if (r[0] instanceof Error) p.reject(r[0]);
          else p.resolve(r[0]);
        } else onPush?.(r[0]);
      }
    });
    const client = {
      connected: false,
      socket,
      call(...args) {
        if (closed) return Promise.reject(new Error('connection closed'));
        return new Promise((res, rej) => {
          pending.push({ resolve: res, reject: rej });
          socket.write(encode(args));
        });
      },
      close() {
        closed = true;
        socket.destroy();
      },
    };
    socket.on('connect', () => {
      if (!keepAlive) socket.unref();
      client.connected = true;
      resolve(client);
    });
  });
}

// ------------------------------------------------------------- scripts ----

const SCRIPTS_DIR = new URL('../../src/scripts/', import.meta.url);
const sha1 = (text) => createHash('sha1').update(text).digest('hex');

/** The source of each lock script, as EVAL sends it. */
export const SCRIPT_SOURCES = Object.fromEntries(['acquire', 'release', 'renew'].map((name) => [
  name, readFileSync(new URL(`${name}.lua`, SCRIPTS_DIR), 'utf8'),
]));

/** The SHA-1 of each lock script, as EVALSHA sends it. */
export const SCRIPT_SHAS = Object.fromEntries(Object.entries(SCRIPT_SOURCES).map(([name, source]) => [sha1(source), name]));

/**
 * Loads the lock scripts into `server`'s cache, so a fault aimed at "the reply" hits the
 * script's own reply and not a NOSCRIPT that happens to come first.
 */
export async function loadScripts(server) {
  for (const source of Object.values(SCRIPT_SOURCES)) await server.command('SCRIPT', 'LOAD', source);
}

/** 'acquire' | 'release' | 'renew' | undefined for a logged command `[name, ...args]`. */
export function scriptOf(name, args) {
  const upper = String(name).toUpperCase();
  if (upper === 'EVALSHA') return SCRIPT_SHAS[args[0]];
  if (upper === 'EVAL') return SCRIPT_SHAS[sha1(args[0])];
  return undefined;
}

/** Proxy log entries (`{ name, args }`, args[0] the command) that ran `script` on `lockKey`. */
export function scriptCommands(entries, script, lockKey) {
  return entries.filter((e) => scriptOf(e.name, e.args.slice(1)) === script && (lockKey === undefined || e.args[3] === lockKey));
}

// ------------------------------------------------------------- monitor ----

// MONITOR prints: +1700000000.123456 [0 127.0.0.1:5000] "EVALSHA" "ab12.." "2" "k1" ...
function parseMonitorLine(line) {
  const args = [];
  const re = /"((?:[^"\\]|\\.)*)"/g;
  let m;
  while ((m = re.exec(line))) args.push(m[1].replace(/\\"/g, '"').replace(/\\\\/g, '\\'));
  return args;
}

/**
 * Records every command the server runs (MONITOR), as `{ name, args }` with args[0] the
 * command name like the proxy log. `close()` stops it.
 */
export async function monitor(port) {
  const entries = [];
  const client = await rawClient(port, {
    onPush(line) {
      if (typeof line !== 'string') return;
      const args = parseMonitorLine(line);
      if (args.length) entries.push({ name: args[0].toUpperCase(), args, at: performance.now() });
    },
  });
  await client.call('MONITOR');
  return {
    entries,
    /** Resolves once the server ran a command matching `predicate` (bounded). */
    async until(predicate, timeoutMs = 5000) {
      const deadline = performance.now() + timeoutMs;
      for (;;) {
        const hit = entries.find(predicate);
        if (hit) return hit;
        if (performance.now() > deadline) throw new Error(`MONITOR saw no matching command within ${timeoutMs} ms`);
        await sleep(5);
      }
    },
    close: () => client.close(),
  };
}

// ------------------------------------------------------ server states ----

/** Counts of error replies by code, from INFO errorstats (e.g. { NOSCRIPT: 1 }). */
export async function errorStats(server) {
  const info = await server.command('INFO', 'errorstats');
  const out = {};
  for (const m of info.matchAll(/^errorstat_([A-Z_]+):count=(\d+)/gm)) out[m[1]] = Number(m[2]);
  return out;
}

/** Every write is refused with OOM (noeviction and a 1-byte limit). `restore()` undoes it. */
export async function makeOom(server) {
  await server.command('CONFIG', 'SET', 'maxmemory-policy', 'noeviction');
  await server.command('CONFIG', 'SET', 'maxmemory', '1');
  return { restore: () => server.command('CONFIG', 'SET', 'maxmemory', '0') };
}

/** Waits until `replica` reports its link to the master up (bounded). */
export async function replicaLinked(replica, timeoutMs = 5000) {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const info = await replica.command('INFO', 'replication');
    if (info.includes('master_link_status:up')) return;
    if (performance.now() > deadline) throw new Error('the replica did not link to its master');
    await sleep(10);
  }
}

/**
 * Runs `while true do end` on `server` from its own connection, so the server answers
 * BUSY once the script passed busy-reply-threshold. Resolves once BUSY is observed.
 * `kill()` ends the script with SCRIPT KILL and resolves when the server answers again.
 */
export async function makeBusy(server, { thresholdMs = 50 } = {}) {
  await server.command('CONFIG', 'SET', 'busy-reply-threshold', String(thresholdMs));
  const looping = await rawClient(server.port);
  const ended = looping.call('EVAL', 'while true do end', '0').then(() => 'returned', (err) => err.message);
  const deadline = performance.now() + 5000;
  for (;;) {
    try {
      await server.command('PING', { timeout: 1000 });
    } catch (err) {
      if (/^BUSY/.test(err.message)) break;
    }
    if (performance.now() > deadline) throw new Error('the server never answered BUSY');
    await sleep(10);
  }
  let killed = false;
  return {
    ended,
    async kill() {
      if (killed) return;
      killed = true;
      for (let i = 0; i < 50; i++) {
        try {
          await server.command('SCRIPT', 'KILL');
          break;
        } catch (err) {
          if (/NOTBUSY/.test(err.message)) break;
          await sleep(20);
        }
      }
      await ended;
      looping.close();
    },
  };
}

/**
 * Puts `server` into LOADING for a while: fills it with `keys` keys and DEBUG RELOADs it
 * with a per-key load delay, serving clients (with -LOADING) while it loads. The server
 * must have been started with `--enable-debug-command yes`. Resolves once LOADING is
 * observed, with `{ done }` (resolves when the reload finished).
 */
export async function makeLoading(server, { keys = 10_000, delayMicros = 60 } = {}) {
  await server.command('CONFIG', 'SET', 'key-load-delay', String(delayMicros));
  await server.command('CONFIG', 'SET', 'loading-process-events-interval-bytes', '1024');
  await server.command('DEBUG', 'POPULATE', String(keys), 'loading-filler');
  const done = server.command('DEBUG', 'RELOAD', { timeout: 30_000 });
  const deadline = performance.now() + 5000;
  for (;;) {
    try {
      await server.command('PING', { timeout: 1000 });
    } catch (err) {
      if (/^LOADING/.test(err.message)) break;
    }
    if (performance.now() > deadline) throw new Error('the server never answered LOADING');
    await sleep(2);
  }
  return { done };
}

/** Holds `n` client connections open (to reach maxclients); `close()` frees them. */
export async function holdConnections(port, n = 1) {
  const clients = [];
  for (let i = 0; i < n; i++) clients.push(await rawClient(port));
  // The server accepts, then may refuse: make sure these are the ones it kept.
  for (const c of clients) await c.call('PING');
  return { close: () => clients.forEach((c) => c.close()) };
}

// ---------------------------------------------------------- assertions ----

/**
 * Asserts a LockError `lockCode` whose cause is RedisError-shaped as the contract fixes.
 * `retryable: true` also requires `status: 503`; `false` requires no status.
 */
export function assertRedisFailure(assert, err, { lockCode, code, outcome, retryable, serverCode }) {
  assert.ok(err instanceof Error, `not an Error: ${err}`);
  assert.equal(err.name, 'LockError', `not a LockError: ${err?.stack ?? err}`);
  assert.equal(err.code, lockCode, err.message);
  const cause = err.cause;
  assert.ok(cause instanceof Error, `the cause is not an Error: ${cause}`);
  assert.equal(cause.name, 'RedisError');
  assert.equal(cause.plugin, 'dokebi-redis');
  if (code !== undefined) assert.equal(cause.code, code, `cause.code (serverCode ${cause.serverCode})`);
  if (outcome !== undefined) assert.equal(cause.outcome, outcome);
  if (retryable !== undefined) {
    assert.equal(cause.retryable, retryable, `cause.retryable of ${cause.code}/${cause.serverCode}`);
    assert.equal(cause.status, retryable ? 503 : undefined, 'status 503 exactly when retryable');
  }
  if (serverCode !== undefined) assert.equal(cause.serverCode, serverCode);
}
