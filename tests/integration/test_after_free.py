"""Right after a large free, a process is never counted below what the
kernel says it holds.

A C worker (mt_worker quiet) builds ~300 MiB of 40-byte blocks and frees them
all at once, under the glibc front end and under the jemalloc preload.
Both allocators keep what was freed resident (glibc's fast bins, jemalloc's
dirty pages, which it purges over its 10 s decay), and the front ends take
the freed bytes out of the heap at once. From the "drop" until 5 s after
the free, every 50 ms (as fast as the CLI answers), the process's figure
as memtallyd reports it is never more than 16 MiB or 10% below RssAnon.
Before the server counted freed bytes as the allocator's until its next
sample, the figure fell to about nothing for 1.5-3.6 s while RssAnon
stayed at ~300 MiB.

The worker frees right after it built, before any quiet spell in which
the refresh thread would have sampled the allocator with the heap held:
under jemalloc, whose only samples the refresh thread takes, the slot's
first sample comes when that thread starts.
"""
import os
import threading
import time

from harness import (MIB, MULT, PRELOAD, Server, Worker, check, in_parallel,
                     rss_anon, run, wait_for, worker)

GLIBC_LIB = os.path.join(os.path.dirname(PRELOAD), "libmemtally_glibc.so")
SLACK = 16 * MIB


def allowance(anon):
    """How far below RssAnon the figure may be: 10% or 16 MiB."""
    return max(0.10 * anon, SLACK)


class FreeRun:
    """One worker that builds with `build` and frees with `drop` (each a
    line to send and the line it answers; no `build`: nothing to send
    first), sampled around the free: samples = [(seconds since the drop
    was sent, figure, RssAnon)]; t_dropped: when its answer came (seconds
    since the drop was sent)."""

    def __init__(self, s, name, argv, lib, env_extra=None,
                 build=("build", "built"), drop=("drop", "dropped"),
                 ready=True):
        self.s, self.name, self.build, self.drop = s, name, build, drop
        env = s.env(LD_PRELOAD=lib)
        env.pop("MEMTALLY_ALLOCATOR_SWITCHED", None)
        for k, v in (env_extra or {}).items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        self.w = Worker(argv, env)
        self.pid = self.w.pid
        if ready:
            check(self.w.readline().startswith("ready"), f"{name} ready")
        self.samples = []
        self.t_dropped = None

    def step(self, line, answer):
        self.w.send(line)
        got = self.w.readline(timeout=120 * MULT)
        check(got == answer, f"{self.name}: {answer}: {got!r}")

    def sample(self, t0, stop, period):
        while not stop.is_set():
            t = time.monotonic()
            try:
                # The figure first: RssAnon only falls after a free (the
                # allocator purges, then a sample follows), so reading it
                # second can only favour the kernel's side.
                p = self.s.ps().get(self.pid)
                anon = rss_anon(self.pid)
            except Exception as e:  # noqa: BLE001
                print("sample failed", repr(e), flush=True)
                stop.wait(period)
                continue
            if p:
                self.samples.append((t - t0, p["bytes"], anon))
            stop.wait(max(0.0, period - (time.monotonic() - t)))

    def free_and_sample(self, after=5.0, period=0.05):
        """Build, then free while sampling until `after` s past the free."""
        if self.build:
            self.step(*self.build)
            wait_for(f"{self.name}: registered", lambda: self.s.ps().get(
                self.pid))
        stop = threading.Event()
        t0 = time.monotonic()
        th = threading.Thread(target=self.sample, args=(t0, stop, period),
                              daemon=True)
        th.start()
        try:
            self.step(*self.drop)
            self.t_dropped = time.monotonic() - t0
            # At least `after` s, and 20 samples: on a loaded machine
            # each `ps` may take longer than the period.
            end = t0 + self.t_dropped + after
            last = end + 30 * MULT
            while time.monotonic() < end or (
                    len(self.samples) < 20 and time.monotonic() < last):
                time.sleep(0.05)
        finally:
            stop.set()
            th.join()

    def worst(self):
        """(deficit, t, figure, anon) of the sample furthest below
        RssAnon less its allowance (deficit > 0: too low), and the span
        in seconds the figure was below RssAnon by more than it."""
        worst = max(((anon - allowance(anon) - fig, t, fig, anon)
                     for t, fig, anon in self.samples), default=None)
        low = [t for t, fig, anon in self.samples
               if fig < anon - allowance(anon)]
        return worst, (max(low) - min(low) if low else 0.0)

    def over(self):
        """(excess, t) of the sample furthest above RssAnon, and the span
        in seconds the figure was above it by more than its allowance:
        what counting freed bytes until the next sample costs."""
        top = max(((fig - anon, t) for t, fig, anon in self.samples),
                  default=(0, 0.0))
        high = [t for t, fig, anon in self.samples
                if fig > anon + allowance(anon)]
        return top, (max(high) - min(high) if high else 0.0)

    def close(self):
        self.w.close()


def test_never_below_the_kernel_after_a_free():
    with Server() as s:
        runs = []
        try:
            runs.append(FreeRun(s, "C, glibc front end",
                                [*worker("quiet"), "300"], GLIBC_LIB,
                                {"MEMTALLY_ALLOCATOR": "glibc"}))
            runs.append(FreeRun(s, "C, jemalloc preload",
                                [*worker("quiet"), "300"], PRELOAD,
                                {"MEMTALLY_ALLOCATOR": "jemalloc"}))
            in_parallel(runs, lambda r: r.free_and_sample())
        finally:
            for r in runs:
                r.close()
    failures = []
    for r in runs:
        (deficit, t, fig, anon), span = r.worst()
        n = len(r.samples)
        print(f"  {r.name}: {n} samples over {r.samples[-1][0]:.1f} s "
              f"(free took {r.t_dropped:.2f} s); closest to RssAnon's "
              f"floor at +{t:.2f} s: memtally {fig / MIB:.1f} MiB, RssAnon "
              f"{anon / MIB:.1f} MiB; below it for {span:.2f} s",
              flush=True)
        check(n >= 20, f"{r.name}: only {n} samples")
        # The free is real: RssAnon held the heap when it began.
        check(max(a for _, _, a in r.samples) >= 250 * MIB,
              f"{r.name}: RssAnon never held the heap")
        if deficit > 0:
            failures.append(f"{r.name}: memtally {fig / MIB:.1f} MiB, "
                            f"RssAnon {anon / MIB:.1f} MiB at +{t:.2f} s "
                            f"(below it for {span:.2f} s)")
    check(not failures, "below the kernel's figure after a free: " +
          "; ".join(failures))


if __name__ == "__main__":
    run([test_never_below_the_kernel_after_a_free])
