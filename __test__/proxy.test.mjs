// The fault proxy (helpers/proxy.mjs) itself: a fault it injects must be one a real network
// can have. TCP never reorders bytes inside a stream; a proxy that did would pair a Redis
// reply with another command and fail a chaos run for the harness's own defect.

import assert from 'node:assert/strict';
import net from 'node:net';
import { test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { startProxy } from './helpers/proxy.mjs';

test('latency switched on and off under a steady stream never reorders the bytes of a connection', { timeout: 60_000 }, async (t) => {
  const echo = net.createServer((s) => { s.on('error', () => {}); s.pipe(s); }).listen(0, '127.0.0.1');
  await new Promise((resolve) => echo.once('listening', resolve));
  t.after(() => echo.close());
  const proxy = await startProxy(echo.address().port);
  t.after(() => proxy.close());
  const client = net.connect(proxy.port, '127.0.0.1');
  await new Promise((resolve) => client.once('connect', resolve));
  t.after(() => client.destroy());

  // Numbered lines out, through the proxy both ways, checked in order as they come back.
  let buf = '';
  let expected = 0;
  const outOfOrder = [];
  client.setEncoding('latin1');
  client.on('data', (d) => {
    buf += d;
    let i;
    while ((i = buf.indexOf('\n')) >= 0) {
      const n = Number(buf.slice(0, i));
      buf = buf.slice(i + 1);
      if (n !== expected && outOfOrder.length < 5) outOfOrder.push({ expected, got: n });
      expected = n + 1;
    }
  });
  let sent = 0;
  const writer = setInterval(() => { for (let k = 0; k < 3; k++) client.write(`${sent++}\n`); }, 0);
  // Each round lifts the latency while delayed chunks are still queued, then keeps the loop
  // busy for a moment, as a loaded machine does, so a due timer fires late.
  for (let round = 0; round < 300; round++) {
    proxy.latency(3 + (round % 5));
    await sleep(7);
    proxy.latency(0);
    const until = performance.now() + 2;
    while (performance.now() < until);
    await sleep(3);
  }
  clearInterval(writer);
  while (expected < sent) await sleep(10);
  assert.deepEqual(outOfOrder, [], `bytes reordered (${sent} lines)`);
});
