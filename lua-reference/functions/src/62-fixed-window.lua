-- The fixed window: `count` in the window of t (windows of P ms from the epoch).
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
