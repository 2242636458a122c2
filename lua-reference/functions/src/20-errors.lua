-- Error replies. The module's texts are not copied: each `--@error E_NAME = CONST` line of this
-- part becomes `local E_NAME = '...'` in the payload, the text of CONST in core/src/error.rs
-- with the module's command names (RATELIMIT.REFUND) as these functions' (ratelimit_refund):
-- see lua-reference/functions/assemble.py. The library's own texts (its bounds, its lack of
-- policies and configuration) are written out below them.

--@error WRONG_TYPE = WRONG_TYPE
--@error E_ALGORITHM = UNKNOWN_ALGORITHM
--@error E_LIMIT = LIMIT
--@error E_PERIOD = PERIOD
--@error E_BURST = BURST
--@error E_BURST_ON_WINDOW = BURST_ON_WINDOW
--@error E_BLOCK = BLOCK
--@error E_COST = COST
--@error E_AT = AT
--@error E_REFUND_COST = REFUND_COST
--@error E_NUMKEYS = NUMKEYS
--@error E_OPTION = UNKNOWN_OPTION
-- A limit spec given as one argument.
--@error E_SPEC_EMPTY_WORD = SPEC_EMPTY_WORD
--@error E_SPEC_WHITESPACE = SPEC_WHITESPACE
--@error E_SPEC_CALL_OPTION = SPEC_CALL_OPTION
--@error E_SPEC_INCOMPLETE = SPEC_INCOMPLETE
-- Leases.
--@error E_LEASE_DURATION = LEASE_DURATION
--@error E_LEASE_COST = LEASE_COST
--@error E_LEASE_ID = LEASE_ID
--@error E_LEASE_ID_MISSING = LEASE_ID_MISSING
--@error E_ACQUIRE_OPTION = UNKNOWN_ACQUIRE_OPTION
--@error E_RELEASE_OPTION = UNKNOWN_RELEASE_OPTION
--@error E_CONCURRENCY_CALL = CONCURRENCY_CALL
-- Partial grants.
--@error E_TAKE_MAX = TAKE_MAX
--@error E_TAKE_MAX_MISSING = TAKE_MAX_MISSING
--@error E_TAKE_OPTION = UNKNOWN_TAKE_OPTION

-- The library's own. Lua's bounds (the module computes these products in 128 bits):
local E_EXACT_BUCKET = 'ERR BURST (or limit, without BURST) times the period in ms must be '
  .. 'below 2^53 for exact arithmetic in the ratelimit functions library (the module has no '
  .. 'such bound)'
local E_EXACT_WINDOW = 'ERR limit times the period in ms must be below 2^53 for exact '
  .. 'arithmetic in the ratelimit functions library (the module has no such bound)'
local E_EXACT_LEASE = 'ERR AT (or the key\'s last write, if later) plus lease-duration must be '
  .. 'below 2^53 for exact arithmetic in the ratelimit functions library (the module has no '
  .. 'such bound)'
-- Named policies (RATELIMIT.POLICY) are the module's: a library keeps no data outside keys.
local E_NO_POLICIES = 'ERR the ratelimit functions library has no policies: give the limit '
  .. 'as algorithm limit period [BURST capacity] (see docs/functions.md)'
local E_NO_LEASE_POLICIES = 'ERR the ratelimit functions library has no policies: give the '
  .. 'limit as limit lease-duration (see docs/functions.md)'
-- The module's too_many_leases without its "or raise it": a library has no configuration.
local E_TOO_MANY_LEASES = 'ERR key holds ratelimit.max-leases (' .. MAX_LEASES .. ') live '
  .. 'leases: release some (ratelimit_release)'
-- A value with a limiter's form that does not read back as one (the module's data type is
-- checked when it is loaded instead).
local E_CORRUPT = 'ERR corrupt sliding-log state'
local E_CORRUPT_LEASES = 'ERR corrupt concurrency state'

-- Texts with arguments, in the module's words (ArgError::message and algorithm_mismatch in
-- core/src/error.rs; tests/integration/functions/errors.rs compares every one with the module's).
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
