#!/usr/bin/env bash
# `make test-dist`: builds dist/ (packaging/dist.sh) and proves each claim the release makes.
#
#  1. contents: the tarballs hold exactly the files they should, root-owned, with fixed times; the
#     .debug file belongs to the library (same build id, named by its .gnu_debuglink); SHA256SUMS
#     covers every file of dist/ and `sha256sum -c` accepts it.
#  2. portable: packaging/check-library.sh passes on the shipped library (glibc floor 2.17, NEEDED
#     glibc and libgcc_s only, non-executable stack, no debug sections) and refuses the host's own
#     release build (glibc 2.34, debug info), so the check can fail; the pages' sample of it and
#     their sizes of the library (stripped, as built) are this build's.
#  3. ratelimit.conf names every config the module registers, with its default.
#  4. the integration suites that exercise every command, with the shipped library, on every
#     server tests/matrix.sh finds (the system's redis-server, Valkey 8, ../shared/servers); on the
#     system's redis-server that includes every redis-cli session of the pages, the README's first.
#  4b. redis-ratelimit-rls: check-library.sh passes on it (glibc floor 2.17) and refuses the host's
#     build; its .deb holds what it should; started with the .deb's config/example.yaml against
#     redis-server with the shipped module, it answers /healthcheck and decides a /json request,
#     and SIGTERM stops it with status 0; a configuration with a bad unit stops it at start with
#     status 1 and the file's name; `systemd-analyze verify` finds nothing to say of its unit.
#  5. Debian 11: in a bullseye root made with `debootstrap --variant=minbase` (cached in
#     target/dist-tools/bullseye), `ldd -r` resolves every symbol of the library, `dpkg -i` of the
#     .deb succeeds, bullseye's redis-server 6.0 started with `include /etc/redis/ratelimit.conf`
#     refuses the module with its "Redis 7.0 or later is required" line and exits (no crash), and
#     `dpkg --purge` leaves nothing; then the redis-ratelimit-rls .deb installs, its binary serves
#     and refuses as in 4b (run in the root against this machine's redis-server), and its purge
#     leaves nothing, conffiles included. Skipped, with the reason, where the Debian mirror (DEBIAN_MIRROR,
#     else the one this machine's apt sources name) cannot be reached.
#  6. this machine's Debian: the .deb installed with `dpkg -i` into the real root (skipped where the
#     package is already installed, or dpkg is not this machine's package manager), redis-server
#     (and valkey-server, when there is one) started with `include /etc/redis/ratelimit.conf` lists
#     the module and answers a CHECK, /etc/redis keeps its owner and mode, and `dpkg --purge` leaves
#     no file or folder of the package behind (also when a step fails).
#  7. lintian: no error or warning on either .deb, but the tags explained in packaging/lintian-overrides.
#  8. reproducible: a second `make dist` from a copy of the checkout in another folder, with its own
#     cargo target folder (so everything is compiled again), gives byte-identical files.
#
# Ends with `N passed, N failed, N skipped`; exits 1 if any check failed. A check that cannot run
# here says why on its `skip` line. DIST_SKIP_REPRO=1 leaves out step 8 (the longest; its build
# runs in the background from the end of the first build on).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
export LC_ALL=C

dist=$root/dist
tools=$root/target/dist-tools
log_dir=$root/target/test-dist
rm -rf "$log_dir"
mkdir -p "$log_dir" "$tools"

passed=0
failed=0
skipped=0
ok() { echo "test-dist: ok    $*"; passed=$((passed + 1)); }
bad() { echo "test-dist: FAIL  $*"; failed=$((failed + 1)); }
skip() { echo "test-dist: skip  $*"; skipped=$((skipped + 1)); }
finish() {
    echo
    echo "$passed passed, $failed failed, $skipped skipped"
    [ "$failed" -eq 0 ]
    exit
}
# check NAME COMMAND...: ok when COMMAND succeeds, else FAIL with its output.
check() {
    local what=$1 out
    shift
    if out=$("$@" 2>&1); then
        ok "$what"
    else
        bad "$what"
        sed 's/^/    /' <<<"$out" | tail -n 30
    fi
}

