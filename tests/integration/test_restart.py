"""kill -9 memtallyd with live workers and start it again: every live worker
is listed with the bytes it had, a worker that died meanwhile is gone, and
the adopted workers go on being counted and reclaimed. --reset starts
afresh instead. A worker outlives more restarts than it keeps attachments
for, stays counted, and past them asks memtallyd nothing. A worker's maps
cannot hold a restart up, nor a worker that changed its uid be adopted as
what it was. The reservations granted before a restart are held after it;
--reset forgets them."""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import time

from harness import (CLI, MIB, MULT, NOBODY, NOGROUP, PRELOAD, Server, Skip,
                     Worker, check,
                     claim, config_file, line_within, open_to_nobody, run,
                     second_user, settled_bytes, wait_for, worker,
                     world_readable_copy)


def counted(s, pid, at_least):
    return lambda: s.ps().get(pid, {}).get("bytes", 0) >= at_least


def settled(s, pids, ticks=20):
    """ps once every worker's figure has stayed the same over `ticks` ticks
    (a thread's last flush may land just after it first looked complete)."""
    last = {}

    def same():
        t0 = s.status()["ticks"]
        ps = s.ps()
        now = {p: ps.get(p, {}).get("bytes") for p in pids}
        wait_for(f"{ticks} ticks", lambda: s.status()["ticks"] >= t0 + ticks)
        ok = now == last.get("v")
        last["v"] = now
        return ps if ok else None
    return wait_for("figures settled", same)


def test_restart_adopts_live_workers():
    first = Server()
    # Their figure is their heap alone: the allocator's free memory is a
    # sample taken on the worker's own clock (every 10 s), which may land
    # between the two readings compared here on a busy machine.
    heap = {"MEMTALLY_ALLOCATOR_FREE": "0"}
    a = Worker([*worker("hold"), "64", "2"], first.env(group="alpha", **heap))
    # b without its refresh thread: that would register it again on its
    # own once the heartbeat is 2 s stale, before the check below on a
    # slow (sanitized) restart; b learns of the restart as it allocates.
    b = Worker([*worker("hold"), "32"],
               first.env(group="beta", MEMTALLY_REFRESH_MS="0", **heap))
    c = Worker([*worker("hold"), "16"], first.env(group="gamma", **heap))
    second = None
    try:
        for w in (a, b, c):
            w.readline()
        wait_for("a counted", counted(first, a.pid, 64 * MIB))
        wait_for("b counted", counted(first, b.pid, 32 * MIB))
        wait_for("c counted", counted(first, c.pid, 16 * MIB))
        before = settled(first, (a.pid, b.pid, c.pid))

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
        d = Worker([*worker("hold"), "8"], second.env(group="delta"))
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
    a = Worker([*worker("hold"), "24"], first.env(group="alpha"))
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

        wait_for("a re-registered", reattached, timeout=30,
                     interval=0.2)
        wait_for("a's whole total in the new segment",
                 counted(second, a.pid, held[0] * MIB))
    finally:
        a.close()
        (second or first).stop()




def test_kill9_under_load_loses_nothing():
    """memtallyd SIGKILLed while workers churn and queries run; restarted:
    the steady holders keep exactly their bytes, the churners that exit
    leave, and the fleet ends at exactly the holders' total."""
    import subprocess
    import threading
    first = Server()
    # Their figure is their heap alone: the allocator's free memory is a
    # sample taken on the worker's own clock, not a count kept across.
    holders = [Worker([*worker("hold"), str(8 * (i + 1)), "2"],
                      first.env(group="hold", MEMTALLY_ALLOCATOR_FREE="0"))
               for i in range(3)]
    churn_env = first.env(group="churn")
    churners = [subprocess.Popen([*worker("churn"), "2", "4"], env=churn_env)
                for _ in range(8)]
    second = None
    stop = threading.Event()

    def query_load(srv_ref):
        while not stop.is_set():
            try:
                srv_ref[0].status()
            except Exception:  # noqa: BLE001 - the server is down for a while
                pass

    srv_ref = [first]
    t = threading.Thread(target=query_load, args=(srv_ref,), daemon=True)
    t.start()
    try:
        for h in holders:
            h.readline()
        for h in holders:
            wait_for("holder counted", counted(first, h.pid, 8 * MIB))
        before = {h.pid: settled_bytes(first, h.pid) for h in holders}
        first.kill9()
        second = Server(after=first)
        srv_ref[0] = second
        ps = wait_for("holders adopted", lambda: (lambda p: p if all(
            h.pid in p for h in holders) else None)(second.ps()))
        for h in holders:
            check(ps[h.pid]["bytes"] == before[h.pid],
                  f"holder {h.pid}: {ps[h.pid]['bytes']} after, "
                  f"{before[h.pid]} before")
        for c in churners:
            check(c.wait(timeout=60) == 0, "churner failed")
        want = sum(before.values())
        st = wait_for("only the holders left", lambda: (lambda st: st if
                      st["processes"] == 3 and st["fleet"]["bytes"] == want
                      else None)(second.status()))
        print(f"  holders kept {want >> 20} MiB across the restart; "
              f"fleet {st['fleet']['bytes']} == {want}")
    finally:
        stop.set()
        t.join(timeout=10)
        for c in churners:
            c.kill()
            c.wait()
        for h in holders:
            h.close()
        (second or first).stop()


def slot_of(s, pid):
    """The slot memtallyd's log last gave `pid`."""
    got = re.findall(r'msg="worker registered" pid=%d uid=\d+ slot=(\d+)'
                     % pid, s.logtext())
    check(got, f"no registration of {pid} in the log")
    return int(got[-1])


