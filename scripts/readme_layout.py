#!/usr/bin/env python3
"""Every function the README's "Source code layout" names is defined.

The layout walks a newcomer through the code by function name; a rename
that forgets the README would send them looking for something that is
gone. Each `name()` in that section must have a definition in the
sources: a line of a .c file that starts at column 0, names the function
and is not a declaration, or a `static inline` definition in a header.

usage: readme_layout.py SOURCE_DIR
"""
import pathlib
import re
import sys

SECTION = "## Source code layout"
DIRS = ("common", "shm", "proto", "client", "programs", "server")
NAME = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)\(\)`")
# The section names the paths through the code: fewer than this many
# functions means the section was cut or its heading renamed.
MIN_NAMES = 20


def section(readme):
    lines = readme.read_text().splitlines()
    try:
        start = lines.index(SECTION)
    except ValueError:
        sys.exit(f"FAIL: {readme} has no line '{SECTION}'")
    body = []
    for line in lines[start + 1:]:
        if line.startswith("## "):
            break
        body.append(line)
    return "\n".join(body)


def definitions(src):
    """Function names defined in the sources (a superset is fine)."""
    defined = set()
    attr = re.compile(r"__attribute__\s*\(\(.*?\)\)")
    word = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*\(")
    for d in DIRS:
        for path in sorted((src / d).rglob("*")):
            if path.suffix not in (".c", ".h"):
                continue
            prev = ""
            for line in path.read_text(errors="replace").splitlines():
                head = line.rstrip()
                starts = bool(head) and (head[0].isalpha() or head[0] == "_")
                inline = "static inline" in head or (
                    "static inline" in prev and not prev.rstrip().endswith(";"))
                if starts and not head.endswith(";") and (
                        path.suffix == ".c" or inline):
                    # The function a definition line names is the
                    # first word followed by "(", attributes aside.
                    m = word.search(attr.sub("", head))
                    if m:
                        defined.add(m.group(1))
                prev = line
    return defined


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    src = pathlib.Path(sys.argv[1])
    names = sorted(set(NAME.findall(section(src / "README.md"))))
    if len(names) < MIN_NAMES:
        sys.exit(f"FAIL: the layout names {len(names)} functions, "
                 f"expected at least {MIN_NAMES}")
    defined = definitions(src)
    missing = [n for n in names if n not in defined]
    for n in missing:
        print(f"FAIL: README.md's source code layout names {n}(), "
              "which is defined nowhere in " + ", ".join(DIRS))
    if missing:
        sys.exit(1)
    print(f"{len(names)} functions named, all defined")


if __name__ == "__main__":
    main()
