#!/usr/bin/env bash
# The closing total of a test run: `N passed, N failed, N skipped`, alone on the last line, after
# the names of the skipped tests.
#
# usage: tests/summary.sh OUTPUT SKIPS [EXIT [NODE_TAP [NODE_EXIT]]]
#   OUTPUT  what `cargo test` printed (every suite's `test result:` line is counted)
#   SKIPS   the file the tests appended their skips to ($RATELIMIT_SKIP_LOG; absent: none), one
#           `<test>: <reason>` line each (see `common::skip` in tests/integration/common/mod.rs)
#   EXIT    cargo's exit status: a run that failed without a failed test (a suite that did not
#           compile or did not finish) counts one failure
#   NODE_TAP  the TAP report of clients/node's `node --test` (clients/node/scripts/test.sh): its
#           closing `# pass`, `# fail` (with `# cancelled`) and `# skipped` counts are added, and
#           each skipped test is listed with its reason (`... # SKIP <reason>`)
#   NODE_EXIT its exit status: a failure without a failed test counts one, as for cargo
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
passed=$((passed - skipped))

node_tap=${4:-}
node_status=${5:-0}
if [ -n "$node_tap" ]; then
    if [ -s "$node_tap" ]; then
        # The closing counts are the last lines at column 0; a skipped test is
        # `ok N - <name> # SKIP <reason>` at any depth.
        read -r node_passed node_failed node_skipped < <(awk '
            /^# pass / { p = $3 } /^# fail / { f = $3 } /^# cancelled / { c = $3 } /^# skipped / { s = $3 }
            END { print p + 0, f + c + 0, s + 0 }' "$node_tap")
        node_skips=$(sed -n 's/^ *ok [0-9]* - \(.*\) # SKIP *\(.*\)$/  node: \1: \2/p' "$node_tap")
    else
        node_passed=0 node_failed=0 node_skipped=0 node_skips=""
    fi
    if [ -n "$node_skips" ]; then
        [ -s "$skips" ] || { echo; echo "skipped:"; }
        echo "$node_skips"
    fi
    if [ "$node_status" -ne 0 ] && [ "$node_failed" -eq 0 ]; then
        echo
        echo "clients/node's tests failed without a failed test (exit status $node_status): counted as 1 failed"
        node_failed=1
    fi
    passed=$((passed + node_passed))
    failed=$((failed + node_failed))
    skipped=$((skipped + node_skipped))
fi
echo
echo "$passed passed, $failed failed, $skipped skipped"
