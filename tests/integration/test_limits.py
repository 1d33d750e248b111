"""Limits, admission and notification (admission, states and Watch,
reservations and their task's workers, who may change limits, SIGHUP),
through the real CLI against a real memtallyd with preloaded workers.

Every wait polls the server with a deadline (harness.wait_for); the only
sleeps are the polling intervals. A `memtally --json watch` subprocess is
the Watch subscriber: it is known to be subscribed once it has reported an
event the test caused after starting it (Watcher.sync).
"""
import json
import os
import select
import signal
import subprocess
import tempfile
import time

from harness import (as_user, CLI, MIB, MULT, PRELOAD, Server, Skip, Worker,  # noqa
                     check, deadline, run, signal_until, wait_for, worker,
                     world_readable_copy)
from harness import NOBODY as NOBODY_UID, NOGROUP  # noqa: E402
from harness import config_file as config_file_text  # noqa: E402

GIB = 1 << 30
NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
          "--"]


# A worker touching hundreds of MiB says "ready" once every page is in:
# on a loaded two-core machine that has taken over 30 s for 1 GiB.
BIG = 120


def cli(s, *args, as_nobody=False, json_out=True):
    """Run the CLI; return (exit status, parsed JSON or None, stdout,
    stderr). Unlike Server.cli, a non-zero status is an answer here."""
    cmd = [CLI, "--socket", s.socket]
    if json_out:
        cmd.append("--json")
    cmd += list(args)
    if as_nobody:
        cmd = NOBODY + cmd
    r = subprocess.run(cmd, capture_output=True, text=True,
                       timeout=30 * MULT)
    doc = None
    if json_out and r.stdout.strip():
        doc = json.loads(r.stdout)
    return r.returncode, doc, r.stdout, r.stderr


def fleet(s):
    return s.status()["fleet"]


