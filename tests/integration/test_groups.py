"""Group owners and per-uid bounds, with real processes of three users.

test_group_owners: [group etl] lists the second test user's uid. A nobody
process naming etl is registered in default (its Registered answer says
so, ps shows it there) and its Admit naming etl is denied
(group_not_allowed); the second user's process is registered in etl.

test_slot_cap: --slots 64 with max_slots_per_uid = 16: 20 nobody processes
register, 16 get a slot, the rest are counted unregistered; a second-user
process still registers.

test_max_ttl_after_takeover: with max_ttl = 8 s, a reservation of task T
taken over by a live worker of T ends when max_ttl has passed anyway; a
worker of another uid naming T neither takes it over nor ends it.

test_refused_lines_are_budgeted: 10,000 refused SetLimits from nobody
make a bounded number of log lines, and a line saying how many were
suppressed.

test_hostile_names: group names with U+009B (CSI) or U+202E (right-to-left
override) are refused at registration, and `memtally ps` prints no C1 or
bidi bytes.

nobody and the second user reach the socket through [server] group = 65534
(nogroup) and a server directory made traversable.
"""
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import (as_user, CLI, MULT, NOBODY, NOGROUP, Server,  # noqa: E402
                     check, open_to_nobody, run, second_user, wait_for,
                     world_readable_copy)
from harness import config_file as config  # noqa: E402

T = 10 * MULT  # per-response deadline

# A process speaking the raw protocol, one command per stdin line, one JSON
# answer per stdout line:
#   register GROUP TASK   Register this process ("-" = none)
#   admit BYTES GROUP     Admit
#   setlimits N           N refused-or-not SetLimit{fleet} on one connection
#   exit
PEER = r'''
import json, socket, sys
sys.path.insert(0, sys.argv[1])
import pbwire as pb
path, T = sys.argv[2], float(sys.argv[3])

def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s, pb.Reader(s)

def call(conn, body_field, body):
    s, r = conn
    s.sendall(pb.request(7, body_field, body))
    return r.frame(T)

def text(v):
    return v.decode("utf-8", "surrogateescape") if v != "-" else ""

def say(x):
    print(json.dumps(x), flush=True)

keep = []
for line in sys.stdin:
    cmd = line.rstrip("\n").split(" ")
    if cmd[0] == "register":
        body = b""
        if cmd[1] != "-":
            body += pb.field(1, 2, bytes.fromhex(cmd[1]))
        if cmd[2] != "-":
            body += pb.field(2, 2, cmd[2].encode())
        c = connect()
        resp = call(c, pb.REGISTER, body + pb.field(3, 0, 4242))
        keep.append(c)  # the descriptors came with it: keep them open
        ok = resp is not None and 3 in resp
        group = pb.parse(resp[3][0]).get(6, [b""])[0].decode() if ok else ""
        say({"ok": ok, "group": group,
             "error": pb.error_code(resp) if resp and not ok else None})
    elif cmd[0] == "admit":
        body = pb.field(1, 0, int(cmd[1])) + pb.field(2, 2, cmd[2].encode())
        resp = call(connect(), pb.ADMIT, body)
        a = pb.parse(resp[6][0])
        say({"admitted": bool(a.get(1, [0])[0]),
             "reason": a.get(3, [b""])[0].decode()})
    elif cmd[0] == "setlimits":
        s, r = connect()
        n = int(cmd[1])
        req = pb.request(7, pb.SET_LIMIT,
                         pb.field(1, 0, 1) + pb.field(4, 0, 1 << 30))
        refused = 0
        for i in range(0, n, 100):
            k = min(100, n - i)
            s.sendall(req * k)
            for _ in range(k):
                resp = r.frame(T)
                refused += resp is not None and 2 in resp
        say({"refused": refused})
    elif cmd[0] == "exit":
        break
'''


class Peer:
    """A PEER process, as root or (uid, gid)."""

    def __init__(self, srv, user=None):
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

    def register(self, group, task="-"):
        g = group.encode("utf-8", "surrogateescape").hex() if group else "-"
        return self.ask(f"register {g} {task}")

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def fleet(s):
    return s.status()["fleet"]


