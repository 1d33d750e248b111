"""What counts toward others is what the kernel says a process holds,
whatever its slot claims: pages shared by many processes count once, a
claim below the kernel's figure counts the kernel's, the allowance for
untouched memory runs out on its own clock, and no claim the kernel does
not hold gets anyone signalled. Real memtallyd as root, real workers of
`nobody`, of a second user and of eight hostile users the harness makes,
the real CLI run as each of them.

test_pages_shared_after_fork_count_once: a nobody process writes 400 MiB
and forks 10 children, each of which claims the 400 MiB in its own slot;
the fleet counts at most 400 MiB + one allowance, no hook runs, the second
user's 600 MiB process (over its own limit) is not signalled and its
100 MiB Admit is granted.

test_a_shared_mapping_counts_once_under_max: the same with a 400 MiB
MAP_SHARED anonymous mapping read by 11 registered processes and
`measure = max`: the fleet's rss and bytes count it once.

test_dips_renew_no_allowance: one nobody process, then eight processes of
eight uids, claiming 256 MiB more than they hold with a 30 ms dip to 0
every 4 s: the phantom bytes are gone within 2 x untouched_time, all of
them together never exceed untouched_allowance_total, and the honest
user's 100 MiB Admit is granted every time.

test_an_allowance_signals_no_one: a 1 MiB nobody process claiming
400 MiB (under its own limit) takes a fleet at 600 of 800 MiB over; past
the grace period memtallyd signals no one, though the other user's
process is over its own limit.

test_children_that_never_register_count_with_their_parent: a nobody
process writes 400 MiB and forks nine children that make no allocator
call (they never register); past its allowance the fleet counts the
400 MiB (>= 380 MiB, at most what the ten hold together + 32 MiB), not
the parent's tenth, and `ps` shows the children's part as
descendant_bytes.

test_a_child_sharing_the_address_space_counts_once: a nobody process
holding 400 MiB makes two children with clone(CLONE_VM): the fleet counts
its memory once (at most its own figure + 32 MiB), none of it as theirs.

test_many_quiet_children_count_no_more_than_they_hold: a nobody process
writes 64 MiB and forks 300 quiet children: the fleet counts at most what
the 301 hold together + 32 MiB (a status read of those past the budget
counted 2.8 GiB), the children's share is counted, and the cut is logged.

test_a_descendant_whose_main_thread_ended_is_still_compared,
test_children_whose_main_threads_ended_are_all_counted,
test_a_clone_of_a_registered_child_counts_once,
test_a_clone_with_a_lower_pid_than_its_original_counts_once,
test_a_memfd_a_descendant_maps_counts_once,
test_short_lived_children_hide_no_one: descendants made the ways that
could fool the family walk (`kin` worker: a CLONE_VM child living on in
a thread, children living on in threads, a CLONE_VM|CLONE_PARENT clone of
a registered child, a memfd the worker holds and a child maps, a stream
of children living 3 ms): each memory counts once, none is hidden.

test_understating_is_refereed: a nobody process holding 500 MiB zeroes
its own slot, and another hides 500 MiB in a memfd it never maps (under
`measure = max`): within one RSS sweep the fleet counts >= 500 MiB, and
the second user's 1,900 MiB Admit against 2 GiB is denied.

test_a_file_named_like_a_memfd_is_not_one: a nobody process holds a 300
MiB file on disk open at "/memfd:disguised" in a mount namespace of its
own (its link reads as an unmapped memfd's), beside a nobody process that
really holds 300 MiB in an unmapped memfd: once the sweep counts the
memfd, the disguised file is not counted (the process's rss stays under
64 MiB and the fleet under 400 MiB).

test_a_run_below_a_worker_stays_in_its_family: a nobody worker starts
`memtally run -- env -u LD_PRELOAD python3` holding 200 MiB: the worker's
descendants and the fleet count it (they counted 6.8 MiB when the run's
own reading stopped the worker's walk).

Skipped (77) with the reason where a mount namespace cannot be made.
"""
import os
import struct
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import (CLI, LANE0_BYTES, MIB, MULT, NOBODY, NOGROUP,  # noqa: E402
                     Server, Skip, Worker, check, claim, cli_as, find_slot,
                     hook_runs, hooks_conf, open_to_nobody, proc_kib,
                     rss_anon, run, second_user, test_user, wait_for, worker,
                     world_readable_copy)
from harness import config_file as config  # noqa: E402

GIB = 1 << 30


def ready_pids(w):
    line = w.readline(timeout=60 * MULT)
    check(line and line.startswith("ready pids="), f"worker said {line!r}")
    return [int(x) for x in line.split("=", 1)[1].split(",")]


