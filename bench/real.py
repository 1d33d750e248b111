#!/usr/bin/python3
"""real: programs nobody in this project wrote, with and without memtally.

The `real` suite. Each program runs an allocation-heavy workload,
unmodified, under three variants:

  glibc     as installed (glibc's malloc), for reference
  jemalloc  LD_PRELOAD=libjemalloc.so.2: jemalloc alone, the baseline
  preload   LD_PRELOAD=libmemtally_preload.so with
            MEMTALLY_ALLOCATOR=jemalloc (jemalloc 5.3 linked into the
            preload, counted by its activity callback; a python interpreter
            would otherwise switch to the glibc front end), with a real
            memtallyd running, so the process registers and is counted

Programs: the `sqlite3` CLI (an in-memory database fed on stdin: rows built
by a recursive CTE, two indexes, GROUP BY, a sort, DISTINCT, UPDATE,
DELETE), `/usr/bin/python3` (JSON dumps/loads of a list of dicts, bytes
objects of 100 B to 40 KB joined, a growing bytearray) and `g++ -O2 -c` of
a small template-heavy C++ file (three processes: driver, cc1plus, as), and
Debian's redis-server (linked to libjemalloc.so.2: variants jemalloc and
preload only), filled with 100,000 keys, then driven by redis-benchmark
from the other CPUs (200,000 SET
then GET of 256 B, pipelined by 16).
Target: throughput with the preload >= 99% of jemalloc alone; for redis,
instructions within 0.3% of jemalloc alone.

Timing: every run is one whole process, started from scratch (so the
preload's registration with memtallyd is in the figure), pinned to one CPU
(memtallyd on the others); wall time and the child's CPU time (user+sys,
from wait4) are recorded. Runs are interleaved across variants (ABC CBA
...), --reps per variant after one warm-up run each. Cells: median [Q1-Q3];
p: two-sided Mann-Whitney U against jemalloc. Then, because a 1% target
is below this shared machine's noise, each program once more under
cachegrind (jemalloc and preload; unless --no-instructions): instructions
executed by the program and its children, and by sqlite3 with empty
input and redis with no request (the preload's fixed cost per process).

Proof (before timing, one "held" run per program and variant; a failed
proof fails the suite): the program runs its workload, then stays alive
holding its memory while the driver checks, independently,
  1. /proc/PID/maps: libjemalloc.so.2 mapped (jemalloc, preload) or not
     (glibc); libmemtally_preload.so mapped only under the preload;
  2. jemalloc's own statistics, printed at exit (MALLOC_CONF=stats_print,
     JSON): present, with >= 1000 allocation requests served (jemalloc,
     preload), or absent (glibc: MALLOC_CONF means nothing to glibc);
  3. preload only: `memtally --json ps` lists the pid with bytes >= half of
     the program's own figure, and the process's lanes in its uid's slot
     table show flushes > 0 (read directly, through the server's
     descriptor of the table in /proc/SERVER/fd).
g++ holds nothing and reads no stdin: its proof run is watched instead
(its process tree polled every ~10 ms; the signs are cc1plus's).
The same held run compares memtally's figure with the program's own idea
of its memory: sqlite's `.stats` "Memory Used" (sqlite3_memory_used()),
for python the sizes (sys.getsizeof) of a known set of bytes objects it is
told to hold, as a difference between before and after, and for g++ the
GGC heap of -fmem-report against memtally's peak for cc1plus.

Outputs: a table on stdout, JSON in BUILD/bench/real.json and, for a run
of every program, bench/results/real.md.

Run all:    cmake --build BUILD --target bench_real
Run one:    /usr/bin/python3 bench/real.py --build-dir BUILD --program sqlite3
Proof only: /usr/bin/python3 bench/real.py --build-dir BUILD --proof-only \\
                --scale 0.02 [--variant glibc --expect preload]
By hand:    /usr/bin/python3 bench/real.py --write-workloads DIR  (the files
                and one command per program)
Extra flags also come from $MEMTALLY_BENCH_ARGS.
"""

import argparse
import json
import mmap
import os
import re
import resource
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (  # noqa: E402
    SRC_DIR, BenchError, fmt_p, log, machine_info, mann_whitney_p,
    memtally_ps, memtally_settled, quartiles, cachegrind_total,
    start_server, results_path, write_section)

PROGRAMS = ["sqlite3", "python3", "g++", "redis"]
TARGET = 0.99  # preload throughput / jemalloc-alone throughput
# Instructions the preload may add over jemalloc alone, where a program has
# a target of its own (the preload of one that is linked to jemalloc).
INSN_TARGET = {"redis": 0.003}
MIN_JE_REQUESTS = 1000  # proof: jemalloc served at least this many mallocs
EXIT_SKIP = 77
# Instruction counts (cachegrind, ~20-50x slower) run the workloads at this
# fraction of --scale (1: the timed workloads themselves); g++ compiles the
# same file whatever the scale.
INSN_SCALE = 1.0  # ctest SKIP_RETURN_CODE: a program is not installed

# The programs and their workloads: bench/programs.py, shared with
# frontends.py.
from programs import (  # noqa: E402
    ALL_PROGRAMS, PY_RECORDS, SQLITE_ROWS, VARIANTS, Gxx, comm_of,
    descendants, pin)


# ---- environment -------------------------------------------------------------


def find_jemalloc():
    for line in subprocess.run(["ldconfig", "-p"], capture_output=True,
                               text=True).stdout.splitlines():
        if line.strip().startswith("libjemalloc.so.2 ") and "=>" in line:
            return line.split("=>", 1)[1].strip()
    for p in ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
              "/lib/x86_64-linux-gnu/libjemalloc.so.2"):
        if os.path.exists(p):
            return p
    raise BenchError("libjemalloc.so.2 not found (apt-get install libjemalloc2)")


