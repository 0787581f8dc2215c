// Docs that cannot rot: every JavaScript block of README.md and the user guides in docs/ runs
// against a throwaway redis-server and must exit 0 by itself; every TypeScript block is
// type-checked with the strict options of __test__/types; a block that is deliberately a
// fragment says so (`<!-- fragment -->` on the line before it) and is only parsed. Every
// relative link and #anchor between the pages must lead somewhere.
//
// Blocks run in a scratch folder whose node_modules/@dokebi/lock-redis links to this
// repository, so `import … from '@dokebi/lock-redis'` loads the package under test exactly as
// it loads for a user. `redis://127.0.0.1:6379` in a block, and REDIS_URL, point at the
// throwaway server (never at a Redis on 6379).

import assert from 'node:assert/strict'
import { mkdirSync, readdirSync, readFileSync, statSync, symlinkSync, writeFileSync } from 'node:fs'
import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { after, before, describe, test } from 'node:test'
import { startRedis } from './helpers/redis.mjs'
import { bin, repo, run, typeRoots } from './packaging/support.mjs'

// Maintainers' records (decisions, operations and chaos histories, perf notes) are not user
// pages: their code is evidence of a moment, not instructions.
const RECORDS = new Set(['CHAOS.md', 'OPS-002.md'])
const guides = readdirSync(path.join(repo, 'docs'))
  .filter((f) => f.endsWith('.md') && !RECORDS.has(f))
  .map((f) => path.join('docs', f))
/** What a user reads. */
const USER_PAGES = ['README.md', ...guides]
/** Pages whose code is run or type-checked (AI.md's snippet is what agents copy). */
const CODE_PAGES = [...USER_PAGES, 'AI.md']
/** Pages whose links are checked. */
const LINK_PAGES = [...CODE_PAGES, 'CONTRIBUTING.md']

const FRAGMENT = '<!-- fragment -->'
const RUN_LANGS = new Set(['js', 'javascript', 'mjs'])
const TYPE_LANGS = new Set(['ts', 'typescript', 'mts'])
const RUN_TIMEOUT_MS = 30_000 // a block does one short lock cycle: well under a second alone

