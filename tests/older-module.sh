#!/usr/bin/env bash
# The module as it was before a limit spec could be one argument (CHECK's arity -4), built once
# into DIR from the repository's history, for the Rust client's test of a server that refuses
# that form (clients/rust/tests/older_module.rs, a cluster's node not upgraded yet).
#
#   bash tests/older-module.sh REV DIR     (prints the library's path when it is there)
#
# Outside a git checkout that holds REV (a tarball), it says so and builds nothing: the test then
# skips with its own message.
set -euo pipefail
rev=$1
dir=$2
lib=$dir/target/release/libredis_ratelimit.so # the bench profile builds into release/
cd "$(dirname "$0")/.."
if [ -f "$lib" ] && [ "$(cat "$dir/rev" 2>/dev/null)" = "$rev" ]; then
  echo "$lib"
  exit 0
fi
if ! git cat-file -e "$rev^{commit}" 2>/dev/null; then
  echo "older-module: no git history with $rev here: the older-module test skips" >&2
  exit 0
fi
rm -rf "$dir"
mkdir -p "$dir/src"
git archive "$rev" | tar -x -C "$dir/src"
# The bench profile (opt-level 1, no LTO): a fast build of a module whose speed nobody measures.
(cd "$dir/src" && CARGO_TARGET_DIR="$dir/target" cargo build --profile bench -p redis-ratelimit \
  >"$dir/build.log" 2>&1) || { echo "older-module: the build failed, see $dir/build.log" >&2; exit 1; }
[ -f "$lib" ] || { echo "older-module: the build made no $lib" >&2; exit 1; }
echo "$rev" >"$dir/rev"
echo "$lib"
