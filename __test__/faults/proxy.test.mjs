// Proves the fault proxy (helpers/proxy.mjs) itself, so a failing fault test can be trusted
// to be about the driver and not about the proxy.

import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { proxyFor } from '../helpers/proxy.mjs';
import { external, startRedis } from '../helpers/redis.mjs';
import { rawClient } from './support.mjs';

const skip = external && 'needs throwaway redis-servers (REDIS_URL is set)';

let redis;
before(async () => { if (!external) redis = await startRedis(); });
after(() => redis?.stop());


/** A raw socket through the proxy that collects every byte it receives. */
function socketTo(port) {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host: '127.0.0.1', port });
    const got = { bytes: Buffer.alloc(0), closed: false, error: undefined };
    socket.on('data', (c) => { got.bytes = Buffer.concat([got.bytes, c]); });
    const closed = new Promise((res) => socket.on('close', () => { got.closed = true; res(); }));
    socket.on('error', (err) => { got.error = err; });
    socket.on('connect', () => resolve({ socket, got, closed }));
    socket.once('error', reject);
  });
}

test('forwards both ways, logs the commands and counts connections and bytes', { skip }, async (t) => {
  const proxy = await proxyFor(t, redis.port);
  const c = await rawClient(proxy.port);
  t.after(() => c.close());
  assert.equal(await c.call('SET', 'proxied', 'välue'), 'OK');
  assert.equal(await c.call('GET', 'proxied'), 'välue');
  assert.equal(await redis.command('GET', 'proxied'), 'välue', 'the write reached the real server');
  assert.deepEqual(proxy.commands.map((e) => e.name), ['SET', 'GET']);
  assert.deepEqual(proxy.commands[0].args, ['SET', 'proxied', 'välue']);
  assert.equal(proxy.count('GET'), 1);
  const s = proxy.stats();
  assert.equal(s.accepted, 1);
  assert.equal(s.active, 1);
  assert.ok(s.bytesUp > 20 && s.bytesDown > 10, JSON.stringify(s));
});

test('refuse() resets new connections at once; accept() lets them in again; open ones stay', { skip }, async (t) => {
  const proxy = await proxyFor(t, redis.port);
  const open = await rawClient(proxy.port);
  t.after(() => open.close());
  proxy.refuse();
  // Reset as soon as it is accepted: the client sees ECONNRESET (during or right after connect).
  const outcome = await new Promise((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port: proxy.port });
    let bytes = 0;
    s.on('data', (c) => { bytes += c.length; });
    s.on('error', () => {});
    s.on('close', () => resolve(bytes));
  });
  assert.equal(outcome, 0, 'nothing was served');
  assert.equal(proxy.stats().refused, 1);
  assert.equal(await open.call('PING'), 'PONG', 'a connection opened before refuse() still works');
  proxy.accept();
  const c = await rawClient(proxy.port);
  t.after(() => c.close());
  assert.equal(await c.call('PING'), 'PONG');
});

test('stallAfterWrite() lets the command run but holds its reply until release()', { skip }, async (t) => {
  const proxy = await proxyFor(t, redis.port);
  const c = await rawClient(proxy.port);
  t.after(() => c.close());
  await c.call('PING');
  proxy.stallAfterWrite();
  let replied = false;
  const reply = c.call('INCR', 'stalled-counter').then((v) => { replied = true; return v; });
  await proxy.nextCommand('INCR');
  // The server ran it (ask it directly) while the client still has no reply.
  for (let i = 0; i < 100 && (await redis.command('GET', 'stalled-counter')) !== '1'; i++);
  assert.equal(await redis.command('GET', 'stalled-counter'), '1');
  assert.equal(replied, false);
  assert.ok(proxy.stats().held > 0);
  proxy.release();
  assert.equal(await reply, 1);
});

test('stallAfterWrite({ drop: true }) discards replies; after release() new replies flow', { skip }, async (t) => {
  const proxy = await proxyFor(t, redis.port);
  const c = await rawClient(proxy.port);
  t.after(() => c.close());
  proxy.stallAfterWrite({ drop: true });
  const lost = c.call('INCR', 'dropped-counter');
  lost.catch(() => {});
  await proxy.nextCommand('INCR');
  for (let i = 0; i < 100 && (await redis.command('GET', 'dropped-counter')) !== '1'; i++);
  assert.equal(await redis.command('GET', 'dropped-counter'), '1');
  proxy.release();
  assert.ok(proxy.stats().droppedBytes > 0);
  const fresh = await rawClient(proxy.port);
  t.after(() => fresh.close());
  assert.equal(await fresh.call('PING'), 'PONG');
});

