"""The real programs the `real` and `frontends` suites run, and their
workloads: sqlite3 :memory:, python3, g++ and redis-server, each with how
to run it timed and how to hold it at its peak (real.py says what each
suite measures with them). A library of the drivers, not a driver: it
runs nothing when imported.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import BenchError  # noqa: E402

VARIANTS = ["glibc", "jemalloc", "preload"]

# ---- workloads ---------------------------------------------------------------

# Rows at --scale 1: ~1 s of CPU on the 2-CPU Xeon guest, ~60 MB held at
# the end (the in-memory database lives in sqlite's page cache, which
# sqlite allocates with malloc and counts in "Memory Used").
SQLITE_ROWS = 60000
SQLITE_SQL = """\
PRAGMA cache_size=-524288;
PRAGMA temp_store=MEMORY;
CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER, s TEXT, b BLOB);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<{rows})
INSERT INTO t SELECT x, (x*2654435761)%1000003,
  printf('%.*c%d', 20+x%200, 'a', (x*7919)%100003), randomblob(100+x%900)
  FROM c;
CREATE INDEX t_k ON t(k);
CREATE INDEX t_s ON t(s);
SELECT k%1000 AS g, count(*), sum(length(b)), max(length(s)) FROM t
  GROUP BY g ORDER BY 3 DESC LIMIT 3;
