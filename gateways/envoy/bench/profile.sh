#!/usr/bin/env bash
# Redis CPU per ShouldRateLimit request: instructions counted by callgrind over the whole
# redis-server (protocol, dispatch, commands, replies), divided by the requests, for what the
# service sends (RATELIMIT.CHECK for one descriptor, RATELIMIT.CHECKALL for three) against what
# envoyproxy/ratelimit's fixed-window cache sends (one pipeline of INCRBY + EXPIRE per
# descriptor). As benches/profile.sh: the server runs under valgrind with instrumentation off;
# the load generator (rls-bench) makes every key once, then turns instrumentation on
# (RLS_BENCH_READY) and sends the measured requests.
#
# usage: gateways/envoy/bench/profile.sh
# env:   RATELIMIT_MODULE (default target/release/libredis_ratelimit.so), RLS_BENCH (the rls-bench
#        binary, default: built with cargo, release without LTO), RLS_PROFILE_REQUESTS (20000),
#        RLS_PROFILE_KEYS (10000), PROFILE_OUT (target/bench/rls-profile), RLS_PROFILE_ROWS (the
#        rows to run, by name, space separated; default all six: baseline-1 baseline-3
#        rls-fixed-window-1 rls-fixed-window-3 rls-sliding-window-1 rls-sliding-window-3)
# prints: NAME instructions-per-request instructions-per-request-without-serverCron
set -euo pipefail

cd "$(dirname "$0")/../../.."
module=$(realpath "${RATELIMIT_MODULE:-target/release/libredis_ratelimit.so}")
requests=${RLS_PROFILE_REQUESTS:-20000}
keys=${RLS_PROFILE_KEYS:-10000}
out=${PROFILE_OUT:-target/bench/rls-profile}
mkdir -p "$out"
for tool in valgrind callgrind_control callgrind_annotate redis-server redis-cli python3; do
    command -v "$tool" >/dev/null || { echo "profile: $tool is missing (apt-get install valgrind redis-tools)" >&2; exit 1; }
done
[ -f "$module" ] || { echo "profile: no module at $module (make build)" >&2; exit 1; }
bench=${RLS_BENCH:-}
if [ -z "$bench" ]; then
    CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
        cargo build --release -p redis-ratelimit-rls --bin rls-bench >&2
    bench=target/release/rls-bench
fi

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

pid=""
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true; }
trap cleanup EXIT

rows=${RLS_PROFILE_ROWS:-baseline-1 baseline-3 rls-fixed-window-1 rls-fixed-window-3 rls-sliding-window-1 rls-sliding-window-3}

# run NAME ARGS...: one measured session (if NAME is among the rows); prints "NAME
# instructions-per-request instructions-per-request-without-serverCron" (serverCron's inclusive
# count subtracted: its memory statistics every 100 ms cost what the run lasts, not what it sends).
run() {
    local name=$1; shift
    case " $rows " in *" $name "*) ;; *) return 0 ;; esac
    local port; port=$(free_port)
    rm -f "$out/callgrind.$name"*
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out/callgrind.$name" \
        redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
        --loadmodule "$module" --logfile "$(realpath "$out")/redis.$name.log" \
        >"$out/valgrind.$name.log" 2>&1 &
    pid=$!
    local up=""
    for _ in $(seq 300); do
        if [ "$(redis-cli -p "$port" info server 2>/dev/null | tr -d '\r' | sed -n 's/^process_id://p')" = "$pid" ]; then
            up=1; break
        fi
        sleep 0.1
    done
    [ -n "$up" ] || { echo "profile: redis-server under valgrind did not start" >&2; exit 1; }
    RLS_BENCH_READY="callgrind_control -i on $pid >/dev/null" \
        "$bench" "$@" --redis-port "$port" --requests "$requests" --keys "$keys" --clients 8 --warm >&2
    callgrind_control -i off "$pid" >/dev/null
    callgrind_control -d "$pid" >/dev/null
    local total
    total=$(callgrind_annotate "$out/callgrind.$name.1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
    local cron
    cron=$(callgrind_annotate --inclusive=yes --threshold=100 "$out/callgrind.$name.1" 2>/dev/null |
        awk '!found && $0 ~ /:serverCron[ ]/ {gsub(",", "", $1); print $1; found = 1}')
    cron=${cron:-0}
    redis-cli -p "$port" info commandstats | tr -d '\r' | grep '^cmdstat' >"$out/commandstats.$name.txt" || true
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    wait "$pid" 2>/dev/null || true
    pid=""
    echo "$name $((total / requests)) $(((total - cron) / requests))"
}

{
    run baseline-1 baseline --descriptors 1
    run baseline-3 baseline --descriptors 3
    run rls-fixed-window-1 grpc --descriptors 1 --algorithm fixed-window
    run rls-fixed-window-3 grpc --descriptors 3 --algorithm fixed-window
    run rls-sliding-window-1 grpc --descriptors 1 --algorithm sliding-window
    run rls-sliding-window-3 grpc --descriptors 3 --algorithm sliding-window
} | tee "$out/results.txt"
