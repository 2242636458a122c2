#!/usr/bin/env bash
# packaging/check-library.sh LIBRARY [GLIBC_FLOOR]: is LIBRARY fit to ship to any x86_64 Linux with
# glibc GLIBC_FLOOR (default 2.17) or later? Prints what it found, one line per check, and exits 1
# when a check fails. LIBRARY may also be an executable (redis-ratelimit-rls): the same checks,
# but RedisModule_OnLoad's:
#
# - glibc floor: the highest GLIBC_x.y version among the symbols it imports is at most the floor
#   (a newer one makes the dynamic loader refuse the library on an older system);
# - NEEDED: only glibc's own libraries and libgcc_s. libc.so.6, libgcc_s.so.1 and the loader
#   (ld-linux-x86-64.so.2) are what any Rust library needs. libpthread.so.0, libdl.so.2, librt.so.1
#   and libm.so.6 are allowed too: before glibc 2.34 (all of RHEL 7 and 8, Debian 11, Ubuntu 20.04)
#   pthread_key_create, dlsym and friends live there, not in libc.so.6, so a library linked against
#   glibc 2.17 must name them. They are parts of glibc itself, in the same package as libc.so.6
#   (libc6, glibc), and glibc 2.34 and later keep them as empty stubs, so they cost nothing and are
#   present wherever libc.so.6 is. Anything else (libssl, libstdc++...) fails the check;
# - the stack is not executable (a PT_GNU_STACK header without the X flag; without that header
#   the loader would make every thread's stack executable);
# - x86_64, a shared object, and `RedisModule_OnLoad` exported (what Redis calls); for an
#   executable (one with a program interpreter), x86_64 and position-independent or not;
# - no debug sections left in it (they belong in the separate .debug file).
set -euo pipefail
lib=${1:?usage: packaging/check-library.sh LIBRARY [GLIBC_FLOOR]}
floor=${2:-2.17}
[ -f "$lib" ] || { echo "check-library: no file $lib" >&2; exit 1; }
export LC_ALL=C

failed=0
ok() { printf 'check-library: ok    %s\n' "$*"; }
bad() { printf 'check-library: FAIL  %s\n' "$*"; failed=1; }

header=$(readelf -h "$lib")
# An executable (redis-ratelimit-rls) has a program interpreter; the module has none.
if readelf -l --wide "$lib" | grep -q 'INTERP'; then
    kind=executable
    if grep -q 'Type:.*\(DYN\|EXEC\)' <<<"$header" && grep -q 'Machine:.*X86-64' <<<"$header"; then
        ok "an x86_64 executable ($(grep -q 'Type:.*DYN' <<<"$header" && echo position-independent || echo fixed addresses))"
    else
        bad "not an x86_64 executable: $(grep -E 'Type|Machine' <<<"$header" | tr -s ' ' | tr '\n' ' ')"
    fi
elif grep -q 'Type:.*DYN' <<<"$header" && grep -q 'Machine:.*X86-64' <<<"$header"; then
    kind=library
    ok "an x86_64 shared object"
else
    kind=library
    bad "not an x86_64 shared object: $(grep -E 'Type|Machine' <<<"$header" | tr -s ' ' | tr '\n' ' ')"
fi

# The versions of the symbols it imports (undefined in .dynsym), e.g. GLIBC_2.14.
highest=$(readelf --dyn-syms --wide "$lib" | awk '$7 == "UND"' | grep -o 'GLIBC_[0-9][0-9.]*' |
    sed 's/^GLIBC_//' | sort -uV | tail -n 1)
if [ -z "$highest" ]; then
    bad "no GLIBC_ symbol version found: not linked against glibc?"
elif [ "$(printf '%s\n%s\n' "$highest" "$floor" | sort -V | tail -n 1)" = "$floor" ]; then
    ok "glibc floor: the highest symbol version is GLIBC_$highest (at most $floor)"
else
    newer=$(readelf --dyn-syms --wide "$lib" | awk '$7 == "UND"' | grep -E "GLIBC_$highest( |$)" |
        awk '{ print $8 }' | head -n 5 | tr '\n' ' ')
    bad "glibc floor: GLIBC_$highest is above $floor (from $newer)"
fi

needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
unexpected=""
for soname in $needed; do
    case $soname in
        libc.so.6 | libgcc_s.so.1 | ld-linux-x86-64.so.2 | libpthread.so.0 | libdl.so.2 | librt.so.1 | libm.so.6) ;;
        *) unexpected+=" $soname" ;;
    esac
done
if [ -z "$unexpected" ]; then
    ok "NEEDED: $(echo $needed) (glibc and libgcc_s only)"
else
    bad "NEEDED names libraries outside glibc and libgcc_s:$unexpected (all: $(echo $needed))"
fi

# Its flags are the columns between the sizes and the alignment: "RW" or "RWE" ("R E" elsewhere).
stack=$(readelf -l --wide "$lib" | awk '$1 == "GNU_STACK" { f = ""; for (i = 7; i < NF; i++) f = f $i; print f }')
case $stack in
    "") bad "no PT_GNU_STACK header: the loader would make the stack executable" ;;
    *E*) bad "the stack is executable (GNU_STACK flags $stack)" ;;
    *) ok "the stack is not executable (GNU_STACK flags $stack)" ;;
esac

if [ "$kind" = executable ]; then
    :
elif readelf --dyn-syms --wide "$lib" | awk '$7 != "UND" && $4 == "FUNC" { print $8 }' | grep -qx 'RedisModule_OnLoad'; then
    ok "exports RedisModule_OnLoad"
else
    bad "RedisModule_OnLoad is not exported"
fi

debug=$(readelf -S --wide "$lib" | { grep -o '\.debug_[a-z_]*' || true; } | sort -u | tr '\n' ' ')
if [ -z "$debug" ]; then
    ok "no debug sections ($(stat -c %s "$lib") bytes)"
else
    bad "debug sections left in it: $debug"
fi

exit $failed
