-- seed_sliding_log.lua: the widely used ZSET sliding-log rate limiter, kept
-- unchanged as the baseline the native sliding log is compared with (see
-- docs/equivalence.md, which calls it "the seed script"). Everything below
-- these comment lines is that script as it circulates, byte for byte, from
-- `local key = KEYS[1]` to the final `end`.
--
-- Usage: EVAL <script> 1 <key> <limit> <current_time_ms> <window_ms>
--   ARGV = (limit, current_time, window); replies 1 (allowed) or 0 (rejected).
--
-- Known defects (RATELIMIT.CHECK and sliding_log.lua fix all of them; the
-- latter takes the server's clock when now_ms is passed empty, and never lets
-- time run backwards for a key):
--   * Two requests in the same millisecond collapse into one ZSET member
--     (`ZADD key t t` uses the timestamp as both score and member), so the
--     second one is admitted without being counted: bursts at one ms are not
--     limited at all.
--   * `EXPIRE key window` takes seconds while the window is in milliseconds,
--     so keys live 1000x longer than they need to (a 60000 ms window keeps
--     its key for 60000 s, about 16.7 hours).
--   * It trusts the client's clock: current_time comes from the caller, so
--     clients with skewed clocks disagree about the window: a client whose
--     clock lags adds entries that already look old and leave the window
--     early (it gets more than the limit), one whose clock runs ahead leaves
--     entries that count for too long, and nothing stops time from running
--     backwards for a key.
--   * No retry-after (or remaining / reset) information: the reply is a bare
--     1/0, so callers cannot set Retry-After or X-RateLimit-* headers.
--   * Cost is not supported: every request weighs exactly 1.
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local current_time = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
local clear_before = current_time - window

-- Remove timestamps older than the sliding window
redis.call('ZREMRANGEBYSCORE', key, 0, clear_before)

-- Count current requests in window
local current_requests = redis.call('ZCARD', key)

if current_requests < limit then
    -- Add unique request timestamp to sorted set
    redis.call('ZADD', key, current_time, current_time)
    redis.call('EXPIRE', key, window)
    return 1 -- Allowed
else
    return 0 -- Rejected (HTTP 429 Too Many Requests)
end