test('cutMidReply() forwards part of the next reply and closes the connection', { skip }, async (t) => {
  const proxy = await proxyFor(t, redis.port);
  await redis.command('SET', 'long-value', 'x'.repeat(100));
  const { socket, got, closed } = await socketTo(proxy.port);
  const cut = proxy.cutMidReply({ after: 'GET', bytes: 7 });
  socket.write('*2\r\n$3\r\nGET\r\n$10\r\nlong-value\r\n');
  const info = await cut;
  await closed;
  assert.equal(info.forwarded, 7);
  assert.ok(info.of > 100);
  assert.equal(got.bytes.toString(), '$100\r\nx', 'only the first 7 bytes arrived');
  assert.equal(proxy.stats().cuts, 1);
  assert.equal(proxy.stats().active, 0);
});

test('cutMidReply({ after }) spares other commands and other connections', { skip }, async (t) => {
  const proxy = await proxyFor(t, redis.port);
  const a = await rawClient(proxy.port);
  const b = await rawClient(proxy.port);
  t.after(() => { a.close(); b.close(); });
  const cut = proxy.cutMidReply({ after: 'ECHO' });
  assert.equal(await a.call('PING'), 'PONG');
  assert.equal(await b.call('PING'), 'PONG');
  await assert.rejects(b.call('ECHO', 'abcdefgh'), /closed/);
  await cut;
  assert.equal(await a.call('PING'), 'PONG', 'the other connection is untouched');
});

test('latency(ms) delays each direction and keeps the order', { skip }, async (t) => {
  const proxy = await proxyFor(t, redis.port);
  const c = await rawClient(proxy.port);
  t.after(() => c.close());
  await c.call('PING');
  // 250 ms each way, so that the round trip without latency (about 1 ms, tens on a busy
  // machine) stays far below the one latency would make (500 ms and more).
  proxy.latency(250);
  const started = performance.now();
  const replies = await Promise.all([c.call('SET', 'lat', '1'), c.call('INCR', 'lat'), c.call('GET', 'lat')]);
  const took = performance.now() - started;
  assert.deepEqual(replies, ['OK', 2, '2']);
  assert.ok(took >= 495, `a round trip took ${took.toFixed(0)} ms with 250 ms each way`);
  proxy.latency(0);
  const quick = performance.now();
  await c.call('PING');
  const quickTook = performance.now() - quick;
  assert.ok(quickTook < 250, `a round trip took ${quickTook.toFixed(0)} ms after latency(0)`);
});

