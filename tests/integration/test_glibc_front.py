"""The glibc front end (libmemtally_glibc.so, MEMTALLY_ALLOCATOR=glibc):
a program counted under its own glibc malloc.

- The allocator is proven to be glibc: the library says so
  (memtally_preload_allocator), malloc_usable_size(malloc(100)) is glibc's
  104 (jemalloc's class is 112), no libjemalloc is mapped, and glibc's own
  mallinfo2() moves with the worker's heap (by hundreds of MiB).
- A 4-thread worker allocating and freeing 16 B .. 256 KiB blocks through
  malloc, calloc, realloc and posix_memalign: at ten points of its run
  memtally's heap figure agrees with mallinfo2()'s in-use bytes (uordblks
  + hblkhd) within the process's error bar. glibc keeps up to 7 freed
  blocks of each small size per thread in its thread cache and mallinfo2
  still counts them as in use, so this run switches the cache off
  (glibc.malloc.tcache_count=0); a second run with the cache on shows the
  gap stays within what the caches can hold.
- The same worker's 1 GiB of malloc/free under glibc ends within its error
  bar (glibc's own mmaps are never counted as mapped), and no more than
  the process holds (no ghost of the gigabyte as glibc's free memory).
- The free memory glibc keeps (allocator_free): a heap freed into holes
  is counted at what glibc holds, equal to its RSS growth; when
  everything is freed, the freed bytes count as glibc's free memory until
  the next sample says what it gave back (never below RssAnon), then the
  figure is what glibc holds; a worker moved to a new slot (a server
  restarted with --reset) samples again at its next flush.
- MEMTALLY_ALLOCATOR names the front end whichever library was preloaded:
  =glibc under libmemtally_preload.so runs the program under the glibc
  front end (same pid, same arguments), =jemalloc under
  libmemtally_glibc.so the other way round.
"""
import os
import subprocess

from harness import MIB, PRELOAD, Server, Worker, check, run, wait_for
from harness import rss_anon, worker

GLIBC_LIB = os.path.join(os.path.dirname(PRELOAD), "libmemtally_glibc.so")
THREADS = 4
# glibc 2.36's tcache: 64 bins of chunks 32..1040 bytes, 7 blocks each.
TCACHE_PER_THREAD = 7 * sum(32 + 16 * i for i in range(64))


def heap(p):
    """The heap part of a process's figure (what mallinfo2 calls in use)."""
    return p["bytes"] - p["mapped"] - p["allocator_free"]


def points(tunables):
    """Run the worker; return (its ready line, [(mallinfo, memtally, p)])."""
    with Server() as s:
        env = s.env(LD_PRELOAD=GLIBC_LIB)
        if tunables:
            env["GLIBC_TUNABLES"] = tunables
        else:
            env.pop("GLIBC_TUNABLES", None)
        w = Worker([*worker("glibc"), str(THREADS), "10"], env)
        out = []
        try:
            ready = w.readline()
            with open(f"/proc/{w.pid}/maps") as f:
                maps = f.read()
            check("libmemtally_glibc.so" in maps, "the glibc front end is "
                  "loaded")
            check("libjemalloc" not in maps, "no jemalloc in the process")
            for k in range(10):
                words = w.readline().split()
                check(words[:2] == ["point", str(k)], f"point {k}: {words}")
                inuse = int(words[2].split("=")[1])
                # Every thread flushed before the point: one tick later
                # the server holds the figure.
                p = wait_for("figure at the point", lambda: (
                    lambda p: p if p and p.get("threads", 0) >= 1 else None)(
                        s.ps().get(w.pid)))
                t0 = s.status()["ticks"]
                wait_for("a tick", lambda: s.status()["ticks"] > t0 + 1)
                p = s.ps()[w.pid]
                out.append((inuse, heap(p), p))
                w.send("go")
            check(w.readline().startswith("done"), "worker done")
            w.send("exit")
        finally:
            w.close()
        return ready, out


