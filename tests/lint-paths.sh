#!/usr/bin/env bash
# Fails on a comment that names a file of this repository that does not exist: a path
# (`core/src/codec/limiter.rs`, `tests/integration/fixtures/`, `../fixtures/x.txt`) resolved from
# the repository's root or from the commenting file's folder, a source file named from inside its
# folder (`store/codec.rs`) that no tracked path ends with, or a bare Rust file name (`txn.rs`)
# that no tracked file bears. A comment is a line's text after `//`, `#` or
# `--` (by the file's language), or a line inside `/* ... */`. A path into another project (a URL,
# `redis/redis src/module.c`) is told by what precedes it; a line with `lint-paths: ignore` is
# skipped. Usage: tests/lint-paths.sh [FILE...] (default: every tracked file); exit 1 on a miss.
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
exec python3 - "$@" <<'PY'
import os, re, subprocess, sys

tracked = subprocess.run(["git", "ls-files", "-z"], capture_output=True, check=True).stdout
tracked = [p for p in tracked.decode().split("\0") if p]
names = {os.path.basename(p) for p in tracked}
folders = {os.path.dirname(p) for p in tracked}
for folder in list(folders):
    while folder:
        folder = os.path.dirname(folder)
        folders.add(folder)
tops = {p.split("/", 1)[0] for p in tracked if "/" in p}

# The comment markers of each language, by file name ending.
LINE = {
    ".rs": "//", ".ts": "//", ".mts": "//", ".js": "//", ".mjs": "//", ".cjs": "//", ".go": "//",
    ".c": "//", ".h": "//", ".py": "#", ".pyi": "#", ".sh": "#", ".toml": "#", ".yml": "#",
    ".yaml": "#", ".txt": "#", ".cfg": "#", ".conf": "#", ".lua": "--", ".luacheckrc": "--",
    "Makefile": "#", "Dockerfile": "#", ".ini": "#", ".nginx": "#", ".cfg.in": "#",
}
BLOCK = {".rs", ".ts", ".mts", ".js", ".mjs", ".cjs", ".c", ".h", ".go"}
EXT = r"(?:rs|lua|py|pyi|ts|mts|mjs|cjs|js|sh|toml|md|txt|json|yml|yaml|c|h|conf|cfg|ini)"
PATH = re.compile(r"(?<![\w./:-])((?:\.\.?/)*(?:[\w.-]+/)+(?:[\w.-]+\." + EXT + r"\b|[\w.-]+/)?)")
# A path from inside a folder is checked for source files only; a bare name for Rust files only,
# the modules a comment names by file (`txn.rs`): a bare `results.md`, `valkey.conf` or
# `functions.lua` may be an output, another program's, or a name a file is installed under.
SOURCE = r"(?:rs|lua|py|pyi|ts|mts|mjs|cjs|js|sh|c|h)"
BARE = re.compile(r"(?<![\w./:-])([\w-]+\.rs)(?![\w/])")
# Words before a path that say it is another project's.
FOREIGN = re.compile(r"(https?://|\b[\w.-]+/[\w.-]+(?:'s)?\s+`?$|\bredis/redis\b|\bupstream\b)", re.I)

def marker(path):
    base = os.path.basename(path)
    if base in LINE:
        return LINE[base]
    for end in sorted(LINE, key=len, reverse=True):
        if base.endswith(end):
            return LINE[end]
    return None

def outside_strings(line, at):
    """The text before `at` closes every string it opens (a rough test: even quotes)."""
    before = line[:at]
    return before.count('"') % 2 == 0 and not before.endswith((":", "'"))

