"""A worker that frees its heap and goes quiet is counted for what it still
holds, without allocating again.

Each runtime builds about 300 MiB of small objects, holds them, drops
them (frees; `del` + `gc.collect()` in python3; DROP TABLE + VACUUM in an
sqlite3 `:memory:` database), then stays idle for 10 s without any
allocation: C under the glibc front end and under the jemalloc preload,
C++ (std::list nodes, jemalloc), sqlite3's shell, python3 with its
default allocator (glibc) and with MEMTALLY_ALLOCATOR=jemalloc. All run
at once, under one server.

- Held: memtally's figure grew as RssAnon did, within 10% or 16 MiB.
- Dropped: what the allocator keeps resident after the free (glibc's
  free chunks, jemalloc's dirty pages, which it purges only when the
  process calls it again) stays counted: within 5 s of the drop the
  figure's growth since start is within 10% or 16 MiB of RssAnon's, and
  still is 10 s after the drop. Before the refresh thread, the figure
  fell to what the program holds (about nothing) while RssAnon stayed
  hundreds of MiB above its start, and stayed there for as long as the
  process was quiet.
"""
import os
import shutil
import time

from harness import (MIB, MULT, PRELOAD, Server, Skip, Worker, check,
                     in_parallel, rss_anon, run, wait_for, worker)

GLIBC_LIB = os.path.join(os.path.dirname(PRELOAD), "libmemtally_glibc.so")
PYTHON = "/usr/bin/python3"
SQLITE = shutil.which("sqlite3")

PY_SCRIPT = r"""
import gc, os, sys
print("ready pid=%d" % os.getpid(), flush=True)
sys.stdin.readline()
held = [(i, "s%07d" % i, {"k": i}) for i in range(950000)]
print("built", flush=True)
sys.stdin.readline()
del held
gc.collect()
print("dropped", flush=True)
sys.stdin.readline()
"""

# sqlite3's shell: 300 MiB of rows in an in-memory database, dropped and
# vacuumed (the database shrinks, its page cache frees the pages).
SQL_BUILD = ("CREATE TABLE t(a INTEGER, b TEXT); "
             "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c "
             "WHERE x < 280000) INSERT INTO t SELECT x, printf('%01000d', x) "
             "FROM c; SELECT 'built';")
SQL_DROP = "DROP TABLE t; VACUUM; SELECT 'dropped';"


class Runtime:
    def __init__(self, name, argv, env_extra, preload, build, drop,
                 ready=True):
        self.name, self.argv, self.env_extra = name, argv, env_extra
        self.preload, self.build, self.drop = preload, build, drop
        self.ready = ready  # says "ready pid=P" first


def runtimes():
    rts = [
        Runtime("C, glibc", [*worker("quiet"), "300"],
                {"MEMTALLY_ALLOCATOR": "glibc"}, GLIBC_LIB, "build", "drop"),
        Runtime("C, jemalloc", [*worker("quiet"), "300"],
                {"MEMTALLY_ALLOCATOR": "jemalloc"}, PRELOAD, "build", "drop"),
        Runtime("C++, jemalloc", [*worker("mt_quiet_cxx"), "300"],
                {"MEMTALLY_ALLOCATOR": "jemalloc"}, PRELOAD, "build", "drop"),
    ]
    if os.access(PYTHON, os.X_OK):  # else the test skips
        for alloc in ("glibc", "jemalloc"):
            env = {"PYTHONMALLOC": None}
            lib = GLIBC_LIB
            if alloc == "jemalloc":
                env["MEMTALLY_ALLOCATOR"] = "jemalloc"
                lib = PRELOAD
            rts.append(Runtime(f"python3, {alloc}", [PYTHON, "-c", PY_SCRIPT],
                               env, lib, "", ""))
    if SQLITE:
        rts.append(Runtime("sqlite3 :memory:, jemalloc",
                           [SQLITE, "-batch", ":memory:"],
                           {"MEMTALLY_ALLOCATOR": "jemalloc"}, PRELOAD,
                           SQL_BUILD, SQL_DROP, ready=False))
    return rts


