#!/usr/bin/python3
"""alloc_overhead: malloc/free cost with and without memtally (the cases of
Comet's alloc_overhead benchmark (apache/datafusion-comet#5934)).

Five variants, each a separate worker process so the allocator really
differs (see alloc_overhead.c):

  jemalloc  bench_alloc_je, jemalloc's malloc, no accounting (the baseline)
  inline    bench_alloc_je, memtally_account(+size/-size) around each pair
  linked    bench_alloc_je, memtally_init() in each thread: jemalloc's
            activity callback counts, nothing is added to the loop
  preload   bench_alloc_plain under LD_PRELOAD=libmemtally_preload.so
            (jemalloc linked into the preload, counted by the same callback)
  glibc     bench_alloc_plain as is, for reference

Every worker proves at start which allocator serves it and that the
accounting counter moves (or, for the baselines, does not); a failed proof
fails the whole run. The workers are pinned to one CPU and stay alive; for
each case the driver sizes one loop to about --target-ms, then runs
--reps repetitions interleaved across the variants (ABCD DCBA ...), so slow
drifts of this shared machine hit every variant alike. Reported per
variant: median ns per alloc/free pair and the interquartile range; per
accounting variant: the difference of medians from jemalloc and a two-sided
Mann-Whitney U p-value.

Outputs: a Markdown table on stdout, JSON in BUILD/bench/alloc_overhead.json
and, for a run of all cases, the generated section of bench/results/alloc_overhead.md.
Instruction counts per pair (callgrind; stable on a noisy machine) are
measured for alloc_free_16b, _64kb and _80kb unless --no-instructions.

Run all:   cmake --build BUILD --target bench_alloc_overhead
Run one:   /usr/bin/python3 bench/alloc_overhead.py --build-dir BUILD \\
               --case alloc_free_16b
Extra flags also come from $MEMTALLY_BENCH_ARGS.
"""

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (  # noqa: E402
    SRC_DIR, BenchError, fmt_p, log, machine_info, mann_whitney_p,
    quartiles, quit_worker, server_socket, shift_ci, start_server,
    results_path, write_section)

# N of the parallel cases: every CPU this driver may use (thread i of a
# parallel case is pinned to the i-th of them).
NTHREADS = len(os.sched_getaffinity(0))
PAR_32 = "parallel_alloc_free_32kb_x%d" % NTHREADS
PAR_64 = "parallel_alloc_free_64kb_x%d" % NTHREADS
SINGLE_CASES = [
    "alloc_free_16b",
    "alloc_free_256b",
    "alloc_free_4096b",
    "alloc_free_32kb",
    "alloc_free_64kb",
    "alloc_free_80kb",
    "alloc_fill_free_64kb",
    "grow_vec_to_64kb",
]
PARALLEL_CASES = ["threshold_churn", PAR_32, PAR_64]
CASES = SINGLE_CASES + PARALLEL_CASES
# Cases added after the first six: their repetitions and loop length can be
# lowered on their own (--new-reps, --new-target-ms) if the suite outgrows
# ~3 minutes; by default they run like the others (whole suite ~75 s here).
NEW_CASES = ["alloc_fill_free_64kb", "grow_vec_to_64kb"] + PARALLEL_CASES
# The worker times ops; a threshold_churn op is two alloc/free pairs
# (two 48 KiB mallocs, then both frees), reported per pair.
PAIRS_PER_OP = {"threshold_churn": 2}
# What one reported time is, for the table's notes.
UNITS = {
    "grow_vec_to_64kb": "ns per whole growth (16 B to 64 KiB, 8192 pushes)",
    "threshold_churn": "ns per pair per thread",
    PAR_32: "ns per pair per thread",
    PAR_64: "ns per pair per thread",
}
VARIANTS = ["jemalloc", "inline", "linked", "preload", "glibc"]
ACCOUNTING = ["inline", "linked", "preload"]
INSN_CASES = ["alloc_free_16b", "alloc_free_64kb", "alloc_free_80kb"]
INSN_ITERS = 200_000
# Out-of-line paths whose calls per pair callgrind reports: the inline
# API's slow path, jemalloc's activity callback (the front end's
# on_activity), the counting fallback's slow path, and the publish itself.
SLOW_FUNCTIONS = ("memtally__account_slow", "on_activity", "count_slow",
                  "mtc_publish")
