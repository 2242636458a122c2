#!lua name=ratelimit
--
-- ratelimit: the redis-ratelimit module's commands as a Redis Functions library, for servers
-- that cannot load modules (managed Redis and Valkey). Same arguments, same replies, same
-- exact integer arithmetic (see docs/algorithms.md and docs/functions.md).
--
--   FCALL    ratelimit_check    1 key algorithm limit period [BURST c] [BLOCK d] [COST n] [AT ms]
--   FCALL_RO ratelimit_peek     1 key algorithm limit period [BURST c] [BLOCK d] [COST n] [AT ms]
--   FCALL    ratelimit_checkall N key1 .. keyN algorithm limit period [BURST c] [BLOCK d] [...]
--                                 [COST n] [AT ms]
--   FCALL    ratelimit_refund   1 key algorithm limit period [BURST c] [BLOCK d] COST n [AT ms]
--   FCALL    ratelimit_reset    N key1 .. keyN
--   FCALL_RO ratelimit_info     1 key
--   FCALL    ratelimit_acquire  1 key limit lease-duration ID lease-id [COST n] [AT ms]
--   FCALL    ratelimit_release  1 key ID lease-id [AT ms]
--
-- Load it with `redis-cli -x FUNCTION LOAD REPLACE < ratelimit.lua` (`make functions`); the
-- full documentation is docs/functions.md, the proof tests/integration/functions.rs (module and library
-- answer alike on the same calls).
--
-- Differences from the module, all forced by Lua or by Functions:
--   * Lua numbers are doubles, exact below 2^53. Every quantity is kept below 2^53, and the
--     products the module computes in 128 bits are refused when they would not be:
--     BURST (default: limit) * period_ms must be below 2^53 for the buckets and gcra, and
--     limit * period_ms for the sliding window (an ERR says so). Fixed window and sliding log
--     take the module's full bounds.
--   * The sliding log's limit is at most 100000 (the module's default ratelimit.max-log-limit;
--     a library has no configuration), and so is a key's count of live leases (the module's
--     default ratelimit.max-leases).
--   * A lease's expiry (the call's time, or the key's last write if later, plus lease-duration)
--     must be below 2^53 ms: a sorted set's score is a double.
--   * Replies are RESP2-shaped under RESP3 too (arrays, not maps; `allowed` is 1 or 0): a
--     function cannot see its caller's protocol.
--   * Error texts are the module's, with its command names replaced by these functions' names.
--   * No INFO section (nor its `_blocked` counters), no `ratelimit.rejected` or
--     `ratelimit.blocked` events; ratelimit_reset is refused under
--     maxmemory OOM like every function that may write (no function has allow-oom).
--
-- State: one Redis string per key, written only by a consuming call, a refund that gives
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
-- period_ms). The
-- sliding log's records are the module's encoding: one record per run of entries at the same ms,
-- varint(gap << 1 | several) then varint(count - 2) if several, the gap counted from the
-- previous run (the first from `base`). Records before `head` have left the window; they are
-- reclaimed when they outweigh the live ones, and a log under 128 bytes is rewritten whole.
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

-- The standard library as upvalues: a function's globals are looked up through its library's
-- environment on every access, and they do not exist while the library loads, so they are
-- bound by the first call.
local floor, max, min, byte, char, find, format, lower, match, strsub, upper, gsub, pack
local unpack_bytes
local bound = false
local function bind()
  floor, max, min = math.floor, math.max, math.min
  byte, char, find, format, lower, match, strsub, upper, gsub = string.byte, string.char,
    string.find, string.format, string.lower, string.match, string.sub, string.upper, string.gsub
  pack, unpack_bytes = struct.pack, struct.unpack
  bound = true
end

local EXACT = 9007199254740992 -- 2^53: doubles hold every integer below it
local MAX_AMOUNT = 1000000000000 -- limit, BURST and COST
local MAX_PERIOD_MS = 3650 * 86400000
local MAX_LOG_LIMIT = 100000 -- the module's default ratelimit.max-log-limit
local MAX_LEASES = 100000 -- the module's default ratelimit.max-leases
local LEASE_ID_MAX = 128

local TB, LB, FW, SW, SL, GC = 'token-bucket', 'leaky-bucket', 'fixed-window', 'sliding-window',
  'sliding-log', 'gcra'
local CC = 'concurrency' -- leases: ratelimit_acquire and ratelimit_release, never checked
local ALGORITHMS = { [TB] = true, [LB] = true, [FW] = true, [SW] = true, [SL] = true, [GC] = true }
-- The algorithms that take BURST (a capacity in scaled units: C*P below 2^53).
local BUCKET = { [TB] = true, [LB] = true, [GC] = true }
local TAG = {
  [TB] = 'rl:tb', [LB] = 'rl:lb', [FW] = 'rl:fw', [SW] = 'rl:sw', [SL] = 'rl:sl', [GC] = 'rl:gc',
}
local OPTIONS = { BURST = 'BURST', BLOCK = 'BLOCK', COST = 'COST', AT = 'AT' }
-- The limit spec's own options (an error in one names the spec in CHECKALL).
local SPEC_OPTION = { BURST = true, BLOCK = true }

-- ------------------------------------------------------------------------------------------
-- Error replies: the module's texts (src/error.rs).

local WRONG_TYPE = 'WRONGTYPE Operation against a key holding the wrong kind of value'
local E_ALGORITHM = 'expected token-bucket, leaky-bucket, fixed-window, sliding-window, '
  .. 'sliding-log or gcra'
local E_LIMIT = 'ERR limit must be an integer from 1 to 1000000000000'
local E_PERIOD = 'ERR period must be an integer from 1 ms to 3650 days, in ms or '
  .. 'with a unit ms, s, m, h or d (250ms, 1s, 15m, 1h, 1d)'
local E_BURST = 'ERR BURST must be an integer from 1 to 1000000000000'
local E_BURST_ON_WINDOW = 'ERR BURST applies only to token-bucket, leaky-bucket and gcra'
local E_BLOCK = 'ERR BLOCK must be a duration from 1 ms to 3650 days, in ms or with a unit '
  .. 'ms, s, m, h or d (250ms, 1s, 15m, 1h, 1d)'
local E_COST = 'ERR COST must be an integer from 0 to 1000000000000'
local E_AT = 'ERR AT must be a time in ms since the Unix epoch, below 2^53'
local E_REFUND_COST = 'ERR ratelimit_refund needs COST: how much to give back'
local E_NUMKEYS = 'ERR numkeys must be an integer from 1 to the number of keys given'
local E_OPTION = 'expected BURST, BLOCK, COST or AT'
-- Lua's own bounds (the module computes these products in 128 bits).
local E_EXACT_BUCKET = 'ERR BURST (or limit, without BURST) times the period in ms must be '
  .. 'below 2^53 for exact arithmetic in the ratelimit functions library (the module has no '
  .. 'such bound)'
local E_EXACT_WINDOW = 'ERR limit times the period in ms must be below 2^53 for exact '
  .. 'arithmetic in the ratelimit functions library (the module has no such bound)'
local E_CORRUPT = 'ERR corrupt sliding-log state'
-- Named policies (RATELIMIT.POLICY) are the module's: a library keeps no data outside keys.
local E_NO_POLICIES = 'ERR the ratelimit functions library has no policies: give the limit '
  .. 'as algorithm limit period [BURST capacity] (see docs/functions.md)'
local E_NO_LEASE_POLICIES = 'ERR the ratelimit functions library has no policies: give the '
  .. 'limit as limit lease-duration (see docs/functions.md)'
-- Leases.
local E_LEASE_DURATION = 'ERR lease-duration must be an integer from 1 ms to 3650 days, in ms '
  .. 'or with a unit ms, s, m, h or d (250ms, 1s, 15m, 1h, 1d)'
local E_LEASE_COST = 'ERR COST must be an integer from 1 to 1000000000000 (a lease holds at '
  .. 'least 1)'
local E_LEASE_ID = 'ERR lease id must be 1 to 128 bytes'
local E_LEASE_ID_MISSING = 'ERR ID lease-id is required: the id the lease is held under'
local E_ACQUIRE_OPTION = 'expected ID, COST or AT'
local E_RELEASE_OPTION = 'expected ID or AT'
local E_CONCURRENCY_CALL = 'ERR concurrency limits are held by leases: use ratelimit_acquire '
  .. 'and ratelimit_release'
local E_TOO_MANY_LEASES = 'ERR key holds ratelimit.max-leases (' .. MAX_LEASES .. ') live '
  .. 'leases: release some (ratelimit_release)'
local E_EXACT_LEASE = 'ERR AT (or the key\'s last write, if later) plus lease-duration must be '
  .. 'below 2^53 for exact arithmetic in the ratelimit functions library (the module has no '
  .. 'such bound)'
local E_CORRUPT_LEASES = 'ERR corrupt concurrency state'

local function arity(name)
  return 'ERR wrong number of arguments for \'' .. name .. '\' command'
end

-- An argument as an error shows it: its first 32 bytes, each outside printable ASCII as `?`,
-- then `...` if it was longer.
local function shown(s)
  local text = gsub(strsub(s, 1, 32), '[^ -~]', '?')
  if #s > 32 then text = text .. '...' end
  return text
end

-- The period unit a word spells out.
local UNIT_WORDS = {
  ms = 'ms', msec = 'ms', msecs = 'ms', millisecond = 'ms', milliseconds = 'ms',
  s = 's', sec = 's', secs = 's', second = 's', seconds = 's',
  m = 'm', min = 'm', mins = 'm', minute = 'm', minutes = 'm',
  h = 'h', hr = 'h', hrs = 'h', hour = 'h', hours = 'h',
  d = 'd', day = 'd', days = 'd',
}

