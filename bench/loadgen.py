#!/usr/bin/python3
"""loadgen: memtallyd under many workers and many scheduler connections.

Load: thousands of workers and many scheduler connections. Three parts,
each against a real memtallyd of this build (its own socket, segment,
--metrics on a kernel-chosen loopback port, a fleet limit of 1 TiB so
that every Admit is decided against a limit):

1. sweep: W preloaded workers (bench_loadgen_worker, 4 threads each,
   churning malloc/free of mixed sizes, in bursts with sleeps between them)
   x C scheduler connections (bench_loadgen_client, mix "cycle": GetUsage,
   Admit 1 MiB ttl 60 s, GetUsage, Release of its own reservation, one
   request in flight per connection). Per cell: requests/s, latency
   percentiles, the server's tick (mean over the cell from
   memtally_tick_duration_seconds_{sum,count}; the largest
   memtally_tick_last_duration_seconds seen by a scrape every 250 ms;
   ticks per second, 100 when the 10 ms timer keeps up), memtallyd's CPU
   (utime + stime from /proc/PID/stat, % of one core), the workers' CPU and
   allocation rate, the client's CPU. C = 0 is the workers alone.
2. queries: GetUsage only, no workers, C connections x K in flight
   (K = 1: not pipelined; K = 8: pipelined); C = 1, K = 1 also with server
   and client pinned to one CPU and to two (this guest's cross-CPU
   wake-up dominates a lone round trip).
3. hold: Admit/Release pairs on 16 connections while R = 0, 1000, 10000
   other reservations are outstanding (bench_loadgen_client --hold).
4. admit1000: 1000 registered idle workers (bench_loadgen_worker with no
   thread, holding 64 KiB each), then Admit/Release pairs on C
   connections, granted (1 MiB) and denied (2 TiB > the fleet limit; a
   denial carries the 5 largest processes).
5. profile: perf record (cpu-clock) on memtallyd during a 300 x 100 sweep
   cell, then perf stat of syscall tracepoints (syscalls per answer);
   skipped without perf (--no-profile).

Nothing lost: after every cell the workers pause (each thread flushes),
report memtally_process_bytes(), and the fleet total must equal their sum
exactly, with W processes and no reservation left; after the workers of a
sweep row exit the fleet must be exactly 0 bytes and 0 processes. Every
answer the client gets must be a success or a legitimate denial. Any
failure fails the run (exit 1).

Run all:   cmake --build BUILD --target bench_loadgen
Smoke:     /usr/bin/python3 bench/loadgen.py --build-dir BUILD --smoke
One cell:  BUILD/bench/bench_loadgen_client --socket SOCK --connections 100
               --seconds 3
"""

import argparse
import json
import os
import re
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (  # noqa: E402
    SRC_DIR, BenchError, log, machine_info, results_path, start_server,
    write_section)

WORKERS = [0, 100, 300]
CONNS = [0, 1, 16, 100, 300]
QUERY_CONNS = [1, 16, 100, 300]
QUERY_INFLIGHT = [1, 8]
ADMIT_WORKERS = 1000
ADMIT_CONNS = [1, 16, 100]
HOLD = [0, 1000, 10000]
HOLD_CONNS = 16
THREADS = 4
FLEET_LIMIT = "1TiB"
# Worker churn: each thread does BURST malloc/free replacements, then
# sleeps SLEEP_US (a bounded live set of LIVE blocks).
BURST, SLEEP_US, LIVE = 32, 100000, 128
CLK_TCK = os.sysconf("SC_CLK_TCK")


class Fail(Exception):
    pass


