-- Release a lease if it is still ours, and tell the waiters of this key (notifications
-- 'per-key' or 'both'; the namespace default runs release.lua, unchanged).
-- KEYS[1] lock key; ARGV[1] owner token, ARGV[2] the key's channel (same hash tag as
-- KEYS[1], so in a Cluster it lives in the key's slot), ARGV[3] key hash, ARGV[4] '1' to
-- publish sharded (SPUBLISH, Cluster), ARGV[5] the namespace channel too ('both'), or absent.
-- Reply: 0 when the key was no longer ours; otherwise 1 + the number of subscribers that
-- heard the release (the releasing process uses it to give other processes a head start).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
-- The release already happened: nothing below may turn it into an error.
local heard = 0
local published, listeners = false, nil
if ARGV[4] == '1' then
  published, listeners = pcall(redis.call, 'SPUBLISH', ARGV[2], ARGV[3])
end
if not published then
  -- Not sharded, or a server without SPUBLISH (Redis < 7): classic PUBLISH, which the
  -- waiters of such a server subscribe to (decision 0064).
  published, listeners = pcall(redis.call, 'PUBLISH', ARGV[2], ARGV[3])
end
if published and type(listeners) == 'number' then
  heard = heard + listeners
end
if ARGV[5] then
  published, listeners = pcall(redis.call, 'PUBLISH', ARGV[5], ARGV[3])
  if published and type(listeners) == 'number' then
    heard = heard + listeners
  end
end
return 1 + heard
