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
local sub = string.sub

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
-- A call that finds no round trip in flight leads: it takes every call queued meanwhile (itself
-- first), sends all their commands in one write on a pooled cosocket, reads all the replies
-- (whole, from as few receives as the kernel hands them in) and wakes each call with its own;
-- then it hands the lead to the first call queued during its round trip, which does the same.
-- Every call waits at most until its own deadline: a leader's socket times out at the leader's,
-- a queued call's semaphore at its own. A batch that fails fails each of its calls, and the
-- breaker counts it once.
local semaphore = require("ngx.semaphore")
local core_parse = core.parse

local channels = {} -- "host:port" -> { queue, leading, until_ms }
-- How long past its deadline a leader may keep the lead before it is deemed gone (its request
-- ended under it): the next call then leads.
local STALE_MS = 1000
local RECEIVE_MAX = 65536
-- Semaphores of calls that ended as they should (count back to 0), for the next calls.
local spare, spare_n = {}, 0

local function new_sema()
  if spare_n > 0 then
    local sema = spare[spare_n]
    spare[spare_n] = nil
    spare_n = spare_n - 1
    return sema
  end
  return semaphore.new()
end

-- Reads the replies of `jobs` (job.n each) into job.replies from `sock`; true, or nil and the
-- transport's error.
local function read_replies(sock, jobs, deadline, auth)
  local buf, pos = "", 1
  local function more()
    sock:settimeout(math.max(1, deadline - ngx.now() * 1000))
    local data, err = sock:receiveany(RECEIVE_MAX)
    if not data then return nil, err end
    buf = pos > #buf and data or sub(buf, pos) .. data
    pos = 1
    return true
  end
  -- One reply: the value, or nil and the error.
  local function reply()
    while true do
      local value, next_at, perr = core_parse(buf, pos)
      if next_at then
        pos = next_at
        return value
      end
      if perr then return nil, perr end
      local ok, err = more()
      if not ok then return nil, err end
    end
  end
  local auth_error
  if auth then
    local value, err = reply()
    if value == nil then return nil, err end
    -- Every call's first reply says it: the core logs it as a configuration error.
    if core.is_error(value) then auth_error = value end
  end
  for i = 1, #jobs do
    local job, replies = jobs[i], {}
    for k = 1, job.n do
      local value, err = reply()
      if value == nil then return nil, err end
      replies[k] = auth_error or value
    end
    job.replies = replies
  end
  return true
end

-- Sends the jobs' payloads in one write and reads their replies; true, or nil, the transport's
-- error and whether the connection came from the pool. fresh: past the pool (whose connection
-- was dead), into a pool of its own name.
local function attempt(o, jobs, deadline, fresh)
  local remaining = math.max(1, deadline - ngx.now() * 1000)
  local sock = ngx.socket.tcp()
  sock:settimeouts(remaining, remaining, remaining)
  local ok, err = sock:connect(o.redis.host, o.redis.port,
    fresh and { pool = o.redis.text .. "#fresh" } or nil)
  if not ok then return nil, "connect: " .. tostring(err) end
  local pooled = (sock:getreusedtimes() or 0) > 0
  local auth = o.password and not pooled
  local payload
  if #jobs == 1 and not auth then
    payload = jobs[1].payload
  else
    local parts = {}
    if auth then parts[1] = core.command({ "AUTH", o.password }) end
    for i = 1, #jobs do parts[#parts + 1] = jobs[i].payload end
    payload = table.concat(parts)
  end
  ok, err = sock:send(payload)
  if ok then ok, err = read_replies(sock, jobs, deadline, auth) end
  if not ok then
    sock:close()
    return nil, err, pooled
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

-- The lead goes to the first call still waiting in the queue, if any.
local function hand_over(ch)
  local queue = ch.queue
  for i = 1, #queue do
    local job = queue[i]
    if not job.gone then
      job.lead = true
      ch.until_ms = job.deadline + STALE_MS
      job.sema:post(1)
      return
    end
  end
  ch.queue = {}
  ch.leading = false
end

-- `me` leads: the queue (me among it) in one round trip, each call woken with its replies.
local function lead(o, ch, me)
  local batch = ch.queue
  ch.queue = {}
  local jobs = {}
  for i = 1, #batch do
    if not batch[i].gone then jobs[#jobs + 1] = batch[i] end
  end
  local ran, ok, err = pcall(flush, o, jobs, me.deadline)
  if not ran then ok, err = nil, "internal error: " .. tostring(ok) end
  for i = 1, #jobs do
    local job = jobs[i]
    if not ok then
      job.err = err
      -- The breaker counts a batch once: by its leader.
      job.counted = job ~= me
    end
    if job ~= me then job.sema:post(1) end
  end
  hand_over(ch)
end

local Pipe = {}
Pipe.__index = Pipe
function Pipe.reused() return 1 end

function Pipe:exchange(payload, n, deadline)
  local o = self.o
  local ch = channels[o.redis.text]
  if not ch then
    ch = { queue = {}, leading = false, until_ms = 0 }
    channels[o.redis.text] = ch
  end
  local job = { payload = payload, n = n, deadline = deadline }
  local queue = ch.queue
  queue[#queue + 1] = job
  local now = ngx.now() * 1000
  if ch.leading and now > ch.until_ms then
    log("err", "ratelimit: a pipeline to " .. o.redis.text .. " was left busy: resumed")
    ch.leading = false
  end
  if not ch.leading then
    ch.leading = true
    ch.until_ms = deadline + STALE_MS
    lead(o, ch, job)
  else
    local sema = new_sema()
    job.sema = sema
    local ok = sema:wait(math.max(0.001, (deadline - now) / 1000))
    if job.lead then
      if ok and ngx.now() * 1000 < deadline then
        lead(o, ch, job)
      else
        -- Too late to lead: the next one does.
        job.gone = true
        job.err = job.err or "timeout"
        hand_over(ch)
      end
    elseif not ok and not job.replies then
      -- Its deadline passed first: the call fails (its leader still reads its reply, if sent).
      job.gone = true
      return nil, "timeout"
    end
    if ok and spare_n < 64 then
      spare_n = spare_n + 1
      spare[spare_n] = sema
    end
  end
  if job.replies then return job.replies end
  return nil, job.err, job.counted
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
