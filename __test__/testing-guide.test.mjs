// README "Testing your app": the node:test and Jest suites of examples/17-testing-your-app run
// as a user's would — each starts its own redis-server on a free port, shuts its drivers down
// in after-hooks (or with `await using`) and exits by itself: no --forceExit, and Jest's
// --detectOpenHandles reports nothing.

import assert from 'node:assert/strict'
import path from 'node:path'
import { test } from 'node:test'
import { bin, repo, run } from './packaging/support.mjs'

const dir = path.join(repo, 'examples', '17-testing-your-app')
// The examples start their own server: REDIS_URL would make them use another. Without
// NODE_TEST_CONTEXT the inner `node --test` runs its files instead of skipping them as nested.
const env = { ...process.env, CI: 'true', FORCE_COLOR: '0' }
delete env.REDIS_URL
delete env.NODE_TEST_CONTEXT

test('the node:test example passes against its own redis-server and exits by itself', async () => {
  const r = await run(process.execPath, ['--test', path.join(dir, 'locks.test.mjs')], { env, timeoutMs: 60_000 })
  const output = r.stdout + r.stderr
  assert.equal(r.code, 0, output)
  assert.match(output, /pass 2\b/)
  assert.match(output, /fail 0\b/)
})

test('the Jest example passes with --detectOpenHandles, exits by itself and reports no open handle', async () => {
  const r = await run(process.execPath, [bin.jest, '--config', path.join(dir, 'jest.config.cjs'), '--ci', '--detectOpenHandles'], { env, timeoutMs: 90_000 })
  const output = r.stdout + r.stderr
  assert.equal(r.code, 0, output)
  assert.match(output, /Tests:\s+2 passed, 2 total/)
  assert.doesNotMatch(output, /open handle|forceExit|Force exiting|did not exit/i, output)
})