# Processes and mounts to undo on exit, whatever happens.
cleanups=()
cleanup() {
    local i
    for ((i = ${#cleanups[@]} - 1; i >= 0; i--)); do eval "${cleanups[i]}" >/dev/null 2>&1 || true; done
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# serve SERVER CONF LOG: starts SERVER with config file CONF in the background; waits until it
# answers PING on the port in CONF. Prints its pid. Fails when it exits or stays silent for 20 s.
serve() {
    local server=$1 conf=$2 log=$3 port pid
    port=$(awk '$1 == "port" { print $2 }' "$conf")
    "$server" "$conf" >"$log" 2>&1 &
    pid=$!
    cleanups+=("kill $pid")
    for _ in $(seq 200); do
        if [ "$(redis-cli -p "$port" PING 2>/dev/null)" = PONG ]; then
            echo "$pid"
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

stop() { kill "$1" 2>/dev/null && wait "$1" 2>/dev/null; true; }

# ---------------------------------------------------------------------------------------------
echo "test-dist: building dist/ (packaging/dist.sh)"
start=$(date +%s)
bash packaging/dist.sh >"$log_dir/dist.log" 2>&1
status=$?
if [ $status -eq 3 ]; then
    tail -n 2 "$log_dir/dist.log"
    skip "everything: the pinned cargo-zigbuild and ziglang could not be installed from PyPI (is it reachable?)"
    finish
elif [ $status -ne 0 ]; then
    tail -n 30 "$log_dir/dist.log"
    bad "make dist (whole log: $log_dir/dist.log)"
    finish
fi
grep -E '^dist: (library|Depends|module built|redis-ratelimit-rls)' "$log_dir/dist.log"
ok "make dist ($(($(date +%s) - start)) s)"

version=$(sed -n 's/^redis-ratelimit_\(.*\)-[0-9]*_amd64\.deb$/\1/p' < <(ls "$dist"))
name=redis-ratelimit-$version-x86_64-linux-gnu
tarball=$dist/$name.tar.gz
debug_tarball=$dist/$name-debug.tar.gz
deb=$(ls "$dist"/redis-ratelimit_"$version"-*_amd64.deb)
rls_deb=$(ls "$dist"/redis-ratelimit-rls_"$version"-*_amd64.deb)
epoch=$(git log -1 --format=%ct)
# Step 8's second build starts now, in the background (its own session, so the cleanup stops
# its cargo too): it compiles everything again, the longest part of this run, while steps 1 to 7
# check the first build. dist.sh runs cargo under nice, so those checks come first.
if [ "${DIST_SKIP_REPRO:-0}" != 1 ]; then
    echo "test-dist: the second build, with its own target folder, in the background"
    repro_start=$(date +%s)
    SOURCE_DATE_EPOCH=$epoch DIST_TARGET_DIR=$log_dir/repro/target DIST_DIR=$log_dir/repro/dist \
        setsid bash packaging/dist.sh >"$log_dir/repro.log" 2>&1 &
    repro_pid=$!
    cleanups+=("kill -- -$repro_pid")
fi
unpacked=$log_dir/unpacked
mkdir -p "$unpacked"
tar -xzf "$tarball" -C "$unpacked" && tar -xzf "$debug_tarball" -C "$unpacked"
lib=$unpacked/$name/libredis_ratelimit.so
rls=$unpacked/$name/redis-ratelimit-rls

# --- 1. contents ------------------------------------------------------------------------------
tar_listing() {
    # mode owner/group size date time name: everything but the size, which is the build's.
    tar -tvzf "$1" --numeric-owner --full-time | awk '{ print $1, $2, $4, $5, $6 }'
}
stamp=$(date -u -d "@$epoch" '+%Y-%m-%d %H:%M:%S')
# expected_listing FILE...: the listing of a folder $name/ holding FILE... (FILE=MODE to give the mode).
expected_listing() {
    echo "drwxr-xr-x 0/0 $stamp $name/"
    for file in "$@"; do
        case $file in
            *=*) echo "${file#*=} 0/0 $stamp $name/${file%%=*}" ;;
            *) echo "-rw-r--r-- 0/0 $stamp $name/$file" ;;
        esac
    done
}
# The library is executable: Redis 7.0 and later refuse a module file without an execute bit.
check "the tarball holds the library and redis-ratelimit-rls (0755), LICENSE, README and ratelimit.conf, root-owned, at the commit's time" \
    diff <(expected_listing LICENSE README libredis_ratelimit.so=-rwxr-xr-x ratelimit.conf redis-ratelimit-rls=-rwxr-xr-x) \
    <(tar_listing "$tarball")
check "the debug tarball holds libredis_ratelimit.so.debug beside where the library unpacks" \
    diff <(expected_listing libredis_ratelimit.so.debug) <(tar_listing "$debug_tarball")
build_id() { readelf -n "$1" | awk '/Build ID/ { print $3 }'; }
debug_file=$unpacked/$name/libredis_ratelimit.so.debug
same_build() {
    [ -n "$(build_id "$lib")" ] && [ "$(build_id "$lib")" = "$(build_id "$debug_file")" ] &&
        readelf -p .gnu_debuglink "$lib" | grep -q 'libredis_ratelimit.so.debug' &&
        readelf -S --wide "$debug_file" | grep -q '\.debug_info' &&
        readelf -S --wide "$debug_file" | grep -q '\.debug_line'
}
check "the .debug file has the library's build id ($(build_id "$lib")), line tables, and the library links to it" same_build
if command -v gdb >/dev/null 2>&1; then
    # gdb finds the debug file through the link and names the source of the module's entry point.
    check "gdb reads the library's sources from the .debug file" \
        bash -c "gdb -batch -ex 'info line RedisModule_OnLoad' '$lib' 2>&1 | grep -E 'Line [0-9]+ of \"src/lib.rs\"'"
else
    skip "gdb reading the .debug file: gdb is not installed"
fi
# The service's package: the binary, its man page, the unit, the two conffiles, the docs.
rls_deb_holds() {
    local expected="./etc/default/redis-ratelimit-rls
./etc/redis-ratelimit-rls/config/example.yaml
./usr/bin/redis-ratelimit-rls
./usr/lib/systemd/system/redis-ratelimit-rls.service
./usr/share/doc/redis-ratelimit-rls/README.md.gz
./usr/share/doc/redis-ratelimit-rls/changelog.Debian.gz
./usr/share/doc/redis-ratelimit-rls/changelog.gz
./usr/share/doc/redis-ratelimit-rls/copyright
./usr/share/man/man1/redis-ratelimit-rls.1.gz"
    diff <(echo "$expected") <(dpkg-deb -c "$rls_deb" | awk '$1 !~ /^d/ { print $6 }' | sort) || return 1
    [ "$(dpkg-deb -I "$rls_deb" conffiles)" = "$(printf '%s\n' /etc/default/redis-ratelimit-rls /etc/redis-ratelimit-rls/config/example.yaml)" ] ||
        { echo "conffiles: $(dpkg-deb -I "$rls_deb" conffiles)"; return 1; }
    cmp <(dpkg-deb --fsys-tarfile "$rls_deb" | tar -xOf - ./usr/bin/redis-ratelimit-rls) "$rls"
}
check "the redis-ratelimit-rls .deb holds the tarball's binary, its man page, the unit, the conffiles /etc/default/redis-ratelimit-rls and config/example.yaml, and its docs" rls_deb_holds
sums_cover_dist() {
    cd "$dist" && sha256sum --quiet -c SHA256SUMS &&
        diff <(find . -maxdepth 1 -type f ! -name SHA256SUMS -printf '%P\n' | sort) <(awk '{ print $2 }' SHA256SUMS | sort)
}
check "SHA256SUMS lists every file of dist/ and sha256sum -c accepts it" sums_cover_dist
for client in python node; do
    case $client in
        python) marker=clients/python/pyproject.toml pattern='*.whl' ;;
        node) marker=clients/node/package.json pattern='*.tgz' ;;
    esac
    if [ -f "$marker" ] && grep -q "^dist: skipped clients/$client" "$log_dir/dist.log"; then
        skip "clients/$client's package: $(grep "^dist: skipped clients/$client" "$log_dir/dist.log" | cut -d' ' -f3-)"
    elif [ -f "$marker" ]; then
        check "clients/$client is packaged in dist/" compgen -G "$dist/$pattern"
    else
        skip "clients/$client's package: $marker does not exist yet"
    fi
done

# --- 2. portable -----------------------------------------------------------------------------
check "packaging/check-library.sh passes on the shipped library" bash packaging/check-library.sh "$lib" 2.17
bash packaging/check-library.sh "$lib" 2.17 | sed -n 's/^check-library: ok    /    /p'
# The pages' numbers for the shipped library are this run's. docs/operations.md's sample is what
# check-library prints on it, run as the page runs it (in the library's folder), line for line,
# its size to the 0.1 MB the pages round it to; README.md's "stripped (0.8 MB)" and
# operations.md's "(0.8 MB instead of 4.7 MB)" are the sizes dist.sh reported, stripped and as
# built (MB: 10^6 bytes).
mb() { awk -v bytes="$1" 'BEGIN { printf "%.1f", bytes / 1000000 }'; }
# "(819096 bytes)" -> "(0.8 MB)"
bytes_to_mb() {
    awk '{
        if (match($0, /\([0-9]+ bytes\)/)) {
            n = substr($0, RSTART + 1, RLENGTH - 8)
            $0 = substr($0, 1, RSTART - 1) sprintf("(%.1f MB)", n / 1000000) substr($0, RSTART + RLENGTH)
        }
        print
    }'
}
page_sample() {
    awk '/^\$ packaging\/check-library\.sh libredis_ratelimit\.so$/ { on = 1; next } on && /^```/ { exit } on' \
        docs/operations.md
}
page_sample_is_this_run() {
    local expected actual
    expected=$(page_sample)
    [ -n "$expected" ] || { echo "docs/operations.md: no \`\$ packaging/check-library.sh libredis_ratelimit.so\` sample"; return 1; }
    actual=$(cd "$(dirname "$lib")" && bash "$root/packaging/check-library.sh" libredis_ratelimit.so)
    diff <(bytes_to_mb <<<"$expected") <(bytes_to_mb <<<"$actual") >/dev/null && return 0
    echo "docs/operations.md's sample (sizes to 0.1 MB):"
    diff <(bytes_to_mb <<<"$expected") <(bytes_to_mb <<<"$actual") | sed 's/^/  /'
    echo "this run prints (paste it into the page):"
    sed 's/^/  /' <<<"$actual"
    return 1
}
check "docs/operations.md's check-library sample is what it prints on the shipped library" page_sample_is_this_run
page_sizes_are_this_run() {
    local sizes built stripped status=0
    sizes=$(sed -n 's/^dist: library: \([0-9]*\) bytes as built, \([0-9]*\) stripped$/\1 \2/p' "$log_dir/dist.log")
    read -r built stripped <<<"$sizes"
    [ -n "${stripped:-}" ] || { echo "dist.log has no 'dist: library: N bytes as built, M stripped' line"; return 1; }
    grep -qF "stripped ($(mb "$stripped") MB)" README.md ||
        { echo "README.md: not 'stripped ($(mb "$stripped") MB)' ($stripped bytes)"; status=1; }
    grep -qF "($(mb "$stripped") MB instead of $(mb "$built") MB)" docs/operations.md ||
        { echo "docs/operations.md: not '($(mb "$stripped") MB instead of $(mb "$built") MB)' ($stripped and $built bytes)"; status=1; }
    return $status
}
check "the pages' sizes of the library are this build's (README.md, docs/operations.md)" page_sizes_are_this_run
no_build_paths() {
    local found
    found=$(strings "${1:-$lib}" | grep -F -e "$root" -e "$(realpath -m "${CARGO_HOME:-$HOME/.cargo}")" | head -n 5)
    [ -z "$found" ] || { echo "$found"; return 1; }
}
check "the shipped library names no path of the build machine (checkout, cargo home)" no_build_paths
check "packaging/check-library.sh passes on the shipped redis-ratelimit-rls (glibc floor 2.17, glibc only)" \
    bash packaging/check-library.sh "$rls" 2.17
