#!/usr/bin/python3
"""start_cost: what the preload costs processes that live a millisecond.

Two workloads, each run under every variant in interleaved rounds (round
r runs every variant once, in a rotated order), so the shared machine's
drift falls on all variants alike:

  true   `/bin/true` spawned N times one after another (posix_spawn +
         waitpid from this driver; no shell): wall time per process.
  make   `make -j2` of 200 generated C files (a few functions each) and
         the link of a program from them, LD_PRELOAD exported to make, so
         make, the shells it starts, gcc, cc1, as, collect2 and ld all run
         under it: wall time, and the CPU time of all of them (user+sys).

Variants:
  plain      no LD_PRELOAD
  jemalloc   LD_PRELOAD=libjemalloc.so.2 (jemalloc alone: the baseline)
  preload    LD_PRELOAD=libmemtally_preload.so, memtallyd up
  no-server  the preload, nobody listening on MEMTALLY_SOCKET
  NAME=PATH  (--extra, repeatable) another build of the preload, memtallyd
             up: e.g. the commit before a change

Instructions: callgrind's total for one `/bin/true` of each variant
(perf stat -e instructions is not available on the guests this runs on).

Proofs, before anything is timed: under each variant `/bin/true` with
MALLOC_CONF=stats_print:true prints jemalloc's statistics exactly when the
variant is jemalloc (so jemalloc really serves malloc), and a `cat
/proc/self/maps` maps exactly the variant's library. A python3 that
allocates 1 MiB under a preload variant with the server up is listed by
memtallyd (/metrics), under any other variant not; during the timed runs
memtallyd's registrations are counted (the preload registers a process at
its first flush once the process has lived 10 ms or published 1 MiB, so
a `/bin/true` is not registered; make's cc1s are), and its live processes fall back to zero after each
batch.

Run:  /usr/bin/python3 bench/start_cost.py --build-dir BUILD
      [--rounds R] [--n N] [--files F] [--no-make] [--extra NAME=PATH]
Writes bench/results/start_cost.md unless --no-results.
"""

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (  # noqa: E402
    SRC_DIR, BenchError, cachegrind_total, log, machine_info,
    median_ci, quartiles, start_server, results_path, write_section)

JEMALLOC_SO = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
TRUE = "/bin/true"


# ---- variants ----------------------------------------------------------------


class Variant:
    def __init__(self, name, lib, server):
        self.name = name
        self.lib = lib          # LD_PRELOAD, or None
        self.server = server    # memtallyd up for it

    def env(self, base, sock, dead_sock):
        e = dict(base)
        for k in ("LD_PRELOAD", "MALLOC_CONF", "MEMTALLY_SOCKET",
                  "MEMTALLY_DEBUG", "MEMTALLY_DISABLE", "MEMTALLY_ALLOCATOR"):
            e.pop(k, None)
        if self.lib:
            e["LD_PRELOAD"] = self.lib
        e["MEMTALLY_SOCKET"] = sock if self.server else dead_sock
        return e

    @property
    def counts(self):
        """Whether its processes register (a preload with memtallyd up)."""
        return self.server and self.lib and "jemalloc.so" not in self.lib


def prove(v, env):
    """jemalloc serves malloc exactly under a jemalloc variant, and the
    variant's library is the one mapped."""
    e = dict(env, MALLOC_CONF="stats_print:true")
    r = subprocess.run([TRUE], env=e, capture_output=True, text=True)
    stats = "jemalloc statistics" in r.stderr
    if stats != bool(v.lib):
        raise BenchError("PROOF FAILED for %s: jemalloc statistics %s"
                         % (v.name, "printed" if stats else "missing"))
    maps = subprocess.run(["cat", "/proc/self/maps"], env=env,
                          capture_output=True, text=True).stdout
    if v.lib and os.path.realpath(v.lib) not in maps and v.lib not in maps:
        raise BenchError("PROOF FAILED for %s: %s is not mapped"
                         % (v.name, v.lib))
    for other in ("libjemalloc.so", "libmemtally_preload.so"):
        if not v.lib and other in maps:
            raise BenchError("PROOF FAILED for plain: %s is mapped" % other)


