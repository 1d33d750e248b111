"""fleet: a node that really runs out of memory, and the policies people
use to keep it alive, side by side.

The node is a memory cgroup this driver makes (cgroup v2 memory.max with
memory.swap.max = 0 where the unified hierarchy has the memory controller,
else v1 memory.limit_in_bytes = memory.memsw.limit_in_bytes), removed after.
The workload is reproducible (numbered): real processes (`mt_worker fleet`,
tests/integration/workers/fleet.c, in C, bench/fleet_worker.py in Python,
both under the preload) drawn from a
dozen kinds that repeat, as a fleet runs the same jobs again: a kind has a
profile (steady, ramp, spike, leak), a heavy-tailed typical peak and the
size its job script declares the way people declare them (mostly ~2x the
peak, some under it); each task's peak is its kind's within +-15%. Two
arrival patterns: a batch queued at once, and Poisson arrivals.

Every policy's logic lives in the product or in the engine it models: the
memtally rows only start `memtally run` (with --retry, and --kind for the
learned rows); admission and eviction are memtallyd's (its node guard).

A policy is an object with `name` and `run(ctx) -> PolicyResult`, where ctx
(a RunContext) holds the node, the tasks, the worker commands and the clock.
Policies that start processes themselves use `Runner` (slots, a queue,
reaping with rusage, requeues); a policy that brings its own scheduler (a
Dask cluster) only has to fill one TaskOutcome per task. Policies not
available here are reported as "not run" rows, never as numbers.

    python3 bench/fleet.py --build build [--workload 7] [--tasks 100]
        [--node-mib 640] [--policy none,static,pollkill,dask,memtally-declared,
                              memtally-cold,memtally-warm,memtally-dask,
                              memtally-dask-warm,memtally-warm-idle]
        [--arrivals batch,over-time] [--results bench/results/fleet.md]
        [--plot bench/fleet.png] [--json out.json]

Exit status 77 (with the reason on stderr) when no memory cgroup can be made.

Plugging in a policy: a class with `name` and `run(ctx)` returning a
PolicyResult whose `outcomes` hold one TaskOutcome per task of ctx.tasks
(done, attempts, kernel_kills, policy_kills, failures, wasted_cpu) and
whose `makespan` is set; its processes must run inside ctx.node (put a
command there with join_cgroup_argv(ctx.node, argv), or write pids to
ctx.node.procs()). run_policy() makes and removes the node, samples its
memory and adds the node's own oom_kill counter; a memtallyd the policy
runs can be watched with DaemonProbe. Register it in POLICIES (and take it
out of NOT_RUN).
"""
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

MIB = 1 << 20
SKIP = 77


class NoCgroup(Exception):
    """No memory cgroup can be made here: the run is skipped (exit 77)."""


# ---- the node: a memory cgroup -----------------------------------------------


def _read(path, default=""):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


class Cgroup:
    """A memory cgroup made by this process (v1 or v2), limited to
    `limit` bytes with no swap, removed by remove()."""

    def __init__(self, path, version, limit):
        self.path = path
        self.version = version
        self.limit = limit
        self.children = []
        try:
            os.mkdir(path)
        except OSError as e:
            raise NoCgroup("cannot make %s: %s" % (path, e.strerror))
        try:
            if version == 2:
                _write(self.file("memory.max"), str(limit))
                if os.path.exists(self.file("memory.swap.max")):
                    _write(self.file("memory.swap.max"), "0")
            else:
                _write(self.file("memory.limit_in_bytes"), str(limit))
                if os.path.exists(self.file("memory.memsw.limit_in_bytes")):
                    _write(self.file("memory.memsw.limit_in_bytes"),
                           str(limit))
        except OSError as e:
            self.remove()
            raise NoCgroup("cannot limit %s: %s" % (path, e.strerror))

    def file(self, name):
        return os.path.join(self.path, name)

    def procs(self):
        return self.file("cgroup.procs")

    def child(self, name, limit):
        c = Cgroup(os.path.join(self.path, name), self.version, limit)
        self.children.append(c)
        return c

    def usage(self):
        name = "memory.current" if self.version == 2 else \
            "memory.usage_in_bytes"
        try:
            return int(_read(self.file(name), "0").strip() or 0)
        except ValueError:
            return 0

    def oom_kills(self):
        """The kernel's OOM kills in this cgroup (itself, not its
        children: they are counted where they happen)."""
        name = "memory.events.local" if self.version == 2 else \
            "memory.oom_control"
        for line in _read(self.file(name)).splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill":
                return int(v)
        return 0

    def pids(self):
        return [int(x) for x in _read(self.procs()).split()]

    def remove(self):
        """Kill whatever is left inside, then rmdir (children first)."""
        for c in self.children:
            c.remove()
        self.children = []
        deadline = time.monotonic() + 10
        while os.path.isdir(self.path):
            for pid in self.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                os.rmdir(self.path)
            except OSError:
                if time.monotonic() > deadline:
                    benchlib.log("fleet: could not remove %s" % self.path)
                    return
                time.sleep(0.05)


def _v2_base(base, reasons):
    """Can a memory-limited child be made under cgroup v2 `base`? Its
    subtree must have the memory controller: enabled already, or enabled
    here (possible where `base` holds no process itself, as the root
    does; a systemd service's own cgroup holds its processes)."""
    if "memory" not in _read(os.path.join(base, "cgroup.controllers")).split():
        reasons.append("no memory controller in %s" % base)
        return False
    ctl = os.path.join(base, "cgroup.subtree_control")
    if "memory" in _read(ctl).split():
        return True
    try:
        _write(ctl, "+memory")
        return True
    except OSError as e:
        reasons.append("cannot enable memory in %s: %s" % (ctl, e.strerror))
        return False


def make_node(limit, name=None):
    """The node: a new memory cgroup of `limit` bytes, no swap, under this
    process's own cgroup where it can be made there, else (cgroup v2, as
    root) under the hierarchy's root. Raises NoCgroup with the reason."""
    name = name or "memtally-node-%d" % os.getpid()
    cg = _read("/proc/self/cgroup")
    v1 = v2 = None
    for line in cg.splitlines():
        hid, ctrls, path = line.split(":", 2)
        if "memory" in ctrls.split(","):
            v1 = path
        if hid == "0" and ctrls == "":
            v2 = path
    reasons = []
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        if v2 is None or _read(os.path.join(root, "cgroup.controllers"),
                               None) is None:
            continue
        for base in dict.fromkeys((root + v2.rstrip("/"), root)):
            if _v2_base(base, reasons):
                try:
                    return Cgroup(os.path.join(base, name), 2, limit)
                except NoCgroup as e:
                    reasons.append(str(e))
    if v1 is not None:
        base = "/sys/fs/cgroup/memory" + v1
        if os.path.exists(os.path.join(base, "memory.limit_in_bytes")):
            return Cgroup(os.path.join(base, name), 1, limit)
        reasons.append("no memory.limit_in_bytes in %s" % base)
    raise NoCgroup("no writable memory cgroup: %s" % (
        "; ".join(reasons) or "no memory controller in /proc/self/cgroup"))


# ---- the workload ---------------------------------------------------------------

PROFILES = ("steady", "ramp", "spike", "leak")


class Task:
    def __init__(self, idx, kind, profile, peak_mib, secs, declared_mib,
                 arrival, job=""):
        self.idx = idx
        self.kind = kind            # "c" or "py"
        self.profile = profile
        self.peak_mib = peak_mib    # what it really reaches
        self.secs = secs
        self.declared_mib = declared_mib
        self.arrival = arrival      # seconds after the start
        self.job = job              # what it is an instance of: its kind

    def argv(self, ctx):
        args = [self.profile, "%d" % self.peak_mib, "%.2f" % self.secs]
        if self.kind == "c":
            return ctx.c_worker + args
        return [sys.executable, ctx.py_worker] + args

    def as_dict(self):
        return dict(self.__dict__)


class Job:
    """A kind of task: what a fleet runs again and again (a build step, a
    nightly job), with one declared size, as its job script declares it."""

    def __init__(self, name, lang, profile, peak_mib, secs, declared_mib):
        self.name = name
        self.lang = lang
        self.profile = profile
        self.peak_mib = peak_mib    # its typical peak
        self.secs = secs
        self.declared_mib = declared_mib