def variant_env(variant, paths, server, stats=False):
    env = dict(os.environ)
    # LD_PRELOAD and MALLOC_CONF are the variant's; MEMTALLY_DISABLE and
    # the like pass through on purpose: a run that is not counted must
    # fail the proof, not be reported.
    for k in ("LD_PRELOAD", "MALLOC_CONF", "MEMTALLY_ALLOCATOR"):
        env.pop(k, None)
    env["MEMTALLY_SOCKET"] = server.socket
    if variant == "jemalloc":
        env["LD_PRELOAD"] = paths["jemalloc"]
    elif variant == "preload":
        env["LD_PRELOAD"] = paths["preload"]
        # The jemalloc front end against jemalloc alone, for every program:
        # without this a python interpreter would switch itself to the
        # glibc front end (client/choose.c).
        env["MEMTALLY_ALLOCATOR"] = "jemalloc"
    if stats:
        # jemalloc prints its statistics at exit, as one JSON document.
        env["MALLOC_CONF"] = "stats_print:true,stats_print_opts:J"
    return env


# ---- memtally's figures ------------------------------------------------------


def lane_flushes(server, pid):
    """Sum of the `flushes` counters of pid's lanes, read from the server's
    shared objects (layout 2.0: shm/mtshm.h), or None if pid has no slot.

    The objects are anonymous (memfd): the header "LABEL" and one slot table
    per uid, "LABEL-slots:INSTANCE:UID". memtallyd keeps a descriptor of
    each while it has a registered process of that uid, so they are opened
    through /proc/SERVER/fd (the server is our child, of our uid), mapped
    read-only, and the slot is found by pid, as a reader must: the layout
    from the header, slot i at i * slot_stride in its table."""
    if not server.segment or not server.proc:
        return None
    label = server.segment.lstrip("/")
    fd_dir = "/proc/%d/fd" % server.proc.pid
    header, tables = None, []
    try:
        for fd in os.listdir(fd_dir):
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target == "/memfd:%s (deleted)" % label and header is None:
                header = os.path.join(fd_dir, fd)
            elif target.startswith("/memfd:%s-slots:" % label):
                tables.append(os.path.join(fd_dir, fd))
    except OSError:
        return None
    if header is None:
        return None

    def mapped(path):
        # Mapped, not read: a table is megabytes, a slot 64 bytes.
        fd = os.open(path, os.O_RDONLY)
        try:
            return mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        finally:
            os.close(fd)

    try:
        hdr = mapped(header)
    except (OSError, ValueError):
        return None
    try:
        if hdr[:8] != b"MEMTALLY" or struct.unpack_from("<H", hdr, 8)[0] != 2:
            return None
        (slot_stride, slot_count, lane_count,
         line_size) = struct.unpack_from("<4I", hdr, 24)
        table_size = struct.unpack_from("<Q", hdr, 40)[0]
    finally:
        hdr.close()
    for path in tables:
        try:
            seg = mapped(path)
        except (OSError, ValueError):
            continue
        try:
            if len(seg) < table_size:
                continue
            for i in range(slot_count):
                base = i * slot_stride
                if struct.unpack_from("<I", seg, base)[0] != pid:
                    continue
                used = min(struct.unpack_from("<I", seg, base + 52)[0],
                           lane_count)
                # Lane k: line k of the slot, after the 64-byte identity;
                # `flushes` at +16 (struct mtshm_lane).
                return sum(struct.unpack_from(
                    "<Q", seg, base + k * line_size + 64 + 16)[0]
                    for k in range(max(used, 1)))
        finally:
            seg.close()
    return None


def maps_of(pid):
    with open("/proc/%d/maps" % pid) as f:
        text = f.read()
    return {"libjemalloc": "libjemalloc.so" in text,
            "libmemtally_preload": "libmemtally_preload.so" in text}


def jemalloc_requests(stderr_text):
    """Allocation requests jemalloc served, from its stats_print JSON at
    exit, or None if it printed none (it was not the allocator). Several
    processes (g++: the driver, cc1plus, as) print one document each: the
    largest figure is reported."""
    best = None
    i = stderr_text.find('{"jemalloc":')
    while i >= 0:
        doc, end = json.JSONDecoder().raw_decode(stderr_text, i)
        arenas = doc["jemalloc"].get("stats.arenas", {})
        picked = [arenas["merged"]] if "merged" in arenas else [
            a for k, a in arenas.items() if k.isdigit()]
        n = sum(a[c]["nrequests"] for a in picked for c in ("small", "large"))
        best = n if best is None else max(best, n)
        i = stderr_text.find('{"jemalloc":', end)
    return best


# ---- held run: proof and accounted totals ------------------------------------


