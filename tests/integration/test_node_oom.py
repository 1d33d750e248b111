"""A node that really runs out of memory: a memory cgroup made by the test
(bench/fleet.py's make_node), the kernel's OOM killer inside it.

- memtally's policy (memtallyd inside the node, tasks started by `memtally
  run --bytes DECLARED --wait`) on a small node loses no task and sees no
  kernel OOM kill on a workload where the same tasks run without a policy
  are OOM-killed by the kernel.
- memtallyd inside the node during a real OOM kill: it survives (its own
  oom_score_adj lowered, the node's other tasks standing above it as
  workers do in production), reclaims the killed worker like any other
  death,
  and answers a status request within 100 ms.

Skipped (77) where no memory cgroup can be made (not root, no writable
memory controller).
"""
import os
import subprocess
import sys
import tempfile
import time

import harness
from harness import MIB, check, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
import fleet  # noqa: E402


def node(limit, name):
    try:
        return fleet.make_node(limit, "mt-it-node-%d-%s" % (os.getpid(), name))
    except fleet.NoCgroup as e:
        raise harness.Skip(str(e))


class Args:
    """What fleet.run_policy takes from the command line."""

    def __init__(self, tmp):
        self.c_worker = harness.worker("fleet")
        self.py_worker = os.path.join(HERE, "..", "..", "bench",
                                      "fleet_worker.py")
        self.build = os.path.dirname(os.path.dirname(harness.MEMTALLYD))
        self.slots = 8


def test_memtally_keeps_a_small_node_alive():
    """24 tasks on a 320 MiB node, 8 slots. Without a policy the kernel
    kills; with memtally every task completes and the kernel kills none."""
    node(64 * MIB, "probe").remove()
    limit = 320 * MIB
    tasks = fleet.make_workload(3, 24, "batch", limit // MIB)
    for t in tasks:                 # short: the test is about a minute
        t.secs = min(t.secs, 2.5)
    env = dict(os.environ, LD_PRELOAD=harness.PRELOAD,
               MEMTALLY_SOCKET="/nonexistent/memtally.sock")
    with tempfile.TemporaryDirectory(prefix="mt-it-fleet-") as tmp:
        args = Args(tmp)
        fleet.Runner.deadline = 120 * harness.MULT
        none = fleet.run_policy(fleet.NonePolicy(), limit, tasks, args,
                                "batch", tmp, env)
        sn = fleet.summarise(none, limit)
        print("none:", sn, flush=True)
        check(sn["kernel_kills"] >= 1 and none.kernel_oom_counter >= 1,
              "without a policy the node should run out: %s" % sn)
        mt = fleet.run_policy(fleet.MemtallyPolicy(), limit, tasks, args,
                              "batch", tmp, env)
        sm = fleet.summarise(mt, limit)
        print("memtally:", sm, mt.daemon, mt.forecast, flush=True)
        check(sm["lost"] == 0 and sm["completed"] == len(tasks),
              "memtally lost tasks: %s" % sm)
        check(sm["kernel_kills"] == 0 and mt.kernel_oom_counter == 0,
              "the kernel OOM-killed under memtally: %s (counter %d)" % (
                  sm, mt.kernel_oom_counter))
        check(mt.daemon["alive"], "memtallyd died: %s" % mt.daemon)


def test_daemon_survives_node_oom():
    """memtallyd and a worker in a 192 MiB node; the worker ramps to 400
    MiB and the kernel kills it. memtallyd lives, its score lowered,
    reclaims the worker, and answers status within 100 ms."""
    cg = node(192 * MIB, "oom")
    bystander = None
    try:
        # The node's other tasks stand where workers stand in production,
        # 900 and more above memtallyd (its unit's OOMScoreAdjust=-900;
        # here it stays at 0, lowering needs CAP_SYS_RESOURCE): the
        # worker first (1000), then an idle bystander (900). Without one,
        # memtallyd was the only task left when the kernel, a few ms after
        # killing the worker and before its memory was back, found the
        # node still full as memtallyd faulted in the pages its reclaim
        # touched (seen under ThreadSanitizer, whose shadow memory makes
        # those faults many), and killed it next.
        join = ["/bin/sh", "-c", 'echo $$ > "$0" && echo 1000 > '
                '/proc/self/oom_score_adj && exec "$@"', cg.procs()]
        bystander = subprocess.Popen(
            ["/bin/sh", "-c", 'echo $$ > "$0" && echo 900 > '
             '/proc/self/oom_score_adj && exec sleep 600', cg.procs()],
            env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
        # memtallyd starts with a high score (raising needs no privilege)
        # and is configured to lower it to 0, which it may do without
        # CAP_SYS_RESOURCE too: what it does as root under its default.
        high = ["/bin/sh", "-c", 'echo $$ > "$0" && echo 500 > '
                '/proc/self/oom_score_adj && exec "$@"', cg.procs()]
        conf = harness.config_file("[server]\noom_score_adj = 0\n")
        with harness.Server("--config", conf, prefix=high) as s:
            adj = int(open("/proc/%d/oom_score_adj" % s.proc.pid).read())
            check(adj == 0, "memtallyd's oom_score_adj is %d, not lowered "
                  "from 500 to 0" % adj)
            w = harness.Worker(join + [*harness.worker("fleet"), "ramp",
                                       "400", "10"], s.env())
            pid = w.proc.pid
            wait_for("the worker registered", lambda: pid in s.ps(),
                     timeout=20)
            rc = w.proc.wait(60 * harness.MULT)
            check(rc == -9, "the worker should be OOM-killed, exit %s" % rc)
            check(cg.oom_kills() >= 1, "no OOM kill counted in the node")
            check(s.proc.poll() is None, "memtallyd died in the node's OOM "
                  "(%d OOM kills in the node)" % cg.oom_kills())
            wait_for("the killed worker reclaimed", lambda: pid not in s.ps(),
                     timeout=10)
            sys.path.insert(0, os.environ.get("MEMTALLY_PYTHON", os.path.join(
                HERE, "..", "..", "python")))
            from memtally import client as mc
            with mc.Client(s.socket, timeout=2.0) as c:
                worst = 0.0
                for _ in range(5):
                    t = time.monotonic()
                    u = c.usage()
                    worst = max(worst, time.monotonic() - t)
                check(u.processes == 0, "processes left: %d" % u.processes)
            check(worst < 0.1 * harness.MULT,
                  "status took %.1f ms" % (worst * 1000))
    finally:
        if bystander:
            bystander.kill()
            bystander.wait()
        cg.remove()


if __name__ == "__main__":
    harness.run([test_memtally_keeps_a_small_node_alive,
                 test_daemon_survives_node_oom])
