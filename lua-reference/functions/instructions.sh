#!/usr/bin/env bash
# instructions.sh [LIBRARY]
#
# Instructions per call of the functions library (LIBRARY, default ratelimit.lua beside this
# script) against the reference script of each algorithm (../<algorithm>.lua, EVALSHA), counted
# by valgrind's callgrind in a redis-server of its own: unlike calls per second, the count does
# not depend on what else the machine is doing, so two versions can be compared on a busy host.
#
# For each algorithm, four workloads of N calls (redis-benchmark, 1 client, pipelines of 32,
# the server's clock), each counted from a zeroed counter to a dump:
#   new       every call on a new key (random keys), admitted and written: make functions-bench's
#   hot       every call on one key with room left, admitted and written
#   rejected  every call on one full key, rejected (nothing written)
#   spread    every call on one of SPREAD (default 10000) full keys at random, rejected
# The library is called twice: with the period in ms, as the reference script takes it, and with
# a unit (1000d). The counts are of the whole server (parsing, Lua, replies), per call.
#
# Needs valgrind and redis-server/redis-benchmark/redis-cli on PATH. Starts the server on PORT
# (default: a free port from 27000), and stops it at the end. N (default 4000) sets the calls per
# workload, ALGORITHMS (default all six) and WORKLOADS (default all four) which ones run.

set -euo pipefail
DIR=$(cd "$(dirname "$0")" && pwd)
LIBRARY=${1:-$DIR/ratelimit.lua}
N=${N:-4000}
ALGORITHMS=${ALGORITHMS:-token-bucket leaky-bucket fixed-window sliding-window sliding-log gcra}
WORKLOADS=${WORKLOADS:-new hot rejected spread}
SPREAD=${SPREAD:-10000}
PERIOD_MS=86400000000 PERIOD_UNIT=1000d

if [[ -z ${PORT:-} ]]; then
  PORT=27000
  while redis-cli -p "$PORT" PING >/dev/null 2>&1 || ss -ltn 2>/dev/null | grep -q ":$PORT "; do
    PORT=$((PORT + 1))
  done
fi
WORK=$(mktemp -d)
valgrind --tool=callgrind --callgrind-out-file="$WORK/cg" \
  redis-server --port "$PORT" --save '' --appendonly no --dir "$WORK" >"$WORK/valgrind.log" 2>&1 &
PID=$!
cleanup() {
  redis-cli -p "$PORT" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
  wait "$PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

cli() { redis-cli -p "$PORT" "$@"; }
for _ in $(seq 100); do
  if cli PING >/dev/null 2>&1; then break; fi
  sleep 0.2
done
cli -x FUNCTION LOAD REPLACE <"$LIBRARY" >/dev/null

# count ARGS...: instructions per call of N calls of ARGS (redis-benchmark's syntax).
count() {
  callgrind_control -z "$PID" >/dev/null 2>&1
  redis-benchmark -p "$PORT" -n "$N" -c 1 -P 32 -r "$RANGE" -q "$@" >/dev/null 2>&1
  callgrind_control -d "$PID" >/dev/null 2>&1
  local dumps total
  dumps=$(find "$WORK" -name 'cg.*' | wc -l)
  total=$(sed -n 's/^totals: //p' "$WORK/cg.$dumps")
  echo $((total / N))
}

# rejected ARGS...: fails unless ARGS is rejected (the reply's first integer is 0).
rejected() {
  if [[ $(cli "$@" | head -1) != 0 ]]; then
    echo "instructions.sh: $* is not rejected" >&2
    exit 1
  fi
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }

printf 'instructions per call, N=%d (library: %s)\n' "$N" "$(basename "$LIBRARY")"
printf '%-15s %-9s %10s %10s %10s %8s %8s\n' algorithm workload reference 'lib (ms)' \
  'lib (unit)' 'ms/ref' 'unit/ref'
for alg in $ALGORITHMS; do
  sha=$(cli SCRIPT LOAD "$(cat "$DIR/../${alg//-/_}.lua")")
  for workload in $WORKLOADS; do
    key="i:$alg:$workload" RANGE=1000000000
    case $workload in
      new) key="$key:__rand_int__" limit=100000 ;;
      hot) limit=100000 ;;
      rejected)
        limit=10
        cli FCALL ratelimit_check 1 "f:$key" "$alg" $limit $PERIOD_MS COST $limit >/dev/null
        cli FCALL ratelimit_check 1 "u:$key" "$alg" $limit $PERIOD_MS COST $limit >/dev/null
        cli EVALSHA "$sha" 1 "r:$key" $limit $PERIOD_MS $limit $limit '' >/dev/null
        ;;
      spread)
        # SPREAD full keys per engine, named as redis-benchmark names __rand_int__ (12 digits).
        limit=10 RANGE=$SPREAD
        for ((k = 0; k < SPREAD; k++)); do
          printf -v k12 '%012d' "$k"
          echo "FCALL ratelimit_check 1 f:$key:$k12 $alg $limit $PERIOD_MS COST $limit"
          echo "FCALL ratelimit_check 1 u:$key:$k12 $alg $limit $PERIOD_MS COST $limit"
          echo "EVALSHA $sha 1 r:$key:$k12 $limit $PERIOD_MS $limit $limit \"\""
        done | cli >/dev/null
        rejected FCALL ratelimit_check 1 "f:$key:000000000000" "$alg" $limit $PERIOD_MS
        rejected EVALSHA "$sha" 1 "r:$key:000000000000" $limit $PERIOD_MS $limit 1 ''
        key="$key:__rand_int__"
        ;;
    esac
    ref_args=(EVALSHA "$sha" 1 "r:$key" $limit $PERIOD_MS $limit 1 '')
    ms_args=(FCALL ratelimit_check 1 "f:$key" "$alg" $limit $PERIOD_MS)
    unit_args=(FCALL ratelimit_check 1 "u:$key" "$alg" $limit $PERIOD_UNIT)
    if [[ $workload == rejected ]]; then
      rejected "${ref_args[@]}"
      rejected "${ms_args[@]}"
      rejected "${unit_args[@]}"
    fi
    ref=$(count "${ref_args[@]}")
    ms=$(count "${ms_args[@]}")
    unit=$(count "${unit_args[@]}")
    printf '%-15s %-9s %10d %10d %10d %8s %8s\n' "$alg" "$workload" "$ref" "$ms" "$unit" \
      "$(ratio "$ms" "$ref")" "$(ratio "$unit" "$ref")"
  done
done
