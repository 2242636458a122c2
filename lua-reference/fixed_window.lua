-- fixed_window.lua: a fixed-window counter rate limiter as one atomic Redis Lua
-- script.
--
-- Reference implementation of `RATELIMIT.CHECK key fixed-window ...` from the
-- redis-ratelimit command contract (docs/algorithms.md): for the same calls
-- it gives the module's reply, integer for integer, and it can be deployed on
-- its own where the module cannot be loaded.
--
-- Windows are aligned to the Unix epoch: the window of time t starts at
-- w = t - t mod P. At most L cost is admitted per window (so up to 2L can pass
-- around a window boundary; use sliding_window.lua or sliding_log.lua if that
-- matters).
--
-- Usage:
--   EVAL <script> 1 <key> <limit> <period_ms> <burst> <cost> <now_ms>
--     limit      L, cost admitted per window (1 .. 10^12)
--     period_ms  P, the window's length in ms (1 .. 3650 days)
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
--   remaining       cost still admissible in this window after this decision
--   retry_after_ms  0 if allowed; else ms until the next window, w + P - t;
--                   -1 if it never can pass (c > L)
--   reset_after_ms  w + P - t while the window holds a count, else 0
--   delay_ms        always 0
--
-- State: a HASH at KEYS[1], written only by a consuming call (admitted, c > 0):
--   alg     "fixed-window"
--   limit   L of the last consuming call
--   period  P of the last consuming call (ms)
--   window  start w of the window counted in (ms since the epoch, multiple of P)
--   count   cost admitted in that window, > 0
--   last    t of that call (ms); later calls are evaluated at max(now, last)
-- The key expires (PEXPIREAT) at the end of its window, w + P, when it is
-- equivalent to no key at all. A rejected call or cost 0 changes nothing, not
-- even the TTL.
-- A key holding another reference script's HASH gets an ERR naming its
-- algorithm; any other key that is not such a HASH gets WRONGTYPE.
--
-- Parameters given on a call win: the stored count is kept when the period is
-- unchanged (a new limit applies to it at once, so remaining can be 0 with
-- count > L) and the window starts afresh when the period changes.

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

-- Load the stored window, if any, and bring it to t.
local t = now
local count = 0 -- a fresh (or absent) key has counted nothing
local s = redis.call('HMGET', key, 'alg', 'period', 'window', 'count', 'last')
if s[1] then
  if s[1] ~= 'fixed-window' then
    return redis.error_reply('ERR key holds a ' .. s[1] .. ' limiter, not fixed-window')
  end
  local P0, w0, count0, last = tonumber(s[2]), tonumber(s[3]), tonumber(s[4]), tonumber(s[5])
  if not (P0 and w0 and count0 and last) then
    return redis.error_reply('ERR corrupt fixed-window state')
  end
  if last > t then t = last end -- time never runs backwards for a key

  -- Under the stored period the count belongs to window w0 only. A count of
  -- 0 is a fresh key (it would have expired now). A changed period starts a
  -- fresh window under the new one.
  if window_start(t, P0) == w0 and P0 == P then count = count0 end
elseif redis.call('EXISTS', key) == 1 then
  -- a HASH, but not one of ours: like any other wrong type
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end

-- Decide at t under the new parameters.
local w = window_start(t, P)
local allowed, retry_after = 0, 0
if cost > L then
  retry_after = -1 -- more than a window can ever admit
elseif count + cost <= L then
  allowed = 1
  count = count + cost
else
  retry_after = P - (t - w) -- the next window admits it
end

local remaining = math.max(0, L - count)
local reset_after = 0
if count > 0 then reset_after = P - (t - w) end

if allowed == 1 and cost > 0 then
  redis.call('HSET', key, 'alg', 'fixed-window', 'limit', fmt(L), 'period', fmt(P),
    'window', fmt(w), 'count', fmt(count), 'last', fmt(t))
  redis.call('PEXPIREAT', key, fmt(t + reset_after))
end

return {allowed, L, remaining, retry_after, reset_after, 0}
