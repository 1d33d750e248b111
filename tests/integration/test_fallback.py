"""Without jemalloc's activity callback (made to fail on purpose with
MEMTALLY_TEST_NO_ACTIVITY_CALLBACK=1, as a jemalloc lacking the mallctl
would), the preload counts on every allocator call, as its interposer
always did: same figures, same bounds; a large allocation is seen at once,
a free at the thread's next allocator call (or its exit).
"""
from harness import MIB, Server, Worker, check, run, wait_for, worker
from test_accuracy import (cxx_new_delete_counted, family_matches_jemalloc,
                           heap, idle_block, threads_counted_and_freed)

NO_CB = {"MEMTALLY_TEST_NO_ACTIVITY_CALLBACK": "1"}
FRONT = "counting"


def test_fallback_600mb_two_threads_match_jemalloc():
    family_matches_jemalloc(2, 300, NO_CB, FRONT)


def test_fallback_malloc_family_matches_jemalloc():
    family_matches_jemalloc(8, 48, NO_CB, FRONT)


def test_fallback_cxx_new_delete_counted():
    cxx_new_delete_counted(NO_CB)


def test_fallback_threads_counted_and_freed():
    threads_counted_and_freed(NO_CB)


def test_fallback_idle_thread():
    """The large allocation is seen at once; its free, made just before the
    thread goes idle, at the thread's next allocator call (as before: the
    check runs before a free is carried out)."""
    with Server() as s:
        w = Worker([*worker("idle"), "256"], s.env(group="idle", **NO_CB))
        try:
            idle_block(s, w, FRONT)
            w.send("free")
            check(w.readline() == "freed", "not freed")
            w.send("poke")
            check(w.readline() == "poked", "not poked")
            wait_for("the free seen at the thread's next call",
                     lambda: heap(s, w.pid, 1 << 40)
                     < MIB, timeout=5)
        finally:
            w.close()


if __name__ == "__main__":
    run([test_fallback_600mb_two_threads_match_jemalloc,
         test_fallback_malloc_family_matches_jemalloc,
         test_fallback_cxx_new_delete_counted,
         test_fallback_threads_counted_and_freed, test_fallback_idle_thread])
