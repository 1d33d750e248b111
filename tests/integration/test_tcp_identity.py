#!/usr/bin/env python3
"""Who a TCP peer is, and what the token may and may not be.

A loopback TCP peer is the uid the kernel says owns its end of the
connection (sock_diag), like a Unix-socket peer: its reservations are its
own, the logs name it, and it counts under that uid's connection cap. The
token gives admin rights, so it must not sit in a file other users can read
nor on a command line. Admins keep a few places of max_connections.

Runs as root (the tests do) and drives the CLI as nobody and as a second
unprivileged user over TCP on 127.0.0.1 with a port the server picks.

A Unix-socket peer memtallyd cannot identify either (it runs in a pid
namespace of its own, as a container that shares the socket but not the
host's pids: the kernel gives the peer's pid as 0) is held to the same
rule: its requests need the token.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import (as_user, CLI, MEMTALLYD, MULT, NOBODY, NOGROUP, PRELOAD,  # noqa: E402
                     Server, Skip, Worker, check, config_file, logged,
                     open_to_nobody, run, second_user, signal_until,
                     wait_for, worker, world_readable_copy)

TOKEN = "tcp-identity-token-0123456789"
GIB = 1 << 30


def private_config(text, mode=0o600):
    path = config_file(text)
    os.chmod(path, mode)
    return path


def tcp_port(s):
    """The port the server picked (--tcp 127.0.0.1:0), from its log."""
    return wait_for("the TCP port in the log", lambda: next(
        (int(w[5:]) for line in s.logtext().splitlines()
         if "tcp listening" in line for w in line.split()
         if w.startswith("port=")), None))


def require_root():
    if os.geteuid() != 0:
        raise Skip("needs root to run processes as other users")


_PUB_CLI = None


def pub_cli():
    """The CLI, copied where every user may run it."""
    global _PUB_CLI
    if _PUB_CLI is None:
        _PUB_CLI = world_readable_copy(CLI)[0]
    return _PUB_CLI


def cli_as(user, port, *args, env_extra=None):
    """The CLI over TCP as user=(uid, gid) (None: root); (rc, out, err)."""
    env = {k: v for k, v in os.environ.items() if k != "MEMTALLY_TOKEN"}
    env.update(env_extra or {})
    r = subprocess.run([pub_cli(), "--tcp", f"127.0.0.1:{port}", "--json",
                        *args], capture_output=True, text=True, env=env,
                       preexec_fn=as_user(user), cwd="/",
                       timeout=30 * MULT)
    return r.returncode, r.stdout, r.stderr


# ---- the token: not in a readable file, not on a command line -------------

def test_inline_token_needs_a_private_config():
    cfg = config_file(f"[server]\ntcp_token = {TOKEN}\n")
    os.chmod(cfg, 0o644)
    r = subprocess.run([MEMTALLYD, "--config", cfg, "--socket",
                        os.path.join(os.path.dirname(cfg), "s.sock")],
                       capture_output=True, text=True, timeout=30 * MULT)
    err = r.stderr.strip()
    check(r.returncode == 2, f"started with a 0644 config holding the "
          f"token: rc {r.returncode} {err}")
    check(cfg in err and "tcp_token_file" in err and "0600" in err and
          len(err.splitlines()) == 1, f"error: {err!r}")
    # A token file other users can read is refused the same way.
    tok = os.path.join(os.path.dirname(cfg), "token")
    with open(tok, "w") as f:
        f.write(TOKEN + "\n")
    os.chmod(tok, 0o644)
    cfg2 = private_config(f"[server]\ntcp_token_file = {tok}\n")
    r = subprocess.run([MEMTALLYD, "--config", cfg2, "--socket",
                        os.path.join(os.path.dirname(cfg2), "s.sock")],
                       capture_output=True, text=True, timeout=30 * MULT)
    check(r.returncode == 2 and tok in r.stderr,
          f"world-readable token file: rc {r.returncode} {r.stderr}")

    # 0600: it starts; made readable later, a reload is rejected and the
    # token in force stays.
    os.chmod(cfg, 0o600)
    with Server("--config", cfg, "--tcp", "127.0.0.1:0") as s:
        tcp_port(s)
        os.chmod(cfg, 0o640)
        before = s.logtext().count("config reload rejected")
        signal_until(s.proc, signal.SIGHUP, "the reload rejected",
                     lambda: s.logtext().count("config reload rejected") >
                     before)
        line = [x for x in s.logtext().splitlines()
                if "config reload rejected" in x][-1]
        check(cfg in line and "tcp_token" in line, f"reload: {line}")


def test_cli_takes_the_token_from_env_or_file_only():
    require_root()
    cfg = private_config(f"[server]\ntcp_token = {TOKEN}\n")
    with Server("--config", cfg, "--tcp", "127.0.0.1:0") as s:
        port = tcp_port(s)
        # On the command line every user could read it: refused, before
        # anything is sent.
        rc, out, err = cli_as((NOBODY, NOGROUP), port, "--token", TOKEN, "limit",
                              "set", "fleet", "1GiB")
        check(rc == 2 and "MEMTALLY_TOKEN" in err and "--token-file" in err,
              f"--token VALUE: {rc} {err}")
        check(s.status()["fleet"]["limit"] is None, "a limit was set")
        # Nobody over loopback TCP is nobody: no admin, no token, refused.
        rc, out, err = cli_as((NOBODY, NOGROUP), port, "limit", "set", "fleet", "1GiB")
        check(rc == 1 and "permission denied" in err.lower(),
              f"no token: {rc} {err}")
        rc, out, err = cli_as((NOBODY, NOGROUP), port, "limit", "set", "fleet", "1GiB",
                              env_extra={"MEMTALLY_TOKEN": TOKEN})
        check(rc == 0 and json.loads(out)["limit"] == GIB,
              f"MEMTALLY_TOKEN: {rc} {out}{err}")
        tdir = tempfile.mkdtemp(prefix="mt-tok-")
        os.chmod(tdir, 0o755)
        tok = os.path.join(tdir, "token")
        with open(tok, "w") as f:
            f.write(TOKEN + "\n")
        os.chown(tok, NOBODY, NOGROUP)
        os.chmod(tok, 0o600)
        rc, out, err = cli_as((NOBODY, NOGROUP), port, "--token-file", tok, "limit",
                              "set", "fleet", "2GiB")
        check(rc == 0 and json.loads(out)["previous"] == GIB,
              f"--token-file: {rc} {out}{err}")
        check(s.status()["fleet"]["limit"] == 2 * GIB, "limit not applied")


# ---- a loopback TCP peer is its uid ---------------------------------------

def test_tcp_reservation_belongs_to_its_uid():
    require_root()
    u2 = second_user()
    cfg = private_config(f"[server]\ntcp_token = {TOKEN}\n")
    with Server("--config", cfg, "--tcp", "127.0.0.1:0") as s:
        port = tcp_port(s)
        rc, out, err = cli_as(u2, port, "admit", "--bytes", "1MiB")
        check(rc == 0 and json.loads(out)["admitted"],
              f"admit as uid {u2[0]}: {rc} {out}{err}")
        rid = json.loads(out)["reservation"]
        line = wait_for("the grant in the log", lambda: next(
            (x for x in s.logtext().splitlines()
             if "admission granted" in x and rid in x), None))
        check(f" uid={u2[0]} " in line and "peer=127.0.0.1:" in line and
              " uid=0" not in line, f"log line: {line}")
        # Another uid over TCP may not release it without the token ...
        rc, out, err = cli_as((NOBODY, NOGROUP), port, "release", rid)
        check(rc == 1 and "permission denied" in err.lower(),
              f"nobody released uid {u2[0]}'s reservation: {rc} {out}{err}")
        check(s.status()["fleet"]["reservations"] == 1, "the reservation went")
        # ... its owner may, with none.
        rc, out, err = cli_as(u2, port, "release", rid)
        check(rc == 0, f"the owner's release: {rc} {out}{err}")
        check(s.status()["fleet"]["reservations"] == 0, "still reserved")


# ---- caps per uid, and room for admins -------------------------------------

HOLDER = r'''
import socket, sys
sys.path.insert(0, sys.argv[1])
import pbwire as pb
path, port = sys.argv[2], int(sys.argv[3])
held = []
for kind in sys.argv[4:]:
    if kind == "unix":
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.settimeout(20)
        c.connect(path)
    else:
        c = socket.create_connection(("127.0.0.1", port), timeout=20)
    c.sendall(pb.get_usage(1))
    try:
        got = c.recv(1)
    except OSError:
        got = b""
    print("ok" if got else "closed", flush=True)
    held.append(c)
sys.stdin.read()
'''


def hold(s, port, user, kinds):
    """A process as `user` holding connections of `kinds` ("unix", "tcp")
    open, one after the other; returns it and whether each was answered
    (True) or closed by the server at once (False)."""
    pub = os.path.dirname(world_readable_copy(
        os.path.join(HERE, "pbwire.py"))[0])
    p = subprocess.Popen([sys.executable, "-c", HOLDER, pub, s.socket,
                          str(port), *kinds], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, preexec_fn=as_user(user),
                         cwd="/")
    got = []
    for _ in kinds:
        line = p.stdout.readline().strip()
        check(line in ("ok", "closed"), f"holder said {line!r}")
        got.append(line == "ok")
    return p, got


def test_per_uid_caps_leave_room_for_others_and_root():
    require_root()
    u2 = second_user()
    # 8 places: the last (8 / 16, at least 1) is for admins.
    cfg = private_config("[server]\ngroup = 65534\nmax_connections = 8\n"
                         "max_connections_per_uid = 4\nidle_timeout = 0\n")
    procs = []
    with Server("--config", cfg, "--tcp", "127.0.0.1:0") as s:
        try:
            open_to_nobody(s)
            port = tcp_port(s)
            # Nobody: four places over both transports, the fifth closed.
            p, got = hold(s, port, (NOBODY, NOGROUP),
                          ["unix", "tcp", "unix", "tcp", "tcp"])
            procs.append(p)
            check(got == [True, True, True, True, False],
                  f"nobody's connections: {got}")
            # Another uid still gets in and is answered (a GetUsage on
            # each), up to what is left to non-admins: 3.
            p, got = hold(s, port, u2, ["tcp", "tcp", "tcp", "tcp"])
            procs.append(p)
            check(got == [True, True, True, False],
                  f"uid {u2[0]}'s connections: {got}")
            # Every place but the admins' is taken: root still answers.
            st = s.status()
            check("fleet" in st, f"root's status: {st}")
            check("max_connections_per_uid reached" in s.logtext() and
                  f"uid={NOBODY} " in s.logtext(), "no cap log line")
        finally:
            for p in procs:
                p.stdin.close()
                p.wait(timeout=20 * MULT)


# ---- a peer gone before accept is nobody in particular ---------------------

HIT_AND_RUN = r"""
import socket, sys
sys.path.insert(0, sys.argv[1])
import pbwire as pb
port, n = int(sys.argv[2]), int(sys.argv[3])
req = pb.request(1, pb.SET_LIMIT, pb.field(1, 0, 1) + pb.field(4, 0, 1 << 20))
ports = []
for _ in range(n):
    c = socket.create_connection(("127.0.0.1", port), timeout=20)
    c.sendall(req)
    ports.append(c.getsockname()[1])
    c.close()