-- `ERR unknown <what> '<word>': <expected>`, with a hint when the word follows a period given
-- as a bare number (`period`: that argument, or nil when the word does not follow a period).
local function unknown(what, expected, word, period)
  local msg = 'ERR unknown ' .. what .. ' \'' .. shown(word) .. '\': ' .. expected
  if period and find(period, '^%d+$') then
    local n, unit = shown(period), UNIT_WORDS[lower(word)]
    if unit then
      msg = msg .. '; a period takes its unit in the same argument: ' .. n .. unit .. ', not \''
        .. n .. ' ' .. shown(word) .. '\''
    else
      msg = msg .. '; a period takes its unit in the same argument: ' .. n .. 'ms, ' .. n .. 's, '
        .. n .. 'm, ' .. n .. 'h or ' .. n .. 'd'
    end
  end
  return msg
end

-- A CHECKALL of `keys` keys with `specs` limit specs.
local function spec_count(keys, specs)
  if keys == 1 then
    return 'ERR 1 key needs 1 limit spec (one per key, in order); found ' .. specs
  end
  return 'ERR ' .. keys .. ' keys need ' .. keys .. ' limit specs (one per key, in order); found '
    .. specs
end

local function one_key(name)
  return 'ERR ' .. name .. ' takes exactly one key: FCALL ' .. name .. ' 1 key ...'
end

local function mismatch(stored, named)
  if stored == CC then
    return 'ERR key holds a concurrency limiter: use ratelimit_acquire and ratelimit_release '
      .. '(or ratelimit_reset it to change algorithm)'
  end
  return 'ERR key holds a ' .. stored .. ' limiter, not ' .. named
    .. ': ratelimit_reset it to change algorithm'
end

-- ------------------------------------------------------------------------------------------
-- Exact integer arithmetic on doubles below 2^53.

-- Float division is correctly rounded, so floor(a / b) is at most one off; the loops fix it.
local function floor_div(a, b)
  local q = floor(a / b)
  while q * b > a do q = q - 1 end
  while (q + 1) * b <= a do q = q + 1 end
  return q
end

local function ceil_div(a, b)
  local q = floor_div(a, b)
  if q * b < a then q = q + 1 end
  return q
end

-- a*b = q*m + r (0 <= r < m) for integers 0 <= a < m < 2^53 and 0 <= b < 2^53, without forming
-- a*b: binary long multiplication modulo m, every intermediate below m.
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

-- Integers to decimal. Lua 5.1's %d converts through a C long (64 bits here), exact for every
-- integer a double holds below 2^53; tostring would use %.14g.
local function fmt(n)
  return format('%d', n)
end

-- a + b in decimal, exact also at or above 2^53 (an expiry t + reset_after_ms may get there).
local function fmt_sum(a, b)
  if a + b < EXACT then return fmt(a + b) end
  local a_hi, b_hi = floor_div(a, 1e8), floor_div(b, 1e8)
  local lo = (a - a_hi * 1e8) + (b - b_hi * 1e8)
  local hi = a_hi + b_hi
  if lo >= 1e8 then lo, hi = lo - 1e8, hi + 1 end
  return fmt(hi) .. format('%08d', lo)
end

-- The later of two times in decimal (digit strings without leading zeros).
local function later(a, b)
  if #a ~= #b then
    if #a > #b then return a end
    return b
  end
  if a > b then return a end
  return b
end

-- ------------------------------------------------------------------------------------------
-- Blocks (BLOCK duration, the module's src/algorithms/block.rs). A consuming call the algorithm
-- rejects (a cost it can ever admit) with BLOCK d, on a stored key, blocks the key until t + d;
-- until then every call is rejected and changes nothing. The block's end may pass 2^53 (t just
-- below it): it is kept in decimal too, and the time left computed exactly.

-- The time left at t in the block of st (a state table), or nil when it is not blocked at t.
local function block_left(st, t)
  local until_ms = st.blocked
  if not until_ms or t >= until_ms then return nil end
  if until_ms < EXACT then return until_ms - t end
  -- until = hi * 10^8 + lo: hi * 10^8 is exact (a multiple of 2^8 below 2^61), and so is the
  -- difference, an integer below 2^53.
  local s = st.blocked_s
  return (strsub(s, 1, -9) * 1e8 - t) + strsub(s, -8)
end

-- The answer of a call on a blocked key, given what the algorithm alone answers (`own`) and the
-- time left in the block.
local function blocked_answer(own, left)
  local retry = -1
  if own[4] >= 0 then retry = max(own[4], left) end
  return { 0, own[2], 0, retry, max(own[5], left), 0 }
end

-- The value of a blocked key: st's state (its value without any earlier block), blocked until
-- `until_s` (decimal).
local function blocked_value(key, st, until_s)
  local state
  if st.alg ~= SL or #st.raw < 128 then
    state = strsub(st.raw, st.off + 1)
  else
    state = redis.call('GETRANGE', key, fmt(st.off), '-1')
  end
  return 'rl:bk ' .. until_s .. ' ' .. state
end

local function window_start(t, p) -- t - t mod p
  return floor_div(t, p) * p
end

local function server_now()
  local tm = redis.call('TIME')
  return tm[1] * 1000 + floor(tm[2] / 1000) -- digit strings: arithmetic converts them
end

