// The nemesis: injects random, overlapping faults from a seeded stream and heals them.
// Every fault and heal is recorded in the history with the coordinator's clock.
//
// Overlap is the point, with two limits that keep a run inside what README promises: one
// fault that moves or replaces the primary at a time (a failover, a killed or stopped
// primary), started only when the cluster is whole again (every Sentinel names the same
// primary, which has both replicas online), so a run measures the driver and not a
// cluster that can no longer elect anyone; and, under Sentinel, at most one Sentinel cut
// off from the clients at a time (a driver that hears no Sentinel cannot follow: README
// "Without announcements").

import { setTimeout as sleep } from 'node:timers/promises';
import { admin, MASTER, until } from './cluster.mjs';

const HOST_OF = '127.0.0.1';
import { now } from './prng.mjs';

const WEIGHTS = {
  standalone: {
    'server-kill': 2, 'server-stop': 2, 'client-kill': 2, 'debug-sleep': 2, oom: 2,
    'proc-stop': 2, 'proc-kill': 2, 'net-cut': 2, 'net-stall': 2, 'net-latency': 1, 'net-silent-cut': 3,
  },
  sentinel: {
    failover: 2, 'primary-kill': 2, 'primary-kill-lagging': 1, 'primary-stop': 2,
    'client-kill': 2, 'debug-sleep': 2, oom: 2, 'proc-stop': 2, 'proc-kill': 2,
    'net-cut': 1, 'net-stall': 1, 'net-silent-cut': 3,
  },
  cluster: {
    'master-kill': 2, 'cluster-failover': 1, 'cluster-failover-force': 1, 'master-stop': 2, 'slot-migrate': 2,
    'client-kill': 2, 'debug-sleep': 2, oom: 1, 'proc-stop': 2, 'proc-kill': 2,
    'net-cut': 1, 'net-stall': 1, 'net-silent-cut': 3,
  },
};
/**
 * net-silent-cut: the dropped flows stay dropped; the fault lasts until the client processes
 * gave every one of them up (found it dead), at most this long (10x pingIntervalMs 500 +
 * commandTimeoutMs 1000, what an idle flow needs to be found). A flow left then is recorded as
 * not given up (a checker violation), and its proxy is free for other faults again.
 */
export const SILENT_CUT_WATCH_MS = 15_000;
const TOPOLOGY = new Set(['server-kill', 'server-stop', 'failover', 'primary-kill', 'primary-kill-lagging', 'primary-stop',
  'master-kill', 'cluster-failover', 'cluster-failover-force', 'master-stop', 'slot-migrate']);

/**
 * @param {object} o
 * @param {object} o.cluster from cluster.mjs
 * @param {object[]} o.proxies standalone: one per client process; sentinel: one per Sentinel; cluster: one per seed node
 * @param {object[]} o.fronts cluster: the proxy each node announces as its address (net-silent-cut only)
 * @param {object} o.clients { count, pid(p), incarnation(p), kill(p), restart(p), ownersOf(proxyPort, clientPorts) → Map(port → { p, inc }) }
 * @param {(ev: object) => void} o.record
 * @param {ReturnType<import('./prng.mjs').rng>} o.r
 */
