"""The default per-uid caps share the server: with two, then four hostile
users each holding everything the defaults let one uid hold, a fifth,
honest user still registers a worker, connects, watches and is admitted.

Real memtallyd as root with no cap configured: 64 slots (so they fill
fast) and a fleet limit of 8 GiB (so reserved bytes per uid mean
something). The harness creates the users (useradd --system; skipped
without it). Each hostile user, in turn:
  - starts workers until one runs unregistered (its uid's slot cap, or a
    full table);
  - opens connections until one more is closed at once by the server, and
    sends Watch on each until one is refused;
  - admits 512 MiB with a TTL of a day until denied.
Then the honest user's worker must get a slot (its pid in ps), its
connection must be answered, its Watch accepted, and its Admit of 1 GiB
granted. Figures (what each hostile uid got) are printed.
"""
import os
import resource
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import (CLI, MIB, MULT, NOGROUP, Server, Worker,  # noqa: E402
                     as_user, check, connections_as, open_to_nobody, run,
                     test_user,
                     wait_for, worker, world_readable_copy)
from harness import config_file as config  # noqa: E402
import pbwire as pb  # noqa: E402

GIB = 1 << 30
SLOTS = 64
FLEET = 8 * GIB
T = 10 * MULT
HOSTILE = ["memtally-hostile1", "memtally-hostile2", "memtally-hostile3",
           "memtally-hostile4"]
HONEST = "memtally-honest"
# More than any default lets one uid open: past it a test would only
# measure max_connections.
MOST_CONNS = 400


def answered(conn, req_id, body_field, body=b""):
    """Send one request; its answer's parsed fields, None at EOF (the
    server closed the connection: over a cap)."""
    try:
        conn.sendall(pb.request(req_id, body_field, body))
        return pb.Reader(conn).frame(T)
    except (BrokenPipeError, ConnectionResetError):
        return None


def cli_as(s, cli, user, *args):
    import json
    out = subprocess.run([cli, "--socket", s.socket, "--json", *args],
                         capture_output=True, text=True, timeout=30 * MULT,
                         preexec_fn=as_user(user))
    return out.returncode, (json.loads(out.stdout) if out.stdout.strip()
                            else out.stderr)


class Hostile:
    def __init__(self, user):
        self.user = user
        self.workers = []
        self.conns = []
        self.watches = 0
        self.reserved = 0

    def fill_slots(self, s, hold, env):
        """Workers until one runs unregistered."""
        while len(self.workers) <= SLOTS:
            before = s.status()["unregistered"]
            w = Worker([*hold, "1"], env, user=(self.user[0], NOGROUP))
            self.workers.append(w)
            check(w.readline().startswith("ready"), "worker not ready")
            got = wait_for(f"worker {w.pid} registered or refused", lambda: (
                "in" if w.pid in s.ps() else
                "out" if s.status()["unregistered"] > before else None))
            if got == "out":
                return len(self.workers) - 1

    def fill_connections(self, s):
        """Connections until the server closes one at once; Watch on
        each until one is refused."""
        conns = connections_as(s, (self.user[0], NOGROUP), MOST_CONNS)
        watching = True
        for i, c in enumerate(conns):
            r = answered(c, i + 1, pb.WATCH if watching else pb.GET_USAGE)
            if r is None:
                c.close()
                continue
            if watching and pb.error_code(r):
                watching = False
                r = answered(c, 100000 + i, pb.GET_USAGE)
                if r is None:
                    c.close()
                    continue
            elif watching:
                self.watches += 1
            self.conns.append(c)
        for c in conns:
            if c not in self.conns:
                c.close()

    def fill_reservations(self, s, cli):
        for _ in range(32):
            rc, out = cli_as(s, cli, (self.user[0], NOGROUP), "admit",
                             "--bytes", "512MiB", "--ttl", "86400")
            if rc != 0:
                check(isinstance(out, dict) and not out["admitted"],
                      f"admit failed, not denied: {out}")
                return
            self.reserved += 512 * MIB

    def close(self):
        for c in self.conns:
            c.close()
        for w in self.workers:
            w.close()


def honest_gets_in(s, cli, hold, env, honest, round_):
    user = (honest[0], NOGROUP)
    w = Worker([*hold, "1"], env, user=user)
    try:
        check(w.readline().startswith("ready"), "honest worker not ready")
        wait_for(f"{round_}: the honest worker's slot",
                 lambda: w.pid in s.ps(), timeout=10)
        c = connections_as(s, user, 1)[0]
        r = answered(c, 1, pb.GET_USAGE, pb.field(1, 0, 1))
        check(r is not None and 4 in r,
              f"{round_}: the honest user's connection was not answered")
        r = answered(c, 2, pb.WATCH)
        check(r is not None and 9 in r and not pb.error_code(r),
              f"{round_}: the honest user's Watch was refused")
        c.close()
        rc, out = cli_as(s, cli, user, "admit", "--bytes", "1GiB",
                         "--ttl", "60")
        check(rc == 0 and out["admitted"],
              f"{round_}: the honest user was denied: {out}")
        rc, _ = cli_as(s, cli, user, "release", out["reservation"])
        check(rc == 0, "release failed")
    finally:
        w.close()


def test_four_hostile_users_leave_room():
    hostile = [test_user(n) for n in HOSTILE]
    honest = test_user(HONEST)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4 * MOST_CONNS + 256:
        from harness import Skip
        raise Skip(f"open-files hard limit {hard} below "
                   f"{4 * MOST_CONNS + 256}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    cfg = config(f"[server]\ngroup = nogroup\n[limits]\nfleet = {FLEET}\n")
    preload, cli, hold = world_readable_copy(
        os.environ["MEMTALLY_PRELOAD_LIB"], CLI, worker("hold"))
    held = []
    with Server("--config", cfg, slots=SLOTS) as s:
        open_to_nobody(s)
        env = s.env()
        env["LD_PRELOAD"] = preload
        try:
            for round_, users in (("two hostile", hostile[:2]),
                                  ("four hostile", hostile[2:])):
                for u in users:
                    h = Hostile(u)
                    held.append(h)
                    slots = h.fill_slots(s, hold, env)
                    # Reserve first: a uid at its connection cap cannot
                    # reach the server itself.
                    h.fill_reservations(s, cli)
                    h.fill_connections(s)
                    print(f"{round_}: uid {u[0]} holds {slots} slots, "
                          f"{len(h.conns)} connections, {h.watches} "
                          f"watches, {h.reserved // MIB} MiB reserved",
                          flush=True)
                honest_gets_in(s, cli, hold, env, honest, round_)
            st = s.status()
            print(f"four hostile: {st['slots_free']} of {SLOTS} slots "
                  f"free, {st['fleet']['reserved'] // MIB} MiB reserved of "
                  f"{FLEET // MIB}", flush=True)
            # Each hostile uid was capped, not the table or the fleet.
            for h in held:
                check(0 < h.watches < len(h.conns) < MOST_CONNS and
                      0 < h.reserved < FLEET // 4,
                      f"a hostile uid was not capped: {h.watches} "
                      f"watches, {len(h.conns)} connections, "
                      f"{h.reserved} bytes reserved")
        finally:
            for h in held:
                h.close()


if __name__ == "__main__":
    run([test_four_hostile_users_leave_room])