def cpu_seconds(pid):
    """utime + stime of pid, seconds (None when it is gone)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            s = f.read()
    except OSError:
        return None
    fields = s[s.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


# ---- the server ------------------------------------------------------------


class Memtallyd:
    """A memtallyd of the run (the harness's Server) with a metrics
    endpoint (its port found once it listens), `memtally status` and the
    tick's metrics."""

    def __init__(self, build, tmp, name, slots=4096):
        self.dir = os.path.join(tmp, name)
        os.makedirs(self.dir)
        self.cli = os.path.join(build, "programs", "memtally")
        try:
            self.server, _ = start_server(
                build, self.dir, sock=os.path.join(self.dir, "mt.sock"),
                segment="/mtload-%d-%s" % (os.getpid(), name), wait=10,
                required=True, log_level="warn",
                extra_args=["--reset", "--metrics", "127.0.0.1:0",
                            "--fleet-limit", FLEET_LIMIT, "--slots",
                            str(slots)])
        except BenchError as e:
            raise Fail(str(e))
        self.socket = self.server.socket
        self.pid = self.server.proc.pid
        self.alive, self.tail = self.server.alive, self.server.tail
        self.stop = self.server.stop
        self.port = None
        end = time.monotonic() + 10
        while time.monotonic() < end and self.alive():
            self.port = self._metrics_port()
            if self.port:
                return
            time.sleep(0.02)
        tail = self.tail()
        self.stop()
        raise Fail("memtallyd did not start: %s" % tail)

    def _metrics_port(self):
        # "metrics listening" is logged at info; we run at warn, so ask
        # the kernel which loopback port the process listens on instead.
        try:
            inodes = set()
            for fd in os.listdir("/proc/%d/fd" % self.pid):
                try:
                    link = os.readlink("/proc/%d/fd/%s" % (self.pid, fd))
                except OSError:
                    continue
                m = re.match(r"socket:\[(\d+)\]", link)
                if m:
                    inodes.add(m.group(1))
            with open("/proc/%d/net/tcp" % self.pid) as f:
                for line in f.readlines()[1:]:
                    p = line.split()
                    if p[3] == "0A" and p[9] in inodes:
                        return int(p[1].split(":")[1], 16)
        except OSError:
            pass
        return None

    def cli_status(self):
        p = subprocess.run([self.cli, "--socket", self.socket, "--json",
                            "status"], capture_output=True, text=True,
                           timeout=30)
        if p.returncode:
            raise Fail("memtally status failed (%d): %s%s" % (
                p.returncode, p.stderr.strip(),
                "" if self.alive() else "; memtallyd DIED: " + self.tail()))
        return json.loads(p.stdout)

    def metrics(self):
        url = "http://127.0.0.1:%d/metrics" % self.port
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line.startswith("memtally_tick_") or line.startswith(
                    "memtally_protocol_errors_total"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out


# ---- the workers -----------------------------------------------------------


class Fleet:
    """W preloaded bench_loadgen_worker processes."""

    def __init__(self, build, srv, n, threads, hold_kib=64):
        self.srv = srv
        self.procs = []
        self.errlog = open(os.path.join(srv.dir, "workers.err"), "w+")
        exe = os.path.join(build, "bench", "bench_loadgen_worker")
        env = dict(os.environ)
        for k in ("MEMTALLY_DISABLE", "MEMTALLY_DEBUG", "MEMTALLY_TASK"):
            env.pop(k, None)
        env["LD_PRELOAD"] = os.path.join(build, "client",
                                         "libmemtally_preload.so")
        env["MEMTALLY_SOCKET"] = srv.socket
        # The fleet must equal what the workers hold, exactly: their heap.
        # jemalloc's free pages, sampled on each worker's own clock, are
        # not part of that conservation check.
        env["MEMTALLY_ALLOCATOR_FREE"] = "0"
        argv = [exe, "--threads", str(threads), "--live", str(LIVE),
                "--burst", str(BURST), "--sleep-us", str(SLEEP_US),
                "--hold-kib", str(hold_kib)]
        for i in range(n):
            env["MEMTALLY_GROUP"] = "g%d" % (i % 8)
            self.procs.append(subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=self.errlog, env=env, text=True, bufsize=1))
        detached = 0
        for p in self.procs:
            line = p.stdout.readline()
            if not line.startswith("ready "):
                raise Fail("a worker did not start (exit %s): %s" % (
                    p.poll(), self._err()))
            if "attached=1" not in line:
                detached += 1
        if detached:
            # A registration that timed out on a busy machine is retried
            # by the client with back-off: give it a while.
            end = time.monotonic() + 15
            while srv.cli_status()["processes"] < n:
                if time.monotonic() > end:
                    raise Fail("%d of %d workers did not attach" % (
                        detached, n))
                time.sleep(0.1)
        self.last_ops = 0

    def _err(self):
        self.errlog.flush()
        self.errlog.seek(0)
        return self.errlog.read()[-400:]

    def pids(self):
        return [p.pid for p in self.procs]

    def cpu(self):
        return sum(c for c in (cpu_seconds(p) for p in self.pids()) if c)

    def _ask_all(self, cmd, prefix):
        for p in self.procs:
            p.stdin.write(cmd + "\n")
            p.stdin.flush()
        held = ops = 0
        for p in self.procs:
            line = p.stdout.readline().split()
            if not line or line[0:len(prefix)] != prefix:
                raise Fail("worker %d answered %r to %s: %s" % (
                    p.pid, line, cmd, self._err()))
            held += int(line[len(prefix) + 0])
            ops += int(line[len(prefix) + 2])
        return held, ops

    def pause(self):
        return self._ask_all("pause", ["held"])

    def resume(self):
        for p in self.procs:
            p.stdin.write("resume\n")
            p.stdin.flush()

    def exit(self):
        held = 0
        if self.procs:
            held, _ = self._ask_all("exit", ["bye", "held"])
        for p in self.procs:
            p.wait(30)
            if p.returncode:
                raise Fail("worker %d exited %d: %s" % (
                    p.pid, p.returncode, self._err()))
        self.procs = []
        return held

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait()
        self.procs = []


def wait_fleet(srv, bytes_, procs, timeout=5.0):
    """Poll status until the fleet holds exactly bytes_ in procs
    processes with no reservation; returns the status or raises."""
    end = time.monotonic() + timeout
    while True:
        st = srv.cli_status()
        f = st["fleet"]
        if (f["bytes"] == bytes_ and st["processes"] == procs
                and f["reserved"] == 0 and f.get("reservations", 0) == 0):
            return st
        if time.monotonic() > end:
            raise Fail(
                "LOST: fleet %d bytes in %d processes, reserved %d (%s "
                "reservations); the workers hold %d bytes in %d processes"
                % (f["bytes"], st["processes"], f["reserved"],
                   f.get("reservations"), bytes_, procs))
        time.sleep(0.02)


def verify(srv, fleet, nworkers):
    """Pause the workers, compare, resume. Returns the workers' ops."""
    held, ops = fleet.pause() if fleet.procs else (0, 0)
    t0 = time.monotonic()
    wait_fleet(srv, held, nworkers)
    ms = (time.monotonic() - t0) * 1e3
    if fleet.procs:
        fleet.resume()
    return held, ops, ms


# ---- one cell --------------------------------------------------------------


class Scraper(threading.Thread):
    """memtally_tick_last_duration_seconds every `every` seconds."""

    def __init__(self, srv, every=0.25):
        super().__init__(daemon=True)
        self.srv, self.every = srv, every
        self.samples = []
        self.halt = threading.Event()

    def run(self):
        while not self.halt.wait(self.every):
            try:
                m = self.srv.metrics()
                self.samples.append(m["memtally_tick_last_duration_seconds"])
            except (OSError, KeyError, ValueError):
                pass


def run_cell(build, srv, fleet, nworkers, conns, seconds, mix="cycle",
             inflight=1, admit_bytes=1 << 20, label="", hold=0, pin=None):
    """pin = (server CPU, client CPU) for this cell, or None."""
    exe = os.path.join(build, "bench", "bench_loadgen_client")
    la0 = os.getloadavg()[0]
    m0 = srv.metrics()
    c0, w0, t0 = cpu_seconds(srv.pid), fleet.cpu(), time.monotonic()
    scr = Scraper(srv)
    scr.start()
    lg = None
    if conns:
        argv = [exe, "--socket", srv.socket, "--connections", str(conns),
                "--seconds", str(seconds), "--warmup", "0.3", "--mix", mix,
                "--inflight", str(inflight), "--admit-bytes",
                str(admit_bytes), "--hold", str(hold)]
        allcpus = os.sched_getaffinity(0)
        if pin:
            os.sched_setaffinity(srv.pid, {pin[0]})
        try:
            p = subprocess.run(
                argv, capture_output=True, text=True, timeout=seconds + 120,
                preexec_fn=(lambda: os.sched_setaffinity(0, {pin[1]}))
                if pin else None)
        finally:
            if pin:
                os.sched_setaffinity(srv.pid, allcpus)
        try:
            lg = json.loads(p.stdout)
        except ValueError:
            lg = None
        if p.returncode or not lg:
            raise Fail("%s: %s (exit %d): %s%s" % (
                label, " ".join(argv), p.returncode, p.stderr.strip(),
                "" if srv.alive() else "; memtallyd DIED: " + srv.tail()))
    else:
        time.sleep(seconds + 0.3)
    c1, w1, t1 = cpu_seconds(srv.pid), fleet.cpu(), time.monotonic()
    scr.halt.set()
    scr.join()
    m1 = srv.metrics()
    if c1 is None:
        raise Fail("%s: memtallyd died: %s" % (label, srv.tail()))
    wall = t1 - t0
    n = m1["memtally_tick_duration_seconds_count"] - \
        m0["memtally_tick_duration_seconds_count"]
    s = m1["memtally_tick_duration_seconds_sum"] - \
        m0["memtally_tick_duration_seconds_sum"]
    perr = m1.get("memtally_protocol_errors_total", 0) - \
        m0.get("memtally_protocol_errors_total", 0)
    if perr:
        raise Fail("%s: the server counted %d protocol errors" % (label,
                                                                   perr))
    held, ops, settle_ms = verify(srv, fleet, nworkers)
    ops_rate = (ops - fleet.last_ops) / wall if fleet.procs else 0
    fleet.last_ops = ops
    cell = {
        "label": label, "workers": nworkers, "connections": conns,
        "mix": mix, "inflight": inflight, "admit_bytes": admit_bytes,
        "hold": hold, "pin": pin,
        "wall_s": wall,
        "server_cpu_pct": 100 * (c1 - c0) / wall,
        "workers_cpu_pct": 100 * (w1 - w0) / wall,
        "worker_ops_per_s": ops_rate,
        "tick_mean_us": s / n * 1e6 if n else None,
        "tick_max_sampled_us": max(scr.samples) * 1e6 if scr.samples
        else None,
        "tick_p50_sampled_us": statistics.median(scr.samples) * 1e6
        if scr.samples else None,
        "ticks_per_s": n / wall,
        "fleet_bytes_verified": held,
        "verify_settle_ms": settle_ms,
        "loadavg_start": la0, "loadavg_end": os.getloadavg()[0],
        "loadgen": lg,
    }
    log("  %-10s W %-4d C %-4d %-5s K %-2d %8s req/s  p50 %7s p99 %8s "
        "p999 %8s us | tick %5.1f us (max %6.1f) %3.0f/s | srv %3.0f%% "
        "wrk %3.0f%% cli %3s%% | fleet %d B ok" % (
            label, nworkers, conns, mix, inflight,
            "%.0f" % lg["per_second"] if lg else "-",
            "%.1f" % lg["all"]["p50_us"] if lg else "-",
            "%.1f" % lg["all"]["p99_us"] if lg else "-",
            "%.1f" % lg["all"]["p999_us"] if lg else "-",
            cell["tick_mean_us"] or 0, cell["tick_max_sampled_us"] or 0,
            cell["ticks_per_s"], cell["server_cpu_pct"],
            cell["workers_cpu_pct"],
            "%.0f" % lg["client_cpu_pct"] if lg else "-", held))
    return cell


# ---- where the server's time goes ------------------------------------------

SYSCALLS = ["read", "write", "epoll_wait", "epoll_ctl", "getrandom"]
PROFILE_W, PROFILE_C = 300, 100


def profile(build, tmp, seconds):
    """perf on memtallyd during one sweep cell (PROFILE_W workers,
    PROFILE_C connections): cpu-clock samples (no PMU needed) by library
    and symbol, then syscall counts per answered request (tracepoints)."""
    if not shutil.which("perf"):
        return {"skipped": "perf not found"}
    out = {"workers": PROFILE_W, "connections": PROFILE_C}
    srv = Memtallyd(build, tmp, "profile")
    fleet = None
    try:
        fleet = Fleet(build, srv, PROFILE_W, THREADS)
        data = os.path.join(srv.dir, "perf.data")
        statf = os.path.join(srv.dir, "perf.stat")
        events = ["syscalls:sys_enter_" + x for x in SYSCALLS] + \
            ["raw_syscalls:sys_enter"]
        for kind in ("record", "stat"):
            if kind == "record":
                argv = ["perf", "record", "-q", "-e", "cpu-clock", "-F",
                        "1999", "-p", str(srv.pid), "-o", data]
            else:
                argv = ["perf", "stat", "-x,", "-e", ",".join(events),
                        "-p", str(srv.pid), "-o", statf]
            perf = subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True)
            time.sleep(0.3)
            if perf.poll() is not None:
                out[kind] = "perf %s failed: %s" % (
                    kind, perf.stderr.read().strip()[-200:])
                continue
            cell = run_cell(build, srv, fleet, PROFILE_W, PROFILE_C,
                            seconds, label="profile")
            perf.send_signal(signal.SIGINT)
            try:
                perf.wait(60)
            except subprocess.TimeoutExpired:
                perf.kill()
                perf.wait()
            if kind == "record":
                out["record_cell"] = cell
                for sort, key, limit in (("dso", "by_dso", "0.5"),
                                         ("dso,sym", "by_sym", "1")):
                    p = subprocess.run(
                        ["perf", "report", "-i", data, "--stdio", "-q",
                         "--no-children", "--sort", sort,
                         "--percent-limit", limit],
                        capture_output=True, text=True)
                    rows = []
                    for line in p.stdout.splitlines():
                        m = re.match(r"\s*([\d.]+)%\s+(.*\S)", line)
                        if m:
                            rows.append([float(m.group(1)),
                                         re.sub(r"\s+", " ", m.group(2))])
                    out[key] = rows
            else:
                out["stat_cell"] = cell
                counts = {}
                try:
                    with open(statf) as f:
                        for line in f:
                            parts = line.strip().split(",")
                            if len(parts) > 2 and parts[0].isdigit():
                                name = parts[2].split(":")[-1]
                                name = name.replace("sys_enter_", "")
                                counts[name] = int(parts[0])
                except OSError:
                    pass
                answered = cell["loadgen"]["answered"]
                out["syscalls_per_answer"] = {
                    k: v / answered for k, v in counts.items()} \
                    if answered else {}
                out["answered"] = answered
        fleet.exit()
        wait_fleet(srv, 0, 0)
    finally:
        if fleet:
            fleet.kill()
        srv.stop()
    return out


