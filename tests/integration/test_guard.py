"""The node guard: memtallyd inside a small memory cgroup (the node, made
by the test as bench/fleet.py's make_node does) evicts a task before the
kernel's OOM killer has to choose.

- test_leak_is_evicted: a task that leaks, next to a steady one within its
  reservation, on a 256 MiB node whose guard line is 70%. memtallyd, not
  the test, kills the leak; its `memtally run` exits 75 with the figures
  on stderr; the steady task runs to its end; the kernel kills nothing.
- test_retry_runs_it_again: `memtally run --retry 1` of the same leak runs
  it twice, evicted twice, and exits 75; each run reads the first line of
  its standard input, a file (the rerun's is rewound).
- test_an_evicted_run_leaves_nothing_behind: the leak's shell also
  started a background process and a daemon that never register; once
  its `memtally run` exits 75, neither is left running.
- test_a_grower_is_paused_then_resumed: a task within its reservation
  grows while memory memtally does not count (a plain process) takes the
  node past its line. memtallyd pauses the grower (SIGSTOP: the kernel
  shows it stopped) rather than evicting it; when the other process ends
  and the node is back under its line it resumes it, and it runs to its
  end (exit 0). Its `memtally run` says
  both on stderr; nothing is evicted, the kernel kills nothing.
- test_a_paused_task_outlives_memtallyds_death: memtallyd is SIGKILLed
  while it holds the grower stopped; the next one, started on the same
  restart record, resumes it as it adopts it, and it ends 0 (also after
  --reset, and for a grower that gave up its uid, which is not adopted).
- test_lie_cannot_evict_another_user: as nobody, a worker naming another
  user's task claims 2^49 bytes and holds real memory that takes the node
  past its line. The guard evicts the liar, not the other user's task
  (within its reservation), though the lie names it.
- test_anothers_eviction_is_not_an_admins: root's `memtally run --task
  leak`, whose command fails on its own, is not told nobody's task of
  that name was evicted: it exits with its command's status, not 75.
- test_a_command_that_switches_user_is_evicted_as_the_runs: root's
  `memtally run` whose command runs as nobody (setpriv) is told of its
  eviction and exits 75.
- test_a_name_taken_without_a_reservation_is_not_an_admins_run: nor of
  nobody's workers that took the name without any reservation (what a
  command that switches user looks like): they do not descend from
  root's run, so root's run still exits with its command's 3.
- test_understating_cannot_hide: as nobody, a task granted 8 MiB holds 50
  and its slot claims 1; a younger task of another user, within its
  reservation, and memory memtally does not count take the node past its
  line. The guard evicts the liar (42 MiB beyond its reservation by what
  the kernel vouches for), not the other user's task.

Skipped (77) where no memory cgroup can be made (not root, no writable
memory controller), or with no second user for the trust test.
"""
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
import harness  # noqa: E402
from harness import (CLI, MIB, MULT, NOBODY, NOGROUP, Server, check,  # noqa: E402
                     claim, open_to_nobody, run, second_user, wait_for,
                     worker, world_readable_copy)
from harness import config_file as config  # noqa: E402
import fleet  # noqa: E402

NODE = 256 * MIB
GUARD = "[guard]\nline = 70%\ninterval = 1s\n"


def node(name):
    try:
        return fleet.make_node(NODE, "mt-it-guard-%d-%s" % (os.getpid(), name))
    except fleet.NoCgroup as e:
        raise harness.Skip(str(e))


def in_node(cg, user=None):
    """A preexec_fn: join the node, then become `user` (uid, gid)."""
    def pre():
        with open(cg.procs(), "w") as f:
            f.write(str(os.getpid()))
        if user:
            os.setgroups([])
            os.setgid(user[1])
            os.setuid(user[0])
    return pre


def run_env(s, **extra):
    e = dict(os.environ)
    for k in ("LD_PRELOAD", "MEMTALLY_TASK", "MEMTALLY_GROUP"):
        e.pop(k, None)
    e["MEMTALLY_SOCKET"] = s.socket
    e.update(extra)
    return e


def mt_run(s, cg, *args, user=None, cli=CLI, env=None, stdin=None):
    return subprocess.Popen([cli, "--socket", s.socket, "run", *args],
                            env=env or run_env(s),
                            stdin=stdin or subprocess.PIPE,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=in_node(cg, user))


def readline(p, timeout):
    r, _, _ = select.select([p.stdout], [], [], timeout * MULT)
    check(r, "no line from pid %d in %.0f s" % (p.pid, timeout))
    return p.stdout.readline()


def joining(cg):
    """A command prefix that runs what follows inside the node."""
    return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', cg.procs()]


def guard_server(cg, extra=""):
    """memtallyd in the node, its guard at 70% of it."""
    return Server("--config", config(GUARD + extra), prefix=joining(cg))


def end_all(cg, *procs):
    """Kill what is still running (stopped or not), remove the node."""
    for p in procs:
        if p and p.poll() is None:
            p.kill()
            p.wait()
    cg.remove()


def tasks_of(s):
    return {p.get("task", "") for p in s.ps().values()}


