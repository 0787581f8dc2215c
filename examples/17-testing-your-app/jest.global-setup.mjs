// One redis-server for the whole Jest run; test files find it through REDIS_URL.
import { startRedis } from './redis-server.mjs'

export default async function globalSetup() {
  if (process.env.REDIS_URL) return
  globalThis.__REDIS__ = await startRedis()
  process.env.REDIS_URL = globalThis.__REDIS__.url
}
