#!/usr/bin/python3
"""allocators: arena and pool against malloc/free (against the reference table).

Panama's AllocatorsForLongRun (OpenJDK foreign-jextract, JMH) timed one op of N
allocations and their release for N = 1, 10, 16, 100, 200, 1000 with
malloc/free, an arena, a pool, an exhausted pool, and a pool with and
without its lock. This suite runs those ops on memtally's client
(memtally_arena, memtally_pool; see allocators.c), all with accounting on,
on jemalloc and on glibc.

Workers bench_allocs_je / bench_allocs_glibc prove their allocator and the
accounting (process_bytes moves per block for malloc_free, per chunk for
arena and pool) before they run; a failed proof fails the run. Both are
pinned to one CPU; each repetition runs every case of one N on both
workers, alternating the order. Score: median ns per op over --reps
repetitions of about --target-ms each; Error: half the interquartile range
(JMH's Error is a 99.9% interval; ours is a spread, not a confidence).

Outputs: the tables on stdout, JSON in BUILD/bench/allocators.json and,
for a full run, bench/results/allocators.md.

Run all:   cmake --build BUILD --target bench_allocators
Run one:   /usr/bin/python3 bench/allocators.py --build-dir BUILD --n 16
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
    SRC_DIR, BenchError, ServeWorker, log, machine_info, quartiles,
    results_path, write_section)

CASES = ["malloc_free", "arena", "arena_reuse", "pool", "pool_exhausted",
         "pool_locked"]
NS = [1, 10, 16, 100, 200, 1000]
ALLOCS = ["jemalloc", "glibc"]

# The reference, ns/op (the Panama run after the arena stopped zeroing, and the
# confined pool without its lock where given).
SEED = {
    "malloc_free": {1: 26.440, 10: 349.220, 16: 602.258, 100: 4755.480,
                    200: 10126.972, 1000: 55986.975},
    "arena": {1: 73.263, 10: 236.181, 16: None, 100: 1902.569, 200: None,
              1000: 22995.554},
    "pool": {1: 14.983, 16: 246.688, 200: 2990.063, 10: 181.496,
             100: 1759.230, 1000: 32862.773},
    "pool_exhausted": {1: 62.226, 16: 890.346, 200: 16232.458},
    "pool_locked": {1: 32.553, 16: 333.564, 200: 3552.176},
}


class Worker(ServeWorker):
    def run(self, case, n, ops):
        return int(self.request("run %s %d %d" % (case, n, ops))[1])


def calibrate(w, case, n, target_ns):
    ops = 1
    while True:
        t = max(w.run(case, n, ops), 1)
        if t >= 2e6:
            return max(1, int(ops * target_ns / t))
        ops = int(ops * min(100.0, max(2.0, 3e6 / t)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(SRC_DIR, "build"))
    ap.add_argument("--n", type=int, action="append", choices=NS)
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--target-ms", type=float, default=10)
    ap.add_argument("--cpu", type=int)
    ap.add_argument("--json")
    ap.add_argument("--results-md",
                    default=results_path("allocators"))
    argv = sys.argv[1:] + shlex.split(os.environ.get("MEMTALLY_BENCH_ARGS",
                                                     ""))
    args = ap.parse_args(argv)
    build = os.path.abspath(args.build_dir)
    ns = args.n or NS
    cpu = args.cpu if args.cpu is not None else max(os.sched_getaffinity(0))
    info = machine_info()
    tmp = tempfile.mkdtemp(prefix="mtbench-allocs-")
    env = dict(os.environ)
    for k in ("LD_PRELOAD", "MEMTALLY_DISABLE", "MEMTALLY_DEBUG"):
        env.pop(k, None)
    env["MEMTALLY_SOCKET"] = os.path.join(tmp, "no-server.sock")
    exes = {"jemalloc": os.path.join(build, "bench", "bench_allocs_je"),
            "glibc": os.path.join(build, "bench", "bench_allocs_glibc")}
    workers = {}
    res = {}
    try:
        for a in ALLOCS:
            workers[a] = Worker(exes[a], a, cpu, tmp, env)
            log("proof %s: %s" % (a, json.dumps(workers[a].proof)))
        for n in ns:
            variants = [(a, c) for a in ALLOCS for c in CASES]
            ops = {v: calibrate(workers[v[0]], v[1], n, args.target_ms * 1e6)
                   for v in variants}
            samples = {v: [] for v in variants}
            for r in range(args.reps):
                order = variants if r % 2 == 0 else variants[::-1]
                for v in order:
                    t = workers[v[0]].run(v[1], n, ops[v])
                    samples[v].append(t / ops[v])
            for v in variants:
                res[(v[0], v[1], n)] = {"ops": ops[v], "ns_per_op": samples[v]}
            log("  N=%-5d %s" % (n, "  ".join(
                "%s/%s %.0f" % (v[0], v[1], statistics.median(samples[v]))
                for v in variants)))
    finally:
        for w in workers.values():
            w.close()

    lines = ["## allocators\n"]
    lines.append(
        "Measured %s on %s (%d CPUs, Linux %s), %s; commit `%s`%s. Load "
        "average (1 min) %.2f at the start, %.2f at the end.\n" % (
            info["date"], info["cpu_model"], info["nproc"], info["kernel"],
            info["glibc"], info["commit"],
            " with uncommitted changes" if info["uncommitted"] else "",
            info["loadavg_start"], os.getloadavg()[0]))
    lines.append(
        "One op = N allocations of 64 bytes, then their release; accounting "
        "on everywhere (malloc_free: memtally_account() per block; arena and "
        "pool: per chunk (arena: its default 16 KiB), proved at start). arena: "
        "create + N allocs + destroy; arena_reuse: N allocs + reset of a "
        "long-lived arena; pool: thread-confined memtally_pool; "
        "pool_exhausted: get returns NULL, the caller falls back to "
        "malloc+account; pool_locked: MEMTALLY_POOL_LOCKED, uncontended. "
        "Workers pinned to CPU %d, %d repetitions of ~%g ms, interleaved. "
        "Score: median ns/op; Error: half the IQR. Allocators proved: %s "
        "(%s), glibc (%s). No server (accounting is counted locally).\n" % (
            cpu, args.reps, args.target_ms,
            "jemalloc " + str(workers["jemalloc"].proof.get(
                "jemalloc_version", "")).split("-")[0],
            workers["jemalloc"].proof.get("malloc_from"),
            workers["glibc"].proof.get("malloc_from")))
    for a in ALLOCS:
        lines.append("%s, the reference table's shape:\n" % a)
        lines.append("```")
        lines.append("%-38s %-13s %4s %3s %10s   %8s  %s" % (
            "Benchmark", "(allocations)", "Mode", "Cnt", "Score", "Error",
            "Units"))
        for c in CASES:
            for n in ns:
                s = res[(a, c, n)]["ns_per_op"]
                q1, med, q3 = quartiles(s)
                lines.append("%-38s %-13d %4s %3d %10.3f ? %8.3f  ns/op" % (
                    "Allocators." + c, n, "avgt", len(s), med,
                    (q3 - q1) / 2))
        lines.append("```\n")
    lines.append("Side by side, median ns/op (ns per allocation in "
                 "parentheses); the reference table below it:\n")
    head = "| N | " + " | ".join("%s %s" % (a[:2], c) for a in ALLOCS
                                  for c in CASES) + " |"
    lines.append("| N | allocator | " + " | ".join(CASES) + " |")
    lines.append("|---|---|" + "---|" * len(CASES))
    for n in ns:
        for a in ALLOCS:
            cells = []
            for c in CASES:
                med = statistics.median(res[(a, c, n)]["ns_per_op"])
                cells.append("%.0f (%.1f)" % (med, med / n))
            lines.append("| %d | %s | %s |" % (n, a, " | ".join(cells)))
        ref = []
        for c in CASES:
            v = SEED.get(c, {}).get(n)
            ref.append("%.0f" % v if v else "–")
        lines.append("| %d | reference | %s |" % (n, " | ".join(ref)))
    del head
    lines.append("")
    rel = os.path.relpath(build, SRC_DIR)
    lines.append(
        "Rerun everything: `cmake --build %s --target bench_allocators`; "
        "one N: `/usr/bin/python3 bench/allocators.py --build-dir %s "
        "--n 16`." % (rel, rel))
    text = "\n".join(lines)
    print(text)
    js = {"machine": info, "reps": args.reps, "cpu": cpu,
          "proofs": {a: w.proof for a, w in workers.items()},
          "results": {"%s/%s/%d" % k: v for k, v in res.items()}}
    jpath = args.json or os.path.join(build, "bench", "allocators.json")
    with open(jpath, "w") as f:
        json.dump(js, f, indent=1)
    log("JSON: %s" % jpath)
    if set(ns) == set(NS):
        write_section(args.results_md, "allocators", text)
        log("wrote the allocators section of %s" % args.results_md)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        log("allocators: FAILED: %s" % e)
        sys.exit(1)
