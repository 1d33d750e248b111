#!/usr/bin/python3
"""server: memtallyd's tick aggregation against slot count and lanes.

Runs bench_server_tick (server_tick.c) for S = 64 .. 16384 slots and 1, 4
and 16 lanes in use per slot: a real header and slot table created with
mtshm_header_create and mtshm_table_create (sealed memfds), a writer thread on another CPU storing into every lane (so the reader sums
lines just written by another core), and the reader, pinned, timing one
tick = mtshm_slot_sum() over all slots, 301 times. `quiet` = no writer.
Each run proves that a tick summed exactly what the lanes hold. This is the
aggregation only (a lower bound on the server's tick): group totals,
limits and the header publish are not in it; each row also times the loop
as it was before the tick's tuning (`--variant call`), interleaved, for a
side-by-side ratio. Then the whole tick, mts_core_tick(), on a registry built
from the daemon's own code (server_core_tick.c: S workers adopted into a
real header and slot table, 8 groups, fleet, group and process limits, 30% churn through
the real exit path). Then exit-to-reclaim latency (server_reclaim.c): a
real memtallyd at 10 ms and 1000 ms ticks, 200 preloaded workers holding
10 MiB each killed one at a time. Then query latency: a real
memtallyd, bench_server_query (server_query.c) timing GetUsage on one
connection beside a bare Unix-socket round trip, and pipelined GetUsage
throughput (server_pipeline.c) for windows of 1..256 requests in flight.
Then registration cost (server_register.c): a real memtallyd, 2000 workers
linked with libmemtally registering one after another (their account +
flush latency, and memtallyd's CPU per registration and exit), with and
without a long-lived worker of the same uid beside them. Then the
reservations' record (server_resv_record.c): what taking it costs the loop
and restoring it costs a start, at 1024 to 65536 reservations.
Many connections and Admit rates: bench/loadgen.py.

Side by side with another tree (`--side-by-side --baseline-build B`):
registration cost and tick cost (loop only and mts_core_tick) of this build and
of B, interleaved round by round (old, new, then new, old, ...), medians
and quartiles over the rounds, ratios new / old; written to its own block
of bench/results/server.md. The registration bench is compiled for both with the same
command, against each tree's headers and libmemtally.a.

Run all:   cmake --build BUILD --target bench_server
Run one:   BUILD/bench/bench_server_tick --slots 16384 --lanes 1 --cpu 1 \\
               --writer-cpu 0
           BUILD/bench/bench_server_core_tick --slots 16384 --churn 30 --cpu 1
           BUILD/bench/bench_server_register --memtallyd \\
               BUILD/server/memtallyd --n 2000 --holder
Side by side: bench/server.py --build-dir NEW --baseline-build OLD \\
               --side-by-side [--rounds 7] [--register-n 2000]
"""

import argparse
import json
import os
import subprocess
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tempfile  # noqa: E402
from benchlib import (  # noqa: E402
    SRC_DIR, log, machine_info, results_path, start_server, write_section)

SLOTS = [64, 256, 1024, 4096, 16384]
LANES = [1, 4, 16]
TARGET_US = 50.0
PIPE_WINDOWS = [1, 16, 64, 256]
TARGET_PIPE = 200000
CORE_ROWS = [(s, 1, False) for s in SLOTS] + [(16384, 1, True),
                                              (16384, 4, True)]
RECLAIM_TICKS = [10, 1000]
RECLAIM_N = 200
REGISTER_N = 2000
RECORD_N = [1024, 8192, 65536]
SBS_SLOTS = [64, 4096, 16384]


def run_json(argv):
    p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode:
        log("server: FAILED: %s: %s" % (" ".join(argv), p.stderr.strip()))
        return None
    return json.loads(p.stdout)


class RunFailed(Exception):
    """A bench run failed (run_json logged why): the suite fails."""


def run_must(argv):
    r = run_json(argv)
    if r is None:
        raise RunFailed()
    return r


def register_run(exe, mtd, holder, n, cpu):
    """One bench_server_register run; its JSON, or None."""
    argv = [exe, "--memtallyd", mtd, "--n", str(n), "--cpu", str(cpu)]
    if holder:
        argv.append("--holder")
    return run_json(argv)