SELECT count(*), max(length(s)) FROM (SELECT s, k FROM t ORDER BY s DESC, k);
SELECT count(DISTINCT substr(s,1,30)||k) FROM t;
UPDATE t SET s = s || 'x', b = randomblob(50+id%700) WHERE id % 3 = 0;
DELETE FROM t WHERE id % 5 = 0;
SELECT count(*), sum(length(b)) FROM t;
"""

# The python workload. Objects above 512 bytes come from malloc; smaller
# ones from pymalloc's arenas, which CPython maps itself (mmap, 1 MiB
# each, 3.11) and which no malloc interposer can see. In --hold mode it
# then holds HOLD_MIB of bytes objects of 1..64 KiB (all malloc'd) and
# prints its own idea of what they take.
PY_RECORDS = 8000
PY_HOLD_MIB = 64
PY_SCRIPT = r'''
import gc, json, sys

def work(n):
    total = 0
    for rnd in range(6):
        recs = [{"id": i, "name": "user-%d" % i,
                 "tags": ["t%d" % (i % 17), "x" * (i % 40)],
                 "blob": ("%08x" % (i * 2654435761 % 2**32)) * (80 + i % 120)}
                for i in range(n)]
        text = json.dumps(recs)
        back = json.loads(text)
        total += len(text) + len(back)
        chunks = [b"%d" % i * (100 + (i * 7) % 4000) for i in range(n)]
        joined = b"".join(chunks)
        ba = bytearray()
        for c in chunks[: n // 4]:
            ba += c
        total += len(joined) + len(ba)
        del recs, text, back, chunks, joined, ba
    return total

def je_class(n):
    # jemalloc 5's size classes: 8, 16, 32, 48, ... 128, then four per
    # doubling (e.g. 160, 192, 224, 256).
    if n <= 8:
        return 8
    if n <= 128:
        return (n + 15) // 16 * 16
    step = 1 << ((n - 1).bit_length() - 3)
    return (n + step - 1) // step * step

n, hold_mib = int(sys.argv[1]), int(sys.argv[2])
work(n)
if len(sys.argv) > 3:  # --hold
    gc.collect()
    print("MT-BASE", flush=True)
    sys.stdin.readline()
    sizes, total, i = [], 0, 0
    while total < hold_mib << 20:
        s = 1024 + (i * 40503) % (63 * 1024)  # 1 KiB .. 64 KiB
        sizes.append(s)
        total += s
        i += 1
    held = [None] * len(sizes)  # the item array: exactly 8 bytes per item
    for j, s in enumerate(sizes):
        held[j] = bytes(s)
    own = sum(sys.getsizeof(b) for b in held) + 8 * len(held)
    at_class = (sum(je_class(sys.getsizeof(b)) for b in held)
                + je_class(8 * len(held)))
    print("MT-OWN " + json.dumps({"requested": own, "at_size_class": at_class,
                                  "objects": len(held)}))
    print("MT-HELD", flush=True)
    sys.stdin.readline()
'''


class Program:
    """One real program: how to run it timed, and how to hold it."""

    name = ""
    exe = ""
    links_jemalloc = False  # DT_NEEDED libjemalloc.so.2 (redis-server)
    variants = VARIANTS     # those that mean something for the program
    served = False          # a server driven by a client (Redis below)

    def available(self):
        return os.access(self.exe, os.X_OK)

    def timed(self, tmp, scale):
        """(argv, path of stdin or None) of one timed run."""
        raise NotImplementedError

    def held(self, tmp, scale):
        """(argv, [(input to send, marker to wait for), ...]) of a held
        run; the last marker means: workload done, memory held."""
        raise NotImplementedError

    def own(self, stages):
        """The program's own figures, from the stages' output lines."""
        raise NotImplementedError


class Sqlite(Program):
    name = "sqlite3"
    exe = shutil.which("sqlite3") or "/usr/bin/sqlite3"

    def sql(self, tmp, scale):
        path = os.path.join(tmp, "sqlite-%g.sql" % scale)
        with open(path, "w") as f:
            f.write(SQLITE_SQL.format(rows=max(100, int(SQLITE_ROWS * scale))))
        return path

    def timed(self, tmp, scale):
        return [self.exe, ":memory:"], self.sql(tmp, scale)

    def held(self, tmp, scale):
        with open(self.sql(tmp, scale)) as f:
            sql = f.read()
        # `.stats` prints sqlite3_memory_used() as "Memory Used"; the CLI
        # flushes its output before it reads the next line of stdin.
        return [self.exe, ":memory:"], [
            (".stats\n.print MT-BASE\n", "MT-BASE"),
            (sql + ".stats\n.print MT-HELD\n", "MT-HELD")]

    def own(self, stages):
        figs = []
        for lines in stages:
            used = [int(m.group(1)) for m in
                    (re.match(r"Memory Used:\s+(\d+)", x) for x in lines) if m]
            if not used:
                raise BenchError("sqlite3: no 'Memory Used' in .stats output")
            figs.append(used[-1])
        return {"base": figs[0], "held": figs[1],
                "what": "sqlite3_memory_used() (.stats 'Memory Used')"}


class Python(Program):
    name = "python3"
    exe = "/usr/bin/python3"  # the distribution's, not a pyenv shim

    def script(self, tmp):
        path = os.path.join(tmp, "workload.py")
        with open(path, "w") as f:
            f.write(PY_SCRIPT)
        return path

    def args(self, scale):
        return [str(max(100, int(PY_RECORDS * scale))),
                str(max(2, int(PY_HOLD_MIB * scale)))]

    def timed(self, tmp, scale):
        return [self.exe, self.script(tmp)] + self.args(scale), None

    def held(self, tmp, scale):
        return ([self.exe, self.script(tmp)] + self.args(scale) + ["--hold"],
                [("", "MT-BASE"), ("go\n", "MT-HELD")])

    def own(self, stages):
        for x in stages[1]:
            if x.startswith("MT-OWN "):
                d = json.loads(x[len("MT-OWN "):])
                return {"base": 0, "held": d["requested"],
                        "held_at_size_class": d["at_size_class"],
                        "objects": d["objects"],
                        "what": "sum of sys.getsizeof() of the held bytes "
                                "objects + their list's item array"}
        raise BenchError("python3: no MT-OWN line")


# A C++ translation unit heavy on the standard library's templates: g++
# -O2 spends ~1 s in cc1plus on it. Written for this suite; what runs is
# the distribution's compiler.
GXX_SOURCE = """
#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>
std::map<std::string, std::vector<int>> f(const std::string &s) {
  std::map<std::string, std::vector<int>> m;
  std::istringstream in(s);
  std::string w;
  while (in >> w) m[w.substr(0, 1)].push_back((int)w.size());
  for (auto &kv : m) std::sort(kv.second.begin(), kv.second.end());
  return m;
}
int main() {
  std::unordered_map<std::string, int> u;
  std::ostringstream o;
  for (auto &kv : f("a=1 b=2")) { o << kv.first; u[kv.first] += (int)kv.second.size(); }
  return (int)o.str().size() + (int)u.size();
}
"""


class Gxx(Program):
    """g++ -O2 -c: the driver runs cc1plus, then as, each a process of its
    own (LD_PRELOAD and MALLOC_CONF reach all of them). Nothing waits on
    stdin, so its proof run is watched from outside instead of held."""

    name = "g++"
    exe = shutil.which("g++") or "/usr/bin/g++"
    watch_comm = "cc1plus"

    def source(self, tmp):
        path = os.path.join(tmp, "unit.cpp")
        with open(path, "w") as f:
            f.write(GXX_SOURCE)
        return path

    def timed(self, tmp, scale):
        # --scale does not apply: one translation unit, ~1 s.
        return [self.exe, "-O2", "-c", self.source(tmp), "-o",
                os.path.join(tmp, "unit.o")], None

    def watched(self, tmp):
        argv, _ = self.timed(tmp, 1.0)
        # -fmem-report: gcc's own idea of its memory (the GGC heap).
        return argv + ["-fmem-report"]

    def own(self, stderr_text):
        # The "Memory still allocated at the end of the compilation
        # process" table, its "Total  75M  67M  998k" row.
        i = stderr_text.find("Memory still allocated at the end")
        m = re.search(r"^Total\s+(\d+)([kMG]?)\s", stderr_text[i:], re.M) \
            if i >= 0 else None
        if not m:
            raise BenchError("g++: no GGC total in -fmem-report output")
        unit = {"": 1, "k": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)]
        return {"base": 0, "held": int(m.group(1)) * unit, "peak": True,
                "what": "cc1plus's GGC heap at the end (-fmem-report)"}


# Debian's redis-server is linked to libjemalloc.so.2 and calls its malloc,
# free, malloc_usable_size and mallctl: under the preload every one of them
# must reach the preload's jemalloc (one heap).
REDIS_REQUESTS = 200000
REDIS_KEYSPACE = 100000


class Redis(Program):
    """redis-server on a Unix socket, filled with REDIS_KEYSPACE keys of
    256 B (DEBUG POPULATE), then driven by redis-benchmark (SET then GET of
    256 B values, one connection, pipelined by 16), then shut down. The timed process is the server; the client runs on
    the other CPUs. redis as installed already runs on jemalloc, so its
    variants are jemalloc and preload only."""

    name = "redis"
    exe = shutil.which("redis-server") or "/usr/bin/redis-server"
    bench = shutil.which("redis-benchmark") or "/usr/bin/redis-benchmark"
    cli = shutil.which("redis-cli") or "/usr/bin/redis-cli"
    links_jemalloc = True
    variants = ["jemalloc", "preload"]
    served = True

    def available(self):
        return all(os.access(x, os.X_OK)
                   for x in (self.exe, self.bench, self.cli))

    def sock(self, tmp):
        return os.path.join(tmp, "redis.sock")

    def server_argv(self, tmp):
        # --hz 1: redis's cron reads jemalloc's statistics (mallctl
        # "epoch", ~70k instructions) each time it runs, 10 times a second
        # by default, so a run's instruction count would grow with its wall
        # time (under cachegrind, with the machine's load): a cron once a
        # second keeps that below 0.01% of a run.
        return [self.exe, "--port", "0", "--unixsocket", self.sock(tmp),
                "--save", "", "--appendonly", "no", "--dir", tmp,
                "--loglevel", "warning", "--hz", "1",
                "--enable-debug-command", "local"]

    def requests(self, scale):
        return max(1000, int(REDIS_REQUESTS * scale))

    def wait_up(self, tmp, proc, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if proc.poll() is not None:
                raise BenchError("redis-server exited at start (%s)" %
                                 proc.returncode)
            if os.path.exists(self.sock(tmp)) and subprocess.run(
                    [self.cli, "-s", self.sock(tmp), "PING"],
                    capture_output=True, text=True).stdout.strip() == "PONG":
                return
            time.sleep(0.02)
        raise BenchError("redis-server did not answer within %d s" % timeout)

    def keys(self, scale):
        return max(100, int(REDIS_KEYSPACE * scale))

    def drive(self, tmp, scale, cpus):
        """The same load every time, so that two runs execute the same
        instructions: DEBUG POPULATE fills the keyspace (keys key:0..N-1,
        256 B values), then one redis-benchmark connection sends the SETs
        and GETs of a 256 B value, pipelined by 16. (redis-benchmark's
        random keys, -r, are seeded from the clock: two runs of the same
        variant then differed by up to 0.75% in instructions.)"""
        aff = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        p = subprocess.run([self.cli, "-s", self.sock(tmp), "DEBUG",
                            "POPULATE", str(self.keys(scale)), "key", "256"],
                           capture_output=True, text=True, preexec_fn=aff)
        if p.returncode != 0 or p.stdout.strip() != "OK":
            raise BenchError("DEBUG POPULATE failed: %s %s" % (
                p.stdout[-200:], p.stderr[-200:]))
        p = subprocess.run(
            [self.bench, "-s", self.sock(tmp), "-c", "1",
             "-n", str(self.requests(scale)), "-d", "256", "-P", "16",
             "-t", "set,get", "-q"],
            capture_output=True, text=True, preexec_fn=aff)
        if p.returncode != 0:
            raise BenchError("redis-benchmark failed: %s" % p.stderr[-500:])

    def shutdown(self, tmp):
        # The server closes the connection as it exits: no reply to check.
        subprocess.run([self.cli, "-s", self.sock(tmp), "SHUTDOWN", "NOSAVE"],
                       capture_output=True, text=True)

    def info(self, tmp):
        """INFO memory, plus `je_allocated`: jemalloc's own "Allocated"
        figure as redis prints it with malloc_stats_print (MEMORY
        MALLOC-STATS), read fresh (INFO's allocator_* figures are those of
        redis's last cron)."""
        out = subprocess.run([self.cli, "-s", self.sock(tmp), "INFO",
                              "memory"], capture_output=True, text=True).stdout
        d = dict(x.strip().split(":", 1) for x in out.splitlines()
                 if ":" in x)
        out = subprocess.run([self.cli, "-s", self.sock(tmp), "MEMORY",
                              "MALLOC-STATS"], capture_output=True,
                             text=True).stdout
        m = re.search(r"^Allocated: (\d+)", out, re.M)
        d["je_allocated"] = int(m.group(1)) if m else -1
        return d

    def timed(self, tmp, scale):
        return self.server_argv(tmp), None


ALL_PROGRAMS = {p.name: p for p in (Sqlite(), Python(), Gxx(), Redis())}


def pin(cpu):
    if cpu is None:
        return None
    return lambda: os.sched_setaffinity(0, {cpu})


def descendants(pid):
    """pid's live descendants, from /proc/PID/task/PID/children."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            with open("/proc/%d/task/%d/children" % (p, p)) as f:
                kids = [int(k) for k in f.read().split()]
        except OSError:
            continue
        out += kids
        todo += kids
    return out


def comm_of(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return ""