def test_leak_is_evicted():
    cg = node("leak")
    fl = worker("fleet")
    try:
        with guard_server(cg) as s:
            check("node guard on" in s.logtext(),
                  "the guard is not on in a limited node: " + s.logtext())
            # GetUsage shows the node as the guard reads it, beside the
            # counted fleet: the kernel's figure for this cgroup.
            nd = s.status()["node"]
            check(nd is not None and nd["limit"] == NODE and
                  nd["line"] == NODE * 7 // 10 and
                  nd["source"] == "cgroup%d" % cg.version and
                  nd["edge"] == "memory" and
                  0 < nd["bytes"] <= cg.usage() + 8 * MIB,
                  "status's node: %s (cgroup usage %d)" % (nd, cg.usage()))
            steady = mt_run(s, cg, "--task", "steady", "--bytes", "64MiB",
                            "--", *fl, "steady", "40", "14")
            wait_for("the steady task registered",
                     lambda: "steady" in tasks_of(s), timeout=20)
            # 80 MiB at once, then 8 MiB/s: past the line (179 MiB) in a
            # few seconds, at the node's limit some 10 s later.
            leak = mt_run(s, cg, "--task", "leak", "--kind", "leaky",
                          "--bytes", "32MiB", "--", *fl, "leak", "400", "40")
            _, err = leak.communicate(timeout=60 * MULT)
            print(err, flush=True)
            check(leak.returncode == 75,
                  "the leak's memtally run exited %s, not 75: %s" % (
                      leak.returncode, err))
            check("evicted by the node guard" in err and
                  "past its line" in err and "MiB" in err and
                  "leak" in err and "32 MiB reserved" in err,
                  "the eviction's figures are not on stderr: %r" % err)
            log = s.logtext()
            check('msg="node guard: evicting"' in log and "rule=beyond" in log
                  and 'task="leak"' in log,
                  "no decision record for the leak in memtallyd's log")
            check('task="steady"' in log, "the decision record does not list "
                  "the other candidate")
            _, serr = steady.communicate(timeout=60 * MULT)
            check(steady.returncode == 0,
                  "the steady task was touched: exit %s: %s" % (
                      steady.returncode, serr))
            check(log.count('msg="node guard: evicting"') == 1,
                  "more than one eviction")
            check(cg.oom_kills() == 0,
                  "the kernel OOM-killed %d in the node" % cg.oom_kills())
            # The eviction is recorded against the kind: its learned size
            # rises past what was declared, to what it reached.
            out = subprocess.run([CLI, "--socket", s.socket, "--json",
                                  "kinds"], capture_output=True, text=True,
                                 timeout=30 * MULT)
            check(out.returncode == 0, "memtally kinds: " + out.stderr)
            kinds = json.loads(out.stdout)["kinds"]
            leaky = [k for k in kinds if k["kind"] == "leaky"]
            check(leaky and leaky[0]["evictions"] == 1 and
                  (leaky[0]["learned"] or 0) > 64 * MIB,
                  "the kind did not learn from its eviction: %s" % kinds)
            print("  kind leaky after the eviction: learned %d MiB" % (
                leaky[0]["learned"] >> 20), flush=True)
            check(s.proc.poll() is None, "memtallyd died")
    finally:
        cg.remove()


def test_retry_runs_it_again():
    cg = node("retry")
    fl = worker("fleet")
    d = tempfile.mkdtemp(prefix="mt-guard-")
    runs = os.path.join(d, "runs")
    lines = os.path.join(d, "stdin")
    with open(lines, "w") as f:
        f.write("first\nsecond\n")
    try:
        with guard_server(cg) as s, open(lines) as stdin:
            # Each run reads a line of its standard input, a file: the
            # rerun reads the first run's line again, not the next.
            leak = mt_run(s, cg, "--retry", "1", "--bytes", "32MiB", "--",
                          "/bin/sh", "-c",
                          'read l && echo "$l" >> "$0" && exec "$@"', runs,
                          *fl, "leak", "400", "40", stdin=stdin)
            _, err = leak.communicate(timeout=120 * MULT)
            print(err, flush=True)
            check(leak.returncode == 75,
                  "exit %s, not 75: %s" % (leak.returncode, err))
            with open(runs) as f:
                got = f.read().split()
            check(got == ["first", "first"],
                  "the runs read %s, not the first line twice" % got)
            check(err.count("evicted by the node guard") == 2 and
                  "running it again (1 of 1)" in err,
                  "stderr does not tell two evictions and one rerun: %r" % err)
            check(cg.oom_kills() == 0,
                  "the kernel OOM-killed %d in the node" % cg.oom_kills())
    finally:
        cg.remove()


def test_an_evicted_run_leaves_nothing_behind():
    """The leak runs under a shell that also started two processes that
    never register (no preload): one in the background, one a daemon
    (setsid -f: its parent ends at once). The guard evicts the leak;
    `memtally run` exits 75 only once neither is left running, holding
    its memory beside a requeued run."""
    cg = node("leftovers")
    fl = worker("fleet")
    d = tempfile.mkdtemp(prefix="mt-guard-")
    pids = os.path.join(d, "pids")
    open(pids, "w").close()
    hold = ("import os,sys,time; b=bytearray(16<<20); "
            "open(sys.argv[1],'a').write('%d\\n' % os.getpid()); "
            "time.sleep(1000)")
    try:
        with guard_server(cg) as s:
            leak = mt_run(
                s, cg, "--bytes", "32MiB", "--", "/bin/sh", "-c",
                'env -u LD_PRELOAD python3 -c "$1" "$2" & '
                'setsid -f env -u LD_PRELOAD python3 -c "$1" "$2"; '
                'while [ "$(wc -l < "$2" 2>/dev/null)" != 2 ]; do '
                'sleep 0.05; done; shift 2; "$@"', "sh", hold, pids,
                *fl, "leak", "400", "40")
            _, err = leak.communicate(timeout=60 * MULT)
            print(err, flush=True)
            check(leak.returncode == 75,
                  "exit %s, not 75: %s" % (leak.returncode, err))
            with open(pids) as f:
                left = [int(x) for x in f.read().split()]
            check(len(left) == 2, "the holders wrote %s" % left)
            alive = [p for p in left if os.path.exists("/proc/%d" % p)]
            check(not alive, "still running after the eviction: %s" % alive)
            check("ended what the evicted command left running" in err,
                  "stderr does not say so: %r" % err)
            check(cg.oom_kills() == 0,
                  "the kernel OOM-killed %d in the node" % cg.oom_kills())
    finally:
        for p in open(pids).read().split() if os.path.exists(pids) else []:
            try:
                os.kill(int(p), signal.SIGKILL)
            except OSError:
                pass
        cg.remove()


