-- TAKE: CHECK's arguments with MAX n (required, 1 to 10^12) where CHECK takes COST. Grants
-- g = min(n, remaining) of a COST 0 PEEK (0 on a blocked key): the largest cost a CHECK admits,
-- as docs/algorithms.md ("Partial grants") shows; then it is that CHECK (of one unit when g is 0,
-- which is refused). The reply is the CHECK's with g in place of allowed.

-- CHECK's parser's words for TAKE's: MAX read as COST; COST itself is no option of TAKE.
local function take_words(args)
  local words, max_given = {}, false
  for k = 1, #args do words[k] = args[k] end
  for j = 4, #args, 2 do
    local word = upper(args[j])
    if word == 'MAX' then
      words[j], max_given = 'COST', true
    elseif word == 'COST' then
      local period = j == 4 and args[3] or nil
      return nil, unknown('option', E_TAKE_OPTION, args[j], period)
    end
  end
  return words, max_given
end

-- CHECK's parser's errors as TAKE's: its COST is TAKE's MAX.
local function take_error(msg)
  if msg == E_COST then return E_TAKE_MAX end
  if msg == 'ERR COST needs a value' then return 'ERR MAX needs a value' end
  if msg == 'ERR COST given more than once' then return 'ERR MAX given more than once' end
  local at = find(msg, E_OPTION, 1, true)
  if at then return strsub(msg, 1, at - 1) .. E_TAKE_OPTION .. strsub(msg, at + #E_OPTION) end
  return msg
end

local function take(keys, args)
  local name = 'ratelimit_take'
  if #keys ~= 1 then return redis.error_reply(one_key(name)) end
  local split, werr = call_words(args)
  if not split then return redis.error_reply(werr) end
  local words, max_given = take_words(split)
  if not words then return redis.error_reply(max_given) end
  local spec, n, at, _, block = parse_check(words, 1)
  if not spec then
    if n.arity then return redis.error_reply(arity(name)) end
    return redis.error_reply(take_error(n.msg))
  end
  if not max_given then return redis.error_reply(E_TAKE_MAX_MISSING) end
  if n == 0 then return redis.error_reply(E_TAKE_MAX) end
  local key = keys[1]
  local st, err = load(key)
  if err then return redis.error_reply(err) end
  local t = at or server_now()
  local peek
  peek, err = evaluate(key, st, spec, 0, t, false, block)
  if not peek then return redis.error_reply(err) end
  local granted = 0
  if peek[1] == 1 then granted = min(n, peek[3]) end
  -- A leaky bucket's delay_ms is the wait of the last granted unit: the queue ahead of it once
  -- the first granted - 1 are queued, the reset_after_ms of a PEEK of that cost now.
  local last_delay
  if spec.alg == LB and granted > 1 then
    local ahead
    ahead, err = evaluate(key, st, spec, granted - 1, t, false, block)
    if not ahead then return redis.error_reply(err) end
    last_delay = ahead[5]
  end
  local reply
  reply, err = evaluate(key, st, spec, max(granted, 1), t, true, block)
  if not reply then return redis.error_reply(err) end
  if last_delay and reply[1] == 1 then reply[6] = last_delay end
  reply[1] = granted
  return reply
end
