#!/usr/bin/python3
"""after_free: how far a process's figure is from RssAnon in the seconds
after it frees a large heap of small objects.

Each runtime, alone under one memtallyd, builds ~300 MiB of small objects
and frees them at once (sqlite3: DROP TABLE + VACUUM of an in-memory
database; python3: `del` + `gc.collect()`; the fragmented heap: 300 MiB of
4 KiB blocks, every other one freed). From the free until 5 s after it,
every 50 ms (as fast as the CLI answers), memtally's figure for the
process (`bytes`, as memtallyd reports it) and RssAnon
(/proc/PID/status). Reported: the sample furthest below RssAnon, how long
the figure stayed below RssAnon by more than 10% or 16 MiB (the bound
tests/integration/test_after_free.py checks), and the other way round the
sample furthest above RssAnon and how long it stayed above by more than
that (freed bytes counted as the allocator's until a sample says what it
gave back).

Run:  /usr/bin/python3 bench/after_free.py --build-dir BUILD
      [--label TEXT] [--refresh-ms N] [--no-results]
Writes its section of bench/results/after_free.md unless --no-results (the section
keeps earlier runs' tables with another label).
"""

import argparse
import os
import re
import shutil
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchlib import (  # noqa: E402
    SRC_DIR, harness, log, machine_info, results_path, write_section)

MIB = 1 << 20
PERL = shutil.which("perl")

# perl: 300 MiB of short strings in an array, then the array emptied.
PERL_SCRIPT = r"""
$| = 1;
print "ready pid=$$\n";
<STDIN>;
my @held = map { "s" . $_ } 1 .. 5_200_000;
print "built\n";
<STDIN>;
@held = ();
undef @held;
print "dropped\n";
<STDIN>;
"""


def runtimes(tq, taf):
    """[(name, argv, lib, env, build, drop, ready)] for FreeRun."""
    glibc, je = taf.GLIBC_LIB, taf.PRELOAD
    g = {"MEMTALLY_ALLOCATOR": "glibc"}
    j = {"MEMTALLY_ALLOCATOR": "jemalloc"}
    w = tq.worker
    rts = [
        ("C, glibc front end", [*w("quiet"), "300"], glibc, g, None),
        ("C, jemalloc", [*w("quiet"), "300"], je, j, None),
        ("C++, glibc front end", [*w("mt_quiet_cxx"), "300"], glibc, g, None),
        ("C++, jemalloc", [*w("mt_quiet_cxx"), "300"], je, j, None),
        ("fragmented heap, glibc front end", [*w("frag"), "300", "4096"],
         glibc, g, "frag"),
        ("fragmented heap, jemalloc", [*w("frag"), "300", "4096"], je, j,
         "frag"),
    ]
    out = []
    for name, argv, lib, env, kind in rts:
        if kind == "frag":
            # Registered at once, small as it is before it allocates.
            env = dict(env, MEMTALLY_REGISTER_MIN="0")
            out.append((name, argv, lib, env, None, ("frag", "fragmented"),
                        True))
        else:
            out.append((name, argv, lib, env, ("build", "built"),
                        ("drop", "dropped"), True))
    if PERL:
        out.append(("perl, glibc front end", [PERL, "-e", PERL_SCRIPT],
                    glibc, g, ("", "built"), ("", "dropped"), True))
        out.append(("perl, jemalloc", [PERL, "-e", PERL_SCRIPT], je, j,
                    ("", "built"), ("", "dropped"), True))
    if os.access(tq.PYTHON, os.X_OK):
        out.append(("python3 (glibc front end, the default)",
                    [tq.PYTHON, "-c", tq.PY_SCRIPT], je,
                    {"MEMTALLY_ALLOCATOR": None, "PYTHONMALLOC": None},
                    ("", "built"), ("", "dropped"), True))
    if tq.SQLITE:
        out.append(("sqlite3 :memory:, jemalloc",
                    [tq.SQLITE, "-batch", ":memory:"], je, j,
                    (tq.SQL_BUILD, "built"), (tq.SQL_DROP, "dropped"),
                    False))
    return out