def test_counted_as_glibc_counts():
    ready, pts = points("glibc.malloc.tcache_count=0")
    print(f"  {ready.strip()}", flush=True)
    check("allocator=glibc" in ready, f"allocator: {ready}")
    check("usable100=104" in ready, f"glibc's usable size: {ready}")
    peak = max(i for i, _, _ in pts)
    check(peak >= 200 * MIB, f"mallinfo2 moved with the heap: {peak}")
    for k, (inuse, mine, p) in enumerate(pts):
        print(f"  point {k}: mallinfo2 {inuse / MIB:9.3f} MiB, memtally "
              f"{mine / MIB:9.3f} MiB, diff {mine - inuse:+d} B, error bar "
              f"{p['error_bytes']} B, mapped {p['mapped']}", flush=True)
        check(abs(mine - inuse) <= p["error_bytes"],
              f"point {k}: memtally {mine} vs mallinfo2 {inuse}, error bar "
              f"{p['error_bytes']}")
        check(p["mapped"] == 0, f"glibc's own mmaps not in mapped: {p}")


def test_thread_caches_are_the_only_gap():
    _, pts = points(None)
    bound = (THREADS + 1) * TCACHE_PER_THREAD
    for k, (inuse, mine, p) in enumerate(pts):
        gap = inuse - mine
        print(f"  point {k}: mallinfo2 - memtally = {gap} B (error bar "
              f"{p['error_bytes']} B + thread caches <= {bound} B)",
              flush=True)
        check(-p["error_bytes"] <= gap <= p["error_bytes"] + bound,
              f"point {k}: gap {gap}")


def test_gigabyte_through_glibc():
    with Server() as s:
        w = Worker(worker("map"), s.env(LD_PRELOAD=GLIBC_LIB))
        try:
            check(w.readline().startswith("ready"), "worker ready")
            w.send("reserve 1")
            check(w.readline().startswith("ok"), "stdio set up")
            base = wait_for("registered", lambda: s.ps().get(w.pid))
            h0 = heap(base)
            w.send("malloc 1024 2")
            check(w.readline().startswith("ok"), "1 GiB allocated")
            held = wait_for("1 GiB counted", lambda: (lambda p: p if p and
                            heap(p) >= h0 + 1024 * MIB else None)(
                                s.ps().get(w.pid)))
            check(held["mapped"] == 0, f"glibc's mmaps not mapped: {held}")
            check(heap(held) <= h0 + 1030 * MIB, f"counted once: {held}")
            w.send("free")
            check(w.readline().startswith("ok"), "freed")
            after = wait_for("back", lambda: (lambda p: p if abs(
                heap(p) - h0) <= max(p["error_bytes"], 64 * 1024) else None)(
                    s.ps().get(w.pid)))
            print(f"  heap {h0} -> {heap(held) / MIB:.1f} MiB -> "
                  f"{heap(after)} (error bar {after['error_bytes']}), "
                  f"allocator free {held['allocator_free']} -> "
                  f"{after['allocator_free']}", flush=True)
            # The gigabyte glibc gave back is not left in the figure as
            # free memory: freed bytes count as glibc's until its next
            # sample (never below what the process holds), and from that
            # sample on the figure is what it holds.
            last = {}

            def no_ghost():
                p, anon = s.ps().get(w.pid), rss_anon(w.pid)
                last.update(p=p, anon=anon)
                return p if p and p["bytes"] <= anon + 4 * MIB else None
            try:
                wait_for("no ghost of the freed gigabyte", no_ghost,
                         timeout=10)
            except AssertionError:
                raise AssertionError(f"a ghost of the freed gigabyte: "
                                     f"{last['p']}, RssAnon {last['anon']}")
        finally:
            w.close()