def within(fig, anon):
    """memtally's growth `fig` agrees with RssAnon's `anon`: 10% or 16 MiB."""
    return abs(fig - anon) <= max(0.10 * abs(anon), 16 * MIB)


class Run:
    """One runtime's worker and its figures, relative to its start."""

    def __init__(self, s, rt):
        self.s, self.rt = s, rt
        env = s.env(LD_PRELOAD=rt.preload)
        env.pop("MEMTALLY_ALLOCATOR_SWITCHED", None)
        for k, v in rt.env_extra.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        self.w = Worker(rt.argv, env)
        self.pid = self.w.pid
        if rt.ready:
            check(self.w.readline().startswith("ready"), f"{rt.name} ready")
        self.anon0 = rss_anon(self.pid)
        p = s.ps().get(self.pid)
        self.fig0 = p["bytes"] if p else 0
        self.rows = {}

    def growth(self):
        p = self.s.ps().get(self.pid)
        fig = (p["bytes"] if p else 0) - self.fig0
        return fig, rss_anon(self.pid) - self.anon0, p

    def step(self, line, answer):
        self.w.send(line)
        got = self.w.readline(timeout=60)
        check(got == answer, f"{self.rt.name}: {answer}: {got!r}")

    def agree(self, what, timeout):
        """Poll until the figure agrees with RssAnon; keep the last pair."""
        def ok():
            fig, anon, p = self.growth()
            self.rows[what] = (fig, anon, p)
            return within(fig, anon)
        try:
            wait_for(f"{self.rt.name}: {what}", ok, timeout=timeout)
        except AssertionError:
            pass
        fig, anon, p = self.rows[what]
        return within(fig, anon)


def test_quiet_after_free():
    # Every runtime the docstring names, or a skip that says which is
    # missing: a test that ran fewer would pass on what it left out.
    if not os.access(PYTHON, os.X_OK) or not SQLITE:
        raise Skip("needs /usr/bin/python3 and sqlite3 (apt-get install "
                   "python3 sqlite3): "
                   + ("no python3" if not os.access(PYTHON, os.X_OK)
                      else "no sqlite3"))
    failures = []
    with Server() as s:
        runs = []
        try:
            for rt in runtimes():
                runs.append(Run(s, rt))

            def held(r):
                r.step(r.rt.build, "built")
                if not r.agree("held", timeout=10):
                    failures.append(f"{r.rt.name}: held {r.rows['held'][:2]}")

            in_parallel(runs, held)

            def dropped(r):
                r.step(r.rt.drop, "dropped")
                r.t_drop = time.monotonic()
                # 5 s after the drop (the allocator settles: glibc keeps,
                # jemalloc's decay does not run while the process is quiet).
                if not r.agree("5 s after the drop", timeout=5):
                    failures.append(f"{r.rt.name}: 5 s after the drop "
                                    f"{r.rows['5 s after the drop'][:2]}")
                end = r.t_drop + 10 * MULT
                wait_for("10 s of quiet", lambda: time.monotonic() >= end,
                         timeout=11, interval=0.2)
                if not r.agree("10 s after the drop", timeout=1):
                    failures.append(f"{r.rt.name}: 10 s after the drop "
                                    f"{r.rows['10 s after the drop'][:2]}")

            in_parallel(runs, dropped)
        finally:
            for r in runs:
                r.w.close()
    print(f"  {'runtime':28} {'held: memtally / RssAnon':>28} "
          f"{'dropped +5 s':>22} {'+10 s':>22}")
    for r in runs:
        cells = []
        for what in ("held", "5 s after the drop", "10 s after the drop"):
            fig, anon, _ = r.rows.get(what, (0, 0, None))
            cells.append(f"{fig / MIB:7.1f} / {anon / MIB:7.1f} MiB")
        print(f"  {r.rt.name:28} {cells[0]:>28} {cells[1]:>22} "
              f"{cells[2]:>22}", flush=True)
    check(not failures, "figure and RssAnon disagree: " + "; ".join(failures))


