"""benchlib: what every benchmark driver shares.

The machine a run was made on (machine_info), the statistics the tables
report (quartiles, a Mann-Whitney p-value), a memtallyd for the run
(start_server, the integration tests' harness.Server) and what `memtally ps` says of a process, a bench worker in
--serve mode (ServeWorker), and the one way a driver writes its section
of bench/results/SUITE.md (write_section). Drivers
import this module, never one another.
"""
import datetime
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time

SRC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class BenchError(Exception):
    pass


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---- statistics ------------------------------------------------------------


def quartiles(xs):
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], statistics.median(xs), q[2]


def mann_whitney_p(a, b):
    """Two-sided Mann-Whitney U p-value, normal approximation with tie
    correction and continuity correction (fine for 15 vs 15)."""
    n1, n2 = len(a), len(b)
    n = n1 + n2
    # (15 vs 15 for the first cases, --new-reps vs --new-reps for the rest)
    pooled = sorted([(x, 0) for x in a] + [(x, 1) for x in b])
    ranks = [0.0] * n
    ties = 0.0
    i = 0
    while i < n:
        j = i
        while j + 1 < n and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        r = (i + j) / 2 + 1
        for k in range(i, j + 1):
            ranks[k] = r
        t = j - i + 1
        ties += t**3 - t
        i = j + 1
    r1 = sum(r for r, (_, g) in zip(ranks, pooled) if g == 0)
    u1 = r1 - n1 * (n1 + 1) / 2
    mu = n1 * n2 / 2
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = max(0.0, abs(u1 - mu) - 0.5) / math.sqrt(var)
    return math.erfc(z / math.sqrt(2))


def shift_ci(a, b, conf=0.95):
    """The Hodges-Lehmann shift of `a` over `b` (the median of all a - b
    differences) and its distribution-free `conf` interval (the order
    statistics of those differences the Mann-Whitney test puts at its
    critical value, normal approximation). It answers what a p-value
    cannot: how large a difference the run could have missed. Returns
    (low, shift, high)."""
    m, n = len(a), len(b)
    d = sorted(x - y for x in a for y in b)
    z = statistics.NormalDist().inv_cdf(0.5 + conf / 2)
    k = int(m * n / 2 - z * math.sqrt(m * n * (m + n + 1) / 12))
    k = min(max(k, 0), len(d) - 1)
    return d[k], statistics.median(d), d[len(d) - 1 - k]


def median_ci(xs, conf=0.95):
    """The median of `xs` and its distribution-free `conf` interval (the
    order statistics a binomial(n, 1/2) puts there, normal
    approximation): for per-round ratios of interleaved runs, where the
    machine's drift cancels within a round. Returns (low, median, high)."""
    s = sorted(xs)
    n = len(s)
    z = statistics.NormalDist().inv_cdf(0.5 + conf / 2)
    k = int(n / 2 - z * math.sqrt(n) / 2)
    k = min(max(k, 0), n - 1)
    return s[k], statistics.median(s), s[n - 1 - k]


def fmt_p(p):
    """A p-value as the tables print it."""
    return "<0.001" if p < 0.001 else "%.3f" % p


# ---- machine and tree ------------------------------------------------------


def run_text(argv, cwd=None):
    try:
        return subprocess.run(
            argv, cwd=cwd, capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        return ""


def machine_info():
    model = ""
    for line in run_text(["lscpu"]).splitlines():
        if line.startswith("Model name:"):
            model = line.split(":", 1)[1].strip()
            break
    commit = run_text(["git", "rev-parse", "--short", "HEAD"], cwd=SRC_DIR)
    dirty = run_text(
        ["git", "status", "--porcelain", "--", "client", "shm", "bench"],
        cwd=SRC_DIR,
    )
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        glibc = ""
    return {
        "cpu_model": model,
        "nproc": os.cpu_count(),
        "kernel": os.uname().release,
        "glibc": glibc,
        "loadavg_start": os.getloadavg()[0],
        "commit": commit,
        "uncommitted": bool(dirty),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime(
            "%Y-%m-%d %H:%M UTC"
        ),
    }


# ---- processes ---------------------------------------------------------------


def quit_worker(proc):
    """Ask a --serve worker to quit; kill it if it does not within 5 s."""
    if proc.poll() is None:
        try:
            proc.stdin.write("quit\n")
            proc.stdin.flush()
            proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()


def cachegrind_total(argv, stdin_path, env, out, what):
    """Instructions executed by argv and every process it starts
    (cachegrind, no cache simulation), their output files kept in the
    directory `out`. `what` names the run in an error."""
    os.makedirs(out, exist_ok=True)
    stdin = open(stdin_path) if stdin_path else subprocess.DEVNULL
    try:
        p = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no",
                            "--trace-children=yes",
                            "--cachegrind-out-file=%s/cg.%%p" % out] + argv,
                           stdin=stdin, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, env=env)
    finally:
        if stdin_path:
            stdin.close()
    if p.returncode != 0:
        raise BenchError("%s, cachegrind: exit %d:\n%s" % (
            what, p.returncode, p.stderr[-2000:]))
    total = 0
    for f in os.listdir(out):
        with open(os.path.join(out, f)) as fh:
            m = re.search(r"^summary: (\d+)", fh.read(), re.M)
        total += int(m.group(1)) if m else 0
    return total


# ---- server --------------------------------------------------------------


def harness(build_dir):
    """The integration tests' harness (tests/integration/harness.py): its
    Server starts every memtallyd a benchmark runs. Imported on first use,
    with MEMTALLY_BUILD set, because it points its children's variables
    (MEMTALLY_PRELOAD_LIB, ...) at that build when it is imported."""
    os.environ["MEMTALLY_BUILD"] = os.path.abspath(build_dir)
    path = os.path.join(SRC_DIR, "tests", "integration")
    if path not in sys.path:
        sys.path.insert(0, path)
    import harness as h  # noqa: E402 - needs MEMTALLY_BUILD set
    return h


