-- REFUND: up to COST given back to what earlier calls consumed, at the refund's time.

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
  local seen = 0
  local gap, count, nxt, newest -- the record holding the keep-th entry
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
