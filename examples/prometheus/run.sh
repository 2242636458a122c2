#!/usr/bin/env bash
# Starts prometheus-redis-exporter in the foreground against REDIS_URL, with ratelimit.lua as its
# --script, so that /metrics carries INFO ratelimit (see README.md here). Installs Debian's
# prometheus-redis-exporter with apt-get first if it is missing. `run.sh install` installs only.
# Reads REDIS_URL (default redis://127.0.0.1:6379), PORT (9121), HOST (127.0.0.1; 0.0.0.0 to be
# scraped from other machines).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

exporter=prometheus-redis-exporter # Debian's name for oliver006/redis_exporter
if ! command -v "$exporter" >/dev/null 2>&1; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "run.sh: no $exporter and no apt-get: install redis_exporter 1.45+ and put it on PATH as $exporter" >&2
        exit 1
    fi
    echo "run.sh: installing $exporter with apt-get" >&2
    sudo=$([ "$(id -u)" -eq 0 ] || echo sudo)
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$exporter" >/dev/null
fi
[ "${1:-}" = install ] && exit 0

exec "$exporter" \
    -redis.addr "${REDIS_URL:-redis://127.0.0.1:6379}" \
    -web.listen-address "${HOST:-127.0.0.1}:${PORT:-9121}" \
    -script "$PWD/ratelimit.lua"
