-- sliding_log.lua: an exact sliding-log rate limiter as one atomic Redis Lua
-- script.
--
-- Reference implementation of `RATELIMIT.CHECK key sliding-log ...` from the
-- redis-ratelimit command contract (docs/algorithms.md): for the same calls
-- it gives the module's reply, integer for integer, and it can be deployed on
-- its own where the module cannot be loaded. It replaces the usual ZSET script
-- (seed_sliding_log.lua) and fixes its defects: entries in the same ms are
-- all counted, the expiry is in ms, time never runs backwards for a key, the
-- reply says when to retry, and requests can weigh more than 1.
--
-- The log is the exact multiset of admitted timestamps in (t - P, t]; a
-- request of cost c is admitted iff n + c <= L, where n counts those
-- entries, and then adds c entries at t.
--
-- Usage:
--   EVAL <script> 1 <key> <limit> <period_ms> <burst> <cost> <now_ms>
--     limit      L, cost admitted per sliding period (1 .. MAX_LOG_LIMIT; the
--                log holds up to L entries per key)
--     period_ms  P, the period in ms (1 .. 3650 days)
--     burst      ignored (kept so that every reference script takes the same
--                ARGV; pass L)
--     cost       c, the request's weight (0 .. 10^12); 0 asks without logging
--     now_ms     the call's time in ms since the Unix epoch (below 2^53), or
--                an empty string to use the Redis server's clock (TIME),
--                so that no client clock is trusted
--
-- Reply: {allowed, limit, remaining, retry_after_ms, reset_after_ms, delay_ms}
--   allowed         1 if admitted (and logged), else 0
--   limit           L
--   remaining       max(0, L - n) after this decision
--   retry_after_ms  0 if allowed; else ms until enough entries have left the
--                   period: ts + P - t of the (n + c - L)-th oldest entry;
--                   -1 if never (c > L)
--   reset_after_ms  ms until the newest entry leaves the period (0: no entry)
--   delay_ms        always 0
--
-- State: a ZSET at KEYS[1], written only by a consuming call (admitted, c > 0):
--   "params:<P>:<L>"  at score -inf: the period and limit of the last
--                     consuming call. Being at -inf it is always the ZSET's
--                     first member and never falls in a range of timestamps
--                     (the entries' scores are >= 0).
--   "<ts>:<i>"        at score ts: one entry per unit of cost admitted at ms
--                     ts, i = 1, 2, ... numbering the entries of the same ms
--                     (so they never collapse into one member).
-- `last`, the time of the last consuming call, is the newest entry's score.
-- Entries that left the period are removed by the next consuming call. The
-- key expires (PEXPIREAT) at t + P, when its newest entry leaves the period
-- and it is equivalent to no key at all. A rejected call or cost 0 changes
-- nothing, not even the TTL.
-- A key that is not such a ZSET (the other reference scripts keep HASHes)
-- gets WRONGTYPE.
--
-- Parameters given on a call win: entries that left the stored period are
-- gone, the others are kept and counted under the new period (those older
-- than t - P_new do not count and are dropped).

local key = KEYS[1]

local EXACT = 9007199254740992 -- 2^53: doubles hold every integer below it

-- The most entries one key may hold; the module's ratelimit.max-log-limit
-- (default 100000) bounds L the same way.
local MAX_LOG_LIMIT = 100000

-- Entries are added this many per ZADD (Lua's unpack has a stack limit).
local ZADD_BATCH = 1000

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

local L = int_arg(1, 'limit', 1, MAX_LOG_LIMIT)
local P = int_arg(2, 'period_ms', 1, 3650 * 86400000)
-- ARGV[3] (burst) is ignored by the log.
local cost = int_arg(4, 'cost', 0, 1e12)
local now
if ARGV[5] == '' then -- the server's clock
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
else
  now = int_arg(5, 'now_ms', 0, EXACT - 1)
end
if bad_arg then return redis.error_reply('ERR invalid ' .. bad_arg) end

-- Load the stored log's parameters and newest entry, if any.
local t = now
local lo = t - P -- entries with ts <= lo do not count
local last       -- newest entry's ts, nil if there is none
local first = redis.call('ZRANGE', key, 0, 0)
if first[1] then
  local P0 = string.match(first[1], '^params:(%d+):%d+$')
  P0 = P0 and tonumber(P0)
  if not P0 then
    -- a ZSET, but not one of ours: like any other wrong type
    return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
  end
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if newest[1] ~= first[1] then
    last = tonumber(newest[2])
    if last > t then t = last end -- time never runs backwards for a key
  end
  -- Entries that left the stored period are gone; of the rest, only those
  -- inside the new period count. (A log left empty is a fresh key.)
  lo = t - math.min(P0, P)
end

-- Entries in (lo, t]. Scores are >= 0 and lo > -inf, so the parameter record
-- is never counted; no entry is newer than t.
local function count_live()
  if not last then return 0 end
  return redis.call('ZCOUNT', key, '(' .. fmt(lo), '+inf')
end

-- Decide at t under the new parameters.
local n = count_live()
local allowed, retry_after = 0, 0
if cost > L then
  retry_after = -1 -- more than a period can ever admit
elseif n + cost <= L then
  allowed = 1
else
  -- The same request passes once the (n + c - L)-th oldest entry has left.
  local k = n + cost - L
  local entry = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(lo), '+inf',
    'WITHSCORES', 'LIMIT', fmt(k - 1), 1)
  retry_after = P - (t - tonumber(entry[2]))
end

local newest_live -- newest entry in (lo, t] after the decision
if allowed == 1 and cost > 0 then
  newest_live = t
  n = n + cost
elseif n > 0 then
  newest_live = last
end
local remaining = math.max(0, L - n)
local reset_after = 0
if newest_live then reset_after = P - (t - newest_live) end

if allowed == 1 and cost > 0 then
  -- Drop what no longer counts, record the parameters, log c entries at t.
  if last then redis.call('ZREMRANGEBYSCORE', key, 0, fmt(lo)) end
  local params = 'params:' .. fmt(P) .. ':' .. fmt(L)
  if first[1] and first[1] ~= params then redis.call('ZREM', key, first[1]) end
  redis.call('ZADD', key, '-inf', params)
  local ts = fmt(t)
  local i = redis.call('ZCOUNT', key, ts, ts) -- entries already at t
  local todo = cost
  while todo > 0 do
    local args = {}
    for _ = 1, math.min(todo, ZADD_BATCH) do
      i = i + 1
      args[#args + 1] = ts
      args[#args + 1] = ts .. ':' .. fmt(i)
    end
    redis.call('ZADD', key, unpack(args))
    todo = todo - ZADD_BATCH
  end
  redis.call('PEXPIREAT', key, fmt(t + reset_after))
end

return {allowed, L, remaining, retry_after, reset_after, 0}
