"""A claim counts for the claimant, and toward anyone else only as far as
the kernel vouches for it. Real memtallyd as root, real workers of two
unprivileged users (nobody, and a second user the harness creates), the
real CLI run as each of them.

A worker's figures are whatever its own slot says, and a worker can write
its own slot (its uid's table is mapped read-write in it): here the test
writes the lie into the liar's slot as the liar itself could, through
/proc/PID/map_files.

test_lies_hurt_only_the_liar: a nobody process holding ~1 MiB claims 2^49
bytes, ten more claim 950 MiB each, all in group etl which a genuine
worker of the second user shares. The fleet (limit 1 GiB, enforcement
SIGKILL after 200 ms, hooks on every state) stays ok, its peak stays below
the limit, the shared group stays ok, no hook runs, nothing is signalled:
the second user's genuine worker, over its own process limit all along,
lives; the second user's Admit of 100 MiB is granted. The liars' own
scopes see the claim: each liar is over its own process limit, a liar's
Admit is denied, `ps` shows its unvouched bytes, and once the excess has
stayed for two untouched_time windows the allowance is gone too.

test_a_genuine_allocation_is_vouched_for: a nobody worker that really
allocates and touches 200 MiB is counted in full toward the fleet (its
kernel figure follows), so vouching never undercounts an honest worker.

test_a_hidden_allocation_is_signalled_not_an_honest_one: a nobody worker
that really holds 200 MiB zeroes its claim; the second user's honest
worker holds 150 MiB, over its 100 MiB process limit. The fleet limit is
lowered under both: enforcement (SIGKILL) chooses the one that hid its
memory, by what the kernel says it holds, and the honest worker lives.

test_flapping_claim_runs_hooks_at_most_once_per_interval: a claim of
9 GiB toggled every 15 ms for 4 s. As nobody's, it changes no shared state
at all; as root's (trusted: counted in full), the fleet flaps, and the
hooks still run at most once per [hooks] min_interval.

test_a_worker_that_dropped_root_claims_as_nobody: a python worker
registered as root drops to nobody without exec (a daemon that serves
untrusted input: real, effective and saved uids), keeping its slot in
root's table, where claims count in full; 2^49 bytes are then claimed in
it. From memtallyd's next read of its status the claim is vouched for by
the kernel: the fleet (1 GiB) is back under, and a warning names the
worker. One that gives up only its effective uid (root again whenever it
likes) stays trusted.

test_a_dropped_workers_neighbours_are_vouched_for: the dropped worker
still maps its window on root's table, and can point it at any page of
the table. Root workers registered before and after it are distrusted
with a warning; 2^49 bytes written into their slots (as the dropped
worker could) are vouched for by the kernel: the fleet stays ok, root's
Admit is granted, and their own process limit (SIGKILL) does not fire. A
worker of another trusted uid, in its own table, still counts its claim
in full.
"""
import os
import struct
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import (CLI, LANE0_BYTES, MIB, MULT, NOBODY, NOGROUP,  # noqa: E402
                     Server, Worker, check, claim, cli_as, find_slot,
                     hook_runs, hooks_conf, open_to_nobody, rss_anon, run,
                     second_user, wait_for, worker, world_readable_copy)
from harness import config_file as config  # noqa: E402

GIB = 1 << 30


