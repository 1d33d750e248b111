"""State hooks ([hooks] on_ok, on_high, on_over): real memtallyd, real
workers, real shell commands.

- the environment a hook gets, for the fleet and for a group, through
  ok -> high -> over -> ok driven by real memory: scope, kind, state,
  previous, bytes, reserved, limit, node, socket;
- one hook per scope at a time, the latest state wins: changes during a
  running hook are coalesced into (at most) the hook of the scope's latest
  state, run after it, with PREVIOUS = what was last reported; a hook's
  exit status and stderr are logged;
- a hook that hangs (sleep 1000) is killed with its process group after
  [hooks] timeout, and that is logged; meanwhile memtallyd answers
  GetUsage with its usual latency (medians compared, generously: the
  machine is shared);
- a hook still running when memtallyd stops is killed with its group,
  and the stop is clean;
- a SIGHUP reload installs hooks;
- the fleet's hook runs once at start for the fleet's state then, told
  PREVIOUS=unknown;
- a failed hook runs again ([hooks] retry, the wait doubling) with the
  environment it had, while its state holds, and no longer once the
  state has changed.
"""
import os
import signal
import socket
import statistics
import subprocess
import tempfile
import time

import pbwire as pb
from harness import (CLI, MIB, MULT, Server, Skip, Worker, check, run,
                     signal_until, wait_for, worker)
from harness import config_file as config

# Holders whose frees leave the process at once: jemalloc purges freed
# pages without its 10 s decay, so what they free leaves RssAnon, and
# memtally's figure with it (which counts jemalloc's dirty pages).
GIVES_BACK = {"MALLOC_CONF": "dirty_decay_ms:0,muzzy_decay_ms:0"}


def env_dump_cmd(d):
    """A hook that writes its MEMTALLY_* environment to a new file."""
    return (f"f={d}/$(date +%s%N); env | grep ^MEMTALLY_ > $f.tmp; "
            "mv $f.tmp $f.env")


def dumps(d):
    out = []
    for name in sorted(os.listdir(d)):
        if name.endswith(".env"):
            with open(os.path.join(d, name)) as f:
                out.append(dict(line.rstrip("\n").split("=", 1)
                                for line in f if "=" in line))
    return out


def cli(s, *args):
    r = subprocess.run([CLI, "--socket", s.socket, *args],
                       capture_output=True, timeout=30 * MULT)
    check(r.returncode == 0, f"memtally {args}: {r.stderr.decode()}")


