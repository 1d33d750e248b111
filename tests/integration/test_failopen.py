"""Fail open: with no server, a bad socket path, a stale socket, or a
server that hands out shared objects a client must refuse (a header of an
unknown major layout version, objects without their seals, a table of the
wrong size, no descriptors at all), a preloaded program's stdout, stderr
and exit status are exactly what they are without the preload. So are
they on the small stacks a program may give the code that allocates or
maps (a thread of PTHREAD_STACK_MIN, a signal handler's alternate stack
of SIGSTKSZ), with a server and without; and a process whose main thread
calls pthread_exit() ends as its last thread does."""
import fcntl
import mmap
import os
import socket
import struct
import subprocess
import tempfile
import threading
import time

import pbwire as pb
from harness import (MULT, NOBODY, NOGROUP, PRELOAD, Server, as_user, check,
                     run, worker)

PROGRAMS = [
    ["python3", "-c",
     "import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\n"
     "x = [bytearray(100000) for _ in range(200)]\nsys.exit(3)"],
    ["sh", "-c", "echo hi; ls /nonexistent-memtally; exit 5"],
    [*worker("mt_cxx"), "8"],
    [*worker("churn"), "2", "0.3"],
]


def outcome(argv, env):
    t0 = time.monotonic()
    r = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=60 * MULT)
    return (r.stdout, r.stderr, r.returncode), time.monotonic() - t0


def compare(socket_path, label):
    base = dict(os.environ)
    for k in ("LD_PRELOAD", "MEMTALLY_SOCKET", "MEMTALLY_DEBUG"):
        base.pop(k, None)
    pre = dict(base, LD_PRELOAD=PRELOAD, MEMTALLY_SOCKET=socket_path)
    for argv in PROGRAMS:
        want, _ = outcome(argv, base)
        got, secs = outcome(argv, pre)
        check(got == want, f"{label}: {argv[0]} differs under the preload:\n"
                           f"want {want!r}\ngot  {got!r}")
        print(f"  {label}: {os.path.basename(argv[0])} identical "
              f"({secs * 1000:.0f} ms)")


def test_no_server():
    d = tempfile.mkdtemp()
    compare(os.path.join(d, "nobody-here.sock"), "no server")


def test_socket_dir_missing():
    compare("/nonexistent/dir/memtally.sock", "missing dir")


def test_socket_is_regular_file():
    d = tempfile.mkdtemp()
    p = os.path.join(d, "file.sock")
    open(p, "w").write("not a socket")
    compare(p, "regular file")


