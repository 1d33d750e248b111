"""Memory a program maps itself, counted by the preload (`mapped`):

- a C worker maps 256 MiB of private anonymous memory and touches it:
  exactly 256 MiB mapped; munmap of its upper half: exactly 128 MiB;
  mremap to 384 MiB: exactly 384 MiB; shared anonymous memory and a
  PROT_NONE reservation: not counted; munmap of the rest: 0. `bytes` (what
  limits compare) carries it; `status`, `ps` and /metrics show it.
- fork: the child, which inherits the mappings, is counted for them as a
  process of its own; its exit takes nothing from the parent's figure.
  A region advised MADV_DONTFORK is not in a fork's child, nor in its
  figure; advised MADV_DOFORK again, it is.
- the allocator's own mappings are never counted twice: the same worker
  holding 1 GiB through malloc (16 MiB blocks, which the allocator maps
  for itself) on two threads keeps `mapped` where it was, its heap bytes
  say 1 GiB, and after free it is back within its error bar.
- fork beside a library that maps under its own fork lock never
  deadlocks; nor does a signal handler that maps inside the interposer.
"""
import os
import signal
import subprocess
import time

from harness import (CLI, MIB, MULT, PRELOAD, WORKERS, Server, Worker, check,
                     config_file, run, wait_for, worker)
from test_metrics import get, metrics_url, parse, value


def table(s, *args):
    """The human-readable output of `memtally ARGS`."""
    return subprocess.run([CLI, "--socket", s.socket, *args],
                          capture_output=True, text=True, timeout=30).stdout


def say(w, cmd):
    w.send(cmd)
    line = w.readline()
    check(line.startswith("ok"), f"{cmd}: {line!r}")
    return line


def tol(p):
    """The error bar of a process's heap figure: threshold x threads, and
    at least one threshold (a thread not yet holding a lane)."""
    return max(p["error_bytes"], 64 * 1024)


def settled(s, pid, pred, what):
    """The process's ps entry once `pred` holds for it."""
    return wait_for(what, lambda: (lambda p: p if p and pred(p) else None)(
        s.ps().get(pid)))


