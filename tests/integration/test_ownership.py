"""Ownership and per-uid bounds, with real processes of two users.

test_another_uids_worker_cannot_end_a_reservation: root admits with task
T; a process running as nobody registers with task T over the raw protocol
and exits. The reservation stays (reserved bytes unchanged) until a worker
of its owner ends it; a nobody worker of another task does not lift that
reservation's TTL either.

test_per_uid_caps: nobody holds connections up to max_connections_per_uid
(one more is closed at once) and reservations up to
max_reservations_per_uid (one more is denied, saying why); root and
another uid can still connect, Admit and register a worker.

test_idle_connections_are_closed: with a short idle_timeout, a connection
that sends nothing is closed; a Watch subscriber is not.

test_open_files_limit: started with a soft RLIMIT_NOFILE of 1024,
memtallyd raises it to fit the default slots and connections; with a hard
limit too low it says so and starts anyway.

nobody reaches the socket through [server] group = 65534 (nogroup) and a
server directory made traversable.
"""
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import (as_user, CLI, MEMTALLYD, MIB, MULT, NOBODY, NOGROUP,  # noqa: E402
                     Server, Skip, check, open_to_nobody, run, terminate,
                     wait_for, world_readable_copy)
from harness import config_file as config  # noqa: E402
import pbwire as pb  # noqa: E402

T = 10 * MULT  # per-response deadline

# A process that speaks the raw protocol on memtallyd's socket, one command
# per stdin line, one JSON answer per stdout line:
#   hold N          open N connections, each answered a GetUsage or closed
#   admit BYTES TASK [TTL]  Admit on the first held (or a new) connection
#   register TASK   Register this process as a worker of TASK
#   exit
PEER = r'''
import json, socket, sys
sys.path.insert(0, sys.argv[1])
import pbwire as pb
path, T = sys.argv[2], float(sys.argv[3])
held = []

def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s, pb.Reader(s)

def call(conn, body_field, body):
    s, r = conn
    try:
        s.sendall(pb.request(7, body_field, body))
    except OSError:
        return None
    return r.frame(T)

def say(x):
    print(json.dumps(x), flush=True)

for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "hold":
        out = []
        for _ in range(int(cmd[1])):
            c = connect()
            resp = call(c, pb.GET_USAGE, pb.field(1, 0, 1))
            if resp is not None and 4 in resp:
                held.append(c)
                out.append("ok")
            else:
                c[0].close()
                out.append("closed")
        say(out)
    elif cmd[0] == "admit":
        body = pb.field(1, 0, int(cmd[1]))
        if cmd[2] != "-":
            body += pb.field(3, 2, cmd[2].encode())
        if len(cmd) > 3:
            body += pb.field(4, 0, int(cmd[3]))
        c = held[0] if held else connect()
        resp = call(c, pb.ADMIT, body)
        if resp is None or 6 not in resp:
            say({"error": pb.error_code(resp) if resp else "eof"})
            continue
        a = pb.parse(resp[6][0])
        say({"admitted": bool(a.get(1, [0])[0]),
             "reservation": a.get(2, [b""])[0].decode(),
             "reason": a.get(3, [b""])[0].decode(),
             "scope": a.get(8, [b""])[0].decode()})
    elif cmd[0] == "register":
        c = connect()
        resp = call(c, pb.REGISTER,
                    pb.field(2, 2, cmd[1].encode()) + pb.field(3, 0, 4242))
        c[0].close()
        say({"ok": resp is not None and 3 in resp,
             "error": pb.error_code(resp) if resp else "eof"})
    elif cmd[0] == "exit":
        break
'''


