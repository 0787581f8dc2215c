// `npm run example` on a machine with nothing set up (docs/decisions/0105-first-run.md): no
// REDIS_URL and nothing at the default address, so it starts a throwaway redis-server from the
// PATH, says so in one line, runs examples/15-lock-redis and stops the server; without
// redis-server it says how to get one and exits non-zero, with no stack trace. With REDIS_URL,
// or something at the default address, that server is used. An addon built after its sources
// is not rebuilt.
//
// The default address is DOKEBI_LOCK_REDIS_EXAMPLE_URL here, a port where nothing listens: the
// test never depends on what runs on this machine's 6379.

import assert from 'node:assert/strict'
import { existsSync, readFileSync, readdirSync, statSync, utimesSync, writeFileSync } from 'node:fs'
import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import net from 'node:net'
import path from 'node:path'
import { after, before, describe, test } from 'node:test'
import { external, startRedis } from './helpers/redis.mjs'
import { binaryName, repo, run } from './packaging/support.mjs'

const script = path.join(repo, 'scripts', 'example.mjs')
const EXAMPLE_DONE = /the store accepted 6 fenced writes: /

/** A port on 127.0.0.1 where nothing listens (bound, closed at once). */
function deadPort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = srv.address()
      srv.close(() => resolve(port))
    })
    srv.on('error', reject)
  })
}

function listening(port) {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1')
    socket.once('connect', () => { socket.destroy(); resolve(true) })
    socket.once('error', () => resolve(false))
  })
}

/** PIDs of redis-server processes whose command line names `port` (Linux /proc). */
function redisServersOn(port) {
  if (!existsSync('/proc/self/cmdline')) return []
  return readdirSync('/proc').filter((d) => /^\d+$/.test(d)).filter((pid) => {
    try {
      // redis-server rewrites its title to `redis-server 127.0.0.1:<port>` (Valkey's says
      // valkey-server); one run through another root's ld.so keeps its arguments instead.
      const cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ')
      return /(redis|valkey)-server/.test(cmdline) &&
        new RegExp(`(:|--port )${port}\\b`).test(cmdline)
    } catch {
      return false
    }
  })
}

/** The environment of `npm run example` with the given REDIS_URL (or none) and default address. */
function exampleEnv({ redisUrl, defaultUrl, pathOverride } = {}) {
  const env = { ...process.env, DOKEBI_LOCK_REDIS_EXAMPLE_URL: defaultUrl }
  delete env.REDIS_URL
  if (redisUrl) env.REDIS_URL = redisUrl
  if (pathOverride !== undefined) env.PATH = pathOverride
  return env
}

test('package.json: `npm run example` is this script', () => {
  assert.equal(JSON.parse(readFileSync(path.join(repo, 'package.json'), 'utf8')).scripts.example, 'node scripts/example.mjs')
})

