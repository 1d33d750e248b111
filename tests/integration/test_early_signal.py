"""A signal sent the moment memtallyd's socket appears is handled, not
fatal.

The socket appears while the server sets itself up, and memtallyd used to
start watching SIGHUP, SIGTERM and SIGINT only after that: a reload sent as
soon as the socket was there (a supervisor's or a test's) met the default
action, and SIGHUP killed the server. Now the three are held back until
the watchers take them.

  test_hup_at_once    SIGHUP the instant the socket exists, 50 times: the
                      server lives, logs the reload, and answers; before
                      the fix all 50 died.
  test_term_at_once   SIGTERM the instant the socket exists, 20 times: a
                      clean exit 0 with its socket removed, as for any
                      SIGTERM (before: killed by the signal, exit -15).
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import MEMTALLYD, MULT, check, run, wait_for  # noqa: E402


def start_and_signal(d, i, sig):
    """Start memtallyd in d, send `sig` as soon as its socket exists (a
    tight loop, no sleep: the window is the point), return the process
    and its socket path."""
    sock = os.path.join(d, "s%d.sock" % i)
    log = open(os.path.join(d, "log%d" % i), "w")
    p = subprocess.Popen([MEMTALLYD, "--socket", sock,
                          "--segment", "mt-early-%d-%d" % (os.getpid(), i)],
                         stdout=subprocess.DEVNULL, stderr=log)
    log.close()
    end = time.monotonic() + 20 * MULT
    while not os.path.exists(sock):
        check(p.poll() is None, "memtallyd exited at start: %s" % p.returncode)
        check(time.monotonic() < end, "no socket after 20 s")
    os.kill(p.pid, sig)
    return p, sock


def test_hup_at_once():
    with tempfile.TemporaryDirectory() as d:
        for i in range(50):
            p, sock = start_and_signal(d, i, signal.SIGHUP)
            logpath = os.path.join(d, "log%d" % i)
            try:
                # No --config: the reload says there is nothing to read.
                wait_for("the SIGHUP logged",
                         lambda: p.poll() is not None or
                         "SIGHUP" in open(logpath).read(), timeout=20)
                check(p.poll() is None,
                      "try %d: memtallyd died of a SIGHUP sent as its socket "
                      "appeared (exit %s)" % (i, p.returncode))
            finally:
                if p.poll() is None:
                    p.terminate()
                p.wait()


def test_term_at_once():
    with tempfile.TemporaryDirectory() as d:
        for i in range(20):
            p, sock = start_and_signal(d, i, signal.SIGTERM)
            try:
                rc = p.wait(timeout=20 * MULT)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                check(False, "try %d: no exit 20 s after SIGTERM" % i)
            check(rc == 0, "try %d: exit %s after a SIGTERM sent as the "
                  "socket appeared (want 0, a clean stop)" % (i, rc))
            check(not os.path.exists(sock),
                  "try %d: socket left behind after SIGTERM" % i)


if __name__ == "__main__":
    run([test_hup_at_once, test_term_at_once])