def prove_registers(v, env, metrics):
    """A process of a counting variant that allocates and lives a while
    is registered (memtallyd lists it); one of any other variant is not.
    (The preload registers at a flush once a process has lived 10 ms or
    published 1 MiB.)"""
    p = subprocess.Popen(
        ["/usr/bin/python3", "-S", "-c",
         "import time; b = bytearray(1 << 20); time.sleep(0.5)"],
        env=dict(env, MEMTALLY_ALLOCATOR="jemalloc"))
    try:
        deadline = time.monotonic() + 5
        seen = 0
        while time.monotonic() < deadline and p.poll() is None:
            seen = max(seen, metrics.read()["processes"])
            if seen and v.counts:
                break
            time.sleep(0.01)
    finally:
        p.wait()
    if bool(seen) != bool(v.counts):
        raise BenchError("PROOF FAILED for %s: memtallyd listed %d "
                         "processes for a python3 under it" % (v.name, seen))
    metrics.settle("python3 under %s" % v.name)


# ---- memtallyd's own count -----------------------------------------------------


class Metrics:
    def __init__(self, port):
        self.url = "http://127.0.0.1:%d/metrics" % port

    def read(self):
        text = urllib.request.urlopen(self.url, timeout=5).read().decode()
        def val(name):
            m = re.search(r"^%s(?:\{[^}]*\})? (\d+)" % name, text, re.M)
            return int(m.group(1)) if m else 0
        return {"registrations": val("memtally_registrations_total"),
                "processes": val("memtally_processes")}

    def settle(self, what):
        """Live processes back to zero: every process of the batch that
        registered was dropped when it exited."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            m = self.read()
            if m["processes"] == 0:
                return m
            time.sleep(0.02)
        raise BenchError("%s: memtallyd still lists %d processes"
                         % (what, m["processes"]))


# ---- workloads ----------------------------------------------------------------


def proc_cpu(pid):
    """CPU time (user+sys, seconds) a live process has used."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_true(env, n):
    """Wall and CPU time (user+sys of the processes themselves, not of
    memtallyd) per process."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    for _ in range(n):
        pid = os.posix_spawn(TRUE, ["true"], env)
        os.waitpid(pid, 0)
    wall = (time.monotonic() - t0) / n
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = ((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)) / n
    return wall, cpu


def make_project(d, files):
    os.makedirs(d, exist_ok=True)
    objs = []
    for i in range(files):
        with open(os.path.join(d, "f%03d.c" % i), "w") as f:
            f.write("#include <string.h>\n#include <stdlib.h>\n")
            for k in range(4):
                f.write(
                    "int f%d_%d(const char *s, int n)\n{\n"
                    "\tint h = %d;\n\tsize_t len = strlen(s);\n"
                    "\tfor (size_t j = 0; j < len; j++)\n"
                    "\t\th = h * 31 + s[j] + n;\n"
                    "\tchar *b = malloc(len + 1);\n"
                    "\tif (b) { memcpy(b, s, len + 1); h ^= b[0]; "
                    "free(b); }\n\treturn h;\n}\n" % (i, k, i * 7 + k))
        objs.append("f%03d.o" % i)
    with open(os.path.join(d, "main.c"), "w") as f:
        f.write("int f0_0(const char *, int);\n"
                "int main(void) { return f0_0(\"x\", 1) == 42; }\n")
    with open(os.path.join(d, "Makefile"), "w") as f:
        f.write("CFLAGS = -O1\nOBJS = main.o %s\n"
                "prog: $(OBJS)\n\t$(CC) -o $@ $(OBJS)\n"
                "%%.o: %%.c\n\t$(CC) $(CFLAGS) -c $< -o $@\n"
                "clean:\n\trm -f prog *.o\n" % " ".join(objs))


def run_make(env, d):
    subprocess.run(["make", "-s", "clean"], cwd=d, check=True,
                   stdout=subprocess.DEVNULL)
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    p = subprocess.run(["make", "-s", "-j2", "prog"], cwd=d, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True)
    wall = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0 or not os.path.exists(os.path.join(d, "prog")):
        raise BenchError("make failed: %s" % p.stderr[-1000:])
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return wall, cpu


def callgrind_true(env, tmp):
    out = os.path.join(tmp, "cg.out")
    r = subprocess.run(["valgrind", "--tool=callgrind",
                        "--callgrind-out-file=" + out, TRUE],
                       env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise BenchError("callgrind of /bin/true: %s" % r.stderr[-1000:])
    with open(out) as f:
        total = int(re.search(r"^(?:summary|totals): (\d+)", f.read(),
                              re.M).group(1))
    os.unlink(out)
    return total


# ---- the run -------------------------------------------------------------------


def fmt_row(name, xs, base, unit_scale, unit):
    q1, med, q3 = quartiles(xs)
    rel = "" if base is None else "%+.1f%%" % ((med / base - 1) * 100)
    return "| %s | %.3f | %.3f–%.3f | %s |" % (
        name, med * unit_scale, q1 * unit_scale, q3 * unit_scale,
        rel or "—") + ("" if unit else "")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(SRC_DIR, "build"))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--n", type=int, default=1000,
                    help="/bin/true runs per variant and round")
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--make-rounds", type=int, default=5)
    ap.add_argument("--no-make", action="store_true")
    ap.add_argument("--insn-files", type=int, default=20,
                    help="C files of the make counted by cachegrind")
    ap.add_argument("--no-instructions", action="store_true")
    ap.add_argument("--extra", action="append", default=[],
                    metavar="NAME=PATH")
    ap.add_argument("--no-results", action="store_true")
    args = ap.parse_args()
    if args.rounds < 2 or args.make_rounds < 2:
        ap.error("--rounds and --make-rounds: at least 2 (quartiles)")
    # Absolute: make runs its processes in the project's directory, where
    # a relative LD_PRELOAD names nothing.
    args.build_dir = os.path.abspath(args.build_dir)
    return args


def make_variants(args):
    preload = os.path.join(args.build_dir, "client",
                           "libmemtally_preload.so")
    for p in (preload, JEMALLOC_SO):
        if not os.path.exists(p):
            raise BenchError("%s missing" % p)
    variants = [Variant("plain", None, False),
                Variant("jemalloc", JEMALLOC_SO, False),
                Variant("preload", preload, True),
                Variant("no-server", preload, False)]
    for e in args.extra:
        name, path = e.split("=", 1)
        variants.append(Variant(name, os.path.abspath(path), True))
    return variants


def rotated(xs, r):
    """Round r's order: the variants interleaved, each first in turn."""
    return xs[r % len(xs):] + xs[:r % len(xs)]


