-- Stored state: one Redis string per key, written only by a consuming call, a refund that gives
-- something back or a rejection that starts a block (BLOCK), with an absolute expiry (PXAT /
-- PEXPIREAT) at the moment it becomes equivalent to a fresh key, or its block's end if later
-- (deleted when a refund leaves it so, unless it is blocked):
--   rl:tb <limit> <period_ms> <burst> <tokens_scaled> <last_ms>      token bucket
--   rl:lb <limit> <period_ms> <burst> <level_scaled> <last_ms>       leaky bucket
--   rl:fw <limit> <period_ms> <count> <last_ms>                      fixed window
--   rl:sw <limit> <period_ms> <current> <previous> <last_ms>         sliding window
--   rl:gc <limit> <period_ms> <burst> <ahead_scaled> <last_ms>       gcra
--   rl:sl <33-byte binary header: LOG_FORMAT> <records>               sliding log
--   rl:sr <33-byte binary header: REFUNDED_LOG_FORMAT> <records>      sliding log after a refund
--   rl:bk <blocked_until_ms> <any of the above>                     a blocked key (see parse_state)
-- (scaled: requests * period_ms; gcra's ahead_scaled, how far its theoretical arrival time is
-- ahead of last_ms, counts limit units per ms; a window's start is last_ms - last_ms mod
-- period_ms; the sliding log's header and records: 50-log-format).
--
-- A concurrency limit (ratelimit_acquire) is a sorted set instead: one member per lease, its
-- score the lease's expiry (ms), and members with negative scores (minus the value) for the
-- rest, so that every range of positive scores holds leases only:
--   =<id>       a lease of cost 1                       score: its expiry
--   +<id>       a lease of cost 2 or more               score: its expiry
--   #<id>       that lease's cost                       score: -cost
--   !limit      limit of the last admitted acquire      score: -limit
--   !lease_ms   lease-duration of that acquire          score: -lease_ms
--   !last       time of the last write                  score: -last_ms
--   !cost       the cost of every stored lease          score: -cost (expired ones included)
-- (an id is any 1 to 128 bytes: the prefix byte keeps it apart from the others). Leases that
-- have expired stay until a write drops them; the key expires with its last lease.
-- Any other value is not a limiter: WRONGTYPE.

local FIXED_PATTERN = {
  [TB] = '^rl:tb (%d+) (%d+) (%d+) (%d+) (%d+)$',
  [LB] = '^rl:lb (%d+) (%d+) (%d+) (%d+) (%d+)$',
  [FW] = '^rl:fw (%d+) (%d+) (%d+) (%d+)$',
  [SW] = '^rl:sw (%d+) (%d+) (%d+) (%d+) (%d+)$',
  [GC] = '^rl:gc (%d+) (%d+) (%d+) (%d+) (%d+)$',
}
local ALG_OF_TAG = {
  ['rl:tb'] = TB, ['rl:lb'] = LB, ['rl:fw'] = FW, ['rl:sw'] = SW, ['rl:sl'] = SL, ['rl:gc'] = GC,
  ['rl:sr'] = SL, -- a refunded sliding log (see LOG_FORMAT)
}

-- A fixed-size algorithm's value as a state table, or nil if it is not one.
local function parse_fixed(alg, raw)
  local f1, f2, f3, f4, f5 = match(raw, FIXED_PATTERN[alg])
  if not f1 then return nil end
  -- Each field below 2^53 (a longer digit string converts to a larger double). The fields are
  -- digit strings: arithmetic converts them, once each.
  f1, f2, f3, f4 = f1 + 0, f2 + 0, f3 + 0, f4 + 0
  if f5 then f5 = f5 + 0 else f5 = 0 end
  if f3 >= EXACT or f4 >= EXACT or f5 >= EXACT then return nil end
  local st
  if BUCKET[alg] then
    st = { alg = alg, L = f1, P = f2, C = f3, a = f4, last = f5 }
  elseif alg == FW then
    st = { alg = alg, L = f1, P = f2, C = f1, a = f3, last = f4 }
  else
    st = { alg = alg, L = f1, P = f2, C = f1, a = f3, b = f4, last = f5 }
  end
  if st.L < 1 or st.L > MAX_AMOUNT or st.P < 1 or st.P > MAX_PERIOD_MS
    or st.C < 1 or st.C > MAX_AMOUNT then
    return nil
  end
  if BUCKET[alg] and (st.C * st.P >= EXACT or st.a > st.C * st.P) then return nil end
  if alg == SW and st.L * st.P >= EXACT then return nil end
  return st
end

-- A stored value (its first bytes: up to 128) as a state table, or nil if it is not a limiter.
-- A blocked key's value is its state's prefixed with `rl:bk <blocked_until_ms> `: the state
-- gets `blocked`, the block's end (a double: rounded above 2^53), `blocked_s`, the same in
-- decimal (exact), and `off`, the prefix's length (0 and nil without one).
local function parse_state(raw)
  local off, until_s = 0, nil
  if strsub(raw, 1, 6) == 'rl:bk ' then
    local digits, pos = match(raw, '^rl:bk ([1-9]%d*) ()')
    if not digits or #digits > 17 then return nil end
    until_s, off = digits, pos - 1
  end
  local alg = ALG_OF_TAG[strsub(raw, off + 1, off + 5)]
  local st
  if alg == SL then
    st = parse_log_header(raw, off, until_s ~= nil)
  elseif alg and #raw < 128 then
    st = parse_fixed(alg, off == 0 and raw or strsub(raw, off + 1))
  end
  if not st then return nil end
  st.raw, st.off = raw, off
  if until_s then st.blocked, st.blocked_s = until_s + 0, until_s end
  return st
end

-- The value a consuming call stores: the call's parameters, its state (a, and b for the sliding
-- window) and its time t.
local function encode_fixed(spec, a, b, t)
  local alg = spec.alg
  if BUCKET[alg] then
    return format('%s %d %d %d %d %d', TAG[alg], spec.L, spec.P, spec.C, a, t)
  elseif alg == FW then
    return format('rl:fw %d %d %d %d', spec.L, spec.P, a, t)
  end
  return format('rl:sw %d %d %d %d %d', spec.L, spec.P, a, b, t)
