// A throwaway redis-server on a free port for one test run: bound to 127.0.0.1, no
// persistence, killed with the test process. Needs `redis-server` on the PATH
// (apt-get install redis-server, brew install redis).
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import net from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'

async function freePort() {
  const probe = net.createServer().listen(0, '127.0.0.1')
  await once(probe, 'listening')
  const { port } = probe.address()
  await new Promise((resolve) => probe.close(resolve))
  return port
}

function answersPing(port) {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1', () => socket.write('PING\r\n'))
    socket.once('data', (reply) => { socket.destroy(); resolve(reply.toString().startsWith('+PONG')) })
    socket.once('error', () => resolve(false))
  })
}

/** Starts a redis-server; resolves with `{ url, stop() }` once it answers PING. */
export async function startRedis() {
  const port = await freePort()
  const child = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' })
  child.unref() // the server must never be what keeps the test process alive
  const kill = () => child.kill('SIGKILL')
  process.once('exit', kill)
  const deadline = Date.now() + 10_000
  while (!(await answersPing(port))) {
    if (child.exitCode !== null) throw new Error(`redis-server exited (${child.exitCode}); is port ${port} taken?`)
    if (Date.now() > deadline) { kill(); throw new Error('redis-server did not answer PING within 10 s') }
    await sleep(20)
  }
  return {
    url: `redis://127.0.0.1:${port}`,
    async stop() {
      process.off('exit', kill)
      if (child.exitCode !== null || child.signalCode !== null) return
      child.ref() // keep the process up until the server has gone
      const gone = once(child, 'exit')
      child.kill('SIGTERM')
      await gone
    },
  }
}
