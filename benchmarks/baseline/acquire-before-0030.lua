-- Acquire a lease and draw its fence in one step.
-- KEYS[1] lock key, KEYS[2] fence key (same hash tag); ARGV[1] owner token, ARGV[2] leaseMs.
-- Reply: the new fence as a decimal string, or the holder's PTTL (integer ms) when held.
if redis.replicate_commands then pcall(redis.replicate_commands) end -- Redis < 5: TIME before writes

if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.call('PTTL', KEYS[1])
end

-- The fence first, the lease last (decision 0012): a refused write (OOM, READONLY, an ACL)
-- then fails before anything is written, and the only write that can precede an error is
-- a fence bump, which is harmless. The script is atomic, so no other acquire can slip in
-- between the check above and the SET below.
if redis.call('EXISTS', KEYS[2]) == 0 then
  -- A missing counter (first use, or Redis lost data) starts at TIME ms x 1000, so new
  -- fences stay above any handed out before. Built as a string: Lua numbers are doubles
  -- and tostring prints them with %.14g.
  local t = redis.call('TIME')
  local ms = t[1] .. string.format('%03d', math.floor(tonumber(t[2]) / 1000))
  redis.call('SET', KEYS[2], ms .. '000')
end
local fence = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
-- INCR's integer arrives as a Lua double: exact below 2^53, and '%.0f' prints it in full
-- (tostring would use %.14g). Above that, read the counter back as Redis stores it.
if fence < 9007199254740992 then
  return string.format('%.0f', fence)
end
return redis.call('GET', KEYS[2])
