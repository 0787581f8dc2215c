// Shared by the packaging tests: the repository's paths, child processes with deadlines, an
// environment without a Rust toolchain, and throwaway consumer apps.

import { execFile } from 'node:child_process'
import { existsSync, readdirSync, statSync } from 'node:fs'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'

export const repo = path.resolve(import.meta.dirname, '..', '..')
export const bin = {
  napi: path.join(repo, 'node_modules', '@napi-rs', 'cli', 'dist', 'cli.js'),
  tsc: path.join(repo, 'node_modules', 'typescript', 'bin', 'tsc'),
  jest: path.join(repo, 'node_modules', 'jest', 'bin', 'jest.js'),
}
export const typeRoots = path.join(repo, 'node_modules', '@types')

/** The napi platform name of this machine's binary, as `napi build --platform` names it. */
export function hostPlatform() {
  const { platform, arch } = process
  if (platform === 'linux') {
    const glibc = process.report.getReport().header.glibcVersionRuntime
    return `linux-${arch}-${glibc ? 'gnu' : 'musl'}`
  }
  if (platform === 'win32') return `win32-${arch}-msvc`
  return `${platform}-${arch}`
}

export const binaryName = `lock-redis.${hostPlatform()}.node`

/**
 * Runs a command; resolves `{ code, stdout, stderr }` whatever the exit code, rejects only when
 * it cannot start or overruns `timeoutMs` (a hang is a failure, not a stuck run).
 */
export function run(file, args, { cwd = repo, env = process.env, timeoutMs = 60_000 } = {}) {
  return new Promise((resolve, reject) => {
    execFile(file, args, { cwd, env, timeout: timeoutMs, killSignal: 'SIGKILL', maxBuffer: 64 << 20, encoding: 'utf8' },
      (err, stdout, stderr) => {
        if (err && err.killed) {
          reject(new Error(`${path.basename(file)} ${args.join(' ')} did not finish within ${timeoutMs} ms\n${stdout}\n${stderr}`))
        } else if (err && typeof err.code !== 'number') {
          reject(err)
        } else {
          resolve({ code: err ? err.code : 0, stdout, stderr })
        }
      })
  })
}

/** `run` that fails unless the exit code is 0, with the output in the message. */
export async function ok(file, args, opts) {
  const result = await run(file, args, opts)
  if (result.code !== 0) {
    throw new Error(`${path.basename(file)} ${args.join(' ')} exited ${result.code}\n--- stdout\n${result.stdout}\n--- stderr\n${result.stderr}`)
  }
  return result
}

const RUST_TOOLS = ['cargo', 'rustc', 'rustup']
const hasRust = (dir) => RUST_TOOLS.some((tool) => existsSync(path.join(dir, tool)))

/**
 * The environment of a user's machine without Rust: PATH keeps node's and npm's directories
 * and drops every directory that holds cargo, rustc or rustup; cargo/rustup variables and
 * the `npm_*` variables of the `npm test` that runs us are removed.
 */
export function userEnv(extra = {}) {
  const env = {}
  for (const [k, v] of Object.entries(process.env)) {
    if (/^(npm_|CARGO|RUSTUP|RUSTC|RUST_)/i.test(k) || k === 'NAPI_RS_NATIVE_LIBRARY_PATH') continue
    env[k] = v
  }
  const dirs = [path.dirname(process.execPath), ...(process.env.PATH ?? '').split(path.delimiter)]
  env.PATH = [...new Set(dirs)].filter((d) => d && !hasRust(d)).join(path.delimiter)
  return { ...env, ...extra }
}

/** Whether `tool` can be found on `env.PATH`. */
export function onPath(tool, env) {
  return env.PATH.split(path.delimiter).some((d) => {
    try {
      return statSync(path.join(d, tool)).isFile()
    } catch {
      return false
    }
  })
}

/** A fresh app directory with its own package.json; `dispose()` removes it. */
export async function tempApp(label, manifest = {}) {
  const dir = await mkdtemp(path.join(os.tmpdir(), `dokebi-lock-redis-${label}-`))
  await writeFile(path.join(dir, 'package.json'), JSON.stringify({ name: `consumer-${label}`, version: '1.0.0', private: true, ...manifest }, null, 2))
  return { dir, dispose: () => rm(dir, { recursive: true, force: true }) }
}

/**
 * `npm install <specs>` into `dir`, offline: nothing may come from the network, only from
 * the local tarballs (and the npm cache, which these installs never need).
 */
export function npmInstallOffline(dir, specs) {
  return ok('npm', ['install', ...specs, '--offline', '--no-audit', '--no-fund', '--loglevel=warn'], {
    cwd: dir,
    env: userEnv(),
    timeoutMs: 120_000,
  })
}

/** `npm pack` of `dir` into `dest`; resolves with npm's JSON report (files, filename). */
export async function npmPack(dir, dest, { dryRun = false } = {}) {
  const args = ['pack', '--json', '--pack-destination', dest]
  if (dryRun) args.push('--dry-run')
  const { stdout } = await ok('npm', args, { cwd: dir, env: userEnv(), timeoutMs: 120_000 })
  const [report] = JSON.parse(stdout.slice(stdout.indexOf('[')))
  return { ...report, tarball: path.join(dest, report.filename), paths: report.files.map((f) => f.path).sort() }
}

/** The `.node` files directly in `dir`. */
export const rootBinaries = (dir) => readdirSync(dir).filter((n) => n.endsWith('.node'))
