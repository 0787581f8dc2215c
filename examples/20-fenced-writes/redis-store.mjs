// The store side of fencing, in Redis: a write carries the lease's fence, and a small script
// keeps it only if no write with a larger fence came first. The script compares the fences
// as decimal strings (a longer one is larger; equal lengths compare digit by digit): Lua
// numbers are doubles and would round a fence's last digits.
//
// The store may be the lock's Redis or another one; here it is any client that can EVAL.
const FENCED_SET = `
local current = redis.call('HGET', KEYS[1], 'fence')
local fence = ARGV[2]
if current and (#current > #fence or (#current == #fence and current >= fence)) then
  return 0
end
redis.call('HSET', KEYS[1], 'body', ARGV[1], 'fence', fence)
return 1`

/** `evalScript(script, keys, args)` runs EVAL on the store's Redis and resolves with the reply. */
export function fencedRedisStore(evalScript) {
  return {
    /** True when the write was kept; false when a write with this fence or a larger one came first. */
    async write(key, body, fence) {
      return (await evalScript(FENCED_SET, [key], [body, fence])) === 1
    },
  }
}
