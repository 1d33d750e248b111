"""The Python client (python/memtally/, `python3 -m memtally`) against a
live memtallyd: GetUsage, ListProcesses, Admit (admitted and denied under
--fleet-limit), Release and Watch, both as a library and as a command. Its
protobuf module is generated at build time (MEMTALLY_PB2_DIR). An Admit
whose answer comes after the client's timeout is released when it comes;
a denial says the rule that decided (denied_by), and which ones waiting
cannot change. A Client whose request timed out, or could not all be
sent, says so at its next call, instead of reading the late answer as
that call's or writing after the broken frame. An answer that trickles
in is bounded by the timeout as a whole; a length that is garbage is an
error at once. Sizes read as memtally's one size parser reads them, and
bad input on the command line is a usage error (2), not a traceback.
"""
import argparse
import logging
import os
import signal
import subprocess
import sys
import time

from harness import (MIB, MULT, Server, Worker, check, config_file,
                     line_within, run, wait_for, worker)

PYDIR = os.environ["MEMTALLY_PYTHON"]
sys.path.insert(0, PYDIR)
import memtally as mc  # noqa: E402

pb = mc.pb


def command(*args):
    env = dict(os.environ, PYTHONPATH=PYDIR)
    return subprocess.run([sys.executable, "-m", "memtally", *args], env=env,
                          capture_output=True, text=True, timeout=30 * MULT)


def example(s, *args):
    return command("--socket", s.socket, *args)


def test_library_admit_deny_release_usage_ps():
    with Server("--fleet-limit", "64MiB") as s:
        w = Worker([*worker("hold"), "8"], s.env(group="py"))
        check(w.readline().startswith("ready"), "worker not ready")
        with mc.Client(s.socket) as c:
            wait_for("worker registered",
                     lambda: any(p.pid == w.pid and p.bytes >= 8 * MIB
                                 for p in c.processes()))
            procs = c.processes("py")
            check([p.pid for p in procs] == [w.pid], f"ps py: {procs}")
            u = c.usage()
            check(u.fleet_limit == 64 * MIB, f"limit {u.fleet_limit}")
            check(u.fleet_bytes >= 8 * MIB, f"fleet bytes {u.fleet_bytes}")
            check(any(g.name == "py" for g in u.groups), "no group py")
            check(c.usage(group="py").group.processes == 1, "group scope")
            check(c.usage(pid=w.pid).process.pid == w.pid, "pid scope")

            ok = c.admit(16 * MIB, group="py", task="t1", ttl_seconds=60)
            check(ok.admitted and ok.reservation.startswith("r-"),
                  f"not admitted: {ok}")
            no = c.admit(60 * MIB, group="py")
            check(not no.admitted, f"admitted over the limit: {no}")
            check(no.limit == 64 * MIB and no.requested_bytes == 60 * MIB,
                  f"denial figures: {no}")
            check("fleet" in no.limit_scope and no.reason, f"reason: {no}")
            check(c.usage().reserved_bytes >= 16 * MIB, "reservation counted")
            info = c.reservation(ok.reservation)
            check(info.reservation == ok.reservation and
                  info.bytes == 16 * MIB and info.task == "t1" and
                  info.group == "py" and not info.taken_over,
                  f"reservation info: {info}")
            rel = c.release(ok.reservation)
            check(rel.reservation == ok.reservation and rel.bytes == 16 * MIB,
                  f"released: {rel}")
            try:
                c.release(ok.reservation)
                check(False, "second release succeeded")
            except mc.MemtallyError as e:
                check(e.code == pb.ERROR_NOT_FOUND, f"code {e.code}")
            try:
                c.reservation(ok.reservation)
                check(False, "a released reservation was found")
            except mc.MemtallyError as e:
                check(e.code == pb.ERROR_NOT_FOUND, f"code {e.code}")
            check(c.admit(40 * MIB).admitted, "room after release")
        w.close()


