#!/usr/bin/env bash
# Starts the example FastAPI app in the foreground, installing requirements.txt into .venv here
# first if it is missing or out of date. `run.sh install` installs only.
# Reads REDIS_URL (default redis://127.0.0.1:6379), PORT (8000), HOST (127.0.0.1),
# RATELIMIT_POLICY (examples), RATELIMIT_FAIL (open or closed; default: ratelimit.json's).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

# requirements.txt names the repository's package (clients/python): a change to it, or to the
# Functions library it ships, installs it again.
package=../../clients/python
want=$(cat requirements.txt "$package"/pyproject.toml "$package"/hatch_build.py \
    "$package"/src/redis_ratelimit/*.py ../../lua-reference/functions/ratelimit.lua | sha256sum | cut -d' ' -f1)
if [ "$(cat .venv/.requirements.sha256 2>/dev/null)" != "$want" ]; then
    echo "run.sh: installing requirements.txt into $PWD/.venv" >&2
    python3 -m venv .venv
    .venv/bin/pip install --quiet --disable-pip-version-check -r requirements.txt
    .venv/bin/pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "$package"
    echo "$want" > .venv/.requirements.sha256
fi
[ "${1:-}" = install ] && exit 0

export REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}
export RATELIMIT_POLICY=${RATELIMIT_POLICY:-examples}
exec .venv/bin/uvicorn app:app --host "${HOST:-127.0.0.1}" --port "${PORT:-8000}"
