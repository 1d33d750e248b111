"""memtally's command line refuses what it cannot do before it connects:
each mistake gets exit status 2 and one line on stderr that names it, and
nothing on stdout; --help and --version answer without a server."""
import os
import subprocess
import sys

from harness import CLI, check, run

# (arguments, what stderr must say)
MISTAKES = [
    ([], "no command given"),
    (["--bogus", "status"], "unknown option '--bogus'"),
    (["-x", "status"], "unknown option '-x'"),
    (["--json=1", "status"], "option '--json' takes no value"),
    (["status", "--timeout"], "option '--timeout' needs a value"),
    (["--timeout", "0", "status"], "invalid --timeout '0'"),
    (["nosuch"], "unknown command 'nosuch'"),
    (["status", "extra"], "status: unexpected argument 'extra'"),
    (["limit"], "limit: missing argument"),
    (["ps", "--bytes", "5"], "ps: --bytes does not apply"),
    (["--socket", "/a", "--tcp", "b:1", "status"],
     "--socket and --tcp exclude each other"),
    (["admit", "--bytes", "zz"], "invalid --bytes 'zz'"),
    (["--socket", "", "status"], "--socket needs a path"),
    # Names memtallyd would refuse: not taken for a server that does not
    # answer, which would run the command unadmitted.
    (["run", "--bytes", "1G", "--group", "a\tb", "--", "true"],
     "run: --group is not a name memtallyd takes"),
    # A group its workers cannot carry (a worker keeps 63 bytes of
    # MEMTALLY_GROUP): they were counted in a group cut short, outside
    # its limit, or, cut inside a character, not at all.
    (["run", "--bytes", "1G", "--group", "b" * 70, "--", "true"],
     "run: the group is 70 bytes, at most 63"),
    (["admit", "--bytes", "1M", "--group", "\u00fc" * 40],
     "admit: the group is 80 bytes, at most 63"),
    # Empty, these listed (or admitted) as if the flag were absent; a
    # name memtallyd would refuse was its refusal (exit 1).
    (["ps", "--group", ""], "ps: --group is empty"),
    (["ps", "--group", "a\x1bb"], "ps: --group is not a name"),
    (["kinds", ""], "kinds: the kind is empty"),
    (["kinds", "k\x1b"], "kinds: the kind is not a name"),
    (["admit", "--bytes", "1M", "--group", ""], "admit: --group is empty"),
    (["admit", "--bytes", "1M", "--task", ""], "admit: --task is empty"),
    (["limit", "set", "group", "a\x1b", "1M"],
     "limit set group: not a name memtallyd takes"),
    # Asked every 6 s, a waiter lost its place in memtallyd's queue
    # (silent for 3 s, it has left).
    (["run", "--bytes", "1M", "--wait", "9", "--poll", "6", "--", "true"],
     "invalid --poll '6'"),
    # Not a server that cannot be reached (run would run unadmitted).
    (["--tcp", "nohost", "status"], "invalid --tcp 'nohost'"),
    (["--tcp", "127.0.0.1:0", "status"], "invalid --tcp '127.0.0.1:0'"),
    (["run", "--tcp", "nohost", "--bytes", "1M", "--", "true"],
     "invalid --tcp 'nohost'"),
    (["--socket", "/tmp/" + "a" * 200, "status"],
     "--socket: a path of 205 bytes"),
    (["run", "--kind", "a\tb", "--", "true"],
     "run: --kind is not a name memtallyd takes"),
    (["run", "--bytes", "1G", "--task", "a\u202eb", "--", "true"],
     "run: --task is not a name memtallyd takes"),
    # A task name a worker cuts (it keeps 63 bytes of MEMTALLY_TASK):
    # granted, it would never be taken over.
    (["admit", "--bytes", "1G", "--task", "t" * 64],
     "admit: --task is 64 bytes, at most 63"),
    # Said here with exit 2, naming the flag, not sent for memtallyd's
    # refusal (exit 1).
    (["admit", "--bytes", "1M", "--group", "a\tb"],
     "admit: --group is not a name memtallyd takes"),
    (["admit", "--kind", "k\u202ex"],
     "admit: --kind is not a name memtallyd takes"),
    (["admit", "--bytes", "1M", "--ttl", "4294967296"],
     "expected seconds from 1 to 4294967295"),
    # jq's "null" for a denial's missing id: the command would run
    # unadmitted.
    (["run", "--reservation", "null", "--task", "t", "--", "true"],
     "invalid --reservation 'null'"),
    # Past 2^63 - 1 no count is real, and JSON could not say it back.
    (["limit", "set", "fleet", "9000000T"], "'9000000T' is too large"),
]


def test_usage_errors():
    for args, says in MISTAKES:
        # A socket that does not exist: a mistake must be caught before
        # any connection is tried.
        r = subprocess.run([CLI, *args], capture_output=True, text=True,
                           env={"MEMTALLY_SOCKET": "/nonexistent/sock"})
        check(r.returncode == 2, f"{args}: exit {r.returncode}, "
              f"stderr {r.stderr!r}")
        check(says in r.stderr and r.stderr.count("\n") == 1,
              f"{args}: stderr {r.stderr!r}, expected {says!r}")
        check(r.stdout == "", f"{args}: stdout {r.stdout!r}")
    print(f"  {len(MISTAKES)} mistakes refused with exit 2", flush=True)


