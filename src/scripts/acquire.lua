-- Acquire a lease and draw its fence in one step.
-- KEYS[1] lock key, KEYS[2] fence key (same hash tag); ARGV[1] owner token, ARGV[2] leaseMs,
-- ARGV[3] (optional) fenceTtlMs: the expiry a newly seeded counter gets.
-- Reply: the new fence as a decimal string, or the holder's PTTL (integer ms) when held.
if redis.replicate_commands then pcall(redis.replicate_commands) end -- Redis < 5: TIME after writes

-- The lease first, then the fence (decision 0030): two commands on the common path. A refused
-- SET (OOM, READONLY, an ACL) is the script's first write, so nothing was written; a held key
-- still answers its PTTL then, as it always did.
local taken = redis.pcall('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
if type(taken) == 'table' and taken.err then
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return redis.call('PTTL', KEYS[1])
  end
  return taken
end
if not taken then
  return redis.call('PTTL', KEYS[1])
end

-- Takes the lease back before the script answers with an error, with the very command that
-- just succeeded on this key, so an ACL that denies DEL cannot keep it. An expiry in the
-- past removes the key at once (PXAT needs Redis 6.2; before that, 1 ms).
local function undo(err)
  local gone = redis.pcall('SET', KEYS[1], ARGV[1], 'XX', 'PXAT', 1)
  if type(gone) == 'table' and gone.err then
    redis.pcall('SET', KEYS[1], ARGV[1], 'XX', 'PX', 1)
  end
  return err
end

local fence = redis.pcall('INCR', KEYS[2])
if type(fence) == 'table' then
  return undo(fence) -- INCR refused: an ACL, or a counter that is not an integer
end
if fence == 1 then
  -- The counter was missing (first use, expired, or Redis lost data): it starts at TIME ms
  -- x 1000, so new fences stay above any handed out before (D-0041). Built as a string: Lua
  -- numbers are doubles and tostring prints them with %.14g.
  local t = redis.call('TIME')
  local seed = t[1] .. string.format('%03d', math.floor(tonumber(t[2]) / 1000)) .. '001'
  local seeded
  if ARGV[3] then
    seeded = redis.pcall('SET', KEYS[2], seed, 'PX', ARGV[3])
  else
    seeded = redis.pcall('SET', KEYS[2], seed)
  end
  if type(seeded) == 'table' and seeded.err then
    -- The counter INCR just created at 1 would make the next acquire draw 2: take it back
    -- too, so the next one seeds again (where the same ACL allows DEL).
    redis.pcall('DEL', KEYS[2])
    return undo(seeded)
  end
  return seed
end
-- INCR's integer arrives as a Lua double: exact below 2^53, and '%.0f' prints it in full
-- (tostring would use %.14g). Above that, read the counter back as Redis stores it.
if fence < 9007199254740992 then
  return string.format('%.0f', fence)
end
return redis.call('GET', KEYS[2])
