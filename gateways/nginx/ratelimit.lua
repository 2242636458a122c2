-- ratelimit: redis-ratelimit for NGINX (Debian's nginx with libnginx-mod-http-lua, or OpenResty).
-- From access_by_lua_block:
--
--   require("ratelimit").limit{ key = ngx.var.http_x_api_key, limit = "sliding-window 100 1m" }
--
-- which answers a refused request there (429) and sets the RateLimit fields on an admitted one's
-- response. gateways/nginx/README.md has the options and a complete nginx.conf.
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
-- command and waits on its own semaphore. The timer's writer takes every call queued meanwhile
-- and sends their commands in one write: a batch, sent without waiting for the replies of the
-- batches before it (at most MAX_IN_FLIGHT of them on the wire). The timer's reader (a light
-- thread of the timer: a cosocket reads in one thread while it writes in another) reads each
-- batch's replies in the order they were sent (whole, from as few receives as the kernel hands
-- them in; what a receive brings beyond a batch is the next one's) and wakes each call with its
-- own. So Redis works on one batch while the worker reads the next requests and sends theirs.
-- Every call waits at most until its own deadline. A batch that fails fails each of its calls,
-- and the batches sent after it on the same connection, and the breaker counts that once; the
-- connection is then closed, and the next batch opens a new one. Where a connection used before
-- turns out closed (a restart), its calls go once more, at once, on a new one.
local semaphore = require("ngx.semaphore")
local core_parse = core.parse
local ok_clear, clear = pcall(require, "table.clear")
if not ok_clear then clear = function(t) for k in pairs(t) do t[k] = nil end end end

local channels = {} -- core.connection_key -> the channel (made in pipe_of)
local RECEIVE_MAX = 65536
-- How long the timer's threads wait for work before they look whether the worker is exiting.
local IDLE_WAIT_S = 1
-- Batches sent and not yet read, at most (the writer waits for the reader beyond).
local MAX_IN_FLIGHT = 32
-- Jobs (each with its semaphore) of calls that ended as they should, for the next calls: a job
-- whose call gave up at its deadline is left to the timer (it may still hold it) and not reused.
local spare, spare_n = {}, 0
local SPARE_MAX = 256

-- Reads the replies of `jobs` (job.n each) into job.replies from `sock`, starting with what the
-- channel kept of that connection's receive before (ch.buf from ch.pos) and keeping what comes
-- after; true, or nil and the transport's error. No closure per batch: the buffer is refilled
-- where a reply is cut.
local function read_replies(ch, sock, jobs, deadline, auth)
  local buf, pos = "", 1
  if ch.buf_of == sock then buf, pos = ch.buf, ch.pos end
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
  ch.buf, ch.pos, ch.buf_of = buf, pos, sock
  return true
end

local AUTH = {}

local function latest_deadline(jobs)
  local deadline = 0
  for i = 1, #jobs do
    if jobs[i].deadline > deadline then deadline = jobs[i].deadline end
  end
  return deadline
end

