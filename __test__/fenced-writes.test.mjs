// The store side of fencing (issue 36 item 4; examples/20-fenced-writes): a paused holder
// whose lease expired writes after the next holder and is refused, by a SQL upsert and by
// a Redis script; both compare every digit of a fence.

import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { after, before, describe, test } from 'node:test';
import { promisify } from 'node:util';
import { Redis } from 'ioredis';
import { fencedRedisStore } from '../examples/20-fenced-writes/redis-store.mjs';
import { openReports } from '../examples/20-fenced-writes/sql-store.mjs';
import { startRedis } from './helpers/redis.mjs';

let redis;
let client;
before(async () => {
  redis = await startRedis();
  client = new Redis(redis.url);
});
after(async () => {
  client?.disconnect();
  await redis?.stop();
});

// Past 2^53 a Number can no longer tell these apart; the stores must.
const BIG = ['9007199254740992', '9007199254740993', '10000000000000000000'];

describe('fenced writes', () => {
  test('the example: the stalled holder is refused by both stores after the next holder wrote', async () => {
    const example = new URL('../examples/20-fenced-writes/index.mjs', import.meta.url);
    const { stdout } = await promisify(execFile)(process.execPath, [example.pathname], {
      env: { ...process.env, REDIS_URL: redis.url },
      timeout: 30_000,
    });
    assert.match(stdout, /^B wrote with a larger fence: sql kept, redis kept$/m);
    assert.match(stdout, /^A wrote late with its old fence: sql refused, redis refused$/m);
    assert.match(stdout, /^the report is from B, and from B in Redis$/m);
  });

  test('SQL: a larger fence is kept; an equal or smaller one refused, every digit compared', () => {
    const sql = openReports();
    try {
      assert.equal(sql.write('r', 'first', '1700000000000000001'), true);
      assert.equal(sql.write('r', 'same fence', '1700000000000000001'), false);
      assert.equal(sql.write('r', 'older', '1700000000000000000'), false);
      assert.equal(sql.write('r', 'newer', '1700000000000000002'), true);
      assert.deepEqual(sql.read('r'), { body: 'newer', fence: '1700000000000000002' });
      assert.equal(sql.write('big', 'a', BIG[0]), true);
      assert.equal(sql.write('big', 'b', BIG[1]), true, 'one more than 2^53');
      assert.equal(sql.write('big', 'c', BIG[0]), false);
      assert.equal(sql.read('big').fence, BIG[1]);
    } finally {
      sql.close();
    }
  });

  test('Redis: a larger fence is kept; an equal or smaller one refused, every digit compared', async () => {
    const kv = fencedRedisStore((script, keys, args) => client.eval(script, keys.length, ...keys, ...args));
    assert.equal(await kv.write('t:r', 'first', '1700000000000000001'), true);
    assert.equal(await kv.write('t:r', 'same fence', '1700000000000000001'), false);
    assert.equal(await kv.write('t:r', 'older', '999999999999999999'), false, 'fewer digits');
    assert.equal(await kv.write('t:r', 'newer', '1700000000000000002'), true);
    assert.equal(await client.hget('t:r', 'body'), 'newer');
    for (let i = 0; i < BIG.length; i++) assert.equal(await kv.write('t:big', `v${i}`, BIG[i]), true, BIG[i]);
    assert.equal(await kv.write('t:big', 'late', BIG[1]), false);
    assert.equal(await client.hget('t:big', 'fence'), BIG[2]);
  });
});
