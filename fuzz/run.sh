#!/usr/bin/env bash
# Bounded fuzz run: `make fuzz` (and CI, after `make test`).
#
# Builds the fuzz targets with cargo-fuzz (installed with `cargo install cargo-fuzz --locked` when
# missing: a few minutes, once per machine) and runs each for FUZZ_SECONDS (default 20) from the
# kept seeds in fuzz/corpus/<target>/ plus the corpus grown by earlier runs on this machine
# (fuzz/target/corpus/<target>/, never committed). A crash, an assertion, a timeout or an
# out-of-memory fails the run; libFuzzer saves the input under fuzz/artifacts/<target>/ and prints
# the command that reproduces it.
#
# Environment: FUZZ_SECONDS (per target), FUZZ_TARGETS (default: all), FUZZ_SANITIZER (default
# none: the fuzzed code has no unsafe; `address` needs RUSTC_BOOTSTRAP=1 on a stable toolchain,
# which this script then sets).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds=${FUZZ_SECONDS:-20}
targets=${FUZZ_TARGETS:-parse_check parse_checkall parse_lease codec}
sanitizer=${FUZZ_SANITIZER:-none}
if [ "$sanitizer" != none ]; then
    export RUSTC_BOOTSTRAP=1
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz (once per machine; a few minutes)"
    cargo install cargo-fuzz --locked
fi

# -a: debug assertions and overflow checks, so an arithmetic overflow is a crash.
build=(--sanitizer "$sanitizer" --debug-assertions)
cargo fuzz build "${build[@]}"

for target in $targets; do
    work=fuzz/target/corpus/$target
    log=fuzz/target/$target.log
    mkdir -p "$work"
    options=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1)
    case $target in
        parse_*) options+=(-dict=fuzz/arguments.dict) ;;
    esac
    echo "fuzz: $target for ${seconds}s (log: $log)"
    if ! cargo fuzz run "${build[@]}" "$target" "$work" "fuzz/corpus/$target" -- "${options[@]}" \
        >"$log" 2>&1; then
        tail -n 60 "$log"
        echo "fuzz: $target FAILED (the input is under fuzz/artifacts/$target/)"
        exit 1
    fi
    grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb)|cov: .*DONE' "$log" || true
    echo "fuzz: $target passed: corpus $(ls "$work" | wc -l) inputs"
done
