#!/usr/bin/python3
"""frontends: what each preload costs a real program, against the same
program without any preload, and how much of its memory it counts.

Variants (each with a real memtallyd running, so the process registers):
  plain    the program as installed (glibc's malloc), no preload: the base
  preload  LD_PRELOAD=libmemtally_preload.so: jemalloc, counted by memtally
  glibc    LD_PRELOAD=libmemtally_glibc.so (MEMTALLY_ALLOCATOR=glibc): the
           program's own glibc malloc, counted by memtally
Both preloads also count the memory the program maps itself (`mapped`).

Programs: /usr/bin/python3 with bench/programs.py's workload (JSON, bytes,
bytearray), /usr/bin/python3 with a small-object workload (a million
tuples, strings and dicts of at most 512 bytes built, dropped and
collected twice), and g++ -O2 -c of programs.py's C++ unit (driver, cc1plus,
as). Targets: python3 within 3% of plain python3's speed; accounted >= 90%
of its anonymous RSS.

Timing: whole processes pinned to one CPU, interleaved (ABC CBA ...),
--reps per variant after a warm-up; CPU = user + sys of the child and its
children (wait4). Instructions: cachegrind --cache-sim=no, once per
variant (children traced). Accounted against RSS: a held run per preload:
python3 holds its objects (small objects: the million; real workload: its
64 MiB of bytes after the work) and memtally's figure for it is set
against its RssAnon (/proc/PID/status) at that moment; for g++, the peaks
of memtally's figure and of RssAnon of cc1plus, polled every ~5 ms.

Run: /usr/bin/python3 bench/frontends.py --build-dir BUILD [--reps N]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (  # noqa: E402
    SRC_DIR, BenchError, harness, log, machine_info, mann_whitney_p,
    memtally_ps, memtally_settled, quartiles, cachegrind_total,
    start_server, results_path, write_section)
# The programs and workloads are programs.py's, which real.py runs too, so
# that both suites run the very same python3 and g++ work.
import programs  # noqa: E402
VARIANTS = ["plain", "preload", "glibc"]
PY = "/usr/bin/python3"

SMALL_SCRIPT = r'''
import gc, sys
def anon():
    with open("/proc/self/status") as f:
        for l in f:
            if l.startswith("RssAnon:"):
                return int(l.split()[1]) * 1024
n = int(sys.argv[1])
for rnd in range(2):
    held = [(i, "s%07d" % i, {"k": i, "v": [i]}) for i in range(n)]
    if rnd == 1 and len(sys.argv) > 2:
        print("MT-HELD", anon(), flush=True)
        sys.stdin.readline()
    del held
    gc.collect()
'''


class Small(programs.Program):
    name = "python3 small objects"
    exe = PY

    def script(self, tmp):
        path = os.path.join(tmp, "small.py")
        with open(path, "w") as f:
            f.write(SMALL_SCRIPT)
        return path

    def timed(self, tmp, scale):
        return [self.exe, self.script(tmp), str(int(1000000 * scale))], None

    def held(self, tmp, scale):
        return [self.exe, self.script(tmp), str(int(1000000 * scale)),
                "--hold"]


class RealPy(programs.Python):
    name = "python3 real.py"

    def held(self, tmp, scale):
        argv, _ = super().held(tmp, scale)
        return argv


PROGRAMS = [RealPy(), Small(), programs.Gxx()]


def env_of(variant, paths, server):
    env = dict(os.environ)
    for k in ("LD_PRELOAD", "MALLOC_CONF", "PYTHONMALLOC",
              "GLIBC_TUNABLES", "MEMTALLY_DISABLE"):
        env.pop(k, None)
    env["MEMTALLY_SOCKET"] = server.socket
    if variant != "plain":
        env["LD_PRELOAD"] = paths[variant]
    # Each variant is the front end it names: without the variable a
    # python3 under the jemalloc preload would keep glibc's malloc.
    env["MEMTALLY_ALLOCATOR"] = "jemalloc" if variant == "preload" else \
        "glibc"
    env.pop("MEMTALLY_ALLOCATOR_SWITCHED", None)
    return env


def timed_run(prog, variant, paths, server, tmp, scale, cpu):
    argv, stdin_path = prog.timed(tmp, scale)
    stdin = open(stdin_path) if stdin_path else subprocess.DEVNULL
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, env=env_of(variant, paths,
                                                            server),
                         preexec_fn=programs.pin(cpu))
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise BenchError("%s under %s failed: %s" % (prog.name, variant,
                                                      err[-1000:]))
    return {"wall": wall, "cpu": ru.ru_utime + ru.ru_stime,
            "sys": ru.ru_stime, "minflt": ru.ru_minflt}


def instructions(prog, variant, paths, server, tmp, scale):
    argv, stdin_path = prog.timed(tmp, scale)
    out = os.path.join(tmp, "cg")
    shutil.rmtree(out, ignore_errors=True)
    env = env_of(variant, paths, server)
    env["PYTHONHASHSEED"] = "0"
    return cachegrind_total(argv, stdin_path, env, out, "%s %s" % (
        prog.name, variant))


def anon_or_none(paths, pid):
    """pid's RssAnon, or None once it has exited (a watched cc1plus
    may end between the listing and the read)."""
    try:
        return harness(paths["build"]).rss_anon(pid)
    except (OSError, AssertionError):
        return None


def allocator_of(pid):
    """jemalloc when a libjemalloc or the jemalloc preload (which links
    jemalloc in) is mapped, else glibc; from /proc/PID/maps."""
    with open("/proc/%d/maps" % pid) as f:
        maps = f.read()
    je = "libjemalloc" in maps or "libmemtally_preload" in maps
    return ("jemalloc" if je else "glibc",
            "libmemtally_glibc" in maps, "libmemtally_preload" in maps)


def held(prog, variant, paths, server, tmp):
    """memtally's figure (bytes, mapped) against RssAnon while held."""
    env = env_of(variant, paths, server)
    argv = prog.held(tmp, 1.0)
    p = subprocess.Popen(argv, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         env=env, text=True)
    try:
        if isinstance(prog, RealPy):
            while "MT-BASE" not in p.stdout.readline():
                pass
            p.stdin.write("go\n")
            p.stdin.flush()
        while True:
            line = p.stdout.readline()
            if not line:
                raise BenchError("%s ended before holding" % prog.name)
            if line.startswith("MT-HELD"):
                break
        e = memtally_settled(paths["cli"], server.socket, p.pid)
        if not e:
            raise BenchError("%s under %s: never registered with memtallyd"
                             % (prog.name, variant))
        anon = anon_or_none(paths, p.pid)
        alloc = allocator_of(p.pid)
        front = alloc[2] if variant == "preload" else alloc[1]
        if not front:
            raise BenchError("%s under %s: the front end's library is not "
                             "mapped" % (prog.name, variant))
        return {"bytes": e["bytes"], "mapped": e["mapped"],
                "free": e.get("allocator_free", 0), "anon": anon,
                "allocator": alloc[0]}
    finally:
        p.stdin.close()
        p.wait()


