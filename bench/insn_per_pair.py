#!/usr/bin/python3
"""insn_per_pair: instructions per malloc+free pair, each front end against
its allocator alone, and what a process's start costs.

Per pair: one worker process (bench_alloc_je / bench_alloc_plain of
alloc_overhead) runs N pairs of one case under callgrind, whole process;
the figure is (Ir(2N) - Ir(N)) / N, so start-up, the worker's proof and
exit cancel and everything a pair causes counts, wherever it runs (the
allocator, the front end, a flush, a sample of the allocator's free
memory). callgrind counts are stable on a loaded machine.

  jemalloc  bench_alloc_je --variant jemalloc (jemalloc alone)
  preload   bench_alloc_plain under LD_PRELOAD=libmemtally_preload.so
  glibc     bench_alloc_plain as is (glibc alone)
  glibcfe   bench_alloc_plain under LD_PRELOAD=libmemtally_glibc.so
  glibcfe0  the same with MEMTALLY_REFRESH_MS=0: no refresh thread, so
            glibc does not take its arena locks as in a threaded process

Start: callgrind's total for `/bin/true` plainly, under jemalloc alone
(LD_PRELOAD=libjemalloc.so.2), under each preload, with and without a
server.

Run:  /usr/bin/python3 bench/insn_per_pair.py --build-dir BUILD
      [--pairs N] [--case alloc_free_16b ...] [--no-server] [--no-start]
Writes bench/results/insn_per_pair.md unless --no-results.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (  # noqa: E402
    SRC_DIR, BenchError, log, machine_info, server_socket, start_server,
    results_path, write_section)

CASES = ["alloc_free_16b", "alloc_free_64kb"]
PAIRS = [("jemalloc", "preload"), ("glibc", "glibcfe", "glibcfe0")]
JEMALLOC_SO = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"


def callgrind_total(argv, env, tmp, callee=None):
    """callgrind's total Ir of the process; with `callee`, also the
    inclusive Ir of all calls to that function (name compression
    understood)."""
    out = os.path.join(tmp, "cg.out")
    r = subprocess.run(["valgrind", "--tool=callgrind",
                        "--callgrind-out-file=" + out] + argv,
                       env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise BenchError("callgrind of %s: exit %d:\n%s"
                         % (" ".join(argv), r.returncode, r.stderr[-2000:]))
    with open(out) as f:
        text = f.read()
    os.unlink(out)
    total = int(re.search(r"^(?:summary|totals): (\d+)", text, re.M)
                .group(1))
    if not callee:
        return total
    names, inc, cfn, want = {}, 0, None, 0
    for line in text.splitlines():
        m = re.match(r"^c?fn=\((\d+)\)(?: (.*))?$", line)
        if m:
            if m.group(2) is not None:
                names[m.group(1)] = m.group(2)
            cfn = names.get(m.group(1)) if line.startswith("cfn") else None
            continue
        if line.startswith("calls="):
            want = cfn == callee
            continue
        if want and line and (line[0].isdigit() or line[0] in "+-*"):
            inc += int(line.split()[1])
            want = False
    return total, inc


def base_env(sock):
    env = dict(os.environ)
    for k in ("LD_PRELOAD", "MEMTALLY_DISABLE", "MEMTALLY_DEBUG",
              "MEMTALLY_ALLOCATOR"):
        env.pop(k, None)
    env["MEMTALLY_SOCKET"] = sock
    return env


def variant_run(build, v, sock):
    b = os.path.join(build, "bench")
    env = base_env(sock)
    if v == "jemalloc":
        return [os.path.join(b, "bench_alloc_je"), "--variant", v], env
    argv = [os.path.join(b, "bench_alloc_plain"), "--variant", v]
    if v == "preload":
        env["LD_PRELOAD"] = os.path.join(build, "client",
                                         "libmemtally_preload.so")
    elif v in ("glibcfe", "glibcfe0"):
        env["LD_PRELOAD"] = os.path.join(build, "client",
                                         "libmemtally_glibc.so")
        if v == "glibcfe0":
            env["MEMTALLY_REFRESH_MS"] = "0"
            argv[-1] = "glibcfe"
    return argv, env


def per_pair(build, sock, tmp, cases, n):
    res = {}
    for case in cases:
        res[case] = {}
        for pair in PAIRS:
            for v in pair:
                argv, env = variant_run(build, v, sock)
                tot, cb = [], []
                for k in (n, 2 * n):
                    t, c = callgrind_total(
                        argv + ["--case", case, "--iters", str(k),
                                "--reps", "1"], env, tmp, "on_activity")
                    tot.append(t)
                    cb.append(c)
                res[case][v] = (tot[1] - tot[0]) / n
                if v == "preload":
                    res[case]["callback"] = (cb[1] - cb[0]) / n
                log("  %-16s %-9s %.1f" % (case, v, res[case][v]))
    return res


def start_costs(build, sock, tmp):
    env = base_env(sock)
    rows = [("plain", None), ("jemalloc alone", JEMALLOC_SO),
            ("preload", os.path.join(build, "client",
                                     "libmemtally_preload.so")),
            ("glibc front end", os.path.join(build, "client",
                                             "libmemtally_glibc.so"))]
    out = {}
    for name, so in rows:
        e = dict(env)
        if so:
            e["LD_PRELOAD"] = so
        out[name] = callgrind_total(["/bin/true"], e, tmp)
        log("  /bin/true %-16s %d" % (name, out[name]))
    return out


def report(info, server_status, n, res, starts):
    L = ["Measured %s on %s (%s CPUs, Linux %s), %s; commit `%s`%s. "
         "%s." % (info["date"], info["cpu_model"], info["nproc"],
                  info["kernel"], info["glibc"], info["commit"],
                  " with uncommitted changes" if info["uncommitted"] else "",
                  server_status), ""]
    L.append("Instructions per malloc+free pair: callgrind, whole worker "
             "process, (Ir(%d pairs) − Ir(%d pairs)) / %d, so start-up "
             "cancels and every instruction a pair causes counts (flushes "
             "and samples included)." % (2 * n, n, n))
    L.append("")
    L.append("| case | jemalloc | preload | Δ preload | preload: activity "
             "callback | glibc | glibc front end | Δ glibc front end | "
             "Δ glibc front end, no refresh thread |")
    L.append("|---|---|---|---|---|---|---|---|---|")
    for case, r in res.items():
        L.append("| `%s` | %.1f | %.1f | %+.1f | %.1f | %.1f | %.1f | %+.1f "
                 "| %+.1f |"
                 % (case, r["jemalloc"], r["preload"],
                    r["preload"] - r["jemalloc"], r["callback"],
                    r["glibc"], r["glibcfe"], r["glibcfe"] - r["glibc"],
                    r["glibcfe0"] - r["glibc"]))
    L.append("")
    L.append("glibc's figures are exact (the same instructions every run); "
             "jemalloc's at 64 KiB are not: extent reuse and decay depend on "
             "heap state and elapsed time, so its Δ moves by hundreds from "
             "run to run. memtally's own part of the preload is the activity "
             "callback's inclusive cost (jemalloc_fe.c's on_activity and "
             "everything it calls), which is exact. The worker is "
             "single-threaded and below MEMTALLY_REFRESH_MIN, so by default "
             "it gets no refresh thread; the last column forbids one "
             "(MEMTALLY_REFRESH_MS=0). A process that has the thread makes "
             "glibc take its arena locks in every call, as any threaded "
             "program does (+25 per 64 KiB pair, inside glibc).")
    if starts:
        L += ["", "Start: callgrind's total for `/bin/true` (one run each; "
              "%s):" % server_status, "",
              "| how | instructions | Δ against jemalloc alone |",
              "|---|---|---|"]
        je = starts["jemalloc alone"]
        for k, v in starts.items():
            L.append("| %s | %d | %+d |" % (k, v, v - je))
    L += ["", "Rerun: `/usr/bin/python3 bench/insn_per_pair.py --build-dir "
          "build` (needs the bench workers, both preloads and memtallyd "
          "built)."]
    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(SRC_DIR, "build"))
    ap.add_argument("--pairs", type=int, default=100_000)
    ap.add_argument("--case", action="append", choices=CASES)
    ap.add_argument("--no-server", action="store_true")
    ap.add_argument("--no-start", action="store_true")
    ap.add_argument("--no-results", action="store_true")
    a = ap.parse_args()
    build = os.path.abspath(a.build_dir)
    info = machine_info()
    with tempfile.TemporaryDirectory(prefix="mt-insn-") as tmp:
        server, status = start_server(build, tmp, not a.no_server)
        sock = server_socket(server, tmp)
        try:
            res = per_pair(build, sock, tmp, a.case or CASES, a.pairs)
            starts = None if a.no_start else start_costs(build, sock, tmp)
        finally:
            if server:
                server.stop()
    text = report(info, status, a.pairs, res, starts)
    print(text)
    if not a.no_results and not a.case:
        write_section(results_path("insn_per_pair"),
                      "insn_per_pair", text)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        log("insn_per_pair: %s" % e)
        sys.exit(1)
