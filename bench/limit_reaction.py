#!/usr/bin/python3
"""limit_reaction: how soon memtallyd reports a process `over` its limit
after the process's heap crossed it in 64 KiB blocks, under each preload.

One memtallyd with a per-process limit (`[limits] process`, a config
file; default 16 MiB) and its default 10 ms tick. Each run starts a fresh
bench_limit_worker under a preload, which
  1. holds blocks of 64 KiB up to 2 to 3 blocks below the limit (two
     steps: the process's start bytes are read from the server), and
     flushes;
  2. the driver reads its figure from the server once it is steady
     (counted: the pid is listed, state not `over`, unchanged over two
     ticks), and asks for K blocks, the fewest that take any counting
     (64 KiB or more per block) past the limit, plus one;
  3. the worker mallocs them back to back, each a flush of its own, and
     reports the CLOCK_MONOTONIC time after the last one (T1);
  4. the driver queries the server (ListProcesses, the Python client, in
     a loop) until the pid's state is `over`, at T; reaction = T - T1.
Under glibc, GLIBC_TUNABLES=glibc.malloc.top_pad=0: glibc grows its heap
by what each block needs, so its free memory (which memtally counts too)
stays under a page and the figure crosses the limit when the heap does.
The crossing happened at or before T1, so the figure is an upper bound
of the time from the crossing, less the query's own round trip. It is
also the proof that the worker was counted: the server's figure at `over`
minus the steady one must be the K blocks (K x 64 KiB to K x 64 KiB +
chunk headers, within the error bar).

Run:  /usr/bin/python3 bench/limit_reaction.py --build-dir BUILD
      [--runs 10] [--limit-mib 16] [--worker PATH]
(--worker: a bench_limit_worker from any build: it is not linked to
memtally, so one binary serves builds of different commits.)
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (  # noqa: E402
    SRC_DIR, BenchError, log, machine_info, start_server)

BLOCK = 64 << 10


def client_for(build, socket):
    os.environ.setdefault("MEMTALLY_PB2_DIR", os.path.join(build, "python"))
    sys.path.insert(0, os.path.join(SRC_DIR, "python"))
    from memtally.client import Client
    import memtally_pb2 as pb
    return Client(socket), pb


def proc(cl, pid):
    for p in cl.processes():
        if p.pid == pid:
            return p
    return None


def steady(cl, pb, pid, deadline):
    """The pid's figure once two ticks left it unchanged."""
    last, since = None, 0
    while time.monotonic() < deadline:
        p = proc(cl, pid)
        if p is not None and p.state != pb.STATE_OVER:
            if last is not None and p.bytes == last:
                if time.monotonic() - since >= 0.025:
                    return p
            else:
                last, since = p.bytes, time.monotonic()
        time.sleep(0.002)
    raise BenchError("pid %d never steady below its limit" % pid)


