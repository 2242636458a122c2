-- Concurrency limits (leases), as the module's core/src/algorithms/concurrency.rs: at most
-- `limit` cost held at once, each lease (id, cost, expiry) held until it is released or expires. At
-- t = max(call, last): the live leases are those with expiry > t, `held` their cost. An acquire
-- of n under id is admitted if the other ids' live leases plus n fit the limit; it then stores
-- (id, n, t + lease-duration) (a new lease, or the id's live one renewed: cost replaced, expiry
-- moved), drops the expired leases and sets last = t. A rejected acquire and a release of no
-- live lease write nothing. The key is a sorted set (its layout: 55-state): its positive scores
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
