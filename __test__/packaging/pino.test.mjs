// pino works as the logger as it is: a real pino instance writing JSON lines into an
// in-memory stream. Every event is a JSON line with a `code` field, at the contract's level;
// nothing in the lines names the key, the token or the address.

import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { Writable } from 'node:stream'
import { after, before, describe, test } from 'node:test'
import { pino } from 'pino'
import { eventually, uniqueNamespace } from '../helpers/lock.mjs'
import { external, startRedis } from '../helpers/redis.mjs'

const { createRedisLockDriver } = createRequire(import.meta.url)('@dokebi/lock-redis')

const KEY = 'job:nightly-report:customer-4711'

/** A pino logger whose JSON lines land in `lines` (parsed). */
function memoryPino() {
  const lines = []
  let partial = ''
  const stream = new Writable({
    write(chunk, _encoding, callback) {
      const text = partial + chunk.toString('utf8')
      const parts = text.split('\n')
      partial = parts.pop()
      for (const line of parts) if (line) lines.push({ raw: line, json: JSON.parse(line) })
      callback()
    },
  })
  return { logger: pino({ level: 'debug', base: { service: 'lock-test' } }, stream), lines }
}

const LEVEL = { debug: 20, info: 30, warn: 40, error: 50 }

function assertNoSecrets(lines, { url }) {
  const { host } = new URL(url)
  for (const { raw } of lines) {
    assert.ok(!raw.includes(KEY), `the key leaked: ${raw}`)
    assert.ok(!raw.includes(host), `the address leaked: ${raw}`)
    assert.ok(!/[0-9a-f]{32,}/.test(raw), `a token or key hash leaked: ${raw}`)
  }
}

describe('with a Redis that evicts keys (maxmemory-policy allkeys-lru)', { skip: external && 'needs a throwaway server with its own policy' }, () => {
  let redis
  before(async () => { redis = await startRedis({ args: ['--maxmemory-policy', 'allkeys-lru'] }) })
  after(() => redis?.stop())

  test("logs one error line { code: 'REDIS_EVICTION_UNSAFE', policy: 'allkeys-lru' } at the first connection", async () => {
    const { logger, lines } = memoryPino()
    const driver = createRedisLockDriver(redis.url, { driver: 'redis', connection: 'main', namespace: uniqueNamespace('pino') }, logger)
    try {
      for (let i = 0; i < 2; i++) {
        const lease = await driver.acquire(KEY)
        try { assert.ok(lease.valid) } finally { await lease.release() }
      }
      const line = await eventually('the eviction line', () => lines.find((l) => l.json.code === 'REDIS_EVICTION_UNSAFE'))
      assert.equal(line.json.level, LEVEL.error)
      assert.equal(line.json.policy, 'allkeys-lru')
      assert.equal(typeof line.json.msg, 'string')
      assert.ok(line.json.msg.length > 0, 'a human message beside the fields')
      assert.equal(line.json.service, 'lock-test', "pino's own bindings are kept")
      assert.equal(typeof line.json.time, 'number')
    } finally {
      await driver.shutdown()
    }
    assert.equal(lines.filter((l) => l.json.code === 'REDIS_EVICTION_UNSAFE').length, 1, 'once, not per acquire')
    assertNoSecrets(lines, redis)
  })
})

describe('with a Redis whose subscription connection gets killed', { skip: external && 'needs CLIENT KILL on a throwaway server' }, () => {
  let redis
  before(async () => { redis = await startRedis() })
  after(() => redis?.stop())

  test("logs warn { code: 'LOCK_NOTIFY_UNAVAILABLE', reason: 'failed' } with the RedisError fields under cause", async () => {
    const { logger, lines } = memoryPino()
    const namespace = uniqueNamespace('pino-notify')
    const options = { driver: 'redis', connection: 'main', namespace }
    const holder = createRedisLockDriver(redis.url, options)
    const waiter = createRedisLockDriver(redis.url, options, logger)
    try {
      const held = await holder.acquire(KEY)
      const waiting = waiter.acquire(KEY, { waitTimeoutMs: 10_000 })
      await eventually('the waiter subscribed', async () => {
        const [, subscribers] = await redis.command('PUBSUB', 'NUMSUB', `${namespace}:lock-released`)
        return subscribers > 0
      })
      await redis.command('CLIENT', 'KILL', 'TYPE', 'pubsub')
      const line = await eventually('the warn line', () => lines.find((l) => l.json.code === 'LOCK_NOTIFY_UNAVAILABLE'))
      await held.release()
      const lease = await waiting
      await lease.release()

      assert.equal(line.json.level, LEVEL.warn)
      assert.equal(line.json.reason, 'failed')
      const { cause } = line.json
      assert.equal(typeof cause, 'object', `cause is serialised as an object: ${line.raw}`)
      assert.equal(cause.plugin, 'dokebi-redis')
      assert.equal(cause.name, 'RedisError')
      assert.equal(typeof cause.code, 'string')
      assert.ok(['not-submitted', 'unknown', 'rejected'].includes(cause.outcome), line.raw)
      assert.equal(typeof cause.retryable, 'boolean')
    } finally {
      await Promise.all([holder.shutdown(), waiter.shutdown()])
    }
    for (const { json } of lines) assert.equal(typeof json.code, 'string', 'every event carries a code')
    assertNoSecrets(lines, redis)
  })
})