def test_own_mappings_counted_exactly():
    # Per-process series are opted in.
    conf = config_file("[metrics]\nper_process = true\n")
    with Server("--config", conf, "--metrics", "127.0.0.1:0") as s:
        url = wait_for("metrics listening", lambda: metrics_url(s))
        w = Worker(worker("map"), s.env(group="maps"))
        try:
            check(w.readline().startswith("ready"), "worker not ready")
            say(w, "reserve 1")  # stdio's buffers allocated and flushed
            base = settled(s, w.pid, lambda p: p["bytes"] > 0, "registered")
            check(base["mapped"] == 0, f"nothing mapped yet: {base}")
            heap0 = base["bytes"]

            say(w, "map 256")
            p = settled(s, w.pid, lambda p: p["mapped"] == 256 * MIB,
                        "256 MiB mapped")
            check(abs(p["bytes"] - 256 * MIB - heap0) <= tol(p),
                  f"bytes carry mapped: {p}, heap before {heap0}")
            st = s.status()
            check(st["fleet"]["mapped"] == 256 * MIB and
                  st["fleet"]["bytes"] >= 256 * MIB, f"status: {st['fleet']}")
            g = next(g for g in st["groups"] if g["name"] == "maps")
            check(g["mapped"] == 256 * MIB, f"group: {g}")
            m = wait_for("metrics show it", lambda: (lambda t: t if value(
                t, "memtally_fleet_mapped_bytes") == 256 * MIB else None)(
                    parse(get(url)[2])))
            mine = [v for k, v in m.items()
                    if k[0] == "memtally_process_mapped_bytes" and
                    ("pid", str(w.pid)) in k[1]]
            check(mine == [256 * MIB], f"process gauge: {mine}")
            check(value(m, "memtally_group_mapped_bytes",
                        group="maps") == 256 * MIB, "group gauge")
            human = table(s, "ps")
            check("MAPPED" in human and "256" in human, f"ps:\n{human}")
            human = table(s, "status")
            check("mapped" in human and "256" in human, f"status:\n{human}")

            say(w, "unmap_half")
            settled(s, w.pid, lambda p: p["mapped"] == 128 * MIB,
                    "half unmapped: 128 MiB")
            say(w, "grow 384")
            settled(s, w.pid, lambda p: p["mapped"] == 384 * MIB,
                    "grown by mremap: 384 MiB")
            w.send("fork")
            lines = [w.readline(), w.readline()]  # either order
            child = int(next(x for x in lines if x.startswith("child"))
                        .split("=")[1])
            check(any(x.startswith("ok forked") for x in lines), f"{lines}")
            c = settled(s, child, lambda p: p["mapped"] == 384 * MIB,
                        "the child counted for what it inherited")
            os.kill(child, signal.SIGTERM)
            wait_for("child gone", lambda: child not in s.ps())
            p = s.ps()[w.pid]
            check(p["mapped"] == 384 * MIB, f"parent unchanged: {p}, "
                  f"child was {c}")
            for advice, want in (("dontfork", 0), ("dofork", 384 * MIB)):
                say(w, f"fork_advice {advice}")
                w.send("fork 8")    # 8 MiB of heap: its figure published
                lines = [w.readline(), w.readline()]
                child = int(next(x for x in lines if x.startswith("child"))
                            .split("=")[1])
                try:
                    settled(s, child, lambda p: p["bytes"] >= 8 * MIB,
                            "the child's figure published")
                    # Before memtallyd's own bound (RssAnon, after a
                    # while) could hide a figure the child got wrong.
                    for _ in range(10):
                        c = s.ps()[child]
                        check(c["mapped"] == want and
                              c["bytes"] < want + 24 * MIB,
                              f"the child of a fork after {advice}: {c}, "
                              f"want {want >> 20} MiB mapped")
                        time.sleep(0.1)
                finally:
                    os.kill(child, signal.SIGTERM)
                wait_for("child gone", lambda: child not in s.ps())
            p = s.ps()[w.pid]
            check(p["mapped"] == 384 * MIB, f"parent unchanged: {p}")
            say(w, "shared 64")
            say(w, "reserve 64")
            w.send("map 0")  # EINVAL from the kernel: nothing counted
            check(w.readline().startswith("error"), "mmap of 0 bytes")
            w.send("malloc 1024 2")  # 1 GiB through the allocator
            check(w.readline().startswith("ok"), "malloc 1 GiB")
            held = settled(s, w.pid, lambda p: p["bytes"] - p["mapped"] >=
                           heap0 + 1024 * MIB - tol(p),
                           "1 GiB of heap counted")
            check(held["mapped"] == 384 * MIB,
                  f"the allocator's own mappings are not in mapped: {held}")
            check(held["bytes"] - held["mapped"] <= heap0 + 1100 * MIB,
                  f"heap counted once: {held}")
            say(w, "free")
            after = settled(s, w.pid, lambda p: abs(
                p["bytes"] - p["mapped"] - heap0) <= tol(p),
                "heap back after free")
            print(f"  heap before {heap0}, held "
                  f"{(held['bytes'] - held['mapped']) / MIB:.1f} MiB, after "
                  f"{after['bytes'] - after['mapped']} (error bar "
                  f"{after['error_bytes']}), mapped {after['mapped'] / MIB} "
                  "MiB throughout", flush=True)
            check(after["mapped"] == 384 * MIB, f"mapped kept: {after}")
            say(w, "unmap")
            settled(s, w.pid, lambda p: p["mapped"] == 0, "all unmapped: 0")
        finally:
            w.close()
        wait_for("fleet mapped back to 0",
                 lambda: s.status()["fleet"]["mapped"] == 0)


