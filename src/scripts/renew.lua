-- Extend a lease if it is still ours.
-- KEYS[1] lock key; ARGV[1] owner token, ARGV[2] leaseMs.
-- Reply: 1 when extended, 0 when another token or none holds the key.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
