-- One limit on one key: CHECK and PEEK decide with the algorithm, then store what it decided
-- (ratelimit_checkall too, limit by limit).

local FIXED = {
  [TB] = token_bucket, [LB] = leaky_bucket, [FW] = fixed_window, [SW] = sliding_window,
  [GC] = gcra,
}

-- The view a decision reads: the state table, or the sliding log's view.
local function view_of(key, st)
  if st and st.alg == SL then return log_view(key, st) end
  return st
end

local function decide(alg, view, spec, cost, now)
  if alg == SL then return sliding_log(view, spec, cost, now) end
  return FIXED[alg](view, spec, cost, now)
end

-- The time a key's state becomes a fresh key's, without its block (decimal): what its expiry
-- would be (the module's expires_at_ms before the block's end is taken into account).
local function state_expiry(key, st)
  return fmt_sum(st.last, decide(st.alg, view_of(key, st), st, 0, st.last)[5])
end

-- CHECK (commit) or PEEK on a loaded key, with the call's BLOCK (ms, nil: none); returns the
-- reply, whether it wrote and whether the key's block decided it, or nil, error. A block is
-- written by the rejection that starts it; a consuming call after its end clears it.
local function evaluate(key, st, spec, cost, now, commit, block)
  if st and st.alg ~= spec.alg then return nil, mismatch(st.alg, spec.alg) end
  local view = view_of(key, st)
  local reply, t, a, b = decide(spec.alg, view, spec, cost, now)
  local left = st and block_left(st, t)
  if left then return blocked_answer(reply, left), false, true end
  if commit and cost > 0 then
    if reply[1] == 1 then
      if spec.alg == SL then
        log_write(key, st, a, spec, cost, t, reply[5])
      else
        redis.call('SET', key, encode_fixed(spec, a, b, t), 'PXAT', fmt_sum(t, reply[5]))
      end
      return reply, true
    end
    if block and st and reply[4] >= 0 then
      -- The key lives until its stored state (under its own parameters, not the call's) is
      -- fresh and the block has ended.
      local until_s = fmt_sum(t, block)
      reply = blocked_answer(reply, block)
      redis.call('SET', key, blocked_value(key, st, until_s), 'PXAT',
        later(state_expiry(key, st), until_s))
      return reply, true
    end
  end
  return reply, false
end