def test_free_memory_glibc_keeps_is_counted():
    """A heap with holes: 128 MiB of 4 KiB blocks, every other one freed.
    glibc keeps the freed half (each free block sits between live ones),
    resident: memtally counts it as allocator_free, so the process's
    figure is what glibc holds (arena + hblkhd), not half of it, and
    follows RSS. When everything is freed, what was freed counts as
    glibc's until the next sample (glibc may keep it, resident: the figure
    never falls below RssAnon in between), and from that sample on the
    figure is what glibc holds, kept or given back."""
    with Server() as s:
        # Registered at its first flush, small and young as it is when
        # it says "ready": RssAnon's baseline is taken once it is listed.
        w = Worker([*worker("frag"), "128", "4096"],
                   s.env(LD_PRELOAD=GLIBC_LIB, MEMTALLY_REGISTER_MIN="0"))

        def report():
            w.send("report")
            words = w.readline().split()
            check(words[0] == "report", f"report: {words}")
            return tuple(int(x.split("=")[1]) for x in words[1:4])

        def figure_is(want, tol):
            # A sample happens at a flush once due: ask the worker to
            # flush until one has been taken and the server shows it.
            def seen():
                inuse, held, walk = report()
                p = s.ps().get(w.pid)
                t0 = s.status()["ticks"]
                wait_for("a tick", lambda: s.status()["ticks"] > t0 + 1)
                p = s.ps().get(w.pid)
                ok = p and abs(p["bytes"] - p["mapped"] - want(held)) <= tol
                return (p, inuse, held, walk) if ok else None
            return wait_for("the free memory sampled", seen, timeout=30)

        try:
            check(w.readline().startswith("ready"), "worker ready")
            wait_for("registered", lambda: s.ps().get(w.pid))
            anon0 = rss_anon(w.pid)
            w.send("frag")
            check(w.readline() == "fragmented", "fragmented")
            tol = 2 * MIB
            p, inuse, held, walk = figure_is(lambda held: held, tol)
            anon = rss_anon(w.pid) - anon0
            print(f"  fragmented: mallinfo2 in use {inuse / MIB:.1f} MiB, "
                  f"held {held / MIB:.1f} MiB (its walk {walk} us); "
                  f"memtally heap {heap(p) / MIB:.1f} MiB + allocator free "
                  f"{p['allocator_free'] / MIB:.1f} MiB = "
                  f"{(p['bytes'] - p['mapped']) / MIB:.1f} MiB; RssAnon grew "
                  f"{anon / MIB:.1f} MiB", flush=True)
            check(held - inuse >= 50 * MIB,
                  f"glibc keeps the holes: in use {inuse}, held {held}")
            check(abs(heap(p) - inuse) <= tol,
                  f"heap {heap(p)} vs in use {inuse}")
            check(p["allocator_free"] >= 50 * MIB, f"free counted: {p}")
            check(p["bytes"] >= 0.9 * anon,
                  f"figure {p['bytes']} vs RssAnon growth {anon}")
            w.send("free")
            check(w.readline() == "freed", "freed")
            # Before any new sample: the heap emptied, and what it freed
            # is counted as glibc's free memory, not as gone. The figure
            # first: RssAnon can only fall meanwhile (glibc trims).
            t0 = s.status()["ticks"]
            wait_for("a tick", lambda: s.status()["ticks"] > t0 + 1)
            now = s.ps()[w.pid]
            anon = rss_anon(w.pid) - anon0
            print(f"  freed, before a new sample: heap {heap(now)} B, "
                  f"allocator free {now['allocator_free']} B; RssAnon grew "
                  f"{anon / MIB:.1f} MiB", flush=True)
            check(heap(now) <= 2 * MIB, f"the heap emptied: {now}")
            check(now["bytes"] >= 0.9 * anon,
                  f"never below RssAnon before a new sample: {now}, "
                  f"RssAnon growth {anon}")
            p, inuse, held, walk = figure_is(lambda held: held, tol)
            print(f"  freed: glibc holds {held / MIB:.1f} MiB; memtally "
                  f"{(p['bytes'] - p['mapped']) / MIB:.1f} MiB", flush=True)
            # Whether glibc trims its heap here depends on its state (a
            # threaded process trimmed to 0.4 MiB, a single-threaded one
            # kept 64.7 MiB of the 128): either way the figure is what it
            # holds (figure_is, just above).
            print(f"  glibc {'gave the heap back' if held <= 16 * MIB else 'kept'}"
                  f" ({held / MIB:.1f} MiB held)", flush=True)
            w.send("exit")
        finally:
            w.close()