def watched(prog, variant, paths, server, tmp):
    """g++: peaks of memtally's figure and of RssAnon for cc1plus."""
    argv, _ = prog.timed(tmp, 1.0)
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL,
                         env=env_of(variant, paths, server))
    peak_b = peak_m = peak_f = peak_a = 0
    # cc1plus's allocator, from its maps while it ran: read until the
    # front end's library is seen (just after its exec, the loader has
    # mapped nothing yet).
    seen = None
    lib = 2 if variant == "preload" else 1
    while p.poll() is None:
        for pid in programs.descendants(p.pid):
            if programs.comm_of(pid) != "cc1plus":
                continue
            try:
                if seen is None or not seen[lib]:
                    seen = allocator_of(pid)
            except OSError:
                pass  # gone meanwhile: the next one is read
            a = anon_or_none(paths, pid) or 0
            peak_a = max(peak_a, a)
            e = memtally_ps(paths["cli"], server.socket,
                            strict=False).get(pid)
            if e:
                peak_b = max(peak_b, e["bytes"])
                peak_m = max(peak_m, e["mapped"])
                peak_f = max(peak_f, e.get("allocator_free", 0))
        time.sleep(0.005)
    # Proof of what ran: cc1plus seen with the front end's library mapped
    # (its allocator read from its maps, not assumed from the variant),
    # and memtally's figure moved.
    if seen is None:
        raise BenchError("g++ under %s: cc1plus never seen" % variant)
    if not seen[lib]:
        raise BenchError("g++ under %s: cc1plus without the front end's "
                         "library" % variant)
    if peak_b <= 0:
        raise BenchError("g++ under %s: memtally never counted cc1plus"
                         % variant)
    return {"bytes": peak_b, "mapped": peak_m, "free": peak_f,
            "anon": peak_a, "allocator": seen[0]}


