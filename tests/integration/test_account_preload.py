"""A program linked to libmemtally that counts memory of its own with
memtally_account() (memory that is not malloc's), run under a preload, as
`memtally run` runs every command.

test_account_beside_the_preload: mt_account mallocs and touches 48 MiB and
accounts 30 MiB of its own, then frees the 48. Under each preload (jemalloc's
and the glibc front end) memtallyd shows it at 78 MiB, then at 30, one
registration. Under the jemalloc preload, memtally_account() bound to
libmemtally's own core, which registered the process a second time over
the preload's slot: memtallyd showed 30 MiB, then 0 ("figure below zero,
clamped"), and logged the second registration as an exec.
"""
import os

from harness import (MIB, PRELOAD, WORKERS, Server, Skip, Worker, check,
                     run, wait_for)

GLIBC_LIB = os.path.join(os.path.dirname(PRELOAD), "libmemtally_glibc.so")
PROGRAM = os.path.join(WORKERS, "mt_account")


def test_account_beside_the_preload():
    if not os.path.exists(PROGRAM):
        raise Skip(f"{PROGRAM} is not built (a sanitized build links no "
                   "unsanitized program to libmemtally)")
    for name, lib in (("jemalloc", PRELOAD), ("glibc", GLIBC_LIB)):
        with Server() as s:
            # 48 MiB: a size class of jemalloc's, which counts usable bytes.
            w = Worker([PROGRAM, "48", "30"], s.env(LD_PRELOAD=lib))
            try:
                check(w.readline() == "held", f"{name}: not held")

                def shown(lo, hi):
                    def f():
                        b = s.ps().get(w.pid, {}).get("bytes")
                        return b if b is not None and lo <= b <= hi else None
                    return f

                b = wait_for(f"{name}: 48 MiB malloc'd and 30 of its own",
                             shown(77 * MIB, 82 * MIB))
                w.send("free")
                check(w.readline() == "freed", f"{name}: not freed")
                a = wait_for(f"{name}: its own 30 MiB after the free",
                             shown(29 * MIB, 33 * MIB))
                print(f"  {name}: {b / MIB:.1f} MiB, then {a / MIB:.1f} MiB "
                      "after the free", flush=True)
                log = s.logtext()
                check(log.count(f"pid={w.pid} ") and
                      "exec'd" not in log and "clamped" not in log,
                      f"{name}: registered twice: {s.tail()}")
            finally:
                w.close()


if __name__ == "__main__":
    run([test_account_beside_the_preload])
