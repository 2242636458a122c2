-- The sliding log: one entry per request (runs of them in records: 50-log-format), admitted
-- while the entries of the last P ms and the call's cost fit the limit.

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
