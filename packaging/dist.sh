#!/usr/bin/env bash
# `make dist`: everything a release would publish, in dist/ (ignored by git).
#
#   redis-ratelimit-<version>-x86_64-linux-gnu.tar.gz        the stripped module, the stripped
#                                                            redis-ratelimit-rls, LICENSE, README,
#                                                            ratelimit.conf
#   redis-ratelimit-<version>-x86_64-linux-gnu-debug.tar.gz  its debug info (libredis_ratelimit.so.debug,
#                                                            found by gdb through the library's
#                                                            .gnu_debuglink and build id when
#                                                            unpacked beside it)
#   redis-ratelimit_<version>-1_amd64.deb                    /usr/lib/redis/modules/libredis_ratelimit.so,
#                                                            the conffile /etc/redis/ratelimit.conf, docs
#   redis-ratelimit-rls_<version>-1_amd64.deb                /usr/bin/redis-ratelimit-rls (the rate limit
#                                                            service for Envoy, gateways/envoy), its
#                                                            systemd unit, the conffiles
#                                                            /etc/default/redis-ratelimit-rls and
#                                                            /etc/redis-ratelimit-rls/config/example.yaml
#   the client packages' wheel, sdist and npm tarball, when clients/python and clients/node exist
#   SHA256SUMS                                               over every other file in dist/
#
# The module and redis-ratelimit-rls are built against glibc 2.17 (RHEL/CentOS 7 and everything newer) by cargo-zigbuild,
# which links with zig's glibc stubs of that version: cargo-zigbuild and ziglang come from PyPI at
# the pinned versions below, into a virtualenv under target/dist-tools/ (never system-wide).
# `make build` and the tests keep the normal toolchain.
#
# Reproducible: two runs of one commit give byte-identical files. Every timestamp is the commit's
# (SOURCE_DATE_EPOCH), names are sorted, owners are root, gzip stores no name or time, and the
# build paths (this checkout, cargo's registry and target folder, the zig installation) are mapped
# to fixed names in the library. One path is left in the .debug file: zig compiles its libunwind
# (linked in, in place of libgcc_s) with no prefix map, so its compilation folder is the checkout's:
# the debug tarball is reproducible for builds from the same folder (the release workflow's is
# fixed), the library, the tarball and the .deb from any folder.
#
# Environment: DIST_DIR (dist), DIST_TARGET_DIR (cargo's target directory: target), SOURCE_DATE_EPOCH
# (default: the commit time of HEAD), DEB_MAINTAINER, DIST_NO_CLIENTS=1 (leave the client packages out),
# DIST_STRICT=1 (fail when a client package cannot be built, instead of leaving it out).
# Exit status 3: the pinned toolchain could not be installed (PyPI out of reach); `make test-dist`
# reports that as a skip.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

# The toolchain, pinned. ziglang 0.15 moved its glibc headers, and cargo-zigbuild 0.24.1 then points
# bindgen at folders that do not exist: 0.14.1 is the newest that builds redis-module's bindings.
ZIGBUILD_PINS="cargo-zigbuild==0.24.1 ziglang==0.14.1"
# The sdist and wheel of clients/python are built by `build` (its backend comes from pyproject.toml).
BUILD_PIN="build==1.2.2.post1"
# The glibc the library is linked against: the highest GLIBC_ symbol version it may need.
GLIBC_FLOOR=2.17
RUST_TARGET=x86_64-unknown-linux-gnu
DEB_ARCH=amd64
DEB_REVISION=1
DEB_MAINTAINER=${DEB_MAINTAINER:-redis-ratelimit maintainers <maintainers@users.noreply.github.com>}

dist=$(realpath -m "${DIST_DIR:-dist}")
target_dir=$(realpath -m "${DIST_TARGET_DIR:-${CARGO_TARGET_DIR:-target}}")
tools=$root/target/dist-tools
venv=$tools/venv

say() { echo "dist: $*"; }
die() { echo "dist: $*" >&2; exit 1; }

