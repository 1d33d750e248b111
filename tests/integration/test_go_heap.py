"""A Go program built with cgo (its heap is mapped through the preload)
holding ~300 MiB of small objects, dropped with runtime.GC() +
debug.FreeOSMemory(), then idle: memtally's figure within 10% (or
16 MiB) of its RssAnon growth while held and of RssAnon's residue 5 s
after the drop, and never below where it started. Go commits its arenas
far ahead of use and gives pages back with madvise through raw system
calls, which no preload sees: what the figure follows is the kernel's
resident count of the counted ranges (reconciled).

The program is built at test time with `go build` (golang-go, in
scripts/deps.sh); without `go` this test is skipped, never passed.
"""
import os
import shutil
import subprocess
import tempfile

from harness import MULT, Server, Skip, Worker, run
from quiet import Sampler, hold_drop_idle

HERE = os.path.dirname(os.path.abspath(__file__))


def build(tmp):
    go = shutil.which("go")
    if not go:
        raise Skip("no go on PATH (scripts/deps.sh installs golang-go)")
    src = os.path.join(tmp, "src")
    os.mkdir(src)
    shutil.copy(os.path.join(HERE, "runtimes", "goheap.go"),
                os.path.join(src, "main.go"))
    with open(os.path.join(src, "go.mod"), "w") as f:
        f.write("module mtgoheap\n\ngo 1.19\n")
    env = dict(os.environ, HOME=tmp, GOCACHE=os.path.join(tmp, "cache"),
               GOPATH=os.path.join(tmp, "gopath"), CGO_ENABLED="1",
               GOFLAGS="-mod=mod", GOTOOLCHAIN="local")
    env.pop("LD_PRELOAD", None)
    out = os.path.join(tmp, "goheap")
    r = subprocess.run([go, "build", "-o", out, "."], cwd=src, env=env,
                       capture_output=True, text=True, timeout=300 * MULT)
    if r.returncode != 0:
        raise AssertionError(f"go build failed: {r.stderr}")
    return out


def test_go_heap_follows_resident():
    with tempfile.TemporaryDirectory(prefix="mt-go-") as tmp:
        exe = build(tmp)
        with Server() as s:
            w = Worker([exe], s.env(group="go"))
            low = Sampler(s, w.pid)
            try:
                words = w.readline(timeout=30).split()
                if words != ["ready"]:
                    raise AssertionError(f"not ready: {words}")
                # Go maps its arena index (32 MiB on amd64) as a plain
                # mapping it hardly touches: counted in full for its
                # first 1-2 s, like any new mapping, then for what is
                # resident; so the figure is held to where it settled.
                hold_drop_idle(s, w, "Go (cgo)", low, from_first=False)
                w.send("exit")
            finally:
                low.close()
                w.close()


if __name__ == "__main__":
    run([test_go_heap_follows_resident])
