#!/usr/bin/env bash
# The closing total of a test run: `N passed, N failed, N skipped`, alone on the last line, after
# the names of the skipped tests.
#
# usage: tests/summary.sh OUTPUT SKIPS [EXIT]
#   OUTPUT  what `cargo test` printed (every suite's `test result:` line is counted)
#   SKIPS   the file the tests appended their skips to ($RATELIMIT_SKIP_LOG; absent: none), one
#           `<test>: <reason>` line each (see `common::skip` in testkit/src/lib.rs)
#   EXIT    cargo's exit status: a run that failed without a failed test (a suite that did not
#           compile or did not finish) counts one failure
# A skipped test returns and passes as far as the test harness knows: it is counted here as
# skipped, not as passed. Exits 0.
set -uo pipefail
output=$1
skips=$2
status=${3:-0}

read -r passed failed < <(awk '
    /^test result: / {
        for (i = 1; i <= NF; i++) {
            if ($(i + 1) ~ /^passed/) p += $i
            if ($(i + 1) ~ /^failed/) f += $i
        }
    }
    END { print p + 0, f + 0 }' "$output")
skipped=0
if [ -s "$skips" ]; then
    skipped=$(sort -u "$skips" | awk -F': ' '{ print $1 }' | sort -u | wc -l)
    echo
    echo "skipped:"
    sort -u "$skips" | sed 's/^/  /'
fi
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
    echo
    echo "a suite failed to build or did not finish (exit status $status): counted as 1 failed"
    failed=1
fi
echo
echo "$((passed - skipped)) passed, $failed failed, $skipped skipped"
