"""Integration-test harness: a real memtallyd, real workers, the real CLI.

Every wait polls with a deadline (scaled by MEMTALLY_TEST_TIMEOUT_MULT) and
never sleeps for a fixed time, so the tests pass on a loaded 2-core machine.
"""
import json
import mmap
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time



def _build_default(var, rel):
    """Where ctest would point `var`: run outside ctest, a test finds the
    binaries in MEMTALLY_BUILD (default: the source tree's build/)."""
    if var in os.environ:
        return os.environ[var]
    here = os.path.dirname(os.path.abspath(__file__))
    build = os.environ.get("MEMTALLY_BUILD",
                           os.path.join(here, "..", "..", "build"))
    path = os.path.normpath(os.path.join(build, rel))
    os.environ[var] = path  # for the test's own children
    return path


MULT = float(os.environ.get("MEMTALLY_TEST_TIMEOUT_MULT", "1"))
# A sanitized memtallyd answers a registration several times slower, and
# on a loaded machine past the client's 500 ms: the worker gives up and
# registers again later (a quiet one from its refresh thread), a second
# or more after the test expects. The workers (never sanitized) wait as
# much longer as the tests.
if MULT > 1:
    os.environ.setdefault("MEMTALLY_REGISTER_TIMEOUT_MS",
                          "%d" % (500 * MULT))
MEMTALLYD = _build_default("MEMTALLYD", "server/memtallyd")
CLI = _build_default("MEMTALLY_CLI", "programs/memtally")
PRELOAD = _build_default("MEMTALLY_PRELOAD_LIB", "client/libmemtally_preload.so")
WORKERS = _build_default("MT_WORKERS", "tests/integration")
_build_default("MEMTALLY_PB2_DIR", "python")  # as ctest sets it
_build_default("MEMTALLY_EXAMPLES", os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
MIB = 1 << 20
KIB = 1 << 10


# The workers: one program, a subcommand per behaviour (workers/mt_worker.c
# lists them), and the programs of their own, named mt_*.
WORKER = os.path.join(WORKERS, "mt_worker")


def worker(name, *args):
    """The argv that runs worker `name` with `args`: `mt_worker NAME
    ARGS...`, or for a program of its own (mt_cxx) `mt_cxx ARGS...`."""
    head = ([os.path.join(WORKERS, name)] if name.startswith("mt_")
            else [WORKER, name])
    return head + [str(a) for a in args]


def deadline(seconds):
    return time.monotonic() + seconds * MULT


def wait_for(what, pred, timeout=20.0, interval=0.02):
    """Poll pred() until it returns a truthy value; fail after timeout."""
    end = deadline(timeout)
    last = None
    while True:
        try:
            last = pred()
        except Exception as e:  # noqa: BLE001 - report the last failure
            last = e
        if last and not isinstance(last, Exception):
            return last
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}; last: {last!r}")
        time.sleep(interval)


_tsan = []


def under_tsan():
    """Whether memtallyd was built with ThreadSanitizer (links libtsan)."""
    if not _tsan:
        out = subprocess.run(["ldd", MEMTALLYD], capture_output=True,
                             text=True).stdout
        _tsan.append("libtsan" in out)
    return _tsan[0]


def terminate(proc, logtext, timeout=10.0):
    """SIGTERM a memtallyd and wait, up to `timeout` (scaled), for its exit;
    its exit status, or None if it is still running.

    ThreadSanitizer holds an asynchronous signal back until the thread's
    next intercepted call when it lands just as the thread enters
    epoll_wait; an idle server (no worker, so no tick) makes none, and the
    signal is never handled. Under TSan only, while the log (`logtext()`)
    has no "shutting down", the signal is sent again every 2 s: once it
    is handled, a second one would take the default action. A plain or
    ASan build gets one signal, so a lost one there still fails."""
    proc.send_signal(signal.SIGTERM)
    end = deadline(timeout)
    while True:
        try:
            return proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() > end:
            return None
        if under_tsan() and 'msg="shutting down"' not in logtext():
            proc.send_signal(signal.SIGTERM)


def signal_until(proc, sig, what, pred, timeout=20.0):
    """Send `sig` to a memtallyd and wait (up to `timeout`, scaled) for
    pred() to hold: a reload's effect, its log line. Under TSan only
    (see terminate()), the signal is sent again every 2 s until then; use
    it for signals whose repetition changes nothing pred() checks."""
    proc.send_signal(sig)
    end = deadline(timeout)
    while True:
        try:
            return wait_for(what, pred, timeout=2 / MULT)
        except AssertionError:
            if time.monotonic() > end:
                raise
        if under_tsan():
            proc.send_signal(sig)