def start_server(build_dir, tmp, enabled=True, cpus=None, extra_args=(),
                 exe=None, prefix=(), sock=None, segment="",
                 log="memtallyd.log", wait=5, required=False,
                 log_level=None):
    """(a memtallyd for the run, what the tables say of it).

    The server is a harness.Server in `tmp` at memtallyd's own tick and log
    level, or None if the build has none, --no-server asked for none, or it
    did not start: the workers' flushes then go to the process-local pending
    counter (fail open), and the status says why. With required=True a
    server that does not start raises BenchError instead. segment "" is
    one of this run's own, None memtallyd's default; `sock` another socket
    path, `prefix` a command that runs it (e.g. one that joins a cgroup)."""
    exe = exe or os.path.join(build_dir, "server", "memtallyd")
    status = None
    if not enabled:
        status = "no server (--no-server)"
    elif not os.access(exe, os.X_OK):
        status = "no server (memtallyd not built)"
    else:
        h = harness(build_dir)
        try:
            return h.Server(*extra_args, tick=None, log_level=log_level,
                            exe=exe, prefix=prefix, directory=tmp,
                            socket=sock, segment=segment, log_name=log,
                            cpus=cpus, timeout=wait), "memtallyd running"
        except AssertionError as e:
            status = "no server (memtallyd did not start: %s)" % (
                str(e)[-400:].replace("\n", " | "))
    if required:
        raise BenchError(status)
    return None, status


def server_socket(server, tmp):
    """The socket workers are pointed at: the server's, or without one a
    path in `tmp` nothing listens on (they fail open; never a system
    memtallyd at the default socket)."""
    return server.socket if server else os.path.join(tmp, "no-server.sock")


def memtally_ps(cli, sock, strict=True):
    """What `memtally ps` lists for the server at `sock`: {pid: entry}.
    A failed query raises BenchError, or gives {} when not `strict`."""
    p = subprocess.run([cli, "--socket", sock, "--json", "ps"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        if not strict:
            return {}
        # Not a proof failure of the program: the query itself broke.
        raise BenchError("memtally ps failed (exit %d): %s" % (
            p.returncode, p.stderr.strip()))
    return {e.get("pid"): e
            for e in json.loads(p.stdout).get("processes", [])}


def memtally_settled(cli, sock, pid, patience=5.0):
    """memtally's entry for pid, once a tick has published it and it is
    stable (two reads 30 ms apart agree), or the last read (None: not
    listed) after `patience` s."""
    last = None
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        cur = memtally_ps(cli, sock).get(pid)
        if cur and last and cur["bytes"] == last["bytes"]:
            return cur
        last = cur
        time.sleep(0.03)
    return last


# ---- bench workers ---------------------------------------------------------


class ServeWorker:
    """A bench worker in --serve mode: it proves its allocator, prints
    "ready <proof JSON>", then answers one "run ..." line with one
    "ns N ..." line. Shared by the buffer_growth and allocators drivers."""

    def __init__(self, exe, alloc, cpu, tmp, env, extra_argv=()):
        self.alloc = alloc
        argv = [exe, "--serve", *extra_argv]
        if cpu is not None:
            argv += ["--cpu", str(cpu)]
        self.err = open(os.path.join(tmp, "worker-%s.err" % alloc), "w+")
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.err, text=True, bufsize=1, env=env)
        line = self.proc.stdout.readline()
        if not line.startswith("ready "):
            rc = self.proc.wait()
            self.err.seek(0)
            raise BenchError("%s: the worker refused to run (exit %s):\n%s"
                             % (alloc, rc, self.err.read().rstrip()))
        self.proof = json.loads(line[len("ready "):])

    def request(self, cmd):
        """Send one command; the answer's words, starting with "ns"."""
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        r = line.split()
        if not r or r[0] != "ns":
            self.err.seek(0)
            raise BenchError("%s: %r failed: %s %s" % (
                self.alloc, cmd, line.strip(), self.err.read().strip()))
        return r

    def close(self):
        quit_worker(self.proc)


# ---- bench/results/SUITE.md -------------------------------------------------


def results_path(suite):
    """Where suite `suite` writes its full output: bench/results/SUITE.md.
    bench/RESULTS.md, the summary, is written by hand and points there."""
    return os.path.join(SRC_DIR, "bench", "results", suite + ".md")


def section_markers(name, generator=None):
    """The BEGIN/END lines around a driver's section: what lies between
    them is rewritten by each run, notes outside them are kept."""
    generator = generator or "bench/%s.py" % name
    return ("<!-- BEGIN %s (generated by %s; edits here are overwritten) -->"
            % (name, generator), "<!-- END %s -->" % name)


def write_section(path, name, text, generator=None):
    """Put `text` between section `name`'s markers in the file at `path`
    (replacing the previous run's), or append the section."""
    begin, end = section_markers(name, generator)
    old = ""
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
    block = begin + "\n" + text.rstrip() + "\n" + end
    if begin in old and end in old:
        a = old.index(begin)
        b = old.index(end) + len(end)
        old = old[:a] + block + old[b:]
    else:
        if not old:
            old = ("# %s\n\nThe newest full output of the suite (between "
                   "the BEGIN/END markers: each run rewrites it); notes "
                   "outside them are kept. The summary of every suite is "
                   "[bench/RESULTS.md](../RESULTS.md).\n\n" % name)
        old = old.rstrip() + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(old)