def test_a_group_from_the_environment_is_checked_as_given():
    """`memtally run` takes its group from MEMTALLY_GROUP without --group:
    one memtallyd refuses was sent, the refusal taken for a server that
    cannot be reached, and the command ran unadmitted (and uncounted: its
    workers' registrations were refused too)."""
    for g in ("a\x1b[1m", "c" * 64):
        r = subprocess.run([CLI, "run", "--bytes", "1M", "--", "echo",
                            "ran"], capture_output=True, text=True,
                           env={"MEMTALLY_SOCKET": "/nonexistent/sock",
                                "MEMTALLY_GROUP": g})
        check(r.returncode == 2 and "MEMTALLY_GROUP" in r.stderr and
              r.stdout == "", f"{g!r}: exit {r.returncode}, "
              f"{r.stdout!r} {r.stderr!r}")


def test_help_and_version_need_no_server():
    env = {"MEMTALLY_SOCKET": "/nonexistent/sock"}
    h = subprocess.run([CLI, "--help"], capture_output=True, text=True,
                       env=env)
    check(h.returncode == 0 and h.stdout.startswith("Usage: memtally"),
          f"--help: {h.returncode} {h.stdout[:80]!r}")
    v = subprocess.run([CLI, "-V"], capture_output=True, text=True, env=env)
    check(v.returncode == 0 and v.stdout.startswith("memtally "),
          f"-V: {v.returncode} {v.stdout!r}")
    down = subprocess.run([CLI, "status"], capture_output=True, text=True,
                          env=env)
    check(down.returncode == 1 and "is memtallyd running?" in down.stderr,
          f"no server: {down.returncode} {down.stderr!r}")


def test_run_after_a_double_dash():
    """Options may come before the command, "--" included: "memtally --
    run -- CMD" runs CMD (it was "unexpected argument")."""
    env = {"MEMTALLY_SOCKET": "/nonexistent/sock", "MEMTALLY_DISABLE": "1"}
    for args in (["--", "run", "--", "sh", "-c", "exit 7"],
                 ["--", "run", "sh", "-c", "exit 7"]):
        r = subprocess.run([CLI, *args], capture_output=True, text=True,
                           env=env)
        check(r.returncode == 7, f"{args}: exit {r.returncode}, "
              f"stderr {r.stderr!r}")


HOSTILE = "\x1b]0;OWNED\x07\x1b[2J"


def fake_server(path):
    """Answers every request on `path` as a hostile peer would: an Admit
    granted under an id and a sizing of escape sequences, anything else an
    error whose words are escape sequences."""
    import socket
    import threading
    sys.path.insert(0, os.environ["MEMTALLY_PB2_DIR"])
    import memtally_pb2 as pb

    def frame(msg):
        d = msg.SerializeToString()
        n, out = len(d), b""
        while True:
            b = n & 0x7F
            n >>= 7
            out += bytes([b | 0x80 if n else b])
            if not n:
                return out + d

    def read(c):
        n, shift = 0, 0
        while True:
            ch = c.recv(1)
            if not ch:
                return None
            n |= (ch[0] & 0x7F) << shift
            shift += 7
            if not ch[0] & 0x80:
                break
        data = b""
        while len(data) < n:
            d = c.recv(n - len(data))
            if not d:
                return None
            data += d
        r = pb.Request()
        r.ParseFromString(data)
        return r

    def serve(c):
        with c:
            while (r := read(c)) is not None:
                resp = pb.Response(id=r.id)
                if r.WhichOneof("body") == "admit":
                    resp.admit_result.admitted = True
                    resp.admit_result.reservation = "r-" + HOSTILE
                    resp.admit_result.sized_by = "s" + HOSTILE
                    resp.admit_result.reserved_for_task = 1 << 20
                else:
                    resp.error.code = 2
                    resp.error.message = "not found " + HOSTILE
                c.sendall(frame(resp))

    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(16)

    def accept():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(c,), daemon=True).start()
    threading.Thread(target=accept, daemon=True).start()
    return srv


def test_what_a_server_says_cannot_drive_the_terminal():
    """Whoever answers on the socket (or a --tcp port) put escape
    sequences on the user's terminal through an error's words, an Admit's
    reservation id and its sizing: printed as they came. They show as
    '?', as names always did."""
    import tempfile
    d = tempfile.mkdtemp(prefix="mt-it-hostile-")
    path = os.path.join(d, "h.sock")
    srv = fake_server(path)
    try:
        for args in (["status"], ["admit", "--bytes", "1M"],
                     ["run", "--bytes", "1M", "--", "true"]):
            # --timeout is in milliseconds: 30 s, for a loaded machine
            # (at 5 ms the fake server's answer came late under CI).
            r = subprocess.run([CLI, "--socket", path, "--timeout",
                                "30000", *args], capture_output=True,
                               text=True, timeout=120)
            out = r.stdout + r.stderr
            check("\x1b" not in out and "\x07" not in out,
                  f"{args}: the server's escapes reached the terminal: "
                  f"{out!r}")
            check(args[0] == "run" or "?" in out, f"{args}: {out!r}")
    finally:
        srv.close()


if __name__ == "__main__":
    run([test_usage_errors,
         test_a_group_from_the_environment_is_checked_as_given,
         test_help_and_version_need_no_server,
         test_run_after_a_double_dash,
         test_what_a_server_says_cannot_drive_the_terminal])
