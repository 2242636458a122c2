-- The core's own tests, without a proxy or a server: `lua5.1 gateways/lua/test_core.lua` (the
-- language of LuaJIT, NGINX's) and `lua5.3 gateways/lua/test_core.lua` (HAProxy's), from the
-- repository's root; tests/integration/gateways runs both. Prints "ok <n>" or fails with the
-- first difference.
package.path = "gateways/lua/?.lua;" .. package.path
local core = require("ratelimit_core")

local checks = 0
local function eq(got, want, what)
  checks = checks + 1
  if got ~= want then
    error(string.format("%s: got %s, want %s", what, tostring(got), tostring(want)), 2)
  end
end

-- A byte stream with a socket's receive("*l") / receive(n).
local function stream(text)
  local s = { buf = text }
  function s:receive(pattern)
    if pattern == "*l" then
      local i = self.buf:find("\r\n", 1, true)
      if not i then return nil, "closed" end
      local line = self.buf:sub(1, i - 1)
      self.buf = self.buf:sub(i + 2)
      return line
    end
    if #self.buf < pattern then return nil, "closed" end
    local data = self.buf:sub(1, pattern)
    self.buf = self.buf:sub(pattern + 1)
    return data
  end
  return s
end

-- RESP replies.
local function int(n) return ":" .. n .. "\r\n" end
local function arr(items) return "*" .. #items .. "\r\n" .. table.concat(items) end
local function bulk(s) return "$" .. #s .. "\r\n" .. s .. "\r\n" end
local function six(a, l, r, retry, reset, delay)
  return arr({ int(a), int(l), int(r), int(retry), int(reset), int(delay) })
end

-- The reader.
local r = core.read_reply(stream(arr({ int(1), bulk("a\r\nb"), "$-1\r\n", "+OK\r\n",
  arr({ int(-5) }) })))
