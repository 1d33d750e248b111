"""One heap per process, even for a program linked to libjemalloc.so.2.

The preload carries its own jemalloc and exports jemalloc's whole API, so
Debian's redis-server (which calls malloc, free, malloc_usable_size,
mallctl and malloc_stats_print of the libjemalloc.so.2 it is linked to)
must have every one of those calls served by the preload's copy: the
"Allocated" figure of the statistics redis prints itself (MEMORY
MALLOC-STATS) moves with its data and agrees with memtally's count, while
libjemalloc.so.2 stays mapped and idle. Were those calls answered by the
other copy, its Allocated would stay at that copy's ~1 MB.

The same program started under the glibc front end (as a python's
children are) is switched to the jemalloc preload: under glibc's malloc its
malloc_usable_size would be libjemalloc's, asked of glibc's blocks.
"""
import os
import re
import shutil
import subprocess

from harness import (KIB, MIB, MULT, PRELOAD, Server, Skip, check, run,
                     wait_for)

REDIS = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
KEYS = 200000


def info_memory(sock):
    """INFO memory, and `je_allocated`: the "Allocated" line of the
    statistics redis prints with malloc_stats_print (MEMORY MALLOC-STATS),
    read fresh; INFO's allocator_allocated is what its last cron (10 Hz)
    read with mallctl."""
    out = subprocess.run([REDIS_CLI, "-s", sock, "INFO", "memory"],
                         capture_output=True, text=True, timeout=30 * MULT)
    d = dict(line.strip().split(":", 1) for line in out.stdout.splitlines()
             if ":" in line)
    out = subprocess.run([REDIS_CLI, "-s", sock, "MEMORY", "MALLOC-STATS"],
                         capture_output=True, text=True, timeout=30 * MULT)
    m = re.search(r"^Allocated: (\d+)", out.stdout, re.M)
    check(m, f"no Allocated line in MEMORY MALLOC-STATS: {out.stdout[:300]}")
    d["je_allocated"] = int(m.group(1))
    return d


def cli(sock, *args):
    out = subprocess.run([REDIS_CLI, "-s", sock, *args], capture_output=True,
                         text=True, timeout=60 * MULT)
    check(out.returncode == 0, f"redis-cli {args}: {out.stderr}")
    return out.stdout.strip()


def need_redis():
    for exe in (REDIS, REDIS_CLI):
        if not os.access(exe, os.X_OK):
            raise Skip(f"{exe} not installed (scripts/deps.sh installs it)")


def start_redis(s, env):
    """redis-server on a socket in s.dir, up (PING answered): (process,
    socket). Fails at once if it exits."""
    sock = os.path.join(s.dir, "redis.sock")
    proc = subprocess.Popen(
        [REDIS, "--port", "0", "--unixsocket", sock, "--save", "",
         "--appendonly", "no", "--enable-debug-command", "yes",
         "--dir", s.dir],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def up():
        check(proc.poll() is None, f"redis-server exited: {proc.returncode}")
        return os.path.exists(sock) and cli(sock, "PING") == "PONG"
    try:
        wait_for("redis-server up", up)
    except BaseException:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        raise
    return proc, sock


def test_redis_one_heap():
    need_redis()
    with Server() as s:
        proc, sock = start_redis(s, s.env(group="redis"))
        try:
            with open(f"/proc/{proc.pid}/maps") as f:
                maps = f.read()
            check("libjemalloc.so.2" in maps, "redis-server does not map "
                  "libjemalloc.so.2: not the program this test is about")
            check(os.path.basename(PRELOAD) in maps, "preload not mapped")
            m0 = info_memory(sock)
            check(m0.get("mem_allocator", "").startswith("jemalloc"),
                  f"redis says mem_allocator={m0.get('mem_allocator')}")
            a0 = m0["je_allocated"]
            cli(sock, "DEBUG", "POPULATE", str(KEYS), "key", "256")
            check(cli(sock, "DBSIZE") == str(KEYS), "keys not populated")
            m1 = info_memory(sock)
            a1 = m1["je_allocated"]
            # 200,000 keys of 256 B values: ~60 MB in the heap.
            check(a1 - a0 >= 40 * MIB,
                  f"the Allocated of redis's malloc_stats_print moved {a0} "
                  f"-> {a1}: its jemalloc API does not see the heap that "
                  "serves its mallocs")
            used = int(m1["used_memory"]) - int(m0["used_memory"])
            check(abs((a1 - a0) - used) <= used // 10,
                  f"jemalloc's Allocated grew by {a1 - a0}, used_memory "
                  f"(malloc_usable_size) by {used}")
            # memtally's count against jemalloc's own: the bound is 64 KiB
            # per thread (redis runs a few background threads).
            threads = len(os.listdir(f"/proc/{proc.pid}/task"))
            bound = 64 * KIB * threads + 256 * KIB

            def agrees():
                a = info_memory(sock)["je_allocated"]
                p = s.ps().get(proc.pid)
                return (p, a) if p and abs(p["bytes"] - a) <= bound else None

            p, a = wait_for("memtally count == jemalloc's Allocated", agrees)
            print(f"  redis: jemalloc Allocated {a0} -> {a}, used_memory "
                  f"+{used}, memtally {p['bytes']}, threads {threads}")
            cli(sock, "FLUSHALL", "SYNC")
            wait_for("memtally count back down after FLUSHALL",
                     lambda: s.ps().get(proc.pid, {}).get("bytes", 1 << 40)
                     < a0 + 8 * MIB)
        finally:
            proc.terminate()
            proc.wait(timeout=30 * MULT)


def test_redis_under_the_glibc_front_end():
    need_redis()
    glibc_lib = os.path.join(os.path.dirname(PRELOAD), "libmemtally_glibc.so")
    with Server() as s:
        env = s.env(group="redis", LD_PRELOAD=glibc_lib)
        env.pop("MEMTALLY_ALLOCATOR", None)
        proc, sock = start_redis(s, env)
        try:
            with open(f"/proc/{proc.pid}/maps") as f:
                maps = f.read()
            check(os.path.basename(PRELOAD) in maps and
                  "libmemtally_glibc.so" not in maps,
                  "not switched to the jemalloc preload")
            cli(sock, "DEBUG", "POPULATE", str(KEYS), "key", "256")
            wait_for("its heap counted", lambda: s.ps().get(
                proc.pid, {}).get("bytes", 0) >= 40 * MIB)
            print(f"  redis under the glibc front end: switched, "
                  f"{s.ps()[proc.pid]['bytes'] // MIB} MiB counted")
        finally:
            proc.terminate()
            proc.wait(timeout=30 * MULT)


if __name__ == "__main__":
    run([test_redis_one_heap, test_redis_under_the_glibc_front_end])