def measure_true(args, variants, envs, metrics, srv):
    """/bin/true, n runs per variant and round: {"wall", "cpu", "srv_cpu",
    "regs"}, each {variant: [one per round]}, per process."""
    t = {k: {v.name: [] for v in variants}
         for k in ("wall", "cpu", "srv_cpu", "regs")}
    log("true: %d rounds of %d runs per variant" % (args.rounds, args.n))
    for r in range(args.rounds):
        for v in rotated(variants, r):
            m0 = metrics.read()["registrations"]
            s0 = proc_cpu(srv.proc.pid)
            w, c = run_true(envs[v.name], args.n)
            m1 = metrics.settle("true under %s" % v.name)
            t["wall"][v.name].append(w)
            t["cpu"][v.name].append(c)
            t["srv_cpu"][v.name].append((proc_cpu(srv.proc.pid) - s0) /
                                        args.n)
            got = m1["registrations"] - m0
            if got > args.n or (got and not v.counts):
                raise BenchError(
                    "PROOF FAILED for %s: %d registrations for %d "
                    "processes" % (v.name, got, args.n))
            t["regs"][v.name].append(got)
        log("  round %d: %s" % (r + 1, " ".join(
            "%s %.3f" % (k, x[-1] * 1e3) for k, x in t["wall"].items())))
    return t


def measure_make(args, variants, envs, metrics, srv, tmp):
    """make -j2 of the generated project: (wall, cpu, srv_cpu), each
    {variant: [one per round]}, srv_cpu being memtallyd's CPU during the
    build; wall also has "VARIANT#regs", the registrations."""
    mk_wall = {v.name: [] for v in variants}
    mk_cpu = {v.name: [] for v in variants}
    mk_srv = {v.name: [] for v in variants}
    d = os.path.join(tmp, "proj")
    make_project(d, args.files)
    run_make(envs["plain"], d)  # warm the page cache
    log("make: %d rounds" % args.make_rounds)
    for r in range(args.make_rounds):
        for v in rotated(variants, r):
            m0 = metrics.read()["registrations"]
            s0 = proc_cpu(srv.proc.pid)
            w, c = run_make(envs[v.name], d)
            m1 = metrics.settle("make under %s" % v.name)
            mk_srv[v.name].append(proc_cpu(srv.proc.pid) - s0)
            if (m1["registrations"] - m0 > 0) != bool(v.counts):
                raise BenchError(
                    "PROOF FAILED for make under %s: %d "
                    "registrations" % (v.name, m1["registrations"] - m0))
            mk_wall[v.name].append(w)
            mk_cpu[v.name].append(c)
            mk_wall[v.name + "#regs"] = (
                mk_wall.get(v.name + "#regs", []) +
                [m1["registrations"] - m0])
        log("  round %d: %s" % (r + 1, " ".join(
            "%s %.2f" % (v.name, mk_wall[v.name][-1])
            for v in variants)))
    return mk_wall, mk_cpu, mk_srv


