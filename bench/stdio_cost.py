#!/usr/bin/python3
"""stdio_cost: what a single-threaded program pays for memtally's refresh
thread.

A process's first thread switches glibc, for good, to locking every
stdio call and every malloc arena. bench_stdio_worker (stdio_worker.c)
holds --mib MiB, then reads a --size MB file with getc() and times that
loop itself. Variants, in interleaved rounds (round r runs every variant
once, in a rotated order), the worker pinned to one CPU:

  plain          no LD_PRELOAD
  jemalloc       LD_PRELOAD=libjemalloc.so.2 (the baseline)
  preload        the jemalloc preload, memtallyd up, defaults
  preload+thread the same with MEMTALLY_REFRESH_MIN=0: the refresh
                 thread starts at registration, as before the minimum
  glibc          the glibc front end, memtallyd up, defaults
  glibc+thread   the same with MEMTALLY_REFRESH_MIN=0

Proofs, each run: the worker's thread count is 1 exactly where no refresh
thread may start (plain, jemalloc, and the defaults below the minimum)
and 2 where it must (the +thread variants); under a preload memtallyd
lists the worker with at least --mib MiB; the sum of the bytes is the
same in every run.

Run:  /usr/bin/python3 bench/stdio_cost.py --build-dir BUILD
      [--rounds 11] [--mib 16] [--size 100]
Writes bench/results/stdio_cost.md unless --no-results.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (  # noqa: E402
    SRC_DIR, BenchError, log, machine_info, memtally_settled,
    quartiles, start_server, results_path, write_section)

JEMALLOC_SO = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
MIB = 1 << 20


def variants(build):
    lib = os.path.join(build, "client")
    pre = os.path.join(lib, "libmemtally_preload.so")
    gl = os.path.join(lib, "libmemtally_glibc.so")
    # (name, environment, threads the worker must have, counted by memtally)
    return [
        ("plain", {}, 1, False),
        ("jemalloc", {"LD_PRELOAD": JEMALLOC_SO}, 1, False),
        ("preload", {"LD_PRELOAD": pre}, 1, True),
        ("preload+thread", {"LD_PRELOAD": pre,
                            "MEMTALLY_REFRESH_MIN": "0"}, 2, True),
        ("glibc", {"LD_PRELOAD": gl}, 1, True),
        ("glibc+thread", {"LD_PRELOAD": gl,
                          "MEMTALLY_REFRESH_MIN": "0"}, 2, True),
    ]


def run_once(args, v, data, server, cli, cpu):
    name, extra, want_threads, counted = v
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env["MEMTALLY_SOCKET"] = server.socket
    env.update(extra)
    w = subprocess.Popen(
        ["taskset", "-c", str(cpu),
         os.path.join(args.build_dir, "bench", "bench_stdio_worker"),
         str(args.mib), data],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = w.stdout.readline().split()
        f = dict(x.split("=") for x in line)
        if int(f["threads"]) != want_threads:
            raise BenchError("%s: the worker had %s threads, want %d"
                             % (name, f["threads"], want_threads))
        pid = int(f["pid"])
        e = memtally_settled(cli, server.socket, pid, patience=3.0)
        if counted and (not e or e["bytes"] < args.mib * MIB):
            raise BenchError("%s: memtallyd lists the worker with %s"
                             % (name, e))
        if not counted and e:
            raise BenchError("%s: memtallyd lists a worker that runs "
                             "without memtally: %s" % (name, e))
        return int(f["ns"]) / 1e9, int(f["sum"])
    finally:
        try:
            w.stdin.write("exit\n")
            w.stdin.close()
        except OSError:
            pass
        w.wait(30)


def measure(args, tmp):
    data = os.path.join(tmp, "data")
    with open(data, "wb") as f:
        f.write(os.urandom(args.size * 1000 * 1000))
    cpu = max(os.sched_getaffinity(0))
    others = set(os.sched_getaffinity(0)) - {cpu} or None
    server, _ = start_server(args.build_dir, tmp, cpus=others, required=True)
    cli = os.path.join(args.build_dir, "programs", "memtally")
    vs = variants(args.build_dir)
    times = {v[0]: [] for v in vs}
    sums = set()
    try:
        for r in range(args.rounds):
            order = vs[r % len(vs):] + vs[:r % len(vs)]
            for v in order:
                t, s = run_once(args, v, data, server, cli, cpu)
                times[v[0]].append(t)
                sums.add(s)
            log("round %d/%d done" % (r + 1, args.rounds))
    finally:
        server.stop()
    if len(sums) != 1:
        raise BenchError("the runs read different bytes: %s" % sums)
    return vs, times


def report(args, vs, times):
    base = statistics.median(times["jemalloc"])
    info = machine_info()
    lines = [
        "Measured %s on %s (%s CPUs, Linux %s), %s; commit `%s`%s; load "
        "%.2f at the start." % (
            info["date"], info["cpu_model"], info["nproc"], info["kernel"],
            info["glibc"], info["commit"],
            " with uncommitted changes" if info["uncommitted"] else "",
            info["loadavg_start"]),
        "",
        "bench_stdio_worker: holds %d MiB, then reads a %d MB file with "
        "getc() (single-threaded); the loop's own time, %d interleaved "
        "rounds, pinned to one CPU, memtallyd on the others. `+thread`: "
        "MEMTALLY_REFRESH_MIN=0, the refresh thread started at "
        "registration; without it the worker (below 64 MiB) stays "
        "single-threaded. Proved each run: its thread count, and that "
        "memtallyd listed it under a preload (never otherwise)."
        % (args.mib, args.size, args.rounds),
        "",
        "| variant | threads | loop s (median) | quartiles | vs jemalloc |",
        "|---|---|---|---|---|",
    ]
    for name, _, threads, _ in vs:
        q1, m, q3 = quartiles(times[name])
        lines.append("| %s | %d | %.3f | %.3f–%.3f | %+.1f%% |"
                     % (name, threads, m, q1, q3, (m / base - 1) * 100))
    lines += ["", "Rerun: `/usr/bin/python3 bench/stdio_cost.py "
              "--build-dir build` (needs both preloads, memtallyd and the "
              "memtally command built)."]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(SRC_DIR, "build"))
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--size", type=int, default=100, help="MB to read")
    ap.add_argument("--no-results", action="store_true")
    args = ap.parse_args()
    args.build_dir = os.path.abspath(args.build_dir)
    if args.rounds < 2:
        ap.error("--rounds: at least 2 (quartiles)")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            vs, times = measure(args, tmp)
    except BenchError as e:
        print("stdio_cost: PROOF FAILED: %s" % e, file=sys.stderr)
        return 1
    text = report(args, vs, times)
    print(text)
    if not args.no_results:
        write_section(results_path("stdio_cost"),
                      "stdio_cost", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