def test_a_quiet_worker_is_counted_after_a_restart_without_adoption():
    """A restart that adopts nothing (--reset here; likewise a server
    without the capability to reopen tables, or one that lost its record):
    a worker that allocates nothing meanwhile is counted again within a
    few seconds, its whole total carried. It looked at the heartbeat only
    at its flushes, after 128 with the ticks stalled: a quiet worker
    stayed out of the figure for as long as it stayed quiet, and an Admit
    was granted into the 96 MiB it held."""
    heap = {"MEMTALLY_ALLOCATOR_FREE": "0"}
    first = Server("--fleet-limit", "150MiB")
    w = Worker([*worker("hold"), "96"], first.env(group="quiet", **heap))
    second = None
    try:
        w.readline()
        wait_for("counted", counted(first, w.pid, 96 * MIB))
        first.stop()
        second = Server("--fleet-limit", "150MiB", "--reset", after=first)
        # Not adopted (the log says so: at once, the worker's refresh
        # thread may register it again before a slow, sanitized server
        # is asked about it).
        check("live workers adopted" not in second.logtext(),
              "adopted despite --reset")
        # Its refresh thread's round (every second) sees the heartbeat
        # stale (2 s) and registers again: a few seconds, no allocation.
        wait_for("the quiet worker counted again",
                 counted(second, w.pid, 96 * MIB), timeout=20)
        ps = second.ps()
        check(ps[w.pid]["bytes"] < 98 * MIB,
              f"counted {ps[w.pid]['bytes'] >> 20} MiB, holds 96")
        rc = subprocess.run([CLI, "--socket", second.socket, "admit",
                             "--bytes", "100MiB"], capture_output=True,
                            text=True, timeout=30 * MULT).returncode
        check(rc == 3, f"admit of 100 MiB beside 96 held of 150: exit {rc}")
    finally:
        w.close()
        (second or first).stop()


def test_a_worker_started_while_memtallyd_was_down_is_counted():
    """A worker that starts (or execs) while no memtallyd runs holds 100
    MiB and goes quiet. Its registration found no server, and nothing
    tried again: a quiet process makes no flush, and its refresh thread,
    armed only by a registration or a lost answer, never started. It
    stayed out of the figure for as long as it stayed quiet (25 s and
    more). Now the failed registration arms the thread (within its
    minimum, as any), whose rounds try again past the back-off (5 s at
    most): it is counted within seconds of memtallyd's return."""
    heap = {"MEMTALLY_ALLOCATOR_FREE": "0"}
    first = Server()
    env = first.env(group="late", **heap)
    first.stop()
    w = Worker([*worker("hold"), "100"], env)
    second = None
    try:
        w.readline()
        time.sleep(1.0)
        second = Server(after=first)
        wait_for("the worker started meanwhile counted",
                 counted(second, w.pid, 100 * MIB), timeout=20)
        check(second.ps()[w.pid]["group"] == "late",
              f"{second.ps()[w.pid]}")
    finally:
        w.close()
        (second or first).stop()


def test_a_worker_left_out_of_the_record_keeps_its_count():
    """The record lost b's entry (a disk full when it registered, a record
    cut short); a is adopted, and with it their uid's table, in which b
    still publishes. A worker c that registers before b does must not get
    b's slot (c would be counted b's bytes, and b, registering again,
    would carry c's), nor b get its own slot zeroed: b, registering again
    once its client sees the restart, carries its whole total. At the
    next restart, b's first slot, which still names it, is not held for
    it as well."""
    heap = {"MEMTALLY_ALLOCATOR_FREE": "0"}
    first = Server()
    a = Worker([*worker("hold"), "64"], first.env(group="alpha", **heap))
    a.readline()
    wait_for("a counted", counted(first, a.pid, 64 * MIB))
    # b without its refresh thread: that would register it again on its
    # own once the heartbeat is 2 s stale, before the check below on a
    # slow (sanitized) restart; b learns of the restart as it allocates.
    b = Worker([*worker("hold"), "32"],
               first.env(group="beta", MEMTALLY_REFRESH_MS="0", **heap))
    b.readline()
    second = c = None
    try:
        wait_for("b counted", counted(first, b.pid, 32 * MIB))
        before = settled(first, (a.pid, b.pid))
        slots = {p: slot_of(first, p) for p in (a.pid, b.pid)}
        check(slots[a.pid] < slots[b.pid], f"slots {slots}")
        first.kill9()
        path = first.socket + ".state"
        # The header's page, then one 1024-byte entry a slot: cut after
        # a's, as a write that never landed leaves it.
        os.truncate(path, 4096 + 1024 * (slots[a.pid] + 1))
        second = Server(after=first)
        wait_for("a adopted", lambda: a.pid in second.ps())
        check(b.pid not in second.ps(), "b was adopted without an entry")
        c = Worker([*worker("hold"), "16"], second.env(group="gamma", **heap))
        c.readline()
        wait_for("c counted", counted(second, c.pid, 16 * MIB))
        # b's client learns of the restart as it allocates, once the
        # heartbeat it reads (its first server's) is 2 s stale.
        more, end = 0, time.monotonic() + 30 * MULT
        while b.pid not in second.ps():
            check(more < 60 * 4 and time.monotonic() < end,
                  "b never registered again")
            b.send("more 4")
            check(b.readline() == "ready", "b did not allocate")
            more += 4
            time.sleep(0.2)
        want = before[b.pid]["bytes"] + more * MIB
        ps = wait_for("b's whole total counted", lambda: (
            lambda p: p if p.get(b.pid, {}).get("bytes", 0) >= want - MIB
            else None)(second.ps()))
        check(ps[b.pid]["bytes"] <= want + MIB,
              f"b: {ps[b.pid]['bytes'] >> 20} MiB, holds {want >> 20}")
        check(ps[c.pid]["bytes"] <= 17 * MIB,
              f"c: {ps[c.pid]['bytes'] >> 20} MiB, holds 16 (b's counted "
              f"in it?)")
        check(slot_of(second, c.pid) != slots[b.pid],
              f"c was given b's slot {slots[b.pid]}")
        print(f"  b registered again after {more} MiB more: counted "
              f"{ps[b.pid]['bytes'] >> 20} MiB of {want >> 20}; c "
              f"{ps[c.pid]['bytes'] >> 20} MiB")
        # b's first slot still names it. At the next restart, which
        # adopts b at its new slot, that old one was held for b as well,
        # until b's exit: an index lost, counted against the uid's cap.
        second.kill9()
        seen = len(second.logtext())
        third = Server(after=second)
        second = third
        wait_for("b adopted again", lambda: b.pid in third.ps())
        time.sleep(0.5)
        held = [x for x in third.logtext()[seen:].splitlines()
                if "slot held for a live worker" in x]
        check(held == [], f"a slot held for an adopted worker: {held}")
    finally:
        for w in (a, b, c):
            if w:
                w.close()
        (second or first).stop()


