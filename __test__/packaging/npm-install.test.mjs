// A clone's `npm ci` is clean (docs/decisions/0106-install-scripts.md): npm 11 warns about
// every dependency whose install scripts no `allowScripts` entry covers, and a newcomer would
// have to find out what `@parcel/watcher` (Jest's file watcher, through jest-haste-map) is
// and whether to allow it. package.json denies it: its install script only builds from
// source on request, its prebuilt binary comes in an optional dependency.
//
// Runs `npm ci --prefer-offline` on a copy of package.json and package-lock.json: everything comes
// from the npm cache that the clone's own `npm ci` filled (.ci/run runs it first), if it can.

import assert from 'node:assert/strict'
import { copyFileSync, readFileSync } from 'node:fs'
import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { test } from 'node:test'
import { repo, run } from './support.mjs'

test('npm ci installs with no warning about unreviewed install scripts', async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'dokebi-lock-redis-npm-ci-'))
  try {
    for (const file of ['package.json', 'package-lock.json']) copyFileSync(path.join(repo, file), path.join(dir, file))
    const env = { ...process.env }
    for (const k of Object.keys(env)) if (/^npm_/i.test(k)) delete env[k] // not the npm test that runs us
    const r = await run('npm', ['ci', '--prefer-offline', '--no-audit', '--no-fund'], { cwd: dir, env, timeoutMs: 300_000 })
    assert.equal(r.code, 0, r.stdout + r.stderr)
    assert.doesNotMatch(r.stderr, /install-scripts|allowScripts|install scripts/i, r.stderr)
    assert.match(readFileSync(path.join(dir, 'node_modules', '@parcel', 'watcher', 'package.json'), 'utf8'), /"install"/,
      'the package whose script is denied is still installed (Jest needs it)')
  } finally {
    await rm(dir, { recursive: true, force: true })
  }
})

test('the one denied install script is @parcel/watcher, which only builds from source on request', () => {
  const { allowScripts } = JSON.parse(readFileSync(path.join(repo, 'package.json'), 'utf8'))
  assert.deepEqual(allowScripts, { '@parcel/watcher': false })
  const watcher = JSON.parse(readFileSync(path.join(repo, 'node_modules', '@parcel', 'watcher', 'package.json'), 'utf8'))
  assert.ok(Object.keys(watcher.optionalDependencies ?? {}).some((d) => d.startsWith('@parcel/watcher-linux-x64')), 'prebuilt binaries come as optional dependencies')
})
