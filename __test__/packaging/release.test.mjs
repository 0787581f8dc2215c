// A rehearsal of the release, the napi-rs way (docs/decisions/0101-prebuilt-binaries.md,
// 0104-release-pipeline.md), laid out as .github/workflows/release.yml's publish job lays it
// out: in a copy of the package, the build jobs' artifacts land in
// artifacts/bindings-<target>/ and the generated binding.js/.d.ts in the root, the job's own
// commands (`npm run artifacts`) spread the eight binaries into npm/<platform>/, then the real
// `prepublishOnly` script that its `npm publish` runs (without publishing: its
// `--skip-optional-publish --no-gh-release`) removes the root copies and has `napi prepublish`
// write `optionalDependencies` on the eight platform packages. The result is packed and installed
// offline into fresh apps: with the platform package the binary comes from it; without it
// (an unreachable optional dependency) install still succeeds and loading fails with an
// error that names the platform.
//
// Only the host's binary is real (the one `npm run build` made); the other seven are
// placeholders: nothing here loads them, napi only copies and checks they exist.

import assert from 'node:assert/strict'
import { cpSync, existsSync, mkdirSync, readFileSync, readdirSync, symlinkSync, writeFileSync } from 'node:fs'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { after, before, describe, test } from 'node:test'
import { parse } from 'yaml'
import { startRedis } from '../helpers/redis.mjs'
import { binaryName, hostPlatform, npmInstallOffline, npmPack, ok, repo, rootBinaries, run, tempApp, userEnv } from './support.mjs'

const VERSION = '0.4.1'
const PLATFORMS = {
  'linux-x64-gnu': { triple: 'x86_64-unknown-linux-gnu', os: ['linux'], cpu: ['x64'], libc: ['glibc'] },
  'linux-x64-musl': { triple: 'x86_64-unknown-linux-musl', os: ['linux'], cpu: ['x64'], libc: ['musl'] },
  'linux-arm64-gnu': { triple: 'aarch64-unknown-linux-gnu', os: ['linux'], cpu: ['arm64'], libc: ['glibc'] },
  'linux-arm64-musl': { triple: 'aarch64-unknown-linux-musl', os: ['linux'], cpu: ['arm64'], libc: ['musl'] },
  'darwin-x64': { triple: 'x86_64-apple-darwin', os: ['darwin'], cpu: ['x64'] },
  'darwin-arm64': { triple: 'aarch64-apple-darwin', os: ['darwin'], cpu: ['arm64'] },
  'win32-x64-msvc': { triple: 'x86_64-pc-windows-msvc', os: ['win32'], cpu: ['x64'] },
  'win32-arm64-msvc': { triple: 'aarch64-pc-windows-msvc', os: ['win32'], cpu: ['arm64'] },
}
const host = hostPlatform()

// What the workflow's publish job does, read from the workflow itself so the two cannot drift.
const publishJob = parse(readFileSync(path.join(repo, '.github', 'workflows', 'release.yml'), 'utf8')).jobs.publish
const downloads = publishJob.steps.filter((s) => s.uses?.startsWith('actions/download-artifact@')).map((s) => s.with)
const bindingsDownload = downloads.find((w) => w.pattern === 'bindings-*')
const bindingDownload = downloads.find((w) => w.name === 'binding')
const runSteps = publishJob.steps.map((s) => s.run).filter(Boolean)
const publishCommand = runSteps.find((r) => r.startsWith('npm publish'))
// Between `npm ci` and `npm publish`, minus listings: the commands that prepare the packages.
const prepareCommands = runSteps.slice(runSteps.indexOf('npm ci --no-audit --no-fund') + 1, runSteps.indexOf(publishCommand))
  .filter((r) => !r.startsWith('ls '))

let work // the rehearsal's scratch directory
let stage // the package copy that gets "published"
let redis
const manifest = () => JSON.parse(readFileSync(path.join(stage, 'package.json'), 'utf8'))

