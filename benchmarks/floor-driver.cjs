// The floor of this package at many calls in flight, in the shape of the driver, for
// benchmarks/throughput-ab.mjs (issue 37, decision 0185): each pair is the driver's two
// scripts (src/scripts/acquire.lua, release.lua) as EVALSHA, packed on the runtime's thread
// and sent on the driver's own connection (src/connection/lane.rs) through the crossing every
// call takes, with no driver on it: no key hashing, wait line, lease, timer or reply read
// (src/binding/floor.rs). What a build's addon threads spend per pair above this is the
// driver's; what this spends is the connection's and the crossing's. With
// DOKEBI_FLOOR=crossing each call only crosses to the runtime's thread and back, with no
// connection: the crossing's share alone (decision 0187).
//
// `npm run build:bench-floor` copies it to target/bench-floor/index.js, beside the build of
// the exports it drives; then
//
//   node benchmarks/throughput-ab.mjs --a DIR --b target/bench-floor --label-b floor ...

'use strict';

const floor = require('./lock-redis.linux-x64-gnu.node');

const crossingOnly = process.env.DOKEBI_FLOOR === 'crossing';

async function ok(reply) {
  if (!(await reply)) throw new Error('the floor: Redis did not answer, or answered an error');
}

// What throughput.worker.mjs reads after a run: the floor keeps no leases and no counts.
const stats = () => ({ trackedLeases: 0, inProgress: 0, subscription: null, errors: {} });

exports.createRedisLockDriver = (url, options) => {
  if (crossingOnly) {
    return {
      async acquire() {
        await ok(floor.floorCrossing());
        return { release: () => ok(floor.floorCrossing()) };
      },
      stats,
      async shutdown() {},
    };
  }
  const ready = ok(floor.floorLaneConnect(Number(new URL(url).port), options.namespace ?? 'floor'));
  let serial = 0;
  return {
    async acquire(key) {
      await ready;
      const mine = ++serial;
      await ok(floor.floorLaneAcquire(key, mine));
      return { release: () => ok(floor.floorLaneRelease(key, mine)) };
    },
    stats,
    async shutdown() {
      await ready.catch(() => {});
    },
  };
};