def nobody_bytes(s, exclude):
    """What nobody's processes count toward the fleet: the fleet's bytes
    less those of the processes in `exclude` (vouched: bytes - unvouched;
    those are trusted or honest, so all their bytes)."""
    f = s.status()["fleet"]
    ps = s.ps()
    return f["bytes"] - sum(ps[p]["bytes"] for p in exclude if p in ps), f


def shared_run(mode, measure):
    second = second_user()
    d = tempfile.mkdtemp(prefix="mt-trustk-")
    hooks, hconf = hooks_conf(d)
    cfg = config("[server]\ngroup = nogroup\n"
                 f"[limits]\nfleet = 2GiB\nprocess = 512MiB\n"
                 f"measure = {measure}\nrss_interval = 500\n"
                 "[enforce]\nsignal = SIGKILL\ngrace = 500\n" + hconf)
    preload, cli, share, hold = world_readable_copy(
        os.environ["MEMTALLY_PRELOAD_LIB"], CLI, worker("share"),
        worker("hold"))
    with Server("--config", cfg) as s:
        open_to_nobody(s)
        env = s.env()
        env["LD_PRELOAD"] = preload
        victim = Worker([*hold, "600"], env, user=(second[0], NOGROUP))
        sharer = Worker([*share, mode, "400", "10"], env,
                        user=(NOBODY, NOGROUP))
        try:
            check(victim.readline().startswith("ready"), "victim not ready")
            pids = ready_pids(sharer)
            check(len(pids) == 11, f"pids {pids}")
            wait_for("all registered", lambda: all(
                p in s.ps() for p in pids + [victim.pid]), timeout=30)
            wait_for("the victim over its own limit", lambda: s.ps()[
                victim.pid]["state"] == "over")
            if mode == "private":
                # Each child claims the 400 MiB it shares.
                for p in pids[1:]:
                    claim(s, p, 400 * MIB)
                wait_for("the claims published", lambda: sum(
                    s.ps()[p]["bytes"] for p in pids) >= 4000 * MIB,
                    timeout=10 * MULT)
            # Under `measure = max` the mapping, resident in all 11, is
            # the claim: each one's resident set holds it.
            # Two sweeps for the kernel's figures to follow, then 3 s in
            # which nothing shared may move. A full sweep that read the
            # children before they registered charged them to their
            # parent too, until the next one (a named gap: at most one
            # full sweep, which a loaded machine spaces further apart
            # than rss_interval): that one first.
            t0 = time.monotonic()
            wait_for("1.2 s", lambda: time.monotonic() > t0 + 1.2)
            wait_for("no child charged to the parent", lambda: s.ps()[
                pids[0]].get("descendant_bytes", 0) == 0,
                timeout=30 * MULT)
            end = time.monotonic() + 3 * MULT
            worst = worst_rss = 0
            while time.monotonic() < end:
                nb, f = nobody_bytes(s, [victim.pid])
                worst = max(worst, nb)
                worst_rss = max(worst_rss, f["rss"])
                check(f["state"] == "ok", f"fleet {f['state']}: {f}")
                time.sleep(0.05)
            # What the sharers really hold, shared pages once: the sum of
            # their proportional sets (the 400 MiB, and each one's own
            # pages: more where transparent huge pages are always on);
            # 256 MiB of allowance; 32 MiB for the victim's figure, read
            # apart from the fleet's. Counting the pages in each child
            # would be 4 GiB more.
            held = sum(proc_kib(p, "smaps_rollup", "Pss") for p in pids)
            bound = held + 256 * MIB + 32 * MIB
            check(worst <= bound,
                  f"nobody's sharers counted {worst >> 20} MiB (at most "
                  f"{bound >> 20}: {held >> 20} MiB held + 256 + 32)")
            # The fleet's rss: the victim's ~600 MiB, the 400 MiB once,
            # and the processes' own pages.
            check(worst_rss <= 600 * MIB + 400 * MIB + 64 * MIB,
                  f"fleet rss {worst_rss >> 20} MiB")
            check(hook_runs(hooks) == [], f"hooks ran: {hook_runs(hooks)}")
            check(victim.proc.poll() is None, "the victim was killed")
            check("enforcement: signal sent" not in s.logtext(),
                  "memtallyd signalled someone")
            rc, out = cli_as(s, (second[0], NOGROUP), cli, "admit",
                             "--bytes", "100MiB", "--ttl", "60")
            check(rc == 0, f"second user's admit: {rc} {out}")
            how = ("claiming" if mode == "private" else "mapping")
            print(f"  {mode}, measure={measure}: 11 processes {how} "
                  f"4.4 GiB of 400 MiB counted at most {worst >> 20} MiB "
                  f"(fleet rss at most {worst_rss >> 20} MiB); no hook, no "
                  f"signal, the other user admitted", flush=True)
        finally:
            sharer.kill()
            victim.kill()


