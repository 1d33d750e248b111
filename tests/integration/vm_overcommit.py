"""Strict overcommit on a real kernel: the node guard's second edge.

With vm.overcommit_memory = 2 the kernel refuses an allocation that would
take the machine's commit charge (Committed_AS) past CommitLimit, however
much memory is free. memtallyd reads the mode at every check and then
guards whichever edge has less room below its line.

- test_commit_edge: memtallyd (the guard at 70%) on a machine with plenty
  of memory. In the heuristic mode its node is the memory (MemAvailable).
  Set the mode to 2 and its node becomes the commit charge: `status`
  shows CommitLimit, 70% of it as the line and Committed_AS as the
  figure; an Admit that fits the memory but not the commit room is denied
  with the commit charge named; a task committing memory past the line is
  evicted by the guard (its `memtally run` exits 75 naming the commit
  charge) before the kernel refuses anyone. Back to the heuristic mode,
  the node is the memory again.

- test_a_hole_in_a_slot_does_not_stop_memtallyd: a root worker punches a
  hole in its own slot (madvise MADV_REMOVE of its window) while another
  process holds the machine's whole commit charge (both reserves set to
  0 for the while), so memtallyd's next read of that slot cannot be given
  a page: a SIGBUS in memtallyd. It serves on, and the worker counts as
  the kernel vouches for it (`"trust": "slot unreadable"` in `ps`).

The mode is the whole machine's, so this is not a ctest test of its own:
it runs inside test_cgroup_v2's VM (MEMTALLY_IN_VM=1), whose machine is
its own. Elsewhere it skips (77). The mode found is restored at the end.
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import (CLI, MIB, MULT, Server, Skip, Worker,  # noqa: E402
                     check, run, wait_for, worker)
from harness import config_file as config  # noqa: E402

MODE = "/proc/sys/vm/overcommit_memory"
RESERVES = ("/proc/sys/vm/user_reserve_kbytes",
            "/proc/sys/vm/admin_reserve_kbytes")
GUARD = "[guard]\nenabled = true\nline = 70%\ninterval = 1s\n"


def meminfo(key):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no %s in /proc/meminfo" % key)


def set_mode(mode):
    with open(MODE, "w") as f:
        f.write("%d\n" % mode)


def node(s):
    return s.status()["node"]


def test_commit_edge():
    in_vm_only()
    with open(MODE) as f:
        old = int(f.read())
    set_mode(0)  # the heuristic mode, whatever the machine had
    try:
        with Server("--config", config(GUARD)) as s:
            nd = node(s)
            check(nd and nd["edge"] == "memory" and
                  nd["source"] == "meminfo" and
                  nd["limit"] == meminfo("MemTotal"),
                  "heuristic mode: the node is not the memory: %s" % nd)
            set_mode(2)
            limit = meminfo("CommitLimit")
            nd = wait_for("the node on the commit edge", lambda: (
                lambda n: n if n and n["edge"] == "commit" else None)(
                    node(s)), timeout=10)
            committed = meminfo("Committed_AS")
            print("  strict: %s (CommitLimit %d MiB, Committed_AS %d MiB)" % (
                {k: nd[k] >> 20 if isinstance(nd[k], int) else nd[k]
                 for k in nd}, limit >> 20, committed >> 20), flush=True)
            check(nd["limit"] == limit and
                  nd["line"] == limit * 7 // 10 and
                  abs(nd["bytes"] - committed) <= 64 * MIB,
                  "the commit edge's figures: %s (CommitLimit %d, "
                  "Committed_AS %d)" % (nd, limit, committed))
            mem_room = (meminfo("MemTotal") * 7 // 10 -
                        (meminfo("MemTotal") - meminfo("MemAvailable")))
            room = nd["line"] - nd["bytes"]
            ask = room + 64 * MIB
            check(0 < room and ask < mem_room - 64 * MIB,
                  "no request fits the memory and not the commit room: "
                  "commit room %d MiB, memory room %d MiB" % (
                      room >> 20, mem_room >> 20))

            # Admission: fits the memory, not the commit charge.
            out = subprocess.run([CLI, "--socket", s.socket, "admit",
                                  "--bytes", str(ask)], capture_output=True,
                                 text=True, timeout=30 * MULT)
            said = out.stdout + out.stderr
            print("  admit %d MiB: exit %d: %s" % (
                ask >> 20, out.returncode, said.strip()), flush=True)
            check(out.returncode == 3 and
                  "committed on the node (Committed_AS, overcommit strict)"
                  in said and "of CommitLimit" in said,
                  "an Admit past the commit room: exit %d: %s" % (
                      out.returncode, said))

            # The guard: a task whose commit charge grows past the line
            # toward 100 MiB past CommitLimit (the kernel would refuse
            # it first): a fifth at once, the rest over 20 s.
            peak = (limit - committed) // MIB + 100
            env = dict(os.environ, MEMTALLY_SOCKET=s.socket)
            for k in ("LD_PRELOAD", "MEMTALLY_TASK", "MEMTALLY_GROUP"):
                env.pop(k, None)
            leak = subprocess.run(
                [CLI, "--socket", s.socket, "run", "--task", "leak",
                 "--bytes", "32MiB", "--", *worker("fleet"), "leak",
                 str(peak), "20"], env=env, capture_output=True, text=True,
                timeout=120 * MULT)
            print(leak.stderr, flush=True)
            check(leak.returncode == 75,
                  "the leak's memtally run exited %d, not 75: %s" % (
                      leak.returncode, leak.stderr))
            check("evicted by the node guard: node's commit charge at" in
                  leak.stderr and "CommitLimit" in leak.stderr,
                  "the eviction does not name the commit charge: %r" %
                  leak.stderr)
            check(s.proc.poll() is None, "memtallyd died")

            set_mode(0)
            wait_for("the node back on the memory edge",
                     lambda: node(s)["edge"] == "memory", timeout=10)
    finally:
        set_mode(old)


def in_vm_only():
    if os.environ.get("MEMTALLY_IN_VM") != "1":
        raise Skip("sets vm.overcommit_memory, which is the whole "
                   "machine's: runs inside test_cgroup_v2's VM")


def sysctl(path, value=None):
    with open(path) as f:
        old = int(f.read())
    if value is not None:
        with open(path, "w") as f:
            f.write("%d\n" % value)
    return old


def test_a_hole_in_a_slot_does_not_stop_memtallyd():
    in_vm_only()
    old = sysctl(MODE, 0)
    reserves = [sysctl(r) for r in RESERVES]
    try:
        with Server() as s:
            w = Worker(worker("punch", "3"), s.env())
            line = w.readline()
            check(line.startswith("ready window="), "punch: %s" % line)
            wait_for("the worker registered, trusted", lambda: (
                s.ps().get(w.pid, {}).get("trust") == "full"))
            # The whole commit charge, every process's reserve included,
            # then the hole: memtallyd's next read of the slot needs a
            # page no one may take.
            for r in RESERVES:
                sysctl(r, 0)
            sysctl(MODE, 2)
            env = {k: v for k, v in os.environ.items()
                   if k != "LD_PRELOAD"}
            hog = subprocess.run(worker("commit", str(w.pid), "2"),
                                 env=env, capture_output=True, text=True,
                                 timeout=120 * MULT)
            sysctl(MODE, 0)
            for r, v in zip(RESERVES, reserves):
                sysctl(r, v)
            print("  %s (exit %d)" % (hog.stdout.strip(), hog.returncode),
                  flush=True)
            check(hog.returncode == 0 and "full committed=" in hog.stdout,
                  "the commit charge was not taken: %r %r" % (
                      hog.stdout, hog.stderr))
            check(s.alive(), "memtallyd died (status %s) when it read the "
                  "hole: %s" % (s.proc.poll(), s.tail()))
            line = w.readline()
            check(line == "punched errno=0", "punch: %s" % line)
            p = wait_for("the worker counted as the kernel holds", lambda: (
                lambda q: q if q.get("trust") == "slot unreadable"
                else None)(s.ps().get(w.pid, {})), timeout=10)
            print("  after the hole: %s" % {k: p[k] for k in (
                "trust", "bytes", "rss", "unvouched")}, flush=True)
            # Its warning was written while the machine had no page to
            # spare (the log is on a tmpfs here): whole, cut short, or
            # lost, and the lines after it whole.
            run_on = [ln for ln in s.logtext().splitlines()
                      if not ln.startswith("ts=") or ln.count(" ts=")]
            check(not run_on, "log lines run on: %s" % run_on)
            w.close()
    finally:
        sysctl(MODE, old)
        for r, v in zip(RESERVES, reserves):
            sysctl(r, v)


if __name__ == "__main__":
    run([test_commit_edge, test_a_hole_in_a_slot_does_not_stop_memtallyd])
