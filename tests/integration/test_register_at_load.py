"""The preload does not register at load: its first flush after start does.

Registering in the constructor was a round trip to memtallyd, and the
server's work for the process, in every process's start. Now the bytes
of the start wait in the process's pending count and the first flush
(jemalloc's activity event, memtally_flush(), memtally_attached())
registers and moves them into the slot. So:

- a process's start does not wait for the server: under a server that
  never answers, `/bin/true` is done at once, where the constructor's
  registration waited out its 500 ms timeout every time;
- a process that exits at once leaves nothing on the server;
- a process that allocates after its start is registered, attached and
  counted in full, and so is a child it forks at once (with its own
  slot); its first open() still gets descriptor 3.

Nor does every flush register: a process registers at the first flush at
which it has lived MEMTALLY_REGISTER_AFTER_MS (10) or published
MEMTALLY_REGISTER_MIN (1 MiB). So:

- a young, small process that goes quiet is never registered, and one
  that allocates again after the first bound registers with everything
  it counted before;
- a process that grows past the size bound registers at once, however
  young;
- an image that a registered process exec'd registers at its first
  flush, small and young as it is, so that the old image's figure does
  not stay on the server; an image whose process merely started a while
  before it (a slow launcher) asks the same, is told that nothing of its
  process is registered, and waits for the bounds like any other;
- MEMTALLY_REGISTER_MIN=0, or a MEMTALLY_TASK to fulfil, register at the
  first flush, as before.
"""
import os
import socket
import subprocess
import tempfile
import time

from harness import (MIB, MULT, PRELOAD, Server, check, deadline, run,
                     wait_for, worker)


def preload_env(sock):
    e = dict(os.environ)
    for k in ("MEMTALLY_DEBUG", "MEMTALLY_DISABLE", "MEMTALLY_ALLOCATOR"):
        e.pop(k, None)
    e["LD_PRELOAD"] = PRELOAD
    e["MEMTALLY_SOCKET"] = sock
    return e


def test_start_does_not_wait_for_the_answer():
    d = tempfile.mkdtemp(prefix="mt-silent-")
    path = os.path.join(d, "silent.sock")
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(path)
    silent.listen(128)  # never accepted, never answered
    try:
        env = preload_env(path)
        times = []
        for _ in range(3):
            t0 = time.monotonic()
            r = subprocess.run(["/bin/true"], env=env, timeout=30 * MULT)
            times.append(time.monotonic() - t0)
            check(r.returncode == 0, f"/bin/true exited {r.returncode}")
    finally:
        silent.close()
    best = min(times)
    print(f"  /bin/true under a silent server: "
          f"{', '.join('%.0f ms' % (t * 1000) for t in times)}")
    # Waiting for the answer took the whole 500 ms timeout each time.
    check(best < 0.25, f"/bin/true took {best * 1000:.0f} ms at best under "
                       f"a server that never answers: its start waited")


def test_short_lived_leave_nothing():
    with Server() as s:
        env = s.env()
        for _ in range(100):
            subprocess.run(["/bin/true"], env=env, check=True)
        wait_for("no process left registered",
                 lambda: s.status()["processes"] == 0)
        print(f"  100 x /bin/true: {s.status()['processes']} processes "
              f"left")