def test_stale_socket():
    d = tempfile.mkdtemp()
    p = os.path.join(d, "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(p)
    s.close()  # the file stays, nobody listens: ECONNREFUSED
    compare(p, "stale socket")


# ---- a server that hands out bad shared objects ----------------------------
#
# memtallyd is trusted to hand out good objects, so a fake server plays the
# bad one: it answers every Register with a Registered frame and the
# descriptors a case builds (header first, then slot table, as memtallyd
# passes them). The client must map nothing it cannot trust, and the
# program runs exactly as it would without the preload.

F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_GROW = 0x1, 0x2, 0x4
F_SEAL_FUTURE_WRITE = 0x10
SEALS_TABLE = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL
SEALS_HEADER = SEALS_TABLE | F_SEAL_FUTURE_WRITE
MAGIC = 0x594C4C41544D454D  # "MEMTALLY" read as a little-endian u64
HEADER_SIZE = 4096
LINE = 128
LANES = 4
SLOTS = 4
STRIDE = LANES * LINE
TABLE_SIZE = SLOTS * STRIDE
SLOT_GEN = 0x5107
THRESHOLD = 64 * 1024


def memfd(name, size, seals):
    """A memfd of `size` zero bytes, mapped read-write (this mapping stays
    writable whatever seals follow), then sealed with `seals`."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    m = mmap.mmap(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd, m


def header(major=2, seals=SEALS_HEADER):
    """A header page as memtallyd fills it in, of layout `major`."""
    fd, m = memfd("memtally-test", HEADER_SIZE, 0)
    struct.pack_into("<HHHH", m, 8, major, 0, 0, 0)
    struct.pack_into("<IIIIIIQQIIQQ", m, 16, HEADER_SIZE, 0, STRIDE, SLOTS,
                     LANES, LINE, TABLE_SIZE, 0x6E6E, os.getpid(),
                     os.getuid(), time.time_ns(), THRESHOLD)
    struct.pack_into("<Q", m, 0, MAGIC)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd, m


def registered():
    """A Response(id 1) carrying Registered{slot 0, its generation, the
    threshold}."""
    body = (pb.field(2, 0, 0) + pb.field(3, 0, SLOT_GEN) +
            pb.field(4, 0, 0x6E6E) + pb.field(5, 0, THRESHOLD) +
            pb.field(6, 2, b"default"))
    return pb.frame(pb.field(1, 0, 1) + pb.field(3, 2, body))


class FakeServer:
    """Listens on a socket of its own; each Register gets registered() and
    the descriptors objects(pid) returns (a list of (fd, mmap), which are
    kept, so a test can look at what the client wrote into them)."""

    def __init__(self, objects, delay=0.0):
        self.objects = objects
        self.delay = delay  # seconds before each answer
        self.dir = tempfile.mkdtemp(prefix="mt-fake-")
        self.socket = os.path.join(self.dir, "fake.sock")
        self.lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.lsock.bind(self.socket)
        self.lsock.listen(64)
        self.lsock.settimeout(0.05)  # accept() wakes up to see `stop`
        self.stop = threading.Event()
        self.registers = 0
        self.handed = []  # [(pid, [(fd, mmap), ...])]
        self.errors = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                c, _ = self.lsock.accept()
            except socket.timeout:
                continue
            c.settimeout(None)
            try:
                self._answer(c)
            except Exception as e:  # noqa: BLE001 - reported by close()
                with self.lock:
                    self.errors.append(repr(e))
            finally:
                c.close()

    def _answer(self, c):
        cred = c.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                            struct.calcsize("3i"))
        pid = struct.unpack("3i", cred)[0]
        req = pb.Reader(c).frame(10 * MULT)
        if req is None or pb.REGISTER not in req:
            return  # not a Register: nothing to answer
        if self.delay:
            self.stop.wait(self.delay)
        objs = self.objects(pid)
        with self.lock:
            self.registers += 1
            self.handed.append((pid, objs))
        fds = [fd for fd, _ in objs]
        try:
            socket.send_fds(c, [registered()], fds)
        except (BrokenPipeError, ConnectionResetError):
            if not self.delay:
                raise  # late on purpose: the client may have gone

    def close(self):
        self.stop.set()
        self.thread.join(timeout=10 * MULT)
        self.lsock.close()
        check(not self.errors, f"fake server failed: {self.errors}")
        for _, objs in self.handed:
            for fd, m in objs:
                m.close()
                os.close(fd)


def table_written(m):
    """Whether a client wrote anything into slot 0 (threads, lanes_used,
    overflow, or lane 0's owner, bytes or flushes) beyond what table()
    wrote."""
    threads, lanes, overflow = struct.unpack_from("<IIq", m, 48)
    owner, _, lbytes, flushes = struct.unpack_from("<IIqQ", m, 64)
    return any((threads, lanes, overflow, owner, lbytes, flushes))


def table(pid, size=TABLE_SIZE, seals=SEALS_TABLE):
    """A slot table whose slot 0 is pid's, as the server writes it."""
    fd, m = memfd("memtally-test-slots", size, 0)
    struct.pack_into("<IIQ", m, 0, pid, os.getuid(), SLOT_GEN)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd, m


def good(pid):
    return [header(), table(pid)]


BAD = [
    # (label, objects(pid)): each breaks one thing a client must check.
    ("future major", lambda pid: [header(major=99), table(pid)]),
    ("header without F_SEAL_FUTURE_WRITE",
     lambda pid: [header(seals=SEALS_TABLE), table(pid)]),
    ("unsealed header", lambda pid: [header(seals=0), table(pid)]),
    ("unsealed table", lambda pid: [header(), table(pid, seals=0)]),
    ("table of the wrong size",
     lambda pid: [header(), table(pid, size=TABLE_SIZE + 4096)]),
    ("no descriptors", lambda pid: []),
]


def test_fake_server_control():
    """The fake server, with good objects: the client does attach (it
    writes into its slot). Without this, the refusals below could be the
    fake server's fault rather than the client's checks."""
    fake = FakeServer(good)
    try:
        compare(fake.socket, "good objects")
        with fake.lock:
            used = [pid for pid, objs in fake.handed
                    if len(objs) == 2 and table_written(objs[1][1])]
        check(used, f"no client attached to good objects "
                    f"({fake.registers} registrations)")
        print(f"  good objects: {fake.registers} registrations, "
              f"{len(set(used))} process(es) wrote into their slot")
    finally:
        fake.close()


def test_bad_objects_from_server():
    """Each bad answer: the programs behave exactly as without the
    preload, they did register (so the objects were offered), and no
    client wrote a byte into any table it was handed."""
    for label, objects in BAD:
        fake = FakeServer(objects)
        try:
            compare(fake.socket, label)
            with fake.lock:
                regs = fake.registers
                written = [pid for pid, objs in fake.handed
                           if len(objs) == 2 and table_written(objs[1][1])]
            check(regs > 0, f"{label}: no client registered: the case "
                            "tested nothing")
            check(not written, f"{label}: clients {written} used a table "
                               "they should have refused")
            print(f"  {label}: {regs} registrations refused")
        finally:
            fake.close()


def test_fork_while_registering():
    """A thread registers with a server that answers late; another forks
    meanwhile. The child, which never execs, must not hold the
    registration's socket (the server would see the connection outlive the
    parent's wait, and its uid's cap on connections fill with such
    children), nor, once the answer came, the slot table's descriptor."""
    fake = FakeServer(good, delay=4.0 * MULT)
    try:
        env = dict(os.environ, LD_PRELOAD=PRELOAD,
                   MEMTALLY_SOCKET=fake.socket, MEMTALLY_TASK="forkreg",
                   MEMTALLY_REGISTER_TIMEOUT_MS=str(int(3000 * MULT)))
        r = subprocess.run([*worker("forkreg")], env=env,
                           stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=60 * MULT)
        check(r.returncode == 0, f"forkreg: {r.returncode} {r.stderr}")
        line = [x for x in r.stdout.splitlines() if x.startswith("child ")]
        check(line, f"no child line: {r.stdout!r}")
        print(f"  {line[0]}")
        check(line[0] == "child sockets=0 memfds=0",
              f"the fork child holds the registration's descriptors: "
              f"{line[0]}")
    finally:
        fake.close()


def test_registration_keeps_off_stdio():
    """A daemon that closed fds 0-2 registers: while the server holds its
    Register, none of 0-2 is the registration's socket (a printf would
    go to the server, a file the program opens would get a number it did
    not expect). The server looks from outside, in /proc, at the moment
    it has the request and the client waits for the answer."""
    seen = []

    def objects(pid):
        held = []
        for fd in ("0", "1", "2"):
            try:
                held.append((fd, os.readlink(f"/proc/{pid}/fd/{fd}")))
            except FileNotFoundError:
                pass
        seen.append(held)
        return good(pid)

    fake = FakeServer(objects)
    try:
        env = dict(os.environ, LD_PRELOAD=PRELOAD,
                   MEMTALLY_SOCKET=fake.socket, MEMTALLY_TASK="nostdio")
        r = subprocess.run([*worker("nostdio")], env=env,
                           stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=60 * MULT)
        check(r.returncode == 0, f"nostdio: exit {r.returncode}")
        with fake.lock:
            used = [pid for pid, objs in fake.handed
                    if len(objs) == 2 and table_written(objs[1][1])]
        check(seen, "the worker never registered: the case tested nothing")
        check(used, "the worker did not attach to good objects")
        print(f"  {len(seen)} registration(s); fds 0-2 held meanwhile: "
              f"{seen}")
        check(all(not held for held in seen),
              f"the registration holds a standard descriptor: {seen}")
    finally:
        fake.close()


# A listener that counts what it is sent: run as another uid.
LISTENER = r"""
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1]); s.listen(16); s.settimeout(0.1)
print("listening", flush=True)
conns = requests = 0
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    try:
        c, _ = s.accept()
    except socket.timeout:
        continue
    conns += 1
    c.settimeout(1.0)
    try:
        requests += len(c.recv(4096)) > 0
    except OSError:
        pass
    c.close()
print(f"conns={conns} requests={requests}", flush=True)
"""


def with_nobodys_server(script, owner, argv, env, seconds=4, mode=0o1777):
    """Run `script` as nobody, listening at s.sock in a fresh directory of
    `owner`'s (of `mode`), for `seconds` (x MULT) at most, and the program
    `argv(path)` beside it, its environment os.environ's plus `env` and
    MEMTALLY_SOCKET=path: (its CompletedProcess, the listener's output)."""
    d = tempfile.mkdtemp(prefix="mt-trust-")
    os.chmod(d, mode)
    os.chown(d, owner, NOGROUP)
    path = os.path.join(d, "s.sock")
    lis = subprocess.Popen(
        ["/usr/bin/python3", "-c", script, path, str(seconds * MULT)],
        stdout=subprocess.PIPE, text=True,
        preexec_fn=as_user((NOBODY, NOGROUP)))
    try:
        check(lis.stdout.readline().strip() == "listening",
              "the listener did not start")
        r = subprocess.run(argv(path), env=dict(os.environ, **env,
                                                MEMTALLY_SOCKET=path),
                           stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=60 * MULT)
        out = lis.communicate(timeout=30 * MULT)[0].strip()
    finally:
        if lis.poll() is None:
            lis.kill()
            lis.wait()
        if os.path.exists(path):
            os.unlink(path)
        os.rmdir(d)
    return r, out


def test_untrusted_server():
    """A worker registers only with a server run by root, by its own uid,
    or by the owner of the socket's directory: anyone else may have bound
    the path first, and could hand it descriptors whose close blocks (a
    lingering TCP socket, a file on a stuck FUSE mount). A server run by
    nobody in a directory of root's is connected to, sent nothing, and the
    program behaves as without memtally; in nobody's own directory it is
    sent the Register, as it is where MEMTALLY_SERVER_UID names nobody.
    A directory of nobody's that others may write in (sticky, as /tmp) is
    not its own: anyone could have bound the path there, and in a user
    namespace every unmapped user reads as its owner."""
    for owner, mode, named, want in ((0, 0o1777, False, False),
                                     (NOBODY, 0o755, False, True),
                                     (NOBODY, 0o1777, False, False),
                                     (0, 0o1777, True, True)):
        env = {"LD_PRELOAD": PRELOAD, "MEMTALLY_TASK": "trust"}
        if named:  # the deployment names the server's user
            env["MEMTALLY_SERVER_UID"] = str(NOBODY)
        r, out = with_nobodys_server(
            LISTENER, owner, lambda path: [*worker("errno"), "3"], env,
            mode=mode)
        check(r.returncode == 0 and "errno kept" in r.stdout,
              f"the program changed: {r.returncode} {r.stdout!r} "
              f"{r.stderr!r}")
        conns, reqs = (int(x.split("=")[1]) for x in out.split())
        who = ("root's" if owner == 0 else "nobody's") + f" {mode:o}"
        how = ", MEMTALLY_SERVER_UID naming nobody" if named else ""
        print(f"  a server of nobody's in {who} directory{how}: {conns} "
              f"connections, {reqs} with a request")
        check(conns > 0, f"{who}: the worker never connected: the case "
                         "tested nothing")
        check((reqs > 0) == want,
              f"{who} directory{how}: {reqs} requests, wanted "
              f"{'some' if want else 'none'}")


# A server of nobody's that, the moment it accepts, tries to queue a
# descriptor (a pipe's) to its peer, as one whose last close blocks would
# be: "sent=N err=E" (N sends that went through, E the errno of the first
# refused, 0 if none was).
PUSHER = r"""
import array, os, socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1]); s.listen(16); s.settimeout(0.1)
print("listening", flush=True)
r, w = os.pipe()
sent = err = 0
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end and not (sent or err):
    try:
        c, _ = s.accept()
    except socket.timeout:
        continue
    try:
        sent += c.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                    array.array("i", [r]))]) > 0
    except OSError as e:
        err = e.errno
    c.close()
print(f"sent={sent} err={err}", flush=True)
"""


def rights_gate_works():
    """Does this kernel have SO_PASSRIGHTS (Linux 6.16): a socket that
    refuses SCM_RIGHTS, its sender getting EPERM?"""
    import array
    a, b = socket.socketpair()
    try:
        a.setsockopt(socket.SOL_SOCKET, 83, 0)
        b.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                            array.array("i", [0]))])
        return False
    except OSError as e:
        return e.errno == 1  # EPERM; ENOPROTOOPT on older kernels
    finally:
        a.close()
        b.close()