def make_jobs(rng, count, node_mib):
    """`count` kinds. Typical peak: lognormal (median 48 MiB, sigma 0.8),
    16 MiB to 35% of the node; 1.5..4 s. Declared: 85% generous (1.6..2.6
    x the typical peak, +8 MiB), 15% under (the typical peak is 1.1..1.5 x
    the declaration), never more than 80% of the node (a task that fits
    no node is not submitted)."""
    jobs = []
    for j in range(count):
        peak = int(min(node_mib * 0.35,
                       max(16, rng.lognormvariate(3.87, 0.8))))
        if rng.random() < 0.15:
            declared = int(peak / rng.uniform(1.1, 1.5))
        else:
            declared = int(peak * rng.uniform(1.6, 2.6)) + 8
        declared = min(declared, int(node_mib * 0.8))
        jobs.append(Job("job%02d" % j, "py" if rng.random() < 0.3 else "c",
                        rng.choice(PROFILES), peak, rng.uniform(1.5, 4.0),
                        declared))
    return jobs


JOBS = 12       # kinds in a workload
JOB_SPREAD = 0.15   # a task's peak: its kind's within +-15%


def make_workload(number, n, arrivals, node_mib, rate=4.0, jobs=JOBS):
    """n tasks, the same for the same number, drawn at random from `jobs`
    kinds (make_jobs): a task's peak is its kind's within +-15% (what the
    same job does on other input), its time within +-20%, its declaration
    its kind's. Arrivals: all at 0 ("batch"), or a Poisson process of
    `rate` tasks/s."""
    rng = random.Random(number)
    kinds = make_jobs(rng, jobs, node_mib)
    tasks = []
    t = 0.0
    for i in range(n):
        k = rng.choice(kinds)
        peak = int(min(node_mib * 0.35, max(8, k.peak_mib * rng.uniform(
            1 - JOB_SPREAD, 1 + JOB_SPREAD))))
        secs = k.secs * rng.uniform(0.8, 1.2)
        if arrivals == "over-time" and i:
            t += rng.expovariate(rate)
        tasks.append(Task(i, k.lang, k.profile, peak, secs, k.declared_mib,
                          0.0 if arrivals == "batch" else t, k.name))
    return tasks


# ---- results --------------------------------------------------------------------


class TaskOutcome:
    def __init__(self, idx):
        self.idx = idx
        self.done = False
        self.attempts = 0
        self.kernel_kills = 0       # attempts the kernel's OOM killer ended
        self.policy_kills = 0       # attempts the policy ended
        self.failures = 0           # attempts that failed otherwise
        self.wasted_cpu = 0.0       # CPU-seconds of attempts that were killed
        self.evictions = 0          # attempts memtallyd's node guard ended
        self.evicted_cpu = 0.0      # CPU-seconds those attempts had used
        self.cpu = 0.0              # CPU-seconds of all its attempts
        self.finished = None        # seconds after the start


class PolicyResult:
    def __init__(self, name):
        self.name = name
        self.ran = True
        self.why_not = ""
        self.outcomes = []
        self.makespan = 0.0
        self.samples = []           # (t, usage bytes, reserved bytes running)
        self.slots = []             # (tasks running, tasks waiting for room)
        self.oom_times = []         # seconds after the start
        self.kernel_oom_counter = 0  # the cgroups' own oom_kill counters
        self.daemon = {}            # memtallyd's fate, for memtally policies
        self.forecast = {}          # alarms, false alarms, misses
        self.note = ""
        self.t_offset = 0.0         # when the policy's clock started, in ctx
        self.kills_note = ""        # what "killed by policy" means here
        self.evictions = None       # memtallyd's own count, for its rows
        self.on_declared = None     # kind -> runs admitted with no history
        self.idle_usage = None      # a Dask row: the node, cluster up, idle


class RunContext:
    def __init__(self, node, tasks, c_worker, py_worker, env, tmp, build,
                 slots, arrivals):
        self.node = node
        self.tasks = tasks
        self.c_worker = c_worker
        self.py_worker = py_worker
        self.env = env              # the preload and nothing else set
        self.tmp = tmp
        self.build = build
        self.slots = slots
        self.arrivals = arrivals
        self.runner = None          # the Runner, for a policy that has one
        self.t0 = time.monotonic()

    def now(self):
        return time.monotonic() - self.t0


def join_cgroup_argv(cg, argv):
    """argv run inside cgroup `cg`: a shell moves itself there, then execs
    (the same process: wait4's rusage and the pid stay the command's)."""
    return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', cg.procs()] + argv


# ---- a policy that starts processes itself ----------------------------------------


class Attempt:
    def __init__(self, task, proc, started, cg=None, declared_mib=0):
        self.task = task
        self.proc = proc
        self.started = started
        self.admitted = True        # under memtally run: once CMD started
        self.cg = cg
        self.declared_mib = declared_mib
        self.killed_by_policy = False
        self.runs = {}              # under memtally run: pid -> [CPU s, grant]


class Runner:
    """Slots, a queue in arrival order, reaping with rusage. A policy
    subclasses it: can_start(), command(), after_exit(), monitor()."""

    retry_policy_kills = True
    retry_kernel_kills = False
    reserves = False                # declared sizes set memory aside
    max_attempts = 4
    monitor_interval = 0.25
    deadline = 600.0                # seconds: then what is left is lost

    def __init__(self, ctx, result):
        self.ctx = ctx
        self.result = result
        self.out = {t.idx: TaskOutcome(t.idx) for t in ctx.tasks}
        self.pending = sorted(ctx.tasks, key=lambda t: (t.arrival, t.idx))
        self.queue = []
        self.running = {}           # pid -> Attempt
        self.declared = {t.idx: t.declared_mib for t in ctx.tasks}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        ctx.runner = self           # the sampler reads its reservations

    # hooks
    def can_start(self, task):
        return True

    def command(self, task):
        return join_cgroup_argv(self.ctx.node, task.argv(self.ctx)), None

    def after_exit(self, att):
        pass

    def monitor(self):
        pass

    def reserved_running(self):
        """What the policy sets aside for the tasks running now: their
        declared sizes (a policy that reserves something else says so)."""
        return sum(a.declared_mib for a in list(self.running.values())
                   if a.admitted) * MIB

    def kill(self, att):
        """End an attempt as the policy's decision (SIGKILL)."""
        att.killed_by_policy = True
        try:
            att.proc.send_signal(signal.SIGKILL)
        except OSError:
            pass

    def start(self, task):
        argv, cg = self.command(task)
        p = subprocess.Popen(argv, env=self.env_for(task),
                             stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL,
                             stderr=self.errlog, start_new_session=False)
        self.out[task.idx].attempts += 1
        self.running[p.pid] = Attempt(task, p, self.ctx.now(), cg,
                                      self.declared[task.idx])

    def env_for(self, task):
        return self.ctx.env

    def _reap(self):
        for pid in list(self.running):
            try:
                rpid, status, ru = os.wait4(pid, os.WNOHANG)
            except ChildProcessError:
                rpid, status, ru = pid, 0, None
            if rpid == 0:
                continue
            att = self.running.pop(pid)
            att.proc.returncode = os.waitstatus_to_exitcode(status)
            self._classify(att, att.proc.returncode,
                           (ru.ru_utime + ru.ru_stime) if ru else 0.0)

    def _classify(self, att, rc, cpu):
        o = self.out[att.task.idx]
        o.cpu += cpu
        now = self.ctx.now()
        if att.cg is not None:
            kk = att.cg.oom_kills()
            self.result.kernel_oom_counter += kk
            att.cg.remove()
            self.ctx.node.children.remove(att.cg)
        if rc == 0:
            o.done = True
            o.finished = now
            self.after_exit(att)
            return
        o.wasted_cpu += cpu
        if att.killed_by_policy:
            o.policy_kills += 1
            retry = self.retry_policy_kills
        elif rc not in (-signal.SIGKILL, 128 + signal.SIGKILL):
            # Not a kill: the task or its runner failed (lost, not an OOM).
            o.failures += 1
            benchlib.log("fleet: %s: task %d failed, exit %s" % (
                self.result.name, att.task.idx, rc))
            retry = False
        else:
            # Nobody else sends SIGKILL here: the kernel's OOM killer did
            # (directly, or to the worker under `memtally run`: 137).
            o.kernel_kills += 1
            self.result.oom_times.append(now)
            retry = self.retry_kernel_kills
        self.after_exit(att)
        if retry and o.attempts < self.max_attempts:
            self.queue.append(att.task)

    def run(self):
        self.errlog = open(os.path.join(self.ctx.tmp, "%s.err" %
                                        self.result.name), "a")
        mon = threading.Thread(target=self._monitor_loop, daemon=True)
        mon.start()
        try:
            while self.pending or self.queue or self.running:
                now = self.ctx.now()
                if now > self.deadline:
                    self._give_up()
                    break
                while self.pending and self.pending[0].arrival <= now:
                    self.queue.append(self.pending.pop(0))
                with self.lock:
                    self._reap()
                    self._start_what_fits()
                time.sleep(0.02)
        finally:
            self.stop.set()
            mon.join(5)
            self.errlog.close()
        self.result.outcomes = list(self.out.values())
        self.result.makespan = self.ctx.now()

    def _start_what_fits(self):
        """First fit in queue order, as a batch scheduler's backfill: a
        large task waiting for room does not hold back small ones."""
        i = 0
        while i < len(self.queue) and len(self.running) < self.ctx.slots:
            if self.can_start(self.queue[i]):
                self.start(self.queue.pop(i))
            else:
                i += 1

    def _give_up(self):
        """Past the deadline: every attempt still running is killed and
        every task not done is lost (a policy that never starts a task
        must show it, not hang)."""
        benchlib.log("fleet: %s: deadline passed, %d running, %d queued" % (
            self.result.name, len(self.running), len(self.queue)))
        with self.lock:
            for a in self.running.values():
                a.proc.kill()
            for a in self.running.values():
                a.proc.wait()
                if a.cg is not None:
                    a.cg.remove()
                    self.ctx.node.children.remove(a.cg)
            self.running.clear()
        self.result.note = "deadline of %.0f s passed" % self.deadline

    def _monitor_loop(self):
        while not self.stop.wait(self.monitor_interval):
            with self.lock:
                self.monitor()