def test_library_watch_sees_over():
    with Server("--fleet-limit", "32MiB") as s:
        with mc.Client(s.socket) as c:
            events = c.watch()
            first = next(events)
            check(first.scope == "fleet" and first.state == pb.STATE_OK,
                  f"first event {first}")
            w = Worker([*worker("hold"), "48"], s.env(group="big"))
            check(w.readline().startswith("ready"), "worker not ready")
            c.sock.settimeout(20 * MULT)
            for ev in events:
                if ev.scope == "fleet" and ev.state == pb.STATE_OVER:
                    check(ev.bytes >= 32 * MIB and ev.limit == 32 * MIB,
                          f"over event {ev}")
                    break
            w.close()


def test_command_line():
    with Server("--fleet-limit", "64MiB") as s:
        r = example(s, "admit", "16MiB", "--group", "cli")
        check(r.returncode == 0 and r.stdout.startswith("admitted r-"),
              f"admit: {r.returncode} {r.stdout} {r.stderr}")
        rid = r.stdout.split()[1]
        r = example(s, "admit", "1GiB")
        check(r.returncode == 3 and "denied" in r.stdout, f"deny: {r}")
        r = example(s, "usage")
        check(r.returncode == 0 and "limit 64.0 MiB" in r.stdout, f"usage: {r}")
        r = example(s, "ps")
        check(r.returncode == 0, f"ps: {r}")
        r = example(s, "release", rid)
        check(r.returncode == 0 and f"released {rid}" in r.stdout,
              f"release: {r}")
        r = example(s, "watch", "--count", "1")
        check(r.returncode == 0 and r.stdout.startswith("fleet ok -> ok"),
              f"watch: {r}")
    r = command("--socket", "/nonexistent/s", "usage")
    check(r.returncode == 1 and r.stderr.startswith("memtally: "),
          f"no server: {r}")


