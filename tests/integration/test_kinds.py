"""Kinds and learned sizes: a real memtallyd, real `memtally run --kind`
tasks (mt_worker level holding a known number of MiB), real users.

test_learned_from_real_runs: four runs each of two kinds (40 and 90 MiB)
through `memtally run --kind K` without --bytes (admitted on the kind's
default, then on its learned size); `memtally kinds` shows 4 runs of each
and a learned size within 15% above what the task really held, and an
Admit of the kind reserves exactly that, saying why.

test_a_liar_cannot_size_another_users_kind: the second user runs kind xz
(30 MiB, three times); nobody runs a task of kind xz whose worker claims
2^49 bytes in its slot. The second user's xz is unchanged, and nobody's
own xz is sized by what the kernel vouched for (its allowance, 64 MiB
here), not by the claim.

test_kinds_past_the_cap_are_refused: nobody with [kinds]
max_kinds_per_uid = 3 gets three kinds, the fourth Admit is denied (exit
3) naming the key; its existing kinds still admit; root still gets a new
kind.

test_a_command_that_never_registers_teaches_its_kind: `memtally run
--kind static -- env -u LD_PRELOAD python3` holding 60 MiB, three times:
nothing of it registers (as a static binary would not), and its kind
learned nothing (0 runs). Now memtallyd reads what is below the run in
its resident sweeps: three runs, each peak the command's 60 MiB and
python's own. A fourth run with --ttl 2 outlives its TTL while its
command holds memory, across a restart of memtallyd too, and ends once
the run is killed (SIGKILL), its run learned.

test_a_command_of_several_steps_is_one_run: `memtally run --kind steps
-- sh -c 'python3 (30 MiB); sleep; python3 (60 MiB)'`: the reservation
ended when the first step's worker exited ("its task's workers
exited"), the second step ran unreserved, and the kind learned the first
step's 30 MiB. Now it lasts until the run releases it, and the kind's
peak is the second step's.

test_restart_keeps_learned_sizes: SIGTERM, start on the same --state:
`memtally kinds --json` is the same before and after, and a live worker
is adopted. Then a corrupt record: refused with a log line, the server
starts without learned sizes, the worker is adopted all the same.
"""
import json
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import (CLI, MIB, MULT, NOBODY, NOGROUP, Server, Worker,  # noqa: E402
                     as_user, check, open_to_nobody, run,
                     second_user, wait_for, worker, world_readable_copy)
from harness import config_file as config  # noqa: E402
from test_trust import claim  # noqa: E402


def run_env(**extra):
    """`memtally run`'s own environment: no preload, task or group of its
    own (it adds them for the command)."""
    e = dict(os.environ)
    for k in ("LD_PRELOAD", "MEMTALLY_TASK", "MEMTALLY_GROUP",
              "MEMTALLY_SOCKET"):
        e.pop(k, None)
    e.update(extra)
    return e


def run_kind(s, kind, mib, user=None, cli=CLI, level=None, env=None):
    """One task of `kind` holding `mib` MiB for a moment, through
    `memtally run --kind` (no --bytes); its exit status and stderr."""
    level = level or worker("level")
    # The level worker holds `mib` MiB until its stdin ends: half a second
    # after it says it holds them (timed from its start, a slow machine's
    # allocation could outlast it, and the task end before a tick saw its
    # peak). Its stdin is a FIFO whose writer reads its "ready" line.
    cmd = [cli, "--socket", s.socket, "run", "--kind", kind, "--",
           "sh", "-c",
           'f=$(mktemp -u) && mkfifo "$f" && '
           f'{{ {shlex.join(level)} {mib} <"$f" | '
           '{ exec 3>"$f"; rm -f "$f"; read r && sleep 0.5; }; }']
    r = subprocess.run(cmd, env=env or run_env(), capture_output=True,
                       text=True, timeout=60 * MULT,
                       preexec_fn=as_user(user))
    return r.returncode, r.stderr


def kinds(s, user=None, cli=CLI):
    out = subprocess.run([cli, "--socket", s.socket, "--json", "kinds"],
                         capture_output=True, text=True, timeout=30 * MULT,
                         preexec_fn=as_user(user))
    check(out.returncode == 0, f"memtally kinds: {out.returncode} "
          f"{out.stderr}")
    return json.loads(out.stdout)


def kind_of(doc, name, uid):
    for k in doc["kinds"]:
        if k["kind"] == name and k["uid"] == uid:
            return k
    return None


def admit_json(s, *args, user=None, cli=CLI):
    out = subprocess.run([cli, "--socket", s.socket, "--json", "admit",
                          *args], capture_output=True, text=True,
                         timeout=30 * MULT, preexec_fn=as_user(user))
    return out.returncode, (json.loads(out.stdout) if out.stdout.strip()
                            else out.stderr)