def comments(path, text):
    """(line number, comment text) of every comment in the file."""
    mark = marker(path)
    block = os.path.splitext(path)[1] in BLOCK
    inside = False
    for number, line in enumerate(text.split("\n"), 1):
        if inside:
            end = line.find("*/")
            yield number, line if end < 0 else line[:end]
            inside = end < 0
            continue
        found = None  # where the first comment of the line starts, and which kind
        if mark is not None:
            at = 0
            while (at := line.find(mark, at)) >= 0:
                if outside_strings(line, at):
                    found = (at, "line")
                    break
                at += len(mark)
        if block:
            at = line.find("/*")
            if at >= 0 and outside_strings(line, at) and (found is None or at < found[0]):
                found = (at, "block")
        if found is None:
            continue
        at, kind = found
        if kind == "line":
            yield number, line[at + len(mark):]
            continue
        rest = line[at + 2:]
        end = rest.find("*/")
        yield number, rest if end < 0 else rest[:end]
        inside = end < 0

def package_root(here):
    """The nearest folder at or above `here` with a package manifest: a crate's, a Node or
    Python package's paths (`tests/twins.rs`) are named from there."""
    folder = here
    while folder:
        if any(os.path.exists(os.path.join(folder, m)) for m in ("Cargo.toml", "package.json", "pyproject.toml")):
            return folder
        folder = os.path.dirname(folder)
    return ""

def exists(path, here):
    clean = path.rstrip("/")
    # A compiled module named as its importer names it (`./core.js`: core.ts).
    stem, ext = os.path.splitext(clean)
    spellings = [clean] + [stem + ts for js, ts in ((".js", ".ts"), (".mjs", ".mts"),
                                                   (".cjs", ".cts")) if ext == js]
    for spelling in spellings:
        for base in ("", here, package_root(here)):
            candidate = os.path.normpath(os.path.join(base, spelling))
            if candidate in folders or os.path.exists(candidate):
                return True
    return False

def ends_a_tracked_path(path):
    """`store/codec.rs` (a path from inside a folder): some tracked file's path ends with it."""
    tail = "/" + path.lstrip("./")
    return any(("/" + p).endswith(tail) for p in tracked)

misses = []
files = sys.argv[1:] or tracked
for path in files:
    if not os.path.isfile(path) or marker(path) is None and os.path.splitext(path)[1] not in BLOCK:
        continue
    # A link shows another file, whose comments are named from that file's folder.
    if os.path.islink(path):
        continue
    # This script's own comments name examples of what it finds.
    if "/corpus/" in path or path.endswith((".lock", "package-lock.json", "lint-paths.sh")):
        continue
    try:
        text = open(path, encoding="utf-8").read()
    except UnicodeDecodeError:
        continue
    here = os.path.dirname(path)
    for number, comment in comments(path, text):
        if "lint-paths: ignore" in comment:
            continue
        for match in PATH.finditer(comment):
            named = match.group(1)
            first = named.lstrip("./").split("/", 1)[0]
            if FOREIGN.search(comment[: match.start()]):
                continue
            if "*" in comment[match.end(): match.end() + 1] or "{" in named:
                continue
            if named.startswith(".") or first in tops:
                if not exists(named, here):
                    misses.append((named, f"{path}:{number}: no such path: {named}"))
            elif re.search(r"\." + SOURCE + r"$", named):
                # A file named from inside its folder (`store/codec.rs`), or another project's.
                if not exists(named, here) and not ends_a_tracked_path(named):
                    misses.append((named, f"{path}:{number}: no file's path ends so: {named}"))
        for match in BARE.finditer(PATH.sub(" ", comment)):
            named = match.group(1)
            if FOREIGN.search(comment[: match.start()]):
                continue
            if named not in names and not exists(named, here):
                misses.append((named, f"{path}:{number}: no tracked file is named {named}"))
# What git ignores is made by the build or the tests (fuzz/artifacts/, target/): it need not exist.
if misses:
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"],
                             input="\n".join(named for named, _ in misses),
                             capture_output=True, text=True).stdout.split("\n")
    misses = [line for named, line in misses if named not in ignored]
for miss in misses:
    print(miss)
if misses:
    print(f"lint-paths: {len(misses)} comment(s) name a path that does not exist", file=sys.stderr)
    sys.exit(1)
PY