def test_a_held_worker_at_its_uids_cap_gets_its_count_back():
    """nobody may have two slots; its two workers have them. The record
    lost the first's entry: the restart holds that worker's slot for it
    and asks it to register again. Its registration was refused, since
    its own hold counted against the cap ("uid at max_slots_per_uid"),
    the hold never ended, and its 20 MiB were out of the figure for good.
    Its own hold no longer counts against it."""
    cfg = config_file("[server]\ngroup = nogroup\n"
                      "[limits]\nmax_slots_per_uid = 2\n")
    # nobody's workers cannot count on reaching the build tree (a fresh
    # clone in a 0700 directory): copies of the worker and the preload.
    hold, preload = world_readable_copy(worker("hold"), PRELOAD)
    heap = {"MEMTALLY_ALLOCATOR_FREE": "0", "LD_PRELOAD": preload}
    nob = (NOBODY, NOGROUP)
    first = Server("--config", cfg)
    open_to_nobody(first)
    w1 = Worker([*hold, "20", "2"], first.env(group="a", **heap), user=nob)
    w2 = Worker([*hold, "10", "2"], first.env(group="b", **heap), user=nob)
    second = None
    try:
        for w in (w1, w2):
            w.readline()
        wait_for("both counted", lambda: counted(first, w1.pid, 20 * MIB)()
                 and counted(first, w2.pid, 10 * MIB)())
        slot = slot_of(first, w1.pid)
        first.kill9()
        path = first.socket + ".state"
        with open(path, "r+b") as f:
            f.seek(4096 + 1024 * slot)
            f.write(bytes(1024))
        second = Server("--config", cfg, after=first)
        open_to_nobody(second)
        wait_for("w2 adopted", lambda: w2.pid in second.ps())
        wait_for("w1 counted again, whole",
                 counted(second, w1.pid, 20 * MIB), timeout=30)
        check("uid at max_slots_per_uid" not in second.logtext(),
              "w1 refused at its uid's cap: " + second.tail())
    finally:
        for w in (w1, w2):
            w.close()
        (second or first).stop()


# A worker of nobody's that maps deleted files whose /proc/PID/maps lines
# are longer than 511 bytes, placed so that a reader of 512-byte pieces
# takes each line's tail for a line of its own:
#   "../root/proc/self/fd/N x 0 0:1 1 /memfd:<its own table's label> (deleted)"
# with the ".." at byte 511, for N from 3 to 40.
FORGE_MAPS = r"""
import mmap, os, re, sys, time
buf = bytearray(1 << 20)
label = None
for _ in range(200):
    m = re.search(r'/memfd:(\S+-slots:[0-9a-f]+:%d) \(deleted\)' % os.getuid(),
                  open('/proc/self/maps').read())
    if m:
        label = m.group(1)
        break
    time.sleep(0.05)
if not label:
    sys.exit("no table of my own")
base = os.path.join(sys.argv[1], "a%d" % os.getpid())
keep = []
for n in range(3, 41):
    tail = ["root", "proc", "self", "fd", "%d x 0 0:1 1 " % n]
    pad = 1
    for attempt in range(3):
        d = base + "/n%d/" % n + "p" * 200 + "/" + "q" * pad + ".."
        full = d + "/" + "/".join(tail)
        os.makedirs(full, exist_ok=True)
        f = full + "/memfd:" + label
        fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(fd, 4096)
        mm = mmap.mmap(fd, 4096, mmap.MAP_SHARED)
        os.close(fd)
        os.unlink(f)
        line = [x for x in open("/proc/self/maps")
                if x.rstrip("\n").endswith(f + " (deleted)")][0]
        want = 511 - (line.index(d) + len(d) - 2)
        if want == 0:
            keep.append(mm)
            break
        mm.close()
        pad += want
    else:
        sys.exit("could not place the split")
print("ready", flush=True)
sys.stdin.read()
"""

# A fresh worker of nobody's after the restart: the table it is handed.
WHICH_TABLE = r"""
import re, sys, time
buf = bytearray(1 << 20)
for _ in range(200):
    m = re.search(r' rw-s .* /memfd:\S+-slots:[0-9a-f]+:(\d+) \(deleted\)$',
                  open('/proc/self/maps').read(), re.M)
    if m:
        break
    time.sleep(0.05)
print("table", m.group(1) if m else "none", flush=True)
sys.stdin.read()
"""


def test_a_forged_maps_line_gets_no_other_uids_table():
    """A restart reopens each recorded worker's table through its
    /proc/PID/maps. It read that file in 512-byte pieces: nobody's worker
    mapped files whose paths made a line's tail read as a line of its own,
    naming ../root/proc/self/fd/N as the mapping's range, and memtallyd
    opened its own descriptor N, the second user's table, and took it for
    nobody's. nobody's next worker was handed the other user's table,
    read-write: every claim there its to write. Lines are read whole now,
    a range must be the kernel's, and the opened memfd must be the one the
    line names, by inode and name."""
    second = second_user()
    cfg = config_file("[server]\ngroup = nogroup\n")
    hold, preload = world_readable_copy(worker("hold"), PRELOAD)
    heap = {"MEMTALLY_ALLOCATOR_FREE": "0", "LD_PRELOAD": preload}
    nob = (NOBODY, NOGROUP)
    scratch = tempfile.mkdtemp(prefix="mt-it-forge-")
    os.chmod(scratch, 0o777)
    first = Server("--config", cfg)
    open_to_nobody(first)
    victim = forger = fresh = second_srv = None
    try:
        victim = Worker([*hold, "40"], first.env(**heap),
                        user=(second[0], NOGROUP))
        victim.readline()
        wait_for("the victim counted", counted(first, victim.pid, 40 * MIB))
        forger = Worker([sys.executable, "-c", FORGE_MAPS, scratch],
                        first.env(**heap), user=nob)
        check(forger.readline(timeout=60) == "ready", "the forger failed")
        wait_for("the forger registered", lambda: forger.pid in first.ps())
        first.kill9()
        second_srv = Server("--config", cfg, after=first)
        open_to_nobody(second_srv)
        wait_for("the victim adopted", lambda: victim.pid in second_srv.ps())
        fresh = Worker([sys.executable, "-c", WHICH_TABLE],
                       second_srv.env(**heap), user=nob)
        line = fresh.readline(timeout=60)
        check(line == f"table {NOBODY}",
              f"nobody's new worker was handed {line!r} (the second user "
              f"is {second[0]})")
    finally:
        for w in (victim, forger, fresh):
            if w:
                w.close()
        (second_srv or first).stop()
        subprocess.run(["rm", "-rf", scratch])


