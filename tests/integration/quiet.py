"""What the managed-heap tests share (test_go_heap.py, test_jvm_heap.py):
a worker that holds ~300 MiB of small objects on "hold", drops them with
its runtime's collection on "drop", and on "flush" does something that
lets the preload reconcile its mapped figure (what a quiet process gets
from the periodic refresh); each answered with a line starting "ok".

hold_drop_idle() checks memtally's figure against the growth of the
process's RssAnon while held (within 10% or 16 MiB), against RssAnon's
residue 5 s after the drop (the same), and, sampled throughout, never
below the figure the process started with (less the heap's own error bar,
threshold x threads: the malloc front end's drift, not the mappings).
"""
import threading
import time

from harness import MIB, check, rss_anon, wait_for

SLACK = 16 * MIB


def say(w, cmd, timeout=60):
    w.send(cmd)
    line = w.readline(timeout=timeout)
    check(line.startswith("ok"), f"{cmd}: {line!r}")
    return line


def near(a, b):
    return abs(a - b) <= max(0.10 * abs(b), SLACK)


class Sampler:
    """The process's figure, as often as the CLI answers, from before it
    registers: samples = [(monotonic time, bytes, error_bytes)]."""

    def __init__(self, s, pid):
        self.s, self.pid = s, pid
        self.samples = []
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop.is_set():
            try:
                p = self.s.ps().get(self.pid)
            except AssertionError:
                continue
            if p:
                self.samples.append((time.monotonic(), p["bytes"],
                                     p["error_bytes"]))

    def close(self):
        self.stop.set()
        self.t.join()

    def lowest(self, since=0.0):
        return min((b for t, b, e in self.samples if t >= since),
                   default=None)


def agree(s, w, start, rss0, what, timeout=20):
    """Poll until the figure's growth since `start` agrees with RssAnon's
    growth since rss0 at the same moment, flushing the worker between
    polls; returns (figure growth, RssAnon growth)."""
    last = {}

    def ok():
        p = s.ps().get(w.pid)
        grown = rss_anon(w.pid) - rss0
        last["v"] = (p and p["bytes"] - start["bytes"], grown,
                     p and p["mapped"])
        if p and near(p["bytes"] - start["bytes"], grown):
            return p["bytes"] - start["bytes"], grown
        say(w, "flush")
        return None
    try:
        wait_for(what, ok, timeout=timeout)
        # And still half a second later (refreshed): the figures shown.
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            say(w, "flush")
            time.sleep(0.05)
        return wait_for(what, ok, timeout=timeout)
    except AssertionError as e:
        raise AssertionError(f"{e}: memtally +{last['v'][0]}, RssAnon "
                             f"+{last['v'][1]}, mapped {last['v'][2]}")


def settled(s, w, what):
    """The process's ps entry once its figure has stopped moving: the same
    after 2.2 s of flushes (ranges mapped lately count in full for one to
    two seconds, then for what of them is resident)."""
    last = {}

    def same():
        p = s.ps().get(w.pid)
        end = time.monotonic() + 2.2
        while time.monotonic() < end:
            say(w, "flush")
            time.sleep(0.05)
        q = s.ps().get(w.pid)
        ok = p and q and abs(q["bytes"] - p["bytes"]) <= MIB
        last["v"] = q
        return q if ok else None
    return wait_for(what, same, timeout=30)


def hold_drop_idle(s, w, name, low, from_first=True):
    """Run the worker through hold, drop and 5 s idle; returns the row
    (name, held: memtally, RssAnon; 5 s after drop: memtally, RssAnon).
    `low` is a Sampler started with the worker: its first figure is the
    one the process started with; never below it unless not `from_first`
    (a program whose first mappings are plain ones it never touches: they
    count in full for their first 1-2 s, then not), and never below the
    figure it settled at either way."""
    start = settled(s, w, f"{name}: started")
    started = time.monotonic()
    rss0 = rss_anon(w.pid)
    try:
        say(w, "hold", timeout=120)
        held = agree(s, w, start, rss0, f"{name}: held counted")
        check(held[1] >= 200 * MIB, f"{name} holds over 200 MiB: {held}")
        say(w, "drop", timeout=120)
        dropped = time.monotonic()
        while time.monotonic() < dropped + 5:  # idle; refreshed
            say(w, "flush")
            time.sleep(0.1)
        after = agree(s, w, start, rss0, f"{name}: 5 s after the drop",
                      timeout=10)
    finally:
        low.close()
    _, first, first_err = low.samples[0]
    lowest, lowest_since = low.lowest(), low.lowest(started)
    row = (name, held, after)
    print(f"  {name}: held memtally +{held[0] / MIB:.1f} MiB, RssAnon "
          f"+{held[1] / MIB:.1f} MiB; 5 s after drop memtally "
          f"+{after[0] / MIB:.1f} MiB, RssAnon +{after[1] / MIB:.1f} MiB; "
          f"first figure {first / MIB:.1f} MiB, settled "
          f"{start['bytes'] / MIB:.1f} MiB (mapped "
          f"{start['mapped'] / MIB:.1f}), lowest {lowest / MIB:.1f} MiB, "
          f"since settled {lowest_since / MIB:.1f} MiB", flush=True)
    # Below where it started by no more than the heap's error bar
    # (threshold x threads: the malloc front end's drift) or 16 MiB (a
    # runtime frees some of what it allocated while starting: the JIT's
    # arenas); a figure that falls below its start by what the runtime
    # uncommitted falls by hundreds of MiB.
    check(not from_first or lowest >= first - max(first_err, SLACK),
          f"{name}: below its first figure {first}: {lowest}")
    check(lowest_since >= start["bytes"] - max(start["error_bytes"], SLACK),
          f"{name}: below its settled figure {start}: {lowest_since}")
    return row
