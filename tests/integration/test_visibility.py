"""Who may see what: a user sees its own processes' names, and of another
user's only the figures (`[server] show_others = counts`, the default) or
nothing at all (`none`); root sees everything. Real memtallyd as root, a
worker of a second user the harness creates, a worker of nobody, the real
CLI run as nobody and as root, and raw GetUsage/Watch on connections made
as nobody.

The second user's worker names its task payroll-q4-layoffs-2027 and its
group payroll, and holds 100 MiB against a 64 MiB process limit, so its
pid has an event on a Watch stream.

test_counts_by_default: as nobody, `ps --json` lists the second user's
process with its pid, uid and bytes but no task, group or comm (null,
names_withheld), plain `ps` shows `-` for them and no "payroll" anywhere,
`ps --group payroll` lists nothing, GetUsage for its pid carries no names;
nobody's own worker shows its task, group and comm; root sees the second
user's task, group and comm.

test_none_hides_them: with show_others = none, nobody's `ps` does not list
the second user's process at all, GetUsage for its pid is answered
not-found, and nobody's Watch stream gets no event of that pid while
root's does; nobody's own worker is still listed with its task.
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import (CLI, MULT, NOBODY, NOGROUP, Server, Worker,  # noqa: E402
                     as_user, check, connections_as, open_to_nobody, run,
                     second_user, signal_until,
                     wait_for, worker, world_readable_copy)
from harness import config_file as config  # noqa: E402
import pbwire as pb  # noqa: E402

TASK = "payroll-q4-layoffs-2027"
OWN_TASK = "nobody-own-task"
T = 10 * MULT
ERROR_NOT_FOUND = 2


def cli_as(s, cli, user, *args, json_out=True):
    """The CLI run as `user` (None: root); its stdout (JSON decoded)."""
    import json
    argv = [cli, "--socket", s.socket] + (["--json"] if json_out else [])
    out = subprocess.run(argv + list(args), capture_output=True, text=True,
                         timeout=30 * MULT, preexec_fn=as_user(user))
    check(out.returncode == 0,
          f"memtally {' '.join(args)} as {user}: {out.returncode} "
          f"{out.stderr}")
    return json.loads(out.stdout) if json_out else out.stdout


def usage_of_pid(conn, pid, req_id):
    """GetUsage for `pid` on `conn`: (error code, ProcessInfo fields)."""
    conn.sendall(pb.request(req_id, pb.GET_USAGE, pb.field(3, 0, pid)))
    resp = pb.Reader(conn).frame(T)
    check(resp is not None, "no answer to GetUsage")
    code = pb.error_code(resp)
    if code:
        return code, {}
    usage = pb.parse(resp[4][0])
    return 0, pb.parse(usage[9][0])


def watch(conn, req_id):
    conn.sendall(pb.request(req_id, pb.WATCH))
    reader = pb.Reader(conn)
    first = reader.frame(T)
    check(first is not None and 9 in first, "Watch not answered")
    return reader


def scopes_until(conn, reader, req_id):
    """The scopes of the events on a Watch stream before the answer to a
    GetUsage sent now: answers and pushed events share the connection's
    order, so every event pushed before is in."""
    conn.sendall(pb.get_usage(req_id))
    scopes = []
    while True:
        f = reader.frame(T)
        check(f is not None, "Watch stream closed")
        if f[1][0] == req_id:
            return scopes
        if 9 in f:
            scopes.append(pb.parse(f[9][0])[1][0].decode())


def start(s, hold, preload, second):
    env = s.env(group="payroll", MEMTALLY_TASK=TASK)
    env["LD_PRELOAD"] = preload
    theirs = Worker([*hold, "100"], env, user=(second[0], NOGROUP))
    env = s.env(group="nbgroup", MEMTALLY_TASK=OWN_TASK)
    env["LD_PRELOAD"] = preload
    mine = Worker([*hold, "1"], env, user=(NOBODY, NOGROUP))
    for w in (theirs, mine):
        check(w.readline().startswith("ready"), "worker not ready")
    wait_for("both registered", lambda: {theirs.pid, mine.pid} <= set(
        s.ps()))
    # The figures are the latest tick's, which may predate the last of
    # the 100 MiB: "over" comes at 64.
    wait_for("theirs counted whole, over its limit", lambda: (
        lambda p: p["state"] == "over" and p["bytes"] >= 100 << 20)(
            s.ps()[theirs.pid]))
    return theirs, mine


def check_root_sees_all(s, cli, theirs):
    p = {x["pid"]: x for x in cli_as(s, cli, None, "ps")["processes"]}
    t = p[theirs.pid]
    check(t["task"] == TASK and t["group"] == "payroll" and
          t["comm"] == "mt_worker" and not t["names_withheld"],
          f"root does not see the second user's names: {t}")


def check_own(p, mine):
    m = p.get(mine.pid)
    check(m is not None and m["task"] == OWN_TASK and
          m["group"] == "nbgroup" and m["comm"] == "mt_worker",
          f"nobody does not see its own worker's names: {m}")


def test_counts_by_default():
    second = second_user()
    cfg = config("[server]\ngroup = nogroup\n[limits]\nprocess = 64MiB\n")
    preload, cli, hold = world_readable_copy(
        os.environ["MEMTALLY_PRELOAD_LIB"], CLI, worker("hold"))
    with Server("--config", cfg) as s:
        open_to_nobody(s)
        theirs, mine = start(s, hold, preload, second)
        try:
            nobody = (NOBODY, NOGROUP)
            p = {x["pid"]: x for x in
                 cli_as(s, cli, nobody, "ps")["processes"]}
            t = p.get(theirs.pid)
            check(t is not None, f"nobody's ps lost the process: {p}")
            check(t["task"] is None and t["group"] is None and
                  t["comm"] is None and t["names_withheld"],
                  f"nobody sees the second user's names: {t}")
            check(t["uid"] == second[0] and t["bytes"] >= 100 << 20,
                  f"nobody does not see the figures: {t}")
            check_own(p, mine)

            text = cli_as(s, cli, nobody, "ps", json_out=False)
            check("payroll" not in text, f"plain ps names it:\n{text}")
            row = [ln.split() for ln in text.splitlines()
                   if ln.split() and ln.split()[0] == str(theirs.pid)]
            check(row and row[0][1] == "-" and row[0][-1] == "-",
                  f"plain ps row not masked:\n{text}")
            own = [ln for ln in text.splitlines()
                   if ln.split() and ln.split()[0] == str(mine.pid)]
            check(own and "nbgroup" in own[0] and "mt_worker" in own[0],
                  f"plain ps hides nobody's own names:\n{text}")

            g = cli_as(s, cli, nobody, "ps", "--group", "payroll")
            check(g["processes"] == [],
                  f"ps --group tells the membership: {g}")

            conn = connections_as(s, nobody, 1)[0]
            code, pi = usage_of_pid(conn, theirs.pid, 7)
            check(code == 0 and pi[1][0] == theirs.pid,
                  f"GetUsage pid: code {code} {pi}")
            names = [pi.get(n, [b""])[0] for n in (2, 11, 13)]
            check(names == [b"", b"", b""],
                  f"GetUsage pid as nobody carries names: {names}")
            code, pi = usage_of_pid(conn, mine.pid, 8)
            check(code == 0 and pi[11][0] == OWN_TASK.encode(),
                  f"GetUsage of its own pid: code {code} {pi}")
            conn.close()
            root = connections_as(s, (0, 0), 1)[0]
            code, pi = usage_of_pid(root, theirs.pid, 9)
            check(code == 0 and pi[11][0] == TASK.encode(),
                  f"GetUsage pid as root: code {code} {pi}")
            root.close()
            check_root_sees_all(s, cli, theirs)
        finally:
            theirs.close()
            mine.close()


def test_none_hides_them():
    second = second_user()
    cfg = config("[server]\ngroup = nogroup\nshow_others = none\n"
                 "[limits]\nprocess = 64MiB\n")
    preload, cli, hold = world_readable_copy(
        os.environ["MEMTALLY_PRELOAD_LIB"], CLI, worker("hold"))
    with Server("--config", cfg) as s:
        open_to_nobody(s)
        nobody = (NOBODY, NOGROUP)
        # Subscribed before the worker goes over its limit.
        nconn = connections_as(s, nobody, 1)[0]
        rconn = connections_as(s, (0, 0), 1)[0]
        nwatch, rwatch = watch(nconn, 1), watch(rconn, 1)
        theirs, mine = start(s, hold, preload, second)
        try:
            scope = f"pid:{theirs.pid}"
            check(scope in scopes_until(rconn, rwatch, 2),
                  "root's Watch missed the process's event")
            seen = scopes_until(nconn, nwatch, 2)
            check(scope not in seen,
                  f"nobody's Watch got another user's event: {seen}")

            p = {x["pid"]: x for x in
                 cli_as(s, cli, nobody, "ps")["processes"]}
            check(theirs.pid not in p,
                  f"nobody's ps lists the second user's process: {p}")
            check_own(p, mine)
            conn = connections_as(s, nobody, 1)[0]
            code, _ = usage_of_pid(conn, theirs.pid, 3)
            check(code == ERROR_NOT_FOUND,
                  f"GetUsage of a hidden pid: code {code}")
            conn.close()
            check_root_sees_all(s, cli, theirs)
        finally:
            for c in (nconn, rconn):
                c.close()
            theirs.close()
            mine.close()


def test_a_reload_that_revokes_an_admin_reaches_its_watch():
    """nobody, an admin by admin_uid when it sent its Watch, kept every
    uid's events after a reload took admin_uid away (a Watch never idles
    out): a revoked admin, or a rotated token, went on seeing what
    show_others = none hides. A reload now asks each subscriber again."""
    import signal
    second = second_user()
    base = "[server]\ngroup = nogroup\nshow_others = none\n"
    cfg = config(base + f"admin_uid = {NOBODY}\n"
                 "[limits]\nprocess = 64MiB\n")
    preload, cli, hold = world_readable_copy(
        os.environ["MEMTALLY_PRELOAD_LIB"], CLI, worker("hold"))
    with Server("--config", cfg) as s:
        open_to_nobody(s)
        nobody = (NOBODY, NOGROUP)
        nconn = connections_as(s, nobody, 1)[0]
        rconn = connections_as(s, (0, 0), 1)[0]
        nwatch, rwatch = watch(nconn, 1), watch(rconn, 1)
        with open(cfg, "w") as f:
            f.write(base + "[limits]\nprocess = 64MiB\n")
        signal_until(s.proc, signal.SIGHUP, "the reload",
                     lambda: "config reloaded" in s.logtext())
        check("watch subscriber no longer an admin" in s.logtext(),
              "the revoked subscriber is not logged")
        theirs, mine = start(s, hold, preload, second)
        try:
            scope = f"pid:{theirs.pid}"
            check(scope in scopes_until(rconn, rwatch, 2),
                  "root's Watch missed the process's event")
            seen = scopes_until(nconn, nwatch, 2)
            check(scope not in seen,
                  f"a revoked admin's Watch got another user's event: "
                  f"{seen}")
        finally:
            for c in (nconn, rconn):
                c.close()
            theirs.close()
            mine.close()


if __name__ == "__main__":
    run([test_counts_by_default, test_none_hides_them,
         test_a_reload_that_revokes_an_admin_reaches_its_watch])
