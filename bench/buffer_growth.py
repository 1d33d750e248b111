#!/usr/bin/python3
"""buffer_growth: memtally_buf with 1.5x vs 2x growth (against the reference table).

Arrow's BufferBuilder (ARROW-6450) measured tiny (8 B), small
(700 B) and large (1.5 MB) appends into one growable buffer with 1.5x and
2x growth, on jemalloc and on the system allocator, and kept 2x. This suite
runs the same three cases on memtally_buf (client/buffer.c) with the
buffer's accounting on and off, and reports bytes per second.

Two workers (buffer_growth.c): bench_bufgrow_je (jemalloc) and
bench_bufgrow_glibc, each proving at start which allocator serves it and
that memtally_process_bytes() moves by exactly the buffer's capacity with
accounting on (and not at all with it off); every timed run checks the
accounting again. A failed proof fails the run. Both workers are pinned to
one CPU and stay alive; every repetition runs all 8 variants of a case,
alternating the order (ABCD DCBA), so drifts of this shared machine hit
every variant alike. Cells: median bytes/s over --reps and the
interquartile range; p: two-sided Mann-Whitney U, accounting on vs off.

Outputs: a table on stdout, JSON in BUILD/bench/buffer_growth.json and,
for a run of all cases, bench/results/buffer_growth.md.

Run all:   cmake --build BUILD --target bench_buffer_growth
Run one:   /usr/bin/python3 bench/buffer_growth.py --build-dir BUILD \\
               --case tiny
Extra flags also come from $MEMTALLY_BENCH_ARGS.
"""

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (  # noqa: E402
    SRC_DIR, BenchError, ServeWorker, log, machine_info, mann_whitney_p,
    quartiles, results_path, write_section)

CASES = ["tiny", "small", "large"]
ALLOCS = ["jemalloc", "glibc"]
GROWTHS = ["1.5", "2"]
ACCTS = ["off", "on"]

# The reference: ARROW-6450, pitrou's Ryzen 7 1700 run (jemalloc) and wesm's i9-9960X run
# (system allocator), bytes per second, for the shape of the comparison.
SEED = {
    ("jemalloc", "1.5", "tiny"): 768.4e6, ("jemalloc", "2", "tiny"): 778.6e6,
    ("jemalloc", "1.5", "small"): 2.68e9, ("jemalloc", "2", "small"): 2.84e9,
    ("jemalloc", "1.5", "large"): 2.78e9, ("jemalloc", "2", "large"): 2.92e9,
    ("glibc", "1.5", "tiny"): 380.3e6, ("glibc", "2", "tiny"): 706.9e6,
    ("glibc", "1.5", "small"): 612.0e6, ("glibc", "2", "small"): 691.6e6,
    ("glibc", "1.5", "large"): 476.6e6, ("glibc", "2", "large"): 670.0e6,
}


class Worker(ServeWorker):
    def __init__(self, exe, alloc, cpu, mib, tmp, env):
        super().__init__(exe, alloc, cpu, tmp, env, ("--mib", str(mib)))

    def run(self, case, growth, acct):
        r = self.request("run %s %s %s" % (case, growth, acct))
        return {"ns": int(r[1]), "cap": int(r[3]), "growths": int(r[5]),
                "moved": int(r[7])}


