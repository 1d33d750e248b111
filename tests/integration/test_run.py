"""`memtally run`: a real memtallyd, the real CLI, real commands.

- a denied admission never starts the command (a marker file it would
  create is never there), exit status 3, nothing reserved;
- the command's exit status passes through, and a signal that ends it
  comes back as 128 + N;
- a signal sent to `memtally run` reaches the command (USR1, ALRM, IO,
  RTMIN+1 handled, TERM ending it with its own status), and SIGINT ends
  a plain command and
  then `memtally run` itself, of SIGINT (a shell's loop stops on it);
- --wait waits (the command not started) and runs the command once
  another task's memory is freed; without room it gives up at the
  deadline, exit 3;
- the command runs under the preload as the reservation's task and group:
  its worker registers with them and the reservation counts only what the
  worker does not use yet; the reservation is released at the end;
- under a reservation a scheduler holds (--reservation ID --task T): an id
  memtallyd does not hold is not run on (3), one of another task is a
  usage error (2); no
  Admit of its own, the worker takes ID over, ID ends with the command;
- a SIGKILLed `memtally run`: its command dies with it, and the
  reservation is gone after its TTL (not before); one its worker had taken
  over is gone as soon as the worker is;
- no server: the command runs anyway, with identical stdout and exit
  status, after exactly one line on stderr;
- memtallyd restarted while a run waits for room: the run keeps asking,
  the command does not start while the restarted server has no room, and
  starts once it has;
- memtallyd stalled (SIGSTOP) while a run waits for room, each ask timing
  out: a SIGINT still ends the wait at once; and once it goes on, the asks
  it missed make one grant, not one each;
- started with its standard descriptors closed, `memtally run` writes
  nothing of its own into its connection to memtallyd;
- as a PID namespace's first process (a container's command), it reaps
  the orphans that become its children.
"""
import os
import signal
import subprocess
import tempfile
import time

from harness import (CLI, MIB, MULT, NOBODY, NOGROUP, Server, Skip, Worker,
                     check, open_to_nobody, run, wait_for, worker,
                     world_readable_copy)
from harness import config_file as config

# Holders whose frees leave the process at once: jemalloc purges freed
# pages without its 10 s decay, so what they free leaves RssAnon, and
# memtally's figure with it (which counts jemalloc's dirty pages).
GIVES_BACK = {"MALLOC_CONF": "dirty_decay_ms:0,muzzy_decay_ms:0"}


def run_env(**extra):
    """The environment of `memtally run` itself: no preload of its own
    (it adds it for the command), no task or group from outside."""
    e = dict(os.environ)
    for k in ("LD_PRELOAD", "MEMTALLY_TASK", "MEMTALLY_GROUP",
              "MEMTALLY_SOCKET"):
        e.pop(k, None)
    e.update(extra)
    return e


def mt_run(s_or_sock, *args, **kw):
    sock = s_or_sock if isinstance(s_or_sock, str) else s_or_sock.socket
    return [CLI, "--socket", sock, "run", *args]


def fleet(s):
    return s.status()["fleet"]


def limited(limit="100MiB"):
    return Server("--config", config(f"[limits]\nfleet = {limit}\n"))


def test_denied_never_starts():
    d = tempfile.mkdtemp(prefix="mt-run-")
    marker = os.path.join(d, "started")
    with limited() as s:
        r = subprocess.run(mt_run(s, "--bytes", "200MiB", "--",
                                  "sh", "-c", f"touch {marker}"),
                           env=run_env(), capture_output=True,
                           timeout=30 * MULT)
        err = r.stderr.decode()
        check(r.returncode == 3, f"exit {r.returncode}: {err}")
        check(not os.path.exists(marker), "the command was started")
        check(r.stdout == b"", f"stdout: {r.stdout!r}")
        check("denied" in err and "fleet" in err and "200" in err,
              f"no reason on stderr: {err!r}")
        f = fleet(s)
        check(f["reserved"] == 0 and f["reservations"] == 0,
              f"a denial left a reservation: {f}")
        # More than the fleet limit (100 MiB) can never fit, however
        # long it waits: --wait 60 does not wait.
        t0 = time.monotonic()
        r = subprocess.run(mt_run(s, "--bytes", "200MiB", "--wait", "60",
                                  "--", "sh", "-c", f"touch {marker}"),
                           env=run_env(), capture_output=True,
                           timeout=90 * MULT)
        took = time.monotonic() - t0
        check(r.returncode == 3 and took < 30,
              f"exit {r.returncode} after {took:.1f} s: {r.stderr!r}")
        check(b"denied, not run" in r.stderr, f"stderr {r.stderr!r}")
        check(not os.path.exists(marker), "the command was started")


def test_exit_status_and_signal_pass_through():
    with limited() as s:
        for args, want in ((["sh", "-c", "exit 7"], 7),
                           (["sh", "-c", "exit 0"], 0),
                           (["sh", "-c", "kill -KILL $$"], 128 + 9),
                           (["sh", "-c", "kill -SEGV $$"], 128 + 11),
                           (["/nonexistent/cmd"], 127)):
            r = subprocess.run(mt_run(s, "--bytes", "10MiB", "--", *args),
                               env=run_env(), capture_output=True,
                               timeout=30 * MULT)
            check(r.returncode == want,
                  f"{args}: exit {r.returncode}, want {want}: "
                  f"{r.stderr.decode()}")
            f = fleet(s)
            check(f["reservations"] == 0 and f["reserved"] == 0,
                  f"{args}: reservation not released: {f}")
        # Without --bytes nothing is asked: still the same status.
        r = subprocess.run(mt_run(s, "--", "sh", "-c", "exit 42"),
                           env=run_env(), timeout=30 * MULT)
        check(r.returncode == 42, f"no --bytes: exit {r.returncode}")


