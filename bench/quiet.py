#!/usr/bin/python3
"""quiet: what a process is counted for after it frees its heap and goes
quiet, per runtime, and what the preloads' refresh thread costs.

Figures: the runtimes of tests/integration/test_quiet.py (C under the
glibc front end and under the jemalloc preload, C++, sqlite3 :memory:,
python3 on glibc and on jemalloc), all at once under one memtallyd: each
builds ~300 MiB of small objects, holds them, drops them, then stays
idle. Growth since start of memtally's `bytes` against RssAnon's: held,
5 s and 15 s after the drop. Cost: the CPU time of each process's
"memtally" thread (/proc/PID/task/TID/schedstat) over 10 idle seconds
after the drop, and callgrind's instructions inside the thread's rounds
(mtc_refresh_once) per idle second of a quiet process (mt_worker quiet,
30 MiB built and dropped, MEMTALLY_REFRESH_MIN=0 so that it has the
thread at that size): (Ir(idle 12 s) - Ir(idle 2 s)) / 10; a run whose
rounds measure nothing fails.

Run:  /usr/bin/python3 bench/quiet.py --build-dir BUILD [--no-callgrind]
Writes its section of bench/results/quiet.md unless --no-results.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchlib import (  # noqa: E402
    BenchError, SRC_DIR, harness, log, machine_info, results_path,
    start_server, write_section)

MIB = 1 << 20


def refresh_thread_ns(pid):
    """CPU ns the process's "memtally" thread has run, or None."""
    base = "/proc/%d/task" % pid
    for tid in os.listdir(base):
        try:
            with open("%s/%s/comm" % (base, tid)) as f:
                if f.read().strip() != "memtally":
                    continue
            with open("%s/%s/schedstat" % (base, tid)) as f:
                return int(f.read().split()[0])
        except OSError:
            continue
    return None


def figures(build):
    """[(runtime, {point: (memtally, anon)}, thread ns per idle s)]."""
    h = harness(build)
    import test_quiet as tq  # noqa: E402 - after harness() set its path
    out = []
    with h.Server() as s:
        runs = [tq.Run(s, rt) for rt in tq.runtimes()]
        try:
            def held(r):
                r.step(r.rt.build, "built")
                r.agree("held", timeout=10)
            tq.in_parallel(runs, held)

            def dropped(r):
                r.step(r.rt.drop, "dropped")
                t = time.monotonic()
                # Read at fixed points after the drop, agreeing or not.
                h.wait_for("5 s", lambda: time.monotonic() >= t + 5,
                           timeout=6, interval=0.05)
                r.agree("5 s after the drop", timeout=0)
                ns0, t0 = refresh_thread_ns(r.pid), time.monotonic()
                h.wait_for("10 s", lambda: time.monotonic() >= t + 15,
                           timeout=16, interval=0.2)
                r.agree("15 s after the drop", timeout=0)
                ns1, t1 = refresh_thread_ns(r.pid), time.monotonic()
                r.cost = (ns1 - ns0) / (t1 - t0) if ns0 is not None \
                    and ns1 is not None else None
            tq.in_parallel(runs, dropped)
        finally:
            for r in runs:
                r.w.close()
    for r in runs:
        out.append((r.rt.name, {k: v[:2] for k, v in r.rows.items()},
                    r.cost))
    return out