def build_register(src_dir, build_dir, out):
    """Compile server_register.c against the tree at src_dir (its headers)
    and build_dir (its libmemtally.a), the same command for every tree."""
    argv = ["cc", "-O2", "-std=c11", "-I", os.path.join(src_dir, "client"),
            "-I", os.path.join(SRC_DIR, "bench"),
            os.path.join(SRC_DIR, "bench", "server_register.c"),
            os.path.join(build_dir, "client", "libmemtally.a"),
            "-lprotobuf-c", "-o", out]
    p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode:
        log("server: FAILED: %s: %s" % (" ".join(argv), p.stderr.strip()))
        return None
    return " ".join(argv)


def quart(v):
    """(p25, median, p75) of a list, by linear interpolation."""
    v = sorted(v)
    def at(q):
        x = q * (len(v) - 1)
        i = int(x)
        j = min(i + 1, len(v) - 1)
        return v[i] + (v[j] - v[i]) * (x - i)
    return at(0.25), at(0.5), at(0.75)


def fmt_q(v, scale=1.0, prec=1):
    a, m, b = quart([x * scale for x in v])
    f = "%%.%df" % prec
    return (f + " (" + f + "–" + f + ")") % (m, a, b)


def side_by_side(args, build, info):
    """Registration and tick cost of this build and of --baseline-build,
    interleaved; writes its own block of bench/results/server.md."""
    base = os.path.abspath(args.baseline_build)
    base_src = os.path.abspath(args.baseline_src or os.path.dirname(base))
    cpus = sorted(os.sched_getaffinity(0))
    cpu, wcpu = cpus[-1], cpus[0]
    tmp = tempfile.mkdtemp(prefix="mtbench-sbs-")
    trees = {"old": (base_src, base), "new": (SRC_DIR, build)}
    reg_exe, cmds = {}, {}
    for k, (src, bld) in trees.items():
        reg_exe[k] = os.path.join(tmp, "bench_server_register_" + k)
        cmds[k] = build_register(src, bld, reg_exe[k])
        if not cmds[k]:
            return 1
    commits = {}
    for k, (src, _) in trees.items():
        commits[k] = subprocess.run(
            ["git", "-C", src, "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True).stdout.strip()
    rounds = args.rounds
    reg = {(k, h): [] for k in trees for h in (True, False)}
    tick = {(k, m, s): [] for k in trees for m in ("loop", "full")
            for s in SBS_SLOTS}
    for r in range(rounds):
        order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
        for holder in (True, False):
            for k in order:
                j = register_run(reg_exe[k], os.path.join(
                    trees[k][1], "server", "memtallyd"), holder,
                    args.register_n, cpu)
                if not j:
                    return 1
                reg[(k, holder)].append(j)
                log("  round %d register %-3s %-6s p50 %.1f us, server "
                    "%.1f us/worker (stat %.1f)" % (
                        r, k, "holder" if holder else "alone",
                        j["latency_us"]["p50"],
                        j["server_run_us_per_worker"],
                        j["server_cpu_us_per_worker"]))
        for s in SBS_SLOTS:
            for k in order:
                b = trees[k][1]
                j = run_json([os.path.join(b, "bench", "bench_server_tick"),
                              "--slots", str(s), "--lanes", "1", "--cpu",
                              str(cpu), "--writer-cpu", str(wcpu), "--quiet",
                              "--variant", "prefetch"])
                f = run_json([os.path.join(b, "bench",
                                           "bench_server_core_tick"),
                              "--slots", str(s), "--lanes", "1", "--churn",
                              "30", "--cpu", str(cpu)])
                if not j or not f:
                    return 1
                tick[(k, "loop", s)].append(j)
                tick[(k, "full", s)].append(f)
            log("  round %d tick %-6d loop p50 old %.1f new %.1f, full p50 "
                "old %.1f new %.1f us" % (
                    r, s, tick[("old", "loop", s)][-1]["p50_ns"] / 1e3,
                    tick[("new", "loop", s)][-1]["p50_ns"] / 1e3,
                    tick[("old", "full", s)][-1]["p50_ns"] / 1e3,
                    tick[("new", "full", s)][-1]["p50_ns"] / 1e3))
    load_end = os.getloadavg()[0]

    def med(v):
        return quart(v)[1]

    lines = []
    lines.append(
        "Measured %s on %s (%d CPUs, Linux %s); new: this tree, commit "
        "`%s`%s, build `%s`; old: commit `%s`, build `%s`. Load average "
        "(1 min) %.2f at the start, %.2f at the end. %d rounds, each "
        "running old and new back to back (old first in even rounds, new "
        "first in odd ones). Figures: the median over the rounds, "
        "(quartiles) in brackets; ratio = new / old of the medians.\n" % (
            info["date"], info["cpu_model"], info["nproc"], info["kernel"],
            info["commit"], " with uncommitted changes" if
            info["uncommitted"] else "", os.path.relpath(build, SRC_DIR),
            commits["old"], base, info["loadavg_start"], load_end, rounds))
    lines.append(
        "**Registration** (bench_server_register, server_register.c): a "
        "real memtallyd (4096 slots, 1000 ms tick, default log level), "
        "then %d workers after 50 warm-up, one at a time, each forked "
        "from the driver, linked with its tree's libmemtally.a: `latency` "
        "is `memtally_account(1 MiB)` + `memtally_flush()` in the worker "
        "(connect, Register, answer, mapping, first publish), `server "
        "CPU` memtallyd's run time (schedstat, all threads) from the "
        "first worker to the last one's exit in its log, over N: one "
        "registration and one exit each; `stat` the same from "
        "utime + stime (10 ms ticks, coarse). Driver, workers and "
        "memtallyd pinned to CPU %d (a round trip across the guest's "
        "vCPUs costs ~100 µs of hypervisor wake-up, which would swamp "
        "both). `holder`: one worker of the same uid stays registered "
        "throughout; `alone`: each worker is the only process of its "
        "uid. Every worker proved attached (flush 0, "
        "`memtally_attached()`, 1 MiB published), each pid registered "
        "and exited in the server's log, GetUsage empty (but the holder) "
        "before and after, the server's own count at shutdown = every "
        "worker.\n" % (args.register_n, cpu))
    lines.append("| uid | | latency p50 µs | latency p99 µs | server CPU "
                 "µs per worker | server CPU (stat) µs per worker |")
    lines.append("|---|---|---|---|---|---|")
    js_reg = []
    for holder in (True, False):
        row = {}
        for k in ("old", "new"):
            v = reg[(k, holder)]
            row[k] = {
                "p50": [x["latency_us"]["p50"] for x in v],
                "p99": [x["latency_us"]["p99"] for x in v],
                "run": [x["server_run_us_per_worker"] for x in v],
                "stat": [x["server_cpu_us_per_worker"] for x in v]}
            lines.append("| %s | %s | %s | %s | %s | %s |" % (
                "holder" if holder else "alone", k,
                fmt_q(row[k]["p50"]), fmt_q(row[k]["p99"]),
                fmt_q(row[k]["run"]), fmt_q(row[k]["stat"])))
        lines.append("| %s | **new / old** | **%.2f** | %.2f | **%.2f** | "
                     "%.2f |" % (
                         "holder" if holder else "alone",
                         *[med(row["new"][c]) / med(row["old"][c])
                           for c in ("p50", "p99", "run", "stat")]))
        js_reg.append({"holder": holder, "old": reg[("old", holder)],
                       "new": reg[("new", holder)]})
    lines.append("")
    lines.append(
        "**Tick**, the same binaries' tick benches, same arguments, "
        "interleaved with the registration rounds: `loop` is "
        "bench_server_tick (the summing loop alone, `--lanes 1 --quiet "
        "--variant prefetch`; it walks the table by `base + i × stride` "
        "in both trees), `full` is bench_server_core_tick (`mts_core_tick()` "
        "of each tree's own server code, `--lanes 1 --churn 30`; the new "
        "one reads each slot through `reg->slot_at[]`). Reader pinned to "
        "CPU %d; 301 ticks per run. p50 = median over the rounds of each "
        "run's p50 (quartiles), min = lowest of the runs' minima; µs.\n"
        % cpu)
    lines.append("| tick | slots | old p50 | new p50 | new / old (p50) | "
                 "old min | new min | new / old (min) |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for m in ("loop", "full"):
        for s in SBS_SLOTS:
            o = [x["p50_ns"] / 1e3 for x in tick[("old", m, s)]]
            n = [x["p50_ns"] / 1e3 for x in tick[("new", m, s)]]
            omin = min(x["min_ns"] for x in tick[("old", m, s)]) / 1e3
            nmin = min(x["min_ns"] for x in tick[("new", m, s)]) / 1e3
            lines.append("| %s | %d | %s | %s | **%.2f** | %.1f | %.1f | "
                         "%.2f |" % (m, s, fmt_q(o, prec=2 if s < 1000
                                                  else 1),
                                     fmt_q(n, prec=2 if s < 1000 else 1),
                                     med(n) / med(o), omin, nmin,
                                     nmin / omin))
    lines.append("")
    lines.append(
        "Rerun: `git worktree add /tmp/mt-old %s && cmake -S /tmp/mt-old "
        "-B /tmp/mt-old/build-release -DCMAKE_BUILD_TYPE=Release && "
        "cmake --build /tmp/mt-old/build-release -j2`, then "
        "`bench/server.py --build-dir %s --baseline-build "
        "/tmp/mt-old/build-release --side-by-side --rounds %d` (it "
        "compiles the registration bench for each tree: `%s`)." % (
            commits["old"], os.path.relpath(build, SRC_DIR), rounds,
            cmds["new"].replace(tmp + "/", "").replace(SRC_DIR + "/", "")))
    text = "\n".join(lines)
    print(text)
    jpath = args.json or os.path.join(build, "bench",
                                      "server_side_by_side.json")
    with open(jpath, "w") as f:
        json.dump({"machine": info, "load_end": load_end,
                   "commits": commits, "register": js_reg,
                   "tick": [{"tree": k[0], "mode": k[1], "slots": k[2],
                             "runs": v} for k, v in tick.items()]},
                  f, indent=1)
    log("JSON: %s" % jpath)
    write_section(args.results_md, "server-side-by-side", text,
                  "bench/server.py --side-by-side")
    log("wrote the side-by-side block of %s" % args.results_md)
    return 0


def record_only(args, build, info):
    """`--record`: the reservations' record alone, in its own block."""
    try:
        record = record_rows(build)
    except RunFailed:
        return 1
    head = report_head(info)
    head[0] = "## server: the reservations' record\n"
    text = "\n".join(head + report_record(record) + [
        "Rerun: `bench/server.py --record`; one size: "
        "`%s/bench/bench_server_resv_record --resv 65536`." %
        os.path.relpath(build, SRC_DIR)])
    print(text)
    write_section(args.results_md, "server-record", text,
                  "bench/server.py --record")
    log("wrote the record block of %s" % args.results_md)
    return 0


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(SRC_DIR, "build"))
    ap.add_argument("--json")
    ap.add_argument("--results-md",
                    default=results_path("server"))
    ap.add_argument("--baseline-build",
                    help="another build whose bench_server_core_tick is "
                    "run interleaved as `before` (e.g. one of the commit "
                    "before a change)")
    ap.add_argument("--baseline-src",
                    help="the source tree of --baseline-build (default: "
                    "its parent directory)")
    ap.add_argument("--side-by-side", action="store_true",
                    help="only registration and tick cost, this build "
                    "against --baseline-build, interleaved")
    ap.add_argument("--record", action="store_true",
                    help="only the reservations' record: what taking and "
                    "restoring it costs at 1024-65536 reservations")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--register-n", type=int, default=REGISTER_N)
    args = ap.parse_args()
    if args.side_by_side and not args.baseline_build:
        ap.error("--side-by-side needs --baseline-build")
    return args


# ---- the measurements (RunFailed: a run failed) ------------------------------


def tick_rows(build, cpu, wcpu):
    """The summing loop alone (bench_server_tick), the old loop and the
    new one back to back in each row."""
    exe = os.path.join(build, "bench", "bench_server_tick")
    rows = []
    for s in SLOTS:
        for lanes, quiet in [(1, True)] + [(lane, False) for lane in LANES]:
            argv = [exe, "--slots", str(s), "--lanes", str(lanes),
                    "--cpu", str(cpu), "--writer-cpu", str(wcpu)]
            if quiet:
                argv.append("--quiet")
            old = run_must(argv + ["--variant", "call"])
            r = run_must(argv + ["--variant", "prefetch"])
            r["call"] = old
            rows.append(r)
            log("  slots %-6d lanes %-3d %-6s p50 %.1f us (call %.1f us)" % (
                s, lanes, "writer" if r["writer"] else "quiet",
                r["p50_ns"] / 1e3, old["p50_ns"] / 1e3))
    return rows


def core_rows(build, baseline_build, cpu, wcpu):
    """The whole tick, mts_core_tick(), on a registry of the daemon's own
    code; with a baseline build, its run just before each row."""
    core = []
    cexe = os.path.join(build, "bench", "bench_server_core_tick")
    for s, lanes, writer in CORE_ROWS:
        argv = ["--slots", str(s), "--lanes", str(lanes), "--churn", "30",
                "--cpu", str(cpu)]
        if writer:
            argv += ["--writer", "--writer-cpu", str(wcpu)]
        before = None
        if baseline_build:
            bexe = os.path.join(os.path.abspath(baseline_build),
                                "bench", "bench_server_core_tick")
            before = run_must([bexe] + argv)
        r = run_must([cexe] + argv)
        if before:
            r["before"] = before
        core.append(r)
        log("  full tick: slots %-6d lanes %d %-6s p50 %.1f us" % (
            s, lanes, "writer" if writer else "quiet", r["p50_ns"] / 1e3))
    return core


def reclaim_rows(build):
    """Exit-to-reclaim latency against a real memtallyd ([]: not built)."""
    reclaim = []
    rexe = os.path.join(build, "bench", "bench_server_reclaim")
    mtd = os.path.join(build, "server", "memtallyd")
    pre = os.path.join(build, "client", "libmemtally_preload.so")
    if not (os.access(mtd, os.X_OK) and os.path.exists(pre)):
        log("server: reclaim latency skipped: memtallyd or the preload "
            "library not built")
        return reclaim
    for tick in RECLAIM_TICKS:
        r = run_must([rexe, "--memtallyd", mtd, "--preload", pre,
                      "--tick", str(tick), "--n", str(RECLAIM_N)])
        reclaim.append(r)
        log("  reclaim: tick %d ms: %s" % (tick, json.dumps(
            r["kill_to_reclaim"])))
    return reclaim


def register_rows(build, cpu):
    """Registration cost against a real memtallyd, workers one at a time,
    with and without a holder ([]: not built)."""
    register = []
    mtd = os.path.join(build, "server", "memtallyd")
    gexe = os.path.join(build, "bench", "bench_server_register")
    if not (os.access(mtd, os.X_OK) and os.access(gexe, os.X_OK)):
        log("server: registration cost skipped: memtallyd not built")
        return register
    for holder in (True, False):
        r = register_run(gexe, mtd, holder, REGISTER_N, cpu)
        if not r:
            raise RunFailed()
        register.append(r)
        log("  register: %s: %s" % ("holder" if holder else "alone",
                                    json.dumps(r["latency_us"])))
    return register


def record_rows(build):
    """What the reservations' record costs (server_resv_record.c) at
    RECORD_N reservations."""
    exe = os.path.join(build, "bench", "bench_server_resv_record")
    rows = []
    for n in RECORD_N:
        r = run_must([exe, "--resv", str(n), "--takes", "21"])
        rows.append(r)
        log("  record: %s" % json.dumps(r))
    return rows


def query_figures(build):
    """Query latency and pipelined throughput against a memtallyd of the
    run: (figures, or None when there is no server; the server's status)."""
    tmp = tempfile.mkdtemp(prefix="mtbench-server-")
    # Nothing pinned here: on this shared 2-CPU guest a pinned server waits
    # behind whatever else runs on its CPU (p99 in milliseconds), which
    # measures the machine, not memtally.
    srv, status = start_server(build, tmp)
    try:
        if not srv:
            log("server: query latency skipped: %s" % status)
            return None, status
        qexe = os.path.join(build, "bench", "bench_server_query")
        query = run_must([qexe, "--socket", srv.socket, "--n", "20000"])
        log("  query: %s" % json.dumps(query))
        pexe = os.path.join(build, "bench", "bench_server_pipeline")
        query["pipeline"] = []
        for w in PIPE_WINDOWS:
            r = run_must([pexe, "--socket", srv.socket, "--window", str(w),
                          "--seconds", "1"])
            query["pipeline"].append(r)
            log("  pipeline: %s" % json.dumps(r))
        return query, status
    finally:
        if srv:
            srv.stop()


# ---- the report -------------------------------------------------------------


def report_head(info):
    return [
        "## server (tick aggregation, full tick, reclaim, query "
        "latency)\n",
        "Measured %s on %s (%d CPUs, Linux %s); commit `%s`%s. Load "
        "average (1 min) %.2f at the start, %.2f at the end.\n" % (
            info["date"], info["cpu_model"], info["nproc"], info["kernel"],
            info["commit"],
            " with uncommitted changes" if info["uncommitted"] else "",
            info["loadavg_start"], os.getloadavg()[0])]


def report_ticks(rows, cpu, wcpu):
    lines = []
    lines.append(
        "**Summing loop only** (the first target measurement): one tick "
        "= `mtshm_slot_sum()` over every live slot of a real "
        "slot table (the server's summing loop, nothing else), reader pinned "
        "to CPU %d; `writer`: a thread on CPU %d keeps storing into every "
        "lane in use, so each line is just written by another core; "
        "`quiet`: no writer. 301 ticks per row; p50 / p99 / min in µs; "
        "each run checks the tick summed exactly what the lanes hold. "
        "The loop is the one mts_core_tick() runs now (`mtshm_slot_sum` inlined, "
        "lane count from the private layout, the line 8 slots ahead "
        "prefetched); `call p50` is the loop as it was (an out-of-line call "
        "per slot), run just before it. "
        "Target: tick ≤ %g µs at 16384 slots.\n"
        % (cpu, wcpu, TARGET_US))
    lines.append("| slots | lanes | writer | p50 µs | p99 µs | min µs | "
                 "ns per slot (p50) | ns per lane (p50) | call p50 µs | "
                 "call min µs |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        lines.append("| %d | %d | %s | %.1f | %.1f | %.1f | %.2f | %.2f | "
                     "%.1f | %.1f |" % (
            r["slots"], r["lanes"], "yes" if r["writer"] else "quiet",
            r["p50_ns"] / 1e3, r["p99_ns"] / 1e3, r["min_ns"] / 1e3,
            r["p50_ns"] / r["slots"], r["p50_ns"] / r["slots"] / r["lanes"],
            r["call"]["p50_ns"] / 1e3, r["call"]["min_ns"] / 1e3))
    big = [r for r in rows if r["slots"] == 16384]
    lines.append("")
    lines.append("Target, 16384 slots, p50: " + "; ".join(
        "%d lane(s) %s %.1f µs %s" % (
            r["lanes"], "writer" if r["writer"] else "quiet",
            r["p50_ns"] / 1e3,
            "met" if r["p50_ns"] / 1e3 <= TARGET_US else "**missed**")
        for r in big) + " (loop only).\n")
    return lines


def report_core(core, cpu, baseline):
    lines = []
    lines.append(
        "**Full tick (mts_core_tick)**: `mts_core_tick()` itself "
        "(bench_server_core_tick: "
        "server_core_tick.c, linked with `memtally_server_core`): a real "
        "header and slot table with the server's default 4 lanes per slot, a registry "
        "(`mts_registry_init`) with S workers adopted through "
        "`mts_registry_adopt_slot` (an eventfd standing in for each pidfd) "
        "over 8 groups, a fleet limit, a group limit and a per-process "
        "limit in force (none reached, so every comparison runs and no "
        "event fires), then 30%% of the workers exited through the server's "
        "own pidfd path and as many adopted into the freed slots, with heap "
        "allocations in between (dense, slot and heap order disagree, as in "
        "a server that has run a while). Sums, group totals, reservations, "
        "limits (fleet, groups, every process), enforcement and the "
        "seqlock publish; each run checks the published fleet total and "
        "the group sums against the lanes. Pinned to CPU %d; 301 ticks per "
        "row after 20 warm-up. `limits pass` is `mts_limits_eval(reg, "
        "true)` timed alone right after a tick: a separate pass over every "
        "process, as the tick ran it before the per-process evaluation "
        "moved into the summing loop (shown for scale; not part of the "
        "tick any more).%s\n" % (
            cpu, " `before`: the same bench built from the baseline tree, "
            "run just before each row." if baseline else ""))
    hdr = ("| slots | lanes used | writer | p50 µs | p99 µs | min µs | "
           "ns per process (p50) | limits pass p50 µs |")
    sep = "|---|---|---|---|---|---|---|---|"
    if baseline:
        hdr += " before p50 µs | before min µs | speed-up (p50) |"
        sep += "---|---|---|"
    lines.append(hdr)
    lines.append(sep)
    for r in core:
        line = "| %d | %d | %s | %.1f | %.1f | %.1f | %.2f | %.1f |" % (
            r["slots"], r["lanes"], "yes" if r["writer"] else "quiet",
            r["p50_ns"] / 1e3, r["p99_ns"] / 1e3, r["min_ns"] / 1e3,
            r["p50_ns"] / r["slots"], r["limits_p50_ns"] / 1e3)
        if "before" in r:
            b = r["before"]
            line += " %.1f | %.1f | %.2f× |" % (
                b["p50_ns"] / 1e3, b["min_ns"] / 1e3,
                b["p50_ns"] / r["p50_ns"])
        lines.append(line)
    bigc = [r for r in core if r["slots"] == 16384]
    lines.append("")
    lines.append("Target, 16384 slots, p50: " + "; ".join(
        "full tick %d lane(s) %s %.1f µs %s" % (
            r["lanes"], "writer" if r["writer"] else "quiet",
            r["p50_ns"] / 1e3,
            "met" if r["p50_ns"] / 1e3 <= TARGET_US else "**missed**")
        for r in bigc) + ".\n")
    return lines


def report_reclaim(reclaim):
    lines = []
    if reclaim:
        lines.append(
            "Exit-to-reclaim latency (bench_server_reclaim: "
            "server_reclaim.c): a real memtallyd (256 slots, `--tick` as "
            "below), %d real workers one after another, each this bench "
            "binary under `LD_PRELOAD=libmemtally_preload.so` holding %d MiB "
            "(registered and flushed: its slot shows ≥ 90%% of the bytes) "
            "and then SIGKILLed. The driver spins on the header and the "
            "slot table, mapped through the server's descriptors in "
            "/proc/SERVER/fd (yielding each round, nothing pinned): `kill → exit` "
            "is when its own pidfd on the worker turns readable (the "
            "kernel's share: tearing down a 10 MiB process), `kill → "
            "reclaimed` when the fleet snapshot published after the kill "
            "shows no process and no bytes (and the worker's slot is free), "
            "`exit → reclaimed` the server's share (0 when both were seen "
            "in the same spin round). µs:\n" % (
                RECLAIM_N, reclaim[0]["mib"]))
        lines.append("| tick | kill → exit p50 / p99 / max | kill → "
                     "reclaimed p50 / p99 / max | exit → reclaimed p50 / "
                     "p99 / max |")
        lines.append("|---|---|---|---|")
        for r in reclaim:
            lines.append("| %d ms | %s | %s | %s |" % (
                r["tick_ms"], *[
                    "%.0f / %.0f / %.0f" % (r[k]["p50_us"], r[k]["p99_us"],
                                            r[k]["max_us"])
                    for k in ("kill_to_exit", "kill_to_reclaim",
                              "exit_to_reclaim")]))
        lines.append("")
    else:
        lines.append("Exit-to-reclaim latency: not measured (memtallyd or "
                     "the preload library not built).\n")
    return lines


def report_register(register, cpu):
    lines = []
    if register:
        lines.append(
            "Registration cost (bench_server_register: server_register.c): "
            "a real memtallyd (4096 slots, 1000 ms tick, default log "
            "level), %d workers after 50 warm-up, one at a time, forked "
            "from the driver and linked with libmemtally: latency = "
            "`memtally_account(1 MiB)` + `memtally_flush()` in the worker "
            "(connect, Register, answer, mapping, first publish); server "
            "CPU = memtallyd's run time (schedstat) from the first worker "
            "to the last one's exit, over N (one registration and one "
            "exit each). Everything pinned to CPU %d. `holder`: another "
            "worker of the uid stays registered throughout; `alone`: "
            "each worker is its uid's only process. Each worker proved "
            "attached and each pid registered and exited in the "
            "server's log. µs:\n" % (REGISTER_N, cpu))
        lines.append("| uid | latency p50 | p25–p75 | p99 | server CPU "
                     "per worker | (utime+stime) |")
        lines.append("|---|---|---|---|---|---|")
        for r in register:
            lat = r["latency_us"]
            lines.append("| %s | %.1f | %.1f–%.1f | %.1f | %.1f | %.1f |" % (
                "holder" if r["holder"] else "alone", lat["p50"],
                lat["p25"], lat["p75"], lat["p99"],
                r["server_run_us_per_worker"],
                r["server_cpu_us_per_worker"]))
        lines.append("")
    return lines


def report_query(query, status):
    lines = []
    if query:
        lines.append(
            "Query latency, one connection, one request in flight, 20000 "
            "calls after 1000 warm-up (nothing pinned; memtallyd with its "
            "defaults, 4096 slots, 10 ms tick): a bare round trip is 64 "
            "bytes each way over an "
            "AF_UNIX socketpair to a forked echo child; GetUsage is "
            "`memtally_query_usage()` against memtallyd (every call must "
            "succeed). µs:\n")
        lines.append("| | p50 | p99 | p99.9 | min |")
        lines.append("|---|---|---|---|---|")
        for k, label in (("bare_rtt", "bare round trip"),
                         ("get_usage", "GetUsage")):
            q = query[k]
            lines.append("| %s | %.1f | %.1f | %.1f | %.1f |" % (
                label, q["p50_ns"] / 1e3, q["p99_ns"] / 1e3,
                q["p999_ns"] / 1e3, q["min_ns"] / 1e3))
        ratio = query["get_usage"]["p99_ns"] / query["bare_rtt"]["p99_ns"]
        lines.append("")
        lines.append("Target, GetUsage p99 ≤ 2 × bare round trip p99: "
                     "%.2f× — %s.\n" % (
                         ratio, "met" if ratio <= 2 else "**missed**"))
        lines.append(
            "Pipelined GetUsage on one connection (bench_server_pipeline: "
            "W requests written at once, then W responses read, each "
            "decoded and matched by id; 1 s per row; memtallyd is "
            "single-threaded, so it runs on one core):\n")
        lines.append("| window W | GetUsage/s |")
        lines.append("|---|---|")
        for r in query["pipeline"]:
            lines.append("| %d | %.0f |" % (r["window"], r["per_second"]))
        best = max(r["per_second"] for r in query["pipeline"])
        lines.append("")
        lines.append("Target, pipelined GetUsage ≥ %d/s: best %.0f/s — %s."
                     "\n" % (TARGET_PIPE, best,
                             "met" if best >= TARGET_PIPE else "**missed**"))
    else:
        lines.append("Query latency: not measured (%s).\n" % status)
    return lines


def report_record(rows):
    lines = [
        "The reservations' record (bench_server_resv_record, "
        "server_resv_record.c: N reservations granted through mts_admit "
        "by 8 uids, each with a task and one of its uid's 4 kinds). "
        "memtallyd takes the record on its loop a moment after a "
        "reservation comes or goes and every 5 s while any is held, no "
        "sooner than 100 times its last cost; the checksum is computed "
        "where it is written, on the thread pool. `loop share` is the most "
        "of the loop's time the record takes at that size; `both on the "
        "loop` is what the loop paid when the checksum was computed there "
        "too. Restore: once, at start, before the server serves.\n",
        "| reservations | record | taking it, on the loop (median, min-max "
        "of 21) | checksum, off the loop | both on the loop | loop share | "
        "restore at start |",
        "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            "| %d | %.1f MB | %.2f ms (%.2f-%.2f) | %.2f ms | %.2f ms | "
            "%.2f%% | %.1f ms |" % (
                r["reservations"], r["record_bytes"] / 1e6,
                r["encode_ms_median"], r["encode_ms_min"],
                r["encode_ms_max"], r["seal_ms"],
                r["encode_ms_median"] + r["seal_ms"],
                100 * r["loop_share"], r["restore_ms"]))
    lines.append("")
    return lines


def rerun_line(build, cpu, wcpu):
    rel = os.path.relpath(build, SRC_DIR)
    return (
        "Rerun everything: `cmake --build %s --target bench_server`; one "
        "row: `%s/bench/bench_server_tick --slots 16384 --lanes 1 --cpu %d "
        "--writer-cpu %d`; full tick: `%s/bench/bench_server_core_tick "
        "--slots 16384 --churn 30 --cpu %d`; reclaim: "
        "`%s/bench/bench_server_reclaim --memtallyd %s/server/memtallyd "
        "--preload %s/client/libmemtally_preload.so --tick 1000`." % (
            rel, rel, cpu, wcpu, rel, cpu, rel, rel, rel))


def main():
    args = parse_args()
    build = os.path.abspath(args.build_dir)
    if args.side_by_side:
        return side_by_side(args, build, machine_info())
    if args.record:
        return record_only(args, build, machine_info())
    cpus = sorted(os.sched_getaffinity(0))
    cpu, wcpu = cpus[-1], cpus[0]
    info = machine_info()
    try:
        rows = tick_rows(build, cpu, wcpu)
        core = core_rows(build, args.baseline_build, cpu, wcpu)
        reclaim = reclaim_rows(build)
        register = register_rows(build, cpu)
        record = record_rows(build)
        query, status = query_figures(build)
    except RunFailed:
        return 1
    lines = (report_head(info) + report_ticks(rows, cpu, wcpu) +
             report_core(core, cpu, args.baseline_build) +
             report_reclaim(reclaim) + report_register(register, cpu) +
             report_record(record) + report_query(query, status) +
             [rerun_line(build, cpu, wcpu)])
    text = "\n".join(lines)
    print(text)
    jpath = args.json or os.path.join(build, "bench", "server.json")
    with open(jpath, "w") as f:
        json.dump({"machine": info, "rows": rows, "full_tick": core,
                   "reclaim": reclaim, "register": register,
                   "record": record, "query": query}, f, indent=1)
    log("JSON: %s" % jpath)
    write_section(args.results_md, "server", text)
    log("wrote the server section of %s" % args.results_md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
