#!/usr/bin/env python3
"""Fail when two of the server's object files call each other.

    scripts/objcycle.py BUILD_DIR [NM]

reads the object files the build made of server/*.c (BUILD_DIR/server/
CMakeFiles/*.dir/*.c.o; the shared common/ sources compiled into the same
library are outside the graph) with `nm`: an object that leaves a symbol
undefined which another defines depends on that one. It prints one edge
per line, `a -> b  (symbol, ...)`, then every cycle (each strongly connected
component of more than one object, with the symbols that close it), and
exits 1 if there is one, 0 otherwise.

The include graph (include_graph.py) can be acyclic while the calls are not:
a module may declare in its own header what another module implements.
This check sees the linker's view, so a call back up the layers shows.
"""
import glob
import os
import subprocess
import sys

from include_graph import components


def symbols(nm, path):
    """(defined, undefined) global symbols of one object file."""
    out = subprocess.run([nm, "-g", "-P", path], check=True,
                         capture_output=True, text=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            undefined.add(name)
        elif kind in "TDBRCGSVW" or kind in "tdbr":
            defined.add(name)
    return defined, undefined


def objects(build):
    found = {}
    for path in glob.glob(os.path.join(build, "server", "CMakeFiles", "*.dir",
                                       "*.c.o")):
        name = os.path.basename(path)[:-len(".c.o")]
        found[name] = path
    return found


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    nm = sys.argv[2] if len(sys.argv) > 2 else "nm"
    objs = objects(sys.argv[1])
    if len(objs) < 5:
        sys.exit(f"objcycle: found {len(objs)} server object files under "
                 f"{sys.argv[1]}: build first")
    defs, undefs, owner = {}, {}, {}
    for name, path in objs.items():
        defs[name], undefs[name] = symbols(nm, path)
        for s in defs[name]:
            owner.setdefault(s, name)
    edges, why = {}, {}
    for name in sorted(objs):
        for s in sorted(undefs[name]):
            dst = owner.get(s)
            if dst and dst != name:
                edges.setdefault(name, set()).add(dst)
                why.setdefault((name, dst), []).append(s)
    for (a, b), syms in sorted(why.items()):
        more = f", ... {len(syms) - 3} more" if len(syms) > 3 else ""
        print(f"{a} -> {b}  ({', '.join(syms[:3])}{more})")
    cycles = components(edges)
    for comp in cycles:
        print(f"CYCLE: {' <-> '.join(comp)}")
        for a in comp:
            for b in comp:
                if (a, b) in why:
                    print(f"  {a} -> {b}: {', '.join(why[(a, b)])}")
    print(f"{len(objs)} objects, {sum(len(v) for v in edges.values())} "
          f"edges, {len(cycles)} cycle(s)")
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main())