print(" ".join(map(str, ports)), flush=True)
"""


def leftovers_timewait(ports):
    """Have the closed peers' sockets on these local ports all become
    timewait ones? /proc/net/tcp shows those with uid 0, where a full
    socket (FIN_WAIT1, just closed) still shows its owner's uid."""
    uid_of = {}
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            w = line.split()
            uid_of[int(w[1].split(":")[1], 16)] = int(w[7])
    return all(uid_of.get(p) == 0 for p in ports)


def tcp_closes(s):
    """Connections closed, written or held back by the log budget (the
    rounds make no other connection)."""
    return logged(s.logtext(), "connection closed")


def test_peer_closed_before_accept_is_not_root():
    """A peer that connects, sends a SetLimit and closes while memtallyd
    is not accepting (stopped here, busy in production) has left behind,
    by the time of accept, a socket in FIN_WAIT or TIME_WAIT; sock_diag
    reports such a leftover with uid 0. It must not be taken for root:
    the peer is unidentified, and its SetLimit refused."""
    require_root()
    tdir = tempfile.mkdtemp(prefix="mt-tok-")
    tok = os.path.join(tdir, "token")
    with open(tok, "w") as f:
        f.write(TOKEN + "\n")
    os.chmod(tok, 0o600)
    cfg = private_config(f"[server]\ntcp_token_file = {tok}\n")
    pub = os.path.dirname(world_readable_copy(
        os.path.join(HERE, "pbwire.py"))[0])
    rounds, per_round = 6, 50  # under max_connections_unidentified
    with Server("--config", cfg, "--tcp", "127.0.0.1:0") as s:
        port = tcp_port(s)
        for i in range(rounds):
            closed = tcp_closes(s)
            s.proc.send_signal(signal.SIGSTOP)
            try:
                r = subprocess.run([sys.executable, "-c", HIT_AND_RUN, pub,
                                    str(port), str(per_round)],
                                   capture_output=True, text=True, cwd="/",
                                   preexec_fn=as_user((NOBODY, NOGROUP)),
                                   timeout=60 * MULT)
                check(r.returncode == 0 and r.stdout.strip(),
                      f"the peers as nobody: {r.returncode} {r.stderr}")
                # Every other round, memtallyd accepts once the leftovers
                # are timewait sockets (uid 0); else while they are still
                # the peer's own sockets, closing.
                if i % 2:
                    ports = [int(x) for x in r.stdout.split()]
                    wait_for("timewait leftovers",
                             lambda: leftovers_timewait(ports))
            finally:
                s.proc.send_signal(signal.SIGCONT)
            wait_for(f"{per_round} TCP connections served and closed",
                     lambda: tcp_closes(s) >= closed + per_round,
                     timeout=30)
        log = s.logtext()
        executed = [x for x in log.splitlines() if 'msg="limit set"' in x]
        check(not executed, f"{len(executed)} of {rounds * per_round} "
              f"SetLimits of a closed peer executed: {executed[:3]}")
        check(s.status()["fleet"]["limit"] is None, "the fleet limit changed")
        as_root = [x for x in log.splitlines() if "uid=0 peer=" in x]
        check(not as_root, f"a TCP peer taken for uid 0: {as_root[:3]}")
        # Each was unidentified, and its SetLimit refused for want of a
        # token (a round stays under max_connections_unidentified).
        # Lines past the log budget are counted in its summaries; every
        # written acceptance names an unidentified peer.
        lines = log.splitlines()
        accepted = [x for x in lines
                    if 'msg="connection accepted"' in x and
                    "peer=127.0.0.1:" in x]
        check(all("uid=unknown peer=127.0.0.1:" in x for x in accepted),
              f"a TCP peer identified: {accepted[:3]}")
        # (root's own connections are accepted too: at least.)
        unknown = logged(log, "connection accepted")
        denied = logged(log, "request refused: unknown uid and no token")
        check(unknown >= rounds * per_round and
              denied == rounds * per_round,
              f"unidentified peers: {unknown} accepted, {denied} refused")

        # A live peer is still its uid, and the token holder's SetLimit
        # over TCP still goes through.
        rc, out, err = cli_as((NOBODY, NOGROUP), port, "limit", "set",
                              "fleet", "1MiB",
                              env_extra={"MEMTALLY_TOKEN": TOKEN})
        check(rc == 0 and json.loads(out)["limit"] == 1 << 20,
              f"the token holder's SetLimit: {rc} {out}{err}")
        check(s.status()["fleet"]["limit"] == 1 << 20, "limit not applied")
        line = wait_for("the limit in the log", lambda: next(
            (x for x in s.logtext().splitlines()
             if 'msg="limit set"' in x), None))
        check(f"by=token uid={NOBODY} peer=127.0.0.1:" in line,
              f"log line: {line}")


