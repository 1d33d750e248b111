"""Packing on learned sizes: a node (a memory cgroup the test makes, as
bench/fleet.py's make_node does) runs tasks of two kinds whose real peaks
are a third of what they declare, each through `memtally run --kind K
--bytes DECLARED`, memtallyd inside the node with its guard on.

test_learned_sizes_pack_the_node: after a warm-up pass (three runs of each
kind), a batch of 24 tasks waits for room at once. The most running at
once, counted from the node's own process list, is at least twice what
the declarations allow under the fleet limit (its smallest declarations
packed first, so the bound is the most they could ever allow); every task
ends well; the kernel's OOM killer never acts in the node (oom_kill
unchanged), nor does the guard; `memtally kinds` shows each kind's learned
size within 15% above the real peak.

Skipped (77) where no memory cgroup can be made (not root, no writable
memory controller).
"""
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
import harness  # noqa: E402
from harness import CLI, MIB, MULT, Server, check, run, worker  # noqa: E402
from harness import config_file as config  # noqa: E402
import fleet  # noqa: E402

# The node leaves room above the fleet limit for what memtally does not
# count (memtallyd, the workers' own pages, page cache), so the fleet
# limit is what bounds admission and the guard's line (90%) is not met.
NODE = 576 * MIB
FLEET = 384 * MIB
# kind: (real peak MiB, declared MiB)
KINDS = {"small": (32, 96), "large": (48, 144)}
SECS = 3.0
BATCH = ["small", "small", "large"] * 8


def node():
    try:
        return fleet.make_node(NODE, "mt-it-packing-%d" % os.getpid())
    except fleet.NoCgroup as e:
        raise harness.Skip(str(e))


def run_env(s):
    e = dict(os.environ)
    for k in ("LD_PRELOAD", "MEMTALLY_TASK", "MEMTALLY_GROUP"):
        e.pop(k, None)
    e["MEMTALLY_SOCKET"] = s.socket
    return e


def start(s, cg, kind):
    """`memtally run` outside the node, its command inside it: only the
    tasks and memtallyd are the node's memory."""
    peak, declared = KINDS[kind]
    argv = [CLI, "--socket", s.socket, "run", "--kind", kind,
            "--bytes", "%dMiB" % declared, "--wait", "%d" % (120 * MULT),
            "--poll", "0.25", "--"]
    argv += fleet.join_cgroup_argv(cg, [*worker("fleet"), "steady",
                                        str(peak), str(SECS), "0.02"])
    return subprocess.Popen(argv, env=run_env(s), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def finish(procs):
    for kind, p in procs:
        _, err = p.communicate(timeout=180 * MULT)
        check(p.returncode == 0, "a task of kind %s exited %s: %s" % (
            kind, p.returncode, err))


def running(cg):
    """Tasks running in the node now: its processes that are
    `mt_worker fleet`."""
    n = 0
    for pid in cg.pids():
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                argv = f.read().split(b"\0")
            n += (os.path.basename(argv[0]) == b"mt_worker" and
                  argv[1:2] == [b"fleet"])
        except OSError:
            pass
    return n


class Counter(threading.Thread):
    """The most tasks running at once, sampled every 20 ms. A level held
    for less than a sample can be missed: it can only count fewer."""

    def __init__(self, cg):
        super().__init__(daemon=True)
        self.cg = cg
        self.most = 0
        self.halt = threading.Event()

    def run(self):
        while not self.halt.wait(0.02):
            self.most = max(self.most, running(self.cg))


def declarations_allow():
    """The most tasks of the batch whose declared sizes fit the fleet
    limit together: its smallest declarations, packed first."""
    n = total = 0
    for d in sorted(KINDS[k][1] for k in BATCH):
        if total + d * MIB > FLEET:
            break
        total += d * MIB
        n += 1
    return n


def test_learned_sizes_pack_the_node():
    cg = node()
    try:
        join = fleet.join_cgroup_argv(cg, [])
        cfg = config("[limits]\nfleet = %d\n[guard]\nline = 90%%\n" % FLEET)
        with Server("--config", cfg, prefix=join) as s:
            check("node guard on" in s.logtext(),
                  "the guard is not on in a limited node: " + s.logtext())
            oom_before = cg.oom_kills()
            # Warm-up: three runs of each kind, one of each at a time.
            for _ in range(3):
                finish([(k, start(s, cg, k)) for k in KINDS])
            count = Counter(cg)
            count.start()
            t0 = time.monotonic()
            procs = [(k, start(s, cg, k)) for k in BATCH]
            try:
                finish(procs)
            finally:
                count.halt.set()
                count.join()
                for _, p in procs:
                    if p.poll() is None:
                        p.kill()
                        p.wait()
            took = time.monotonic() - t0
            allow = declarations_allow()
            print("  %d tasks in %.1f s; at most %d at once; the "
                  "declarations allow %d" % (len(BATCH), took, count.most,
                                             allow), flush=True)
            check(count.most >= 2 * allow,
                  "at most %d tasks ran at once, not 2 x the %d the "
                  "declarations allow" % (count.most, allow))
            check(cg.oom_kills() == oom_before,
                  "the kernel OOM-killed %d in the node" % (
                      cg.oom_kills() - oom_before))
            check('msg="node guard: evicting"' not in s.logtext(),
                  "the guard evicted a task")
            doc = s.cli("kinds")
            for kind, (peak, _) in KINDS.items():
                k = [x for x in doc["kinds"] if x["kind"] == kind and
                     x["uid"] == 0]
                check(k, "no kind %s: %s" % (kind, doc))
                k = k[0]
                runs = 3 + BATCH.count(kind)
                check(k["runs"] == runs and k["evictions"] == 0,
                      "%s: %d runs, %d evictions, not %d and 0" % (
                          kind, k["runs"], k["evictions"], runs))
                ratio = k["learned"] / (peak * MIB)
                check(1.0 <= ratio <= 1.15,
                      "%s: learned %.1f MiB for a real peak of %d MiB "
                      "(%.3fx)" % (kind, k["learned"] / MIB, peak, ratio))
                # Its profile: the learned size at its largest step,
                # over a length its runs took.
                prof = k["profile"]
                check(prof and prof["length_ms"] > 0
                      and max(prof["bytes"]) == k["learned"],
                      "%s: profile %s, learned %d" % (kind, prof,
                                                      k["learned"]))
                print("  %s: real peak %d MiB, learned %.1f MiB (%.3fx), "
                      "%s; profile over %.1f s" % (
                          kind, peak, k["learned"] / MIB, ratio,
                          k["learned_by"], prof["length_ms"] / 1000),
                      flush=True)
            table = s.cli_text("kinds")
            check("PROFILE" in table and "s: " in table,
                  "no profile in the table:\n" + table)
            check(s.proc.poll() is None, "memtallyd died")
    finally:
        cg.remove()


if __name__ == "__main__":
    run([test_learned_sizes_pack_the_node])
