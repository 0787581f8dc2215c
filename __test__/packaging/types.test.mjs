// The types, as a strict TypeScript user sees them (__test__/types/, `npm run test:types`):
// usage.mts / usage.cts use the whole public API and must compile; every line of
// invalid.mts marked `// @ts-expect-error TSxxxx reason` must fail with exactly that error.

import assert from 'node:assert/strict'
import { mkdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs'
import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { after, before, test } from 'node:test'
import { bin, repo, run, typeRoots } from './support.mjs'

const typesDir = path.join(repo, '__test__', 'types')
const DIRECTIVE = /^\s*\/\/ @ts-expect-error (TS\d+) (\S.*)$/

const tsc = (args, cwd = repo) => run(process.execPath, [bin.tsc, ...args, '--pretty', 'false'], { cwd, timeoutMs: 120_000 })

/** `file(line,col): error TSxxxx: message` lines of tsc's output. */
function diagnostics(output) {
  return [...output.matchAll(/^(.+?)\((\d+),(\d+)\): error (TS\d+): (.*)$/gm)].map(([, file, line, , code, message]) => ({
    file: path.basename(file), line: Number(line), code, message,
  }))
}

// A scratch project in which `@dokebi/lock-redis` resolves to this repository through
// node_modules, exactly as for a user, so a file can be checked outside __test__/types.
let scratch
before(async () => {
  scratch = await mkdtemp(path.join(os.tmpdir(), 'dokebi-lock-redis-types-'))
  mkdirSync(path.join(scratch, 'node_modules', '@dokebi'), { recursive: true })
  symlinkSync(repo, path.join(scratch, 'node_modules', '@dokebi', 'lock-redis'), 'dir')
})
after(() => scratch && rm(scratch, { recursive: true, force: true }))

/** Type-checks `source` as `name` in the scratch project with the compiler options of __test__/types. */
async function checkScratch(name, source) {
  writeFileSync(path.join(scratch, name), source)
  writeFileSync(path.join(scratch, 'tsconfig.json'), JSON.stringify({
    extends: path.join(typesDir, 'tsconfig.json'),
    compilerOptions: { typeRoots: [typeRoots] },
    files: [name],
  }))
  return tsc(['-p', scratch], scratch)
}

test('strict tsc --noEmit passes over the usage files (import and require) and the invalid file', async () => {
  const { code, stdout, stderr } = await tsc(['-p', typesDir])
  assert.equal(code, 0, `tsc failed:\n${stdout}${stderr}`)
})

test('each @ts-expect-error in invalid.mts marks a line that fails with exactly the named error', async () => {
  const lines = readFileSync(path.join(typesDir, 'invalid.mts'), 'utf8').split('\n')
  const expected = new Map() // 1-based line of the code -> [code, reason]
  const stripped = lines.map((line, i) => {
    const m = DIRECTIVE.exec(line)
    if (!m) {
      assert.ok(!/^\s*\/\/\s*@ts-expect-error/.test(line), `line ${i + 1}: a directive must name its error: ${line.trim()}`)
      return line
    }
    expected.set(i + 2, [m[1], m[2]])
    return '//' // keeps the line numbers
  })
  assert.ok(expected.size >= 20, `only ${expected.size} invalid uses`)

  const { stdout } = await checkScratch('invalid.mts', stripped.join('\n'))
  const found = diagnostics(stdout)
  const byLine = new Map(found.map((d) => [d.line, d]))
  for (const [line, [code, reason]] of expected) {
    const d = byLine.get(line)
    assert.ok(d, `line ${line} (${reason}) compiles, but must not`)
    assert.equal(d.code, code, `line ${line} (${reason}) fails with ${d.code} ${d.message}, expected ${code}`)
  }
  const unexpected = found.filter((d) => !expected.has(d.line))
  assert.deepEqual(unexpected, [], 'errors on lines without a directive')
})

test('the usage files carry no @ts-expect-error: they compile as written', () => {
  for (const file of ['usage.mts', 'usage.cts']) {
    assert.ok(!readFileSync(path.join(typesDir, file), 'utf8').includes('@ts-expect-error'), `${file} must compile as it is`)
  }
})

test('pending.mts compiles: LockError constructor, `| undefined` on optional fields',
  async () => {
    const { code, stdout } = await checkScratch('pending.mts', readFileSync(path.join(typesDir, 'pending.mts'), 'utf8'))
    assert.equal(code, 0, stdout)
  })
