-- leaky_bucket.lua: a leaky-bucket (queue) rate limiter as one atomic Redis
-- Lua script.
--
-- Reference implementation of `RATELIMIT.CHECK key leaky-bucket ...` from the
-- redis-ratelimit command contract (docs/algorithms.md): for the same calls
-- it gives the module's reply, integer for integer, and it can be deployed on
-- its own where the module cannot be loaded.
--
-- The bucket is a queue of capacity C drained at the strictly constant rate
-- of L requests per P ms. An admitted request gets its place in the queue as
-- delay_ms: the caller waits that long before processing it, which turns
-- bursts into an evenly spaced stream.
--
-- Usage:
--   EVAL <script> 1 <key> <limit> <period_ms> <burst> <cost> <now_ms>
--     limit      L, requests drained per period (1 .. 10^12)
--     period_ms  P, the period in ms (1 .. 3650 days)
--     burst      C, the queue's size in requests (1 .. 10^12; pass L if none)
--     cost       c, the request's weight (0 .. 10^12); 0 asks without queueing
--     now_ms     the call's time in ms since the Unix epoch (below 2^53), or
--                an empty string to use the Redis server's clock (TIME),
--                so that no client clock is trusted
--
-- Reply: {allowed, limit, remaining, retry_after_ms, reset_after_ms, delay_ms}
--   allowed         1 if admitted (and queued), else 0
--   limit           C
--   remaining       whole requests that still fit in the queue after this call
--   retry_after_ms  0 if allowed; else ms until the same request would fit;
--                   -1 if it never can (c > C)
--   reset_after_ms  ms until the queue is empty (0: it is)
--   delay_ms        for an admitted request (cost 0 included), ms until its
--                   turn: the queue's length before it, ceil(level / L);
--                   0 when rejected
--
-- Arithmetic: in scaled units one request is worth P units and L units drain
-- per ms, so every quantity is an integer. Lua numbers are doubles and are
-- exact below 2^53; the script refuses a call with C*P >= 2^53 rather than
-- round, and never forms a larger product (draining and rescaling are done by
-- comparison and exact multiply-divide).
--
-- State: a HASH at KEYS[1], written only by a consuming call (admitted, c > 0):
--   alg     "leaky-bucket"
--   limit   L of the last consuming call
--   period  P of the last consuming call (ms)
--   burst   C of the last consuming call
--   level   the queue's length after that call, scaled (requests * P), > 0
--   last    t of that call (ms); later calls are evaluated at max(now, last)
-- The key expires (PEXPIREAT) at t + reset_after_ms, the moment the queue is
-- empty, when it is equivalent to no key at all. A rejected call or cost 0
-- changes nothing, not even the TTL.
-- A key holding another reference script's HASH gets an ERR naming its
-- algorithm; any other key that is not such a HASH gets WRONGTYPE.
--
-- Parameters given on a call win: the stored queue is first drained up to t
-- under its stored L and P, then carried over in requests to the new P
-- (level * P_new / P_old, rounded up) and clamped to the new capacity.

local key = KEYS[1]

local EXACT = 9007199254740992 -- 2^53: doubles hold every integer below it

-- Integer helpers. Float division is correctly rounded, so math.floor(a / b)
-- is at most one off for integers below 2^53; the loops make it exact.
local function floor_div(a, b)
  local q = math.floor(a / b)
  while q * b > a do q = q - 1 end
  while (q + 1) * b <= a do q = q + 1 end
  return q
end

local function ceil_div(a, b)
  local q = floor_div(a, b)
  if q * b < a then q = q + 1 end
  return q
end

-- Exact a*b = q*m + r (0 <= r < m) for integers 0 <= a < m < 2^53,
-- 0 <= b < 2^53, without forming a*b (which may exceed 2^53): binary
-- long multiplication modulo m; every intermediate stays below m.
local function mul_div(a, b, m)
  local bits = {}
  while b > 0 do
    local bit = b % 2
    bits[#bits + 1] = bit
    b = (b - bit) / 2
  end
  local q, r = 0, 0
  for i = #bits, 1, -1 do
    q = q * 2
    if r >= m - r then r = r - (m - r); q = q + 1 else r = r + r end
    if bits[i] == 1 then
      if r >= m - a then r = r - (m - a); q = q + 1 else r = r + a end
    end
  end
  return q, r
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
local C = int_arg(3, 'burst', 1, 1e12)
local cost = int_arg(4, 'cost', 0, 1e12)
local now
if ARGV[5] == '' then -- the server's clock
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
else
  now = int_arg(5, 'now_ms', 0, EXACT - 1)
end
if bad_arg then return redis.error_reply('ERR invalid ' .. bad_arg) end
if C * P >= EXACT then
  return redis.error_reply('ERR burst * period_ms must stay below 2^53 for exact Lua arithmetic')
end

local full = C * P -- a full queue under the new parameters, scaled

-- Load the stored queue, if any, and bring it to t.
local t = now
local level = 0 -- a fresh (or absent) key is an empty queue
local s = redis.call('HMGET', key, 'alg', 'limit', 'period', 'burst', 'level', 'last')
if s[1] then
  if s[1] ~= 'leaky-bucket' then
    return redis.error_reply('ERR key holds a ' .. s[1] .. ' limiter, not leaky-bucket')
  end
  local L0, P0, C0 = tonumber(s[2]), tonumber(s[3]), tonumber(s[4])
  local lvl, last = tonumber(s[5]), tonumber(s[6])
  if not (L0 and P0 and C0 and lvl and last) then
    return redis.error_reply('ERR corrupt leaky-bucket state')
  end
  if last > t then t = last end -- time never runs backwards for a key

  -- Drain under the stored parameters: max(0, lvl - (t - last)*L0), decided
  -- by comparison so that (t - last)*L0 is only formed when small.
  local elapsed = t - last
  if elapsed >= ceil_div(lvl, L0) then lvl = 0 else lvl = lvl - elapsed * L0 end

  -- An empty queue is a fresh key (it would have expired now): keep 0.
  -- Otherwise carry it over in requests to the new period, rounding up, and
  -- clamp it to the new capacity.
  if lvl > 0 then
    if P0 == P then
      level = math.min(lvl, full)
    else
      local whole = floor_div(lvl, P0)
      if whole >= C then
        level = full
      else
        local part, rem = mul_div(lvl - whole * P0, P, P0) -- frac * P / P0
        if rem > 0 then part = part + 1 end                -- rounded up
        level = math.min(whole * P + part, full)
      end
    end
  end
elseif redis.call('EXISTS', key) == 1 then
  -- a HASH, but not one of ours: like any other wrong type
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end

-- Decide at t under the new parameters.
local allowed, retry_after, delay = 0, 0, 0
if cost > C then
  retry_after = -1 -- more than the queue can ever hold
elseif level <= full - cost * P then
  allowed = 1
  delay = ceil_div(level, L) -- the queue ahead of this request
  level = level + cost * P
else
  retry_after = ceil_div(level - (full - cost * P), L)
end

local remaining = floor_div(full - level, P)
local reset_after = ceil_div(level, L)

if allowed == 1 and cost > 0 then
  redis.call('HSET', key, 'alg', 'leaky-bucket', 'limit', fmt(L), 'period', fmt(P),
    'burst', fmt(C), 'level', fmt(level), 'last', fmt(t))
  redis.call('PEXPIREAT', key, fmt(t + reset_after))
end

return {allowed, C, remaining, retry_after, reset_after, delay}
