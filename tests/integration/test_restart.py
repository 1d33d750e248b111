"""kill -9 memtallyd with live workers and start it again: every live worker
is listed with the bytes it had, a worker that died meanwhile is gone, and
the adopted workers go on being counted and reclaimed (issue 3,
must-show 4). --reset starts afresh instead."""
from harness import MIB, Server, Worker, check, run, wait_for, worker


def counted(s, pid, at_least):
    return lambda: s.ps().get(pid, {}).get("bytes", 0) >= at_least


def test_restart_adopts_live_workers():
    first = Server()
    a = Worker([worker("mt_hold"), "64", "2"], first.env(group="alpha"))
    b = Worker([worker("mt_hold"), "32"], first.env(group="beta"))
    c = Worker([worker("mt_hold"), "16"], first.env(group="gamma"))
    second = None
    try:
        for w in (a, b, c):
            w.readline()
        wait_for("a counted", counted(first, a.pid, 64 * MIB))
        wait_for("b counted", counted(first, b.pid, 32 * MIB))
        wait_for("c counted", counted(first, c.pid, 16 * MIB))
        before = first.ps()

        first.kill9()
        c.kill()  # dies while no server runs

        second = Server(after=first)
        ps = wait_for("a and b adopted, c gone",
                      lambda: (lambda p: p if set(p) == {a.pid, b.pid}
                               else None)(second.ps()))
        for w, group in ((a, "alpha"), (b, "beta")):
            check(ps[w.pid]["bytes"] == before[w.pid]["bytes"],
                  f"{group}: {ps[w.pid]['bytes']} after restart, "
                  f"{before[w.pid]['bytes']} before")
            check(ps[w.pid]["group"] == group,
                  f"group {ps[w.pid]['group']} != {group}")

        # Adopted workers are still counted live, and still reclaimed.
        a.send("more 10")
        check(a.readline() == "ready", "a did not allocate more")
        wait_for("a's new bytes counted",
                 counted(second, a.pid, before[a.pid]["bytes"] + 10 * MIB))
        b.kill()
        wait_for("b reclaimed by the new server",
                 lambda: b.pid not in second.ps())
        st = second.status()
        check(st["processes"] == 1, f"processes {st['processes']}")
        # And a new worker registers beside the adopted one.
        d = Worker([worker("mt_hold"), "8"], second.env(group="delta"))
        d.readline()
        wait_for("new worker counted", counted(second, d.pid, 8 * MIB))
        d.close()
    finally:
        for w in (a, b, c):
            w.close()
        if second:
            second.stop()
        else:
            first.stop()


def test_reset_starts_afresh():
    first = Server()
    a = Worker([worker("mt_hold"), "24"], first.env(group="alpha"))
    second = None
    try:
        a.readline()
        wait_for("a counted", counted(first, a.pid, 24 * MIB))
        first.kill9()
        second = Server("--reset", after=first)
        # The old slots are gone with the old segment; the worker notices
        # (its segment's tick counter stopped, heartbeat > 2 s old) only
        # when it flushes, so keep it allocating until it re-registers.
        check(second.status()["processes"] == 0, "slots survived --reset")
        held = [24]

        def reattached():
            if a.pid in second.ps():
                return second.ps()[a.pid]
            a.send("more 4")
            check(a.readline() == "ready", "a did not allocate")
            held[0] += 4
            return None

        p = wait_for("a re-registered", reattached, timeout=30,
                     interval=0.2)
        wait_for("a's whole total in the new segment",
                 counted(second, a.pid, held[0] * MIB))
    finally:
        a.close()
        (second or first).stop()


if __name__ == "__main__":
    run([test_restart_adopts_live_workers, test_reset_starts_afresh])