bash packaging/check-library.sh "$rls" 2.17 | sed -n 's/^check-library: ok    /    /p'
check "the shipped redis-ratelimit-rls names no path of the build machine (checkout, cargo home)" no_build_paths "$rls"
host_rls=${CARGO_TARGET_DIR:-target}/release/redis-ratelimit-rls
if [ -f "$host_rls" ]; then
    refuses_host_rls() { ! bash packaging/check-library.sh "$host_rls" 2.17; }
    check "check-library.sh refuses the host's own build of redis-ratelimit-rls ($host_rls: its glibc floor is newer)" refuses_host_rls
else
    skip "check-library.sh on the host's redis-ratelimit-rls: no $host_rls (cargo build --release -p redis-ratelimit-rls)"
fi
if [ -f target/release/libredis_ratelimit.so ]; then
    refuses_host_build() { ! bash packaging/check-library.sh target/release/libredis_ratelimit.so 2.17; }
    check "check-library.sh refuses the host's own build (target/release: its glibc floor is newer)" refuses_host_build
else
    skip "check-library.sh on the host's build: no target/release/libredis_ratelimit.so (make build)"
fi

# --- 3. ratelimit.conf ------------------------------------------------------------------------
conf_lists_configs() {
    local dir port pid
    dir=$(mktemp -d "$log_dir/conf.XXXXXX")
    port=$(free_port)
    printf 'port %s\nbind 127.0.0.1\ndir %s\nsave ""\nloadmodule %s\n' "$port" "$dir" "$lib" >"$dir/redis.conf"
    pid=$(serve redis-server "$dir/redis.conf" "$dir/server.log") || { cat "$dir/server.log"; return 1; }
    redis-cli -p "$port" CONFIG GET 'ratelimit.*' | paste - - | sort >"$dir/configs"
    stop "$pid"
    [ -s "$dir/configs" ] || { echo "CONFIG GET ratelimit.* listed nothing"; return 1; }
    diff <(sed -n 's/^# \(ratelimit\.[a-z-]*\) \([0-9]*\)$/\1\t\2/p' "$unpacked/$name/ratelimit.conf" | sort) "$dir/configs"
}
check "ratelimit.conf shows every config CONFIG GET ratelimit.* lists, with its default" conf_lists_configs

