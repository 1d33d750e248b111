"""What the preload adds to a process's start, over jemalloc alone.

Every short-lived process (a shell pipeline, each compile of a `make -j`)
pays the preload's start. callgrind counts the instructions of `/bin/true`
under libjemalloc.so.2 alone and under the preload with a memtallyd up (so
the preload registers, as a worker does): the preload may add at most
20,000. Setting a thread up through mallctl, as the preload did, added
~150,000 (jemalloc's first mallctl builds its whole ctl state).
"""
import os
import re
import shutil
import subprocess

from harness import MULT, Server, Skip, check, run

JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
BUDGET = 20000


def instructions(env, out):
    r = subprocess.run(["valgrind", "--tool=callgrind",
                        "--callgrind-out-file=" + out, "/bin/true"],
                       env=env, capture_output=True, text=True,
                       timeout=120 * MULT)
    check(r.returncode == 0, f"callgrind of /bin/true: {r.stderr[-500:]}")
    with open(out) as f:
        m = re.search(r"^(?:summary|totals): (\d+)", f.read(), re.M)
    check(m, "no total in callgrind's output")
    return int(m.group(1))


def test_start_within_budget():
    if not shutil.which("valgrind"):
        raise Skip("valgrind not installed")
    if not os.path.exists(JEMALLOC):
        raise Skip(f"{JEMALLOC} not installed")
    with Server() as s:
        env = s.env()
        out = os.path.join(s.dir, "cg.out")
        pre = instructions(env, out)
        env["LD_PRELOAD"] = JEMALLOC
        alone = instructions(env, out)
    print(f"/bin/true: jemalloc alone {alone}, preload {pre}, "
          f"{pre - alone:+d}")
    check(pre - alone <= BUDGET,
          f"the preload adds {pre - alone} instructions to /bin/true over "
          f"jemalloc alone (at most {BUDGET})")


if __name__ == "__main__":
    run([test_start_within_budget])