OWN_OBJECTS = ("bench_alloc_je", "bench_alloc_plain", "libmemtally_preload.so")

# Targets from the brief; reported, never used to bend the measurement.
TARGETS = [
    ("inline", "alloc_free_16b", "ns", 0.5),
    ("preload", "alloc_free_16b", "ns", 1.5),
    # jemalloc's activity callback: nothing on the path at all.
    ("linked", "alloc_free_16b", "nsd", 0.05),
    ("preload", "alloc_free_16b", "nsd", 0.05),
    ("linked", "alloc_free_64kb", "nsd", 0.05),
    ("preload", "alloc_free_64kb", "nsd", 0.05),
    ("linked", PAR_64, "nsd", 0.05),
    ("preload", PAR_64, "nsd", 0.05),
    ("linked", "threshold_churn", "nsd", 0.05),
    ("preload", "threshold_churn", "nsd", 0.05),
    ("inline", "alloc_free_64kb", "pct", 3.0),
    ("preload", "alloc_free_64kb", "pct", 3.0),
    ("inline", PAR_64, "pct", 5.0),
    ("preload", PAR_64, "pct", 5.0),
    # "no significant difference": two-sided p >= 0.05.
    ("inline", "alloc_fill_free_64kb", "nsd", 0.05),
    ("preload", "alloc_fill_free_64kb", "nsd", 0.05),
    ("inline", "grow_vec_to_64kb", "nsd", 0.05),
    ("linked", "alloc_fill_free_64kb", "nsd", 0.05),
    ("linked", "grow_vec_to_64kb", "nsd", 0.05),
    ("preload", "grow_vec_to_64kb", "nsd", 0.05),
]




# ---- workers -------------------------------------------------------------


def worker_argv(paths, variant):
    exe = (paths["je"] if variant in ("jemalloc", "inline", "linked")
           else paths["plain"])
    return [exe, "--variant", variant]


def worker_env(paths, variant, server, tmp):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.pop("MEMTALLY_DISABLE", None)
    env.pop("MEMTALLY_DEBUG", None)
    env["MEMTALLY_SOCKET"] = server_socket(server, tmp)
    if variant == "preload":
        env["LD_PRELOAD"] = paths["preload"]
    return env


class Worker:
    def __init__(self, paths, variant, cpu, server, tmp):
        self.variant = variant
        argv = worker_argv(paths, variant) + ["--serve"]
        if cpu is not None:
            argv += ["--cpu", str(cpu)]
        if server and server.segment:
            argv += ["--segment", server.segment]
        self.err = open(os.path.join(tmp, "worker-%s.err" % variant), "w+")
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            text=True,
            bufsize=1,
            env=worker_env(paths, variant, server, tmp),
        )
        line = self.proc.stdout.readline()
        if not line.startswith("ready "):
            rc = self.proc.wait()
            self.err.seek(0)
            raise BenchError(
                "variant %s: the worker refused to run (exit %s):\n%s"
                % (variant, rc, self.err.read().rstrip())
            )
        self.proof = json.loads(line[len("ready "):])

    def ask(self, cmd):
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            self.err.seek(0)
            raise BenchError(
                "variant %s: worker died on %r:\n%s"
                % (self.variant, cmd, self.err.read().rstrip())
            )
        return line.split()

    def run(self, case, n):
        r = self.ask("run %s %d" % (case, n))
        if r[0] != "ns":
            raise BenchError("variant %s: %s" % (self.variant, " ".join(r)))
        return int(r[1])

    def probe(self, case):
        r = self.ask("probe %s" % case)
        f = float(r[1])
        return (None if f < 0 else f), r[2]

    def close(self):
        quit_worker(self.proc)