# ---- report ----------------------------------------------------------------


def f0(x):
    return "-" if x is None else "%.0f" % x


def f1(x):
    return "-" if x is None else "%.1f" % x


def cpu_per_req(c):
    """memtallyd CPU per answered request, µs (the tick's share included:
    small next to the requests')."""
    lg = c["loadgen"]
    if not lg or not lg["per_second"]:
        return "-"
    return "%.1f" % (c["server_cpu_pct"] / 100 / lg["per_second"] * 1e6)


def lat(lg, k, kind="all"):
    if not lg:
        return "-"
    h = lg["all"] if kind == "all" else lg["by_type"][kind]
    return "%.0f" % h[k] if h[k] >= 100 else "%.1f" % h[k]


def report(info, res, args, build):
    L = ["## loadgen (many workers, many scheduler connections)\n"]
    L.append(
        "Measured %s on %s (%d CPUs, Linux %s); commit `%s`%s. Load "
        "average (1 min) %.2f at the start, %.2f at the end (the machine "
        "is shared: other jobs ran beside this one, so tails are noisy)."
        "\n" % (info["date"], info["cpu_model"], info["nproc"],
                info["kernel"], info["commit"],
                " with uncommitted changes" if info["uncommitted"] else "",
                info["loadavg_start"], os.getloadavg()[0]))
    L.append(
        "memtallyd of this build, defaults (4096 slots, 4 lanes, 10 ms "
        "tick) plus `--fleet-limit %s` and `--metrics`; nothing pinned. "
        "Workers: `bench_loadgen_worker` under the preload, %d threads "
        "each; every thread replaces a random block of its %d-block live "
        "set %d times (31/32 of sizes 8 B..4 KiB, a third of those by "
        "calloc; 1/32 4..260 KiB, malloc, untouched), then "
        "sleeps %d ms, i.e. at most %d malloc+free per second per thread "
        "(`wrk ops/s` is what they did). Client: `bench_loadgen_client`, "
        "one thread, epoll, raw frames; mix `cycle` = GetUsage, Admit "
        "(1 MiB, ttl 60 s), GetUsage, Release of its own reservation; one "
        "request in flight per connection unless K says otherwise; %g s "
        "per cell after 0.3 s of warm-up (2 s without connections). "
        "Latency: write of the request to parse of its answer, µs. Tick: "
        "the median and the largest of "
        "`memtally_tick_last_duration_seconds` scraped every 250 ms, and "
        "the mean of `memtally_tick_duration_seconds` over the cell (wall "
        "time: a tick preempted by another process counts whole, so the "
        "mean and max carry this machine's noise; the median does less); "
        "ticks/s (100 = the 10 ms timer kept up). CPU: memtallyd's "
        "utime+stime over the cell, %% of one core (the server is one "
        "thread: 100%% is its ceiling); `wrk` all workers together; `cli` "
        "the client. `server µs CPU/req` = server CPU / req/s: what one "
        "answer costs the server, which a busy shared machine does not "
        "distort as it does rates and tails.\n" % (
            FLEET_LIMIT, THREADS, LIVE, BURST, SLEEP_US // 1000,
            BURST * 1000000 // SLEEP_US, args.seconds))
    L.append(
        "Every cell is checked: every answer a success or a legitimate "
        "denial (ids in order, the body asked for, a reservation on each "
        "grant, Release of each grant); then the workers pause and flush "
        "and the fleet total must equal the sum of their "
        "`memtally_process_bytes()` exactly, with W processes and no "
        "reservation left; when a row's workers exit, the fleet must be "
        "0 bytes, 0 processes.\n")
    L.append("### Sweep: workers × connections (mix cycle, K = 1)\n")
    L.append("| workers (×%d thr) | conns | req/s | GetUsage/s | Admit/s | "
             "p50 µs | p99 µs | p99.9 µs | tick p50 µs | tick mean µs | "
             "tick max µs | "
             "ticks/s | server CPU %% | server µs CPU/req | wrk CPU %% | "
             "wrk ops/s | cli CPU %% | fleet checked, bytes |" % THREADS)
    L.append("|" + "---|" * 18)
    for c in res["sweep"]:
        lg = c["loadgen"]
        L.append("| %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | "
                 "%s | %s | %s | %s | %s | %s | %d |" % (
                     c["workers"], c["connections"],
                     f0(lg["per_second"]) if lg else "-",
                     f0(lg["by_type"]["get_usage"]["per_second"])
                     if lg else "-",
                     f0(lg["by_type"]["admit"]["per_second"])
                     if lg else "-",
                     lat(lg, "p50_us"), lat(lg, "p99_us"),
                     lat(lg, "p999_us"), f1(c["tick_p50_sampled_us"]),
                     f1(c["tick_mean_us"]),
                     f1(c["tick_max_sampled_us"]), f0(c["ticks_per_s"]),
                     f0(c["server_cpu_pct"]), cpu_per_req(c),
                     f0(c["workers_cpu_pct"]),
                     f0(c["worker_ops_per_s"]),
                     f0(lg["client_cpu_pct"]) if lg else "-",
                     c["fleet_bytes_verified"]))
    L.append("")
    L.append("Workers exited after each row; fleet then: %s.\n" % "; ".join(
        "W %d: %d bytes, %d processes" % (r["workers"], r["bytes"],
                                           r["processes"])
        for r in res["after_exit"]))
    if res.get("queries"):
        L.append("### Queries: GetUsage only, no workers, C connections × "
                 "K in flight each\n")
        L.append("K = 1 is one request at a time per connection; K = 8 "
                 "pipelines 8 per connection (a new one as each answer "
                 "arrives). One connection with larger windows: the "
                 "`server` suite's pipeline table.\n")
        L.append("`pinned`: server and client on one CPU (`same`), or each "
                 "on its own (`split`); otherwise nothing is pinned.\n")
        L.append("| conns | K | pinned | GetUsage/s | p50 µs | p99 µs | "
                 "p99.9 µs | max µs | server CPU % | server µs CPU/req | "
                 "cli CPU % |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for c in res["queries"]:
            lg = c["loadgen"]
            pin = c.get("pin")
            L.append("| %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | "
                     "%s |" % (
                c["connections"], c["inflight"],
                "-" if not pin else "same" if pin[0] == pin[1] else "split",
                f0(lg["per_second"]),
                lat(lg, "p50_us"), lat(lg, "p99_us"), lat(lg, "p999_us"),
                lat(lg, "max_us"), f0(c["server_cpu_pct"]), cpu_per_req(c),
                f0(lg["client_cpu_pct"])))
        L.append("")
    if res.get("hold"):
        L.append("### Admit and Release against outstanding reservations\n")
        L.append(
            "No workers; before the run, a connection of its own takes R "
            "reservations (1 MiB each, TTL past the run) and releases them "
            "after it; meanwhile %d connections run mix `admit` (Admit "
            "1 MiB, Release of the grant), one in flight each.\n"
            % HOLD_CONNS)
        L.append("| R outstanding | decisions/s | req/s | Admit p50 µs | "
                 "Admit p99 µs | Release p50 µs | server CPU % | "
                 "server µs CPU/req |")
        L.append("|---|---|---|---|---|---|---|---|")
        for c in res["hold"]:
            lg = c["loadgen"]
            L.append("| %d | %s | %s | %s | %s | %s | %s | %s |" % (
                c["hold"], f0(lg["by_type"]["admit"]["per_second"]),
                f0(lg["per_second"]), lat(lg, "p50_us", "admit"),
                lat(lg, "p99_us", "admit"), lat(lg, "p50_us", "release"),
                f0(c["server_cpu_pct"]), cpu_per_req(c)))
        L.append("")
    if res.get("admit1000"):
        a = res["admit1000"]
        L.append("### Admit decisions per second with %d live workers\n"
                 % a["workers"])
        L.append(
            "%d idle registered workers (`bench_loadgen_worker --threads "
            "0`, 64 KiB each, fleet %d bytes, checked after every row). "
            "Mix `admit`: Admit, then Release of the grant, one request in "
            "flight per connection; `granted` asks 1 MiB, `denied` asks "
            "2 TiB (> the %s fleet limit: every answer is a denial with "
            "the reason and the 5 largest of the %d processes). Decisions/s "
            "= Admit answers per second; req/s counts the Releases too.\n"
            % (a["workers"], a["fleet_bytes"], FLEET_LIMIT, a["workers"]))
        L.append("| conns | Admits | decisions/s | req/s | Admit p50 µs | "
                 "Admit p99 µs | Admit p99.9 µs | tick p50 µs | "
                 "tick mean µs | server CPU % | server µs CPU/req | "
                 "cli CPU % |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for c in a["cells"]:
            lg = c["loadgen"]
            cols = (" %s |" * 11) % (
                        "granted" if c["admit_bytes"] < 1 << 40
                        else "denied",
                        f0(lg["by_type"]["admit"]["per_second"]),
                        f0(lg["per_second"]),
                        lat(lg, "p50_us", "admit"),
                        lat(lg, "p99_us", "admit"),
                        lat(lg, "p999_us", "admit"),
                        f1(c["tick_p50_sampled_us"]),
                        f1(c["tick_mean_us"]), f0(c["server_cpu_pct"]),
                        cpu_per_req(c), f0(lg["client_cpu_pct"]))
            L.append("| %d |%s" % (c["connections"], cols))
        L.append("")
    if res.get("profile") and res["profile"].get("by_dso"):
        pr = res["profile"]
        c = pr["record_cell"]
        L.append("### Where memtallyd spends its time\n")
        L.append(
            "`perf record -e cpu-clock` (no PMU in this guest) on memtallyd "
            "during a sweep cell of %d workers and %d connections "
            "(%s req/s, server %s%% CPU, %s µs CPU per request), then "
            "`perf stat` of syscall tracepoints during the same cell again. "
            "Share of memtallyd's samples by object: %s.\n" % (
                pr["workers"], pr["connections"],
                f0(c["loadgen"]["per_second"]), f0(c["server_cpu_pct"]),
                cpu_per_req(c), ", ".join(
                    "%s %.1f%%" % (n, v) for v, n in pr["by_dso"])))
        L.append("Symbols over 1%%: %s.\n" % ", ".join(
            "`%s` %.1f%%" % (n.split(" ", 1)[-1], v)
            for v, n in pr["by_sym"]))
        if pr.get("syscalls_per_answer"):
            L.append("Syscalls per answered request: %s (all syscalls: "
                     "%.2f).\n" % (", ".join(
                         "%s %.2f" % (k, pr["syscalls_per_answer"].get(k, 0))
                         for k in SYSCALLS),
                         pr["syscalls_per_answer"].get("sys_enter", 0)))
    rel = os.path.relpath(build, SRC_DIR)
    L.append("Rerun: `cmake --build %s --target bench_loadgen` (about %.0f "
             "s); one cell by hand: `%s/bench/bench_loadgen_client --socket "
             "SOCK --connections 100 --seconds 3 [--mix admit] "
             "[--inflight 8]`; JSON in `%s/bench/loadgen.json`." % (
                 rel, res["elapsed_s"], rel, rel))
    return "\n".join(L)


# ---- main ------------------------------------------------------------------


def raise_nofile(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, n)) if hard != resource.RLIM_INFINITY \
        else max(soft, n)
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def smoke(build, tmp):
    srv = Memtallyd(build, tmp, "smoke", slots=64)
    fleet = None
    try:
        fleet = Fleet(build, srv, 3, 2)
        c = run_cell(build, srv, fleet, 3, 8, 2.0, label="smoke")
        lg = c["loadgen"]
        if not lg["ok"] or lg["errors"] or lg["requests"] <= 0:
            raise Fail("smoke: %s" % json.dumps(lg))
        if lg["by_type"]["admit"]["count"] <= 0 or \
                lg["by_type"]["release"]["count"] <= 0:
            raise Fail("smoke: no Admit or Release answered")
        fleet.exit()
        wait_fleet(srv, 0, 0)
        log("loadgen smoke: OK (%d requests, fleet checked, 0 after exit)"
            % lg["requests"])
    finally:
        if fleet:
            fleet.kill()
        srv.stop()
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(SRC_DIR, "build"))
    ap.add_argument("--json")
    ap.add_argument("--results-md",
                    default=results_path("loadgen"))
    ap.add_argument("--seconds", type=float, default=4.0,
                    help="per sweep cell (queries 2 s, admit 3 s)")
    ap.add_argument("--workers", type=lambda s: [int(x) for x in
                                                  s.split(",")],
                    default=WORKERS)
    ap.add_argument("--connections", type=lambda s: [int(x) for x in
                                                      s.split(",")],
                    default=CONNS)
    ap.add_argument("--admit-workers", type=int, default=ADMIT_WORKERS)
    ap.add_argument("--no-queries", action="store_true")
    ap.add_argument("--no-admit", action="store_true")
    ap.add_argument("--no-results-md", action="store_true")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--no-hold", action="store_true")
    ap.add_argument("--smoke", action="store_true",
                    help="~3 s check: 3 workers, 8 connections")
    argv = sys.argv[1:] + shlex.split(os.environ.get("MEMTALLY_BENCH_ARGS",
                                                     ""))
    args = ap.parse_args(argv)
    build = os.path.abspath(args.build_dir)
    for exe in ("server/memtallyd", "programs/memtally",
                "client/libmemtally_preload.so",
                "bench/bench_loadgen_client", "bench/bench_loadgen_worker"):
        if not os.path.exists(os.path.join(build, exe)):
            log("loadgen: FAILED: %s/%s is not built" % (build, exe))
            return 1
    # Each worker costs this driver two pipes and the server a pidfd.
    nofile = raise_nofile(8192)
    need = 2 * max(args.workers + [args.admit_workers]) + 64
    if nofile < need:
        log("loadgen: FAILED: RLIMIT_NOFILE %d < %d needed" % (nofile, need))
        return 1
    tmp = tempfile.mkdtemp(prefix="mtbench-loadgen-")
    if args.smoke:
        try:
            return smoke(build, tmp)
        except Fail as e:
            log("loadgen smoke: FAILED: %s" % e)
            return 1
    info = machine_info()
    t_start = time.monotonic()
    res = {"sweep": [], "after_exit": [], "queries": [], "admit1000": None,
           "hold": [],
           "config": {"threads": THREADS, "burst": BURST,
                      "sleep_us": SLEEP_US, "live": LIVE,
                      "fleet_limit": FLEET_LIMIT,
                      "seconds": args.seconds}}
    try:
        for w in args.workers:
            srv = Memtallyd(build, tmp, "sweep-w%d" % w)
            fleet = None
            try:
                t0 = time.monotonic()
                fleet = Fleet(build, srv, w, THREADS)
                log("loadgen: %d workers x %d threads up in %.1f s" % (
                    w, THREADS, time.monotonic() - t0))
                for c in args.connections:
                    res["sweep"].append(run_cell(
                        build, srv, fleet, w, c,
                        args.seconds if c else 2.0, label="sweep"))
                fleet.exit()
                st = wait_fleet(srv, 0, 0)
                res["after_exit"].append({
                    "workers": w, "bytes": st["fleet"]["bytes"],
                    "processes": st["processes"]})
            finally:
                if fleet:
                    fleet.kill()
                srv.stop()
        if not args.no_queries:
            srv = Memtallyd(build, tmp, "queries")
            try:
                fleet = Fleet(build, srv, 0, 0)
                cpus = sorted(os.sched_getaffinity(0))
                pins = [None]
                if len(cpus) > 1:
                    pins += [(cpus[0], cpus[0]), (cpus[0], cpus[1])]
                for c in QUERY_CONNS:
                    for k in QUERY_INFLIGHT:
                        for pin in pins if c == 1 and k == 1 else [None]:
                            res["queries"].append(run_cell(
                                build, srv, fleet, 0, c, 2.0, mix="usage",
                                inflight=k, label="queries", pin=pin))
            finally:
                srv.stop()
        if not args.no_hold:
            srv = Memtallyd(build, tmp, "hold")
            try:
                fleet = Fleet(build, srv, 0, 0)
                for r in HOLD:
                    res["hold"].append(run_cell(
                        build, srv, fleet, 0, HOLD_CONNS, 3.0, mix="admit",
                        hold=r, label="hold%d" % r))
            finally:
                srv.stop()
        if not args.no_admit and args.admit_workers:
            n = args.admit_workers
            srv = Memtallyd(build, tmp, "admit", slots=max(4096, n + 64))
            fleet = None
            try:
                t0 = time.monotonic()
                fleet = Fleet(build, srv, n, 0, hold_kib=64)
                log("loadgen: %d idle workers up in %.1f s" % (
                    n, time.monotonic() - t0))
                held, _, _ = verify(srv, fleet, n)
                a = {"workers": n, "fleet_bytes": held, "cells": []}
                for c in ADMIT_CONNS:
                    for nbytes in (1 << 20, 2 << 40):
                        a["cells"].append(run_cell(
                            build, srv, fleet, n, c, 3.0, mix="admit",
                            admit_bytes=nbytes, label="admit%d" % n))
                res["admit1000"] = a
                fleet.exit()
                wait_fleet(srv, 0, 0, timeout=20)
            finally:
                if fleet:
                    fleet.kill()
                srv.stop()
        if not args.no_profile:
            res["profile"] = profile(build, tmp, args.seconds)
            log("  profile: %s" % json.dumps(
                {k: v for k, v in res["profile"].items()
                 if not k.endswith("_cell")})[:1500])
    except Fail as e:
        log("loadgen: FAILED: %s" % e)
        return 1
    res["elapsed_s"] = time.monotonic() - t_start
    res["machine"] = info
    text = report(info, res, args, build)
    print(text)
    jpath = args.json or os.path.join(build, "bench", "loadgen.json")
    with open(jpath, "w") as f:
        json.dump(res, f, indent=1)
    log("JSON: %s" % jpath)
    if not args.no_results_md:
        write_section(args.results_md, "loadgen", text)
        log("wrote the loadgen section of %s" % args.results_md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