def test_learned_from_real_runs():
    with Server("--config", config("[limits]\nfleet = 2GiB\n")) as s:
        for i in range(4):
            for kind, mib in (("small", 40), ("large", 90)):
                rc, err = run_kind(s, kind, mib)
                check(rc == 0, f"run {i} of {kind}: {rc} {err}")
        doc = kinds(s)
        for kind, mib in (("small", 40), ("large", 90)):
            k = kind_of(doc, kind, 0)
            check(k is not None, f"no kind {kind}: {doc}")
            check(k["runs"] == 4 and k["runs_total"] == 4,
                  f"{kind}: {k['runs']} runs")
            real = mib * MIB
            ratio = k["learned"] / real
            check(1.0 <= ratio <= 1.15,
                  f"{kind}: learned {k['learned']} for a real peak of "
                  f"{real}: {ratio:.3f}")
            check(len(k["last_peaks"]) == 4 and
                  all(real <= p <= real * 1.05 for p in k["last_peaks"]),
                  f"{kind}: peaks {k['last_peaks']}")
            rc, a = admit_json(s, "--kind", kind, "--ttl", "5")
            check(rc == 0 and a["admitted"], f"admit --kind {kind}: {a}")
            check(a["reserved_for_task"] == k["learned"],
                  f"reserved {a['reserved_for_task']}, learned "
                  f"{k['learned']}")
            check(f"p95 of 4 runs of kind {kind} + 10%" in a["sized_by"],
                  f"sized_by {a['sized_by']!r}")
            print(f"  {kind}: real {mib} MiB, learned "
                  f"{k['learned'] / MIB:.1f} MiB ({ratio:.3f}x)",
                  flush=True)
        # The table for people names them too.
        out = subprocess.run([CLI, "--socket", s.socket, "kinds"],
                             capture_output=True, text=True)
        check("small" in out.stdout and "large" in out.stdout,
              f"table: {out.stdout}")


def test_a_liar_cannot_size_another_users_kind():
    second = second_user()
    cfg = config("[server]\ngroup = nogroup\n"
                 "[limits]\nfleet = 2GiB\n"
                 "[trust]\nuntouched_allowance = 64MiB\n"
                 "untouched_time = 1s\n")
    preload, cli, level, hold = world_readable_copy(
        os.environ["MEMTALLY_PRELOAD_LIB"], CLI, worker("level"),
        worker("hold"))
    env = run_env(MEMTALLY_PRELOAD_LIB=preload)
    with Server("--config", cfg) as s:
        open_to_nobody(s)
        alice = (second[0], NOGROUP)
        for _ in range(3):
            rc, err = run_kind(s, "xz", 30, user=alice, cli=cli,
                               level=level, env=env)
            check(rc == 0, f"second user's run: {rc} {err}")
        before = kind_of(kinds(s), "xz", second[0])
        check(before and before["runs"] == 3, f"second user's xz: {before}")

        # nobody's task of kind xz: a worker holding 1 MiB that claims
        # 2^49 bytes for a while, then exits.
        w = Worker([cli, "--socket", s.socket, "run", "--kind", "xz", "--",
                    *hold, "1"], env, user=(NOBODY, NOGROUP))
        try:
            line = w.readline()
            check(line.startswith("ready pid="), f"liar: {line}")
            pid = int(line.split("=")[1])
            claim(s, pid, 1 << 49)
            wait_for("the lie published",
                     lambda: s.ps()[pid]["bytes"] >= 1 << 49)
            t0 = s.status()["ticks"]
            wait_for("50 ticks", lambda: s.status()["ticks"] >= t0 + 50)
            w.send("exit")
            check(w.close() == 0, "liar's run failed")
        finally:
            w.kill()
        doc = kinds(s)
        after = kind_of(doc, "xz", second[0])
        check(after == before,
              f"the second user's xz changed: {before} -> {after}")
        liar = kind_of(doc, "xz", NOBODY)
        check(liar and liar["runs"] == 1, f"nobody's xz: {liar}")
        check(liar["learned"] < 100 * MIB,
              f"nobody's xz sized by its claim: {liar['learned']}")
        # And the second user's next task of xz reserves what xz uses.
        rc, a = admit_json(s, "--kind", "xz", "--ttl", "5", user=alice,
                           cli=cli)
        check(rc == 0 and a["reserved_for_task"] == before["learned"],
              f"second user's admit: {a}")
        print(f"  a claim of 2^49 B: the other user's xz stays "
              f"{before['learned'] / MIB:.1f} MiB; nobody's own xz "
              f"{liar['learned'] / MIB:.1f} MiB", flush=True)


