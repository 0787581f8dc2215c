// `npm pack` yields a tarball that a fresh app on this machine installs and uses without a
// Rust toolchain and without the registry: the binary built here travels inside it
// (docs/decisions/0101-prebuilt-binaries.md). Both `require` and `import` work by the package
// name through the `exports` map, TypeScript finds the types through it, the process exits
// by itself after `shutdown()`, and the examples README points users at (15, 16 and 17) ship
// and run from the installed package.

import assert from 'node:assert/strict'
import { existsSync, readFileSync, readdirSync } from 'node:fs'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { after, before, describe, test } from 'node:test'
import { startRedis } from '../helpers/redis.mjs'
import { binaryName, bin, npmInstallOffline, npmPack, ok, onPath, repo, run, tempApp, typeRoots, userEnv } from './support.mjs'

const PKG = '@dokebi/lock-redis'

// The scripts a user would write. Each acquires, proves a second acquire is LOCK_BUSY,
// releases in finally, shuts down, and prints what it saw; none calls process.exit, so a
// handle left open would make it hang (and the test fail on its deadline).
const CJS_SCRIPT = `'use strict'
const { createRedisLockDriver, LockError, LockErrorCode } = require('${PKG}')

async function main() {
  const driver = createRedisLockDriver(process.env.REDIS_URL, { driver: 'redis', connection: 'main', namespace: process.env.NS })
  const lease = await driver.acquire('job:nightly-report')
  let busy, released
  try {
    busy = await driver.acquire('job:nightly-report', { waitTimeoutMs: 0 }).then(() => 'acquired twice', (err) => err instanceof LockError && err.code)
  } finally {
    released = await lease.release()
  }
  await driver.shutdown()
  const binary = Object.keys(require.cache).find((file) => file.endsWith('.node'))
  console.log(JSON.stringify({ fence: lease.fence, busy, released, valid: lease.valid, binary, entry: require.resolve('${PKG}'), LOCK_BUSY: LockErrorCode.LOCK_BUSY }))
}
main().catch((err) => { console.error(err); process.exitCode = 1 })
`

const ESM_SCRIPT = `import { createRedisLockDriver, LockError, LockErrorCode, parseRedisLockBackend } from '${PKG}'
import lockRedis from '${PKG}'
import { createRequire } from 'node:module'

const required = createRequire(import.meta.url)('${PKG}')
const options = parseRedisLockBackend({ driver: 'redis', connection: 'main', namespace: process.env.NS })
const driver = createRedisLockDriver({ url: process.env.REDIS_URL, name: 'main' }, options)
const lease = await driver.acquire('job:nightly-report', { waitTimeoutMs: 2000 })
let busy, released
try {
  busy = await driver.acquire('job:nightly-report', { waitTimeoutMs: 0 }).then(() => 'acquired twice', (err) => err instanceof LockError && err.code)
} finally {
  released = await lease.release()
}
await driver.shutdown()
console.log(JSON.stringify({
  fence: lease.fence, busy, released, valid: lease.valid, leaseMs: options.leaseMs,
  sameAsRequire: required.LockError === LockError && required.createRedisLockDriver === createRedisLockDriver,
  defaultIsModule: lockRedis.createRedisLockDriver === createRedisLockDriver,
  LOCK_BUSY: LockErrorCode.LOCK_BUSY,
}))
`

// What a TypeScript user of the installed package compiles (strict, nodenext).
const TS_CONSUMER = `import { createRedisLockDriver, LockError, type Lease } from '${PKG}'
const driver = createRedisLockDriver('redis://127.0.0.1:6379/0', { driver: 'redis', connection: 'main', namespace: 'app' })
export async function once(): Promise<bigint> {
  const lease: Lease = await driver.acquire('k', { waitTimeoutMs: 0 })
  try {
    return BigInt(lease.fence)
  } catch (err) {
    if (err instanceof LockError && err.code === 'LOCK_BUSY') return 0n
    throw err
  } finally {
    await lease.release()
  }
}
`
const TS_CONSUMER_CJS = `import lock = require('${PKG}')
export const driver: lock.LockDriver = lock.createRedisLockDriver('redis://127.0.0.1:6379/0', { driver: 'redis', connection: 'main', namespace: 'app' })
`
const TS_WRONG = `import { createRedisLockDriver } from '${PKG}'
const driver = createRedisLockDriver('redis://127.0.0.1:6379/0', {})
export const n: number = (await driver.acquire('k')).fence
`