def test_an_untrusted_workers_trim_is_followed():
    """As nobody (its claims not trusted), a glibc worker with a heap of
    holes calls malloc_trim(): glibc gives the holes' pages back to the
    kernel, but its own figures (mallinfo2) do not move, so the sample
    does not either. The kernel's read bounds the free part, as for a
    trusted worker; before, the figure kept the phantom until the
    worker's untouched time, over its own limit meanwhile."""
    from harness import NOBODY, NOGROUP, config_file, open_to_nobody
    from harness import world_readable_copy
    lib, frag = world_readable_copy(GLIBC_LIB, worker("frag"))
    cfg = config_file("[server]\ngroup = 65534\n"
                      "[trust]\nuntouched_time = 1h\n")
    with Server("--config", cfg) as s:
        open_to_nobody(s)
        w = Worker([*frag, "128", "100"],
                   s.env(LD_PRELOAD=lib, MEMTALLY_REGISTER_MIN="0"),
                   user=(NOBODY, NOGROUP))
        try:
            check(w.readline().startswith("ready"), "worker ready")
            wait_for("registered", lambda: s.ps().get(w.pid))
            w.send("thin")
            check(w.readline() == "thinned", "thinned")
            w.send("report")
            check(w.readline().startswith("report"), "report")
            p = wait_for("the holes counted as glibc's", lambda: (
                lambda p: p if p and p["allocator_free"] >= 50 * MIB
                else None)(s.ps().get(w.pid)))
            before = p["bytes"]
            w.send("trim")
            check(w.readline() == "trimmed", "trimmed")
            anon = rss_anon(w.pid)
            check(anon <= before - 40 * MIB,
                  f"glibc gave nothing back: RssAnon {anon >> 20} MiB, "
                  f"figure {before >> 20} MiB")
            p = wait_for("the figure follows the kernel", lambda: (
                lambda p: p if p and p["bytes"] <= anon + 8 * MIB
                else None)(s.ps().get(w.pid)), timeout=30)
            print(f"  trimmed: figure {before >> 20} -> {p['bytes'] >> 20} "
                  f"MiB, RssAnon {anon >> 20} MiB", flush=True)
            w.send("exit")
        finally:
            w.close()


def test_free_memory_sampled_again_in_a_new_slot():
    """A server restarted without adoption (--reset) gives a worker a new
    slot, whose free-memory words are empty: the worker samples at its
    first flush there, not after the old slot's spacing."""
    first = Server()
    second = None
    w = Worker([*worker("frag"), "64", "4096"],
               first.env(LD_PRELOAD=GLIBC_LIB))
    try:
        check(w.readline().startswith("ready"), "worker ready")
        w.send("frag")
        check(w.readline() == "fragmented", "fragmented")

        def sampled():
            w.send("report")
            check(w.readline().startswith("report"), "report")
            p = first.ps().get(w.pid)
            return p if p and p["allocator_free"] >= 24 * MIB else None
        before = wait_for("free memory counted", sampled)
        first.kill9()
        second = Server("--reset", after=first)

        def registered_again():
            w.send("churn")
            check(w.readline() == "churned", "churned")
            return second.ps().get(w.pid)
        # The worker notices the old server is gone (its tick counter
        # stopped) only when it flushes: keep it busy until it registers.
        wait_for("registered with the new server", registered_again,
                 timeout=30, interval=0.2)
        # One more flush in the new slot is enough: no waiting out the
        # old slot's spacing (up to 2 s).
        t0 = second.status()["ticks"]
        w.send("churn")
        check(w.readline() == "churned", "churned")
        wait_for("two ticks", lambda: second.status()["ticks"] >= t0 + 2)
        p = second.ps()[w.pid]
        print(f"  old slot {before['allocator_free'] / MIB:.1f} MiB free, "
              f"new slot {p['allocator_free'] / MIB:.1f} MiB after one "
              f"flush", flush=True)
        check(p["allocator_free"] >= 24 * MIB,
              f"sampled in the new slot at once: {p}")
    finally:
        w.close()
        (second or first).stop()