def require_pid_namespace():
    """Root, and a pid namespace can be made here (unshare); else skip."""
    require_root()
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc",
                            "true"], capture_output=True)
    if probe.returncode != 0:
        raise Skip("cannot make a pid namespace: %s" %
                   probe.stderr.decode().strip())


def test_a_peer_in_a_pid_namespace_memtallyd_cannot_see_needs_the_token():
    require_pid_namespace()
    cfg = private_config(f"[server]\ntcp_token = {TOKEN}\n")
    # unshare --fork waits for memtallyd and passes no signal on: the
    # SIGTERM goes to memtallyd itself (pid 1 of its namespace, which
    # takes it: it has a handler), and unshare then exits with it.
    s = Server("--config", cfg,
               prefix=["unshare", "--pid", "--fork", "--mount-proc"])
    try:
        env = dict(os.environ)
        env.pop("MEMTALLY_TOKEN", None)
        admit = [CLI, "--socket", s.socket, "admit", "--bytes", "1MiB"]
        r = subprocess.run(admit, env=env, capture_output=True, text=True,
                           timeout=30 * MULT)
        check(r.returncode != 0 and "token is needed" in r.stderr and
              "pid namespace" in r.stderr,
              f"no token: exit {r.returncode}: {r.stderr.strip()}")
        r = subprocess.run(admit, env=dict(env, MEMTALLY_TOKEN=TOKEN),
                           capture_output=True, text=True, timeout=30 * MULT)
        check(r.returncode == 0 and r.stdout.strip(),
              f"with the token: exit {r.returncode}: {r.stderr.strip()}")
        print("  a peer of pid 0: refused without the token, admitted with "
              "it", flush=True)
    finally:
        with open(f"/proc/{s.proc.pid}/task/{s.proc.pid}/children") as f:
            for c in f.read().split():
                os.kill(int(c), signal.SIGTERM)
        s.proc.wait(timeout=20 * MULT)