def one_run(cl, pb, worker, env, want, limit):
    w = subprocess.Popen([worker], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, bufsize=1,
                         env=env)
    try:
        ready = w.stdout.readline().split()
        if len(ready) < 2 or want not in " ".join(ready[1:]):
            raise BenchError("worker allocator %r, wanted %s" % (ready, want))
        # 1 MiB below the limit, whatever the process's start counts;
        # then 2 to 3 blocks below it.
        n = (limit - (1 << 20)) // BLOCK
        for _ in range(2):
            w.stdin.write("hold %d\n" % n)
            w.stdin.flush()
            w.stdout.readline()
            p0 = steady(cl, pb, w.pid, time.monotonic() + 10)
            if p0.bytes >= limit:
                raise BenchError("start %d already past the limit"
                                 % p0.bytes)
            n += (limit - p0.bytes) // BLOCK - 2
        k = (limit - p0.bytes) // BLOCK + 1
        w.stdin.write("burst %d\n" % k)
        w.stdin.flush()
        words = w.stdout.readline().split()
        t0, t1 = int(words[1]), int(words[2])
        deadline = time.monotonic() + 5
        while True:
            p = proc(cl, w.pid)
            t = time.monotonic_ns()
            if p is not None and p.state == pb.STATE_OVER:
                break
            if time.monotonic() > deadline:
                raise BenchError("pid %d not over 5 s after %d blocks: "
                                 "%d -> %s" % (w.pid, k, p0.bytes, p))
        grew = p.bytes - p0.bytes
        counted = (k * BLOCK - p.error_bytes <= grew <=
                   k * (BLOCK + 64) + p.error_bytes + (256 << 10))
        if not counted or p.bytes < limit:
            raise BenchError("pid %d: grew %d for %d blocks (error bar %d),"
                             " %d vs limit %d" % (w.pid, grew, k,
                                                  p.error_bytes, p.bytes,
                                                  limit))
        return {"ms": (t - t1) / 1e6, "burst_us": (t1 - t0) / 1e3,
                "blocks": k, "grew": grew, "start": p0.bytes,
                "at_over": p.bytes, "over_limit": p.over_limit}
    finally:
        try:
            w.stdin.close()
        except OSError:
            pass
        w.wait(5)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(SRC_DIR, "build"))
    ap.add_argument("--worker", default=None)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--limit-mib", type=int, default=16)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    build = os.path.abspath(a.build_dir)
    worker = a.worker or os.path.join(build, "bench", "bench_limit_worker")
    limit = a.limit_mib << 20
    info = machine_info()
    res = {}
    with tempfile.TemporaryDirectory(prefix="mt-limit-") as tmp:
        conf = os.path.join(tmp, "memtallyd.conf")
        with open(conf, "w") as f:
            f.write("[limits]\nprocess = %dMiB\n" % a.limit_mib)
        server, _ = start_server(build, tmp, extra_args=("--config", conf),
                                 required=True)
        try:
            cl, pb = client_for(build, server.socket)
            for name, lib, want in (
                    ("jemalloc preload", "libmemtally_preload.so",
                     "jemalloc"),
                    ("glibc front end", "libmemtally_glibc.so", "glibc")):
                env = dict(os.environ)
                env["LD_PRELOAD"] = os.path.join(build, "client", lib)
                env["MEMTALLY_SOCKET"] = server.socket
                env.pop("MEMTALLY_GROUP", None)
                # glibc grows its heap by exactly what a block needs: what
                # it holds free (counted too) stays under a page, so the
                # figure crosses when the heap does.
                env["GLIBC_TUNABLES"] = "glibc.malloc.top_pad=0"
                runs = [one_run(cl, pb, worker, env, want, limit)
                        for _ in range(a.runs)]
                res[name] = runs
                ms = [r["ms"] for r in runs]
                log("  %-16s %s ms" % (name, " ".join("%.2f" % x
                                                      for x in ms)))
        finally:
            server.stop()
    print("%s: %s, build %s (driver at commit %s); memtallyd tick 10 ms, "
          "process limit %d MiB, %d runs each"
          % (a.label or "limit_reaction", info["date"], build,
             info["commit"], a.limit_mib, a.runs))
    print()
    print("| preload | median ms | min | quartiles | max | burst µs "
          "(median) | blocks | server's growth / blocks x 64 KiB |")
    print("|---|---|---|---|---|---|---|---|")
    for name, runs in res.items():
        ms = sorted(r["ms"] for r in runs)
        q = statistics.quantiles(ms, n=4, method="inclusive")
        g = statistics.median(r["grew"] / (r["blocks"] * BLOCK)
                              for r in runs)
        print("| %s | %.2f | %.2f | %.2f-%.2f | %.2f | %.0f | %d | %.4f |"
              % (name, statistics.median(ms), ms[0], q[0], q[2], ms[-1],
                 statistics.median(r["burst_us"] for r in runs),
                 runs[0]["blocks"], g))


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        log("limit_reaction: %s" % e)
        sys.exit(1)