for tool in python3 cargo objcopy strip tar gzip dpkg-deb dpkg-shlibdeps fakeroot readelf; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is missing (make dist installs dpkg-dev, fakeroot and binutils with apt-get)"
done

version=$(cargo metadata --no-deps --format-version 1 --manifest-path "$root/Cargo.toml" |
    python3 -c 'import json, sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "redis-ratelimit"))')
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
    SOURCE_DATE_EPOCH=$(git -C "$root" log -1 --format=%ct 2>/dev/null) ||
        die "not a git checkout: set SOURCE_DATE_EPOCH (the release's time, in seconds since 1970)"
fi
export SOURCE_DATE_EPOCH
# Everything below sorts and formats the same wherever it runs.
export LC_ALL=C TZ=UTC
umask 022

# --- the pinned toolchain ----------------------------------------------------------------------
pins="$ZIGBUILD_PINS $BUILD_PIN"
if [ "$(cat "$venv/.pins" 2>/dev/null)" != "$pins" ]; then
    say "installing $pins into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    # shellcheck disable=SC2086
    if ! "$venv/bin/pip" install --quiet --disable-pip-version-check $pins >"$tools/pip.log" 2>&1; then
        tail -n 3 "$tools/pip.log" >&2
        echo "dist: could not install $pins from PyPI (is it reachable?); whole log: $tools/pip.log" >&2
        rm -rf "$venv"
        exit 3
    fi
    echo "$pins" >"$venv/.pins"
fi
ziglib=$("$venv/bin/python3" -c 'import os, ziglang; print(os.path.dirname(ziglang.__file__))')

# --- the library -------------------------------------------------------------------------------
# zig reports its lib folder relative to the current directory when it lies below it, and
# cargo-zigbuild hands that relative path to bindgen, which runs elsewhere: run cargo from a
# folder beside the virtualenv, not above it.
mkdir -p "$tools/cwd"
cargo_home=$(realpath -m "${CARGO_HOME:-$HOME/.cargo}")
# Paths that would otherwise be written into the library and its debug info. Where several match
# (the target folder and the venv lie inside the checkout), rustc and clang take the last one: the
# most specific goes last.
remap=(--remap-path-prefix="$root=/build" --remap-path-prefix="$cargo_home=/cargo"
    --remap-path-prefix="$target_dir=/target")
link=(-C link-arg=-Wl,--build-id=sha1 -C link-arg=-Wl,-z,noexecstack)
cflags="-ffile-prefix-map=$root=/build -ffile-prefix-map=$cargo_home=/cargo -ffile-prefix-map=$target_dir=/target"
cflags+=" -ffile-prefix-map=$ziglib=/zig"
# zigbuild LOG ARGS...: cargo zigbuild ARGS for glibc $GLIBC_FLOOR, its output in LOG.
zigbuild() {
    local log=$1
    shift
    (
        cd "$tools/cwd"
        export PATH="$venv/bin:$PATH"
        export RUSTFLAGS="${remap[*]} ${link[*]}"
        export "CFLAGS_${RUST_TARGET//-/_}=$cflags"
        # zig's own objects (libunwind, the glibc stubs) are cached beside cargo's.
        export ZIG_GLOBAL_CACHE_DIR="$target_dir/zig-cache" ZIG_LOCAL_CACHE_DIR="$target_dir/zig-cache"
        export CARGO_TARGET_DIR="$target_dir"
        nice cargo zigbuild --locked --manifest-path "$root/Cargo.toml" --target "$RUST_TARGET.$GLIBC_FLOOR" "$@"
    ) >"$log" 2>&1
}
# The rate limit service for Envoy (gateways/envoy) is built at the same time, by a second cargo
# (the module's fat LTO links on one core; the service compiles on the other). Its profile,
# dist-rls, is the release profile without LTO and with 16 codegen units: fat LTO over tonic,
# hyper, rustls and tokio took minutes for a binary that waits on Redis. It ships stripped, with
# no debug info (debug = 0).
rls_profile=(--config 'profile.dist-rls.inherits="release"' --config 'profile.dist-rls.lto=false'
    --config 'profile.dist-rls.codegen-units=16' --config 'profile.dist-rls.debug=0')