class Peer:
    """A PEER process, as root or (uid, gid)."""

    def __init__(self, srv, user=None):
        # pbwire.py from a directory nobody can read too (the tree may
        # be in a 0700 directory).
        pub = os.path.dirname(world_readable_copy(
            os.path.join(HERE, "pbwire.py"))[0])
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PEER, pub, srv.socket, str(T)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            bufsize=1, preexec_fn=as_user(user))
        self.pid = self.proc.pid

    def ask(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        out = self.proc.stdout.readline()
        if not out:
            raise AssertionError(f"peer {self.pid} exited on '{line}': "
                                 f"{self.proc.wait()}")
        return json.loads(out)

    def exit(self):
        try:
            self.proc.stdin.write("exit\n")
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        self.proc.wait(timeout=20 * MULT)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def fleet(s):
    return s.status()["fleet"]


def registered(s, pid):
    return pid in s.ps()


def ticks_pass(s, n=3):
    """Wait until n more ticks have run (the exit of a worker is seen
    at once; what it ends, at a tick)."""
    t0 = s.status()["ticks"]
    wait_for(f"{n} ticks", lambda: s.status()["ticks"] >= t0 + n)


def test_another_uids_worker_cannot_end_a_reservation():
    conf = config("[server]\ngroup = 65534\n")
    with Server("--config", conf) as s:
        open_to_nobody(s)
        a = s.cli("admit", "--bytes", "64MiB", "--task", "T")
        check(a["admitted"], f"admit: {a}")
        rid = a["reservation"]
        check(fleet(s)["reserved"] == 64 * MIB, "reserved at once")

        # nobody names root's task, registers, exits.
        p = Peer(s, (NOBODY, NOGROUP))
        try:
            r = p.ask("register T")
            check(r["ok"], f"nobody's Register failed: {r}")
            wait_for("nobody's worker registered",
                     lambda: registered(s, p.pid))
            p.exit()
        finally:
            p.kill()
        wait_for("nobody's worker gone", lambda: not registered(s, p.pid))
        ticks_pass(s)
        f = fleet(s)
        check(f["reserved"] == 64 * MIB and f["reservations"] == 1,
              f"another uid's worker ended or used up the reservation: {f}")
        check(f'msg="reservation taken over by its task" reservation={rid}'
              not in s.logtext(), "taken over by nobody's worker")
        print(f"  after nobody's worker of T came and went: reserved "
              f"{f['reserved'] // MIB} MiB, {f['reservations']} reservation")

        # The owner's worker takes it over and ends it by exiting.
        w = Peer(s)
        try:
            r = w.ask("register T")
            check(r["ok"], f"root's Register failed: {r}")
            w.exit()
        finally:
            w.kill()
        wait_for("the owner's worker ends the reservation",
                 lambda: fleet(s)["reservations"] == 0)
        check(fleet(s)["reserved"] == 0, "reserved left behind")
        check(f'reservation ended: its task\'s workers exited" '
              f'reservation={rid}' in s.logtext(), "not ended by its task")

        # A live worker of another uid does not lift the TTL either.
        a = s.cli("admit", "--bytes", "8MiB", "--task", "U", "--ttl", "1")
        check(a["admitted"], f"admit: {a}")
        p = Peer(s, (NOBODY, NOGROUP))
        try:
            check(p.ask("register U")["ok"], "nobody's Register of U")
            wait_for("the reservation expires by its TTL",
                     lambda: fleet(s)["reservations"] == 0, timeout=30)
            check(f'msg="reservation expired" '
                  f'reservation={a["reservation"]}' in s.logtext(),
                  "it must have expired, not ended otherwise")
        finally:
            p.kill()


def test_per_uid_caps():
    conf = config("[server]\ngroup = 65534\nmax_connections_per_uid = 4\n"
                  "idle_timeout = 0\n"
                  "[admission]\nmax_reservations_per_uid = 5\n")
    with Server("--config", conf) as s:
        open_to_nobody(s)
        hog = Peer(s, (NOBODY, NOGROUP))
        try:
            got = hog.ask("hold 4")
            check(got == ["ok"] * 4, f"nobody's first 4: {got}")
            got = hog.ask("hold 1")
            check(got == ["closed"], f"nobody's 5th must be closed: {got}")
            wait_for("the rejection logged", lambda: (
                'msg="max_connections_per_uid reached' in s.logtext() and
                "uid=65534" in s.logtext()))
            for i in range(5):
                r = hog.ask("admit 1048576 -")
                check(r.get("admitted"), f"nobody's admit {i}: {r}")
            r = hog.ask("admit 1048576 -")
            check(not r.get("admitted") and r["scope"] == "uid:65534" and
                  "max_reservations_per_uid = 5" in r["reason"],
                  f"nobody's 6th reservation: {r}")
            print(f"  nobody over its cap: {r['reason']}")

            # Root: connects, admits, registers a worker.
            check(s.status()["fleet"]["reservations"] == 5, "5 held")
            a = s.cli("admit", "--bytes", "1MiB")
            check(a["admitted"], f"root's admit: {a}")
            w = Peer(s)
            try:
                check(w.ask("hold 2") == ["ok", "ok"], "root's connections")
                check(w.ask("register R")["ok"], "root's Register")
                wait_for("root's worker", lambda: registered(s, w.pid))
            finally:
                w.kill()
            # Another uid (daemon, 1) is not stopped by nobody's caps.
            d = Peer(s, (1, NOGROUP))
            try:
                check(d.ask("hold 3") == ["ok"] * 3, "daemon's connections")
                r = d.ask("admit 1048576 -")
                check(r.get("admitted"), f"daemon's admit: {r}")
                r = d.ask("register D")
                check(r["ok"], f"daemon's Register: {r}")
            finally:
                d.kill()
            # nobody still holds its four.
            check(hog.ask("admit 1 -")["scope"] == "uid:65534",
                  "nobody's held connection still answers")
        finally:
            hog.kill()
        # Its connections closed, nobody may connect again.
        p = Peer(s, (NOBODY, NOGROUP))
        try:
            wait_for("nobody's connections counted down", lambda: (
                p.ask("hold 1") == ["ok"]))
        finally:
            p.kill()


def test_idle_connections_are_closed():
    conf = config("[server]\nidle_timeout = 500ms\n")
    with Server("--config", conf) as s:
        def connect():
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(s.socket)
            return c, pb.Reader(c)

        watcher, wr = connect()
        watcher.sendall(pb.request(5, pb.WATCH))
        first = wr.frame(T)
        check(first is not None and 9 in first, f"watch: {first}")
        for round_ in range(2):
            idle, ir = connect()
            # Before the request: the server's idleness counts from its
            # handling of it, which a slow answer would put before a t0
            # taken after the answer.
            t0 = time.monotonic()
            idle.sendall(pb.get_usage(1))
            check(ir.frame(T) is not None, "GetUsage answered")
            # The server closes it: EOF (the read waits for it).
            check(ir.frame(30 * MULT) is None, "an idle connection stayed")
            took = time.monotonic() - t0
            check(took >= 0.45, f"closed after {took:.2f} s, before 500 ms")
            idle.close()
            print(f"  idle connection {round_} closed after {took:.2f} s")
        # Two timeouts later the watcher is open and still hears events.
        a = s.cli("admit", "--bytes", "2MiB")
        check(a["admitted"], "admit")
        subprocess.run([os.environ["MEMTALLY_CLI"], "--socket", s.socket,
                        "limit", "set", "fleet", "1MiB"], check=True,
                       capture_output=True, timeout=30 * MULT)
        ev = wr.frame(T)
        check(ev is not None and 9 in ev, f"watcher: {ev}")
        check(pb.parse(ev[9][0]).get(2, [0])[0] == 2, "an `over` event")
        watcher.close()
        check('msg="connection idle, closed"' in s.logtext(), "logged")


# ---- RLIMIT_NOFILE -------------------------------------------------------

SLOTS, MAX_CONNS, MARGIN = 4096, 1024, 256  # defaults; main.c's margin


def start_limited(nofile):
    """memtallyd (default slots and connections) under prlimit."""
    d = tempfile.mkdtemp(prefix="mt-nofile-")
    log = open(os.path.join(d, "memtallyd.log"), "w+b")
    label = f"mt-nofile-{os.getpid()}-{nofile.replace(':', '-')}"
    proc = subprocess.Popen(
        ["prlimit", f"--nofile={nofile}", MEMTALLYD,
         "--socket", os.path.join(d, "s.sock"), "--segment", label,
         "--log-level", "debug"],
        stdout=log, stderr=log)

    def text():
        log.flush()
        with open(log.name, "rb") as f:
            return f.read().decode(errors="replace")

    def ready():
        if proc.poll() is not None:
            raise AssertionError("memtallyd exited: " + text())
        return 'msg="listening"' in text()
    wait_for("memtallyd listening", ready, timeout=20)
    return proc, text, d


def stop_limited(proc, text, d):
    rc, log = terminate(proc, text, timeout=20), ""
    if rc is None:
        proc.kill()
        proc.wait()
        log = text()
    shutil.rmtree(d, ignore_errors=True)
    check(rc is not None, f"memtallyd did not stop on SIGTERM: {log}")


def nofile_of(pid):
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    raise AssertionError("no Max open files line")


def test_open_files_limit():
    check(shutil.which("prlimit"), "prlimit (util-linux) is needed")
    need = SLOTS + MAX_CONNS + MARGIN
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    low_hard = hard != resource.RLIM_INFINITY and hard < need
    if not low_hard:
        h = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
        proc, text, d = start_limited(f"1024:{h}")
        try:
            soft, _ = nofile_of(proc.pid)
            check(soft > 1024 and soft >= need,
                  f"soft limit {soft}, need {need}: {text()}")
            check('msg="open-files limit raised"' in text(), "logged")
            print(f"  soft 1024 -> {soft} (need {need}, hard {h})")
        finally:
            stop_limited(proc, text, d)

    proc, text, d = start_limited("256:256")
    try:
        check(nofile_of(proc.pid) == (256, 256), "limit changed?")
        line = [x for x in text().splitlines()
                if "open-files limit too low" in x]
        check(line and "nofile_hard=256" in line[0] and
              f"needed={need}" in line[0], f"no warning: {text()}")
        print(f"  {line[0].split(' msg=')[1][:150]}")
        # It started anyway and answers.
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(os.path.join(d, "s.sock"))
        s.sendall(pb.get_usage(1))
        check(pb.Reader(s).frame(T) is not None, "no answer")
        s.close()
    finally:
        stop_limited(proc, text, d)
    if low_hard:
        raise Skip(f"this hard open-files limit ({hard}) is below {need}: "
                   "the raise itself was not shown (the warning was)")


def test_a_run_past_its_users_connection_cap_waits():
    """`memtally run --wait` of a uid whose connections are all taken
    (its other runs hold two each while they wait) is accepted and
    dropped at once. It waits for a connection as for room, and is
    admitted once one frees, instead of running its command unadmitted
    at once (which every run past the cap did)."""
    conf = config("[server]\ngroup = 65534\nmax_connections_per_uid = 3\n"
                  "idle_timeout = 0\n[limits]\nfleet = 1GiB\n")
    (cli,) = world_readable_copy(CLI)
    with Server("--config", conf) as s:
        open_to_nobody(s)
        hog = Peer(s, (NOBODY, NOGROUP))
        err = tempfile.TemporaryFile(mode="w+")
        run_ = None
        try:
            check(hog.ask("hold 3") == ["ok"] * 3, "nobody's 3 connections")
            run_ = subprocess.Popen(
                [cli, "--socket", s.socket, "run", "--bytes", "16MiB",
                 "--wait", "60", "--", "true"], stderr=err,
                preexec_fn=as_user((NOBODY, NOGROUP)))

            def said():
                err.seek(0)
                return err.read()
            wait_for("the run waits for a connection",
                     lambda: "dropped the connection" in said())
            check(run_.poll() is None, f"the run ended: {said()}")
            hog.kill()
            rc = run_.wait(timeout=60 * MULT)
            text = said()
            check(rc == 0 and "without admission" not in text,
                  f"exit {rc}: {text}")
            check('msg="admission granted"' in s.logtext() and
                  "bytes=16777216" in s.logtext(),
                  "no grant logged: " + s.tail())
            print(f"  waited, then admitted: {text.strip()}")
        finally:
            hog.kill()
            if run_ and run_.poll() is None:
                run_.kill()


if __name__ == "__main__":
    run([test_another_uids_worker_cannot_end_a_reservation,
         test_a_run_past_its_users_connection_cap_waits,
         test_per_uid_caps,
         test_idle_connections_are_closed,
         test_open_files_limit])
