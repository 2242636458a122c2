#!/usr/bin/env bash
# Instructions per call, counted by callgrind over the whole server (protocol, dispatch, command,
# reply): stable on a busy machine, unlike throughput. Each session runs its own redis-server under
# valgrind with the module (or with redis-cell); its keys are created with instrumentation off,
# then each measured run sends PROFILE_CALLS calls (50 clients, pipeline 16) with it on, and its
# counts are dumped to target/bench/profile/callgrind.NAME. The calls come from redis-benchmark
# (RESP2), or from the bench's own load generator (`compare --drive`, benches/compare/drive.rs)
# for the RESP2 and RESP3 (`HELLO 3`) cases, which turns instrumentation on once its clients are
# connected. The cases with a replica attach a second redis-server (not under valgrind, same
# binary and module) to the measured one and wait for the initial sync first.
#
# usage: benches/profile.sh            (make profile)
# env:   RATELIMIT_MODULE (default target/release/libredis_ratelimit.so), PROFILE_CALLS (100000),
#        PROFILE_KEYS (100000), PROFILE_OUT (target/bench/profile), RATELIMIT_SERVER
#        (default redis-server: the server binary to measure, e.g. valkey-server),
#        REDIS_CELL (default ../shared/peers/libredis_cell.so; measured when present)
set -euo pipefail

cd "$(dirname "$0")/.."
module=$(realpath "${RATELIMIT_MODULE:-target/release/libredis_ratelimit.so}")
calls=${PROFILE_CALLS:-100000}
keys=${PROFILE_KEYS:-100000}
out=${PROFILE_OUT:-target/bench/profile}
cell=${REDIS_CELL:-../shared/peers/libredis_cell.so}
mkdir -p "$out"
server=${RATELIMIT_SERVER:-redis-server}
for tool in valgrind callgrind_control callgrind_annotate "$server" redis-benchmark redis-cli python3; do
    command -v "$tool" >/dev/null || { echo "profile: $tool is missing (apt-get install valgrind redis-tools python3)" >&2; exit 1; }
done
[ -f "$module" ] || { echo "profile: no module at $module (make build)" >&2; exit 1; }
started=$SECONDS