def test_signals_reach_the_command():
    d = tempfile.mkdtemp(prefix="mt-run-")
    log = os.path.join(d, "log")
    script = (f"trap 'echo usr1 >> {log}' USR1; "
              f"trap 'echo alrm >> {log}' ALRM; "
              f"trap 'echo io >> {log}' {int(signal.SIGIO)}; "
              f"trap 'echo rt >> {log}' {int(signal.SIGRTMIN) + 1}; "
              f"trap 'echo term >> {log}; exit 42' TERM; "
              f"echo ready >> {log}; "
              "while :; do sleep 0.05; done")
    with limited() as s:
        # Its own session: the signals come from outside its group, as
        # from a job runner (the terminal's own case is not forwarded).
        p = subprocess.Popen(mt_run(s, "--bytes", "10MiB", "--",
                                    "sh", "-c", script),
                             env=run_env(), start_new_session=True)
        try:
            signals_to(p, log)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        # A command that does not handle the signal: 128 + SIGINT.
        p = subprocess.Popen(mt_run(s, "--", "sleep", "600"), env=run_env(),
                             start_new_session=True)
        try:
            wait_for("sleep running", lambda: any(
                open(f"/proc/{c}/comm").read().strip() == "sleep"
                for c in children(p.pid)))
            p.send_signal(signal.SIGINT)
            rc = p.wait(timeout=20 * MULT)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        # It dies of the same signal: a shell running it in a loop
        # stops on ^C, as it would for the command itself.
        check(rc == -signal.SIGINT,
              f"INT: {rc}, want death by SIGINT ({-signal.SIGINT})")


def words_of(log):
    """The words the command wrote to `log` so far."""
    try:
        with open(log) as f:
            return f.read().split()
    except FileNotFoundError:
        return []


def signals_to(p, log):
    """USR1 handled by the command, then TERM ending it with its status."""

    def lines():
        return words_of(log)
    wait_for("command started", lambda: "ready" in lines())
    p.send_signal(signal.SIGUSR1)
    wait_for("USR1 handled", lambda: "usr1" in lines())
    check(p.poll() is None, "USR1 ended memtally run")
    # ALRM too (timeout -s ALRM): it ended memtally run, not the command.
    p.send_signal(signal.SIGALRM)
    wait_for("ALRM handled", lambda: "alrm" in lines())
    check(p.poll() is None, "ALRM ended memtally run")
    # IO and the real-time ones too (kill -s IO, scancel -s RTMIN+1):
    # they ended memtally run, the command with SIGKILL.
    p.send_signal(signal.SIGIO)
    wait_for("IO handled", lambda: "io" in lines())
    p.send_signal(signal.SIGRTMIN + 1)
    wait_for("RTMIN+1 handled", lambda: "rt" in lines())
    check(p.poll() is None, "IO or RTMIN+1 ended memtally run")
    p.send_signal(signal.SIGTERM)
    rc = p.wait(timeout=20 * MULT)
    check(rc == 42, f"TERM: exit {rc}, want the command's 42")
    check(lines() == ["ready", "usr1", "alrm", "io", "rt", "term"],
          f"log {lines()}")


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


def not_started(p, marker, secs, why):
    """For `secs`, `memtally run` (p) waits and its command (which would
    create `marker`) has not started."""
    end = time.monotonic() + secs
    while time.monotonic() < end:
        check(p.poll() is None and not os.path.exists(marker), why)
        time.sleep(0.05)


def test_wait_then_runs_when_room_appears():
    d = tempfile.mkdtemp(prefix="mt-run-")
    marker = os.path.join(d, "started")
    with limited() as s:
        holder = Worker([*worker("hold"), "80"],
                        s.env(group="other", **GIVES_BACK))
        check(holder.readline().startswith("ready"), "holder not ready")
        wait_for("80 MiB counted", lambda: fleet(s)["bytes"] >= 80 * MIB)
        # No room, short deadline: gives up, never starts.
        t0 = time.monotonic()
        r = subprocess.run(mt_run(s, "--bytes", "50MiB", "--wait", "1",
                                  "--", "touch", marker),
                           env=run_env(), capture_output=True,
                           timeout=30 * MULT)
        took = time.monotonic() - t0
        check(r.returncode == 3 and not os.path.exists(marker),
              f"no room: exit {r.returncode}: {r.stderr.decode()}")
        check(took >= 1.0, f"gave up after {took:.2f} s, before --wait 1")
        check(b"no room in time" in r.stderr, f"stderr {r.stderr!r}")

        # ^C while it waits: it dies of SIGINT, as the command would
        # have (a shell's loop stops), and the command never starts.
        p = subprocess.Popen(mt_run(s, "--bytes", "50MiB", "--wait", "60",
                                    "--", "touch", marker),
                             env=run_env(), stderr=subprocess.PIPE)
        line = p.stderr.readline().decode()
        check("waiting up to 60 s for room" in line, f"stderr {line!r}")
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=30 * MULT)
        check(rc == -signal.SIGINT and not os.path.exists(marker),
              f"INT while waiting: {rc}, want death by SIGINT")
        p.stderr.close()

        # Started as nohup and a shell's `&` start it (SIGHUP and SIGINT
        # ignored): those signals while it waits end nothing.
        def ignore_hup_int():
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        p = subprocess.Popen(mt_run(s, "--bytes", "50MiB", "--wait", "60",
                                    "--", "touch", marker),
                             env=run_env(), stderr=subprocess.PIPE,
                             preexec_fn=ignore_hup_int)
        line = p.stderr.readline().decode()
        check("waiting up to 60 s for room" in line, f"stderr {line!r}")
        p.send_signal(signal.SIGHUP)
        p.send_signal(signal.SIGINT)
        # It waits: still running, the command not started.
        not_started(p, marker, 1.0, "started without room")
        holder.send("free")
        check(holder.readline() == "freed", "holder did not free")
        t_free = time.monotonic()
        rc = p.wait(timeout=30 * MULT)
        took = time.monotonic() - t_free
        check(rc == 0 and os.path.exists(marker),
              f"after room: exit {rc}, started {os.path.exists(marker)}")
        print(f"  started {took:.2f} s after the other task freed its "
              f"memory")
        check(took < 10 * MULT, f"took {took:.1f} s after room appeared")
        holder.close()


