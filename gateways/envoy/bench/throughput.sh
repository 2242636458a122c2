#!/usr/bin/env bash
# The service's ShouldRateLimit requests per second and latency (p50, p99) for 1 and 3
# descriptors from concurrent gRPC clients, the service in process, Redis with the module on a
# free loopback port; and the baseline (INCRBY + EXPIRE pipelines straight to Redis) for scale.
#
# usage: gateways/envoy/bench/throughput.sh
# env:   RATELIMIT_MODULE, RLS_BENCH (as profile.sh), RLS_BENCH_REQUESTS (50000), RLS_BENCH_CLIENTS
#        (16)
set -euo pipefail

cd "$(dirname "$0")/../../.."
module=$(realpath "${RATELIMIT_MODULE:-target/release/libredis_ratelimit.so}")
requests=${RLS_BENCH_REQUESTS:-50000}
clients=${RLS_BENCH_CLIENTS:-16}
bench=${RLS_BENCH:-}
if [ -z "$bench" ]; then
    CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
        cargo build --release -p redis-ratelimit-rls --bin rls-bench >&2
    bench=target/release/rls-bench
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
    --loadmodule "$module" --logfile "$dir/redis.log" &
pid=$!
trap 'kill -9 $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
for d in 1 3; do
    "$bench" grpc --redis-port "$port" --descriptors "$d" --clients "$clients" --requests "$requests" --warm
    "$bench" grpc --redis-port "$port" --descriptors "$d" --clients "$clients" --requests "$requests" --warm --algorithm sliding-window
    "$bench" baseline --redis-port "$port" --descriptors "$d" --clients "$clients" --requests "$requests" --warm
done