def test_lies_hurt_only_the_liar():
    second = second_user()
    d = tempfile.mkdtemp(prefix="mt-trust-")
    hooks, hconf = hooks_conf(d)
    cfg = config("[server]\ngroup = nogroup\n"
                 "[limits]\nfleet = 1GiB\nprocess = 100MiB\n"
                 "[group etl]\nlimit = 768MiB\n"
                 "[enforce]\nsignal = SIGKILL\ngrace = 200\n"
                 "[trust]\nuntouched_allowance = 64MiB\n"
                 "untouched_time = 1s\n" + hconf)
    preload, cli, hold = world_readable_copy(
        os.environ["MEMTALLY_PRELOAD_LIB"], CLI, worker("hold"))
    with Server("--config", cfg) as s:
        open_to_nobody(s)
        env = s.env(group="etl")
        env["LD_PRELOAD"] = preload
        # The second user's genuine worker: 150 MiB, over its own limit.
        victim = Worker([*hold, "150"], env, user=(second[0], NOGROUP))
        liars = [Worker([*hold, "1"], env, user=(NOBODY, NOGROUP))
                 for _ in range(11)]
        workers = [victim] + liars
        try:
            for w in workers:
                check(w.readline().startswith("ready"), "worker not ready")
            wait_for("all registered",
                     lambda: len(s.ps()) == len(workers))
            wait_for("the victim over its own limit", lambda: s.ps()[
                victim.pid]["state"] == "over")
            claim(s, liars[0].pid, 1 << 49)
            for w in liars[1:]:
                claim(s, w.pid, 950 * MIB)
            claimed = (1 << 49) + 10 * 950 * MIB
            wait_for("the lies published", lambda: sum(
                p["bytes"] for p in s.ps().values()) >= claimed)
            # For three untouched_time windows: nothing shared moves.
            end = time.monotonic() + 3.5 * MULT
            worst = 0
            while time.monotonic() < end:
                st = s.status()
                f = st["fleet"]
                worst = max(worst, f["bytes"])
                check(f["state"] == "ok", f"fleet {f}")
                check(f["peak"] < GIB, f"fleet peak {f['peak']}")
                # All of the lies but the allowance and what the liars
                # really hold (1-2 MiB each in small pages, ~10 MiB where
                # transparent huge pages are always on).
                held = sum(rss_anon(w.pid) for w in liars)
                check(f["unvouched"] >= claimed - 64 * MIB - held - 16 * MIB,
                      f"fleet unvouched {f['unvouched']} (liars hold "
                      f"{held >> 20} MiB)")
                etl = [g for g in st["groups"] if g["name"] == "etl"][0]
                check(etl["state"] == "ok", f"group etl {etl}")
            check(hook_runs(hooks) == [], f"hooks ran: {hook_runs(hooks)}")
            check(victim.proc.poll() is None, "the victim was killed")
            check("enforcement: signal sent" not in s.logtext(),
                  "memtallyd signalled someone")
            # Admission of another user: granted.
            rc, out = cli_as(s, (second[0], NOGROUP), cli, "admit",
                             "--bytes", "100MiB", "--ttl", "60")
            check(rc == 0, f"second user's admit: {rc} {out}")
            # The liar's own scopes see its claim.
            ps = s.ps()
            for w in liars:
                check(ps[w.pid]["state"] == "over",
                      f"liar {w.pid} not over its own limit: {ps[w.pid]}")
            big = ps[liars[0].pid]
            check(big["unvouched"] >= (1 << 49) - 64 * MIB - 16 * MIB,
                  f"ps does not show the lie: {big}")
            rc, out = cli_as(s, (NOBODY, NOGROUP), cli, "admit",
                             "--bytes", "1MiB", "--ttl", "60")
            check(rc == 3, f"liar's own admit not denied: {rc} {out}")
            # Stale: two windows on, the allowance is gone; the fleet
            # counts the kernel's figures of the liars (~1-3 MiB each in
            # small pages, ~10 MiB where huge pages are always on).
            vouched_liars = sum(p["bytes"] - p["unvouched"] for pid, p in
                                s.ps().items() if pid != victim.pid)
            held = sum(rss_anon(w.pid) for w in liars)
            check(vouched_liars < held + 48 * MIB,
                  f"liars still vouched for {vouched_liars >> 20} MiB "
                  f"(they hold {held >> 20} MiB)")
            print(f"  lies of {claimed >> 40} TiB: fleet at most "
                  f"{worst >> 20} MiB (state ok), no hook, no signal; "
                  f"liars vouched for {vouched_liars >> 20} MiB after "
                  f"the allowance went stale", flush=True)
        finally:
            for w in workers:
                w.kill()