# ---- the policies ---------------------------------------------------------------


class NonePolicy:
    """K concurrent runners; the kernel decides."""
    name = "none"

    def run(self, ctx):
        r = PolicyResult(self.name)
        Runner(ctx, r).run()
        return r


class StaticRunner(Runner):
    reserves = True

    def can_start(self, task):
        need = self.declared[task.idx] * MIB
        return self.reserved_running() + need <= self.ctx.node.limit

    def command(self, task):
        cg = self.ctx.node.child("t%d-%d" % (task.idx,
                                             self.out[task.idx].attempts),
                                 self.declared[task.idx] * MIB)
        return join_cgroup_argv(cg, task.argv(self.ctx)), cg


class StaticPolicy:
    """Slurm --mem / Ray memory=: start while the declared sizes fit; each
    task confined to its declared size in its own child cgroup."""
    name = "static"

    def run(self, ctx):
        r = PolicyResult(self.name)
        StaticRunner(ctx, r).run()
        return r


class PollKillRunner(Runner):
    retry_kernel_kills = True
    threshold = 0.95

    def monitor(self):
        if self.ctx.node.usage() <= self.threshold * self.ctx.node.limit:
            return
        live = [a for a in self.running.values() if not a.killed_by_policy]
        if live:
            self.kill(max(live, key=lambda a: a.started))


class PollKillPolicy:
    """Ray's memory monitor: every 250 ms read the node's usage; above 95%
    kill the most recently started task and retry it later."""
    name = "pollkill"

    def run(self, ctx):
        r = PolicyResult(self.name)
        PollKillRunner(ctx, r).run()
        return r


class NotRun:
    """A policy that cannot run in this harness yet: one row saying so."""

    def __init__(self, name, why):
        self.name = name
        self.why = why

    def run(self, ctx):
        r = PolicyResult(self.name)
        r.ran = False
        r.why_not = self.why
        return r


# ---- memtally ------------------------------------------------------------------


def _pb_client(build):
    os.environ.setdefault("MEMTALLY_PB2_DIR", os.path.join(build, "python"))
    sys.path.insert(0, os.path.join(benchlib.SRC_DIR, "python"))
    from memtally import client as mc  # noqa: E402
    return mc


def _cli(build):
    """The `memtally` command of a build tree (programs/, once client/)."""
    for sub in ("programs", "client"):
        path = os.path.join(build, sub, "memtally")
        if os.path.exists(path):
            return path
    return os.path.join(build, "programs", "memtally")


EX_EVICTED = 75     # `memtally run`: evicted by memtallyd's node guard


def _cpu_seconds(pid):
    """utime + stime of a live process (/proc/PID/stat), or None."""
    st = _read("/proc/%d/stat" % pid)
    try:
        f = st[st.rindex(")") + 2:].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except (ValueError, IndexError):
        return None


class MemtallyRunner(Runner):
    """Every task through `memtally run --bytes DECLARED [--kind KIND]
    --retry 3 --wait 3600 --poll 0.25 -- CMD` (tasks of a few seconds:
    room appears every second or so, mostly without a state change of the
    fleet), memtallyd inside the node with its guard on. What keeps the
    node safe is memtally's alone: admission (on declarations, or on the
    kind's learned size), the node guard's eviction, `memtally run`'s rerun
    of an evicted task (--retry) and its exit 75 when evicted past them.

    This runner starts `memtally run` and reads, never signals: which run
    of a task is live (the child of `memtally run`), its CPU time (what an
    eviction threw away) and what memtallyd reserved for it (the kind's
    learned size when it has one and reservations are learned, else the
    declaration), for the slack."""

    # A task the kernel killed is lost, as under none and static: only
    # `memtally run --retry` reruns (what memtallyd's guard evicted), so
    # no row of memtally's is kept whole by the bench.
    retry_kernel_kills = False
    retry_policy_kills = False  # `memtally run --retry` reran it already
    reserves = True
    monitor_interval = 0.1
    retries = 3

    def __init__(self, ctx, result, sock, learned):
        self.held = 0               # the sampler may ask before the first
        super().__init__(ctx, result)
        self.sock = sock
        self.learned = learned
        self.mc = _pb_client(ctx.build)
        self.client = None
        self.cli = os.environ.get("MEMTALLY_CLI") or _cli(ctx.build)

    def command(self, task):
        argv = [self.cli, "--socket", self.sock, "run",
                "--bytes", "%dMiB" % self.declared[task.idx],
                "--retry", str(self.retries),
                "--wait", "3600", "--poll", "0.25"]
        if self.learned:
            argv += ["--kind", task.job]
        return argv + ["--"] + join_cgroup_argv(self.ctx.node,
                                                task.argv(self.ctx)), None

    def env_for(self, task):
        e = dict(self.ctx.env)
        e.pop("LD_PRELOAD", None)   # memtally run adds it to the command
        return e

    def start(self, task):
        """`memtally run`, its stderr kept: it says each eviction."""
        o = self.out[task.idx]
        err = tempfile.TemporaryFile("w+", dir=self.ctx.tmp)
        p = subprocess.Popen(self.command(task)[0], env=self.env_for(task),
                             stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=err)
        o.attempts += 1
        att = Attempt(task, p, self.ctx.now(), None, self.declared[task.idx])
        att.admitted = False
        att.err = err
        att.live = None
        self.running[p.pid] = att

    def reserved_running(self):
        """What memtallyd sets aside now: what it counts (the larger of
        the accounted and resident figures, as `measure = max`) plus what
        its reservations hold beyond that. A reservation that follows
        its kind's profile holds the profile's step for its task's age."""
        return self.held

    def _grant(self, task):
        declared = self.declared[task.idx] * MIB
        if not self.learned:
            return declared
        try:
            if self.client is None:
                self.client = self.mc.Client(self.sock, timeout=2.0)
            for k in self.client.kinds(task.job).kinds:
                if k.uid == os.getuid() and k.learned_bytes:
                    return k.learned_bytes
        except (OSError, self.mc.MemtallyError):
            self.client = None
            return declared
        on = self.result.on_declared
        on[task.job] = on.get(task.job, 0) + 1
        return declared

    def monitor(self):
        """Reads only: each task's live run (the command `memtally run`
        started once admitted), its CPU time and its grant, and what
        memtallyd sets aside (GetUsage)."""
        try:
            if self.client is None:
                self.client = self.mc.Client(self.sock, timeout=2.0)
            u = self.client.usage()
            self.held = max(u.fleet_bytes, u.rss_bytes) + u.reserved_bytes
        except (OSError, self.mc.MemtallyError):
            self.client = None
        for a in self.running.values():
            pid = a.proc.pid
            kids = [int(k) for k in _read("/proc/%d/task/%d/children" % (
                pid, pid)).split()]
            a.admitted = bool(kids)
            for k in kids:
                if k not in a.runs:
                    a.runs[k] = [0.0, self._grant(a.task)]
                a.live = k
                cpu = _cpu_seconds(k)
                if cpu is not None:
                    a.runs[k][0] = cpu

    def _classify(self, att, rc, cpu):
        o = self.out[att.task.idx]
        att.err.seek(0)
        text = att.err.read()
        att.err.close()
        evicted = text.count("evicted by the node guard")
        o.attempts += text.count("running it again")
        o.evictions += evicted
        o.policy_kills += evicted
        if rc == EX_EVICTED:
            # Evicted past its reruns: everything it did was thrown away.
            o.cpu += cpu
            o.wasted_cpu += cpu
            o.evicted_cpu += cpu
            return
        # The runs before the last one were evicted; the last one ended
        # here (done, or killed by the kernel: then the whole is wasted).
        lost = sum(c for c, _ in list(att.runs.values())[:-1])
        o.evicted_cpu += lost
        if rc == 0:
            o.wasted_cpu += lost
        super()._classify(att, rc, cpu)


