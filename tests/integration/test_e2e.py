"""End to end: preloaded workers are counted, grouped, dropped at death,
and fork/exec keep the counts right."""
import itertools
import os
import signal
import sys
import time

from harness import (KIB, MIB, PRELOAD, Server, Skip, Worker, check,
                     config_file, run, wait_for, worker)

HOLD_PY = ("import sys\n"
           "blocks = [bytearray((1 << 20) - 1) for _ in range({mib})]\n"
           "print('ready', flush=True)\n"
           "sys.stdin.read()\n")


def test_python_groups():
    """Two unmodified python3 holding 100 and 300 MiB: listed with their
    groups, bytes differ by 200 MiB +/- 2 MiB."""
    with Server() as s:
        small = Worker(["python3", "-c", HOLD_PY.format(mib=100)],
                       s.env(group="small"))
        big = Worker(["python3", "-c", HOLD_PY.format(mib=300)],
                     s.env(group="big"))
        try:
            check(small.readline() == "ready", "small not ready")
            check(big.readline() == "ready", "big not ready")

            def settled():
                # ps and status are two queries and may see two ticks: take
                # status between two identical ps answers, so the group's
                # figure and the processes' are of the same moment.
                ps = s.ps()
                st = s.status()
                again = s.ps()
                a, b = ps.get(small.pid), ps.get(big.pid)
                if not a or not b:
                    return None
                for pid, p in ((small.pid, a), (big.pid, b)):
                    if (again.get(pid) or {}).get("bytes") != p["bytes"]:
                        return None
                if a["group"] != "small" or b["group"] != "big":
                    raise AssertionError(f"groups wrong: {a} {b}")
                d = b["bytes"] - a["bytes"]
                return (a, b, st) if abs(d - 200 * MIB) <= 2 * MIB else None

            a, b, st = wait_for("difference of 200 MiB", settled)
            check(a["bytes"] >= 100 * MIB, f"small holds {a['bytes']}")
            groups = {g["name"]: g for g in st["groups"]}
            check(groups["big"]["bytes"] == b["bytes"],
                  f"group big {groups['big']} vs process {b}")
            check(st["processes"] == 2, f"processes {st['processes']}")
            check(st["fleet"]["bytes"] >= a["bytes"] + b["bytes"] - 2 * MIB,
                  f"fleet {st['fleet']}")
        finally:
            small.close()
            big.close()
        wait_for("both gone", lambda: s.status()["processes"] == 0)


def test_sigkill_leaves_within_one_tick():
    """SIGKILL: the worker leaves ps and its bytes leave the fleet total
    without waiting for a tick. The tick is 10 s so that one falling
    between the two status queries is rare; when one does (a loaded
    machine), the figure could have been a tick's doing, so the kill is
    tried again with a new victim, up to four times."""
    with Server(tick=10000) as s:
        def spawn_victim():
            return Worker([*worker("hold"), "64", "4"],
                          s.env(group="victim"))

        keep = Worker([*worker("hold"), "20"], s.env(group="keep"))
        # The first victim starts beside keep, so one tick counts both.
        victim = spawn_victim()
        try:
            keep.readline()
            for attempt in range(4):
                if attempt:
                    victim = spawn_victim()
                try:
                    victim.readline()
                    wait_for("both counted", lambda: (
                        lambda ps: ps.get(victim.pid, {}).get("bytes", 0)
                        >= 64 * MIB and ps.get(keep.pid, {})
                        .get("bytes", 0) >= 20 * MIB)(s.ps()))
                    before = s.status()
                    check(before["fleet"]["bytes"] >= 84 * MIB,
                          f"both not in the fleet: {before['fleet']}")
                    t0 = time.monotonic()
                    victim.proc.send_signal(signal.SIGKILL)
                    victim.proc.wait()
                    ps = wait_for("victim gone", lambda: (
                        lambda ps: ps if victim.pid not in ps else None)(
                            s.ps()))
                    st = s.status()
                    elapsed = time.monotonic() - t0
                finally:
                    victim.close()
                check(keep.pid in ps, "the other worker must stay")
                check(st["fleet"]["bytes"] < 40 * MIB,
                      f"victim's bytes still in the fleet: {st['fleet']}")
                ticks = st["ticks"] - before["ticks"]
                print(f"  victim gone after {elapsed * 1000:.0f} ms, "
                      f"{ticks} tick(s) between")
                if ticks == 0:
                    return
            raise AssertionError("a tick fell between the kill and every "
                                 "look at the fleet: removal not shown to "
                                 "come before a tick")
        finally:
            victim.close()
            keep.close()


