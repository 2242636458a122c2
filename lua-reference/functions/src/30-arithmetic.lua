-- Exact integer arithmetic on doubles below 2^53, and time.

-- Float division is correctly rounded, so floor(a / b) is at most one off; the loops fix it.
local function floor_div(a, b)
  local q = floor(a / b)
  while q * b > a do q = q - 1 end
  while (q + 1) * b <= a do q = q + 1 end
  return q
end

local function ceil_div(a, b)
  local q = floor_div(a, b)
  if q * b < a then q = q + 1 end
  return q
end

-- a*b = q*m + r (0 <= r < m) for integers 0 <= a < m < 2^53 and 0 <= b < 2^53, without forming
-- a*b: binary long multiplication modulo m, every intermediate below m.
local function mul_div(a, b, m)
  local bits = {}
  while b > 0 do
    local bit = b % 2
    bits[#bits + 1] = bit
    b = (b - bit) / 2
  end
  local q, r = 0, 0
  for i = #bits, 1, -1 do
    q = q * 2
    if r >= m - r then r = r - (m - r); q = q + 1 else r = r + r end
    if bits[i] == 1 then
      if r >= m - a then r = r - (m - a); q = q + 1 else r = r + a end
    end
  end
  return q, r
end

-- Integers to decimal. Lua 5.1's %d converts through a C long (64 bits here), exact for every
-- integer a double holds below 2^53; tostring would use %.14g.
local function fmt(n)
  return format('%d', n)
end

-- a + b in decimal, exact also at or above 2^53 (an expiry t + reset_after_ms may get there).
local function fmt_sum(a, b)
  if a + b < EXACT then return fmt(a + b) end
  local a_hi, b_hi = floor_div(a, 1e8), floor_div(b, 1e8)
  local lo = (a - a_hi * 1e8) + (b - b_hi * 1e8)
  local hi = a_hi + b_hi
  if lo >= 1e8 then lo, hi = lo - 1e8, hi + 1 end
  return fmt(hi) .. format('%08d', lo)
end

-- The later of two times in decimal (digit strings without leading zeros).
local function later(a, b)
  if #a ~= #b then
    if #a > #b then return a end
    return b
  end
  if a > b then return a end
  return b
end

-- The start of the window of t (windows of p ms from the epoch).
local function window_start(t, p) -- t - t mod p
  return floor_div(t, p) * p
end

-- The server's clock in ms (a call without AT).
local function server_now()
  local tm = redis.call('TIME')
  return tm[1] * 1000 + floor(tm[2] / 1000) -- digit strings: arithmetic converts them
end