def test_reservations_counted_when_committed():
    """Address space reserved PROT_NONE and committed piece by piece, as
    runtimes do: with mprotect (V8, .NET) or with mmap(MAP_FIXED) over it
    (HotSpot). A committed piece counts once, however the commits overlap;
    made read-only or read-execute (a JIT's W^X flips) it still counts; a
    decommitted one (PROT_NONE) stops counting, also after the reservation
    was moved by mremap; the reservation itself never counts. mprotect of
    a mapping that was counted when it was made changes nothing."""
    with Server() as s:
        w = Worker(worker("map"), s.env())
        try:
            check(w.readline().startswith("ready"), "worker ready")
            say(w, "reserve 1")  # stdio's buffers allocated and flushed
            settled(s, w.pid, lambda p: p["bytes"] > 0, "registered")
            steps = [
                ("reserve 256", 0),
                ("commit 0 64", 64),
                ("commit 32 64", 96),      # overlaps [32, 64): once
                ("decommit 0 32", 64),     # [32, 96) left
                ("protect 32 16 rx", 64),  # a JIT's W^X flip: still held
                ("protect 48 16 ro", 64),  # read-only: still held
                ("commit 32 16", 64),      # and back to read-write: once
                ("commit_fixed 128 32", 96),
                ("uncommit_fixed 128 32", 64),
                ("commit 200 8", 72),      # again by mprotect
                ("pkey_commit 220 4", 76),  # by pkey_mprotect
                ("move_resv", 76),         # mremap: committed parts move
                ("protect 32 64 none", 12),  # and decommit after the move
                ("map 16", 28),            # an ordinary mapping
                ("protect_ro", 28),        # counted when made: stays
                ("unreserve", 16),
                ("unmap", 0),
            ]
            for cmd, mib in steps:
                out = say(w, cmd)
                if cmd == "move_resv":
                    # Several mappings move at once from Linux 6.17 on;
                    # before, nothing moves. The figure is the same.
                    print(f"  the kernel: {out.split()[1]}", flush=True)
                # The worker stores its figure before it answers: two
                # ticks later the server has it, changed or not.
                t0 = s.status()["ticks"]
                wait_for("two ticks", lambda: s.status()["ticks"] >= t0 + 2)
                p = s.ps()[w.pid]
                print(f"  {cmd:24s} mapped {p['mapped'] / MIB:.0f} MiB",
                      flush=True)
                check(p["mapped"] == mib * MIB,
                      f"after {cmd!r}: {mib} MiB expected: {p}")
        finally:
            w.close()


def test_signal_handler_mapping_never_deadlocks():
    """A signal handler that maps memory while its thread is inside the
    interposer (or taking its lock) maps uncounted; the process never waits
    for the lock its own thread holds. Thousands of signals land in a
    map/unmap loop, attached (3 s) and with no server (8 s: the window
    is widest there; the old code stalled in about one such run of three);
    a watchdog in the worker says "stalled" when the loop stops moving."""
    with Server() as s:
        for seconds, env in ((3, s.env(group="sig")),
                             (8, s.env(MEMTALLY_SOCKET="/nonexistent/x"))):
            w = Worker([*worker("sigmap"), str(seconds)], env)
            try:
                line = w.readline(timeout=60 + seconds)
                words = line.split()
                check(words[:1] == ["done"], f"the worker stalled: {line!r}")
                # A flood of signals (300,000 in 3 s on an idle machine)
                # can leave the loop a few hundred turns: each signal
                # landed inside it or its handler, which is the point.
                check(int(words[1]) > 100 and int(words[2]) > 100,
                      f"too few iterations or signals to mean anything: "
                      f"{line}")
                print(f"  {seconds} s: {words[1]} map/unmap pairs, "
                      f"{words[2]} signals handled, no stall", flush=True)
            finally:
                w.close()


def test_a_librarys_fork_lock_never_deadlocks():
    """A library set up before the preload maps memory under a lock of its
    own and takes that lock around fork() (its handlers run after the
    preload's prepare handler). One thread maps and unmaps through it while
    the other forks 2000 times: it ends, under the jemalloc preload and the
    glibc front end, as it does without memtally. The old code took its
    table's lock in its prepare handler and waited there for ever."""
    glibc = os.path.join(os.path.dirname(PRELOAD), "libmemtally_glibc.so")
    prog = os.path.join(WORKERS, "mt_forklock")
    with Server() as s:
        for lib in (PRELOAD, glibc):
            if not os.path.exists(lib):
                print(f"  {lib} not built: not run under it", flush=True)
                continue
            try:
                out = subprocess.run([prog, "2000"], env=s.env(
                    group="forklock", LD_PRELOAD=lib), capture_output=True,
                    text=True, timeout=60 * MULT)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"deadlocked under {lib}")
            check(out.returncode == 0 and out.stdout == "no deadlock\n",
                  f"under {lib}: exit {out.returncode}: {out.stdout!r} "
                  f"{out.stderr!r}")
            print(f"  {os.path.basename(lib)}: 2000 forks beside the "
                  f"library's mapping thread, no deadlock", flush=True)


if __name__ == "__main__":
    run([test_own_mappings_counted_exactly,
         test_reservations_counted_when_committed,
         test_signal_handler_mapping_never_deadlocks,
         test_a_librarys_fork_lock_never_deadlocks])