def held_run(prog, variant, expect, paths, server, tmp, scale, cpu):
    argv, stages = prog.held(tmp, scale)
    err_path = os.path.join(tmp, "%s-%s-held.err" % (prog.name, variant))
    err = open(err_path, "w+")
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=err, text=True, bufsize=1,
                            env=variant_env(variant, paths, server, True),
                            preexec_fn=pin(cpu))
    obs = {"variant": variant, "expect": expect, "pid": proc.pid}
    outs = []
    try:
        for k, (send, marker) in enumerate(stages):
            if send:
                proc.stdin.write(send)
                proc.stdin.flush()
            lines = []
            while True:
                line = proc.stdout.readline()
                if not line:
                    err.seek(0)
                    raise BenchError("%s under %s exited before %s:\n%s" % (
                        prog.name, variant, marker, err.read()[-2000:]))
                if line.strip() == marker:
                    break
                lines.append(line.rstrip("\n"))
            outs.append(lines)
            if k == 0:
                # memtally's figure with the program idle and its workload
                # not yet held (python: after the work, before the hold).
                obs["memtally_base"] = memtally_settled(
                    paths["cli"], server.socket, proc.pid) \
                    if variant == "preload" else None
        obs["maps"] = maps_of(proc.pid)
        # A process that registers does so at its first malloc, long
        # before the workload ends: for one that should not be counted,
        # a few ticks are enough to see it is not listed.
        # One that should, and was not listed before its workload, had
        # 5 s already: 1 s more is plenty.
        patience = 0.2
        if variant == "preload":
            patience = 5.0 if obs["memtally_base"] else 1.0
        obs["memtally"] = memtally_settled(paths["cli"], server.socket,
                                         proc.pid, patience)
        obs["flushes"] = lane_flushes(server, proc.pid)
        obs["own"] = prog.own(outs)
        proc.stdin.close()
        rc = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err.seek(0)
    stderr_text = err.read()
    if rc != 0:
        raise BenchError("%s under %s: exit %d:\n%s" % (
            prog.name, variant, rc, stderr_text[-2000:]))
    obs["jemalloc_requests"] = jemalloc_requests(stderr_text)
    failures = check_proof(expect, obs, links=prog.links_jemalloc)
    obs["proof"] = "ok" if not failures else failures
    if failures:
        raise BenchError("PROOF FAILED for %s under variant %s (expected %s): "
                         "%s" % (prog.name, variant, expect,
                                 "; ".join(failures)))
    return obs


def held_run_served(prog, variant, expect, paths, server, tmp, scale, cpu):
    """The proof run of a served program: start it, read its own memory
    figures (redis: INFO memory) and memtally's, drive it, read both
    again while it holds its data, shut it down (jemalloc's statistics
    print at exit). Besides the common signs: under the preload, the
    program's own jemalloc figure (the "Allocated" of the statistics redis
    prints with its malloc_stats_print) must move with its data: its
    jemalloc API reaches the heap that serves its mallocs."""
    err = open(os.path.join(tmp, "%s-%s-held.err" % (prog.name, variant)),
               "w+")
    proc = subprocess.Popen(prog.server_argv(tmp), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=err,
                            env=variant_env(variant, paths, server, True),
                            preexec_fn=pin(cpu))
    obs = {"variant": variant, "expect": expect, "pid": proc.pid}
    try:
        prog.wait_up(tmp, proc, 30)
        obs["memtally_base"] = memtally_settled(
            paths["cli"], server.socket, proc.pid) \
            if variant == "preload" else None
        i0 = prog.info(tmp)
        prog.drive(tmp, scale, others(cpu))
        i1 = prog.info(tmp)
        obs["maps"] = maps_of(proc.pid)
        patience = 0.2
        if variant == "preload":
            patience = 5.0 if obs["memtally_base"] else 1.0
        obs["memtally"] = memtally_settled(paths["cli"], server.socket,
                                         proc.pid, patience)
        obs["flushes"] = lane_flushes(server, proc.pid)
        prog.shutdown(tmp)
        rc = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err.seek(0)
    stderr_text = err.read()
    if rc != 0:
        raise BenchError("%s under %s: exit %d:\n%s" % (
            prog.name, variant, rc, stderr_text[-2000:]))
    used0, used1 = int(i0["used_memory"]), int(i1["used_memory"])
    a0, a1 = i0["je_allocated"], i1["je_allocated"]
    obs["own"] = {"base": used0, "held": used1,
                  "je_allocated": [a0, a1],
                  "what": "used_memory of INFO memory (zmalloc: "
                          "malloc_usable_size of each block)"}
    obs["jemalloc_requests"] = jemalloc_requests(stderr_text)
    failures = check_proof(expect, obs, links=prog.links_jemalloc)
    if expect in ("jemalloc", "preload") and a1 - a0 < (used1 - used0) // 2:
        failures.append("the Allocated of redis's malloc_stats_print moved "
                        "%d -> %d while used_memory grew by %d: its jemalloc "
                        "API reads another heap" % (a0, a1, used1 - used0))
    obs["proof"] = "ok" if not failures else failures
    if failures:
        raise BenchError("PROOF FAILED for %s under variant %s (expected %s): "
                         "%s" % (prog.name, variant, expect,
                                 "; ".join(failures)))
    return obs


def watched_run(prog, variant, expect, paths, server, tmp, cpu):
    """The proof run of a program that does not wait for us (g++): poll
    its process tree while it runs; the signs are taken from the
    prog.watch_comm process (cc1plus), the one that does the work."""
    err = open(os.path.join(tmp, "%s-%s-watched.err" % (prog.name, variant)),
               "w+")
    proc = subprocess.Popen(prog.watched(tmp), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=err,
                            env=variant_env(variant, paths, server, True),
                            preexec_fn=pin(cpu))
    obs = {"variant": variant, "expect": expect, "pid": None,
           "maps": {"libjemalloc": False, "libmemtally_preload": False},
           "memtally": None, "memtally_base": None, "flushes": None}
    try:
        while proc.poll() is None:
            for d in descendants(proc.pid):
                if comm_of(d) != prog.watch_comm:
                    continue
                obs["pid"] = d
                try:
                    # Libraries are never unmapped: any read that shows
                    # one is proof; the first may come before ld.so ran.
                    for k, v in maps_of(d).items():
                        obs["maps"][k] |= v
                except OSError:
                    pass
                e = memtally_ps(paths["cli"], server.socket,
                                strict=False).get(d)
                if e and (not obs["memtally"]
                          or e["peak"] >= obs["memtally"]["peak"]):
                    obs["memtally"] = e
                f = lane_flushes(server, d)
                if f is not None:
                    obs["flushes"] = max(f, obs["flushes"] or 0)
            time.sleep(0.01)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    err.seek(0)
    stderr_text = err.read()
    if proc.returncode != 0:
        raise BenchError("%s under %s: exit %d:\n%s" % (
            prog.name, variant, proc.returncode, stderr_text[-2000:]))
    if obs["pid"] is None:
        raise BenchError("PROOF FAILED for %s under variant %s: no %s process "
                         "was seen" % (prog.name, variant, prog.watch_comm))
    obs["own"] = prog.own(stderr_text)
    obs["jemalloc_requests"] = jemalloc_requests(stderr_text)
    # Most of cc1plus's memory is its GGC heap, pages it maps itself: a
    # floor of 1 MiB of malloc'd bytes, not a share of its own figure.
    failures = check_proof(expect, obs, floor=1 << 20,
                           links=prog.links_jemalloc)
    obs["proof"] = "ok" if not failures else failures
    if failures:
        raise BenchError("PROOF FAILED for %s under variant %s (expected %s): "
                         "%s" % (prog.name, variant, expect,
                                 "; ".join(failures)))
    return obs