describe('with no REDIS_URL and nothing at the default address', () => {
  let result
  let port
  let builtBefore
  before(async () => {
    builtBefore = statSync(path.join(repo, binaryName)).mtimeMs
    const dead = await deadPort()
    result = await run(process.execPath, [script], { env: exampleEnv({ defaultUrl: `redis://127.0.0.1:${dead}/0` }), timeoutMs: 120_000 })
    port = Number(/started a throwaway redis-server on port (\d+)/.exec(result.stdout)?.[1])
  })

  test('starts a throwaway redis-server, says so in one line, runs the example and exits 0', () => {
    assert.equal(result.code, 0, result.stdout + result.stderr)
    const lines = result.stdout.split('\n')
    assert.equal(lines.filter((l) => /throwaway redis-server/.test(l)).length, 1, result.stdout)
    assert.match(lines[0], /^No Redis at 127\.0\.0\.1:\d+ and REDIS_URL unset: started a throwaway redis-server on port \d+/)
    assert.match(result.stdout, /A holds the job \(fence \d+/)
    assert.match(result.stdout, EXAMPLE_DONE)
  })

  test('leaves no redis-server running', async () => {
    assert.ok(port > 0, result.stdout)
    if (existsSync('/proc/self/cmdline') && !external) {
      const probe = await startRedis()
      try {
        assert.equal(redisServersOn(probe.port).length, 1, 'the process check sees a running server')
      } finally {
        await probe.stop()
      }
    }
    assert.equal(await listening(port), false, `something still listens on ${port}`)
    assert.deepEqual(redisServersOn(port), [])
  })

  test('does not rebuild an addon built after its sources', () => {
    assert.doesNotMatch(result.stdout, /building the addon/)
    assert.equal(statSync(path.join(repo, binaryName)).mtimeMs, builtBefore)
  })
})

test('without redis-server on the PATH: two lines on how to get one, no stack trace, exit 1', async () => {
  const dead = await deadPort()
  // Only node's own directory: no redis-server (nor npm, cargo).
  const r = await run(process.execPath, [script], {
    env: exampleEnv({ defaultUrl: `redis://127.0.0.1:${dead}/0`, pathOverride: path.dirname(process.execPath) }),
    timeoutMs: 30_000,
  })
  assert.equal(r.code, 1, r.stdout + r.stderr)
  const lines = r.stderr.trim().split('\n')
  assert.equal(lines.length, 2, r.stderr)
  assert.match(lines[0], /no redis-server on the PATH/)
  assert.match(lines[1], /apt-get install redis-server, brew install redis/)
  assert.match(lines[1], /REDIS_URL=/)
  assert.doesNotMatch(r.stderr, /^\s+at /m, 'no stack trace')
  assert.equal(r.stdout, '')
})

// The build itself is `npm run build` (minutes); here npm is a stand-in that records the call
// and marks the addon built, so the test proves the decision, not the compiler.
test('an addon older than its sources is rebuilt with `npm run build` before the example runs', async () => {
  const binary = path.join(repo, binaryName)
  const { atime, mtime } = statSync(binary)
  const dir = await mkdtemp(path.join(os.tmpdir(), 'dokebi-first-run-'))
  const calls = path.join(dir, 'calls')
  const fakeNpm = path.join(dir, 'npm-cli.js')
  writeFileSync(fakeNpm, `require('fs').appendFileSync(${JSON.stringify(calls)}, process.argv.slice(2).join(' ') + '\\n')
    require('fs').utimesSync(${JSON.stringify(binary)}, new Date(), new Date())`)
  const redis = await startRedis()
  try {
    utimesSync(binary, new Date(0), new Date(0)) // built long before any source
    const env = { ...exampleEnv({ redisUrl: redis.url }), npm_execpath: fakeNpm }
    const r = await run(process.execPath, [script], { env, timeoutMs: 60_000 })
    assert.equal(r.code, 0, r.stdout + r.stderr)
    assert.match(r.stdout.split('\n')[0], /^building the addon \(its sources changed since the last build\)$/)
    assert.equal(readFileSync(calls, 'utf8'), 'run build\n')
    assert.match(r.stdout, EXAMPLE_DONE)
  } finally {
    utimesSync(binary, atime, mtime)
    await redis.stop()
    await rm(dir, { recursive: true, force: true })
  }
})

describe('with a Redis to use', () => {
  let redis
  before(async () => { redis = await startRedis() })
  after(() => redis?.stop())

  const count = (info) => Number(/total_commands_processed:(\d+)/.exec(info)[1])

  test('REDIS_URL set: that server, no throwaway one', async () => {
    const before = await redis.command('INFO', 'stats')
    const dead = await deadPort()
    const r = await run(process.execPath, [script], { env: exampleEnv({ redisUrl: redis.url, defaultUrl: `redis://127.0.0.1:${dead}/0` }), timeoutMs: 60_000 })
    assert.equal(r.code, 0, r.stdout + r.stderr)
    assert.doesNotMatch(r.stdout, /throwaway/)
    assert.match(r.stdout, EXAMPLE_DONE)
    assert.ok(count(await redis.command('INFO', 'stats')) > count(before) + 10, 'the example ran its commands on this server')
  })

  test('something answering at the default address: used as it is', { skip: Boolean(process.env.REDIS_URL) && 'the test server is REDIS_URL itself' }, async () => {
    const before = await redis.command('INFO', 'stats')
    const r = await run(process.execPath, [script], { env: exampleEnv({ defaultUrl: `${redis.url}/0` }), timeoutMs: 60_000 })
    assert.equal(r.code, 0, r.stdout + r.stderr)
    assert.doesNotMatch(r.stdout, /throwaway/)
    assert.match(r.stdout, EXAMPLE_DONE)
    assert.ok(count(await redis.command('INFO', 'stats')) > count(before) + 10, 'the example ran its commands on this server')
  })
})