def in_parallel(runs, fn):
    """fn(run) for every run at once; the first failure is raised."""
    errors = []

    def one(r):
        try:
            fn(r)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
    ts = [threading.Thread(target=one, args=(r,)) for r in runs]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]


def proc_kib(pid, name, field):
    """A "Field:  N kB" line of /proc/PID/<name>, in bytes."""
    with open(f"/proc/{pid}/{name}") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/{name}")


def rss_anon(pid):
    """pid's anonymous resident bytes (RssAnon of /proc/PID/status)."""
    return proc_kib(pid, "status", "RssAnon")


def read_makes_resident(mib=128, huge=False):
    """How many bytes reading untouched anonymous memory makes resident
    here: `mib` MiB mapped private and anonymous in this process, in small
    pages (MADV_NOHUGEPAGE) or, with `huge`, in transparent huge pages
    (MADV_HUGEPAGE), as the workers that read do; a byte read of every
    4 KiB page, RssAnon compared. Where reads map the kernel's shared zero
    page (small) or huge zero page (huge: transparent_hugepage/
    use_zero_page) this is about 0; otherwise the kernel allocates a page
    per read, and a test of read-only pages would assert the kernel, not
    memtally."""
    m = mmap.mmap(-1, mib * MIB, flags=mmap.MAP_PRIVATE,
                  prot=mmap.PROT_READ | mmap.PROT_WRITE)
    try:
        m.madvise(mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE)
        before = rss_anon(os.getpid())
        read = sum(m[off] for off in range(0, mib * MIB, 4096))
        made = rss_anon(os.getpid()) - before
        if read != 0:
            raise AssertionError(f"untouched memory read {read}, not 0")
        return made
    finally:
        m.close()


def settled_bytes(s, pid, ticks=5):
    """pid's figure once it has stopped moving: the same before and after
    `ticks` server ticks. A worker that says "ready" has flushed, but the
    server may publish the last of its threads' flushes a tick later."""
    last = {}

    def same():
        t0 = s.status()["ticks"]
        now = s.ps().get(pid, {}).get("bytes")
        wait_for(f"{ticks} ticks", lambda: s.status()["ticks"] >= t0 + ticks)
        ok = now is not None and now == last.get("v")
        last["v"] = now
        return now if ok else None

    return wait_for(f"pid {pid}'s figure settled", same)


