// A small TCP fault proxy between the driver and a redis-server, for the fault tests.
//
// Why this exists: pausing or killing redis-server hits every client at once and cannot
// tell "the command was written" from "the reply was lost". A proxy on its own free port
// can: refuse new connections, forward a command but hold (or drop) the reply, cut a
// connection in the middle of a reply, add latency, kill every connection, drop the open
// flows without a word (a NAT or load balancer that forgot them), and move to another server
// (a "failover"). It also reads the RESP commands the client sends, so a
// test can await "the acquire is on the wire" instead of sleeping, and count attempts.
//
// No dependencies, and it does not load the package under test.
//
//   const proxy = await startProxy(redis.port)     // or startProxy({ host, port })
//   proxy.url                                      // redis://127.0.0.1:<proxy port>
//   proxy.refuse() / proxy.accept()                // new connections reset at once / accepted again
//   proxy.stallAfterWrite({ drop })                // client→server flows; server→client held (or dropped)
//   proxy.release()                                // held replies flow again, in order
//   await proxy.cutMidReply({ after, bytes })      // the next reply (after a command named `after`) is cut
//   proxy.latency(ms)                              // every chunk, both ways, delayed by ms (order kept)
//   proxy.killAll({ reset })                       // destroy every open connection
//   proxy.dropFlows({ reset, where })              // open flows go silent (a NAT or LB dropped them)
//   proxy.retarget(port)                           // new connections go to another server
//   await proxy.nextCommand('EVALSHA')             // resolves when a client sends that command
//   proxy.commands / proxy.stats()                 // what was sent; counters of connections and bytes
//   await proxy.close()

import { EventEmitter } from 'node:events';
import net from 'node:net';

const HOST = '127.0.0.1';
/** The command log is for assertions in short tests; beyond this it stops growing. */
const MAX_LOGGED_COMMANDS = 100_000;

// Client→server RESP: arrays of bulk strings. Returns [args, next] or undefined while
// incomplete. Anything else (inline commands) is returned as one opaque command so the
// parser never stalls the forwarding (parsing is only for the log).
function parseCommand(buf, start) {
  if (start >= buf.length) return undefined;
  if (buf[start] !== 0x2a /* '*' */) {
    const eol = buf.indexOf('\r\n', start);
    if (eol === -1) return undefined;
    return [[buf.toString('utf8', start, eol)], eol + 2];
  }
  const eol = buf.indexOf('\r\n', start);
  if (eol === -1) return undefined;
  const n = Number(buf.toString('latin1', start + 1, eol));
  let off = eol + 2;
  const args = [];
  for (let i = 0; i < n; i++) {
    if (off >= buf.length) return undefined;
    const lineEnd = buf.indexOf('\r\n', off);
    if (lineEnd === -1) return undefined;
    const len = Number(buf.toString('latin1', off + 1, lineEnd));
    const dataStart = lineEnd + 2;
    if (buf.length < dataStart + len + 2) return undefined;
    args.push(buf.toString('utf8', dataStart, dataStart + len));
    off = dataStart + len + 2;
  }
  return [args, off];
}

/**
 * Starts a proxy on a free port in front of `target` (a port, or `{ host, port }`).
 * @returns {Promise<Proxy>}
 */
