-- INFO ratelimit as metrics, for prometheus-redis-exporter's --script option (run.sh passes it).
-- The exporter runs this with EVAL at every scrape and exports each name/value pair it returns as
-- a gauge redis_script_values{key="<name>"}. The names (prometheus.yml turns them into metrics
-- with labels):
--   ratelimit:<algorithm>:<field>        calls, allowed, rejected, blocked, keys per algorithm
--   ratelimit_policy:<policy>:<field>    calls, allowed, rejected, shadow_rejected, blocked
--   ratelimit_policies                   how many policies are defined
-- A policy name never holds ':' (the module refuses it), so ':' splits these names safely.
-- Every value is returned as a string: 1.45.0 fails the whole scrape on a number in the reply.
local info = redis.call("INFO", "ratelimit")
local out = {}
local function add(name, value)
  out[#out + 1] = name
  out[#out + 1] = value
end
for line in string.gmatch(info, "[^\r\n]+") do
  local name, value = string.match(line, "^ratelimit_([^:]+):(.*)$")
  if name == "policies" then
    add("ratelimit_policies", value)
  elseif name and string.sub(name, 1, 7) == "policy_" then
    local policy = string.sub(name, 8)
    for field, count in string.gmatch(value, "([%a_]+)=(%d+)") do
      add("ratelimit_policy:" .. policy .. ":" .. field, count)
    end
  elseif name and string.match(value, "^%d+$") then
    -- <algorithm>_<field>: the field is the last word (no algorithm name ends in one)
    local algorithm, field = string.match(name, "^(.-)_(%a+)$")
    if algorithm then
      add("ratelimit:" .. algorithm .. ":" .. field, value)
    end
  end
end
return out