def test_pages_shared_after_fork_count_once():
    shared_run("private", "accounted")


def test_a_shared_mapping_counts_once_under_max():
    shared_run("shared", "max")


def test_children_that_never_register_count_with_their_parent():
    """A nobody worker writes 400 MiB and forks nine children that never
    register (no allocator call): their proportional figures are the
    parent's, so the fleet counts the 400 MiB once, not the parent's
    tenth of it, once its allowance is spent."""
    cfg = config("[server]\ngroup = nogroup\n"
                 "[limits]\nfleet = 2GiB\nrss_interval = 500\n"
                 "[trust]\nuntouched_time = 1s\n")
    preload, share = world_readable_copy(
        os.environ["MEMTALLY_PRELOAD_LIB"], worker("share"))
    with Server("--config", cfg) as s:
        open_to_nobody(s)
        env = s.env()
        env["LD_PRELOAD"] = preload
        sharer = Worker([*share, "private", "400", "9", "quiet"], env,
                        user=(NOBODY, NOGROUP))
        try:
            pids = ready_pids(sharer)
            check(len(pids) == 10, f"pids {pids}")
            parent = pids[0]
            wait_for("the parent registered", lambda: parent in s.ps())
            # Its own proportional figure is about a tenth of the 400 MiB
            # (a page shared by ten counts 1/10 in each).
            own = proc_kib(parent, "smaps_rollup", "Pss_Anon")
            check(own < 100 * MIB, f"the parent's own Pss_Anon "
                  f"{own >> 20} MiB: the children do not share its pages")
            # Past its allowance (untouched_time: then what it claims
            # beyond what counts is unvouched) and a full sweep or two,
            # the fleet counts what the family holds.
            # A read of the parent made before it forked (its 400 MiB
            # its own then) also passes the fleet's figure: the family's
            # own figure says a sweep after the fork came.
            def counted():
                f = s.status()["fleet"]
                return (f["unvouched"] > 0 and f["bytes"] >= 380 * MIB and
                        s.ps().get(parent, {}).get("descendant_bytes", 0)
                        >= 300 * MIB)
            wait_for("the family counted", counted, timeout=15 * MULT)
            ps = s.ps()
            check(not any(p in ps for p in pids[1:]),
                  f"a quiet child registered: {sorted(ps)}")
            fam = ps[parent]["descendant_bytes"]
            check(fam >= 300 * MIB and ps[parent]["rss"] >= 380 * MIB,
                  f"descendant_bytes {fam >> 20} MiB, rss "
                  f"{ps[parent]['rss'] >> 20} MiB")
            # Once, not ten times: at most what the ten hold together
            # (their proportional sets) and a little for the sweeps'
            # timing.
            held = sum(proc_kib(p, "smaps_rollup", "Pss") for p in pids)
            end = time.monotonic() + 2 * MULT
            worst = 0
            while time.monotonic() < end:
                f = s.status()["fleet"]
                worst = max(worst, f["bytes"], f["rss"])
                time.sleep(0.05)
            check(worst <= held + 32 * MIB,
                  f"the family counted {worst >> 20} MiB, more than the "
                  f"{held >> 20} MiB it holds: {s.ps()[parent]} "
                  f"{s.status()['fleet']}")
            check("descendants that never registered hold memory"
                  in s.logtext(), "no log line names the descendants")
            print(f"  nobody with 9 quiet children: parent's own Pss "
                  f"{own >> 20} MiB; counted {worst >> 20} MiB of "
                  f"{held >> 20} MiB held (descendants {fam >> 20} MiB)",
                  flush=True)
        finally:
            sharer.kill()


def family_run(args, settled, sub="share", watch=None):
    """A nobody sharer (`share` ARGS), once settled(s, pids) and two full
    sweeps more: the fleet's worst figure over 2 s, what its processes
    hold (their Pss), the sharer's ps entry, the log and how many they
    are."""
    cfg = config("[server]\ngroup = nogroup\n"
                 "[limits]\nfleet = 2GiB\nrss_interval = 500\n"
                 "[trust]\nuntouched_time = 1s\n")
    preload, share = world_readable_copy(
        os.environ["MEMTALLY_PRELOAD_LIB"], worker(sub))
    with Server("--config", cfg) as s:
        open_to_nobody(s)
        env = s.env()
        env["LD_PRELOAD"] = preload
        sharer = Worker([*share, *args], env, user=(NOBODY, NOGROUP))
        try:
            pids = ready_pids(sharer)
            parent = pids[0]
            seen = []
            wait_for("the sharer registered", lambda: parent in s.ps())
            wait_for("its figures settled", lambda: settled(s, pids),
                     timeout=15 * MULT)
            t0 = time.monotonic()
            wait_for("1.2 s", lambda: time.monotonic() > t0 + 1.2 * MULT)
            end = time.monotonic() + 2 * MULT
            worst = 0
            while time.monotonic() < end:
                f = s.status()["fleet"]
                check(f["state"] == "ok", f"fleet {f['state']}: {f}")
                worst = max(worst, f["bytes"], f["rss"])
                if watch:
                    seen.append(watch(s, parent))
                time.sleep(0.05)
            held = 0
            for p in pids:
                try:
                    held += proc_kib(p, "smaps_rollup", "Pss")
                except (OSError, AssertionError):
                    pass  # gone, or a leader whose main thread ended
            if watch:
                return worst, held, s.ps()[parent], seen, pids
            return worst, held, s.ps()[parent], s.logtext(), len(pids)
        finally:
            sharer.kill()


