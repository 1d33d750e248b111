"""memtally top: refreshes in place (here: twice, piped), largest first;
on a terminal, draws each frame cut to the screen's width and height;
gives up on a server that does not answer, as every other command does;
refuses bad options before it connects."""
import fcntl
import os
import pty
import struct
import termios
import signal
import subprocess
import tempfile
import time

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


def on_terminal(argv, rows, cols):
    """argv's output on a pseudo-terminal of rows x cols, until it exits."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ,
                struct.pack("HHHH", rows, cols, 0, 0))
    # No newline translation: the rows are read as the program wrote them.
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.ONLCR
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    out = b""
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the program and its terminal are gone
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
        proc.wait(timeout=30 * MULT)
    return proc.returncode, out.decode("utf-8", "replace")


def cols(text):
    """The columns `text` takes on a terminal: 2 for a wide character
    (East Asian wide or fullwidth), 0 for a combining mark, else 1."""
    import unicodedata
    return sum(0 if unicodedata.combining(c) else
               2 if unicodedata.east_asian_width(c) in "WF" else 1
               for c in text)


WIDE = "数据处理数据处理"  # 8 characters, 24 bytes, 16 columns


def test_top_fits_a_narrow_terminal():
    """On a 60 x 14 terminal every line of a frame fits 60 columns (a
    process row is more than twice that), the frame fits 13 rows, and
    the title still leads it: nothing wrapped or scrolled it away. A
    group named in double-width characters keeps its column in line with
    the others' and its row within the 60 columns."""
    with Server() as s:
        ws = [Worker([*worker("hold"), "8"], s.env(group=g))
              for g in ("g0", "g1", WIDE)]
        try:
            for w in ws:
                w.readline()
            wait_for("all counted", lambda: len(s.ps()) == 3 and all(
                p["bytes"] >= 8 * MIB for p in s.ps().values()))
            rc, out = on_terminal(
                [CLI, "--socket", s.socket, "top", "--iterations", "1"],
                14, 60)
            check(rc == 0, f"top on a terminal: exit {rc}: {out!r}")
            frame = out.split("\033[H\033[2J")[-1]
            lines = frame.split("\n")
            if lines and lines[-1] == "":
                lines.pop()
            print(f"  {len(lines)} lines, widest "
                  f"{max(cols(l) for l in lines)} columns")
            check(lines and lines[0].startswith("memtally top - "),
                  f"the title is not first: {lines[:2]}")
            check(len(lines) <= 13, f"{len(lines)} lines on 14 rows")
            wide = [l for l in lines if cols(l) > 60]
            check(not wide, f"lines wider than 60 columns: {wide}")
            # Taller: the table. The BYTES column ends where its heading
            # does, in each row.
            rc, out = on_terminal(
                [CLI, "--socket", s.socket, "top", "--iterations", "1"],
                30, 60)
            check(rc == 0, f"top on a terminal: exit {rc}: {out!r}")
            lines = out.split("\033[H\033[2J")[-1].split("\n")
            wide = [l for l in lines if cols(l) > 60]
            check(not wide, f"lines wider than 60 columns: {wide}")
            def ends(head, rows):
                end = cols(head[:head.index("BYTES") + 5])
                at = [cols(r[:r.index("MiB") + 3]) for r in rows]
                check(len(rows) == 3 and all(e == end for e in at) and
                      any(WIDE in r for r in rows),
                      f"BYTES ends at column {end}, in the rows at {at}: "
                      f"{[head] + rows}")
            heads = [l for l in lines if "BYTES" in l]
            check(len(heads) == 2, f"not two tables: {lines}")
            groups = ("g0", "g1", WIDE)
            ends(heads[0], [l for l in lines if l.split(" ")[0] in groups])
            ends(heads[1], [l for l in lines if "MiB" in l and
                            l.split()[0] in {str(w.pid) for w in ws}])
            # 11 columns: the group table's wide row is cut before the
            # character that would straddle the edge, never inside one.
            rc, out = on_terminal(
                [CLI, "--socket", s.socket, "top", "--iterations", "1"],
                30, 11)
            check(rc == 0 and "\ufffd" not in out,
                  f"top on 11 columns: exit {rc}: {out!r}")
            lines = out.split("\033[H\033[2J")[-1].split("\n")
            wide = [l for l in lines if cols(l) > 11]
            check(not wide and WIDE[:5] in lines,
                  f"on 11 columns: {lines}")
        finally:
            for w in ws:
                w.close()


def test_top_gives_up_on_a_stopped_server():
    with Server() as s:
        os.kill(s.proc.pid, signal.SIGSTOP)
        try:
            for extra in (["--timeout", "1000"], []):
                t0 = time.monotonic()
                out = subprocess.run(
                    [CLI, "--socket", s.socket, *extra, "top",
                     "--iterations", "1"], capture_output=True, text=True,
                    timeout=60 * MULT)
                took = time.monotonic() - t0
                check(out.returncode == 1,
                      f"top {extra}: exit {out.returncode}: {out.stderr}")
                # The default deadline is 5 s.
                check(took < 20 * MULT, f"top {extra} took {took:.1f} s")
                print(f"  top {extra or '(default timeout)'} against a "
                      f"stopped server: exit 1 after {took:.1f} s")
        finally:
            os.kill(s.proc.pid, signal.SIGCONT)


def test_top_refuses_bad_options_without_a_server():
    with tempfile.TemporaryDirectory() as d:
        sock = os.path.join(d, "none.sock")
        for args in (["--interval", "0"], ["--iterations", "x"],
                     ["--iterations", "99999999999999999999"]):
            out = subprocess.run([CLI, "--socket", sock, "top", *args],
                                 capture_output=True, text=True)
            check(out.returncode == 2,
                  f"top {args}: exit {out.returncode}: {out.stderr}")
        out = subprocess.run([CLI, "--socket", sock, "--json", "top"],
                             capture_output=True, text=True)
        check(out.returncode == 2, f"top --json: exit {out.returncode}")
        out = subprocess.run([CLI, "--socket", sock, "top",
                              "--iterations", "1"],
                             capture_output=True, text=True)
        check(out.returncode == 1, f"no server: exit {out.returncode}")


if __name__ == "__main__":
    run([test_top_refreshes_largest_first, test_top_fits_a_narrow_terminal,
         test_top_gives_up_on_a_stopped_server,
         test_top_refuses_bad_options_without_a_server])