# --- 4. the integration suites on every server ------------------------------------------------
# One suite per concern, together every command: CHECK, PEEK, RESET, INFO (commands), CHECKALL,
# REFUND, BLOCK, ACQUIRE/RELEASE (leases), POLICY (policies), CL.THROTTLE and GCRA (dialects),
# APPLY (policies::replication, operations), the configs (module_configs), RDB (persistence),
# and the pages' blocks in order on one server (snippets; on the system's redis-server only).
suites="commands:: checkall:: refund:: block:: leases:: policies:: dialects:: module_configs:: persistence:: operations::"
suites+=" snippets::the_pages_run_top_to_bottom_on_one_server"
# The Functions library's tests (functions::refund::..., functions::leases::...) match those names
# too; they test the library, not the module, and take two thirds of the time.
suites+=" --skip functions::"
echo "test-dist: the integration suites with the shipped library on every server (tests/matrix.sh): $suites"
start=$(date +%s)
if RATELIMIT_MODULE=$lib MATRIX_TESTS=$suites bash tests/matrix.sh >"$log_dir/matrix.log" 2>&1; then
    sed -n '/^| server/,/^$/p' "$log_dir/matrix.log" | sed 's/^/    /'
    ok "the integration suites pass with the shipped library on every server ($(($(date +%s) - start)) s): $(tail -n 1 "$log_dir/matrix.log")"
else
    tail -n 40 "$log_dir/matrix.log" | sed 's/^/    /'
    bad "the integration suites with the shipped library (whole log: $log_dir/matrix.log)"
fi

# --- 4b. redis-ratelimit-rls -------------------------------------------------------------------
# One redis-server (this machine's) with the shipped module for every run of the service, here and
# in the Debian 11 root (which shares this machine's network). The .deb's files, unpacked, give the
# configuration the unit uses (/etc/redis-ratelimit-rls/config/example.yaml) and the unit.
rls_dir=$log_dir/rls
mkdir -p "$rls_dir/bad"
dpkg-deb -x "$rls_deb" "$rls_dir/deb"
# A unit it must refuse: a rate limit with a unit that is not one, naming the file.
printf 'domain: broken\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n' \
    >"$rls_dir/bad/broken.yaml"
