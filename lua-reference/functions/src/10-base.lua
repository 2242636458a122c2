-- The base: the standard library, the bounds, the names.

-- The standard library as upvalues: a function's globals are looked up through its library's
-- environment on every access, and they do not exist while the library loads, so they are
-- bound by the first call.
local floor, max, min, byte, char, find, format, lower, match, strsub, upper, gsub, pack
local unpack_bytes
local bound = false
local function bind()
  floor, max, min = math.floor, math.max, math.min
  byte, char, find, format, lower, match, strsub, upper, gsub = string.byte, string.char,
    string.find, string.format, string.lower, string.match, string.sub, string.upper, string.gsub
  pack, unpack_bytes = struct.pack, struct.unpack
  bound = true
end

local EXACT = 9007199254740992 -- 2^53: doubles hold every integer below it
local MAX_AMOUNT = 1000000000000 -- limit, BURST and COST
local MAX_PERIOD_MS = 3650 * 86400000
local MAX_LOG_LIMIT = 100000 -- the module's default ratelimit.max-log-limit
local MAX_LEASES = 100000 -- the module's default ratelimit.max-leases
local LEASE_ID_MAX = 128

local TB, LB, FW, SW, SL, GC = 'token-bucket', 'leaky-bucket', 'fixed-window', 'sliding-window',
  'sliding-log', 'gcra'
local CC = 'concurrency' -- leases: ratelimit_acquire and ratelimit_release, never checked
local ALGORITHMS = { [TB] = true, [LB] = true, [FW] = true, [SW] = true, [SL] = true, [GC] = true }
-- The algorithms that take BURST (a capacity in scaled units: C*P below 2^53).
local BUCKET = { [TB] = true, [LB] = true, [GC] = true }
local TAG = {
  [TB] = 'rl:tb', [LB] = 'rl:lb', [FW] = 'rl:fw', [SW] = 'rl:sw', [SL] = 'rl:sl', [GC] = 'rl:gc',
}
local OPTIONS = { BURST = 'BURST', BLOCK = 'BLOCK', COST = 'COST', AT = 'AT' }
-- The limit spec's own options (an error in one names the spec in CHECKALL).
local SPEC_OPTION = { BURST = true, BLOCK = true }
