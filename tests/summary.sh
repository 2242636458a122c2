#!/usr/bin/env bash
# The closing total of a test run: `N passed, N failed, N skipped`, alone on the last line, after
# the names of the skipped tests.
#
# usage: tests/summary.sh OUTPUT SKIPS [EXIT [PYTEST_OUTPUT PYTEST_EXIT [NODE_TAP NODE_EXIT]]]
#   OUTPUT  what `cargo test` printed (every suite's `test result:` line is counted)
#   SKIPS   the file the tests appended their skips to ($RATELIMIT_SKIP_LOG; absent: none), one
#           `<test>: <reason>` line each (see `common::skip` in testkit/src/lib.rs)
#   EXIT    cargo's exit status: a run that failed without a failed test (a suite that did not
#           compile or did not finish) counts one failure
#   PYTEST_OUTPUT, PYTEST_EXIT  what clients/python/test.sh printed (pytest -rs) and its exit
#           status: pytest's passed, failed (and errors) and skipped are added, its skips listed
#           with their reasons; a failed run without a failed test counts one failure
#           ("" and 0: none)
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
not_cargo=0
if [ -s "$skips" ]; then
    skipped=$(sort -u "$skips" | awk -F': ' '{ print $1 }' | sort -u | wc -l)
    # A whole run skipped outside cargo (the Python package's) passed no cargo test.
    not_cargo=$(grep -c '^clients/python (pytest): ' "$skips")
    echo
    echo "skipped:"
    sort -u "$skips" | sed 's/^/  /'
fi
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
    echo
    echo "a suite failed to build or did not finish (exit status $status): counted as 1 failed"
    failed=1
fi
pytest_output=${4:-}
pytest_status=${5:-0}
if [ -n "$pytest_output" ]; then
    # pytest's closing lines (one per run): `== 78 passed, 2 skipped, 1 failed, 1 error in 14.8s ==`.
    read -r py_passed py_failed py_skipped < <(awk '
        /^=+ .* in [0-9.]+s/ {
            for (i = 1; i <= NF; i++) {
                w = $(i + 1); sub(/,$/, "", w)
                if (w == "passed") p += $i
                if (w == "failed" || w == "error" || w == "errors") f += $i
                if (w == "skipped") s += $i
            }
        }
        END { print p + 0, f + 0, s + 0 }' "$pytest_output" 2>/dev/null || echo 0 0 0)
    if [ "$py_skipped" -gt 0 ]; then
        echo
        echo "skipped (pytest, clients/python):"
        grep -E '^SKIPPED \[' "$pytest_output" | sed 's/^/  /'
    fi
    if [ "$pytest_status" -ne 0 ] && [ "$py_failed" -eq 0 ]; then
        echo
        echo "clients/python's tests failed to build or run (exit status $pytest_status): counted as 1 failed"
        py_failed=1
    fi
    passed=$((passed + py_passed))
    failed=$((failed + py_failed))
    skipped_py=$py_skipped
else
    skipped_py=0
fi
passed=$((passed - skipped + not_cargo))
skipped=$((skipped + skipped_py))

node_tap=${6:-}
node_status=${7:-0}
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