def test_a_restart_does_not_start_the_waiters():
    d = tempfile.mkdtemp(prefix="mt-run-")
    marker = os.path.join(d, "started")
    conf = config("[limits]\nfleet = 100MiB\n")
    first = Server("--config", conf)
    second = holder = p = None
    try:
        holder = Worker([*worker("hold"), "80"],
                        first.env(group="other", **GIVES_BACK))
        check(holder.readline().startswith("ready"), "holder not ready")
        wait_for("80 MiB counted", lambda: fleet(first)["bytes"] >= 80 * MIB)
        p = subprocess.Popen(mt_run(first, "--bytes", "50MiB", "--wait",
                                    "60", "--", "touch", marker),
                             env=run_env(), stderr=subprocess.PIPE)
        line = p.stderr.readline().decode()
        check("waiting up to 60 s for room" in line, f"stderr {line!r}")
        # A restart: SIGTERM, a second's gap (systemd's RestartSec=1s),
        # the next memtallyd on the same record. The run must not take
        # the gap for a missing server and start unadmitted.
        first.stop()
        time.sleep(1.0)
        check(p.poll() is None and not os.path.exists(marker),
              "started while memtallyd restarted")
        second = Server("--config", conf, after=first)
        wait_for("the holder's 80 MiB adopted",
                 lambda: fleet(second)["bytes"] >= 80 * MIB)
        not_started(p, marker, 1.5, "started without room after the restart")
        holder.send("free")
        check(holder.readline() == "freed", "holder did not free")
        rc = p.wait(timeout=30 * MULT)
        err = p.stderr.read().decode()
        check(rc == 0 and os.path.exists(marker),
              f"after room: exit {rc}, started {os.path.exists(marker)}: "
              f"{err}")
        check("stopped answering" in err and "without admission" not in err,
              f"stderr {err!r}")
        print("  waited through the restart, started once room appeared")
    finally:
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()
        if holder is not None:
            holder.close()
        for s in (second, first):
            if s is not None:
                s.stop()


def test_poll_bounds_the_wait_without_a_state_change():
    """Room that appears with no state change (the fleet stays ok) is
    found within --poll, not the default 2 s ceiling of the retries."""
    d = tempfile.mkdtemp(prefix="mt-run-")
    marker = os.path.join(d, "started")
    with limited() as s:
        a = Worker([*worker("hold"), "50"],
                   s.env(group="other", **GIVES_BACK))
        b = Worker([*worker("hold"), "30"],
                   s.env(group="other", **GIVES_BACK))
        check(a.readline().startswith("ready") and
              b.readline().startswith("ready"), "holders not ready")
        wait_for("80 MiB counted", lambda: fleet(s)["bytes"] >= 80 * MIB)
        check(fleet(s)["state"] == "ok", "80 of 100 MiB should be ok")
        r = subprocess.run(mt_run(s, "--bytes", "50MiB", "--poll", "0.25",
                                  "--", "true"),
                           env=run_env(), capture_output=True)
        check(r.returncode == 2 and b"--poll applies to --wait" in r.stderr,
              f"--poll without --wait: {r.returncode} {r.stderr!r}")
        # 80 + 35 > 100: denied; 50 + 35 stays under the 90% watermark,
        # so room appears with no state change and no Watch event.
        p = subprocess.Popen(mt_run(s, "--bytes", "35MiB", "--wait", "60",
                                    "--poll", "0.25", "--", "touch", marker),
                             env=run_env(), stderr=subprocess.PIPE)
        line = p.stderr.readline().decode()
        check("waiting up to 60 s for room" in line, f"stderr {line!r}")
        # Long enough for the default retries to reach their 2 s ceiling.
        end = time.monotonic() + 4.0
        while time.monotonic() < end:
            check(p.poll() is None, "started without room")
            time.sleep(0.05)
        b.send("free")
        check(b.readline() == "freed", "holder did not free")
        # Room appears when memtallyd's figure drops, which follows the
        # free by up to the allocator's next sample (a second or two on a
        # loaded machine, more under a sanitizer): time the poll from
        # there, not from the free.
        t_free = time.monotonic()
        end = t_free + 30 * MULT
        while fleet(s)["bytes"] > 55 * MIB and p.poll() is None:
            check(time.monotonic() < end, "the free never reached the figure")
            time.sleep(0.02)
        t_room = time.monotonic()
        rc = p.wait(timeout=30 * MULT)
        took = time.monotonic() - t_room
        check(rc == 0 and os.path.exists(marker), f"exit {rc}")
        print(f"  figure fell {t_room - t_free:.2f} s after the free; "
              f"started {took:.2f} s after (--poll 0.25)")
        # Well under the 2 s a retry's back-off would take, with room for
        # the fork, the exec and the wait on a loaded machine.
        check(took < 1.5 * MULT, f"took {took:.2f} s with --poll 0.25")
        a.close()
        b.close()