def test_watch_reconnects_across_a_restart():
    """memtally.watch(reconnect=True) and `python3 -m memtally watch
    --reconnect` outlive memtallyd's SIGKILL: the loss is said once, and
    the events of the server started again follow (the first: the
    fleet's state). Without reconnect the watch ends with the stream."""
    first = Server()
    second = None
    env = dict(os.environ, PYTHONPATH=PYDIR)
    follow = subprocess.Popen(
        [sys.executable, "-m", "memtally", "--socket", first.socket, "watch",
         "--reconnect"], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    lost, back = [], []
    lib = mc.watch(first.socket, reconnect=True, on_lost=lost.append,
                   on_back=lambda: back.append(1))
    plain = mc.watch(first.socket)
    try:
        check(next(lib).scope == "fleet" and next(plain).scope == "fleet",
              "no first event")
        check(line_within(follow, 30 * MULT).startswith("fleet "),
              "the command's first event")
        first.kill9()
        try:
            ev = next(plain)
            check(False, f"the plain watch went on: {ev}")
        except (OSError, ConnectionError):
            pass
        second = Server(after=first)
        ev = next(lib)
        check(ev.scope == "fleet" and len(lost) == 1 and back == [1],
              f"after the restart: {ev}, lost {lost}, back {back}")
        line = line_within(follow, 30 * MULT)
        check(line.startswith("fleet ") and follow.poll() is None,
              f"the command after the restart: {line!r}")
    finally:
        lib.close()
        if follow.poll() is None:
            follow.terminate()
        follow.wait(timeout=30 * MULT)
        (second or first).stop()
    err = follow.stderr.read()
    print("  " + err.strip().replace("\n", "\n  "))
    check("was lost" in err and "reconnecting" in err and "again" in err,
          f"stderr: {err!r}")


def test_watch_reconnect_waits_when_closed_at_once():
    """memtallyd at its connection cap accepts new connections and closes
    them at once. `python3 -m memtally watch --reconnect` reconnected with
    no wait each time: 45,000 "lost, reconnecting" lines in 3 s, and
    memtallyd busy refusing it. Now a stream closed before its first
    event waits as a refused connection does (0.2 s, doubling) and the
    loss is said once; when a place frees, the stream runs."""
    with Server("--max-connections", "4") as s:
        held = []

        def served():
            # A slow (sanitized, loaded) server must not pass for a
            # refusing one: a timeout is an OSError too.
            c = mc.Client(s.socket, timeout=20 * MULT)
            try:
                c.usage()
                return c
            except (OSError, ConnectionError):
                c.close()
                return None

        # The first one is retried: the harness's readiness probes are
        # closed on our side but can still hold places until memtallyd
        # reads their end (a loaded ASan server accepted four of them at
        # once and refused this test's first client).
        held.append(wait_for("a first connection served", served,
                             timeout=30 * MULT))
        for _ in range(7):              # until one is closed at once
            c = served()
            if c is None:
                break
            held.append(c)
        check(0 < len(held) <= 4, f"{len(held)} connections held")
        env = dict(os.environ, PYTHONPATH=PYDIR)
        follow = subprocess.Popen(
            [sys.executable, "-m", "memtally", "--socket", s.socket, "watch",
             "--reconnect"], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(3.0)
            for c in held:
                c.close()
            line = line_within(follow, 30 * MULT)
            check(line.startswith("fleet "), f"no event once a place "
                  f"freed: {line!r}")
        finally:
            follow.terminate()
            follow.wait(timeout=30 * MULT)
        err = follow.stderr.read()
        n = err.count("reconnecting")
        print(f"  3 s at the cap: {n} loss line(s), "
              f"{s.logtext().count('max_connections reached')} refusal "
              f"line(s) in memtallyd's log", flush=True)
        check(1 <= n <= 2, f"{n} loss lines: {err[:500]!r}")


def test_a_late_admit_answer_is_released_at_exit():
    """`python3 -m memtally --timeout 1 admit` with memtallyd stopped: the
    command times out and exits 1. Its late-answer thread died with it,
    and memtallyd's grant then stayed set aside, unnamed, for its TTL (an
    hour here). Now the command waits for that answer at exit (at most
    10 s) and releases the grant."""
    with Server("--fleet-limit", "1GiB") as s:
        s.proc.send_signal(signal.SIGSTOP)
        env = dict(os.environ, PYTHONPATH=PYDIR)
        p = subprocess.Popen(
            [sys.executable, "-m", "memtally", "--socket", s.socket,
             "--timeout", "1", "admit", "100MiB", "--task", "orphan",
             "--ttl", "3600"], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(2.0 * MULT)
        finally:
            s.proc.send_signal(signal.SIGCONT)
        out, err = p.communicate(timeout=30 * MULT)
        check(p.returncode == 1 and "timed out" in err,
              f"exit {p.returncode}: {err!r}")
        wait_for("nothing reserved", lambda: s.status()["fleet"][
            "reserved"] == 0, timeout=10)
        check('msg="reservation released"' in s.logtext(),
              "the late grant was not released: " + s.tail())


def test_a_late_admit_answer_is_released():
    """memtallyd stopped (SIGSTOP) while an Admit waits for its answer: the
    client times out and the caller runs without admission; once memtallyd
    goes on, it grants the request and the client's thread releases it."""
    caught = []

    class Catch(logging.Handler):
        def emit(self, rec):
            caught.append(rec.getMessage())
    logging.getLogger("memtally").addHandler(Catch())
    with Server("--fleet-limit", "64MiB") as s:
        c = mc.Client(s.socket, timeout=0.5)
        c.usage()                       # connected, answered
        s.proc.send_signal(signal.SIGSTOP)
        try:
            try:
                c.admit(16 * MIB, group="late", ttl_seconds=600)
                check(False, "answered while memtallyd was stopped")
            except TimeoutError:
                pass
            c.close()                   # the caller's: the thread keeps it
        finally:
            s.proc.send_signal(signal.SIGCONT)
        msg = wait_for("the late grant released", lambda: next(
            (m for m in caught if "released" in m), None), timeout=30)
        # A Client whose request timed out is out of step with its
        # stream: it says so, rather than read the stale answer as the
        # next request's.
        for first in ("admit", "usage"):
            c = mc.Client(s.socket, timeout=0.5)
            s.proc.send_signal(signal.SIGSTOP)
            try:
                try:
                    if first == "admit":
                        c.admit(1 * MIB, ttl_seconds=600)
                    else:
                        c.usage()
                    check(False, "answered while memtallyd was stopped")
                except TimeoutError:
                    pass
            finally:
                s.proc.send_signal(signal.SIGCONT)
            try:
                c.usage()
                check(False, f"a {first} that timed out: the next call "
                      "answered")
            except ConnectionError as e:
                check("open a new Client" in str(e), f"{e}")
            c.close()
        wait_for("the second late grant released", lambda: sum(
            "released" in m for m in caught) >= 2, timeout=30)
        check(s.status()["fleet"]["reserved"] == 0,
              f"still reserved: {s.status()['fleet']}; {msg}")
        text = s.logtext()
        check('msg="admission granted"' in text and
              'msg="reservation released"' in text,
              "no grant and release logged: " + text[-1500:])


def test_a_request_not_sent_whole_gives_the_client_up():
    """A request whose frame could not all be written (memtallyd stopped,
    the socket's buffer full: the send times out) leaves part of a frame
    on the stream. The Client says so at its next call instead of writing
    a request after the broken frame, which memtallyd would read as its
    rest."""
    with Server() as s:
        c = mc.Client(s.socket, timeout=10 * MULT)
        c.usage()                       # connected, answered
        c.sock.settimeout(0.5)          # the stopped server's wait
        s.proc.send_signal(signal.SIGSTOP)
        try:
            try:
                c.call(get_usage=pb.GetUsage(group="g" * (8 * MIB)))
                check(False, "8 MiB written to a stopped memtallyd")
            except (TimeoutError, OSError):
                pass
        finally:
            s.proc.send_signal(signal.SIGCONT)
        try:
            got = c.usage()
            check(False, f"the next call answered: {got}")
        except ConnectionError as e:
            check("open a new Client" in str(e), f"{e}")
        c.close()
        # memtallyd dropped the broken frame's connection, not itself.
        with mc.Client(s.socket, timeout=5) as fresh:
            u = fresh.usage()
            check(u.fleet_limit == 0 and s.proc.poll() is None,
                  f"a new Client's answer: {u}")


def test_denied_by_names_the_rule():
    # The server's kinds cap binds root too (a uid's does not).
    cfg = config_file("[kinds]\nmax_kinds = 1\n")
    with Server("--fleet-limit", "64MiB", "--config", cfg) as s:
        with mc.Client(s.socket) as c:
            no = c.admit(1 << 30)
            check(no.denied_by == "fleet_limit" and
                  not mc.denied_for_ever(no), f"fleet: {no}")
            ok = c.admit(MIB, kind="first", ttl_seconds=60)
            check(ok.admitted and ok.denied_by == "", f"first kind: {ok}")
            no = c.admit(MIB, kind="second")
            check(no.denied_by == "kinds" and
                  mc.denied_for_ever(no) == "kinds", f"second kind: {no}")
            # Without the kind, the same request goes.
            check(c.admit(MIB, ttl_seconds=60).admitted, "without the kind")


def fake_memtallyd(path, answer, pace):
    """A socket that answers every request with `answer`, a byte every
    `pace` seconds."""
    import socket
    import threading
    import time
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(4)

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            try:
                c.recv(4096)
                for b in answer:
                    c.sendall(bytes([b]))
                    time.sleep(pace)
            except OSError:
                pass
    threading.Thread(target=serve, daemon=True).start()
    return srv


def test_an_answer_is_bounded_by_the_timeout():
    import tempfile
    import time
    d = tempfile.mkdtemp(prefix="mt-pyfake-")
    # A frame of 64 bytes, a byte every 0.2 s: 13 s to read it whole.
    slow = fake_memtallyd(os.path.join(d, "slow"), b"\x40" + b"\x08" * 64,
                          0.2)
    c = mc.Client(os.path.join(d, "slow"), timeout=1.0)
    t0 = time.monotonic()
    try:
        c.usage()
        check(False, "a trickled answer was taken")
    except TimeoutError:
        pass
    took = time.monotonic() - t0
    check(took < 3 * MULT, f"a 1 s timeout took {took:.1f} s")
    print(f"  a trickling answer: TimeoutError after {took:.1f} s",
          flush=True)
    slow.close()
    for name, answer in (("ff", b"\xff" * 12),
                         ("huge", b"\x80\x80\x80\x80\x80\x20")):
        fake = fake_memtallyd(os.path.join(d, name), answer, 0)
        c = mc.Client(os.path.join(d, name), timeout=5.0)
        t0 = time.monotonic()
        try:
            c.usage()
            check(False, f"{answer!r} taken for an answer")
        except mc.MemtallyError as e:
            check(e.code == pb.ERROR_UNDECODABLE, f"{answer!r}: {e}")
            took = time.monotonic() - t0
            check(took < 2.5 * MULT, f"{answer!r}: {took:.1f} s")
            print(f"  {answer!r}: {e}", flush=True)
        fake.close()


def test_sizes_and_bad_input():
    cases = {"20Mi": 20 << 20, "2Gi": 2 << 30, "1.001KB": 1001,
             "1.5G": 3 << 29, "512MB": 512 * 10**6, "64KiB": 64 << 10,
             "4096": 4096, "0.5k": 512,
             "18446744073709551615": (1 << 64) - 1}
    for text, want in cases.items():
        got = mc.parse_size(text)
        check(got == want, f"{text}: {got}, want {want}")
    for text in ("1.5", "1 MiB", " 1", "1.", ".5", "-1", "0x10", "1Q",
                 "18446744073709551616", "99999999TB", "0.0000001K"):
        try:
            got = mc.parse_size(text)
            check(False, f"{text!r} read as {got}")
        except argparse.ArgumentTypeError:
            pass
    with Server() as s:
        for args in (["admit", "99999999TB"], ["admit", "1MiB", "--ttl",
                                                "-1"],
                     ["admit", "1.5"]):
            r = example(s, *args)
            check(r.returncode == 2 and "Traceback" not in r.stderr,
                  f"{args}: exit {r.returncode}: {r.stderr}")
        # An integration's settings: a group memtallyd would refuse, or
        # one past a frame's size (which broke the connection, and the
        # log blamed memtallyd), is the setting's error, named.
        from memtally.client import task_settings
        for group, why in (("g" * 70000, "more than 255 bytes"),
                           ("a\u202eb", "not printable")):
            try:
                task_settings("1MiB", group, 0)
                check(False, f"group {group[:10]!r}... taken")
            except ValueError as e:
                check("memtally_group" in str(e) and why in str(e),
                      f"{e}")
        check(task_settings("1MiB", "etl", 5) == (1 << 20, "etl", 5),
              "a good group")
        r = command("--tcp", "localhost", "usage")
        check(r.returncode == 2 and "Traceback" not in r.stderr and
              "HOST:PORT" in r.stderr, f"--tcp localhost: exit "
              f"{r.returncode}: {r.stderr}")


if __name__ == "__main__":
    run([test_library_admit_deny_release_usage_ps, test_library_watch_sees_over,
         test_command_line, test_watch_reconnects_across_a_restart,
         test_watch_reconnect_waits_when_closed_at_once,
         test_a_late_admit_answer_is_released,
         test_a_late_admit_answer_is_released_at_exit,
         test_a_request_not_sent_whole_gives_the_client_up,
         test_denied_by_names_the_rule,
         test_an_answer_is_bounded_by_the_timeout,
         test_sizes_and_bad_input])