class Watcher:
    """`memtally --json watch` in the background: one JSON event a line.

    Reads the pipe's fd directly into its own buffer: select() on a
    buffered file object misses lines already pulled into its buffer."""

    def __init__(self, s):
        self.proc = subprocess.Popen([CLI, "--socket", s.socket, "--json",
                                      "watch"], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.fd = self.proc.stdout.fileno()
        self.buf = b""
        self.events = []

    def _read(self, until):
        """Wait for bytes until `until` (monotonic), take every complete
        line; False at EOF."""
        left = max(0.0, until - time.monotonic())
        if select.select([self.fd], [], [], left)[0]:
            data = os.read(self.fd, 65536)
            if not data:
                return False
            self.buf += data
            *lines, self.buf = self.buf.split(b"\n")
            self.events += [json.loads(x) for x in lines]
        return True

    def wait(self, what, pred, timeout=20.0):
        """Wait until some event seen so far satisfies pred; return it."""
        end = deadline(timeout)
        while True:
            for ev in self.events:
                if pred(ev):
                    return ev
            if time.monotonic() > end:
                raise AssertionError(f"watch: timed out waiting for {what};"
                                     f" events: {self.events}")
            if not self._read(min(end, time.monotonic() + 0.1)):
                raise AssertionError(
                    f"watch exited ({self.proc.wait()}): "
                    f"{self.proc.stderr.read()}; events: {self.events}")

    def drain(self):
        """Take the events already written to us, without waiting."""
        while select.select([self.fd], [], [], 0)[0]:
            if not self._read(time.monotonic()):
                break

    def sync(self, s, name="watch-probe"):
        """Prove the subscription is live: make a group go over its limit
        and back, again and again, until the watcher reports it. Events
        before the subscription are lost, so one reported event means
        every later one will be."""
        w = Worker([*worker("level"), "4"], s.env(group=name))
        try:
            w.readline()
            wait_for("probe counted", lambda: s.ps().get(w.pid))
            end = deadline(20)
            while True:
                check(cli(s, "limit", "set", "group", name, "1MiB")[0] == 0,
                      "cannot set the probe's limit")
                try:
                    self.wait("probe event", lambda e: e["scope"] ==
                              f"group:{name}", timeout=0.5)
                    break
                except AssertionError:
                    if time.monotonic() > end:
                        raise
                check(cli(s, "limit", "set", "group", name, "none")[0] == 0,
                      "cannot clear the probe's limit")
        finally:
            w.close()
            cli(s, "limit", "set", "group", name, "none")
        # Only events after the probe matter to the caller.
        self.events.clear()

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait()
        return self.proc.returncode


def fleet_events(events):
    """Fleet transitions, without the snapshot a server may send at
    subscription (previous == state)."""
    return [(e["previous"], e["state"]) for e in events
            if e["scope"] == "fleet" and e["previous"] != e["state"]]


# ---- admission --------------------------------------------

def test_admit_release_and_ttl():
    """1 GiB fleet limit: 600 MiB admitted, another 600 MiB denied (exit 3)
    with its figures, release, admitted again; a TTL expires."""
    with Server("--fleet-limit", "1GiB") as s:
        # A consumer for the denial to name.
        hog = Worker([*worker("level"), "20"], s.env(group="hog"))
        hog.readline()
        wait_for("hog counted", lambda: fleet(s)["bytes"] >= 20 * MIB)
        rc, a, out, err = cli(s, "admit", "--bytes", "600MiB", "--group",
                              "etl")
        check(rc == 0, f"first admit: exit {rc}: {out}{err}")
        check(a["admitted"] is True and a["reservation"],
              f"first admit: {a}")
        print(f"  admitted: {json.dumps(a)}")
        wait_for("reservation counted",
                 lambda: fleet(s)["reserved"] == 600 * MIB)

        rc, d, out, err = cli(s, "admit", "--bytes", "600MiB")
        check(rc == 3, f"second admit: exit {rc}, want 3: {out}{err}")
        check(d["admitted"] is False, f"second admit: {d}")
        check(d["reason"], "a denial says why")
        check(d["limit"] == GIB, f"limit {d['limit']}")
        check(d["reserved"] == 600 * MIB, f"reserved {d['reserved']}")
        check(d["requested"] == 600 * MIB, f"requested {d}")
        check(d["fleet_bytes"] >= 20 * MIB, f"fleet_bytes {d}")
        check(d["top"] and d["top"][0]["pid"] == hog.pid and
              d["top"][0]["group"] == "hog", f"top consumers {d['top']}")
        print(f"  denied: {json.dumps(d)}")

        # The same denial for people: reason, figures, exit status 3.
        rc, _, out, _ = cli(s, "admit", "--bytes", "600MiB",
                            json_out=False)
        check(rc == 3 and out.startswith("denied: ") and
              "limit       1 GiB" in out and
              "requested   600 MiB" in out, f"human denial ({rc}):\n{out}")

        rc, r, out, err = cli(s, "release", a["reservation"])
        check(rc == 0 and r["released"] == a["reservation"] and
              r["bytes"] == 600 * MIB, f"release: {rc} {out}{err}")
        wait_for("reservation gone", lambda: fleet(s)["reserved"] == 0)
        rc, _, out, err = cli(s, "release", a["reservation"])
        check(rc == 1 and "not found" in err, f"release twice: {rc} {err}")

        rc, _, out, _ = cli(s, "admit", "--bytes", "600MiB", "--group",
                            "etl", json_out=False)
        check(rc == 0 and out.startswith("admitted: ") and
              "(600 MiB, group etl" in out, f"third admit ({rc}): {out}")
        rid = out.split()[1]
        check(cli(s, "release", rid)[0] == 0, "release the third")
        wait_for("released", lambda: fleet(s)["reserved"] == 0)

        # Long enough for a second CLI to see it on a loaded machine.
        ttl = max(2, round(3 * MULT))
        rc, t, out, err = cli(s, "admit", "--bytes", "100MiB", "--ttl",
                              str(ttl))
        check(rc == 0 and t["admitted"], f"ttl admit: {rc} {out}{err}")
        wait_for("ttl reservation counted",
                 lambda: fleet(s)["reserved"] == 100 * MIB, timeout=5)
        t0 = time.monotonic()
        wait_for("reservation expired at its TTL",
                 lambda: fleet(s)["reserved"] == 0, timeout=10 + ttl)
        print(f"  ttl={ttl} reservation gone after "
              f"{time.monotonic() - t0:.2f} s more")
        rc, _, _, err = cli(s, "release", t["reservation"])
        check(rc == 1, f"release after expiry: {rc} {err}")
        hog.close()


# ---- states, Watch, hysteresis ------------------------------

def test_states_seen_by_watch():
    """900 MiB of a 1 GiB fleet at an 80% watermark: high; 200 MiB more:
    over, both seen by a Watch subscriber; the worker dies: ok."""
    with Server("--fleet-limit", "1GiB", "--high-watermark", "80") as s:
        watch = Watcher(s)
        w = None
        try:
            watch.sync(s)
            w = Worker([*worker("hold"), "900"], s.env(group="big"))
            w.readline(BIG)
            wait_for("state high", lambda: fleet(s)["state"] == "high")
            watch.wait("fleet ok -> high", lambda e: e["scope"] == "fleet"
                       and e["state"] == "high")
            w.send("more 200")
            w.readline(BIG)
            wait_for("state over", lambda: fleet(s)["state"] == "over")
            ev = watch.wait("fleet high -> over", lambda e: e["scope"] ==
                            "fleet" and e["state"] == "over")
            check(ev["previous"] == "high" and ev["limit"] == GIB and
                  ev["bytes"] > GIB, f"over event {ev}")
            print(f"  over event: {json.dumps(ev)}")
            w.kill()
            w = None
            wait_for("state ok", lambda: fleet(s)["state"] == "ok")
            watch.wait("fleet back to ok", lambda e: e["scope"] == "fleet"
                       and e["state"] == "ok")
            print(f"  fleet events: {fleet_events(watch.events)}")
        finally:
            if w:
                w.kill()
            watch.close()


def test_a_new_watch_hears_what_is_not_ok():
    """A subscriber that starts (or reconnects, after a drop or a restart)
    while a group and a process are over their limits hears of both
    first, after the fleet's state, as the docs promise. It heard only the
    fleet's: a group that went over while it was away stayed unknown until
    its next change."""
    with Server() as s:
        w = Worker([*worker("hold"), "24"], s.env(group="g1"))
        watch = None
        try:
            w.readline()
            wait_for("counted", lambda: s.ps().get(w.pid, {}).get(
                "bytes", 0) >= 24 * MIB)
            for args in (("group", "g1", "8MiB"), ("pid", str(w.pid),
                                                   "8MiB")):
                check(cli(s, "limit", "set", *args)[0] == 0,
                      f"limit set {args}")
            wait_for("g1 over", lambda: next(
                (g for g in s.status()["groups"] if g["name"] == "g1"
                 and g["state"] == "over"), None))
            wait_for("the worker over", lambda: s.ps()[w.pid].get(
                "state") == "over")
            watch = Watcher(s)
            g = watch.wait("g1's current state",
                           lambda e: e["scope"] == "group:g1")
            p = watch.wait("the worker's current state",
                           lambda e: e["scope"] == f"pid:{w.pid}")
            f = watch.wait("the fleet's", lambda e: e["scope"] == "fleet")
            for ev in (g, p):
                check(ev["state"] == "over" and ev["previous"] == "over" and
                      ev["reason"] == "current state" and
                      ev["limit"] == 8 * MIB and ev["bytes"] >= 24 * MIB,
                      f"current state event {ev}")
            check(watch.events.index(f) == 0,
                  f"the fleet's first: {watch.events}")
            watch.drain()
            scopes = [e["scope"] for e in watch.events]
            check(len(scopes) == len(set(scopes)),
                  f"a scope told twice: {scopes}")
        finally:
            w.close()
            if watch:
                watch.close()


def test_oscillation_does_not_flap():
    """A level moved across the limit and back ten times (every level
    seen by the server) gives one transition into `over` and none out."""
    with Server("--fleet-limit", "1GiB", "--high-watermark", "80") as s:
        watch = Watcher(s)
        # The level is the heap's: jemalloc keeps what the worker frees
        # as dirty pages for its decay time, which would count too.
        w = Worker([*worker("level"), "1016"],
                   s.env(group="osc", MEMTALLY_ALLOCATOR_FREE="0"))
        try:
            w.readline(BIG)
            wait_for("high below the line", lambda: fleet(s)["state"] ==
                     "high")
            watch.sync(s)
            states = []
            for i in range(10):
                for level in (1032, 1016):  # 1 GiB = 1024 MiB
                    w.send(f"set {level}")
                    check(w.readline() == f"at {level}", "worker level")

                    def seen(level=level):
                        f = fleet(s)
                        b = f["bytes"]
                        return f if abs(b - level * MIB) <= 2 * MIB else None

                    states.append(wait_for(f"level {level} MiB seen",
                                           seen)["state"])
            watch.drain()
            evs = fleet_events(watch.events)
            print(f"  states seen: {states}")
            print(f"  fleet events: {evs}")
            into = [e for e in evs if e[1] == "over"]
            out_of = [e for e in evs if e[0] == "over"]
            check(len(into) == 1 and len(out_of) == 0,
                  f"want one transition into over, none out: {evs}")
            check(states[-1] == "over",
                  f"hysteresis keeps `over` just below the line: {states}")
        finally:
            w.close()
            watch.close()


# ---- a reservation and its task's workers -----------------

def test_task_counts_the_larger_not_the_sum():
    """600 MiB reserved for task T, a worker of T holding 400 MiB of it:
    the fleet counts 600, not 1000; past 600 it counts what is used; the
    reservation ends when the task's workers have exited."""
    with Server("--fleet-limit", "1GiB") as s:
        rc, a, out, err = cli(s, "admit", "--bytes", "600MiB", "--task",
                              "T-42")
        check(rc == 0, f"admit: {rc} {out}{err}")
        w = Worker([*worker("hold"), "400"],
                   s.env(group="tasks", MEMTALLY_TASK="T-42"))
        try:
            w.readline(BIG)

            def reconciled():
                f = fleet(s)
                ok = (f["bytes"] >= 400 * MIB and
                      abs(f["bytes"] + f["reserved"] - 600 * MIB) <= 2 * MIB)
                return f if ok else None

            f = wait_for("bytes + reserved = the larger (600 MiB)",
                         reconciled)
            print(f"  400 of 600 MiB used: bytes {f['bytes'] / MIB:.1f} "
                  f"MiB + reserved {f['reserved'] / MIB:.1f} MiB")
            # Admission sees the same: 600 + 400 fits 1 GiB; 1000 + 400
            # (the sum) would not.
            rc, b, out, err = cli(s, "admit", "--bytes", "400MiB")
            check(rc == 0 and b["admitted"],
                  f"400 MiB more must fit: {rc} {out}{err}")
            check(cli(s, "release", b["reservation"])[0] == 0, "release")

            w.send("more 300")
            w.readline()

            def used_over():
                f = fleet(s)
                return f if (f["bytes"] >= 700 * MIB and
                             f["reserved"] == 0) else None

            f = wait_for("past the reservation: only what is used",
                         used_over)
            print(f"  700 MiB used: reserved {f['reserved']}")
        finally:
            w.close()
        wait_for("the reservation ends with its workers",
                 lambda: (lambda st: st["processes"] == 0 and
                          st["fleet"]["reservations"] == 0)(s.status()))
        rc, _, _, err = cli(s, "release", a["reservation"])
        check(rc == 1, f"the reservation should be gone: {rc} {err}")


# ---- who may change limits ----------------------------------

def test_unprivileged_may_query_not_set_limits():
    with Server() as s:
        # Let nobody reach the socket (the harness's directory is 0700).
        os.chmod(s.dir, 0o755)
        os.chmod(s.socket, 0o666)
        rc, st, out, err = cli(s, "status", as_nobody=True)
        check(rc == 0 and st["fleet"]["limit"] is None,
              f"nobody: status: {rc} {out}{err}")
        check(cli(s, "ps", as_nobody=True)[0] == 0, "nobody: ps")
        rc, a, out, err = cli(s, "admit", "--bytes", "1MiB",
                              as_nobody=True)
        check(rc == 0 and a["admitted"], f"nobody: admit: {rc} {out}{err}")

        rc, _, out, err = cli(s, "limit", "set", "fleet", "1GiB",
                              as_nobody=True)
        check(rc == 1, f"nobody: limit set: exit {rc}: {out}{err}")
        check("permission denied" in err.lower(),
              f"the error must say permission: {err}")
        print(f"  nobody: {err.strip()}")
        check(s.status()["fleet"]["limit"] is None, "limit changed anyway")

        # Another's reservation: only an authorised peer may release it.
        rc, r, _, _ = cli(s, "admit", "--bytes", "1MiB")
        rc, _, _, err = cli(s, "release", r["reservation"], as_nobody=True)
        check(rc == 1 and "permission denied" in err.lower(),
              f"nobody released root's reservation: {rc} {err}")
        rc, _, _, err = cli(s, "release", a["reservation"], as_nobody=True)
        check(rc == 0, f"nobody: release its own: {rc} {err}")

        rc, ls, out, err = cli(s, "limit", "set", "fleet", "1GiB")
        check(rc == 0 and ls["limit"] == GIB and ls["previous"] is None,
              f"root: limit set: {rc} {out}{err}")
        check(s.status()["fleet"]["limit"] == GIB, "limit not applied")
        rc, _, out, _ = cli(s, "limit", "set", "fleet", "none",
                            json_out=False)
        check(rc == 0 and out.strip() == "fleet limit: none (was 1 GiB)",
              f"root: clear: {rc} {out}")


# ---- SIGHUP applies a changed limit -------------------

def test_sighup_reloads_the_fleet_limit():
    cfgdir = tempfile.mkdtemp(prefix="mt-it-cfg-")
    cfg = os.path.join(cfgdir, "memtallyd.conf")

    def write(limit, extra=""):
        with open(cfg + ".new", "w") as f:
            f.write(f"[limits]\nfleet = {limit}\nhigh_watermark = 80\n"
                    + extra)
        os.replace(cfg + ".new", cfg)

    write("1GiB")
    with Server("--config", cfg) as s:
        check(fleet(s)["limit"] == GIB, f"from the file: {fleet(s)}")
        write("1.5G")
        signal_until(s.proc, signal.SIGHUP, "the new limit",
                     lambda: fleet(s)["limit"] == 3 * GIB // 2)
        # A bad value is refused with the old config kept.
        write("lots")
        signal_until(s.proc, signal.SIGHUP, "the rejection logged",
                     lambda: "lots" in s.logtext(), timeout=10)
        check(fleet(s)["limit"] == 3 * GIB // 2, "bad reload applied")
        # So is a guard line below what memtallyd needs, its whole reason
        # in the log: the figures to the node's limit (a quoted field's
        # usual bound cut it at "of a").
        write("1.5G", "[guard]\nenabled = true\ncgroup = none\n"
              "line = 1MiB\n")
        signal_until(s.proc, signal.SIGHUP, "the guard's rejection logged",
                     lambda: "is below what memtallyd needs" in s.logtext(),
                     timeout=10)
        why = [x for x in s.logtext().splitlines()
               if "is below what memtallyd needs" in x][-1]
        check("of a node limited to" in why and "max_buffered" in why,
              f"the rejection's reason is cut short: {why}")
        check(s.status().get("node") in (None, {}) or
              not s.status()["node"].get("line"),
              f"the rejected guard applied: {s.status().get('node')}")
        check(s.proc.poll() is None, "a bad reload stopped the server")


# ---- TCP: queries open, limits need the token ------------------------------

def test_tcp_needs_the_token_for_limits():
    # A loopback peer is its uid (the server asks the kernel): root would
    # be an admin, so the CLI runs as nobody, whom only the token lets in.
    if os.geteuid() != 0:
        raise Skip("needs root to run the CLI as nobody")
    cli = world_readable_copy(CLI)[0]

    as_nobody = as_user((NOBODY_UID, NOGROUP))

    token = "test-token-0123456789"
    cfgdir = tempfile.mkdtemp(prefix="mt-it-cfg-")
    cfg = os.path.join(cfgdir, "memtallyd.conf")
    with open(os.open(cfg, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(f"[server]\ntcp_token = {token}\n")
    # Port 0: the server picks one and logs it.
    with Server("--config", cfg, "--tcp", "127.0.0.1:0") as s:
        port = wait_for("the TCP port in the log", lambda: next(
            (int(w[5:]) for line in s.logtext().splitlines()
             if "tcp listening" in line for w in line.split()
             if w.startswith("port=")), None))
        env = {k: v for k, v in os.environ.items() if k != "MEMTALLY_TOKEN"}

        def tcp(*args, token_env=None):
            e = dict(env, MEMTALLY_TOKEN=token_env) if token_env else env
            r = subprocess.run([cli, "--tcp", f"127.0.0.1:{port}", "--json",
                                *args], capture_output=True, text=True,
                               env=e, timeout=30 * MULT, cwd="/",
                               preexec_fn=as_nobody)
            return r.returncode, r.stdout, r.stderr

        rc, out, err = tcp("status")
        check(rc == 0 and json.loads(out)["fleet"]["limit"] is None,
              f"status over TCP: {rc} {out}{err}")
        rc, out, err = tcp("admit", "--bytes", "1MiB")
        check(rc == 0 and json.loads(out)["admitted"],
              f"admit over TCP: {rc} {out}{err}")
        rc, out, err = tcp("limit", "set", "fleet", "1GiB")
        check(rc == 1 and "permission denied" in err.lower(),
              f"no token: {rc} {err}")
        rc, out, err = tcp("limit", "set", "fleet", "1GiB",
                           token_env="not-the-token-at-all")
        check(rc == 1 and "permission denied" in err.lower(),
              f"wrong token: {rc} {err}")
        rc, out, err = tcp("limit", "set", "fleet", "1GiB", token_env=token)
        check(rc == 0 and json.loads(out)["limit"] == GIB,
              f"MEMTALLY_TOKEN: {rc} {out}{err}")
        rc, out, err = tcp("limit", "set", "fleet", "2GiB", token_env=token)
        check(rc == 0 and json.loads(out)["previous"] == GIB,
              f"MEMTALLY_TOKEN: {rc} {out}{err}")
        check(fleet(s)["limit"] == 2 * GIB, "limit over TCP not applied")


def test_a_pids_limit_removed_says_the_default_in_force():
    """`limit set pid P none` removes P's own limit; the default
    per-process limit applies to it again, and the CLI says so with the
    figure memtallyd answers. It printed "none" while 64 MiB stayed in
    force, and P could still be flagged and signalled."""
    with Server("--config", config_file_text("[limits]\nprocess = 64MiB\n")
                ) as s:
        w = Worker([*worker("hold"), "4"], s.env(group="own"))
        try:
            w.readline()
            wait_for("counted", lambda: s.ps().get(w.pid))
            rc, doc, out, err = cli(s, "limit", "set", "pid", str(w.pid),
                                    "10MiB")
            check(rc == 0 and doc["limit"] == 10 * MIB and
                  doc["previous"] == 64 * MIB and not doc["default"],
                  f"set 10MiB: {rc} {out}{err}")
            rc, doc, out, err = cli(s, "limit", "set", "pid", str(w.pid),
                                    "none")
            check(rc == 0 and doc["limit"] == 64 * MIB and doc["default"]
                  and doc["previous"] == 10 * MIB,
                  f"set none: {rc} {out}{err}")
            check(s.ps()[w.pid]["limit"] == 64 * MIB,
                  f"in force: {s.ps()[w.pid]}")
            rc, _, out, err = cli(s, "limit", "set", "pid", str(w.pid),
                                  "none", json_out=False)
            check(rc == 0 and "limit: 64 MiB, the default per-process "
                  "limit (was 64 MiB)" in out, f"text: {out!r}{err}")
        finally:
            w.close()


def test_enforcement_waits_in_the_hysteresis_band_and_says_why():
    """The fleet went over, then its limit was raised above the figure but
    not past the hysteresis: its state stays over. Enforcement signals
    only above the limit, so nothing is signalled, and the log says why.
    It blamed untrusted uids' allowances, which were none here."""
    conf = config_file_text("[enforce]\nsignal = SIGCONT\ngrace = 2000\n")
    with Server("--config", conf) as s:
        w = Worker([*worker("hold"), "20"],
                   s.env(group="band", MEMTALLY_ALLOCATOR_FREE="0"))
        try:
            w.readline()
            wait_for("counted", lambda: s.ps().get(w.pid, {}).get(
                "bytes", 0) >= 20 * MIB)
            for args in (("pid", str(w.pid), "10MiB"), ("fleet", "16MiB"),
                         ("fleet", "21MiB")):
                check(cli(s, "limit", "set", *args)[0] == 0,
                      f"limit set {args}")
            check(fleet(s)["state"] == "over",
                  f"fleet not over in the band: {fleet(s)}")
            log = wait_for("enforcement's word", lambda: (
                lambda t: t if "past the grace period" in t else None)(
                    s.logtext()), timeout=30)
            check("back under its limit (over until below its lower mark)"
                  in log and "untouched allowances" not in log,
                  "the log does not say the fleet is in its band: " +
                  "\n".join(x for x in log.splitlines() if "enforce" in x))
            check("signal sent" not in log, "signalled in the band")
            check(fleet(s)["state"] == "over", "left the band meanwhile")
        finally:
            w.close()


# ---- the worker's over-limit callback -------------------------------------

def until(w, line, lines):
    """Read the worker's lines into `lines` up to and including `line`."""
    while True:
        lines.append(w.readline())
        if lines[-1] == line:
            return lines


def test_over_limit_callback_runs_in_the_worker():
    """A per-process limit: the server flags the worker, and the worker's
    memtally_on_over_limit() callback runs at its next flush, once per
    episode; a second episode calls it again."""
    with Server() as s:
        w = Worker([*worker("level"), "10"],
                   s.env(group="spill", MT_LEVEL_CALLBACK="1"))
        try:
            check(w.readline().startswith("ready"), "worker not ready")
            wait_for("worker counted", lambda: s.ps().get(w.pid))
            rc, _, out, err = cli(s, "limit", "set", "pid", str(w.pid),
                                  "64MiB")
            check(rc == 0, f"limit set pid: {rc} {out}{err}")
            lines = []
            for episode in (1, 2):
                w.send("set 100")
                until(w, "at 100", lines)
                wait_for("flagged over", lambda: s.ps()[w.pid]["over_limit"])
                # The flag is seen at the worker's next flush (a 1 MiB
                # block is flushed at once), and only once per episode.
                for level in (101, 102, 103):
                    w.send(f"set {level}")
                    until(w, f"at {level}", lines)
                calls = [x for x in lines if x.startswith("over-limit")]
                check(calls == [f"over-limit {k}" for k in
                                range(1, episode + 1)],
                      f"episode {episode}: {lines}")
                # Back below the lower mark: the flag clears; a flush
                # sees that and re-arms the callback.
                w.send("set 8")
                until(w, "at 8", lines)
                wait_for("flag cleared",
                         lambda: not s.ps()[w.pid]["over_limit"])
                w.send("set 9")
                until(w, "at 9", lines)
            print(f"  worker said: {[x for x in lines if 'over' in x]}")
        finally:
            w.close()


GLIBC_LIB = os.path.join(os.path.dirname(PRELOAD), "libmemtally_glibc.so")


def test_over_limit_seen_by_large_blocks_at_once():
    """A worker churning 64 KiB blocks (every call a flush past the
    threshold, published quietly while the server has not ticked) sees
    the server's over-limit flag at its first call after the flag rose:
    the callback has run before the first malloc+free pair completes,
    under both front ends."""
    for lib in (PRELOAD, GLIBC_LIB):
        with Server() as s:
            w = Worker([*worker("level"), "10"],
                       s.env(MT_LEVEL_CALLBACK="1", LD_PRELOAD=lib))
            try:
                check(w.readline().startswith("ready"), "worker not ready")
                wait_for("worker counted", lambda: s.ps().get(w.pid))
                rc, _, out, err = cli(s, "limit", "set", "pid", str(w.pid),
                                      "64MiB")
                check(rc == 0, f"limit set pid: {rc} {out}{err}")
                lines = []
                w.send("set 100")
                until(w, "at 100", lines)
                wait_for("flagged over", lambda: s.ps()[w.pid]["over_limit"])
                w.send("churn")
                while not lines[-1].startswith("churned"):
                    lines.append(w.readline())
                pairs = int(lines[-1].split()[1])
                calls = [x for x in lines if x.startswith("over-limit")]
                check(calls == ["over-limit 1"] and pairs == 0,
                      f"{os.path.basename(lib)}: callback after {pairs} "
                      f"pairs of 64 KiB: {lines}")
                print(f"  {os.path.basename(lib)}: callback after {pairs} "
                      "pairs")
            finally:
                w.close()


if __name__ == "__main__":
    run([test_admit_release_and_ttl, test_states_seen_by_watch,
         test_a_new_watch_hears_what_is_not_ok,
         test_oscillation_does_not_flap,
         test_task_counts_the_larger_not_the_sum,
         test_unprivileged_may_query_not_set_limits,
         test_sighup_reloads_the_fleet_limit,
         test_tcp_needs_the_token_for_limits,
         test_a_pids_limit_removed_says_the_default_in_force,
         test_enforcement_waits_in_the_hysteresis_band_and_says_why,
         test_over_limit_callback_runs_in_the_worker,
         test_over_limit_seen_by_large_blocks_at_once])
