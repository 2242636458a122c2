#!/usr/bin/env bash
# `make test-python`: builds the sdist and the wheel (python -m build), installs the wheel into a
# fresh virtualenv, and runs tests/ against it (what users install, not this source tree), with
# real redis-servers: with the module (RATELIMIT_MODULE, default target/release's) and without.
# Everything lands in target/python/. Where the package registry cannot be reached, it says so
# in one line, appends it to $RATELIMIT_SKIP_LOG (counted by tests/summary.sh), and exits 0.
# Extra arguments go to pytest (`make test-python PYTEST_ARGS="-k stall"`).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$root/target/python
mkdir -p "$out"
export RATELIMIT_MODULE=${RATELIMIT_MODULE:-$root/target/release/libredis_ratelimit.so}
pip_quiet=(--quiet --disable-pip-version-check)

skip() {
    echo "clients/python: skipped: $1"
    if [ -n "${RATELIMIT_SKIP_LOG:-}" ]; then
        echo "clients/python (pytest): $1" >> "$RATELIMIT_SKIP_LOG"
    fi
    exit 0
}

# pip failed: the registry is unreachable (skip), or the failure is ours (fail).
pip_failed() {
    if ! timeout 20 "$out/tools/bin/python" -m pip index versions pip >/dev/null 2>&1; then
        skip "the package registry is unreachable (pip install $1)"
    fi
    cat "$out/pip.log"
    echo "clients/python: pip install $1 failed" >&2
    exit 1
}

tools=$out/tools
if ! "$tools/bin/python" -c "import build, hatchling" 2>/dev/null; then
    python3 -m venv --clear "$tools" || skip "python3 -m venv failed (Debian: apt-get install python3-venv)"
    "$tools/bin/pip" install "${pip_quiet[@]}" build hatchling >"$out/pip.log" 2>&1 || pip_failed "build hatchling"
fi

rm -rf "$out/dist"
if ! nice "$tools/bin/python" -m build --no-isolation --outdir "$out/dist" "$here" >"$out/build.log" 2>&1; then
    cat "$out/build.log"
    echo "clients/python: python -m build failed" >&2
    exit 1
fi
wheel=$(ls "$out"/dist/*.whl)
ls "$out"/dist/*.tar.gz >/dev/null || { echo "clients/python: no sdist built" >&2; exit 1; }

# The dependencies (the wheel's, its extras', the tests') live in a virtualenv of their own,
# made again only when this list changes; the wheel goes into a fresh virtualenv each run, which
# sees them through a .pth file.
deps_list="redis fastapi flask pytest httpx uvicorn"
deps=$out/deps
if [ "$(cat "$deps/.list" 2>/dev/null)" != "$deps_list" ]; then
    python3 -m venv --clear "$deps" || skip "python3 -m venv failed (Debian: apt-get install python3-venv)"
    # shellcheck disable=SC2086
    "$deps/bin/pip" install "${pip_quiet[@]}" $deps_list >"$out/pip.log" 2>&1 || pip_failed "$deps_list"
    echo "$deps_list" > "$deps/.list"
fi
venv=$out/venv
# Without pip of its own (bootstrapping it is the slow part): the deps' pip installs into it.
python3 -m venv --clear --without-pip "$venv" || skip "python3 -m venv failed"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$deps/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$site/_redis_ratelimit_test_deps.pth"
"$deps/bin/pip" --python "$venv/bin/python" install "${pip_quiet[@]}" --no-deps "$wheel" >"$out/pip.log" 2>&1 \
    || pip_failed "the wheel"
# The wheel's dependencies are met, as pip sees them.
"$deps/bin/pip" --python "$venv/bin/python" check >"$out/pip.log" 2>&1 \
    || { cat "$out/pip.log"; echo "clients/python: pip check failed" >&2; exit 1; }

# The oldest redis-py the package takes: the API's suites again with redis-py 5 (its own
# dependency virtualenv, the same wheel).
old_redis="redis==5.0.8 pytest"
deps5=$out/deps-redis5
if [ "$(cat "$deps5/.list" 2>/dev/null)" != "$old_redis" ]; then
    python3 -m venv --clear "$deps5" || skip "python3 -m venv failed"
    # shellcheck disable=SC2086
    "$deps5/bin/pip" install "${pip_quiet[@]}" $old_redis >"$out/pip.log" 2>&1 || pip_failed "$old_redis"
    echo "$old_redis" > "$deps5/.list"
fi
venv5=$out/venv-redis5
python3 -m venv --clear --without-pip "$venv5" || skip "python3 -m venv failed"
site5=$("$venv5/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$deps5/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$site5/_redis_ratelimit_test_deps.pth"
"$deps5/bin/pip" --python "$venv5/bin/python" install "${pip_quiet[@]}" --no-deps "$wheel" >"$out/pip.log" 2>&1 \
    || pip_failed "the wheel"

cd "$here"
status=0
echo "== redis-py $("$venv/bin/python" -c 'import redis; print(redis.__version__)'): every suite"
RATELIMIT_WHEEL_VENV=$venv nice "$venv/bin/python" -m pytest tests -rs -p no:cacheprovider ${PYTEST_ARGS:-} || status=$?
echo "== redis-py $("$venv5/bin/python" -c 'import redis; print(redis.__version__)'): the limiters' suites"
RATELIMIT_WHEEL_VENV=$venv5 nice "$venv5/bin/python" -m pytest tests/test_limiter.py tests/test_equivalence.py \
    tests/test_failures.py tests/test_wheel.py tests/test_take.py tests/test_local.py tests/test_fallback.py \
    tests/test_denial_cache.py tests/test_batches.py tests/test_late_grants.py tests/test_fast_path.py \
    tests/test_spec_form.py -rs -p no:cacheprovider ${PYTEST_ARGS:-} || status=$?
exit $status
