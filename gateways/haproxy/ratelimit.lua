-- ratelimit: redis-ratelimit for HAProxy 2.6+ (Debian's haproxy; Lua 5.3 or 5.4, core.tcp).
-- A Lua file of yours, loaded with `lua-load` after `lua-prepend-path`, names the limits:
--
--   local ratelimit = require("ratelimit")
--   ratelimit.configure{ redis = "127.0.0.1:6379", timeout_ms = 50 }
--   ratelimit.rule("api", { key = "txn.api_key", limit = "sliding-window 100 1m" })
--
-- and haproxy.cfg applies them, the key computed into a variable by any sample expression:
--
--   http-request set-var-fmt(txn.api_key) "api:%[req.hdr(x-api-key)]"
--       if { req.hdr(x-api-key) -m found }
--   http-request lua.ratelimit api
--   http-response lua.ratelimit-headers
--
-- gateways/haproxy/README.md has the options and a complete haproxy.cfg. Load it with
-- `lua-load-per-thread` (a socket belongs to the thread that opened it): the connection pool and
-- the breaker are then per thread, and nothing is shared between threads or HAProxy processes.

local core_ = require("ratelimit_core")

local M = {}

local rules = {}
local limiter

local function now_ms()
  local t = core.now()
  return t.sec * 1000 + t.usec / 1000
end

local LEVELS = { err = "Alert", warn = "Warning", info = "Info" }
local function log(level, message)
  core[LEVELS[level] or "Alert"](message)
end

-- The breaker's store: a table of this Lua state.
local state, expires = {}, {}
local store = {
  get = function(_, name) return state[name] end,
  set = function(_, name, value) state[name] = value end,
  add = function(_, name, ttl_ms)
    local now = now_ms()
    if state[name] and expires[name] > now then return false end
    state[name], expires[name] = true, now + ttl_ms
    return true
  end,
}

-- Idle connections per server address, most recent last, in this thread's Lua state (a socket
-- belongs to the thread that opened it). An idle socket keeps IDLE_S as its timeout: HAProxy
-- closes a socket's stream after its timeout without traffic, so a pooled one waiting with a
-- call's short timeout would be closed within it. POOL_SIZE is above the calls a thread makes at
-- once under load: a call beyond it opens a connection and the next give-back closes one.
local POOL_SIZE = 128
local IDLE_S = 60
local pools = {}

-- A connection is HAProxy's socket itself (a Lua table: the core's receive and send go straight
-- to HAProxy's), with the fields the core and the pool need: rl_uses, rl_where, and
-- settimeout_ms and reused as functions.
-- From HAProxy 2.8 a socket's read times out at its last read plus its timeout (2.6: at each
-- wait plus its timeout), and 3.0 aborts (SIGILL, a BUG_ON in sc_notify) on a socket whose
-- expiry has passed when it sends: a pooled socket idle longer than a call's timeout, given
-- that timeout, kills HAProxy. There the first timeout of a call on a connection counts from
-- the connection's last read (rl_read_at, set when it is given back), so that it ends at the
-- call's deadline as on 2.6.
local major, minor = string.match(core.get_info().Version or "", "^(%d+)%.(%d+)")
local FROM_LAST_READ = major ~= nil and (tonumber(major) * 100 + tonumber(minor)) >= 208
local function settimeout_ms(sock, ms)
  local at = sock.rl_read_at
  if at then
    sock.rl_read_at = nil
    ms = ms + now_ms() - at + 1
  end
  sock:settimeout(ms / 1000)
end
local function reused(sock) return sock.rl_uses end