end

-- Parsed states by their stored value (a memo as above). A call that writes nothing leaves the
-- value as it was, so the next call on that key finds it here: see remember_state.
local states, states_n = {}, 0

local function remember_state(raw, st)
  if states_n >= MEMO_MAX then states, states_n = {}, 0 end
  states[raw], states_n = st, states_n + 1
end

-- A concurrency key's fields (see the layout above): the members read with ZMSCORE.
local LEASE_META = { '!limit', '!lease_ms', '!last', '!cost' }

-- A score (as Redis answers it: a decimal string; false when missing) negated, if it is an
-- integer from lo to hi.
local function negated(score, lo, hi)
  if not score then return nil end
  local v = -(score + 0)
  if v >= lo and v <= hi and v == floor(v) then return v end
  return nil
end

-- The fields of a concurrency key from the scores of LEASE_META, or nil if they are not one's:
-- L (limit) and P (lease-duration) of its last admitted acquire, last (its last write, ms) and
-- total (the cost of its stored leases, expired ones included: at most a limit, 10^12).
local function lease_fields(scores)
  local L, P = negated(scores[1], 1, MAX_AMOUNT), negated(scores[2], 1, MAX_PERIOD_MS)
  local last, total = negated(scores[3], 0, EXACT - 1), negated(scores[4], 1, MAX_AMOUNT)
  if not (L and P and last and total) then return nil end
  return { alg = CC, L = L, P = P, C = L, last = last, total = total }
end

-- The limiter at `key`: nil for a missing key, or nil and WRONGTYPE for anything that is not
-- one (another type, or a string that is not a limiter's). One read of at most 128 bytes (a
-- concurrency key, a sorted set, is read once GETRANGE has refused it: its fields).
-- A state just parsed (not found in the memo) comes with its value, the third result.
local function load(key)
  local raw = redis.pcall('GETRANGE', key, '0', '127')
  if type(raw) ~= 'string' then
    local scores = redis.pcall('ZMSCORE', key, unpack(LEASE_META))
    local st = not scores.err and lease_fields(scores)
    if st then return st end
    return nil, WRONG_TYPE
  end
  local st = states[raw]
  if st then return st end
  if raw == '' then
    if redis.call('EXISTS', key) == 1 then return nil, WRONG_TYPE end
    return nil
  end
  st = parse_state(raw)
  if not st then return nil, WRONG_TYPE end
  return st, nil, raw
end
