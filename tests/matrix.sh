#!/usr/bin/env bash
# `make test-matrix`: the integration suites once per server found on this machine, then a table of
# server, version and tests passed / failed / skipped.
#
# Servers: the system `redis-server`; Valkey 8 (`valkey-server`, installed from Debian's
# bookworm-backports suite when missing, on the mirror the machine's apt sources already use); and
# each `redis-server` and `valkey-server` under ../shared/servers/*/ when that folder exists (Redis
# 7.2, 7.4, 8.0-m01, Valkey 7.2); and Debian 13's Redis 8.0 and Valkey 8.1, run from a trixie
# root that tests/debian13.sh makes with debootstrap from the same mirror (cached in
# target/debian13/). A test that needs something a server lacks records a skip (`common::skip`)
# and returns: the "skipped" column counts those tests, which are not counted as passed
# (tests/summary.sh, as `make test` counts them).
#
# Environment: RATELIMIT_MODULE (set by make), MATRIX_SERVERS (a space-separated list of server
# binaries, instead of discovering them), MATRIX_NO_INSTALL=1 (never apt-get Valkey nor make the
# Debian 13 root), MATRIX_TESTS (the integration test binary's arguments, e.g. `commands::
# leases:: --skip functions::`: only those tests run on each server; `make test-dist` runs a
# subset that covers every command this way), MATRIX_SKIP (server binaries to leave out, each
# said on a line: .ci/run leaves out the system's redis-server, on which `make test` has just run
# the same tests with the same module).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log_dir=target/matrix
mkdir -p "$log_dir"
rm -f "$log_dir"/*.log "$log_dir"/*.skips

apt_get() {
    if [ "$(id -u)" = 0 ]; then
        env DEBIAN_FRONTEND=noninteractive apt-get "$@"
    else
        sudo env DEBIAN_FRONTEND=noninteractive apt-get "$@"
    fi
}

# Valkey from bookworm-backports, on the Debian mirror the machine's apt sources name.
install_valkey() {
    [ "${MATRIX_NO_INSTALL:-0}" = 1 ] && return 1
    command -v apt-get >/dev/null 2>&1 || return 1
    if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
        local mirror
        mirror=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null)
        [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $3 ~ /^bookworm/ { print $2; exit }' \
            /etc/apt/sources.list 2>/dev/null)
        [ -n "$mirror" ] || { echo "matrix: no Debian mirror in the apt sources" >&2; return 1; }
        printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
            "$mirror" | (if [ "$(id -u)" = 0 ]; then tee /etc/apt/sources.list.d/bookworm-backports.sources; \
                         else sudo tee /etc/apt/sources.list.d/bookworm-backports.sources; fi) >/dev/null
    fi
    apt_get update -qq && apt_get install -y -qq -t bookworm-backports valkey-server valkey-tools >/dev/null
    # The package starts a service on port 6379: the tests never need it.
    if command -v systemctl >/dev/null 2>&1; then
        systemctl stop valkey-server >/dev/null 2>&1 || true
        systemctl disable valkey-server >/dev/null 2>&1 || true
    fi
    command -v valkey-server >/dev/null 2>&1
}

servers=()
if [ -n "${MATRIX_SERVERS:-}" ]; then
    read -r -a servers <<<"$MATRIX_SERVERS"
else
    command -v redis-server >/dev/null 2>&1 && servers+=("$(command -v redis-server)")
    if ! command -v valkey-server >/dev/null 2>&1; then
        echo "matrix: installing valkey-server from bookworm-backports"
        install_valkey || echo "matrix: valkey-server could not be installed; Valkey is not tested" >&2
    fi
    command -v valkey-server >/dev/null 2>&1 && servers+=("$(command -v valkey-server)")
    for server in ../shared/servers/*/redis-server ../shared/servers/*/valkey-server; do
        [ -x "$server" ] && servers+=("$(realpath "$server")")
    done
    [ -d ../shared/servers ] || echo "matrix: ../shared/servers is absent: only the local servers are tested"
    # Debian 13's Redis 8.0 and Valkey 8.1, from a trixie root tests/debian13.sh makes (cached).
    if [ "${MATRIX_NO_INSTALL:-0}" = 1 ] && [ ! -f target/debian13/root/.ready ]; then
        echo "matrix: MATRIX_NO_INSTALL=1 and no Debian 13 root yet: Redis 8.0 and Valkey 8.1 are not tested"
    elif debian13=$(bash tests/debian13.sh | tail -n 1) && [ -x "$debian13/redis-server" ]; then
        servers+=("$debian13/redis-server" "$debian13/valkey-server")
    else
        echo "matrix: the Debian 13 root could not be made: Redis 8.0 and Valkey 8.1 are not tested" >&2
    fi
fi
if [ -n "${MATRIX_SKIP:-}" ]; then
    kept=()
    for server in "${servers[@]}"; do
        if [[ " $MATRIX_SKIP " == *" $server "* ]]; then
            echo "matrix: $server left out (MATRIX_SKIP)"
        else
            kept+=("$server")
        fi
    done
    servers=("${kept[@]}")
fi
[ ${#servers[@]} -gt 0 ] || { echo "matrix: no server found" >&2; exit 1; }

# What runs on each server: every test, or the integration tests MATRIX_TESTS names.
if [ -n "${MATRIX_TESTS:-}" ]; then
    read -r -a filters <<<"$MATRIX_TESTS"
    cargo_args=(--test integration --no-fail-fast -- "${filters[@]}")
else
    # The gateways' tests (NGINX, HAProxy) test the proxies' Lua, not the server: `make test`
    # runs them on the system's redis-server.
    cargo_args=(--tests --no-fail-fast -- --skip gateways::)
fi

# The suites mostly wait on their servers: four tests at a time, as `make test` runs them.
export RUST_TEST_THREADS=${RUST_TEST_THREADS:-4}

# Compile the test binaries once, outside the per-server runs.
cargo test --profile tests --tests --no-run --quiet || exit 1

rows=()
failed_servers=0
total_passed=0
total_failed=0
total_skipped=0
for server in "${servers[@]}"; do
    version=$("$server" --version | grep -o 'v=[^ ]*' | cut -c3-)
    name=redis
    cli=$(dirname "$server")/redis-cli
    [ -x "$cli" ] || cli=$(command -v redis-cli)
    case $(basename "$server") in
        valkey*)
            name=valkey
            cli=$(dirname "$server")/valkey-cli
            [ -x "$cli" ] || cli=$(command -v valkey-cli)
            ;;
    esac
    label="$name $version"
    # A preview reports its own version number (8.0-m01 says 7.9.224): name its folder too.
    folder=$(basename "$(dirname "$server")")
    case $server in
        */target/debian13/bin/*) label="$label (Debian 13)" ;;
        *)
            case $folder in
                "$name-$version" | bin | sbin) ;;
                *) label="$label ($folder)" ;;
            esac
            ;;
    esac
    log="$log_dir/${name}-${version}.log"
    echo "matrix: $label ($server)"
    start=$(date +%s)
    skips="$log_dir/${name}-${version}.skips"
    rm -f "$skips"
    RATELIMIT_SERVER=$server REDIS_CLI=$cli RATELIMIT_SKIP_LOG=$(realpath -m "$skips") \
        cargo test --profile tests "${cargo_args[@]}" >"$log" 2>&1
    status=$?
    seconds=$(( $(date +%s) - start ))
    # The closing total, `N passed, N failed, N skipped`, as `make test` prints it.
    read -r passed failures skipped < <(bash tests/summary.sh "$log" "$skips" "$status" |
        tail -n 1 | awk '{ print $1, $3, $5 }')
    [ $status -eq 0 ] || failed_servers=$((failed_servers + 1))
    total_passed=$((total_passed + passed))
    total_failed=$((total_failed + failures))
    total_skipped=$((total_skipped + skipped))
    rows+=("$(printf '| %-16s | %-45s | %6s | %6s | %7s | %4ss |' "$label" "$server" "$passed" "$failures" "$skipped" "$seconds")")
    if [ $status -ne 0 ]; then
        echo "matrix: $label FAILED; the failing tests:" >&2
        grep -E '^(test .* FAILED|---- .* stdout ----|thread .* panicked)' "$log" | head -20 >&2
        echo "matrix: whole output in $log" >&2
    fi
done

echo
printf '| %-16s | %-45s | %6s | %6s | %7s | %5s |\n' server binary passed failed skipped time
printf '|%s|%s|%s|%s|%s|%s|\n' ------------------ ----------------------------------------------- -------- -------- --------- -------
printf '%s\n' "${rows[@]}"
echo
echo "skips (test: server: what the server lacks):"
cat "$log_dir"/*.skips 2>/dev/null | sort | uniq -c | sed 's/^/  /'
echo
echo "matrix: $total_passed passed, $total_failed failed, $total_skipped skipped"
if [ $failed_servers -ne 0 ]; then
    echo "matrix: $failed_servers server(s) failed" >&2
    exit 1
fi