eq(r[1], 1, "integer")
eq(r[2], "a\r\nb", "bulk with CRLF inside")
eq(r[3], false, "nil bulk")
eq(r[4], "OK", "status")
eq(r[5][1], -5, "nested array")
local e = core.read_reply(stream("-ERR no such policy 'x'\r\n"))
eq(core.is_error(e), true, "error reply")
eq(e.message, "ERR no such policy 'x'", "error text")
local none, err = core.read_reply(stream("*2\r\n:1\r\n"))
eq(none, nil, "a truncated reply")
eq(err, "closed", "its error")
-- The writer, read back.
local words = core.read_reply(stream(core.command({ "RATELIMIT.CHECK", "k y", "" })))
eq(#words, 3, "command words")
eq(words[2], "k y", "a word with a space")
eq(words[3], "", "an empty word")

-- The reader over a buffer: replies whole, or nil while the buffer ends before the reply does.
local text = arr({ int(1), bulk("a\r\nb"), "$-1\r\n", "+OK\r\n", arr({ int(-5) }) })
  .. six(1, 100, 99, -1, 60000, 0) .. "-ERR x\r\n" .. bulk("xyz")
local value, at = core.parse(text, 1)
eq(value[2], "a\r\nb", "parse: bulk with CRLF inside")
eq(value[3], false, "parse: nil bulk")
eq(value[5][1], -5, "parse: nested array")
value, at = core.parse(text, at)
eq(#value, 6, "parse: a decision")
eq(value[2], 100, "parse: its limit")
eq(value[4], -1, "parse: a negative integer")
value, at = core.parse(text, at)
eq(core.is_error(value), true, "parse: an error reply")
value, at = core.parse(text, at)
eq(value, "xyz", "parse: a bulk string")
eq(at, #text + 1, "parse: the end")
-- Every cut inside a reply leaves it incomplete: nil, and no error.
local starts, from = {}, 1
while from <= #text do
  starts[#starts + 1] = from
  local _, next_at = core.parse(text, from)
  from = next_at
end
for i, first in ipairs(starts) do
  local stop = starts[i + 1] or #text + 1
  for cut = first, stop - 2 do
    local part, part_at, perr = core.parse(text:sub(1, cut), first)
    eq(part == nil and part_at == nil and perr == nil, true, "parse: a cut at " .. cut)
  end
end
local bad, bad_at, bad_err = core.parse("?x\r\n", 1)
eq(bad == nil and bad_at == nil, true, "parse: not RESP")
eq(bad_err:find("protocol error", 1, true) ~= nil, true, bad_err)
eq(core.parse("*6\r\n:1\r\n:2\r\n", 1), nil, "parse: a decision cut short")
value = core.parse("*6\r\n:1\r\n$1\r\nx\r\n:3\r\n:4\r\n:5\r\n:6\r\n", 1)
eq(value[2], "x", "parse: six items that are not all integers")
-- The decision's two readers (bytes under LuaJIT, one match elsewhere) read alike.
for _, way in ipairs({ "six_by_bytes", "six_by_match" }) do
  local read = core[way]
  local d6 = "xx" .. six(0, "9007199254740993", 99, -1, -60000, 0) .. "+OK\r\n"
  local got, got_at = read(d6, 3)
  eq(got_at, #d6 - 4, way .. ": the position after it")
  eq(got[1], 0, way .. ": a zero")
  eq(got[2], tonumber("9007199254740993"), way .. ": 16 digits, as tonumber reads them")
  eq(got[4], -1, way .. ": a negative integer")
  eq(got[5], -60000, way .. ": another")
  eq(got[6], 0, way .. ": the last")
  local rest = ":3\r\n:4\r\n:5\r\n:6\r\n"
  for _, no in ipairs({ "*6\r\n:1\r\n:2\r\n:3\r\n:4\r\n:5\r\n:6\r", "*6\r\n:1\r\n:\r\n" .. rest,
    "*6\r\n:1\r\n:-\r\n" .. rest, "*6\r\n:1\r\n:2x\r\n" .. rest, "*6\n:1\r\n:2\r\n" .. rest,
    "*6\r\n:1\r\n+2\r\n" .. rest }) do
    eq(read(no, 1), nil, way .. ": not six integers: " .. no:gsub("\r\n", "|"))
  end
end

-- Periods and limits.
eq(core.period_ms("1m"), 60000, "1m")
eq(core.period_ms("1M"), 60000, "1M: a minute")
eq(core.period_ms("250ms"), 250, "250ms")
eq(core.period_ms("1y"), nil, "no year unit")
eq(core.ceil_s(1), 1, "ceil 1 ms")
eq(core.ceil_s(1000), 1, "ceil 1000 ms")
eq(core.ceil_s(1001), 2, "ceil 1001 ms")
eq(core.ceil_s(0), 0, "ceil 0")
local spec = core.parse_limit("token-bucket 10 1s BURST 20")
eq(spec.period_ms, 1000, "spec period")
eq(#spec.words, 5, "spec words")
local _, why = core.parse_limit("sliding-windw 100 1m")
eq(why:find("unknown algorithm 'sliding-windw'", 1, true) ~= nil, true, why)
_, why = core.parse_limit("fixed-window 5 15 minutes")
eq(why:find("unknown option 'minutes'", 1, true) ~= nil, true, why)
_, why = core.parse_limit("fixed-window 5 1m BURST")
eq(why:find("BURST needs a value", 1, true) ~= nil, true, why)

-- Options: each mistake names its option.
local function option_error(opts)
  local o, message = core.options(opts, {})
  eq(o, nil, "options accepted")
  return message
end
local base = { key = "k", limit = "fixed-window 1 1s" }
local function with(k, v)
  local t = {}
  for a, b in pairs(base) do t[a] = b end
  t[k] = v
  return t
end
eq(option_error(with("timeout_ms", 0)):find("timeout_ms", 1, true) ~= nil, true, "timeout_ms")
eq(option_error(with("on_error", "maybe")):find("on_error", 1, true) ~= nil, true, "on_error")
eq(option_error(with("redis", "localhost")):find("redis", 1, true) ~= nil, true, "redis")
eq(option_error(with("cost", -1)):find("cost", 1, true) ~= nil, true, "cost")
eq(option_error(with("policy", "p")):find("one of limit", 1, true) ~= nil, true, "both")
eq(option_error({ limits = { { key = "a", limit = "fixed-window 1 1s" },
  { key = "b", limit = "fixed-window 1 1s" } } }):find("name is needed", 1, true) ~= nil, true,
  "names of several")

-- The answer, as the Python package's http_answer gives it.
local function header(answer, name)
  for _, h in ipairs(answer.headers) do
    if h[1] == name then return h[2] end
  end
  return nil
end
local d = core.decision(core.read_reply(stream(six(1, 100, 99, 0, 116285, 0))))
local a = core.answer({ { "default", 60000, d } })
eq(a.status, 200, "admitted")
eq(header(a, "RateLimit-Policy"), '"default";q=100;w=60', "policy field")
eq(header(a, "RateLimit"), '"default";r=99;t=117', "RateLimit field")
eq(header(a, "Retry-After"), nil, "no Retry-After when admitted")
d = core.decision(core.read_reply(stream(six(0, 100, 0, 56869, 116269, 0))))
a = core.answer({ { "default", 60000, d } })
eq(a.status, 429, "refused")
eq(header(a, "RateLimit"), '"default";r=0;t=57', "t from retry_after_ms")
eq(header(a, "Retry-After"), "57", "Retry-After")
eq(a.body, '{"error": "rate limited", "policy": "default", "retry_after_ms": 56869}', "body")
-- A cost above the limit: never admitted, so no Retry-After and no RateLimit item.
d = core.decision(core.read_reply(stream(six(0, 5, 5, -1, 0, 0))))
a = core.answer({ { "default", 1000, d } })
eq(a.status, 429, "never")
eq(header(a, "Retry-After"), nil, "no Retry-After for -1")
eq(header(a, "RateLimit"), nil, "no RateLimit item for -1")
-- A period unknown (a policy not read): no w.
a = core.answer({ { "api", nil, core.decision({ 1, 5, 4, 0, 200, 0 }) } })
eq(header(a, "RateLimit-Policy"), '"api";q=5', "no w without a period")

-- The limiter over a fake server: engine detection, the library loaded, policies, the breaker.
local function fake(handler)
  local log, sent = {}, { raw = {} } -- each command's words by spaces; sent.raw: its bytes
  local store = { values = {} }
  function store:get(name) return self.values[name] end
  function store:set(name, v) self.values[name] = v end
  function store:add(name)
    if self.values[name] then return false end
    self.values[name] = true
    return true
  end
  local clock = 1000
  local env = {
    now_ms = function() return clock end,
    log = function(level, message) log[#log + 1] = level .. ": " .. message end,
    store = store,
    library_code = "#!lua name=ratelimit\n-- stand-in",
  }
  function env.connect()
    if env.down then return nil, "connect: connection refused" end
    local sock = stream("")
    function sock.send(_, data)
      local input = stream(data)
      while input.buf ~= "" do
        local command = core.read_reply(input)
        sent[#sent + 1] = table.concat(command, " ")
        sent.raw[#sent] = core.command(command)
        sock.buf = sock.buf .. handler(command)
      end
      return #data
    end
    function sock.settimeout_ms() end
    function sock.reused() return 1 end
    return sock
  end
  function env.keep() end
  function env.close() end
  return core.new(env), env, sent, log, function(ms) clock = clock + ms end
end

-- A server without the module, and without the library until it is loaded.
local loaded = false
local limiter, _, sent, log = fake(function(command)
  local name = command[1]
  if name:find("^RATELIMIT") then
    return "-ERR unknown command '" .. name .. "', with args beginning with: \r\n"
  elseif name == "FUNCTION" and command[2] == "LIST" then
    return loaded and arr({ arr({ bulk("library_name"), bulk("ratelimit") }) }) or "*0\r\n"
  elseif name == "FUNCTION" and command[2] == "LOAD" then
    loaded = true
    return bulk("ratelimit")
  elseif name == "FCALL" then
    return six(1, 10, 9, 0, 6000, 0)
  end
  return "-ERR unexpected\r\n"
end)
a = limiter:decide({ key = "k", policy = "upload", fallback = "token-bucket 10 1m" })
eq(a.status, 200, "library: admitted")
eq(a.source, "library", "library: the engine")
eq(header(a, "RateLimit-Policy"), '"upload";q=10;w=60', "library: the fallback's fields")
eq(sent[#sent], "FCALL ratelimit_check 1 fn:k token-bucket 10 1m COST 1", "library: the call")
eq(sent.raw[#sent], core.command({ "FCALL", "ratelimit_check", "1", "fn:k", "token-bucket", "10",
  "1m", "COST", "1" }), "library: the spec as words")
eq(loaded, true, "library: loaded")
local n = #sent
limiter:decide({ key = "k", limit = "fixed-window 1 1s" })
eq(#sent, n + 1, "library: found once, then one call per decision")
eq(table.concat(log, "\n"):find("engine on 127.0.0.1:6379: the Functions library", 1, true) ~= nil,
  true, "library: said")
a = limiter:decide({ key = "k", policy = "upload" })
eq(a.status, 500, "library: a policy without fallback is a mistake")

-- The module: a policy's definition read with the decision, in one round trip.
limiter, _, sent = fake(function(command)
  if command[2] == "GET" then
    return arr({ bulk("algorithm"), bulk("token-bucket"), bulk("limit"), int(3),
      bulk("period_ms"), int(60000) })
  elseif command[1] == "RATELIMIT.CHECKALL" then
    return arr({ six(0, 3, 0, 20000, 60000, 0), six(0, 3, 0, 20000, 60000, 0),
      six(1, 5, 4, 0, 1000, 0) })
  end
  return six(1, 3, 2, 0, 20000, 0)
end)
a = limiter:decide({ key = "t", policy = "upload" })
eq(header(a, "RateLimit-Policy"), '"upload";q=3;w=60', "module: the policy's period")
eq(sent[1], "RATELIMIT.POLICY GET upload", "module: the definition first")
eq(sent[2], "COMMAND INFO RATELIMIT.CHECK", "module: its arity, once (a decision: words)")
eq(sent[3], "RATELIMIT.CHECK t POLICY upload COST 1", "module: then the decision")
a = limiter:decide({ limits = { { key = "a", policy = "upload" },
  { key = "b", limit = "token-bucket 5 1s", name = "sec" } }, cost = 2 })
eq(sent[#sent], "RATELIMIT.CHECKALL 2 a b POLICY upload token-bucket 5 1s COST 2",
  "module: CHECKALL")
eq(a.status, 429, "CHECKALL: refused")
eq(header(a, "Retry-After"), "20", "CHECKALL: the overall wait")
eq(header(a, "RateLimit"), '"upload";r=0;t=20, "sec";r=4;t=1', "CHECKALL: one item each")
eq(a.body:find('"policy": "upload"', 1, true) ~= nil, true, "CHECKALL: the limit that refused")
eq(limiter:decide({ key = nil, limit = "fixed-window 1 1s" }), nil, "no key: not limited")
eq(limiter:decide({ key = "", limit = "fixed-window 1 1s" }), nil, "empty key: not limited")

-- The spec as one argument where the module's arity is -3: asked once, in the first call's round
-- trip (that call goes as words); words where it is -4, where COMMAND fails, and to the library.
local function info(arity)
  return arr({ arr({ bulk("ratelimit.check"), int(arity), arr({ bulk("write") }), int(1), int(1),
    int(1) }) })
end
local W, O = "words", "one argument"
local seen = {}
for _, case in ipairs({ { -3, O }, { -4, W }, { "error", W }, { "nil", W } }) do
  local arity, form = case[1], case[2]
  local what = "arity " .. arity .. ": "
  limiter, _, sent = fake(function(command)
    if command[1] == "COMMAND" then
      if arity == "error" then return "-NOPERM this user has no permissions\r\n" end
      return arity == "nil" and "*1\r\n*-1\r\n" or info(arity)
    elseif command[2] == "GET" then
      return arr({ bulk("algorithm"), bulk("token-bucket"), bulk("limit"), int(3),
        bulk("period_ms"), int(60000) })
    elseif command[1] == "RATELIMIT.CHECKALL" then
      return arr({ six(0, 3, 0, 20000, 60000, 0), six(0, 3, 0, 20000, 60000, 0),
        six(1, 5, 4, 0, 1000, 0) })
    end
    return six(1, 100, 99, 0, 60000, 0)
  end)
  -- The option's text normalised: single spaces between its words.
  local one = { key = "user:42", limit = "sliding-window  100\t1m" }
  local first = limiter:decide(one)
  eq(sent[1], "COMMAND INFO RATELIMIT.CHECK", what .. "asked first")
  eq(sent.raw[2], core.command({ "RATELIMIT.CHECK", "user:42", "sliding-window", "100", "1m",
    "COST", "1" }), what .. "the first call as words")
  local second = limiter:decide(one)
  eq(#sent, 3, what .. "asked once")
  eq(sent.raw[3], form == O and "*5\r\n$15\r\nRATELIMIT.CHECK\r\n$7\r\nuser:42\r\n"
    .. "$21\r\nsliding-window 100 1m\r\n$4\r\nCOST\r\n$1\r\n1\r\n" or sent.raw[2],
    what .. "then " .. form)
  local several = { limits = { { key = "a", policy = "upload" },
    { key = "b", limit = "token-bucket 5 1s BURST 10", name = "sec" } }, cost = 2 }
  limiter:decide(several)
  local all = limiter:decide(several)
  eq(sent.raw[#sent], core.command(form == O
    and { "RATELIMIT.CHECKALL", "2", "a", "b", "POLICY upload", "token-bucket 5 1s BURST 10",
      "COST", "2" }
    or { "RATELIMIT.CHECKALL", "2", "a", "b", "POLICY", "upload", "token-bucket", "5", "1s",
      "BURST", "10", "COST", "2" }), what .. "CHECKALL as " .. form)
  local fields = table.concat({ first.status, second.status, header(second, "RateLimit"),
    header(second, "RateLimit-Policy"), all.status, header(all, "RateLimit"),
    header(all, "RateLimit-Policy"), header(all, "Retry-After"), all.body }, "|")
  seen[#seen + 1] = fields
  eq(fields, seen[1], what .. "the same answers either way")
end

-- A module that refuses a spec as one argument after saying -3 (a failover to an older one): the
-- call again as words, and words from then on (said once); a failure has the arity asked again.
local old = false
local env, advance
limiter, env, sent, log, advance = fake(function(command)
  if command[1] == "COMMAND" then return info(-3) end
  if old and command[4] == "COST" then
    return "-ERR unknown algorithm '" .. command[3] .. "': expected token-bucket, ...\r\n"
  end
  return six(1, 100, 99, 0, 60000, 0)
end)
local opts = { key = "k", limit = "fixed-window 100 1m" }
limiter:decide(opts)
limiter:decide(opts)
eq(sent[3], "RATELIMIT.CHECK k fixed-window 100 1m COST 1", "older: one argument before")
eq(#sent.raw[3] < #sent.raw[2], true, "older: fewer bytes as one argument")
old = true
a = limiter:decide(opts)
eq(a.status, 200, "older: answered")
eq(a.source, "module", "older: by the module")
eq(sent.raw[4], sent.raw[3], "older: one argument, refused")
eq(sent.raw[5], sent.raw[2], "older: then words")
limiter:decide(opts)
eq(#sent, 6, "older: words from then on")
eq(sent.raw[6], sent.raw[2], "older: words")
eq(table.concat(log, "\n"):find("does not take a limit spec as one argument", 1, true) ~= nil,
  true, "older: said")
env.down = true
limiter:decide(opts)
advance(1000)
env.down = false
old = false
limiter:decide(opts)
eq(sent[7], "COMMAND INFO RATELIMIT.CHECK", "after a failure: asked again")
limiter:decide(opts)
eq(sent.raw[9], sent.raw[3], "after a failure: one argument again")

-- The breaker: after a failure no call for the cool-down, then one probe.
limiter, env, _, log, advance = fake(function() return six(1, 1, 0, 0, 1000, 0) end)
env.down = true
local calls = 0
local real = env.connect
env.connect = function(...)
  calls = calls + 1
  return real(...)
end
eq(limiter:decide({ key = "k", limit = "fixed-window 1 1s" }).source, "error", "down: open")
eq(limiter:decide({ key = "k", limit = "fixed-window 1 1s", on_error = "closed" }).status, 503,
  "down: closed")
eq(calls, 1, "down: one attempt per cool-down")
advance(1000)
env.down = false
eq(limiter:decide({ key = "k", limit = "fixed-window 1 1s" }).source, "module", "probe: answered")
eq(calls, 2, "probe: one attempt")
eq(table.concat(log, "\n"):find("answers again", 1, true) ~= nil, true, "recovery: said")
-- A call that finds the breaker closed reads it once (a read of NGINX's shared dict each).
local reads, get = 0, env.store.get
env.store.get = function(...)
  reads = reads + 1
  return get(...)
end
limiter:decide({ key = "k", limit = "fixed-window 1 1s" })
eq(reads, 1, "closed: one read of the breaker per call")

-- A server that cannot serve now (restarting: LOADING) is unavailable, not misconfigured.
limiter, _, _, log = fake(function()
  return "-LOADING Redis is loading the dataset in memory\r\n"
end)
a = limiter:decide({ key = "k", limit = "fixed-window 1 1s", on_error = "closed" })
eq(a.status, 503, "LOADING: fails as on_error says")
eq(table.concat(log, "\n"):find("unavailable (LOADING", 1, true) ~= nil, true, "LOADING: said")

print("ok " .. checks)
