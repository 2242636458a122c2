#!/usr/bin/env bash
# `make memcheck`: the module's memory safety, checked by valgrind memcheck.
#
# Runs tests/integration/memcheck.rs (`cargo test --profile tests --test integration -- memcheck::`) with every redis-server the
# harness starts wrapped in valgrind (RATELIMIT_SERVER_WRAPPER, see testkit/src/lib.rs), one log
# per process (forked children too) in $MEMCHECK_DIR/valgrind.<pid>.log, then reads the logs.
# It FAILS on any invalid read/write/free, mismatched free, overlapping copy, fishy allocation
# size, jump to an invalid address, crash, or use of uninitialised memory (conditional jump,
# uninitialised value, syscall param) whose record has a frame in the module: a frame in
# libredis_ratelimit.so, a `redis_ratelimit::`, `redis_ratelimit_core::` or `redis_module::` function, or any Rust source
# file (`*.rs:N`; redis-server, libc and jemalloc hold no Rust, so a Rust frame is the module's).
# Any stack of the record counts (where it happened, where the block was freed or allocated, where
# an uninitialised value was created), so Redis reading memory the module freed is caught too.
# Errors wholly inside redis-server/libc are printed as notes and do not fail the run; so are the
# false positives Redis suppresses in its own valgrind runs (redis/src/valgrind.sup) when the
# module is on the stack only because it called Redis (LZF's uninitialised hash table when
# RM_SaveStringBuffer compresses; see known_redis_false_positive below), and definite leaks
# (noted when the module allocated them). It also fails when the suite fails or when no log was
# produced (the wrapper did not take effect). Each distinct record is printed once, with a count.
#
# usage: tests/memcheck.sh          (make memcheck; RATELIMIT_MODULE defaults to the release build)
# env:   MEMCHECK_DIR (target/memcheck; emptied first), MEMCHECK_TRACK_ORIGINS (1: where
#        uninitialised values come from; 0 is faster), MEMCHECK_ONLY_CHECK=1 (read the logs
#        already in MEMCHECK_DIR, run nothing), MEMCHECK_TEST_ARGS (extra arguments for the test
#        binary, e.g. a test name filter)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

out=$(realpath -m "${MEMCHECK_DIR:-target/memcheck}")
track_origins=${MEMCHECK_TRACK_ORIGINS:-1}

if [ "${MEMCHECK_ONLY_CHECK:-0}" != 1 ]; then
    for tool in valgrind redis-server python3 cargo; do
        command -v "$tool" >/dev/null || { echo "memcheck: $tool is missing (make memcheck installs valgrind)" >&2; exit 1; }
    done
    module=$(realpath "${RATELIMIT_MODULE:-target/release/libredis_ratelimit.so}")
    [ -f "$module" ] || { echo "memcheck: no module at $module (make build)" >&2; exit 1; }
    # The wrapper is split on whitespace by the harness: the log path must not contain any.
    case "$out" in *[[:space:]]*) echo "memcheck: MEMCHECK_DIR must not contain spaces: $out" >&2; exit 1 ;; esac
    server=$(command -v "${RATELIMIT_SERVER:-${REDIS_SERVER:-redis-server}}")
    # valgrind must replace the allocator redis-server really uses. Debian's redis-server 7.0.15
    # links jemalloc dynamically (ldd: libjemalloc.so.2), hence `somalloc=libjemalloc.so*`. A
    # server with an unprefixed allocator linked statically needs `somalloc=NONE` (malloc is in
    # the executable itself); one on glibc malloc needs no synonym. Redis's own bundled jemalloc
    # is prefixed (je_malloc): valgrind cannot replace it, so heap errors would go unseen; build
    # such a server with MALLOC=libc (Redis's `make valgrind`).
    if ldd "$server" 2>/dev/null | grep -q 'libjemalloc\.so'; then
        synonyms='--soname-synonyms=somalloc=libjemalloc.so*'
    elif nm -D "$server" 2>/dev/null | grep -qE ' T malloc$'; then
        synonyms='--soname-synonyms=somalloc=NONE'
    elif nm -D "$server" 2>/dev/null | grep -qE ' T je_malloc$'; then
        echo "memcheck: $server has a prefixed static jemalloc valgrind cannot replace;" \
            "use a redis-server built with MALLOC=libc (RATELIMIT_SERVER=...)" >&2
        exit 1
    else
        synonyms=''
    fi
    rm -rf "$out"
    mkdir -p "$out"
    wrapper="valgrind --tool=memcheck $synonyms --error-limit=no --num-callers=40"
    wrapper+=" --leak-check=full --show-leak-kinds=definite --errors-for-leak-kinds=none"
    if [ "$track_origins" = 1 ]; then
        wrapper+=" --track-origins=yes"
    fi
    wrapper+=" --log-file=$out/valgrind.%p.log"
    echo "memcheck: $wrapper"
    echo "memcheck: module $module; logs in $out"
    start=$(date +%s)
    suite_status=0
    # shellcheck disable=SC2086
    RATELIMIT_MODULE=$module RATELIMIT_SERVER_WRAPPER=$wrapper RATELIMIT_SERVER=$server \
        cargo test --profile tests --test integration -- memcheck:: ${MEMCHECK_TEST_ARGS:-} || suite_status=$?
    echo "memcheck: the suite took $(( $(date +%s) - start )) s under valgrind (exit status $suite_status)"