def test_a_child_sharing_the_address_space_counts_once():
    """A nobody worker holds 400 MiB and makes two children with
    clone(CLONE_VM), as vfork and posix_spawn do before their exec: each
    shows the whole address space as its own. Charged to the worker, they
    made it 1.2 GiB; the same memory counts once."""
    # Its allowance spent: what it claims beyond what counts is
    # unvouched.
    worst, _, p, _, _ = family_run(
        ["private", "400", "2", "clonevm"],
        lambda s, pids: s.status()["fleet"]["unvouched"] > 0)
    own = p["rss"] - p["descendant_bytes"]
    check(p["descendant_bytes"] == 0,
          f"descendants sharing its address space charged: {p}")
    check(worst <= own + 32 * MIB,
          f"counted {worst >> 20} MiB of the {own >> 20} MiB it holds")
    print(f"  400 MiB worker with 2 CLONE_VM children: counted "
          f"{worst >> 20} MiB (its own {own >> 20} MiB)", flush=True)


def test_many_quiet_children_count_no_more_than_they_hold():
    """A nobody worker writes 64 MiB and forks 300 children that never
    register. Past a sweep's reads through smaps_rollup, the rest were
    read through status, which counts every page they share in full: 44
    children made 2.8 GiB of the 64 MiB and took a 2 GiB fleet over.
    Only proportional figures are charged, and the walk stops at the
    budget (said in the log)."""
    worst, held, p, log, n = family_run(
        ["private", "64", "300", "quiet"],
        lambda s, pids: s.ps()[pids[0]]["descendant_bytes"] > 0)
    check(n == 301, f"{n} processes")
    check(worst <= held + 32 * MIB,
          f"counted {worst >> 20} MiB, more than the {held >> 20} MiB "
          f"the 301 processes hold")
    check(p["descendant_bytes"] >= 32 * MIB,
          f"its children's share not counted: {p}")
    check("more unregistered descendants than a sweep reads" in log,
          "the budget's cut is not logged")
    print(f"  64 MiB worker with 300 quiet children: counted "
          f"{worst >> 20} MiB of {held >> 20} MiB held (descendants "
          f"{p['descendant_bytes'] >> 20} MiB)", flush=True)


def kin_run(mode, mib, settled=None, watch=None):
    """family_run of `kin MODE MIB`: what the node holds of anonymous and
    shared memory is read beside, the referee of what the fleet counts."""
    return family_run(
        [mode, str(mib)],
        settled or (lambda s, pids: s.ps()[pids[0]]["descendant_bytes"]
                    > 0),
        sub="kin", watch=watch)


def test_a_descendant_whose_main_thread_ended_is_still_compared():
    """A CLONE_VM child of a 400 MiB worker ends its main thread and
    lives on in another: its task has no address space, so it compared
    as no one's and was charged the worker's 400 MiB again. It is
    compared through a live thread."""
    worst, _, p, _, _ = kin_run(
        "zombievm", 400,
        lambda s, pids: s.status()["fleet"]["unvouched"] > 0)
    own = p["rss"] - p["descendant_bytes"]
    check(p["descendant_bytes"] < 32 * MIB, f"charged twice: {p}")
    check(worst <= own + 32 * MIB,
          f"counted {worst >> 20} MiB of the {own >> 20} MiB it holds")
    print(f"  CLONE_VM child living on in a thread: counted "
          f"{worst >> 20} MiB (the worker's {own >> 20} MiB)", flush=True)


def test_children_whose_main_threads_ended_are_all_counted():
    """Three children write 100 MiB each and end their main threads:
    every such task compared equal to every other (none has an address
    space), and only the first was counted. All three are."""
    _, _, p, _, _ = kin_run("zombiefork", 100)
    check(p["descendant_bytes"] >= 280 * MIB,
          f"descendants counted {p['descendant_bytes'] >> 20} MiB of "
          f"300: {p}")
    print(f"  3 children of 100 MiB living on in threads: descendants "
          f"{p['descendant_bytes'] >> 20} MiB", flush=True)