def test_command_is_the_reservations_task():
    with limited("1GiB") as s:
        argv = mt_run(s, "--bytes", "64MiB", "--task", "job-7", "--group",
                      "etl", "--", *worker("hold"), "20")
        # MEMTALLY_PRELOAD_LIB unset: the preload is found next to the CLI.
        env = run_env()
        env.pop("MEMTALLY_PRELOAD_LIB", None)
        w = Worker(argv, env)
        first = w.readline()
        check(first.startswith("ready pid="), f"worker said {first!r}")
        pid = int(first.split("=")[1])
        p = wait_for("worker registered", lambda: s.ps().get(pid))
        check(p["group"] == "etl" and p.get("task") == "job-7",
              f"registered as {p}")
        # Reconciled: the reservation counts what the worker has not used.
        # Fleet and group from one answer: between two queries the
        # worker's start-up allocations may still move the figure.
        st = wait_for("reconciled", lambda: (
            lambda st: st if st["fleet"]["reservations"] == 1 and
            st["fleet"]["reserved"] <= 45 * MIB else None)(s.status()))
        f = st["fleet"]
        check(f["reserved"] >= 40 * MIB,
              f"reserved {f['reserved'] / MIB:.1f} MiB, want 64 - ~20")
        grp = next(g for g in st["groups"] if g["name"] == "etl")
        check(grp["reserved"] == f["reserved"], f"group {grp}")
        check(w.close() == 0, "exit status")
        f = wait_for("released", lambda: (
            lambda f: f if f["reservations"] == 0 else None)(fleet(s)))
        check(f["reserved"] == 0, f"reserved left: {f}")


def test_runs_under_a_reservation_a_scheduler_holds():
    """A scheduler admits the task itself (to move on to another when
    denied) and starts it with --reservation: no second Admit, the
    command's worker takes that reservation over, it ends with the
    command."""
    with limited("1GiB") as s:
        a = s.cli("admit", "--bytes", "64MiB", "--task", "sched-1",
                  "--ttl", "600")
        check(a["admitted"], f"admit: {a}")
        rid = a["reservation"]
        f = fleet(s)
        check(f["reservations"] == 1 and f["reserved"] == 64 * MIB,
              f"admitted: {f}")
        w = Worker(mt_run(s, "--reservation", rid, "--task", "sched-1",
                          "--kind", "sched", "--retry", "1", "--",
                          *worker("hold"), "20"), run_env())
        first = w.readline()
        check(first.startswith("ready pid="), f"worker said {first!r}")
        pid = int(first.split("=")[1])
        p = wait_for("worker registered", lambda: s.ps().get(pid))
        check(p.get("task") == "sched-1", f"registered as {p}")
        # Taken over, and still the one reservation: run asked for none.
        st = wait_for("reconciled", lambda: (
            lambda f: f if f["reserved"] <= 45 * MIB else None)(fleet(s)))
        check(st["reservations"] == 1 and st["reserved"] >= 40 * MIB,
              f"reservations {st}")
        check(w.close() == 0, "exit status")
        f = wait_for("released", lambda: (
            lambda f: f if f["reservations"] == 0 else None)(fleet(s)))
        check(f["reserved"] == 0, f"reserved left: {f}")
        # An id given without its task, or a rerun it could not admit,
        # is a usage error: nothing runs.
        # A rerun with nothing to be admitted on (no --bytes, no --kind)
        # would start again at once where it was just evicted.
        for bad, says in (
                (["--reservation", rid], b"--reservation"),
                (["--reservation", rid, "--task", "t", "--retry", "1"],
                 b"--retry needs --bytes or --kind"),
                (["--retry", "1"], b"--retry needs --bytes or --kind"),
                (["--reservation", "", "--task", "t"], b"--reservation")):
            r = subprocess.run(mt_run(s, *bad, "--", "true"), env=run_env(),
                               capture_output=True, timeout=30 * MULT)
            check(r.returncode == 2 and says in r.stderr,
                  f"{bad}: exit {r.returncode}, {r.stderr!r}")
        # An id memtallyd does not hold (stale, mistyped) is not run on:
        # the command would hold memory no one set aside (exit 3, as a
        # denial). One held for another task is a usage error (its
        # workers would never take it over, and its Release at the end
        # would free that task's room), and stays held.
        b = s.cli("admit", "--bytes", "8MiB", "--task", "sched-2",
                  "--ttl", "600")
        d = tempfile.mkdtemp(prefix="mt-run-")
        ran = os.path.join(d, "ran")
        for rid2, task, rc, says in (
                ("r-0123456789abcdef", "sched-2", 3,
                 b"holds no reservation r-0123456789abcdef"),
                (b["reservation"], "other", 2,
                 b'was granted for task "sched-2", not "other"')):
            r = subprocess.run(mt_run(s, "--reservation", rid2, "--task",
                                      task, "--", "touch", ran),
                               env=run_env(), capture_output=True,
                               timeout=30 * MULT)
            check(r.returncode == rc and says in r.stderr,
                  f"{rid2} {task}: exit {r.returncode}, {r.stderr!r}")
            check(not os.path.exists(ran), f"{rid2} {task}: it ran")
        f = fleet(s)
        check(f["reservations"] == 1 and f["reserved"] == 8 * MIB,
              f"sched-2's reservation is not held as it was: {f}")


