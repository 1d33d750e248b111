"""Do no harm: nothing one worker does to memtally's shared memory reaches
another uid's worker or the server, nothing pre-created or forged is adopted
or signalled, and memtallyd fits many workers under a service's default
open-files limit.

- An attacker worker (as root, and as nobody) tries to truncate, grow,
  punch and write every memtally object it holds a mapping of: through the
  descriptors it can reopen (/proc/self/map_files, root only), mprotect,
  and /proc/self/mem over every mapping. Only its own uid's slot table is
  writable; the header never is, and nothing can be resized. Meanwhile
  memtallyd and a worker of the other uid holding 64 MiB run on, that
  worker's figure unchanged; a new worker registers afterwards.
- A process of another uid cannot reach a root worker's table (map_files,
  /proc/PID/mem, the server's descriptors) and is handed only its own.
- A restart record pre-created by another user (mode 0666, naming an
  unrelated live process) is refused; a worker that writes another
  process's pid into its slot does not get that process adopted after a
  restart; enforcement signals only processes that registered.
- 1,500 workers register when memtallyd starts with a soft open-files
  limit of 1024, as under systemd.
"""
import json
import os
import re
import resource
import signal
import struct
import subprocess
import sys
import tempfile
import time

from harness import (as_user, MIB, MULT, NOBODY, NOGROUP, PRELOAD, Server, Skip,
                     settled_bytes,
                     Worker, check, open_to_nobody, run, wait_for,
                     WORKER, world_readable_copy)
from harness import config_file as config

# Workers run as nobody too: they and the preload come from copies every
# user can reach (the build tree may be in a 0700 directory).
PUB_WORKER, PUB_PRELOAD = world_readable_copy(WORKER, PRELOAD)


def worker(name):
    assert name == "hold", name
    return [PUB_WORKER, name]


def wenv(s, group):
    # A worker's figure is its heap alone: the allocator's free memory is
    # a sample taken on the worker's own clock (every 10 s), which may land
    # between two readings of a figure that must not change.
    e = s.env(group=group, MEMTALLY_ALLOCATOR_FREE="0")
    e["LD_PRELOAD"] = PUB_PRELOAD
    return e

ROOT = (0, 0)
USER = (NOBODY, NOGROUP)

# Run under the preload, as root or nobody: report what of memtally's shared
# memory it could change, then allocate on and report again.
ATTACKER = r'''
import ctypes, json, mmap, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
PROT_READ, PROT_WRITE = 1, 2
FALLOC_PUNCH = 0x02 | 0x01  # PUNCH_HOLE | KEEP_SIZE
hold = [bytearray(1 << 20) for _ in range(4)]  # allocate: attach

def mappings():
    out = []
    for line in open("/proc/self/maps"):
        f = line.split()
        if len(f) >= 6 and f[5].startswith("/memfd:"):
            lo, hi = (int(x, 16) for x in f[0].split("-"))
            out.append((f[0], lo, hi, f[1], f[5]))
    return out

deadline = time.monotonic() + 20
while len(mappings()) < 2 and time.monotonic() < deadline:
    hold.append(bytearray(1 << 20))
    time.sleep(0.02)
maps = mappings()
report = {"uid": os.getuid(), "mappings": [], "writes": {}}

def tried(kind, what, fn):
    try:
        fn()
        ok = True
    except OSError:
        ok = False
    report["writes"].setdefault(kind, {})[what] = \
        report["writes"].get(kind, {}).get(what, False) or ok

for rng, lo, hi, perms, path in maps:
    kind = "table" if "-slots:" in path else "header"
    report["mappings"].append({"kind": kind, "perms": perms, "path": path})
    size = hi - lo
    fds = []
    for mode in (os.O_RDWR, os.O_RDONLY):
        try:
            fds.append(os.open("/proc/self/map_files/" + rng, mode))
        except OSError:
            pass
    for fd in fds:
        tried(kind, "truncate", lambda: os.ftruncate(fd, 0))
        tried(kind, "grow", lambda: os.ftruncate(fd, size * 4))
        def punch():
            if libc.fallocate(fd, FALLOC_PUNCH, ctypes.c_long(0),
                              ctypes.c_long(size)) != 0:
                raise OSError(ctypes.get_errno(), "fallocate")
        tried(kind, "punch", punch)
        tried(kind, "pwrite", lambda: os.pwrite(fd, os.urandom(64), 0))
        def map_write():
            m = mmap.mmap(fd, 4096, mmap.MAP_SHARED,
                          mmap.PROT_READ | mmap.PROT_WRITE)
            m[0:64] = os.urandom(64)
            m.close()
        tried(kind, "map_write", map_write)
        path_rw = "/proc/self/fd/%d" % fd
        def reopen_write():
            g = os.open(path_rw, os.O_RDWR)
            try:
                os.pwrite(g, os.urandom(64), 0)
            finally:
                os.close(g)
        tried(kind, "reopen_write", reopen_write)
        os.close(fd)
    report.setdefault("descriptors", 0)
    report["descriptors"] += len(fds)
    def protect():
        if libc.mprotect(ctypes.c_void_p(lo), ctypes.c_size_t(size),
                         PROT_READ | PROT_WRITE) != 0:
            raise OSError(ctypes.get_errno(), "mprotect")
    tried(kind, "mprotect", protect if "w" not in perms else
          (lambda: (_ for _ in ()).throw(OSError("already writable"))))
    def scribble():
        with open("/proc/self/mem", "r+b", buffering=0) as m:
            m.seek(lo)
            m.write(os.urandom(size))
    tried(kind, "mem_write", scribble)
print(json.dumps(report), flush=True)
# Go on living as a worker does: allocate and free, flush, exit cleanly.
for i in range(200):
    hold.append(bytearray(256 << 10))
    if len(hold) > 16:
        del hold[:8]
print("alive", flush=True)
sys.stdin.readline()
'''