def test_kinds_past_the_cap_are_refused():
    cfg = config("[server]\ngroup = nogroup\n"
                 "[limits]\nfleet = 2GiB\n"
                 "[kinds]\nmax_kinds_per_uid = 3\n")
    (cli,) = world_readable_copy(CLI)
    nobody = (NOBODY, NOGROUP)
    with Server("--config", cfg) as s:
        open_to_nobody(s)
        for k in ("k0", "k1", "k2"):
            rc, a = admit_json(s, "--kind", k, "--bytes", "1MiB", "--ttl",
                               "60", user=nobody, cli=cli)
            check(rc == 0 and a["admitted"], f"kind {k}: {a}")
        rc, a = admit_json(s, "--kind", "k3", "--bytes", "1MiB", "--ttl",
                           "60", user=nobody, cli=cli)
        check(rc == 3 and not a["admitted"], f"a fourth kind: {rc} {a}")
        check("max_kinds_per_uid = 3" in a["reason"] and
              a["limit_scope"] == f"uid:{NOBODY}" and
              a["denied_by"] == "kinds", f"reason: {a}")
        # No room that frees changes it: `run --wait` does not wait.
        t0 = time.monotonic()
        r = subprocess.run([cli, "--socket", s.socket, "run", "--kind", "k3",
                            "--bytes", "1MiB", "--wait", "60", "--", "true"],
                           capture_output=True, text=True,
                           timeout=60 * MULT, preexec_fn=as_user(nobody))
        took = time.monotonic() - t0
        check(r.returncode == 3 and "denied, not run" in r.stderr and
              took < 20, f"run --wait of a fourth kind: {r.returncode} "
              f"after {took:.1f} s: {r.stderr}")
        rc, a = admit_json(s, "--kind", "k1", "--bytes", "1MiB", "--ttl",
                           "60", user=nobody, cli=cli)
        check(rc == 0, f"an existing kind refused: {a}")
        rc, a = admit_json(s, "--kind", "k3", "--bytes", "1MiB", "--ttl",
                           "60")
        check(rc == 0, f"root's new kind refused: {a}")
        check('reason=kinds' in s.logtext() or
              "too many kinds" in s.logtext(), "no log line")


# Holds `mib` MiB of its own (written: resident), says so, and waits.
HOLD = ("import sys, time; b = b'\\x01' * ({mib} << 20); "
        "print('ready', flush=True); time.sleep({secs})")


def reservations(s):
    return s.cli("status")["fleet"]["reservations"]


