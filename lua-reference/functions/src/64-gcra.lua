-- GCRA: `ahead`, how far the theoretical arrival time (TAT) is ahead of t, scaled (L units per
-- ms, so one request is P units). With the same parameters it is the token bucket seen from the
-- other side (ahead = C*P - tokens); a parameter change keeps the TAT as a point in time.
local function gcra(st, spec, cost, now)
  local L, P, C = spec.L, spec.P, spec.C
  local tolerance = C * P
  local t, ahead = now, 0 -- a missing key: the TAT is not ahead
  -- far: the carried-over TAT is 2^53 units or more ahead (only after a raised limit), as
  -- ahead = u*L + w with 0 <= w <= L; such a TAT is beyond any tolerance (C*P < 2^53).
  local far, u, w = false, 0, 0
  if st then
    if st.last > t then t = st.last end
    -- Advance under the stored limit: max(0, ahead - (t - last)*L0), decided by comparison so
    -- that (t - last)*L0 is only formed when small.
    local a, L0 = st.a, st.L
    local elapsed = t - st.last
    if elapsed >= ceil_div(a, L0) then a = 0 else a = a - elapsed * L0 end
    -- 0 is a fresh key. Otherwise the same span of time in the new units, rounded up, never
    -- clamped: ceil(a*L/L0) = u*L + w with a = u*L0 + v and w = ceil(v*L/L0) <= L.
    if a > 0 then
      if L0 == L then
        ahead = a
      else
        u = floor_div(a, L0)
        local q, r = mul_div(a - u * L0, L, L0)
        w = q
        if r > 0 then w = w + 1 end
        ahead = u * L + w -- exact below 2^53, and 2^53 or more when the exact value is
        far = ahead >= EXACT
      end
    end
  end
  local allowed, retry, remaining = 0, 0, 0
  local reset
  if far then
    -- Rejected whatever the cost: retry when ahead - (C - c)*P units have passed, reset when
    -- ahead has; both in ms from u*L + w without forming it.
    if cost > C then
      retry = -1
    else
      local room = tolerance - cost * P
      if room >= w then retry = u - floor_div(room - w, L) else retry = u + 1 end
    end
    reset = u
    if w > 0 then reset = u + 1 end
    return { 0, C, 0, retry, reset, 0 }, t, ahead
  end
  if cost > C then
    retry = -1
  else
    local room = tolerance - cost * P -- ahead + c*P <= C*P admits
    if ahead <= room then
      allowed = 1
      ahead = ahead + cost * P
    else
      retry = ceil_div(ahead - room, L)
    end
  end
  if ahead < tolerance then remaining = floor_div(tolerance - ahead, P) end
  reset = ceil_div(ahead, L)
  return { allowed, C, remaining, retry, reset, 0 }, t, ahead
end
