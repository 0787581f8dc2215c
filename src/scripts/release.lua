-- Release a lease if it is still ours, and tell waiters in every process.
-- KEYS[1] lock key; ARGV[1] owner token, ARGV[2] release channel, ARGV[3] key hash.
-- Reply: 1 when this call deleted the key, 0 when it was no longer ours.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
-- The release already happened; a PUBLISH denied by an ACL must not turn it into an error.
pcall(redis.call, 'PUBLISH', ARGV[2], ARGV[3])
return 1