before(async () => {
  if (!existsSync(path.join(repo, binaryName))) throw new Error(`${binaryName} is missing: run \`npm run build\` first (npm test does)`)
  work = await mkdtemp(path.join(os.tmpdir(), 'dokebi-lock-redis-release-'))
  stage = path.join(work, 'package')
  mkdirSync(stage)
  // What the publish job checks out (package.json `files` + npm/), plus the dev tools.
  const { files } = JSON.parse(readFileSync(path.join(repo, 'package.json'), 'utf8'))
  const generated = ['binding.js', 'binding.d.ts'] // not in git: they come from the build job
  for (const entry of [...files, 'package.json', 'README.md', 'npm']) {
    if (entry.includes('*') || generated.includes(entry)) continue // the binaries come from artifacts/, as in CI
    cpSync(path.join(repo, entry), path.join(stage, entry), { recursive: true, filter: (src) => !src.endsWith('.node') })
  }
  symlinkSync(path.join(repo, 'node_modules'), path.join(stage, 'node_modules'), 'dir')
  // The `binding` artifact, downloaded where the workflow puts it.
  for (const file of generated) cpSync(path.join(repo, file), path.join(stage, bindingDownload.path, file))
  // The build jobs' `bindings-<target>` artifacts, each in its own folder as download-artifact
  // lays out a pattern download.
  for (const [platform, { triple }] of Object.entries(PLATFORMS)) {
    const dir = path.join(stage, bindingsDownload.path, `bindings-${triple}`)
    mkdirSync(dir, { recursive: true })
    const file = path.join(dir, `lock-redis.${platform}.node`)
    if (platform === host) cpSync(path.join(repo, binaryName), file)
    else writeFileSync(file, `placeholder for the ${platform} build job's binary\n`)
  }
  redis = await startRedis()
})

after(async () => {
  if (work) await rm(work, { recursive: true, force: true })
  await redis?.stop()
})

describe('npm/<platform> packages', () => {
  test('one per target, named @dokebi/lock-redis-<platform>, 0.4.1, with os/cpu/libc and the .node as main', () => {
    const { napi, optionalDependencies } = JSON.parse(readFileSync(path.join(repo, 'package.json'), 'utf8'))
    assert.deepEqual([...napi.targets].sort(), Object.values(PLATFORMS).map((p) => p.triple).sort())
    assert.equal(napi.binaryName, 'lock-redis')
    assert.equal(optionalDependencies, undefined, 'written by `napi prepublish` at release, not kept in the source (0101)')
    const dirs = readdirSync(path.join(repo, 'npm'), { withFileTypes: true }).filter((d) => d.isDirectory()).map((d) => d.name)
    assert.deepEqual(dirs.sort(), Object.keys(PLATFORMS).sort())
    for (const [platform, want] of Object.entries(PLATFORMS)) {
      const pkg = JSON.parse(readFileSync(path.join(repo, 'npm', platform, 'package.json'), 'utf8'))
      const file = `lock-redis.${platform}.node`
      assert.equal(pkg.name, `@dokebi/lock-redis-${platform}`)
      assert.equal(pkg.version, VERSION)
      assert.deepEqual(pkg.os, want.os, platform)
      assert.deepEqual(pkg.cpu, want.cpu, platform)
      assert.deepEqual(pkg.libc, want.libc, platform)
      assert.equal(pkg.main, file)
      assert.deepEqual(pkg.files, [file])
      assert.equal(pkg.engines.node, '>=24.0.0')
      assert.match(readFileSync(path.join(repo, 'npm', platform, 'README.md'), 'utf8'), new RegExp(want.triple))
    }
  })
})