say "building the module $version (profile dist) and redis-ratelimit-rls (profile dist-rls) for glibc $GLIBC_FLOOR (cargo zigbuild)"
mkdir -p "$target_dir"
rls_start=$(date +%s)
zigbuild "$target_dir/dist-rls.log" -p redis-ratelimit-rls --bin redis-ratelimit-rls --profile dist-rls \
    "${rls_profile[@]}" &
rls_pid=$!
module_start=$(date +%s)
if ! zigbuild "$target_dir/dist-module.log" --lib --profile dist; then
    tail -n 30 "$target_dir/dist-module.log" >&2
    wait "$rls_pid" || true
    die "building the module failed (whole log: $target_dir/dist-module.log)"
fi
say "module built in $(($(date +%s) - module_start)) s"
if ! wait "$rls_pid"; then
    tail -n 30 "$target_dir/dist-rls.log" >&2
    die "building redis-ratelimit-rls failed (whole log: $target_dir/dist-rls.log)"
fi
say "redis-ratelimit-rls built in $(($(date +%s) - rls_start)) s"
built=$target_dir/$RUST_TARGET/dist/libredis_ratelimit.so
[ -f "$built" ] || die "cargo zigbuild produced no $built"

work=$(mktemp -d "$root/target/dist-work.XXXXXX")
trap 'rm -rf "$work"' EXIT
name=redis-ratelimit-$version-x86_64-linux-gnu
rm -rf "$dist"
mkdir -p "$dist" "$work/lib"
# The debug info goes into its own file; the library keeps a link to it (name and CRC) and its
# build id, which is how gdb and debuginfod find it.
objcopy --only-keep-debug "$built" "$work/lib/libredis_ratelimit.so.debug"
chmod 0644 "$work/lib/libredis_ratelimit.so.debug"
(
    cd "$work/lib"
    objcopy --strip-all --remove-section=.comment --add-gnu-debuglink=libredis_ratelimit.so.debug \
        "$built" libredis_ratelimit.so
)
# Executable: since 7.0, Redis refuses to load a module file without an execute bit ("It does not
# have execute permissions"), whatever the loader would accept.
chmod 0755 "$work/lib/libredis_ratelimit.so"
bash "$root/packaging/check-library.sh" "$work/lib/libredis_ratelimit.so" "$GLIBC_FLOOR" >/dev/null ||
    die "the library fails packaging/check-library.sh (run it on $built)"
say "library: $(stat -c %s "$built") bytes as built, $(stat -c %s "$work/lib/libredis_ratelimit.so") stripped"

# The service: stripped of everything (its symbol table would name the build's folders), then
# the same checks as the library, but for an executable.
mkdir -p "$work/rls"
rls_built=$target_dir/$RUST_TARGET/dist-rls/redis-ratelimit-rls
objcopy --strip-all --remove-section=.comment "$rls_built" "$work/rls/redis-ratelimit-rls"
chmod 0755 "$work/rls/redis-ratelimit-rls"
bash "$root/packaging/check-library.sh" "$work/rls/redis-ratelimit-rls" "$GLIBC_FLOOR" >/dev/null ||
    die "redis-ratelimit-rls fails packaging/check-library.sh (run it on $rls_built)"
say "redis-ratelimit-rls: $(stat -c %s "$rls_built") bytes as built, $(stat -c %s "$work/rls/redis-ratelimit-rls") stripped"

# substitute FILE MODULE_PATH CONF_PATH: a template with this release's values.
substitute() {
    sed -e "s|@VERSION@|$version|g" -e "s|@GLIBC_FLOOR@|$GLIBC_FLOOR|g" \
        -e "s|@MODULE_PATH@|$2|g" -e "s|@CONF_PATH@|$3|g" "$1"
}