def test_another_users_reservation_is_not_run_under():
    """nobody runs `memtally run --reservation ID` with root's ID. memtallyd
    will not show nobody another user's reservation, and run took that
    refusal for "cannot say": the command ran, its workers could not take
    the reservation over, and they were counted beside it, twice. It is a
    usage error now (exit 2), and nothing runs."""
    from harness import NOBODY, NOGROUP, open_to_nobody, world_readable_copy
    cli = world_readable_copy(CLI)[0]
    with Server("--config", config("[server]\ngroup = nogroup\n")) as s:
        open_to_nobody(s)
        a = s.cli("admit", "--bytes", "50MiB", "--task", "tS", "--ttl", "600")
        check(a["admitted"], f"admit: {a}")
        d = tempfile.mkdtemp(prefix="mt-run-")
        os.chmod(d, 0o777)
        ran = os.path.join(d, "ran")

        def as_nobody():
            os.setgroups([])
            os.setgid(NOGROUP)
            os.setuid(NOBODY)
        r = subprocess.run([cli, "--socket", s.socket, "run",
                            "--reservation", a["reservation"], "--task",
                            "tS", "--", "touch", ran], env=run_env(),
                           capture_output=True, timeout=30 * MULT,
                           preexec_fn=as_nobody)
        check(r.returncode == 2 and b"is not yours" in r.stderr,
              f"exit {r.returncode}, {r.stderr!r}")
        check(not os.path.exists(ran), "the command ran")
        check(fleet(s)["reserved"] == 50 * MIB, f"{fleet(s)}")


def test_sigkilled_run_leaves_no_reservation_after_its_ttl():
    d = tempfile.mkdtemp(prefix="mt-run-")
    pidfile = os.path.join(d, "pid")
    ttl = 4
    with limited() as s:
        # A command whose processes never register (MEMTALLY_DISABLE, as
        # a static binary would): nothing takes the reservation over, so
        # only its TTL can end it. (Any preloaded process registers at
        # once, jemalloc's own start-up is over the flush threshold.)
        t0 = time.monotonic()
        p = subprocess.Popen(mt_run(s, "--bytes", "30MiB", "--ttl", str(ttl),
                                    "--", "sh", "-c",
                                    f"echo $$ > {pidfile}; exec sleep 600"),
                             env=run_env(MEMTALLY_DISABLE="1"),
                             start_new_session=True)
        try:
            cmd_pid = int(wait_for("command pid", lambda: (
                open(pidfile).read().strip() if os.path.exists(pidfile)
                else None)))
            f = fleet(s)
            check(f["reservations"] == 1 and f["reserved"] == 30 * MIB,
                  f"admitted: {f}")
        finally:
            p.kill()
            p.wait()
        # The command dies with it (it cannot be forwarded SIGKILL).
        wait_for("command gone", lambda: not os.path.exists(
            f"/proc/{cmd_pid}") or open(f"/proc/{cmd_pid}/stat").read()
            .split(")")[1].split()[0] == "Z", timeout=10)
        # Nothing of it registered: only the TTL ends the reservation.
        # (On a machine too loaded to look before the TTL, the check
        # below, gone no sooner than the TTL, still holds.)
        # The figure first, then the clock: a slow query must not carry
        # the look past the TTL after the clock said it was before.
        held = fleet(s)["reservations"]
        if time.monotonic() - t0 < ttl - 1:
            check(held == 1, "reservation ended before its TTL")
        wait_for("reservation expired", lambda: fleet(s)["reservations"] == 0,
                 timeout=ttl + 10)
        gone = time.monotonic() - t0
        check(gone >= ttl - 0.5, f"gone after {gone:.1f} s, TTL {ttl}")
        check(fleet(s)["reserved"] == 0, "reserved bytes left")
        print(f"  reservation gone {gone:.1f} s after admission (TTL {ttl})")

        # Taken over by the command's worker: gone with the worker, at
        # once, whatever the TTL.
        w = Worker(mt_run(s, "--bytes", "30MiB", "--ttl", "600", "--",
                          *worker("hold"), "10"), run_env())
        try:
            wpid = int(w.readline().split("=")[1])
            wait_for("worker registered", lambda: s.ps().get(wpid))
            check(fleet(s)["reservations"] == 1, "no reservation")
        finally:
            w.kill()
        wait_for("taken-over reservation ended",
                 lambda: fleet(s)["reservations"] == 0 and
                 wpid not in s.ps(), timeout=10)


