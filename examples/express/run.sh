#!/usr/bin/env bash
# Starts the example Express app in the foreground, installing its dependencies into
# node_modules here first if they are missing or out of date (npm ci, from package-lock.json),
# after making the package it depends on, redis-ratelimit-client in clients/node, ready (its own
# npm ci and build, each only when needed: clients/node/scripts/prepare.sh).
# `run.sh install` installs only.
# Reads REDIS_URL (default redis://127.0.0.1:6379), PORT (3000), HOST (127.0.0.1),
# RATELIMIT_POLICY (examples), RATELIMIT_FAIL (open or closed; default: ratelimit.json's).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

bash ../../clients/node/scripts/prepare.sh

want=$(cat package.json package-lock.json | sha256sum | cut -d' ' -f1)
if [ "$(cat node_modules/.installed.sha256 2>/dev/null)" != "$want" ]; then
    echo "run.sh: installing package-lock.json into $PWD/node_modules" >&2
    npm ci --no-audit --no-fund --loglevel=error
    echo "$want" > node_modules/.installed.sha256
fi
[ "${1:-}" = install ] && exit 0

export REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}
export RATELIMIT_POLICY=${RATELIMIT_POLICY:-examples}
exec node app.js
