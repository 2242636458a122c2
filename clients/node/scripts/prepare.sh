#!/usr/bin/env bash
# Makes clients/node ready to use and test: its dev dependencies installed from package-lock.json
# into clients/node/node_modules (npm ci, only when the lock changed), then the build (dist/, only
# when a source changed). Used by `make test-node` and by examples/express/run.sh.
# Exits 0 when ready; 2 with one line on stderr when npm (or the registry) is out of reach.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

for tool in node npm; do
    command -v "$tool" >/dev/null 2>&1 || { echo "clients/node: no $tool on PATH (Node 18 or later is needed)" >&2; exit 2; }
done
major=$(node -p 'process.versions.node.split(".")[0]')
[ "$major" -ge 18 ] || { echo "clients/node: Node $major is too old (18 or later)" >&2; exit 2; }

want=$(cat package.json package-lock.json | sha256sum | cut -d' ' -f1)
if [ "$(cat node_modules/.installed.sha256 2>/dev/null)" != "$want" ]; then
    echo "clients/node: installing package-lock.json into $PWD/node_modules" >&2
    if ! log=$(npm ci --no-audit --no-fund --loglevel=error 2>&1); then
        echo "$log" > npm-ci-error.log # the whole story, beside the one line below
        reason=$(echo "$log" | grep -i -m1 'error' || echo "$log" | tail -1)
        echo "clients/node: npm ci failed (is the npm registry reachable?): $reason (clients/node/npm-ci-error.log)" >&2
        exit 2
    fi
    echo "$want" > node_modules/.installed.sha256
fi

library=$(node -p 'require("./package.json").ratelimit.library')
built=$(cat package.json tsconfig.json scripts/build.mjs src/*.ts "$library" | sha256sum | cut -d' ' -f1)
# The stamp stays out of dist/ (npm pack ships dist/).
if [ ! -f dist/esm/index.js ] || [ "$(cat node_modules/.built.sha256 2>/dev/null)" != "$built" ]; then
    echo "clients/node: building dist/" >&2
    node scripts/build.mjs
    echo "$built" > node_modules/.built.sha256
fi