def calibrate(w, case, target_ns):
    """Iterations per repetition so one loop takes about target_ns."""
    n = 1000
    while True:
        t = max(w.run(case, n), 1)
        if t >= 20e6:
            return max(1000, int(n * target_ns / t))
        n = int(n * min(100.0, max(2.0, 25e6 / t)))


def measure(workers, cases, reps, target_ms, new_reps, new_target_ms):
    results = {}
    ref = workers[0]
    for case in cases:
        new = case in NEW_CASES
        case_reps = new_reps if new else reps
        n = calibrate(ref, case, (new_target_ms if new else target_ms) * 1e6)
        for w in workers:  # warm-up, not recorded
            w.run(case, max(1000, n // 4))
        samples = {w.variant: [] for w in workers}
        div = n * PAIRS_PER_OP.get(case, 1)
        for r in range(case_reps):
            order = workers if r % 2 == 0 else workers[::-1]
            for w in order:
                samples[w.variant].append(w.run(case, n) / div)
        flushes = {}
        for w in workers:
            f, how = w.probe(case)  # per op
            if f is not None:
                f /= PAIRS_PER_OP.get(case, 1)
            flushes[w.variant] = {"per_pair": f, "method": how}
        results[case] = {"iters": n, "reps": case_reps, "samples": samples,
                         "flushes": flushes,
                         "threads": NTHREADS if case in PARALLEL_CASES else 1,
                         "unit": UNITS.get(case, "ns per pair")}
        med = {v: statistics.median(s) for v, s in samples.items()}
        log(
            "  %-18s N=%-9d %s"
            % (case, n, "  ".join("%s %.2f" % (v, m) for v, m in med.items()))
        )
    return results


def summarise(results):
    for case, res in results.items():
        st = {}
        for v, s in res["samples"].items():
            q1, med, q3 = quartiles(s)
            st[v] = {
                "median": med,
                "q1": q1,
                "q3": q3,
                "min": min(s),
                "max": max(s),
            }
        base = res["samples"].get("jemalloc")
        for v in ACCOUNTING:
            if base and v in res["samples"]:
                d = st[v]["median"] - st["jemalloc"]["median"]
                st[v]["delta_ns"] = d
                st[v]["delta_pct"] = 100 * d / st["jemalloc"]["median"]
                st[v]["p"] = mann_whitney_p(res["samples"][v], base)
                lo, _, hi = shift_ci(res["samples"][v], base)
                st[v]["ci_pct"] = (100 * lo / st["jemalloc"]["median"],
                                   100 * hi / st["jemalloc"]["median"])
                # Repetitions ran side by side (ABCD DCBA), so the median
                # of per-repetition differences is robust to slow drift.
                st[v]["delta_paired_ns"] = statistics.median(
                    x - y for x, y in zip(res["samples"][v], base))
        res["stats"] = st


# ---- instruction counts (callgrind) --------------------------------------


def parse_callgrind(path):
    """Total Ir, self Ir per (object, function), and calls per function,
    from a callgrind output file (name compression understood)."""
    names = {"fn": {}, "ob": {}}
    total = 0
    self_ir = {}
    calls = {}
    ob = cob = fn = cfn = None
    after_calls = False
    spec = re.compile(r"^(fn|cfn|ob|cob)=\((\d+)\)(?: (.*))?$")
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            m = spec.match(line)
            if m:
                kind, ident, name = m.groups()
                space = "fn" if kind in ("fn", "cfn") else "ob"
                if name is not None:
                    names[space][ident] = name
                name = names[space].get(ident, "?")
                if kind == "ob":
                    ob = os.path.basename(name)
                    cob = None
                elif kind == "cob":
                    cob = os.path.basename(name)
                elif kind == "fn":
                    fn = (ob, name)
                    cob = None
                else:
                    cfn = (cob or ob, name)
                continue
            if line.startswith("calls="):
                c = int(line.split()[0][len("calls="):])
                calls[cfn] = calls.get(cfn, 0) + c
                after_calls = True
                continue
            if line.startswith(("summary:", "totals:")):
                total = max(total, int(line.split()[1]))
                continue
            if line and (line[0].isdigit() or line[0] in "+-*"):
                parts = line.split()
                ir = int(parts[1]) if len(parts) > 1 else 0
                if after_calls:
                    after_calls = False  # inclusive cost of the call
                    cob = None
                else:
                    self_ir[fn] = self_ir.get(fn, 0) + ir
    return total, self_ir, calls


def perf_instructions_status():
    """Whether `perf stat -e instructions` counts here (it does not in many
    guests, which is why the counts come from callgrind)."""
    if not shutil.which("perf"):
        return "perf not installed"
    r = subprocess.run(["perf", "stat", "-x,", "-e", "instructions", "true"],
                       capture_output=True, text=True)
    if r.returncode != 0 or "not supported" in r.stderr or "not counted" in r.stderr:
        return "perf stat -e instructions: not supported here"
    return "perf stat -e instructions: supported (not used)"


def count_instructions(paths, server, tmp, cases):
    if not shutil.which("valgrind"):
        return {"status": "valgrind not installed"}
    out = {"status": "ok", "tool": "valgrind --tool=callgrind "
           "--toggle-collect=bench_loop_*", "iters": INSN_ITERS, "cases": {}}
    for case in cases:
        out["cases"][case] = {}
        for v in VARIANTS:
            cg = os.path.join(tmp, "cg-%s-%s.out" % (case, v))
            argv = [
                "valgrind", "--tool=callgrind", "--toggle-collect=bench_loop_*",
                "--callgrind-out-file=" + cg,
            ] + worker_argv(paths, v) + [
                "--case", case, "--iters", str(INSN_ITERS), "--reps", "1",
            ]
            r = subprocess.run(
                argv, capture_output=True, text=True,
                env=worker_env(paths, v, server, tmp),
            )
            if r.returncode != 0 or not os.path.exists(cg):
                raise BenchError(
                    "callgrind run of %s/%s failed (exit %d):\n%s"
                    % (case, v, r.returncode, r.stderr[-2000:])
                )
            total, self_ir, calls = parse_callgrind(cg)
            per = lambda x: x / INSN_ITERS  # noqa: E731
            top = sorted(self_ir.items(), key=lambda kv: -kv[1])
            slow = {}
            for (obj, fn), c in calls.items():
                base = fn.split(".")[0]  # count_slow.constprop.0 -> count_slow
                if base in SLOW_FUNCTIONS:
                    slow[base] = slow.get(base, 0) + per(c)
            own_ir = sum(ir for (o, f), ir in self_ir.items()
                         if o in OWN_OBJECTS)
            out["cases"][case][v] = {
                "ir_per_pair": per(total),
                # The bench loop plus the interposer or the inline API
                # (libmemtally is linked statically into bench_alloc_je).
                "own_ir_per_pair": per(own_ir),
                "self_ir_per_pair": [
                    {"object": o, "function": f, "ir": per(ir)}
                    for (o, f), ir in top if per(ir) >= 0.05
                ],
                "slow_calls_per_pair": slow,
            }
        log("  %-18s %s" % (case, "  ".join(
            "%s %.1f" % (v, out["cases"][case][v]["ir_per_pair"])
            for v in VARIANTS)))
    return out


# ---- output --------------------------------------------------------------


def fmt_ns(x):
    if x >= 10000:
        return "%.0f" % x
    return "%.1f" % x if x >= 100 else "%.2f" % x


def fmt_cell(s):
    return "%s [%s–%s]" % (fmt_ns(s["median"]), fmt_ns(s["q1"]), fmt_ns(s["q3"]))


def fmt_delta(s):
    return "%+.2f (%+.1f%%)" % (s["delta_ns"], s["delta_pct"])


def fmt_flush(f):
    if f["per_pair"] is None:
        return "n/a"
    return "%g" % f["per_pair"]


def table(results, variants):
    cols = ["case"]
    for v in variants:
        cols.append(v)
        if v in ACCOUNTING and "jemalloc" in variants:
            cols += ["Δ " + v, "p"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for case, res in results.items():
        st = res["stats"]
        row = ["`%s`" % case]
        for v in variants:
            row.append(fmt_cell(st[v]))
            if v in ACCOUNTING and "jemalloc" in variants:
                row += [fmt_delta(st[v]), fmt_p(st[v]["p"])]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def flush_table(results, variants):
    acc = [v for v in variants if v in ACCOUNTING]
    if not acc:
        return ""
    lines = ["| case | " + " | ".join("flushes/pair " + v for v in acc) + " |",
             "|---|" + "---|" * len(acc)]
    for case, res in results.items():
        lines.append("| `%s` | %s |" % (case, " | ".join(
            "%s (%s)" % (fmt_flush(res["flushes"][v]), res["flushes"][v]["method"])
            for v in acc)))
    return "\n".join(lines)


def insn_table(insn):
    if insn.get("status") != "ok":
        return "Instructions: not measured (%s)." % insn.get("status")
    lines = ["| case | " + " | ".join(VARIANTS) + " | " +
             " | ".join("Δ " + v for v in ACCOUNTING) + " | " +
             " | ".join("memtally's own: " + v for v in ACCOUNTING) + " |",
             "|---|" + "---|" * (len(VARIANTS) + 2 * len(ACCOUNTING))]
    for case, per in insn["cases"].items():
        ir = {v: per[v]["ir_per_pair"] for v in VARIANTS}
        own = {v: per[v]["own_ir_per_pair"] - per["jemalloc"]["own_ir_per_pair"]
               for v in ACCOUNTING}
        lines.append("| `%s` | %s | %s | %s |" % (
            case, " | ".join("%.1f" % ir[v] for v in VARIANTS),
            " | ".join("%+.1f" % (ir[v] - ir["jemalloc"]) for v in ACCOUNTING),
            " | ".join("%+.1f" % own[v] for v in ACCOUNTING)))
    lines.append("")
    lines.append("Totals include jemalloc's own work, which for the large "
                 "cases depends on heap state and elapsed time (extent reuse, "
                 "decay), so their Δ is noise of hundreds of instructions; "
                 "*memtally's own* counts only the instructions executed in "
                 "the bench executable and libmemtally_preload.so (the "
                 "inline API and its slow path, or the activity callback), "
                 "minus the jemalloc variant's bare loop; for the preload it "
                 "also holds jemalloc itself, which is linked into it, so "
                 "there its Δ is the total's.")
    lines.append("")
    lines.append("Out-of-line calls per pair (callgrind call counts):")
    lines.append("")
    lines.append("| case | " + " | ".join(
        "%s: %s" % (v, f) for v in ACCOUNTING for f in SLOW_FUNCTIONS) + " |")
    lines.append("|---|" + "---|" * (len(ACCOUNTING) * len(SLOW_FUNCTIONS)))
    for case, per in insn["cases"].items():
        lines.append("| `%s` | %s |" % (case, " | ".join(
            "%.3g" % per[v]["slow_calls_per_pair"].get(f, 0)
            for v in ACCOUNTING for f in SLOW_FUNCTIONS)))
    c16 = insn["cases"].get("alloc_free_16b")
    if c16:
        lines.append("")
        lines.append("Where the instructions of one `alloc_free_16b` pair go "
                     "(self cost per function):")
        lines.append("")
        lines.append("| variant | function [object]: Ir per pair |")
        lines.append("|---|---|")
        for v in VARIANTS:
            parts = ["%s [%s]: %.1f" % (e["function"], e["object"], e["ir"])
                     for e in c16[v]["self_ir_per_pair"]
                     if e["ir"] >= 0.5][:6]
            lines.append("| %s | %s |" % (v, "; ".join(parts)))
    return "\n".join(lines)


# "No significant difference" is only evidence when the run could have
# shown one: the 95% interval of the difference (shift_ci) must lie within
# this share of the baseline's median on both sides, so that a difference
# of that size would have been told apart. A wide spread needs many
# repetitions to get there; a spread alone does not decide.
NSD_RESOLUTION_PCT = 5.0


def nsd_verdict(st, base, limit):
    """met / missed / inconclusive for a no-significant-difference target,
    and why when it is not met."""
    lo, hi = st["ci_pct"]
    ci = " (95%% interval of the difference %+.1f%% to %+.1f%%" % (lo, hi)
    if st["p"] < limit:
        if st["delta_ns"] < 0:
            return "inconclusive", ci + (
                "; the accounting side was the faster one: the difference "
                "is the machine's drift, not a cost)")
        return "missed", ci + ")"
    if lo < -NSD_RESOLUTION_PCT or hi > NSD_RESOLUTION_PCT:
        spread = 100 * (base["q3"] - base["q1"]) / base["median"]
        return "inconclusive", ci + (
            ", the baseline's quartiles ±%.1f%%: too noisy or too short a "
            "run to show a difference of %g%%)" % (
                spread / 2, NSD_RESOLUTION_PCT))
    return "met", ci + (": a difference of %g%% would have shown)"
                        % NSD_RESOLUTION_PCT)


def targets_text(results):
    out = []
    for v, case, unit, limit in TARGETS:
        stats = results.get(case, {}).get("stats", {})
        st = stats.get(v)
        if not st or "delta_ns" not in st:
            continue
        if unit == "nsd":
            verdict, why = nsd_verdict(st, stats["jemalloc"], limit)
            out.append("- %s `%s` vs jemalloc: %+.2f ns (%+.1f%%), p = %s "
                       "(target: no significant difference, p ≥ %g): **%s**%s" % (
                           v, case, st["delta_ns"], st["delta_pct"],
                           fmt_p(st["p"]), limit, verdict, why))
            continue
        val = st["delta_ns"] if unit == "ns" else st["delta_pct"]
        ok = val <= limit
        out.append("- %s `%s` vs jemalloc: %+.2f %s (target ≤ +%g %s, p = %s): **%s**" % (
            v, case, val, "ns" if unit == "ns" else "%", limit,
            "ns" if unit == "ns" else "%", fmt_p(st["p"]),
            "met" if ok else "missed"))
    return "\n".join(out)


def report(info, server_status, attached, results, variants, reps, insn,
           build_rel):
    je = info.get("jemalloc", "?")
    head = [
        "## alloc_overhead",
        "",
        "Measured %s on %s (%s CPUs, Linux %s), jemalloc %s, %s; commit `%s`%s." % (
            info["date"], info["cpu_model"], info["nproc"], info["kernel"], je,
            info["glibc"], info["commit"],
            " plus uncommitted changes in client/, shm/ or bench/" if info["uncommitted"] else ""),
        "Server: %s; workers attached: %s. Load average (1 min) %.2f at the "
        "start, %.2f at the end: the machine is shared, so compare within a "
        "row, not across runs." % (server_status, attached,
                                   info["loadavg_start"], info["loadavg_end"]),
        "Single-thread cases: every worker pinned to CPU %s; %d repetitions per "
        "variant (the added `alloc_fill_free_64kb`, `grow_vec_to_64kb` and "
        "parallel cases: %d, loops of ~%d ms), "
        "interleaved ABCD DCBA; each repetition one loop of N ops sized to "
        "~%d ms. Parallel cases (`threshold_churn`, `_x%d`): %d threads, thread i "
        "pinned to CPU i, started together behind a barrier, time = wall time "
        "from the barrier to the last thread's end; the memtallyd of the run "
        "shares CPUs with them. Cells: median [Q1–Q3] ns per malloc+free pair "
        "(per pair per thread for the parallel cases; per whole growth for "
        "`grow_vec_to_64kb`); Δ = difference of medians from jemalloc; p = "
        "two-sided Mann-Whitney U." % (
            info["cpu"], reps, info["new_reps"], info["new_target_ms"],
            info["target_ms"], NTHREADS, NTHREADS),
        "",
        "What the added cases do: `alloc_fill_free_64kb` mallocs 64 KiB, "
        "memsets it, frees it; `grow_vec_to_64kb` pushes 8-byte elements into "
        "a vector that starts as malloc(16) and reallocs to twice its "
        "capacity when full, to 64 KiB (12 reallocs), then frees it (the "
        "inline variant accounts +new−old per realloc); `threshold_churn` "
        "(the parallel case around the flush threshold): on every CPU, "
        "each thread mallocs two 48 KiB blocks into a 2-slot ring, then frees "
        "both, so its drift goes +48K, +96K (past +64 KiB: flush), −48K, "
        "−96K (past −64 KiB: flush), i.e. one flush per pair on every thread "
        "at once; `parallel_alloc_free_{32,64}kb_x%d`: `alloc_free_{32,64}kb` "
        "on %d threads." % (NTHREADS, NTHREADS),
        "",
        table(results, variants),
        "",
        "Flushes per pair (probe of the same loop; `tls`: from the inline API's "
        "thread-local state, `slot`: the flush counters of the worker's slot, read where its client mapped them, n/a: preload "
        "without a server; see the callgrind call counts below):",
        "",
        flush_table(results, variants),
        "",
    ]
    t = targets_text(results)
    if t:
        head += ["Targets:", "", t, ""]
    if insn is not None:
        head += ["### Instructions per pair (callgrind, %s pairs, only "
                 "`bench_loop_*` and what it calls; %s)" % (
                     f"{INSN_ITERS:,}", insn.get("perf", "")), "",
                 insn_table(insn), ""]
    head += [
        "Rerun everything: `cmake --build %s --target bench_alloc_overhead`; "
        "one case: `/usr/bin/python3 bench/alloc_overhead.py --build-dir %s "
        "--case alloc_free_16b`." % (build_rel, build_rel),
    ]
    return "\n".join(head)


# ---- main ------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(SRC_DIR, "build"))
    ap.add_argument("--case", action="append", choices=CASES,
                    help="run only this case (repeatable)")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated subset of " + ",".join(VARIANTS))
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--target-ms", type=int, default=80)
    ap.add_argument("--new-reps", type=int, default=15,
                    help="repetitions for the cases added after the first "
                    "six (fill, grow, threshold_churn, parallel)")
    ap.add_argument("--new-target-ms", type=int, default=80)
    ap.add_argument("--cpu", type=int, help="CPU to pin workers to "
                    "(default: the last one this process may use)")
    ap.add_argument("--no-server", action="store_true")
    ap.add_argument("--no-instructions", action="store_true")
    ap.add_argument("--json", help="default BUILD/bench/alloc_overhead.json")
    ap.add_argument("--results", default=results_path("alloc_overhead"))
    ap.add_argument("--no-results", action="store_true",
                    help="do not update bench/results/alloc_overhead.md")
    argv = sys.argv[1:] + shlex.split(os.environ.get("MEMTALLY_BENCH_ARGS", ""))
    args = ap.parse_args(argv)

    build = os.path.abspath(args.build_dir)
    paths = {
        "je": os.path.join(build, "bench", "bench_alloc_je"),
        "plain": os.path.join(build, "bench", "bench_alloc_plain"),
        "preload": os.path.join(build, "client", "libmemtally_preload.so"),
    }
    for k, p in paths.items():
        if not os.path.exists(p):
            log("alloc_overhead: %s missing; build it first: cmake --build %s "
                "--target bench_alloc_je bench_alloc_plain memtally_preload"
                % (p, build))
            return 2
    variants = [v for v in args.variants.split(",") if v]
    if not variants or any(v not in VARIANTS for v in variants):
        log("alloc_overhead: --variants must be a subset of " + ",".join(VARIANTS))
        return 2
    variants = [v for v in VARIANTS if v in variants]
    cases = args.case or CASES
    allowed = sorted(os.sched_getaffinity(0))
    cpu = args.cpu if args.cpu is not None else allowed[-1]
    others = set(allowed) - {cpu}

    info = machine_info()
    info["cpu"] = cpu
    info["target_ms"] = args.target_ms
    info["new_reps"] = args.new_reps
    info["new_target_ms"] = args.new_target_ms
    tmp = tempfile.mkdtemp(prefix="mtbench-")
    server = None
    workers = []
    try:
        server, status = start_server(build, tmp, not args.no_server, others)
        log("alloc_overhead: %s; workers pinned to CPU %d" % (status, cpu))
        for v in variants:
            workers.append(Worker(paths, v, cpu, server, tmp))
        proofs = {w.variant: w.proof for w in workers}
        for v, p in proofs.items():
            log("  proof %-8s malloc from %s, usable(100)=%d, mallctl version %s, "
                "stats +%d, memtally +%d, attached %s" % (
                    v, p["malloc_from"], p["usable_size_100"],
                    p["jemalloc_version"], p["stats_allocated_delta"],
                    p["process_bytes_held_delta"], p["attached"]))
        info["jemalloc"] = next((p["jemalloc_version"] for p in proofs.values()
                                 if p["jemalloc_version"]), "?").split("-")[0]
        attached = ", ".join("%s %s" % (v, "yes" if p["attached"] else "no")
                             for v, p in proofs.items() if v in ACCOUNTING) or "n/a"

        t0 = time.monotonic()
        results = measure(workers, cases, args.reps, args.target_ms,
                          args.new_reps, args.new_target_ms)
        for w in workers:
            w.close()
        info["loadavg_end"] = os.getloadavg()[0]
        summarise(results)
        log("alloc_overhead: measured in %.0f s" % (time.monotonic() - t0))

        insn = None
        if not args.no_instructions and all(v in variants for v in VARIANTS):
            log("alloc_overhead: instruction counts under callgrind")
            insn_cases = [c for c in INSN_CASES if c in cases]
            if insn_cases:
                insn = count_instructions(paths, server, tmp, insn_cases)
                insn["perf"] = perf_instructions_status()
    except BenchError as e:
        log("alloc_overhead: FAILED: %s" % e)
        return 1
    finally:
        for w in workers:
            w.close()
        if server:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    build_rel = os.path.relpath(build, SRC_DIR)
    md = report(info, status, attached, results, variants, args.reps,
                insn, build_rel)
    print(md)

    doc = {
        "suite": "alloc_overhead",
        "machine": info,
        "server": status,
        "proofs": proofs,
        "reps": args.reps,
        "results": results,
        "instructions": insn,
    }
    jpath = args.json or os.path.join(build, "bench", "alloc_overhead.json")
    with open(jpath, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    log("alloc_overhead: JSON written to %s" % jpath)
    if args.no_results or args.case or variants != VARIANTS:
        log("alloc_overhead: %s not updated (partial run)" % args.results)
    else:
        write_section(args.results, "alloc_overhead", md)
        log("alloc_overhead: %s updated" % args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
