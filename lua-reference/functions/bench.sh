#!/usr/bin/env bash
# bench.sh PORT [HOST]
#
# Consuming calls per second of the functions library (ratelimit.lua), against the reference
# script of each algorithm (../<algorithm>.lua, EVALSHA) and the module's RATELIMIT.CHECK when
# the server has it, with redis-benchmark: 50 clients, pipelines of 16, 100000 random keys per
# case, the server's clock, limit 100000 per 60000000000 ms (every call admitted and written).
# The concurrency row takes a lease of a random id on one of the keys (ratelimit_acquire against
# RATELIMIT.ACQUIRE, limit 10^12, leases of 60000000000 ms: every call admitted and written; no
# reference script). Cases are interleaved round by round; each cell is the median of the rounds.
#
# It loads the library (FUNCTION LOAD REPLACE) and the scripts (SCRIPT LOAD) into the running
# server, writes keys named rl-bench:<pid>:* only, and deletes them at the end.
# BENCH_N (default 100000) sets the calls per run, BENCH_ROUNDS (default 3) the rounds,
# BENCH_ALGORITHMS (default the six and concurrency) the rows.

set -euo pipefail
PORT=${1:?usage: bench.sh PORT [HOST]}
HOST=${2:-127.0.0.1}
N=${BENCH_N:-100000}
ROUNDS=${BENCH_ROUNDS:-3}
ALGORITHMS=${BENCH_ALGORITHMS:-token-bucket leaky-bucket fixed-window sliding-window sliding-log gcra concurrency}
DIR=$(cd "$(dirname "$0")" && pwd)
PREFIX="rl-bench:$$"

cli() { redis-cli -h "$HOST" -p "$PORT" "$@"; }

cleanup() {
  cli --scan --pattern "$PREFIX:*" | xargs -r -n 1000 redis-cli -h "$HOST" -p "$PORT" DEL >/dev/null
}
trap cleanup EXIT

if ! cli PING >/dev/null 2>&1; then
  echo "bench.sh: no Redis server answers on $HOST:$PORT" >&2
  exit 2
fi
cli -x FUNCTION LOAD REPLACE <"$DIR/ratelimit.lua" >/dev/null
module=no
if [[ $(cli COMMAND INFO ratelimit.check | head -c 1) != "" ]]; then module=yes; fi

rps() {
  redis-benchmark -h "$HOST" -p "$PORT" -n "$N" -c 50 -P 16 -r 100000 -q "$@" 2>/dev/null |
    tr '\r' '\n' | grep -o '[0-9.]* requests per second' | tail -1 | cut -d' ' -f1
}
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

LIMIT=100000 PERIOD=60000000000
printf '%-15s %12s %12s %12s %10s %10s\n' algorithm library reference module lib/ref mod/lib
for alg in $ALGORITHMS; do
  lib=() ref=() mod=()
  if [[ $alg == concurrency ]]; then
    for ((round = 1; round <= ROUNDS; round++)); do
      lib+=("$(rps FCALL ratelimit_acquire 1 "$PREFIX:f:cc:__rand_int__" 1000000000000 $PERIOD \
        ID __rand_int__)")
      if [[ $module == yes ]]; then
        mod+=("$(rps RATELIMIT.ACQUIRE "$PREFIX:n:cc:__rand_int__" 1000000000000 $PERIOD \
          ID __rand_int__)")
      fi
    done
    l=$(median "${lib[@]}") m=-
    if [[ $module == yes ]]; then m=$(median "${mod[@]}"); fi
    printf '%-15s %12s %12s %12s %10s %10s\n' "$alg" "$l" - "$m" - \
      "$(awk -v a="$m" -v b="$l" 'BEGIN { if (a == "-") print "-"; else printf "%.2fx", a / b }')"
    continue
  fi
  sha=$(cli SCRIPT LOAD "$(cat "$DIR/../${alg//-/_}.lua")")
  for ((round = 1; round <= ROUNDS; round++)); do
    lib+=("$(rps FCALL ratelimit_check 1 "$PREFIX:f:$alg:__rand_int__" "$alg" $LIMIT $PERIOD)")
    ref+=("$(rps EVALSHA "$sha" 1 "$PREFIX:r:$alg:__rand_int__" $LIMIT $PERIOD $LIMIT 1 '')")
    if [[ $module == yes ]]; then
      mod+=("$(rps RATELIMIT.CHECK "$PREFIX:n:$alg:__rand_int__" "$alg" $LIMIT $PERIOD)")
    fi
  done
  l=$(median "${lib[@]}") r=$(median "${ref[@]}") m=-
  if [[ $module == yes ]]; then m=$(median "${mod[@]}"); fi
  printf '%-15s %12s %12s %12s %10s %10s\n' "$alg" "$l" "$r" "$m" \
    "$(awk -v a="$l" -v b="$r" 'BEGIN { printf "%.2fx", a / b }')" \
    "$(awk -v a="$m" -v b="$l" 'BEGIN { if (a == "-") print "-"; else printf "%.2fx", a / b }')"
done
