// Runs the Jest suite in __test__/jest/ the way an app's CI would, twice, and checks that
// Jest ends by itself: no --forceExit anywhere.
//   1. `--detectOpenHandles` (in band): passes, exits 0, and reports no open handle.
//   2. Jest's defaults (parallel workers): no "Jest did not exit one second after the test
//      run", no worker "failed to exit gracefully". This is the check that sees native work:
//      Rust-side handles are invisible to --detectOpenHandles (async_hooks), but a driver
//      left running keeps the process alive and Jest prints that warning.
// The Redis is started here and handed over as REDIS_URL, so it outlives the Jest run like
// a real one; a Redis that went away with Jest could end a leftover wait early and hide it.

import assert from 'node:assert/strict'
import path from 'node:path'
import { after, before, test } from 'node:test'
import { external, startRedis } from '../helpers/redis.mjs'
import { bin, repo, run } from './support.mjs'

const config = path.join(repo, '__test__', 'jest', 'jest.config.cjs')
let redis
before(async () => { redis = await startRedis() })
after(() => redis?.stop())

async function jest(extraArgs) {
  const env = { ...process.env, REDIS_URL: external ? process.env.REDIS_URL : redis.url, CI: 'true', FORCE_COLOR: '0' }
  const started = performance.now()
  const result = await run(process.execPath, [bin.jest, '--config', config, '--ci', ...extraArgs], { env, timeoutMs: 90_000 })
  return { ...result, output: result.stdout + result.stderr, ms: performance.now() - started }
}

function assertPassed(r) {
  assert.equal(r.code, 0, r.output)
  assert.match(r.output, /Test Suites:\s+2 passed, 2 total/, r.output)
  assert.match(r.output, /Tests:\s+\d+ passed, \d+ total/)
  assert.doesNotMatch(r.output, /forceExit|Force exiting/i)
}

test('jest --detectOpenHandles: passes, exits by itself, no open handle reported', async () => {
  const r = await jest(['--detectOpenHandles'])
  assertPassed(r)
  assert.doesNotMatch(r.output, /open handle/i, r.output)
})

test('jest with its defaults: no "did not exit" warning, no worker force-exited', async () => {
  const r = await jest([])
  assertPassed(r)
  assert.doesNotMatch(r.output, /did not exit/i, r.output)
  assert.doesNotMatch(r.output, /failed to exit gracefully/i, r.output)
})