def test_environment_fleet_and_group():
    d = tempfile.mkdtemp(prefix="mt-hooks-")
    cmd = env_dump_cmd(d)
    cfg = config("[limits]\nfleet = 100MiB\n[group g]\nlimit = 50MiB\n"
                 f"[hooks]\nnode = node-a\non_ok = {cmd}\n"
                 f"on_high = {cmd}\non_over = {cmd}\n")
    # Every hook's lines are counted below: none held back by the budget.
    with Server("--config", cfg, "--log-budget", "none") as s:
        seen = []

        def expect(scope, state, previous, limit, lo_mib, hi_mib):
            n = len(seen) + 1
            got = wait_for(f"hook {scope} {state}", lambda: (
                lambda ds: ds if len(ds) >= n else None)(dumps(d)))
            check(len(got) == n, f"more hooks than changes: {got[len(seen):]}")
            e = got[-1]
            seen.append(e)
            kind = "fleet" if scope == "fleet" else "group"
            want = {"MEMTALLY_SCOPE": scope, "MEMTALLY_KIND": kind,
                    "MEMTALLY_STATE": state, "MEMTALLY_PREVIOUS": previous,
                    "MEMTALLY_LIMIT": str(limit), "MEMTALLY_RESERVED": "0",
                    "MEMTALLY_NODE": "node-a",
                    "MEMTALLY_MEASURE": "accounted",
                    "MEMTALLY_SOCKET": s.socket}
            for k, v in want.items():
                check(e.get(k) == v, f"{scope} {state}: {k}={e.get(k)!r}, "
                      f"want {v!r}: {e}")
            b = int(e["MEMTALLY_BYTES"])
            check(lo_mib * MIB <= b <= hi_mib * MIB,
                  f"{scope} {state}: MEMTALLY_BYTES {b / MIB:.2f} MiB, "
                  f"want {lo_mib}..{hi_mib}")
            check(e.get("MEMTALLY_REASON"), f"no reason: {e}")
            print(f"  {scope} {previous} -> {state}: "
                  f"{b / MIB:.1f} MiB of {limit // MIB} MiB")

        def expect_down(scope, limit, lo_mib, hi_mib):
            """Over to ok. A tick may see a free half done (a loaded
            machine): the scope then passes through high on its way."""
            got = wait_for(f"hook {scope} ok", lambda: (
                lambda ds: ds if ds and ds[-1].get("MEMTALLY_STATE") == "ok"
                and ds[-1].get("MEMTALLY_SCOPE") == scope else None)(
                    dumps(d)))
            if len(got) == len(seen) + 2:
                mid = got[len(seen)]
                check(mid.get("MEMTALLY_STATE") == "high" and
                      mid.get("MEMTALLY_PREVIOUS") == "over" and
                      mid.get("MEMTALLY_SCOPE") == scope,
                      f"{scope} on its way down: {mid}")
                seen.append(mid)
                expect(scope, "ok", "high", limit, lo_mib, hi_mib)
            else:
                expect(scope, "ok", "over", limit, lo_mib, hi_mib)

        # At start, the fleet's state as it is: nothing counted yet.
        expect("fleet", "ok", "unknown", 100 * MIB, 0, 0)
        w1 = Worker([*worker("hold"), "20"],
                    s.env(group="g", **GIVES_BACK))
        w2 = None
        try:
            check(w1.readline().startswith("ready"), "w1")
            w1.send("more 27")  # group 47 MiB: high at 45
            check(w1.readline().startswith("ready"), "w1 more")
            # The figure as the tick saw it cross the mark: from the mark
            # up to where the worker stopped.
            expect("g", "high", "ok", 50 * MIB, 45, 48)
            w1.send("more 10")  # group 57 MiB: over 50
            check(w1.readline().startswith("ready"), "w1 more")
            expect("g", "over", "high", 50 * MIB, 50, 58)
            w2 = Worker([*worker("hold"), "36"],
                        s.env(group="h", **GIVES_BACK))
            check(w2.readline().startswith("ready"), "w2")  # fleet 93
            expect("fleet", "high", "ok", 100 * MIB, 90, 94)
            w2.send("more 10")  # fleet 103 MiB: over 100
            check(w2.readline().startswith("ready"), "w2 more")
            expect("fleet", "over", "high", 100 * MIB, 100, 104)
            w2.send("free")  # fleet 57: below both lower marks
            check(w2.readline() == "freed", "w2 free")
            expect_down("fleet", 100 * MIB, 57, 85)
            w1.send("free")
            check(w1.readline() == "freed", "w1 free")
            expect_down("g", 50 * MIB, 0, 1)
        finally:
            w1.close()
            if w2:
                w2.close()
        runs = len(seen)
        wait_for(f"{runs} hook ends logged", lambda: s.logtext().count(
            'msg="hook finished"') == runs)
        check(s.logtext().count("exit_status=0") == runs, "hooks failed")


def hook_log(path):
    try:
        with open(path) as f:
            return [line.split() for line in f.read().splitlines()]
    except FileNotFoundError:
        return []


