#!/usr/bin/env node
// `npm run example`: runs examples/15-lock-redis with nothing set up (docs/decisions/0105).
//
// - Redis: REDIS_URL when set; otherwise the default address (redis://127.0.0.1:6379/0, or
//   DOKEBI_LOCK_REDIS_EXAMPLE_URL) when something accepts connections there; otherwise a
//   throwaway `redis-server` from the PATH on a free port, stopped when the example ends.
// - The addon: built (`npm run build`) only when lock-redis.<platform>.node is missing or
//   older than a build input (src/**, Cargo.toml, Cargo.lock, build.rs).
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { existsSync, mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'

const repo = path.resolve(import.meta.dirname, '..')
const example = path.join(repo, 'examples', '15-lock-redis', 'index.mjs')
const defaultUrl = process.env.DOKEBI_LOCK_REDIS_EXAMPLE_URL || 'redis://127.0.0.1:6379/0'

/** Whether something accepts a TCP connection at `url`'s host and port within 1 s. */
function answers(url) {
  const { hostname, port } = new URL(url)
  return new Promise((resolve) => {
    const socket = net.connect({ host: hostname.replace(/^\[|\]$/g, ''), port: Number(port || 6379) })
    const done = (ok) => { socket.destroy(); resolve(ok) }
    socket.setTimeout(1000, () => done(false))
    socket.once('connect', () => done(true))
    socket.once('error', () => done(false))
  })
}

function onPath(command) {
  const exts = process.platform === 'win32' ? (process.env.PATHEXT ?? '.EXE').split(';') : ['']
  return (process.env.PATH ?? '').split(path.delimiter).some((dir) =>
    dir && exts.some((ext) => { try { return statSync(path.join(dir, command + ext)).isFile() } catch { return false } }))
}

/** The napi platform suffix `napi build --platform` gives this machine's binary. */
function platformName() {
  const { platform, arch } = process
  if (platform === 'linux') return `linux-${arch}-${process.report.getReport().header.glibcVersionRuntime ? 'gnu' : 'musl'}`
  return platform === 'win32' ? `win32-${arch}-msvc` : `${platform}-${arch}`
}

function newestInput() {
  let newest = 0
  const visit = (file) => {
    const s = statSync(file, { throwIfNoEntry: false })
    if (!s) return
    if (s.isDirectory()) for (const name of readdirSync(file)) visit(path.join(file, name))
    else newest = Math.max(newest, s.mtimeMs)
  }
  for (const input of ['src', 'Cargo.toml', 'Cargo.lock', 'build.rs']) visit(path.join(repo, input))
  return newest
}

function run(file, args, opts = {}) {
  const child = spawn(file, args, { stdio: 'inherit', ...opts })
  return once(child, 'exit').then(([code, signal]) => code ?? (signal ? 1 : 0))
}

async function buildIfStale() {
  const binary = path.join(repo, `lock-redis.${platformName()}.node`)
  const built = statSync(binary, { throwIfNoEntry: false })?.mtimeMs
  if (built !== undefined && built >= newestInput() && existsSync(path.join(repo, 'binding.js'))) return
  console.log(`building the addon (${built === undefined ? `${path.basename(binary)} is missing` : 'its sources changed since the last build'})`)
  const npm = process.env.npm_execpath
  const code = npm
    ? await run(process.execPath, [npm, 'run', 'build'], { cwd: repo })
    : await run('npm', ['run', 'build'], { cwd: repo, shell: process.platform === 'win32' })
  if (code !== 0) process.exit(code)
}

async function freePort() {
  const probe = net.createServer().listen(0, '127.0.0.1')
  await once(probe, 'listening')
  const { port } = probe.address()
  await new Promise((resolve) => probe.close(resolve))
  return port
}

/** A redis-server on a free port, no persistence; resolves once it accepts connections. */
async function startRedis() {
  const port = await freePort()
  const dir = mkdtempSync(path.join(os.tmpdir(), 'dokebi-lock-redis-example-'))
  // Its own process group: Ctrl-C reaches the example (which shuts down and releases its
  // leases through this server) but not the server; we stop it after the example has ended.
  // setpriv (util-linux) has the kernel kill the server if this script dies by SIGKILL.
  const argv = ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir]
  const setpriv = ['/usr/bin/setpriv', '/bin/setpriv'].find((p) => existsSync(p))
  const [cmd, args] = setpriv ? [setpriv, ['--pdeathsig', 'KILL', 'redis-server', ...argv]] : ['redis-server', argv]
  const child = spawn(cmd, args, { stdio: 'ignore', detached: process.platform !== 'win32' })
  const kill = () => { child.kill('SIGKILL'); rmSync(dir, { recursive: true, force: true }) }
  process.once('exit', kill)
  for (const signal of ['SIGTERM', 'SIGHUP']) process.once(signal, () => process.exit(128 + os.constants.signals[signal]))
  let failure
  child.once('error', (err) => { failure = err })
  const deadline = Date.now() + 10_000
  while (!(await answers(`redis://127.0.0.1:${port}`))) {
    if (failure || child.exitCode !== null || Date.now() > deadline) {
      kill()
      throw new Error(`the throwaway redis-server did not start${failure ? ` (${failure.message})` : ''}`)
    }
    await sleep(20)
  }
  return {
    port,
    url: `redis://127.0.0.1:${port}/0`,
    async stop() {
      process.off('exit', kill)
      if (child.exitCode === null && child.signalCode === null) {
        const gone = once(child, 'exit')
        child.kill('SIGTERM')
        await gone
      }
      rmSync(dir, { recursive: true, force: true })
    },
  }
}

let url = process.env.REDIS_URL
let server
if (!url) {
  if (await answers(defaultUrl)) {
    url = defaultUrl
  } else if (!onPath('redis-server')) {
    const { host } = new URL(defaultUrl)
    console.error(`npm run example: nothing answers at ${host}, REDIS_URL is unset, and there is no redis-server on the PATH to start one.`)
    console.error('Install Redis (apt-get install redis-server, brew install redis) or set REDIS_URL=redis://<host>:<port>/0 to use a server you have.')
    process.exit(1)
  }
}
await buildIfStale()
if (!url) {
  try {
    server = await startRedis()
  } catch (err) {
    console.error(`npm run example: ${err.message}; set REDIS_URL=redis://<host>:<port>/0 to use a server you have.`)
    process.exit(1)
  }
  url = server.url
  console.log(`No Redis at ${new URL(defaultUrl).host} and REDIS_URL unset: started a throwaway redis-server on port ${server.port} for this run (stopped when it ends).`)
}

// The example handles Ctrl-C itself (it stops waiting and shuts down); we wait for it.
process.on('SIGINT', () => {})
const code = await run(process.execPath, [example], { env: { ...process.env, REDIS_URL: url } })
await server?.stop()
process.exit(code)