def taken_over_and_recorded(s):
    """Wait until a reservation of `s` is taken over by its task's worker
    and the take-over is in the reservations' record (saved within
    200 ms, else at the 5 s refresh)."""
    wait_for("taken over", lambda:
             "reservation taken over by its task" in s.logtext())
    resv = s.socket + ".state.resv"
    t_over = time.time()
    wait_for("the take-over recorded", lambda: os.path.exists(resv) and
             os.stat(resv).st_mtime > t_over + 0.05)


def test_a_reservation_waits_for_its_held_worker():
    """A task's worker took its reservation over; the record lost the
    worker's entry (a full disk), so the restart holds its slot instead of
    adopting it. The reservation, restored taken over, was judged at the
    first tick: "its task's workers exited", and its 100 MiB given to
    others while the worker ran. It now waits for the held worker, which
    registers again in its task."""
    conf = config_file("[admission]\ndefault_ttl = 600\nmax_ttl = 3600\n")
    heap = {"MEMTALLY_ALLOCATOR_FREE": "0"}
    first = Server("--config", conf)
    a = Worker([*worker("hold"), "8"], first.env(group="alpha", **heap))
    w = second = None
    try:
        a.readline()
        wait_for("a registered", lambda: a.pid in first.ps())
        first.cli("admit", "--bytes", "100MiB", "--task", "job")
        w = Worker([*worker("hold"), "30", "2"],
                   first.env(MEMTALLY_TASK="job", **heap))
        w.readline()
        taken_over_and_recorded(first)
        sa, sw = slot_of(first, a.pid), slot_of(first, w.pid)
        check(sa < sw, f"slots {sa} {sw}")
        first.kill9()
        # w's entry never landed: the record ends after a's.
        os.truncate(first.socket + ".state", 4096 + 1024 * (sa + 1))
        second = Server("--config", conf, after=first)
        wait_for("w registered again in its task", lambda: second.ps().get(
            w.pid, {}).get("task") == "job", timeout=30)
        check(second.status()["fleet"]["reservations"] == 1,
              f"the reservation ended: {second.tail()}")
        check("its task's workers exited" not in second.logtext(),
              second.tail())
    finally:
        for x in (a, w):
            if x:
                x.close()
        (second or first).stop()


def test_a_pids_limit_outlives_a_restart_that_cannot_adopt():
    """memtally limit set pid P 100M, then a restart that cannot reopen
    the worker's table (a server without the capability): the worker
    registers again, and its limit was gone, though memtallyd.8 says
    per-pid limits are kept across a restart. It is its own again."""
    heap = {"MEMTALLY_ALLOCATOR_FREE": "0"}
    first = Server()
    w = Worker([*worker("hold"), "70", "2"], first.env(group="g", **heap))
    second = None
    try:
        w.readline()
        wait_for("w registered", lambda: w.pid in first.ps())
        first.cli("limit", "set", "pid", str(w.pid), "100MiB")
        check(first.ps()[w.pid]["limit"] == 100 * MIB, f"{first.ps()}")
        first.kill9()
        second = Server(after=first, prefix=[
            "setpriv", "--bounding-set=-sys_admin,-checkpoint_restore",
            "--inh-caps=-sys_admin,-checkpoint_restore"])
        check("cannot reopen a live worker's slot table" in
              second.logtext(), "the worker was adopted: " + second.tail())
        p = wait_for("w registered again", lambda: second.ps().get(w.pid),
                     timeout=30)
        check(p["limit"] == 100 * MIB, f"its limit after the restart: {p}")
    finally:
        w.close()
        (second or first).stop()


def test_a_reservation_waits_for_its_worker_not_adopted():
    """A task's worker took its reservation over; memtallyd is SIGKILLed
    and started again without the capability to reopen the worker's slot
    table, so the live worker is not adopted: it registers again later.
    Its reservation is kept for it meanwhile (before, the first tick ended
    it, 'its task's workers exited', and its room went to other Admits),
    and ends once that worker has exited."""
    conf = config_file("[admission]\ndefault_ttl = 600\nmax_ttl = 3600\n")
    heap = {"MEMTALLY_ALLOCATOR_FREE": "0"}
    first = Server("--config", conf)
    w = second = None
    try:
        first.cli("admit", "--bytes", "100MiB", "--task", "job")
        w = Worker([*worker("hold"), "8"],
                   first.env(MEMTALLY_TASK="job", **heap))
        w.readline()
        taken_over_and_recorded(first)
        first.kill9()
        second = Server("--config", conf, after=first, prefix=[
            "setpriv", "--bounding-set=-sys_admin,-checkpoint_restore",
            "--inh-caps=-sys_admin,-checkpoint_restore"])
        check("cannot reopen a live worker's slot table" in
              second.logtext(), "the worker was adopted: the test needs "
              "a memtallyd that cannot reopen its table")
        t0 = second.status()["ticks"]
        wait_for("ticks", lambda: second.status()["ticks"] >= t0 + 20)
        st = second.status()["fleet"]
        check(st["reservations"] == 1,
              f"the reservation ended at the restart: {st}")
        # The worker learns of the restart as it allocates, once the
        # heartbeat it reads (its first server's) is 2 s stale.
        end = time.monotonic() + 30 * MULT
        sent = 0
        while w.pid not in second.ps():
            check(sent < 60 and time.monotonic() < end,
                  "the worker never registered again")
            w.send("more 8")
            check(w.readline() == "ready", "the worker did not allocate")
            sent += 1
            time.sleep(0.1)
        check(second.ps()[w.pid]["task"] == "job", "not in its task")
        st = second.status()["fleet"]
        check(st["reservations"] == 1, f"reservation lost: {st}")
        w.close()
        w = None
        wait_for("the reservation ends with its worker", lambda:
                 second.status()["fleet"]["reservations"] == 0)
        check("reservation ended: its task's workers exited" in
              second.logtext(), "not ended by its worker's exit")
    finally:
        if w:
            w.close()
        (second or first).stop()


