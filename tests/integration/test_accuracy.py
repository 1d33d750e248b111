"""The preload's count agrees with jemalloc's own stats.allocated within
64 KiB per live thread, for every entry of the malloc family and C++ new,
and a large block is seen inside the very call that allocates or frees it,
even when its thread then goes idle. What is compared is the heap part of
the figure: jemalloc's own free memory (its dirty pages, the free room of
its slabs: allocator_free) is counted beside it, sampled, and is not what
stats.allocated says.

The same functions run with the activity callback made unavailable
(test_fallback.py): the counting fallback must agree just as well.
"""
from harness import KIB, MIB, Server, Worker, check, run, wait_for, worker

FRONT = "activity-callback"


def heap(s, pid, missing=0):
    """The heap part of pid's figure (live blocks), or `missing`."""
    p = s.ps().get(pid)
    if not p:
        return missing
    return p["bytes"] - p["mapped"] - p["allocator_free"]


def family_matches_jemalloc(threads, mib, env=None, front=FRONT):
    with Server() as s:
        w = Worker([*worker("family"), str(threads), str(mib)],
                   s.env(group="family", **(env or {})))
        try:
            line = w.readline(timeout=180)
            fields = dict(kv.split("=") for kv in line.split())
            check(fields["jemalloc"] == "1", "mallctl not found: not jemalloc")
            allocated = int(fields["allocated"])
            live_threads = int(fields["threads"])
            check(allocated > 100 * MIB, f"only {allocated} bytes allocated")
            bound = 64 * KIB * live_threads

            def agrees():
                p = s.ps().get(w.pid)
                return p if p and abs(heap(s, w.pid) - allocated) <= bound \
                    else None

            try:
                p = wait_for("memtally count == stats.allocated", agrees)
            except AssertionError:
                p = s.ps().get(w.pid)
                raise AssertionError(f"memtally {heap(s, w.pid)} vs jemalloc "
                                     f"{allocated}, bound {bound}")
            print(f"  {threads} threads x {mib} MiB ({front}): jemalloc "
                  f"stats.allocated={allocated} memtally heap="
                  f"{heap(s, w.pid)} allocator free {p['allocator_free']}")
        finally:
            w.close()


def test_malloc_family_matches_jemalloc():
    family_matches_jemalloc(8, 48)


def test_600mb_two_threads_match_jemalloc():
    """~600 MB through every entry (malloc, calloc, realloc, reallocarray,
    posix_memalign, aligned_alloc, memalign, valloc, pvalloc, mallocx,
    rallocx, dallocx, sdallocx, free) on two threads."""
    family_matches_jemalloc(2, 300)


def cxx_new_delete_counted(env=None):
    with Server() as s:
        w = Worker(worker("mt_cxx", "64"),
                   s.env(group="cxx", **(env or {})))
        try:
            check(w.readline().startswith("ready"), "mt_cxx not ready")
            wait_for("C++ vectors counted",
                     lambda: 64 * MIB <= heap(s, w.pid)
                     <= 64 * MIB + 2 * MIB)
        finally:
            w.close()


def test_cxx_new_delete_counted():
    cxx_new_delete_counted()


def threads_counted_and_freed(env=None):
    """Blocks held by 4 threads, then freed by the main thread."""
    with Server() as s:
        w = Worker([*worker("hold"), "100", "4"], s.env(**(env or {})))
        try:
            w.readline()
            wait_for("100 MiB counted",
                     lambda: 100 * MIB <= heap(s, w.pid) <= 101 * MIB)
            w.send("free")
            check(w.readline() == "freed", "not freed")
            wait_for("back near zero",
                     lambda: heap(s, w.pid, 1 << 40) < MIB)
        finally:
            w.close()


def test_threads_counted_and_freed():
    threads_counted_and_freed()


def idle_block(s, w, front):
    """mt_worker idle's thread holds 256 MiB and is idle: counted at once."""
    line = w.readline()
    check(line == f"held front={front}", f"mt_worker idle said {line!r}")
    # One or two server ticks (10 ms); the deadline only absorbs a loaded
    # machine. The thread makes no allocator call after its malloc.
    wait_for("the idle thread's 256 MiB counted",
             lambda: 256 * MIB <= heap(s, w.pid)
             <= 257 * MIB, timeout=5)


def test_idle_thread_large_free_seen_at_once():
    """A thread frees 256 MiB and goes idle: the process's figure drops
    without any further call of that thread (its free published itself)."""
    with Server() as s:
        w = Worker([*worker("idle"), "256"], s.env(group="idle"))
        try:
            idle_block(s, w, FRONT)
            w.send("free")
            check(w.readline() == "freed", "not freed")
            wait_for("the idle thread's free seen",
                     lambda: heap(s, w.pid, 1 << 40)
                     < MIB, timeout=5)
        finally:
            w.close()


def test_c11_thread_counted():
    """A thread made with thrd_create (glibc starts it without the
    exported pthread_create) holds 48 MiB: counted, under jemalloc's
    per-thread callback as under any other thread."""
    with Server() as s:
        w = Worker(worker("thrd", 48), s.env())
        try:
            check(w.readline().startswith("ready"), "mt_worker thrd")
            # In the heap, as live blocks: not only as the allocator's
            # memory the process's figure takes in at its next sample.
            wait_for("the C11 thread's 48 MiB counted",
                     lambda: heap(s, w.pid) >= 48 * MIB)
        finally:
            w.close()


if __name__ == "__main__":
    run([test_malloc_family_matches_jemalloc,
         test_600mb_two_threads_match_jemalloc, test_cxx_new_delete_counted,
         test_threads_counted_and_freed,
         test_idle_thread_large_free_seen_at_once, test_c11_thread_counted])