let redis
let packDir
let packed
let app

before(async () => {
  if (!existsSync(path.join(repo, binaryName))) {
    throw new Error(`${binaryName} is missing: run \`npm run build\` first (npm test does)`)
  }
  redis = await startRedis()
  packDir = await mkdtemp(path.join(os.tmpdir(), 'dokebi-lock-redis-pack-'))
  packed = await npmPack(repo, packDir)
  app = await tempApp('pack')
  await npmInstallOffline(app.dir, [packed.tarball])
})

after(async () => {
  await app?.dispose()
  if (packDir) await rm(packDir, { recursive: true, force: true })
  await redis?.stop()
})

describe('npm pack', () => {
  test('the tarball holds the API, its types, the binary built here and the documents — nothing else', () => {
    for (const file of ['package.json', 'index.js', 'index.d.ts', 'binding.js', 'binding.d.ts', binaryName, 'README.md', 'CHANGELOG.md', 'AI.md']) {
      assert.ok(packed.paths.includes(file), `${file} is missing from the tarball: ${packed.paths.join(', ')}`)
    }
    const stray = packed.paths.filter((p) => /^(src|tests|__test__|npm|target|benchmarks|docs|\.ci)\/|^Cargo\.|^build\.rs$|^\.git/.test(p))
    assert.deepEqual(stray, [], 'sources, tests and build files stay out of the tarball')
    const binaries = packed.paths.filter((p) => p.endsWith('.node'))
    assert.deepEqual(binaries, [binaryName], 'exactly the binary built on this machine')
  })

  test('every file of the examples README points at ships: 15, 16-tracing-channels, 17-testing-your-app, 18-lease-signal, 19-with-lock, 20-fenced-writes', () => {
    const readme = readFileSync(path.join(repo, 'README.md'), 'utf8')
    for (const example of ['15-lock-redis', '16-tracing-channels', '17-testing-your-app', '18-lease-signal', '19-with-lock', '20-fenced-writes']) {
      assert.match(readme, new RegExp(`examples/${example}`), `README no longer mentions ${example}: drop it from files`)
      for (const file of readdirSync(path.join(repo, 'examples', example))) {
        assert.ok(packed.paths.includes(`examples/${example}/${file}`), `examples/${example}/${file} is missing from the tarball`)
      }
    }
  })

  test('the manifest: exports map with types, Node 24, no install scripts, no hard dependencies', () => {
    const manifest = JSON.parse(readFileSync(path.join(app.dir, 'node_modules', PKG, 'package.json'), 'utf8'))
    assert.deepEqual(manifest.exports['.'], { types: './index.d.ts', default: './index.js' })
    assert.equal(manifest.engines.node, '>=24.0.0')
    assert.equal(manifest.dependencies, undefined, 'nothing to download besides the package itself')
    for (const hook of ['preinstall', 'install', 'postinstall', 'prepare']) {
      assert.equal(manifest.scripts?.[hook], undefined, `a ${hook} script would run on users' machines`)
    }
    assert.equal(manifest.dokebi, undefined, 'not a dokebi plugin: no dokebi manifest')
  })
})

