"""A wild write in one worker never reaches another process's figure.

A buggy program that writes backwards from the start of a 256 KiB block
(mapped on its own by glibc and by jemalloc alike) dies at once with
SIGSEGV without memtally. Under memtally its slot is the only part of the
uid's slot table it maps, between inaccessible guard regions, so the same
program still dies with SIGSEGV at once, and a second worker of the same
uid holding 50 MiB keeps its exact figure and is never flagged corrupt.
Checked under the jemalloc preload and the glibc front end, as root and as
nobody (both workers of one uid each time), with the block taken before
memtally attached (its slot is then mapped right below the block) and
after.

A worker's only writable memtally mapping is the page of its own slot. A
forked child (which inherits its parent's) keeps none of its parent's: it
ends with its own slot's page only, and both are counted.
"""
import os

from harness import (MIB, NOBODY, NOGROUP, PRELOAD, Server, Worker, check,
                     open_to_nobody, run, settled_bytes, wait_for,
                     world_readable_copy)
from harness import config_file, worker

GLIBC_LIB = os.path.join(os.path.dirname(PRELOAD), "libmemtally_glibc.so")
# Copies every user can reach: the build tree may be in a 0700 directory.
HOLD, WILD, PUB_PRELOAD, PUB_GLIBC = world_readable_copy(
    worker("hold"), worker("wild"), PRELOAD, GLIBC_LIB)
HOLD_MIB = 50
PAGE = os.sysconf("SC_PAGE_SIZE")


def slot_mappings(pid):
    """pid's writable shared mappings of a slot table: (size, offset)."""
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) < 6 or "-slots:" not in line:
                continue
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if fields[1].startswith("rw") and fields[1][3] == "s":
                out.append((hi - lo, int(fields[2], 16)))
    return out


def plain_dies():
    """The program without memtally: SIGSEGV at once."""
    w = Worker([*WILD, "first"], dict(os.environ, LD_PRELOAD=""))
    try:
        w.readline()
        w.send("go")
        rc = w.proc.wait(timeout=60)
    finally:
        w.close()
    check(rc == -11, f"without memtally the wild writer ends with {rc}, "
          "not SIGSEGV")


def wild_beside_holder(lib, user):
    for order in ("first", "later"):
        one_wild(lib, user, order)


def one_wild(lib, user, order):
    with Server("--config", config_file("[server]\ngroup = 65534\n")) as s:
        if user is not None:
            open_to_nobody(s)
        env = s.env(LD_PRELOAD=lib)
        # The holder's figure is its heap alone: the allocator's free
        # memory is a sample taken on the worker's own clock (every 10 s),
        # which may land between the two readings compared here.
        hold = Worker([*HOLD, str(HOLD_MIB)],
                      s.env(LD_PRELOAD=lib, MEMTALLY_ALLOCATOR_FREE="0"),
                      user=user)
        wild = None
        try:
            hold.readline()
            before = settled_bytes(s, hold.pid)
            p = s.ps()[hold.pid]
            check(abs(before - HOLD_MIB * MIB) <= p["error_bytes"] + MIB,
                  f"the holder's figure {before} is 50 MiB")
            wild = Worker([*WILD, order], env, user=user)
            wild.readline()
            wait_for("the wild writer registered",
                     lambda: wild.pid in s.ps())
            check(s.ps()[wild.pid]["uid"] == s.ps()[hold.pid]["uid"],
                  "both workers of one uid")
            wild.send("go")
            rc = wild.proc.wait(timeout=120)
            check(rc == -11, f"the wild writer ({order}) ended with {rc}, "
                  "not SIGSEGV (plain behaviour)")
            # Ticks after the writes: the holder's slot was read again.
            t0 = s.status()["ticks"]
            wait_for("ticks", lambda: s.status()["ticks"] >= t0 + 5)
            p = s.ps()[hold.pid]
            check(not p.get("corrupt"),
                  f"wild writer ({order}): the holder is flagged corrupt: {p}")
            check(abs(p["bytes"] - before) <= p["error_bytes"],
                  f"wild writer ({order}): the holder's figure moved: "
                  f"{before} -> {p['bytes']}")
            check("slot counters corrupt" not in s.logtext(),
                  "a slot was flagged corrupt")
            hold.send("exit")
        finally:
            if wild is not None:
                wild.close()
            hold.close()


def fork_child_maps_its_own_slot(lib):
    with Server() as s:
        w = Worker([*worker("fork"), "8"], s.env(LD_PRELOAD=lib))
        try:
            pids = {}
            for _ in range(2):
                who, pid = w.readline().split()
                pids[who] = int(pid.split("=")[1])
            child = pids["child"]
            wait_for("parent and child counted", lambda: all(
                s.ps().get(p, {}).get("bytes", 0) >= 8 * MIB
                for p in pids.values()))
            own = {who: slot_mappings(pid) for who, pid in pids.items()}
            for who, maps in own.items():
                check(len(maps) == 1 and maps[0][0] <= 2 * PAGE,
                      f"the {who} maps more than its own slot's page: "
                      f"{maps}")
            # The child started from its parent's heap total, in its own
            # slot (the free memory glibc keeps is sampled by each apart).
            ps = s.ps()
            heap = {p: ps[p]["bytes"] - ps[p]["allocator_free"]
                    for p in pids.values()}
            check(abs(heap[child] - heap[w.pid]) <= 64 * 1024,
                  f"child {heap[child]} vs parent {heap[w.pid]}")
        finally:
            w.close()


def test_fork_preload():
    fork_child_maps_its_own_slot(PRELOAD)


def test_fork_glibc():
    fork_child_maps_its_own_slot(GLIBC_LIB)


def test_plain_program_segfaults():
    plain_dies()


def test_preload_root():
    wild_beside_holder(PUB_PRELOAD, None)


def test_preload_nobody():
    wild_beside_holder(PUB_PRELOAD, (NOBODY, NOGROUP))


def test_glibc_root():
    wild_beside_holder(PUB_GLIBC, None)


def test_glibc_nobody():
    wild_beside_holder(PUB_GLIBC, (NOBODY, NOGROUP))


if __name__ == "__main__":
    run([test_plain_program_segfaults, test_preload_root,
         test_preload_nobody, test_glibc_root, test_glibc_nobody,
         test_fork_preload, test_fork_glibc])