# In a network namespace (a host of its own, as memtallyd sees it), against
# HOST:PORT. Prints one JSON object of what it saw:
#  - idle: of 20 connections that send nothing, how many ended within 20 s,
#    whether the 12 oldest ended before the 8 newest (their places taken by
#    newer ones), and how long the 8 newest lived (the token's wait: 5 s);
#  - bare: a request without the token is answered PERMISSION_DENIED (3)
#    and the connection closed;
#  - tokened: with 8 connections that showed the token open (the address's
#    share), a ninth is closed at once; the 8 are still answered after the
#    wait.
REMOTE_PEERS = r"""
import json, socket, sys, time
sys.path.insert(0, sys.argv[3])
from harness import Ends, closed_at_once
import pbwire as pb
host, port, quick, token = sys.argv[1], int(sys.argv[2]), float(sys.argv[4]), sys.argv[5]
out = {}

def conn():
    return socket.create_connection((host, port), timeout=5)

def usage(c, rid, tok):
    req = pb.field(1, 0, rid) + (pb.field(2, 2, tok.encode()) if tok else b"")
    try:
        c.sendall(pb.frame(req + pb.field(pb.GET_USAGE, 2, pb.field(1, 0, 1))))
        return pb.Reader(c).frame(10)
    except OSError:  # closed by the server
        return None

def ok(r):
    return r is not None and pb.error_code(r) == 0

idle = Ends()
for _ in range(20):
    idle.add(conn())
idle.wait(20)
# The 12 oldest gave their places to newer ones, as those came; the 8
# newest went by the token's wait, 5 s after their accept.
out["idle_ended"] = sum(idle.lived(i) is not None for i in range(20))
out["oldest_12_ended_first"] = idle.ended_first(range(12), range(12, 20))
out["newest_8_lived_s"] = min((idle.lived(i) or 0) for i in range(12, 20))

bare = conn()
r = usage(bare, 7, "")
out["bare_error"] = pb.error_code(r) if r is not None else -1
out["bare_closed"] = pb.Reader(bare).frame(5) is None

kept = [conn() for _ in range(8)]
out["tokened_answered"] = sum(ok(usage(c, i + 1, token))
                              for i, c in enumerate(kept))
ninth = conn()
out["ninth_closed_at_once"] = closed_at_once([ninth], quick)
time.sleep(6)
out["tokened_after_wait"] = sum(ok(usage(c, 100 + i, token))
                                for i, c in enumerate(kept))
print(json.dumps(out), flush=True)
"""


