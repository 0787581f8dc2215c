// The ioredis probe (`--probe ioredis`, Sentinel mode only; issue 23 item 3): a plain ioredis
// Sentinel client in a process of its own, beside the drivers, through the same storm. Every
// ~50 ms it writes one small key (SET with PX, then WAIT minReplicas like the driver's
// acquire when minReplicas > 0) and records each success or failure as a `probe` event with
// the monotonic time, and the primary's port it was connected to. The checker ignores these
// events for its invariants; its summary sets the probe's longest gaps without a write beside
// the drivers' longest gaps without a lease, so a reader can tell a gap of the servers and
// Sentinels (the probe could not write either) from a gap of the driver (it could).
//
// The client is what a careful ioredis user would configure, not a straw man:
// - the same Sentinel addresses as the drivers (the fault proxies before the Sentinels), and
//   only those (`updateSentinels: false`: ioredis would otherwise add the Sentinels' real
//   addresses, which no proxy stands before, and dodge the Sentinel cuts the drivers get);
// - `failoverDetector: true`: it subscribes to `+switch-master` on the Sentinels and
//   reconnects at the first announcement (what the driver does, decision 0050); its
//   subscriptions reconnect after 1 s (`sentinelReconnectStrategy`; default 60 s);
// - `reconnectOnError` on READONLY: a demoted primary makes it ask the Sentinels again;
// - connect/command timeouts 1000 ms as the drivers'; reconnect after 50 ms × attempt,
//   at most 500 ms (`retryStrategy`; default 50 × 2^n ms + jitter, up to 5 s), all Sentinels
//   unreachable: again after 50 ms × attempt, at most 500 ms (`sentinelRetryStrategy`);
// - `maxRetriesPerRequest: 1`, offline queue on: a write made while disconnected waits for
//   the reconnection, bounded by the command timeout, and is resent at most once.
// One write at a time: the next starts 50 ms after the previous one started, or when it
// settled if it took longer (at most the 1 s command timeout, and WAIT's 500 ms).
//
// Started by run.mjs with fork(); its options come in CHAOS_PROBE (JSON).

import { createRequire } from 'node:module';
import { setTimeout as sleep } from 'node:timers/promises';
import { now } from './prng.mjs';

const require = createRequire(import.meta.url);
const Redis = require('ioredis');

const cfg = JSON.parse(process.env.CHAOS_PROBE);
const EVERY_MS = 50;
const PX_MS = 2000;

const send = (ev) => {
  if (process.connected) process.send({ t: 'ev', ev: { k: 'probe', ...ev } });
};
// An error's class, never an address: its first sentence, numbers (ports, delays) as N (the
// summary, which tallies them, is committed).
const describe = (err) => ({
  name: err?.name ?? typeof err,
  code: typeof err?.code === 'string' ? err.code : undefined,
  msg: String(err?.message ?? err).split(/\.(\s|$)/)[0].replace(/\d+(\.\d+)*/g, 'N').slice(0, 80),
});
// ioredis prints the errors of the failover detector's Sentinel connections, which have no
// listener, with console.error: recorded as events instead of a stack on the run's stderr.
const consoleError = console.error;
console.error = (first, ...rest) => {
  if (first === '[ioredis] Unhandled error event:') send({ ev: 'sentinel-error', at: now(), err: describe(String(rest[0] ?? '').split('\n')[0].replace(/^Error: /, '')) });
  else consoleError(first, ...rest);
};

let stopping = false;
let finished = false;
process.on('disconnect', () => { if (!finished) process.exit(2); });
let stopped;
const stopRequested = new Promise((resolve) => { stopped = resolve; });
process.on('message', (msg) => {
  if (msg.t === 'stop') { stopping = true; stopped(); }
});

const redis = new Redis({
  sentinels: cfg.sentinels,
  name: cfg.name,
  updateSentinels: false,
  failoverDetector: true,
  sentinelReconnectStrategy: () => 1000,
  connectTimeout: cfg.connectTimeoutMs,
  commandTimeout: cfg.commandTimeoutMs,
  sentinelCommandTimeout: cfg.commandTimeoutMs,
  retryStrategy: (times) => Math.min(50 * times, 500),
  sentinelRetryStrategy: (times) => Math.min(50 * times, 500),
  reconnectOnError: (err) => /^READONLY/.test(err.message),
  maxRetriesPerRequest: 1,
  enableOfflineQueue: true,
});
const port = () => redis.stream?.remotePort ?? null;
// The connection's life, for the history (not judged): when it was ready, on which primary.
redis.on('ready', () => send({ ev: 'ready', at: now(), port: port() }));
redis.on('close', () => send({ ev: 'close', at: now() }));
redis.on('error', (err) => send({ ev: 'error', at: now(), err: describe(err) }));

send({ ev: 'start', at: now(), pid: process.pid });
let n = 0;
const loop = (async () => {
  while (!stopping) {
    const startAt = now();
    const i = ++n;
    let on = port();
    try {
      await redis.set(`${cfg.prefix}:${i % 64}`, String(i), 'PX', PX_MS);
      on = port() ?? on;
      let acks;
      if (cfg.minReplicas > 0) acks = Number(await redis.call('WAIT', String(cfg.minReplicas), String(cfg.replicaTimeoutMs)));
      send({ ev: 'write', at: now(), startAt, n: i, ok: true, port: on, acks });
    } catch (err) {
      send({ ev: 'write', at: now(), startAt, n: i, ok: false, port: on, err: describe(err) });
    }
    const next = startAt + EVERY_MS - now();
    if (next > 0) await sleep(next);
  }
})();

await stopRequested;
await loop;
send({ ev: 'stop', at: now(), writes: n });
redis.disconnect();
finished = true;
process.disconnect();
