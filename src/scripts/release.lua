-- Release a lease if it is still ours, and tell waiters in every process.
-- KEYS[1] lock key; ARGV[1] owner token, ARGV[2] release channel, ARGV[3] key hash.
-- Reply: 0 when the key was no longer ours; otherwise 1 + the number of subscribers that
-- heard the release (the releasing process uses it to give other processes a head start).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
-- The release already happened; a PUBLISH denied by an ACL must not turn it into an error.
local published, listeners = pcall(redis.call, 'PUBLISH', ARGV[2], ARGV[3])
if published and type(listeners) == 'number' then
  return 1 + listeners
end
return 1