def test_a_taken_over_reservation_restored_without_its_workers_ends():
    """The reservations' record survives but the workers' does not (it
    was removed, or is of another version): no worker is adopted, and a
    reservation its task's workers had taken over was never judged again,
    holding its bytes for max_ttl (a day). Now it is judged by its asker:
    once `memtally run` and its command are gone, it ends."""
    conf = config_file("[admission]\nmax_ttl = 86400\n")
    first = Server("--config", conf)
    second = None
    # The CLI itself not under the preload (a sanitized build refuses
    # it); `memtally run` preloads its command.
    env = {k: v for k, v in first.env().items() if k != "LD_PRELOAD"}
    run_ = subprocess.Popen(
        [CLI, "--socket", first.socket, "run", "--bytes", "20MiB",
         "--task", "T", "--ttl", "5", "--", *worker("hold"), "2"],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL)
    try:
        check(run_.stdout.readline().startswith(b"ready"), "no worker")
        taken_over_and_recorded(first)
        first.kill9()
        os.unlink(first.socket + ".state")
        second = Server("--config", conf, after=first)
        check('"restart: reservations restored" kept=1' in second.logtext(),
              "the reservation was not restored")
        check(second.status()["fleet"]["reservations"] == 1,
              "ended while its asker runs")
        run_.kill()  # its command dies with it (PDEATHSIG)
        run_.wait()
        wait_for("the reservation ends with its asker", lambda:
                 second.status()["fleet"]["reservations"] == 0,
                 timeout=20)
        check(second.status()["fleet"]["reserved"] == 0, "bytes held")
    finally:
        if run_.poll() is None:
            run_.kill()
            run_.wait()
        (second or first).stop()


def read(path):
    with open(path) as f:
        return f.read()


def test_a_worker_outlives_more_restarts_than_attachments():
    """A process keeps 16 attachments in its life; each restart that
    adopts its slot costs one (a new header). Past them its slot is still
    the adopted one, ticked by each new server: it stays counted, and it
    no longer registers (before, it did so every back-off, for nothing)."""
    s = Server()
    err = os.path.join(s.dir, "churn.err")
    with open(err, "w") as f:
        w = subprocess.Popen([*worker("churn"), "1", "600"],
                             env=s.env(MEMTALLY_DEBUG="1"),
                             stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=f)
    adopted = "re-registered: slot 0 adopted by a new server"
    try:
        wait_for("registered", lambda: w.pid in s.ps())
        for n in range(2, 19):
            stale = read(err).count("heartbeat stale")
            s.stop()
            s = Server(after=s)
            if n <= 16:
                wait_for(f"attachment {n}", lambda: read(err).count(
                    adopted) == n - 1, timeout=30)
            else:
                wait_for(f"the stale header seen after restart {n - 1}",
                         lambda: read(err).count("heartbeat stale") > stale,
                         timeout=30)
        # Counted in the last server: its figure moves as churn goes on.
        first = s.ps()[w.pid]["bytes"]
        wait_for("the figure moving", lambda: s.ps()[w.pid]["bytes"] != first)
        # Five seconds of a stale header (the back-off's longest wait):
        # no registration tried, so none failed.
        t0 = s.status()["ticks"]
        wait_for("5 s", lambda: s.status()["ticks"] >= t0 + 500, timeout=60)
        text = read(err)
        check(text.count("too many re-attachments") == 1 and
              "attach failed" not in text,
              "registrations tried past the last attachment: " +
              "".join(ln + "\n" for ln in text.splitlines()
                      if "attach" in ln)[-2000:])
        check(w.poll() is None, "churn exited")
    finally:
        w.kill()
        w.wait()
        s.stop()


# Registers (its allocations flush), then maps, below its slot table, a
# regular file whose path reads like the table's memfd, under a read lease
# it never gives back: an open for writing waits for the lease break
# (lease-break-time, 45 s by default). With `setuid` instead, it drops from
# root to nobody without exec, and allocates 1 MiB at each line read.
DECOY = r"""
import fcntl, mmap, os, signal, sys, time
signal.signal(signal.SIGIO, signal.SIG_IGN)
keep = [bytearray(1 << 20) for _ in range(4)]
label = None
for _ in range(3000):
    for line in open("/proc/self/maps"):
        if "/memfd:" in line and "-slots:" in line:
            label = line.split("/memfd:", 1)[1].rsplit(" (deleted)", 1)[0]
    if label:
        break
    keep.append(bytearray(1 << 16))
    time.sleep(0.01)
if label is None:
    sys.exit("never mapped a slot table")
if sys.argv[2] == "setuid":
    os.setuid(65534)
    print("ready", flush=True)
    for line in sys.stdin:
        keep.append(bytearray(1 << 20))
        print("ok", flush=True)
    sys.exit(0)
d = os.path.join(sys.argv[1], "x ")
os.mkdir(d)
path = os.path.join(d, "memfd:" + label.strip())
with open(path, "wb") as f:
    f.write(b"\0" * 65536)
fd = os.open(path, os.O_RDONLY)
fcntl.fcntl(fd, 1024, fcntl.F_RDLCK)  # F_SETLEASE
m = mmap.mmap(fd, 65536, mmap.MAP_SHARED, mmap.PROT_READ)
os.unlink(path)
print("ready", flush=True)
sys.stdin.readline()
"""