// TCP never reorders bytes inside a stream; a proxy that did would pair a Redis reply with
// another command (a chaos run, seed 2401, handed one key's fence to another key's acquire).
test('latency switched on and off under a steady stream never reorders the bytes of a connection', { timeout: 60_000 }, async (t) => {
  const echo = net.createServer((s) => { s.on('error', () => {}); s.pipe(s); }).listen(0, '127.0.0.1');
  await new Promise((resolve) => echo.once('listening', resolve));
  t.after(() => echo.close());
  const proxy = await proxyFor(t, echo.address().port);
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

test('killAll() closes every open connection; retarget() sends new ones to another server', { skip }, async (t) => {
  const other = await startRedis();
  t.after(() => other.stop());
  await other.command('SET', 'where', 'other');
  await redis.command('SET', 'where', 'first');
  const proxy = await proxyFor(t, redis.port);
  const a = await rawClient(proxy.port);
  assert.equal(await a.call('GET', 'where'), 'first');
  proxy.retarget(other.port);
  assert.equal(await a.call('GET', 'where'), 'first', 'an open connection stays on its server');
  const closed = new Promise((resolve) => a.socket.on('close', resolve));
  proxy.killAll();
  await closed;
  assert.equal(proxy.stats().active, 0);
  const b = await rawClient(proxy.port);
  t.after(() => b.close());
  assert.equal(await b.call('GET', 'where'), 'other');
});

/** Resolves once `cond()` is true; fails after `ms` (a bound far above what it needs). */
async function until(what, cond, ms = 5000) {
  const deadline = performance.now() + ms;
  while (!(await cond())) {
    if (performance.now() > deadline) assert.fail(`${what}: not within ${ms} ms`);
    await sleep(10);
  }
}

const resp = (...args) => args.reduce((s, a) => `${s}$${Buffer.byteLength(a)}\r\n${a}\r\n`, `*${args.length}\r\n`);

test('dropFlows() silences the open flows both ways without closing either side; new connections pass', { skip }, async (t) => {
  const proxy = await proxyFor(t, redis.port);
  const sub = await socketTo(proxy.port);
  const cmd = await socketTo(proxy.port);
  t.after(() => { sub.socket.destroy(); cmd.socket.destroy(); });
  sub.socket.write(resp('SUBSCRIBE', 'silent-channel'));
  await until('the subscription is confirmed', () => sub.got.bytes.includes('silent-channel'));
  const heard = sub.got.bytes.length;

  const dropped = proxy.dropFlows();
  assert.deepEqual(dropped.map((f) => f.clientPort).sort(), [sub.socket.localPort, cmd.socket.localPort].sort());
  assert.equal(proxy.stats().silent, 2);
  assert.equal(proxy.stats().active, 0);

  // Client to server: the SET reaches the proxy and goes no further.
  cmd.socket.write(resp('SET', 'silent-key', 'v'));
  await until('the proxy swallows the SET', () => proxy.stats().silentBytes > 0);
  assert.equal(await redis.command('GET', 'silent-key'), null, 'the command never reached the server');
  // Server to client: the server still holds the subscriber (its side stays open) and
  // publishes to it; the proxy swallows the message.
  const before = proxy.stats().silentBytes;
  assert.equal(await redis.command('PUBLISH', 'silent-channel', 'hello'), 1, "the server's side of the flow is still open");
  await until('the proxy swallows the message', () => proxy.stats().silentBytes > before);
  assert.equal(sub.got.bytes.length, heard, 'the subscriber heard nothing more');
  assert.equal(cmd.got.bytes.length, 0, 'no reply came');
  assert.equal(sub.got.closed || cmd.got.closed, false, 'no FIN or RST reached a client');
  assert.equal(sub.got.error ?? cmd.got.error, undefined);

  // A new flow passes (a NAT makes a new mapping).
  const fresh = await rawClient(proxy.port);
  t.after(() => fresh.close());
  assert.equal(await fresh.call('PING'), 'PONG');
  assert.equal(proxy.stats().active, 1);
  assert.equal(sub.got.closed || cmd.got.closed, false, 'the dropped flows are still open');

  // The client giving a flow up is what a chaos run measures as "found".
  const givenUp = new Promise((resolve) => proxy.events.once('given-up', resolve));
  const cmdFlow = dropped.find((f) => f.clientPort === cmd.socket.localPort).id;
  cmd.socket.destroy();
  const g = await givenUp;
  assert.equal(g.how, 'closed');
  assert.equal(g.id, cmdFlow);
  assert.equal(proxy.stats().silent, 1);
});

test('dropFlows({ reset: true }) answers the next packet a client sends on a dropped flow with a RST', { skip }, async (t) => {
  const proxy = await proxyFor(t, redis.port);
  const a = await socketTo(proxy.port);
  const idle = await socketTo(proxy.port);
  t.after(() => { a.socket.destroy(); idle.socket.destroy(); });
  a.socket.write(resp('PING'));
  await until('the first PING is answered', () => a.got.bytes.toString() === '+PONG\r\n');
  proxy.dropFlows({ reset: true });
  const givenUp = new Promise((resolve) => proxy.events.once('given-up', resolve));

  a.socket.write(resp('SET', 'reset-key', 'v'));
  await a.closed;
  assert.equal(a.got.error?.code, 'ECONNRESET', 'the write was answered with a RST');
  assert.equal(a.got.bytes.toString(), '+PONG\r\n', 'nothing passed after the drop');
  assert.equal((await givenUp).how, 'reset');
  assert.equal(await redis.command('GET', 'reset-key'), null, 'the command never reached the server');
  assert.equal(proxy.stats().silentResets, 1);

  // A flow that sends nothing is not reset: it stays open and silent.
  const fresh = await rawClient(proxy.port);
  t.after(() => fresh.close());
  assert.equal(await fresh.call('PING'), 'PONG', 'a new connection passes');
  assert.equal(idle.got.closed, false);
  assert.equal(proxy.stats().silent, 1);
});

test('dropFlows({ where }) drops only the flows it picks, by what they carried; the others pass on', { skip }, async (t) => {
  const proxy = await proxyFor(t, redis.port);
  const spared = await rawClient(proxy.port);
  const dropped = await rawClient(proxy.port);
  t.after(() => { spared.close(); dropped.close(); });
  assert.equal(await spared.call('ECHO', 'spare me'), 'spare me');
  assert.equal(await dropped.call('PING'), 'PONG');
  const flows = proxy.dropFlows({ where: (f) => !f.commands.includes('ECHO') });
  assert.deepEqual(flows.map((f) => f.commands), [['PING']]);
  assert.equal(await spared.call('PING'), 'PONG', 'the flow it did not pick still passes');
  assert.equal(proxy.stats().silent, 1);
});