else
    suite_status=0
fi

python3 - "$out" "$suite_status" <<'PY'
"""Reads every valgrind.*.log in argv[1]; exits 1 on an error record with a module frame."""
import glob
import os
import re
import sys

out, suite_status = sys.argv[1], int(sys.argv[2])

# Record kinds (the record's first line) that fail the run when the module is involved.
FATAL = re.compile(
    r"^(Invalid (read|write) of size"
    r"|Invalid free\(\)"
    r"|Mismatched free\(\)"
    r"|Conditional jump or move depends on uninitialised value"
    r"|Use of uninitialised value of size"
    r"|Syscall param .* (points to|contains) uninitialised byte"
    r"|Source and destination overlap"
    r"|Argument '.*' of function .* has a fishy"
    r"|Jump to the invalid address"
    r"|Process terminating with default action of signal)"
)
LEAK = re.compile(r"are definitely lost in loss record")
FRAME = re.compile(r"^\s+(at|by) 0x[0-9A-Fa-f]+: (.*)$")
# A frame of the module: its library, its crates, or any Rust source (only the module has Rust).
MODULE_FRAME = re.compile(r"libredis_ratelimit\.so|redis_ratelimit(_core)?::|redis_module::|\.rs:\d+\)")
PREFIX = re.compile(r"^==(\d+)== ?(.*)$")


def records(path):
    """The log's lines without the ==pid== prefix, split into blank-line separated records."""
    current = []
    with open(path, errors="replace") as log:
        for raw in log:
            match = PREFIX.match(raw.rstrip("\n"))
            if not match:
                continue  # valgrind's own non-prefixed lines (rare): ignore
            text = match.group(2)
            if text.strip():
                current.append(text)
            elif current:
                yield current
                current = []
    if current:
        yield current


def module_frames(record):
    return [line for line in record if FRAME.match(line) and MODULE_FRAME.search(line)]


def function(frame_line):
    """`lzf_compress` from `   at 0x1849B3: lzf_compress (in /usr/bin/redis-server)`."""
    return FRAME.match(frame_line).group(2).split(" (")[0]


def stacks(record):
    """The record's stacks as (label, [function...]): first where it happened (label ""), then
    e.g. "Block was alloc'd at" or "Uninitialised value was created by a stack allocation"."""
    out = [("", [])]
    for line in record[1:]:
        if FRAME.match(line):
            out[-1][1].append(function(line))
        else:
            out.append((line.strip(), []))
    return out