def switched(lib, allocator):
    """Start mt_worker glibc (2 threads, 3 points) with LD_PRELOAD=lib and
    MEMTALLY_ALLOCATOR=allocator; return its ready line, its maps and its
    last ps entry."""
    with Server() as s:
        env = s.env(LD_PRELOAD=lib, MEMTALLY_ALLOCATOR=allocator,
                    GLIBC_TUNABLES="glibc.malloc.tcache_count=0")
        w = Worker([*worker("glibc"), "2", "3"], env)
        try:
            ready = w.readline()
            with open(f"/proc/{w.pid}/maps") as f:
                maps = f.read()
            for k in range(3):
                words = w.readline().split()
                check(words[:2] == ["point", str(k)],
                      f"the arguments survived: point {k}: {words}")
                w.send("go")
            check(w.readline().startswith("done"), "done after 3 points")
            p = wait_for("counted", lambda: s.ps().get(w.pid))
            w.send("exit")
        finally:
            w.close()
        return ready, maps, p


def test_allocator_variable_switches_the_front_end():
    ready, maps, p = switched(PRELOAD, "glibc")
    print(f"  jemalloc preload, MEMTALLY_ALLOCATOR=glibc: {ready.strip()}",
          flush=True)
    check("allocator=glibc" in ready and "usable100=104" in ready,
          f"not glibc: {ready}")
    check("libmemtally_glibc.so" in maps and "libjemalloc" not in maps,
          "the glibc front end, and no jemalloc, in the process")
    check(p["bytes"] > 0, f"counted: {p}")
    # The exec through /proc/self/exe must not rename the process "exe".
    check(p["comm"] == "mt_worker", f"the program keeps its name: {p}")
    ready, maps, p = switched(GLIBC_LIB, "jemalloc")
    print(f"  glibc preload, MEMTALLY_ALLOCATOR=jemalloc: {ready.strip()}",
          flush=True)
    check("allocator=jemalloc" in ready and "usable100=112" in ready,
          f"not jemalloc: {ready}")
    check("libmemtally_preload.so" in maps and
          "libmemtally_glibc.so" not in maps,
          "the jemalloc preload (jemalloc linked in) in the process")
    check(p["bytes"] > 0, f"counted: {p}")


PY_PROBE = r"""
import os, subprocess, sys
def front(maps):
    return ("glibc" if "libmemtally_glibc.so" in maps else
            "jemalloc" if "libmemtally_preload.so" in maps else "none")
# A child that is not python: the front end it gets, and whether the
# switch's marker reached it (it must not).
child = subprocess.run(["sh", "-c", "cat /proc/self/maps; "
                        "echo marker=${MEMTALLY_ALLOCATOR_SWITCHED:-none}"],
                       capture_output=True, text=True).stdout
held = [bytearray(1 << 20) for _ in range(64)]
print("front", front(open("/proc/self/maps").read()), sys.argv[1],
      "child", front(child), child.split("marker=")[1].strip(), flush=True)
sys.stdin.readline()
"""


