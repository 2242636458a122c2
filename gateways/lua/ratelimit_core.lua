-- ratelimit_core: what the NGINX and the HAProxy modules of redis-ratelimit share. It runs on
-- LuaJIT (lua-nginx-module) and on Lua 5.3/5.4 (HAProxy), and does no I/O of its own: the proxy's
-- module hands it a socket opener, a clock, a logger and a store for the breaker.
--
--   options  the call's table checked and compiled (limit specs parsed once per text)
--   RESP     commands written, replies read from a socket-like object (receive "*l" / n)
--   engine   the module's RATELIMIT.* commands, or the Functions library (FCALL ratelimit_*),
--            found on the first call and kept; the library loaded where it is missing; with the
--            module, each spec as one argument where it takes one (COMMAND INFO's arity -3)
--   breaker  after a failure, no call to Redis for `breaker_cooldown_ms`; then one probe
--   answer   status, the RateLimit-Policy / RateLimit / Retry-After fields and the body, as the
--            Python and Node packages' middleware send them (README "As HTTP headers")

local M = {}

local format, match, gmatch, lower, sub, byte, find = string.format, string.match,
  string.gmatch, string.lower, string.sub, string.byte, string.find
local concat, floor, max = table.concat, math.floor, math.max

M.LIBRARY_NAME = "ratelimit"

local ALGORITHMS = {
  ["token-bucket"] = true, ["leaky-bucket"] = true, ["fixed-window"] = true,
  ["sliding-window"] = true, ["sliding-log"] = true, ["gcra"] = true,
}
local UNITS = { [""] = 1, ms = 1, s = 1000, m = 60000, h = 3600000, d = 86400000 }
local NAME_PATTERN = "^[A-Za-z0-9_.%-]+$"

local function int(n) return format("%d", n) end

--- One word of a command as a RESP2 bulk string.
local function encode(word) return "$" .. #word .. "\r\n" .. word .. "\r\n" end
M.encode = encode

--- ms as whole seconds, rounded up.
function M.ceil_s(ms) return floor((ms + 999) / 1000) end

--- A period (`250ms`, `1s`, `15m`, `1h`, `1d`, or bare ms) in ms; nil if it is not one.
function M.period_ms(text)
  local digits, unit = match(lower(text), "^(%d+)(%a*)$")
  if not digits or not UNITS[unit] then return nil end
  local ms = tonumber(digits) * UNITS[unit]
  if ms < 1 then return nil end
  return ms
end

-- Limit specs, parsed once per distinct text.
local specs = {}

--- "sliding-window 100 1m [BURST n] [BLOCK d]" as { words = {...}, period_ms = n }, or nil and
--- what is wrong with it. The server checks the bounds (its ERR names the argument).
function M.parse_limit(text)
  local cached = specs[text]
  if cached then return cached end
  if type(text) ~= "string" then
    return nil, format("must be a string like \"sliding-window 100 1m\", not a %s", type(text))
  end
  local words = {}
  for word in gmatch(text, "%S+") do words[#words + 1] = word end
  if #words < 3 then
    return nil, format("'%s' must be \"algorithm limit period [BURST n] [BLOCK d]\"", text)
  end
  if not ALGORITHMS[lower(words[1])] then
    return nil, format("'%s': unknown algorithm '%s': expected token-bucket, leaky-bucket, "
      .. "fixed-window, sliding-window, sliding-log or gcra", text, words[1])
  end
  if not match(words[2], "^%d+$") then
    return nil, format("'%s': the limit '%s' must be an integer", text, words[2])
  end
  local period = M.period_ms(words[3])
  if not period then
    return nil, format("'%s': the period '%s' must be an integer of ms or with a unit ms, s, m, "
      .. "h or d (250ms, 1s, 15m, 1h, 1d)", text, words[3])
  end
  local i = 4
  while i <= #words do
    local option = lower(words[i])
    if option ~= "burst" and option ~= "block" then
      return nil, format("'%s': unknown option '%s': expected BURST or BLOCK", text, words[i])
    end
    if not words[i + 1] then return nil, format("'%s': %s needs a value", text, words[i]) end
    i = i + 2
  end
  local resp = {}
  for k = 1, #words do resp[k] = encode(words[k]) end
  -- The same as one argument (the module's arity -3 takes it): the words by single spaces.
  local spec = { words = words, period_ms = period, text = text, resp = concat(resp),
    nwords = #words, one_resp = encode(concat(words, " ")) }
  specs[text] = spec
  return spec
end

-- Options --------------------------------------------------------------------------------------

M.DEFAULTS = {
  redis = "127.0.0.1:6379",
  timeout_ms = 50,
  on_error = "open",
  engine = "auto",
  prefix = "fn:",
  breaker_cooldown_ms = 1000,
  cost = 1,
}

local function positive_int(value)
  return type(value) == "number" and value >= 0 and value == floor(value)
end

local addresses = {}
local function address(text)
  local cached = addresses[text]
  if cached then return cached end
  local host, port = match(text, "^%[?([^%]]*)%]?:(%d+)$")
  if not host or host == "" or tonumber(port) < 1 or tonumber(port) > 65535 then
    return nil
  end
  cached = { host = host, port = tonumber(port), text = text,
    open_until = "open_until " .. text, probe = "probe " .. text, by_password = {} }
  addresses[text] = cached
  return cached
end

--- One limit of a call: { key, spec (inline, or a policy's fallback), policy, name }, or nil and
--- what is wrong. `where` names it in messages ("limit", "limits[2]").
local function one_limit(entry, where, single)
  local limit, policy, fallback = entry.limit, entry.policy, entry.fallback
  local out = { key = entry.key }
  if out.key ~= nil and type(out.key) ~= "string" then
    return nil, format("%s: key must be a string (nil or \"\" leaves the request unlimited), "
      .. "not a %s", where, type(out.key))
  end
  if (limit == nil) == (policy == nil) then
    return nil, format("%s: give one of limit = \"algorithm limit period\" or policy = \"name\"",
      where)
  end
  if limit ~= nil then
    local spec, err = M.parse_limit(limit)
    if not spec then return nil, format("%s: limit %s", where, err) end
    out.spec = spec
  else
    if type(policy) ~= "string" or not match(policy, NAME_PATTERN) or #policy > 64 then
      return nil, format("%s: policy must be a name of 1 to 64 A-Z, a-z, 0-9, '_', '-', '.', "
        .. "not %s", where, tostring(policy))
    end
    out.policy = policy
    if fallback ~= nil then
      local spec, err = M.parse_limit(fallback)
      if not spec then return nil, format("%s: fallback %s", where, err) end
      out.spec = spec
    end
  end
  local name = entry.name
  if name == nil then
    name = policy or (single and "default") or nil
    if not name then
      return nil, format("%s: name is needed with several limits (the name of its item in the "
        .. "RateLimit fields)", where)
    end
  end
  if type(name) ~= "string" or not match(name, NAME_PATTERN) then
    return nil, format("%s: name must be a token of A-Z, a-z, 0-9, '_', '-' and '.', not %s",
      where, tostring(name))
  end
  out.name = name
  return out
end

--- The call's options checked, with the module's defaults under them: a table
--- { limits = {...}, cost, redis = {host, port}, timeout_ms, on_error, ... } or nil and the
--- message naming the option at fault.
function M.options(opts, defaults)
  if type(opts) ~= "table" then return nil, "takes a table of options" end
  local o = {}
  for _, field in ipairs({ "redis", "timeout_ms", "on_error", "engine", "prefix",
    "breaker_cooldown_ms", "cost", "password" }) do
    local value = opts[field]
    if value == nil then value = defaults[field] end
    if value == nil then value = M.DEFAULTS[field] end
    o[field] = value
  end
  if type(o.redis) ~= "string" then return nil, "redis must be \"host:port\"" end
  local redis = address(o.redis)
  if not redis then
    return nil, format("redis must be \"host:port\" (an IP address: the proxy resolves no names "
      .. "there), not '%s'", o.redis)
  end
  o.redis = redis
  if not positive_int(o.timeout_ms) or o.timeout_ms < 1 then
    return nil, format("timeout_ms must be a whole number of ms, at least 1, not %s",
      tostring(o.timeout_ms))
  end
  if o.on_error ~= "open" and o.on_error ~= "closed" then
    return nil, format("on_error must be \"open\" or \"closed\", not %s", tostring(o.on_error))
  end
  if o.engine ~= "auto" and o.engine ~= "module" and o.engine ~= "library" then
    return nil, format("engine must be \"auto\", \"module\" or \"library\", not %s",
      tostring(o.engine))
  end
  if type(o.prefix) ~= "string" then return nil, "prefix must be a string" end
  if not positive_int(o.breaker_cooldown_ms) then
    return nil, format("breaker_cooldown_ms must be a whole number of ms, not %s",
      tostring(o.breaker_cooldown_ms))
  end
  if not positive_int(o.cost) then
    return nil, format("cost must be a whole number from 0, not %s", tostring(o.cost))
  end
  if o.password ~= nil and type(o.password) ~= "string" then
    return nil, "password must be a string"
  end
  local limits = {}
  if opts.limits ~= nil then
    if opts.limit ~= nil or opts.policy ~= nil or opts.key ~= nil then
      return nil, "give either limits = { {key=..., limit=...}, ... } or key with limit/policy, "
        .. "not both"
    end
    if type(opts.limits) ~= "table" or #opts.limits == 0 then
      return nil, "limits must be a non-empty list of { key = ..., limit = ... | policy = ... }"
    end
    local names = {}
    for i, entry in ipairs(opts.limits) do
      if type(entry) ~= "table" then
        return nil, format("limits[%d] must be a table { key = ..., limit = ... }", i)
      end
      local one, err = one_limit(entry, format("limits[%d]", i), false)
      if not one then return nil, err end
      if names[one.name] then
        return nil, format("limits[%d]: name '%s' is given twice", i, one.name)
      end
      names[one.name] = true
      limits[i] = one
    end
  else
    local one, err = one_limit(opts, "limit", true)
    if not one then return nil, err end
    limits[1] = one
  end
  o.limits = limits
  return o
end

-- RESP -----------------------------------------------------------------------------------------

--- A command as RESP2 (an array of bulk strings).
function M.command(words)
  local out = { "*", int(#words), "\r\n" }
  for i = 1, #words do out[#out + 1] = encode(words[i]) end
  return concat(out)
end

local ERROR_MT = {}
--- Whether a reply is an error reply ({ message = "ERR ..." }).
function M.is_error(value) return getmetatable(value) == ERROR_MT end

-- The reply whose first line `line` has been read from `sock` (as read_reply).
local function read_value(sock, line)
  local kind, rest = byte(line, 1), sub(line, 2)
  if kind == 58 then -- ':'
    local n = tonumber(rest)
    if not n then return nil, "protocol error: integer " .. rest end
    return n
  elseif kind == 43 then -- '+'
    return rest
  elseif kind == 45 then -- '-'
    return setmetatable({ message = rest }, ERROR_MT)
  elseif kind == 36 then -- '$'
    local n = tonumber(rest)
    if not n then return nil, "protocol error: bulk " .. rest end
    if n < 0 then return false end
    local data, derr = sock:receive(n + 2)
    if not data then return nil, derr end
    return sub(data, 1, n)
  elseif kind == 42 then -- '*'
    local n = tonumber(rest)
    if not n then return nil, "protocol error: array " .. rest end
    if n < 0 then return false end
    local out = {}
    for i = 1, n do
      local item, ierr = sock:receive("*l")
      if not item then return nil, ierr end
      local value
      if byte(item, 1) == 58 then
        -- An integer, a decision's every item: read here, without a call per item.
        value = tonumber(sub(item, 2))
        if not value then return nil, "protocol error: integer " .. sub(item, 2) end
      else
        local verr
        value, verr = read_value(sock, item)
        if value == nil then return nil, verr end
      end
      out[i] = value
    end
    return out
  end
  return nil, "protocol error: unexpected reply " .. line
end

--- Reads one RESP2 reply from `sock` (its `receive("*l")` and `receive(n)`): a number, a string,
--- a table (array), false (nil bulk or array), or an error reply; nil and the transport's error
--- (timeout, closed) when the socket fails.
function M.read_reply(sock)
  local line, err = sock:receive("*l")
  if not line then return nil, err end
  return read_value(sock, line)
end

--- Reads one RESP2 reply from the string `buf` at `pos`, whole: the reply (as read_reply gives
--- it) and the position after it; nil when `buf` ends before the reply does (more to receive);
--- nil, nil and a message for what is no RESP.
--- The common reply, a decision's six integers ("*6\r\n:1\r\n:100\r\n..." from pos), as an array
--- and the position after it; nil for anything else (then the general reader reads it). Two
--- ways of the same: one match under Lua 5.3 (C does the work), bytes under LuaJIT (compiled,
--- no string made per integer).
local SIX = "^%*6\r\n" .. string.rep(":(%-?%d+)\r\n", 6) .. "()"
function M.six_by_match(buf, pos)
  local a, b, c, d, e, f, at = match(buf, SIX, pos)
  if not a then return nil end
  return { tonumber(a), tonumber(b), tonumber(c), tonumber(d), tonumber(e), tonumber(f) }, at
end

function M.six_by_bytes(buf, pos)
  if byte(buf, pos + 2) ~= 13 or byte(buf, pos + 3) ~= 10 then return nil end
  local out, i = { 0, 0, 0, 0, 0, 0 }, pos + 4
  for k = 1, 6 do
    if byte(buf, i) ~= 58 then return nil end -- ':'
    i = i + 1
    local c = byte(buf, i)
    local negative = c == 45 -- '-'
    if negative then
      i = i + 1
      c = byte(buf, i)
    end
    local from, n = i, 0
    while c and c >= 48 and c <= 57 do
      n = n * 10 + (c - 48)
      i = i + 1
      c = byte(buf, i)
    end
    if i == from or c ~= 13 or byte(buf, i + 1) ~= 10 then return nil end
    -- Beyond 15 digits a double sums them inexactly: as tonumber reads them.
    if i - from > 15 then n = tonumber(sub(buf, from, i - 1)) end
    out[k] = negative and -n or n
    i = i + 2
  end
  return out, i
end

local six = jit and M.six_by_bytes or M.six_by_match
local function parse(buf, pos)
  if byte(buf, pos + 1) == 54 and byte(buf, pos) == 42 then -- "*6": a decision, most likely
    local value, at = six(buf, pos)
    if value then return value, at end
  end
  local e = find(buf, "\r\n", pos, true)
  if not e then return nil end
  local kind = byte(buf, pos)
  if kind == 58 then -- ':'
    local n = tonumber(sub(buf, pos + 1, e - 1))
    if not n then return nil, nil, "protocol error: integer " .. sub(buf, pos + 1, e - 1) end
    return n, e + 2
  elseif kind == 42 then -- '*'
    local n = tonumber(sub(buf, pos + 1, e - 1))
    if not n then return nil, nil, "protocol error: array " .. sub(buf, pos + 1, e - 1) end
    if n < 0 then return false, e + 2 end
    local out, at = {}, e + 2
    for i = 1, n do
      local value, next_at, err = parse(buf, at)
      if next_at == nil then return nil, nil, err end
      out[i], at = value, next_at
    end
    return out, at
  elseif kind == 36 then -- '$'
    local n = tonumber(sub(buf, pos + 1, e - 1))
    if not n then return nil, nil, "protocol error: bulk " .. sub(buf, pos + 1, e - 1) end
    if n < 0 then return false, e + 2 end
    if #buf < e + 3 + n then return nil end
    return sub(buf, e + 2, e + 1 + n), e + 4 + n
  elseif kind == 43 then -- '+'
    return sub(buf, pos + 1, e - 1), e + 2
  elseif kind == 45 then -- '-'
    return setmetatable({ message = sub(buf, pos + 1, e - 1) }, ERROR_MT), e + 2
  end
  return nil, nil, "protocol error: unexpected reply " .. sub(buf, pos, e - 1)
end
M.parse = parse

-- Decisions and the HTTP answer ----------------------------------------------------------------


--- Six integers as a decision table; nil if the reply is not one.
function M.decision(reply)
  if type(reply) ~= "table" then return nil end
  local a, l, r, retry, reset, delay = reply[1], reply[2], reply[3], reply[4], reply[5], reply[6]
  if type(a) ~= "number" or type(l) ~= "number" or type(r) ~= "number"
    or type(retry) ~= "number" or type(reset) ~= "number" or type(delay) ~= "number" then
    return nil
  end
  -- One constructor: the table made at its size at once.
  return { allowed = a == 1, limit = l, remaining = r, retry_after_ms = retry,
    reset_after_ms = reset, delay_ms = delay }
end

--- The answer to the decisions of one request: { status, headers = { {name, value}, ... },
--- body } where `limits` is { {name, period_ms, decision}, ... } and `overall` the decision that
--- admits or refuses (default the only limit's). As README "As HTTP headers": RateLimit-Policy
--- `"name";q=<limit>;w=<period s>` per limit (no `w` where the period is unknown), RateLimit
--- `"name";r=<remaining>;t=<s>` (t from reset_after_ms admitted, retry_after_ms refused; no item
--- where it never can, -1), and on a 429 Retry-After from the overall decision unless -1.
function M.answer(limits, overall)
  overall = overall or limits[1][3]
  local policies, items = {}, {}
  local refused_by
  for i = 1, #limits do
    local name, period_ms, d = limits[i][1], limits[i][2], limits[i][3]
    local item = '"' .. name .. '";q=' .. int(d.limit)
    if period_ms and period_ms > 0 then item = item .. ";w=" .. int(M.ceil_s(period_ms)) end
    policies[#policies + 1] = item
    local wait = d.allowed and d.reset_after_ms or d.retry_after_ms
    if wait >= 0 then
      items[#items + 1] = '"' .. name .. '";r=' .. int(d.remaining) .. ";t=" .. int(M.ceil_s(wait))
    end
    if not d.allowed and not refused_by then refused_by = name end
  end
  local headers = { { "RateLimit-Policy", concat(policies, ", ") } }
  if #items > 0 then headers[2] = { "RateLimit", concat(items, ", ") } end
  if overall.allowed then return { status = 200, headers = headers, decision = overall } end
  if overall.retry_after_ms >= 0 then
    headers[#headers + 1] = { "Retry-After", int(M.ceil_s(overall.retry_after_ms)) }
  end
  return {
    status = 429,
    headers = headers,
    decision = overall,
    body = format('{"error": "rate limited", "policy": "%s", "retry_after_ms": %s}',
      refused_by or limits[1][1], int(overall.retry_after_ms)),
  }
end

M.UNAVAILABLE_BODY = '{"error": "rate limiter unavailable"}'
--- The name of the connections (a pool, a channel) a call with options `o` may use: its
--- server's, and its password's, so a connection authenticated with one password never serves a
--- call configured with another.
--- Made once per server and password (the address's table keeps them), not per call.
function M.connection_key(o)
  local password, redis = o.password, o.redis
  if password == nil then return redis.text end
  local name = redis.by_password[password]
  if not name then
    name = redis.text .. "\0" .. password
    redis.by_password[password] = name
  end
  return name
end

M.CONFIG_BODY = '{"error": "rate limiter misconfigured"}'

-- The limiter ----------------------------------------------------------------------------------

local Limiter = {}
Limiter.__index = Limiter

--- A limiter over a proxy's I/O. `env`:
---   connect(o, timeout_ms, fresh) -> sock (receive, send, settimeout_ms, reused) or nil, err;
---                                 or a sock with exchange(payload, n, deadline) -> n replies
---                                 (the proxy pipelines, authenticates and pools itself)
---   keep(sock)                 -> give a healthy connection back to the pool
---   close(sock)
---   now_ms()                   -> a clock in ms
---   log(level, message)        -> level "err", "warn" or "info"
---   store                      -> get(name), set(name, value), add(name, ttl_ms) -> bool: the
---                                 breaker's state, shared as widely as the proxy allows
---   library_code               -> the Functions library's source, or nil (then a server
---                                 without module nor library is an error that says so)
---   defaults                   -> options under every call's
function M.new(env)
  local self = setmetatable({}, Limiter)
  self.env = env
  self.defaults = env.defaults or {}
  self.engines = {} -- server address -> "module" or "library", once known
  self.library_ready = {}
  self.one_arg = {} -- server address -> whether its module takes a spec as one argument, once known
  self.policies = {} -- name -> { at_ms, period_ms or false }
  self.said = {}
  return self
end

--- Logs `message` once per process (and per distinct text).
function Limiter:once(level, message)
  if self.said[message] then return end
  local n = (self.said.n or 0) + 1
  if n > 1000 then return end
  self.said.n = n
  self.said[message] = true
  self.env.log(level, message)
end

-- The breaker: one failure opens it for the cool-down; after it, one probe (the store's `add`).
-- (Per server: the store's names end with its address.) Whether it is open, and whether it was
-- (the call is the probe: its success closes it; a call that found it closed reads it no more).
function Limiter:breaker_open(o)
  local store = self.env.store
  local open_until = store:get(o.redis.open_until) or 0
  if open_until == 0 then return false, false end
  local now = self.env.now_ms()
  if now < open_until then return true end
  -- Cool-down over: one request probes; the others fail as during it until it answers.
  return not store:add(o.redis.probe, o.timeout_ms * 4), true
end

function Limiter:failed(o, err)
  local store = self.env.store
  local name = o.redis.open_until
  local was = store:get(name) or 0
  store:set(name, self.env.now_ms() + o.breaker_cooldown_ms)
  self.one_arg[o.redis.text] = nil -- asked again once it answers (it may be another server then)
  if was == 0 then
    self.env.log("warn", format("ratelimit: Redis %s unavailable (%s): no call to it for %d ms "
      .. "at a time until it answers; each limit fails as its on_error says", o.redis.text,
      tostring(err), o.breaker_cooldown_ms))
  end
end

-- A call answered; `probed`: it found the breaker open (it was the probe).
function Limiter:succeeded(o, probed)
  if not probed then return end
  local store = self.env.store
  local name = o.redis.open_until
  if (store:get(name) or 0) ~= 0 then
    store:set(name, 0)
    self.env.log("warn", format("ratelimit: Redis %s answers again", o.redis.text))
  end
end

-- Replies that say the server cannot serve now (loading, busy with a script, a replica that lost
-- its master or is read-only, out of memory): Redis unavailable, not a mistake of the caller.
local UNAVAILABLE = { LOADING = true, BUSY = true, MASTERDOWN = true, READONLY = true,
  TRYAGAIN = true, CLUSTERDOWN = true, OOM = true }
local function unavailable_reply(replies)
  for i = 1, #replies do
    local reply = replies[i]
    if getmetatable(reply) == ERROR_MT and UNAVAILABLE[match(reply.message, "^(%u+)")] then
      return reply.message
    end
  end
  return nil
end

-- One round trip: `commands` (word lists, or RESP text already) pipelined, their replies read,
-- every operation bounded by what is left of the deadline. Answers the replies, or nil, the
-- transport's error and whether the breaker has counted it already (a failed batch of NGINX's
-- pipeline counts once, for all the calls in it).
function Limiter:round_trip(sock, commands, deadline)
  local payload = {}
  for i = 1, #commands do
    local command = commands[i]
    payload[i] = type(command) == "string" and command or M.command(command)
  end
  return self:exchange(sock, concat(payload), #commands, deadline)
end

-- `payload` (RESP text of `n` commands) sent, the n replies read.
function Limiter:exchange(sock, payload, n, deadline)
  local replies, err, counted
  if sock.exchange then
    -- The proxy's own pipeline (NGINX: concurrent calls share one round trip).
    replies, err, counted = sock:exchange(payload, n, deadline)
  else
    replies, err = self:send_and_read(sock, payload, n, deadline)
  end
  if replies then
    local busy = unavailable_reply(replies)
    if busy then return nil, busy end
  end
  return replies, err, counted
end

function Limiter:send_and_read(sock, payload, n, deadline)
  local env = self.env
  sock:settimeout_ms(max(1, deadline - env.now_ms()))
  local ok, err = sock:send(payload)
  if not ok then return nil, err end
  local replies = {}
  for i = 1, n do
    if i > 1 then sock:settimeout_ms(max(1, deadline - env.now_ms())) end
    local reply, rerr = M.read_reply(sock)
    if reply == nil then return nil, rerr end
    replies[i] = reply
  end
  return replies
end

local function unknown_command(reply)
  return M.is_error(reply) and (match(reply.message, "^ERR unknown command") ~= nil)
end

local function function_not_found(reply)
  return M.is_error(reply) and match(lower(reply.message), "function not found") ~= nil
end

-- The call's limits with a key (`limits[i]` with `keys[i]`) and whether each uses its policy's
-- fallback (`fallback[i]`), as the words of the module's command (for messages).
local function module_command(o, limits, keys, fallback)
  local n = #limits
  local words
  if n == 1 then
    words = { "RATELIMIT.CHECK", keys[1] }
  else
    words = { "RATELIMIT.CHECKALL", int(n) }
    for i = 1, n do words[#words + 1] = keys[i] end
  end
  for i = 1, n do
    local l = limits[i]
    if fallback[i] or not l.policy then
      for _, w in ipairs(l.spec.words) do words[#words + 1] = w end
    else
      words[#words + 1] = "POLICY"
      words[#words + 1] = l.policy
    end
  end
  words[#words + 1] = "COST"
  words[#words + 1] = int(o.cost)
  return words
end

local NO_FALLBACK = {} -- no limit of the call uses a policy's fallback (never written)
local CHECK = encode("RATELIMIT.CHECK")
local CHECKALL = encode("RATELIMIT.CHECKALL")
local POLICY = encode("POLICY")
-- Whether the module takes a spec as one argument: its arity, -3 where it does (-4 before).
local COMMAND_INFO = M.command({ "COMMAND", "INFO", "RATELIMIT.CHECK" })
local ONE_ARG_ARITY = -3

-- The same as RESP, from the pieces the plan encoded once; `one`: each spec as one argument.
local function module_resp(plan, limits, keys, fallback, one)
  local n = #limits
  local l = limits[1]
  if n == 1 and not (l.policy and not fallback[1]) then
    -- The common call: one inline limit.
    local key = keys[1]
    if one then
      return l.check_head1 .. "$" .. #key .. "\r\n" .. key .. "\r\n" .. l.check_tail1
    end
    return l.check_head .. "$" .. #key .. "\r\n" .. key .. "\r\n" .. l.check_tail
  end
  local parts, count
  if n == 1 then
    parts, count = { "", CHECK, encode(keys[1]) }, 2
  else
    parts, count = { "", CHECKALL, encode(int(n)) }, 2 + n
    for i = 1, n do parts[#parts + 1] = encode(keys[i]) end
  end
  for i = 1, n do
    l = limits[i]
    if one then
      parts[#parts + 1] = (fallback[i] or not l.policy) and l.spec.one_resp or l.policy_one_resp
      count = count + 1
    elseif fallback[i] or not l.policy then
      parts[#parts + 1] = l.spec.resp
      count = count + l.spec.nwords
    else
      parts[#parts + 1] = l.policy_resp
      count = count + 2
    end
  end
  parts[#parts + 1] = plan.cost_resp
  parts[1] = "*" .. (count + 2) .. "\r\n"
  return concat(parts)
end

-- The library's FCALL for the call's limits (policies by their fallbacks), or nil and why not.
local function library_command(o, limits, keys)
  local n = #limits
  local words = { "FCALL", n == 1 and "ratelimit_check" or "ratelimit_checkall", int(n) }
  for i = 1, n do words[#words + 1] = o.prefix .. keys[i] end
  for i = 1, n do
    local l = limits[i]
    if not l.spec then
      return nil, format("ratelimit: policy '%s' on the Functions library: the library has no "
        .. "policies; give it a fallback = \"algorithm limit period\"", l.policy)
    end
    for _, w in ipairs(l.spec.words) do words[#words + 1] = w end
  end
  words[#words + 1] = "COST"
  words[#words + 1] = int(o.cost)
  return words
end

-- Makes sure the server has the Functions library (loading it where missing); true, or false and
-- a configuration error, or nil and a transport error.
function Limiter:ensure_library(o, sock, deadline)
  local where = o.redis.text
  if self.library_ready[where] then return true end
  local replies, err, counted = self:round_trip(sock,
    { { "FUNCTION", "LIST", "LIBRARYNAME", M.LIBRARY_NAME } }, deadline)
  if not replies then return nil, err, counted end
  local present = false
  if type(replies[1]) == "table" then
    for _, library in ipairs(replies[1]) do
      if type(library) == "table" then
        for k = 1, #library - 1, 2 do
          if library[k] == "library_name" and library[k + 1] == M.LIBRARY_NAME then
            present = true
          end
        end
      end
    end
  end
  if not present then
    local code = self.env.library_code
    if not code then
      return false, format("ratelimit: Redis %s has neither the module nor the Functions "
        .. "library '%s': load one (redis-cli -x FUNCTION LOAD < ratelimit.lua), or give the "
        .. "library's file as library = \"/path/to/ratelimit.lua\"", where, M.LIBRARY_NAME)
    end
    replies, err, counted = self:round_trip(sock, { { "FUNCTION", "LOAD", code } }, deadline)
    if not replies then return nil, err, counted end
    if M.is_error(replies[1]) and not match(replies[1].message, "already exists") then
      return false, format("ratelimit: FUNCTION LOAD of the library on %s: %s", where,
        replies[1].message)
    end
    self.env.log("warn", format("ratelimit: loaded the Functions library '%s' on %s "
      .. "(FUNCTION LOAD)", M.LIBRARY_NAME, where))
  end
  self.library_ready[where] = true
  return true
end

function Limiter:use(o, engine, why)
  local where = o.redis.text
  if self.engines[where] == engine then return end
  self.engines[where] = engine
  if engine == "module" then
    self.env.log("info", format("ratelimit: engine on %s: the module (RATELIMIT.* commands)",
      where))
  else
    self.env.log("info", format("ratelimit: engine on %s: the Functions library '%s' (FCALL "
      .. "ratelimit_*, keys prefixed '%s'): %s", where, M.LIBRARY_NAME, o.prefix, why))
  end
end

local POLICY_REFRESH_MS = 10000

local function unavailable(o)
  if o.on_error == "closed" then
    return { status = 503, headers = {}, body = M.UNAVAILABLE_BODY, source = "error" }
  end
  return { status = 200, headers = {}, source = "error" }
end

local function misconfigured() return { status = 500, headers = {}, body = M.CONFIG_BODY,
  source = "config" } end

-- Plans: a call's options checked once and what its commands need encoded once, kept per
-- distinct options (the keys apart, read per request).

-- The options that make a plan (a call's `key`s are not among them).
local PLAN_FIELDS = { "limit", "policy", "fallback", "name", "redis", "timeout_ms", "on_error",
  "engine", "prefix", "breaker_cooldown_ms", "cost", "password" }
local ENTRY_FIELDS = { "limit", "policy", "fallback", "name" }
local MAX_PLANS = 1000 -- distinct option sets kept (beyond: checked at each call)
local PER_TEXT = 8 -- option sets kept per limit text

local function snapshot(opts)
  local snap = {}
  for i = 1, #PLAN_FIELDS do snap[PLAN_FIELDS[i]] = opts[PLAN_FIELDS[i]] end
  if opts.limits ~= nil then
    snap.limits = {}
    for i, entry in ipairs(opts.limits) do
      local copy = {}
      for k = 1, #ENTRY_FIELDS do copy[ENTRY_FIELDS[k]] = entry[ENTRY_FIELDS[k]] end
      snap.limits[i] = copy
    end
  end
  return snap
end

-- Whether `opts` gives the options `snap` was taken of (keys aside).
local function same(snap, opts)
  for i = 1, #PLAN_FIELDS do
    local f = PLAN_FIELDS[i]
    if opts[f] ~= snap[f] then return false end
  end
  local limits, want = opts.limits, snap.limits
  if want == nil then return limits == nil end
  if type(limits) ~= "table" or #limits ~= #want or opts.key ~= nil then return false end
  for i = 1, #want do
    local entry, w = limits[i], want[i]
    if type(entry) ~= "table" then return false end
    for k = 1, #ENTRY_FIELDS do
      local f = ENTRY_FIELDS[k]
      if entry[f] ~= w[f] then return false end
    end
  end
  return true
end

-- The plan of checked options `o`: what each limit's command needs, encoded.
local function compile(o)
  local plan = { o = o, cost_resp = encode("COST") .. encode(int(o.cost)) }
  for i, l in ipairs(o.limits) do
    if l.policy then plan.has_policy = true end
    l.where = #o.limits == 1 and "limit" or format("limits[%d]", i)
    if l.policy then
      l.policy_resp = POLICY .. encode(l.policy)
      l.policy_one_resp = encode("POLICY " .. l.policy)
    end
    if l.spec then
      l.check_head = "*" .. (l.spec.nwords + 4) .. "\r\n" .. CHECK
      l.check_tail = l.spec.resp .. plan.cost_resp
      l.check_head1 = "*5\r\n" .. CHECK
      l.check_tail1 = l.spec.one_resp .. plan.cost_resp
    end
  end
  return plan
end

--- The plan of a call's options (checked as M.options checks them; kept per distinct options),
--- or nil and what is wrong with them.
function Limiter:plan(opts)
  if type(opts) ~= "table" then return nil, "takes a table of options" end
  if self.plans_under ~= self.defaults then
    self.plans, self.plans_n, self.plans_under = {}, 0, self.defaults
  end
  local limits = opts.limits
  local text = opts.limit or opts.policy
  if limits ~= nil then
    text = type(limits) == "table" and type(limits[1]) == "table"
      and (limits[1].limit or limits[1].policy) or nil
  end
  local kept = type(text) == "string" and self.plans[text]
  if kept then
    for i = 1, #kept do
      if same(kept[i].snap, opts) then return kept[i] end
    end
  end
  local o, err = M.options(opts, self.defaults)
  if not o then return nil, err end
  local plan = compile(o)
  if type(text) == "string" and self.plans_n < MAX_PLANS and (not kept or #kept < PER_TEXT) then
    plan.snap = snapshot(opts)
    if not kept then
      kept = {}
      self.plans[text] = kept
    end
    kept[#kept + 1] = plan
    self.plans_n = self.plans_n + 1
  end
  return plan
end

--- Decides a request. Answers nil when no limit applies (no key), else { status, headers, body,
--- source } where source is "module", "library", "error" (Redis unavailable: status 200 with no
--- headers when failing open, 503 closed) or "config" (a mistake in the configuration, logged:
--- status 500).
function Limiter:decide(opts)
  local plan, err = self:plan(opts)
  if not plan then
    self:once("err", "ratelimit: configuration: " .. err)
    return misconfigured()
  end
  local keys
  if opts.limits then
    keys = {}
    for i = 1, #plan.o.limits do keys[i] = opts.limits[i].key end
  else
    keys = { opts.key }
  end
  return self:decide_plan(plan, keys)
end

--- Decides a request by a plan (Limiter:plan) and the key of each of its limits (nil or "" for a
--- limit that does not apply): as decide.
function Limiter:decide_plan(plan, keys)
  local o = plan.o
  local all = o.limits
  local limits, with = all, keys
  for i = 1, #all do
    local key = keys[i]
    if key ~= nil and type(key) ~= "string" then
      self:once("err", format("ratelimit: configuration: %s: key must be a string (nil or \"\" "
        .. "leaves the request unlimited), not a %s", all[i].where, type(key)))
      return misconfigured()
    end
    if key == nil or key == "" then limits = nil end
  end
  if not limits then
    -- Some limits without a key: the others only.
    limits, with = {}, {}
    for i = 1, #all do
      local key = keys[i]
      if key ~= nil and key ~= "" then
        limits[#limits + 1] = all[i]
        with[#with + 1] = key
      end
    end
    if #limits == 0 then return nil end
  end
  local open, probed = self:breaker_open(o)
  if open then return unavailable(o) end

  local env = self.env
  local deadline = env.now_ms() + o.timeout_ms
  local sock, cerr = env.connect(o, o.timeout_ms)
  if not sock then
    self:failed(o, cerr)
    return unavailable(o)
  end
  local result, rerr, counted = self:run(plan, sock, limits, with, deadline)
  if result == nil and sock:reused() > 0 and rerr ~= "timeout" and not sock.exchange then
    -- A pooled connection the server closed meanwhile (a restart): once more on a new one.
    env.close(sock)
    sock, cerr = env.connect(o, math.max(1, deadline - env.now_ms()), true)
    if not sock then
      self:failed(o, cerr)
      return unavailable(o)
    end
    result, rerr, counted = self:run(plan, sock, limits, with, deadline)
  end
  if result == nil then
    env.close(sock)
    if not counted then self:failed(o, rerr) end
    return unavailable(o)
  end
  env.keep(sock)
  self:succeeded(o, probed)
  if result.config then
    self:once("err", result.config)
    return misconfigured()
  end
  return result
end

-- The call on a connected socket: an answer, { config = message }, or nil, a transport error and
-- whether the breaker counted it.
function Limiter:run(plan, sock, limits, keys, deadline)
  local o = plan.o
  local env = self.env
  local where = o.redis.text
  if o.password and sock:reused() == 0 and not sock.exchange then
    local replies, err = self:round_trip(sock, { { "AUTH", o.password } }, deadline)
    if not replies then return nil, err end
    if M.is_error(replies[1]) then
      return { config = format("ratelimit: AUTH on %s: %s", where, replies[1].message) }
    end
  end
  local engine = o.engine ~= "auto" and o.engine or self.engines[where] or "module"
  for _ = 1, 3 do
    if engine == "module" then
      local one = self.one_arg[where]
      local payload, n, gets, fallback = nil, 0, nil, NO_FALLBACK
      local now = plan.has_policy and env.now_ms() or 0
      for i = 1, plan.has_policy and #limits or 0 do
        local l = limits[i]
        if l.policy then
          if fallback == NO_FALLBACK then fallback = {} end
          local cached = self.policies[l.policy]
          if not cached or now - cached[1] >= POLICY_REFRESH_MS then
            gets = gets or {}
            payload = (payload or "") .. M.command({ "RATELIMIT.POLICY", "GET", l.policy })
            n = n + 1
            gets[#gets + 1] = l.policy
          end
          -- A policy the server lacks: its fallback, if it has one (the server says which).
          fallback[i] = cached and cached[2] == false and l.spec ~= nil
        end
      end
      local info
      if one == nil then
        -- The arity asked once, in the same round trip (this call goes as words).
        payload = (payload or "") .. COMMAND_INFO
        n = n + 1
        info = n
      end
      local check = module_resp(plan, limits, keys, fallback, one)
      payload = payload and payload .. check or check
      local replies, err, counted = self:exchange(sock, payload, n + 1, deadline)
      if not replies then return nil, err, counted end
      local reply = replies[n + 1]
      if info then
        -- [[name, arity, ...]]; [nil] without the command; an error, anything else: words.
        local command = replies[info]
        command = type(command) == "table" and command[1]
        self.one_arg[where] = type(command) == "table" and command[2] == ONE_ARG_ARITY
      end
      if n == 0 and type(reply) == "table" and getmetatable(reply) == nil then
        -- The common reply: no policy asked for, a decision (or CHECKALL's list), no error.
        if self.engines[where] ~= "module" then self:use(o, "module") end
        return self:answer(limits, reply, "module", fallback)
          or { config = format("ratelimit: Redis %s gave an unexpected reply to %s", where,
            concat(module_command(o, limits, keys, fallback), " ")) }
      end
      if unknown_command(replies[1]) or unknown_command(reply) then
        if o.engine == "module" then
          local said = unknown_command(reply) and reply or replies[1]
          return { config = format("ratelimit: engine = \"module\" but Redis %s has no "
            .. "module: %s", where, said.message) }
        end
        engine = "library"
      else
        for i = 1, gets and #gets or 0 do
          local def = replies[i]
          local period = false
          if type(def) == "table" then
            for k = 1, #def - 1, 2 do
              if def[k] == "period_ms" then period = def[k + 1] end
            end
          end
          self.policies[gets[i]] = { now, period }
          if period == false then
            local has_fallback = false
            for j = 1, #limits do
              if limits[j].policy == gets[i] and limits[j].spec then has_fallback = true end
            end
            if has_fallback then
              self:once("warn", format("ratelimit: Redis %s has no policy '%s': using its "
                .. "fallback", where, gets[i]))
            end
          end
        end
        if one and M.is_error(reply)
          and match(reply.message, "unknown algorithm '[^']* [^']*'") then
          -- Refused as an older module refuses a spec as one argument (a failover to one): words
          -- from now on, and this call again so.
          self.one_arg[where] = false
          self:once("warn", format("ratelimit: Redis %s does not take a limit spec as one "
            .. "argument (an older module: %s): sending the words from now on", where,
            reply.message))
        elseif M.is_error(reply) then
          local missing = match(reply.message, "no such policy '([^']*)'")
          local retry = false
          for j = 1, #limits do
            if missing and limits[j].policy == missing and limits[j].spec and not fallback[j] then
              self.policies[missing] = { now, false }
              retry = true
            end
          end
          if not retry then
            return { config = format("ratelimit: Redis %s answered %s to %s", where,
              reply.message, concat(module_command(o, limits, keys, fallback), " ")) }
          end
        else
          self:use(o, "module")
          return self:answer(limits, reply, "module", fallback)
            or { config = format("ratelimit: Redis %s gave an unexpected reply to %s", where,
              concat(module_command(o, limits, keys, fallback), " ")) }
        end
      end
    else
      local ok, err, counted = self:ensure_library(o, sock, deadline)
      if ok == nil then return nil, err, counted end
      if ok == false then return { config = err } end
      local command, why = library_command(o, limits, keys)
      if not command then return { config = why } end
      local replies, rerr, rcounted = self:round_trip(sock, { command }, deadline)
      if not replies then return nil, rerr, rcounted end
      local reply = replies[1]
      if function_not_found(reply) then
        self.library_ready[where] = nil -- flushed meanwhile: load it again, once
      elseif M.is_error(reply) then
        return { config = format("ratelimit: Redis %s answered %s to %s", where, reply.message,
          concat(command, " ")) }
      else
        self:use(o, "library", o.engine == "library" and "engine = \"library\""
          or "the server has no module")
        return self:answer(limits, reply, "library", NO_FALLBACK)
          or { config = format("ratelimit: Redis %s gave an unexpected reply to %s", where,
            concat(command, " ")) }
      end
    end
  end
  return { config = format("ratelimit: Redis %s: no engine answered", where) }
end

-- An integer as text: concatenated as it is where both Lua 5.3 (an integer) and LuaJIT (a double,
-- "%.14g") print it in full, else formatted.
local function digits(n)
  if n < 1e14 and n > -1e14 and n == floor(n) then return n end
  return int(n)
end

-- The answer to one limit's CHECK: the fields built with as few allocations as can be (the
-- RateLimit-Policy field kept with the limit for the limit and period it was built for).
local function answer_one(l, d, period, source)
  local limit = d.limit
  local policy = l.policy_field
  if not policy or l.policy_field_for ~= limit or l.policy_field_period ~= period then
    local text = '"' .. l.name .. '";q=' .. int(limit)
    if period and period > 0 then text = text .. ";w=" .. int(M.ceil_s(period)) end
    policy = { "RateLimit-Policy", text }
    l.policy_field, l.policy_field_for, l.policy_field_period = policy, limit, period
    l.remaining_prefix = '"' .. l.name .. '";r='
  end
  local allowed = d.allowed
  local wait = allowed and d.reset_after_ms or d.retry_after_ms
  if allowed then
    local headers
    if wait >= 0 then
      headers = { policy, { "RateLimit", l.remaining_prefix .. digits(d.remaining) .. ";t="
        .. digits(floor((wait + 999) / 1000)) } }
    else
      headers = { policy }
    end
    return { status = 200, headers = headers, decision = d, source = source }
  end
  local result = M.answer({ { l.name, period, d } })
  result.source = source
  return result
end

-- The HTTP answer to a CHECK or CHECKALL reply; nil if the reply is not one.
function Limiter:answer(limits, reply, source, fallback)
  local n = #limits
  if n == 1 then
    local d = M.decision(reply)
    if not d then return nil end
    local l = limits[1]
    local period = l.spec and l.spec.period_ms
    if l.policy and not fallback[1] and source == "module" then
      local cached = self.policies[l.policy]
      period = cached and cached[2] or nil
    end
    return answer_one(l, d, period, source)
  end
  local decisions, overall = {}, nil
  if n == 1 then
    decisions[1] = M.decision(reply)
  elseif type(reply) == "table" then
    overall = M.decision(reply[1])
    if not overall then return nil end
    for i = 1, n do decisions[i] = M.decision(reply[i + 1]) end
  end
  local items = {}
  for i = 1, n do
    local l = limits[i]
    if not decisions[i] then return nil end
    local period = l.spec and l.spec.period_ms
    if l.policy and not fallback[i] and source == "module" then
      local cached = self.policies[l.policy]
      period = cached and cached[2] or nil
    end
    items[i] = { l.name, period, decisions[i] }
  end
  local result = M.answer(items, overall)
  result.source = source
  return result
end

--- What configure{...} takes, checked: the options under every call's (each as a limit's
--- options are checked) and `library`, the path of the Functions library's file, read with
--- `read(path)` (text, or nil and the reason: the proxy's own I/O). Returns the defaults and the
--- library's code (nil without `library`), or nil and the message to raise.
function M.configuration(opts, read)
  if type(opts) ~= "table" then return nil, "ratelimit.configure takes a table of options" end
  local defaults, probe = {}, {}
  for k, v in pairs(opts) do
    if k ~= "library" then defaults[k], probe[k] = v, v end
  end
  probe.limit = probe.limit or "fixed-window 1 1s"
  local ok, err = M.options(probe, {})
  if not ok then return nil, "ratelimit.configure: " .. err end
  local library = opts.library
  if library == nil then return defaults, nil end
  if type(library) ~= "string" then
    return nil, "ratelimit.configure: library must be the path of the Functions library's file"
  end
  local code, rerr = read(library)
  if not code then
    return nil, "ratelimit.configure: library = '" .. library .. "': " .. tostring(rerr)
  end
  if not code:find("^#!lua name=ratelimit") then
    return nil, "ratelimit.configure: library = '" .. library .. "' is not the Functions "
      .. "library (its first line is not #!lua name=ratelimit)"
  end
  return defaults, code
end

return M