def test_registered_and_first_open_unchanged():
    """python3 (which allocates at start) is registered; its first
    open() gets the descriptor it gets without memtally."""
    with Server() as s:
        prog = ("import os, sys\n"
                "fd = os.open('/dev/null', os.O_RDONLY)\n"
                "print(fd, flush=True)\n"
                "sys.stdin.read()\n")
        p = subprocess.Popen(["/usr/bin/python3", "-S", "-c", prog],
                             env=dict(s.env(), MEMTALLY_ALLOCATOR="jemalloc"),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
        try:
            first = p.stdout.readline().strip()
            wait_for(f"pid {p.pid} registered", lambda: p.pid in s.ps())
        finally:
            p.stdin.close()
            p.wait()
        want = subprocess.run(
            ["/usr/bin/python3", "-S", "-c", prog.replace(
                "sys.stdin.read()\n", "")],
            capture_output=True, text=True).stdout.strip()
        check(first == want, f"first open() under the preload gave {first}, "
                             f"without it {want}")


def test_allocating_process_attached_and_counted():
    """A worker that holds 64 MiB after its start: registered at that
    flush, counted in full (its start's bytes included)."""
    with Server() as s:
        p = subprocess.Popen([*worker("idle"), "64"], env=s.env(),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
        try:
            line = p.stdout.readline()
            check(line.startswith("held"), f"mt_worker idle said {line!r}")
            end = deadline(20)
            got = 0
            while time.monotonic() < end:
                got = s.ps().get(p.pid, {}).get("bytes", 0)
                if got >= 64 * MIB:
                    break
                time.sleep(0.02)
            check(got >= 64 * MIB,
                  f"mt_worker idle holding 64 MiB shows {got} bytes")
            print(f"  mt_worker idle 64 MiB: {got} bytes")
        finally:
            p.stdin.close()
            p.wait()


def test_fork_child_registers_itself():
    """A process that forks at once, before either has registered:
    parent and child are each registered at their first flush, with
    their own slot, and counted in full."""
    prog = ("import os, sys\n"
            "pid = os.fork()\n"
            "b = bytearray((32 if pid == 0 else 16) << 20)\n"
            "print(os.getpid(), flush=True)\n"
            "sys.stdin.read()\n")
    with Server() as s:
        p = subprocess.Popen(["/usr/bin/python3", "-S", "-c", prog],
                             env=dict(s.env(), MEMTALLY_ALLOCATOR="jemalloc"),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
        try:
            pids = {int(p.stdout.readline()), int(p.stdout.readline())}
            child = (pids - {p.pid}).pop()
            want = {p.pid: 16 * MIB, child: 32 * MIB}
            def counted():
                ps = s.ps()
                return all(ps.get(q, {}).get("bytes", 0) >= w
                           for q, w in want.items())
            wait_for("parent and child counted", counted)
            ps = s.ps()
            print(f"  parent {ps[p.pid]['bytes']} bytes, child "
                  f"{ps[child]['bytes']} bytes")
        finally:
            p.stdin.close()
            p.wait()


KIB = 1024


def start_young(env, kib, argv=None):
    argv = argv or [*worker("young"), str(kib)]
    p = subprocess.Popen(argv, env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    line = p.stdout.readline().strip()
    check(line == "held", f"mt_worker young said {line!r}")
    return p


def ask(p, line):
    """Send mt_worker young one command line; return its answer."""
    p.stdin.write(line + "\n")
    p.stdin.flush()
    return p.stdout.readline().strip()


def more(p, kib):
    line = ask(p, f"more {kib}")
    check(line == "held", f"mt_worker young said {line!r}")


def stays_unregistered(s, pid, seconds):
    """pid is never listed for `seconds`; False at the first sight."""
    end = time.monotonic() + seconds * MULT
    while time.monotonic() < end:
        if pid in s.ps():
            return False
        time.sleep(0.05)
    return True


def out_until_asked(s, p, registered_msg):
    """mt_worker young (256 KiB) stays unregistered, then memtally_attached()
    registers it with all it holds; returns its bytes then."""
    check(stays_unregistered(s, p.pid, 0.3), registered_msg)
    line = ask(p, "attached")
    check(line == "attached=1", f"memtally_attached(): {line!r}")
    got = wait_bytes(s, p.pid, 256 * KIB)
    check(got >= 256 * KIB, f"once asked it shows {got} bytes")
    return got


def wait_bytes(s, pid, at_least):
    end = deadline(20)
    got = 0
    while time.monotonic() < end:
        got = s.ps().get(pid, {}).get("bytes", 0)
        if got >= at_least:
            return got
        time.sleep(0.02)
    return got


def test_young_small_quiet_left_out():
    """256 KiB at its start (four flushes' worth), then quiet: no
    registration, and no process left behind on the server. Then 128 KiB
    more, once past the age bound: registered, with all 384 KiB. (The age
    bound is set to a second here, not its 10 ms default, so that a busy
    machine descheduling the worker between its flushes cannot age it.)"""
    age_ms = int(1000 * MULT)
    with Server() as s:
        before = s.status()["processes"]
        t0 = time.monotonic()
        p = start_young(s.env(MEMTALLY_REGISTER_AFTER_MS=str(age_ms)), 256)
        try:
            check(stays_unregistered(s, p.pid, 0.5),
                  "a young process holding 256 KiB registered")
            check(s.status()["processes"] == before,
                  "the server lists a process it should not know")
            time.sleep(max(0.0, t0 + 1.2 * age_ms / 1000 - time.monotonic()))
            more(p, 128)
            got = wait_bytes(s, p.pid, 384 * KIB)
            check(got >= 384 * KIB,
                  f"after 128 KiB more it shows {got} bytes, want the "
                  f"384 KiB it holds (its first 256 KiB carried over)")
            print(f"  quiet 256 KiB: not registered; after 128 KiB more: "
                  f"{got} bytes")
        finally:
            p.stdin.close()
            p.wait()


def test_large_registers_at_once():
    """Past the size bound a process registers at that flush, however
    young: with the age bound out of reach, 2 MiB still registers."""
    with Server() as s:
        p = start_young(s.env(MEMTALLY_REGISTER_AFTER_MS="60000"), 2048)
        try:
            got = wait_bytes(s, p.pid, 2 * MIB)
            check(got >= 2 * MIB, f"a 2 MiB process shows {got} bytes")
            print(f"  2 MiB at once: {got} bytes")
        finally:
            p.stdin.close()
            p.wait()


def test_exec_replaces_the_old_image():
    """A registered process (2 MiB) execs a small one (256 KiB, then
    quiet): the new image registers at once and replaces the old
    image's figure."""
    with Server() as s:
        p = start_young(s.env(), 2048)
        try:
            got = wait_bytes(s, p.pid, 2 * MIB)
            check(got >= 2 * MIB, f"before the exec it shows {got} bytes")
            time.sleep(0.05)  # older than the start time's 10 ms ticks
            line = ask(p, "exec 256")
            check(line == "held", f"mt_worker young after exec said {line!r}")
            end = deadline(20)
            now = got
            while time.monotonic() < end:
                now = s.ps().get(p.pid, {}).get("bytes", 0)
                if 256 * KIB <= now < 1 * MIB:
                    break
                time.sleep(0.02)
            check(256 * KIB <= now < 1 * MIB,
                  f"after exec'ing a 256 KiB image it shows {now} bytes, "
                  f"not the new image's (the old image held {got})")
            print(f"  exec: {got} -> {now} bytes")
        finally:
            p.stdin.close()
            p.wait()


def test_slow_launcher_is_not_an_exec():
    """A shell that waits 0.3 s before it execs the worker: the worker's
    process is older than its image, as after a registered worker's exec.
    It asks to register only if its process is registered (memtallyd's
    log shows it connect), is told no, and stays out like any young, small
    process. (Before, it registered at once: a launcher slow between its
    fork and exec, or a sanitizer's start-up, did the same.)"""
    with Server() as s:
        env = s.env(MEMTALLY_REGISTER_AFTER_MS="60000")
        p = start_young(env, 256, ["/bin/sh", "-c",
                                   'sleep 0.3; exec "$0" "$1" 256',
                                   *worker("young")])
        try:
            asked = f'connection accepted" peer_pid={p.pid} '
            wait_for("the worker's ask reaches memtallyd",
                     lambda: asked in s.logtext())
            got = out_until_asked(s, p, "a slow launcher's young, small "
                                  "worker registered")
            print(f"  slow launcher: asked, stayed out; then {got} bytes")
        finally:
            p.stdin.close()
            p.wait()


def test_attached_asks_at_once():
    """memtally_attached() is the program asking: a young, small process
    registers then, whatever the bounds."""
    with Server() as s:
        p = start_young(s.env(MEMTALLY_REGISTER_AFTER_MS="60000"), 256)
        try:
            got = out_until_asked(s, p, "a young process holding 256 KiB "
                                  "registered")
            print(f"  memtally_attached(): {got} bytes")
        finally:
            p.stdin.close()
            p.wait()


def test_first_flush_when_asked():
    """MEMTALLY_REGISTER_MIN=0, or a task to fulfil: the small quiet
    process registers at its first flush."""
    with Server() as s:
        for extra in ({"MEMTALLY_REGISTER_MIN": "0"},
                      {"MEMTALLY_TASK": "t-young"}):
            p = start_young(s.env(**extra), 256)
            try:
                got = wait_bytes(s, p.pid, 256 * KIB)
                check(got >= 256 * KIB,
                      f"under {extra} a 256 KiB process shows {got} bytes")
                print(f"  {extra}: {got} bytes")
            finally:
                p.stdin.close()
                p.wait()


if __name__ == "__main__":
    run([test_start_does_not_wait_for_the_answer,
         test_short_lived_leave_nothing,
         test_registered_and_first_open_unchanged,
         test_allocating_process_attached_and_counted,
         test_fork_child_registers_itself,
         test_young_small_quiet_left_out,
         test_large_registers_at_once,
         test_exec_replaces_the_old_image,
         test_slow_launcher_is_not_an_exec,
         test_attached_asks_at_once,
         test_first_flush_when_asked])
