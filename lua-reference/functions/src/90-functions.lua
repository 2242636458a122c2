-- The functions' bodies: arguments parsed, keys loaded, decided, stored, answered.

local function check(name, keys, args, commit)
  if #keys ~= 1 then return redis.error_reply(one_key(name)) end
  local words, werr = call_words(args)
  if not words then return redis.error_reply(werr) end
  local spec, cost, at, _, block = parse_check(words, 1)
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
  local words, werr = call_words(args)
  if not words then return redis.error_reply(werr) end
  local spec, cost, at, cost_given = parse_check(words, 1)
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
    local reset_after = 0
    if top[2] and top[2] + 0 > t then reset_after = top[2] - t end
    return {
      status('algorithm'), status(CC), status('limit'), st.L, status('lease_ms'), st.P,
      status('remaining'), max(0, st.L - held), status('reset_after_ms'), reset_after,
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