def test_a_clone_of_a_registered_child_counts_once():
    """A registered child holds 300 MiB and makes a clone of itself with
    CLONE_VM|CLONE_PARENT: a child of the worker sharing the registered
    child's memory. Charged to the worker, the 300 MiB counted twice."""
    clone_counted_once("clonepar", "")


def clone_counted_once(mode, how):
    """kin MODE 300, once the registered child (the second pid) is
    listed: its clone is charged to no one, the 300 MiB count once."""
    worst, _, p, _, _ = kin_run(
        mode, 300, lambda s, pids: pids[1] in s.ps())
    check(p["descendant_bytes"] < 32 * MIB, f"charged twice: {p}")
    check(worst < 300 * MIB + 64 * MIB,
          f"counted {worst >> 20} MiB of 300 MiB")
    print(f"  clone of a registered 300 MiB child{how}: counted "
          f"{worst >> 20} MiB", flush=True)


def test_a_clone_with_a_lower_pid_than_its_original_counts_once():
    """The same, the clone's pid below the registered child's (pids
    wrap): children were compared in pid order, so the clone came before
    the registered child's address space was known, and counted again.
    Skipped (77) where pid_max is too large to wrap in a test."""
    with open("/proc/sys/kernel/pid_max") as f:
        if int(f.read()) > 65536:
            raise Skip("pid_max over 65536: wrapping the pids takes too "
                       "long")
    clone_counted_once("clonewrap", ", a lower pid")


def test_a_memfd_a_descendant_maps_counts_once():
    """The worker writes 300 MiB into a memfd it never maps, and a child
    maps all of it: the worker was charged the memfd as unmapped and the
    child its mapping, 600 MiB."""
    worst, _, p, _, _ = kin_run("memfdmap", 300)
    check(worst < 300 * MIB + 48 * MIB,
          f"counted {worst >> 20} MiB of a 300 MiB memfd: {p}")
    print(f"  a 300 MiB memfd a child maps: counted {worst >> 20} MiB",
          flush=True)


def test_short_lived_children_hide_no_one():
    """A child with 100 children of 4 MiB each, beside a stream of
    children that live 3 ms: one of those read and gone before a later
    comparison made every comparison meeting it fail, and most of the
    400 MiB went uncounted (30 MiB at times)."""
    _, _, p, seen, _ = kin_run(
        "churn", 4,
        lambda s, pids: s.ps()[pids[0]]["descendant_bytes"] >= 300 * MIB,
        watch=lambda s, pid: s.ps()[pid]["descendant_bytes"])
    check(min(seen) >= 380 * MIB,
          f"descendants counted as little as {min(seen) >> 20} MiB of "
          f"400")
    print(f"  100 children of 4 MiB beside a churn: descendants "
          f"{min(seen) >> 20}-{max(seen) >> 20} MiB", flush=True)


