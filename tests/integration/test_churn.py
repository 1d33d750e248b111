"""64 worker processes x 4 threads allocating and freeing at random, then
exiting: the fleet total returns to exactly 0 and no process is listed
."""
import re
import subprocess

from harness import MULT, Server, check, logged, run, wait_for, worker


def test_fleet_returns_to_zero():
    with Server(slots=256) as s:
        env = s.env(group="churn")
        # Each waits to be registered before it exits: under load a
        # registration can time out (the library never blocks a worker
        # past 500 ms) and is retried after a back-off.
        procs = [subprocess.Popen([*worker("churn"), "4", "3",
                                   str(30 * MULT)], env=env)
                 for _ in range(64)]
        most = {"processes": 0, "bytes": 0}
        while any(p.poll() is None for p in procs):
            st = s.status()
            most["processes"] = max(most["processes"], st["processes"])
            most["bytes"] = max(most["bytes"], st["fleet"]["bytes"])
        for p in procs:
            check(p.wait(timeout=60 * MULT) == 0,
                  f"worker exit {p.returncode} (3: never registered)")
        # Every worker allocates far past the flush threshold, so each
        # must have registered once: count the server's own log lines
        # rather than how many a status poll happened to see at once
        # (which depends on scheduling: 15 of 16 once at load ~29). The
        # log budget writes 10 a second and sums the rest in a summary.
        # Held-back lines are reported within a tick of their second.
        wait_for("every registration logged", lambda: logged(
            s.logtext(), "worker registered") >= len(procs))
        text = s.logtext()
        registered = logged(text, "worker registered")
        written = [int(m) for m in re.findall(
            r'msg="worker registered" pid=(\d+)', text)]
        check(set(written) <= {p.pid for p in procs} and
              len(set(written)) == len(written),
              f"registered lines of other pids or twice: {written}")
        check(registered == len(procs),
              f"{registered} of {len(procs)} workers registered")
        check(most["bytes"] > 0, "nothing was ever counted")
        st = wait_for("fleet back to 0", lambda: (lambda st: st if
                      st["processes"] == 0 and st["fleet"]["bytes"] == 0
                      else None)(s.status()))
        check(s.cli("ps")["processes"] == [], "processes still listed")
        check(st["unregistered"] == 0,
              f"workers refused: {st}")
        print(f"  {registered} workers registered, at most "
              f"{most['processes']} processes and "
              f"{most['bytes'] >> 20} MiB seen at once; back to 0")


if __name__ == "__main__":
    run([test_fleet_returns_to_zero])