class MemtallyPolicy:
    """memtallyd inside the node, its guard on (line 90% of the node), its
    fleet limit at the same 90% (what it counts can then use what the
    guard lets the node hold; admission also checks the node's own figure
    against the line), every task through `memtally run --retry`
    (MemtallyRunner). Declared: no --kind, every reservation the
    declaration ([kinds] reserve_learned = false too)."""
    name = "memtally (declared)"
    slug = "memtally-declared"
    headroom = 0.10
    learned = False
    warm = False
    beside_idle = False     # beside the memory an idle Dask cluster holds

    def run(self, ctx):
        r = PolicyResult(self.name)
        if self.beside_idle and ctx.arrivals not in DASK_IDLE:
            r.ran = False
            r.why_not = "no idle Dask cluster measured: run memtally-dask " \
                "or memtally-dask-warm before it"
            return r
        state = None
        if self.learned:
            state = learned_state(ctx, "learned", self.warm, r,
                                  "memtally-cold")
            if state is None:
                return r
        server = start_memtallyd(ctx, self.slug, self.headroom,
                                 learned=self.learned, state=state)
        runner = MemtallyRunner(ctx, r, server.socket, self.learned)
        if self.learned:
            r.on_declared = {t.job: 0 for t in ctx.tasks}
        if self.warm:
            n = len(runner.mc.Client(server.socket).kinds().kinds)
            r.note = "started with %d kinds learned" % n
        probe = DaemonProbe(runner.mc, server.socket, server.proc.pid, ctx,
                            horizon=5.0)
        ballast = None
        if self.beside_idle:
            ballast = start_ballast(ctx, server.socket,
                                    DASK_IDLE[ctx.arrivals])
        probe.start()
        try:
            runner.run()
        finally:
            probe.stop()
            if ballast is not None:
                ballast.kill()
                ballast.wait()
        probe.require_counted(self.name)
        if self.learned and not runner.mc.Client(
                server.socket).kinds().kinds:
            raise benchlib.BenchError("fleet: %s: memtallyd learned no kind"
                                      % self.name)
        r.daemon = probe.summary(server.proc)
        r.forecast = probe.forecast_summary(r.oom_times)
        server.stop()
        r.evictions = _read(os.path.join(ctx.tmp, server.logname)).count(
            'msg="node guard: evicting"')
        r.kills_note = "evicted by memtallyd's guard"
        return r


class MemtallyColdPolicy(MemtallyPolicy):
    """Reservations learned (--kind, [kinds] reserve_learned = true), from
    no history: a kind's first runs are admitted on its declaration."""
    name = "memtally (learned, cold)"
    slug = "memtally-cold"
    learned = True


class MemtallyWarmPolicy(MemtallyColdPolicy):
    """Learned, after one pass of the workload: memtallyd starts on the
    learned sizes the cold row's memtallyd kept at its stop."""
    name = "memtally (learned, warm)"
    slug = "memtally-warm"
    warm = True


def start_ballast(ctx, sock, hold):
    """A python3 process inside the node, under the preload and registered
    with memtallyd as an untasked worker (as a Dask worker is), that
    brings the node to `hold` bytes for the whole run (what the node
    holds already, memtallyd and the interpreter, is part of `hold`).
    The clock restarts once it does: its start is not in the makespan."""
    env = dict(ctx.env, MEMTALLY_SOCKET=sock)
    code = ("import sys, time\n"
            "print('up', flush=True)\n"
            "b = bytearray(int(sys.stdin.readline()))\n"
            "for i in range(0, len(b), 4096):\n"
            "    b[i] = 1\n"
            "print('ready', flush=True)\n"
            "time.sleep(3600)\n")
    p = subprocess.Popen(join_cgroup_argv(ctx.node, [sys.executable, "-c",
                                                     code]),
                         env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE)
    ok = p.stdout.readline().strip() == b"up"
    if ok:
        p.stdin.write(b"%d\n" % max(MIB, hold - ctx.node.usage()))
        p.stdin.flush()
        ok = p.stdout.readline().strip() == b"ready"
    if not ok:
        p.kill()
        p.wait()
        raise benchlib.BenchError("fleet: the idle memory's holder did not "
                                  "start")
    time.sleep(0.5)     # memtallyd's resident sweeps (100 ms) count it
    benchlib.log("fleet: the node holds %.0f MiB before any task (the idle "
                 "cluster held %.0f)" % (ctx.node.usage() / MIB, hold / MIB))
    ctx.t0 = time.monotonic()
    return p


class MemtallyWarmIdlePolicy(MemtallyWarmPolicy):
    """The warm row beside what the memtally-dask rows' idle cluster held
    (the scheduler, nannies and workers before any task; the latest such
    row of the same arrivals): what that memory alone costs the learned
    row, so that memtally-dask's makespan can be read against it. It
    starts on what the learned rows before it kept (the cold row's pass
    and the warm row's)."""
    name = "memtally (learned, warm) beside Dask's idle memory"
    slug = "memtally-warm-idle"
    beside_idle = True


# arrivals -> bytes the node held once the memtally-dask rows' cluster was
# up, before any task (memtallyd and the idle cluster).
DASK_IDLE = {}


def learned_state(ctx, tag, warm, r, cold):
    """The restart record (STATE, and STATE.kinds: the learned sizes) of
    a learned row's memtallyd: a cold row starts it afresh, a warm row on
    what its cold row (`cold`) kept at its stop. None, with `r` saying
    why, when a warm row has nothing to start from."""
    state = os.path.join(ctx.tmp, "mt-%s-%s.state" % (tag, ctx.arrivals))
    if not warm:
        for f in (state, state + ".kinds"):
            if os.path.exists(f):
                os.unlink(f)
    elif not os.path.exists(state + ".kinds"):
        r.ran = False
        r.why_not = "no learned sizes to start from: run %s before it" % cold
        return None
    return state


def start_memtallyd(ctx, policy, headroom, learned=None, state=None):
    """memtallyd (the build's, or $MEMTALLYD) inside the node, its fleet
    limit the node less `headroom`, reservations reconciled against use,
    the forecast on (horizon 5 s over a 4 s window). With `learned` set
    (True or False), its node guard on and [kinds] reserve_learned so;
    `state`, its restart record (and STATE.kinds, the learned sizes).
    Returns the running harness.Server."""
    run = "%s-%s" % (policy, ctx.arrivals)
    conf = os.path.join(ctx.tmp, "mt-%s.conf" % run)
    fleet = int(ctx.node.limit * (1 - headroom))
    with open(conf, "w") as f:
        # A lane for each thread a Dask worker allocates on (the
        # memtally-dask rows' worker: 16 task threads and about six of
        # Dask's own), so that each task run inside it is counted by its
        # own thread's.
        f.write("[server]\nlanes = 24\n")
        f.write("[limits]\nfleet = %d\nmeasure = max\nrss_interval = 100\n"
                "growth_window = 4s\nforecast_horizon = 5s\n" % fleet)
        if learned is not None:
            f.write("[guard]\nenabled = true\nline = 90%%\n"
                    "[kinds]\nreserve_learned = "
                    "%s\n" % ("true" if learned else "false"))
        # Experiments only: more config (e.g. "[admission]\nqueue = false").
        f.write(os.environ.get("FLEET_MEMTALLYD_CONF", "").replace("\\n", "\n"))
    # FLEET_LOG=info: memtallyd's decisions in full (no log budget), for
    # reading why it denied what it denied (kept with --keep DIR).
    log = os.environ.get("FLEET_LOG")
    extra = ["--config", conf]
    if log:
        extra += ["--log-budget", "none"]
    if state:
        extra += ["--state", state]
    logname = "memtallyd-%s.log" % run
    server, _ = benchlib.start_server(
        ctx.build, ctx.tmp, exe=os.environ.get("MEMTALLYD"),
        prefix=join_cgroup_argv(ctx.node, []),
        sock=os.path.join(ctx.tmp, "mt-%s.sock" % run), segment=None,
        log=logname, wait=10, required=True, extra_args=extra,
        log_level=log or "warn")
    server.logname = logname
    return server