def test_one_at_a_time_latest_state_wins():
    d = tempfile.mkdtemp(prefix="mt-hooks-")
    log = os.path.join(d, "log")
    # Each hook runs until the gate file exists, so the changes below
    # all happen while the first one runs, however slow the machine;
    # the over hook also complains and fails.
    gate = os.path.join(d, "gate")
    script = os.path.join(d, "hook.sh")
    with open(script, "w") as f:
        f.write("[ $MEMTALLY_PREVIOUS = unknown ] && "
                f"echo at-start $MEMTALLY_STATE >> {log}.start && exit 0\n"
                f"echo start $MEMTALLY_STATE $MEMTALLY_PREVIOUS >> {log}\n"
                f"while [ ! -e {gate} ]; do sleep 0.02; done\n"
                f"echo end $MEMTALLY_STATE >> {log}\n")
    cmd = f"sh {script}"
    cfg = config("[limits]\nfleet = 1GiB\n[hooks]\nretry = 0\n"
                 f"on_ok = {cmd}\non_high = {cmd}\n"
                 f"on_over = {cmd}; echo over-stderr >&2; exit 3\n")
    # Every hook's lines, however fast they come (the log's budget would
    # hold back some of the over hook's).
    with Server("--config", cfg, "--log-budget", "none") as s:
        # The hook at start, out of the way first.
        wait_for("hook at start", lambda: 'msg="hook finished"' in
                 s.logtext())
        check(hook_log(log + ".start") == [["at-start", "ok"]],
              f"hook at start: {hook_log(log + '.start')}")
        # 100 MiB reserved: the fleet's figure, moved by its limit.
        cli(s, "admit", "--bytes", "100MiB", "--ttl", "600")
        # high, over, ok, high, over while the first (high) runs: only
        # the latest, over, runs after it, told PREVIOUS=high.
        for lim in ("105MiB", "99MiB", "1GiB", "105MiB", "99MiB"):
            cli(s, "limit", "set", "fleet", lim)
        check(hook_log(log) == [["start", "high", "ok"]],
              f"the first hook holds the line: {hook_log(log)}")
        open(gate, "w").close()
        # A last change, to ok, marks the end: nothing ran between.
        wait_for("over hook", lambda: ["start", "over", "high"] in
                 hook_log(log), timeout=30)
        cli(s, "limit", "set", "fleet", "1GiB")
        wait_for("ok hook ended", lambda: ["end", "ok"] in hook_log(log),
                 timeout=30)
        got = hook_log(log)
        check(got == [["start", "high", "ok"], ["end", "high"],
                      ["start", "over", "high"], ["end", "over"],
                      ["start", "ok", "over"], ["end", "ok"]],
              f"hooks ran: {got}")
        # Back to the reported state during a hook: nothing more runs.
        # (100 MiB of 110 MiB leaves `over` for `high`: below 95% of the
        # limit, above 85%.)
        os.unlink(log)
        os.unlink(gate)
        for lim in ("105MiB", "99MiB", "110MiB"):
            cli(s, "limit", "set", "fleet", lim)
        wait_for("high hook started", lambda: ["start", "high", "ok"] in
                 hook_log(log), timeout=30)
        open(gate, "w").close()
        wait_for("high hook ended", lambda: ["end", "high"] in
                 hook_log(log), timeout=30)
        cli(s, "limit", "set", "fleet", "1GiB")
        wait_for("ok hook ended", lambda: ["end", "ok"] in hook_log(log),
                 timeout=30)
        got = hook_log(log)
        check(got == [["start", "high", "ok"], ["end", "high"],
                      ["start", "ok", "high"], ["end", "ok"]],
              f"hooks ran: {got}")
        text = s.logtext()
        over = [line for line in text.splitlines()
                if 'msg="hook finished"' in line and "state=over" in line]
        check(len(over) == 1 and "level=warn" in over[0] and
              "exit_status=3" in over[0] and
              'stderr="over-stderr\\x0a"' in over[0],
              f"the failing hook's end: {over}")


