-- ratelimit: redis-ratelimit for NGINX (Debian's nginx with libnginx-mod-http-lua, or OpenResty).
-- From access_by_lua_block:
--
--   require("ratelimit").limit{ key = ngx.var.http_x_api_key, limit = "sliding-window 100 1m" }
--
-- and header_filter_by_lua_block { require("ratelimit").headers() } to put the RateLimit fields
-- on the responses it admits. gateways/nginx/README.md has the options and a complete nginx.conf.
-- The calls go over cosockets (non-blocking), pooled with setkeepalive, the concurrent calls of a
-- worker pipelined on one connection; the breaker lives in the shared dict
-- `lua_shared_dict ratelimit 1m`, so all workers share it.

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

-- The pipeline: the calls a worker makes to one server at the same time share a round trip.
-- The first call with none in flight sends its commands and reads its replies on a pooled
-- cosocket; calls that come meanwhile queue up, and when it is done a timer sends all of them in
-- one write and reads their replies in order (and again while more queue up). A batch that fails
-- fails each of its calls (the breaker then stops the next ones).
local semaphore = require("ngx.semaphore")

local channels = {} -- "host:port" -> { queue = {...}, busy = bool, until_ms = when it is stale }
-- How long past its calls' deadlines a batch may keep the pipeline before it is deemed gone.
local STALE_MS = 1000

-- A cosocket in the shape the core reads from.
local Raw = {}
Raw.__index = Raw
function Raw:receive(pattern) return self.sock:receive(pattern) end

-- Sends the jobs' payloads in one write and reads each job's replies into job.replies; true, or
-- nil, the transport's error (the connection is then closed) and whether it came from the pool.
-- fresh: past the pool (whose connection was dead), into a pool of its own name.
local function attempt(o, jobs, deadline, fresh)
  local remaining = math.max(1, deadline - ngx.now() * 1000)
  local sock = ngx.socket.tcp()
  sock:settimeouts(remaining, remaining, remaining)
  local ok, err = sock:connect(o.redis.host, o.redis.port,
    fresh and { pool = o.redis.text .. "#fresh" } or nil)
  if not ok then return nil, "connect: " .. tostring(err) end
  local pooled = (sock:getreusedtimes() or 0) > 0
  local auth = o.password and not pooled
  local parts = {}
  if auth then parts[1] = core.command({ "AUTH", o.password }) end
  for i = 1, #jobs do parts[#parts + 1] = jobs[i].payload end
  ok, err = sock:send(table.concat(parts))
  if not ok then
    sock:close()
    return nil, err, pooled
  end
  local raw = setmetatable({ sock = sock }, Raw)
  if auth then
    local reply, rerr = core.read_reply(raw)
    if reply == nil then
      sock:close()
      return nil, rerr, pooled
    end
    if core.is_error(reply) then
      -- Every job's first reply says it: the core logs it as a configuration error.
      for i = 1, #jobs do jobs[i].auth_error = reply end
    end
  end
  for i = 1, #jobs do
    local job, replies = jobs[i], {}
    for k = 1, job.n do
      sock:settimeout(math.max(1, deadline - ngx.now() * 1000))
      local reply, rerr = core.read_reply(raw)
      if reply == nil then
        sock:close()
        return nil, rerr, pooled
      end
      replies[k] = job.auth_error or reply
    end
    job.replies = replies
  end
  sock:setkeepalive(KEEPALIVE_MS)
  return true
end

-- attempt, and once more on a new connection when a pooled one turns out closed (a restart).
local function flush(o, jobs, deadline)
  local ok, err, pooled = attempt(o, jobs, deadline, false)
  if not ok and pooled and err ~= "timeout" then
    ok, err = attempt(o, jobs, deadline, true)
  end
  return ok, err
end

-- Flushes `jobs`, then wakes each of them but `own`.
local function serve(o, jobs, own)
  local deadline = 0
  for i = 1, #jobs do deadline = math.max(deadline, jobs[i].deadline) end
  local ran, ok, err = pcall(flush, o, jobs, deadline)
  if not ran then ok, err = nil, "internal error: " .. tostring(ok) end
  for i = 1, #jobs do
    local job = jobs[i]
    if not ok then job.err = err end
    if job ~= own then job.sema:post(1) end
  end
end

-- While calls are queued: one batch after another, in a timer (a request of its own).
local function drain(premature, o, ch)
  if premature then
    for _, job in ipairs(ch.queue) do
      job.err = "nginx is exiting"
      job.sema:post(1)
    end
    ch.queue, ch.busy = {}, false
    return
  end
  while ch.queue[1] do
    local jobs = ch.queue
    ch.queue = {}
    ch.until_ms = ngx.now() * 1000 + o.timeout_ms * 2 + STALE_MS
    serve(o, jobs, nil)
  end
  ch.busy = false
end

local Pipe = {}
Pipe.__index = Pipe
function Pipe.reused() return 1 end

function Pipe:exchange(payload, n, deadline)
  local o = self.o
  local ch = channels[o.redis.text]
  if not ch then
    ch = { queue = {}, busy = false }
    channels[o.redis.text] = ch
  end
  local job = { payload = payload, n = n, deadline = deadline }
  local now = ngx.now() * 1000
  -- A sender gone without finishing (its request ended under it): the next call sends.
  if ch.busy and now > ch.until_ms then
    log("err", "ratelimit: a pipeline to " .. o.redis.text .. " was left busy: resumed")
    ch.busy = false
  end
  if not ch.busy then
    ch.busy = true
    ch.until_ms = now + o.timeout_ms * 2 + STALE_MS
    serve(o, { job }, job)
    if ch.queue[1] then
      local ok, err = ngx.timer.at(0, drain, o, ch)
      if not ok then
        log("err", "ratelimit: no timer for the pipeline (" .. tostring(err) .. "): this "
          .. "request sends the queued calls")
        drain(false, o, ch)
      end
    else
      ch.busy = false
    end
  else
    job.sema = semaphore.new()
    ch.queue[#ch.queue + 1] = job
    local ok = job.sema:wait(math.max(0.001, (deadline - ngx.now() * 1000) / 1000))
    if not ok then return nil, "timeout" end
  end
  if job.replies then return job.replies end
  return nil, job.err
end

local env = {
  now_ms = function() return ngx.now() * 1000 end,
  log = log,
  defaults = {},
  connect = function(o) return setmetatable({ o = o }, Pipe) end,
  keep = function() end,
  close = function() end,
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
  local defaults, code = core.configuration(opts, read_file)
  if not defaults then error(code, 2) end
  if code then env.library_code = code end
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