def fmt_bps(x):
    if x >= 1e9:
        return "%.2f GB/s" % (x / 1e9)
    return "%.0f MB/s" % (x / 1e6)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(SRC_DIR, "build"))
    ap.add_argument("--case", action="append", choices=CASES)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--mib", type=int, default=64,
                    help="bytes built per buffer, MiB (reference: 256)")
    ap.add_argument("--cpu", type=int)
    ap.add_argument("--json")
    ap.add_argument("--results-md",
                    default=results_path("buffer_growth"))
    argv = sys.argv[1:] + shlex.split(os.environ.get("MEMTALLY_BENCH_ARGS",
                                                     ""))
    args = ap.parse_args(argv)
    build = os.path.abspath(args.build_dir)
    cases = args.case or CASES
    cpu = args.cpu
    if cpu is None:
        cpu = max(os.sched_getaffinity(0))
    info = machine_info()
    tmp = tempfile.mkdtemp(prefix="mtbench-bufgrow-")
    env = dict(os.environ)
    for k in ("LD_PRELOAD", "MEMTALLY_DISABLE", "MEMTALLY_DEBUG"):
        env.pop(k, None)
    # No server: the buffer's growths are counted locally (fail open).
    env["MEMTALLY_SOCKET"] = os.path.join(tmp, "no-server.sock")
    exes = {"jemalloc": os.path.join(build, "bench", "bench_bufgrow_je"),
            "glibc": os.path.join(build, "bench", "bench_bufgrow_glibc")}
    workers = {}
    try:
        for a in ALLOCS:
            workers[a] = Worker(exes[a], a, cpu, args.mib, tmp, env)
            log("proof %s: %s" % (a, json.dumps(workers[a].proof)))
        variants = [(a, g, c) for a in ALLOCS for g in GROWTHS
                    for c in ACCTS]
        results = {}
        total = args.mib << 20
        for case in cases:
            for v in variants:  # warm-up, not recorded
                workers[v[0]].run(case, v[1], v[2])
            samples = {v: [] for v in variants}
            meta = {}
            for r in range(args.reps):
                order = variants if r % 2 == 0 else variants[::-1]
                for v in order:
                    res = workers[v[0]].run(case, v[1], v[2])
                    samples[v].append(total / (res["ns"] / 1e9))
                    meta[v] = res
            results[case] = {"samples": samples, "meta": meta}
            log("  %-6s %s" % (case, "  ".join(
                "%s/%s/%s %s" % (v[0], v[1], v[2],
                                 fmt_bps(statistics.median(s)))
                for v, s in samples.items())))
    finally:
        for w in workers.values():
            w.close()

    # ---- tables ----------------------------------------------------------
    lines = []
    lines.append("## buffer_growth\n")
    lines.append(
        "Measured %s on %s (%d CPUs, Linux %s), %s; commit `%s`%s. "
        "Load average (1 min) %.2f at the start, %.2f at the end: the "
        "machine is shared, compare within a row.\n" % (
            info["date"], info["cpu_model"], info["nproc"], info["kernel"],
            info["glibc"], info["commit"],
            " with uncommitted changes" if info["uncommitted"] else "",
            info["loadavg_start"], os.getloadavg()[0]))
    lines.append(
        "memtally_buf (client/buffer.c) built to %d MiB by appends of 8 B "
        "(tiny), 700 B (small) and 1.5 MB (large), then finished and freed; "
        "both workers pinned to CPU %d; %d repetitions per variant, "
        "interleaved; cells: median bytes/s [Q1–Q3]. `acct on`: "
        "memtally_account() per growth (proved each run: "
        "memtally_process_bytes() moved by exactly the capacity); p: "
        "Mann-Whitney U, on vs off. Allocators proved: jemalloc %s (%s), "
        "glibc (%s).\n" % (
            args.mib, cpu, args.reps,
            workers["jemalloc"].proof.get("jemalloc_version"),
            workers["jemalloc"].proof.get("malloc_from"),
            workers["glibc"].proof.get("malloc_from")))
    lines.append("| case | allocator | growth | acct off | acct on | on/off "
                 "| p | growths | reference |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    summary = {}
    for case in cases:
        res = results[case]
        for a in ALLOCS:
            for g in GROWTHS:
                off = res["samples"][(a, g, "off")]
                on = res["samples"][(a, g, "on")]
                qo, qn = quartiles(off), quartiles(on)
                p = mann_whitney_p(off, on)
                summary[(case, a, g)] = {"off": qo, "on": qn, "p": p}
                lines.append(
                    "| %s | %s | %sx | %s [%s–%s] | %s [%s–%s] | %+.1f%% | "
                    "%.2g | %d | %s |" % (
                        case, a, g, fmt_bps(qo[1]), fmt_bps(qo[0]),
                        fmt_bps(qo[2]), fmt_bps(qn[1]), fmt_bps(qn[0]),
                        fmt_bps(qn[2]), (qn[1] / qo[1] - 1) * 100, p,
                        res["meta"][(a, g, "on")]["growths"],
                        fmt_bps(SEED[(a, g, case)])))
    lines.append("")
    lines.append("2x against 1.5x (accounting on; median of 2x / median of "
                 "1.5x; p: Mann-Whitney U):\n")
    lines.append("| case | jemalloc 2x/1.5x | p | glibc 2x/1.5x | p | "
                 "reference jemalloc | reference system |")
    lines.append("|---|---|---|---|---|---|---|")
    choice = {}
    for case in cases:
        row = [case]
        for a in ALLOCS:
            s15 = results[case]["samples"][(a, "1.5", "on")]
            s2 = results[case]["samples"][(a, "2", "on")]
            ratio = statistics.median(s2) / statistics.median(s15)
            choice[(case, a)] = ratio
            row += ["%+.1f%%" % ((ratio - 1) * 100),
                    "%.2g" % mann_whitney_p(s15, s2)]
        row += ["%+.1f%%" % ((SEED[("jemalloc", "2", case)] /
                              SEED[("jemalloc", "1.5", case)] - 1) * 100),
                "%+.1f%%" % ((SEED[("glibc", "2", case)] /
                              SEED[("glibc", "1.5", case)] - 1) * 100)]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    rel = os.path.relpath(build, SRC_DIR)
    lines.append(
        "Rerun everything: `cmake --build %s --target bench_buffer_growth`;"
        " one case: `/usr/bin/python3 bench/buffer_growth.py --build-dir %s"
        " --case tiny`; one variant by hand: `%s/bench/bench_bufgrow_glibc "
        "--case tiny --growth 1.5 --acct on`." % (rel, rel, rel))
    text = "\n".join(lines)
    print(text)

    js = {"machine": info, "mib": args.mib, "reps": args.reps, "cpu": cpu,
          "proofs": {a: w.proof for a, w in workers.items()},
          "cases": {case: {"%s/%s/%s" % v: {"bytes_per_s": s,
                                             "last_run": results[case]
                                             ["meta"][v]}
                           for v, s in results[case]["samples"].items()}
                    for case in cases}}
    jpath = args.json or os.path.join(build, "bench", "buffer_growth.json")
    with open(jpath, "w") as f:
        json.dump(js, f, indent=1)
    log("JSON: %s" % jpath)
    if set(cases) == set(CASES):
        write_section(args.results_md, "buffer_growth", text)
        log("wrote the buffer_growth section of %s" % args.results_md)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        log("buffer_growth: FAILED: %s" % e)
        sys.exit(1)
