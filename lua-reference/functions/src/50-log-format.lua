-- The sliding log's stored form, in the module's encoding: a binary header, then one record
-- per run of entries at the same ms, varint(gap << 1 | several) then varint(count - 2) if
-- several, the gap counted from the previous run (the first from `base`).
-- Records before `head` have left the window; they are reclaimed when they outweigh the live
-- ones, and a log under 128 bytes is rewritten whole.

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

-- The records. A view reads the stored records lazily (GETRANGE in growing chunks) and
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
