"""memtally top: refreshes in place (here: twice, piped), largest first."""
import subprocess

from harness import CLI, MIB, MULT, Server, Worker, check, run, wait_for, worker


def test_top_refreshes_largest_first():
    with Server() as s:
        big = Worker([*worker("hold"), "48"], s.env(group="big"))
        small = Worker([*worker("hold"), "8"], s.env(group="small"))
        try:
            big.readline()
            small.readline()
            wait_for("both counted", lambda: len(s.ps()) == 2 and all(
                p["bytes"] >= 8 * MIB for p in s.ps().values()))
            out = subprocess.run(
                [CLI, "--socket", s.socket, "top", "--iterations", "2",
                 "--interval", "0.2"], capture_output=True, text=True,
                timeout=30 * MULT)
            check(out.returncode == 0, f"top failed: {out.stderr}")
            check(out.stdout.count("memtally top - ") == 2,
                  f"not two refreshes:\n{out.stdout}")
            lines = out.stdout.splitlines()
            rows = [l for l in lines if l.strip().split(" ")[0] in
                    (str(big.pid), str(small.pid))]
            check(len(rows) == 4, f"rows: {rows}")
            check(rows[0].split()[0] == str(big.pid),
                  f"largest not first: {rows[0]}")
            bad = subprocess.run([CLI, "--socket", s.socket, "top",
                                  "--interval", "0"], capture_output=True)
            check(bad.returncode == 2, "bad interval accepted")
        finally:
            big.close()
            small.close()


if __name__ == "__main__":
    run([test_top_refreshes_largest_first])