def usage_latencies(sock_path, n):
    """n GetUsage round trips on one connection, in seconds each."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock_path)
    r = pb.Reader(s)
    out = []
    try:
        for i in range(1, n + 1):
            t0 = time.perf_counter()
            s.sendall(pb.get_usage(i))
            resp = r.frame(10 * MULT)
            out.append(time.perf_counter() - t0)
            check(resp is not None and resp[1] == [i] and 4 in resp,
                  f"GetUsage {i}: {resp}")
    finally:
        s.close()
    return out


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_hanging_hook_is_killed_and_queries_go_on():
    d = tempfile.mkdtemp(prefix="mt-hooks-")
    # Long enough for 400 queries and the waits before them to run
    # while the hook hangs, on a loaded or sanitized server.
    timeout = max(3, round(3 * MULT))
    cfg = config("[limits]\nfleet = 1GiB\n[hooks]\n"
                 f"timeout = {timeout}s\n"
                 f"on_high = echo $MEMTALLY_NODE > {d}/node; "
                 f"echo $$ > {d}/pid; sleep 1000; touch {d}/never\n")
    with Server("--config", cfg) as s:
        cli(s, "admit", "--bytes", "100MiB", "--ttl", "600")
        before = usage_latencies(s.socket, 400)
        # Before the call: the hook may start while it runs.
        t_start = time.monotonic()
        cli(s, "limit", "set", "fleet", "105MiB")
        pid = int(wait_for("hook running", lambda: (
            open(f"{d}/pid").read().strip()
            if os.path.exists(f"{d}/pid") else None)))
        sleeps = wait_for("its sleep", lambda: [
            c for c in open(f"/proc/{pid}/task/{pid}/children")
            .read().split()])
        during = usage_latencies(s.socket, 400)
        hung = time.monotonic() - t_start
        check(alive(pid), "the hook ended before the measurement did")
        mb, md = statistics.median(before), statistics.median(during)
        print(f"  GetUsage median {mb * 1e6:.0f} us before, "
              f"{md * 1e6:.0f} us while the hook hangs "
              f"(p90 {sorted(before)[360] * 1e6:.0f} / "
              f"{sorted(during)[360] * 1e6:.0f} us; measured "
              f"{hung:.2f} s into it)")
        # A blocked loop would stall queries for the hook's whole run
        # (it sleeps 1000 s); 5 ms of slack absorbs a loaded machine.
        check(md <= 4 * mb + 0.005,
              f"queries slowed by the hook: median {md * 1e6:.0f} us vs "
              f"{mb * 1e6:.0f} us")
        wait_for("timeout logged", lambda: 'msg="hook timed out' in
                 s.logtext(), timeout=timeout + 15)
        killed = time.monotonic() - t_start
        check(killed >= timeout - 0.5, f"killed after {killed:.1f} s")
        wait_for("hook end logged", lambda: 'msg="hook finished"' in
                 s.logtext(), timeout=15)
        end = next(line for line in s.logtext().splitlines()
                   if 'msg="hook finished"' in line)
        check("signal=KILL" in end and "timed_out=1" in end and
              "level=warn" in end, f"end: {end}")
        ms = int(end.split("duration_ms=")[1].split()[0])
        check(ms >= (timeout - 0.5) * 1000, f"duration_ms={ms}")
        # The whole process group went: the shell and its sleep.
        wait_for("shell and sleep gone", lambda: not alive(pid) and not any(
            alive(int(c)) for c in sleeps), timeout=10)
        check(not os.path.exists(f"{d}/never"), "the hook ran on")
        with open(f"{d}/node") as f:
            node = f.read().strip()
        check(node == socket.gethostname(), f"MEMTALLY_NODE={node!r}")
        print(f"  killed {killed:.1f} s after it started (timeout "
              f"{timeout} s)")


def test_stop_kills_a_running_hook():
    d = tempfile.mkdtemp(prefix="mt-hooks-")
    cfg = config("[limits]\nfleet = 1GiB\n[hooks]\n"
                 f"on_high = echo $$ > {d}/pid; sleep 1000\n")
    s = Server("--config", cfg)
    try:
        cli(s, "admit", "--bytes", "100MiB", "--ttl", "600")
        cli(s, "limit", "set", "fleet", "105MiB")
        pid = int(wait_for("hook running", lambda: (
            open(f"{d}/pid").read().strip()
            if os.path.exists(f"{d}/pid") else None)))
        sleeps = wait_for("its sleep", lambda: open(
            f"/proc/{pid}/task/{pid}/children").read().split())
    finally:
        rc = s.stop()
    # A clean stop (under ASan: nothing leaked), the hook's group gone.
    check(rc == 0, f"memtallyd exit status {rc}: {s.logtext()[-2000:]}")
    check('msg="hook still running at stop, killed"' in s.logtext(),
          "the kill at stop is not logged")
    wait_for("hook gone", lambda: not alive(pid) and not any(
        alive(int(c)) for c in sleeps), timeout=10)


def test_reload_installs_hooks():
    d = tempfile.mkdtemp(prefix="mt-hooks-")
    cfg = config("[limits]\nfleet = 1GiB\n")
    with Server("--config", cfg) as s:
        cli(s, "admit", "--bytes", "100MiB", "--ttl", "600")
        with open(cfg, "a") as f:
            f.write(f"[hooks]\non_over = {env_dump_cmd(d)}\n")
        signal_until(s.proc, signal.SIGHUP, "reloaded",
                     lambda: 'msg="config reloaded"' in s.logtext() and
                     "hooks=1" in s.logtext())
        cli(s, "limit", "set", "fleet", "99MiB")
        e = wait_for("hook ran", lambda: dumps(d))[0]
        check(e["MEMTALLY_STATE"] == "over" and
              e["MEMTALLY_PREVIOUS"] == "ok", f"after reload: {e}")


def test_a_failed_hook_runs_again_while_its_state_holds():
    d = tempfile.mkdtemp(prefix="mt-hooks-")
    log = os.path.join(d, "log")
    # Each run logs its start time and environment, then fails while
    # d/fail-STATE holds a count above 0 (taking one off) or "always".
    script = os.path.join(d, "hook.sh")
    with open(script, "w") as f:
        f.write(f"echo $(date +%s.%N) $MEMTALLY_STATE $MEMTALLY_PREVIOUS "
                f"$MEMTALLY_RESERVED >> {log}\n"
                f"f={d}/fail-$MEMTALLY_STATE; [ -e $f ] || exit 0\n"
                "n=$(cat $f); [ $n = always ] && exit 1\n"
                "[ $n -gt 0 ] && echo $((n - 1)) > $f && exit 1\n"
                "exit 0\n")

    def fail(state, how):
        with open(os.path.join(d, "fail-" + state), "w") as f:
            f.write(f"{how}\n")

    def runs(state=None):
        return [r for r in hook_log(log) if state is None or r[1] == state]

    cmd = f"sh {script}"
    cfg = config("[limits]\nfleet = 1GiB\n[hooks]\nretry = 300ms\n"
                 f"on_ok = {cmd}\non_over = {cmd}\n")
    with Server("--config", cfg, "--log-budget", "none") as s:
        wait_for("hook at start", lambda: 'msg="hook finished"' in
                 s.logtext())
        os.unlink(log)
        cli(s, "admit", "--bytes", "100MiB", "--ttl", "600")
        # Fails twice, then succeeds.
        fail("over", 2)
        cli(s, "limit", "set", "fleet", "99MiB")
        got = wait_for("third run", lambda: (
            lambda r: r if len(r) >= 3 else None)(runs()), timeout=30)
        wait_for("its end logged", lambda: s.logtext().count(
            'msg="hook finished" scope="fleet" state=over') == 3)
        # Each run told what the first was: over from ok, the same bytes.
        check(all(r[1:] == ["over", "ok", str(100 * MIB)] for r in got),
              f"runs: {got}")
        t = [float(r[0]) for r in got]
        check(t[1] - t[0] >= 0.29 and t[2] - t[1] >= 0.59,
              f"retried after {t[1] - t[0]:.2f} s, then {t[2] - t[1]:.2f} s "
              "(300 ms, then 600 ms at least)")
        text = s.logtext()
        check('msg="hook failed: run again while the state holds"' in text
              and "failures=1" in text and "failures=2" in text and
              "retry_in_ms=300" in text and "retry_in_ms=600" in text,
              "retries not logged: " + text[-2000:])
        # Succeeded: no more runs.
        time.sleep(1.5 * MULT)
        check(len(runs()) == 3, f"ran on: {runs()}")

        # A hook that always fails runs until its state changes; the
        # next state's hook starts its own count (a first wait of 300 ms,
        # not the over hook's, now at 2.4 s).
        os.unlink(log)
        fail("over", "always")
        cli(s, "limit", "set", "fleet", "1GiB")
        wait_for("ok hook", lambda: runs("ok"))
        cli(s, "limit", "set", "fleet", "99MiB")
        wait_for("four failed runs", lambda: len(runs("over")) >= 4,
                 timeout=30)
        fail("ok", 1)
        cli(s, "limit", "set", "fleet", "1GiB")
        ok = wait_for("the ok hook, failed then run again", lambda: (
            lambda r: r if len(r) >= 3 else None)(runs("ok")), timeout=30)
        check(ok[1][2] == "over" and ok[2][2] == "over",
              f"ok told PREVIOUS=over: {ok}")
        gap = float(ok[2][0]) - float(ok[1][0])
        check(0.29 <= gap < 1.2 * MULT,
              f"the ok hook ran again after {gap:.2f} s (300 ms)")
        n = len(runs("over"))
        time.sleep(3 * MULT)
        check(len(runs("over")) == n and len(runs("ok")) == 3,
              f"ran on after the state changed: {runs()}")


def test_a_restart_says_it_does_not_know_what_was_heard():
    """memtallyd is SIGKILLed with the fleet over (its hook told "over"),
    and comes back on its record to a fleet in the high band. The first
    hook after the restart was told PREVIOUS=ok, from the adoption's
    events, and the start's own hook (PREVIOUS=unknown) never ran: the
    Slurm hook, told ok -> high, leaves alone a node its predecessor
    drained. It is told PREVIOUS=unknown now."""
    d = tempfile.mkdtemp(prefix="mt-it-hooks-")
    log = os.path.join(d, "h.log")
    cmd = f'echo "$MEMTALLY_STATE prev=$MEMTALLY_PREVIOUS" >> {log}'
    cfg = config(f"[limits]\nfleet = 40MiB\n[hooks]\non_ok = {cmd}\n"
                 f"on_high = {cmd}\non_over = {cmd}\n")
    heap = {"MEMTALLY_ALLOCATOR_FREE": "0"}
    first = Server("--config", cfg)
    w1 = Worker([*worker("hold"), "37"], first.env(**heap))
    w2 = Worker([*worker("hold"), "10"], first.env(**heap))
    second = None
    try:
        for w in (w1, w2):
            w.readline()
        wait_for("the over hook", lambda: os.path.exists(log) and
                 "over prev=" in open(log).read())
        first.kill9()
        w2.close()
        with open(log, "a") as f:
            f.write("--- restart\n")
        second = Server("--config", cfg, after=first)
        wait_for("a hook after the restart", lambda: open(log).read()
                 .split("--- restart\n")[1].strip())
        after = open(log).read().split("--- restart\n")[1].split("\n")
        check(after[0] == "high prev=unknown",
              f"after the restart: {after}")
    finally:
        w1.close()
        w2.close()
        (second or first).stop()


def test_a_hook_is_not_shielded_from_the_oom_killer():
    """memtallyd lowers its own oom_score_adj; the hooks it starts are
    ordinary processes (an on_over hook runs when memory is short)."""
    d = tempfile.mkdtemp(prefix="mt-hooks-")
    out = os.path.join(d, "scores")
    cmd = (f"sleep 0.3; echo $(cat /proc/$$/oom_score_adj) "
           f"$(cat /proc/$PPID/oom_score_adj) > {out}.tmp; "
           f"mv {out}.tmp {out}")
    cfg = config(f"[hooks]\non_ok = {cmd}\n")
    # memtallyd lowers its score where it may (CAP_SYS_RESOURCE, or the
    # unit's OOMScoreAdjust=); where it may not, it keeps the one it
    # inherits. Either way not the hook's: here it inherits 300, which
    # needs no privilege to set.
    with open("/proc/self/oom_score_adj") as f:
        mine = f.read().strip()
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("300")
    except OSError as e:
        raise Skip(f"cannot raise this test's own oom_score_adj: {e}")
    try:
        with Server("--config", cfg):
            # The fleet's state at start runs on_ok.
            got = wait_for("the start hook's scores", lambda: (
                open(out).read().split() if os.path.exists(out) else None))
    finally:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(mine)
    check(got[0] == "0" and got[1] != "0",
          f"hook and memtallyd oom_score_adj: {got}, want 0 and not 0")
    print(f"  hook {got[0]}, memtallyd {got[1]}", flush=True)


if __name__ == "__main__":
    run([test_environment_fleet_and_group,
         test_a_restart_says_it_does_not_know_what_was_heard,
         test_a_hook_is_not_shielded_from_the_oom_killer,
         test_one_at_a_time_latest_state_wins,
         test_hanging_hook_is_killed_and_queries_go_on,
         test_stop_kills_a_running_hook,
         test_reload_installs_hooks,
         test_a_failed_hook_runs_again_while_its_state_holds])
