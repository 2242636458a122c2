-- ratelimit: redis-ratelimit for NGINX (Debian's nginx with libnginx-mod-http-lua, or OpenResty).
-- From access_by_lua_block:
--
--   require("ratelimit").limit{ key = ngx.var.http_x_api_key, limit = "sliding-window 100 1m" }
--
-- and header_filter_by_lua_block { require("ratelimit").headers() } to put the RateLimit fields
-- on the responses it admits. gateways/nginx/README.md has the options and a complete nginx.conf.
-- The calls go over a cosocket (non-blocking) that a background timer of each worker holds open,
-- the worker's concurrent calls pipelined on that one connection; the breaker lives in the shared
-- dict `lua_shared_dict ratelimit 1m`, so all workers share it.

local core = require("ratelimit_core")
local sub, max, concat = string.sub, math.max, table.concat

local M = {}

local DICT = "ratelimit"

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

-- The pipeline: one connection per worker and server, held by a background timer (ngx.timer.at:
-- a cosocket opened there lives as long as the timer, across requests). A call queues its
-- command and waits on its own semaphore; the timer takes every call queued meanwhile, sends
-- all their commands in one write, reads all the replies (whole, from as few receives as the
-- kernel hands them in) and wakes each call with its own; then it takes the calls queued during
-- that round trip. Every call waits at most until its own deadline. A round trip that fails
-- fails each of its calls, and the breaker counts it once; the connection is then closed, and
-- the next round trip opens a new one (once more at once when a connection used before turns
-- out closed: a restart).
local semaphore = require("ngx.semaphore")
local core_parse = core.parse
local ok_clear, clear = pcall(require, "table.clear")
if not ok_clear then clear = function(t) for k in pairs(t) do t[k] = nil end end end

local channels = {} -- core.connection_key -> { queue, next, wake, idle, running, sock, used }
local RECEIVE_MAX = 65536
-- How long the timer waits for calls before it looks whether the worker is exiting.
local IDLE_WAIT_S = 1
-- Jobs (each with its semaphore) of calls that ended as they should, for the next calls: a job
-- whose call gave up at its deadline is left to the timer (it may still hold it) and not reused.
local spare, spare_n = {}, 0
local SPARE_MAX = 256

-- Reads the replies of `jobs` (job.n each) into job.replies from `sock`; true, or nil and the
-- transport's error. No closure per round trip: the buffer is refilled where a reply is cut.
local function read_replies(sock, jobs, deadline, auth)
  local buf, pos = "", 1
  local auth_error, auth_pending = nil, auth
  local i, k, job = 1, 1, jobs[1]
  local replies
  while job do
    local value, next_at, perr = core_parse(buf, pos)
    if next_at then
      pos = next_at
      if auth_pending then
        auth_pending = false
        -- Every call's first reply says it: the core logs it as a configuration error.
        if core.is_error(value) then auth_error = value end
      else
        if k == 1 then
          replies = {}
          job.replies = replies
        end
        replies[k] = auth_error or value
        if k < job.n then
          k = k + 1
        else
          i, k = i + 1, 1
          job = jobs[i]
        end
      end
    elseif perr then
      return nil, perr
    else
      sock:settimeout(max(1, deadline - ngx.now() * 1000))
      local data, err = sock:receiveany(RECEIVE_MAX)
      if not data then return nil, err end
      buf = pos > #buf and data or sub(buf, pos) .. data
      pos = 1
    end
  end
  return true
end

local AUTH = {}

-- Sends the jobs' payloads in one write on the channel's connection (opened first if there is
-- none) and reads their replies; true, or nil, the transport's error and whether the connection
-- had served before.
local function attempt(ch, o, jobs, deadline)
  local sock, used = ch.sock, ch.used
  local auth = false
  if not sock then
    sock = ngx.socket.tcp()
    local remaining = max(1, deadline - ngx.now() * 1000)
    sock:settimeouts(remaining, remaining, remaining)
    local ok, err = sock:connect(o.redis.host, o.redis.port)
    if not ok then return nil, "connect: " .. tostring(err) end
    ch.sock, ch.used = sock, false
    used = false
    auth = o.password ~= nil
  end
  local payload
  local n = #jobs
  if n == 1 and not auth then
    payload = jobs[1].payload
  else
    local parts = ch.parts
    clear(parts)
    local at = 0
    if auth then
      local cmd = AUTH[o.password]
      if not cmd then
        cmd = core.command({ "AUTH", o.password })
        AUTH[o.password] = cmd
      end
      parts[1], at = cmd, 1
    end
    for j = 1, n do parts[at + j] = jobs[j].payload end
    payload = concat(parts)
    clear(parts)
  end
  sock:settimeout(max(1, deadline - ngx.now() * 1000))
  local ok, err = sock:send(payload)
  if ok then ok, err = read_replies(sock, jobs, deadline, auth) end
  if not ok then
    sock:close()
    ch.sock = nil
    return nil, err, used
  end
  ch.used = true
  return true
end

-- One round trip for `jobs`, each woken with its replies or the error.
local function flush(ch, jobs)
  local deadline = 0
  for i = 1, #jobs do
    if jobs[i].deadline > deadline then deadline = jobs[i].deadline end
  end
  local o = jobs[1].o
  local ran, ok, err, used = pcall(attempt, ch, o, jobs, deadline)
  if ran and not ok and used and err ~= "timeout" then
    ran, ok, err = pcall(attempt, ch, o, jobs, deadline)
  end
  if not ran then
    ok, err = nil, "internal error: " .. tostring(ok)
    if ch.sock then ch.sock:close() end
    ch.sock = nil
  end
  for i = 1, #jobs do
    local job = jobs[i]
    if not ok then
      job.replies = nil
      job.err = err
      -- The breaker counts a round trip once: by its first call.
      job.counted = i > 1
    end
    if not job.gone then job.sema:post(1) end
  end
end

-- The timer: round trips as long as there are calls, until the worker exits. The calls queue
-- into ch.queue; a round trip takes that table and leaves ch.next (emptied) in its place.
local function run(premature, ch)
  if not premature then
    local jobs = {}
    while not ngx.worker.exiting() do
      local queue = ch.queue
      if queue[1] == nil then
        ch.idle = true
        ch.wake:wait(IDLE_WAIT_S)
        ch.idle = false
      else
        ch.queue, ch.next = ch.next, queue
        local n = 0
        for i = 1, #queue do
          local job = queue[i]
          if not job.gone then
            n = n + 1
            jobs[n] = job
          end
        end
        clear(queue)
        if n > 0 then flush(ch, jobs) end
        clear(jobs)
      end
    end
  end
  ch.running = false
  if ch.sock then ch.sock:close() end
  ch.sock = nil
  local queue = ch.queue
  ch.queue = {}
  for i = 1, #queue do
    queue[i].err = "the worker is exiting"
    if not queue[i].gone then queue[i].sema:post(1) end
  end
end

-- One per call's options (a plan's, kept while the plan is): its channel found once.
local Pipe = {}
Pipe.__index = Pipe
function Pipe.reused() return 1 end
local pipes = setmetatable({}, { __mode = "k" })