def dip_run(users, seconds):
    second = second_user()
    cfg = config("[server]\ngroup = nogroup\n"
                 "[limits]\nfleet = 2GiB\nrss_interval = 500\n"
                 "[trust]\nuntouched_time = 2s\n")
    window = 2.0
    preload, cli, hold = world_readable_copy(
        os.environ["MEMTALLY_PRELOAD_LIB"], CLI, worker("hold"))
    with Server("--config", cfg) as s:
        open_to_nobody(s)
        env = s.env()
        env["LD_PRELOAD"] = preload
        honest = Worker([*hold, "50"], env, user=(second[0], NOGROUP))
        liars = [Worker([*hold, "1"], env, user=(u, NOGROUP)) for u in users]
        maps = []
        try:
            for w in [honest] + liars:
                check(w.readline().startswith("ready"), "worker not ready")
            wait_for("all registered", lambda: all(
                w.pid in s.ps() for w in [honest] + liars))
            for w in liars:
                m, o = wait_for(f"slot of {w.pid}",
                                lambda w=w: find_slot(s.segment, w.pid))
                maps.append((m, o, struct.unpack_from(
                    "<q", m, o + LANE0_BYTES)[0]))

            def lie(on):
                for m, o, base in maps:
                    struct.pack_into("<q", m, o + LANE0_BYTES,
                                     base + (256 * MIB if on else 0))
            t0 = time.monotonic()
            lie(True)
            next_dip = t0 + 4.0
            next_admit = t0 + 0.5
            worst = worst_late = 0
            admits = granted = 0
            while time.monotonic() < t0 + seconds:
                now = time.monotonic()
                if now >= next_dip:
                    lie(False)
                    time.sleep(0.03)
                    lie(True)
                    next_dip += 4.0
                # What the liars are counted for beyond what the kernel
                # says they hold: bytes - unvouched (what counts toward
                # the fleet) less RssAnon, which the kernel referees
                # anyway (more than their claims where transparent huge
                # pages are always on).
                ps = s.ps()
                phantom = sum(ps[w.pid]["bytes"] - ps[w.pid]["unvouched"]
                              - rss_anon(w.pid) for w in liars
                              if w.pid in ps)
                worst = max(worst, phantom)
                if now > t0 + 2 * window + 0.5:
                    worst_late = max(worst_late, phantom)
                if now >= next_admit:
                    admits += 1
                    rc, out = cli_as(s, (second[0], NOGROUP), cli, "admit",
                                     "--bytes", "100MiB", "--ttl", "1")
                    granted += rc == 0
                    check(rc == 0, f"honest admit {admits}: {rc} {out}")
                    next_admit += 4.0
                time.sleep(0.02)
            lie(False)
            cap = 256 * MIB
            check(worst <= cap + 8 * MIB,
                  f"phantom {worst >> 20} MiB above the fleet-wide cap")
            check(worst_late <= 8 * MIB,
                  f"phantom {worst_late >> 20} MiB still counted after "
                  f"2 x untouched_time")
            print(f"  {len(liars)} uid(s) dipping: phantom at most "
                  f"{worst >> 20} MiB, after {2 * window:.0f} s at most "
                  f"{max(worst_late, 0) >> 20} MiB; honest admits "
                  f"{granted}/{admits}", flush=True)
        finally:
            for m, _, _ in maps:
                m.close()
            for w in [honest] + liars:
                w.kill()


def test_dips_renew_no_allowance():
    dip_run([NOBODY], 14 * MULT)
    dip_run([u for u, _ in [test_user(f"mt-hostile-{i}") for i in range(1, 9)]], 14 * MULT)


def test_an_allowance_signals_no_one():
    second = second_user()
    cfg = config("[server]\ngroup = nogroup\n"
                 "[limits]\nfleet = 800MiB\nprocess = 512MiB\n"
                 "[enforce]\nsignal = SIGKILL\ngrace = 500\n")
    preload, hold = world_readable_copy(
        os.environ["MEMTALLY_PRELOAD_LIB"], worker("hold"))
    with Server("--config", cfg) as s:
        open_to_nobody(s)
        env = s.env()
        env["LD_PRELOAD"] = preload
        victim = Worker([*hold, "600"], env, user=(second[0], NOGROUP))
        liar = Worker([*hold, "1"], env, user=(NOBODY, NOGROUP))
        try:
            for w in (victim, liar):
                check(w.readline().startswith("ready"), "not ready")
            wait_for("the victim over its own limit", lambda: s.ps().get(
                victim.pid, {}).get("state") == "over")
            wait_for("the liar registered", lambda: liar.pid in s.ps())
            claim(s, liar.pid, 400 * MIB)
            wait_for("the fleet over", lambda: s.status()["fleet"][
                "state"] == "over")
            # Four grace periods.
            t0 = time.monotonic()
            wait_for("2 s", lambda: time.monotonic() > t0 + 2.0)
            check(victim.proc.poll() is None, "the victim was killed")
            check("enforcement: signal sent" not in s.logtext(),
                  "memtallyd signalled someone")
            check(s.ps()[liar.pid]["state"] == "ok",
                  "the liar is over its own limit: the test is wrong")
            check("only by untouched allowances" in s.logtext(),
                  "no line says why nothing was signalled")
            print("  a 400 MiB claim took the fleet over; nothing "
                  "signalled in 2 s", flush=True)
        finally:
            victim.kill()
            liar.kill()