def check_proof(expect, obs, floor=None, links=False):
    """What does not hold for a process that should run as `expect`.
    Under the preload, memtally must count at least `floor` bytes (by
    default half the program's own figure). libjemalloc.so.2 is mapped
    under the `jemalloc` variant, and in every variant of a program linked
    to it (`links`); the preload carries its own jemalloc, so a program
    that does not link it shows no libjemalloc.so.2 under the preload."""
    bad = []
    je = expect in ("jemalloc", "preload")
    pre = expect == "preload"
    je_lib = expect == "jemalloc" or links
    if obs["maps"]["libjemalloc"] != je_lib:
        bad.append("libjemalloc.so.2 %s in /proc/PID/maps" % (
            "is not mapped" if je_lib else "is mapped"))
    if obs["maps"]["libmemtally_preload"] != pre:
        bad.append("libmemtally_preload.so %s in /proc/PID/maps" % (
            "is not mapped" if pre else "is mapped"))
    req = obs["jemalloc_requests"]
    if je and (req is None or req < MIN_JE_REQUESTS):
        bad.append("jemalloc's exit statistics show %s allocation requests "
                   "(want >= %d)" % ("no" if req is None else req,
                                     MIN_JE_REQUESTS))
    if not je and req is not None:
        bad.append("jemalloc printed exit statistics (%d requests): it "
                   "served this process" % req)
    m = obs["memtally"]
    if pre:
        want = obs["own"]["held"] // 2 if floor is None else floor
        if not m:
            bad.append("memtally ps does not list the pid: the process was "
                       "never counted")
        elif m["bytes"] < want:
            bad.append("memtally counts %d bytes for the pid, less than "
                       "%d" % (m["bytes"], want))
        if not obs["flushes"]:
            bad.append("the pid's lanes in its slot table show %s flushes" % (
                "no slot, so no" if obs["flushes"] is None else "0"))
    elif m:
        bad.append("memtally ps lists the pid (%d bytes) though it should "
                   "not be counted" % m["bytes"])
    return bad


# ---- timed runs --------------------------------------------------------------


def others(cpu):
    """The CPUs a driving client may use: all but the program's."""
    allowed = os.sched_getaffinity(0)
    return (allowed - {cpu}) or allowed if cpu is not None else None


def timed_run_served(prog, variant, paths, server, tmp, scale, cpu):
    """A served program: start it, drive it from the other CPUs, shut it
    down; wall time from start to exit, CPU time of the server."""
    err = open(os.path.join(tmp, "%s-%s.err" % (prog.name, variant)), "w+")
    t0 = time.monotonic()
    proc = subprocess.Popen(prog.server_argv(tmp), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=err,
                            env=variant_env(variant, paths, server),
                            preexec_fn=pin(cpu))
    try:
        prog.wait_up(tmp, proc, 30)
        prog.drive(tmp, scale, others(cpu))
        prog.shutdown(tmp)
    except BenchError:
        proc.kill()
        raise
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        err.seek(0)
        raise BenchError("%s under %s: exit %d:\n%s" % (
            prog.name, variant, proc.returncode, err.read()[-2000:]))
    return {"wall": wall, "cpu": ru.ru_utime + ru.ru_stime,
            "user": ru.ru_utime, "sys": ru.ru_stime,
            "minflt": ru.ru_minflt, "maxrss_kib": ru.ru_maxrss}


def timed_run(prog, variant, paths, server, tmp, scale, cpu):
    if prog.served:
        return timed_run_served(prog, variant, paths, server, tmp, scale, cpu)
    argv, stdin_path = prog.timed(tmp, scale)
    stdin = open(stdin_path) if stdin_path else subprocess.DEVNULL
    err = open(os.path.join(tmp, "%s-%s.err" % (prog.name, variant)), "w+")
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.DEVNULL,
                            stderr=err, env=variant_env(variant, paths, server),
                            preexec_fn=pin(cpu))
    # wait4: this child's own CPU time and peak RSS.
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if stdin_path:
        stdin.close()
    if proc.returncode != 0:
        err.seek(0)
        raise BenchError("%s under %s: exit %d:\n%s" % (
            prog.name, variant, proc.returncode, err.read()[-2000:]))
    return {"wall": wall, "cpu": ru.ru_utime + ru.ru_stime,
            "user": ru.ru_utime, "sys": ru.ru_stime,
            "minflt": ru.ru_minflt, "maxrss_kib": ru.ru_maxrss}


def measure(prog, variants, reps, paths, server, tmp, scale, cpu):
    for v in variants:  # warm-up (page cache, CPU frequency), not recorded
        timed_run(prog, v, paths, server, tmp, scale, cpu)
    runs = {v: [] for v in variants}
    for r in range(reps):
        for v in (variants if r % 2 == 0 else variants[::-1]):
            runs[v].append(timed_run(prog, v, paths, server, tmp, scale, cpu))
    return runs


INSN_VARIANTS = ["jemalloc", "preload"]