class DaemonProbe:
    """What happens to memtallyd under the pressure: its RSS, the latency
    of a (denied) Admit every 100 ms, and the Watch events of the fleet
    (forecast alarms, over)."""

    def __init__(self, mc, sock, pid, ctx, horizon):
        self.mc = mc
        self.sock = sock
        self.pid = pid
        self.ctx = ctx
        self.horizon = horizon
        self.lat = []
        self.errors = 0
        self.rss_max = 0
        self.counted_max = 0  # the fleet's measured bytes, from the denials
        self.events = []
        self.halt = threading.Event()

    def start(self):
        self.threads = [threading.Thread(target=self._admits, daemon=True),
                        threading.Thread(target=self._watch, daemon=True)]
        for t in self.threads:
            t.start()

    def stop(self):
        self.halt.set()
        self.threads[0].join(5)

    def _rss(self):
        for line in _read("/proc/%d/status" % self.pid).splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def _admits(self):
        c = None
        while not self.halt.wait(0.1):
            self.rss_max = max(self.rss_max, self._rss())
            try:
                if c is None:
                    c = self.mc.Client(self.sock, timeout=2.0)
                t = time.monotonic()
                res = c.admit(1 << 50)  # always denied: nothing reserved
                self.lat.append(time.monotonic() - t)
                self.counted_max = max(self.counted_max, res.fleet_bytes)
            except (OSError, self.mc.MemtallyError):
                self.errors += 1
                c = None

    def _watch(self):
        try:
            c = self.mc.Client(self.sock, timeout=2.0)
            for ev in c.watch():
                if ev.scope == "fleet":
                    self.events.append((self.ctx.now(), ev.state, ev.reason))
        except Exception:  # noqa: BLE001 - the daemon stopped: done
            return

    def require_counted(self, name):
        """Proof of what ran: memtallyd counted the tasks (its fleet's
        measured bytes, read from the probe's denials, moved). A run whose
        tasks were never counted (the preload not loaded, MEMTALLY_DISABLE,
        another socket) would still fill a row."""
        if self.counted_max < MIB:
            raise benchlib.BenchError(
                "fleet: %s: memtallyd counted %d bytes at most over the "
                "run: its tasks were not counted" % (name, self.counted_max))

    def summary(self, daemon):
        lat = sorted(self.lat)
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else None
        return {"alive": daemon.poll() is None, "rss_max": self.rss_max,
                "admit_p99_ms": p99 * 1000 if p99 is not None else None,
                "admits": len(lat), "errors": self.errors,
                "oom_score_adj": _read("/proc/%d/oom_score_adj" %
                                       daemon.pid).strip()}

    def forecast_summary(self, oom_times):
        """An alarm is a fleet event whose reason is the forecast; it is
        right when the fleet goes over, or a kill happens, within the
        horizon after it. A miss: the fleet over, or a kernel OOM kill,
        with no alarm in the horizon before."""
        pb = self.mc.pb
        alarms = [t for t, s, why in self.events if why.startswith("forecast")]
        overs = [t for t, s, _ in self.events if s == pb.STATE_OVER]
        bad = sorted(overs + list(oom_times))
        false = sum(1 for a in alarms
                    if not any(a <= b <= a + self.horizon for b in bad))
        missed = sum(1 for b in bad
                     if not any(b - self.horizon <= a <= b for a in alarms))
        return {"alarms": len(alarms), "false_alarms": false,
                "misses": missed, "overs": len(overs)}


# ---- Dask ----------------------------------------------------------------------


def dask_missing():
    """Why Dask cannot run here, or None."""
    try:
        import distributed  # noqa: F401
    except ImportError as e:
        return "dask.distributed not installed (%s)" % e
    return None


