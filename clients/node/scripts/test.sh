#!/usr/bin/env bash
# `make test-node`: prepare.sh (npm ci, build), `npm pack`, then `node --test` against real
# redis-servers the tests start (RATELIMIT_MODULE: the module; without it its tests skip).
#   scripts/test.sh [TAP]   TAP: where node --test's TAP report goes (for tests/summary.sh)
# Where npm or the registry is out of reach, the TAP says so in one skipped test, and it exits 0.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tap=${1:-$PWD/test-results.tap}
mkdir -p "$(dirname "$tap")"

errors=$(mktemp)
bash scripts/prepare.sh 2> >(tee "$errors" >&2)
status=$?
if [ "$status" -ne 0 ]; then
    reason=$(tail -1 "$errors" | sed 's|^clients/node: ||')
    rm -f "$errors"
    if [ "$status" -eq 2 ]; then # npm or the registry out of reach: one skip, said once
        echo "clients/node: skipped: $reason"
        printf 'TAP version 13\nok 1 - clients/node # SKIP %s\n1..1\n# tests 1\n# pass 0\n# fail 0\n# skipped 1\n' "$reason" > "$tap"
        exit 0
    fi
    printf 'TAP version 13\nnot ok 1 - clients/node: the build failed: %s\n1..1\n# tests 1\n# pass 0\n# fail 1\n# skipped 0\n' "$reason" > "$tap"
    exit 1
fi
rm -f "$errors"

pack=$(mktemp -d)
trap 'rm -rf "$pack"' EXIT
name=$(npm pack --ignore-scripts --silent --pack-destination "$pack" | tail -1)
export RATELIMIT_NODE_TARBALL=$pack/$name
# Two files at a time: most of the time is spent waiting on servers and child processes.
node --test --test-concurrency=2 \
    --test-reporter=spec --test-reporter-destination=stdout \
    --test-reporter=tap --test-reporter-destination="$tap" \
    test/*.test.mjs