describe('release rehearsal', () => {
  let rootTarball
  let hostTarball

  test("the workflow's publish job prepares with `npm run artifacts` and publishes with `npm publish`", () => {
    assert.deepEqual(prepareCommands, ['npm run artifacts'])
    assert.match(publishCommand, /^npm publish --provenance\b/, 'npm publish runs prepublishOnly, rehearsed below')
  })

  test("the publish job's commands put each binary into its npm/<platform> package", async () => {
    for (const command of prepareCommands) {
      const [file, ...args] = command.split(' ')
      await ok(file, args, { cwd: stage, env: userEnv(), timeoutMs: 60_000 })
    }
    for (const platform of Object.keys(PLATFORMS)) {
      assert.ok(existsSync(path.join(stage, 'npm', platform, `lock-redis.${platform}.node`)), platform)
    }
  })

  test('prepublishOnly refuses a root binary that is not the release artifact', async () => {
    const local = path.join(stage, binaryName)
    const artifact = readFileSync(local)
    writeFileSync(local, 'a local debug build')
    try {
      const refused = await run(process.execPath, ['npm/prune-root-binaries.mjs'], { cwd: stage })
      assert.equal(refused.code, 1)
      assert.match(refused.stderr, new RegExp(`${binaryName.replaceAll('.', '\\.')}.*not the release artifact`))
      assert.ok(existsSync(local), 'nothing is deleted when it refuses')
    } finally {
      writeFileSync(local, artifact)
    }
  })

  test('prepublishOnly: root copies removed, optionalDependencies on all eight at 0.4.1', async () => {
    // The script exactly as `npm publish` runs it, minus the publishing of the platform packages.
    await ok('npm', ['run', 'prepublishOnly', '--', '--skip-optional-publish', '--no-gh-release'], {
      cwd: stage, env: userEnv(), timeoutMs: 120_000,
    })
    assert.deepEqual(rootBinaries(stage), [], 'the published root package carries no binary')
    const expected = Object.fromEntries(Object.keys(PLATFORMS).map((p) => [`@dokebi/lock-redis-${p}`, VERSION]))
    assert.deepEqual(manifest().optionalDependencies, expected)
  })

  test('the packed root and platform packages hold what they should', async () => {
    const root = await npmPack(stage, work)
    assert.deepEqual(root.paths.filter((p) => p.endsWith('.node')), [], 'no binary in the root package')
    for (const file of ['index.js', 'index.d.ts', 'binding.js', 'package.json']) assert.ok(root.paths.includes(file), file)
    rootTarball = root.tarball
    const platforms = Object.keys(PLATFORMS)
    const packs = await Promise.all(platforms.map((p) => npmPack(path.join(stage, 'npm', p), work, { dryRun: p !== host })))
    platforms.forEach((platform, i) => {
      assert.deepEqual(packs[i].paths, ['README.md', `lock-redis.${platform}.node`, 'package.json'].sort(), platform)
      if (platform === host) hostTarball = packs[i].tarball
    })
  })

  test('an app with the platform package loads the binary from it and locks', async () => {
    const app = await tempApp('release')
    try {
      await npmInstallOffline(app.dir, [rootTarball, hostTarball])
      const script = `const { createRedisLockDriver } = require('@dokebi/lock-redis')
        ;(async () => {
          const driver = createRedisLockDriver(process.env.REDIS_URL, { driver: 'redis', connection: 'main', namespace: 'release-${process.pid}' })
          const lease = await driver.acquire('k')
          let released
          try { released = await lease.release() } finally { await driver.shutdown() }
          const binary = Object.keys(require.cache).find((f) => f.endsWith('.node'))
          console.log(JSON.stringify({ fence: lease.fence, released, binary }))
        })()`
      await writeFile(path.join(app.dir, 'lock.cjs'), script)
      const { stdout } = await ok(process.execPath, ['lock.cjs'], { cwd: app.dir, env: userEnv({ REDIS_URL: redis.url }), timeoutMs: 20_000 })
      const seen = JSON.parse(stdout)
      assert.equal(seen.released, true)
      assert.match(seen.fence, /^[1-9][0-9]*$/)
      assert.equal(seen.binary, path.join(app.dir, 'node_modules', `@dokebi/lock-redis-${host}`, binaryName))
    } finally {
      await app.dispose()
    }
  })

  describe('an app whose platform package could not be installed', () => {
    let app
    let failure
    before(async () => {
      app = await tempApp('nobinary')
      // Offline, the eight optional dependencies are unreachable: npm skips them and succeeds.
      await npmInstallOffline(app.dir, [rootTarball])
      const probe = `try { require('@dokebi/lock-redis'); console.log('null') } catch (err) {
        const chain = []; for (let e = err; e; e = e.cause) chain.push(String(e.message))
        console.log(JSON.stringify({ message: err.message, chain }))
      }`
      const { stdout } = await ok(process.execPath, ['-e', probe], { cwd: app.dir, env: userEnv(), timeoutMs: 20_000 })
      failure = JSON.parse(stdout)
    })
    after(() => app?.dispose())

    test('installs, and loading fails with an error whose causes name the platform package', () => {
      assert.ok(failure, 'loading must fail without a binary')
      assert.ok(failure.chain.some((m) => m.includes(`@dokebi/lock-redis-${host}`)), failure.chain.join('\n'))
    })

    // The generated binding.js's own message names no platform; index.js wraps it.
    test('the top-level message names the platform and the supported ones', () => {
      assert.match(failure.message, new RegExp(host))
      // index.js keeps its own list: it must name every target package.json builds.
      const prebuilt = /Prebuilt: ([^.]+)\./.exec(failure.message)?.[1].split(', ')
      assert.deepEqual(prebuilt?.sort(), Object.keys(PLATFORMS).sort(), failure.message)
    })
  })
})
