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

-- Removes a key this script just wrote, with the command that just succeeded on the lease
-- (SET), so an ACL that denies DEL cannot keep it; DEL only where SET itself was refused.
-- An expiry in the past removes the key at once (PXAT needs Redis 6.2; before that, 1 ms).
local function drop(key, value)
  local gone = redis.pcall('SET', key, value, 'XX', 'PXAT', 1)
  if type(gone) == 'table' and gone.err then
    gone = redis.pcall('SET', key, value, 'XX', 'PX', 1)
  end
  if type(gone) == 'table' and gone.err then
    redis.pcall('DEL', key)
  end
end

-- A script never answers with an error after it wrote: the lease is taken back first.
local function undo(err)
  drop(KEYS[1], ARGV[1])
  return err
end

local fence = redis.pcall('INCR', KEYS[2])
if type(fence) == 'table' then
  return undo(fence) -- INCR refused: an ACL, or a counter that is not an integer
end
if fence == 1 then
  -- The counter was missing (first use, expired, or Redis lost data): it starts at TIME ms
  -- x 1000, so new fences stay above any handed out before (D-0041). TIME only here, not
  -- before the first write, keeps the common path at two commands. Refused (TIME is only in
  -- @fast: an ACL written by category lacks it), the counter INCR just created goes back
  -- with the lease, or it would hand out 2, 3, ... unseeded (decision 0164).
  local t = redis.pcall('TIME')
  if t.err then
    drop(KEYS[2], '0')
    return undo(t)
  end
  -- Built as a string: Lua numbers are doubles and tostring prints them with %.14g.
  local seed = t[1] .. string.format('%03d', math.floor(tonumber(t[2]) / 1000)) .. '001'
  local seeded
  if ARGV[3] then
    seeded = redis.pcall('SET', KEYS[2], seed, 'PX', ARGV[3])
  else
    seeded = redis.pcall('SET', KEYS[2], seed)
  end
  if type(seeded) == 'table' and seeded.err then
    -- The counter INCR just created at 1 would make the next acquire draw 2: take it back
    -- too, so the next one seeds again.
    drop(KEYS[2], '0')
    return undo(seeded)
  end
  return seed
end
-- INCR's integer arrives as a Lua double: exact below 2^53, and '%.0f' prints it in full
-- (tostring would use %.14g). Above that, read the counter back as Redis stores it.
if fence < 9007199254740992 then
  return string.format('%.0f', fence)
end
-- A refused GET answers its error with the lease taken back; the counter keeps the step
-- INCR drew, a fence no one holds: fences only need to rise (decision 0164).
local exact = redis.pcall('GET', KEYS[2])
if type(exact) == 'table' and exact.err then
  return undo(exact)
end
return exact
