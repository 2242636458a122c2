-- sliding_window.lua: a sliding-window (weighted counter) rate limiter as one
-- atomic Redis Lua script.
--
-- Reference implementation of `RATELIMIT.CHECK key sliding-window ...` from
-- the redis-ratelimit command contract (docs/algorithms.md): for the same
-- calls it gives the module's reply, integer for integer, and it can be
-- deployed on its own where the module cannot be loaded.
--
-- Windows are aligned to the Unix epoch (w = t - t mod P). The count of the
-- previous window is weighted by the part of it that still overlaps the last
-- P ms: with e = t - w, the estimate is prev*(P - e) + curr*P in scaled units
-- (one request = P units), and a request of cost c is admitted iff
-- estimate + c*P <= L*P. Two counters per key, no burst at window edges.
--
-- Usage:
--   EVAL <script> 1 <key> <limit> <period_ms> <burst> <cost> <now_ms>
--     limit      L, cost admitted per sliding period (1 .. 10^12)
--     period_ms  P, the period in ms (1 .. 3650 days)
--     burst      ignored (kept so that every reference script takes the same
--                ARGV; pass L)
--     cost       c, the request's weight (0 .. 10^12); 0 asks without counting
--     now_ms     the call's time in ms since the Unix epoch (below 2^53), or
--                an empty string to use the Redis server's clock (TIME),
--                so that no client clock is trusted
--
-- Reply: {allowed, limit, remaining, retry_after_ms, reset_after_ms, delay_ms}
--   allowed         1 if admitted (and counted), else 0
--   limit           L
--   remaining       max(0, floor((L*P - estimate) / P)) after this decision
--   retry_after_ms  0 if allowed; else the least d >= 1 such that the same
--                   request would be admitted at t + d; -1 if never (c > L)
--   reset_after_ms  w + 2P - t while the current window holds a count,
--                   w + P - t while only the previous one does, else 0
--   delay_ms        always 0
--
-- Arithmetic: Lua numbers are doubles, exact below 2^53; the script refuses a
-- call with L*P >= 2^53 rather than round.
--
-- State: a HASH at KEYS[1], written only by a consuming call (admitted, c > 0):
--   alg     "sliding-window"
--   limit   L of the last consuming call
--   period  P of the last consuming call (ms)
--   window  start w of the current window (ms since the epoch, multiple of P)
--   curr    cost admitted in window w, > 0
--   prev    cost admitted in window w - P (0 if that window saw none)
--   last    t of that call (ms); later calls are evaluated at max(now, last)
-- The key expires (PEXPIREAT) at w + 2P, when the current window has slid out
-- completely and the key is equivalent to no key at all. A rejected call or
-- cost 0 changes nothing, not even the TTL.
-- A key holding another reference script's HASH gets an ERR naming its
-- algorithm; any other key that is not such a HASH gets WRONGTYPE.
--
-- Parameters given on a call win: the counts are kept when the period is
-- unchanged (a new limit applies to them at once) and start afresh when the
-- period changes.

local key = KEYS[1]

local EXACT = 9007199254740992 -- 2^53: doubles hold every integer below it

-- Exact floor division for integers below 2^53 (float division is correctly
-- rounded, so math.floor(a / b) is at most one off; the loops fix that).
local function floor_div(a, b)
  local q = math.floor(a / b)
  while q * b > a do q = q - 1 end
  while (q + 1) * b <= a do q = q + 1 end
  return q
end

local function window_start(t, p) -- t - t mod p
  return floor_div(t, p) * p
end

local function fmt(n) -- integer to decimal string (tostring would use %.14g)
  return string.format('%.0f', n)
end

-- Plain decimal integers within bounds, as the module accepts them.
local bad_arg
local function int_arg(i, name, lo, hi)
  local s = ARGV[i]
  local n = s and string.match(s, '^%d+$') and tonumber(s)
  if not n or n < lo or n > hi then
    bad_arg = bad_arg or (name .. ': must be an integer from ' .. fmt(lo) .. ' to ' .. fmt(hi))
    return nil
  end
  return n