def test_untrusted_server_queues_no_descriptor():
    """A worker refuses a server it may not trust (above), and closes its
    socket; but a server that accepts and sends at once could queue
    descriptors to it before the check, which that close then releases,
    inside the program's malloc (a lingering TCP socket's last close
    blocks). The worker's socket refuses descriptors until the server is
    known. The instant between connect() and the check is widened to 2 s
    (strace delays the worker's getsockopt): the server's send is
    refused with EPERM, and the program behaves as without memtally."""
    import shutil
    from harness import Skip
    if not rights_gate_works():
        raise Skip("the kernel has no SO_PASSRIGHTS (Linux 6.16): a "
                   "socket cannot refuse descriptors")
    strace = shutil.which("strace")
    if not strace:
        raise Skip("strace not found: scripts/deps.sh installs it")
    r, out = with_nobodys_server(PUSHER, 0, lambda path: [
        strace, "-f", "-qq", "-o", "/dev/null", "-e", "trace=getsockopt",
        "-e", "inject=getsockopt:delay_enter=2000000",
        "-E", f"LD_PRELOAD={PRELOAD}", "-E", f"MEMTALLY_SOCKET={path}",
        "-E", "MEMTALLY_TASK=trust", *worker("errno"), "3"], {}, seconds=20)
    if r.returncode != 0 and "ptrace" in r.stderr:
        raise Skip(f"strace cannot trace here: {r.stderr.strip()}")
    check(r.returncode == 0 and "errno kept" in r.stdout,
          f"the program changed: {r.returncode} {r.stdout!r} {r.stderr!r}")
    sent, err = (int(x.split("=")[1]) for x in out.split())
    print(f"  a server of nobody's sending a descriptor at accept: "
          f"{sent} sent, refused with errno {err}")
    check(sent == 0 and err == 1,
          f"{sent} descriptors queued to the worker before its check "
          f"(errno {err}), wanted none, refused with EPERM")


