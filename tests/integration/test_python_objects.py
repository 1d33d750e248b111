"""An unmodified python3 under the preload (no variable set by the user,
its own pymalloc allocator) holding over 300 MB of objects of at most 512
bytes -- tuples, strings and dicts, which CPython keeps in pymalloc's
arenas, maps it makes itself -- is counted for them: memtally's figure
grows within 15% of the growth of its anonymous RSS, and after `del` and
`gc.collect()` it falls back.

Run with Debian's /usr/bin/python3 (a static interpreter: pymalloc's mmap
goes through the executable's own PLT) and, when there is one, with the
python3 on PATH if it is another build (pyenv's links libpython3.so, whose
calls go through the library's PLT): two ways a CPython reaches mmap.
"""
import os
import shutil

from harness import MIB, Server, Worker, check, run, wait_for, Skip

SCRIPT = r"""
import gc, sys
def anon():
    with open("/proc/self/status") as f:
        for l in f:
            if l.startswith("RssAnon:"):
                return int(l.split()[1]) * 1024
print("base", anon(), flush=True)
sys.stdin.readline()
held = [(i, "s%07d" % i, {"k": i}) for i in range(1000000)]
big = max(max(sys.getsizeof(x) for x in t) for t in held[:1000])
big = max(big, max(sys.getsizeof(t) for t in held[:1000]))
print("held", anon(), big, flush=True)
sys.stdin.readline()
del held
gc.collect()
print("freed", anon(), flush=True)
sys.stdin.readline()
"""


def interpreters():
    found = []
    for p in ("/usr/bin/python3", shutil.which("python3")):
        if p and os.access(p, os.X_OK):
            real = os.path.realpath(p)
            # pyenv's shim is a shell script: find the interpreter it runs.
            if open(real, "rb").read(2) == b"#!":
                prefix = os.popen("pyenv prefix 2>/dev/null").read().strip()
                real = os.path.realpath(os.path.join(prefix, "bin",
                                                     "python3"))
                if not os.access(real, os.X_OK):
                    continue
            if real not in found:
                found.append(real)
    return found


def figure(s, pid):
    p = s.ps().get(pid)
    return p["bytes"] if p else None


def one(python):
    with Server() as s:
        env = s.env()
        env.pop("PYTHONMALLOC", None)
        w = Worker([python, "-c", SCRIPT], env)
        try:
            base_rss = int(w.readline().split()[1])
            wait_for("registered", lambda: figure(s, w.pid) is not None)
            base = figure(s, w.pid)
            w.send("")
            words = w.readline().split()
            check(words[0] == "held", f"held: {words}")
            held_rss, biggest = int(words[1]), int(words[2])
            check(biggest <= 512, f"objects of at most 512 B: {biggest}")
            grown_rss = held_rss - base_rss
            check(grown_rss >= 300 * 1000 * 1000,
                  f"holds over 300 MB: RssAnon grew {grown_rss}")
            # A tick and the last flush: the figure stops moving.
            got = wait_for("counted", lambda: (lambda f: f if f and abs(
                (f - base) - grown_rss) <= 0.15 * grown_rss else None)(
                    figure(s, w.pid)), timeout=10)
            p = s.ps()[w.pid]
            print(f"  {python}: RssAnon +{grown_rss / MIB:.1f} MiB, "
                  f"memtally +{(got - base) / MIB:.1f} MiB "
                  f"({(got - base) / grown_rss:.3f}) of which mapped "
                  f"{p['mapped'] / MIB:.1f} MiB", flush=True)
            check(p["mapped"] >= 0.5 * grown_rss,
                  f"pymalloc's arenas counted as mapped: {p}")
            w.send("")
            words = w.readline().split()
            check(words[0] == "freed", f"freed: {words}")
            low = wait_for("fallen back", lambda: (lambda f: f if f is not None
                           and f - base <= 0.15 * grown_rss else None)(
                               figure(s, w.pid)), timeout=10)
            print(f"  after del + gc.collect(): memtally "
                  f"+{(low - base) / MIB:.1f} MiB, RssAnon "
                  f"+{(int(words[1]) - base_rss) / MIB:.1f} MiB", flush=True)
            w.send("")
        finally:
            w.close()


def test_small_objects_counted():
    pys = interpreters()
    if not pys:
        raise Skip("no python3 interpreter found")
    for py in pys:
        one(py)


if __name__ == "__main__":
    run([test_small_objects_counted])