def test_fork_child_starts_with_parent_total():
    with Server() as s:
        w = Worker([*worker("fork"), "40"], s.env(group="forky"))
        try:
            lines = {w.readline().split()[0], w.readline().split()[0]}
            check(lines == {"child", "parent"}, f"got {lines}")

            def both_counted():
                # Figures come from the latest tick: wait until both are in.
                ps = s.ps()
                if len(ps) != 2 or ps.get(w.pid, {}).get("bytes", 0) < 40 * MIB:
                    return None
                (child,) = [p for pid, p in ps.items() if pid != w.pid]
                return (ps[w.pid], child) if child["bytes"] >= 40 * MIB else None

            parent, child = wait_for("parent and child counted", both_counted)
            # Both may still allocate a little after the fork (stdio
            # buffers): within one threshold of each other.
            check(abs(child["bytes"] - parent["bytes"]) <= 64 * KIB,
                  f"child {child['bytes']} vs parent {parent['bytes']}")
            check(child["group"] == "forky", f"child group {child['group']}")
        finally:
            w.close()


def test_a_fork_without_handlers_leaves_the_parent_alone():
    """A child made by _Fork() or a raw clone() runs no atfork handler.
    It used to go on writing into its parent's lanes (the parent's figure
    took the child's bytes, raced with its own, and the child was never
    seen). Now the child registers as itself: the parent holds its 16 MiB,
    the child its parent's 16 plus its own 24."""
    for how in ("_Fork", "clone"):
        with Server() as s:
            env = dict(s.env(group="unseen"), MEMTALLY_REFRESH_MS="0")
            w = Worker([*worker("unseen"), "16", "24", how], env)
            try:
                lines = dict(w.readline().split() for _ in range(2))
                child = int(lines["child"].split("=")[1])
                check(set(lines) == {"child", "parent"}, f"got {lines}")

                def child_counted():
                    ps = s.ps()
                    c = ps.get(child, {})
                    return ps if c.get("bytes", 0) >= 40 * MIB else None

                ps = wait_for(f"{how}: the child counted as itself",
                              child_counted)
                parent = ps[w.pid]["bytes"]
                print(f"  {how}: parent {parent / MIB:.1f} MiB, child "
                      f"{ps[child]['bytes'] / MIB:.1f} MiB")
                check(16 * MIB <= parent < 20 * MIB,
                      f"{how}: the parent shows {parent} bytes")
                check(ps[child]["bytes"] < 44 * MIB,
                      f"{how}: the child shows {ps[child]['bytes']}")
                check(ps[child]["group"] == "unseen",
                      f"{how}: child group {ps[child]['group']}")
            finally:
                w.close()


def test_a_fork_without_handlers_that_drops_its_uid_keeps_no_window():
    """A root worker's child made by _Fork() or a raw clone() that gives up
    its uid for nobody's with setuid(), before its first allocation (a
    launcher about to run untrusted code) or after it. Its windows on
    root's slot table stayed writable: whatever ran as nobody there could
    write the claim of every root worker whose slot shared the page, and
    nothing told memtallyd. Now the set-uid call, or the child's first
    allocation, turns them into zero pages, and the parent still shows its
    16 MiB. Dropping early (counted right after the set-uid call, before
    any allocation), the child keeps no writable mapping of root's table;
    dropping late, only its own slot's, where it registered as root before
    the drop, and memtallyd sees it leave (from then root's table counts
    as the kernel vouches for it: test_trust.py). Under both preloads."""
    glibc = os.path.join(os.path.dirname(PRELOAD), "libmemtally_glibc.so")
    for lib, how, when in itertools.product(
            (PRELOAD, glibc), ("_Fork", "clone"), ("early", "late")):
        with Server() as s:
            env = dict(s.env(group="dropped"), MEMTALLY_REFRESH_MS="0",
                       LD_PRELOAD=lib)
            w = Worker([*worker("unseen"), "16", "8", how, "65534",
                        when], env)
            try:
                lines = {}
                for _ in range(2):
                    k, *rest = w.readline().split()
                    lines[k] = dict(x.split("=") for x in rest)
                check(set(lines) == {"child", "parent"}, f"got {lines}")
                left = int(lines["child"]["writable"])
                print(f"  {os.path.basename(lib)}, {how}, setuid "
                      f"{when}: {left} writable mapping(s) of root's "
                      f"table left in the child", flush=True)
                own = 0 if when == "early" else 1
                check(left == own, f"{how}, {when}: the child keeps "
                      f"{left} writable window(s) on root's table, "
                      f"{own} of them its own")
                if own:
                    child = int(lines["child"]["pid"])
                    wait_for(f"{how}: the child seen leaving root",
                             lambda: f"pid={child} uid=0 euid=65534"
                             in s.logtext())
                ps = wait_for(f"{how}: the parent counted", lambda: (
                    lambda p: p if p.get(w.pid, {}).get(
                        "bytes", 0) >= 16 * MIB else None)(s.ps()))
                check(ps[w.pid]["bytes"] < 20 * MIB,
                      f"{how}, {when}: the parent shows "
                      f"{ps[w.pid]['bytes']} bytes")
            finally:
                w.close()