def test_a_run_told_to_stop_is_not_run_again():
    """`memtally run --retry 3` gets SIGTERM (a job cancelled); the
    command, handling it, grows until the guard evicts it. The run is not
    run again, and ends of SIGTERM, not 75 (which a runner requeues)."""
    cg = node("told-to-stop")
    d = tempfile.mkdtemp(prefix="mt-guard-")
    runs = os.path.join(d, "runs")
    leak = None
    try:
        with guard_server(cg) as s:
            fl = " ".join(worker("fleet"))
            leak = mt_run(s, cg, "--retry", "3", "--bytes", "32MiB", "--",
                          "/bin/sh", "-c",
                          'echo run >> "$0"; trap "exec %s leak 400 4" TERM;'
                          ' echo ready; while :; do sleep 0.1; done' % fl,
                          runs)
            check(readline(leak, 30).strip() == "ready", "not started")
            leak.send_signal(signal.SIGTERM)
            try:
                _, err = leak.communicate(timeout=60 * MULT)
            except subprocess.TimeoutExpired:
                leak.kill()
                _, err = leak.communicate()
                raise AssertionError("memtally run did not end (run again?):"
                                     " %r" % err)
            print(err, flush=True)
            with open(runs) as f:
                n = len(f.read().split())
            check(n == 1, "the command ran %d times, not once" % n)
            check("evicted by the node guard" in err and
                  "not running it again" in err and
                  "running it again (" not in err,
                  "stderr does not tell one eviction, not rerun: %r" % err)
            check(leak.returncode == -signal.SIGTERM,
                  "exit %s, not death by SIGTERM: %s" % (leak.returncode, err))
            check(cg.oom_kills() == 0,
                  "the kernel OOM-killed %d in the node" % cg.oom_kills())
    finally:
        end_all(cg, leak)