def test_a_genuine_allocation_is_vouched_for():
    cfg = config("[server]\ngroup = nogroup\n"
                 "[trust]\nuntouched_allowance = 16MiB\n"
                 "untouched_time = 1s\n")
    preload, level = world_readable_copy(
        os.environ["MEMTALLY_PRELOAD_LIB"], worker("level"))
    with Server("--config", cfg) as s:
        open_to_nobody(s)
        env = s.env()
        env["LD_PRELOAD"] = preload
        w = Worker(level, env, user=(NOBODY, NOGROUP))
        try:
            check(w.readline().startswith("ready"), "worker not ready")
            w.send("set 200")
            check(w.readline() == "at 200", "worker did not reach 200 MiB")

            def counted():
                p = s.ps().get(w.pid)
                f = s.status()["fleet"]
                return (p if p and p["bytes"] >= 200 * MIB and
                        p["unvouched"] == 0 and f["bytes"] >= 200 * MIB
                        else None)
            p = wait_for("200 MiB vouched for", counted)
            # And it stays so, past the untouched windows.
            t0 = time.monotonic()
            wait_for("3 s", lambda: time.monotonic() > t0 + 3)
            p = s.ps()[w.pid]
            check(p["unvouched"] == 0 and
                  s.status()["fleet"]["bytes"] >= 200 * MIB,
                  f"a genuine worker lost its count: {p}")
            w.send("set 20")
            check(w.readline() == "at 20", "worker did not free")
            # Down to what it holds: 20 MiB, or what the kernel says it
            # still holds where that is more (transparent huge pages).
            wait_for("down to 20 MiB", lambda: s.status()["fleet"][
                "bytes"] < max(40 * MIB, rss_anon(w.pid) + 16 * MIB))
        finally:
            w.kill()


def hide(s, pid, nbytes):
    """Make `pid`'s own slot say it holds `nbytes` less, as the process
    itself could: its heap bytes, and its allocator's free-memory sample
    rewritten to match (else the server counts what left the heap as free
    memory its allocator kept)."""
    m, o = wait_for(f"slot of {pid}", lambda: find_slot(s.segment, pid))
    try:
        cur = struct.unpack_from("<q", m, o + LANE0_BYTES)[0]
        struct.pack_into("<q", m, o + LANE0_BYTES, cur - nbytes)
        # Lane 0's free_seq, free_bytes, free_heap (shm/mtshm.h): a new
        # even sequence, no free memory, at no heap.
        seq = struct.unpack_from("<Q", m, o + LANE0_BYTES + 24)[0]
        struct.pack_into("<qq", m, o + LANE0_BYTES + 32, 0, 0)
        struct.pack_into("<Q", m, o + LANE0_BYTES + 24, (seq | 1) + 1)
    finally:
        m.close()


def test_a_hidden_allocation_is_signalled_not_an_honest_one():
    second = second_user()
    cfg = config("[server]\ngroup = nogroup\n"
                 "[limits]\nfleet = 2GiB\nprocess = 100MiB\n"
                 "[enforce]\nsignal = SIGKILL\ngrace = 200\n"
                 "[trust]\nuntouched_allowance = 16MiB\n"
                 "untouched_time = 1s\n")
    preload, hold = world_readable_copy(
        os.environ["MEMTALLY_PRELOAD_LIB"], worker("hold"))
    with Server("--config", cfg) as s:
        open_to_nobody(s)
        env = s.env()
        env["LD_PRELOAD"] = preload
        honest = Worker([*hold, "150"], env, user=(second[0], NOGROUP))
        # No refresh thread: its next sample would publish the hidden
        # bytes again (as memory its allocator keeps) within a second,
        # and on a loaded machine before the test's next look. The lie
        # stays as written, as a hider's would.
        hider = Worker([*hold, "200"], dict(env, MEMTALLY_REFRESH_MS="0"),
                       user=(NOBODY, NOGROUP))
        try:
            check(honest.readline().startswith("ready"), "honest not ready")
            check(hider.readline().startswith("ready"), "hider not ready")
            wait_for("the honest worker over its own limit", lambda: s.ps()[
                honest.pid]["state"] == "over")

            def vouched():
                p = s.ps().get(hider.pid)
                return p if p and p["bytes"] >= 200 * MIB and \
                    p["unvouched"] == 0 else None
            wait_for("the hider's 200 MiB vouched for", vouched)
            hide(s, hider.pid, 190 * MIB)
            # Its own figure says little; the fleet still counts what
            # the kernel says it holds.
            wait_for("the lie published", lambda: s.ps()[hider.pid][
                "bytes"] < 40 * MIB)
            check(s.ps()[hider.pid]["state"] != "over",
                  "the hider is over by its own figure")
            # 150 MiB + 200 MiB, less what the kernel's figures have not
            # caught up with yet; by its claims alone, about 160 MiB.
            wait_for("the fleet counts the hidden memory",
                     lambda: s.status()["fleet"]["bytes"] >= 300 * MIB)
            s.cli("limit", "set", "fleet", "256MiB")
            wait_for("someone signalled",
                     lambda: hider.proc.poll() is not None or
                     honest.proc.poll() is not None)
            check(hider.proc.poll() is not None, "the hider lives")
            check(honest.proc.poll() is None, "the honest worker was killed")
            check(f"pid={hider.pid} " in s.logtext() and
                  "enforcement: signal sent" in s.logtext(),
                  "no enforcement line names the hider")
            print("  the worker that hid 190 MiB was signalled; the "
                  "honest one, over its own limit, lives", flush=True)
        finally:
            honest.kill()
            hider.kill()