def test_a_reservation_signals_no_one():
    """A reservation is a promise: nothing is resident. nobody, with no
    process at all, admits 12 MiB (within its share of reserved bytes);
    then the second user's worker, over its own 30 MiB limit, grows from
    80 to 89 MiB, and the fleet is over its 100 MiB limit with the
    reservation: that worker was killed though the node held less than
    the limit. Nothing is signalled now, and a line says
    why."""
    second = second_user()
    cfg = config("[server]\ngroup = nogroup\n"
                 "[limits]\nfleet = 100MiB\nprocess = 30MiB\n"
                 "[enforce]\nsignal = SIGKILL\ngrace = 500\n")
    preload, hold, cli = world_readable_copy(
        os.environ["MEMTALLY_PRELOAD_LIB"], worker("hold"), CLI)
    with Server("--config", cfg) as s:
        open_to_nobody(s)
        env = s.env()
        env["LD_PRELOAD"] = preload
        victim = Worker([*hold, "80"], env, user=(second[0], NOGROUP))
        try:
            check(victim.readline().startswith("ready"), "not ready")
            wait_for("the victim over its own limit", lambda: s.ps().get(
                victim.pid, {}).get("state") == "over")
            rc, out = cli_as(s, (NOBODY, NOGROUP), cli, "admit", "--bytes",
                             "12MiB", "--ttl", "600")
            check(rc == 0, f"admit: {rc} {out}")
            # Then the victim grows by 9 MiB: 89 held, 101 with the
            # reservation.
            victim.send("more 9")
            check(victim.readline().startswith("ready"), "did not grow")
            wait_for("the fleet over", lambda: s.status()["fleet"][
                "state"] == "over")
            t0 = time.monotonic()
            wait_for("2 s", lambda: time.monotonic() > t0 + 2.0)
            check(victim.proc.poll() is None, "the victim was killed")
            check("enforcement: signal sent" not in s.logtext(),
                  "memtallyd signalled someone")
            check("untouched allowances or reservations" in s.logtext(),
                  "no line says why nothing was signalled")
        finally:
            victim.kill()


def test_understating_is_refereed():
    second = second_user()
    preload, cli, hold, share = world_readable_copy(
        os.environ["MEMTALLY_PRELOAD_LIB"], CLI, worker("hold"),
        worker("share"))
    for measure in ("accounted", "max"):
        cfg = config("[server]\ngroup = nogroup\n"
                     f"[limits]\nfleet = 2GiB\nmeasure = {measure}\n"
                     "rss_interval = 1000\n")
        with Server("--config", cfg) as s:
            open_to_nobody(s)
            env = s.env()
            env["LD_PRELOAD"] = preload
            env["MEMTALLY_ALLOCATOR_FREE"] = "0"
            if measure == "accounted":
                w = Worker([*hold, "500"], env, user=(NOBODY, NOGROUP))
                check(w.readline().startswith("ready"), "not ready")
                pid = w.pid
            else:
                w = Worker([*share, "memfd", "500"], env,
                           user=(NOBODY, NOGROUP))
                pid = ready_pids(w)[0]
            try:
                wait_for("registered", lambda: pid in s.ps())
                if measure == "accounted":
                    wait_for("500 MiB claimed", lambda: s.ps()[pid][
                        "bytes"] >= 500 * MIB)
                    claim(s, pid, -s.ps()[pid]["bytes"])
                    wait_for("the claim zeroed", lambda: s.ps()[pid][
                        "bytes"] < MIB)
                t0 = time.monotonic()
                f = wait_for("the fleet counting >= 500 MiB", lambda: (
                    lambda f: f if f["bytes"] >= 500 * MIB else None)(
                        s.status()["fleet"]), timeout=10 * MULT)
                took = time.monotonic() - t0
                rc, out = cli_as(s, (second[0], NOGROUP), cli, "admit",
                                 "--bytes", "1900MiB", "--ttl", "60")
                check(rc == 3, f"1,900 MiB admitted: {rc} {out}")
                what = ("zeroed slot" if measure == "accounted"
                        else "unmapped memfd")
                print(f"  {what}, measure={measure}: fleet "
                      f"{f['bytes'] >> 20} MiB after {took:.1f} s; the "
                      f"1,900 MiB Admit denied", flush=True)
            finally:
                w.kill()


def test_a_file_named_like_a_memfd_is_not_one():
    preload, share, hold = world_readable_copy(
        os.environ["MEMTALLY_PRELOAD_LIB"], worker("share"), worker("hold"))
    cfg = config("[server]\ngroup = nogroup\n"
                 "[limits]\nfleet = 2GiB\nmeasure = max\n"
                 "rss_interval = 1000\n")
    with Server("--config", cfg) as s, \
            tempfile.TemporaryDirectory(prefix="mt-disguise-",
                                        dir="/var/tmp") as d:
        open_to_nobody(s)
        env = s.env()
        env.pop("LD_PRELOAD", None)
        env["MT_EXEC_PRELOAD"] = preload
        env["MEMTALLY_ALLOCATOR_FREE"] = "0"
        fake = Worker(worker("disguise", 300, NOBODY, NOGROUP, d, *hold, 1),
                      env)
        line = fake.readline(timeout=60)
        if line.startswith("error "):
            fake.kill()
            raise Skip(f"no mount namespace of its own: {line}")
        check(line.startswith("ready"), f"disguised worker said {line!r}")
        link = os.readlink(f"/proc/{fake.pid}/fd/3") if os.path.exists(
            f"/proc/{fake.pid}/fd/3") else ""
        env["LD_PRELOAD"] = preload
        real = Worker([*share, "memfd", "300"], env, user=(NOBODY, NOGROUP))
        try:
            pid = ready_pids(real)[0]
            wait_for("both registered",
                     lambda: pid in s.ps() and fake.pid in s.ps())
            wait_for("the real memfd counted", lambda: s.ps()[pid][
                "rss"] >= 300 * MIB, timeout=10 * MULT)
            # The sweep that counted the memfd read the disguised file's
            # holder too (it registered first); one more to be sure.
            time.sleep(1.5)
            ps = s.ps()
            fleet = s.status()["fleet"]
            print(f"  {link!r} held open: rss {ps[fake.pid]['rss'] >> 20} "
                  f"MiB; the real memfd's holder {ps[pid]['rss'] >> 20} "
                  f"MiB; fleet {fleet['bytes'] >> 20} MiB", flush=True)
            check(ps[fake.pid]["rss"] < 64 * MIB,
                  f"a file on disk counted as memory: {ps[fake.pid]}")
            check(fleet["bytes"] < 400 * MIB, f"fleet {fleet}")
        finally:
            real.kill()
            fake.kill()


