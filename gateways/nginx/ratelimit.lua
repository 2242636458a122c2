-- ratelimit: redis-ratelimit for NGINX (Debian's nginx with libnginx-mod-http-lua, or OpenResty).
-- From access_by_lua_block:
--
--   require("ratelimit").limit{ key = ngx.var.http_x_api_key, limit = "sliding-window 100 1m" }
--
-- and header_filter_by_lua_block { require("ratelimit").headers() } to put the RateLimit fields
-- on the responses it admits. gateways/nginx/README.md has the options and a complete nginx.conf.
-- The calls go over cosockets (non-blocking), pooled with setkeepalive; the breaker lives in the
-- shared dict `lua_shared_dict ratelimit 1m`, so all workers share it.

local core = require("ratelimit_core")

local M = {}

local DICT = "ratelimit"
local KEEPALIVE_MS = 60000

local function log(level, message)
  local levels = { err = ngx.ERR, warn = ngx.WARN, info = ngx.NOTICE }
  ngx.log(levels[level] or ngx.ERR, message)
end

-- The breaker's store: the shared dict (all workers), else, said once, this worker's own table.
local function store()
  local dict = ngx.shared[DICT]
  if dict then
    return {
      get = function(_, name) return dict:get(name) end,
      set = function(_, name, value) dict:set(name, value) end,
      add = function(_, name, ttl_ms) return (dict:add(name, true, ttl_ms / 1000)) end,
    }
  end
  log("err", "ratelimit: nginx.conf has no `lua_shared_dict " .. DICT .. " 1m;` in its http "
    .. "block: each worker keeps its own breaker")
  local own, expires = {}, {}
  return {
    get = function(_, name) return own[name] end,
    set = function(_, name, value) own[name] = value end,
    add = function(_, name, ttl_ms)
      local now = ngx.now() * 1000
      if own[name] and expires[name] > now then return false end
      own[name], expires[name] = true, now + ttl_ms
      return true
    end,
  }
end

-- A connected cosocket in the shape the core reads from.
local Conn = {}
Conn.__index = Conn
function Conn:receive(pattern) return self.sock:receive(pattern) end
function Conn:send(data) return self.sock:send(data) end
function Conn:settimeout_ms(ms) self.sock:settimeout(ms) end
function Conn:reused() return self.sock:getreusedtimes() or 0 end

local env = {
  now_ms = function() return ngx.now() * 1000 end,
  log = log,
  defaults = {},
  connect = function(o, timeout_ms, fresh)
    local sock = ngx.socket.tcp()
    sock:settimeouts(timeout_ms, timeout_ms, timeout_ms)
    -- fresh: past the pool (its connection was dead), into a pool of its own name.
    local ok, err = sock:connect(o.redis.host, o.redis.port,
      fresh and { pool = o.redis.text .. "#fresh" } or nil)
    if not ok then return nil, "connect: " .. tostring(err) end
    return setmetatable({ sock = sock }, Conn)
  end,
  keep = function(conn) conn.sock:setkeepalive(KEEPALIVE_MS) end,
  close = function(conn) conn.sock:close() end,
}

local limiter

local function the_limiter()
  if not limiter then
    env.store = store()
    limiter = core.new(env)
  end
  return limiter
end

local function read_file(path)
  local file, err = io.open(path, "rb")
  if not file then return nil, err end
  local text = file:read("*a")
  file:close()
  return text
end

--- Options under every call's, from init_by_lua_block (checked there, so a mistake stops nginx
--- from starting): redis, timeout_ms, on_error, engine, prefix, breaker_cooldown_ms, password,
--- and library = the path of the Functions library's file (lua-reference/functions/ratelimit.lua),
--- loaded into servers that have neither the module nor the library.
function M.configure(opts)
  if type(opts) ~= "table" then error("ratelimit.configure takes a table of options", 2) end
  local defaults = {}
  for k, v in pairs(opts) do
    if k ~= "library" then defaults[k] = v end
  end
  local probe = {}
  for k, v in pairs(defaults) do probe[k] = v end
  probe.limit = probe.limit or "fixed-window 1 1s"
  local ok, err = core.options(probe, {})
  if not ok then error("ratelimit.configure: " .. err, 2) end
  if opts.library ~= nil then
    if type(opts.library) ~= "string" then
      error("ratelimit.configure: library must be the path of the Functions library's file", 2)
    end
    local code, rerr = read_file(opts.library)
    if not code then
      error("ratelimit.configure: library = '" .. opts.library .. "': " .. rerr, 2)
    end
    if not code:find("^#!lua name=ratelimit") then
      error("ratelimit.configure: library = '" .. opts.library .. "' is not the Functions "
        .. "library (its first line is not #!lua name=ratelimit)", 2)
    end
    env.library_code = code
  end
  env.defaults = defaults
  if limiter then limiter.defaults = defaults end
end

--- Limits this request (access phase). Admitted: returns, the fields kept for headers(). Refused:
--- 429 with Retry-After, RateLimit-Policy, RateLimit and a JSON body. Redis unavailable:
--- on_error "open" admits without fields, "closed" answers 503. A mistake in the options: 500,
--- and the error log says which option.
function M.limit(opts)
  local result = the_limiter():decide(opts)
  if not result then return nil end
  if result.status == 200 then
    if result.headers[1] then ngx.ctx.ratelimit_headers = result.headers end
    return result
  end
  for _, h in ipairs(result.headers) do ngx.header[h[1]] = h[2] end
  ngx.status = result.status
  ngx.header["Content-Type"] = "application/json"
  ngx.header["Content-Length"] = #result.body
  ngx.print(result.body)
  return ngx.exit(ngx.HTTP_OK)
end

--- The RateLimit fields on an admitted response (header_filter_by_lua_block).
function M.headers()
  local headers = ngx.ctx.ratelimit_headers
  if not headers then return end
  for i = 1, #headers do ngx.header[headers[i][1]] = headers[i][2] end
end

return M