/** The fenced code blocks of a Markdown text: language, 1-based line of the fence, code. */
function codeBlocks(markdown) {
  const lines = markdown.split('\n')
  const blocks = []
  for (let i = 0; i < lines.length; i++) {
    const open = /^(`{3,})(\S*)\s*$/.exec(lines[i])
    if (!open) continue
    const close = lines.findIndex((l, j) => j > i && l.startsWith(open[1]) && l.trim() === open[1])
    assert.ok(close > i, `an unclosed code fence at line ${i + 1}`)
    const before = lines.slice(0, i).findLast((l) => l.trim() !== '')
    blocks.push({
      lang: open[2].toLowerCase(),
      line: i + 1,
      code: lines.slice(i + 1, close).join('\n') + '\n',
      fragment: before?.trim() === FRAGMENT,
    })
    i = close
  }
  return blocks
}

const read = (page) => readFileSync(path.join(repo, page), 'utf8')
const blockName = (page, block, ext) => `${page.replace(/[^A-Za-z0-9]+/g, '-')}-L${block.line}.${ext}`


let scratch
let redis
before(async () => {
  scratch = await mkdtemp(path.join(os.tmpdir(), 'dokebi-lock-redis-docs-'))
  mkdirSync(path.join(scratch, 'node_modules', '@dokebi'), { recursive: true })
  symlinkSync(repo, path.join(scratch, 'node_modules', '@dokebi', 'lock-redis'), 'dir')
  // The one other client a guide uses (a Redis store that checks the fence).
  symlinkSync(path.join(repo, 'node_modules', 'ioredis'), path.join(scratch, 'node_modules', 'ioredis'), 'dir')
  writeFileSync(path.join(scratch, 'package.json'), '{ "private": true }\n')
})
after(async () => {
  await redis?.stop()
  if (scratch) await rm(scratch, { recursive: true, force: true })
})

describe('every JavaScript block of README.md, AI.md and docs/ runs and exits by itself', () => {
  before(async () => { redis = await startRedis() })
  for (const page of CODE_PAGES) {
    for (const block of codeBlocks(read(page)).filter((b) => RUN_LANGS.has(b.lang))) {
      const title = `${page}:${block.line}${block.fragment ? ' (fragment: parsed only)' : ''}`
      test(title, async () => {
        const file = path.join(scratch, blockName(page, block, 'mjs'))
        if (block.fragment) {
          writeFileSync(file, block.code)
          const { code, stderr } = await run(process.execPath, ['--check', file], { cwd: scratch })
          assert.equal(code, 0, `${title} does not parse:\n${stderr}`)
          return
        }
        writeFileSync(file, block.code.replaceAll(/redis:\/\/127\.0\.0\.1:6379(\/0)?/g, redis.url))
        const { code, stdout, stderr } = await run(process.execPath, [file], {
          cwd: scratch, env: { ...process.env, REDIS_URL: redis.url }, timeoutMs: RUN_TIMEOUT_MS,
        })
        assert.equal(code, 0, `${title} exited ${code}\n--- stdout\n${stdout}\n--- stderr\n${stderr}`)
      })
    }
  }
})

test('every TypeScript block of README.md, AI.md and docs/ passes a strict type check', async () => {
  const files = []
  for (const page of CODE_PAGES) {
    for (const block of codeBlocks(read(page)).filter((b) => TYPE_LANGS.has(b.lang))) {
      const name = blockName(page, block, 'mts')
      writeFileSync(path.join(scratch, name), block.code)
      files.push(name)
    }
  }
  assert.ok(files.length > 0, 'README shows `satisfies RedisLockBackendInput` in a TypeScript block')
  writeFileSync(path.join(scratch, 'tsconfig.json'), JSON.stringify({
    extends: path.join(repo, '__test__', 'types', 'tsconfig.json'),
    compilerOptions: { typeRoots: [typeRoots], noUnusedLocals: false },
    files,
  }))
  const { code, stdout, stderr } = await run(process.execPath, [bin.tsc, '-p', scratch, '--pretty', 'false'], {
    cwd: scratch, timeoutMs: 120_000,
  })
  assert.equal(code, 0, `tsc failed on the docs' TypeScript blocks:\n${stdout}${stderr}`)
})

test("README is a front door: under 20 KB, and its first block is a quick start that runs, within 40 lines", () => {
  const readme = read('README.md')
  assert.ok(Buffer.byteLength(readme) <= 20 * 1024, `README.md is ${Buffer.byteLength(readme)} bytes`)
  const first = codeBlocks(readme)[0]
  assert.ok(first && first.line <= 40, 'README.md has a code block in its first 40 lines')
  assert.ok(RUN_LANGS.has(first.lang) && !first.fragment, 'the first block is JavaScript that the test runs')
  assert.match(first.code, /from '@dokebi\/lock-redis'/, 'the quick start imports the package by name')
  assert.match(first.code, /shutdown\(\)/, 'the quick start shuts its driver down, so node exits')
})

/** GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to hyphens. */
function slug(heading) {
  return heading.trim().toLowerCase().replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, '').replaceAll(' ', '-')
}

function anchors(markdown) {
  const seen = new Map()
  const out = new Set()
  const prose = markdown.replace(/^(`{3,})[^\n]*\n[\s\S]*?^\1\s*$/gm, '')
  for (const [, text] of prose.matchAll(/^#{1,6}\s+(.+?)\s*#*\s*$/gm)) {
    const base = slug(text)
    const n = seen.get(base) ?? 0
    seen.set(base, n + 1)
    out.add(n ? `${base}-${n}` : base)
  }
  return out
}

test('every relative link and #anchor between README, CONTRIBUTING, AI.md and the guides leads somewhere', () => {
  const broken = []
  for (const page of LINK_PAGES) {
    const prose = read(page)
      .replace(/^(`{3,})[^\n]*\n[\s\S]*?^\1\s*$/gm, '') // code blocks
      .replace(/`[^`\n]*`/g, '') // inline code
    for (const [, target] of prose.matchAll(/\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)) {
      if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue // https:, mailto:
      const [file, anchor] = target.split('#')
      const resolved = file ? path.join(path.dirname(path.join(repo, page)), decodeURI(file)) : path.join(repo, page)
      let exists = true
      try { statSync(resolved) } catch { exists = false }
      if (!exists) { broken.push(`${page}: ${target} (no such file)`); continue }
      if (anchor !== undefined) {
        if (!resolved.endsWith('.md')) { broken.push(`${page}: ${target} (an anchor into a non-Markdown file)`); continue }
        if (!anchors(readFileSync(resolved, 'utf8')).has(anchor)) broken.push(`${page}: ${target} (no such heading)`)
      }
    }
  }
  assert.deepEqual(broken, [])
})

test('user pages explain in their own words: no issue numbers, no D-NNNN shorthand', () => {
  const found = []
  for (const page of USER_PAGES) {
    read(page).split('\n').forEach((line, i) => {
      if (/\bissues? \d+\b|\bD-\d{4}\b/i.test(line)) found.push(`${page}:${i + 1}: ${line.trim().slice(0, 100)}`)
    })
  }
  assert.deepEqual(found, [])
})
