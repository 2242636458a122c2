#!/usr/bin/env bash
# check_examples.sh PORT [HOST]
#
# Runs the reference scripts in this directory against a running Redis server
# (redis-cli must be on PATH) and compares their replies with the worked
# examples of docs/algorithms.md, including those that change parameters
# between calls on the same key, run time backwards, use COST 0 and costs
# above the limit, and with gcra's (its rules in docs/algorithms.md, "GCRA"
# and "Parameter changes", worked by hand). For every call it also checks the side effects:
#   - a consuming call (allowed, cost > 0) sets the expiry to t + reset_after_ms
#     (t = max(AT, last));
#   - any other call leaves the key exactly as it was (DUMP and PEXPIRETIME).
# AT values are shifted by BASE, a multiple of one hour (so every period used
# below keeps its window alignment) about 20 minutes or more after the
# server's clock, so that no key expires during the run.
# Exits 0 when everything matches, 1 on any mismatch, 2 on a usage error.
# It only creates and deletes keys named rl-check:<pid>:*.

set -u
PORT=${1:?usage: check_examples.sh PORT [HOST]}
HOST=${2:-127.0.0.1}
DIR=$(cd "$(dirname "$0")" && pwd)

raw() { redis-cli --raw -h "$HOST" -p "$PORT" "$@"; }

if ! raw PING >/dev/null 2>&1; then
  echo "check_examples: no Redis server answers on $HOST:$PORT" >&2
  exit 2
fi

declare -A SHA
for s in token_bucket leaky_bucket fixed_window sliding_window sliding_log gcra; do
  SHA[$s]=$(raw SCRIPT LOAD "$(cat "$DIR/$s.lua")") || exit 2
  if [[ ! ${SHA[$s]} =~ ^[0-9a-f]{40}$ ]]; then
    echo "check_examples: cannot load $s.lua: ${SHA[$s]}" >&2
    exit 2
  fi
done

read -r secs usecs < <(raw TIME | tr '\n' ' ')
now_ms=$(( secs * 1000 + usecs / 1000 ))
HOUR=3600000
BASE=$(( (now_ms + 1200000) / HOUR * HOUR + HOUR ))

fail=0 rows=0 table=0 key='' script='' last=''
state() { printf '%s|%s' "$(raw DUMP "$key" | md5sum)" "$(raw PEXPIRETIME "$key")"; }