class DaskPolicy:
    """A real dask.distributed LocalCluster inside the node (scheduler,
    nannies and workers: bench/fleet_dask.py, started in the node's
    cgroup) with Dask's defaults: per worker, pause at 80% and terminate
    (the nanny restarts it) at 95% of memory_limit = node / n_workers,
    checked every 100 ms; a task on workers that died 4 times is lost
    (KilledWorker). The tasks are Python functions that hold their memory
    in the worker process, so Dask's monitor sees them.

    Concurrency: 2 worker processes of 8 threads, 16 tasks at once as the
    other policies' 16 slots. Fewer, larger workers because each worker
    process costs the node tens of MiB of its own, and a task larger than
    a worker's share can never finish: with 4 workers (160 MiB each) the
    largest tasks (up to 224 MiB) would be lost for sure; with 2 (320 MiB)
    every task fits a worker alone. The tasks are 10% CPU, so 8 threads
    under one GIL keep up."""

    name = "dask"
    headroom = 0.10         # memtally-dask's fleet limit: the node less 10%
    n_workers = 2
    threads = 8
    deadline = 240.0        # seconds after the start; then what is left is lost
    stall = 15.0            # seconds with no task running, some waiting: lost
    memtally = False

    def run(self, ctx):
        r = PolicyResult(self.name)
        why = dask_missing()
        if why:
            r.ran, r.why_not = False, why
            return r
        env = dict(ctx.env)
        src = benchlib.SRC_DIR
        env["PYTHONPATH"] = os.pathsep.join(
            [os.path.join(src, "bench"), os.path.join(src, "python")] +
            ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env.setdefault("MEMTALLY_PB2_DIR", os.path.join(ctx.build, "python"))
        server = probe = None
        if self.memtally:
            state = learned_state(ctx, "dask", self.warm, r, "memtally-dask")
            if state is None:
                return r
            server = start_memtallyd(ctx, self.slug, self.headroom,
                                     learned=True, state=state)
            env["MEMTALLY_SOCKET"] = server.socket
            probe = DaemonProbe(_pb_client(ctx.build), server.socket,
                                server.proc.pid, ctx, horizon=5.0)
        try:
            self._run_cluster(ctx, r, env, probe, server)
        finally:
            if probe is not None:
                if hasattr(probe, "threads"):   # started with the clock
                    probe.stop()
                probe.require_counted(self.name)
                r.daemon = probe.summary(server.proc)
                r.forecast = probe.forecast_summary(r.oom_times)
                server.stop()
        return r

    def memory_limit(self, ctx):
        """Dask's own split: each worker its share of the node."""
        return ctx.node.limit // self.n_workers

    def _run_cluster(self, ctx, r, env, probe, server):
        """Start the cluster in the node, start the clock when it is up,
        wait for its result (or kill it past the deadline), read the
        outcomes."""
        workdir = os.path.join(ctx.tmp, "%s-%s" % (self.name, ctx.arrivals))
        os.makedirs(workdir)
        spec = os.path.join(workdir, "spec.json")
        with open(spec, "w") as f:
            json.dump({"tasks": [t.as_dict() for t in ctx.tasks],
                       "n_workers": self.n_workers, "threads": self.threads,
                       "memory_limit": self.memory_limit(ctx),
                       "workdir": workdir, "memtally": self.memtally,
                       "deadline": self.deadline, "stall": self.stall}, f)
        log = open(os.path.join(workdir, "driver.log"), "w")
        driver = subprocess.Popen(
            join_cgroup_argv(ctx.node, [sys.executable, os.path.join(
                benchlib.SRC_DIR, "bench", "fleet_dask.py"), spec]),
            env=env, stdin=subprocess.PIPE, stdout=log, stderr=log)
        try:
            ready = os.path.join(workdir, "ready")
            limit = time.monotonic() + 120
            while not os.path.exists(ready):
                if driver.poll() is not None or time.monotonic() > limit:
                    raise benchlib.BenchError(
                        "%s: the cluster did not start: %s" % (
                            self.name, _read(log.name)[-600:]))
                time.sleep(0.1)
            # The clock starts now: cluster start-up is not in the makespan
            # (the node's memory from here on includes the idle cluster).
            r.t_offset = ctx.now()
            r.idle_usage = ctx.node.usage()
            if self.memtally:
                DASK_IDLE[ctx.arrivals] = r.idle_usage
            benchlib.log("fleet: %s: the idle cluster holds %.0f MiB of the "
                         "node" % (self.name, r.idle_usage / MIB))
            if probe is not None:
                probe.start()
            driver.stdin.write(b"go\n")
            driver.stdin.flush()
            try:
                driver.wait(self.deadline + 60)
            except subprocess.TimeoutExpired:
                driver.kill()
                driver.wait()
                r.note = "the cluster did not finish; killed"
            if driver.returncode and not r.note:
                r.note = "the cluster's process ended with %d" % \
                    driver.returncode
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait()
            log.close()
        evicted = None
        if server is not None:
            # The workers memtallyd's node guard ended, from its log: a
            # SIGKILL the nanny did not send is the kernel's unless it
            # was memtallyd's.
            evicted = set(int(m) for m in re.findall(
                r'msg="node guard: evicting" .*? pid=(\d+)',
                _read(os.path.join(ctx.tmp, server.logname))))
        self._outcomes(ctx, r, workdir, evicted)

    def _outcomes(self, ctx, r, workdir, evicted=None):
        """One TaskOutcome per task from the attempt files (each attempt:
        its worker's pid, CPU-seconds, done) and the nannies' log: an
        attempt not done whose worker the nanny terminated was ended by
        Dask (policy kill); one whose worker died by SIGKILL otherwise was
        ended by the kernel's OOM killer, unless memtallyd's node guard
        evicted that worker (`evicted`, its pids). A task is done when an
        attempt finished and Dask did not report it lost."""
        res = {}
        try:
            with open(os.path.join(workdir, "result.json")) as f:
                res = json.load(f)
        except (OSError, ValueError):
            pass
        off = r.t_offset
        t0 = res.get("t0")
        to_ctx = (lambda t: t - t0) if t0 else (lambda t: t - ctx.t0 - off)
        terminated, sigkilled = set(), {}
        for t, pid, what in res.get("nanny", []):
            if what == "terminate":
                terminated.add(pid)
            elif what == "signal 9":
                sigkilled[pid] = to_ctx(t)
        evicted = evicted or set()
        kernel = {p: t for p, t in sigkilled.items()
                  if p not in terminated and p not in evicted}
        r.oom_times = sorted(kernel.values())
        r.workers_terminated = len(terminated)
        r.workers_killed = len(kernel)
        outs = {t.idx: TaskOutcome(t.idx) for t in ctx.tasks}
        last = 0.0
        adir = os.path.join(workdir, "attempts")
        for name in os.listdir(adir) if os.path.isdir(adir) else []:
            if name.endswith(".tmp"):
                continue
            idx = int(name.split(".")[0])
            pid, cpu, done, when = _read(os.path.join(adir, name)).split()
            o = outs[idx]
            o.attempts += 1
            o.cpu += float(cpu)
            last = max(last, to_ctx(float(when)))
            if int(done):
                o.done = True
                o.finished = max(o.finished or 0, to_ctx(float(when)))
                continue
            o.wasted_cpu += float(cpu)
            if int(pid) in terminated:
                o.policy_kills += 1
            elif int(pid) in evicted:
                o.policy_kills += 1
                o.evictions += 1
                o.evicted_cpu += float(cpu)
            elif int(pid) in kernel:
                o.kernel_kills += 1
        status = res.get("tasks")
        results_lost = 0
        for idx, o in outs.items():
            st = status.get(str(idx), {}) if status is not None else {}
            if status is not None and st.get("status") != "finished":
                # Its result died with its worker and Dask had not
                # produced it again: not delivered, not done.
                results_lost += o.done
                o.done = False
            if st.get("status") == "error" and "KilledWorker" not in \
                    st.get("error", ""):
                o.failures += 1
        r.outcomes = list(outs.values())
        # The last moment any task ran (its end, or its attempt's last
        # word): a run that gave up on waiting tasks is not charged the
        # wait.
        r.makespan = last
        notes = []
        if results_lost:
            notes.append("%d ran to the end, results lost with their "
                         "workers" % results_lost)
        if res.get("gave_up"):
            notes.append("gave up: %s" % res["gave_up"])
        r.note = "; ".join(notes)
        r.kills_note = "%d workers terminated by Dask, %d killed by the " \
            "kernel" % (r.workers_terminated, r.workers_killed)
        if self.memtally:
            r.evictions = len(evicted)
            r.kills_note += ", %d evicted by memtallyd's guard" % len(evicted)


class MemtallyDaskPolicy(DaskPolicy):
    """DaskPolicy with memtallyd inside the node, as the learned rows run
    it (fleet limit and node guard line at 90% of the node), every worker
    under the preload (counted) with MEMTALLY_SOCKET set and
    memtally.dask.Admission installed, each task annotated with its
    declared bytes: a task is admitted on memtallyd, inside the thread that
    runs it, before it runs.

    Each worker's memory_limit is the node's, as python/README.md advises
    with memtally: memtallyd admits on the whole node, so Dask's static
    split of it (node / n_workers, the dask row's) would only strand
    memory in the worker that has no use for it. Dask's pause (80%) and
    terminate (95%) thresholds stay, above the guard's line.

    One worker process of 16 threads, not the dask row's two of 8: with
    the node as its memory_limit a second process buys no room, and costs
    the node ~45 MiB of its own (the idle cluster: ~100 MiB against
    ~145)."""

    name = "memtally-dask"
    slug = "memtally-dask"
    memtally = True
    warm = False
    n_workers = 1
    threads = 16

    def memory_limit(self, ctx):
        """The node's: memtallyd, not a static split, shares it out."""
        return ctx.node.limit


class MemtallyDaskWarmPolicy(MemtallyDaskPolicy):
    """memtally-dask after one pass of the workload: memtallyd starts on
    the kinds its cold row's memtallyd learned from the tasks' own
    memory in their workers (each task's thread, Admit.in_process)."""

    name = "memtally-dask (warm)"
    slug = "memtally-dask-warm"
    warm = True


# ---- sampling and the whole run ---------------------------------------------------


class Sampler(threading.Thread):
    """The node's usage every 100 ms, and when its oom_kill counter moves."""

    def __init__(self, ctx, result):
        super().__init__(daemon=True)
        self.ctx, self.result = ctx, result
        self.halt = threading.Event()

    def run(self):
        t0 = self.ctx.t0
        while not self.halt.wait(0.1):
            if self.ctx.t0 != t0:   # the policy restarted the clock
                t0 = self.ctx.t0
                del self.result.samples[:], self.result.slots[:]
            r = self.ctx.runner
            reserved = r.reserved_running() if r and r.reserves else 0
            self.result.samples.append((self.ctx.now(), self.ctx.node.usage(),
                                        reserved))
            if r is not None:
                runs = list(r.running.values())
                held = sum(1 for a in runs if getattr(a, "admitted", True))
                self.result.slots.append((held, len(runs) - held))


def run_policy(policy, node_limit, tasks, args, arrivals, tmp, env):
    if isinstance(policy, NotRun):
        return policy.run(None)
    node = make_node(node_limit, "memtally-node-%d-%s" % (
        os.getpid(), getattr(policy, "slug", policy.name)))
    try:
        ctx = RunContext(node, tasks, args.c_worker, args.py_worker, env, tmp,
                         args.build, args.slots, arrivals)
        result_box = PolicyResult(policy.name)
        sampler = Sampler(ctx, result_box)
        sampler.start()
        try:
            result = policy.run(ctx)
        finally:
            sampler.halt.set()
            sampler.join()
        # A policy may start its clock late (after a cluster's start-up):
        # its samples begin there too.
        off = result.t_offset
        result.samples = [(t - off, u, d) for t, u, d in result_box.samples
                          if t >= off]
        result.kernel_oom_counter += node.oom_kills()
        if result_box.slots:
            # How many of the slots ran a task, how many waited for room.
            n = len(result_box.slots)
            benchlib.log("fleet: %s: slots: %.1f running, %.1f waiting "
                         "for room on average" % (
                             policy.name,
                             sum(a for a, _ in result_box.slots) / n,
                             sum(b for _, b in result_box.slots) / n))
        return result
    finally:
        node.remove()


# ---- the table ---------------------------------------------------------------


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))] if xs else 0.0


