-- The sliding window: the current window's count and the previous one's, weighted by the
-- part of the previous window still inside the last P ms.
local function sliding_window(st, spec, cost, now)
  local L, P = spec.L, spec.P
  local t, prev, curr = now, 0, 0
  if st then
    if st.last > t then t = st.last end
    -- The same window keeps both counts, the next one makes the current count the previous,
    -- any later one (or a changed period) starts afresh.
    if st.P == P then
      local w0, wt = window_start(st.last, P), window_start(t, P)
      if wt == w0 then
        curr, prev = st.a, st.b
      elseif wt == w0 + P then
        curr, prev = 0, st.a
      end
    end
  end
  local w = window_start(t, P)
  local e = t - w
  local LP = L * P
  local est = prev * (P - e) + curr * P -- the weighted estimate, scaled
  local allowed, retry = 0, 0
  if cost > L then
    retry = -1
  elseif est <= LP - cost * P then
    allowed = 1
    curr = curr + cost
    est = est + cost * P
  else
    -- The least d >= 1 that admits it: later in this window while prev decays...
    if prev > 0 and curr + cost <= L then
      local d = max(1, P - e - floor_div((L - curr - cost) * P, prev))
      if d < P - e then retry = d end
    end
    -- ...else in the next window (curr becomes the previous count), or the one after.
    if retry == 0 then
      if curr == 0 then
        retry = P - e
      else
        local e2 = max(0, P - floor_div((L - cost) * P, curr))
        if e2 < P then retry = P - e + e2 else retry = 2 * P - e end
      end
    end
  end
  local remaining = 0
  if est < LP then remaining = floor_div(LP - est, P) end
  local reset = 0
  if curr > 0 then
    reset = 2 * P - e
  elseif prev > 0 then
    reset = P - e
  end
  local reply = { allowed, L, remaining, retry, reset, 0 }
  return reply, t, curr, prev
end