def test_fail_open_without_server():
    d = tempfile.mkdtemp(prefix="mt-run-")
    sock = os.path.join(d, "no-server.sock")
    prog = ["sh", "-c", "echo out; echo err >&2; exit 5"]
    plain = subprocess.run(prog, capture_output=True, timeout=30 * MULT)
    for extra in ([], ["--bytes", "1GiB"], ["--bytes", "1GiB", "--wait", "30"]):
        t0 = time.monotonic()
        r = subprocess.run(mt_run(sock, *extra, "--", *prog), env=run_env(),
                           capture_output=True, timeout=30 * MULT)
        took = time.monotonic() - t0
        check(r.returncode == plain.returncode and r.stdout == plain.stdout,
              f"{extra}: exit {r.returncode}, stdout {r.stdout!r}")
        err = r.stderr.decode().splitlines()
        if extra:
            check(len(err) == 2 and "without admission" in err[0] and
                  sock in err[0] and err[1] == "err",
                  f"{extra}: stderr {err}")
        else:
            check(err == ["err"], f"no --bytes, no server: stderr {err}")
        check(took < 5 * MULT, f"{extra}: took {took:.1f} s")


def waiting_run(s, timeout_ms, *args):
    """`memtally --timeout TIMEOUT_MS run ARGS`, once it says it waits
    for room (its stderr a pipe of text)."""
    import select
    p = subprocess.Popen([CLI, "--socket", s.socket, "--timeout", timeout_ms,
                          "run", *args], env=run_env(),
                         stderr=subprocess.PIPE, text=True)
    got, _, _ = select.select([p.stderr], [], [], 20 * MULT)
    if not (got and "waiting up to" in p.stderr.readline()):
        p.kill()
        p.wait()
        check(False, "the run is not waiting for room")
    return p


def test_a_signal_ends_the_wait_while_memtallyd_is_stalled():
    """Each ask took its whole timeout and the next was due at once, so
    the wait never looked at its signals: a SIGINT ended it only at the
    --wait deadline (30 s)."""
    with limited("100MiB") as s:
        # Room that may free (a reservation held), not a request past
        # the limit, which is not waited for.
        check(s.cli("admit", "--bytes", "95MiB", "--ttl", "600")["admitted"],
              "the blocker was denied")
        p = waiting_run(s, "500", "--bytes", "10MiB", "--wait", "30",
                        "--poll", "0.2", "--", "true")
        try:
            s.proc.send_signal(signal.SIGSTOP)
            try:
                time.sleep(1.5)     # asks timing out, one after another
                t0 = time.monotonic()
                p.send_signal(signal.SIGINT)
                p.wait(timeout=30 * MULT)
                took = time.monotonic() - t0
            finally:
                s.proc.send_signal(signal.SIGCONT)
            print(f"  SIGINT with memtallyd stopped: ended after "
                  f"{took:.1f} s, status {p.returncode}", flush=True)
            check(p.returncode in (-signal.SIGINT, 128 + signal.SIGINT),
                  f"status {p.returncode}")
            check(took < 2 * MULT, f"the wait went on {took:.1f} s")
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_stalled_memtallyd_holds_no_signal_up():
    """While its command runs, `memtally run` opens a lost watch again. A
    memtallyd that does not accept (stopped, or wedged, its backlog full)
    held each reopen's connect for the whole --timeout, and the signals
    run forwards waited as long: a job manager's SIGTERM reached the
    command two minutes late, after its grace. A reopen now waits half a
    second."""
    import socket
    d = tempfile.mkdtemp(prefix="mt-run-")
    log = os.path.join(d, "log")
    script = (f"trap 'echo term >> {log}; exit 42' TERM; "
              f"echo ready >> {log}; "
              "while :; do sleep 0.05; done")

    def lines():
        return words_of(log)
    s = limited()
    try:
        p = subprocess.Popen([CLI, "--socket", s.socket, "--timeout",
                              "120000", "run", "--bytes", "10MiB", "--",
                              "sh", "-c", script],
                             env=run_env(), start_new_session=True,
                             stderr=subprocess.DEVNULL)
        hung = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        fillers = []
        try:
            wait_for("command started", lambda: "ready" in lines())
            # The watch is lost with memtallyd; in its place a listener
            # that never accepts, its backlog full (a memtallyd stopped
            # under a crowd of clients): a connect waits.
            s.kill9()
            os.unlink(s.socket)
            hung.bind(s.socket)
            hung.listen(0)
            for _ in range(16):
                f = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                f.setblocking(False)
                fillers.append(f)
                try:
                    f.connect(s.socket)
                except BlockingIOError:
                    break
            else:
                raise Skip("a listener's backlog does not fill here")
            time.sleep(1.0)  # reopens under way, each stuck on it
            t0 = time.monotonic()
            p.send_signal(signal.SIGTERM)
            wait_for("TERM reached the command", lambda: "term" in lines(),
                     timeout=60 * MULT)
            took = time.monotonic() - t0
            print(f"  SIGTERM with the watch reopening on a memtallyd that "
                  f"does not accept: at the command after {took:.1f} s",
                  flush=True)
            check(took < 8 * MULT, f"TERM reached it after {took:.1f} s")
        finally:
            for f in fillers:
                f.close()
            hung.close()
            if p.poll() is None:
                # Its release waits out --timeout on the listener.
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    finally:
        s.stop()  # killed above: its status is not judged


def test_closed_stdio_keeps_off_the_connection():
    """Its standard descriptors closed, the run's first socket took fd 2,
    and its own "waiting for room" line went to memtallyd, which closed
    the connection on the garbage."""
    with limited("1MiB") as s:
        r = subprocess.run(["/bin/sh", "-c", 'exec "$@" 0<&- 1>&- 2>&-',
                            "sh", CLI, "--socket", s.socket, "run",
                            "--bytes", "2MiB", "--wait", "1.5", "--",
                            "true"], env=run_env(), timeout=60 * MULT)
        check(r.returncode == 3, f"status {r.returncode}, not 3 (denied)")
        text = s.logtext()
        check("malformed" not in text and "undecodable" not in text,
              "memtallyd read garbage: " + text[-2000:])