def test_a_decoy_mapping_does_not_hold_up_a_restart():
    first = Server()
    w = Worker([sys.executable, "-c", DECOY, first.dir, "decoy"],
               first.env(group="decoy"))
    second = None
    try:
        check(w.readline() == "ready", "the decoy was not set")
        wait_for("registered", lambda: w.pid in first.ps())
        first.kill9()
        t0 = time.monotonic()
        second = Server(after=first)
        took = time.monotonic() - t0
        log = second.logtext()
        print(f"  restart with a leased decoy mapped: serving after "
              f"{took:.1f} s")
        check("cannot reopen" not in log, "the decoy was opened: " +
              second.tail())
        check(f"pid={w.pid}" in log and "worker adopted" in log,
              "the worker was not adopted: " + second.tail())
        check(took < 20, f"the restart waited {took:.1f} s on the decoy")
        check(w.pid in second.ps(), "the worker is not listed")
    finally:
        w.close()
        (second or first).stop()


def lie_vouched_for(s, pid):
    """Write 2^49 into `pid`'s slot (as a worker that left root could) and
    wait until it is seen and counts as the kernel vouches for it: the
    fleet at what is held (4 MiB), not 2^49, not 0. The fleet."""
    claim(s, pid, 1 << 49)
    wait_for("the lie seen, and vouched for by the kernel", lambda: (
        s.ps()[pid]["unvouched"] >= (1 << 49) - 64 * MIB))
    return wait_for("the fleet at what is held", lambda: (
        lambda f: f if 4 * MIB <= f["bytes"] < 1 << 30 else None)(
            s.status()["fleet"]))


def test_a_worker_that_changed_uid_is_not_adopted_as_root():
    """A worker that left root without exec while no server ran is not
    adopted as root; it still maps its window on root's table, so the
    root worker registered after it, adopted, counts as the kernel vouches
    for it: 2^49 bytes written into its slot leave the fleet ok. It
    registers again as what it is now."""
    first = Server()
    w = Worker([sys.executable, "-c", DECOY, first.dir, "setuid"],
               first.env(group="turncoat"))
    second = n = None
    try:
        check(w.readline() == "ready", "the worker did not start")
        wait_for("registered as root",
                 lambda: first.ps().get(w.pid, {}).get("uid") == 0)
        n = Worker([*worker("hold"), "4"], first.env())
        n.readline()
        wait_for("the root worker registered", lambda: n.pid in first.ps())
        first.kill9()
        seen = len(first.logtext())
        second = Server(after=first)
        log = second.logtext()[seen:]
        check(f'msg="worker adopted" pid={w.pid} ' not in log,
              "a worker now of uid 65534 was adopted as root: " +
              second.tail())
        check(f'msg="worker adopted" pid={n.pid} uid=0' in log,
              "the root worker was not adopted: " + second.tail())
        t = second.ps()[n.pid]
        check(t["trust"] == "in reach of a worker that left its uid" and
              t["trust_uid"] == 65534, f"after the restart: {t}")
        f = lie_vouched_for(second, n.pid)
        print(f"  root worker in reach of one that left root while no "
              f"server ran claims 2^49: fleet {f['bytes'] >> 20} MiB",
              flush=True)
        # It registers again as what it is now at its next flushes (the
        # harness's directory is root's alone).
        os.chmod(second.dir, 0o755)
        os.chmod(second.socket, 0o666)
        def now_nobody():
            w.send("alloc")
            w.readline()
            return second.ps().get(w.pid, {}).get("uid") == 65534
        wait_for("registered again as nobody", now_nobody)
    finally:
        w.close()
        if n:
            n.close()
        (second or first).stop()


def test_a_taint_outlives_a_restart():
    """A root worker left root without exec under the first server, which
    tainted root's table, and has exited since. The server started after
    it has no leaver to see, and taints the table again from the restart
    entries: the root worker adopted there counts as the kernel vouches
    for it (2^49 written into its slot leave the fleet ok), where it
    would count in full."""
    cfg = config_file("[limits]\nrss_interval = 100\n")
    first = Server("--config", cfg)
    w = Worker([sys.executable, "-c", DECOY, first.dir, "setuid"],
               first.env(group="turncoat"))
    n = second = None
    reach = "in reach of a worker that left its uid"
    try:
        check(w.readline() == "ready", "the worker did not start")
        n = Worker([*worker("hold"), "4"], first.env())
        n.readline()
        wait_for("root's table tainted under the first server", lambda: (
            first.ps().get(n.pid, {}).get("trust") == reach))
        check(w.close() == 0, "the leaver did not exit")
        wait_for("the leaver gone", lambda: w.pid not in first.ps())
        first.kill9()
        seen = len(first.logtext())
        second = Server("--config", cfg, after=first)
        log = second.logtext()[seen:]
        check(f'msg="worker adopted" pid={n.pid} uid=0' in log,
              "the root worker was not adopted: " + second.tail())
        t = second.ps()[n.pid]
        check(t["trust"] == reach and t["trust_uid"] == 65534,
              f"after the restart, with the leaver gone: {t}")
        f = lie_vouched_for(second, n.pid)
        print(f"  root worker beside one that left root and exited, "
              f"claims 2^49 after a restart: fleet {f['bytes'] >> 20} MiB",
              flush=True)
    finally:
        w.close()
        if n:
            n.close()
        (second or first).stop()