local env = {
  now_ms = now_ms,
  log = log,
  store = store,
  defaults = {},
  connect = function(o, timeout_ms, fresh)
    local where = core_.connection_key(o)
    local pool = pools[where]
    if pool and pool[1] and not fresh then
      local sock = pool[#pool]
      pool[#pool] = nil
      sock.rl_uses = sock.rl_uses + 1
      return sock
    end
    local sock = core.tcp()
    sock:settimeout(timeout_ms / 1000)
    local ok, err = sock:connect(o.redis.host, o.redis.port)
    if not ok then return nil, "connect: " .. tostring(err) end
    sock.rl_uses, sock.rl_where = 0, where
    sock.settimeout_ms, sock.reused = settimeout_ms, reused
    return sock
  end,
  keep = function(sock)
    local pool = pools[sock.rl_where]
    if not pool then
      pool = {}
      pools[sock.rl_where] = pool
    end
    if #pool < POOL_SIZE then
      sock:settimeout(IDLE_S)
      if FROM_LAST_READ then sock.rl_read_at = now_ms() end
      pool[#pool + 1] = sock
    else
      sock:close()
    end
  end,
  close = function(sock) sock:close() end,
}

local function read_file(path)
  local file, err = io.open(path, "rb")
  if not file then return nil, err end
  local text = file:read("*a")
  file:close()
  return text
end

--- Options under every rule's (redis, timeout_ms, on_error, engine, prefix,
--- breaker_cooldown_ms, password), and library = the path of the Functions library's file,
--- loaded into servers that have neither the module nor the library. A mistake stops HAProxy
--- from starting, with the message.
function M.configure(opts)
  local defaults, code = core_.configuration(opts, read_file)
  if not defaults then error(code, 2) end
  if code then env.library_code = code end
  env.defaults = defaults
  if limiter then limiter.defaults = defaults end
end

local function key_source(key, where)
  if type(key) == "function" then return key end
  if type(key) ~= "string" or not key:match("^[a-z]+%.[A-Za-z0-9_.]+$") then
    error(string.format("ratelimit.rule: %s: key must name a variable (\"txn.api_key\", set by "
      .. "http-request set-var) or be a function(txn), not %s", where, tostring(key)), 3)
  end
  return function(txn) return txn:get_var(key) end
end

--- Names a limit for `http-request lua.ratelimit <name>`: the options of the NGINX module's
--- limit{} (limit or policy [+ fallback], or limits = {...} for CHECKALL, name, cost, and any
--- option of configure), with each key the name of a variable or a function(txn).
function M.rule(name, opts)
  if type(name) ~= "string" or not name:match("^[A-Za-z0-9_.%-]+$") then
    error("ratelimit.rule: the name must be a token of A-Z, a-z, 0-9, '_', '-', '.'", 2)
  end
  if rules[name] then error("ratelimit.rule: '" .. name .. "' is defined twice", 2) end
  if type(opts) ~= "table" then error("ratelimit.rule: '" .. name .. "' takes a table", 2) end
  -- Checked now (with a stand-in key), so that a mistake stops HAProxy from starting.
  local probe, sources = {}, {}
  for k, v in pairs(opts) do probe[k] = v end
  if opts.limits then
    probe.limits = {}
    for i, entry in ipairs(opts.limits) do
      local copy = {}
      for k, v in pairs(type(entry) == "table" and entry or {}) do copy[k] = v end
      sources[i] = key_source(copy.key, string.format("'%s' limits[%d]", name, i))
      copy.key = "k"
      probe.limits[i] = copy
    end
  else
    sources[1] = key_source(opts.key, "'" .. name .. "'")
    probe.key = "k"
  end
  local merged = {}
  for k, v in pairs(env.defaults) do merged[k] = v end
  local ok, err = core_.options(probe, merged)
  if not ok then error("ratelimit.rule: '" .. name .. "': " .. err, 2) end
  rules[name] = { opts = probe, sources = sources }
end

local function the_limiter()
  if not limiter then limiter = core_.new(env) end
  return limiter
end

-- The rule's plan (its options checked and encoded once, again if configure changed them).
local function plan_of(rule, lim)
  if rule.plan and rule.plan_under == lim.defaults then return rule.plan end
  local plan, err = lim:plan(rule.opts)
  if not plan then return nil, err end
  rule.plan, rule.plan_under = plan, lim.defaults
  return plan
end

local function action(txn, name)
  local rule = rules[name]
  local lim = the_limiter()
  if not rule then
    lim:once("err", "ratelimit: http-request lua.ratelimit " .. tostring(name)
      .. ": no such rule (ratelimit.rule(\"" .. tostring(name) .. "\", {...}) in a lua-load file)")
    return txn:done(txn:reply{ status = 500, body = core_.CONFIG_BODY,
      headers = { ["content-type"] = { "application/json" } } })
  end
  local plan, err = plan_of(rule, lim)
  local result
  if plan then
    local sources, keys = rule.sources, {}
    for i = 1, #sources do keys[i] = sources[i](txn) end
    result = lim:decide_plan(plan, keys)
  else
    lim:once("err", "ratelimit: configuration: " .. err)
    result = { status = 500, headers = {}, body = core_.CONFIG_BODY }
  end
  if not result then return end
  if result.status == 200 then
    if result.headers[1] then txn:set_priv(result.headers) end
    return
  end
  local headers = { ["content-type"] = { "application/json" } }
  for _, h in ipairs(result.headers) do headers[h[1]] = { h[2] } end
  return txn:done(txn:reply{ status = result.status, headers = headers, body = result.body })
end

core.register_action("ratelimit", { "http-req" }, action, 1)

core.register_action("ratelimit-headers", { "http-res" }, function(txn)
  local headers = txn:get_priv()
  if type(headers) ~= "table" then return end
  for i = 1, #headers do txn.http:res_set_header(headers[i][1], headers[i][2]) end
end, 0)

return M