end

local L = int_arg(1, 'limit', 1, 1e12)
local P = int_arg(2, 'period_ms', 1, 3650 * 86400000)
-- ARGV[3] (burst) is ignored by the window algorithms.
local cost = int_arg(4, 'cost', 0, 1e12)
local now
if ARGV[5] == '' then -- the server's clock
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
else
  now = int_arg(5, 'now_ms', 0, EXACT - 1)
end
if bad_arg then return redis.error_reply('ERR invalid ' .. bad_arg) end
if L * P >= EXACT then
  return redis.error_reply('ERR limit * period_ms must stay below 2^53 for exact Lua arithmetic')
end

-- Load the stored windows, if any, and bring them to t.
local t = now
local prev, curr = 0, 0 -- a fresh (or absent) key has counted nothing
local s = redis.call('HMGET', key, 'alg', 'period', 'window', 'curr', 'prev', 'last')
if s[1] then
  if s[1] ~= 'sliding-window' then
    return redis.error_reply('ERR key holds a ' .. s[1] .. ' limiter, not sliding-window')
  end
  local P0, w0 = tonumber(s[2]), tonumber(s[3])
  local curr0, prev0, last = tonumber(s[4]), tonumber(s[5]), tonumber(s[6])
  if not (P0 and w0 and curr0 and prev0 and last) then
    return redis.error_reply('ERR corrupt sliding-window state')
  end
  if last > t then t = last end -- time never runs backwards for a key

  -- Slide under the stored period: the same window keeps both counts, the
  -- next one makes curr the previous count, any later one forgets both.
  -- Counts that are all 0 are a fresh key (it would have expired now); a
  -- changed period starts afresh under the new one.
  if P0 == P then
    local wt = window_start(t, P0)
    if wt == w0 then
      prev, curr = prev0, curr0
    elseif wt == w0 + P0 then
      prev, curr = curr0, 0
    end
  end
elseif redis.call('EXISTS', key) == 1 then
  -- a HASH, but not one of ours: like any other wrong type
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end

-- Decide at t under the new parameters.
local w = window_start(t, P)
local e = t - w                       -- ms elapsed in the current window
local LP = L * P                      -- the limit, scaled
local est = prev * (P - e) + curr * P -- the weighted estimate, scaled
local allowed, retry_after = 0, 0
if cost > L then
  retry_after = -1 -- more than a period can ever admit
elseif est <= LP - cost * P then
  allowed = 1
  curr = curr + cost
  est = est + cost * P
else
  -- The least d >= 1 that admits it at t + d. Later in this window, while
  -- prev decays: prev*(P - e - d) <= (L - curr - c)*P.
  if prev > 0 and curr + cost <= L then
    local d = math.max(1, P - e - floor_div((L - curr - cost) * P, prev))
    if d < P - e then retry_after = d end
  end
  -- Else in the next window, where curr becomes the previous count:
  -- curr*(P - e2) <= (L - c)*P at e2 ms into it; or at the start of the one
  -- after, where both counts are gone.
  if retry_after == 0 then
    if curr == 0 then
      retry_after = P - e
    else
      local e2 = math.max(0, P - floor_div((L - cost) * P, curr))
      if e2 < P then retry_after = P - e + e2 else retry_after = 2 * P - e end
    end
  end
end

local remaining = 0
if est < LP then remaining = floor_div(LP - est, P) end
local reset_after = 0
if curr > 0 then
  reset_after = 2 * P - (t - w)
elseif prev > 0 then
  reset_after = P - (t - w)
end

if allowed == 1 and cost > 0 then
  redis.call('HSET', key, 'alg', 'sliding-window', 'limit', fmt(L), 'period', fmt(P),
    'window', fmt(w), 'curr', fmt(curr), 'prev', fmt(prev), 'last', fmt(t))
  redis.call('PEXPIREAT', key, fmt(t + reset_after))
end

return {allowed, L, remaining, retry_after, reset_after, 0}
