#!/usr/bin/env python3
"""Assembles the Redis Functions library, lua-reference/functions/ratelimit.lua, from its parts.

`FUNCTION LOAD` takes one payload; the library is kept in parts (lua-reference/functions/src/,
concatenated in the order of their names) so that each idea has a file of its own. The module's
error texts are not copied by hand: a line `--@error E_NAME = CONST` in a part becomes
`local E_NAME = '<text>'`, the text of `pub const CONST: &str` in the module's errors (ERROR_RS),
its command names (`RATELIMIT.REFUND`) spelled as the library's functions (`ratelimit_refund`).

    python3 lua-reference/functions/assemble.py          writes ratelimit.lua (make functions-payload)
    python3 lua-reference/functions/assemble.py --check  exits 1 if ratelimit.lua is not what the
                                                         parts assemble to (make lint, make test)
    python3 lua-reference/functions/assemble.py --stdout prints the payload

Standard library only, and deterministic: the same parts and errors give the same bytes.
"""

import argparse
import difflib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The module's error texts, relative to the repository's root: the one place this path is named.
ERROR_RS = "core/src/error.rs"
PARTS = "lua-reference/functions/src"
PAYLOAD = "lua-reference/functions/ratelimit.lua"
SHEBANG = "#!lua name=ratelimit"
# The width of the generated lines (the parts keep to it too: .luacheckrc).
WIDTH = 100

ERROR_LINE = re.compile(r"--@error ([A-Za-z_][A-Za-z0-9_]*) = ([A-Z][A-Z0-9_]*)")
CONST = re.compile(r"pub const ([A-Z][A-Z0-9_]*): &str =\s*")
COMMAND = re.compile(r"RATELIMIT\.([A-Z]+)")


class AssemblyError(Exception):
    pass


def rust_string(source, at, where):
    """The value of the Rust string literal starting at source[at] (a `"`), and its end."""
    if source[at] != '"':
        raise AssemblyError(f"{where}: expected a plain string literal")
    out, i = [], at + 1
    simple = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", '"': '"', "'": "'"}
    while i < len(source):
        c = source[i]
        if c == '"':
            return "".join(out), i + 1
        if c != "\\":
            out.append(c)
            i += 1
            continue
        e = source[i + 1]
        if e == "\n":
            # A line continuation: the newline and the next line's leading whitespace go.
            i += 2
            while i < len(source) and source[i] in " \t\n\r":
                i += 1
        elif e in simple:
            out.append(simple[e])
            i += 2
        elif e == "x":
            out.append(chr(int(source[i + 2 : i + 4], 16)))
            i += 4
        elif e == "u":
            end = source.index("}", i)
            out.append(chr(int(source[i + 3 : end], 16)))
            i = end + 1
        else:
            raise AssemblyError(f"{where}: unknown escape \\{e}")
    raise AssemblyError(f"{where}: unterminated string")


def module_errors():
    """The module's `pub const NAME: &str = "..."` texts, by name."""
    path = ROOT / ERROR_RS
    try:
        source = path.read_text(encoding="utf-8")
    except OSError as e:
        raise AssemblyError(
            f"cannot read the module's error texts ({e}); if src/error.rs moved, "
            f"set ERROR_RS in {Path(__file__).relative_to(ROOT)}"
        ) from e
    texts = {}
    for m in CONST.finditer(source):
        texts[m.group(1)], _ = rust_string(source, m.end(), f"{ERROR_RS}: {m.group(1)}")
    return texts


def lua_string(text):
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def lua_local(name, text):
    """`local name = '...'`, wrapped after spaces so that no line passes WIDTH."""
    words = re.findall(r"[^ ]* *", text)
    words = [w for w in words if w]
    lines, piece, first = [], "", f"local {name} = "
    prefix = first
    for word in words:
        if piece and len(prefix) + len(lua_string(piece + word)) > WIDTH:
            lines.append(prefix + lua_string(piece))
            prefix, piece = "  .. ", ""
        piece += word
    lines.append(prefix + lua_string(piece))
    return lines


def library_text(texts, error):
    """A module error's text as the library sends it: the functions' names for the commands'."""
    return COMMAND.sub(lambda m: "ratelimit_" + m.group(1).lower(), texts[error])


def expand(part, lines, texts):
    out = []
    for n, line in enumerate(lines, 1):
        if line.startswith("--@"):
            m = ERROR_LINE.fullmatch(line)
            if not m:
                raise AssemblyError(f"{part}:{n}: expected --@error E_NAME = CONST")
            name, error = m.groups()
            if error not in texts:
                raise AssemblyError(f"{part}:{n}: {ERROR_RS} has no pub const {error}: &str")
            out.extend(lua_local(name, library_text(texts, error)))
        else:
            out.append(line)
    return out


def assemble():
    texts = module_errors()
    parts = sorted((ROOT / PARTS).glob("*.lua"))
    if not parts:
        raise AssemblyError(f"no parts in {PARTS}")
    out = []
    for path in parts:
        rel = path.relative_to(ROOT / PARTS.rsplit("/", 1)[0]).as_posix()
        lines = path.read_text(encoding="utf-8").rstrip("\n").split("\n")
        if path == parts[0]:
            if lines[0] != SHEBANG:
                raise AssemblyError(f"{rel}: the first part starts with {SHEBANG}")
            # FUNCTION LOAD takes nothing but the shebang on the first line: the notice is next.
            out += [
                SHEBANG,
                f"-- GENERATED by lua-reference/functions/assemble.py from {PARTS}/*.lua",
                f"-- and the error texts of {ERROR_RS}: do not edit it. Edit the parts, then run",
                "-- `make functions-payload` (docs/functions.md, \"How the library is built\").",
            ]
            lines = lines[1:]
        else:
            out += ["", ("-- ---- " + rel + " ").ljust(WIDTH - 4, "-")]
        out += expand(rel, lines, texts)
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help=f"fail if {PAYLOAD} is not current")
    mode.add_argument("--stdout", action="store_true", help="print the payload")
    args = parser.parse_args()
    try:
        payload = assemble()
    except AssemblyError as e:
        print(f"assemble.py: {e}", file=sys.stderr)
        return 2
    target = ROOT / PAYLOAD
    if args.stdout:
        sys.stdout.write(payload)
        return 0
    if args.check:
        current = target.read_text(encoding="utf-8") if target.exists() else ""
        if current == payload:
            return 0
        diff = difflib.unified_diff(
            current.splitlines(), payload.splitlines(),
            f"{PAYLOAD} (committed)", f"{PAYLOAD} (assembled from {PARTS})", lineterm="", n=1,
        )
        shown = list(diff)
        print("\n".join(shown[:60]), file=sys.stderr)
        if len(shown) > 60:
            print(f"... {len(shown) - 60} more diff lines", file=sys.stderr)
        print(
            f"assemble.py: {PAYLOAD} is not what its parts assemble to: edit the parts in "
            f"{PARTS} (not the payload), then run `make functions-payload`",
            file=sys.stderr,
        )
        return 1
    if not target.exists() or target.read_text(encoding="utf-8") != payload:
        target.write_text(payload, encoding="utf-8")
        print(f"assembled {PAYLOAD} from {len(list((ROOT / PARTS).glob('*.lua')))} parts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
