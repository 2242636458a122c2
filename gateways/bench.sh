#!/usr/bin/env bash
# The gateways measured: requests/s and p99 of NGINX and HAProxy (one worker, one thread) serving
# a static response without a limiter, with redis-ratelimit's Lua module (a consuming CHECK per
# request, admitted), and with the proxy's own per-instance limiter (limit_req, a stick table),
# loaded by wrk over 16 connections and again over 64, then over one connection for the latency
# alone; and one Redis round trip of that CHECK alone (redis-benchmark, one connection). Prints a
# Markdown table.
#
#   bash gateways/bench.sh            (DURATION=5s CONNECTIONS="16 64" ROUNDS=3 by default)
#
# CONNECTIONS lists wrk's connection counts: the table's first columns are at the first (as
# benches/results/gateways.md has them), then requests/s, p99 and proxy CPU at each other. With
# the limiter, throughput at few connections is bounded by the round trip times the connections
# rather than by the worker's CPU; 64 loads one worker to saturation.
#
# The six cases run one after another in each of ROUNDS rounds (interleaved, so that a change of
# the machine's load falls on all of them alike); the table gives each column's median over the
# rounds, and ROUNDS_DETAIL=1 prints every round's row too (on stderr).
#
# Needs nginx, libnginx-mod-http-lua, haproxy, wrk, redis-server, redis-tools (installed with
# apt-get where missing, as root) and the module (RATELIMIT_MODULE, default the release build).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODULE=${RATELIMIT_MODULE:-$ROOT/target/release/libredis_ratelimit.so}
DURATION=${DURATION:-5s}
ROUNDS=${ROUNDS:-3}
CONNECTIONS=${CONNECTIONS:-16 64}
[ -f "$MODULE" ] || { echo "bench.sh: no module at $MODULE (make build)" >&2; exit 1; }

missing=""
command -v nginx >/dev/null || missing+=" nginx"
[ -e /usr/lib/nginx/modules/ngx_http_lua_module.so ] || missing+=" libnginx-mod-http-lua"
command -v haproxy >/dev/null || missing+=" haproxy"
command -v wrk >/dev/null || missing+=" wrk"
command -v redis-benchmark >/dev/null || missing+=" redis-tools"
if [ -n "$missing" ]; then
  echo "installing:$missing" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing >/dev/null
fi