def known_redis_false_positive(record):
    """Reports Redis itself suppresses in its own valgrind runs (redis/src/valgrind.sup), which
    only have the module on the stack because it called into Redis:
    - LZF's hash table is an uninitialised stack array by design: a conditional jump or use of
      an uninitialised value inside lzf_compress whose origin is lzf_compress's own stack (or
      unknown, without --track-origins) is not the module's data;
    - ztrymalloc asked for a fishy size read from a corrupt RDB/DUMP length, which Redis checks.
    Uninitialised data the module hands to lzf_compress has another origin and still fails."""
    head, site = record[0], stacks(record)[0][1]
    origins = [f for label, f in stacks(record) if label.startswith("Uninitialised value was")]
    if ("uninitialised" in head and site[:1] == ["lzf_compress"]
            and all(f[:1] == ["lzf_compress"] for f in origins)):
        return "LZF's uninitialised hash table: redis/src/valgrind.sup lzf_uninitialized_hash_table"
    if "fishy" in head and site[:3] == ["malloc", "ztrymalloc_usable", "ztrymalloc"]:
        return "Redis's try-allocation of a corrupt length: redis/src/valgrind.sup"
    return None


logs = sorted(glob.glob(os.path.join(out, "valgrind.*.log")))
fatal, other, benign, leaks, incomplete = [], [], [], [], []
for path in logs:
    complete = False
    for record in records(path):
        head = record[0]
        if any(line.startswith("ERROR SUMMARY:") for line in record):
            complete = True
        if LEAK.search(head):
            if module_frames(record):
                leaks.append((path, record))
            continue
        if not FATAL.match(head) and not head.startswith(("Invalid", "Mismatched", "Uninitialised")):
            continue
        if not any(FRAME.match(line) for line in record):
            continue  # e.g. "Process terminating" without a stack
        if not (FATAL.match(head) and module_frames(record)):
            other.append((path, record))
        elif known_redis_false_positive(record):
            benign.append((path, [f"[{known_redis_false_positive(record)}]"] + record))
        else:
            fatal.append((path, record))
    if not complete:
        incomplete.append(path)


def shown(record, full):
    """The record in full, or (notes) its first line, stack labels and each stack's first frames."""
    if full:
        return record
    lines, frames = [], 0
    for line in record:
        frames = frames + 1 if FRAME.match(line) else 0
        if frames <= 5:
            lines.append(line)
    return lines


def show(title, items, full):
    """Each distinct record once, with how many times and in which logs it was seen."""
    groups = {}
    for path, record in items:
        lines = shown(record, full)
        key = "\n".join(re.sub(r"0x[0-9A-Fa-f]+", "0x", line) for line in lines)
        groups.setdefault(key, (lines, []))[1].append(os.path.basename(path))
    for lines, paths in groups.values():
        where = ", ".join(sorted(set(paths)))
        print(f"--- {title} (x{len(paths)}: {where}) ---")
        print("\n".join(lines))


show("NOTE: error outside the module (does not fail the run)", other, full=False)
show("NOTE: known Redis false positive, the module on the stack (does not fail the run)", benign,
     full=False)
show("NOTE: memory definitely lost, allocated by the module (does not fail the run)", leaks,
     full=True)
for path in incomplete:
    print(f"NOTE: {os.path.basename(path)} has no ERROR SUMMARY: the process was killed before "
          "valgrind finished (errors it met before are still counted)")
show("MODULE ERROR", fatal, full=True)
print(f"memcheck: {len(logs)} valgrind logs read ({len(logs) - len(incomplete)} complete), "
      f"{len(fatal)} errors in module frames, {len(other)} other errors, "
      f"{len(benign)} known Redis false positives, "
      f"{len(leaks)} definite leaks from the module")
failed = False
if not logs:
    print(f"memcheck: FAILED: no valgrind log in {out}: the servers did not run under valgrind")
    failed = True
if fatal:
    print("memcheck: FAILED: memory errors in the module (records above)")
    failed = True
if suite_status != 0:
    print(f"memcheck: FAILED: the memcheck suite itself failed (exit status {suite_status})")
    failed = True
if not failed:
    print("memcheck: OK")
sys.exit(1 if failed else 0)
PY