def test_one_remote_host_gets_an_eighth_of_the_unidentified_places():
    """Peers on other hosts are of unknown uid: they share
    max_connections_unidentified (64), and one host opening connections
    and leaving them open would lock out every remote scheduler. One
    address gets an eighth of it; a connection that has not shown the
    token gives its place to a newer one and goes after 5 s; one that
    asks without it is closed; the places of those that showed it are
    theirs. From a peer in a network namespace of its own."""
    require_root()
    tag = os.getpid() % 100000
    ns, host_if, ns_if = f"mt{tag}", f"mth{tag}", f"mtn{tag}"
    # A /30 of 10.213.0.0/16 by the pid (14,000 of them): the ASan and
    # TSan passes run this test at the same time, and a /24 by pid % 200
    # met once in 200.
    idx = os.getpid() % 14000
    net3, base = 20 + idx // 64, (idx % 64) * 4
    here, there = f"10.213.{net3}.{base + 1}", f"10.213.{net3}.{base + 2}"
    if subprocess.run(["ip", "netns", "add", ns],
                      capture_output=True).returncode != 0:
        raise Skip("cannot make a network namespace (ip netns add)")
    try:
        for cmd in (["ip", "link", "add", host_if, "type", "veth", "peer",
                     "name", ns_if],
                    ["ip", "link", "set", ns_if, "netns", ns],
                    ["ip", "addr", "add", f"{here}/30", "dev", host_if],
                    ["ip", "link", "set", host_if, "up"],
                    ["ip", "netns", "exec", ns, "ip", "addr", "add",
                     f"{there}/30", "dev", ns_if],
                    ["ip", "netns", "exec", ns, "ip", "link", "set", ns_if,
                     "up"],
                    ["ip", "netns", "exec", ns, "ip", "link", "set", "lo",
                     "up"]):
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise Skip(f"cannot wire a veth pair: {' '.join(cmd)}: "
                           f"{r.stderr.strip()}")
        cfg = private_config(f"[server]\ntcp_token = {TOKEN}\n"
                             "tcp_allow_remote = true\n")
        with Server("--config", cfg, "--tcp", f"{here}:0") as s:
            port = tcp_port(s)
            r = subprocess.run(["ip", "netns", "exec", ns, sys.executable,
                                "-c", REMOTE_PEERS, here, str(port),
                                HERE, str(1.5 * MULT), TOKEN],
                               capture_output=True, text=True,
                               timeout=90 * MULT)
            check(r.returncode == 0, f"the remote peers: {r.stderr}")
            got = json.loads(r.stdout.strip().splitlines()[-1])
            print(f"  from {there}: {got}", flush=True)
            check(got["idle_ended"] == 20,
                  f"{got['idle_ended']} of 20 silent connections from one "
                  "address ended within 20 s, not all")
            check(got["oldest_12_ended_first"],
                  "the 12 oldest of 20 silent connections from one address "
                  "did not end first (their places taken by newer ones; 8 "
                  "kept)")
            check(got["newest_8_lived_s"] >= 4.5,
                  f"the 8 newest silent connections lived "
                  f"{got['newest_8_lived_s']:.1f} s, not the token's 5 s")
            check(got["tokened_answered"] == 8, f"{got}")
            check(got["ninth_closed_at_once"] == 1,
                  "a ninth connection beside 8 that showed the token was "
                  "not closed at once")
            check(got["tokened_after_wait"] == 8,
                  f"{got['tokened_after_wait']} of 8 connections that "
                  "showed the token answered after the wait, not 8")
            check(got["bare_error"] == 3 and got["bare_closed"],
                  f"a request without the token: error {got['bare_error']}"
                  f", closed {got['bare_closed']} (want 3, closed)")
            check("reached for this address" in s.logtext(),
                  "no log line names the per-address cap")
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_a_worker_in_a_pid_namespace_of_its_own_is_counted():
    """memtallyd on the host, a worker in a container's pid namespace
    sharing the socket (a DaemonSet's memtallyd and the node's pods): the
    slot carries the pid memtallyd sees, the host's, not the worker's
    getpid(). The worker must attach and be counted all the same."""
    require_pid_namespace()
    s = Server()
    w = None
    try:
        env = dict(os.environ, LD_PRELOAD=PRELOAD, MEMTALLY_SOCKET=s.socket,
                   MEMTALLY_REGISTER_MIN="0")
        w = Worker(["unshare", "--pid", "--fork", "--mount-proc",
                    "--kill-child", *worker("hold"), "32"], env)
        line = w.readline()
        check(line.startswith("ready pid=1"), f"in its namespace: {line}")
        kids = open(f"/proc/{w.pid}/task/{w.pid}/children").read().split()
        host = int(kids[0])
        wait_for(f"worker {host} (pid 1 in its namespace) counted",
                 lambda: s.ps().get(host, {}).get("bytes", 0) >= 32 << 20,
                 timeout=20 * MULT)
        print(f"  pid 1 in its namespace, {host} on the host: "
              f"{s.ps()[host]['bytes'] >> 20} MiB counted")
    finally:
        if w is not None:
            w.kill()
        s.stop()


