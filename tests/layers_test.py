#!/usr/bin/env python3
"""layers_test.py - checks every quoted #include of the tree against the
layer table in docs/ARCHITECTURE.md ("Who may include whom").

The table has one row per directory (or per file, for an exception) and
the directories its files may include:

    | `gpud/` | `common/`, `proto/`, `gpud/` |

`d/` means the files directly in d/, `d/**` the whole subtree, a file name
that file; the same in both columns. A file's row is the longest row that
holds it. A directory holding C sources or headers that no row holds fails
the test, so a new directory has to be placed in the table.

Usage: layers_test.py [SOURCE_ROOT] (default: this file's parent's parent).
Exit status 0 when every include is allowed, 1 otherwise (each violation is
printed as file:line: include "x" (from row R; allowed: ...)).
"""

import os
import re
import sys
import tempfile

DOC = "docs/ARCHITECTURE.md"
MARK = "<!-- layers -->"
SOURCES = (".c", ".h", ".cu", ".cuh")
SKIP_DIRS = {".git", "subprojects"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|(.*)\|\s*$")


def read_table(root):
    """Rows of the table after MARK: {row: [allowed entries]}."""
    rows = {}
    with open(os.path.join(root, DOC), encoding="utf-8") as f:
        lines = f.read().split("\n")
    try:
        i = lines.index(MARK) + 1
    except ValueError:
        sys.exit(f"{DOC}: no {MARK} line before the layer table")
    # Skip to the table, then read rows until it ends.
    while i < len(lines) and not lines[i].startswith("|"):
        i += 1
    while i < len(lines) and lines[i].startswith("|"):
        m = ROW.match(lines[i])
        if m:
            rows[m.group(1)] = re.findall(r"`([^`]+)`", m.group(2))
        i += 1
    if not rows:
        sys.exit(f"{DOC}: the layer table after {MARK} has no rows")
    return rows


def row_of(path, rows):
    """The longest row containing path: a file row beats its directory's
    row, a `d/` row holds the files directly in d/, a `d/**` row the whole
    subtree."""
    best = None
    for r in rows:
        hit = covers(r, path)
        if hit and (best is None or len(r) > len(best)):
            best = r
    return best


def covers(entry, path):
    if entry.endswith("/**"):
        return path.startswith(entry[:-2])
    if entry.endswith("/"):
        return os.path.dirname(path) + "/" == entry
    return path == entry


def allowed(target, entries):
    return any(covers(e, target) for e in entries)


def resolve(root, src, name):
    """The include's path from the root: relative to the including file
    first (as the compiler looks), then from the root; a name found in
    neither (a generated header such as sw_config.h) stays as it is."""
    near = os.path.normpath(os.path.join(os.path.dirname(src), name))
    if os.path.exists(os.path.join(root, near)) and "/" not in name:
        return near
    return os.path.normpath(name)


def check(root):
    """(violations, unplaced directories, includes checked) of the tree."""
    rows = read_table(root)
    bad = []
    unplaced = set()
    checked = 0
    for d, dirs, files in os.walk(root):
        rel_d = os.path.relpath(d, root)
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and
                         not (rel_d == "." and (x.startswith("build") or
                                                x.startswith("."))))
        for fn in sorted(files):
            if not fn.endswith(SOURCES):
                continue
            src = os.path.normpath(os.path.join(rel_d, fn))
            row = row_of(src, rows)
            if row is None:
                unplaced.add(os.path.dirname(src) + "/")
                continue
            with open(os.path.join(root, src), encoding="utf-8", errors="replace") as f:
                for n, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    checked += 1
                    target = resolve(root, src, m.group(1))
                    if not allowed(target, rows[row]):
                        bad.append(f'{src}:{n}: include "{m.group(1)}" '
                                   f'(row `{row}` allows {", ".join(rows[row])})')
    return bad, sorted(unplaced), checked


def self_test():
    """The checker on a small tree of its own: it must see a program that
    includes another, a library that includes upward, a file row that opens
    one include, and a directory the table does not place."""
    files = {
        DOC: "\n".join([MARK, "| files in | may include |", "|---|---|",
                        "| `lib/` | `lib/` |", "| `app/` | `lib/`, `app/` |",
                        "| `app/glue.c` | `lib/`, `app/`, `other/` |",
                        "| `other/**` | `lib/**`, `other/**` |", ""]),
        "lib/a.h": '#include "lib/b.h"\n#include <stdio.h>\n',
        "lib/b.h": '#include "app/x.h"\n',            # upward: refused
        "app/x.h": '#include "lib/a.h"\n',
        "app/y.c": '#include "other/z.h"\n',          # sideways: refused
        "app/glue.c": '#include "other/z.h"\n',       # its row allows it
        "other/z.h": '#include "lib/deep/c.h"\n',     # lib/** allows it
        "other/sub/w.c": '#include "other/z.h"\n',    # other/** holds it
        "lib/deep/c.h": "",                            # lib/ holds only lib/*: unplaced
        "stray/s.c": '#include "lib/a.h"\n',          # no row: unplaced
    }
    with tempfile.TemporaryDirectory() as root:
        for name, text in files.items():
            os.makedirs(os.path.join(root, os.path.dirname(name)), exist_ok=True)
            with open(os.path.join(root, name), "w", encoding="utf-8") as f:
                f.write(text)
        bad, unplaced, checked = check(root)
    where = sorted(b.split(":")[0] for b in bad)
    assert where == ["app/y.c", "lib/b.h"], bad
    assert unplaced == ["lib/deep/", "stray/"], unplaced
    assert checked == 7, checked


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    self_test()
    bad, unplaced, checked = check(root)
    for d in unplaced:
        print(f"{d}: sources in a directory the layer table of {DOC} does not place")
    for b in bad:
        print(b)
    print(f"layers: {checked} includes checked, {len(bad)} outside their layer, "
          f"{len(unplaced)} directories unplaced")
    return 1 if bad or unplaced else 0


if __name__ == "__main__":
    sys.exit(main())