def test_as_a_containers_first_process_it_reaps_orphans():
    """A container's first process inherits every orphan in it: waiting
    for its command alone, `memtally run` left them zombies."""
    import shutil
    from harness import Skip
    if os.geteuid() != 0 or not shutil.which("unshare"):
        raise Skip("needs root and unshare(1) for a PID namespace")
    script = ('sh -c "sleep 0.2 & exit 0"; sleep 1; '
              'for f in /proc/[0-9]*/stat; do cut -d" " -f2,3 "$f"; done')
    r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", CLI,
                        "--socket", "/nonexistent/memtally.sock", "run",
                        "--", "sh", "-c", script], env=run_env(),
                       capture_output=True, text=True, timeout=60 * MULT)
    if r.returncode != 0 and "unshare" in r.stderr:
        raise Skip(f"no PID namespace here: {r.stderr.strip()}")
    states = [line.split() for line in r.stdout.splitlines()]
    check(r.returncode == 0 and any(c == "(memtally)" for c, _ in states),
          f"exit {r.returncode}: {r.stdout!r} {r.stderr!r}")
    check(all(st != "Z" for _, st in states),
          f"zombies under memtally run as PID 1: {states}")


def test_asks_a_stalled_memtallyd_missed_make_one_grant():
    """A run waits for room; memtallyd stalls (SIGSTOP) while the room
    comes free (a reservation's TTL), so each ask times out and the run
    asks again on a new connection. Going on, memtallyd read every ask it
    missed and granted each that fit: reservations the run never knew of,
    held until their TTL. Every ask after a run's first says it repeats
    it (Admit.again): one grant, the run's."""
    with limited("64MiB") as s:
        r = subprocess.run([CLI, "--socket", s.socket, "admit", "--bytes",
                            "60MiB", "--ttl", "2"], env=run_env(),
                           capture_output=True, text=True,
                           timeout=30 * MULT)
        check(r.returncode == 0, f"the blocker: {r.stdout} {r.stderr}")
        p = waiting_run(s, "300", "--bytes", "24MiB", "--wait", "60",
                        "--poll", "0.2", "--ttl", "300", "--", "sleep", "0.5")
        try:
            s.proc.send_signal(signal.SIGSTOP)
            try:
                time.sleep(3)   # the blocker's TTL passes; asks time out
            finally:
                s.proc.send_signal(signal.SIGCONT)
            _, err = p.communicate(timeout=60 * MULT)
            check(p.returncode == 0, f"exit {p.returncode}: {err}")
            text = s.logtext()
            grants = text.count('msg="admission granted" ')
            again = text.count('msg="admission granted again')
            print(f"  grants {grants} (the blocker's and the run's), "
                  f"answered again {again}", flush=True)
            wait_for("nothing left reserved",
                     lambda: fleet(s)["reserved"] == 0, timeout=10)
            check(grants == 2, f"{grants} grants, not 2")
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_an_admit_given_up_on_is_not_granted():
    """memtallyd stalls (SIGSTOP) past a run's --timeout: the run fails
    open and runs its command. Going on, memtallyd read the Admit and
    granted it, a reservation nobody released until its TTL (120 s)."""
    with limited("1GiB") as s:
        s.proc.send_signal(signal.SIGSTOP)
        try:
            r = subprocess.run([CLI, "--socket", s.socket, "--timeout",
                                "500", "run", "--bytes", "300MiB", "--",
                                "true"], env=run_env(), capture_output=True,
                               text=True, timeout=30 * MULT)
        finally:
            s.proc.send_signal(signal.SIGCONT)
        check(r.returncode == 0 and "without admission" in r.stderr,
              f"exit {r.returncode}: {r.stderr}")
        wait_for("the Admit read", lambda: any(
            w in s.logtext() for w in ("closed its connection",
                                       'msg="admission granted"')),
                 timeout=20)
        check(fleet(s)["reservations"] == 0,
              f"a grant nobody will release: {fleet(s)}")


def test_a_closed_stderr_ends_neither_run_nor_command():
    """run's stderr a pipe nobody reads any more (a runner's log reader
    gone): its fail-open line killed it with SIGPIPE before the command
    started, and a later line (a guard's pause) would have killed the
    command with it. The line is lost; the command runs and passes its
    status."""
    d = tempfile.mkdtemp(prefix="mt-it-pipe-")
    made = os.path.join(d, "ran")
    rd, wr = os.pipe()
    os.close(rd)
    try:
        r = subprocess.run([CLI, "--socket", os.path.join(d, "none.sock"),
                            "run", "--bytes", "1MiB", "--", "sh", "-c",
                            'echo x > "$0"; exit 4', made],
                           stderr=wr, stdout=subprocess.DEVNULL,
                           timeout=60 * MULT)
    finally:
        os.close(wr)
    check(r.returncode == 4 and os.path.exists(made),
          f"run with a closed stderr: {r.returncode}, command "
          f"{'ran' if os.path.exists(made) else 'never ran'}")