def callgrind_idle(build, tmp, idle_s, toggle, front):
    """callgrind's total Ir of `mt_worker quiet 30` (built, dropped, idle_s
    idle); with `toggle`, only inside that function."""
    out = os.path.join(tmp, "cg.out")
    env = dict(os.environ)
    env["LD_PRELOAD"] = os.path.join(build, "client", {
        "glibc": "libmemtally_glibc.so",
        "jemalloc": "libmemtally_preload.so"}[front])
    env["MEMTALLY_SOCKET"] = os.path.join(tmp, "memtally.sock")
    env["MEMTALLY_ALLOCATOR"] = front
    # The worker holds 30 MiB, under the size at which a single-threaded
    # process gets the refresh thread (MTC_REFRESH_MIN, 64 MiB): without
    # this it has none, and its rounds would measure 0.
    env["MEMTALLY_REFRESH_MIN"] = "0"
    env.pop("MEMTALLY_DISABLE", None)
    p = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out] +
        (["--toggle-collect=" + toggle] if toggle else []) + [
         os.path.join(build, "tests", "integration", "mt_worker"), "quiet",
         "30"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, env=env, text=True, bufsize=1)
    assert p.stdout.readline().startswith("ready")
    for cmd, answer in (("build", "built"), ("drop", "dropped")):
        p.stdin.write(cmd + "\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == answer
    time.sleep(idle_s)
    p.stdin.write("exit\n")
    p.stdin.flush()
    p.wait()
    total = 0
    for f in os.listdir(tmp):
        if f.startswith("cg.out"):
            with open(os.path.join(tmp, f)) as fh:
                m = re.search(r"^(?:summary|totals): (\d+)", fh.read(), re.M)
            total += int(m.group(1)) if m else 0
            os.unlink(os.path.join(tmp, f))
    return total


def mib(x):
    return "%.1f" % (x / MIB)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(SRC_DIR, "build"))
    ap.add_argument("--no-callgrind", action="store_true")
    ap.add_argument("--no-results", action="store_true")
    a = ap.parse_args()
    build = os.path.abspath(a.build_dir)
    log("runtimes: build, hold, drop, 15 s idle (all at once)")
    rows = figures(build)
    lines = ["| runtime | held: memtally / RssAnon growth (MiB) | "
             "5 s after the drop | 15 s after the drop | "
             "refresh thread's CPU per s, 5-15 s after the drop |",
             "|---|---|---|---|---|"]
    for name, pts, cost in rows:
        cells = []
        for k in ("held", "5 s after the drop", "15 s after the drop"):
            fig, anon = pts.get(k, (0, 0))
            cells.append("%s / %s" % (mib(fig), mib(anon)))
        c = "%.1f µs" % (cost / 1000) if cost is not None else "no thread"
        lines.append("| %s | %s | %s |" % (name, " | ".join(cells), c))
    text = "\n".join(lines)
    cg = ""
    if not a.no_callgrind:
        with tempfile.TemporaryDirectory() as tmp:
            srv, _ = start_server(build, tmp)
            try:
                res = {}
                for front in ("glibc", "jemalloc"):
                    short = callgrind_idle(build, tmp, 2, "mtc_refresh_once",
                                           front)
                    long_ = callgrind_idle(build, tmp, 12,
                                           "mtc_refresh_once", front)
                    # No instruction in the rounds: no thread ran them
                    # (not started, or not this build's), not a free one.
                    if short <= 0 or long_ <= short:
                        raise BenchError(
                            "quiet: the refresh thread's rounds measured "
                            "%d Ir (2 s idle) and %d (12 s), %s: the "
                            "thread did not run" % (short, long_, front))
                    res[front] = ((long_ - short) / 10.0, short)
                    log("refresh, %s: %.0f Ir per idle second"
                        % (front, res[front][0]))
            finally:
                if srv:
                    srv.stop()
        cg = ("\n\nThe thread's CPU time includes, under jemalloc, the "
              "purging its decay does (madvise of the freed pages), which "
              "jemalloc would otherwise do in the program's calls or in its "
              "own background thread; once the pages are gone an idle round "
              "costs what the glibc rows show.\n\n"
              "callgrind, mt_worker quiet 30 (built, dropped, then idle), "
              "inside the refresh thread's rounds (mtc_refresh_once, "
              "inclusive), per idle second ((Ir with 12 s idle - Ir with "
              "2 s) / 10): glibc front end %.0f (an idle round is a clock "
              "read and a sum of the lanes; the difference is within the "
              "noise of where the first sample fell), jemalloc preload %.0f "
              "(every round while the dropped pages decay: decay, epoch, "
              "statistics). The 2 s runs, whose first round after the drop "
              "sampled the allocator (glibc: mallinfo2's walk of ~650,000 "
              "free chunks): %d and %d."
              % (res["glibc"][0], res["jemalloc"][0], res["glibc"][1],
                 res["jemalloc"][1]))
    i = machine_info()
    info = "%s on %s (%d CPUs, Linux %s), %s; commit `%s`%s" % (
        i["date"], i["cpu_model"], i["nproc"], i["kernel"], i["glibc"],
        i["commit"], " with uncommitted changes" if i["uncommitted"] else "")
    out = ("Measured %s.\n\nGrowth since start of memtally's `bytes` and of "
           "RssAnon (/proc/PID/status), all runtimes at once under one "
           "memtallyd:\n\n%s%s\n\nRerun: `/usr/bin/python3 bench/quiet.py "
           "--build-dir build`" % (info, text, cg))
    print(out)
    if not a.no_results:
        write_section(results_path("quiet"), "quiet", out)


if __name__ == "__main__":
    main()
