-- Arguments: the module's grammar (core/src/parse/). An error is a table: `msg` the
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

-- A limit spec given as one argument (`"sliding-window 100 1m"`): its words, as the module reads
-- them (core/src/parse/words.rs), split at single spaces and checked in order before anything
-- else of the call is read. No algorithm, number, period or option holds a space.
local CALL_OPTION = { COST = 'COST', AT = 'AT', MAX = 'MAX' }

local function one_argument(s)
  return find(s, ' ', 1, true) ~= nil
end

-- Appends the words of the one-argument spec `s` to `out`: nil, or the error message.
local function push_spec_words(s, out)
  local start, from = #out + 1, 1
  while true do
    local space = find(s, ' ', from, true)
    local word = strsub(s, from, space and space - 1 or #s)
    if word == '' then return 'ERR limit spec \'' .. shown(s) .. '\' ' .. E_SPEC_EMPTY_WORD end
    if find(word, '[\t\n\r\v\f]') then
      return 'ERR limit spec \'' .. shown(s) .. '\' ' .. E_SPEC_WHITESPACE
    end
    local option = CALL_OPTION[upper(word)]
    if option then
      return 'ERR ' .. option .. ' goes after the limit spec \'' .. shown(s) .. '\' '
        .. E_SPEC_CALL_OPTION
    end
    out[#out + 1] = word
    if not space then break end
    from = space + 1
  end
  -- A whole spec: POLICY name, or a period, and the value of a BURST or BLOCK at its end.
  local n = #out - start + 1
  if lower(out[start]) ~= 'policy'
    and (n < 3 or ((n - 3) % 2 == 1 and SPEC_OPTION[upper(out[#out])])) then
    return 'ERR limit spec \'' .. shown(s) .. '\' ' .. E_SPEC_INCOMPLETE
  end
  return nil
end

-- The arguments of CHECK, PEEK, REFUND, TAKE (a spec first), its one-argument spec split into
-- its words; or nil, the error message.
local function call_words(args)
  local first = args[1]
  if first == nil or not one_argument(first) then return args end
  local words = {}
  local err = push_spec_words(first, words)
  if err then return nil, err end
  for k = 2, #args do words[#words + 1] = args[k] end
  return words
end

-- CHECKALL's arguments after its keys, every one-argument spec split into its words. Specs start
-- where the grammar reads one: after an option name and its value, a spec of one argument, or
-- `POLICY name`, or three words. Returns the words, or nil, the error message and the spec's
-- number.
local function checkall_words(args)
  local any = false
  for k = 1, #args do
    if one_argument(args[k]) then
      any = true
      break
    end
  end
  if not any then return args end
  local words, i, s = {}, 1, 0
  while args[i] ~= nil do
    local word, taken = args[i], 3
    if OPTIONS[word] or OPTIONS[upper(word)] then
      taken = 2
    else
      s = s + 1
      if lower(word) == 'policy' then taken = 2 end
      if one_argument(word) then taken = 0 end
    end
    if taken == 0 then
      local err = push_spec_words(word, words)
      if err then return nil, err, s end
      i = i + 1
    else
      for k = i, i + taken - 1 do
        if args[k] ~= nil then words[#words + 1] = args[k] end
      end
      i = i + taken
    end
  end
  return words
end

-- CHECKALL: one spec per key, `algorithm limit period [BURST c] [BLOCK d]` each (BURST and
-- BLOCK in any order, each once), the last one followed by the shared COST and AT (the last spec
-- and the options parse exactly as CHECK's). An error in a spec names it and its key. Returns
-- specs, cost, at, blocks (BLOCK's duration per spec, false: none) or nil, error message.
local function parse_checkall(keys, args, name)
  local n = #keys
  if n == 0 then return nil, E_NUMKEYS end
  if #args > 0 then
    local words, err, s = checkall_words(args)
    if not words then
      if s > n then return nil, err end
      return nil, 'ERR limit spec ' .. s .. ' (key \'' .. keys[s] .. '\'): ' .. strsub(err, 5)
    end
    args = words
  end
  local total = n + #args
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
