// Small utilities shared by the lock tests. Like redis.mjs, this file does not
// load the package under test: every test file loads it itself.

import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';

/** A namespace no other test uses. */
let counter = 0;
export function uniqueNamespace(label = 't') {
  counter += 1;
  return `${label}-${process.pid}-${counter}-${randomBytes(3).toString('hex')}`;
}

/** Backend options for `namespace`, plus `extra`. */
export function backend(namespace, extra = {}) {
  return { driver: 'redis', connection: 'main', namespace, ...extra };
}

/**
 * A driver made by `create` (the package's createRedisLockDriver: this file does not load
 * the package) for `connection` and `backend(namespace, extra)`, shut down when the test
 * `t` ends.
 */
export function driverFor(t, create, connection, namespace, extra = {}, logger = undefined) {
  const d = create(connection, backend(namespace, extra), logger);
  t.after(() => d.shutdown().catch(() => {}));
  return d;
}

export const sha256hex = (key) => createHash('sha256').update(key, 'utf8').digest('hex');
export const lockKeyOf = (namespace, key) => `${namespace}:lock:{${sha256hex(key)}}`;
export const fenceKeyOf = (namespace, key) => `${namespace}:lock-fence:{${sha256hex(key)}}`;

/** The rejection (or throw) of `work`; fails when it settles without one. */
export async function failure(work) {
  try {
    await (typeof work === 'function' ? work() : work);
  } catch (err) {
    return err;
  }
  throw new Error('expected a rejection, but it resolved');
}

/** Like `failure`, for synchronous throws. */
export function thrown(fn) {
  try {
    fn();
  } catch (err) {
    return err;
  }
  throw new Error('expected a throw, but it returned');
}

/** Calls of one command so far, from INFO commandstats (0 when never called). */
export async function commandCalls(server, name) {
  const info = await server.command('INFO', 'commandstats');
  const m = new RegExp(`^cmdstat_${name}:calls=(\\d+)`, 'm').exec(info);
  return m ? Number(m[1]) : 0;
}

/** Script runs so far, by EVALSHA and EVAL together. */
export async function scriptCalls(server) {
  const info = await server.command('INFO', 'commandstats');
  let total = 0;
  for (const name of ['evalsha', 'eval']) {
    const m = new RegExp(`^cmdstat_${name}:calls=(\\d+)`, 'm').exec(info);
    if (m) total += Number(m[1]);
  }
  return total;
}

/**
 * Polls `check` until it returns a truthy value, which it then returns; fails
 * after `timeoutMs`. For states only observable by asking (Redis keys, stats).
 */
export async function eventually(what, check, { timeoutMs = 3000, intervalMs = 10 } = {}) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for: ${what}`);
    await sleep(intervalMs);
  }
}

/** Resolves with `promise`, or fails after `ms` (so a hang is a failure, not a stuck run). */
export function within(ms, promise, what = 'the operation') {
  let timer;
  const limit = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not settle within ${ms} ms`)), ms);
  });
  return Promise.race([promise, limit]).finally(() => clearTimeout(timer));
}

/** Resolves once `promise` has settled, with how long that took from `start`. */
export async function settleTime(promise, start = performance.now()) {
  try {
    await promise;
  } catch {
    /* the caller inspects the outcome separately */
  }
  return performance.now() - start;
}

/** A port nothing listens on (at the moment of asking). */
export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

// Just enough RESP2 to read pub/sub pushes: arrays of bulk strings and integers.
function parse(buf, start) {
  const eol = buf.indexOf('\r\n', start);
  if (eol === -1) return undefined;
  const type = String.fromCharCode(buf[start]);
  const line = buf.toString('utf8', start + 1, eol);
  const next = eol + 2;
  if (type === '+' || type === '-') return [line, next];
  if (type === ':') return [Number(line), next];
  if (type === '$') {
    const len = Number(line);
    if (len < 0) return [null, next];
    if (buf.length < next + len + 2) return undefined;
    return [buf.toString('utf8', next, next + len), next + len + 2];
  }
  if (type === '*') {
    const items = [];
    let off = next;
    for (let i = 0; i < Number(line); i++) {
      const r = parse(buf, off);
      if (!r) return undefined;
      items.push(r[0]);
      off = r[1];
    }
    return [items, off];
  }
  throw new Error(`unexpected RESP type ${type}`);
}

/**
 * SUBSCRIBEs to `channel` on its own connection. Resolves once Redis confirmed
 * the subscription, with `{ messages, next(timeoutMs), close() }`: `messages`
 * holds the payloads seen so far, `next()` resolves with the next one.
 */
export function subscribe(port, channel) {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host: '127.0.0.1', port });
    const messages = [];
    let buf = Buffer.alloc(0);
    let waiting = [];
    let confirmed = false;
    socket.on('error', (err) => (confirmed ? undefined : reject(err)));
    socket.on('data', (chunk) => {
      buf = Buffer.concat([buf, chunk]);
      let r;
      while ((r = parse(buf, 0))) {
        buf = buf.subarray(r[1]);
        const [kind, ch, payload] = r[0];
        if (kind === 'subscribe' && !confirmed) {
          confirmed = true;
          resolve(handle);
        } else if (kind === 'message' && ch === channel) {
          messages.push(payload);
          const w = waiting;
          waiting = [];
          for (const fn of w) fn();
        }
      }
    });
    const handle = {
      messages,
      async next(timeoutMs = 2000) {
        const seen = messages.length;
        const deadline = Date.now() + timeoutMs;
        while (messages.length === seen) {
          const left = deadline - Date.now();
          if (left <= 0) throw new Error(`no message on ${channel} within ${timeoutMs} ms`);
          await new Promise((res) => {
            const timer = setTimeout(res, left);
            waiting.push(() => { clearTimeout(timer); res(); });
          });
        }
        return messages[seen];
      },
      close() {
        socket.destroy();
      },
    };
    socket.write(`*2\r\n$9\r\nSUBSCRIBE\r\n$${Buffer.byteLength(channel)}\r\n${channel}\r\n`);
  });
}

/**
 * Runs an ESM snippet in a child node with `env` added to this process's; resolves with its
 * exit code and signal, its output and how long it ran, or fails (killing it) if it outlives
 * `limitMs`: a process that does not exit by itself is what the callers catch.
 */
export function runNodeChild(source, env, limitMs) {
  const child = spawn(process.execPath, ['--input-type=module', '-e', source], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d) => { stdout += d; });
  child.stderr.on('data', (d) => { stderr += d; });
  const started = performance.now();
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`the child did not exit within ${limitMs} ms; stdout: ${stdout}; stderr: ${stderr}`));
    }, limitMs);
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr, ms: performance.now() - started });
    });
  });
}