def flap(s, pid, seconds):
    m, o = wait_for(f"slot of {pid}", lambda: find_slot(s.segment, pid))
    base = struct.unpack_from("<q", m, o + LANE0_BYTES)[0]
    end = time.monotonic() + seconds
    n = 0
    try:
        while time.monotonic() < end:
            n += 1
            v = base + (9 * GIB if n % 2 else 0)
            struct.pack_into("<q", m, o + LANE0_BYTES, v)
            time.sleep(0.015)
        struct.pack_into("<q", m, o + LANE0_BYTES, base)
    finally:
        m.close()
    return n


def test_flapping_claim_runs_hooks_at_most_once_per_interval():
    d = tempfile.mkdtemp(prefix="mt-trust-")
    hooks, hconf = hooks_conf(d)
    cfg = config("[server]\ngroup = nogroup\n[limits]\nfleet = 1GiB\n"
                 "[trust]\nuntouched_allowance = 64MiB\n" + hconf)
    preload, hold = world_readable_copy(
        os.environ["MEMTALLY_PRELOAD_LIB"], worker("hold"))
    with Server("--config", cfg) as s:
        open_to_nobody(s)
        env = s.env()
        env["LD_PRELOAD"] = preload
        for user, most in (((NOBODY, NOGROUP), 0), (None, None)):
            w = Worker([*hold, "1"], env, user=user)
            try:
                check(w.readline().startswith("ready"), "not ready")
                wait_for("registered", lambda: w.pid in s.ps())
                before = len(hook_runs(hooks))
                t0 = time.monotonic()
                flips = flap(s, w.pid, 4.0)
                took = time.monotonic() - t0
                wait_for("the fleet ok again", lambda: s.status()[
                    "fleet"]["state"] == "ok")
                # Hooks still under way end within their interval.
                t1 = time.monotonic()
                wait_for("1.5 s", lambda: time.monotonic() > t1 + 1.5)
                runs = len(hook_runs(hooks)) - before
                # Every start lies between t0 and now, 1 s apart at least
                # (and one for the loop clock's millisecond rounding).
                elapsed = time.monotonic() - t0
                bound = most if most is not None else int(elapsed) + 2
                who = "nobody" if user else "root"
                check(runs <= bound,
                      f"{who}: {runs} hook runs for {flips} flips in "
                      f"{took:.1f} s (at most {bound})")
                if user is None:
                    check(runs >= 1, "root's flapping ran no hook at all")
                print(f"  {who}: {flips} flips of 9 GiB in {took:.1f} s, "
                      f"{runs} hook runs", flush=True)
            finally:
                w.kill()
            wait_for("gone", lambda: w.pid not in s.ps())