def test_an_exec_into_an_unregistered_image_is_seen_across_a_restart():
    """Two root workers held 300 MiB each, then exec'd a program that
    never registers: one under the first server, which saw it, and one
    while memtallyd was down. The server started after them knows from
    the restart record which image registered (its name and arg_start),
    so both count as the kernel vouches, not at the old images' 600 MiB
    (which it counted for the sleeps' whole lives)."""
    from test_e2e import EXEC_QUIET
    cfg = config_file("[limits]\nrss_interval = 100\n")
    first = Server("--config", cfg)
    # A registered image mapping root's slot table, through which the
    # second server reopens it (the sleeps map none): the first slot, so
    # that the table is open when theirs are adopted.
    keeper = Worker([*worker("hold"), "4"], first.env())
    keeper.readline()
    wait_for("the keeper registered", lambda: keeper.pid in first.ps())
    ws = [Worker([sys.executable, "-c", EXEC_QUIET], first.env(group="ex"))
          for _ in range(2)]
    second = None
    stale = "exec'd an image that has not registered"
    try:
        for w in ws:
            check(w.readline().startswith("held"), "no held line")
        wait_for("600 MiB counted", lambda: first.status()["fleet"][
            "bytes"] >= 600 * MIB)
        mark = open(f"/proc/{ws[0].pid}/stat").read().rsplit(")", 1)[1]
        if mark.split()[45] == "0":
            raise Skip("arg_start reads 0 here (no ptrace access)")
        ws[0].send("")
        wait_for("the first server saw the exec", lambda: first.ps()[
            ws[0].pid]["trust"] == stale, timeout=20 * MULT)
        first.kill9()
        ws[1].send("")
        wait_for("the exec while memtallyd is down", lambda: open(
            f"/proc/{ws[1].pid}/comm").read().strip() == "sleep")
        seen = len(first.logtext())
        second = Server("--config", cfg, after=first)
        log = second.logtext()[seen:]
        for w in ws:
            check(f'msg="worker adopted" pid={w.pid} uid=0' in log,
                  f"{w.pid} was not adopted: " + second.tail())
        f = wait_for("the old claims no longer counted", lambda: (
            lambda f: f if f["bytes"] < 40 * MIB else None)(
                second.status()["fleet"]), timeout=20 * MULT)
        ps = second.ps()
        for w in ws:
            check(ps[w.pid]["trust"] == stale,
                  f"after the restart: {ps[w.pid]}")
        print(f"  two sleeps exec'd from 300 MiB workers, one before and "
              f"one during a restart: fleet {f['bytes'] >> 20} MiB after "
              f"it (their slots claim "
              f"{sum(ps[w.pid]['bytes'] for w in ws) >> 20} MiB)",
              flush=True)
    finally:
        for w in ws:
            w.kill()
        keeper.close()
        (second or first).stop()


def recorded(s):
    """(reservations, of them taken over) in the server's record, or None
    while it has written none."""
    r = record_of(s)
    return None if r is None else (len(r), sum(t for t, _ in r))


RESV_REC = 584  # a reservation in the record (version 2), before its names


def record_of(s):
    """[(taken over, the use of a task run inside its asker)] per
    reservation in the server's record, or None while it has written none.
    The record: a 48-byte header (its count at 12), then per reservation
    RESV_REC bytes (taken over at 43; the lengths of its group, task and
    kind names at 112, 116, 120; a host's pid at 512, the task's use at
    576) and those names."""
    try:
        with open(s.socket + ".state.resv", "rb") as f:
            d = f.read()
    except FileNotFoundError:
        return None
    if len(d) < 48:
        return None
    count, off, out = struct.unpack_from("<I", d, 12)[0], 48, []
    for _ in range(count):
        if len(d) < off + RESV_REC:
            return None
        out.append((d[off + 43], struct.unpack_from("<Q", d, off + 576)[0]))
        off += RESV_REC + sum(struct.unpack_from("<III", d, off + 112))
    return out


def test_reservations_survive_a_restart():
    """A scheduler's grants outlive memtallyd's SIGKILL. The server started
    again holds them (ids, bytes, owner): the one whose task's worker runs
    stays taken over (its run goes on, not started again) and ends with
    that worker; the one whose worker died while no server ran ends at
    once; the one no worker took is its owner's to release. A --reset
    start forgets them, and its record."""
    conf = config_file("[admission]\ndefault_ttl = 600\nmax_ttl = 3600\n")
    first = Server("--config", conf)
    second = third = fourth = w = g = None
    try:
        keep = first.cli("admit", "--bytes", "64MiB", "--task", "keep")
        run_ = first.cli("admit", "--bytes", "32MiB", "--task", "run")
        gone = first.cli("admit", "--bytes", "16MiB", "--task", "gone")
        check(keep["admitted"] and run_["admitted"] and gone["admitted"],
              f"{keep} {run_} {gone}")
        w = Worker([*worker("hold"), "8"], first.env(MEMTALLY_TASK="run"))
        g = Worker([*worker("hold"), "4"], first.env(MEMTALLY_TASK="gone"))
        w.readline()
        g.readline()
        for r in (run_, gone):
            wait_for("taken over", lambda r=r: (
                f'msg="reservation taken over by its task" '
                f'reservation={r["reservation"]}' in first.logtext()))
        wait_for("all three in the record, two taken over",
                 lambda: recorded(first) == (3, 2))
        first.kill9()
        g.kill()  # its task's worker dies while no server runs
        g = None
        seen = len(first.logtext())  # the log goes on in the same file

        second = Server("--config", conf, after=first)
        st = second.status()["fleet"]
        log = second.logtext()[seen:]
        print(f"  after the restart: {st['reservations']} reservations, "
              f"{st['reserved'] / MIB:.0f} MiB reserved")
        check('msg="restart: reservations restored" kept=3 dropped=0' in
              log, "no restore line: " + second.tail())
        check('msg="reservation ended: its task\'s workers exited" '
              f'reservation={gone["reservation"]}' in log,
              "the reservation whose worker died was not ended")
        check("reservation taken over by its task" not in log,
              "a restored reservation was taken over again (its run "
              "started afresh)")
        check(st["reservations"] == 2,
              f"{st['reservations']} reservations after the restart")
        # keep's 64 MiB, and what run's worker has not used of its 32.
        check(64 * MIB + 20 * MIB <= st["reserved"] <= 64 * MIB + 24 * MIB,
              f"reserved {st['reserved']} after the restart")
        second.cli("release", keep["reservation"])
        check(second.status()["fleet"]["reservations"] == 1,
              "keep not released")
        w.close()
        w = None
        wait_for("run ended with its worker",
                 lambda: second.status()["fleet"]["reservations"] == 0)

        again = second.cli("admit", "--bytes", "16MiB", "--task", "later")
        check(again["admitted"], f"{again}")
        wait_for("later in the record", lambda: recorded(second) == (1, 0))
        second.kill9()
        third = Server("--reset", "--config", conf, after=second)
        check(third.status()["fleet"]["reservations"] == 0,
              "--reset kept the reservations")
        wait_for("an empty record in its place",
                 lambda: recorded(third) in (None, (0, 0)))
        third.kill9()
        fourth = Server("--config", conf, after=third)
        check(fourth.status()["fleet"]["reservations"] == 0,
              "a start after --reset restored the reservations before it")
    finally:
        for x in (w, g):
            if x:
                x.close()
        (fourth or third or second or first).stop()


