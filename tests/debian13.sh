#!/usr/bin/env bash
# The servers Debian 13 (trixie) ships, Redis 8.0 and Valkey 8.1, for `make test-matrix`: a trixie
# root made with `debootstrap --variant=minbase` from the Debian mirror this machine's apt sources
# name (DEBIAN_MIRROR to choose another), with redis-server and valkey-server installed inside it,
# cached in target/debian13/ (remove the folder to make it again).
#
# The servers run on this machine, not in a chroot: each wrapper in target/debian13/bin/ starts the
# root's binary through the root's own dynamic loader and libraries, so the test harness hands it
# host paths (the module, its temporary folder) as it does any server. The wrapper execs, so the
# server keeps its pid (the harness signals it).
#
# usage: tests/debian13.sh   prints the folder of the wrappers (redis-server, redis-cli,
#                            valkey-server, valkey-cli) on its last line; exits 1 where the root
#                            cannot be made (no debootstrap and no apt-get, no mirror, offline).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

dir=$PWD/target/debian13
root=$dir/root
bin=$dir/bin
log=$dir/debootstrap.log

run_as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

if [ ! -f "$root/.ready" ]; then
    mkdir -p "$dir"
    if ! command -v debootstrap >/dev/null 2>&1; then
        echo "debian13: installing debootstrap" >&2
        run_as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null 2>&1 ||
            { run_as_root apt-get update -qq >/dev/null 2>&1 &&
              run_as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null 2>&1; } ||
            { echo "debian13: debootstrap could not be installed" >&2; exit 1; }
    fi
    mirror=${DEBIAN_MIRROR:-}
    [ -n "$mirror" ] || mirror=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null)
    [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $3 ~ /^(bookworm|trixie)/ { print $2; exit }' /etc/apt/sources.list 2>/dev/null)
    [ -n "$mirror" ] || { echo "debian13: no Debian mirror in the apt sources (set DEBIAN_MIRROR)" >&2; exit 1; }
    echo "debian13: making the trixie root in $root (debootstrap --variant=minbase, then redis-server and valkey-server; cached)" >&2
    run_as_root rm -rf "$root"
    if run_as_root debootstrap --variant=minbase trixie "$root" "$mirror" >"$log" 2>&1 &&
        # No service may start inside the root: its servers would listen on this machine.
        printf '#!/bin/sh\nexit 101\n' | run_as_root tee "$root/usr/sbin/policy-rc.d" >/dev/null &&
        run_as_root chmod 0755 "$root/usr/sbin/policy-rc.d" &&
        run_as_root chroot "$root" env DEBIAN_FRONTEND=noninteractive sh -c \
            'apt-get update -qq && apt-get install -y -qq --no-install-recommends redis-server valkey-server && apt-get clean' \
            >>"$log" 2>&1; then
        run_as_root touch "$root/.ready"
    else
        tail -n 20 "$log" | sed 's/^/    /' >&2
        echo "debian13: making the trixie root failed (whole log: $log)" >&2
        exit 1
    fi
fi

mkdir -p "$bin"
loader=$root/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
for program in redis-server redis-cli valkey-server valkey-cli; do
    [ -e "$root/usr/bin/$program" ] || { echo "debian13: $program is missing from the root" >&2; exit 1; }
    # --argv0: the server sees the wrapper's name (redis-server is a link to redis-check-rdb, and
    # the name decides which program runs).
    printf '#!/bin/sh\n# %s from the Debian 13 root (tests/debian13.sh)\nexec %q --library-path %q --argv0 "$0" %q "$@"\n' \
        "$program" "$loader" "$root/usr/lib/x86_64-linux-gnu" "$root/usr/bin/$program" >"$bin/$program"
    chmod 0755 "$bin/$program"
done
"$bin/redis-server" --version >/dev/null 2>&1 || { echo "debian13: the root's redis-server does not start" >&2; exit 1; }
echo "$bin"