class Server:
    """A memtallyd on a private socket (and restart record), stopped on exit.

    The integration tests and the benchmarks both start theirs here. A test
    takes the defaults (a fast tick, debug log, a fresh directory); a
    benchmark names its binary and directory and keeps memtallyd's own tick
    and log level, so that what it times is what a deployment runs."""

    count = 0

    def __init__(self, *args, slots=None, tick=10, after=None, prefix=(),
                 exe=None, directory=None, socket=None, segment="",
                 log_level="debug", log_name="memtallyd.log", cpus=None,
                 timeout=10):
        """Start memtallyd with `args` after the harness's own options.

        after=<a stopped or killed Server> restarts on that server's socket
        and restart record (its log goes on); prefix is a command memtallyd
        runs under (e.g. prlimit ...); exe another memtallyd than the
        build's. directory (default: a fresh one) holds the log `log_name`
        and, unless `socket` names another path, the socket. segment "" is a
        label of this server's own, None memtallyd's default. tick and
        log_level None leave memtallyd's defaults; cpus pins it. Raises
        AssertionError when it has not started within `timeout` s."""
        Server.count += 1
        if after is not None:
            self.dir, self.socket = after.dir, after.socket
            self.segment = after.segment
        else:
            self.dir = directory or tempfile.mkdtemp(prefix="mt-it-")
            self.socket = socket or os.path.join(self.dir, "memtally.sock")
            self.segment = (f"/mt-it-{os.getpid()}-{Server.count}"
                            if segment == "" else segment)
        self.log = open(os.path.join(self.dir, log_name), "a+b")
        # A restarted server appends to its predecessor's log: it is ready
        # at the first ready line after those already there.
        ready_before = self._ready_lines()
        cmd = [*prefix, exe or MEMTALLYD, "--socket", self.socket]
        if self.segment is not None:
            cmd += ["--label", self.segment]
        if tick is not None:
            cmd += ["--tick", str(tick)]
        if log_level is not None:
            cmd += ["--log-level", log_level]
        if slots:
            cmd += ["--slots", str(slots)]
        cmd += list(args)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=self.log)
        if cpus:
            try:
                os.sched_setaffinity(self.proc.pid, cpus)
            except OSError:
                pass
        # memtallyd listens before it sets up the segment (so that a
        # second server on the same socket is refused before it touches
        # anything): a connect can succeed while the segment is not there
        # yet, which a slow (TSan) build showed. Ready = its last start-up
        # line, "listening": by then it has logged what it did at start
        # (the segment, adoption, learned sizes, the guard), which tests
        # read at once (a slow build logged the learned sizes' refusal
        # after the segment line a test had taken for ready). Below info
        # that line is not logged: ready is then the connect alone.
        logs_ready = log_level in (None, "debug", "info")
        try:
            wait_for("memtallyd socket", self._connectable, timeout=timeout)
            if logs_ready:
                wait_for("memtallyd started", lambda: (
                    self._connectable()
                    and self._ready_lines() > ready_before), timeout=timeout)
        except BaseException:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            raise

    def _connectable(self):
        if self.proc.poll() is not None:
            raise AssertionError("memtallyd exited: " + self.logtext())
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self.socket)
            return True
        except OSError:
            return False
        finally:
            s.close()

    def _ready_lines(self):
        return self.logtext().count('msg="listening"')

    def logtext(self):
        self.log.flush()
        with open(self.log.name, "rb") as f:
            return f.read().decode(errors="replace")

    def tail(self, n=600):
        """The end of its log, on one line (for an error message)."""
        return self.logtext()[-n:].strip().replace("\n", " | ")

    def alive(self):
        return self.proc.poll() is None

    def env(self, group=None, **extra):
        e = dict(os.environ)
        e["LD_PRELOAD"] = PRELOAD
        e["MEMTALLY_SOCKET"] = self.socket
        e.pop("MEMTALLY_GROUP", None)
        if group is not None:
            e["MEMTALLY_GROUP"] = group
        e.update(extra)
        return e

    def cli(self, *args):
        out = subprocess.run([CLI, "--socket", self.socket, "--json", *args],
                             capture_output=True, timeout=30 * MULT)
        if out.returncode != 0:
            raise AssertionError(f"memtally {' '.join(args)} failed "
                                 f"({out.returncode}): {out.stderr.decode()}")
        return json.loads(out.stdout)

    def cli_text(self, *args):
        """The CLI's table (no --json), as text."""
        out = subprocess.run([CLI, "--socket", self.socket, *args],
                             capture_output=True, text=True,
                             timeout=30 * MULT)
        if out.returncode != 0:
            raise AssertionError(f"memtally {' '.join(args)} failed "
                                 f"({out.returncode}): {out.stderr}")
        return out.stdout

    def status(self):
        return self.cli("status")

    def ps(self):
        return {p["pid"]: p for p in self.cli("ps")["processes"]}

    def kill9(self):
        """SIGKILL the server: socket file and restart record stay behind."""
        self.proc.kill()
        self.proc.wait()

    def stop(self, check_status=True):
        """SIGTERM the server and wait; its exit status. A server that
        exits other than 0 on this SIGTERM fails the test (with
        check_status): under ASan that is a leak, under TSan a race
        (exit 66), reported only there. One that had exited before is
        not judged here (kill9, or a test that saw it exit)."""
        if self.proc.poll() is None:
            rc = terminate(self.proc, self.logtext)
            if rc is None:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("memtallyd did not stop on SIGTERM")
            if check_status and rc != 0:
                raise AssertionError(f"memtallyd exit status {rc} at its "
                                     f"stop: {self.logtext()[-6000:]}")
        return self.proc.returncode

    def forget(self):
        """Remove the restart record (and the reservations'), so no later
        server adopts from it."""
        for suffix in (".state", ".state.resv"):
            try:
                os.unlink(self.socket + suffix)
            except FileNotFoundError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        rc = self.stop(check_status=exc[0] is None)
        if exc[0] is None and rc != 0:
            raise AssertionError(f"memtallyd exit status {rc}: {self.logtext()}")
        if exc[0] is not None:
            sys.stderr.write("---- memtallyd log ----\n" + self.logtext()[-6000:])