def test_group_owners():
    uid2, _ = second_user()
    conf = config(f"[server]\ngroup = 65534\n[group etl]\nuids = {uid2}\n")
    with Server("--config", conf) as s:
        open_to_nobody(s)
        peers = []
        try:
            nob = Peer(s, (NOBODY, NOGROUP))
            peers.append(nob)
            r = nob.register("etl")
            check(r["ok"] and r["group"] == "default",
                  f"nobody naming etl must be put in default: {r}")
            two = Peer(s, (uid2, NOGROUP))
            peers.append(two)
            r = two.register("etl")
            check(r["ok"] and r["group"] == "etl",
                  f"the listed uid's worker is in etl: {r}")
            ps = s.ps()
            check(ps[nob.pid]["group"] == "default",
                  f"nobody's worker shows in {ps[nob.pid]['group']}")
            check(ps[two.pid]["group"] == "etl", "uid2's worker in etl")
            groups = {g["name"]: g for g in s.status()["groups"]}
            check(groups["etl"]["processes"] == 1,
                  f"etl counts only the listed uid's worker: {groups}")
            check('msg="group not allowed for this uid, worker put in '
                  'default"' in s.logtext(), "the refusal is logged")

            a = nob.ask("admit 1048576 etl")
            check(not a["admitted"] and "group not allowed" in a["reason"],
                  f"nobody's Admit naming etl: {a}")
            a = two.ask("admit 1048576 etl")
            check(a["admitted"], f"uid2's Admit naming etl: {a}")
            m = s.status()
            check(m["fleet"]["reservations"] == 1, "one reservation")
            print(f"  nobody -> default; denied: {nob.ask('admit 1 etl')}")
        finally:
            for p in peers:
                p.kill()


def test_slot_cap():
    uid2, _ = second_user()
    conf = config("[server]\ngroup = 65534\n"
                  "[limits]\nmax_slots_per_uid = 16\n")
    with Server("--config", conf, slots=64) as s:
        open_to_nobody(s)
        peers = []
        try:
            answers = []
            for _ in range(20):
                p = Peer(s, (NOBODY, NOGROUP))
                peers.append(p)
                answers.append(p.register(None))
            ok = sum(a["ok"] for a in answers)
            check(ok == 16, f"{ok} of nobody's 20 registered, want 16")
            check(len(s.ps()) == 16, f"ps shows {len(s.ps())}")
            st = s.status()
            check(st["unregistered"] == 4,
                  f"refused workers counted unregistered: {st}")
            other = Peer(s, (uid2, NOGROUP))
            peers.append(other)
            r = other.register(None)
            check(r["ok"], f"the second user still registers: {r}")
            check(len(s.ps()) == 17, "17 registered")
        finally:
            for p in peers:
                p.kill()


def test_max_ttl_after_takeover():
    # The owner's worker must take the reservation over before its TTL
    # runs out: starting two peers took over a second on a busy machine.
    conf = config("[server]\ngroup = 65534\n"
                  "[admission]\ndefault_ttl = 8\nmax_ttl = 8\n")
    with Server("--config", conf) as s:
        open_to_nobody(s)
        a = s.cli("admit", "--bytes", "64MiB", "--task", "T")
        check(a["admitted"], f"admit: {a}")
        rid = a["reservation"]
        peers = []
        try:
            # Another uid's worker of T: leaves the reservation alone.
            nob = Peer(s, (NOBODY, NOGROUP))
            peers.append(nob)
            check(nob.register(None, "T")["ok"], "nobody's Register of T")
            wait_for("the foreign worker noted", lambda: (
                "worker names a task reserved by another uid" in
                s.logtext()))
            # The owner's (root's) worker of T takes it over and lives on.
            w = Peer(s)
            peers.append(w)
            check(w.register(None, "T")["ok"], "root's Register of T")
            wait_for("taken over", lambda: (
                f'msg="reservation taken over by its task" '
                f'reservation={rid}' in s.logtext()))
            # nobody's worker leaves: the reservation stays.
            nob.kill()
            wait_for("nobody's worker gone", lambda: nob.pid not in s.ps())
            # Read the count, then the log: if max_ttl (8 s from the
            # Admit, which a loaded machine can reach by now) ended it,
            # its line was written before the count was answered.
            left = fleet(s)["reservations"]
            text = s.logtext()
            check(left == 1 or "max_ttl passed while its task runs" in text,
                  "another uid's worker ended the reservation")
            check("its task's workers exited" not in text,
                  "the reservation ended with nobody's worker")
            t0 = time.monotonic()
            wait_for("max_ttl ends the taken-over reservation",
                     lambda: fleet(s)["reservations"] == 0, timeout=30)
            check(w.pid in s.ps(), "its worker is still running")
            check("max_ttl passed while its task runs" in s.logtext(),
                  "ended by max_ttl")
            print(f"  ended {time.monotonic() - t0:.1f} s after takeover "
                  f"while its worker ran")
        finally:
            for p in peers:
                p.kill()


