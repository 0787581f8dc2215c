// One throwaway redis-server for the Jest run (or REDIS_URL's server, see helpers/redis.mjs).
// The test files read its address from the environment; global-teardown.mjs stops it.
import { startRedis } from '../helpers/redis.mjs'

export default async function globalSetup() {
  const redis = await startRedis()
  globalThis.__DOKEBI_JEST_REDIS__ = redis
  process.env.DOKEBI_JEST_REDIS_URL = redis.url
}
