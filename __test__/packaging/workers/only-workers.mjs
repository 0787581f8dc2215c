// A process whose main thread never loads the addon: worker threads load it one after
// another (as a worker pool that recycles its threads does). Run by workers.test.mjs as
// `node only-workers.mjs <redis url> <namespace> <workers>`; prints one JSON line per worker
// and must then exit by itself.
import path from 'node:path'
import { Worker } from 'node:worker_threads'

const [url, namespace, count] = process.argv.slice(2)
const worker = path.join(import.meta.dirname, 'lock-worker.mjs')
const shared = new SharedArrayBuffer(3 * Int32Array.BYTES_PER_ELEMENT)

for (let id = 1; id <= Number(count); id++) {
  const w = new Worker(worker, { workerData: { url, namespace, id, rounds: 3, shared, holdMs: 1, mode: 'compete' } })
  let last
  w.on('message', (m) => { last = m })
  const code = await new Promise((resolve, reject) => { w.once('error', reject); w.once('exit', resolve) })
  console.log(JSON.stringify({ id, code, error: last?.error ?? null, releasedAll: last?.releasedAll ?? null }))
}