def refresh_threads(pid):
    """How many of pid's threads are memtally's refresh thread."""
    n = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                n += f.read().strip() == "memtally"
        except OSError:
            pass
    return n


def test_one_refresh_thread_per_process():
    """Under each preload a registered process has exactly one refresh
    thread, and so does its fork child (the thread does not survive a
    fork: the child's registration starts its own);
    MEMTALLY_REFRESH_MS=0 starts none. The 8 MiB worker is single-threaded
    and below the default MEMTALLY_REFRESH_MIN, so the minimum is lowered
    here (test_small_single_threaded_process_stays_so checks the
    default)."""
    for lib, alloc in ((GLIBC_LIB, "glibc"), (PRELOAD, "jemalloc")):
        for period in ("1000", "0"):
            with Server() as s:
                env = s.env(LD_PRELOAD=lib, MEMTALLY_ALLOCATOR=alloc,
                            MEMTALLY_REFRESH_MS=period,
                            MEMTALLY_REFRESH_MIN="1MiB")
                w = Worker([*worker("fork"), "8"], env)
                try:
                    pids = {}
                    for _ in range(2):
                        who, p = w.readline().split()
                        pids[who] = int(p.split("=")[1])
                    for who, pid in pids.items():
                        wait_for(f"{alloc}: {who} registered",
                                 lambda: s.ps().get(pid))
                        want = 1 if period != "0" else 0
                        got = wait_for(
                            f"{alloc}, period {period}: {who}'s threads",
                            lambda: (lambda n: n == want and n + 1)(
                                refresh_threads(pid)))
                        check(got == want + 1, f"{who}: {got - 1} threads")
                        # Registered, flushed and armed: with a period, its
                        # one thread; without, none ever (nothing arms it).
                        check(refresh_threads(pid) == want,
                              f"{alloc}, period {period}, {who}: "
                              f"{refresh_threads(pid)} refresh threads")
                    print(f"  {alloc}, MEMTALLY_REFRESH_MS={period}: "
                          f"parent and fork child have "
                          f"{1 if period != '0' else 0} refresh thread each",
                          flush=True)
                finally:
                    w.close()


def test_small_single_threaded_process_stays_so():
    """A single-threaded process below MEMTALLY_REFRESH_MIN (64 MiB by
    default) is registered and counted but gets no refresh thread: its
    first thread would switch glibc to locking every stdio call and
    every malloc arena for good. Once its figure passes the minimum, the
    thread starts."""
    for lib, alloc in ((GLIBC_LIB, "glibc"), (PRELOAD, "jemalloc")):
        with Server() as s:
            env = s.env(LD_PRELOAD=lib, MEMTALLY_ALLOCATOR=alloc)
            small = Worker([*worker("fork"), "8"], env)
            big = Worker([*worker("fork"), "96"], env)
            try:
                pids = {}
                for n, w in ((8, small), (96, big)):
                    for _ in range(2):
                        who, p = w.readline().split()
                        if who == "parent":
                            pids[n] = int(p.split("=")[1])
                wait_for(f"{alloc}: both counted", lambda: all(
                    s.ps().get(pids[n], {}).get("bytes", 0) >= n * MIB
                    for n in (8, 96)))
                wait_for(f"{alloc}: the 96 MiB worker's refresh thread",
                         lambda: refresh_threads(pids[96]) == 1)
                # The small one has flushed, registered and been ticked
                # as long as the big one: it would have its thread by now.
                check(refresh_threads(pids[8]) == 0,
                      f"{alloc}: an 8 MiB single-threaded worker got "
                      f"{refresh_threads(pids[8])} refresh threads")
                print(f"  {alloc}: 8 MiB single-threaded worker: no "
                      f"refresh thread; 96 MiB: one", flush=True)
            finally:
                small.close()
                big.close()


if __name__ == "__main__":
    run([test_quiet_after_free, test_one_refresh_thread_per_process,
         test_small_single_threaded_process_stays_so])