# The bench's load generator (the `compare` bench binary, `--drive` mode).
driver=$(cargo bench --config profile.bench.opt-level=3 --bench compare --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "compare" and m.get("executable"):
        print(m["executable"])')
[ -x "$driver" ] || { echo "profile: could not build the bench's load generator (cargo bench --bench compare --no-run)" >&2; exit 1; }

if [ -f "$cell" ]; then
    cell=$(realpath "$cell")
else
    echo "profile: $cell is absent: redis-cell's CL.THROTTLE is not measured (skipped)" >&2
    cell=""
fi

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

server_pid=""
replica_pid=""
replica_dir=""
cleanup() {
    [ -n "$replica_pid" ] && kill -9 "$replica_pid" 2>/dev/null || true
    [ -n "$server_pid" ] && kill -9 "$server_pid" 2>/dev/null || true
    [ -n "$replica_dir" ] && rm -rf "$replica_dir"
    return 0
}
trap cleanup EXIT

results=()  # "NAME INSTRUCTIONS-PER-CALL"
session=""  # the session's name: its callgrind dumps are $out/callgrind.session.$session.N
dumps=0
port=""

# start NAME [MODULE]: a redis-server under callgrind, instrumentation off, with MODULE (ours by
# default) loaded.
start() {
    session=$1
    local lib=${2:-$module}
    dumps=0
    local attempt
    for attempt in 1 2 3; do
        port=$(free_port)
        rm -f "$out/callgrind.session.$session"*
        valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out/callgrind.session.$session" \
            "$server" --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
            --repl-diskless-sync-delay 0 --dir "$(realpath "$out")" --dbfilename "dump.$session.rdb" \
            --loadmodule "$lib" --logfile "$(realpath "$out")/redis.$session.log" \
            >"$out/valgrind.$session.log" 2>&1 &
        server_pid=$!
        ours "$port" "$server_pid" && return 0
        kill -9 "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
        echo "profile: $session: attempt $attempt: no server of ours on port $port" >&2
    done
    echo "profile: redis-server under valgrind did not start (see $out/valgrind.$session.log)" >&2
    exit 1
}

# ours PORT PID: waits until the server answering on PORT is process PID (valgrind runs it in its
# own process). Another process may take a free port while valgrind starts (the machine runs other
# tests): then ours cannot bind and exits, and no command of ours goes to the other server.
ours() {
    local pid
    for _ in $(seq 300); do
        pid=$(redis-cli -p "$1" info server 2>/dev/null | tr -d '\r' | sed -n 's/^process_id://p')
        [ "$pid" = "$2" ] && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

stop() {
    if [ -n "$replica_pid" ]; then
        kill -9 "$replica_pid" 2>/dev/null || true
        wait "$replica_pid" 2>/dev/null || true
        replica_pid=""
        rm -rf "$replica_dir"
        replica_dir=""
    fi
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
    rm -f "$out/callgrind.session.$session"* "$out/dump.$session.rdb"
}

# fill ARGS...: redis-benchmark with instrumentation off, to create keys.
fill() { redis-benchmark -p "$port" -c 50 -P 16 "$@" >/dev/null; }

# collect NAME: dump what was counted since the last dump to $out/callgrind.NAME, record per call.
collect() {
    local name=$1
    # Off first, then dump: a dump taken while instrumentation is on leaves the next part
    # uncounted (callgrind 3.19).
    callgrind_control -i off "$server_pid" >/dev/null
    callgrind_control -d "$server_pid" >/dev/null
    dumps=$((dumps + 1))
    mv "$out/callgrind.session.$session.$dumps" "$out/callgrind.$name"
    local total
    total=$(callgrind_annotate "$out/callgrind.$name" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
    results+=("$name $((total / calls))")
    echo "profile: $name $((total / calls)) instructions per call ($((SECONDS - started)) s)" >&2
}

# measure NAME ARGS...: PROFILE_CALLS calls from redis-benchmark (RESP2), counted.
measure() {
    local name=$1; shift
    callgrind_control -i on "$server_pid" >/dev/null
    redis-benchmark -p "$port" -c 50 -P 16 -n "$calls" "$@" >/dev/null
    collect "$name"
}

# measure_resp NAME PROTOCOL EXPECT ARGS...: PROFILE_CALLS calls from the bench's own clients
# speaking RESP PROTOCOL (2 or 3), counted from the first call (connections and HELLO are not);
# every reply must begin with EXPECT (1 admitted, 0 rejected).
measure_resp() {
    local name=$1 protocol=$2 expect=$3; shift 3
    local random=()
    [[ "$*" == *__rand_int__* ]] && random=(-r "$keys")
    "$driver" --drive --port "$port" --resp "$protocol" -n "$calls" "${random[@]}" \
        --expect "$expect" --ready "callgrind_control -i on $server_pid >/dev/null" -- "$@" >/dev/null
    collect "$name"
}

# attach_replica: a second redis-server (not under valgrind, same binary, the session's module)
# replicating from the measured one; returns once the link is up and the initial sync is done.
attach_replica() {
    local lib=${1:-$module}
    local rport; rport=$(free_port)
    replica_dir=$(mktemp -d)
    "$server" --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --dir "$replica_dir" \
        --loadmodule "$lib" --logfile "$replica_dir/redis.log" >/dev/null 2>&1 &
    replica_pid=$!
    ours "$rport" "$replica_pid" || { echo "profile: $session: no replica of ours on port $rport" >&2; exit 1; }
    redis-cli -p "$rport" replicaof 127.0.0.1 "$port" >/dev/null
    local info master
    for _ in $(seq 3000); do
        info=$(redis-cli -p "$rport" info replication | tr -d '\r')
        master=$(redis-cli -p "$port" info replication | tr -d '\r')
        if grep -q '^master_link_status:up' <<<"$info" && grep -q '^master_sync_in_progress:0' <<<"$info" \
            && grep -q '^slave0:.*state=online' <<<"$master" \
            && [ "$(sed -n 's/^slave_repl_offset://p' <<<"$info")" = "$(sed -n 's/^master_repl_offset://p' <<<"$master")" ]; then
            echo "profile: $session: replica on port $rport in sync" >&2
            return 0
        fi
        sleep 0.1
    done
    echo "profile: the replica on port $rport did not sync with $session's server (see $replica_dir/redis.log)" >&2
    tail -5 "$replica_dir/redis.log" >&2
    exit 1
}

check() { echo "RATELIMIT.CHECK rl:__rand_int__ $1 100000 60000000000"; }
# The same with common parameters (100 an hour): keys the module keeps in one word
# (docs/operations.md, "Memory per key"), where the parameters above are too wide for one.
check_common() { echo "RATELIMIT.CHECK rl:__rand_int__ $1 100 3600000"; }
compact_algorithms=(token-bucket leaky-bucket fixed-window sliding-window gcra)
hot() { echo "RATELIMIT.CHECK hot $1 1 60000000000"; }
# CL.THROTTLE with the limits of `make bench` (benches/compare/model.rs): 100000 per 60,000,000 s
# with burst 100000 (every call admitted, no key expires), and burst 0 for the rejected hot key.
throttle=(CL.THROTTLE rl:__rand_int__ 100000 100000 60000000 1)
throttle_hot=(CL.THROTTLE hot 0 1 60000000 1)
fill_random=(-r "$keys" -n $((keys * 3)))
set_cmd=(SET rl:__rand_int__ v PXAT 99999999999999)
algorithms=(token-bucket leaky-bucket fixed-window sliding-window sliding-log gcra)

start set
fill "${fill_random[@]}" "${set_cmd[@]}"
measure set -r "$keys" "${set_cmd[@]}"
attach_replica
measure set-replica -r "$keys" "${set_cmd[@]}"
stop

start incr
fill "${fill_random[@]}" INCR rl:__rand_int__
measure incr -r "$keys" INCR rl:__rand_int__
attach_replica
measure incr-replica -r "$keys" INCR rl:__rand_int__
stop

start incr-hot
fill -n 1 INCR hot
measure incr-hot INCR hot
stop

for algorithm in "${algorithms[@]}"; do
    # shellcheck disable=SC2046
    {
        start "$algorithm"
        fill "${fill_random[@]}" $(check "$algorithm")
        measure "$algorithm" -r "$keys" $(check "$algorithm")
        measure_resp "$algorithm-resp2" 2 1 $(check "$algorithm")
        measure_resp "$algorithm-resp3" 3 1 $(check "$algorithm")
        attach_replica
        measure "$algorithm-replica" -r "$keys" $(check "$algorithm")
        stop

        start "$algorithm-rejected"
        fill -n 1 $(hot "$algorithm")
        measure "$algorithm-rejected" $(hot "$algorithm")
        measure_resp "$algorithm-rejected-resp2" 2 0 $(hot "$algorithm")
        measure_resp "$algorithm-rejected-resp3" 3 0 $(hot "$algorithm")
        stop
    }
done

for algorithm in "${compact_algorithms[@]}"; do
    # shellcheck disable=SC2046
    {
        start "$algorithm-common"
        fill "${fill_random[@]}" $(check_common "$algorithm")
        measure "$algorithm-common" -r "$keys" $(check_common "$algorithm")
        stop
    }
done

# The same calls through a policy of the same parameters (`RATELIMIT.CHECK key POLICY name`):
# fewer arguments to parse, one look-up of the name.
policy_algorithms=(token-bucket sliding-window)
for algorithm in "${policy_algorithms[@]}"; do
    # shellcheck disable=SC2046
    {
        start "$algorithm-policy"
        redis-cli -p "$port" RATELIMIT.POLICY SET api "$algorithm" 100 3600000 >/dev/null
        fill "${fill_random[@]}" $(check_common "$algorithm")
        measure "$algorithm-inline" -r "$keys" $(check_common "$algorithm")
        measure "$algorithm-policy" -r "$keys" RATELIMIT.CHECK rl:__rand_int__ POLICY api
        stop
    }
done

start cl-throttle
fill "${fill_random[@]}" "${throttle[@]}"
measure cl-throttle -r "$keys" "${throttle[@]}"
stop
start cl-throttle-rejected
fill -n 1 "${throttle_hot[@]}"
measure cl-throttle-rejected "${throttle_hot[@]}"
stop
if [ -n "$cell" ]; then
    start redis-cell "$cell"
    fill "${fill_random[@]}" "${throttle[@]}"
    measure redis-cell -r "$keys" "${throttle[@]}"
    stop
    start redis-cell-rejected "$cell"
    fill -n 1 "${throttle_hot[@]}"
    measure redis-cell-rejected "${throttle_hot[@]}"
    stop
fi

# inclusive NAME FUNCTION: instructions per call spent in FUNCTION and what it calls (an RM_
# function is VM_ in Valkey).
inclusive() {
    callgrind_annotate --inclusive=yes "$out/callgrind.$1" 2>/dev/null |
        awk -v f="${2/#RM_/[RV]M_}" -v n="$calls" '$0 ~ ":" f " \\[" {gsub(",", "", $1); s += $1} END {printf "%d", s / n}'
}
# The six-field reply: the array (RESP2) or map (RESP3) header and its fields.
reply() {
    local total=0 f
    for f in RM_ReplyWithArray RM_ReplyWithMap RM_ReplyWithLongLong RM_ReplyWithBool \
        RM_ReplyWithSimpleString RM_ReplyWithCallReply; do
        total=$((total + $(inclusive "$1" "$f")))
    done
    echo "$total"
}
lookup() { printf '%s\n' "${results[@]}" | awk -v n="$1" '$1 == n {print $2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.2fx", a / b; else printf "n/a"}'; }
set_ir=$(lookup set); incr_ir=$(lookup incr); hot_ir=$(lookup incr-hot)
set_repl_ir=$(lookup set-replica); incr_repl_ir=$(lookup incr-replica)
set_reply=$(inclusive set addReply); incr_reply=$(inclusive incr addReplyLongLong)
hot_reply=$(inclusive incr-hot addReplyLongLong)
server_version=$("$server" --version | awk '{print $3}' | tr -d 'v=')
{
    echo "#### Instructions per call (callgrind, whole server, 50 clients, pipeline 16, $calls calls)"
    echo
    echo "Module $(git describe --always --dirty 2>/dev/null || echo unknown), $(basename "$server") $server_version."
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
    for algorithm in "${algorithms[@]}"; do
        ir=$(lookup "$algorithm"); rej=$(lookup "$algorithm-rejected")
        repl=$(inclusive "$algorithm" RM_Replicate); out_reply=$(reply "$algorithm")
        rej_reply=$(reply "$algorithm-rejected")
        echo "| $algorithm consuming CHECK, $keys keys | $ir | $(ratio "$ir" "$set_ir") | $(ratio "$ir" "$incr_ir") | $repl | $out_reply | $(ratio $((ir - repl - out_reply)) $((set_ir - set_reply))) of SET's |"
        echo "| $algorithm rejected CHECK, hot key | $rej |  | $(ratio "$rej" "$hot_ir") (hot INCR) | $(inclusive "$algorithm-rejected" RM_Replicate) | $rej_reply | $(ratio $((rej - rej_reply)) $((hot_ir - hot_reply))) of hot INCR's |"
    done
    echo
    echo "#### Instructions per call with a replica attached"
    echo
    echo "The same consuming calls, then again once a second redis-server (the same binary and module,"
    echo "not measured) has attached to the measured one as its replica and finished its initial sync:"
    echo "each write is then also fed to the replication stream, as on a master in production."
    echo
    echo "| command | alone | with a replica | with / alone | vs SET PXAT alone | vs SET PXAT with a replica |"
    echo "|---|---|---|---|---|---|"
    echo "| SET k v PXAT t | $set_ir | $set_repl_ir | $(ratio "$set_repl_ir" "$set_ir") |  |  |"
    echo "| INCR | $incr_ir | $incr_repl_ir | $(ratio "$incr_repl_ir" "$incr_ir") |  |  |"
    for algorithm in "${algorithms[@]}"; do
        ir=$(lookup "$algorithm"); with=$(lookup "$algorithm-replica")
        echo "| $algorithm consuming CHECK | $ir | $with | $(ratio "$with" "$ir") | $(ratio "$ir" "$set_ir") | $(ratio "$with" "$set_repl_ir") |"
    done
    echo
    echo "#### Instructions per call from RESP2 and RESP3 clients"
    echo
    echo "The bench's own load generator (\`compare --drive\`), 50 clients at pipeline 16 either way; for"
    echo "RESP3 each client sends \`HELLO 3\` first (not counted) and gets each decision as a map with a"
    echo "boolean \`allowed\`, where a RESP2 client gets six integers. The last column is the same RESP2"
    echo "calls from redis-benchmark."
    echo
    echo "| algorithm | calls | RESP2 | RESP3 | RESP3 / RESP2 | in the reply: RESP2 / RESP3 | RESP2 from redis-benchmark |"
    echo "|---|---|---|---|---|---|---|"
    for algorithm in "${algorithms[@]}"; do
        for kind in consuming rejected; do
            name=$algorithm; [ "$kind" = rejected ] && name=$algorithm-rejected
            two=$(lookup "$name-resp2"); three=$(lookup "$name-resp3")
            echo "| $algorithm | $kind | $two | $three | $(ratio "$three" "$two") | $(reply "$name-resp2") / $(reply "$name-resp3") | $(lookup "$name") |"
        done
    done
    echo
    echo "#### Keys of common parameters"
    echo
    echo "Consuming calls over $keys random keys at 100 an hour (\`$(check_common "<algorithm>")\`):"
    echo "keys the module keeps as one word beside an entry their parameters share, against the"
    echo "consuming calls above, whose parameters are too wide for a word (a 32-byte value per key;"
    echo "except the fixed window, whose count fits a word either way)."
    echo
    echo "| algorithm | 100 an hour | 100000 per 60000000000 ms | common / wide | common vs SET PXAT |"
    echo "|---|---|---|---|---|"
    for algorithm in "${compact_algorithms[@]}"; do
        common=$(lookup "$algorithm-common"); wide=$(lookup "$algorithm")
        echo "| $algorithm | $common | $wide | $(ratio "$common" "$wide") | $(ratio "$common" "$set_ir") |"
    done
    echo
    echo "#### Through a policy"
    echo
    echo "Consuming calls over $keys random keys at 100 an hour, in one session: inline"
    echo "(\`$(check_common "<algorithm>")\`), then the same keys through a policy of the same"
    echo "parameters (\`RATELIMIT.CHECK rl:<n> POLICY api\`)."
    echo
    echo "| algorithm | inline | POLICY api | policy / inline |"
    echo "|---|---|---|---|"
    for algorithm in "${policy_algorithms[@]}"; do
        inline=$(lookup "$algorithm-inline"); through=$(lookup "$algorithm-policy")
        echo "| $algorithm | $inline | $through | $(ratio "$through" "$inline") |"
    done
    echo
    echo "#### CL.THROTTLE: the module against redis-cell"
    echo
    if [ -n "$cell" ]; then
        echo "redis-cell ($(basename "$cell")) on its own redis-server under callgrind: both register"
        echo "\`CL.THROTTLE\`. Consuming: \`${throttle[*]}\` over $keys random keys; rejected: \`${throttle_hot[*]}\`."
    else
        echo "redis-cell was not measured: \`../shared/peers/libredis_cell.so\` is absent. Consuming:"
        echo "\`${throttle[*]}\` over $keys random keys; rejected: \`${throttle_hot[*]}\`."
    fi
    echo
    cell_ir=$(lookup redis-cell); cell_rej=$(lookup redis-cell-rejected)
    echo "| command | consuming | vs redis-cell | vs SET PXAT | rejected (hot key) | vs redis-cell |"
    echo "|---|---|---|---|---|---|"
    for row in "CL.THROTTLE (ours)|cl-throttle" "RATELIMIT.CHECK ... gcra|gcra"; do
        label=${row%|*}; name=${row#*|}
        ir=$(lookup "$name"); rej=$(lookup "$name-rejected")
        if [ -n "$cell" ]; then
            echo "| $label | $ir | $(ratio "$ir" "$cell_ir") | $(ratio "$ir" "$set_ir") | $rej | $(ratio "$rej" "$cell_rej") |"
        else
            echo "| $label | $ir |  | $(ratio "$ir" "$set_ir") | $rej |  |"
        fi
    done
    if [ -n "$cell" ]; then
        echo "| CL.THROTTLE (redis-cell) | $cell_ir |  | $(ratio "$cell_ir" "$set_ir") | $cell_rej |  |"
    fi
    echo
    echo "make profile took $((SECONDS - started)) s."
} | tee "$out/profile.md"
echo "profile: callgrind files in $out (callgrind_annotate --inclusive=yes FILE)" >&2
