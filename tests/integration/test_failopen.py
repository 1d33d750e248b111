"""Fail open: with no server, a bad socket path, a stale socket or a segment
of a wrong layout version, a preloaded program's stdout, stderr and exit
status are exactly what they are without the preload (must-show 4)."""
import mmap
import os
import socket
import struct
import subprocess
import tempfile
import time

from harness import MULT, PRELOAD, Server, check, run, worker

PROGRAMS = [
    ["python3", "-c",
     "import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\n"
     "x = [bytearray(100000) for _ in range(200)]\nsys.exit(3)"],
    ["sh", "-c", "echo hi; ls /nonexistent-memtally; exit 5"],
    [worker("mt_cxx"), "8"],
    [worker("mt_churn"), "2", "0.3"],
]


def outcome(argv, env):
    t0 = time.monotonic()
    r = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=60 * MULT)
    return (r.stdout, r.stderr, r.returncode), time.monotonic() - t0


def compare(socket_path, label):
    base = dict(os.environ)
    for k in ("LD_PRELOAD", "MEMTALLY_SOCKET", "MEMTALLY_DEBUG"):
        base.pop(k, None)
    pre = dict(base, LD_PRELOAD=PRELOAD, MEMTALLY_SOCKET=socket_path)
    for argv in PROGRAMS:
        want, _ = outcome(argv, base)
        got, secs = outcome(argv, pre)
        check(got == want, f"{label}: {argv[0]} differs under the preload:\n"
                           f"want {want!r}\ngot  {got!r}")
        print(f"  {label}: {os.path.basename(argv[0])} identical "
              f"({secs * 1000:.0f} ms)")


def test_no_server():
    d = tempfile.mkdtemp()
    compare(os.path.join(d, "nobody-here.sock"), "no server")


def test_socket_dir_missing():
    compare("/nonexistent/dir/memtally.sock", "missing dir")


def test_socket_is_regular_file():
    d = tempfile.mkdtemp()
    p = os.path.join(d, "file.sock")
    open(p, "w").write("not a socket")
    compare(p, "regular file")


def test_stale_socket():
    d = tempfile.mkdtemp()
    p = os.path.join(d, "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(p)
    s.close()  # the file stays, nobody listens: ECONNREFUSED
    compare(p, "stale socket")


def test_segment_of_wrong_version():
    with Server() as srv:
        # Rewrite version_major (offset 8) to a future major: the server
        # keeps answering Register, the client must refuse the mapping.
        fd = os.open("/dev/shm" + srv.segment, os.O_RDWR)
        m = mmap.mmap(fd, 4096)
        m[8:10] = struct.pack("<H", 99)
        m.close()
        os.close(fd)
        compare(srv.socket, "wrong version")


if __name__ == "__main__":
    run([test_no_server, test_socket_dir_missing, test_socket_is_regular_file,
         test_stale_socket, test_segment_of_wrong_version])