def test_a_deep_fork_chain_is_counted():
    """A chain of 40 nested forks, none exec'ing (a shell's subshells, a
    daemon that forks again): each child inherited its parent's count of
    attachments, and past 16 levels could attach no more, counting locally
    while memtallyd showed it with nothing. The leaf of the chain holds
    24 MiB and is counted, as is every level on the way (past 32 levels
    the attachments a child remembers of its ancestors wrap around)."""
    with Server() as s:
        w = Worker([*worker("chain"), "40", "24"], s.env(group="chain"))
        try:
            line = w.readline().split()
            check(line[:1] == ["leaf"], f"got {line}")
            leaf = int(line[1].split("=")[1])

            def counted():
                ps = s.ps()
                p = ps.get(leaf)
                return ps if p and p.get("bytes", 0) >= 24 * MIB else None

            ps = wait_for("the chain's leaf counted", counted)
            chain = [p for p in ps.values() if p.get("group") == "chain"]
            print(f"  40 nested forks: the leaf counts "
                  f"{ps[leaf]['bytes'] / MIB:.1f} MiB; {len(chain)} of the "
                  f"chain's 41 processes shown", flush=True)
            check(len(chain) == 41, f"{len(chain)} of 41 processes shown")
        finally:
            w.close()


def test_exec_replaces_slot():
    with Server() as s:
        w = Worker([*worker("exec"), "120", "30"], s.env(group="ex"))
        try:
            check(w.readline().startswith("before"), "no before line")
            wait_for("before image counted",
                     lambda: s.ps().get(w.pid, {}).get("bytes", 0) >= 120 * MIB)
            w.send("go")
            check(w.readline().startswith("after"), "no after line")

            def only_new_image():
                procs = s.cli("ps")["processes"]
                mine = [p for p in procs if p["pid"] == w.pid]
                if len(mine) != 1 or len(procs) != 1:
                    return None
                b = mine[0]["bytes"]
                return b if 30 * MIB <= b <= 32 * MIB else None

            wait_for("one slot with the new image's count", only_new_image)
        finally:
            w.close()


EXEC_QUIET = r"""
import os, sys
b = bytearray(300 << 20)
for i in range(0, len(b), 4096):
    b[i] = 1
print("held", flush=True)
sys.stdin.readline()
# A cleared environment: no preload, so the new image never registers.
os.execve("/bin/sleep", ["sleep", "120"], {})
"""


def test_an_exec_into_an_image_that_never_registers_drops_the_old_claim():
    """A worker (root's: claims count in full) held 300 MiB, then exec'd
    a program that never registers (here without the preload; a sleep
    under the jemalloc preload is another). Its slot kept the old claim:
    the fleet counted 300 MiB for a sleep holding a few hundred KiB, for
    the rest of its life. memtallyd sees the exec (its comm changed and
    /proc/PID/stat's arg_start moved) and counts it as the kernel
    vouches until an image of it registers."""
    cfg = config_file("[limits]\nprocess = 200MiB\n")
    with Server("--config", cfg) as s:
        w = Worker([sys.executable, "-c", EXEC_QUIET], s.env(group="ex"))
        try:
            check(w.readline().startswith("held"), "no held line")
            wait_for("300 MiB counted, over its limit", lambda: s.status()[
                "fleet"]["bytes"] >= 300 * MIB and s.ps()[w.pid]["state"]
                == "over")
            mark = open(f"/proc/{w.pid}/stat").read().rsplit(")", 1)[1]
            if mark.split()[45] == "0":
                raise Skip("arg_start reads 0 here (no ptrace access)")
            w.send("")
            wait_for("the exec", lambda: open(
                f"/proc/{w.pid}/comm").read().strip() == "sleep")
            f = wait_for("the old claim no longer counted", lambda: (
                lambda f: f if f["bytes"] < 32 * MIB else None)(
                    s.status()["fleet"]), timeout=20)
            check("exec'd an image that has not registered" in s.logtext(),
                  "the exec is not logged")
            # Its own limit sees the same figure (a sleep holding
            # nothing is not over), and ps says why it counts so.
            p = wait_for("no longer over its own limit", lambda: (
                lambda p: p if p["state"] == "ok" else None)(
                    {x["pid"]: x for x in s.cli("ps")["processes"]}[w.pid]))
            check(p["trust"] == "exec'd an image that has not registered",
                  f"ps says {p['trust']!r}")
            print(f"  exec into a quiet image: fleet {f['bytes'] >> 20} "
                  f"MiB (the slot claims {s.ps()[w.pid]['bytes'] >> 20} "
                  f"MiB)", flush=True)
        finally:
            w.kill()  # a sleep: stdin's end does not stop it


if __name__ == "__main__":
    run([test_python_groups, test_sigkill_leaves_within_one_tick,
         test_fork_child_starts_with_parent_total,
         test_a_fork_without_handlers_leaves_the_parent_alone,
         test_a_fork_without_handlers_that_drops_its_uid_keeps_no_window,
         test_a_deep_fork_chain_is_counted, test_exec_replaces_slot,
         test_an_exec_into_an_image_that_never_registers_drops_the_old_claim])