export async function startProxy(target, { host = HOST } = {}) {
  let upstream = typeof target === 'number' ? { host: HOST, port: target } : { host: target.host ?? HOST, port: target.port };
  const events = new EventEmitter();
  events.setMaxListeners(0);
  const conns = new Set();
  // Flows dropped by dropFlows(): out of `conns` (no other fault touches them again) until
  // the client gives them up. `lingering`: their server sockets, never closed before close(),
  // as the server's end of a forgotten flow stays open.
  const silent = new Set();
  const lingering = new Set();
  const commands = [];
  const counters = {
    accepted: 0, refused: 0, bytesUp: 0, bytesDown: 0, droppedBytes: 0, heldBytes: 0, cuts: 0, killed: 0,
    silentFlows: 0, silentBytes: 0, silentResets: 0, silentGivenUp: 0,
  };
  let refusing = false;
  let stall = null; // null | { drop: boolean }
  let cut = null; // null | { after?: string, bytes?: number, done: (info) => void }
  let latencyMs = 0;
  let nextId = 0;

  const server = net.createServer({ noDelay: true }, onConnection);
  server.on('error', (err) => events.emit('error', err));

  function onConnection(client) {
    if (refusing) {
      counters.refused += 1;
      client.on('error', () => {});
      client.resetAndDestroy();
      return;
    }
    counters.accepted += 1;
    const conn = {
      id: ++nextId,
      client,
      upstream: net.connect({ ...upstream, noDelay: true }),
      held: [],
      upBuf: Buffer.alloc(0),
      cutPending: false,
      dead: false,
      // Ordered delivery under latency: each direction's delayed chunks, first due first.
      dueUp: [],
      dueDown: [],
      // null, or { reset, at } once dropFlows() took it.
      silent: null,
      // The names of the first commands it carried (a few), to tell what a flow was for.
      names: new Set(),
    };
    conns.add(conn);
    const end = (side) => {
      if (conn.dead) return;
      if (conn.silent) {
        // A dropped flow: the server's side ending is heard by nobody; the client's means
        // it gave the flow up (found it dead), which is what a test or a chaos run measures.
        if (side === 'client') giveUp(conn, 'closed');
        return;
      }
      conn.dead = true;
      conns.delete(conn);
      conn.client.destroy();
      conn.upstream.destroy();
      events.emit('close', conn.id);
    };
    conn.end = end;
    client.on('error', () => end('client'));
    client.on('close', () => end('client'));
    conn.upstream.on('error', () => end('upstream'));
    conn.upstream.on('close', () => end('upstream'));
    client.on('data', (chunk) => {
      if (conn.silent) {
        swallow(conn, 'client', chunk);
        return;
      }
      counters.bytesUp += chunk.length;
      logCommands(conn, chunk);
      schedule(conn, 'dueUp', () => { if (!conn.dead && !conn.silent) conn.upstream.write(chunk); });
    });
    conn.upstream.on('data', (chunk) => {
      if (conn.silent) {
        swallow(conn, 'upstream', chunk);
        return;
      }
      schedule(conn, 'dueDown', () => deliverDown(conn, chunk));
    });
    events.emit('connection', conn.id);
  }

  // One queue and one timer per direction: a chunk goes out only after every chunk before it.
  // (A timer per chunk let a chunk that came once the latency was lifted overtake one whose
  // timer was due but had not fired yet: bytes reordered inside a TCP stream, which paired a
  // reply with another command; a chaos run handed one key's fence to another key's acquire.)
  function schedule(conn, lane, fn) {
    const queue = conn[lane];
    if (latencyMs <= 0 && queue.length === 0) {
      fn();
      return;
    }
    queue.push({ due: Math.max(performance.now() + latencyMs, queue.at(-1)?.due ?? 0), fn });
    if (queue.length === 1) drainLater(queue);
  }

  function drainLater(queue) {
    setTimeout(() => {
      while (queue.length > 0 && queue[0].due <= performance.now()) queue.shift().fn();
      if (queue.length > 0) drainLater(queue);
    }, Math.max(0, queue[0].due - performance.now()));
  }

  function logCommands(conn, chunk) {
    conn.upBuf = conn.upBuf.length ? Buffer.concat([conn.upBuf, chunk]) : chunk;
    let parsed;
    let off = 0;
    while ((parsed = parseCommand(conn.upBuf, off))) {
      const [args, next] = parsed;
      off = next;
      const name = String(args[0] ?? '').toUpperCase();
      const entry = { conn: conn.id, name, args, at: performance.now() };
      if (commands.length < MAX_LOGGED_COMMANDS) commands.push(entry);
      if (conn.names.size < 8) conn.names.add(name);
      if (cut && (!cut.after || cut.after === name)) conn.cutPending = true;
      events.emit('command', entry);
    }
    conn.upBuf = conn.upBuf.subarray(off);
  }

  // A packet on a dropped flow: discarded; with `reset`, answered with a RST as a load
  // balancer does once its idle timeout forgot the flow (to that side only).
  function swallow(conn, side, chunk) {
    counters.silentBytes += chunk.length;
    if (!conn.silent.reset) return;
    const socket = side === 'client' ? conn.client : conn.upstream;
    if (socket.destroyed) return;
    counters.silentResets += 1;
    socket.resetAndDestroy();
    if (side === 'client') giveUp(conn, 'reset');
  }

  function giveUp(conn, how) {
    if (conn.dead) return;
    conn.dead = true;
    silent.delete(conn);
    counters.silentGivenUp += 1;
    conn.client.destroy();
    if (!conn.upstream.destroyed) {
      lingering.add(conn.upstream);
      conn.upstream.once('close', () => lingering.delete(conn.upstream));
    }
    events.emit('given-up', { id: conn.id, how, at: performance.now(), droppedAt: conn.silent.at });
  }

  function deliverDown(conn, chunk) {
    if (conn.dead || conn.silent) return;
    if (stall) {
      if (stall.drop) counters.droppedBytes += chunk.length;
      else {
        conn.held.push(chunk);
        counters.heldBytes += chunk.length;
      }
      return;
    }
    if (cut && (conn.cutPending || !cut.after)) {
      const armed = cut;
      cut = null;
      // At least one byte and at least one byte short of the chunk: the reply starts
      // but never completes (a one-byte chunk is cut before it is sent).
      const n = chunk.length <= 1 ? 0 : Math.max(1, Math.min(armed.bytes ?? Math.floor(chunk.length / 2), chunk.length - 1));
      counters.cuts += 1;
      counters.bytesDown += n;
      const finish = () => {
        conn.end();
        armed.done({ conn: conn.id, forwarded: n, of: chunk.length });
      };
      if (n > 0) conn.client.write(chunk.subarray(0, n), finish);
      else finish();
      return;
    }
    counters.bytesDown += chunk.length;
    conn.client.write(chunk);
  }

  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const { port } = server.address();
  // Like the redis harness: a forgotten proxy must not keep the test process alive.
  server.unref();

  const proxy = {
    host,
    port,
    url: `redis://${host}:${port}`,
    events,
    /** Every command clients sent through the proxy: `{ conn, name, args, at }`. */
    commands,

    /** New connections are accepted and reset at once (the client sees ECONNRESET or EOF). */
    refuse() {
      refusing = true;
    },
    accept() {
      refusing = false;
    },

    /**
     * Forwards client→server as before, but holds every server→client byte (of open and
     * new connections) until `release()`; with `drop: true` they are discarded instead.
     */
    stallAfterWrite({ drop = false } = {}) {
      stall = { drop };
    },
    /** Replies flow again; held ones are delivered first, in order. */
    release() {
      stall = null;
      for (const conn of conns) {
        const held = conn.held;
        conn.held = [];
        for (const chunk of held) deliverDown(conn, chunk);
      }
    },

    /**
     * Cuts the next reply: forwards `bytes` of it (default: half) and destroys both
     * sockets. With `after` (a command name such as 'EVALSHA'), only a connection that
     * sent that command after this call is cut. Resolves when the cut happened.
     */
    cutMidReply({ after, bytes } = {}) {
      return new Promise((done) => {
        cut = { after: after?.toUpperCase(), bytes, done };
      });
    },

    /** Delays every chunk in both directions by `ms` (order kept). 0 turns it off. */
    latency(ms) {
      latencyMs = ms;
    },

    /** Destroys every open connection (`reset: true` sends RST instead of FIN). */
    killAll({ reset = false } = {}) {
      for (const conn of [...conns]) {
        counters.killed += 1;
        if (reset) {
          conn.client.resetAndDestroy();
          conn.upstream.resetAndDestroy();
        }
        conn.end();
      }
    },

    /**
     * Drops every flow open now without a word, as a NAT or a cloud load balancer that forgot
     * them: nothing passes either way (chunks delayed or held are discarded too) and the
     * proxy sends no FIN and no RST, so each side sees an open connection that never hears
     * anything again. With `reset: true` the next packet a client sends on one is answered
     * with a RST (`resetAndDestroy`), as a load balancer does after its idle timeout (a
     * server's next packet too, to the server). Flows opened later pass (a new mapping).
     * Other faults (killAll, release, cutMidReply) no longer touch dropped flows. `where`
     * (`({ id, clientPort, commands }) => boolean`) picks the flows to drop; others pass on.
     * Emits `given-up` `{ id, how: 'closed'|'reset', at, droppedAt }` when a client closes
     * one or is reset on it (performance.now() times). Returns the flows dropped:
     * `[{ id, clientPort, commands }]` (clientPort: the client's local port, to tell whose flow
     * it is; commands: the names of the first few commands it carried, to tell what for).
     */
    dropFlows({ reset = false, where = () => true } = {}) {
      const at = performance.now();
      const dropped = [];
      for (const conn of [...conns]) {
        const flow = { id: conn.id, clientPort: conn.client.remotePort, commands: [...conn.names] };
        if (!where(flow)) continue;
        conns.delete(conn);
        silent.add(conn);
        conn.silent = { reset, at };
        conn.held = [];
        conn.dueUp.length = 0;
        conn.dueDown.length = 0;
        counters.silentFlows += 1;
        dropped.push(flow);
      }
      return dropped;
    },

    /** New connections go to `target` (a port or `{ host, port }`); open ones stay. */
    retarget(next) {
      upstream = typeof next === 'number' ? { host: HOST, port: next } : { host: next.host ?? HOST, port: next.port };
    },

    /** Resolves with the next command named `name` a client sends (e.g. 'EVALSHA'). */
    nextCommand(name, { timeoutMs = 5000 } = {}) {
      const want = name.toUpperCase();
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => {
          events.off('command', on);
          reject(new Error(`no ${want} reached the proxy within ${timeoutMs} ms`));
        }, timeoutMs);
        const on = (entry) => {
          if (entry.name !== want) return;
          clearTimeout(timer);
          events.off('command', on);
          resolve(entry);
        };
        events.on('command', on);
      });
    },

    /** Resolves when a connection is opened through the proxy. */
    nextConnection({ timeoutMs = 5000 } = {}) {
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => {
          events.off('connection', on);
          reject(new Error(`no connection reached the proxy within ${timeoutMs} ms`));
        }, timeoutMs);
        const on = (id) => {
          clearTimeout(timer);
          events.off('connection', on);
          resolve(id);
        };
        events.on('connection', on);
      });
    },

    /** Commands named `name` sent so far (optionally since index `from` of `commands`). */
    count(name, from = 0) {
      const want = name.toUpperCase();
      let n = 0;
      for (let i = from; i < commands.length; i++) if (commands[i].name === want) n += 1;
      return n;
    },

    stats() {
      let held = 0;
      for (const conn of conns) for (const c of conn.held) held += c.length;
      return { ...counters, active: conns.size, silent: silent.size, held, refusing, stalled: Boolean(stall), latencyMs };
    },

    async close() {
      refusing = true;
      for (const conn of [...conns]) conn.end();
      for (const conn of [...silent]) {
        conn.dead = true;
        conn.client.destroy();
        conn.upstream.destroy();
      }
      silent.clear();
      for (const socket of [...lingering]) socket.destroy();
      await new Promise((resolve) => server.close(() => resolve()));
    },
  };
  return proxy;
}

/** A proxy in front of `port`, closed when the test `t` ends. */
export async function proxyFor(t, port) {
  const proxy = await startProxy(port);
  t.after(() => proxy.close());
  return proxy;
}