def proc_state(pid):
    """/proc/PID/stat's state letter, or None once it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


# Memory memtally does not count: a plain process of the node holding
# 90 MiB of touched bytes until its stdin closes.
UNCOUNTED = ("import sys; b = bytes([1]) * (90 << 20); "
             "print('ready', flush=True); sys.stdin.read()")


# A grower that gives up root for nobody's uid (a daemon dropping its
# privileges without exec) 1.5 s in, then grows 5 MiB/s: 20 MiB to 100.
GROW_AND_DROP = ("import os, time\n"
                 "keep = [bytearray(b'\\1' * (20 << 20))]\n"
                 "time.sleep(1.5)\n"
                 "os.setuid(65534)\n"
                 "for i in range(80):\n"
                 "    keep.append(bytearray(b'\\1' * (1 << 20)))\n"
                 "    time.sleep(0.2)\n")


def grower_paused(s, cg, cmd=None):
    """Start the grower (`cmd`, or the fleet worker's leak) and the
    uncounted process in the node of `s`; return both once memtallyd has
    paused the grower, with its pid."""
    # 20 MiB growing to 100 over 15 s (5 MiB/s), within its 128 MiB,
    # admitted on an empty node.
    grow = mt_run(s, cg, "--task", "grow", "--bytes", "128MiB", "--",
                  *(cmd or [*worker("fleet"), "leak", "100", "15"]))
    wait_for("the grower registered", lambda: "grow" in tasks_of(s),
             timeout=20)

    def growing():
        g = [p for p in s.ps().values() if p.get("task") == "grow"]
        return g and (g[0].get("growth_bytes_per_s") or 0) >= 2 * MIB
    # Its growth measured (two seconds of samples) before the node is
    # past its line: the guard pauses the fastest grower, and a task not
    # yet seen growing would be evicted as the youngest.
    wait_for("the grower's growth measured", growing, timeout=30)
    # Then what memtally cannot count takes 90 MiB: the node passes its
    # line (179 MiB) some 10 s in, nobody beyond.
    other = subprocess.Popen(
        [sys.executable, "-c", UNCOUNTED], env=run_env(s),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        preexec_fn=in_node(cg))
    check(readline(other, 30).startswith("ready"),
          "the uncounted process is not ready")
    wait_for("the guard pausing the grower", lambda:
             'msg="node guard: pausing"' in s.logtext(), timeout=40)
    log = s.logtext()
    line = log.split('msg="node guard: pausing"')[1].split("\n")[0]
    check('task="grow"' in line and "rule=growth" in line,
          "the pause was not the grower's: " + line)
    pid = [p for p, v in s.ps().items() if v.get("task") == "grow"]
    check(pid, "the grower's worker is not registered")
    wait_for("the grower stopped", lambda: proc_state(pid[0]) == "T",
             timeout=10)
    return grow, other, pid[0]


def grower_ends_well(s, cg, grow):
    _, err = grow.communicate(timeout=60 * MULT)
    print(err, flush=True)
    check(grow.returncode == 0,
          "the grower did not run to its end: exit %s: %s" % (
              grow.returncode, err))
    check("paused by the node guard" in err and
          "resumed by the node guard" in err,
          "memtally run did not say the pause and the resume: %r" % err)
    log = s.logtext()
    check('msg="node guard: evicting' not in log,
          "something was evicted: " + log[-3000:])
    check(cg.oom_kills() == 0,
          "the kernel OOM-killed %d in the node" % cg.oom_kills())


# A long interval: a pause must end by the node coming back, not by the
# clock, however slow the machine.
PAUSE_CONF = "[guard]\nline = 70%\ninterval = 1m\n"


def test_a_grower_is_paused_then_resumed():
    cg = node("pause")
    join = joining(cg)
    conf = config(PAUSE_CONF)
    other = grow = None
    try:
        with Server("--config", conf, prefix=join) as s:
            grow, other, pid = grower_paused(s, cg)
            # The other process ends: the node comes back under its line.
            other.stdin.close()
            other.wait(timeout=30 * MULT)
            wait_for("the grower resumed", lambda:
                     'msg="node guard: resumed"' in s.logtext(), timeout=20)
            check(proc_state(pid) != "T", "the grower is still stopped")
            grower_ends_well(s, cg, grow)
            held = [x for x in s.logtext().splitlines()
                    if 'msg="node guard: resumed"' in x][0]
            print("  " + held.split(" msg=")[1][:160], flush=True)
    finally:
        end_all(cg, other, grow)


def test_a_paused_task_outlives_memtallyds_death():
    paused_task_outlives_death("pause-kill")


def test_a_paused_task_outlives_memtallyds_death_and_a_reset():
    """The successor starts afresh (--reset): it adopts nothing, but
    still resumes what the record says was held."""
    paused_task_outlives_death("pause-reset", "--reset")


def test_a_paused_task_that_left_its_uid_outlives_memtallyds_death():
    """The paused grower had given up root for nobody's uid: the next
    memtallyd did not adopt it (its uid changed) and never resumed it,
    though the record said it was held, logging it as a dead worker's
    slot; it stayed stopped for ever. Now it is resumed, and ends 0."""
    paused_task_outlives_death("pause-drop", cmd=[
        sys.executable, "-c", GROW_AND_DROP])


def paused_task_outlives_death(name, *restart_args, cmd=None):
    cg = node(name)
    join = joining(cg)
    conf = config(PAUSE_CONF)
    other = grow = None
    try:
        s = Server("--config", conf, prefix=join)
        try:
            grow, other, pid = grower_paused(s, cg, cmd)
            s.kill9()  # while it holds the grower stopped
        except BaseException:
            s.stop()
            raise
        check(proc_state(pid) == "T", "the grower was not left stopped")
        other.stdin.close()  # the node will have room again
        other.wait(timeout=30 * MULT)
        with Server("--config", conf, *restart_args, prefix=join,
                    after=s) as s2:
            wait_for("the restarted server resuming the grower", lambda:
                     "resumed a task the memtallyd before held paused"
                     in s2.logtext(), timeout=30)
            wait_for("the grower running", lambda: proc_state(pid) != "T",
                     timeout=10)
            _, err = grow.communicate(timeout=60 * MULT)
            check(grow.returncode == 0,
                  "the grower did not run to its end: exit %s: %s" % (
                      grow.returncode, err))
            check(cg.oom_kills() == 0,
                  "the kernel OOM-killed %d in the node" % cg.oom_kills())
            print("  memtallyd SIGKILLed holding the grower; its successor "
                  "resumed it and it ended 0", flush=True)
    finally:
        end_all(cg, other, grow)


def test_an_eviction_after_memtallyds_restart_is_the_runs():
    """memtallyd restarts while a run's command runs: the run's watch,
    lost with the first server, is opened again on the second, which
    adopts the workers and evicts the leak; the run exits 75, not 137."""
    evicted_after_restart("restart-evict", [])


def test_orphans_put_off_no_reopen_of_the_watch():
    """The same with a command that leaves an orphan every 100 ms (run
    is their subreaper: a SIGCHLD each). Each signal woke the run's poll
    before the reopen's timeout, which then began again: the watch was
    never opened on the second memtallyd, and the eviction looked like
    the command's own SIGKILL, 137 and no message."""
    evicted_after_restart(
        "orphans-evict",
        ["sh", "-c", 'while :; do (sleep 0.01 &); sleep 0.1; done & '
         'exec "$@"', "sh"])


def evicted_after_restart(name, prefix):
    cg = node(name)
    join = joining(cg)
    conf = config(GUARD)
    fl = worker("fleet")
    leak = None
    try:
        s = Server("--config", conf, prefix=join)
        try:
            # 80 MiB at once, then 8 MiB/s: past the line (179 MiB) some
            # 12 s after it starts.
            leak = mt_run(s, cg, "--task", "leak", "--bytes", "32MiB",
                          "--", *prefix, *fl, "leak", "400", "40")
            wait_for("the leak registered", lambda: "leak" in tasks_of(s),
                     timeout=20)
            s.kill9()
        except BaseException:
            s.stop()
            raise
        with Server("--config", conf, prefix=join,
                    after=s) as s2:
            _, err = leak.communicate(timeout=60 * MULT)
            print(err, flush=True)
            check('msg="node guard: evicting"' in s2.logtext(),
                  "the second memtallyd did not evict the leak")
            check(leak.returncode == 75 and
                  "evicted by the node guard" in err,
                  "the leak's memtally run exited %s, not 75: %s" % (
                      leak.returncode, err))
            check(cg.oom_kills() == 0,
                  "the kernel OOM-killed %d in the node" % cg.oom_kills())
    finally:
        end_all(cg, leak)



def test_a_run_started_while_memtallyd_is_down_hears_its_eviction():
    """A run started while memtallyd is down (a restart) fails open. Its
    command registers once memtallyd is back, and the guard evicts the
    leak; the run, whose first watch reached no one, never opened one
    again: it exited 137 with no message and no rerun. It now asks again
    with back-off: the eviction is reported, --retry 1 reruns it, 75."""
    cg = node("down-evict")
    fl = worker("fleet")
    d = tempfile.mkdtemp(prefix="mt-it-down-")
    sock = os.path.join(d, "memtally.sock")
    leak = None
    try:
        env = dict(run_env(type("S", (), {"socket": sock})))
        leak = subprocess.Popen(
            [CLI, "--socket", sock, "run", "--task", "leak", "--bytes",
             "32MiB", "--retry", "1", "--", *fl, "leak", "400", "40"],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, preexec_fn=in_node(cg))
        kids = "/proc/%d/task/%d/children" % (leak.pid, leak.pid)
        wait_for("the command started (run failed open)",
                 lambda: open(kids).read().strip(), timeout=30)
        with Server("--config", config(GUARD), prefix=joining(cg),
                    socket=sock, directory=d) as s:
            _, err = leak.communicate(timeout=120 * MULT)
            print(err, flush=True)
            check(s.logtext().count('msg="node guard: evicting"') >= 1,
                  "memtallyd did not evict the leak")
            check(leak.returncode == 75 and
                  "evicted by the node guard" in err and
                  "running it again" in err,
                  "the run exited %s, not 75 after one rerun: %s" % (
                      leak.returncode, err))
    finally:
        end_all(cg, leak)


def test_a_guard_that_may_not_signal_says_so():
    """memtallyd without CAP_KILL (a container that dropped it, as the
    DaemonSet's capabilities did not list it) cannot signal nobody's
    leak. The guard read the refusal as "the task had ended", said
    nothing else each interval, and left the node to the kernel's OOM
    killer. It now logs an error naming CAP_KILL."""
    cg = node("nokill")
    preload, cli, fl = world_readable_copy(
        os.environ["MEMTALLY_PRELOAD_LIB"], CLI, worker("fleet"))
    leak = None
    try:
        prefix = ["setpriv", "--bounding-set",
                  "-all,+sys_ptrace,+dac_read_search,+chown"] + joining(cg)
        with Server("--config", config(GUARD + "[server]\ngroup = nogroup\n"),
                    prefix=prefix) as s:
            open_to_nobody(s)
            leak = mt_run(s, cg, "--task", "leak", "--bytes", "32MiB", "--",
                          *fl, "leak", "400", "40", user=(NOBODY, NOGROUP),
                          cli=cli, env=run_env(s, MEMTALLY_PRELOAD_LIB=preload))
            wait_for("the guard's refusal logged", lambda:
                     "may not signal the task's processes" in s.logtext(),
                     timeout=60)
            line = [x for x in s.logtext().splitlines()
                    if "may not signal" in x][0]
            check("CAP_KILL" in line and 'task="leak"' in line and
                  "level=error" in line, "the refusal's line: " + line)
            check("its choice had ended" not in s.logtext(),
                  "a refused signal still logged as an ended task")
    finally:
        end_all(cg, leak)

STALE_SERVICE = r"""
import os, sys
b = bytearray(20 << 20)
for i in range(0, len(b), 4096):
    b[i] = 1
print("held", flush=True)
sys.stdin.readline()
os.execve("/bin/sleep", ["sleep", "120"], {})
"""

UNCOUNTED_190 = r"""
import sys
b = bytearray(190 << 20)
for i in range(0, len(b), 4096):
    b[i] = 1
print("hog", flush=True)
sys.stdin.readline()
"""


def test_a_root_service_that_exec_d_is_still_no_job():
    """A root service (no task: never the guard's while evict_trusted is
    off) exec'd a program that never registers. memtallyd counts it as
    the kernel vouches from then on, and the guard took that for an
    untrusted user's job: past the line it SIGKILLed the service holding
    96 KiB. Its user is what it was: the node past its line has no task
    to evict, and the service lives."""
    cg = node("stale")
    svc = hog = None
    try:
        with guard_server(cg) as s:
            svc = subprocess.Popen(
                [sys.executable, "-c", STALE_SERVICE], env=s.env(group="svc"),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                preexec_fn=in_node(cg))
            check(svc.stdout.readline().startswith("held"), "no service")
            wait_for("the service registered", lambda: svc.pid in s.ps())
            svc.stdin.write("\n")
            svc.stdin.flush()
            wait_for("its exec seen", lambda: "exec'd an image that has "
                     "not registered" in s.logtext(), timeout=30)
            env = dict(os.environ)
            env.pop("LD_PRELOAD", None)
            hog = subprocess.Popen(
                [sys.executable, "-c", UNCOUNTED_190], env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, text=True, preexec_fn=in_node(cg))
            check(hog.stdout.readline().startswith("hog"), "no hog")
            wait_for("the guard past its line, choosing no one", lambda:
                     "no task may be evicted" in s.logtext(), timeout=30)
            check("node guard: evicting" not in s.logtext(),
                  "the guard chose: " + s.tail())
            check(svc.poll() is None, "the service died: %s" % svc.poll())
    finally:
        end_all(cg, svc, hog)

def test_lie_cannot_evict_another_user():
    second = second_user()
    cg = node("trust")
    preload, cli, hold = world_readable_copy(
        os.environ["MEMTALLY_PRELOAD_LIB"], CLI, worker("hold"))
    victim = liar = None
    try:
        with guard_server(cg, "[server]\ngroup = nogroup\n"
                          "[trust]\nuntouched_allowance = 16MiB\n"
                          "untouched_time = 1s\n") as s:
            open_to_nobody(s)
            env = run_env(s, MEMTALLY_PRELOAD_LIB=preload)
            # The second user's task: 100 MiB, within its 120 MiB.
            victim = mt_run(s, cg, "--task", "etl", "--bytes", "120MiB",
                            "--", *hold, "100", user=(second[0], NOGROUP),
                            cli=cli, env=env)
            check(readline(victim, 30).startswith("ready"),
                  "the victim is not ready")
            # nobody's worker names the same task and claims 2^49 bytes;
            # then it holds 80 MiB, and the node passes its line. The lie
            # comes first: were the node past its line before it, the
            # guard could end the liar before it lied (a slow machine).
            lenv = dict(env, LD_PRELOAD=preload, MEMTALLY_TASK="etl")
            liar = subprocess.Popen([*hold, "1"], env=lenv,
                                    stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True,
                                    preexec_fn=in_node(cg, (NOBODY, NOGROUP)))
            check(readline(liar, 30).startswith("ready"),
                  "the liar is not ready")
            wait_for("the liar registered", lambda: liar.pid in s.ps(),
                     timeout=20)
            claim(s, liar.pid, 1 << 49)
            liar.stdin.write("more 80\n")
            liar.stdin.flush()
            rc = liar.wait(timeout=30 * MULT)
            check(rc == -9, "the liar was not evicted: exit %s" % rc)
            log = s.logtext()
            check("uid=%d" % NOBODY in log.split(
                'msg="node guard: evicting"')[1].split("\n")[0],
                  "the eviction was not the liar's")
            time.sleep(1.5)  # past the interval: no second choice
            check(victim.poll() is None,
                  "the other user's task was killed: %s" % victim.poll())
            check(log.count('msg="node guard: evicting"') == 1 and
                  s.logtext().count('msg="node guard: evicting"') == 1,
                  "more than one eviction")
            check(cg.oom_kills() == 0,
                  "the kernel OOM-killed %d in the node" % cg.oom_kills())
    finally:
        end_all(cg, victim, liar)


def admins_run_beside_a_leak(name, start_leak):
    """root's `memtally run --task leak`, whose command will exit 3, beside
    nobody's leak named "leak" that start_leak(s, cg, env, cli, fl) starts
    (returning its process and a function that waits for its eviction):
    the guard evicts nobody's, and root's run exits 3, never 75."""
    cg = node(name)
    preload, cli, fl = world_readable_copy(
        os.environ["MEMTALLY_PRELOAD_LIB"], CLI, worker("fleet"))
    admin = leak = None
    try:
        with guard_server(cg, "[server]\ngroup = nogroup\n") as s:
            open_to_nobody(s)
            env = run_env(s, MEMTALLY_PRELOAD_LIB=preload)
            admin = mt_run(s, cg, "--task", "leak", "--bytes", "16MiB", "--",
                           "/bin/sh", "-c", "echo ready; read x; exit 3",
                           cli=cli, env=env)
            check(readline(admin, 30).startswith("ready"),
                  "root's command is not ready")
            leak, evicted = start_leak(s, cg, dict(env), cli, fl)
            evicted()
            log = s.logtext()
            check("uid=%d" % NOBODY in log.split(
                'msg="node guard: evicting"')[1].split("\n")[0],
                  "the eviction was not nobody's")
            admin.stdin.write("go\n")
            admin.stdin.flush()
            _, aerr = admin.communicate(timeout=30 * MULT)
            print("  root's run of the same name: exit %s %r" % (
                admin.returncode, aerr.strip()), flush=True)
            check(admin.returncode == 3,
                  "root's memtally run exited %s, not its command's 3: %s"
                  % (admin.returncode, aerr))
            check("evicted" not in aerr,
                  "root's run took nobody's eviction for its own: %r" % aerr)
            check(cg.oom_kills() == 0,
                  "the kernel OOM-killed %d in the node" % cg.oom_kills())
    finally:
        end_all(cg, admin, leak)


def test_anothers_eviction_is_not_an_admins():
    """root's `memtally run --task leak` sees every uid's events, and took
    the guard's eviction of nobody's task of that name for its own: when
    its command then failed (exit 3) it said "evicted" and exited 75, which
    a job runner retries. It watches its own uid's events only: nobody's
    leak is evicted (its run exits 75), root's command exits 3, and so does
    its `memtally run`."""
    def start(s, cg, env, cli, fl):
        leak = mt_run(s, cg, "--task", "leak", "--bytes", "32MiB", "--",
                      *fl, "leak", "400", "40", user=(NOBODY, NOGROUP),
                      cli=cli, env=env)

        def evicted():
            _, err = leak.communicate(timeout=60 * MULT)
            check(leak.returncode == 75,
                  "nobody's leak was not evicted: exit %s: %s" % (
                      leak.returncode, err))
        return leak, evicted
    admins_run_beside_a_leak("own", start)


def test_a_command_that_switches_user_is_evicted_as_the_runs():
    """root's `memtally run --task sw` runs its command as nobody
    (setpriv, which execs in place): its workers are nobody's, who holds
    no reservation of "sw", and descend from root's run. They count
    against root's reservation (it does not end when the command switches
    user) as root's candidate, and their eviction is the run's: it says
    so, with the reservation, and exits 75."""
    if not shutil.which("setpriv"):
        raise harness.Skip("no setpriv (util-linux) to switch user with")
    cg = node("switch")
    preload, cli, fl = world_readable_copy(
        os.environ["MEMTALLY_PRELOAD_LIB"], CLI, worker("fleet"))
    run = None
    try:
        with guard_server(cg, "[server]\ngroup = nogroup\n") as s:
            open_to_nobody(s)
            env = run_env(s, MEMTALLY_PRELOAD_LIB=preload)
            run = mt_run(s, cg, "--task", "sw", "--bytes", "32MiB", "--",
                         "setpriv", "--reuid=%d" % NOBODY,
                         "--regid=%d" % NOGROUP, "--clear-groups", "--",
                         *fl, "leak", "400", "40", cli=cli, env=env)
            _, err = run.communicate(timeout=60 * MULT)
            print("  root's run, its command nobody's: exit %s %r" % (
                run.returncode, err.strip()), flush=True)
            log = s.logtext()
            line = log.split('msg="node guard: evicting"')
            check(len(line) > 1 and 'task="sw" uid=0 ' in line[1].split(
                "\n")[0], "root's task sw was not evicted as root's")
            check("counted as its owner's" in log and
                  "reservation ended: its task's workers exited" not in
                  line[0], "the reservation ended when its command "
                  "switched user, before the eviction")
            check(run.returncode == 75 and "evicted by the node guard" in err,
                  "root's run did not say its command was evicted: exit "
                  "%s: %r" % (run.returncode, err))
            # The run's reservation is what it is measured against.
            check("against 32 MiB reserved" in err,
                  "not measured against its reservation: %r" % err)
            check(cg.oom_kills() == 0,
                  "the kernel OOM-killed %d in the node" % cg.oom_kills())
    finally:
        end_all(cg, run)


def test_a_name_taken_without_a_reservation_is_not_an_admins_run():
    """root's `memtally run --task leak` holds a reservation of "leak", so
    the eviction of a task of that name whose uid holds none is its own:
    its command switched user (runuser). nobody's worker took the name
    without a reservation and leaks; the guard evicts it. Its workers do
    not descend from root's run, so they are not its command: root's run
    exits with its command's 3, not with 75 ("evicted") that a job runner
    would retry."""
    def start(s, cg, env, cli, fl):
        env.update(LD_PRELOAD=env["MEMTALLY_PRELOAD_LIB"],
                   MEMTALLY_TASK="leak")
        leak = subprocess.Popen([*fl, "leak", "400", "40"], env=env,
                                stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL,
                                preexec_fn=in_node(cg, (NOBODY, NOGROUP)))

        def evicted():
            rc = leak.wait(timeout=60 * MULT)
            check(rc == -9, "nobody's leak was not evicted: exit %s" % rc)
        return leak, evicted
    admins_run_beside_a_leak("spoof", start)


# A plain process of the node holding 80 MiB until its stdin closes.
HOG = ("import sys; b = bytes([1]) * (80 << 20); "
       "print('ready', flush=True); sys.stdin.read()")


def test_understating_cannot_hide():
    second = second_user()
    cg = node("hide")
    preload, cli, hold = world_readable_copy(
        os.environ["MEMTALLY_PRELOAD_LIB"], CLI, worker("hold"))
    victim = liar = hog = None
    try:
        with guard_server(cg, "[server]\ngroup = nogroup\n") as s:
            open_to_nobody(s)
            env = run_env(s, MEMTALLY_PRELOAD_LIB=preload)
            # nobody's task, granted 8 MiB, holds 50 MiB; then its slot
            # says 1 MiB (its refresh thread off, so that nothing of the
            # client writes the slot again).
            liar = mt_run(s, cg, "--task", "hide", "--bytes", "8MiB", "--",
                          *hold, "50", user=(NOBODY, NOGROUP), cli=cli,
                          env=dict(env, MEMTALLY_REFRESH_MS="0"))
            check(readline(liar, 30).startswith("ready"),
                  "the liar is not ready")

            def liar_pid():
                return [p for p, v in s.ps().items()
                        if v.get("task") == "hide"]
            pid = wait_for("the liar registered", liar_pid, timeout=20)[0]
            held = wait_for("the liar's 50 MiB counted", lambda: (
                s.ps().get(pid, {}).get("bytes", 0) >= 50 * MIB and
                s.ps()[pid]["bytes"]), timeout=20)
            claim(s, pid, -(held - MIB))
            wait_for("the liar's claim at 1 MiB", lambda:
                     s.ps().get(pid, {}).get("bytes", 1 << 40) <= 2 * MIB,
                     timeout=20)
            # What the kernel vouches for is read once a sweep (1 s): the
            # guard sees the liar's 50 MiB once a read after them came.
            wait_for("the kernel's figure of the liar read", lambda:
                     (s.ps().get(pid, {}).get("rss") or 0) >= 48 * MIB,
                     timeout=20)
            # The second user's task, younger: 60 MiB, within its 80.
            victim = mt_run(s, cg, "--task", "etl", "--bytes", "80MiB",
                            "--", *hold, "60", user=(second[0], NOGROUP),
                            cli=cli, env=env)
            check(readline(victim, 30).startswith("ready"),
                  "the victim is not ready")
            # Then what memtally cannot count takes the node past its
            # line (179 MiB). By their claims both tasks are within their
            # reservations, and the other user's the younger and the one
            # that grew; by what the kernel vouches for, the liar is 42
            # MiB beyond its 8.
            hog = subprocess.Popen([sys.executable, "-c", HOG],
                                   env=run_env(s), stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True,
                                   preexec_fn=in_node(cg))
            check(readline(hog, 30).startswith("ready"),
                  "the uncounted process is not ready")
            wait_for("an eviction", lambda:
                     'msg="node guard: evicting"' in s.logtext() or
                     'msg="node guard: pausing"' in s.logtext(),
                     timeout=30)
            log = s.logtext()
            check('msg="node guard: pausing"' not in log,
                  "a task was paused: " + log.split(
                      'msg="node guard: pausing"')[-1].split("\n")[0])
            line = log.split('msg="node guard: evicting"')[1].split("\n")[0]
            check("uid=%d" % NOBODY in line and 'task="hide"' in line,
                  "the eviction was not the liar's: " + line)
            rc = liar.wait(timeout=30 * MULT)
            check(rc == 75, "the liar's run did not end evicted: %s" % rc)
            time.sleep(1.5)  # past the interval: no second choice
            check(victim.poll() is None,
                  "the other user's task was killed: %s" % victim.poll())
            check(s.logtext().count('msg="node guard: evicting"') == 1,
                  "more than one eviction")
            check(cg.oom_kills() == 0,
                  "the kernel OOM-killed %d in the node" % cg.oom_kills())
    finally:
        end_all(cg, victim, liar, hog)


# A plain python3 (no preload: it never registers) holding 150 MiB of the
# 256 MiB node, which takes the node past its 70% line on its own.
BIG_HOG = ("import sys; b = bytes([1]) * (150 << 20); "
       "print('ready', flush=True); sys.stdin.read()")


def stray_beside_a_task(name, start_hog):
    """Another user's task within its reservation (40 MiB of 64), then
    nobody's hog that never registers, started by `start_hog(s, cg, env,
    cli)`: the guard must evict the hog's run, never the task within its
    grant. Returns the hog's exit status, stderr and the server's log."""
    second = second_user()
    cg = node(name)
    preload, cli, hold = world_readable_copy(
        os.environ["MEMTALLY_PRELOAD_LIB"], CLI, worker("hold"))
    victim = hog = None
    try:
        with guard_server(cg, "[server]\ngroup = nogroup\n") as s:
            open_to_nobody(s)
            env = run_env(s, MEMTALLY_PRELOAD_LIB=preload)
            victim = mt_run(s, cg, "--task", "victim", "--bytes", "64MiB",
                            "--", *hold, "40", user=(second[0], NOGROUP),
                            cli=cli, env=env)
            check(readline(victim, 30).startswith("ready"),
                  "the victim is not ready")
            wait_for("the victim registered",
                     lambda: "victim" in tasks_of(s), timeout=20)
            # Evicted as soon as it takes the node past its line: maybe
            # before it says it is ready.
            hog = start_hog(s, cg, env, cli)
            try:
                rc = hog.wait(timeout=30 * MULT)
            except subprocess.TimeoutExpired:
                check(False, "the hog was not evicted; log:\n%s" %
                      s.logtext()[-3000:])
            log = s.logtext()
            time.sleep(1.5)  # past the interval: no second choice
            check(victim.poll() is None,
                  "the task within its reservation was evicted: exit %s; "
                  "log:\n%s" % (victim.poll(), log[-3000:]))
            check(s.logtext().count('msg="node guard: evicting"') == 1,
                  "more than one eviction")
            victim.stdin.close()
            check(victim.wait(timeout=30 * MULT) == 0,
                  "the task did not end well: %s" % victim.returncode)
            check(cg.oom_kills() == 0,
                  "the kernel OOM-killed %d in the node" % cg.oom_kills())
            return rc, hog.stderr.read() if hog.stderr else "", log
    finally:
        end_all(cg, victim, hog)


def test_a_command_that_drops_the_preload_is_its_runs():
    """nobody's `memtally run --bytes 1MiB` whose command runs the hog
    without the preload: the hog is that run's task (its figure, beyond
    the 1 MiB granted), so the run is evicted (exit 75) and says so.
    Before, the guard knew only registered workers: none beyond its
    reservation, it evicted the other user's task within its grant as the
    youngest, and the hog stayed."""
    def start(s, cg, env, cli):
        return mt_run(s, cg, "--task", "dropper", "--bytes", "1MiB", "--",
                      "/usr/bin/env", "-u", "LD_PRELOAD", "/usr/bin/python3",
                      "-c", BIG_HOG, user=(NOBODY, NOGROUP), cli=cli, env=env)
    rc, err, log = stray_beside_a_task("dropper", start)
    check(rc == 75, "the run was not evicted: exit %s: %s" % (rc, err))
    check("evicted by the node guard" in err and "task dropper" in err,
          "the run did not say it was evicted: %r" % err)
    decision = log.split('msg="node guard: evicting"')[1].split("\n")[0]
    check('task="dropper"' in decision and "unregistered=1" in decision,
          "the eviction was not the run's: %s" % decision)

if __name__ == "__main__":
    run([test_leak_is_evicted, test_retry_runs_it_again,
         test_an_evicted_run_leaves_nothing_behind,
         test_a_run_told_to_stop_is_not_run_again,
         test_a_grower_is_paused_then_resumed,
         test_a_paused_task_outlives_memtallyds_death,
         test_a_paused_task_outlives_memtallyds_death_and_a_reset,
         test_a_paused_task_that_left_its_uid_outlives_memtallyds_death,
         test_an_eviction_after_memtallyds_restart_is_the_runs,
         test_orphans_put_off_no_reopen_of_the_watch,
         test_a_run_started_while_memtallyd_is_down_hears_its_eviction,
         test_a_guard_that_may_not_signal_says_so,
         test_a_root_service_that_exec_d_is_still_no_job,
         test_lie_cannot_evict_another_user, test_understating_cannot_hide,
         test_anothers_eviction_is_not_an_admins,
         test_a_command_that_switches_user_is_evicted_as_the_runs,
         test_a_name_taken_without_a_reservation_is_not_an_admins_run,
         test_a_command_that_drops_the_preload_is_its_runs])