-- ------------------------------------------------------------------------------------------
-- Arguments: the module's grammar (src/commands/parse.rs). An error is a table: `msg` the
-- reply, `shared` when it concerns COST, AT or an unknown option (no limit spec's in CHECKALL),
-- `arity` for a wrong number of arguments (its text names the function).

local ARITY = { arity = true }

local function bad(msg, shared)
  return { msg = msg, shared = shared }
end

-- Memos. Parsing is pure, and clients name the same few limits over and over: parsed limits and
-- amounts are kept by their argument strings, so a repeated argument costs a table lookup instead
-- of pattern matching and number conversion. A memo is dropped whole once it holds MEMO_MAX
-- entries; errors are never kept. Memoized tables are never modified.
local MEMO_MAX = 1000
-- heads[algorithm][limit][period] = { alg, L, P, specs = { [BURST or 0] = spec } }
local heads, heads_n = {}, 0
-- amounts[s] = the integer s spells (digit strings up to MAX_AMOUNT)
local amounts, amounts_n = {}, 0

-- A plain decimal integer (no sign, fraction or exponent). The conversion is exact below 2^53,
-- and a larger value never rounds below 2^53, so every bound check below is exact.
local function parse_integer(s)
  if s and find(s, '^%d+$') then return s + 0 end
  return nil
end

local function parse_amount(s, lo)
  local n = amounts[s]
  if not n then
    n = parse_integer(s)
    if not n or n > MAX_AMOUNT then return nil end
    if amounts_n >= MEMO_MAX then amounts, amounts_n = {}, 0 end
    amounts[s], amounts_n = n, amounts_n + 1
  end
  if n >= lo then return n end
  return nil
end

local PERIOD_UNITS = { [''] = 1, ms = 1, s = 1000, m = 60000, h = 3600000, d = 86400000 }

local function parse_period(s)
  local digits, unit = match(s, '^(%d*)(.*)$')
  local scale = PERIOD_UNITS[lower(unit)]
  local n = parse_integer(digits)
  if not (scale and n) then return nil end
  local ms = n * scale
  if ms >= 1 and ms <= MAX_PERIOD_MS then return ms end
  return nil
end

local function option_value(option, s)
  local v
  if option == 'BURST' then
    v = parse_amount(s, 1)
    if not v then return nil, bad(E_BURST, false) end
  elseif option == 'BLOCK' then
    v = parse_period(s)
    if not v then return nil, bad(E_BLOCK, false) end
  elseif option == 'COST' then
    v = parse_amount(s, 0)
    if not v then return nil, bad(E_COST, true) end
  else
    v = parse_integer(s)
    if not v or v >= EXACT then return nil, bad(E_AT, true) end
  end
  return v
end

-- `algorithm limit period` at args[i]: a head (memoized). `after`: the argument before it when
-- that is the previous spec's period (for the hint of an unknown algorithm), else nil.
local function parse_head(args, i, after)
  local alg_s, limit_s, period_s = args[i], args[i + 1], args[i + 2]
  if alg_s ~= nil and #alg_s == 6 and lower(alg_s) == 'policy' then
    return nil, bad(E_NO_POLICIES)
  end
  if period_s == nil then return nil, ARITY end
  local by_limit = heads[alg_s]
  local by_period = by_limit and by_limit[limit_s]
  local head = by_period and by_period[period_s]
  if head then return head end
  -- Names are case-insensitive.
  local algorithm = alg_s
  if not ALGORITHMS[algorithm] then
    algorithm = lower(algorithm)
    if not ALGORITHMS[algorithm] then
      if algorithm == CC then
        -- The module's order: the limit and the period are read first.
        if not parse_amount(limit_s, 1) then return nil, bad(E_LIMIT) end
        if not parse_period(period_s) then return nil, bad(E_PERIOD) end
        return nil, bad(E_CONCURRENCY_CALL)
      end
      return nil, bad(unknown('algorithm', E_ALGORITHM, alg_s, after))
    end
  end
  local limit = parse_amount(limit_s, 1)
  if not limit then return nil, bad(E_LIMIT) end
  local period = parse_period(period_s)
  if not period then return nil, bad(E_PERIOD) end
  head = { alg = algorithm, L = limit, P = period, specs = {} }
  if heads_n >= MEMO_MAX then heads, heads_n = {}, 0 end
  by_limit = heads[alg_s]
  if not by_limit then
    by_limit = {}
    heads[alg_s] = by_limit
  end
  by_period = by_limit[limit_s]
  if not by_period then
    by_period = {}
    by_limit[limit_s] = by_period
  end
  by_period[period_s], heads_n = head, heads_n + 1
  return head
end

-- The spec of a head and its BURST (nil: none): the BURST rules, the sliding log's bound, and
-- Lua's exactness bounds (memoized).
local function finish_spec(head, burst)
  local spec = head.specs[burst or 0]
  if spec then return spec end
  local alg, L, P = head.alg, head.L, head.P
  if burst and not BUCKET[alg] then return nil, bad(E_BURST_ON_WINDOW) end
  if alg == SL and L > MAX_LOG_LIMIT then
    return nil, bad('ERR sliding-log limit ' .. fmt(L)
      .. ' exceeds ratelimit.max-log-limit ' .. fmt(MAX_LOG_LIMIT))
  end
  local C = burst or L
  if BUCKET[alg] and C * P >= EXACT then return nil, bad(E_EXACT_BUCKET) end
  if alg == SW and L * P >= EXACT then return nil, bad(E_EXACT_WINDOW) end
  spec = { alg = alg, L = L, P = P, C = C }
  head.specs[burst or 0], heads_n = spec, heads_n + 1
  return spec
end

-- `algorithm limit period [BURST c] [BLOCK d] [COST n] [AT ms]` from args[i] on, options in
-- any order, each once. Returns spec, cost, at (nil: the server's clock), whether COST was given
-- and BLOCK's duration in ms (nil: none), or nil, error (an unknown option's error has its
-- position in `at`). `after` as for parse_head.
local function parse_check(args, i, after)
  local head, err = parse_head(args, i, after)
  if not head then return nil, err end
  local burst, block, cost, at
  local j = i + 3
  while args[j] ~= nil do
    local option = OPTIONS[args[j]] or OPTIONS[upper(args[j])]
    if not option then
      local period = j == i + 3 and args[i + 2] or nil
      local e = bad(unknown('option', E_OPTION, args[j], period), true)
      e.at = j
      return nil, e
    end
    local shared = not SPEC_OPTION[option]
    if args[j + 1] == nil then return nil, bad('ERR ' .. option .. ' needs a value', shared) end
    local value, verr = option_value(option, args[j + 1])
    if value == nil then return nil, verr end
    local before
    if option == 'BURST' then
      before, burst = burst, value
    elseif option == 'BLOCK' then
      before, block = block, value
    elseif option == 'COST' then
      before, cost = cost, value
    else
      before, at = at, value
    end
    if before ~= nil then return nil, bad('ERR ' .. option .. ' given more than once', shared) end
    j = j + 2
  end
  local spec
  spec, err = finish_spec(head, burst)
  if not spec then return nil, err end
  return spec, cost or 1, at, cost ~= nil, block
end

-- CHECKALL: one spec per key, `algorithm limit period [BURST c] [BLOCK d]` each (BURST and
-- BLOCK in any order, each once), the last one followed by the shared COST and AT (the last spec
-- and the options parse exactly as CHECK's). An error in a spec names it and its key. Returns
-- specs, cost, at, blocks (BLOCK's duration per spec, false: none) or nil, error message.
local function parse_checkall(keys, args, name)
  local n = #keys
  local total = n + #args
  if n == 0 then return nil, E_NUMKEYS end
  if total < 3 then return nil, arity(name) end
  if n >= total then return nil, E_NUMKEYS end

  -- How many specs the arguments hold, read as the grammar reads them: an option name and its
  -- value, or a spec's three arguments.
  local function count_specs()
    local specs, j = 0, 1
    while args[j] ~= nil do
      if OPTIONS[args[j]] or OPTIONS[upper(args[j])] then
        j = j + 2
      else
        specs, j = specs + 1, j + 3
      end
    end
    return specs
  end
  -- A wrong number of arguments that is a wrong number of specs says so.
  local function wrong_count(err)
    if err.arity then
      local specs = count_specs()
      if specs ~= n then return { msg = spec_count(n, specs), whole = true } end
    end
    return err
  end
  -- A key and the shortest spec each (the module's `POLICY name`, two arguments).
  if n * 3 > total then return nil, wrong_count(ARITY).msg or arity(name) end

  local function in_spec(err, s)
    if err.arity then return arity(name) end
    if s == 0 or err.whole then return err.msg end
    return 'ERR limit spec ' .. s .. ' (key \'' .. keys[s] .. '\'): ' .. strsub(err.msg, 5)
  end
  -- Where a spec must start: COST or AT there means a spec is missing.
  local function spec_start(i)
    local option = args[i] and OPTIONS[upper(args[i])]
    if option == 'COST' or option == 'AT' then return ARITY end
    return nil
  end

  local specs, blocks = {}, {}
  local i = 1
  -- The spec before ended with its period (no BURST or BLOCK): the hint of an unknown
  -- algorithm right after it.
  local after_period = false
  for s = 1, n - 1 do
    local err = spec_start(i)
    if err then return nil, in_spec(wrong_count(err), s - 1) end
    local head, spec
    head, err = parse_head(args, i, after_period and args[i - 1] or nil)
    if not head then return nil, in_spec(err, s) end
    i = i + 3
    after_period = true
    -- The spec's own options, right after its period, each once.
    local values = {}
    while true do
      local option = args[i] and OPTIONS[upper(args[i])]
      if not SPEC_OPTION[option] then break end
      if args[i + 1] == nil then
        return nil, in_spec(bad('ERR ' .. option .. ' needs a value'), s)
      end
      local value
      value, err = option_value(option, args[i + 1])
      if not value then return nil, in_spec(err, s) end
      if values[option] then
        return nil, in_spec(bad('ERR ' .. option .. ' given more than once'), s)
      end
      values[option] = value
      i = i + 2
      after_period = false
    end
    spec, err = finish_spec(head, values.BURST)
    if not spec then return nil, in_spec(err, s) end
    specs[s], blocks[s] = spec, values.BLOCK or false
  end
  local err = spec_start(i)
  if err then return nil, in_spec(wrong_count(err), n - 1) end
  local spec, cost, at, _, block = parse_check(args, i, after_period and args[i - 1] or nil)
  if not spec then
    -- Another spec after the last one: more specs than keys.
    if cost.at and ALGORITHMS[lower(args[cost.at])] then
      return nil, spec_count(n, count_specs())
    end
    if cost.shared then return nil, cost.msg end
    return nil, in_spec(cost, n)
  end
  specs[n], blocks[n] = spec, block or false
  return specs, cost, at, blocks
end

-- ------------------------------------------------------------------------------------------
-- Stored state.

-- The sliding log's header: the tag, then big-endian unsigned fields of fixed widths (packed
-- and unpacked by Redis's struct library):
--   P           5 bytes  period_ms of the last consuming call
--   L           3        limit of the last consuming call
--   last        7        time of the last write (a consuming call's) = the newest run's ms
--   base        7        the ms the first live record's gap counts from
--   head        4        offset of the first live record (records before it are dead)
--   newest_pos  4        offset of the newest record (the last one)
--   total       3        entries from head on
-- A refund (ratelimit_refund) removes the newest entries but moves `last` to its own time, as
-- the module does: later calls are evaluated at max(now, last), and the log is fresh once
-- last + P has passed. Such a log, whose newest entry is older than `last`, has a tag of its
-- own and, in place of head and newest_pos, the newest run's ms (the same 33 bytes, so every
-- offset is the same): a refund writes the log whole (head 0) and no call extends its newest
-- run in place (every later call is at or after `last`, so after that run), so neither is
-- needed. The next consuming call's header rewrite gives it the usual tag and fields back.
--   P, L, last, base     as above (last: the refund's time)
--   newest      8        the newest run's ms, base <= newest < last
--   total       3        entries
local LOG_FORMAT = '>I5I3I7I7I4I4I3'
local REFUNDED_LOG_FORMAT = '>I5I3I7I7I8I3'
local HEADER = 5 + 33 -- the tag and the fields, in both forms

local function log_header(P, L, last, base, head, newest_pos, total)
  return 'rl:sl' .. pack(LOG_FORMAT, P, L, last, base, head, newest_pos, total)
end

-- The header of a refunded log (the records start at offset 0).
local function refunded_log_header(P, L, last, base, newest, total)
  return 'rl:sr' .. pack(REFUNDED_LOG_FORMAT, P, L, last, base, newest, total)
end

-- `newest`: the newest run's ms (`last` but in a refunded log); a refunded log has no
-- newest_pos. The log starts after `off` bytes of raw (a block's prefix, see parse_state); a
-- blocked log may be empty (a refund took every entry during the block: no records, total 0).
local function parse_log_header(raw, off, blocked)
  local hdr = off + HEADER
  if #raw < hdr or (#raw == hdr and not blocked) then return nil end
  local P, L, last, base, head, newest_pos, newest, total
  if byte(raw, off + 5) == 108 then -- 'l': rl:sl
    P, L, last, base, head, newest_pos, total = unpack_bytes(LOG_FORMAT, raw, off + 6)
    newest = last
    if head > newest_pos then return nil end
  else
    P, L, last, base, newest, total = unpack_bytes(REFUNDED_LOG_FORMAT, raw, off + 6)
    head = 0
    if newest >= last then return nil end
  end
  if P < 1 or P > MAX_PERIOD_MS or L < 1 or L > MAX_LOG_LIMIT
    or last >= EXACT or base > newest or (total < 1 and not (blocked and #raw == hdr)) then
    return nil
  end
  -- records: the records read with the header (all of them when the value is under 128 bytes);
  -- hdr: their offset in the value.
  return { alg = SL, P = P, L = L, C = L, last = last, newest = newest, base = base,
    head = head, newest_pos = newest_pos, total = total, raw = raw, hdr = hdr,
    records = strsub(raw, hdr + 1) }
end

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

-- ------------------------------------------------------------------------------------------
-- The fixed-size algorithms: (stored state or nil, spec, cost, now) -> reply, t, and the state
-- to store if the call consumes (a, and b for the sliding window). Each call is evaluated at
-- t = max(now, last).

local function token_bucket(st, spec, cost, now)
  local L, P, C = spec.L, spec.P, spec.C
  local full = C * P
  local t, tokens = now, full -- a missing key is a full bucket
  if st then
    if st.last > t then t = st.last end
    -- Refill under the stored parameters, min(C0*P0, tokens + (t - last)*L0), decided by
    -- comparison so that (t - last)*L0 is only formed when small.
    local full0, tok = st.C * st.P, st.a
    local elapsed = t - st.last
    if elapsed >= ceil_div(full0 - tok, st.L) then tok = full0 else tok = tok + elapsed * st.L end
    -- A full bucket is a fresh one; otherwise carried over in requests to the new period
    -- (rounded down) and clamped to the new capacity.
    if tok < full0 then
      if st.P == P then
        tokens = min(tok, full)
      else
        local whole = floor_div(tok, st.P)
        if whole >= C then
          tokens = full
        else
          tokens = min(whole * P + mul_div(tok - whole * st.P, P, st.P), full)
        end
      end
    end
  end
  local allowed, retry = 0, 0
  if cost > C then
    retry = -1
  elseif tokens >= cost * P then
    allowed = 1
    tokens = tokens - cost * P
  else
    retry = ceil_div(cost * P - tokens, L)
  end
  local reply = { allowed, C, floor_div(tokens, P), retry, ceil_div(full - tokens, L), 0 }
  return reply, t, tokens
end

local function leaky_bucket(st, spec, cost, now)
  local L, P, C = spec.L, spec.P, spec.C
  local full = C * P
  local t, level = now, 0 -- a missing key is an empty queue
  if st then
    if st.last > t then t = st.last end
    local lvl = st.a
    local elapsed = t - st.last
    if elapsed >= ceil_div(lvl, st.L) then lvl = 0 else lvl = lvl - elapsed * st.L end
    -- An empty queue is a fresh one; otherwise carried over in requests to the new period
    -- (rounded up) and clamped to the new capacity.
    if lvl > 0 then
      if st.P == P then
        level = min(lvl, full)
      else
        local whole = floor_div(lvl, st.P)
        if whole >= C then
          level = full
        else
          local part, rem = mul_div(lvl - whole * st.P, P, st.P)
          if rem > 0 then part = part + 1 end
          level = min(whole * P + part, full)
        end
      end
    end
  end
  local allowed, retry, delay = 0, 0, 0
  if cost > C then
    retry = -1
  elseif level <= full - cost * P then
    allowed = 1
    delay = ceil_div(level, L) -- the queue ahead of this request
    level = level + cost * P
  else
    retry = ceil_div(level - (full - cost * P), L)
  end
  local reply = { allowed, C, floor_div(full - level, P), retry, ceil_div(level, L), delay }
  return reply, t, level
end

local function fixed_window(st, spec, cost, now)
  local L, P = spec.L, spec.P
  local t, count = now, 0
  if st then
    if st.last > t then t = st.last end
    -- The count belongs to the window of `last` only, under an unchanged period.
    if st.P == P and window_start(t, P) == window_start(st.last, P) then count = st.a end
  end
  local w = window_start(t, P)
  local allowed, retry = 0, 0
  if cost > L then
    retry = -1
  elseif count + cost <= L then
    allowed = 1
    count = count + cost
  else
    retry = P - (t - w)
  end
  local reset = 0
  if count > 0 then reset = P - (t - w) end
  local reply = { allowed, L, max(0, L - count), retry, reset, 0 }
  return reply, t, count
end

local function sliding_window(st, spec, cost, now)
  local L, P = spec.L, spec.P
  local t, prev, curr = now, 0, 0
  if st then
    if st.last > t then t = st.last end
    -- The same window keeps both counts, the next one makes the current count the previous,
    -- any later one (or a changed period) starts afresh.
    if st.P == P then
      local w0, wt = window_start(st.last, P), window_start(t, P)
      if wt == w0 then
        curr, prev = st.a, st.b
      elseif wt == w0 + P then
        curr, prev = 0, st.a
      end
    end
  end
  local w = window_start(t, P)
  local e = t - w
  local LP = L * P
  local est = prev * (P - e) + curr * P -- the weighted estimate, scaled
  local allowed, retry = 0, 0
  if cost > L then
    retry = -1
  elseif est <= LP - cost * P then
    allowed = 1
    curr = curr + cost
    est = est + cost * P
  else
    -- The least d >= 1 that admits it: later in this window while prev decays...
    if prev > 0 and curr + cost <= L then
      local d = max(1, P - e - floor_div((L - curr - cost) * P, prev))
      if d < P - e then retry = d end
    end
    -- ...else in the next window (curr becomes the previous count), or the one after.
    if retry == 0 then
      if curr == 0 then
        retry = P - e
      else
        local e2 = max(0, P - floor_div((L - cost) * P, curr))
        if e2 < P then retry = P - e + e2 else retry = 2 * P - e end
      end
    end
  end
  local remaining = 0
  if est < LP then remaining = floor_div(LP - est, P) end
  local reset = 0
  if curr > 0 then
    reset = 2 * P - e
  elseif prev > 0 then
    reset = P - e
  end
  local reply = { allowed, L, remaining, retry, reset, 0 }
  return reply, t, curr, prev
end

-- GCRA: `ahead`, how far the theoretical arrival time (TAT) is ahead of t, scaled (L units per
-- ms, so one request is P units). With the same parameters it is the token bucket seen from the
-- other side (ahead = C*P - tokens); a parameter change keeps the TAT as a point in time.
local function gcra(st, spec, cost, now)
  local L, P, C = spec.L, spec.P, spec.C
  local tolerance = C * P
  local t, ahead = now, 0 -- a missing key: the TAT is not ahead
  -- far: the carried-over TAT is 2^53 units or more ahead (only after a raised limit), as
  -- ahead = u*L + w with 0 <= w <= L; such a TAT is beyond any tolerance (C*P < 2^53).
  local far, u, w = false, 0, 0
  if st then
    if st.last > t then t = st.last end
    -- Advance under the stored limit: max(0, ahead - (t - last)*L0), decided by comparison so
    -- that (t - last)*L0 is only formed when small.
    local a, L0 = st.a, st.L
    local elapsed = t - st.last
    if elapsed >= ceil_div(a, L0) then a = 0 else a = a - elapsed * L0 end
    -- 0 is a fresh key. Otherwise the same span of time in the new units, rounded up, never
    -- clamped: ceil(a*L/L0) = u*L + w with a = u*L0 + v and w = ceil(v*L/L0) <= L.
    if a > 0 then
      if L0 == L then
        ahead = a
      else
        u = floor_div(a, L0)
        local q, r = mul_div(a - u * L0, L, L0)
        w = q
        if r > 0 then w = w + 1 end
        ahead = u * L + w -- exact below 2^53, and 2^53 or more when the exact value is
        far = ahead >= EXACT
      end
    end
  end
  local allowed, retry, remaining, reset = 0, 0, 0, 0
  if far then
    -- Rejected whatever the cost: retry when ahead - (C - c)*P units have passed, reset when
    -- ahead has; both in ms from u*L + w without forming it.
    if cost > C then
      retry = -1
    else
      local room = tolerance - cost * P
      if room >= w then retry = u - floor_div(room - w, L) else retry = u + 1 end
    end
    reset = u
    if w > 0 then reset = u + 1 end
    return { 0, C, 0, retry, reset, 0 }, t, ahead
  end
  if cost > C then
    retry = -1
  else
    local room = tolerance - cost * P -- ahead + c*P <= C*P admits
    if ahead <= room then
      allowed = 1
      ahead = ahead + cost * P
    else
      retry = ceil_div(ahead - room, L)
    end
  end
  if ahead < tolerance then remaining = floor_div(tolerance - ahead, P) end
  reset = ceil_div(ahead, L)
  return { allowed, C, remaining, retry, reset, 0 }, t, ahead
end

local FIXED = {
  [TB] = token_bucket, [LB] = leaky_bucket, [FW] = fixed_window, [SW] = sliding_window,
  [GC] = gcra,
}

-- ------------------------------------------------------------------------------------------
-- The sliding log. A view reads the stored records lazily (GETRANGE in growing chunks) and
-- may carry runs appended in memory (CHECKALL's first pass). A mark is a point between runs:
-- (pos: the record's offset, prev: the ms its gap counts from, left: stored entries from there
-- on, x: the next in-memory run).

local function varint(out, v)
  while v >= 128 do
    local low = v % 128
    out[#out + 1] = low + 128
    v = (v - low) / 128
  end
  out[#out + 1] = v
end

-- One run's record: varint(gap << 1 | several) [varint(count - 2)], without forming gap << 1
-- (which may pass 2^53).
local function log_record(gap, count)
  -- The usual records, a single entry 1 or 2 bytes long, without a table.
  if count == 1 then
    if gap < 64 then return char(gap * 2) end
    if gap < 8192 then
      local low = gap % 64
      return char(low * 2 + 128, (gap - low) / 64)
    end
  end
  local several = 0
  if count > 1 then several = 1 end
  local low = gap % 64
  local out = { low * 2 + several }
  local rest = (gap - low) / 64
  if rest > 0 then
    out[1] = out[1] + 128
    varint(out, rest)
  end
  if several == 1 then varint(out, count - 2) end
  return char(unpack(out))
end

-- The byte at offset `off` of the records, loading a chunk when it is not buffered.
local function log_byte(v, off)
  local k = off - v.buf_at + 1
  if k < 1 or k > #v.buf then
    if v.complete and off >= v.buf_at then error(redis.error_reply(E_CORRUPT)) end
    v.buf = redis.call('GETRANGE', v.key, fmt(v.hdr + off), fmt(v.hdr + off + v.chunk - 1))
    v.buf_at = off
    v.chunk = min(v.chunk * 2, 65536)
    k = 1
    if #v.buf == 0 then error(redis.error_reply(E_CORRUPT)) end
  end
  return byte(v.buf, k)
end

-- The record at `off`: gap, count, the next record's offset.
local function log_read(v, off)
  local b = log_byte(v, off)
  off = off + 1
  local several = b % 2
  local gap = (b % 128 - several) / 2
  local scale = 64
  while b >= 128 do
    b = log_byte(v, off)
    off = off + 1
    gap = gap + (b % 128) * scale
    scale = scale * 128
  end
  local count = 1
  if several == 1 then
    local n, sc = 0, 1
    repeat
      b = log_byte(v, off)
      off = off + 1
      n = n + (b % 128) * sc
      sc = sc * 128
    until b < 128
    count = n + 2
  end
  return gap, count, off
end

-- The run at a mark: ts, count, and the mark after it; nil at the end.
local function log_next(v, pos, prev, left, x)
  if left > 0 then
    local gap, count, nxt = log_read(v, pos)
    local ts = prev + gap
    return ts, count, nxt, ts, left - count, x
  end
  local run = v.extra[x]
  if not run then return nil end
  return run[1], run[2], pos, prev, 0, x + 1
end

-- No runs appended in memory (a view's extra until CHECKALL appends one; never modified).
local NO_RUNS = {}

-- A view of a stored log (st from load, with its first bytes), or of a missing key (st nil).
local function log_view(key, st)
  if not st then return nil end
  return {
    key = key, buf = st.records, buf_at = 0, chunk = 256, hdr = st.hdr,
    complete = #st.raw < 128,
    P = st.P, last = st.last, newest = st.newest,
    pos = st.head, prev = st.base, left = st.total, x = 1, extra = NO_RUNS, n = st.total,
  }
end

-- The decision; `res` tells the write what the call saw: live (the stored log counts), count
-- (live entries), and the mark after the entries that have left the window.
local function sliding_log(v, spec, cost, now)
  local L, P = spec.L, spec.P
  local t, count, live = now, 0, false
  local res = {}
  if v then
    if v.last > t then t = v.last end
    -- A log whose last call has left its own window is a fresh key.
    live = v.last + v.P > t
  end
  if live then
    -- Entries at or before the cutoff are gone (under the stored period) or do not count
    -- (under the new one).
    local cutoff = max(t - v.P, t - P)
    local pos, prev, left, x = v.pos, v.prev, v.left, v.x
    local gone = 0
    while true do
      local ts, c, p2, pv2, l2, x2 = log_next(v, pos, prev, left, x)
      if not ts or ts > cutoff then break end
      gone = gone + c
      pos, prev, left, x = p2, pv2, l2, x2
    end
    count = v.n - gone
    res.pos, res.prev, res.left, res.x = pos, prev, left, x
  end
  res.live, res.count = live, count
  local allowed, retry = 0, 0
  local after = count
  if count + cost <= L then
    allowed = 1
    after = count + cost
  elseif cost > L then
    retry = -1
  else
    -- The request fits once the (count + cost - L)-th oldest live entry has left the window.
    local k = count + cost - L
    local pos, prev, left, x = res.pos, res.prev, res.left, res.x
    local seen = 0
    while true do
      local ts, c
      ts, c, pos, prev, left, x = log_next(v, pos, prev, left, x)
      if not ts then break end
      seen = seen + c
      if seen >= k then
        retry = P - (t - ts)
        break
      end
    end
  end
  local newest
  if allowed == 1 and cost > 0 then
    newest = t
  elseif count > 0 then
    newest = v.newest
  end
  local reset = 0
  if newest then reset = P - (t - newest) end
  return { allowed, L, max(0, L - after), retry, reset, 0 }, t, res
end

-- CHECKALL's first pass: what a consuming call would leave, in memory.
local function log_consume_in_view(key, v, res, spec, cost, t)
  if not v then
    v = { key = key, buf = '', buf_at = 0, chunk = 256, hdr = HEADER, complete = true }
  end
  if res.live and res.count > 0 then
    v.pos, v.prev, v.left, v.x = res.pos, res.prev, res.left, res.x
    if v.extra == NO_RUNS then v.extra = {} end
    v.extra[#v.extra + 1] = { t, cost }
  else
    v.left, v.extra, v.x = 0, { { t, cost } }, 1
  end
  v.n = res.count + cost
  v.P, v.last, v.newest = spec.P, t, t
  return v
end

-- A consuming call's write: the dropped prefix becomes dead (head moves), the entries are
-- appended (or the newest run grows when it is at the same ms), the header is rewritten in
-- place (a refunded log's too: it gets the usual form back). When the dead bytes outweigh the
-- live ones the log is rewritten without them.
local function log_write(key, st, res, spec, cost, t, reset)
  local expire = fmt_sum(t, reset)
  local P, L = spec.P, spec.L
  if not (res.live and res.count > 0) then
    redis.call('SET', key, log_header(P, L, t, t, 0, 0, cost) .. log_record(0, cost), 'PXAT',
      expire)
    return
  end
  local base, total = res.prev, res.count + cost
  local head, pos = res.pos, st.newest_pos
  local record, size
  local same_ms = t == st.newest
  if #st.raw < 128 or st.off > 0 then
    -- A small log, read whole by load(): one SET rewrites it without its dead records. A log
    -- whose block has ended is rewritten so too, without the block.
    local records = st.records
    if #st.raw >= 128 then records = redis.call('GETRANGE', key, fmt(st.hdr), '-1') end
    if same_ms then
      local v = { key = key, buf = records, buf_at = 0, chunk = 256, complete = true }
      local gap, count = log_read(v, pos)
      record = log_record(gap, count + cost)
    else
      record = log_record(t - st.newest, cost)
      pos = #records
    end
    redis.call('SET', key, log_header(P, L, t, base, 0, pos - head, total)
      .. strsub(records, head + 1, pos) .. record, 'PXAT', expire)
    return
  end
  if same_ms then
    -- The newest record is the last one: re-encode it with its new count.
    local old = redis.call('GETRANGE', key, fmt(HEADER + pos), '-1')
    local v = { key = key, buf = old, buf_at = pos, chunk = 256, complete = true }
    local gap, count = log_read(v, pos)
    record = log_record(gap, count + cost)
    size = pos + #record
  else
    -- Appended: APPEND answers the new length.
    record = log_record(t - st.newest, cost)
    size = redis.call('APPEND', key, record) - HEADER
    pos = size - #record
  end
  if head >= 16 and head >= size - head then
    -- The dead records outweigh the live ones: rewrite the log without them.
    local live = redis.call('GETRANGE', key, fmt(HEADER + head), fmt(HEADER + pos - 1))
    redis.call('SET', key, log_header(P, L, t, base, 0, pos - head, total) .. live .. record,
      'PXAT', expire)
    return
  end
  if same_ms then redis.call('SETRANGE', key, fmt(HEADER + pos), record) end
  redis.call('SETRANGE', key, '0', log_header(P, L, t, base, head, pos, total))
  redis.call('PEXPIREAT', key, expire)
end

-- REFUND on a log (st, loaded), as the module's sliding_log::refund: at t = max(now, last),
-- the `cost` newest entries still in the window of the log's own period are removed (all of
-- them if fewer), with the entries that have left it. The log is written whole, its time
-- `last` moved to t (a refunded header when its newest entry is older), and expires when its
-- newest entry leaves the window. Returns the view to answer from (the log as it was when
-- nothing was given back; nil when the key was left fresh and deleted) and t.
local function log_give_back(key, st, cost, now)
  local P = st.P
  local t = max(now, st.last)
  local v = log_view(key, st)
  -- A stale log (its last call out of its window) holds no entry in it: nothing to walk.
  if cost == 0 or st.last + P <= t then return v, t end
  -- Past the entries that have left the window.
  local cutoff = t - P
  local pos, prev, left = v.pos, v.prev, v.left
  while left > 0 do
    local gap, count, nxt = log_read(v, pos)
    if prev + gap > cutoff then break end
    pos, prev, left = nxt, prev + gap, left - count
  end
  local take = min(cost, left)
  if take == 0 then return v, t end
  -- A refund does not lift a block: a blocked log keeps its state, empty or not.
  local blocked = block_left(st, t) and st.blocked_s
  if take == left then
    if not blocked then
      redis.call('DEL', key)
      return nil, t
    end
    local value = 'rl:bk ' .. blocked .. ' ' .. log_header(P, st.L, t, t, 0, 0, 0)
    redis.call('SET', key, value, 'PXAT', blocked)
    return log_view(key, parse_state(value)), t
  end
  -- The records kept: from the first live one (its gap counts from `base`) to the one holding
  -- the keep-th live entry, which keeps only its first entries up to there.
  local keep = left - take
  local from, base = pos, prev
  local seen, gap, count, nxt, newest = 0, 0, 0, 0, 0
  while true do
    gap, count, nxt = log_read(v, pos)
    newest = prev + gap
    seen = seen + count
    if seen >= keep then break end
    pos, prev = nxt, newest
  end
  local before = ''
  if pos > from then
    if v.complete then
      before = strsub(st.records, from + 1, pos)
    else
      before = redis.call('GETRANGE', key, fmt(st.hdr + from), fmt(st.hdr + pos - 1))
    end
  end
  local header
  if newest == t then
    header = log_header(P, st.L, t, base, 0, pos - from, keep)
  else
    header = refunded_log_header(P, st.L, t, base, newest, keep)
  end
  local value = header .. before .. log_record(gap, count - (seen - keep))
  local expire = fmt_sum(newest, P)
  if blocked then
    value = 'rl:bk ' .. blocked .. ' ' .. value
    expire = later(expire, blocked)
  end
  redis.call('SET', key, value, 'PXAT', expire)
  return log_view(key, parse_state(strsub(value, 1, 128))), t
end

-- ------------------------------------------------------------------------------------------
-- One limit on one key.

-- The view a decision reads: the state table, or the sliding log's view.
local function view_of(key, st)
  if st and st.alg == SL then return log_view(key, st) end
  return st
end

local function decide(alg, view, spec, cost, now)
  if alg == SL then return sliding_log(view, spec, cost, now) end
  return FIXED[alg](view, spec, cost, now)
end

-- The time a key's state becomes a fresh key's, without its block (decimal): what its expiry
-- would be (the module's expires_at_ms before the block's end is taken into account).
local function state_expiry(key, st)
  return fmt_sum(st.last, decide(st.alg, view_of(key, st), st, 0, st.last)[5])
end

-- CHECK (commit) or PEEK on a loaded key, with the call's BLOCK (ms, nil: none); returns the
-- reply, whether it wrote and whether the key's block decided it, or nil, error. A block is
-- written by the rejection that starts it; a consuming call after its end clears it.
local function evaluate(key, st, spec, cost, now, commit, block)
  if st and st.alg ~= spec.alg then return nil, mismatch(st.alg, spec.alg) end
  local view = view_of(key, st)
  local reply, t, a, b = decide(spec.alg, view, spec, cost, now)
  local left = st and block_left(st, t)
  if left then return blocked_answer(reply, left), false, true end
  if commit and cost > 0 then
    if reply[1] == 1 then
      if spec.alg == SL then
        log_write(key, st, a, spec, cost, t, reply[5])
      else
        redis.call('SET', key, encode_fixed(spec, a, b, t), 'PXAT', fmt_sum(t, reply[5]))
      end
      return reply, true
    end
    if block and st and reply[4] >= 0 then
      -- The key lives until its stored state (under its own parameters, not the call's) is
      -- fresh and the block has ended.
      local until_s = fmt_sum(t, block)
      reply = blocked_answer(reply, block)
      redis.call('SET', key, blocked_value(key, st, until_s), 'PXAT',
        later(state_expiry(key, st), until_s))
      return reply, true
    end
  end
  return reply, false
end

-- REFUND on a fixed-size state (st, loaded), as the module's give_back: the state brought to
-- t = max(now, last) under its own parameters (the algorithm called with COST 0 and the state
-- as its spec), then up to `cost` given back: tokens up to the capacity (token bucket), the
-- level or gcra's ahead down to 0, the current window's count down to 0 (windows). Costs are
-- compared before they are multiplied, so every product stays below 2^53. Stored with
-- last = t and the expiry of the state's own parameters; deleted when left as a fresh key's.
-- Returns the view to answer from (st when nothing was given back; nil when deleted) and t.
local function give_back(key, st, cost, now)
  local alg, P = st.alg, st.P
  local _, t, a, b = FIXED[alg](st, st, 0, now)
  local blocked = block_left(st, t) and st.blocked_s
  local fresh
  if alg == TB then
    local missing = st.C * P - a
    if cost == 0 or missing == 0 then return st, t end
    fresh = cost >= ceil_div(missing, P)
    if not fresh then a = a + cost * P end
  elseif alg == FW or alg == SW then
    -- The previous window's count (b) is spent.
    if cost == 0 or a == 0 then return st, t end
    a = max(0, a - cost)
    fresh = a == 0 and (alg == FW or b == 0)
  else
    -- Leaky bucket, gcra.
    if cost == 0 or a == 0 then return st, t end
    fresh = cost >= ceil_div(a, P)
    if not fresh then a = a - cost * P end
  end
  if fresh then
    if not blocked then
      redis.call('DEL', key)
      return nil, t
    end
    -- A refund does not lift a block: a blocked key keeps its state, fresh or not.
    if alg == TB then a = st.C * P else a = 0 end
  end
  local after = { alg = alg, L = st.L, P = P, C = st.C, a = a, b = b, last = t }
  local reset = FIXED[alg](after, st, 0, t)[5]
  local value, expire = encode_fixed(st, a, b, t), fmt_sum(t, reset)
  if blocked then
    value, expire = 'rl:bk ' .. blocked .. ' ' .. value, later(expire, blocked)
  end
  redis.call('SET', key, value, 'PXAT', expire)
  return after, t
end

-- ------------------------------------------------------------------------------------------
-- Concurrency limits (leases), as the module's src/algorithms/concurrency.rs: at most `limit`
-- cost held at once, each lease (id, cost, expiry) held until it is released or expires. At
-- t = max(call, last): the live leases are those with expiry > t, `held` their cost. An acquire
-- of n under id is admitted if the other ids' live leases plus n fit the limit; it then stores
-- (id, n, t + lease-duration) (a new lease, or the id's live one renewed: cost replaced, expiry
-- moved), drops the expired leases and sets last = t. A rejected acquire and a release of no
-- live lease write nothing. The key is a sorted set (the layout at the top): its positive scores
-- are the leases' expiries, so the expired leases, the live ones in order of expiry and the
-- last one are ranges of it, and a call costs O(log n) plus the leases it walks.

local EQUALS, PLUS = 61, 43 -- '=' and '+': a lease of cost 1, of cost 2 or more

-- A lease's expiry from its score: an integer from 1 to 2^53 - 1.
local function lease_expiry(score)
  local e = score + 0
  if e < 1 or e >= EXACT or e ~= floor(e) then error(redis.error_reply(E_CORRUPT_LEASES)) end
  return e
end

-- The costs of `members` ('+<id>' leases) from their '#<id>' members, appended to `out`.
local function lease_costs(key, members, out)
  for i = 1, #members, 1000 do
    local names = {}
    for j = i, min(i + 999, #members) do names[#names + 1] = '#' .. strsub(members[j], 2) end
    local scores = redis.call('ZMSCORE', key, unpack(names))
    for j = 1, #names do
      local cost = negated(scores[j], 2, MAX_AMOUNT)
      if not cost then error(redis.error_reply(E_CORRUPT_LEASES)) end
      out[#out + 1] = cost
    end
  end
  return out
end

-- The leases that have expired by t (they hold nothing, and stay until a write drops them):
-- { n = how many, cost = their cost, members = the '#<id>' members of those of cost 2 or more,
-- removed with them }.
local function expired_leases(key, t)
  local found = redis.call('ZRANGE', key, '(0', fmt(t), 'BYSCORE')
  local cost, plus = 0, {}
  for _, m in ipairs(found) do
    if byte(m) == PLUS then plus[#plus + 1] = m else cost = cost + 1 end
  end
  for _, c in ipairs(lease_costs(key, plus, {})) do cost = cost + c end
  local members = {}
  for i, m in ipairs(plus) do members[i] = '#' .. strsub(m, 2) end
  return { n = #found, cost = cost, members = members }
end

-- A write's removals: the expired leases (with their cost members) and `members`.
local function drop_leases(key, t, expired, members)
  if expired.n > 0 then
    redis.call('ZREMRANGEBYSCORE', key, '(0', fmt(t))
    local more = expired.members
    for i = 1, #more, 1000 do
      redis.call('ZREM', key, unpack(more, i, min(i + 999, #more)))
    end
  end
  if #members > 0 then redis.call('ZREM', key, unpack(members)) end
end

-- The concurrency key at `key` and `id`'s stored lease (live or not): fields (nil: missing),
-- lease ({ member, expiry, cost } or nil), or nil, nil, error (another type, or a rate limiter:
-- the module's mismatch error).
local function load_leases(key, id)
  local scores = redis.pcall('ZMSCORE', key, LEASE_META[1], LEASE_META[2], LEASE_META[3],
    LEASE_META[4], '=' .. id, '+' .. id, '#' .. id)
  if scores.err then
    local st, err = load(key)
    if st then return nil, nil, mismatch(st.alg, CC) end
    return nil, nil, err or WRONG_TYPE
  end
  local st = lease_fields(scores)
  if not st then
    if scores[1] or scores[2] or scores[3] or scores[4] or scores[5] or scores[6]
      or redis.call('EXISTS', key) == 1 then
      return nil, nil, WRONG_TYPE
    end
    return nil
  end
  local lease
  if scores[5] then
    if scores[6] then return nil, nil, E_CORRUPT_LEASES end
    lease = { member = '=' .. id, expiry = lease_expiry(scores[5]), cost = 1 }
  elseif scores[6] then
    local cost = negated(scores[7], 2, MAX_AMOUNT)
    if not cost then return nil, nil, E_CORRUPT_LEASES end
    lease = { member = '+' .. id, expiry = lease_expiry(scores[6]), cost = cost }
  end
  return st, lease
end

-- The members a lease of id leaves behind when it goes.
local function lease_members(lease, id)
  if lease.cost == 1 then return { lease.member } end
  return { lease.member, '#' .. id }
end

-- The earliest expiry by which the live leases of the other ids (than `id`) that have expired
-- hold `need` (at least 1): leases expire in order of expiry, so the running total of their
-- costs, walked in that order from t on, reaches `need` there; nil if it never does. Read by
-- rank, in pages.
local function first_fit(key, t, need, id)
  local equals, plus = '=' .. id, '+' .. id
  local rank = redis.call('ZCOUNT', key, '-inf', fmt(t)) -- the fields and the expired leases
  local page, sum = min(need + 1, 256), 0
  while true do
    local got = redis.call('ZRANGE', key, fmt(rank), fmt(rank + page - 1), 'WITHSCORES')
    if #got == 0 then return nil end
    local members = {}
    for i = 1, #got, 2 do
      local m = got[i]
      if byte(m) == PLUS and m ~= plus then members[#members + 1] = m end
    end
    local costs, k = lease_costs(key, members, {}), 0
    for i = 1, #got, 2 do
      local m = got[i]
      if m ~= equals and m ~= plus then
        local cost = 1
        if byte(m) == PLUS then
          k = k + 1
          cost = costs[k]
        elseif byte(m) ~= EQUALS then
          error(redis.error_reply(E_CORRUPT_LEASES))
        end
        sum = sum + cost
        if sum >= need then return lease_expiry(got[i + 1]) end
      end
    end
    rank, page = rank + page, min(page * 2, 1000)
  end
end

-- The latest expiry of a stored lease but `id`'s (0: none). `top`: ZRANGE's highest members
-- WITHSCORES, in ascending order; the fields have negative scores.
local function last_expiry_except(top, id)
  for i = #top - 1, 1, -2 do
    local m, score = top[i], top[i + 1] + 0
    if score <= 0 then return 0 end
    if strsub(m, 2) ~= id then return lease_expiry(score) end
  end
  return 0
end

-- `ID lease-id`, `COST n` (with_cost: ACQUIRE's) and `AT unix-ms` from args[i] on, in pairs, in
-- any order, each once. Returns id, cost (default 1), at (nil: the server's clock), or nil,
-- error message.
local LEASE_OPTIONS = { ID = 'ID', COST = 'COST', AT = 'AT' }
local function lease_options(args, i, with_cost)
  local id, cost, at
  while args[i] ~= nil do
    local option = LEASE_OPTIONS[args[i]] or LEASE_OPTIONS[upper(args[i])]
    if option == 'COST' and not with_cost then option = nil end
    if not option then
      local expected = E_RELEASE_OPTION
      if with_cost then expected = E_ACQUIRE_OPTION end
      return nil, unknown('option', expected, args[i], nil)
    end
    local value = args[i + 1]
    if value == nil then return nil, 'ERR ' .. option .. ' needs a value' end
    local before
    if option == 'ID' then
      if #value < 1 or #value > LEASE_ID_MAX then return nil, E_LEASE_ID end
      before, id = id, value
    elseif option == 'COST' then
      local n = parse_amount(value, 1)
      if not n then return nil, E_LEASE_COST end
      before, cost = cost, n
    else
      local v, err = option_value('AT', value)
      if not v then return nil, err.msg end
      before, at = at, v
    end
    if before ~= nil then return nil, 'ERR ' .. option .. ' given more than once' end
    i = i + 2
  end
  if not id then return nil, E_LEASE_ID_MISSING end
  return id, cost or 1, at
end

-- ACQUIRE: `limit lease-duration ID lease-id [COST n] [AT unix-ms]`, the reply the six integers
-- (`delay_ms` 0): `remaining` the limit less what the live leases hold after the call,
-- `retry_after_ms` the least wait until enough of the other ids' leases have expired for this
-- one to fit (-1 for a cost above the limit), `reset_after_ms` the time until the last live
-- lease expires (when the key does).
local function acquire(keys, args)
  local name = 'ratelimit_acquire'
  if #keys ~= 1 then return redis.error_reply(one_key(name)) end
  local first = args[1]
  if first ~= nil and #first == 6 and lower(first) == 'policy' then
    return redis.error_reply(E_NO_LEASE_POLICIES)
  end
  if #args < 4 then return redis.error_reply(arity(name)) end
  local L = parse_amount(args[1], 1)
  if not L then return redis.error_reply(E_LIMIT) end
  local D = parse_period(args[2])
  if not D then return redis.error_reply(E_LEASE_DURATION) end
  local id, n, at = lease_options(args, 3, true)
  if not id then return redis.error_reply(n) end

  local key = keys[1]
  local st, own, err = load_leases(key, id)
  if err then return redis.error_reply(err) end
  local t = at or server_now()
  if st and st.last > t then t = st.last end
  if t + D >= EXACT then return redis.error_reply(E_EXACT_LEASE) end

  local held, expired = 0, nil
  if st then
    expired = expired_leases(key, t)
    held = st.total - expired.cost
    if held < 0 then return redis.error_reply(E_CORRUPT_LEASES) end
  end
  local live = own and own.expiry > t
  local other = held
  if live then other = held - own.cost end

  if other + n > L then
    -- Rejected: nothing written.
    local retry = -1
    if n <= L then
      local x = first_fit(key, t, other + n - L, id)
      if not x then return redis.error_reply(E_CORRUPT_LEASES) end
      retry = x - t
    end
    local reset = 0
    if st then
      local top = redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')
      if top[2] and top[2] + 0 > t then reset = top[2] - t end
    end
    return { 0, L, max(0, L - held), retry, reset, 0 }
  end

  -- A new lease past the bound is an error (a renewal never is). ZCARD, every member, bounds
  -- the live leases from above in O(1).
  if st and not live and redis.call('ZCARD', key) >= MAX_LEASES
    and redis.call('ZCOUNT', key, '(' .. fmt(t), '+inf') >= MAX_LEASES then
    return redis.error_reply(E_TOO_MANY_LEASES)
  end
  local expiry = t + D
  local last_other = 0
  if st then
    last_other = last_expiry_except(redis.call('ZRANGE', key, '-2', '-1', 'WITHSCORES'), id)
  end
  local reset = max(last_other, expiry) - t

  -- The write: the expired leases dropped, the id's lease stored (its old members removed
  -- when it changes form), the fields, the expiry at the last lease's.
  local member = '=' .. id
  if n > 1 then member = '+' .. id end
  local gone = {}
  if live and own.member ~= member then gone = lease_members(own, id) end
  if st then drop_leases(key, t, expired, gone) end
  local zadd = { 'ZADD', key, fmt(-L), '!limit', fmt(-D), '!lease_ms', fmt(-t), '!last',
    fmt(-(other + n)), '!cost', fmt(expiry), member }
  if n > 1 then
    zadd[#zadd + 1] = fmt(-n)
    zadd[#zadd + 1] = '#' .. id
  end
  redis.call(unpack(zadd))
  redis.call('PEXPIREAT', key, fmt(t + reset))
  return { 1, L, L - (other + n), 0, reset, 0 }
end

-- RELEASE: `ID lease-id [AT unix-ms]`; 1 if the id held a live lease (now gone, with the
-- expired ones), else 0 and nothing written. Releasing the last live lease deletes the key.
local function release(keys, args)
  local name = 'ratelimit_release'
  if #keys ~= 1 then return redis.error_reply(one_key(name)) end
  if #args < 2 then return redis.error_reply(arity(name)) end
  local id, bad_option, at = lease_options(args, 1, false)
  if not id then return redis.error_reply(bad_option) end
  local key = keys[1]
  local st, own, err = load_leases(key, id)
  if err then return redis.error_reply(err) end
  if not st then return 0 end
  local t = max(at or server_now(), st.last)
  if not own or own.expiry <= t then return 0 end
  local expired = expired_leases(key, t)
  local total = st.total - expired.cost - own.cost
  if total < 0 then return redis.error_reply(E_CORRUPT_LEASES) end
  if total == 0 then
    -- Every lease has a cost: none is left.
    redis.call('DEL', key)
    return 1
  end
  drop_leases(key, t, expired, lease_members(own, id))
  redis.call('ZADD', key, fmt(-t), '!last', fmt(-total), '!cost')
  local top = redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')
  redis.call('PEXPIREAT', key, fmt(lease_expiry(top[2])))
  return 1
end

-- ------------------------------------------------------------------------------------------
-- The functions.

local function check(name, keys, args, commit)
  if #keys ~= 1 then return redis.error_reply(one_key(name)) end
  local spec, cost, at, _, block = parse_check(args, 1)
  if not spec then
    if cost.arity then return redis.error_reply(arity(name)) end
    return redis.error_reply(cost.msg)
  end
  local st, err, raw = load(keys[1])
  if err then return redis.error_reply(err) end
  local reply, wrote = evaluate(keys[1], st, spec, cost, at or server_now(), commit, block)
  if not reply then return redis.error_reply(wrote) end
  -- A value left as it was is likely read again: rejections repeat on a key at its limit.
  if raw and not wrote then remember_state(raw, st) end
  return reply
end

-- REFUND: CHECK's arguments, COST required; the reply is PEEK's with the call's parameters and
-- COST 0 right after, at the refund's time.
local function refund(keys, args)
  local name = 'ratelimit_refund'
  if #keys ~= 1 then return redis.error_reply(one_key(name)) end
  local spec, cost, at, cost_given = parse_check(args, 1)
  if not spec then
    if cost.arity then return redis.error_reply(arity(name)) end
    return redis.error_reply(cost.msg)
  end
  if not cost_given then return redis.error_reply(E_REFUND_COST) end
  local key = keys[1]
  local st, err = load(key)
  if err then return redis.error_reply(err) end
  if st and st.alg ~= spec.alg then return redis.error_reply(mismatch(st.alg, spec.alg)) end
  local view, t = nil, at or server_now()
  if st and st.alg == SL then
    view, t = log_give_back(key, st, cost, t)
  elseif st then
    view, t = give_back(key, st, cost, t)
  end
  local reply = decide(spec.alg, view, spec, 0, t)
  -- A refund does not lift a block: the answer is the blocked one.
  local left = st and block_left(st, t)
  if left then return blocked_answer(reply, left) end
  return reply
end

-- The overall decision: allowed only if all allow; the least remaining (and the limit of the
-- first key with it); the greatest retry_after (-1 if any is -1), reset_after and delay.
local function combine(replies)
  local overall = { 1, 0, 0, 0, 0, 0 }
  local least
  local never = false
  for _, r in ipairs(replies) do
    if r[1] == 0 then overall[1] = 0 end
    if not least or r[3] < least[3] then least = r end
    if r[4] == -1 then never = true end
    overall[4] = max(overall[4], r[4])
    overall[5] = max(overall[5], r[5])
    overall[6] = max(overall[6], r[6])
  end
  overall[2], overall[3] = least[2], least[3]
  if never then overall[4] = -1 end
  return overall
end

local function checkall(keys, args)
  local specs, cost, at, blocks = parse_checkall(keys, args, 'ratelimit_checkall')
  if not specs then return redis.error_reply(cost) end
  local now = at or server_now()

  -- First pass: decide every limit in order without writing. A key named more than once is
  -- decided on a view that carries what the admitted limits before it consumed. A blocked key
  -- rejects every limit on it (by_block), and its view stays as it is.
  local loaded, views, algs, seen = {}, {}, {}, {}
  local replies, times, by_block = {}, {}, {}
  for i, key in ipairs(keys) do
    local spec = specs[i]
    if not seen[key] then
      local st, err = load(key)
      if err then return redis.error_reply(err) end
      seen[key], loaded[key] = true, st
      views[key] = view_of(key, st)
      algs[key] = st and st.alg
    end
    if algs[key] and algs[key] ~= spec.alg then
      return redis.error_reply(mismatch(algs[key], spec.alg))
    end
    local reply, t, a, b = decide(spec.alg, views[key], spec, cost, now)
    local st = loaded[key]
    local left = st and block_left(st, t)
    if left then
      reply, by_block[i] = blocked_answer(reply, left), true
    elseif reply[1] == 1 and cost > 0 then
      algs[key] = spec.alg
      if spec.alg == SL then
        views[key] = log_consume_in_view(key, views[key], a, spec, cost, t)
      else
        views[key] = { alg = spec.alg, L = spec.L, P = spec.P, C = spec.C, a = a, b = b, last = t }
      end
    end
    replies[i], times[i] = reply, t
  end

  local admitted = true
  for _, r in ipairs(replies) do
    if r[1] == 0 then admitted = false end
  end
  if admitted and cost > 0 then
    -- Second pass: consume everywhere, in order, as the same CHECKs one after the other. A key
    -- is read again after a write to it.
    local fresh = {}
    for i, key in ipairs(keys) do
      local st = loaded[key]
      if fresh[key] then
        local err
        st, err = load(key)
        if err then return redis.error_reply(err) end
      end
      local reply, err = evaluate(key, st, specs[i], cost, now, true)
      if not reply then return redis.error_reply(err) end
      replies[i] = reply
      fresh[key] = true
    end
  end
  -- Blocks: a limit with BLOCK that its algorithm rejected (a cost it can ever admit, on a
  -- stored key not blocked already) blocks its key, whether or not the request was admitted;
  -- once per key, the first such limit's. Nothing else of the key changes; it expires at the
  -- later of its state's expiry and the block's end.
  local blocked = {}
  if cost > 0 then
    for i, key in ipairs(keys) do
      local r, st, block = replies[i], loaded[key], blocks[i]
      if block and st and r[1] == 0 and r[4] >= 0 and not by_block[i] and not blocked[key] then
        local until_s = fmt_sum(times[i], block)
        redis.call('SET', key, blocked_value(key, st, until_s), 'PXAT',
          later(state_expiry(key, st), until_s))
        replies[i] = blocked_answer(r, block)
        blocked[key] = true
      end
    end
  end

  local out = { combine(replies) }
  for i, r in ipairs(replies) do out[i + 1] = r end
  return out
end

local function reset(keys, args)
  if #keys == 0 or #args > 0 then return redis.error_reply(arity('ratelimit_reset')) end
  -- All or nothing: a key of another type fails the call before anything is removed. A key
  -- named twice is removed once, as DEL counts it.
  local found, seen = {}, {}
  for _, key in ipairs(keys) do
    if not seen[key] then
      seen[key] = true
      local st, err = load(key)
      if err then return redis.error_reply(err) end
      if st then found[#found + 1] = key end
    end
  end
  for i = 1, #found, 1000 do
    redis.call('DEL', unpack(found, i, min(i + 999, #found)))
  end
  return #found
end

local function status(s)
  return { ok = s }
end

local function info(keys, args)
  if #keys ~= 1 then return redis.error_reply(one_key('ratelimit_info')) end
  if #args > 0 then return redis.error_reply(arity('ratelimit_info')) end
  local key = keys[1]
  local st, err = load(key)
  if err then return redis.error_reply(err) end
  if not st then return false end
  if st.alg == CC then
    -- The module's fields of a concurrency key: what its live leases hold now.
    local t = max(server_now(), st.last)
    local expired = expired_leases(key, t)
    local held = st.total - expired.cost
    local leases = redis.call('ZCOUNT', key, '(' .. fmt(t), '+inf')
    local top = redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')
    local reset = 0
    if top[2] and top[2] + 0 > t then reset = top[2] - t end
    return {
      status('algorithm'), status(CC), status('limit'), st.L, status('lease_ms'), st.P,
      status('remaining'), max(0, st.L - held), status('reset_after_ms'), reset,
      status('updated_at_ms'), st.last, status('leases'), leases, status('held'), held,
    }
  end
  -- remaining and reset_after_ms: a COST 0 PEEK with the stored parameters, now (a block too).
  local reply, t = decide(st.alg, view_of(key, st), st, 0, server_now())
  local left = block_left(st, t)
  if left then reply = blocked_answer(reply, left) end
  local out = {
    status('algorithm'), status(st.alg), status('limit'), st.L, status('period_ms'), st.P,
    status('burst'), st.C, status('remaining'), reply[3], status('reset_after_ms'), reply[5],
    status('updated_at_ms'), st.last,
  }
  local own
  if st.alg == TB then
    own = { 'tokens', floor_div(st.a, st.P) }
  elseif st.alg == LB then
    own = { 'level', ceil_div(st.a, st.P) }
  elseif st.alg == FW then
    own = { 'window_start', window_start(st.last, st.P), 'count', st.a }
  elseif st.alg == SW then
    own = { 'window_start', window_start(st.last, st.P), 'count', st.a, 'previous', st.b }
  elseif st.alg == GC then
    -- The TAT in ms since the epoch, rounded up (a double: exact below 2^53).
    own = { 'tat', st.last + ceil_div(st.a, st.L) }
  else
    own = { 'entries', st.total }
  end
  -- A block that has not ended (a double: rounded above 2^53).
  if left then
    own[#own + 1] = 'blocked_until_ms'
    own[#own + 1] = st.blocked
  end
  for k = 1, #own, 2 do
    out[#out + 1] = status(own[k])
    out[#out + 1] = own[k + 1]
  end
  return out
end

redis.register_function {
  function_name = 'ratelimit_check',
  callback = function(keys, args)
    if not bound then bind() end
    return check('ratelimit_check', keys, args, true)
  end,
  description = 'RATELIMIT.CHECK: 1 key algorithm limit period [BURST c] [BLOCK d] [COST n] '
    .. '[AT ms]',
}
redis.register_function {
  function_name = 'ratelimit_peek',
  callback = function(keys, args)
    if not bound then bind() end
    return check('ratelimit_peek', keys, args, false)
  end,
  flags = { 'no-writes' },
  description = 'RATELIMIT.PEEK: what ratelimit_check would answer, changing nothing',
}
redis.register_function {
  function_name = 'ratelimit_checkall',
  callback = function(keys, args)
    if not bound then bind() end
    return checkall(keys, args)
  end,
  description = 'RATELIMIT.CHECKALL: N keys, one algorithm limit period [BURST c] [BLOCK d] '
    .. 'per key, '
    .. '[COST n] [AT ms]; all or nothing',
}
redis.register_function {
  function_name = 'ratelimit_refund',
  callback = function(keys, args)
    if not bound then bind() end
    return refund(keys, args)
  end,
  description = 'RATELIMIT.REFUND: 1 key algorithm limit period [BURST c] [BLOCK d] COST n '
    .. '[AT ms]; gives '
    .. 'back up to n of what earlier calls consumed',
}
redis.register_function {
  function_name = 'ratelimit_reset',
  callback = function(keys, args)
    if not bound then bind() end
    return reset(keys, args)
  end,
  description = 'RATELIMIT.RESET: N keys; removes limiters, replies how many',
}
redis.register_function {
  function_name = 'ratelimit_info',
  callback = function(keys, args)
    if not bound then bind() end
    return info(keys, args)
  end,
  flags = { 'no-writes' },
  description = 'RATELIMIT.INFO: 1 key; the stored state as field/value pairs, nil if missing',
}
redis.register_function {
  function_name = 'ratelimit_acquire',
  callback = function(keys, args)
    if not bound then bind() end
    return acquire(keys, args)
  end,
  description = 'RATELIMIT.ACQUIRE: 1 key limit lease-duration ID lease-id [COST n] [AT ms]; '
    .. 'takes (or renews) a lease if the limit has room for it',
}
-- allow-oom: a release only removes and rewrites members (memory is given back), and the
-- module's RELEASE is allowed over maxmemory so that a request's `finally` can always run.
redis.register_function {
  function_name = 'ratelimit_release',
  callback = function(keys, args)
    if not bound then bind() end
    return release(keys, args)
  end,
  flags = { 'allow-oom' },
  description = 'RATELIMIT.RELEASE: 1 key ID lease-id [AT ms]; gives a lease back, 1 if it was '
    .. 'live',
}
