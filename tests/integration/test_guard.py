"""The node guard: memtallyd inside a small memory cgroup (the node, made
by the test as bench/fleet.py's make_node does) evicts a task before the
kernel's OOM killer has to choose.

- test_leak_is_evicted: a task that leaks, next to a steady one within its
  reservation, on a 256 MiB node whose guard line is 70%. memtallyd, not
  the test, kills the leak; its `memtally run` exits 75 with the figures
  on stderr; the steady task runs to its end; the kernel kills nothing.
- test_retry_runs_it_again: `memtally run --retry 1` of the same leak runs
  it twice, evicted twice, and exits 75.
- test_lie_cannot_evict_another_user: as nobody, a worker naming another
  user's task claims 2^49 bytes and holds real memory that takes the node
  past its line. The guard evicts the liar, not the other user's task
  (within its reservation), though the lie names it.

Skipped (77) where no memory cgroup can be made (not root, no writable
memory controller), or with no second user for the trust test.
"""
import json
import os
import select
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
import harness  # noqa: E402
from harness import (CLI, MIB, MULT, NOBODY, NOGROUP, Server, check,  # noqa: E402
                     open_to_nobody, run, second_user, wait_for, worker,
                     world_readable_copy)
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


def mt_run(s, cg, *args, user=None, cli=CLI, env=None):
    return subprocess.Popen([cli, "--socket", s.socket, "run", *args],
                            env=env or run_env(s), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=in_node(cg, user))


def readline(p, timeout):
    r, _, _ = select.select([p.stdout], [], [], timeout * MULT)
    check(r, "no line from pid %d in %.0f s" % (p.pid, timeout))
    return p.stdout.readline()


def guard_server(cg, extra=""):
    """memtallyd in the node, its guard at 70% of it."""
    join = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', cg.procs()]
    return Server("--config", config(GUARD + extra), prefix=join)


def tasks_of(s):
    return {p.get("task", "") for p in s.ps().values()}


def test_leak_is_evicted():
    cg = node("leak")
    fl = worker("fleet")
    try:
        with guard_server(cg) as s:
            check("node guard on" in s.logtext(),
                  "the guard is not on in a limited node: " + s.logtext())
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
    try:
        with guard_server(cg) as s:
            leak = mt_run(s, cg, "--retry", "1", "--bytes", "32MiB", "--",
                          "/bin/sh", "-c",
                          'echo run >> "$0" && exec "$@"', runs,
                          *fl, "leak", "400", "40")
            _, err = leak.communicate(timeout=120 * MULT)
            print(err, flush=True)
            check(leak.returncode == 75,
                  "exit %s, not 75: %s" % (leak.returncode, err))
            with open(runs) as f:
                n = len(f.read().split())
            check(n == 2, "the command ran %d times, not 2" % n)
            check(err.count("evicted by the node guard") == 2 and
                  "running it again (1 of 1)" in err,
                  "stderr does not tell two evictions and one rerun: %r" % err)
            check(cg.oom_kills() == 0,
                  "the kernel OOM-killed %d in the node" % cg.oom_kills())
    finally:
        cg.remove()


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
            # nobody's worker names the same task, holds 80 MiB (the node
            # passes its line) and claims 2^49 bytes more.
            lenv = dict(env, LD_PRELOAD=preload, MEMTALLY_TASK="etl")
            liar = subprocess.Popen([*hold, "80"], env=lenv,
                                    stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True,
                                    preexec_fn=in_node(cg, (NOBODY, NOGROUP)))
            wait_for("the liar registered", lambda: liar.pid in s.ps(),
                     timeout=20)
            from test_trust import claim
            claim(s, liar.pid, 1 << 49)
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
        for p in (victim, liar):
            if p and p.poll() is None:
                p.kill()
                p.wait()
        cg.remove()


if __name__ == "__main__":
    run([test_leak_is_evicted, test_retry_runs_it_again,
         test_lie_cannot_evict_another_user])
