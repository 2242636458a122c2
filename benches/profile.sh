#!/usr/bin/env bash
# Instructions per call, counted by callgrind over the whole server (protocol, dispatch, command,
# reply): stable on a busy machine, unlike throughput. Each subject runs on its own redis-server
# started under valgrind with the module; keys are created first with instrumentation off, then
# `redis-benchmark` sends PROFILE_CALLS calls (50 clients, pipeline 16) with it on.
#
# usage: benches/profile.sh            (make profile)
# env:   RATELIMIT_MODULE (default target/release/libredis_ratelimit.so), PROFILE_CALLS (100000),
#        PROFILE_KEYS (100000), PROFILE_OUT (target/bench/profile)
set -euo pipefail

cd "$(dirname "$0")/.."
module=$(realpath "${RATELIMIT_MODULE:-target/release/libredis_ratelimit.so}")
calls=${PROFILE_CALLS:-100000}
keys=${PROFILE_KEYS:-100000}
out=${PROFILE_OUT:-target/bench/profile}
mkdir -p "$out"
for tool in valgrind callgrind_control callgrind_annotate redis-server redis-benchmark redis-cli; do
    command -v "$tool" >/dev/null || { echo "profile: $tool is missing (apt-get install valgrind redis-tools)" >&2; exit 1; }
done
[ -f "$module" ] || { echo "profile: no module at $module (make build)" >&2; exit 1; }

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

server_pid=""
cleanup() { [ -n "$server_pid" ] && kill -9 "$server_pid" 2>/dev/null || true; }
trap cleanup EXIT

# profile NAME SETUP-ARGS... -- CALL-ARGS...: instructions per call of CALL-ARGS, after SETUP-ARGS
# (a redis-benchmark command line, run uninstrumented to create the keys).
profile() {
    local name=$1; shift
    local setup=() call=()
    while [ "$1" != "--" ]; do setup+=("$1"); shift; done
    shift
    call=("$@")
    local port; port=$(free_port)
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out/callgrind.$name" \
        redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
        --loadmodule "$module" --logfile "$out/redis.$name.log" >"$out/valgrind.$name.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 200); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
    if [ "${#setup[@]}" -gt 0 ]; then
        redis-benchmark -p "$port" -c 50 -P 16 "${setup[@]}" >/dev/null
    fi
    callgrind_control -i on "$server_pid" >/dev/null
    redis-benchmark -p "$port" -c 50 -P 16 -n "$calls" "${call[@]}" >/dev/null
    callgrind_control -i off "$server_pid" >/dev/null
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
    local total
    total=$(callgrind_annotate "$out/callgrind.$name" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
    echo "$name $((total / calls))"
}

check() { echo "RATELIMIT.CHECK rl:__rand_int__ $1 100000 60000000000"; }
hot() { echo "RATELIMIT.CHECK hot $1 1 60000000000"; }
fill=(-r "$keys" -n $((keys * 3)))

results=()
results+=("$(profile set "${fill[@]}" SET rl:__rand_int__ v PXAT 99999999999999 -- -r "$keys" SET rl:__rand_int__ v PXAT 99999999999999)")
results+=("$(profile incr "${fill[@]}" INCR rl:__rand_int__ -- -r "$keys" INCR rl:__rand_int__)")
results+=("$(profile incr-hot -n 1 INCR hot -- INCR hot)")
for algorithm in token-bucket leaky-bucket fixed-window sliding-window sliding-log; do
    # shellcheck disable=SC2046
    results+=("$(profile "$algorithm" "${fill[@]}" $(check "$algorithm") -- -r "$keys" $(check "$algorithm"))")
    # shellcheck disable=SC2046
    results+=("$(profile "$algorithm-rejected" -n 1 $(hot "$algorithm") -- $(hot "$algorithm"))")
done

# inclusive NAME FUNCTION: instructions per call spent in FUNCTION and what it calls.
inclusive() {
    callgrind_annotate --inclusive=yes "$out/callgrind.$1" 2>/dev/null |
        awk -v f="$2" -v n="$calls" '$0 ~ ":" f " \\[" {gsub(",", "", $1); s += $1} END {printf "%d", s / n}'
}
# The six-field reply: the array header and its integers.
reply() { echo $(( $(inclusive "$1" RM_ReplyWithArray) + $(inclusive "$1" RM_ReplyWithLongLong) )); }
lookup() { printf '%s\n' "${results[@]}" | awk -v n="$1" '$1 == n {print $2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2fx", a / b}'; }
set_ir=$(lookup set); incr_ir=$(lookup incr); hot_ir=$(lookup incr-hot)
set_reply=$(inclusive set addReply); incr_reply=$(inclusive incr addReplyLongLong)
hot_reply=$(inclusive incr-hot addReplyLongLong)
{
    echo "#### Instructions per call (callgrind, whole server, 50 clients, pipeline 16, $calls calls)"
    echo
    echo "Module $(git describe --always --dirty 2>/dev/null || echo unknown), $(redis-server --version | awk '{print $3}' | tr -d 'v=')."
    echo
    echo "The last column leaves out what the contract makes a CHECK pay and its floor does not: the"
    echo "replication of the new state by name (RM_Replicate) and the six-field reply, against the"
    echo "floor without its own reply (+OK for SET, one integer for INCR)."
    echo
    echo "| command | instructions / call | vs SET PXAT | vs INCR | in RM_Replicate | in the reply | the rest vs the floor's rest |"
    echo "|---|---|---|---|---|---|---|"
    echo "| SET k v PXAT t, $keys keys | $set_ir |  | $(ratio "$set_ir" "$incr_ir") |  | $set_reply |  |"
    echo "| INCR, $keys keys | $incr_ir |  |  |  | $incr_reply |  |"
    echo "| INCR, one hot key | $hot_ir |  |  |  | $hot_reply |  |"
    for algorithm in token-bucket leaky-bucket fixed-window sliding-window sliding-log; do
        ir=$(lookup "$algorithm"); rej=$(lookup "$algorithm-rejected")
        repl=$(inclusive "$algorithm" RM_Replicate); out_reply=$(reply "$algorithm")
        rej_reply=$(reply "$algorithm-rejected")
        echo "| $algorithm consuming CHECK, $keys keys | $ir | $(ratio "$ir" "$set_ir") | $(ratio "$ir" "$incr_ir") | $repl | $out_reply | $(ratio $((ir - repl - out_reply)) $((set_ir - set_reply))) of SET's |"
        echo "| $algorithm rejected CHECK, hot key | $rej |  | $(ratio "$rej" "$hot_ir") (hot INCR) | $(inclusive "$algorithm-rejected" RM_Replicate) | $rej_reply | $(ratio $((rej - rej_reply)) $((hot_ir - hot_reply))) of hot INCR's |"
    done
} | tee "$out/profile.md"
echo "profile: callgrind files in $out (callgrind_annotate --inclusive=yes FILE)" >&2