# tarball BASE DIR ARCHIVE: BASE/DIR as a reproducible .tar.gz whose entries start with DIR/.
tarball() {
    find "$1/$2" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
    tar --create --format=ustar --sort=name --owner=0 --group=0 --numeric-owner \
        --mtime="@$SOURCE_DATE_EPOCH" --mode='u=rwX,go=rX' -C "$1" "$2" | gzip -9n >"$3"
}

# --- the tarballs ------------------------------------------------------------------------------
mkdir -p "$work/tar/$name" "$work/debug/$name"
install -m 0755 "$work/lib/libredis_ratelimit.so" "$work/tar/$name/"
install -m 0755 "$work/rls/redis-ratelimit-rls" "$work/tar/$name/"
install -m 0644 LICENSE "$work/tar/$name/"
substitute packaging/README.tarball "" "" >"$work/tar/$name/README"
substitute packaging/ratelimit.conf /path/to/libredis_ratelimit.so /path/to/ratelimit.conf \
    >"$work/tar/$name/ratelimit.conf"
install -m 0644 "$work/lib/libredis_ratelimit.so.debug" "$work/debug/$name/"
tarball "$work/tar" "$name" "$dist/$name.tar.gz"
tarball "$work/debug" "$name" "$dist/$name-debug.tar.gz"

# --- the Debian package ------------------------------------------------------------------------
deb_version=$version-$DEB_REVISION
pkg=$work/deb
doc=$pkg/usr/share/doc/redis-ratelimit
install -D -m 0755 "$work/lib/libredis_ratelimit.so" "$pkg/usr/lib/redis/modules/libredis_ratelimit.so"
mkdir -p "$pkg/etc/redis" "$doc/docs" "$pkg/DEBIAN"
substitute packaging/ratelimit.conf /usr/lib/redis/modules/libredis_ratelimit.so /etc/redis/ratelimit.conf \
    >"$pkg/etc/redis/ratelimit.conf"