def test_localhost_is_the_servers_loopback_not_a_squatters():
    """memtallyd reads "localhost" as 127.0.0.1. Debian's /etc/hosts lists
    ::1 first, where any user may listen on the same port: a client that
    resolved the name itself connected there and sent the token (admin
    rights) to that user. The C and Python clients now read it as the
    server does."""
    import socket
    require_root()
    try:
        probe = socket.socket(socket.AF_INET6)
        probe.bind(("::1", 0))
        probe.close()
    except OSError as e:
        raise Skip(f"no IPv6 loopback here: {e}")
    hosts = os.path.join(tempfile.mkdtemp(prefix="mt-hosts-"), "hosts")
    with open(hosts, "w") as f:  # Debian 12's own order
        f.write("::1\tlocalhost ip6-localhost ip6-loopback\n"
                "127.0.0.1\tlocalhost\n")
    cfg = private_config(f"[server]\ntcp_token = {TOKEN}\n")
    with Server("--config", cfg, "--tcp", "127.0.0.1:0") as s:
        port = tcp_port(s)
        squat = subprocess.Popen(
            [sys.executable, "-c",
             "import socket,sys\n"
             "s=socket.socket(socket.AF_INET6)\n"
             "s.setsockopt(socket.IPPROTO_IPV6,socket.IPV6_V6ONLY,1)\n"
             f"s.bind(('::1',{port}));s.listen();print('up',flush=True)\n"
             "s.settimeout(60)\n"
             "c,_=s.accept();c.settimeout(5)\n"
             "print('got',len(c.recv(4096)),flush=True)\n"],
            stdout=subprocess.PIPE, text=True,
            preexec_fn=as_user((NOBODY, NOGROUP)))
        try:
            check(squat.stdout.readline().strip() == "up", "no squatter")
            env = dict(os.environ, MEMTALLY_TOKEN=TOKEN,
                       PYTHONPATH=os.environ["MEMTALLY_PYTHON"])
            py = (f"from memtally.client import Client\n"
                  f"print(Client(tcp='localhost:{port}').usage() is not "
                  f"None)\n")
            for what, argv in (
                    ("the CLI", [CLI, "--tcp", f"localhost:{port}",
                                 "--json", "status"]),
                    ("the Python client", [sys.executable, "-c", py])):
                r = subprocess.run(
                    ["unshare", "-m", "sh", "-c",
                     'mount --bind "$0" /etc/hosts && exec "$@"', hosts,
                     *argv], capture_output=True, text=True, env=env,
                    timeout=60 * MULT)
                check(r.returncode == 0, f"{what}: {r.returncode} "
                      f"{r.stdout}{r.stderr}")
        finally:
            squat.kill()
            squat.wait()
        said = squat.stdout.read()
        check("got" not in said,
              f"the squatter on [::1]:{port} was reached: {said}")