-- Wakes the calls of a failed batch: each with the error, or, the first time a connection that
-- had served fails otherwise than by a timeout (a restart), queued again to go at once on a new
-- one. The breaker counts a failure once: by the first call of its first batch (`counts`).
local function fail(ch, jobs, err, used, counts)
  local again = used and err ~= "timeout"
  for i = 1, #jobs do
    local job = jobs[i]
    job.replies = nil
    if again and not job.again and not job.gone then
      job.again = true
      local queue = ch.queue
      queue[#queue + 1] = job
    else
      job.err = err
      job.counted = not (counts and i == 1)
      if not job.gone then job.sema:post(1) end
    end
  end
  if again and ch.idle then
    ch.idle = false
    ch.wake:post(1)
  end
end

-- Closes `sock` unless the other thread is in a call on it: that thread closes it when its call
-- returns (it finds the channel on another connection).
local function retire(ch, sock)
  if ch.sock == sock then ch.sock = nil end
  sock:close()
end

-- The reader: the replies of each batch, in the order sent.
local function reader(ch)
  local inflight = ch.inflight
  while true do
    local b = ch.first
    local batch = inflight[b]
    if not batch then
      if ch.stopping then return end
      ch.reader_idle = true
      ch.reader_wake:wait(IDLE_WAIT_S)
      ch.reader_idle = false
    else
      local sock = batch.sock
      local ran, ok, err = pcall(read_replies, ch, sock, batch.jobs, batch.deadline, batch.auth)
      if not ran then ok, err = nil, "internal error: " .. tostring(ok) end
      inflight[b] = nil
      ch.first = b + 1
      if ok then
        if sock == ch.sock then ch.used = true end
        local jobs = batch.jobs
        for i = 1, #jobs do
          if not jobs[i].gone then jobs[i].sema:post(1) end
        end
        -- A connection the writer left (its send failed) is closed once its batches are read.
        local later = inflight[b + 1]
        if sock ~= ch.sock and not (later and later.sock == sock) then sock:close() end
      else
        local used = batch.used
        retire(ch, sock)
        fail(ch, batch.jobs, err, used, true)
        -- The batches sent after it on the same connection fail with it.
        local later = inflight[ch.first]
        while later and later.sock == sock do
          inflight[ch.first] = nil
          ch.first = ch.first + 1
          fail(ch, later.jobs, err, used, false)
          later = inflight[ch.first]
        end
      end
      if ch.writer_waits then
        ch.writer_waits = false
        ch.room:post(1)
      end
    end
  end
end

-- Sends `jobs` as one batch on the channel's connection (opened first if there is none): true,
-- or nil, the transport's error and whether the connection had served before.
local function send(ch, jobs)
  local deadline = latest_deadline(jobs)
  local o = jobs[1].o
  local sock = ch.sock
  local auth = false
  if not sock then
    sock = ngx.socket.tcp()
    local remaining = max(1, deadline - ngx.now() * 1000)
    sock:settimeouts(remaining, remaining, remaining)
    local ok, err = sock:connect(o.redis.host, o.redis.port)
    if not ok then return nil, "connect: " .. tostring(err), false end
    ch.sock, ch.used = sock, false
    auth = o.password ~= nil
  end
  local used = ch.used
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
  if ok and ch.sock ~= sock then
    -- The reader failed this connection while the batch was going out: it fails with it.
    ok, err = nil, "closed"
  end
  if not ok then
    retire(ch, sock)
    return nil, err, used
  end
  ch.last = ch.last + 1
  ch.inflight[ch.last] = { jobs = jobs, sock = sock, deadline = deadline, auth = auth,
    used = used }
  if ch.reader_idle then
    ch.reader_idle = false
    ch.reader_wake:post(1)
  end
  return true
end

-- The timer: the writer (this thread) and the reader, as long as there are calls, until the
-- worker exits. The calls queue into ch.queue; a batch takes that table and leaves ch.next
-- (emptied) in its place.
local function run(premature, ch)
  if not premature then
    ch.inflight, ch.first, ch.last = {}, 1, 0
    ch.buf, ch.pos, ch.buf_of, ch.stopping = "", 1, nil, false
    local thread = ngx.thread.spawn(reader, ch)
    while not ngx.worker.exiting() do
      local queue = ch.queue
      if queue[1] == nil then
        ch.idle = true
        ch.wake:wait(IDLE_WAIT_S)
        ch.idle = false
      elseif ch.last - ch.first + 1 >= MAX_IN_FLIGHT then
        ch.writer_waits = true
        ch.room:wait(IDLE_WAIT_S)
        ch.writer_waits = false
      else
        ch.queue, ch.next = ch.next, queue
        local jobs, n = {}, 0
        for i = 1, #queue do
          local job = queue[i]
          if not job.gone then
            n = n + 1
            jobs[n] = job
          end
        end
        clear(queue)
        if n > 0 then
          local ran, ok, err, used = pcall(send, ch, jobs)
          if not ran then
            ok, err, used = nil, "internal error: " .. tostring(ok), false
            if ch.sock then retire(ch, ch.sock) end
          end
          if not ok then fail(ch, jobs, err, used, true) end
        end
      end
    end
    -- The batches on the wire are read (each within its calls' deadlines), then the reader ends.
    ch.stopping = true
    if ch.reader_idle then
      ch.reader_idle = false
      ch.reader_wake:post(1)
    end
    ngx.thread.wait(thread)
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
      running = false, reader_wake = semaphore.new(), reader_idle = false,
      room = semaphore.new(), writer_waits = false }
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
  job.replies, job.err, job.counted, job.again = nil, nil, nil, nil
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

--- Limits this request (access phase). Admitted: returns, the fields set on its response. Refused:
--- 429 with Retry-After, RateLimit-Policy, RateLimit and a JSON body. Redis unavailable:
--- on_error "open" admits without fields, "closed" answers 503. A mistake in the options: 500,
--- and the error log says which option.
function M.limit(opts)
  local result = the_limiter():decide(opts)
  if not result then return nil end
  -- Set now, an admitted request's go out with whatever answers it (proxy_pass, static files);
  -- an upstream's own fields of the same names follow them.
  local headers = result.headers
  for i = 1, #headers do ngx.header[headers[i][1]] = headers[i][2] end
  if result.status == 200 then return result end
  ngx.status = result.status
  ngx.header["Content-Type"] = "application/json"
  ngx.header["Content-Length"] = #result.body
  ngx.print(result.body)
  return ngx.exit(ngx.HTTP_OK)
end

return M