def test_a_token_it_will_not_send_is_exit_2():
    """With MEMTALLY_TOKEN set, a socket another user listens on (bound
    in a directory anyone may write, while memtallyd is down) gets no
    token, and the run does not go on unadmitted as if no memtallyd
    were there: the request was refused, exit 2, nothing run."""
    from harness import NOBODY, NOGROUP, as_user
    if os.geteuid() != 0:
        raise Skip("needs root, to listen as nobody")
    d = tempfile.mkdtemp(prefix="mt-it-squat-")
    os.chmod(d, 0o1777)
    sock = os.path.join(d, "memtally.sock")
    made = os.path.join(d, "ran")
    squat = subprocess.Popen(
        ["python3", "-c",
         "import os,socket,sys\n"
         "s=socket.socket(socket.AF_UNIX);s.bind(sys.argv[1]);s.listen()\n"
         "os.chmod(sys.argv[1],0o666);print('up',flush=True)\n"
         "sys.stdin.read()\n", sock],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        preexec_fn=as_user((NOBODY, NOGROUP)))
    try:
        check(squat.stdout.readline().strip() == "up", "no listener")
        env = dict(os.environ, MEMTALLY_TOKEN="run-token-0123456789")
        env.pop("MEMTALLY_SERVER_UID", None)
        r = subprocess.run([CLI, "--socket", sock, "run", "--bytes", "1MiB",
                            "--", "touch", made], capture_output=True,
                           text=True, env=env, timeout=60 * MULT)
    finally:
        squat.communicate("", timeout=30 * MULT)
    check(r.returncode == 2 and not os.path.exists(made) and
          "not sending the token" in r.stderr,
          f"run to another user's socket with a token: {r.returncode} "
          f"{'ran' if os.path.exists(made) else 'not run'} {r.stderr}")


def test_the_token_is_not_the_commands():
    """MEMTALLY_TOKEN gives admin rights: whoever set it for `memtally
    run` did not give them to the job it wraps. Before, the command
    inherited it."""
    with limited() as s:
        r = subprocess.run(
            mt_run(s, "--", "sh", "-c",
                   'printf "%s %s" "${MEMTALLY_TOKEN-unset}" '
                   '"${MEMTALLY_TASK:+task}"'),
            env=dict(run_env(), MEMTALLY_TOKEN="sekrit"),
            capture_output=True, text=True, timeout=30 * MULT)
        check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
        check(r.stdout == "unset task",
              f"the command's environment: {r.stdout!r}")


def test_runs_of_one_user_keep_one_connection_each():
    """A run keeps only its watch open while its command runs. Before, it
    kept admission's connection too: with max_connections_per_uid = 4,
    nobody's third run at once was refused its Admit and ran unadmitted
    (as 64 runs of one user were under the default 128)."""
    preload, cli, hold = world_readable_copy(
        os.environ["MEMTALLY_PRELOAD_LIB"], CLI, worker("hold"))

    def nobody():
        os.setgroups([])
        os.setgid(NOGROUP)
        os.setuid(NOBODY)
    with Server("--config", config("[server]\ngroup = nogroup\n"
                                   "max_connections_per_uid = 4\n")) as s:
        open_to_nobody(s)
        runs = []
        try:
            for i in range(3):
                p = subprocess.Popen(
                    [cli, "--socket", s.socket, "run", "--bytes", "4MiB",
                     "--task", "t%d" % i, "--", *hold, "1"],
                    env=run_env(MEMTALLY_PRELOAD_LIB=preload),
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True, preexec_fn=nobody)
                runs.append(p)
                check(p.stdout.readline().startswith("ready"),
                      "run %d's command is not ready" % i)
                wait_for("run %d's worker registered" % i, lambda: {
                    "t%d" % j for j in range(i + 1)} <= {
                    v.get("task") for v in s.ps().values()}, timeout=20)
            check(fleet(s)["reservations"] == 3,
                  "reservations: %s" % fleet(s))
            for p in runs:
                p.stdin.close()
            for i, p in enumerate(runs):
                err = p.stderr.read()
                check(p.wait(timeout=30 * MULT) == 0 and
                      "without admission" not in err,
                      "run %d: exit %s: %s" % (i, p.returncode, err))
            wait_for("released", lambda: fleet(s)["reservations"] == 0,
                     timeout=20)
        finally:
            for p in runs:
                if p.poll() is None:
                    p.kill()
                    p.wait()


if __name__ == "__main__":
    run([test_denied_never_starts,
         test_a_closed_stderr_ends_neither_run_nor_command,
         test_a_token_it_will_not_send_is_exit_2,
         test_exit_status_and_signal_pass_through,
         test_signals_reach_the_command,
         test_wait_then_runs_when_room_appears,
         test_a_restart_does_not_start_the_waiters,
         test_poll_bounds_the_wait_without_a_state_change,
         test_command_is_the_reservations_task,
         test_runs_under_a_reservation_a_scheduler_holds,
         test_another_users_reservation_is_not_run_under,
         test_sigkilled_run_leaves_no_reservation_after_its_ttl,
         test_fail_open_without_server,
         test_a_signal_ends_the_wait_while_memtallyd_is_stalled,
         test_a_stalled_memtallyd_holds_no_signal_up,
         test_asks_a_stalled_memtallyd_missed_make_one_grant,
         test_closed_stdio_keeps_off_the_connection,
         test_as_a_containers_first_process_it_reaps_orphans,
         test_the_token_is_not_the_commands,
         test_runs_of_one_user_keep_one_connection_each,
         test_an_admit_given_up_on_is_not_granted])