def as_user(user):
    """A preexec_fn that makes a child user=(uid, gid), with no
    supplementary groups; None for user None (the child stays root)."""
    if user is None:
        return None
    uid, gid = user

    def pre():
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    return pre


class Worker:
    """A worker process talking line by line over stdin/stdout."""

    def __init__(self, argv, env, user=None):
        """user=(uid, gid) runs it as that user (the tests run as root)."""
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True,
                                     bufsize=1, preexec_fn=as_user(user))
        self.pid = self.proc.pid
        # A thread owns stdout: select() on a buffered pipe would miss lines
        # already read into Python's buffer (a forked child and its parent
        # share one pipe, and two lines often arrive in one read).
        import queue
        import threading
        self.lines = queue.Queue()

        def pump():
            for line in self.proc.stdout:
                self.lines.put(line.strip())
            self.lines.put(None)
        threading.Thread(target=pump, daemon=True).start()

    def readline(self, timeout=30.0):
        """The worker's next line; fails if it exits or says nothing."""
        import queue
        try:
            line = self.lines.get(timeout=timeout * MULT)
        except queue.Empty:
            raise AssertionError(f"worker {self.pid} said nothing")
        if line is None:
            self.lines.put(None)
            raise AssertionError(f"worker {self.pid} exited: "
                                 f"{self.proc.wait()}")
        return line

    def send(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                self.proc.wait(timeout=20 * MULT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self):
        self.proc.kill()
        self.proc.wait()


def logged(text, msg):
    """How many `msg` lines memtallyd logged: those written, and those its
    per-uid log budget held back and counted in a "similar lines
    suppressed" summary (reported within a tick of their second)."""
    import re
    written = sum(1 for ln in text.splitlines()
                  if f'msg="{msg}"' in ln and " suppressed=" not in ln)
    held = sum(int(n) for n in re.findall(
        re.escape(msg) + r" \((\d+)\)(?:;|\"$)", text, re.M))
    return written + held


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


NOBODY, NOGROUP = 65534, 65534


def maps_of(pid, label):
    """{address range: name} of the memfd mappings of `pid` whose name
    starts with `label` ("/memfd:<label>... (deleted)" in its maps)."""
    out = {}
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith("/memfd:" + label):
                out[fields[0]] = fields[5].strip()
    return out


def line_within(proc, secs):
    """The next line a subprocess.Popen `proc` (text mode) writes to its
    stdout within `secs`, or "" (none came; the pipe's own buffer is
    empty first, as after each readline)."""
    import select
    end = time.monotonic() + secs
    while time.monotonic() < end:
        r, _, _ = select.select([proc.stdout], [], [], 0.1)
        if r:
            return proc.stdout.readline()
    return ""


def find_slot(segment, pid):
    """(mmap, offset of the slot of `pid`) in the slot table that `pid`
    itself maps, reopened (as root) through /proc/PID/map_files; the
    stride comes from the header it maps, read the same way."""
    label = segment.lstrip("/")
    maps = maps_of(pid, label)
    header = [r for r, n in maps.items()
              if n == f"/memfd:{label} (deleted)"]
    tables = [r for r, n in maps.items()
              if n.startswith(f"/memfd:{label}-slots:")]
    if not header or not tables:
        return None
    fd = os.open(f"/proc/{pid}/map_files/{header[0]}", os.O_RDONLY)
    try:
        h = mmap.mmap(fd, 4096, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    stride, count = struct.unpack_from("<II", h, 24)
    h.close()
    for r in tables:
        fd = os.open(f"/proc/{pid}/map_files/{r}", os.O_RDWR)
        try:
            m = mmap.mmap(fd, 0)
        finally:
            os.close(fd)
        for i in range(min(count, len(m) // stride)):
            o = i * stride
            if struct.unpack_from("<I", m, o)[0] == pid:
                return m, o
        m.close()
    return None


SECOND_USER = "memtally-test2"


def second_user():
    """(uid, gid) of a second unprivileged user, created on first use.

    Trust is per uid: a test of what one user may do to another needs two
    users that are neither root nor each other, and nobody is only one.
    Raises Skip when the user can neither be found nor made (not root, no
    useradd)."""
    return test_user(SECOND_USER)


def test_user(name):
    """(uid, gid) of the unprivileged system user `name`, created on first
    use (and left for the next run); Skip as second_user()."""
    import pwd
    import shutil
    try:
        pw = pwd.getpwnam(name)
        return pw.pw_uid, pw.pw_gid
    except KeyError:
        pass
    if os.geteuid() != 0 or not shutil.which("useradd"):
        raise Skip(f"no user {name} and cannot create one "
                   "(needs root and useradd)")
    r = subprocess.run(["useradd", "--system", "--no-create-home",
                        "--shell", "/usr/sbin/nologin", "--user-group",
                        name], capture_output=True, text=True)
    if r.returncode not in (0, 9):  # 9: made meanwhile by a parallel test
        raise Skip(f"useradd {name} failed: {r.stderr.strip()}")
    pw = pwd.getpwnam(name)
    return pw.pw_uid, pw.pw_gid


def config_file(text):
    """A memtallyd config file holding `text`, in a fresh directory."""
    d = tempfile.mkdtemp(prefix="mt-it-cfg-")
    path = os.path.join(d, "memtallyd.conf")
    with open(path, "w") as f:
        f.write(text)
    return path


def open_to_nobody(s):
    """Let nobody reach a server started with `[server] group = 65534`:
    the harness's directory is 0700; the socket must be 0660, group
    nogroup."""
    os.chmod(s.dir, 0o755)
    st = os.stat(s.socket)
    check(st.st_gid == NOGROUP and st.st_mode & 0o777 == 0o660,
          f"socket mode {st.st_mode & 0o777:o} group {st.st_gid}")


def world_readable_copy(*paths):
    """Copies of `paths` in a fresh directory every user can read and run;
    an argv (a list, as worker() makes) comes back as the same argv of the
    copy of its program.

    A test that runs a process as another user (nobody) cannot count on the
    build or source tree being reachable by it: a fresh clone may sit in a
    0700 directory."""
    import shutil
    d = tempfile.mkdtemp(prefix="mt-pub-")
    os.chmod(d, 0o755)
    out = []
    for p in paths:
        argv = p if isinstance(p, list) else None
        p = argv[0] if argv else p
        q = os.path.join(d, os.path.basename(p))
        if not os.path.exists(q):
            shutil.copy2(p, q)
            os.chmod(q, 0o755)
        out.append([q] + argv[1:] if argv else q)
    return out


def closed_at_once(conns, seconds):
    """How many of `conns` (sockets) the other end closes within `seconds`
    in all: an EOF or a reset."""
    closed = 0
    until = time.monotonic() + seconds
    for c in conns:
        c.settimeout(max(0.01, until - time.monotonic()))
        try:
            closed += c.recv(16) == b""
        except ConnectionResetError:
            closed += 1
        except OSError:
            pass
    return closed


class Ends:
    """Connections the other end is to close: when each was opened, and
    when this process saw its end (an EOF or a reset). Ends are watched
    for from each open on, so a connection closed while later ones are
    still being opened is timed as it happens, however slow the
    machine."""

    def __init__(self):
        self.conns, self.opened, self.ended = [], [], {}

    def add(self, c):
        self.conns.append(c)
        self.opened.append(time.monotonic())
        self.wait(0)

    def wait(self, seconds):
        """Watch for `seconds` (0: one look), or until every one ended."""
        import select
        until = time.monotonic() + seconds
        while True:
            left = [c for c in self.conns if c not in self.ended]
            if not left:
                return
            step = max(0.0, min(0.05, until - time.monotonic()))
            ready, _, _ = select.select(left, [], [], step)
            now = time.monotonic()
            for c in ready:
                try:
                    gone = c.recv(16) == b""
                except OSError:
                    gone = True
                if gone:
                    self.ended[c] = now
            if now >= until:
                return

    def lived(self, i):
        """Seconds connection `i` lived, to its end (None: not ended)."""
        c = self.conns[i]
        return self.ended[c] - self.opened[i] if c in self.ended else None

    def ended_first(self, first, then):
        """Did every connection of the indices `first` end, and before
        any of `then` did?"""
        ends = [self.ended.get(self.conns[i]) for i in first]
        later = [self.ended.get(self.conns[i], float("inf")) for i in then]
        return None not in ends and max(ends) < min(later)

    def refused_at_accept(self, kept, deadline):
        """How many a server refused at accept that lets the first `kept`
        in and ends those `deadline` s after their open (watched until all
        ended): all but `kept` when those ended before any of the `kept`,
        which lived at least 0.9 x `deadline`; 0 when every one lived that
        long; else -1."""
        n = len(self.conns)
        long = [(self.lived(i) or 0) >= 0.9 * deadline for i in range(n)]
        if all(long[:kept]) and self.ended_first(range(kept, n),
                                                 range(kept)):
            return n - kept
        return 0 if all(long) else -1


class Skip(Exception):
    """Raised by a test whose tool or precondition is missing; the message
    says which."""



# Lane 0's bytes in a slot: the slot's identity line (64 bytes), then the
# lane's owner word and its bytes at +8 (shm/mtshm.h).
LANE0_BYTES = 64 + 8


def cli_as(s, user, cli, *args):
    """The CLI run as `user` with --json; (exit status, stdout + stderr)."""
    out = subprocess.run([cli, "--socket", s.socket, "--json", *args],
                         capture_output=True, text=True, timeout=30 * MULT,
                         preexec_fn=as_user(user))
    return out.returncode, out.stdout + out.stderr


def claim(s, pid, nbytes):
    """Make `pid`'s own slot claim `nbytes` more than it holds, as the
    process itself could (its lane 0's bytes)."""
    import struct
    m, o = wait_for(f"slot of {pid}", lambda: find_slot(s.segment, pid))
    try:
        cur = struct.unpack_from("<q", m, o + LANE0_BYTES)[0]
        struct.pack_into("<q", m, o + LANE0_BYTES, cur + nbytes)
    finally:
        m.close()


def hooks_conf(d):
    """A [hooks] section that logs "SCOPE STATE" of every run for a change
    (not the fleet's run at start) to a file in `d`: (the file, the
    section)."""
    log = os.path.join(d, "hooks.log")
    cmd = (f'[ "$MEMTALLY_PREVIOUS" = unknown ] || '
           f'echo "$MEMTALLY_SCOPE $MEMTALLY_STATE" >> {log}')
    return log, (f"[hooks]\non_ok = {cmd}\non_high = {cmd}\n"
                 f"on_over = {cmd}\nmin_interval = 1s\n")


def hook_runs(path):
    """The lines hooks_conf()'s hooks wrote."""
    try:
        with open(path) as f:
            return [ln.strip() for ln in f if ln.strip()]
    except FileNotFoundError:
        return []


def connections_as(s, user, n):
    """`n` connections made by a process of `user` (SO_PEERCRED says
    `user`), handed back to this process."""
    import socket
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(user[1])
            os.setuid(user[0])
            for _ in range(n):
                c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                c.connect(s.socket)
                socket.send_fds(a, [b"c"], [c.fileno()])
                c.close()
        finally:
            os._exit(0)
    a.close()
    conns = []
    for _ in range(n):
        _, fds, _, _ = socket.recv_fds(b, 1, 1)
        conns.append(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM,
                                   fileno=fds[0]))
    os.waitpid(pid, 0)
    b.close()
    return conns

def _select(tests, argv):
    """The tests named on the command line (all when none is named), so one
    test can be run alone: `python3 test_x.py test_name`. `--list` prints
    the names. An unknown name is an error, not an empty pass."""
    names = [t.__name__ for t in tests]
    if "--list" in argv:
        print("\n".join(names))
        sys.exit(0)
    if not argv:
        return tests
    unknown = [a for a in argv if a not in names]
    if unknown:
        print(f"unknown test(s): {' '.join(unknown)}; this file has: "
              f"{' '.join(names)}", file=sys.stderr)
        sys.exit(2)
    return [t for t in tests if t.__name__ in argv]


def run(tests):
    """Run test functions (or those named in sys.argv); print a closing
    'N passed, N failed' line (and ', N skipped'). Exit 1 if any failed,
    else 77 (ctest: skipped) if any was skipped: a skipped check is never
    reported as passed."""
    tests = _select(tests, sys.argv[1:])
    passed = failed = skipped = 0
    for t in tests:
        t0 = time.monotonic()
        try:
            t()
            passed += 1
            print(f"PASS {t.__name__} ({time.monotonic() - t0:.1f}s)", flush=True)
        except Skip as e:
            skipped += 1
            print(f"SKIP {t.__name__}: {e}", flush=True)
        except Exception as e:  # noqa: BLE001
            failed += 1
            import traceback
            traceback.print_exc()
            print(f"FAIL {t.__name__}: {e}", flush=True)
    line = f"{passed} passed, {failed} failed"
    if skipped:
        line += f", {skipped} skipped"
    print(line)
    sys.exit(1 if failed else 77 if skipped else 0)