WORK=$(mktemp -d)
[ -z "${KEEP:-}" ] || echo "bench.sh: keeping $WORK" >&2
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  sleep 0.3
  for pid in "${PIDS[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
  [ -n "${KEEP:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# Starts "$@" as the leader of its own process group (killed with it at exit).
start() { setsid "$@" >"$WORK/$(basename "$1").$RANDOM.log" 2>&1 & PIDS+=($!); }
wait_port() {
  for _ in $(seq 1 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done
  echo "bench.sh: nothing listens on $1" >&2; exit 1
}

LIB=$WORK/lib
mkdir -p "$LIB"
cp "$ROOT/gateways/lua/ratelimit_core.lua" "$LIB/"
REDIS_PORT=$(free_port)
start redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
  --loadmodule "$MODULE"
wait_port "$REDIS_PORT"

# A limit that admits every request: each one is a consuming CHECK on one key.
LIMIT="sliding-window 1000000000 1m"

nginx_conf() { # $1: port, $2: what the location does before answering
  cat <<EOF
worker_processes 1;
daemon off;
pid $WORK/nginx.$1.pid;
error_log $WORK/nginx.$1.error.log warn;
load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
events { worker_connections 1024; }
http {
    access_log off;
    lua_package_path "$LIB/?.lua;;";
    lua_shared_dict ratelimit 1m;
    init_by_lua_block { require("ratelimit").configure{ redis = "127.0.0.1:$REDIS_PORT", timeout_ms = 50 } }
    limit_req_zone \$binary_remote_addr zone=perip:1m rate=1000000r/s;
    server {
        listen 127.0.0.1:$1;
        location / {
            $2
            empty_gif;
        }
    }
}
EOF
}

haproxy_cfg() { # $1: port, $2: rules before the answer
  cat <<EOF
global
    nbthread 1
    lua-prepend-path $LIB/?.lua
    lua-load-per-thread $LIB/rules.lua
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend bench
    bind 127.0.0.1:$1
    stick-table type ip size 100k expire 30s store http_req_rate(1s)
    $2
    http-request return status 200 content-type text/plain string "ok\n"
EOF
}

cp "$ROOT/gateways/nginx/ratelimit.lua" "$LIB/ratelimit.lua"
NGINX_PLAIN=$(free_port); NGINX_LIMITED=$(free_port); NGINX_OWN=$(free_port)
nginx_conf "$NGINX_PLAIN" "" >"$WORK/nginx-plain.conf"
nginx_conf "$NGINX_LIMITED" "access_by_lua_block { require(\"ratelimit\").limit{ key = \"bench\", limit = \"$LIMIT\" } }" >"$WORK/nginx-limited.conf"
nginx_conf "$NGINX_OWN" "limit_req zone=perip burst=1000000 nodelay;" >"$WORK/nginx-own.conf"
for v in plain limited own; do start nginx -p "$WORK/" -c "$WORK/nginx-$v.conf"; done

# HAProxy's module is a file of its own name: a directory of its own.
HLIB=$WORK/hlib
mkdir -p "$HLIB"
cp "$ROOT/gateways/lua/ratelimit_core.lua" "$HLIB/"
cp "$ROOT/gateways/haproxy/ratelimit.lua" "$HLIB/ratelimit.lua"
cat >"$HLIB/rules.lua" <<EOF
local ratelimit = require("ratelimit")
ratelimit.configure{ redis = "127.0.0.1:$REDIS_PORT", timeout_ms = 50 }
ratelimit.rule("bench", { key = "txn.key", limit = "$LIMIT" })
EOF
LIB=$HLIB
HAPROXY_PLAIN=$(free_port); HAPROXY_LIMITED=$(free_port); HAPROXY_OWN=$(free_port)
haproxy_cfg "$HAPROXY_PLAIN" "" >"$WORK/haproxy-plain.cfg"
haproxy_cfg "$HAPROXY_LIMITED" "http-request set-var(txn.key) str(bench)
    http-request lua.ratelimit bench" >"$WORK/haproxy-limited.cfg"
haproxy_cfg "$HAPROXY_OWN" "http-request track-sc0 src
    http-request deny deny_status 429 if { sc_http_req_rate(0) gt 100000000 }" >"$WORK/haproxy-own.cfg"
HAPROXY_PIDS=()
for v in plain limited own; do start haproxy -db -f "$WORK/haproxy-$v.cfg"; HAPROXY_PIDS+=("${PIDS[-1]}"); done

for port in $NGINX_PLAIN $NGINX_LIMITED $NGINX_OWN $HAPROXY_PLAIN $HAPROXY_LIMITED $HAPROXY_OWN; do
  wait_port "$port"
done

# Each limited proxy decides through Redis (the module's CHECK count grows), and NGINX sends
# the fields (HAProxy's `http-request return` answers pass no http-response rule).
checks() { redis-cli -p "$REDIS_PORT" INFO commandstats | awk -F'[=,:]' '/^cmdstat_ratelimit.check:/ { print $3 }'; }
for port in $NGINX_LIMITED $HAPROXY_LIMITED; do
  before=$(checks); before=${before:-0}
  curl -s -o /dev/null "http://127.0.0.1:$port/"
  [ "$(checks)" -gt "$before" ] || { echo "bench.sh: the proxy on $port did not call Redis" >&2; exit 1; }
done
curl -si "http://127.0.0.1:$NGINX_LIMITED/" | grep -qi '^ratelimit:' \
  || { echo "bench.sh: NGINX sends no RateLimit field" >&2; exit 1; }

# CPU time (user + system, in clock ticks) of the processes "$@".
ticks() { local t=0 pid; for pid in "$@"; do t=$((t + $(awk '{ print $14 + $15 }' "/proc/$pid/stat"))); done; echo "$t"; }
# The proxy's worker: nginx's master's child, or haproxy itself.
worker() { pgrep -P "$1" || echo "$1"; }
REDIS_PID=$(redis-cli -p "$REDIS_PORT" INFO server | awk -F: '/^process_id:/ { print $2 + 0 }')
HZ=$(getconf CLK_TCK)

# wrk's 50% and 99% latencies in µs (p50, p99).
LATENCY='function us(v) { if (v ~ /us$/) { sub("us", "", v); return v } if (v ~ /ms$/) { sub("ms", "", v); return v * 1000 } sub("s", "", v); return v * 1000000 }
  $1 == "50%" { p50 = us($2) } $1 == "99%" { p99 = us($2) }'

# wrk on port $1 (proxy pid $2) over $3 connections: requests/s, p99 (µs), the CPU µs per
# request of the proxy's worker and of redis-server.
loaded() {
  local out pid before redis_before after redis_after
  pid=$(worker "$2")
  before=$(ticks "$pid"); redis_before=$(ticks "$REDIS_PID")
  out=$(wrk -t1 -c"$3" -d"$DURATION" --latency "http://127.0.0.1:$1/")
  after=$(ticks "$pid"); redis_after=$(ticks "$REDIS_PID")
  local non2xx
  non2xx=$(awk '/Non-2xx/ { print $NF }' <<<"$out")
  [ -z "$non2xx" ] || { echo "bench.sh: $non2xx non-2xx responses on $1" >&2; exit 1; }
  awk -v t="$((after - before))" -v r="$((redis_after - redis_before))" -v hz="$HZ" '
    /^Requests\/sec:/ { rps = $2 }
    /requests in/ { n = $1 }
  '"$LATENCY"'
    END { printf "%d %d %.1f %.1f", rps, p99, t * 1e6 / hz / n, r * 1e6 / hz / n }' <<<"$out"
}

# One row of a case: at the first of $CONNECTIONS requests/s, p99, proxy and redis-server CPU
# per request; p50 and p99 over one connection; then at each other count requests/s, p99 and
# proxy CPU per request.
measure() {
  local first="" extra="" c row
  for c in $CONNECTIONS; do
    row=$(loaded "$1" "$2" "$c")
    if [ -z "$first" ]; then first=$row; else extra+=" $(cut -d' ' -f1-3 <<<"$row")"; fi
  done
  # Latency alone: one connection.
  local one
  one=$(wrk -t1 -c1 -d"$DURATION" --latency "http://127.0.0.1:$1/" | awk "$LATENCY"' END { printf "%d %d", p50, p99 }')
  echo "$first $one$extra"
}

RTT=$(redis-benchmark -p "$REDIS_PORT" -c 1 -n 20000 --precision 3 --csv \
  RATELIMIT.CHECK rtt sliding-window 1000000000 1m | awk -F'"' 'NR == 2 { printf "%d µs, p99 %d", $10 * 1000, $14 * 1000 }')

median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

CASES=()
for proxy in nginx haproxy; do
  if [ $proxy = nginx ]; then
    ports=("$NGINX_PLAIN" "$NGINX_LIMITED" "$NGINX_OWN"); own="limit_req"
    pids=("$(cat "$WORK/nginx.$NGINX_PLAIN.pid")" "$(cat "$WORK/nginx.$NGINX_LIMITED.pid")" "$(cat "$WORK/nginx.$NGINX_OWN.pid")")
  else
    ports=("$HAPROXY_PLAIN" "$HAPROXY_LIMITED" "$HAPROXY_OWN"); own="stick table"
    pids=("${HAPROXY_PIDS[@]}")
  fi
  what=("no limiter" "redis-ratelimit" "$own")
  for i in 0 1 2; do CASES+=("$proxy, ${what[$i]}|${ports[$i]}|${pids[$i]}"); done
done

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
for round in $(seq 1 "$ROUNDS"); do
  for c in "${!CASES[@]}"; do
    IFS='|' read -r name port pid <<<"${CASES[$c]}"
    measure "$port" "$pid" >>"$WORK/case.$c"
    [ -z "${ROUNDS_DETAIL:-}" ] || echo "round $round | $name | $(tail -n1 "$WORK/case.$c")" >&2
  done
done

echo "Load average before: $LOAD_BEFORE on $(nproc) CPUs; medians of $ROUNDS interleaved rounds of $DURATION per case."
echo
read -r FIRST MORE <<<"$CONNECTIONS"
header="| proxy (1 worker) | requests/s, $FIRST connections | p99 (µs), $FIRST connections | proxy CPU µs/request | redis-server CPU µs/request | p50 / p99 (µs), 1 connection |"
rule="|---|---|---|---|---|---|"
for n in $MORE; do
  header+=" requests/s, $n connections | p99 (µs), $n connections | proxy CPU µs/request, $n connections |"
  rule+="---|---|---|"
done
echo "$header"
echo "$rule"
declare -A RPS P50 P99 CPU
for c in "${!CASES[@]}"; do
  IFS='|' read -r name _ _ <<<"${CASES[$c]}"
  col() { awk -v k="$1" '{ print $k }' "$WORK/case.$c" | median; }
  RPS[$c]=$(col 1); P50[$c]=$(col 5); P99[$c]=$(col 6); CPU[$c]=$(col 3)
  line="| $name | ${RPS[$c]} | $(col 2) | ${CPU[$c]} | $(col 4) | ${P50[$c]} / ${P99[$c]} |"
  k=7
  for n in $MORE; do
    RPS[$c.$n]=$(col $k); CPU[$c.$n]=$(col $((k + 2)))
    line+=" ${RPS[$c.$n]} | $(col $((k + 1))) | ${CPU[$c.$n]} |"
    k=$((k + 3))
  done
  echo "$line"
done
echo
echo "One Redis round trip of RATELIMIT.CHECK (redis-benchmark, 1 connection): p50 $RTT µs."
for p in 0 3; do
  name=${CASES[$p]%%,*}
  awk -v n="$name" -v a="${RPS[$p]}" -v b="${RPS[$((p + 1))]}" -v p50a="${P50[$p]}" -v p50b="${P50[$((p + 1))]}" \
    -v p99a="${P99[$p]}" -v p99b="${P99[$((p + 1))]}" 'BEGIN { printf "%s: with the limiter %.2fx the requests/s without it; over 1 connection it adds %d µs to the p50, %d µs to the p99.\n", n, b / a, p50b - p50a, p99b - p99a }'
  for m in $MORE; do
    awk -v n="$name" -v m="$m" -v a="${RPS[$p.$m]}" -v b="${RPS[$((p + 1)).$m]}" -v ca="${CPU[$p.$m]}" -v cb="${CPU[$((p + 1)).$m]}" \
      'BEGIN { printf "%s at %d connections: with the limiter %.2fx the requests/s without it; the proxy CPU per request %.2fx.\n", n, m, b / a, cb / ca }'
  done
done
echo "Load average after: $(cut -d' ' -f1-3 /proc/loadavg)."
