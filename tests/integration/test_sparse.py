"""A mapping counted in full is brought to the pages the process holds
within a bound, whatever the process does meanwhile, nothing included:

- a single-threaded worker (mt_worker sparse, no refresh thread: it never has a
  second thread) maps 512 MiB, touches 100 MiB and waits in read(2), with
  no further call of any kind: its figure is within 16 MiB of its RssAnon
  at most BOUND seconds after the touch, and stays there, also through
  its next call, a 1 MiB mapping, in which its client reconciles; under
  both preloads;
- an idle `ruby -e sleep` (a 32 MiB heap mapping and a 20 MiB MAP_STACK,
  mostly untouched): within 16 MiB of its RssAnon, both preloads;
- 256 MiB touched, all given back with MADV_DONTNEED (figure 0), 128 MiB
  of it written again without a system call, then a 1 MiB malloc and
  free every half second: within 16 MiB of RssAnon at most REWRITE_BOUND
  seconds after the rewrite, both preloads.

A mapping counts in full while it is young (the client's 1 to 2 s,
memtallyd's 2 s): the idle worker's first figure is checked to be the
whole mapping when it is read early enough.
"""
import os
import shutil
import time

from harness import (MIB, PRELOAD, Server, Skip, Worker, check, deadline,
                     rss_anon, run, wait_for, worker)

SLACK = 16 * MIB
GLIBC_LIB = os.path.join(os.path.dirname(PRELOAD), "libmemtally_glibc.so")
# memtallyd bounds a mapped figure 2 s after it last rose (the longest the
# client counts a new mapping in full), from a kernel read it asks for
# then (the next tick, early reads at most every 100 ms).
BOUND = 2.5
# The next full kernel read (rss_interval, 1 s) finds RssAnon above the
# claim and asks the client to reconcile at its next publish.
REWRITE_BOUND = 2.5


def threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def env_for(s, lib, **extra):
    e = s.env(group="sparse", **extra)
    e["LD_PRELOAD"] = lib
    return e


def say(w, cmd):
    w.send(cmd)
    line = w.readline()
    check(line.split()[:1] == ["ok"], f"{cmd}: {line!r}")


def near(s, pid):
    """(memtally's figure, RssAnon, their difference)"""
    p = s.ps().get(pid)
    ra = rss_anon(pid)
    fig = p["bytes"] if p else None
    return fig, ra, (abs(fig - ra) if fig is not None else None)


def until_near(s, pid, since, bound, what, poke=None):
    """Seconds from `since` until the figure is within SLACK of RssAnon;
    fails past the bound (scaled for a loaded machine), and if it leaves
    that band again in the 2 s after."""
    end = deadline(bound + 5)
    first = None
    while True:
        fig, ra, diff = near(s, pid)
        first = first or (fig, ra)
        if diff is not None and diff <= SLACK:
            took = time.monotonic() - since
            break
        check(time.monotonic() < end,
              f"{what}: never within {SLACK // MIB} MiB of RssAnon: "
              f"memtally {fig}, RssAnon {ra}")
        if poke:
            poke()
        time.sleep(0.05)
    check(took <= bound * float(os.environ.get(
        "MEMTALLY_TEST_TIMEOUT_MULT", "1")) + 0.5,
        f"{what}: {took:.2f} s to come within {SLACK // MIB} MiB of "
        f"RssAnon (bound {bound} s)")
    stay = time.monotonic() + 2
    while time.monotonic() < stay:
        fig, ra, diff = near(s, pid)
        check(diff is not None and diff <= SLACK,
              f"{what}: left the band again: memtally {fig}, RssAnon {ra}")
        if poke:
            poke()
        time.sleep(0.1)
    print(f"  {what}: within {diff / MIB:.1f} MiB of RssAnon "
          f"({ra / MIB:.1f} MiB) {took:.2f} s after; first seen: memtally "
          f"{(first[0] or 0) / MIB:.1f} MiB, RssAnon {first[1] / MIB:.1f} "
          f"MiB", flush=True)
    return took