rls_redis_port=$(free_port)
printf 'port %s\nbind 127.0.0.1\ndir %s\nsave ""\nappendonly no\nloadmodule %s\n' "$rls_redis_port" "$rls_dir" "$lib" \
    >"$rls_dir/redis.conf"
if rls_redis_pid=$(serve redis-server "$rls_dir/redis.conf" "$rls_dir/redis.log"); then
    cleanups+=("kill $rls_redis_pid")
else
    rls_redis_pid=""
    tail -n 20 "$rls_dir/redis.log" | sed 's/^/    /'
fi
# http GET|POST URL [BODY]: prints the status and the body, "000" when nothing answers.
http() {
    python3 - "$@" <<'PY'
import sys, urllib.error, urllib.request
method, url = sys.argv[1], sys.argv[2]
data = sys.argv[3].encode() if len(sys.argv) > 3 else None
try:
    with urllib.request.urlopen(urllib.request.Request(url, data=data, method=method), timeout=5) as r:
        print(r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
except OSError:
    print("000")
PY
}
# rls_env: the environment of every run: Redis over TCP, both ports on loopback, free.
rls_env() {
    echo "REDIS_SOCKET_TYPE=tcp REDIS_URL=127.0.0.1:$rls_redis_port HOST=127.0.0.1 PORT=$1 GRPC_HOST=127.0.0.1 GRPC_PORT=$2 LOG_LEVEL=info"
}
# rls_serves LABEL BINARY CONFIG_DIR [ROOT]: BINARY --config CONFIG_DIR (paths inside ROOT when
# given: run there with chroot) against the server above: /healthcheck answers 200, /json decides
# a request of example.yaml's domain (OK, 99 of 100 left) with a key in Redis, and SIGTERM stops
# it with exit status 0.
rls_serves() {
    local label=$1 bin=$2 conf=$3 root=${4:-} http_port grpc_port pid health reply status
    [ -n "$rls_redis_pid" ] || { echo "the redis-server for the service did not start"; return 1; }
    redis-cli -p "$rls_redis_port" FLUSHALL >/dev/null
    http_port=$(free_port)
    grpc_port=$(free_port)
    # shellcheck disable=SC2046
    ${root:+chroot "$root"} env $(rls_env "$http_port" "$grpc_port") "$bin" --config "$conf" >"$rls_dir/$label.log" 2>&1 &
    pid=$!
    cleanups+=("kill $pid")
    for _ in $(seq 100); do
        health=$(http GET "http://127.0.0.1:$http_port/healthcheck")
        [ "${health%% *}" = 200 ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    reply=$(http POST "http://127.0.0.1:$http_port/json" \
        '{"domain":"example","descriptors":[{"entries":[{"key":"generic_key","value":"default"}]}]}')
    kill "$pid" 2>/dev/null
    wait "$pid"
    status=$?
    echo "/healthcheck: $health; /json: $reply; keys in Redis: $(redis-cli -p "$rls_redis_port" DBSIZE); exit status after SIGTERM: $status"
    [ "${health%% *}" = 200 ] && grep -q '"overallCode":"OK"' <<<"$reply" && grep -q '"limitRemaining":99' <<<"$reply" &&
        [ "$(redis-cli -p "$rls_redis_port" DBSIZE)" -ge 1 ] && [ $status -eq 0 ] || { tail -n 20 "$rls_dir/$label.log"; return 1; }
}
# rls_rejects LABEL BINARY CONFIG_DIR [ROOT]: a configuration with a bad unit stops it at start
# with exit status 1 and a message naming the file.
rls_rejects() {
    local label=$1 bin=$2 conf=$3 root=${4:-} status
    # shellcheck disable=SC2046
    timeout 20 ${root:+chroot "$root"} env $(rls_env "$(free_port)" "$(free_port)") "$bin" --config "$conf" >"$rls_dir/$label.log" 2>&1
    status=$?
    cat "$rls_dir/$label.log"
    [ $status -eq 1 ] && grep -q 'broken\.yaml' "$rls_dir/$label.log" && grep -qi 'unit' "$rls_dir/$label.log"
}
check "redis-ratelimit-rls from the tarball, with the .deb's config/example.yaml: /healthcheck 200, /json decides with the module, SIGTERM exits 0" \
    rls_serves tarball "$rls" "$rls_dir/deb/etc/redis-ratelimit-rls/config"
check "redis-ratelimit-rls refuses a configuration with a bad unit at start (exit status 1, naming the file)" \
    rls_rejects tarball-bad "$rls" "$rls_dir/bad"
sed -n '1p' "$rls_dir/tarball-bad.log" | cut -c1-200 | sed 's/^/    /'
if command -v systemd-analyze >/dev/null 2>&1; then
    # The unit as shipped, with its ExecStart pointing at the unpacked binary (verify wants it to
    # exist); any line it prints (an unknown key, a bad value: warnings only) fails the check.
    unit_verifies() {
        local unit=$rls_dir/redis-ratelimit-rls.service out
        sed "s|/usr/bin/redis-ratelimit-rls|$rls_dir/deb/usr/bin/redis-ratelimit-rls|" \
            "$rls_dir/deb/usr/lib/systemd/system/redis-ratelimit-rls.service" >"$unit"
        out=$(systemd-analyze verify --man=no "$unit" 2>&1) || { echo "$out"; return 1; }
        [ -z "$out" ] || { echo "$out"; return 1; }
        systemd-analyze security --offline=yes "$unit" 2>/dev/null | tail -n 1
    }
    check "systemd-analyze verify: redis-ratelimit-rls.service has no error or warning" unit_verifies
    systemd-analyze security --offline=yes "$rls_dir/redis-ratelimit-rls.service" 2>/dev/null | tail -n 1 | sed 's/^/    /'
else
    skip "systemd-analyze verify of redis-ratelimit-rls.service: systemd-analyze is not installed"
fi

# --- 5. Debian 11 (bullseye) ------------------------------------------------------------------
# The Debian mirror this machine's apt sources use (deb822 .sources files, then sources.list):
# the first entry for a suite that is not a -security one.
debian_mirror() {
    local file
    for file in /etc/apt/sources.list.d/*.sources; do
        [ -f "$file" ] || continue
        awk 'BEGIN { RS = ""; FS = "\n" }
            { uri = ""; suites = "";
              for (i = 1; i <= NF; i++) {
                  if ($i ~ /^URIs:/) { split($i, a, " "); uri = a[2] }
                  if ($i ~ /^Suites:/) suites = $i }
              if (uri != "" && suites !~ /-security/ && suites ~ /[a-z]/) { print uri; exit } }' "$file"
    done | head -n 1
    [ -f /etc/apt/sources.list ] &&
        awk '$1 == "deb" && $3 !~ /-security/ { print $2 }' /etc/apt/sources.list | head -n 1
}
reachable() {
    python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=20).read(1)' "$1" 2>/dev/null
}
bullseye=$tools/bullseye
mirror=${DEBIAN_MIRROR:-$(debian_mirror | head -n 1)}
mirror=${mirror%/}
bullseye_ready() { [ -f "$bullseye/.ready" ]; }
if ! bullseye_ready; then
    if [ -z "$mirror" ]; then
        skip "Debian 11: no Debian mirror in this machine's apt sources"
    elif ! reachable "$mirror/dists/bullseye/Release"; then
        skip "Debian 11: the mirror $mirror cannot be reached (or has no bullseye)"
    elif ! command -v debootstrap >/dev/null 2>&1; then
        skip "Debian 11: debootstrap is not installed (make test-dist installs it with apt-get)"
    else
        echo "test-dist: making the bullseye root in $bullseye (debootstrap --variant=minbase, then redis-server; cached)"
        rm -rf "$bullseye"
        if debootstrap --variant=minbase bullseye "$bullseye" "$mirror" >"$log_dir/debootstrap.log" 2>&1 &&
            # No service may start inside the root: its redis-server would listen on this machine.
            printf '#!/bin/sh\nexit 101\n' >"$bullseye/usr/sbin/policy-rc.d" &&
            chmod 0755 "$bullseye/usr/sbin/policy-rc.d" &&
            chroot "$bullseye" env DEBIAN_FRONTEND=noninteractive sh -c \
                'apt-get update -qq && apt-get install -y -qq --no-install-recommends redis-server && apt-get clean' \
                >>"$log_dir/debootstrap.log" 2>&1; then
            touch "$bullseye/.ready"
        else
            tail -n 20 "$log_dir/debootstrap.log" | sed 's/^/    /'
            bad "Debian 11: making the bullseye root (whole log: $log_dir/debootstrap.log)"
        fi
    fi
fi
if bullseye_ready; then
    inside=/tmp/test-dist
    rm -rf "${bullseye:?}$inside"
    mkdir -p "$bullseye$inside"
    cp "$lib" "$deb" "$rls_deb" "$bullseye$inside/"
    mkdir -p "$bullseye$inside/bad" && cp "$rls_dir/bad/broken.yaml" "$bullseye$inside/bad/"
    in_root() { chroot "$bullseye" "$@"; }
    echo "test-dist: Debian $(cat "$bullseye/etc/debian_version") root, $(in_root redis-server --version | cut -d' ' -f1-3)"
    resolves() {
        local out
        out=$(in_root ldd -r "$inside/libredis_ratelimit.so" 2>&1) || { echo "$out"; return 1; }
        echo "$out"
        ! grep -qE 'not found|undefined symbol|version .* not found' <<<"$out"
    }
    check "Debian 11: ldd -r resolves every symbol of the library" resolves
    check "Debian 11: dpkg -i of the .deb succeeds" in_root dpkg -i "$inside/$(basename "$deb")"
    refuses() {
        local status
        # No TCP port (the root shares this machine's network); a socket, or Redis 6 will not start.
        printf 'port 0\nunixsocket %s/redis.sock\ndaemonize no\nlogfile ""\ninclude /etc/redis/ratelimit.conf\n' "$inside" >"$bullseye$inside/redis.conf"
        timeout 30 chroot "$bullseye" redis-server "$inside/redis.conf" >"$log_dir/bullseye-redis.log" 2>&1
        status=$?
        cat "$log_dir/bullseye-redis.log"
        # Exit status 1: the server aborts because the module refused; 124 would be a server that
        # started anyway, 128+N a crash.
        [ $status -eq 1 ] &&
            grep -q 'Redis 7.0 or later is required' "$log_dir/bullseye-redis.log" &&
            ! grep -qE 'crashed by signal|BUG REPORT|Segmentation' "$log_dir/bullseye-redis.log"
    }
    check "Debian 11: redis-server $(in_root redis-server --version | grep -o 'v=[^ ]*' | cut -c3-) with include /etc/redis/ratelimit.conf refuses the module (\"Redis 7.0 or later is required\", exit status 1, no crash)" refuses
    grep -h 'Redis 7.0 or later\|server aborting' "$log_dir/bullseye-redis.log" | sed 's/^/    /'
    purged_in_root() {
        local files
        files=$(in_root dpkg -L redis-ratelimit | grep -v '^/\.$') || return 1
        in_root dpkg --purge redis-ratelimit || return 1
        local left=""
        for path in $files; do
            [ -d "$bullseye$path" ] && continue
            [ -e "$bullseye$path" ] && left+=" $path"
        done
        [ -z "$left" ] || { echo "left behind:$left"; return 1; }
        [ ! -e "$bullseye/usr/lib/redis/modules" ] || { echo "left behind: /usr/lib/redis/modules"; return 1; }
    }
    check "Debian 11: dpkg --purge leaves no file behind" purged_in_root
    rls_resolves() {
        local out
        out=$(in_root ldd "$1" 2>&1) || { echo "$out"; return 1; }
        echo "$out"
        ! grep -qE 'not found|version .* not found' <<<"$out"
    }
    check "Debian 11: dpkg -i of the redis-ratelimit-rls .deb succeeds" in_root dpkg -i "$inside/$(basename "$rls_deb")"
    check "Debian 11: ldd resolves every library of /usr/bin/redis-ratelimit-rls" rls_resolves /usr/bin/redis-ratelimit-rls
    check "Debian 11: /usr/bin/redis-ratelimit-rls with the package's /etc/redis-ratelimit-rls/config: /healthcheck 200, /json decides with the module, SIGTERM exits 0" \
        rls_serves bullseye /usr/bin/redis-ratelimit-rls /etc/redis-ratelimit-rls/config "$bullseye"
    check "Debian 11: redis-ratelimit-rls refuses a configuration with a bad unit (exit status 1, naming the file)" \
        rls_rejects bullseye-bad /usr/bin/redis-ratelimit-rls "$inside/bad" "$bullseye"
    rls_purged_in_root() {
        local files path left=""
        files=$(in_root dpkg -L redis-ratelimit-rls | grep -v '^/\.$') || return 1
        in_root dpkg --purge redis-ratelimit-rls || return 1
        for path in $files; do
            [ -d "$bullseye$path" ] && continue
            [ -e "$bullseye$path" ] && left+=" $path"
        done
        for path in /etc/redis-ratelimit-rls /usr/share/doc/redis-ratelimit-rls; do
            [ ! -e "$bullseye$path" ] || left+=" $path/"
        done
        [ -z "$left" ] || { echo "left behind:$left"; return 1; }
    }
    check "Debian 11: dpkg --purge redis-ratelimit-rls leaves no file or folder of it behind (conffiles too)" rls_purged_in_root
    rm -rf "${bullseye:?}$inside"
fi

# --- 6. this machine's Debian ------------------------------------------------------------------
package_installed() { dpkg-query -W -f='${Status}' redis-ratelimit 2>/dev/null | grep -q 'install ok installed'; }
if ! command -v dpkg >/dev/null 2>&1 || [ ! -f /etc/debian_version ]; then
    skip "this machine's Debian: not a Debian system"
elif [ "$(id -u)" != 0 ]; then
    skip "this machine's Debian: dpkg -i needs root"
elif dpkg-query -W -f='${Status}' redis-ratelimit 2>/dev/null | grep -q 'installed'; then
    skip "this machine's Debian: redis-ratelimit is already installed here; this test never touches it"
else
    debian=$(cat /etc/debian_version)
    # What exists before, so the purge can be checked against it (and undone on any failure).
    existed=()
    for dir in /usr/lib/redis /usr/lib/redis/modules /etc/redis /usr/share/doc/redis-ratelimit; do
        [ -e "$dir" ] && existed+=("$dir")
    done
    etc_redis_before=$(stat -c '%a %U:%G' /etc/redis 2>/dev/null || echo absent)
    cleanups+=("dpkg --purge redis-ratelimit")
    if dpkg -i "$deb" >"$log_dir/dpkg-install.log" 2>&1; then
        ok "Debian $debian: dpkg -i of the .deb succeeds"
        files=$(dpkg -L redis-ratelimit | grep -v '^/\.$')
        installed_as_shipped() {
            [ "$(stat -c '%a %U:%G' /usr/lib/redis/modules/libredis_ratelimit.so)" = "755 root:root" ] &&
                cmp /usr/lib/redis/modules/libredis_ratelimit.so "$lib" &&
                dpkg-query -W -f='${Conffiles}\n' redis-ratelimit | grep -q '^ /etc/redis/ratelimit.conf ' &&
                grep -qx 'loadmodule /usr/lib/redis/modules/libredis_ratelimit.so' /etc/redis/ratelimit.conf
        }
        check "Debian $debian: the library is /usr/lib/redis/modules/libredis_ratelimit.so (0755, root), /etc/redis/ratelimit.conf a conffile" installed_as_shipped
        check "Debian $debian: /etc/redis keeps its owner and mode ($etc_redis_before)" \
            test "$(stat -c '%a %U:%G' /etc/redis 2>/dev/null || echo absent)" = "$etc_redis_before"
        # serves SERVER: started with `include /etc/redis/ratelimit.conf`, it lists the module and
        # answers a CHECK (admitted, limit 100, 99 left).
        serves() {
            local server=$1 dir port pid modules reply
            dir=$(mktemp -d "$log_dir/served.XXXXXX")
            port=$(free_port)
            printf 'port %s\nbind 127.0.0.1\ndir %s\nsave ""\nappendonly no\ninclude /etc/redis/ratelimit.conf\n' \
                "$port" "$dir" >"$dir/server.conf"
            pid=$(serve "$server" "$dir/server.conf" "$dir/server.log") || { tail -n 20 "$dir/server.log"; return 1; }
            modules=$(redis-cli -p "$port" MODULE LIST)
            reply=$(redis-cli -p "$port" RATELIMIT.CHECK dist:alice sliding-window 100 1m | head -n 3 | tr '\n' ' ')
            stop "$pid"
            echo "MODULE LIST: $(echo $modules); CHECK: $reply"
            grep -qx ratelimit <<<"$modules" && [ "$reply" = "1 100 99 " ]
        }
        check "Debian $debian: redis-server $(redis-server --version | grep -o 'v=[^ ]*' | cut -c3-) with include /etc/redis/ratelimit.conf lists the module and answers a CHECK" serves redis-server
        if command -v valkey-server >/dev/null 2>&1; then
            check "Debian $debian: valkey-server $(valkey-server --version | grep -o 'v=[^ ]*' | cut -c3-) with include /etc/redis/ratelimit.conf lists the module and answers a CHECK" serves valkey-server
        else
            skip "Debian $debian: valkey-server with the .deb: valkey-server is not installed"
        fi
        purged() {
            dpkg --purge redis-ratelimit || return 1
            local left="" path known
            for path in $files; do
                if [ -d "$path" ]; then
                    # A folder stays only if it was there before (another package's, /etc/redis).
                    known=0
                    for dir in "${existed[@]}" /etc /usr /usr/lib /usr/share /usr/share/doc; do
                        [ "$path" = "$dir" ] && known=1
                    done
                    [ $known = 1 ] || left+=" $path/"
                elif [ -e "$path" ]; then
                    left+=" $path"
                fi
            done
            ! package_installed || left+=" (still installed)"
            [ -z "$left" ] || { echo "left behind:$left"; return 1; }
        }
        check "Debian $debian: dpkg --purge leaves no file or folder of the package behind" purged
    else
        sed 's/^/    /' "$log_dir/dpkg-install.log"
        bad "Debian $debian: dpkg -i of the .deb (log: $log_dir/dpkg-install.log)"
    fi
fi

# --- 7. lintian ----------------------------------------------------------------------------
if command -v lintian >/dev/null 2>&1; then
    lintian_clean() {
        # Tags a binary-only package built without a source package must carry, each explained
        # in packaging/lintian-overrides.
        local suppress
        suppress=$(grep -v '^#' packaging/lintian-overrides | awk 'NF { print $1 }' | paste -sd, -)
        lintian --tag-display-limit 0 --fail-on error,warning ${suppress:+--suppress-tags "$suppress"} "$1"
    }
    check "lintian: no error or warning on the .deb (overrides: packaging/lintian-overrides)" lintian_clean "$deb"
    check "lintian: no error or warning on the redis-ratelimit-rls .deb (overrides: packaging/lintian-overrides)" \
        lintian_clean "$rls_deb"
else
    skip "lintian: not installed (make test-dist installs it with apt-get)"
fi

# --- 8. reproducible -------------------------------------------------------------------------
if [ "${DIST_SKIP_REPRO:-0}" = 1 ]; then
    skip "reproducibility: DIST_SKIP_REPRO=1"
else
    # The same checkout, a target folder of its own: everything is compiled again (zig's libunwind
    # too). The shipped library holds no path of this checkout (checked in step 2); the .debug
    # file holds one (packaging/dist.sh says why), so the second build runs from the same folder.
    echo "test-dist: waiting for the second build"
    if wait "$repro_pid"; then
        compare() { (cd "$1" && sha256sum --quiet -c "$2/SHA256SUMS") && diff "$1/SHA256SUMS" "$2/SHA256SUMS"; }
        check "reproducible: a second build from scratch gives byte-identical files ($(($(date +%s) - repro_start)) s, beside steps 1 to 7)" \
            compare "$log_dir/repro/dist" "$dist"
    else
        tail -n 20 "$log_dir/repro.log" | sed 's/^/    /'
        bad "reproducibility: the second build failed (log: $log_dir/repro.log)"
    fi
fi

finish
