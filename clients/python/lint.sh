#!/usr/bin/env bash
# `make lint`'s Python part: `ruff check`, `ruff format --check` and `mypy --strict` over the
# package (src/redis_ratelimit), configured in pyproject.toml. The whole package is formatted by
# `ruff format` (line length 120), so the format is checked too. The tools, at the versions
# pinned here, and what mypy reads of the package's imports (redis-py, the frameworks) are
# installed with pip into a virtualenv of their own, target/python-lint (never system-wide),
# made again only when that list changes; their caches live there too. Where the package
# registry cannot be reached, it says so in one line (appended to $RATELIMIT_SKIP_LOG) and exits
# 0, as test.sh does.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=$root/target/python-lint
tools="ruff==0.17.6 mypy==2.4.1 redis==8.2.0 fastapi==0.165.0 flask==3.1.3"

skip() {
    echo "clients/python lint: skipped: $1"
    if [ -n "${RATELIMIT_SKIP_LOG:-}" ]; then
        echo "clients/python (lint): $1" >> "$RATELIMIT_SKIP_LOG"
    fi
    exit 0
}

if [ "$(cat "$venv/.list" 2>/dev/null)" != "$tools" ]; then
    python3 -m venv --clear "$venv" || skip "python3 -m venv failed (Debian: apt-get install python3-venv)"
    # shellcheck disable=SC2086
    if ! "$venv/bin/pip" install --quiet --disable-pip-version-check $tools >"$venv/pip.log" 2>&1; then
        if ! timeout 20 "$venv/bin/python" -m pip index versions pip >/dev/null 2>&1; then
            skip "the package registry is unreachable (pip install $tools)"
        fi
        cat "$venv/pip.log"
        echo "clients/python lint: pip install $tools failed" >&2
        exit 1
    fi
    echo "$tools" > "$venv/.list"
fi

cd "$here"
export RUFF_CACHE_DIR=$venv/ruff-cache MYPY_CACHE_DIR=$venv/mypy-cache
status=0
"$venv/bin/ruff" check src/redis_ratelimit || status=1
"$venv/bin/ruff" format --check src/redis_ratelimit || status=1
# --strict is pyproject.toml's too; said here so that the command reads as what it checks.
"$venv/bin/mypy" --strict || status=1
exit $status
