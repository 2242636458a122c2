-- The fixed-size algorithms, one part each (docs/algorithms.md; the module's
-- core/src/algorithms/): (stored state or nil, spec, cost, now) -> reply, t, and the state to
-- store if the call consumes (a, and b for the sliding window). Each call is evaluated at
-- t = max(now, last). They read and write nothing: 75-one-limit stores what they decide.

-- The token bucket: `tokens`, scaled (one request is P).

local function token_bucket(st, spec, cost, now)
  local L, P, C = spec.L, spec.P, spec.C
  local full = C * P
  local t, tokens = now, full -- a missing key is a full bucket
  if st then
    if st.last > t then t = st.last end
    -- Refill under the stored parameters, min(C0*P0, tokens + (t - last)*L0), decided by
    -- comparison so that (t - last)*L0 is only formed when small.
    local full0, tok = st.C * st.P, st.a
    local elapsed = t - st.last
    if elapsed >= ceil_div(full0 - tok, st.L) then tok = full0 else tok = tok + elapsed * st.L end
    -- A full bucket is a fresh one; otherwise carried over in requests to the new period
    -- (rounded down) and clamped to the new capacity.
    if tok < full0 then
      if st.P == P then
        tokens = min(tok, full)
      else
        local whole = floor_div(tok, st.P)
        if whole >= C then
          tokens = full
        else
          tokens = min(whole * P + mul_div(tok - whole * st.P, P, st.P), full)
        end
      end
    end
  end
  local allowed, retry = 0, 0
  if cost > C then
    retry = -1
  elseif tokens >= cost * P then
    allowed = 1
    tokens = tokens - cost * P
  else
    retry = ceil_div(cost * P - tokens, L)
  end
  local reply = { allowed, C, floor_div(tokens, P), retry, ceil_div(full - tokens, L), 0 }
  return reply, t, tokens
end