def start(user, env, argv):
    w = Worker(argv, env, user=user)
    return w


def attack(s, attacker_user, victim_user):
    victim = start(victim_user, wenv(s, "victim"),
                   [*worker("hold"), "64"])
    attacker = None
    try:
        check(victim.readline().startswith("ready"), "victim did not start")
        wait_for("victim counted",
                 lambda: s.ps().get(victim.pid, {}).get("bytes", 0)
                 >= 64 * MIB)
        before = settled_bytes(s, victim.pid)
        attacker = start(attacker_user, wenv(s, "attacker"),
                         [sys.executable, "-c", ATTACKER])
        rep = json.loads(attacker.readline(timeout=60))
        check(attacker.readline(timeout=60) == "alive",
              "the attacker itself did not survive its scribbling")
        kinds = {m["kind"] for m in rep["mappings"]}
        check(kinds == {"header", "table"},
              f"attacker mapped {rep['mappings']}")
        for m in rep["mappings"]:
            if m["kind"] == "header":
                check("w" not in m["perms"], f"header mapped {m['perms']}")
            else:
                check(m["path"].split(":")[-1].startswith(
                    str(attacker_user[0])),
                      f"a table of another uid was handed out: {m}")
        w = rep["writes"]
        # The header: nothing at all may write or resize it.
        for what, ok in w.get("header", {}).items():
            check(not ok, f"the attacker could {what} the header")
        # Its own uid's table: writable (by design), never resizable.
        for what in ("truncate", "grow"):
            check(not w.get("table", {}).get(what, False),
                  f"the attacker could {what} its table")
        check(w["table"]["mem_write"], "scribbling its own table failed: "
              "the attack did not really run")
        if attacker_user == ROOT:
            check(rep["descriptors"] >= 2,
                  "root could not reopen its mappings: the descriptor "
                  "attacks did not run")
            check(not w["header"]["truncate"] and not w["header"]["pwrite"],
                  "header writable through a descriptor")
        # memtallyd is up, the other uid's figure is untouched.
        check(s.proc.poll() is None, "memtallyd died: " + s.logtext())
        after = s.ps()[victim.pid]["bytes"]
        check(after == before,
              f"victim's figure changed: {before} -> {after}")
        check(after >= 64 * MIB, f"victim counted {after}")
        # A new worker of the victim's uid registers and is counted.
        fresh = start(victim_user, wenv(s, "fresh"),
                      [*worker("hold"), "8"])
        try:
            check(fresh.readline().startswith("ready"), "new worker did not start")
            wait_for("a new worker counted after the attack",
                     lambda: s.ps().get(fresh.pid, {}).get("bytes", 0)
                     >= 8 * MIB)
        finally:
            fresh.close()
        return rep
    finally:
        if attacker:
            attacker.close()
        victim.close()