def test_a_run_below_a_worker_stays_in_its_family():
    """A nobody worker (preloaded python3, registered) starts `memtally
    run --bytes 1MiB -- env -u LD_PRELOAD python3` holding 200 MiB. The
    run's command never registers and is below the worker: the worker's
    family holds it, so the fleet counts it, as it counts any child that
    never registered. (The run's own reading of it is its reservation's
    use, in no counted figure.) A first version of those readings stopped
    the worker's walk at the run: the fleet counted 6.8 MiB."""
    cfg = config("[server]\ngroup = nogroup\n"
                 "[limits]\nfleet = 2GiB\nrss_interval = 200\n"
                 "[trust]\nuntouched_time = 1s\n")
    preload, cli = world_readable_copy(os.environ["MEMTALLY_PRELOAD_LIB"],
                                       CLI)
    # Holds until its stdin (the test's pipe, through the worker and the
    # run) ends: nothing is left behind.
    hold = ("import sys; b = b'\\x01' * (200 << 20); "
            "print('held', flush=True); sys.stdin.read()")
    with Server("--config", cfg) as s:
        open_to_nobody(s)
        env = s.env()
        env["LD_PRELOAD"] = preload
        code = ("import subprocess, sys\n"
                "x = [bytearray(1000) for _ in range(2000)]\n"
                "print('ready', flush=True)\n"
                "subprocess.run(['env', '-u', 'LD_PRELOAD', sys.argv[1], "
                "'--socket', sys.argv[2], 'run', '--bytes', '1MiB', '--', "
                "'env', '-u', 'LD_PRELOAD', sys.executable, '-c', "
                "sys.argv[3]])\n")
        w = Worker([sys.executable, "-c", code, cli, s.socket, hold], env,
                   user=(NOBODY, NOGROUP))
        try:
            check(w.readline(timeout=30 * MULT).startswith("ready"),
                  "the worker did not start")
            check(w.readline(timeout=30 * MULT).startswith("held"),
                  "the run's command does not hold its memory")
            wait_for("the worker registered", lambda: w.pid in s.ps(),
                     timeout=15 * MULT)
            wait_for("the run's command counted with the worker",
                     lambda: s.ps().get(w.pid, {}).get(
                         "descendant_bytes", 0) >= 190 * MIB and
                     s.status()["fleet"]["bytes"] >= 190 * MIB,
                     timeout=20 * MULT)
            f = s.status()["fleet"]
            print(f"  fleet {f['bytes'] / MIB:.1f} MiB, the worker's "
                  f"descendants {s.ps()[w.pid]['descendant_bytes'] / MIB:.1f}"
                  f" MiB", flush=True)
        finally:
            w.close()


if __name__ == "__main__":
    run([test_pages_shared_after_fork_count_once,
         test_a_shared_mapping_counts_once_under_max,
         test_children_that_never_register_count_with_their_parent,
         test_a_child_sharing_the_address_space_counts_once,
         test_many_quiet_children_count_no_more_than_they_hold,
         test_a_descendant_whose_main_thread_ended_is_still_compared,
         test_children_whose_main_threads_ended_are_all_counted,
         test_a_clone_of_a_registered_child_counts_once,
         test_a_clone_with_a_lower_pid_than_its_original_counts_once,
         test_a_memfd_a_descendant_maps_counts_once,
         test_short_lived_children_hide_no_one,
         test_dips_renew_no_allowance,
         test_an_allowance_signals_no_one,
         test_a_reservation_signals_no_one,
         test_understating_is_refereed,
         test_a_file_named_like_a_memfd_is_not_one,
         test_a_run_below_a_worker_stays_in_its_family])