def count_instructions(prog, variant, paths, server, tmp, scale,
                       empty=False):
    """Instructions one run executes, the program and every child it
    starts, under cachegrind (no cache simulation: just Ir). On this
    shared machine a 1% difference in time is below the noise; the
    instruction count is not (valgrind's own allocator is not involved:
    cachegrind does not replace malloc, so jemalloc and the preload run
    as they would). PYTHONHASHSEED fixed: the same dict layouts in both.
    empty: the program with nothing on stdin (its start and exit only)."""
    if prog.served:
        return count_instructions_served(prog, variant, paths, server, tmp,
                                         scale, empty)
    argv, stdin_path = prog.timed(tmp, scale)
    if empty:
        stdin_path = None
    out = os.path.join(tmp, "cg-%s-%s" % (prog.name, variant))
    env = variant_env(variant, paths, server)
    env["PYTHONHASHSEED"] = "0"
    try:
        return cachegrind_total(argv, stdin_path, env, out, "%s under %s" % (
            prog.name, variant))
    finally:
        shutil.rmtree(out, ignore_errors=True)


def count_instructions_served(prog, variant, paths, server, tmp, scale,
                              empty=False):
    """Instructions the server executes for one driven run (start, the
    client's requests, shutdown), under cachegrind; the client is not.
    empty: start and shutdown only."""
    out = os.path.join(tmp, "cg-%s-%s.out" % (prog.name, variant))
    env = variant_env(variant, paths, server)
    proc = subprocess.Popen(["valgrind", "--tool=cachegrind", "--cache-sim=no",
                             "--cachegrind-out-file=" + out]
                            + prog.server_argv(tmp),
                            stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        prog.wait_up(tmp, proc, 300)
        if not empty:
            prog.drive(tmp, scale, None)
        prog.shutdown(tmp)
        _, errtext = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise BenchError("%s under %s, cachegrind: exit %d:\n%s" % (
            prog.name, variant, proc.returncode, errtext[-2000:]))
    with open(out) as fh:
        m = re.search(r"^summary: (\d+)", fh.read(), re.M)
    os.unlink(out)
    return int(m.group(1)) if m else 0


def stats(runs, base="jemalloc"):
    out = {}
    for v, rs in runs.items():
        s = {}
        for k in ("wall", "cpu"):
            xs = [r[k] for r in rs]
            s[k] = quartiles(xs)
            if base in runs and v != base:
                b = [r[k] for r in runs[base]]
                # throughput relative to the base: runs/s is 1/time.
                s[k + "_rel"] = quartiles(b)[1] / s[k][1]
                s[k + "_p"] = mann_whitney_p(xs, b)
                # repetitions ran side by side: per-pair ratios are robust
                # to the machine's slow drifts.
                s[k + "_rel_paired"] = quartiles(
                    [y[k] / x[k] for x, y in zip(rs, runs[base])])[1]
        for k in ("maxrss_kib", "minflt", "sys"):
            s[k] = quartiles([r[k] for r in rs])[1]
        out[v] = s
    return out


# ---- report ------------------------------------------------------------------


def fmt_q(q):
    return "%.3f [%.3f–%.3f]" % (q[1], q[0], q[2])


def verdict(rel, p):
    if rel >= TARGET:
        return "met"
    if p >= 0.05:
        return "not shown (%.1f%%, p = %s: within the noise)" % (
            (rel - 1) * 100, fmt_p(p))
    return "**missed**"


def mib(x):
    if abs(x) < 1 << 20:
        return "%.1f KiB" % (x / 1024)
    return "%.2f MiB" % (x / 1048576)


def report(info, args, programs, results, proofs, paths, cpu, build_rel):
    lines = ["## real (real programs with and without the preload)\n"]
    lines.append(
        "Measured %s on %s (%d CPUs, Linux %s), %s, %s; commit `%s`%s. Load "
        "average (1 min) %.2f at the start, %.2f at the end: the machine is "
        "shared, compare within a row.\n" % (
            info["date"], info["cpu_model"], info["nproc"], info["kernel"],
            info["glibc"], info["jemalloc"], info["commit"],
            " with uncommitted changes" if info["uncommitted"] else "",
            info["loadavg_start"], info["loadavg_end"]))
    lines.append(
        "Each run is one whole process (start, workload, exit), pinned to "
        "CPU %d, memtallyd (10 ms tick) on the other CPUs; %d runs per "
        "variant after one warm-up each, interleaved (ABC CBA ...). `glibc`: "
        "the program as installed; `jemalloc`: `LD_PRELOAD=%s`; `preload`: "
        "`LD_PRELOAD=libmemtally_preload.so` (jemalloc 5.3 linked into the "
        "preload, counted by its activity callback) with the process "
        "registered and counted by memtallyd. "
        "Cells: median [Q1–Q3] seconds per run, wall and CPU (user+sys of "
        "the child and the children it waited for, from wait4; sys, minor "
        "page faults and peak RSS: medians, the same source); rel: "
        "throughput (1/time) relative to "
        "jemalloc alone, ratio of medians, and in brackets the median of "
        "the per-repetition ratios; p: two-sided Mann-Whitney U against "
        "jemalloc. Target: preload ≥ %d%% of jemalloc alone.\n" % (
            cpu, args.reps, paths["jemalloc"], TARGET * 100))
    lines.append(
        "Workloads: **sqlite3** %s, `sqlite3 :memory:` fed on stdin: %d rows "
        "of text and 100–1000 B blobs built by a recursive CTE into a "
        "512 MiB page cache, two indexes, GROUP BY, a sorted scan, "
        "DISTINCT, UPDATE of a third, DELETE of a fifth. **python3** %s "
        "(`/usr/bin/python3`): six rounds of JSON dumps/loads of %d dicts "
        "and bytes objects of 100 B–40 KB joined and appended to a "
        "bytearray. **g++** %s: `g++ -O2 -c` of a 20-line C++ file using "
        "<map>, <sstream>, <unordered_map>, <algorithm> (the driver, "
        "cc1plus and as: three processes, each preloaded and, under the "
        "preload, registered). **redis** %s (Debian's redis-server, linked "
        "to libjemalloc.so.2, so its `glibc` run would be jemalloc too: "
        "not run): the server on a Unix socket with `--save '' --hz 1`, "
        "from the other CPUs `DEBUG POPULATE %d key 256`, then "
        "`redis-benchmark -c 1 -n %d -d 256 -P 16 -t set,get` (%d SET then "
        "%d GET of 256 B values, pipelined by 16), then SHUTDOWN NOSAVE; "
        "timed and counted: the server process.\n" % (
            info["versions"].get("sqlite3", "?"),
            max(100, int(SQLITE_ROWS * args.scale)),
            info["versions"].get("python3", "?"),
            max(100, int(PY_RECORDS * args.scale)),
            info["versions"].get("g++", "?"),
            info["versions"].get("redis", "?"),
            ALL_PROGRAMS["redis"].keys(args.scale),
            ALL_PROGRAMS["redis"].requests(args.scale),
            ALL_PROGRAMS["redis"].requests(args.scale),
            ALL_PROGRAMS["redis"].requests(args.scale)))
    lines.append("| program | variant | wall s | CPU s | rel (wall) | p | "
                 "rel (CPU) | p | of which sys s | minor faults | peak RSS |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in programs:
        st = results[name]["stats"]
        for v in VARIANTS:
            if v not in st:
                continue
            s = st[v]
            if v == "jemalloc":
                rel = ["1 (base)", "", "1 (base)", ""]
            else:
                rel = ["%.1f%% (%.1f%%)" % (s["wall_rel"] * 100,
                                            s["wall_rel_paired"] * 100),
                       fmt_p(s["wall_p"]),
                       "%.1f%% (%.1f%%)" % (s["cpu_rel"] * 100,
                                            s["cpu_rel_paired"] * 100),
                       fmt_p(s["cpu_p"])]
            lines.append("| %s | %s | %s | %s | %s | %.3f | %.0fk | %.0f MiB |"
                         % (name, v, fmt_q(s["wall"]), fmt_q(s["cpu"]),
                            " | ".join(rel), s["sys"], s["minflt"] / 1000,
                            s["maxrss_kib"] / 1024))
    lines.append("")
    lines.append("Target, preload throughput ≥ %d%% of jemalloc alone:" %
                 (TARGET * 100))
    lines.append("")
    for name in programs:
        s = results[name]["stats"].get("preload")
        if not s or "wall_rel" not in s:
            continue
        lines.append("- %s: wall %.1f%% — %s; CPU %.1f%% — %s." % (
            name, s["wall_rel"] * 100, verdict(s["wall_rel"], s["wall_p"]),
            s["cpu_rel"] * 100, verdict(s["cpu_rel"], s["cpu_p"])))
    lines.append("")
    if any("instructions" in results[n] for n in programs):
        lines.append(
            "Instructions per run (cachegrind `--cache-sim=no "
            "--trace-children=yes`: the program and every process it "
            "starts; sqlite3 and python3 at %g× the timed workload, g++ the "
            "same compile; one run each): what the preload adds, free of "
            "the machine's noise.\n" % INSN_SCALE)
        lines.append("| program | jemalloc | preload | preload − jemalloc "
                     "| instruction throughput, preload / jemalloc |")
        lines.append("|---|---|---|---|---|")
        for name in programs:
            ins = results[name].get("instructions")
            if not ins:
                continue
            j, p = ins["jemalloc"], ins["preload"]
            lim = INSN_TARGET.get(name)
            if lim is not None:
                ok = (p - j) / j <= lim
                verdict_text = "%s (target: within %+.1f%% of jemalloc)" % (
                    "met" if ok else "**missed**", lim * 100)
            else:
                verdict_text = "met" if j / p >= TARGET else "**missed**"
            lines.append("| %s | {:,} | {:,} | {:+,} ({:+.2f}%%) | %.2f%% — "
                         "%s |".format(j, p, p - j, (p - j) / j * 100)
                         % (name, j / p * 100, verdict_text))
        for name, what in (("sqlite3", "empty stdin"),
                           ("redis", "no request")):
            e = results.get(name, {}).get("instructions_empty")
            if e:
                j, p = e["jemalloc"], e["preload"]
                lines.append("| %s, %s (start and exit only) | "
                             "{:,} | {:,} | {:+,} | — |".format(j, p, p - j)
                             % (name, what))
        lines.append("")
    lines.append(
        "Accounted total against the program's own figure, from the held "
        "run under the preload (the process idle, holding its memory, "
        "memtally read after a tick, twice 30 ms apart agreeing): "
        "*base* is before the workload (sqlite3: the CLI started, empty "
        "database) or before the hold (python3: after its work, before it "
        "allocates the held objects); *held* is with everything held. "
        "g++ holds nothing at its end: its row is memtally's peak for "
        "cc1plus (the server's highest tick, polled while it ran) against "
        "the GGC heap gcc reports at the end.\n")
    lines.append("| program | own figure | own base | own held | memtally "
                 "base | memtally held | held: memtally / own | Δ memtally "
                 "/ Δ own | flushes |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for name in programs:
        o = proofs[name]["preload"]
        own, m0, m1 = o["own"], o["memtally_base"], o["memtally"]
        if own.get("peak"):
            # A compiler run holds nothing at the end: memtally's peak
            # (the server's highest tick) against gcc's own report.
            lines.append("| %s | %s | — | %s | — | peak %s | %.3f | — | %d |"
                         % (name, own["what"], mib(own["held"]),
                            mib(m1["peak"]), m1["peak"] / own["held"],
                            o["flushes"]))
            continue
        d_own = own["held"] - own["base"]
        d_mt = m1["bytes"] - m0["bytes"]
        extra = ""
        if "held_at_size_class" in own:
            extra = " (at jemalloc's size classes: %s; Δ memtally / that: "\
                    "%.4f)" % (mib(own["held_at_size_class"]),
                               d_mt / own["held_at_size_class"])
        lines.append("| %s | %s | %s | %s | %s | %s | %.3f | %.4f%s | %d |" % (
            name, own["what"], mib(own["base"]), mib(own["held"]),
            mib(m0["bytes"]), mib(m1["bytes"]), m1["bytes"] / own["held"],
            d_mt / d_own if d_own else float("nan"), extra, o["flushes"]))
    lines.append("")
    lines.append(
        "Proof (every variant, from the held runs; the suite fails if any "
        "sign is wrong): libjemalloc.so.2 / libmemtally_preload.so in "
        "/proc/PID/maps; jemalloc's allocation requests from its own exit "
        "statistics (`MALLOC_CONF=stats_print`, JSON; none: it printed "
        "nothing, glibc served); memtally ps bytes and lane flushes for the "
        "pid.\n")
    lines.append("| program | variant | jemalloc mapped | preload mapped | "
                 "jemalloc requests | memtally bytes | flushes |")
    lines.append("|---|---|---|---|---|---|---|")
    for name in programs:
        for v in VARIANTS:
            o = proofs[name].get(v)
            if not o:
                continue
            lines.append("| %s | %s | %s | %s | %s | %s | %s |" % (
                name, v, "yes" if o["maps"]["libjemalloc"] else "no",
                "yes" if o["maps"]["libmemtally_preload"] else "no",
                "none" if o["jemalloc_requests"] is None
                else "{:,}".format(o["jemalloc_requests"]),
                mib(o["memtally"]["bytes"]) if o["memtally"] else "not listed",
                "n/a" if o["flushes"] is None else o["flushes"]))
    lines.append("")
    lines.append(
        "Rerun everything: `cmake --build %s --target bench_real`; one "
        "program: `/usr/bin/python3 bench/real.py --build-dir %s --program "
        "sqlite3`; the proof alone: `/usr/bin/python3 bench/real.py "
        "--build-dir %s --proof-only --scale 0.02`; one run by hand: "
        "`/usr/bin/python3 bench/real.py --write-workloads /tmp/w` (writes "
        "sqlite.sql, workload.py and unit.cpp, and prints the commands), "
        "then e.g. `LD_PRELOAD=$PWD/%s/client/libmemtally_preload.so "
        "sqlite3 :memory: < /tmp/w/sqlite.sql` (a memtallyd must be "
        "listening on `MEMTALLY_SOCKET` for it to be counted)." % (
            build_rel, build_rel, build_rel, build_rel))
    return "\n".join(lines)


# ---- main --------------------------------------------------------------------


def versions():
    v = {}
    p = subprocess.run([ALL_PROGRAMS["sqlite3"].exe, "-version"],
                       capture_output=True, text=True)
    v["sqlite3"] = p.stdout.split()[0] if p.returncode == 0 and p.stdout else "?"
    p = subprocess.run([ALL_PROGRAMS["python3"].exe, "--version"],
                       capture_output=True, text=True)
    v["python3"] = p.stdout.split()[-1] if p.returncode == 0 and p.stdout else "?"
    p = subprocess.run([ALL_PROGRAMS["g++"].exe, "-dumpfullversion"],
                       capture_output=True, text=True)
    v["g++"] = p.stdout.strip() if p.returncode == 0 else "?"
    p = subprocess.run([ALL_PROGRAMS["redis"].exe, "--version"],
                       capture_output=True, text=True)
    m = re.search(r"v=(\S+)", p.stdout) if p.returncode == 0 else None
    v["redis"] = m.group(1) if m else "?"
    return v


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(SRC_DIR, "build"))
    ap.add_argument("--program", action="append", choices=PROGRAMS)
    ap.add_argument("--variant", action="append", choices=VARIANTS,
                    help="run only this variant (repeatable)")
    ap.add_argument("--expect", choices=VARIANTS,
                    help="check the proof of this variant instead of the "
                    "one run (to show a wrong setting fails)")
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--scale", type=float, default=1.0,
                    help="workload size (1: ~1 s of CPU per run)")
    ap.add_argument("--write-workloads", metavar="DIR",
                    help="write the workloads into DIR, print the command "
                    "of one run of each, and exit")
    ap.add_argument("--no-instructions", action="store_true",
                    help="skip the instruction counts (cachegrind)")
    ap.add_argument("--proof-only", action="store_true",
                    help="the held runs and their proof, no timing")
    ap.add_argument("--cpu", type=int, help="CPU for the programs "
                    "(default: the last one this process may use)")
    ap.add_argument("--json")
    ap.add_argument("--results-md",
                    default=results_path("real"))
    argv = sys.argv[1:] + shlex.split(os.environ.get("MEMTALLY_BENCH_ARGS", ""))
    args = ap.parse_args(argv)

    if args.reps < 2:
        ap.error("--reps must be at least 2 (quartiles)")
    if args.write_workloads:
        d = os.path.abspath(args.write_workloads)
        os.makedirs(d, exist_ok=True)
        for name in PROGRAMS:
            argv, stdin_path = ALL_PROGRAMS[name].timed(d, args.scale)
            if stdin_path:  # sqlite-1.sql: call it what the notes say
                os.replace(stdin_path, os.path.join(d, "sqlite.sql"))
                stdin_path = os.path.join(d, "sqlite.sql")
            print(" ".join(shlex.quote(a) for a in argv)
                  + (" < " + shlex.quote(stdin_path) if stdin_path else ""))
        return 0
    build = os.path.abspath(args.build_dir)
    programs = args.program or PROGRAMS
    variants = [v for v in VARIANTS if v in (args.variant or VARIANTS)]
    for name in programs:
        if not ALL_PROGRAMS[name].available():
            log("real: %s is not installed (scripts/deps.sh installs it)" %
                ALL_PROGRAMS[name].exe)
            return EXIT_SKIP
    paths = {"preload": os.path.join(build, "client", "libmemtally_preload.so"),
             "cli": os.path.join(build, "programs", "memtally"),
             "jemalloc": find_jemalloc()}
    for k in ("preload", "cli"):
        if not os.path.exists(paths[k]):
            raise BenchError("%s missing; build it first: cmake --build %s" % (
                paths[k], build))
    allowed = sorted(os.sched_getaffinity(0))
    cpu = args.cpu if args.cpu is not None else allowed[-1]
    others = set(allowed) - {cpu} or None

    info = machine_info()
    info["versions"] = versions()
    tmp = tempfile.mkdtemp(prefix="mtbench-real-")
    server = None
    proofs = {}
    results = {}
    try:
        server, status = start_server(build, tmp, cpus=others)
        if not server:
            raise BenchError("the preload variant needs a memtallyd: %s" %
                             status)
        log("real: %s; programs pinned to CPU %d" % (status, cpu))
        for name in programs:
            prog = ALL_PROGRAMS[name]
            proofs[name] = {}
            for v in [v for v in variants if v in prog.variants]:
                if prog.served:
                    o = held_run_served(prog, v, args.expect or v, paths,
                                        server, tmp, args.scale, cpu)
                elif isinstance(prog, Gxx):
                    o = watched_run(prog, v, args.expect or v, paths, server,
                                    tmp, cpu)
                else:
                    o = held_run(prog, v, args.expect or v, paths, server,
                                 tmp, args.scale, cpu)
                proofs[name][v] = o
                log("  proof %-7s %-8s maps %s, jemalloc requests %s, "
                    "memtally %s, flushes %s, own %s" % (
                        name, v, o["maps"], o["jemalloc_requests"],
                        o["memtally"]["bytes"] if o["memtally"] else None,
                        o["flushes"], o["own"]["held"]))
        if args.proof_only:
            log("real: proof ok")
            return 0
        if set(variants) != set(VARIANTS) or args.expect:
            raise BenchError("a timed run needs every variant, as itself")
        for name in programs:
            t0 = time.monotonic()
            runs = measure(ALL_PROGRAMS[name],
                           [v for v in variants
                            if v in ALL_PROGRAMS[name].variants],
                           args.reps, paths,
                           server, tmp, args.scale, cpu)
            results[name] = {"runs": runs, "stats": stats(runs)}
            log("  %-7s %s  (%.0f s)" % (name, "  ".join(
                "%s %.3f s" % (v, s["wall"][1])
                for v, s in results[name]["stats"].items()),
                time.monotonic() - t0))
        if not args.no_instructions:
            if not shutil.which("valgrind"):
                raise BenchError("valgrind not installed (scripts/deps.sh); "
                                 "or run with --no-instructions")
            for name in programs:
                t0 = time.monotonic()
                sc = args.scale * INSN_SCALE
                results[name]["instructions"] = {
                    v: count_instructions(ALL_PROGRAMS[name], v, paths,
                                          server, tmp, sc)
                    for v in INSN_VARIANTS}
                log("  %-7s instructions %s  (%.0f s)" % (name, "  ".join(
                    "%s %d" % kv
                    for kv in results[name]["instructions"].items()),
                    time.monotonic() - t0))
            for name in ("sqlite3", "redis"):
                if name not in programs:
                    continue
                # What a process pays once, whatever it does: the
                # preload's start (a second jemalloc's initialisation where
                # the program links one, registration) and exit.
                results[name]["instructions_empty"] = {
                    v: count_instructions(ALL_PROGRAMS[name], v, paths,
                                          server, tmp, 1.0, empty=True)
                    for v in INSN_VARIANTS}
    finally:
        if server:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    info["loadavg_end"] = os.getloadavg()[0]
    info["jemalloc"] = "jemalloc %s" % jemalloc_version(paths["jemalloc"])
    rel = os.path.relpath(build, SRC_DIR)
    text = report(info, args, programs, results, proofs, paths, cpu, rel)
    print(text)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    js = {"suite": "real", "machine": info, "reps": args.reps,
          "scale": args.scale, "cpu": cpu, "paths": paths,
          "driver_cpu_s": ru.ru_utime + ru.ru_stime,
          "proofs": proofs, "results": results}
    jpath = args.json or os.path.join(build, "bench", "real.json")
    with open(jpath, "w") as f:
        json.dump(js, f, indent=1, default=str)
    log("JSON: %s" % jpath)
    if set(programs) == set(PROGRAMS) and args.scale == 1.0:
        write_section(args.results_md, "real", text)
        log("wrote the real section of %s" % args.results_md)
    else:
        log("real: %s not updated (partial run)" % args.results_md)
    return 0


def jemalloc_version(path):
    """The version jemalloc reports about itself, from a tiny run."""
    env = dict(os.environ, LD_PRELOAD=path,
               MALLOC_CONF="stats_print:true,stats_print_opts:J")
    p = subprocess.run([ALL_PROGRAMS["python3"].exe, "-c", ""], env=env,
                       capture_output=True, text=True)
    i = p.stderr.find('{"jemalloc":')
    if i < 0:
        return "?"
    doc = json.JSONDecoder().raw_decode(p.stderr[i:])[0]
    return doc["jemalloc"]["version"].split("-")[0]


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        log("real: FAILED: %s" % e)
        sys.exit(1)