def test_relative_socket_path():
    """MEMTALLY_SOCKET relative: it would be looked up from wherever the
    program is when it registers (an NFS home, a stuck FUSE mount, where
    the lookup hangs inside malloc). It is not used: a server there gets
    no registration, and the program behaves as without memtally."""
    fake = FakeServer(good)
    try:
        env = dict(os.environ, LD_PRELOAD=PRELOAD, MEMTALLY_SOCKET="fake.sock",
                   MEMTALLY_TASK="relative")
        r = subprocess.run([*worker("errno"), "3"], env=env, cwd=fake.dir,
                           stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=60 * MULT)
        check(r.returncode == 0 and "errno kept" in r.stdout,
              f"the program changed: {r.returncode} {r.stdout!r}")
        # A registration waits for its answer: counted by now.
        with fake.lock:
            relative = fake.registers
        # The same with the absolute path registers: the case is live.
        env["MEMTALLY_SOCKET"] = fake.socket
        subprocess.run([*worker("errno"), "3"], env=env,
                       stdin=subprocess.DEVNULL, capture_output=True,
                       timeout=60 * MULT)
        with fake.lock:
            regs = fake.registers
        print(f"  relative path: {relative} registrations; absolute: "
              f"{regs - relative}")
        check(relative == 0, f"{relative} registrations by a relative path")
        check(regs > 0, "the absolute path did not register either: the "
                        "case tested nothing")
    finally:
        fake.close()