# The copyright file in Debian's machine-readable format, with the license's own text.
copyright=$(sed -n 's/^Copyright (c) //p' LICENSE)
substitute packaging/debian/copyright "" "" | sed "s|@COPYRIGHT@|$copyright|" >"$doc/copyright"
sed -n '/^Redistribution/,$p' LICENSE | sed -e 's/^$/./' -e 's/^/ /' >>"$doc/copyright"
cp README.md "$doc/README.md"
cp docs/*.md "$doc/docs/"
cp CHANGELOG.md "$doc/changelog"
{
    echo "redis-ratelimit ($deb_version) unstable; urgency=medium"
    echo
    echo "  * Release $version, packaged by make dist (the changes are in changelog.gz)."
    echo
    echo " -- $DEB_MAINTAINER  $(date -u -R -d "@$SOURCE_DATE_EPOCH")"
} >"$doc/changelog.Debian"
# Debian policy 12.3: the changelogs and docs over 4 kB are compressed (gzip -9n), the copyright never.
find "$doc" -type f ! -name copyright \( -name 'changelog*' -o -size +4k \) -exec gzip -9n {} +

# Depends from the library's own needs: dpkg-shlibdeps maps each symbol version it uses to the
# first version of the package that provides it (libc6, libgcc-s1).
mkdir -p "$work/shlibdeps/debian"
printf 'Source: redis-ratelimit\n\nPackage: redis-ratelimit\nArchitecture: %s\n' "$DEB_ARCH" \
    >"$work/shlibdeps/debian/control"
depends=$(cd "$work/shlibdeps" && dpkg-shlibdeps -O -e"$pkg/usr/lib/redis/modules/libredis_ratelimit.so" 2>/dev/null |
    sed -n 's/^shlibs:Depends=//p')
[ -n "$depends" ] || die "dpkg-shlibdeps computed no Depends"
installed_size=$(du -k -s --apparent-size --exclude=DEBIAN "$pkg" | cut -f1)
substitute packaging/debian/control "" "" |
    sed -e "s|@DEB_VERSION@|$deb_version|" -e "s|@ARCH@|$DEB_ARCH|" -e "s|@DEPENDS@|$depends|" \
        -e "s|@MAINTAINER@|$DEB_MAINTAINER|" -e "s|@INSTALLED_SIZE@|$installed_size|" \
        >"$pkg/DEBIAN/control"
echo /etc/redis/ratelimit.conf >"$pkg/DEBIAN/conffiles"
(cd "$pkg" && find usr -type f | sort | xargs md5sum >DEBIAN/md5sums)
find "$pkg" -type d -exec chmod 0755 {} +
find "$pkg" -type f -exec chmod 0644 {} +
chmod 0755 "$pkg/usr/lib/redis/modules/libredis_ratelimit.so"
find "$pkg" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
deb=$dist/redis-ratelimit_${deb_version}_$DEB_ARCH.deb
dpkg-deb --root-owner-group -Zxz --build "$pkg" "$deb" >/dev/null
say "Depends: $depends"

# --- the service's Debian package ---------------------------------------------------------------
# /usr/bin/redis-ratelimit-rls, its man page, the systemd unit (installed disabled: no maintainer
# script, so installing starts nothing and purging leaves nothing), the conffiles
# /etc/default/redis-ratelimit-rls (its environment) and /etc/redis-ratelimit-rls/config/example.yaml.
rpkg=$work/deb-rls
rdoc=$rpkg/usr/share/doc/redis-ratelimit-rls
install -D -m 0755 "$work/rls/redis-ratelimit-rls" "$rpkg/usr/bin/redis-ratelimit-rls"
mkdir -p "$rpkg/usr/lib/systemd/system" "$rpkg/usr/share/man/man1" "$rpkg/etc/default" \
    "$rpkg/etc/redis-ratelimit-rls/config" "$rdoc" "$rpkg/DEBIAN"
substitute packaging/rls/redis-ratelimit-rls.service "" "" >"$rpkg/usr/lib/systemd/system/redis-ratelimit-rls.service"
substitute packaging/rls/redis-ratelimit-rls.default "" "" >"$rpkg/etc/default/redis-ratelimit-rls"
substitute packaging/rls/example.yaml "" "" >"$rpkg/etc/redis-ratelimit-rls/config/example.yaml"
substitute packaging/rls/redis-ratelimit-rls.1 "" "" | gzip -9n >"$rpkg/usr/share/man/man1/redis-ratelimit-rls.1.gz"
substitute packaging/debian/copyright-rls "" "" | sed "s|@COPYRIGHT@|$copyright|" >"$rdoc/copyright"
sed -n '/^Redistribution/,$p' LICENSE | sed -e 's/^$/./' -e 's/^/ /' >>"$rdoc/copyright"
cp gateways/envoy/README.md "$rdoc/README.md"
cp CHANGELOG.md "$rdoc/changelog"
{
    echo "redis-ratelimit-rls ($deb_version) unstable; urgency=medium"
    echo
    echo "  * Release $version, packaged by make dist (the changes are in changelog.gz)."
    echo
    echo " -- $DEB_MAINTAINER  $(date -u -R -d "@$SOURCE_DATE_EPOCH")"
} >"$rdoc/changelog.Debian"
find "$rdoc" -type f ! -name copyright \( -name 'changelog*' -o -size +4k \) -exec gzip -9n {} +
printf 'Source: redis-ratelimit\n\nPackage: redis-ratelimit-rls\nArchitecture: %s\n' "$DEB_ARCH" \
    >"$work/shlibdeps/debian/control"
rls_depends=$(cd "$work/shlibdeps" && dpkg-shlibdeps -O -e"$rpkg/usr/bin/redis-ratelimit-rls" 2>/dev/null |
    sed -n 's/^shlibs:Depends=//p')
[ -n "$rls_depends" ] || die "dpkg-shlibdeps computed no Depends for redis-ratelimit-rls"
# It needs libc6 alone, and the version dpkg-shlibdeps gives is too high: Debian's libc6 symbols
# file dates sysconf (GLIBC_2.2.5) from 2.34, when the _SC_ names it added (_SC_MINSIGSTKSZ...)
# appeared, and Rust's standard library calls sysconf for the page size and the CPUs. Its symbol
# versions, checked above, are at most $GLIBC_FLOOR (test-dist installs and runs it on Debian 11's
# glibc 2.31), so that is the floor.
case $rls_depends in
    "libc6 (>= "*")") rls_depends="libc6 (>= $GLIBC_FLOOR)" ;;
    *) die "redis-ratelimit-rls needs more than libc6: $rls_depends" ;;
esac
installed_size=$(du -k -s --apparent-size --exclude=DEBIAN "$rpkg" | cut -f1)
substitute packaging/debian/control-rls "" "" |
    sed -e "s|@DEB_VERSION@|$deb_version|" -e "s|@ARCH@|$DEB_ARCH|" -e "s|@DEPENDS@|$rls_depends|" \
        -e "s|@MAINTAINER@|$DEB_MAINTAINER|" -e "s|@INSTALLED_SIZE@|$installed_size|" \
        >"$rpkg/DEBIAN/control"
printf '%s\n' /etc/default/redis-ratelimit-rls /etc/redis-ratelimit-rls/config/example.yaml >"$rpkg/DEBIAN/conffiles"
(cd "$rpkg" && find usr -type f | sort | xargs md5sum >DEBIAN/md5sums)
find "$rpkg" -type d -exec chmod 0755 {} +
find "$rpkg" -type f -exec chmod 0644 {} +
chmod 0755 "$rpkg/usr/bin/redis-ratelimit-rls"
find "$rpkg" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
rls_deb=$dist/redis-ratelimit-rls_${deb_version}_$DEB_ARCH.deb
dpkg-deb --root-owner-group -Zxz --build "$rpkg" "$rls_deb" >/dev/null
say "redis-ratelimit-rls Depends: $rls_depends"

# --- the client packages -----------------------------------------------------------------------
# Each needs its registry (the Python build backend, the Node package's devDependencies): where
# that fails, the package is left out with a line saying so (`make test-dist` then skips its
# check), unless DIST_STRICT=1 (the release workflow), which fails instead.
client_failed() {
    tail -n 15 "$2" >&2
    if [ "${DIST_STRICT:-0}" = 1 ]; then
        die "building $1 failed (log above)"
    fi
    say "skipped $1: its build failed (is its package registry reachable?); the log's end is above"
}
if [ "${DIST_NO_CLIENTS:-0}" != 1 ] && [ -f clients/python/pyproject.toml ]; then
    say "building clients/python (the sdist, then the wheel from it)"
    "$venv/bin/python3" -m build --outdir "$dist" clients/python >"$work/python-build.log" 2>&1 ||
        client_failed clients/python "$work/python-build.log"
fi
if [ "${DIST_NO_CLIENTS:-0}" != 1 ] && [ -f clients/node/package.json ]; then
    say "packing clients/node (npm pack)"
    (
        command -v npm >/dev/null 2>&1 || { echo "npm is missing"; exit 1; }
        cd clients/node
        # npm pack runs the package's prepack script, which may need its devDependencies.
        if [ ! -d node_modules ] && [ -f package-lock.json ]; then
            npm ci --no-audit --no-fund --loglevel=error
        fi
        npm pack --pack-destination "$dist" --loglevel=error
    ) >"$work/node-pack.log" 2>&1 || client_failed clients/node "$work/node-pack.log"
fi

(cd "$dist" && find . -maxdepth 1 -type f ! -name SHA256SUMS -printf '%P\n' | sort | xargs sha256sum >SHA256SUMS)
say "wrote $dist:"
(cd "$dist" && find . -maxdepth 1 -type f -printf '  %f (%s bytes)\n' | sort)