describe('installed into a fresh app, offline, without Rust', () => {
  const env = () => userEnv({ REDIS_URL: redis.url, NS: `pack-${process.pid}` })

  test('the environment really has no Rust toolchain', () => {
    for (const tool of ['cargo', 'rustc']) assert.ok(!onPath(tool, env()), `${tool} is still on PATH`)
  })

  let cjsFence
  test("require('@dokebi/lock-redis') acquires, refuses a second holder, releases and exits by itself", async () => {
    await writeFile(path.join(app.dir, 'lock.cjs'), CJS_SCRIPT)
    const { stdout } = await ok(process.execPath, ['lock.cjs'], { cwd: app.dir, env: env(), timeoutMs: 20_000 })
    const seen = JSON.parse(stdout)
    assert.match(seen.fence, /^[1-9][0-9]*$/, 'the fence is a positive decimal string')
    assert.equal(seen.busy, 'LOCK_BUSY')
    assert.equal(seen.released, true)
    assert.equal(seen.valid, false)
    assert.equal(seen.LOCK_BUSY, 'LOCK_BUSY')
    assert.equal(seen.entry, path.join(app.dir, 'node_modules', PKG, 'index.js'))
    assert.equal(seen.binary, path.join(app.dir, 'node_modules', PKG, binaryName), 'the binary inside the installed tarball')
    cjsFence = BigInt(seen.fence)
  })

  test("import { createRedisLockDriver } from '@dokebi/lock-redis' works the same, one module instance", async () => {
    await writeFile(path.join(app.dir, 'lock.mjs'), ESM_SCRIPT)
    const { stdout } = await ok(process.execPath, ['lock.mjs'], { cwd: app.dir, env: env(), timeoutMs: 20_000 })
    const seen = JSON.parse(stdout)
    assert.equal(seen.busy, 'LOCK_BUSY')
    assert.equal(seen.released, true)
    assert.equal(seen.leaseMs, 10000)
    assert.equal(seen.sameAsRequire, true, 'import and require share one LockError class (no dual-package hazard)')
    assert.equal(seen.defaultIsModule, true)
    if (cjsFence !== undefined) assert.ok(BigInt(seen.fence) > cjsFence, 'the same key in the same namespace: a larger fence')
  })

  test('the example runs from the installed package', async () => {
    const example = path.join(app.dir, 'node_modules', PKG, 'examples', '15-lock-redis', 'index.mjs')
    assert.ok(existsSync(example), 'examples/15-lock-redis ships in the tarball')
    const { stdout } = await ok(process.execPath, [example], { cwd: app.dir, env: env(), timeoutMs: 30_000 })
    assert.match(stdout, /fence/i)
  })

  test('examples/16-tracing-channels runs from the installed package', async () => {
    const example = path.join(app.dir, 'node_modules', PKG, 'examples', '16-tracing-channels', 'index.mjs')
    const { stdout } = await ok(process.execPath, [example], { cwd: app.dir, env: env(), timeoutMs: 30_000 })
    assert.match(stdout, /lock hold ms: n=\d+/)
  })

  test("examples/17-testing-your-app's node:test suite passes from the installed package, against its own redis-server", async () => {
    const suite = path.join(app.dir, 'node_modules', PKG, 'examples', '17-testing-your-app', 'locks.test.mjs')
    const own = userEnv()
    delete own.REDIS_URL // it starts its own server
    delete own.NODE_TEST_CONTEXT // otherwise the inner `node --test` skips its files as nested
    const r = await run(process.execPath, ['--test', suite], { cwd: app.dir, env: own, timeoutMs: 60_000 })
    assert.equal(r.code, 0, r.stdout + r.stderr)
    assert.match(r.stdout, /pass 2\b/)
  })

  test('TypeScript (strict, nodenext) finds the types through the exports map, for import and require', async () => {
    await writeFile(path.join(app.dir, 'consumer.mts'), TS_CONSUMER)
    await writeFile(path.join(app.dir, 'consumer.cts'), TS_CONSUMER_CJS)
    await writeFile(path.join(app.dir, 'wrong.mts'), TS_WRONG)
    const compilerOptions = {
      strict: true, module: 'nodenext', moduleResolution: 'nodenext', target: 'es2023', lib: ['es2023'],
      types: ['node'], typeRoots: [typeRoots], noEmit: true, skipLibCheck: false,
    }
    await writeFile(path.join(app.dir, 'tsconfig.json'), JSON.stringify({ compilerOptions, files: ['consumer.mts', 'consumer.cts'] }))
    await ok(process.execPath, [bin.tsc, '-p', app.dir, '--pretty', 'false'], { cwd: app.dir, timeoutMs: 60_000 })

    await writeFile(path.join(app.dir, 'tsconfig.wrong.json'), JSON.stringify({ compilerOptions, files: ['wrong.mts'] }))
    const wrong = await run(process.execPath, [bin.tsc, '-p', path.join(app.dir, 'tsconfig.wrong.json'), '--pretty', 'false'], { cwd: app.dir })
    assert.notEqual(wrong.code, 0, 'a fence used as a number must not compile')
    assert.match(wrong.stdout, /wrong\.mts\(3,\d+\): error TS2322/)
  })
})