def mib(x):
    return "%.1f MiB" % (x / 1048576.0)


def report(info, results, reps, cpu, build, build_type):
    L = ["## frontends (each preload against the same program "
         "without one)", ""]
    L.append("Measured %s on %s (%d CPUs, Linux %s), %s; commit `%s`%s. "
             "Load average (1 min) %.2f at the start, %.2f at the end: the "
             "machine is shared, compare within a row." % (
                 info["date"], info["cpu_model"], info["nproc"],
                 info["kernel"], info["glibc"], info["commit"],
                 " with uncommitted changes" if info["uncommitted"] else "",
                 info["loadavg_start"], info["loadavg_end"]))
    L.append("")
    L.append("`plain`: the program as installed (glibc malloc, no preload); "
             "`preload`: `LD_PRELOAD=libmemtally_preload.so` (jemalloc); "
             "`glibc`: `LD_PRELOAD=libmemtally_glibc.so` "
             "(MEMTALLY_ALLOCATOR=glibc). A memtallyd runs throughout and "
             "each preloaded process registers. %d runs per variant after a "
             "warm-up, interleaved, pinned to CPU %s; cells: median [Q1–Q3] "
             "seconds; rel: throughput relative to plain (ratio of medians); "
             "p: Mann-Whitney U against plain. Instructions: cachegrind, "
             "one run each, children included, the python3 workloads at a "
             "quarter of their timed size (g++: the same compile)."
             % (reps, cpu))
    L.append("")
    L.append("| program | variant | wall s | CPU s | rel (CPU) | p | sys s "
             "| minor faults | instructions | Δ instr. vs plain |")
    L.append("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        base_cpu = [x["cpu"] for x in r["runs"]["plain"]]
        bq = quartiles(base_cpu)
        for v in VARIANTS:
            runs = r["runs"][v]
            w = quartiles([x["wall"] for x in runs])
            c = quartiles([x["cpu"] for x in runs])
            s = quartiles([x["sys"] for x in runs])[1]
            f = quartiles([x["minflt"] for x in runs])[1]
            rel = bq[1] / c[1]
            pv = "" if v == "plain" else "%.3f" % mann_whitney_p(
                base_cpu, [x["cpu"] for x in runs])
            ins = r["insn"].get(v)
            d = ""
            if ins and v != "plain" and r["insn"].get("plain"):
                d = "%+.2f%%" % (100.0 * (ins / r["insn"]["plain"] - 1))
            L.append("| %s | %s | %.3f [%.3f–%.3f] | %.3f [%.3f–%.3f] | "
                     "%s | %s | %.3f | %dk | %s | %s |" % (
                         name, v, w[1], w[0], w[2], c[1], c[0], c[2],
                         "1 (base)" if v == "plain" else "%.1f%%" % (
                             100 * rel), pv, s, f // 1000,
                         "{:,}".format(ins) if ins else "—", d))
    L.append("")
    L.append("Accounted against anonymous RSS (held runs; g++: peaks of "
             "cc1plus while it compiles):")
    L.append("")
    L.append("| program | variant | allocator in the process | memtally "
             "bytes | of which mapped | of which allocator free | RssAnon "
             "| bytes / RssAnon |")
    L.append("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        for v in ("preload", "glibc"):
            h = r["held"][v]
            L.append("| %s | %s | %s | %s | %s | %s | %s | %.3f |" % (
                name, v, h["allocator"], mib(h["bytes"]), mib(h["mapped"]),
                mib(h["free"]), mib(h["anon"]),
                h["bytes"] / h["anon"] if h["anon"] else 0))
    L.append("")
    L.append("Rerun: `/usr/bin/python3 bench/frontends.py --build-dir "
             "BUILD` (this run: `%s`, %s; cachegrind adds a few minutes; "
             "`--no-instructions` skips it)." % (build, build_type))
    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--cpu", type=int, default=1)
    ap.add_argument("--no-instructions", action="store_true")
    ap.add_argument("--insn-scale", type=float, default=0.25)
    ap.add_argument("--results-md",
                    default=results_path("frontends"))
    args = ap.parse_args()
    b = os.path.abspath(args.build_dir)
    paths = {"preload": os.path.join(b, "client", "libmemtally_preload.so"),
             "glibc": os.path.join(b, "client", "libmemtally_glibc.so"),
             "cli": os.path.join(b, "programs", "memtally"), "build": b}
    for k, p in paths.items():
        if not os.path.exists(p):
            raise BenchError("%s not built: %s" % (k, p))
    info = machine_info()
    tmp = tempfile.mkdtemp(prefix="mt-frontends-")
    others = set(range(os.cpu_count() or 1)) - {args.cpu}
    server, _ = start_server(b, tmp, cpus=others or None, required=True)
    results = {}
    try:
        for prog in PROGRAMS:
            if not prog.available():
                log("%s: not installed, skipped" % prog.name)
                continue
            log("%s: held/watched runs" % prog.name)
            hv = {}
            for v in ("preload", "glibc"):
                hv[v] = (watched if isinstance(prog, programs.Gxx) else held)(
                    prog, v, paths, server, tmp)
                want = "jemalloc" if v == "preload" else "glibc"
                if hv[v]["allocator"] != want:
                    raise BenchError("%s under %s: allocator %s" % (
                        prog.name, v, hv[v]["allocator"]))
            log("%s: timing" % prog.name)
            for v in VARIANTS:
                timed_run(prog, v, paths, server, tmp, 1.0, args.cpu)
            runs = {v: [] for v in VARIANTS}
            for r in range(args.reps):
                for v in (VARIANTS if r % 2 == 0 else VARIANTS[::-1]):
                    runs[v].append(timed_run(prog, v, paths, server, tmp,
                                             1.0, args.cpu))
            insn = {}
            if not args.no_instructions:
                log("%s: instructions" % prog.name)
                for v in VARIANTS:
                    insn[v] = instructions(prog, v, paths, server, tmp,
                                           args.insn_scale)
            results[prog.name] = {"runs": runs, "held": hv, "insn": insn}
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    info["loadavg_end"] = os.getloadavg()[0]
    build_type = ""
    try:
        with open(os.path.join(b, "CMakeCache.txt")) as f:
            m = re.search(r"^CMAKE_BUILD_TYPE:STRING=(.*)$", f.read(), re.M)
        build_type = (m.group(1) if m else "") or "RelWithDebInfo"
    except OSError:
        pass
    text = report(info, results, args.reps, args.cpu,
                  os.path.relpath(b, SRC_DIR), build_type)
    print(text)
    with open(os.path.join(b, "frontends.json"), "w") as f:
        json.dump({"machine": info, "results": results}, f, indent=1)
    write_section(args.results_md, "frontends", text)
    log("wrote the frontends section of %s" % args.results_md)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        log("frontends: FAILED: %s" % e)
        sys.exit(1)