def test_malloc_is_no_cancellation_point():
    """A thread with a cancel pending comes back from a malloc that tries
    to register (connect, poll, recvmsg and reading /proc are cancellation
    points; malloc and free are not): without the fix, it was unwound out
    of malloc, its block lost, the process never registered again."""
    glibc = os.path.join(os.path.dirname(PRELOAD), "libmemtally_glibc.so")
    for lib in (PRELOAD, glibc):
        env = dict(os.environ, LD_PRELOAD=lib,
                   MEMTALLY_SOCKET="/nonexistent/memtally.sock",
                   MEMTALLY_REGISTER_MIN="0")
        r = subprocess.run([*worker("cancel")], env=env,
                           stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=60 * MULT)
        check(r.returncode == 0 and "malloc returned" in r.stdout,
              f"{os.path.basename(lib)}: {r.returncode} {r.stdout!r} "
              f"{r.stderr!r}")
        print(f"  {os.path.basename(lib)}: {r.stdout.strip()}")


def test_small_stacks():
    """A thread of PTHREAD_STACK_MIN (16 KiB) that allocates, and a signal
    handler on an alternate stack of 8 KiB that maps memory, each the
    process's first call that may register: a registration took about
    8 KiB of the caller's stack (its buffers, the dynamic linker's first
    resolution of socket() and connect()), and both died of SIGSEGV,
    with a server and without. The process still registers (from the
    thread, the handler leaving it to a later call)."""
    glibc = os.path.join(os.path.dirname(PRELOAD), "libmemtally_glibc.so")
    with Server() as s:
        pids = []
        for lib in (PRELOAD, glibc):
            for sock in (s.socket, "/nonexistent/memtally.sock"):
                env = dict(os.environ, LD_PRELOAD=lib, MEMTALLY_SOCKET=sock)
                p = subprocess.Popen(worker("stacks"), env=env,
                                     stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
                out, err = p.communicate(timeout=60 * MULT)
                check(p.returncode == 0 and out == "ok\n",
                      f"{os.path.basename(lib)}, socket {sock}: exit "
                      f"{p.returncode} {out!r} {err!r}")
                if sock == s.socket:
                    pids.append(p.pid)
                print(f"  {os.path.basename(lib)}, "
                      f"{'a server' if sock == s.socket else 'no server'}:"
                      f" exit 0", flush=True)
        text = s.logtext()
        for pid in pids:
            check(f'msg="worker registered" pid={pid} ' in text,
                  f"{pid} never registered")


def test_the_last_thread_ends_the_process():
    """The main thread calls pthread_exit(); the other allocates, frees,
    and returns. glibc ends the process (status 0) as its last thread
    ends; memtally's refresh thread was one more, with every signal
    blocked: the process lived on, and not even SIGTERM ended it."""
    glibc = os.path.join(os.path.dirname(PRELOAD), "libmemtally_glibc.so")
    with Server() as s:
        for lib in (PRELOAD, glibc):
            env = dict(os.environ, LD_PRELOAD=lib, MEMTALLY_SOCKET=s.socket,
                       MEMTALLY_REFRESH_MS="200")
            p = subprocess.Popen(worker("lastthread"), env=env,
                                 stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, text=True)
            try:
                out, _ = p.communicate(timeout=30 * MULT)
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
            check(p.returncode == 0 and out == "cleanup ok\ndone\n",
                  f"{os.path.basename(lib)}: exit {p.returncode} {out!r}")
            check(f'msg="worker registered" pid={p.pid} ' in s.logtext(),
                  f"{os.path.basename(lib)}: never registered")
            print(f"  {os.path.basename(lib)}: ended, status 0",
                  flush=True)


if __name__ == "__main__":
    run([test_no_server, test_socket_dir_missing, test_socket_is_regular_file,
         test_stale_socket, test_fake_server_control,
         test_bad_objects_from_server, test_fork_while_registering,
         test_registration_keeps_off_stdio,
         test_untrusted_server, test_untrusted_server_queues_no_descriptor,
         test_relative_socket_path, test_malloc_is_no_cancellation_point,
         test_small_stacks, test_the_last_thread_ends_the_process])