def make_instructions(args, variants, envs, tmp):
    """Instructions of a make of --insn-files files, per variant."""
    mk_insn = {}
    d = os.path.join(tmp, "proj-insn")
    make_project(d, args.insn_files)
    for v in variants:
        if v.name == "no-server":
            continue
        subprocess.run(["make", "-s", "clean"], cwd=d, check=True,
                       stdout=subprocess.DEVNULL)
        mk_insn[v.name] = cachegrind_total(
            ["make", "-s", "-j2", "-C", d, "prog"], None, envs[v.name],
            os.path.join(tmp, "cg-make-" + v.name),
            "make under " + v.name)
    return mk_insn


def report_true(args, info, variants, t, insns):
    wall, cpu, srv_cpu, regs = t["wall"], t["cpu"], t["srv_cpu"], t["regs"]
    lines = []
    lines.append("Machine: %s, %s cores, kernel %s, glibc %s; commit %s%s; "
                 "%s; load %.2f at start." % (
                     info["cpu_model"], info["nproc"], info["kernel"],
                     info["glibc"], info["commit"],
                     " (uncommitted changes)" if info["uncommitted"] else "",
                     info["date"], info["loadavg_start"]))
    lines.append("")
    lines.append("`/bin/true`, %d runs per variant in each of %d interleaved "
                 "rounds; wall time per process (median of the rounds, "
                 "quartiles; and the median of the per-round ratios to "
                 "jemalloc alone, with its 95%% interval), its CPU time (user+sys of the process itself; "
                 "median) and memtallyd's per process, against jemalloc alone; "
                 "instructions: callgrind, one run." % (args.n, args.rounds))
    lines.append("")
    lines.append("| variant | ms per process | quartiles | vs jemalloc "
                 "| per round vs jemalloc [95% interval] "
                 "| CPU ms | vs jemalloc | memtallyd CPU ms | instructions "
                 "| vs jemalloc | registered (median) |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
    jc = statistics.median(cpu["jemalloc"])
    jw = statistics.median(wall["jemalloc"])
    ji = insns.get("jemalloc")
    for v in variants:
        q1, med, q3 = quartiles(wall[v.name])
        ins = insns.get(v.name)
        c = statistics.median(cpu[v.name])
        lines.append("| %s | %.3f | %.3f–%.3f | %+.1f%% "
                     "| %s | %.3f | %+.1f%% "
                     "| %.3f | %s | %s | %s |"
                     % (v.name, med * 1e3, q1 * 1e3, q3 * 1e3,
                        (med / jw - 1) * 100,
                        round_ratio(wall[v.name], wall["jemalloc"]),
                        c * 1e3, (c / jc - 1) * 100,
                        statistics.median(srv_cpu[v.name]) * 1e3,
                        "{:,}".format(ins) if ins else "—",
                        "{:+,}".format(ins - ji) if ins and ji else "—",
                        "%d of %d" % (statistics.median(regs[v.name]),
                                      args.n) if v.counts else "—"))
    return lines


def round_ratio(xs, base):
    """The median of the per-round ratios of `xs` to `base` (each round
    ran every variant back to back, so the drift between rounds cancels)
    and its 95% interval, as a percentage against the base."""
    lo, rm, hi = median_ci([x / y for x, y in zip(xs, base)])
    return "%+.1f%% [%+.1f%% to %+.1f%%]" % (
        (rm - 1) * 100, (lo - 1) * 100, (hi - 1) * 100)


def report_make(args, variants, mk_wall, mk_cpu, mk_srv):
    lines = []
    lines.append("")
    lines.append("`make -j2` of %d generated C files and their link, "
                 "LD_PRELOAD exported to make, %d interleaved rounds; "
                 "wall and CPU (user+sys of make and everything it ran) "
                 "per build, medians and quartiles; memtallyd's CPU during "
                 "the build (it runs through every variant, so this is "
                 "its ticks alone where nothing registers), and the CPU "
                 "of the build and, for a variant that counts, "
                 "memtallyd's together, per round against the build's "
                 "under jemalloc alone: what the node pays." % (
                     args.files, args.make_rounds))
    lines.append("")
    lines.append("| variant | wall s | quartiles | vs plain | vs "
                 "jemalloc | per round vs jemalloc [95% interval] "
                 "| CPU s | vs plain | vs jemalloc | "
                 "per round vs jemalloc [95% interval] | memtallyd CPU s "
                 "| CPU with memtallyd's, per round vs jemalloc "
                 "[95% interval] | registrations |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    pw = statistics.median(mk_wall["plain"])
    jw = statistics.median(mk_wall["jemalloc"])
    pc = statistics.median(mk_cpu["plain"])
    jc = statistics.median(mk_cpu["jemalloc"])
    for v in variants:
        q1, med, q3 = quartiles(mk_wall[v.name])
        c = statistics.median(mk_cpu[v.name])
        regs = mk_wall.get(v.name + "#regs")
        node = ([c + s for c, s in zip(mk_cpu[v.name], mk_srv[v.name])]
                if v.counts else mk_cpu[v.name])
        lines.append(
            "| %s | %.2f | %.2f–%.2f | %+.1f%% | %+.1f%% | %s | %.2f | "
            "%+.1f%% | %+.1f%% | %s | %.3f | %s | %s |" % (
                v.name, med, q1, q3, (med / pw - 1) * 100,
                (med / jw - 1) * 100,
                round_ratio(mk_wall[v.name], mk_wall["jemalloc"]),
                c, (c / pc - 1) * 100, (c / jc - 1) * 100,
                round_ratio(mk_cpu[v.name], mk_cpu["jemalloc"]),
                statistics.median(mk_srv[v.name]),
                round_ratio(node, mk_cpu["jemalloc"]),
                statistics.median(regs) if regs else "—"))
    return lines


def report_make_insn(args, mk_insn):
    lines = []
    lines.append("")
    lines.append("Instructions of a `make -j2` of %d of those files "
                 "(cachegrind, make and every process it ran, one run "
                 "each):" % args.insn_files)
    lines.append("")
    lines.append("| variant | instructions | vs plain | vs jemalloc |")
    lines.append("|---|---|---|---|")
    for name, n in mk_insn.items():
        lines.append("| %s | {:,} | %+.2f%% | %+.2f%% |".format(n) % (
            name, (n / mk_insn["plain"] - 1) * 100,
            (n / mk_insn["jemalloc"] - 1) * 100))
    return lines


def main():
    args = parse_args()
    variants = make_variants(args)
    info = machine_info()
    tmp = tempfile.mkdtemp(prefix="mt-startcost-")
    port = 20000 + os.getpid() % 20000
    srv, _ = start_server(args.build_dir, tmp, required=True,
                          extra_args=["--metrics", "127.0.0.1:%d" % port])
    metrics = Metrics(port)
    dead = os.path.join(tmp, "nobody.sock")
    base = dict(os.environ)
    envs = {v.name: v.env(base, srv.socket, dead) for v in variants}
    insns, mk_wall, mk_cpu, mk_insn = {}, {}, {}, {}
    try:
        for v in variants:
            prove(v, envs[v.name])
        metrics.settle("before the run")
        for v in variants:
            prove_registers(v, envs[v.name], metrics)
        t = measure_true(args, variants, envs, metrics, srv)
        if not args.no_instructions and shutil.which("valgrind"):
            for v in variants:
                insns[v.name] = callgrind_true(envs[v.name], tmp)
        if not args.no_make:
            mk_wall, mk_cpu, mk_srv = measure_make(args, variants, envs,
                                                   metrics, srv, tmp)
            if insns:
                mk_insn = make_instructions(args, variants, envs, tmp)
    finally:
        srv.stop()

    lines = report_true(args, info, variants, t, insns)
    if not args.no_make:
        lines += report_make(args, variants, mk_wall, mk_cpu, mk_srv)
    if mk_insn:
        lines += report_make_insn(args, mk_insn)
    lines.append("")
    lines.append("Rerun: `/usr/bin/python3 bench/start_cost.py --build-dir "
                 "build` (needs the preload and memtallyd built, gcc, make).")
    text = "\n".join(lines)
    print(text)
    if not args.no_results:
        write_section(results_path("start_cost"),
                      "start_cost", text)


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        log(str(e))
        sys.exit(1)
