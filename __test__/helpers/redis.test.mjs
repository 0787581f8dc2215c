// Proves the throwaway-Redis harness itself, so a failing lock test can be
// trusted to be about the lock and not about the harness.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import test from 'node:test';
import { external, flushAll, startRedis } from './redis.mjs';

const HELPER = new URL('./redis.mjs', import.meta.url).href;
const skip = external && 'needs a throwaway server (REDIS_URL is set)';

// A zombie still answers kill(pid, 0), so read the state instead.
function alive(pid) {
  try {
    const state = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1][0];
    return state !== 'Z' && state !== 'X';
  } catch {
    return false;
  }
}

function refusesConnections(port) {
  return new Promise((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port });
    s.on('connect', () => { s.destroy(); resolve(false); });
    s.on('error', (err) => resolve(err.code === 'ECONNREFUSED'));
  });
}

// Runs a snippet in a separate node process that imports the harness, and
// collects its stdout lines as they come.
function runNode(source, env = {}) {
  const child = spawn(process.execPath, ['--input-type=module', '-e', source], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  child.stdout.on('data', (d) => { out += d; });
  child.stderr.on('data', (d) => { err += d; });
  const exit = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  const line = async (n) => {
    for (let i = 0; i < 500; i++) {
      const lines = out.split('\n');
      if (lines.length > n) return lines[n - 1];
      await sleep(10);
    }
    throw new Error(`no output line ${n}; stderr: ${err}`);
  };
  return { child, exit, line, stderr: () => err };
}

test('starts a private server and speaks RESP', { skip }, async (t) => {
  const r = await startRedis();
  t.after(() => r.stop());

  assert.notEqual(r.port, 6379);
  assert.equal(r.url, `redis://127.0.0.1:${r.port}`);
  const info = await r.command('INFO', 'server');
  assert.match(info, new RegExp(`process_id:${r.pid}\r\n`), 'answers come from our own child');
  assert.deepEqual(await r.command('CONFIG', 'GET', 'save'), ['save', '']);
  assert.deepEqual(await r.command('CONFIG', 'GET', 'appendonly'), ['appendonly', 'no']);

  assert.equal(await r.command('SET', 'k', 'välue'), 'OK');
  assert.equal(await r.command('GET', 'k'), 'välue', 'bulk length is in bytes, not chars');
  assert.equal(await r.command('GET', 'missing'), null);
  assert.equal(await r.command('INCRBY', 'n', 41), 41);
  assert.deepEqual(await r.command('MGET', 'k', 'missing'), ['välue', null]);
  await assert.rejects(r.command('INCR', 'k'), { message: 'ERR value is not an integer or out of range' });

  // A 200 kB value arrives in many chunks; the parser must wait for all of it.
  const big = 'x'.repeat(200_000);
  await r.command('SET', 'big', big);
  assert.equal(await r.command('GET', 'big'), big);

  // An error inside an array is a value, not a rejection of the whole reply.
  const [one, boom] = await r.command('EVAL', "return {1, redis.error_reply('boom')}", 0);
  assert.equal(one, 1);
  assert.ok(boom instanceof Error);
  assert.match(boom.message, /boom$/); // Redis 7 adds 'ERR '

  // Each command() is its own connection, so no state carries over.
  await r.command('MULTI');
  await assert.rejects(r.command('EXEC'), /ERR EXEC without MULTI/);

  assert.equal(await flushAll(r), 'OK');
  assert.equal(await r.command('DBSIZE'), 0);
});

test('passes extra args and gives each server its own port', { skip }, async (t) => {
  const a = await startRedis({ args: ['--maxmemory-policy', 'allkeys-lru'] });
  t.after(() => a.stop());
  const b = await startRedis();
  t.after(() => b.stop());

  assert.notEqual(a.port, b.port);
  assert.deepEqual(await a.command('CONFIG', 'GET', 'maxmemory-policy'), ['maxmemory-policy', 'allkeys-lru']);
  assert.deepEqual(await b.command('CONFIG', 'GET', 'maxmemory-policy'), ['maxmemory-policy', 'noeviction']);
  await a.command('SET', 'only-in-a', '1');
  assert.equal(await b.command('GET', 'only-in-a'), null);
});

test('pause makes commands time out; resume answers again', { skip }, async (t) => {
  const r = await startRedis();
  t.after(() => r.stop());

  await r.pause();
  const started = Date.now();
  await assert.rejects(r.command('PING', { timeout: 200 }), { code: 'ETIMEDOUT' });
  assert.ok(Date.now() - started >= 190, 'waited for the timeout, not an early failure');

  await r.resume();
  assert.equal(await r.command('PING', { timeout: 1000 }), 'PONG');
});

test('restart keeps the port and loses data unless asked', { skip }, async (t) => {
  const r = await startRedis();
  t.after(() => r.stop());
  const { port } = r;
  const firstPid = r.pid;

  await r.command('SET', 'k', 'v');
  await r.restart();
  assert.equal(r.port, port);
  assert.notEqual(r.pid, firstPid);
  assert.equal(alive(firstPid), false);
  assert.equal(await r.command('GET', 'k'), null);

  await r.command('SET', 'k', 'kept');
  await r.restart({ keepData: true });
  assert.equal(await r.command('GET', 'k'), 'kept');

  // A paused server can be restarted too, and the dump.rdb that keepData
  // wrote must not come back.
  await r.pause();
  await r.restart();
  assert.equal(await r.command('GET', 'k'), null);
});

test('restart waits for its port instead of trusting whoever answers there', { skip }, async (t) => {
  const r = await startRedis();
  t.after(() => r.stop());
  await r.kill();

  // An impostor holds the port for a moment and answers anything with PONG.
  const impostor = net.createServer((sock) => {
    sock.on('data', () => sock.write('+PONG\r\n$0\r\n\r\n'));
    sock.on('error', () => {});
  });
  await new Promise((resolve) => impostor.listen(r.port, '127.0.0.1', resolve));
  setTimeout(() => impostor.close(), 300);

  await r.restart();
  assert.match(await r.command('INFO', 'server'), new RegExp(`process_id:${r.pid}\r\n`));
});

test('kill is abrupt; restart brings it back; stop cleans up', { skip }, async () => {
  const r = await startRedis();
  const { pid, port, dir } = r;
  await r.kill();
  assert.equal(alive(pid), false);
  await assert.rejects(r.command('PING'), { code: 'ECONNREFUSED' });
  await assert.rejects(r.pause(), /not running/);

  await r.restart();
  assert.equal(await r.command('PING'), 'PONG');

  const pid2 = r.pid;
  await r.stop();
  assert.equal(alive(pid2), false);
  assert.equal(await refusesConnections(port), true);
  assert.equal(existsSync(dir), false, 'temp dir removed');
});

test('a test process that forgets stop() still exits, and its server dies', { skip }, async () => {
  const p = runNode(`
    import { startRedis } from ${JSON.stringify(HELPER)};
    const r = await startRedis();
    await r.command('SET', 'a', '1');
    console.log(r.pid);
  `);
  const pid = Number(await p.line(1));
  let timer;
  const hung = new Promise((resolve) => { timer = setTimeout(resolve, 5000, 'hung'); });
  const result = await Promise.race([p.exit, hung]);
  clearTimeout(timer);
  if (result === 'hung') p.child.kill('SIGKILL');
  assert.deepEqual(result, { code: 0, signal: null }, `an open handle kept node alive? ${p.stderr()}`);
  for (let i = 0; i < 100 && alive(pid); i++) await sleep(20);
  assert.equal(alive(pid), false, 'redis died with its test process');
});

test('a SIGKILLed test process takes its server with it', { skip }, async () => {
  const p = runNode(`
    import { startRedis } from ${JSON.stringify(HELPER)};
    const r = await startRedis();
    console.log(r.pid);
    console.log(r.dir);
    setInterval(() => {}, 1000); // stay alive until killed
  `);
  const pid = Number(await p.line(1));
  const dir = await p.line(2);
  assert.equal(alive(pid), true);
  p.child.kill('SIGKILL');
  await p.exit;
  for (let i = 0; i < 100 && alive(pid); i++) await sleep(20);
  assert.equal(alive(pid), false, 'no exit hook runs on SIGKILL; pdeathsig must do it');

  // Its temp dir outlives it; the next process to start a server removes it.
  assert.equal(existsSync(dir), true);
  const next = runNode(`
    import { startRedis } from ${JSON.stringify(HELPER)};
    await (await startRedis()).stop();
  `);
  assert.equal((await next.exit).code, 0, next.stderr());
  assert.equal(existsSync(dir), false, 'stale dir swept');
});

test('REDIS_URL mode wraps the given server and refuses fault injection', { skip }, async (t) => {
  // Stand-in for someone's existing server: a password-protected user and
  // db 2, to prove the harness authenticates and selects on every fresh
  // connection. The default user stays open so this test can look inside.
  const backing = await startRedis({ args: ['--user', 'alice', 'on', '>s3cret', '~*', '&*', '+@all'] });
  t.after(() => backing.stop());
  const url = `redis://alice:s3cret@127.0.0.1:${backing.port}/2`;

  const p = runNode(`
    import { external, startRedis } from ${JSON.stringify(HELPER)};
    const r = await startRedis();
    await r.command('SET', 'via-url', 'yes');
    const refused = [];
    for (const m of ['kill', 'pause', 'resume', 'restart']) {
      try { await r[m](); } catch (e) { refused.push(e.message); }
    }
    await r.stop();
    console.log(JSON.stringify({ external, url: r.url, port: r.port, refused }));
  `, { REDIS_URL: url });
  const { code } = await p.exit;
  assert.equal(code, 0, p.stderr());
  const got = JSON.parse(await p.line(1));
  assert.equal(got.external, true);
  assert.equal(got.url, url);
  assert.equal(got.port, backing.port);
  assert.equal(got.refused.length, 4);
  for (const msg of got.refused) assert.match(msg, /needs a throwaway server/);

  // The write really went to db 2 of the backing server, not db 0.
  assert.equal(await backing.command('GET', 'via-url'), null);
  assert.match(await backing.command('INFO', 'keyspace'), /^db2:keys=1,/m);
  assert.equal(alive(backing.pid), true, 'external stop() left the server alone');

  // A wrong password fails at startRedis(), not in the first test.
  const bad = runNode(`
    import { startRedis } from ${JSON.stringify(HELPER)};
    await startRedis();
  `, { REDIS_URL: `redis://alice:wrong@127.0.0.1:${backing.port}` });
  const badExit = await bad.exit;
  assert.notEqual(badExit.code, 0);
  assert.match(bad.stderr(), /WRONGPASS|invalid password/);
});