def test_python_defaults_to_glibc():
    """A CPython interpreter under the jemalloc preload, with no variable
    set, keeps glibc's malloc (the glibc front end): what it has without
    memtally, at its speed; its children inherit it. MEMTALLY_ALLOCATOR=
    jemalloc still asks for jemalloc; a program that is not python is not
    switched."""
    import sys
    with Server() as s:
        for allocator, want in ((None, "glibc"), ("jemalloc", "jemalloc")):
            extra = {"MEMTALLY_ALLOCATOR": allocator} if allocator else {}
            env = s.env(LD_PRELOAD=PRELOAD, **extra)
            if not allocator:
                env.pop("MEMTALLY_ALLOCATOR", None)
                env.pop("MEMTALLY_ALLOCATOR_SWITCHED", None)
            w = Worker([sys.executable, "-c", PY_PROBE, "argv-kept"], env)
            try:
                line = w.readline(timeout=30)
                # The child (sh) inherits the front end its parent runs
                # on, and no marker: it could switch on its own variable.
                check(line == f"front {want} argv-kept child {want} none",
                      f"MEMTALLY_ALLOCATOR={allocator}: {line!r}")
                p = wait_for("counted", lambda: (lambda p: p if p and
                             p["bytes"] >= 64 * MIB else None)(
                                 s.ps().get(w.pid)))
                name = os.path.basename(sys.executable)[:15]
                check(p["comm"] == name, f"named {name}: {p}")
                print(f"  python3, MEMTALLY_ALLOCATOR={allocator}: {want}, "
                      f"{p['bytes'] / MIB:.1f} MiB counted", flush=True)
            finally:
                w.close()
        w = Worker([*worker("glibc"), "1", "1"],
                   s.env(LD_PRELOAD=PRELOAD))
        try:
            ready = w.readline()
            check("allocator=jemalloc" in ready,
                  f"a C worker stays on jemalloc: {ready}")
        finally:
            w.close()


PY_PARENT = r"""
import os, subprocess, sys
def front(maps):
    return ("glibc" if "libmemtally_glibc.so" in maps else
            "jemalloc" if "libmemtally_preload.so" in maps else "none")
def named(lp):
    names = [os.path.basename(t) for t in lp.replace(" ", ":").split(":")]
    return ("glibc" if "libmemtally_glibc.so" in names else
            "jemalloc" if "libmemtally_preload.so" in names else "none")
if sys.argv[1] == "child":
    held = bytearray(64 << 20)
    print(front(open("/proc/self/maps").read()),
          named(os.environ.get("LD_PRELOAD", "")), flush=True)
    sys.stdin.readline()
    sys.exit(0)
pipe = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
py = subprocess.Popen([sys.executable, "-c", sys.argv[2], "child"], **pipe)
c = subprocess.Popen([*sys.argv[3:], "64"], **pipe)
print("parent", front(open("/proc/self/maps").read()),
      named(os.environ.get("LD_PRELOAD", "")), flush=True)
print("python", py.pid, py.stdout.readline().strip(), flush=True)
print("c", c.pid, c.stdout.readline().strip(), flush=True)
sys.stdin.readline()
for p in (py, c):
    p.stdin.write("exit\n")
    p.stdin.close()
    p.wait()
"""


def front_of(pid):
    with open(f"/proc/{pid}/maps") as f:
        maps = f.read()
    return ("glibc" if "libmemtally_glibc.so" in maps else
            "jemalloc" if "libmemtally_preload.so" in maps else "none")