def sparse_worker(s, lib):
    w = Worker(worker("sparse"), env_for(s, lib, MEMTALLY_REFRESH_MS="0"))
    try:
        check(w.readline().startswith("ready"), "worker not ready")
        # Its first allocator call sets it up and registers it (its
        # stdio buffers are static: nothing else allocates).
        say(w, "poke")
        wait_for("registered", lambda: s.ps().get(w.pid))
    except BaseException:
        w.close()
        raise
    return w


def idle_mapping(lib):
    with Server() as s:
        w = sparse_worker(s, lib)
        try:
            # The mapping's youth counts from its making, not the touch.
            t0 = time.monotonic()
            say(w, "map 512")
            say(w, "touch 0 100")
            fig, ra, _ = near(s, w.pid)
            if time.monotonic() - t0 < 1.0:  # young: counted in full
                check(fig is not None and fig >= 500 * MIB,
                      f"a young mapping counts in full: {fig}")
            check(ra >= 95 * MIB, f"100 MiB touched: RssAnon {ra}")
            until_near(s, w.pid, t0, BOUND, f"{os.path.basename(lib)} "
                       "512 MiB mapped, 100 MiB touched, idle")
            # Its next call is a mapping of 1 MiB: the client reconciles
            # in it, so its own figure falls to what it holds, and the
            # bound (kept: the figure fell) and the figure agree.
            say(w, "map 1")
            end = time.monotonic() + 2.5
            while time.monotonic() < end:
                fig, ra, diff = near(s, w.pid)
                check(diff <= SLACK, f"after a 1 MiB mapping: memtally "
                      f"{fig}, RssAnon {ra}")
                time.sleep(0.05)
            check(threads(w.pid) == 1, "the worker stayed single-threaded")
        finally:
            w.close()


def test_idle_mapping_jemalloc():
    idle_mapping(PRELOAD)


def test_idle_mapping_glibc():
    idle_mapping(GLIBC_LIB)


def idle_ruby(lib):
    ruby = shutil.which("ruby")
    if not ruby:
        raise Skip("no ruby here (scripts/deps.sh installs it)")
    with Server() as s:
        w = Worker([ruby, "-e", "STDOUT.sync = true; puts 'ready'; "
                    "sleep 60"], env_for(s, lib))
        try:
            check(w.readline() == "ready", "ruby not ready")
            until_near(s, w.pid, time.monotonic(), BOUND,
                       f"{os.path.basename(lib)} idle ruby")
        finally:
            w.kill()
            w.close()


def test_idle_ruby_jemalloc():
    idle_ruby(PRELOAD)


def test_idle_ruby_glibc():
    idle_ruby(GLIBC_LIB)


def rewrite_after_dontneed(lib):
    with Server() as s:
        w = sparse_worker(s, lib)
        try:
            say(w, "map 256")
            say(w, "touch 0 256")
            say(w, "dontneed 0 256")
            until_near(s, w.pid, time.monotonic(), 1.0,
                       f"{os.path.basename(lib)} 256 MiB given back")
            say(w, "touch 0 128")
            t0 = time.monotonic()
            ra = rss_anon(w.pid)
            check(ra >= 120 * MIB, f"128 MiB written again: RssAnon {ra}")
            pokes = {"at": 0.0}

            def poke():  # an allocator call every half second
                if time.monotonic() - pokes["at"] >= 0.5:
                    say(w, "poke")
                    pokes["at"] = time.monotonic()
            until_near(s, w.pid, t0, REWRITE_BOUND,
                       f"{os.path.basename(lib)} 128 MiB written again",
                       poke=poke)
            check(threads(w.pid) == 1, "the worker stayed single-threaded")
        finally:
            w.close()


def test_rewrite_after_dontneed_jemalloc():
    rewrite_after_dontneed(PRELOAD)


def test_rewrite_after_dontneed_glibc():
    rewrite_after_dontneed(GLIBC_LIB)


if __name__ == "__main__":
    run([test_idle_mapping_jemalloc, test_idle_mapping_glibc,
         test_idle_ruby_jemalloc, test_idle_ruby_glibc,
         test_rewrite_after_dontneed_jemalloc,
         test_rewrite_after_dontneed_glibc])