DROPS = r"""
import os, sys, time
keep = [bytearray(1 << 20) for _ in range(8)]
for _ in range(3000):
    if any("-slots:" in line for line in open("/proc/self/maps")):
        break
    keep.append(bytearray(1 << 16))
    time.sleep(0.01)
else:
    sys.exit("never mapped a slot table")
if sys.argv[1] == "later":  # as root until told, then to uid argv[2]
    print("ready", flush=True)
    sys.stdin.readline()
    os.setuid(int(sys.argv[2]))
    print("dropped", flush=True)
    sys.stdin.readline()
    sys.exit(0)
(os.seteuid if sys.argv[1] == "seteuid" else os.setuid)(65534)
print("ready", flush=True)
sys.stdin.readline()
"""


def dropper(s, how):
    """A python worker of group dropped, registered as root, that then
    gave up root by `how` (os.seteuid or os.setuid)."""
    w = Worker([sys.executable, "-c", DROPS, how], s.env(group="dropped"))
    check(w.readline() == "ready", "the worker did not start")
    wait_for("registered as root",
             lambda: s.ps().get(w.pid, {}).get("uid") == 0)
    return w


def test_a_worker_that_dropped_root_claims_as_nobody():
    cfg = config("[limits]\nfleet = 1GiB\nrss_interval = 100\n"
                 "[group dropped]\nlimit = 512MiB\n")
    with Server("--config", cfg) as s:
        # Only its effective uid given up: root again whenever it likes,
        # so still root's, and trusted.
        w = dropper(s, "seteuid")
        try:
            claim(s, w.pid, 1 << 40)
            wait_for("the claim counted", lambda: s.status()["fleet"][
                "bytes"] >= 1 << 40)
            time.sleep(1.0 * MULT)  # ten sweeps: none may distrust it
            check(s.ps()[w.pid]["unvouched"] == 0, f"{s.ps()[w.pid]}")
            check("left its uid" not in s.logtext(), s.tail())
        finally:
            w.kill()
        w = dropper(s, "setuid")
        try:
            check(os.stat(f"/proc/{w.pid}").st_uid == 65534,
                  "the worker did not drop to nobody")
            claim(s, w.pid, 1 << 49)
            wait_for("the lie vouched for by the kernel", lambda: s.ps()[
                w.pid]["unvouched"] >= (1 << 49) - 64 * MIB)
            f = wait_for("the fleet back to what is held", lambda: (
                lambda f: f if f["bytes"] < GIB else None)(
                    s.status()["fleet"]))
            check(f["state"] == "ok", f"fleet {f}")
            # Its lie is nobody's, not root's: root's own Admit into
            # the group is granted.
            s.cli("admit", "--bytes", "1MiB", "--group", "dropped",
                  "--ttl", "5")
            check(f"pid={w.pid} uid=0 euid=65534" in s.logtext(),
                  "no warning names the worker: " + s.tail())
            print(f"  root worker now nobody claims 2^49: fleet "
                  f"{f['bytes'] >> 20} MiB, {f['state']}", flush=True)
        finally:
            w.kill()