def measure(build, refresh_ms):
    h = harness(build)
    import test_quiet as tq  # noqa: E402 - after harness() set its path
    import test_after_free as taf  # noqa: E402
    rows = []
    for name, argv, lib, env, build_step, drop, ready in runtimes(tq, taf):
        env = dict(env)
        if refresh_ms is not None:
            env["MEMTALLY_REFRESH_MS"] = str(refresh_ms)
        with h.Server() as s:
            r = taf.FreeRun(s, name, argv, lib, env, build_step, drop, ready)
            try:
                r.free_and_sample()
            finally:
                r.close()
        (deficit, t_low, fig, anon), below = r.worst()
        (excess, t_high), above = r.over()
        low = min(fig_ - anon_ for _, fig_, anon_ in r.samples)
        t_min = min(r.samples, key=lambda x: x[1] - x[2])[0]
        held = max(a for _, _, a in r.samples)
        rows.append((name, held, low, t_min, below, excess, t_high, above,
                     len(r.samples)))
        log("%s: lowest %+.1f MiB at +%.2f s, below the bound %.2f s; "
            "highest %+.1f MiB, above it %.2f s (%d samples)"
            % (name, low / MIB, t_min, below, excess / MIB, above,
               len(r.samples)))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(SRC_DIR, "build"))
    ap.add_argument("--label", default="this build")
    ap.add_argument("--refresh-ms", type=int, default=None)
    ap.add_argument("--no-results", action="store_true")
    a = ap.parse_args()
    build = os.path.abspath(a.build_dir)
    rows = measure(build, a.refresh_ms)
    i = machine_info()
    info = "%s on %s (%d CPUs, Linux %s), %s; commit `%s`%s" % (
        i["date"], i["cpu_model"], i["nproc"], i["kernel"], i["glibc"],
        i["commit"], " with uncommitted changes" if i["uncommitted"] else "")
    label = a.label + (", MEMTALLY_REFRESH_MS=%d" % a.refresh_ms
                       if a.refresh_ms is not None else "")
    lines = ["#### %s\n" % label,
             "Measured %s.\n" % info,
             "| runtime | RssAnon at most (MiB) | figure − RssAnon, lowest "
             "(MiB, at s after the free) | below by > 10%/16 MiB for | "
             "figure − RssAnon, highest (MiB, at s) | above by > 10%/16 MiB "
             "for |",
             "|---|---|---|---|---|---|"]
    for (name, held, low, t_min, below, excess, t_high, above, n) in rows:
        lines.append("| %s | %.1f | %+.1f (+%.2f s) | %.2f s | %+.1f "
                     "(+%.2f s) | %.2f s |"
                     % (name, held / MIB, low / MIB, t_min, below,
                        excess / MIB, t_high, above))
    table = "\n".join(lines)
    print(table)
    if a.no_results:
        return
    path = results_path("after_free")
    old = ""
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
    m = re.search(r"<!-- BEGIN after_free.*?-->\n(.*?)<!-- END after_free "
                  r"-->", old, re.S)
    kept = []
    if m:
        # Earlier runs' tables under other labels stay.
        for block in re.split(r"(?m)^(?=#### )", m.group(1)):
            if block.startswith("#### ") and \
                    not block.startswith("#### %s\n" % label):
                kept.append(block.split("\n\nRerun:")[0].rstrip())
    intro = (
        "What the figure does in the 5 s after a process frees ~300 MiB "
        "of small objects, each runtime alone, sampled every 50 ms (as "
        "fast as the CLI answers). Below by more than 10% or 16 MiB: "
        "under-counting, which tests/integration/test_after_free.py "
        "forbids; above: freed bytes counted as the allocator's until "
        "the next sample says what it gave back.")
    text = "\n\n".join([intro] + kept + [table]) + \
        "\n\nRerun: `/usr/bin/python3 bench/after_free.py --build-dir " \
        "build [--label TEXT] [--refresh-ms N]`"
    write_section(path, "after_free", text)


if __name__ == "__main__":
    main()