export function createNemesis({ cluster, proxies, fronts = [], clients, record, r, keySlots = new Map(), seedNode = null }) {
  const mode = cluster.mode;
  const active = new Map(); // id → { kind, target, heal }
  let nextId = 0;
  let topologyBusy = false;
  const busyProcs = new Set();
  const busyProxies = new Set();
  const busyFronts = new Set();
  const pending = new Set();
  const track = (p) => { pending.add(p); p.finally(() => pending.delete(p)); return p; };

  function begin(kind, target, extra = {}) {
    const id = ++nextId;
    record({ k: 'fault', id, kind, target, at: now(), ...extra });
    return id;
  }
  function end(id, kind, target) {
    active.delete(id);
    record({ k: 'heal', id, kind, target, at: now() });
  }
  // A fault healed after `ms`, or earlier by healAll().
  function timed(kind, target, ms, heal, extra) {
    const id = begin(kind, target, extra);
    let done = false;
    const finish = async () => {
      if (done) return;
      done = true;
      try { await heal(); } catch { /* e.g. the node was killed meanwhile; healAll retries health */ }
      end(id, kind, target);
    };
    active.set(id, { kind, target, finish });
    track(sleep(ms).then(finish));
    return id;
  }
  const safe = (p) => p.catch(() => {});

  // After a topology fault: busy until healed and the cluster is whole again (bounded).
  function topology(work) {
    topologyBusy = true;
    track((async () => {
      try { await work(); } catch { /* recorded by the heal */ }
      const deadline = Date.now() + 30_000;
      while (Date.now() < deadline) {
        try { if (await cluster.healthy()) break; } catch { /* not yet */ }
        await sleep(100);
      }
      topologyBusy = false;
    })());
  }

  // Cluster: which of the run's keys a shard (a master's slots) serves now, recorded with
  // each topology fault so the checker excuses losses on that shard only.
  const keysOf = (m) => [...keySlots].filter(([, slot]) => m.slots.some(([a, b = a]) => slot >= a && slot <= b)).map(([k]) => k);
  const healthyNow = () => safe(cluster.healthy()).then((h) => h === true);

  async function inject(kind) {
    // Cluster: CLIENT KILL, DEBUG SLEEP and OOM hit any master.
    const primary = mode === 'cluster' ? r.pick(await cluster.masters())?.node : await cluster.primary();
    switch (kind) {
      case 'master-kill': {
        if (topologyBusy || !(await healthyNow())) return false;
        const masters = await cluster.masters();
        // The URL's first seed node a third of the time when it is a master (a driver
        // whose first seed dies must come back through the others).
        const seedMaster = masters.find((m) => m.node === seedNode);
        const m = seedMaster && r.chance(1 / 3) ? seedMaster : r.pick(masters);
        const replica = m.replicas[0];
        const extraMs = r.int(0, 1500);
        topology(async () => {
          const id = begin(kind, m.node.port, { keys: keysOf(m), seed: m.node === seedNode, replica: replica?.port });
          await m.node.kill();
          // Restarted only once its replica has taken over, so it rejoins as a replica (a
          // master restarted empty before that would be a restart, not a failover).
          await until('the replica takes over', async () => (await admin(replica.port, ['ROLE'], 500))[0] === 'master', 20_000).catch(() => {});
          await sleep(extraMs);
          await m.node.restart({ keepData: true }); // dead: keeps its dir, so its nodes.conf
          end(id, kind, m.node.port);
        });
        return true;
      }
      case 'cluster-failover':
      case 'cluster-failover-force': {
        if (topologyBusy || !(await healthyNow())) return false;
        const m = r.pick(await cluster.masters());
        const replica = m.replicas[0];
        topology(async () => {
          const id = begin(kind, replica.port, { keys: keysOf(m), master: m.node.port });
          try {
            await admin(replica.port, kind === 'cluster-failover' ? ['CLUSTER', 'FAILOVER'] : ['CLUSTER', 'FAILOVER', 'FORCE'], 2000);
            await until('the replica takes over', async () => (await admin(replica.port, ['ROLE'], 500))[0] === 'master', 10_000);
          } catch (err) {
            record({ k: 'fault-refused', id, kind, at: now(), message: String(err?.message ?? err) });
          } finally {
            end(id, kind, replica.port);
          }
        });
        return true;
      }
      case 'master-stop': {
        if (topologyBusy || !(await healthyNow())) return false;
        const m = r.pick(await cluster.masters());
        // Longer than cluster-node-timeout (1000 ms) most of the time: its replica takes over
        // and the master, continued, finds itself demoted.
        const ms = r.int(500, 4000);
        topology(async () => {
          await m.node.pause();
          await new Promise((resolve) => timed(kind, m.node.port, ms, async () => { try { await m.node.resume(); } finally { resolve(); } }, { keys: keysOf(m) }));
        });
        return true;
      }
      case 'slot-migrate': {
        if (topologyBusy || !(await healthyNow()) || keySlots.size === 0) return false;
        const [key, slot] = r.pick([...keySlots]);
        const masters = await cluster.masters();
        const from = masters.find((m) => m.slots.some(([a, b = a]) => slot >= a && slot <= b));
        const to = r.pick(masters.filter((m) => m !== from));
        const pauseMs = r.int(0, 1000);
        topology(async () => {
          const id = begin(kind, from.node.port, { key, slot, to: to.node.port });
          try {
            await admin(to.node.port, ['CLUSTER', 'SETSLOT', String(slot), 'IMPORTING', from.id], 1000);
            await admin(from.node.port, ['CLUSTER', 'SETSLOT', String(slot), 'MIGRATING', to.id], 1000);
            // Traffic meets the slot half-moved (ASK, TRYAGAIN) for a while.
            await sleep(pauseMs);
            for (let round = 0; round < 50; round++) {
              const moving = await admin(from.node.port, ['CLUSTER', 'GETKEYSINSLOT', String(slot), '100'], 1000);
              if (moving.length === 0) break;
              try {
                await admin(from.node.port, ['MIGRATE', HOST_OF, String(to.node.port), '', '0', '5000', 'KEYS', ...moving], 8000);
              } catch (err) {
                record({ k: 'nemesis-error', kind, at: now(), message: `MIGRATE: ${err?.message ?? err}` });
                await sleep(50);
              }
              await sleep(r.int(0, 200));
            }
            // The new owner first, then the old one, then every other master (as redis-cli does).
            for (const m of [to, from, ...masters.filter((x) => x !== to && x !== from)]) {
              await admin(m.node.port, ['CLUSTER', 'SETSLOT', String(slot), 'NODE', to.id], 1000);
            }
          } catch (err) {
            record({ k: 'fault-refused', id, kind, at: now(), message: String(err?.message ?? err) });
          } finally {
            end(id, kind, from.node.port);
          }
        });
        return true;
      }
      case 'server-kill': {
        if (topologyBusy) return false;
        const node = primary;
        topology(async () => {
          const id = begin(kind, node.port);
          await node.kill();
          await sleep(r.int(100, 1500));
          await node.restart();
          end(id, kind, node.port);
        });
        return true;
      }
      case 'server-stop':
      case 'primary-stop': {
        if (topologyBusy || !primary) return false;
        const node = primary;
        const ms = r.int(200, mode === 'sentinel' ? 2500 : 1500);
        topology(async () => {
          await node.pause();
          await new Promise((resolve) => timed(kind, node.port, ms, async () => { try { await node.resume(); } finally { resolve(); } }));
        });
        return true;
      }
      case 'failover': {
        if (topologyBusy || !(await safe(cluster.healthy()).then((h) => h))) return false;
        const s = r.int(0, cluster.sentinels.length - 1);
        topology(async () => {
          const id = begin(kind, s);
          try {
            await admin(cluster.sentinels[s].port, ['SENTINEL', 'FAILOVER', MASTER], 2000);
          } catch (err) {
            record({ k: 'fault-refused', id, kind, at: now(), message: String(err?.message ?? err) });
          } finally {
            end(id, kind, s);
          }
        });
        return true;
      }
      case 'primary-kill':
      case 'primary-kill-lagging': {
        if (topologyBusy || !primary || !(await safe(cluster.healthy()).then((h) => h))) return false;
        const node = primary;
        const replicas = cluster.nodes.filter((n) => n !== node);
        const downMs = r.int(300, 3000);
        const lagMs = r.int(100, 400);
        topology(async () => {
          const id = begin(kind, node.port, { downMs, lagMs: kind === 'primary-kill-lagging' ? lagMs : undefined });
          if (kind === 'primary-kill-lagging') {
            // The replicas fall behind while writes go on, then the primary dies.
            for (const rep of replicas) await safe(rep.pause());
            await sleep(lagMs);
            await node.kill();
            await sleep(50);
            for (const rep of replicas) await safe(rep.resume());
          } else {
            await node.kill();
          }
          await sleep(downMs);
          await node.restart();
          end(id, kind, node.port);
        });
        return true;
      }
      case 'client-kill': {
        if (!primary) return false;
        const type = r.pick(['normal', 'pubsub']);
        const id = begin(kind, primary.port, { type });
        await safe(admin(primary.port, ['CLIENT', 'KILL', 'TYPE', type], 1000));
        end(id, kind, primary.port);
        return true;
      }
      case 'debug-sleep': {
        if (!primary) return false;
        const seconds = r.int(1, mode === 'standalone' ? 12 : 6) / 10;
        const id = begin(kind, primary.port, { seconds });
        track(safe(admin(primary.port, ['DEBUG', 'SLEEP', String(seconds)], seconds * 1000 + 3000)).then(() => end(id, kind, primary.port)));
        return true;
      }
      case 'oom': {
        if (!primary) return false;
        const node = primary;
        const port = node.port;
        await safe(admin(port, ['CONFIG', 'SET', 'maxmemory', '1'], 1000));
        timed(kind, port, r.int(200, 1500), () => admin(port, ['CONFIG', 'SET', 'maxmemory', '0'], 1000));
        return true;
      }
      case 'proc-stop':
      case 'proc-kill': {
        const free = [...Array(clients.count).keys()].filter((p) => !busyProcs.has(p) && clients.pid(p));
        if (free.length <= 1) return false; // someone must keep working
        const p = r.pick(free);
        busyProcs.add(p);
        const inc = clients.incarnation(p);
        if (kind === 'proc-stop') {
          const pid = clients.pid(p);
          process.kill(pid, 'SIGSTOP');
          timed(kind, p, r.int(200, 2500), async () => {
            try { process.kill(pid, 'SIGCONT'); } finally { busyProcs.delete(p); }
          }, { inc });
        } else {
          const id = begin(kind, p, { inc });
          clients.kill(p);
          track((async () => {
            await sleep(r.int(100, 1000));
            await clients.restart(p);
            busyProcs.delete(p);
            end(id, kind, p);
          })());
        }
        return true;
      }
      case 'net-silent-cut':
        if (mode === 'cluster') {
          // Before the nodes' announced addresses, where the drivers' node connections go (the
          // seed proxies carry none once the slot map is known): one at a time.
          if (busyFronts.size > 0) return false;
          const i = r.int(0, fronts.length - 1);
          busyFronts.add(i);
          silentCut(i, fronts[i], r.chance(0.5), () => busyFronts.delete(i), { node: cluster.nodes[i].port });
          return true;
        }
      // falls through: elsewhere the proxies before the client processes' Redis or the Sentinels
      case 'net-cut':
      case 'net-stall':
      case 'net-latency': {
        const free = [...proxies.keys()].filter((i) => !busyProxies.has(i));
        // Under Sentinel the proxies stand before the Sentinels: one at a time (see above).
        // In a Cluster they stand before the seed nodes: one at a time too (redirects go to the
        // real addresses, which no proxy stands before).
        if (free.length === 0 || (mode !== 'standalone' && busyProxies.size > 0)) return false;
        const i = r.pick(free);
        const proxy = proxies[i];
        busyProxies.add(i);
        const ms = kind === 'net-latency' ? r.int(500, 2000) : r.int(200, 1500);
        if (kind === 'net-silent-cut') {
          silentCut(i, proxy, r.chance(0.5), () => busyProxies.delete(i));
        } else if (kind === 'net-cut') {
          proxy.refuse();
          proxy.killAll({ reset: true });
          timed(kind, i, ms, () => { proxy.accept(); busyProxies.delete(i); });
        } else if (kind === 'net-stall') {
          const drop = r.chance(0.3);
          proxy.stallAfterWrite({ drop });
          // Bytes lost from a live TCP stream cannot happen: a dropping stall (a black hole)
          // ends with its connections reset, as TCP would end them. Releasing them instead
          // would pair later replies with earlier commands (CHAOS.md, the first long run).
          timed(kind, i, ms, () => {
            if (drop) proxy.killAll({ reset: true });
            proxy.release();
            busyProxies.delete(i);
          }, { drop });
        } else {
          const latency = r.int(20, 150);
          proxy.latency(latency);
          timed(kind, i, ms, () => { proxy.latency(0); busyProxies.delete(i); }, { latency });
        }
        return true;
      }
      default:
        throw new Error(`unknown fault ${kind}`);
    }
  }

  // A NAT or load balancer forgets the flows open through one proxy: no FIN, no RST (or, with
  // `reset`, a RST to the next packet). New flows pass at once; the dropped ones are dead until
  // the driver finds them (its liveness PING, or a command that times out on one). Each flow is
  // recorded with the client process holding it, and each given up with when and how, so the
  // checker can time the finding per flow.
  function silentCut(i, proxy, reset, free, extra = {}) {
    // A node's replication link (a replica's PSYNC through the front proxy) is not a client's.
    const dropped = proxy.dropFlows({ reset, where: (f) => !f.commands.some((c) => c === 'PSYNC' || c === 'SYNC' || c === 'REPLCONF') });
    const owners = clients.ownersOf?.(proxy.port, dropped.map((f) => f.clientPort)) ?? new Map();
    // What each flow carried: a subscription (release notifications, or a Sentinel watcher's
    // announcements), or commands.
    const use = (f) => (f.commands.some((c) => c.endsWith('SUBSCRIBE')) ? 'subscription' : 'commands');
    const flows = dropped.map((f) => ({ flow: f.id, use: use(f), ...(owners.get(f.clientPort) ?? { p: null, inc: null }) }));
    const id = begin('net-silent-cut', i, { reset, flows, ...extra });
    const left = new Set(dropped.map((f) => f.id));
    let settle;
    const allGivenUp = new Promise((resolve) => { settle = resolve; });
    const onGivenUp = (g) => {
      if (!left.delete(g.id)) return;
      record({ k: 'flow-given-up', id, flow: g.id, how: g.how, at: now() });
      if (left.size === 0) settle();
    };
    proxy.events.on('given-up', onGivenUp);
    if (left.size === 0) settle();
    let done = false;
    // ended: 'given-up' (every flow), 'watch' (ran out), 'heal-all' (the run's end came first).
    const finish = async (ended = 'heal-all') => {
      if (done) return;
      done = true;
      proxy.events.off('given-up', onGivenUp);
      free();
      active.delete(id);
      record({ k: 'heal', id, kind: 'net-silent-cut', target: i, at: now(), ended, unfound: [...left] });
    };
    active.set(id, { kind: 'net-silent-cut', target: i, finish: () => finish('heal-all') });
    // unref: the watch must not hold the coordinator once everything else is done.
    const watch = new Promise((resolve) => setTimeout(() => resolve('watch'), SILENT_CUT_WATCH_MS).unref());
    track(Promise.race([allGivenUp.then(() => 'given-up'), watch]).then(finish));
  }

  return {
    /** What is still going on, for a run that overstays (run.mjs's watchdog). */
    describe() {
      return `faults active: ${[...active.values()].map((a) => a.kind).join(', ') || 'none'}; pending tasks: ${pending.size}; topology busy: ${topologyBusy}`;
    },
    /** Injects faults until `untilAt` (ms, CLOCK_MONOTONIC). */
    /** Injects faults until `untilAt`, or until `stopped()` says the run has seen enough. */
    async run(untilAt, stopped = () => false) {
      while (now() < untilAt && !stopped()) {
        await sleep(r.int(150, 1200));
        if (now() >= untilAt || stopped()) break;
        const kind = r.weighted(WEIGHTS[mode]);
        if (TOPOLOGY.has(kind) && topologyBusy) continue;
        try { await inject(kind); } catch (err) { record({ k: 'nemesis-error', kind, at: now(), message: String(err?.message ?? err) }); }
      }
    },
    /** Heals every fault now, waits for the pending ones, then for a whole cluster. */
    async healAll() {
      for (const a of [...active.values()]) await a.finish();
      while (pending.size) await Promise.allSettled([...pending]);
      const deadline = Date.now() + 60_000;
      for (const n of cluster.nodes) await safe(admin(n.port, ['CONFIG', 'SET', 'maxmemory', '0'], 1000));
      while (!(await safe(cluster.healthy()).then((h) => h))) {
        if (Date.now() > deadline) throw new Error('the cluster did not become whole within 60 s after the last fault');
        await sleep(100);
      }
      record({ k: 'healed-all', at: now() });
    },
  };
}