def test_scribbling_worker_harms_nobody():
    conf = config("[server]\ngroup = 65534\n")
    with Server("--config", conf) as s:
        open_to_nobody(s)
        attack(s, ROOT, USER)
        attack(s, USER, ROOT)
        check(s.proc.poll() is None, "memtallyd died")


# Run as nobody beside a root worker: every way into root's figures fails.
# The paths to try come from the root parent: nobody cannot even list them.
PROBE = r'''
import json, os, sys
pid = int(sys.argv[1])
targets = json.loads(sys.argv[2])
res = {}
def tried(what, fn):
    try:
        fn()
        ok = True
    except OSError:
        ok = False
    res[what] = res.get(what, False) or ok
for path in targets["map_files"]:
    tried("map_files", lambda: os.open(path, os.O_RDWR))
    tried("map_files", lambda: os.open(path, os.O_RDONLY))
tried("mem", lambda: open("/proc/%d/mem" % pid, "r+b"))
for path in targets["server_fds"]:
    tried("server_fd", lambda: os.open(path, os.O_RDWR))
    tried("server_fd", lambda: os.open(path, os.O_RDONLY))
tried("dev_shm", lambda: [os.open("/dev/shm/" + n, os.O_RDWR)
                          for n in os.listdir("/dev/shm") if "memtally" in n
                          or n.startswith("mt-")] or (_ for _ in ()).throw(
                              OSError("no segment in /dev/shm")))
print(json.dumps(res), flush=True)
'''


def test_another_uid_cannot_reach_roots_figures():
    conf = config("[server]\ngroup = 65534\n")
    with Server("--config", conf) as s:
        open_to_nobody(s)
        w = Worker([*worker("hold"), "32"], wenv(s, "root"))
        try:
            check(w.readline().startswith("ready"), "root worker did not start")
            wait_for("root worker counted",
                     lambda: s.ps().get(w.pid, {}).get("bytes", 0)
                     >= 32 * MIB)
            before = settled_bytes(s, w.pid)

            pre = as_user((NOBODY, NOGROUP))
            # What nobody will try: the worker's table mapping and every
            # descriptor memtallyd holds (its header and tables among
            # them). Root can list them; the test makes sure there is
            # something real to try, so the refusals below mean something.
            tables = [ln.split()[0] for ln in open(f"/proc/{w.pid}/maps")
                      if "-slots:" in ln]
            check(tables, "the root worker maps no slot table")
            fd_dir = f"/proc/{s.proc.pid}/fd"
            server_fds = [os.path.join(fd_dir, f) for f in os.listdir(fd_dir)
                          if "memfd:" in os.readlink(os.path.join(fd_dir, f))]
            check(len(server_fds) >= 2,
                  f"memtallyd holds {len(server_fds)} memfds, want >= 2")
            targets = {"map_files": [f"/proc/{w.pid}/map_files/{r}"
                                     for r in tables],
                       "server_fds": server_fds}
            out = subprocess.run(
                [sys.executable, "-c", PROBE, str(w.pid), json.dumps(targets)],
                capture_output=True, text=True, timeout=60 * MULT,
                preexec_fn=pre)
            check(out.returncode == 0, f"probe failed: {out.stderr}")
            res = json.loads(out.stdout)
            for what in ("map_files", "mem", "server_fd", "dev_shm"):
                check(not res.get(what, False),
                      f"nobody could open root's {what}: {res}")
            check(s.ps()[w.pid]["bytes"] == before, "figure changed")
        finally:
            w.close()


# ---- restart: nothing pre-created, nothing forged ----------------------