def test_a_dropped_workers_neighbours_are_vouched_for():
    second = second_user()
    cfg = config("[server]\ngroup = nogroup\n"
                 "[limits]\nfleet = 1GiB\nprocess = 100MiB\n"
                 "rss_interval = 100\n"
                 "[enforce]\nsignal = SIGKILL\ngrace = 200\n"
                 f"[trust]\ntrusted_uids = {second[0]}\n")
    preload, hold = world_readable_copy(
        os.environ["MEMTALLY_PRELOAD_LIB"], worker("hold"))
    with Server("--config", cfg) as s:
        open_to_nobody(s)
        env = s.env()
        env["LD_PRELOAD"] = preload

        def root_worker():
            x = Worker([*hold, "4"], env)
            x.readline()
            return x
        early, late = root_worker(), None
        # Trusted too, in a table of its own: out of reach.
        other = Worker([*hold, "4"], env, user=(second[0], NOGROUP))
        other.readline()
        w = dropper(s, "setuid")
        try:
            wait_for("its leaving seen", lambda: (
                f"pid={w.pid} uid=0 euid=65534" in s.logtext()))
            late = root_worker()
            for x in (early, late):
                wait_for("a root worker distrusted", lambda x=x: (
                    f"pid={x.pid} uid=0 leaver_uid=65534" in s.logtext()))
            ps = s.ps()
            reach = "in reach of a worker that left its uid"
            check(ps[early.pid]["trust"] == reach and
                  ps[late.pid]["trust"] == reach and
                  ps[late.pid]["trust_uid"] == 65534 and
                  ps[w.pid]["trust"] == "left its uid" and
                  ps[other.pid]["trust"] == "full",
                  f"ps: {ps[early.pid]} {ps[late.pid]} {ps[w.pid]} "
                  f"{ps[other.pid]}")
            # What whoever controls the dropped worker could write, in
            # any slot of root's table.
            claim(s, early.pid, 1 << 49)
            claim(s, late.pid, 1 << 49)
            for x in (early, late):
                wait_for("the lie vouched for by the kernel",
                         lambda x=x: s.ps()[x.pid]["unvouched"] >=
                         (1 << 49) - 64 * MIB)
            f = wait_for("the fleet back to what is held", lambda: (
                lambda f: f if f["bytes"] < GIB else None)(
                    s.status()["fleet"]))
            check(f["state"] == "ok", f"fleet {f}")
            # Root's own Admit is not denied for it.
            a = s.cli("admit", "--bytes", "1MiB", "--ttl", "5")
            check(a["admitted"], f"root's Admit: {a}")
            # Their own limit (100 MiB) sees what the kernel vouches
            # for: not signalled past the grace.
            time.sleep(1.0 * MULT)
            check(early.proc.poll() is None and late.proc.poll() is None,
                  "a root worker was signalled")
            # Out of reach, a trusted worker's claim counts in full.
            claim(s, other.pid, 50 * MIB)
            wait_for("the trusted claim counted", lambda: s.ps()[
                other.pid]["bytes"] >= 50 * MIB)
            check(s.ps()[other.pid]["unvouched"] == 0,
                  f"{s.ps()[other.pid]}")
            print(f"  root workers in reach of a dropped worker claim "
                  f"2^49 each: fleet {f['bytes'] >> 20} MiB, "
                  f"{f['state']}", flush=True)
        finally:
            w.kill()
            for x in (early, late, other):
                if x:
                    x.close()


def test_a_neighbour_that_leaves_too_is_its_new_uids():
    """A root worker already in reach of one that left root (for nobody)
    leaves root itself, for a second user: from memtallyd's next read it
    has left its uid, and what it claims beyond the kernel's figure is
    that user's, not nobody's (trust_uid)."""
    second = second_user()
    cfg = config("[limits]\nfleet = 1GiB\nrss_interval = 100\n")
    reach = "in reach of a worker that left its uid"
    with Server("--config", cfg) as s:
        n = Worker([sys.executable, "-c", DROPS, "later", str(second[0])],
                   s.env(group="later"))
        check(n.readline() == "ready", "the worker did not start")
        w = dropper(s, "setuid")
        try:
            p = wait_for("in reach of the first leaver", lambda: (
                lambda q: q if q.get("trust") == reach else None)(
                    s.ps().get(n.pid, {})))
            check(p["trust_uid"] == 65534, f"{p}")
            n.send("go")
            check(n.readline() == "dropped", "it did not leave root")
            p = wait_for("seen leaving itself", lambda: (
                lambda q: q if q.get("trust") == "left its uid" else None)(
                    s.ps().get(n.pid, {})))
            check(p["trust_uid"] == second[0],
                  f"its excess is uid {p['trust_uid']}'s, not its own "
                  f"new uid {second[0]}'s: {p}")
            check(f"pid={n.pid} uid=0 euid={second[0]}" in s.logtext(),
                  s.tail())
        finally:
            w.kill()
            n.kill()


if __name__ == "__main__":
    run([test_lies_hurt_only_the_liar,
         test_a_genuine_allocation_is_vouched_for,
         test_a_hidden_allocation_is_signalled_not_an_honest_one,
         test_flapping_claim_runs_hooks_at_most_once_per_interval,
         test_a_worker_that_dropped_root_claims_as_nobody,
         test_a_dropped_workers_neighbours_are_vouched_for,
         test_a_neighbour_that_leaves_too_is_its_new_uids])