def test_a_command_that_never_registers_teaches_its_kind():
    # Sweeps ten times a second: each run is read many times while it
    # holds its memory, however loaded the machine.
    conf = config("[limits]\nfleet = 2GiB\nrss_interval = 100\n")
    mib = 60

    def static_run(*extra, secs):
        return [CLI, "--socket", s.socket, "run", "--kind", "static",
                *extra, "--", "env", "-u", "LD_PRELOAD", sys.executable,
                "-c", HOLD.format(mib=mib, secs=secs)]

    s = Server("--config", conf)
    run = None
    try:
        for i in range(3):
            r = subprocess.run(static_run(secs=1.5 * MULT), env=run_env(),
                               capture_output=True, text=True,
                               timeout=60 * MULT)
            check(r.returncode == 0 and r.stdout.startswith("ready"),
                  f"run {i}: {r.returncode} {r.stderr}")
        k = kind_of(kinds(s), "static", 0)
        check(k is not None and k["runs"] == 3,
              f"kind static: {k} (a command that never registers taught "
              f"its kind nothing)")
        real = mib * MIB
        # Its 60 MiB, and what python3 holds of its own (~7 MiB).
        check(all(real <= p <= real + 24 * MIB for p in k["last_peaks"]),
              f"peaks {k['last_peaks']} for {mib} MiB held")
        print(f"  3 runs that never registered: peaks "
              f"{[round(p / MIB, 1) for p in k['last_peaks']]} MiB, "
              f"learned {k['learned'] / MIB:.1f} MiB", flush=True)

        # Past its TTL while its command holds memory.
        run = subprocess.Popen(static_run("--ttl", "2", secs=600),
                               env=run_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        check(run.stdout.readline().startswith("ready"), "not ready")
        said = "a run's command holds memory no worker of it registered"
        wait_for("the run's command seen",
                 lambda: s.logtext().count(said) == 4, timeout=30 * MULT)
        time.sleep(3.0)
        check(reservations(s) == 1, "the run's reservation expired at its "
              "TTL while its command held memory")
        # A restart keeps it so: the record says the run was seen.
        check(s.stop() == 0, "memtallyd did not stop cleanly")
        s = Server("--config", conf, after=s)
        time.sleep(1.0)
        check(reservations(s) == 1, "the run's reservation ended at the "
              "restart")
        # Killed: its command goes with it (PR_SET_PDEATHSIG), the next
        # sweep finds the run gone, and its reservation ends, learned.
        run.kill()
        run.wait(timeout=30 * MULT)
        wait_for("the reservation ended", lambda: reservations(s) == 0,
                 timeout=30 * MULT)
        check("reservation ended: the run that asked for it is gone" in
              s.logtext(), "ended, but not for its run's end")
        k = kind_of(kinds(s), "static", 0)
        check(k["runs"] == 4 and real <= k["last_peaks"][0],
              f"the killed run: {k}")
    finally:
        if run and run.poll() is None:
            run.kill()
            run.wait()
        s.stop()


def test_a_command_of_several_steps_is_one_run():
    step = ("import time; b = b'\\x01' * ({mib} << 20); "
            "time.sleep({secs})")
    script = (f"{shlex.quote(sys.executable)} -c "
              f"{shlex.quote(step.format(mib=30, secs=0.5 * MULT))}; "
              f"sleep {1.5 * MULT}; "
              f"{shlex.quote(sys.executable)} -c "
              f"{shlex.quote(step.format(mib=60, secs=1.5 * MULT))}")
    with Server("--config", config("[limits]\nfleet = 2GiB\n")) as s:
        r = subprocess.run([CLI, "--socket", s.socket, "run", "--kind",
                            "steps", "--", "sh", "-c", script],
                           env=run_env(), capture_output=True, text=True,
                           timeout=60 * MULT)
        check(r.returncode == 0, f"run: {r.returncode} {r.stderr}")
        log = s.logtext()
        check("its task's workers exited" not in log,
              "the reservation ended with the first step")
        check("reservation released" in log, "not released by the run")
        k = kind_of(kinds(s), "steps", 0)
        check(k is not None and k["runs"] == 1, f"kind steps: {k}")
        check(60 * MIB <= k["last_peaks"][0] <= 80 * MIB,
              f"the run's peak {k['last_peaks'][0]}: not the second "
              f"step's 60 MiB")
        print(f"  two steps, 30 and 60 MiB: one run, peak "
              f"{k['last_peaks'][0] / MIB:.1f} MiB", flush=True)


def comparable(doc):
    """A kinds document without what changes by itself across a
    restart (reservations outstanding)."""
    return sorted((k["kind"], k["uid"], k["runs"], k["runs_total"],
                   k["learned"], k["learned_by"], k["evictions"],
                   json.dumps(k["last"])) for k in doc["kinds"])


def test_restart_keeps_learned_sizes():
    s = Server("--config", config("[limits]\nfleet = 2GiB\n"))
    w = None
    try:
        for kind, mib in (("a", 20), ("b", 30), ("a", 25)):
            rc, err = run_kind(s, kind, mib)
            check(rc == 0, f"run: {rc} {err}")
        before = kinds(s)
        check(len(before["kinds"]) == 2, f"kinds: {before}")
        w = Worker([*worker("hold"), "5"], s.env())
        check(w.readline().startswith("ready"), "worker not ready")
        wait_for("registered", lambda: w.pid in s.ps())
        check(s.stop() == 0, "memtallyd did not stop cleanly")
        s = Server("--config", config("[limits]\nfleet = 2GiB\n"), after=s)
        after = kinds(s)
        check(comparable(after) == comparable(before),
              f"kinds changed across the restart:\n{before}\n{after}")
        check("restart: live workers adopted" in s.logtext() and
              w.pid in s.ps(), "the worker was not adopted")

        # A corrupt record: refused, the rest of the state kept.
        check(s.stop() == 0, "memtallyd did not stop cleanly")
        rec = s.socket + ".state.kinds"
        with open(rec, "r+b") as f:
            f.seek(48)
            b = f.read(1)
            f.seek(48)
            f.write(bytes([b[0] ^ 0xff]))
        s = Server("--config", config("[limits]\nfleet = 2GiB\n"), after=s)
        # The server is ready once it logged its segment, and reads the
        # record just after: poll for the refusal.
        wait_for("the refusal logged",
                 lambda: "learned sizes refused" in s.logtext())
        check("checksum" in s.logtext(), "refused, but not for the checksum")
        check(kinds(s)["kinds"] == [], "a corrupt record was used")
        check(w.pid in s.ps(), "the worker was not adopted")
    finally:
        if w:
            w.kill()
        s.stop()


if __name__ == "__main__":
    run([test_learned_from_real_runs,
         test_a_liar_cannot_size_another_users_kind,
         test_kinds_past_the_cap_are_refused,
         test_a_command_that_never_registers_teaches_its_kind,
         test_a_command_of_several_steps_is_one_run,
         test_restart_keeps_learned_sizes])
