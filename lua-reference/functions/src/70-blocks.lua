-- Blocks (BLOCK duration, the module's core/src/algorithms/block.rs). A consuming call the
-- algorithm rejects (a cost it can ever admit) with BLOCK d, on a stored key, blocks the key until
-- t + d; until then every call is rejected and changes nothing. The block's end may pass 2^53
-- (t just below it): it is kept in decimal too, and the time left computed exactly.

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
