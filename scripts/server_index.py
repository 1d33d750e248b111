#!/usr/bin/env python3
"""server/server.h's index names every module of memtallyd.

The comment at the top of server.h is where a reader finds which file
holds what; a module added without a line there is one they will not
find. Each server/*.c and server/mts_*.h must be named in that comment.

usage: server_index.py SERVER_DIR
"""
import pathlib
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    d = pathlib.Path(sys.argv[1])
    text = (d / "server.h").read_text()
    end = text.find("*/")
    if end < 0:
        sys.exit("FAIL: server.h opens with no comment")
    index = text[:end]
    files = sorted(p.name for p in d.glob("*.c")) + sorted(
        p.name for p in d.glob("mts_*.h"))
    missing = [f for f in files if f not in index]
    for f in missing:
        print(f"FAIL: server/{f} has no line in server.h's index")
    if missing:
        sys.exit(1)
    print(f"{len(files)} modules, all in server.h's index")


if __name__ == "__main__":
    main()
