-- gcra.lua: a GCRA (generic cell rate algorithm) rate limiter as one atomic
-- Redis Lua script.
--
-- Reference implementation of `RATELIMIT.CHECK key gcra ...` from the
-- redis-ratelimit command contract (docs/algorithms.md): for the same calls
-- it gives the module's reply, integer for integer, and it can be deployed on
-- its own where the module cannot be loaded.
--
-- Requests are scheduled one emission interval T = P/L apart, and the key
-- remembers its theoretical arrival time (TAT), the moment the schedule is
-- caught up. A request of cost c moves the TAT c*T later and is admitted if
-- the new TAT is at most the tolerance C*T ahead of t. With the same
-- parameters every reply is the token bucket's (token_bucket.lua); the two
-- differ when the parameters change (below).
--
-- Usage:
--   EVAL <script> 1 <key> <limit> <period_ms> <burst> <cost> <now_ms>
--     limit      L, requests per period: T = P/L (1 .. 10^12)
--     period_ms  P, the period in ms (1 .. 3650 days)
--     burst      C, the tolerance in requests (1 .. 10^12; pass L for the
--                usual "L per P, bursts of up to L"; redis-cell's and the
--                GCRA command's max_burst is C - 1)
--     cost       c, the request's weight (0 .. 10^12); 0 asks without consuming
--     now_ms     the call's time in ms since the Unix epoch (below 2^53), or
--                an empty string to use the Redis server's clock (TIME),
--                so that no client clock is trusted
--
-- Reply: {allowed, limit, remaining, retry_after_ms, reset_after_ms, delay_ms}
--   allowed         1 if admitted (and the TAT moved), else 0
--   limit           C
--   remaining       whole requests that would still be admitted after this
--                   decision (0 when the TAT is beyond the tolerance)
--   retry_after_ms  0 if allowed; else ms until the same request would pass;
--                   -1 if it never can (c > C)
--   reset_after_ms  ms until the TAT (0: it is not ahead of t)
--   delay_ms        always 0 for GCRA
--
-- Arithmetic: in scaled units one request is worth P units (T) and L units
-- pass per ms, so every quantity is an integer. Lua numbers are doubles and
-- are exact below 2^53; the script refuses a call with C*P >= 2^53 rather
-- than round, and never forms a larger product (the advance is done by
-- comparison, a changed rate by exact multiply-divide). Only a TAT re-scaled
-- to a higher rate can reach 2^53 units: it is then held as whole ms and a
-- remainder, and, being far beyond the tolerance, only rejects.
--
-- State: a HASH at KEYS[1], written only by a consuming call (admitted, c > 0):
--   alg     "gcra"
--   limit   L of the last consuming call
--   period  P of the last consuming call (ms)
--   burst   C of the last consuming call
--   ahead   TAT - t of that call, scaled (L units per ms), 0 < ahead <= C*P
--   last    t of that call (ms); later calls are evaluated at max(now, last)
-- The key expires (PEXPIREAT) at t + reset_after_ms, the TAT, when it is
-- equivalent to no key at all. A rejected call or cost 0 changes nothing,
-- not even the TTL.
-- A key holding another reference script's HASH gets an ERR naming its
-- algorithm; any other key that is not such a HASH gets WRONGTYPE.
--
-- Parameters given on a call win: the stored TAT is first brought to t (ahead
-- decreases by L_old per ms, down to 0), then kept as a point in time: if the
-- limit changes, ahead is re-scaled to the new rate (ahead * L_new / L_old,
-- rounded up, so the TAT never moves earlier) and never clamped, so a TAT
-- beyond the new tolerance rejects (even cost 0) until time catches up.

local key = KEYS[1]

local EXACT = 9007199254740992 -- 2^53: doubles hold every integer below it

-- Integer helpers. Float division is correctly rounded, so math.floor(a / b)
-- is at most one off for integers below 2^53; the loops make it exact (for
-- any sign of a, b > 0).
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

local full = C * P -- the tolerance under the new parameters, scaled

-- Load the stored TAT, if any, and bring it to t. `ahead` is TAT - t in
-- units of the new rate when below 2^53; otherwise it is nil and the TAT is
-- far_ms * L + far_rem units ahead (0 <= far_rem < L).
local t = now
local ahead = 0 -- a fresh (or absent) key: the TAT is not ahead of t
local far_ms, far_rem
local s = redis.call('HMGET', key, 'alg', 'limit', 'period', 'burst', 'ahead', 'last')
if s[1] then
  if s[1] ~= 'gcra' then
    return redis.error_reply('ERR key holds a ' .. s[1] .. ' limiter, not gcra')
  end
  local L0, P0, C0 = tonumber(s[2]), tonumber(s[3]), tonumber(s[4])
  local a, last = tonumber(s[5]), tonumber(s[6])
  if not (L0 and P0 and C0 and a and last) then
    return redis.error_reply('ERR corrupt gcra state')
  end
  if last > t then t = last end -- time never runs backwards for a key

  -- Advance under the stored rate: max(0, a - (t - last)*L0), decided by
  -- comparison so that (t - last)*L0 is only formed when small.
  local elapsed = t - last
  if elapsed >= ceil_div(a, L0) then a = 0 else a = a - elapsed * L0 end

  -- A TAT not ahead of t is a fresh key (it would have expired now): keep 0.
  -- Otherwise keep the TAT as a time. Under a new limit the same span is
  -- ceil(a * L / L0) units: whole ms m = floor(a / L0) and the rest
  -- s = a - m*L0 give m*L + ceil(s * L / L0), the last term at most L.
  -- Neither the period nor the burst moves the TAT, and nothing clamps it.
  if a > 0 then
    if L0 == L then
      ahead = a
    else
      local m = floor_div(a, L0)
      local part, rem = mul_div(a - m * L0, L, L0)
      if rem > 0 then part = part + 1 end -- rounded up: never earlier
      if part == L then m = m + 1; part = 0 end
      if m <= floor_div(EXACT - 1 - part, L) then
        ahead = m * L + part
      else
        ahead, far_ms, far_rem = nil, m, part
      end
    end
  end
elseif redis.call('EXISTS', key) == 1 then
  -- a HASH, but not one of ours: like any other wrong type
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end

-- Decide at t under the new parameters. ahead + c*P may pass 2^53, so the
-- request fits when ahead <= full - c*P (c <= C keeps c*P <= full).
local allowed, retry_after, remaining = 0, 0, 0
local reset_after
if ahead then
  if cost > C then
    retry_after = -1 -- more than the tolerance can ever admit
  elseif ahead <= full - cost * P then
    allowed = 1
    ahead = ahead + cost * P
  else
    retry_after = ceil_div(ahead - (full - cost * P), L)
  end
  if ahead < full then remaining = floor_div(full - ahead, P) end
  reset_after = ceil_div(ahead, L)
else
  -- At least 2^53 units ahead, beyond any tolerance: rejected, remaining 0.
  -- ceil((far_ms*L + far_rem + c*P - full) / L), the last three terms in
  -- one ceil_div (a negative numerator is fine).
  if cost > C then
    retry_after = -1
  else
    retry_after = far_ms + ceil_div(far_rem - (full - cost * P), L)
  end
  reset_after = far_ms
  if far_rem > 0 then reset_after = far_ms + 1 end
end

if allowed == 1 and cost > 0 then
  redis.call('HSET', key, 'alg', 'gcra', 'limit', fmt(L), 'period', fmt(P),
    'burst', fmt(C), 'ahead', fmt(ahead), 'last', fmt(t))
  redis.call('PEXPIREAT', key, fmt(t + reset_after))
end

return {allowed, C, remaining, retry_after, reset_after, 0}