SQUATTER = """
import os, socket, sys, threading
tcp = socket.socket(); tcp.bind(("127.0.0.1", 0)); tcp.listen()
unix = socket.socket(socket.AF_UNIX); unix.bind(sys.argv[1]); unix.listen()
os.chmod(sys.argv[1], 0o666)
got = []
def serve(l):
    while True:
        c, _ = l.accept(); c.settimeout(2)
        try:
            got.append(c.recv(4096))
        except OSError:
            pass
        c.close()
for l in (tcp, unix):
    threading.Thread(target=serve, args=(l,), daemon=True).start()
print(tcp.getsockname()[1], flush=True)
sys.stdin.read()
print(repr(b"".join(got)), flush=True)
"""


def test_the_token_goes_to_no_other_users_server():
    """The token is admin rights. A client sent it with every request to
    whoever listened where it connected: nobody, bound on memtallyd's TCP
    port while memtallyd was down (a restart) or on a socket in a
    directory any user may write, got it and set the fleet's limit with
    it. The C library and the Python client now give it only to a server
    that runs as root, the user itself or $MEMTALLY_SERVER_UID (over Unix
    also the sole owner of the socket's directory)."""
    require_root()
    d = tempfile.mkdtemp(prefix="mt-squat-")
    os.chmod(d, 0o1777)  # /tmp's mode: anyone may bind a socket here
    path = os.path.join(d, "memtally.sock")
    squat = subprocess.Popen([sys.executable, "-c", SQUATTER, path],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, preexec_fn=as_user((NOBODY, NOGROUP)))
    try:
        port = int(squat.stdout.readline())
        env = dict(os.environ, MEMTALLY_TOKEN=TOKEN,
                   PYTHONPATH=os.environ["MEMTALLY_PYTHON"])
        env.pop("MEMTALLY_SERVER_UID", None)
        for where, cli_args, py_args in (
                (f"127.0.0.1:{port}", ["--tcp", f"127.0.0.1:{port}"],
                 f"tcp='127.0.0.1:{port}'"),
                (path, ["--socket", path], f"path={path!r}")):
            r = subprocess.run([CLI, *cli_args, "--timeout", "5000",
                                "status"], capture_output=True, text=True,
                               env=env, timeout=60 * MULT)
            check(r.returncode != 0 and "not sending the token" in r.stderr
                  and f"uid {NOBODY} listens there" in r.stderr,
                  f"the CLI to {where}: {r.returncode} {r.stderr}")
            py = (f"from memtally.client import Client\n"
                  f"try:\n    Client({py_args}).usage()\n"
                  f"except PermissionError as e:\n    print('refused', e)\n")
            r = subprocess.run([sys.executable, "-c", py],
                               capture_output=True, text=True, env=env,
                               timeout=60 * MULT)
            check(r.stdout.startswith("refused not sending the token"),
                  f"the Python client to {where}: {r.stdout}{r.stderr}")
        # Without a token both still ask (nothing to keep from anyone):
        # the squatter is reached, so the check above is what kept it out.
        env.pop("MEMTALLY_TOKEN")
        subprocess.run([CLI, "--tcp", f"127.0.0.1:{port}", "--timeout",
                        "2000", "status"], capture_output=True, env=env,
                       timeout=60 * MULT)
    finally:
        out, _ = squat.communicate("", timeout=30 * MULT)
    check(TOKEN not in out and out.strip() != "b''",
          f"what the squatter got: {out.strip()}")


