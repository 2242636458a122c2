-- The leaky bucket: `level`, the queue, scaled (one request is P); an admitted request waits
-- `delay` ms for the queue ahead of it to drain.
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