STATE_MAGIC = 0x3174617453544D4D
REC_CHECK = 0x6D656D74616C6C79
STATE_VERSION = 2   # server/state.c
STATE_REC = 1024    # MTS_STATE_REC_SIZE


def starttime(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def forged_state(victim_pid, slots=4096, lanes=4):
    """A restart record in memtallyd's format naming victim_pid in slot 0."""
    hdr = struct.pack("<QIIIIQQ", STATE_MAGIC, STATE_VERSION, slots, lanes,
                      0, 65536, 0x1234)
    page = hdr + bytes(4096 - len(hdr))
    rec = struct.pack("<IIQQQQQ", victim_pid, 0, starttime(victim_pid), 1, 1,
                      1, REC_CHECK ^ (victim_pid << 32) ^ 0)
    rec += b"forged".ljust(256, b"\0") + bytes(256)
    rec += bytes(STATE_REC - len(rec))
    return page + rec + bytes(STATE_REC * (slots - 1))


ENFORCE = ("[server]\ngroup = 65534\n[limits]\nfleet = 1MiB\n"
           "process = 1MiB\n[enforce]\nsignal = SIGKILL\ngrace = 0\n")


def bystander():
    """A live process that never registers (no preload)."""
    return subprocess.Popen(["sleep", "600"])


def test_precreated_state_file_is_refused():
    victim = bystander()
    d = tempfile.mkdtemp(prefix="mt-iso-")
    os.chmod(d, 0o1777)  # like /tmp: anyone may create files here
    state = os.path.join(d, "memtally.state")
    # Another user creates the record first, world-writable, naming a
    # process memtallyd never saw; enforcement would kill it if adopted.
    with open(state, "wb") as f:
        f.write(forged_state(victim.pid))
    os.chown(state, NOBODY, NOGROUP)
    os.chmod(state, 0o666)
    conf = config(ENFORCE)
    s = None
    try:
        s = Server("--config", conf, "--state", state)
        log = s.logtext()
        check("state file refused" in log, "no refusal logged:\n" + log)
        check(victim.pid not in s.ps(), "a forged record was adopted")
        st = os.stat(state)
        check(st.st_uid == 0 and st.st_mode & 0o777 == 0o600,
              f"record not replaced by one of our own: "
              f"uid {st.st_uid} mode {st.st_mode & 0o777:o}")
        # Positive control: enforcement is live and kills a registered
        # worker over its limit...
        w = Worker([*worker("hold"), "8"], wenv(s, "over"))
        try:
            w.readline()
        except AssertionError:
            pass  # signalled before it could say "ready": counted at once
        wait_for("the registered worker over its limit is signalled",
                 lambda: w.proc.poll() == -signal.SIGKILL, timeout=30)
        # ... and the bystander lives on.
        check(victim.poll() is None, "an unregistered process was signalled")
    finally:
        if s:
            s.stop()
        victim.kill()
        victim.wait()


def find_own_slot(pid):
    """(mapping of pid's table, offset of its slot) through map_files."""
    import mmap
    for line in open(f"/proc/{pid}/maps"):
        f = line.split()
        if len(f) >= 6 and "-slots:" in f[5]:
            fd = os.open(f"/proc/{pid}/map_files/{f[0]}", os.O_RDWR)
            size = os.fstat(fd).st_size
            m = mmap.mmap(fd, size)
            os.close(fd)
            stride = 4 * 128
            for off in range(0, size, stride):
                if struct.unpack_from("<I", m, off)[0] == pid:
                    return m, off
            m.close()
    return None


def test_a_symlinked_state_file_is_refused_and_said():
    """A symlink where the record goes (to a record naming a live process
    that never registered) is never followed: it is replaced, and the log
    says why, as for every other file memtallyd did not make."""
    victim = bystander()
    d = tempfile.mkdtemp(prefix="mt-iso-")
    target = os.path.join(d, "elsewhere")
    with open(target, "wb") as f:
        f.write(forged_state(victim.pid))
    os.chmod(target, 0o600)
    state = os.path.join(d, "memtally.state")
    os.symlink(target, state)
    s = None
    try:
        s = Server("--state", state)
        log = s.logtext()
        check('state file refused, not adopting it' in log and
              'why="a symlink"' in log, "no refusal logged:\n" + log)
        check(victim.pid not in s.ps(), "the symlinked record was adopted")
        check(not os.path.islink(state) and os.path.isfile(state),
              "the symlink is still there")
    finally:
        if s:
            s.stop()
        victim.kill()
        victim.wait()


def test_forged_slot_is_not_adopted():
    victim = bystander()
    conf = config("[server]\ngroup = 65534\n")
    first = Server("--config", conf)
    w = Worker([*worker("hold"), "16"], wenv(first, "liar"))
    second = third = None
    try:
        check(w.readline().startswith("ready"), "worker did not start")
        wait_for("worker counted",
                 lambda: first.ps().get(w.pid, {}).get("bytes", 0)
                 >= 16 * MIB)
        # The worker (its uid may write its table) claims to be the
        # bystander: pid and start time in its slot's identity.
        found = wait_for("its slot", lambda: find_own_slot(w.pid))
        m, off = found
        struct.pack_into("<II", m, off, victim.pid, 0)
        struct.pack_into("<Q", m, off + 16, starttime(victim.pid))
        first.kill9()
        # A new server with enforcement on: it adopts the worker that
        # registered (from its own record), not the pid the slot claims.
        with open(conf, "w") as f:
            f.write(ENFORCE)
        second = Server("--config", conf, after=first)
        # Enforcement (grace 0) may signal the adopted worker before a
        # query sees it: what was adopted is read from the server's log.
        log = wait_for("adoption logged", lambda: (
            lambda t: t if "restart: live workers adopted" in t else None)(
                second.logtext()))
        adopted = [ln for ln in log.splitlines()
                   if 'msg="worker adopted"' in ln]
        check(len(adopted) == 1 and f" pid={w.pid} " in adopted[0] and
              'group="liar"' in adopted[0],
              f"adopted {adopted}, want only pid {w.pid}")
        check(f"pid={victim.pid} " not in log,
              "the bystander's pid appears in the new server's log")
        wait_for("the registered worker over its limit is signalled",
                 lambda: w.proc.poll() is not None, timeout=30)
        check(victim.poll() is None, "the bystander was signalled")
    finally:
        w.close()
        for s in (second, third):
            if s:
                s.stop()
        if not second:
            first.stop()
        victim.kill()
        victim.wait()


def test_two_uids_naming_one_slot_index_free_it_once():
    """Slot indices are the fleet's, the tables each uid's. After a
    restart, two uids' tables each name, at the same index, a live process
    of their own the restart did not adopt (each uid may write its own
    table). Both are held; the index goes back on the free stack once,
    when the last hold ends. Pushed twice, it was handed to two workers at
    once, and memtallyd crashed when one of them exited."""
    conf = config("[server]\ngroup = 65534\n")
    first = Server("--config", conf)
    open_to_nobody(first)
    users = [(NOBODY, NOGROUP), (1, NOGROUP)]  # nobody, daemon
    ws, xs, fresh = [], [], []
    second = None
    try:
        for u in users:
            w = Worker([*worker("hold"), "4"], wenv(first, "iso"), user=u)
            check(w.readline().startswith("ready"), "worker did not start")
            ws.append(w)
            wait_for("worker counted", lambda: first.ps().get(
                w.pid, {}).get("bytes", 0) >= 4 * MIB)
            xs.append(subprocess.Popen(["sleep", "600"],
                                       preexec_fn=as_user(u)))
        used = set()
        maps = []
        for w in ws:
            m, off = wait_for("its slot", lambda: find_own_slot(w.pid))
            used.add(off // 512)
            maps.append(m)
        j = max(used) + 3  # in the same page: a free index in both tables
        for m, x, u in zip(maps, xs, users):
            struct.pack_into("<Q", m, j * 512 + 16, starttime(x.pid))
            struct.pack_into("<II", m, j * 512, x.pid, u[0])
            m.close()
        first.stop()
        second = Server("--config", conf, after=first)
        held = wait_for("both holds", lambda: (
            lambda t: t if t.count(f'msg="slot held for a live worker not '
                                   f'adopted"') >= 2 else None)(
                second.logtext()))
        check(held.count(f" slot={j}") >= 2, f"holds not at slot {j}")
        for x in xs:
            x.kill()
            x.wait()
        # Gone: both holds end at the next look (once a second).
        wait_for("both holds ended", lambda: second.logtext().count(
            'msg="slot hold ended"') >= 2)
        st = second.status()
        check(st["slots_free"] == st["slots"] - st["processes"],
              f"{st['slots_free']} slots free of {st['slots']} with "
              f"{st['processes']} workers: an index on the stack twice")
        for u in users:
            w = Worker([*worker("hold"), "2"], wenv(second, "new"), user=u)
            check(w.readline().startswith("ready"), "new worker")
            fresh.append(w)
        wait_for("the new workers registered", lambda: all(
            w.pid in second.ps() for w in fresh))
        got = re.findall(r'msg="worker registered" pid=(\d+) uid=\d+ '
                         r'slot=(\d+)', second.logtext())
        slots = {int(p): int(sl) for p, sl in got
                 if int(p) in (fresh[0].pid, fresh[1].pid)}
        check(len(set(slots.values())) == 2,
              f"two workers given one slot: {slots}")
        fresh[0].close()
        wait_for("the first gone", lambda: fresh[0].pid not in second.ps())
        ps = second.ps()
        check(second.proc.poll() is None, "memtallyd died")
        check(fresh[1].pid in ps and ps[fresh[1].pid]["bytes"] >= 2 * MIB,
              f"the other not counted: {ps.get(fresh[1].pid)}")
    finally:
        for w in ws + fresh:
            w.close()
        for x in xs:
            if x.poll() is None:
                x.kill()
                x.wait()
        (second or first).stop()


# ---- many workers under the default open-files limit -------------------

def test_many_workers_under_default_fd_limit():
    n = int(os.environ.get("MT_ISOLATION_WORKERS", "1500"))
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < n + 1100:
        raise Skip(f"hard open-files limit {hard} is below {n + 1100}: "
                   "cannot show the soft limit being raised for {n} workers")
    s = Server(prefix=["prlimit", f"--nofile=1024:{hard}", "--"])
    r, wfd = os.pipe()
    procs = []
    try:
        with open(f"/proc/{s.proc.pid}/limits") as f:
            line = [x for x in f if x.startswith("Max open files")][0]
        soft = int(line.split()[3])
        check(soft >= n + 100, f"memtallyd kept a soft limit of {soft}")
        env = wenv(s, "many")
        t0 = time.monotonic()
        for i in range(n):
            procs.append(subprocess.Popen(
                [*worker("hold"), "0"], env=env, stdin=r,
                stdout=subprocess.DEVNULL))
        os.close(r)
        r = -1
        wait_for(f"{n} workers registered",
                 lambda: s.status()["processes"] >= n, timeout=300)
        st = s.status()
        check(st["processes"] == n, f"{st['processes']} registered")
        check(st.get("unregistered", 0) == 0,
              f"{st.get('unregistered')} unregistered")
        check(s.proc.poll() is None, "memtallyd died")
        print(f"  {n} workers registered in {time.monotonic() - t0:.1f}s "
              f"(memtallyd soft limit {soft})")
    finally:
        os.close(wfd)  # EOF: every worker exits
        if r >= 0:
            os.close(r)
        for p in procs:
            try:
                p.wait(timeout=60 * MULT)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        wait_for("all gone", lambda: s.status()["processes"] == 0,
                 timeout=120)
        s.stop()


if __name__ == "__main__":
    run([test_scribbling_worker_harms_nobody,
         test_another_uid_cannot_reach_roots_figures,
         test_precreated_state_file_is_refused,
         test_a_symlinked_state_file_is_refused_and_said,
         test_forged_slot_is_not_adopted,
         test_two_uids_naming_one_slot_index_free_it_once,
         test_many_workers_under_default_fd_limit])