def preload_named(pid):
    """The front end /proc/PID/environ's LD_PRELOAD names."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0")
                   if b"=" in kv)
    names = [os.path.basename(t) for t in
             env.get(b"LD_PRELOAD", b"").replace(b" ", b":").split(b":")]
    return ("glibc" if b"libmemtally_glibc.so" in names else
            "jemalloc" if b"libmemtally_preload.so" in names else "none")


def test_python_children_run_on_the_front_end_their_environment_names():
    """python3 under the default preload moves onto the glibc front end;
    its environment says so, and its children inherit it: a child python3
    (no exec of its own) and a child C program (mt_worker hold) both run on the
    glibc front end, their LD_PRELOAD names it, and both are registered
    and counted for the 64 MiB they hold."""
    import sys
    with Server() as s:
        env = s.env(LD_PRELOAD=PRELOAD)
        for k in ("MEMTALLY_ALLOCATOR", "MEMTALLY_ALLOCATOR_SWITCHED"):
            env.pop(k, None)
        w = Worker([sys.executable, "-c", PY_PARENT, "parent", PY_PARENT,
                    *worker("hold")], env)
        try:
            lines = [w.readline(timeout=30).split() for _ in range(3)]
            print(f"  {lines}", flush=True)
            check(lines[0] == ["parent", "glibc", "glibc"],
                  f"the parent runs on glibc and its LD_PRELOAD says so: "
                  f"{lines[0]}")
            check(lines[1][0] == "python" and lines[1][2:] ==
                  ["glibc", "glibc"],
                  f"the child python3: front end and LD_PRELOAD: "
                  f"{lines[1]}")
            check(lines[2][0] == "c" and lines[2][2] == "ready",
                  f"the C child: {lines[2]}")
            kids = {"python3": int(lines[1][1]), "C": int(lines[2][1])}
            for name, pid in kids.items():
                run_on, named = front_of(pid), preload_named(pid)
                print(f"  {name} child {pid}: runs on {run_on}, "
                      f"LD_PRELOAD names {named}", flush=True)
                check(run_on == named == "glibc",
                      f"{name} child runs on {run_on}, its environment "
                      f"names {named}")
                p = wait_for(f"{name} child counted", lambda: (
                    lambda p: p if p and p["bytes"] >= 64 * MIB else None)(
                        s.ps().get(pid)))
                print(f"  {name} child: {p['bytes'] / MIB:.1f} MiB counted",
                      flush=True)
            w.send("done")
        finally:
            w.close()


ALIGNED = r"""
import ctypes
c = ctypes.CDLL(None, use_errno=True)
c.aligned_alloc.restype = ctypes.c_void_p
c.aligned_alloc.argtypes = (ctypes.c_size_t, ctypes.c_size_t)
out = []
for align in (0, 24, 64):
    ctypes.set_errno(0)
    p = c.aligned_alloc(align, 100)
    out.append("%d:%s:%d" % (align, "ok" if p else "null", ctypes.get_errno()))
print(" ".join(out))
"""


def test_aligned_alloc_as_the_hosts_glibc():
    """aligned_alloc with an alignment C11 refuses: what the host's glibc
    does (before 2.38 it takes any, as memalign), with memtally or not."""
    import sys
    with Server() as s:
        env = s.env(LD_PRELOAD=GLIBC_LIB)
        plain = dict(env)
        plain.pop("LD_PRELOAD")
        got = [subprocess.run([sys.executable, "-c", ALIGNED], env=e,
                              capture_output=True, text=True, timeout=60)
               for e in (plain, env)]
        for g in got:
            check(g.returncode == 0, f"exit {g.returncode}: {g.stderr}")
        print(f"  aligned_alloc: glibc {got[0].stdout.strip()}; "
              f"glibc front end {got[1].stdout.strip()}")
        check(got[0].stdout == got[1].stdout,
              f"glibc: {got[0].stdout!r}, front end: {got[1].stdout!r}")


def test_disabled_means_no_switch():
    """MEMTALLY_DISABLE=1: a python under the jemalloc preload runs as it
    was started, with no exec to the glibc front end."""
    import sys
    with Server() as s:
        env = s.env(LD_PRELOAD=PRELOAD, MEMTALLY_DISABLE="1")
        env.pop("MEMTALLY_ALLOCATOR", None)
        out = subprocess.run(
            [sys.executable, "-c", "import os; print(open('/proc/self/maps')"
             ".read()); print('pid', os.getpid())"],
            env=env, capture_output=True, text=True, timeout=60)
        check(out.returncode == 0, f"exit {out.returncode}: {out.stderr}")
        check("libmemtally_preload.so" in out.stdout and
              "libmemtally_glibc.so" not in out.stdout,
              "switched although disabled")


if __name__ == "__main__":
    run([test_counted_as_glibc_counts, test_thread_caches_are_the_only_gap,
         test_gigabyte_through_glibc,
         test_free_memory_glibc_keeps_is_counted,
         test_an_untrusted_workers_trim_is_followed,
         test_free_memory_sampled_again_in_a_new_slot,
         test_allocator_variable_switches_the_front_end,
         test_python_defaults_to_glibc,
         test_python_children_run_on_the_front_end_their_environment_names,
         test_disabled_means_no_switch,
         test_aligned_alloc_as_the_hosts_glibc])
