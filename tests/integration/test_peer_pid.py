"""Registration proves the pid where SO_PEERPIDFD is missing.

Before Linux 6.5 (Debian 12 runs 6.1) the server learns only the pid of
the process that connected (SO_PEERCRED) and opens a pidfd of whoever has
that pid at Register. The attack: a process connects, hands its connected
socket to another (here: its parent, which made the socket before the
fork) and exits; another user's process gets the pid; the parent registers
through the socket, and its claims are the victim's (enforcement would
kill the victim). The server now accepts a pid from that fallback only if
its process had started when the connection was accepted and its real uid
is the peer's.

MEMTALLY_TEST_NO_PEERPIDFD=1 makes memtallyd use the fallback on this
kernel too.

  test_reused_pid_refused     the attack, with the victim given the exact
                              pid (ns_last_pid): Register is refused
                              (permission denied), the victim's pid is not
                              registered, the victim lives.
  test_fallback_registers     with the fallback, ordinary workers (root's
                              and nobody's) still register.
  test_peerpidfd_registers    without the switch (SO_PEERPIDFD), as before.
"""
import json
import os
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pbwire  # noqa: E402
from harness import (as_user, NOBODY, NOGROUP, PRELOAD, Server, Skip,  # noqa: E402
                     Worker, check, config_file, open_to_nobody, run,
                     second_user, wait_for, worker, world_readable_copy)

NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else \
    sys.executable
ERROR_PERMISSION_DENIED = 3

# Runs as nobody: a socket made here, connected by a child that exits at
# once; the child's pid on stdout; on "go", the Register frame (hex, argv)
# through the socket, the answer (hex) on stdout.
ATTACKER = r"""
import os, socket, sys
path, frame = sys.argv[1], bytes.fromhex(sys.argv[2])
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
pid = os.fork()
if pid == 0:
    s.connect(path)
    os._exit(0)
os.waitpid(pid, 0)
print(pid, flush=True)
if sys.stdin.readline().strip() != "go":
    sys.exit(1)
s.sendall(frame)
s.settimeout(20)
buf = b""
while True:
    data = s.recv(65536)
    if not data:
        break
    buf += data
    # one varint-delimited answer is all we wait for
    n = shift = i = 0
    while i < len(buf):
        b = buf[i]; i += 1
        n |= (b & 0x7F) << shift; shift += 7
        if not b & 0x80:
            break
    if len(buf) - i >= n:
        break
print(buf.hex(), flush=True)
sys.stdin.readline()
"""


def fallback_server(**kw):
    os.environ["MEMTALLY_TEST_NO_PEERPIDFD"] = "1"
    try:
        s = Server("--config", config_file(f"[server]\ngroup = {NOGROUP}\n"),
                   **kw)
    finally:
        del os.environ["MEMTALLY_TEST_NO_PEERPIDFD"]
    check("MEMTALLY_TEST_NO_PEERPIDFD" in s.logtext(),
          "the test switch was not taken")
    open_to_nobody(s)
    return s


def victim_at(pid, user):
    """A process of `user` with exactly `pid` (next pid set through
    ns_last_pid), or None when another process took it meanwhile."""
    for _ in range(200):
        if os.path.exists(f"/proc/{pid}"):
            return None  # someone else has it now
        with open(NS_LAST_PID, "w") as f:
            f.write(str(pid - 1))
        v = subprocess.Popen(["sleep", "300"], preexec_fn=as_user(user))
        if v.pid == pid:
            return v
        v.kill()
        v.wait()
    return None


def test_reused_pid_refused():
    if not os.access(NS_LAST_PID, os.W_OK):
        raise Skip(f"{NS_LAST_PID} not writable (needs root in the initial "
                   "pid namespace)")
    user = second_user()
    frame = pbwire.request(1, pbwire.REGISTER, pbwire.field(1, 2, b"atk"))
    with fallback_server() as s:
        for attempt in range(10):
            a = subprocess.Popen([PY, "-c", ATTACKER, s.socket, frame.hex()],
                                 stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True,
                                 preexec_fn=as_user((NOBODY, NOGROUP)))
            try:
                line = a.stdout.readline().strip()
                check(line.isdigit(), f"attacker said {line!r}")
                pid = int(line)
                # The server accepted the connection before the victim
                # exists.
                wait_for("the connection accepted", lambda: (
                    f'msg="connection accepted" peer_pid={pid} '
                    in s.logtext()))
                v = victim_at(pid, user)
                if v is None:
                    continue
                try:
                    a.stdin.write("go\n")
                    a.stdin.flush()
                    answer = a.stdout.readline().strip()
                    check(answer, "no answer to the attacker's Register")
                    resp = pbwire.Reader(None)
                    resp.buf = bytearray(bytes.fromhex(answer))
                    resp.eof = True
                    r = resp.frame(1)
                    code = pbwire.error_code(r)
                    check(code == ERROR_PERMISSION_DENIED,
                          f"Register through a reused pid answered "
                          f"error {code}: {r}")
                    check(pid not in s.ps(),
                          f"the victim's pid {pid} was registered: "
                          f"{json.dumps(s.ps().get(pid))}")
                    check(v.poll() is None, "the victim died")
                    check(any("the peer's pid now names another process"
                              in line and "action=registration_refused"
                              in line for line in s.logtext().splitlines()),
                          "no log line for the refusal")
                    return
                finally:
                    v.kill()
                    v.wait()
            finally:
                a.kill()
                a.wait()
        raise Skip("could not give the victim the attacker's pid in 10 "
                   "tries (a busy machine takes pids first)")


def registers(s, user=None, argv=None):
    w = Worker(argv or [*worker("hold"), "2"], s.env(), user=user)
    try:
        check(w.readline().startswith("ready"), "worker not ready")
        wait_for(f"worker {w.pid} registered", lambda: w.pid in s.ps())
    finally:
        w.close()


def test_fallback_registers():
    with fallback_server() as s:
        registers(s)
        hold, = world_readable_copy(worker("hold"))
        pre, = world_readable_copy(PRELOAD)
        w = Worker([*hold, "2"], {**s.env(), "LD_PRELOAD": pre},
                   user=(NOBODY, NOGROUP))
        try:
            check(w.readline().startswith("ready"), "nobody's worker not ready")
            wait_for(f"nobody's worker {w.pid} registered",
                     lambda: s.ps().get(w.pid, {}).get("uid") == NOBODY)
        finally:
            w.close()
        check("now names another process" not in s.logtext(),
              "an ordinary worker was refused")


def test_peerpidfd_registers():
    with Server() as s:
        check("MEMTALLY_TEST_NO_PEERPIDFD" not in s.logtext(),
              "test switch on without the variable")
        registers(s)


if __name__ == "__main__":
    if os.geteuid() != 0:
        print("SKIP: needs root (other users, ns_last_pid)")
        sys.exit(77)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    run([test_reused_pid_refused, test_fallback_registers,
         test_peerpidfd_registers])