def summarise(r, limit):
    if not r.ran:
        return None
    o = r.outcomes
    use = [u / limit for _, u, _ in r.samples]
    # Slack: what was set aside and not used, of what was set aside
    # (Autopilot's figure), over the samples where something was.
    reserved = sum(d for _, _, d in r.samples if d)
    slack = sum(d - u for _, u, d in r.samples if d) / reserved \
        if reserved else None
    cpu = sum(x.cpu for x in o)
    return {
        "completed": sum(x.done for x in o),
        "lost": sum(not x.done for x in o),
        "kernel_kills": sum(x.kernel_kills for x in o),
        "oom_counter": r.kernel_oom_counter,
        "policy_kills": sum(x.policy_kills for x in o),
        "failures": sum(x.failures for x in o),
        "retries": sum(max(0, x.attempts - 1) for x in o),
        "wasted_cpu": sum(x.wasted_cpu for x in o),
        "makespan": r.makespan,
        "use_mean": sum(use) / len(use) if use else 0.0,
        "use_p95": pct(use, 0.95),
        "slack_mean": slack,
        "evictions": r.evictions,
        "evicted_cpu": sum(x.evicted_cpu for x in o),
        "task_cpu": cpu,
        "evicted_cpu_share": sum(x.evicted_cpu for x in o) / cpu
        if cpu else None,
    }


def lost_cell(s, r):
    """Tasks lost, and how many failed; why the run ended early if it did."""
    why = []
    if s["failures"]:
        why.append("%d failed" % s["failures"])
    if r.note and s["lost"]:
        why.append(r.note)
    return "%d (%s)" % (s["lost"], "; ".join(why)) if why else \
        "%d" % s["lost"]


def table(results, limit):
    head = ("| arrivals | policy | completed | lost | kernel OOM kills "
            "| killed by policy | retries | CPU-s thrown away | evictions "
            "| CPU-s evictions threw away | makespan s "
            "| use mean | use p95 | slack | memtallyd | forecast |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
            "\n")
    rows = []
    for arrivals, r in results:
        s = summarise(r, limit)
        if s is None:
            rows.append("| %s | %s | not run: %s |||||||||||||| |" % (
                arrivals, r.name, r.why_not))
            continue
        d = r.daemon
        daemon = "—"
        if d:
            daemon = "%s, RSS %.1f MiB, Admit p99 %s, oom_score_adj %s" % (
                "alive" if d["alive"] else "**dead**", d["rss_max"] / MIB,
                "%.2f ms" % d["admit_p99_ms"] if d["admit_p99_ms"] is not None
                else "—", d["oom_score_adj"] or "?")
        fc = "—"
        if r.forecast:
            fc = "%d alarms, %d false, %d missed (of %d over)" % (
                r.forecast["alarms"], r.forecast["false_alarms"],
                r.forecast["misses"], r.forecast["overs"])
        ev = evcpu = "—"
        if s["evictions"] is not None:
            ev = "%d" % s["evictions"]
            evcpu = "%.2f (%.1f%% of %.1f)" % (
                s["evicted_cpu"], 100 * (s["evicted_cpu_share"] or 0),
                s["task_cpu"])
        rows.append(
            "| %s | %s | %d | %s | %d (counter %d) | %s | %d | %.1f | %s | %s "
            "| %.1f | %.0f%% | %.0f%% | %s | %s | %s |" % (
                arrivals, r.name, s["completed"],
                lost_cell(s, r),
                s["kernel_kills"], s["oom_counter"],
                "%d (%s)" % (s["policy_kills"], r.kills_note)
                if r.kills_note else "%d" % s["policy_kills"],
                s["retries"], s["wasted_cpu"], ev, evcpu, s["makespan"],
                s["use_mean"] * 100, s["use_p95"] * 100,
                "%.0f%%" % (s["slack_mean"] * 100)
                if s["slack_mean"] is not None else "—", daemon, fc))
    return head + "\n".join(rows) + "\n"


WARM = "memtally (learned, warm)"
IDLE = "memtally (learned, warm) beside Dask's idle memory"
COLD = "memtally (learned, cold)"


def lost_by_kind(r, tasks):
    """What a row lost, by kind, largest share first ("job02 x5, job05
    x3"), and those tasks' work (peak x time, MiB x s) of all tasks':
    what a makespan that lost them does not contain."""
    by_idx = {t.idx: t for t in tasks}
    lost = [by_idx[x.idx] for x in r.outcomes
            if not x.done and x.idx in by_idx]
    if not lost:
        return None
    count = {}
    for t in lost:
        count[t.job] = count.get(t.job, 0) + 1
    kinds = ", ".join("%s x%d" % (j, n) for j, n in sorted(
        count.items(), key=lambda jn: (-jn[1], jn[0])))
    work = sum(t.peak_mib * t.secs for t in lost)
    total = sum(t.peak_mib * t.secs for t in tasks)
    return "%s: %.0f%% of the workload's peak x time" % (
        kinds, 100 * work / total if total else 0)


