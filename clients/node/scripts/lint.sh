#!/usr/bin/env bash
# `make lint`'s Node part: the package's TypeScript type-checked (`tsc --noEmit`, tsconfig.json:
# strict, no implicit override or return, no switch fallthrough, no unused locals or parameters)
# and linted (eslint 9, eslint.config.mjs: typescript-eslint's type-checked recommended rules) over
# src/, with the dev dependencies package-lock.json pins, installed by prepare.sh (npm ci into
# clients/node/node_modules) as test.sh does.
# Exits 0 when both are clean; 1 on a finding or a failed install; 0 with one line saying why it
# skipped when npm or the npm registry is out of reach.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

errors=$(mktemp)
trap 'rm -f "$errors"' EXIT
bash scripts/prepare.sh 2> >(tee "$errors" >&2)
status=$?
if [ "$status" -ne 0 ]; then
    reason=$(tail -1 "$errors" | sed 's|^clients/node: ||')
    # prepare.sh's 2 is npm or its install out of reach; a registry that answers makes it a failure.
    if [ "$status" -eq 2 ] && ! { command -v npm >/dev/null 2>&1 && timeout 30 npm ping --silent >/dev/null 2>&1; }; then
        echo "clients/node: lint skipped: $reason"
        exit 0
    fi
    echo "clients/node: lint failed: $reason" >&2
    exit 1
fi

set -e
echo "clients/node: tsc --noEmit (tsconfig.json)"
node node_modules/typescript/bin/tsc -p tsconfig.json --noEmit
echo "clients/node: eslint src/ (eslint.config.mjs)"
node node_modules/eslint/bin/eslint.js --max-warnings 0 src/
echo "clients/node: lint clean"