# A Python worker (preloaded) that runs a task inside itself, as a Dask or
# Celery worker does: "admit" asks memtallyd with in_process (kind
# "inproc"), "N" holds N MiB more.
IN_PROCESS = r"""
import os, sys
sys.path.insert(0, os.environ["MEMTALLY_PYTHON"])
import memtally
held = []
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "admit":
        with memtally.Client(os.environ["MEMTALLY_SOCKET"]) as c:
            r = c.admit(64 << 20, task="t-inproc", kind="inproc",
                        in_process=True)
        print(r.reservation if r.admitted and r.in_process else "no", flush=True)
    else:
        held.append(bytearray(b"\x01") * (int(line) << 20))
        print("held", flush=True)
"""


def test_a_task_inside_its_worker_survives_a_restart():
    """A reservation run inside its asker (Admit.in_process) outlives
    memtallyd's SIGKILL: the server started again finds its host among
    the adopted workers and goes on counting the task's use from where the
    record left it; the reservation ends with its host, and its kind
    learns the run."""
    first = Server()
    second = w = None
    try:
        w = Worker([sys.executable, "-c", IN_PROCESS], first.env())
        check(w.readline() == "ready", "the worker did not start")
        wait_for("the worker registered", lambda: w.pid in first.ps())
        w.send("admit")
        rid = w.readline()
        check(rid.startswith("r-"), f"not admitted in process: {rid}")
        w.send("16")
        check(w.readline() == "held", "the worker did not allocate")
        wait_for("its use in the record", lambda: (
            (record_of(first) or [(0, 0)])[0][1] >= 15 * MIB), timeout=30)
        first.kill9()
        seen = len(first.logtext())

        second = Server(after=first)
        log = second.logtext()[seen:]
        check('msg="restart: reservations restored" kept=1 dropped=0' in
              log, "no restore line: " + second.tail())
        st = second.status()["fleet"]
        print(f"  after the restart: {st['reservations']} reservation, "
              f"{st['reserved'] / MIB:.1f} MiB reserved")
        check(st["reservations"] == 1,
              f"{st['reservations']} reservations after the restart")
        # 64 MiB less the 16 the task holds (and what Python added; less
        # what the worker's threads have not flushed, 64 KiB each).
        wait_for("what the task holds set against it", lambda: (
            40 * MIB <= second.status()["fleet"]["reserved"] <= 49 * MIB))
        w.send("16")
        check(w.readline() == "held", "the worker did not allocate")
        wait_for("the task's use counted on after the restart", lambda: (
            24 * MIB <= second.status()["fleet"]["reserved"] <= 33 * MIB))
        w.close()
        w = None
        wait_for("the reservation ended with its host",
                 lambda: second.status()["fleet"]["reservations"] == 0)
        check('msg="reservation ended: the process running its task '
              f'exited" reservation={rid}' in second.logtext()[seen:],
              "no end line")
        kinds = {k["kind"]: k for k in second.cli("kinds")["kinds"]}
        check("inproc" in kinds and kinds["inproc"]["runs"] == 1,
              f"the kind did not learn the run: {kinds}")
    finally:
        if w:
            w.close()
        (second or first).stop()


def test_watch_reconnects_across_a_restart():
    """`memtally watch --reconnect` outlives memtallyd's SIGKILL: it says
    once on stderr that the stream was lost, and goes on printing the
    events of the server started again (its first: the fleet's state).
    Without --reconnect the watch ends with the stream (exit 1)."""
    first = Server()
    second = None
    cmd = [CLI, "--socket", first.socket, "--json", "watch"]
    follow = subprocess.Popen([*cmd, "--reconnect"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    once = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        for p in (follow, once):
            line = line_within(p, 30 * MULT)
            check(line and json.loads(line)["scope"] == "fleet",
                  f"no first event: {line!r}")
        first.kill9()
        check(once.wait(timeout=30 * MULT) == 1,
              f"watch without --reconnect: exit {once.returncode}")
        second = Server(after=first)
        line = line_within(follow, 30 * MULT)
        check(line and json.loads(line)["scope"] == "fleet",
              f"no event after the restart: {line!r}")
        check(follow.poll() is None, "watch --reconnect ended")
    finally:
        for p in (follow, once):
            if p.poll() is None:
                p.terminate()
            p.wait(timeout=30 * MULT)
        (second or first).stop()
    err = follow.stderr.read()
    print("  " + err.strip().replace("\n", "\n  "))
    check("was lost" in err and "reconnecting" in err and
          "again" in err, f"stderr: {err!r}")


if __name__ == "__main__":
    run([test_restart_adopts_live_workers, test_reset_starts_afresh,
         test_a_quiet_worker_is_counted_after_a_restart_without_adoption,
         test_kill9_under_load_loses_nothing,
         test_a_worker_left_out_of_the_record_keeps_its_count,
         test_a_reservation_waits_for_its_worker_not_adopted,
         test_a_taken_over_reservation_restored_without_its_workers_ends,
         test_a_worker_started_while_memtallyd_was_down_is_counted,
         test_a_held_worker_at_its_uids_cap_gets_its_count_back,
         test_a_reservation_waits_for_its_held_worker,
         test_a_pids_limit_outlives_a_restart_that_cannot_adopt,
         test_a_forged_maps_line_gets_no_other_uids_table,
         test_a_worker_outlives_more_restarts_than_attachments,
         test_a_decoy_mapping_does_not_hold_up_a_restart,
         test_a_worker_that_changed_uid_is_not_adopted_as_root,
         test_a_taint_outlives_a_restart,
         test_an_exec_into_an_unregistered_image_is_seen_across_a_restart,
         test_reservations_survive_a_restart,
         test_a_task_inside_its_worker_survives_a_restart,
         test_watch_reconnects_across_a_restart])