def goals(results, limit, tasks=()):
    """The targets memtally (learned, warm) is held to, per arrival
    pattern, each said met or missed with the figures; and how the cold
    row learned. `tasks`: the workload, to say what an unmanaged row's
    makespan left out."""
    lines = []
    by, raw = {}, {}
    for a, r in results:
        s = summarise(r, limit)
        if s is not None:
            by.setdefault(a, {})[r.name] = s
            raw.setdefault(a, {})[r.name] = r
    ok = lambda c: "met" if c else "**missed**"  # noqa: E731
    for a, rows in by.items():
        m = rows.get(WARM)
        if not m:
            continue
        lines.append("- %s: kernel OOM kills %d (counter %d; target 0): %s; "
                     "tasks lost %d (target 0): %s" % (
                         a, m["kernel_kills"], m["oom_counter"],
                         ok(m["kernel_kills"] == 0 and m["oom_counter"] == 0),
                         m["lost"], ok(m["lost"] == 0)))
        none, st = rows.get("none"), rows.get("static")
        if none:
            gone = lost_by_kind(raw[a]["none"], tasks) if tasks else None
            lines.append("- %s: makespan %.1f s, %.2f x none's %.1f s "
                         "(target <= 1.2 x): %s%s" % (
                             a, m["makespan"], m["makespan"] / none["makespan"],
                             none["makespan"],
                             ok(m["makespan"] <= 1.2 * none["makespan"]),
                             "; none's lost tasks, not in its makespan: " +
                             gone if gone else ""))
            d = (m["use_mean"] - none["use_mean"]) * 100
            lines.append("- %s: mean node use %.0f%% against none's %.0f%% "
                         "(%+.0f points; target >= -10): %s" % (
                             a, m["use_mean"] * 100, none["use_mean"] * 100,
                             d, ok(d >= -10)))
        if st:
            lines.append("- %s: faster than static (%.1f s against %.1f s): "
                         "%s" % (a, m["makespan"], st["makespan"],
                                 ok(m["makespan"] < st["makespan"])))
        if m["slack_mean"] is not None:
            lines.append("- %s: slack %.0f%% (target <= 23%%): %s" % (
                a, m["slack_mean"] * 100, ok(m["slack_mean"] <= 0.23)))
        share = m["evicted_cpu_share"] or 0.0
        lines.append("- %s: %d evictions threw away %.2f CPU-s, %.1f%% of "
                     "all task CPU-seconds (%.1f; target <= 2%%): %s" % (
                         a, m["evictions"] or 0, m["evicted_cpu"],
                         100 * share, m["task_cpu"], ok(share <= 0.02)))
        idle = rows.get(IDLE)
        for name in ("memtally-dask", "memtally-dask (warm)"):
            d = rows.get(name)
            if not d:
                continue
            beside = ""
            if idle and raw[a][name].idle_usage is not None:
                beside = "; beside the idle cluster's memory (%.0f MiB) the " \
                    "learned row takes %.1f s: %.2f x that" % (
                        raw[a][name].idle_usage / MIB, idle["makespan"],
                        d["makespan"] / idle["makespan"])
            lines.append("- %s, %s: lost %d (target 0): %s; makespan %.1f s, "
                         "%.2f x %s's %.1f s (target <= 1.2 x): %s%s" % (
                             a, name, d["lost"], ok(d["lost"] == 0),
                             d["makespan"], d["makespan"] / m["makespan"],
                             WARM, m["makespan"],
                             ok(d["makespan"] <= 1.2 * m["makespan"]),
                             beside))
    for a, rr in raw.items():
        for name in (COLD, WARM):
            r = rr.get(name)
            if r is None or r.on_declared is None:
                continue
            runs = sorted(r.on_declared.values())
            lines.append("- %s, %s: runs of a kind admitted on its "
                         "declaration before it had a learned size: median "
                         "%d, at most %d (%d kinds)" % (
                             a, name, runs[len(runs) // 2], runs[-1],
                             len(runs)))
    return "\n".join(lines) + "\n"


def plot(results, limit, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        benchlib.log("fleet: no matplotlib, no picture")
        return False
    arrivals = []
    for a, _ in results:
        if a not in arrivals:
            arrivals.append(a)
    fig, axes = plt.subplots(len(arrivals), 1, figsize=(10, 4 * len(arrivals)),
                             squeeze=False)
    for ax, a in zip(axes[:, 0], arrivals):
        for arr, r in results:
            if arr != a or not r.ran or not r.samples:
                continue
            ts = [t for t, _, _ in r.samples]
            us = [u / limit * 100 for _, u, _ in r.samples]
            line, = ax.plot(ts, us, label=r.name, linewidth=1)
            for t in r.oom_times:
                i = min(range(len(ts)), key=lambda k: abs(ts[k] - t))
                ax.plot([t], [us[i]], marker="x", color=line.get_color(),
                        markersize=8)
        ax.axhline(100, color="grey", linestyle="--", linewidth=0.8)
        ax.set_title("node memory, arrivals: %s (x = kernel OOM kill)" % a)
        ax.set_xlabel("seconds")
        ax.set_ylabel("usage / node limit, %")
        ax.set_ylim(0, 110)
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return True


POLICIES = {
    "none": NonePolicy,
    "static": StaticPolicy,
    "pollkill": PollKillPolicy,
    "memtally-declared": MemtallyPolicy,
    "memtally-cold": MemtallyColdPolicy,
    "memtally-warm": MemtallyWarmPolicy,
    "dask": DaskPolicy,
    "memtally-dask": MemtallyDaskPolicy,
    "memtally-dask-warm": MemtallyDaskWarmPolicy,
    "memtally-warm-idle": MemtallyWarmIdlePolicy,
}
# Policies that cannot run in this harness: name -> why.
NOT_RUN = {}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(benchlib.SRC_DIR,
                                                    "build"))
    ap.add_argument("--workload", type=int, default=7,
                    help="which workload: the same number, the same tasks")
    ap.add_argument("--tasks", type=int, default=100)
    ap.add_argument("--node-mib", type=int, default=640)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--policy",
                    default="none,static,pollkill,dask,memtally-declared,"
                    "memtally-cold,memtally-warm,memtally-dask,"
                    "memtally-dask-warm,memtally-warm-idle")
    ap.add_argument("--arrivals", default="batch,over-time")
    ap.add_argument("--results")
    ap.add_argument("--plot")
    ap.add_argument("--json")
    ap.add_argument("--keep", metavar="DIR",
                    help="keep the run's logs and work files in DIR")
    args = ap.parse_args(argv)
    # Stopped, still remove the node (the finally blocks run).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.build = os.path.abspath(args.build)
    workers = os.environ.get("MT_WORKERS",
                             os.path.join(args.build, "tests", "integration"))
    args.c_worker = [os.path.join(workers, "mt_worker"), "fleet"]
    args.py_worker = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                  "fleet_worker.py")
    preload = os.environ.get("MEMTALLY_PRELOAD_LIB", os.path.join(
        args.build, "client", "libmemtally_preload.so"))
    # Without its glibc front end beside it, the preload keeps python3 on
    # jemalloc, whose freed pages a quiet long-lived process (a Dask
    # worker) keeps: the Python tasks would not run as their users run them.
    glibc = os.path.join(os.path.dirname(preload), "libmemtally_glibc.so")
    for f in (args.c_worker[0], preload, glibc):
        if not os.path.exists(f):
            raise SystemExit("fleet: %s not built" % f)
    limit = args.node_mib * MIB
    try:
        make_node(limit).remove()
    except NoCgroup as e:
        print("fleet: skipped: %s" % e, file=sys.stderr)
        return SKIP
    env = dict(os.environ)
    # Every policy's tasks as their users run them: none of a caller's
    # settings that would switch memtally off or change the allocators.
    for k in ("MEMTALLY_DISABLE", "MEMTALLY_ALLOCATOR",
              "MEMTALLY_ALLOCATOR_SWITCHED", "MALLOC_CONF", "GLIBC_TUNABLES",
              "PYTHONMALLOC"):
        env.pop(k, None)
    env["LD_PRELOAD"] = preload
    env["MEMTALLY_SOCKET"] = "/nonexistent/memtally.sock"  # counted, no server
    info = benchlib.machine_info()
    results = []
    with tempfile.TemporaryDirectory(prefix="mtfleet-") as tmp:
        if args.keep:   # logs and work files kept there, for a look after
            tmp = args.keep
            os.makedirs(tmp, exist_ok=True)
        for arrivals in args.arrivals.split(","):
            tasks = make_workload(args.workload, args.tasks, arrivals,
                                  args.node_mib)
            for name in args.policy.split(","):
                pol = POLICIES[name]() if name in POLICIES else \
                    NotRun(name, NOT_RUN.get(name, "unknown policy"))
                benchlib.log("fleet: %s / %s ..." % (arrivals, name))
                r = run_policy(pol, limit, tasks, args, arrivals, tmp, env)
                s = summarise(r, limit)
                benchlib.log("fleet: %s / %s: %s" % (arrivals, name, s))
                results.append((arrivals, r))
    tab = table(results, limit)
    print(tab)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"arrivals": a, "policy": r.name, "ran": r.ran,
                        "summary": summarise(r, limit), "daemon": r.daemon,
                        "forecast": r.forecast, "oom_times": r.oom_times}
                       for a, r in results], f, indent=1)
    if args.plot:
        plot(results, limit, args.plot)
    if args.results:
        tasks = make_workload(args.workload, args.tasks, "batch", args.node_mib)
        text = section_text(info, args, tasks, tab + "\nTargets:\n\n" +
                            goals(results, limit, tasks))
        benchlib.write_section(args.results, "fleet", text)
    return 0


def section_text(info, args, tasks, tab):
    peaks = sorted(t.peak_mib for t in tasks)
    under = sum(t.peak_mib > t.declared_mib for t in tasks)
    jobs = {t.job for t in tasks}
    return (
        "## fleet: a node that runs out of memory\n\n"
        "Measured %s on %s (%d CPUs, Linux %s); commit `%s`.\n"
        "Node: a memory cgroup of %d MiB, no swap. Workload #%d: %d "
        "tasks drawn from %d kinds that repeat (a kind: one language, "
        "profile, typical peak and time; a task's peak is its kind's within "
        "+-%d%%, its time within +-20%%), %d%% C / %d%% Python, profiles "
        "steady/ramp/spike/leak, true peak median %d MiB, p90 %d MiB, max "
        "%d MiB; a kind's time 1.5-4 s, at 10%% CPU; declared per kind, "
        "~2x the typical peak, %d tasks under their peak. %d runner slots for every "
        "policy; arrivals: all at once (batch) or Poisson at 4/s "
        "(over-time). Kernel OOM kills: attempts ended by SIGKILL that the "
        "policy did not send (the cgroups' own `oom_kill` counters beside "
        "them). Use: node usage / node limit sampled every 100 ms. Slack: "
        "what the policy set aside for the running tasks (declared sizes; "
        "for memtally what memtallyd reserved) less the node's usage, of "
        "what was set aside, over the run. Evictions: memtallyd's node "
        "guard's, from its log; the CPU-seconds of the evicted runs, of all "
        "the CPU-seconds its tasks used.\n\n%s\n"
        "![node memory per policy](%s)\n" % (
            info["date"], info["cpu_model"], info["nproc"], info["kernel"],
            info["commit"], args.node_mib, args.workload, len(tasks),
            len(jobs), round(JOB_SPREAD * 100),
            100 - round(100 * sum(t.kind == "py" for t in tasks) / len(tasks)),
            round(100 * sum(t.kind == "py" for t in tasks) / len(tasks)),
            peaks[len(peaks) // 2], peaks[int(len(peaks) * 0.9)], peaks[-1],
            under, args.slots, tab, picture_link(args)))


def picture_link(args):
    """The plot's path as the results file links it: relative to the
    file's directory (bench/results/fleet.md shows ../fleet.png)."""
    plot = os.path.abspath(args.plot or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "fleet.png"))
    return os.path.relpath(plot, os.path.dirname(os.path.abspath(
        args.results)))


if __name__ == "__main__":
    sys.exit(main())