def test_a_dropped_connection_with_the_token_still_fails_open():
    """The token check asks the kernel who holds the server's end. When
    memtallyd closed the connection at once (the uid at its connection
    cap, as a job array's runs reach), that end was a leftover, and the
    check refused "cannot tell which user listens there": memtally run
    exited 2 and never ran the command, where without the token it
    failed open. A connection closed on us is the connection's fault
    again: the run fails open, the Python client raises
    ConnectionResetError."""
    require_root()
    cfg = private_config(f"[server]\ngroup = 65534\ntcp_token = {TOKEN}\n"
                         "max_connections_per_uid = 2\nidle_timeout = 0\n")
    procs = []
    with Server("--config", cfg, "--tcp", "127.0.0.1:0") as s:
        try:
            open_to_nobody(s)
            port = tcp_port(s)
            p, got = hold(s, port, (NOBODY, NOGROUP), ["tcp", "tcp"])
            procs.append(p)
            check(got == [True, True], f"nobody's connections: {got}")
            env = dict(os.environ, MEMTALLY_TOKEN=TOKEN,
                       MEMTALLY_PRELOAD_LIB="")
            r = subprocess.run([pub_cli(), "--tcp", f"127.0.0.1:{port}",
                                "run", "--bytes", "1MiB", "--", "echo",
                                "RAN"], capture_output=True, text=True,
                               env=env, preexec_fn=as_user((NOBODY, NOGROUP)),
                               cwd="/", timeout=60 * MULT)
            check(r.returncode == 0 and "RAN" in r.stdout and
                  "not sending the token" not in r.stderr,
                  f"a dropped run with the token: {r.returncode} "
                  f"{r.stdout!r} {r.stderr}")
            # The Python client and its generated module, where nobody
            # may read them (a fresh clone may sit in a 0700 directory).
            import shutil
            pub = tempfile.mkdtemp(prefix="mt-pub-py-")
            os.chmod(pub, 0o755)
            shutil.copytree(os.path.join(os.environ["MEMTALLY_PYTHON"],
                                         "memtally"),
                            os.path.join(pub, "memtally"))
            for f in os.listdir(os.environ["MEMTALLY_PB2_DIR"]):
                if f.endswith(".py"):
                    shutil.copy(os.path.join(os.environ["MEMTALLY_PB2_DIR"],
                                             f), pub)
            subprocess.run(["chmod", "-R", "a+rX", pub], check=True)
            py = ("import sys\nfrom memtally.client import Client\n"
                  "try:\n"
                  f"    Client(tcp='127.0.0.1:{port}').usage()\n"
                  "except ConnectionError as e:\n    print('dropped', e)\n")
            env = dict(os.environ, MEMTALLY_TOKEN=TOKEN, PYTHONPATH=pub)
            r = subprocess.run([sys.executable, "-c", py],
                               capture_output=True, text=True, env=env,
                               preexec_fn=as_user((NOBODY, NOGROUP)),
                               cwd="/", timeout=60 * MULT)
            check(r.stdout.startswith("dropped"),
                  f"the Python client, dropped: {r.stdout}{r.stderr}")
        finally:
            for p in procs:
                p.stdin.close()
                p.wait(timeout=20 * MULT)


if __name__ == "__main__":
    run([test_inline_token_needs_a_private_config,
         test_cli_takes_the_token_from_env_or_file_only,
         test_tcp_reservation_belongs_to_its_uid,
         test_per_uid_caps_leave_room_for_others_and_root,
         test_peer_closed_before_accept_is_not_root,
         test_a_peer_in_a_pid_namespace_memtallyd_cannot_see_needs_the_token,
         test_one_remote_host_gets_an_eighth_of_the_unidentified_places,
         test_a_worker_in_a_pid_namespace_of_its_own_is_counted,
         test_localhost_is_the_servers_loopback_not_a_squatters,
         test_the_token_goes_to_no_other_users_server,
         test_a_dropped_connection_with_the_token_still_fails_open])