while read -r line; do
  [[ -z $line || $line == \#* ]] && continue
  set -- $line
  if [[ $1 == table ]]; then
    script=$2; shift 2; title="$*"
    table=$(( table + 1 )); key="rl-check:$$:$table"; last=''
    raw DEL "$key" >/dev/null
    continue
  fi
  # L P C cost AT | expected reply
  L=$1 P=$2 C=$3 cost=$4 at=$5; shift 6; expected="$*"
  rows=$(( rows + 1 ))
  before=$(state)
  reply=$(raw EVALSHA "${SHA[$script]}" 1 "$key" "$L" "$P" "$C" "$cost" $(( BASE + at )) | tr '\n' ' ')
  reply=${reply% }
  t=$at; [[ -n $last && $last -gt $t ]] && t=$last
  problem=''
  if [[ $reply != "$expected" ]]; then
    problem="reply [$reply], expected [$expected]"
  else
    set -- $reply
    if [[ $1 == 1 && $cost -gt 0 ]]; then
      last=$t
      want=$(( BASE + t + $5 )); got=$(raw PEXPIRETIME "$key")
      [[ $got == "$want" ]] || problem="expiry at $got, expected $want"
    elif [[ $(state) != "$before" ]]; then
      problem="a non-consuming call changed the key"
    fi
  fi
  if [[ -n $problem ]]; then
    fail=$(( fail + 1 ))
    echo "FAIL $script ($title) L=$L P=$P C=$C COST=$cost AT=$at: $problem"
  fi
done <<'EOF'
# ---- docs/algorithms.md worked examples -----------------------------------
# L P C COST AT | allowed limit remaining retry_after reset_after delay
table token_bucket example token-bucket 3 1000
3 1000 3 1 0     | 1 3 2 0 334 0
3 1000 3 1 0     | 1 3 1 0 667 0
3 1000 3 1 0     | 1 3 0 0 1000 0
3 1000 3 1 0     | 0 3 0 334 1000 0
3 1000 3 1 331   | 0 3 0 3 669 0
3 1000 3 2 400   | 0 3 1 267 600 0
3 1000 3 0 1000  | 1 3 3 0 0 0

table leaky_bucket example leaky-bucket 3 1000
3 1000 3 1 0     | 1 3 2 0 334 0
3 1000 3 1 0     | 1 3 1 0 667 334
3 1000 3 1 0     | 1 3 0 0 1000 667
3 1000 3 1 0     | 0 3 0 334 1000 0
3 1000 3 1 331   | 0 3 0 3 669 0
3 1000 3 1 1500  | 1 3 2 0 334 0

table fixed_window example fixed-window 2 1000
2 1000 2 1 100   | 1 2 1 0 900 0
2 1000 2 1 200   | 1 2 0 0 800 0
2 1000 2 1 300   | 0 2 0 700 700 0
2 1000 2 0 999   | 1 2 0 0 1 0
2 1000 2 2 1000  | 1 2 0 0 1000 0
2 1000 2 3 1001  | 0 2 0 -1 999 0

table sliding_window example sliding-window 2 1000
2 1000 2 1 0     | 1 2 1 0 2000 0
2 1000 2 1 100   | 1 2 0 0 1900 0
2 1000 2 1 200   | 0 2 0 1300 1800 0
2 1000 2 1 1500  | 1 2 0 0 1500 0
2 1000 2 1 1999  | 0 2 0 1 1001 0
2 1000 2 1 2000  | 1 2 0 0 2000 0

table sliding_log example sliding-log 2 1000
2 1000 2 1 0     | 1 2 1 0 1000 0
2 1000 2 1 0     | 1 2 0 0 1000 0
2 1000 2 1 500   | 0 2 0 500 500 0
2 1000 2 1 1000  | 1 2 1 0 1000 0
2 1000 2 1 1000  | 1 2 0 0 1000 0
2 1000 2 1 1400  | 0 2 0 600 600 0

# gcra 3 1000: with the same parameters, the token bucket's replies
table gcra example gcra 3 1000
3 1000 3 1 0     | 1 3 2 0 334 0
3 1000 3 1 0     | 1 3 1 0 667 0
3 1000 3 1 0     | 1 3 0 0 1000 0
3 1000 3 1 0     | 0 3 0 334 1000 0
3 1000 3 1 331   | 0 3 0 3 669 0
3 1000 3 2 400   | 0 3 1 267 600 0
3 1000 3 4 400   | 0 3 1 -1 600 0
3 1000 3 0 1000  | 1 3 3 0 0 0

# ---- Parameter changes, time going backwards, COST 0, cost above limit --
# (computed by hand from docs/algorithms.md, "Parameter changes")

table token_bucket changes
# empty it; then 1.5 requests are carried over (clamped to C=5: no change)
3 1000 3 3 0     | 1 3 0 0 1000 0
3 1000 5 0 500   | 1 5 1 0 1167 0
# full again under the stored C=3 at 2000: a fresh key, so full under C=5
3 1000 5 0 2000  | 1 5 5 0 0 0
# 1500 scaled = 1.5 requests -> 3000 under P=2000; admit one
3 2000 3 1 500   | 1 3 0 0 1667 0
# AT 400 runs backwards: evaluated at 500
3 2000 3 1 400   | 0 3 0 334 1667 0
# refill 334 ms at L=3: 2002 = 1.001 requests -> 1001 under P=1000
1 1000 2 1 834   | 1 2 0 0 1999 0
1 1000 2 3 834   | 0 2 0 -1 1999 0
1 1000 2 2 1000  | 0 2 0 1833 1833 0

table leaky_bucket changes
2 1000 4 3 0     | 1 4 1 0 1500 0
2 1000 4 2 0     | 0 4 1 500 1500 0
# drained to 2500 = 2.5 requests -> 7500 under P=3000, clamped to C=2: 6000
1 3000 2 0 250   | 1 2 0 0 6000 6000
1 3000 5 1 250   | 1 5 1 0 10500 7500
# drained to 7500 = 2.5 requests -> 2500 under P=1000
2 1000 4 1 3250  | 1 4 0 0 1750 1250
# empty at 5000: a fresh key
2 1000 4 0 5000  | 1 4 4 0 0 0
2 1000 4 5 5000  | 0 4 4 -1 0 0

table fixed_window changes
3 1000 3 2 100   | 1 3 1 0 900 0
# limit lowered below the count: even COST 0 is rejected until the next window
1 1000 1 0 200   | 0 1 0 800 800 0
# period changed: a fresh window [0, 2000)
5 2000 5 1 300   | 1 5 4 0 1700 0
5 2000 5 4 100   | 1 5 0 0 1700 0
5 2000 5 1 2000  | 1 5 4 0 2000 0
# period changed again: count 0, but 3 > L
2 1000 2 3 2500  | 0 2 2 -1 0 0

table sliding_window changes
4 1000 4 3 0     | 1 4 1 0 2000 0
# prev=3 decaying: 3*(1000-250-d) <= 2000 from d=84
4 1000 4 2 1250  | 0 4 1 84 750 0
2 1000 2 1 1250  | 0 2 0 417 750 0
# period changed: counts start afresh
2 500 2 1 1250   | 1 2 1 0 750 0
2 500 2 2 1600   | 0 2 1 400 400 0
2 500 2 1 1600   | 1 2 0 0 900 0
2 500 2 1 1700   | 0 2 0 300 800 0
1 500 1 1 1700   | 0 1 0 800 800 0

table sliding_log changes
3 1000 3 2 0     | 1 3 1 0 1000 0
3 1000 3 1 600   | 1 3 0 0 1000 0
# shorter period: only the entry at 600 counts
3 500 3 1 700    | 1 3 1 0 500 0
# longer period: the entries at 0 are gone for good
3 2000 3 2 800   | 0 3 1 1800 1900 0
# AT 750 runs backwards? no: last is 700, so t = 750
3 2000 3 1 750   | 1 3 0 0 2000 0
# limit lowered below n: even COST 0 is rejected
1 2000 1 0 1000  | 0 1 0 1700 1750 0
3 2000 3 4 1000  | 0 3 0 -1 1750 0
# a run in one ms: three entries at 1000, never collapsed
3 100 3 3 1000   | 1 3 0 0 100 0
3 100 3 1 1000   | 0 3 0 100 100 0
# time running backwards: evaluated at 1000
3 100 3 1 900    | 0 3 0 100 100 0

table gcra changes
# ten at once: the TAT 1 s ahead (10000 units at L = 10 per ms)
10 1000 10 10 0  | 1 10 0 0 1000 0
# L = 1: the TAT stays 1 s ahead (1000 units); a tolerance of 2 s fits one more
1 1000 2 1 0     | 1 2 0 0 2000 0
1 1000 2 1 0     | 0 2 0 1000 2000 0
# a tolerance of 1 s: the TAT 1.5 s ahead is kept, not clamped, so even COST 0
# is rejected until time catches up
1 1000 1 0 500   | 0 1 0 500 1500 0
1 1000 1 1 500   | 0 1 0 1500 1500 0
1 1000 1 1 1500  | 0 1 0 500 500 0
# the TAT reached at 2000: a fresh key
1 1000 1 1 2000  | 1 1 0 0 1000 0
# AT 1900 is before last: evaluated at 2000
1 1000 1 1 1900  | 0 1 0 1000 1000 0
# L = 3 at 2100: 900 ms ahead are 2700 units; 3700 > 3000
3 1000 3 1 2100  | 0 3 0 234 900 0
3 1000 3 0 2100  | 1 3 0 0 900 0
# at 2334: 666 ms ahead, 1998 units; 2998 fits
3 1000 3 1 2334  | 1 3 0 0 1000 0
# L = 2 at 2335: 2995 units (998.33 ms) become ceil(2995 * 2 / 3) = 1997
2 1000 2 0 2335  | 1 2 0 0 999 0
2 1000 2 1 2335  | 0 2 0 499 999 0
# another period, the same limit: the TAT does not move; 2995 > 3 * 500
3 500 3 0 2335   | 0 3 0 499 999 0
3 500 3 4 2335   | 0 3 0 -1 999 0
# the TAT reached at 3334: a fresh key
3 500 3 3 3334   | 1 3 0 0 500 0
EOF

# clean up
for (( i = 1; i <= table; i++ )); do raw DEL "rl-check:$$:$i" >/dev/null; done

if (( fail > 0 )); then
  echo "check_examples: $fail of $rows calls FAILED"
  exit 1
fi
echo "check_examples: all $rows calls in $table tables match"
exit 0