def test_refused_lines_are_budgeted():
    conf = config("[server]\ngroup = 65534\n")
    with Server("--config", conf) as s:
        open_to_nobody(s)
        p = Peer(s, (NOBODY, NOGROUP))
        try:
            t0 = time.monotonic()
            r = p.ask("setlimits 10000")
            took = time.monotonic() - t0
            check(r["refused"] == 10000, f"all refused: {r}")
            wait_for("the suppressed lines reported", lambda: (
                'msg="similar lines suppressed" uid=65534' in s.logtext()))
            n = s.logtext().count('msg="SetLimit refused')
            bound = 10 * (int(took) + 2)
            check(n <= bound,
                  f"{n} SetLimit lines for 10000 refusals in {took:.1f} s")
            print(f"  10000 refusals in {took:.1f} s: {n} lines + summary")
        finally:
            p.kill()


def test_hostile_names():
    conf = config("[server]\ngroup = 65534\n")
    with Server("--config", conf) as s:
        open_to_nobody(s)
        peers = []
        try:
            for name in ("a\u009b31mX", "b\u202eevil", "c\u2066d",
                         "e\udcff"):  # the last: a lone byte 0xff
                p = Peer(s, (NOBODY, NOGROUP))
                peers.append(p)
                r = p.register(name)
                check(not r["ok"], f"group {name!r} must be refused: {r}")
            p = Peer(s, (NOBODY, NOGROUP))
            peers.append(p)
            check(p.register("fine-ñame")["ok"], "plain UTF-8 is fine")
            out = subprocess.run([CLI, "--socket", s.socket, "ps"],
                                 capture_output=True, timeout=30 * MULT)
            check(out.returncode == 0, f"ps: {out.stderr}")
            raw = out.stdout
            for bad in (b"\xc2\x9b", b"\xe2\x80\xae", b"\xe2\x81\xa6",
                        b"\x1b"):
                check(bad not in raw, f"raw {bad!r} in ps output: {raw!r}")
            check("fine-ñame".encode() in raw, "the fine name shown")
        finally:
            for p in peers:
                p.kill()


def test_a_long_group_name_is_named_whole():
    """`limit set group NAME` names the group it set, whole: a name of 255
    bytes (the most a name may be) was cut at 89 in the answer, and one
    cut inside a character was shown as '?'s throughout."""
    name = "é" * 127 + "x"          # 255 bytes of UTF-8
    with Server() as s:
        out = s.cli("limit", "set", "group", name, "1GiB")
        check(out["scope"] == "group:" + name, f"scope {out['scope']!r}")
        text = s.cli_text("limit", "set", "group", name, "2GiB")
        check(text.startswith("group:" + name + " limit: 2 GiB (was 1 GiB)"),
              f"said {text!r}")


def test_a_group_past_what_a_worker_keeps_is_cut_on_a_character():
    """MEMTALLY_GROUP of 40 'ü' (80 bytes): a worker keeps 63 bytes, and
    cut inside a character the name was not UTF-8, memtallyd refused the
    registration, and the worker's 64 MiB were never counted. It is cut
    on a character (31 'ü', 62 bytes) and counted."""
    from harness import MIB, Worker, worker
    with Server() as s:
        w = Worker([*worker("hold"), "64"],
                   s.env(group="\u00fc" * 40))
        try:
            w.readline()
            p = wait_for("the worker counted", lambda: (
                lambda q: q if q and q["bytes"] >= 64 * MIB else None)(
                    s.ps().get(w.pid)))
            check(p["group"] == "\u00fc" * 31, f"{p}")
        finally:
            w.close()


if __name__ == "__main__":
    run([test_group_owners,
         test_slot_cap,
         test_max_ttl_after_takeover,
         test_refused_lines_are_budgeted,
         test_hostile_names,
         test_a_long_group_name_is_named_whole,
         test_a_group_past_what_a_worker_keeps_is_cut_on_a_character])
