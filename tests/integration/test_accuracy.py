"""The preload's count agrees with jemalloc's own stats.allocated within
64 KiB per live thread, for every entry of the malloc family and C++ new
."""
from harness import KIB, MIB, Server, Worker, check, run, wait_for, worker


def test_malloc_family_matches_jemalloc():
    with Server() as s:
        w = Worker([worker("mt_family"), "8", "48"], s.env(group="family"))
        try:
            line = w.readline(timeout=120)
            fields = dict(kv.split("=") for kv in line.split())
            check(fields["jemalloc"] == "1", "mallctl not found: not jemalloc")
            allocated = int(fields["allocated"])
            live_threads = int(fields["threads"])
            check(allocated > 100 * MIB, f"only {allocated} bytes allocated")
            bound = 64 * KIB * live_threads

            def agrees():
                p = s.ps().get(w.pid)
                return p if p and abs(p["bytes"] - allocated) <= bound else None

            try:
                p = wait_for("memtally count == stats.allocated", agrees)
            except AssertionError:
                p = s.ps().get(w.pid)
                raise AssertionError(f"memtally {p and p['bytes']} vs jemalloc "
                                     f"{allocated}, bound {bound}")
            print(f"  jemalloc stats.allocated={allocated} memtally="
                  f"{p['bytes']} diff={p['bytes'] - allocated}")
        finally:
            w.close()


def test_cxx_new_delete_counted():
    with Server() as s:
        w = Worker([worker("mt_cxx"), "64"], s.env(group="cxx"))
        try:
            check(w.readline().startswith("ready"), "mt_cxx not ready")
            wait_for("C++ vectors counted",
                     lambda: 64 * MIB <= s.ps().get(w.pid, {}).get("bytes", 0)
                     <= 64 * MIB + 2 * MIB)
        finally:
            w.close()


def test_threads_counted_and_freed():
    """Blocks held by 4 threads, then freed by the main thread."""
    with Server() as s:
        w = Worker([worker("mt_hold"), "100", "4"], s.env())
        try:
            w.readline()
            wait_for("100 MiB counted", lambda: 100 * MIB <= s.ps()
                     .get(w.pid, {}).get("bytes", 0) <= 101 * MIB)
            w.send("free")
            check(w.readline() == "freed", "not freed")
            wait_for("back near zero",
                     lambda: s.ps().get(w.pid, {}).get("bytes", 1 << 40) < MIB)
        finally:
            w.close()


if __name__ == "__main__":
    run([test_malloc_family_matches_jemalloc, test_cxx_new_delete_counted,
         test_threads_counted_and_freed])