local function pipe_of(o)
  local pipe = pipes[o]
  if pipe then return pipe end
  local where = core.connection_key(o)
  local ch = channels[where]
  if not ch then
    ch = { queue = {}, next = {}, parts = {}, wake = semaphore.new(), idle = false,
      running = false }
    channels[where] = ch
  end
  pipe = setmetatable({ o = o, ch = ch }, Pipe)
  pipes[o] = pipe
  return pipe
end

function Pipe:exchange(payload, n, deadline)
  local ch = self.ch
  if not ch.running then
    local ok, err = ngx.timer.at(0, run, ch)
    if not ok then return nil, "ngx.timer.at: " .. tostring(err) end
    ch.running = true
  end
  local job
  if spare_n > 0 then
    job = spare[spare_n]
    spare[spare_n] = nil
    spare_n = spare_n - 1
  else
    job = { sema = semaphore.new() }
  end
  job.payload, job.n, job.deadline, job.o = payload, n, deadline, self.o
  job.replies, job.err, job.counted = nil, nil, nil
  local queue = ch.queue
  queue[#queue + 1] = job
  if ch.idle then
    ch.idle = false
    ch.wake:post(1)
  end
  local ok = job.sema:wait(max(0.001, (deadline - ngx.now() * 1000) / 1000))
  if not ok then
    -- Its deadline passed first: the call fails (the timer still reads its reply, if sent).
    job.gone = true
    return nil, "timeout"
  end
  local replies, err, counted = job.replies, job.err, job.counted
  job.payload, job.o, job.replies = nil, nil, nil
  if spare_n < SPARE_MAX then
    spare_n = spare_n + 1
    spare[spare_n] = job
  end
  if replies then return replies end
  return nil, err, counted
end

local env = {
  now_ms = function() return ngx.now() * 1000 end,
  log = log,
  defaults = {},
  connect = pipe_of,
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
