#!/usr/bin/env python3
"""Print the include graph of a C directory's modules and fail on a cycle.

A module is a .c file and its own header: `registry.c` and `mts_registry.h`
are the module `registry`, `server.c` and `server.h` the module `server`.
Module A depends on module B when A's .c or header includes B's header.
Only headers of the same directory count: system and library headers, and
the other folders' (common/, shm/, proto/), are outside the graph.

    scripts/include_graph.py [DIR]        (default: server/)

prints one edge per line, `a -> b`, then every cycle found (each strongly
connected component of more than one module, and the include chain that
closes it), and exits 1 if there is one, 0 otherwise. A layered program has
none: each module sees only the ones below it.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def module_of(filename):
    base = os.path.splitext(os.path.basename(filename))[0]
    return base[4:] if base.startswith("mts_") else base


def graph(directory):
    names = sorted(f for f in os.listdir(directory) if f.endswith((".c", ".h")))
    local = {f for f in names if f.endswith(".h")}
    edges = {}
    for f in names:
        with open(os.path.join(directory, f), encoding="utf-8") as fh:
            text = fh.read()
        src = module_of(f)
        edges.setdefault(src, set())
        for inc in INCLUDE.findall(text):
            if inc in local and module_of(inc) != src:
                edges[src].add(module_of(inc))
    return edges


def components(edges):
    """Tarjan's strongly connected components, iteratively."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def chain(edges, comp):
    """One cycle inside a component, as a path a -> ... -> a."""
    inside = set(comp)
    start = comp[0]
    prev, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges.get(v, ())):
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return list(reversed(path)) + [start]
                if w in inside and w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp


def main():
    directory = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "server")
    edges = graph(directory)
    for src in sorted(edges):
        for dst in sorted(edges[src]):
            print(f"{src} -> {dst}")
    cycles = components(edges)
    for comp in cycles:
        print(f"cycle: {' -> '.join(chain(edges, comp))}"
              f"  (modules in the circle: {', '.join(comp)})", file=sys.stderr)
    if cycles:
        print(f"include_graph: {len(cycles)} cycle(s) in {directory}",
              file=sys.stderr)
        return 1
    print(f"include_graph: no cycle ({sum(map(len, edges.values()))} edges, "
          f"{len(edges)} modules)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
