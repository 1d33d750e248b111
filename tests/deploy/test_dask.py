"""memtally.dask with a real Dask scheduler and two real Dask workers
(processes): two "nodes" (a memtallyd each, 64 MiB fleet limit), one worker
per node pointed at its node's memtallyd (MEMTALLY_SOCKET), the plugin
registered from the client. With node A over budget, A's worker is paused
and every task runs on B, each exactly once; with A back under and B
without room for a task, B's worker denies and reschedules, and every task
runs on A; with A's memtallyd gone (and B over), A's worker runs tasks
anyway (fail open).

In-process tasks, one worker under memtally's preload: a task holding
memory in its worker has its reservation fall as the worker grows (not
counted twice); a task larger than the fleet limit fails at once, naming
the figures; a task without `memtally_bytes` is admitted as its key's
prefix, on that kind's size. A task waiting for room: cancelled, it
never runs; the plugin registered again, it runs; memtallyd restarted,
it waits on. A long key makes a task name a worker's MEMTALLY_TASK
keeps. A task whose settings memtally does not take (a bad group name,
size or TTL) runs without admission and the worker's log says which.
Environment: as for the integration tests, and
MEMTALLY_SOURCE_DIR.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from harness import (MULT, Server, Skip, Worker, check, run, wait_for,
                     worker)

SRC = os.environ["MEMTALLY_SOURCE_DIR"]


def need_distributed():
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise Skip(f"python3-distributed not installed for {sys.executable} "
                   "(apt-get install python3-distributed)")


def work(i, ledger):
    """A task: note which node ran it (each line written in one append)."""
    import dask.distributed
    key = dask.distributed.get_worker().get_current_task()
    node = os.environ["MT_NODE"]
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps([key, node, i]) + "\n").encode())
    finally:
        os.close(fd)
    return node


class Proc:
    def __init__(self, tmp, name, argv, env):
        self.name = name
        self.logpath = os.path.join(tmp, f"{name}.log")
        self.log = open(self.logpath, "w+")
        self.proc = subprocess.Popen(argv, env=env, cwd=tmp, stdout=self.log,
                                     stderr=subprocess.STDOUT)

    def text(self):
        with open(self.logpath) as f:
            return f.read()

    def alive(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited: {self.text()[-3000:]}")
        return True

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30 * MULT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def hold(nbytes, gate, started):
    """A task holding `nbytes` in its worker process (touched, so that
    every measure sees it) until the file `gate` exists."""
    open(started, "w").close()
    buf = b"\1" * nbytes
    while not os.path.exists(gate):
        time.sleep(0.05)
    return len(buf)


def plain_env():
    """The scheduler's and workers' environment: this package on the path,
    no preload (a test that wants one adds it)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(SRC, "python"), env.get("PYTHONPATH", "")])
    env.pop("LD_PRELOAD", None)
    return env


def start_scheduler(tmp, env, procs):
    sched_file = os.path.join(tmp, "scheduler.json")
    procs.append(Proc(tmp, "scheduler", [
        sys.executable, "-m", "distributed.cli.dask_scheduler",
        "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
        "--scheduler-file", sched_file], env))
    wait_for("scheduler file", lambda: procs[-1].alive()
             and os.path.exists(sched_file), timeout=30)
    return sched_file


def start_worker(tmp, name, sched_file, env, procs, nthreads=1):
    procs.append(Proc(tmp, f"worker-{name}", [
        sys.executable, "-m", "distributed.cli.dask_worker",
        "--scheduler-file", sched_file, "--name", name,
        "--nthreads", str(nthreads), "--no-nanny", "--no-dashboard"], env))
    return procs[-1]


def statuses(client):
    """The scheduler's view: worker name -> status (running, paused)."""
    return client.run_on_scheduler(lambda dask_scheduler: {
        ws.name: ws.status.name for ws in dask_scheduler.workers.values()})


def ledger_of(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def kinds_of(srv):
    """memtally kinds --json, by kind name."""
    return {k["kind"]: k for k in srv.cli("kinds")["kinds"]}


def run_batch(client, ledger, first, n, nbytes):
    import dask
    with dask.annotate(memtally_bytes=nbytes):
        futs = client.map(work, range(first, first + n), ledger=ledger,
                          pure=False)
    nodes = client.gather(futs, errors="raise")
    keys = [f.key for f in futs]
    ran = [r for r in ledger_of(ledger) if r[2] >= first]
    # Each task's body ran exactly once, where its result says.
    check(sorted(r[0] for r in ran) == sorted(keys),
          f"ran {ran}, submitted {keys}")
    check(sorted(r[1] for r in ran) == sorted(nodes), f"{ran} vs {nodes}")
    return set(nodes)


def test_two_nodes():
    need_distributed()
    from distributed import Client
    sys.path.insert(0, os.path.join(SRC, "python"))
    import memtally.dask

    tmp = tempfile.mkdtemp(prefix="mt-dask-")
    ledger = os.path.join(tmp, "ledger")
    env = plain_env()
    procs, hogs, client = [], [], None
    try:
        with Server("--fleet-limit", "64MiB") as a, \
                Server("--fleet-limit", "64MiB") as b:
            sched_file = start_scheduler(tmp, env, procs)
            for node, srv in (("A", a), ("B", b)):
                start_worker(tmp, node, sched_file, dict(
                    env, MT_NODE=node, MEMTALLY_SOCKET=srv.socket), procs)
            client = Client(scheduler_file=sched_file, timeout=30 * MULT)
            client.wait_for_workers(2, timeout=60 * MULT)
            # wait=0: a denied task goes back to the scheduler at once
            # (the in-thread wait is test_in_process's).
            client.register_worker_plugin(
                memtally.dask.Admission(interval=0.1, pause=1.0, wait=0))
            wA, wB = procs[1], procs[2]
            wait_for("plugin on both workers", lambda: all(
                "memtally: admitting" in w.text() for w in (wA, wB)),
                timeout=30)

            # Node A over budget: 80 MiB held against 64 MiB. A's worker
            # pauses; every task runs on B, and A never even asks.
            hog_a = Worker([*worker("hold"), "80"], a.env(group="hog"))
            hogs.append(hog_a)
            check(hog_a.readline().startswith("ready"), "hog not ready")
            wait_for("node A over", lambda: a.status()["fleet"]["state"] == "over")
            wait_for("A paused", lambda: statuses(client)
                     == {"A": "paused", "B": "running"}, timeout=20)
            nodes = run_batch(client, ledger, 0, 10, "8MiB")
            check(nodes == {"B"}, f"nodes while A over: {nodes}")
            check("denied" not in wA.text(), "A took a task while over:\n"
                  + wA.text()[-3000:])
            check(statuses(client)["A"] == "paused", "A resumed while over")
            check(b.status()["fleet"]["reserved"] == 0, "reservations left on B")

            # A has room again; B has no room for a 32 MiB task (40 MiB
            # held of 64) but is not over: B's worker takes tasks, is
            # denied, hands them back, and every task runs on A.
            hog_a.send("free")
            check(hog_a.readline() == "freed", "hog did not free")
            wait_for("node A ok", lambda: a.status()["fleet"]["state"] == "ok")
            wait_for("A running", lambda: statuses(client)["A"] == "running",
                     timeout=20)
            hog_b = Worker([*worker("hold"), "40"], b.env(group="hog"))
            hogs.append(hog_b)
            check(hog_b.readline().startswith("ready"), "hog not ready")
            wait_for("B counts its hog",
                     lambda: b.status()["fleet"]["bytes"] >= 40 << 20)
            check(b.status()["fleet"]["state"] != "over", "B over")
            nodes = run_batch(client, ledger, 100, 10, "32MiB")
            check(nodes == {"A"}, f"nodes once A had room and B had none: {nodes}")
            denied_b = wB.text().count("denied on")
            check(denied_b >= 1, "B never took (and handed back) a task:\n"
                  + wB.text()[-3000:])
            check(a.status()["fleet"]["reserved"] == 0
                  and b.status()["fleet"]["reserved"] == 0,
                  "reservations left behind")

            # Fail open: B over (another 40 MiB: 80 of 64), A's memtallyd
            # gone. A's worker runs every task without asking, and says
            # once that it does.
            hog_b2 = Worker([*worker("hold"), "40"], b.env(group="hog"))
            hogs.append(hog_b2)
            check(hog_b2.readline().startswith("ready"), "hog not ready")
            wait_for("node B over", lambda: b.status()["fleet"]["state"] == "over")
            wait_for("B paused", lambda: statuses(client)["B"] == "paused",
                     timeout=20)
            a.stop()
            nodes = run_batch(client, ledger, 200, 6, "32MiB")
            check(nodes == {"A"}, f"nodes with A's memtallyd gone: {nodes}")
            check(wA.text().count("not reachable") == 1,
                  "A's worker did not say once that it runs without memtallyd:\n"
                  + wA.text()[-3000:])
            check(statuses(client)["A"] == "running", "A paused without memtallyd")
            print(f"B denied {denied_b} tasks while it had no room")
            for h in hogs:
                h.close()
            hogs = []
            client.close()
            client = None
    except BaseException:
        for p in procs:
            sys.stderr.write(f"---- {p.name} ----\n" + p.text()[-4000:])
        raise
    finally:
        for h in hogs:
            h.kill()
        if client is not None:
            client.close()
        for p in reversed(procs):
            p.stop()
    shutil.rmtree(tmp, ignore_errors=True)


MiB = 1 << 20


def test_in_process():
    need_distributed()
    import dask
    from distributed import Client
    sys.path.insert(0, os.path.join(SRC, "python"))
    import memtally.dask

    tmp = tempfile.mkdtemp(prefix="mt-dask-")
    env = plain_env()
    procs, client = [], None
    gate = os.path.join(tmp, "gate")
    try:
        # A lane for each thread a worker allocates on (its event loop,
        # Dask's and the plugin's pools, its task threads): what each
        # task's thread allocated is then the task's.
        with Server("--fleet-limit", "256MiB", "--lanes", "16") as srv:
            sched_file = start_scheduler(tmp, env, procs)
            # The worker process is memtally's worker: what its tasks
            # hold is counted as its own bytes.
            w = start_worker(tmp, "P", sched_file, srv.env(**{
                "PYTHONPATH": env["PYTHONPATH"]}), procs)
            client = Client(scheduler_file=sched_file, timeout=30 * MULT)
            client.wait_for_workers(1, timeout=60 * MULT)
            client.register_worker_plugin(
                memtally.dask.Admission(interval=0.1, pause=1.0))
            wait_for("plugin on the worker",
                     lambda: "memtally: admitting" in w.text(), timeout=30)
            pid = next(iter(client.run(os.getpid).values()))
            wait_for("worker registered", lambda: pid in srv.ps())

            def fleet():
                return srv.status()["fleet"]

            # A task declaring 96 MiB holds 64 MiB in its worker: the
            # worker's bytes show it, and the reservation falls by as
            # much (to about 32 MiB), where it counted 96 MiB on top.
            started = os.path.join(tmp, "started-1")
            with dask.annotate(memtally_bytes="96MiB"):
                f = client.submit(hold, 64 * MiB, gate, started, pure=False)
            wait_for("task started", lambda: os.path.exists(started),
                     timeout=30)
            wait_for("worker holds the task's 64 MiB",
                     lambda: srv.ps()[pid]["bytes"] >= 64 * MiB, timeout=30)
            wait_for("reservation follows the worker's growth",
                     lambda: fleet()["reserved"] <= 40 * MiB, timeout=20)
            f0 = fleet()
            check(f0["reserved"] >= 16 * MiB,
                  f"reservation fell below what the task has not used: {f0}")
            open(gate, "w").close()
            check(f.result(timeout=30) == 64 * MiB, "task result")
            wait_for("reservation released",
                     lambda: fleet()["reserved"] == 0, timeout=20)
            os.unlink(gate)
            # Its kind learned what it held in the worker, 64 MiB, not
            # its declaration: within what the worker freed meanwhile
            # (the worker's growth bounds the thread's figure) and the
            # interpreter's few pages.
            hold_kind = kinds_of(srv)["hold"]
            peak = hold_kind["last_peaks"][0]
            check(56 * MiB <= peak <= 72 * MiB,
                  f"kind hold learned {peak / MiB:.1f} MiB: {hold_kind}")

            # Larger than the fleet limit even on an empty node: fails at
            # once with the figures, its body never runs. (A kind of its
            # own: "hold" has a learned size now, and a declaration is
            # then only its ceiling.)
            started = os.path.join(tmp, "started-2")
            t0 = time.monotonic()
            with dask.annotate(memtally_bytes="512MiB"):
                f = client.submit(hold, MiB, gate, started, key="huge-1")
            err = f.exception(timeout=30 * MULT)
            took = time.monotonic() - t0
            check(err is not None and "NeverAdmitted" in type(err).__name__,
                  f"not failed as unadmittable: {err!r}")
            msg = str(err)
            check("512.0 MiB" in msg and "256.0 MiB" in msg
                  and "fleet limit" in msg, f"message: {msg}")
            check(not os.path.exists(started), "the body ran")
            check(sum("distributed.memtally - WARNING" in line
                      and "never be admitted" in line
                      for line in w.text().splitlines()) == 1,
                  "not tried once:\n" + w.text()[-3000:])
            print(f"unadmittable task failed in {took:.1f} s: {msg}")

            # No annotation: admitted as its key's prefix ("hold"), on
            # what that kind learned above (a kind with no history gets
            # [kinds] default_size: below).
            started = os.path.join(tmp, "started-3")
            f = client.submit(hold, 0, gate, started, pure=False)
            wait_for("task started", lambda: os.path.exists(started),
                     timeout=30)
            f3 = fleet()
            kinds = kinds_of(srv)
            learned = kinds["hold"]["learned"]
            check(60 * MiB <= learned <= 80 * MiB, f"kinds: {kinds}")
            check(learned * 0.8 <= f3["reserved"] <= learned,
                  f"not reserved on the learned {learned}: {f3}")
            check(kinds["hold"].get("outstanding") == 1, f"kinds: {kinds}")
            open(gate, "w").close()
            check(f.result(timeout=30) == 0, "task result")
            wait_for("reservation released",
                     lambda: fleet()["reserved"] == 0, timeout=20)
            os.unlink(gate)
            print(f"in-process: reserved {f0['reserved'] / MiB:.1f} MiB of "
                  f"96 MiB declared while the worker held 64 MiB for it; "
                  f"kind hold learned {peak / MiB:.1f} MiB")

            # Two tasks at once on one worker's two threads, of two kinds
            # with no history (each on [kinds] default_size, 32 MiB):
            # each kind learns what its own thread held, not the worker's
            # growth under both.
            w2 = start_worker(tmp, "Q", sched_file, srv.env(**{
                "PYTHONPATH": env["PYTHONPATH"]}), procs, nthreads=2)
            client.wait_for_workers(2, timeout=60 * MULT)
            wait_for("plugin on the second worker",
                     lambda: "memtally: admitting" in w2.text(), timeout=30)
            q = next(a for a, i in client.scheduler_info()["workers"].items()
                     if i["name"] == "Q")
            qpid = client.run(os.getpid, workers=[q])[q]
            wait_for("second worker registered", lambda: qpid in srv.ps())
            qbase = srv.ps()[qpid]["bytes"]
            sb = os.path.join(tmp, "started-big")
            ss = os.path.join(tmp, "started-small")
            fb = client.submit(hold, 96 * MiB, gate, sb, key="big-1",
                               workers=[q])
            fs = client.submit(hold, 16 * MiB, gate, ss, key="small-1",
                               workers=[q])
            wait_for("both started", lambda: os.path.exists(sb)
                     and os.path.exists(ss), timeout=30)
            wait_for("the worker holds both",
                     lambda: srv.ps()[qpid]["bytes"] >= 112 * MiB,
                     timeout=30)
            time.sleep(0.3)     # a few ticks at the peak
            open(gate, "w").close()
            check(fb.result(timeout=30) == 96 * MiB, "big result")
            check(fs.result(timeout=30) == 16 * MiB, "small result")
            wait_for("both released",
                     lambda: fleet()["reserved"] == 0, timeout=20)
            kinds = kinds_of(srv)
            big = kinds["big"]["last_peaks"][0]
            small = kinds["small"]["last_peaks"][0]
            check(84 * MiB <= big <= 104 * MiB, f"big learned {big}")
            check(12 * MiB <= small <= 24 * MiB, f"small learned {small}")
            print(f"two threads of one worker: kind big learned "
                  f"{big / MiB:.1f} MiB, small {small / MiB:.1f} MiB "
                  f"(the worker grew by both, 112 MiB)")

            # Denied for room that frees soon: the task asks again in its
            # thread and runs once the first one ends, without going back
            # to the scheduler (Admission's `wait`, 10 s by default).
            os.unlink(gate)
            # What glibc kept of the two tasks' 112 MiB is the worker's
            # until given back (counted: it is resident); the idle worker
            # trims it.
            wait_for("the idle worker gave back what its tasks freed",
                     lambda: srv.ps()[qpid]["bytes"] <= qbase + 24 * MiB,
                     timeout=30)
            s1 = os.path.join(tmp, "started-first")
            s2 = os.path.join(tmp, "started-second")
            # 160 MiB, not more: with the workers' own memory it must not
            # take the fleet `over` (which pauses every worker, and the
            # second task would never reach Q); beside it, the second's
            # 100 MiB is denied whatever the workers hold.
            with dask.annotate(memtally_bytes="160MiB"):
                f1 = client.submit(hold, MiB, gate, s1, key="first-1",
                                   workers=[q])
            wait_for("first started", lambda: os.path.exists(s1), timeout=30)
            with dask.annotate(memtally_bytes="100MiB"):
                f2 = client.submit(hold, MiB, gate, s2, key="second-1",
                                   workers=[q])
            wait_for("second denied and waiting", lambda: any(
                'task="second-1"' in line and "admission denied" in line
                for line in srv.logtext().splitlines()), timeout=30)
            check(not os.path.exists(s2), "second ran beside the first")
            open(gate, "w").close()
            check(f1.result(timeout=30) == MiB, "first result")
            check(f2.result(timeout=30) == MiB, "second result")
            check("rescheduled" not in w2.text(),
                  "went back to the scheduler:\n" + w2.text()[-3000:])
            print("a denied task waited in its thread and ran once room "
                  "freed")

            # Settings memtally does not take: each task runs without
            # admission and the log names the setting (or memtallyd's
            # refusal), never "memtallyd not reachable".
            bad = {"bad-group": {"memtally_bytes": "1MiB",
                                 "memtally_group": "a\tb"},
                   "bad-bytes": {"memtally_bytes": -1},
                   "bad-ttl": {"memtally_bytes": "1MiB",
                               "memtally_ttl": -5},
                   "bad-size": {"memtally_bytes": "1.5"}}
            futs = []
            for key, ann in bad.items():
                with dask.annotate(**ann):
                    futs.append(client.submit(int, 7, key=f"{key}-1",
                                              workers=[q]))
            check([f.result(timeout=30) for f in futs] == [7] * len(bad),
                  "a task with a bad setting did not run")
            text = w2.text()
            for words in ("memtally_group 'a?b': not printable",
                          "memtally_bytes -1",
                          "memtally_ttl -5", "memtally_bytes '1.5'"):
                check(words in text, f"no {words!r} in the worker's log:\n"
                      + text[-3000:])
            check("not reachable" not in text,
                  "bad settings taken for memtallyd failing:\n"
                  + text[-3000:])
            print("tasks with bad settings ran without admission, each "
                  "said why")
            client.close()
            client = None
    except BaseException:
        for p in procs:
            sys.stderr.write(f"---- {p.name} ----\n" + p.text()[-4000:])
        raise
    finally:
        if client is not None:
            client.close()
        for p in reversed(procs):
            p.stop()
    shutil.rmtree(tmp, ignore_errors=True)


def test_evicted_command_retried():
    """run_tasks: a command its node kills (SIGKILL, as the guard does)
    is run again by Dask; one killed every time fails as Evicted once
    its retries are spent."""
    need_distributed()
    sys.path.insert(0, os.path.join(SRC, "python"))
    import memtally.dask

    tmp = tempfile.mkdtemp(prefix="mt-dask-")
    once = os.path.join(tmp, "once")
    done = os.path.join(tmp, "done")
    killed = os.path.join(tmp, "killed")
    with Server("--fleet-limit", "256MiB") as srv:
        out = memtally.dask.run_tasks(
            [(f"if [ ! -e {once} ]; then touch {once}; kill -9 $$; fi; "
              f"echo $MEMTALLY_TASK > {done}", "8MiB"),
             (f"echo x >> {killed}; kill -9 $$", "8MiB")],
            n_workers=1, socket=srv.socket, retries=1,
            # The task's own name wins over one the caller's env names.
            env={"MEMTALLY_TASK": "not-the-task"})
        check(out[0].get("returncode") == 0, f"not rerun: {out[0]}")
        check(os.path.exists(once) and os.path.exists(done),
              "the first attempt did not die, or the rerun did not finish")
        with open(done) as f:
            named = f.read().strip()
        # Its key: its command's own kind, then its index.
        check(named.startswith("cmd_") and named.split("-")[1:2] == ["0"]
              and len(named.split("-")[0]) == 12,
              f"the command ran as task {named!r}, not its Dask key's")
        check("Evicted" in out[1].get("error", ""), f"{out[1]}")
        with open(killed) as f:
            runs = len(f.read().split())
        check(runs == 2, f"killed every time: ran {runs} times, not 1 + 1 "
              "retry")
        check(srv.status()["fleet"]["reserved"] == 0, "reservations left")
    print(f"evicted command rerun once and finished; one killed every "
          f"time failed as Evicted after {runs} runs")
    shutil.rmtree(tmp, ignore_errors=True)


def with_a_waiting_task(test):
    """Node A (64 MiB fleet limit, 40 held by a hog), one worker with the
    plugin (asking again for up to 60 s), and a 32 MiB task denied and
    waiting in its thread for room: then test(a, client, fut, hog, ledger,
    procs), whose servers (a's successors) it stops itself."""
    need_distributed()
    import dask
    from distributed import Client
    sys.path.insert(0, os.path.join(SRC, "python"))
    import memtally.dask

    tmp = tempfile.mkdtemp(prefix="mt-dask-")
    ledger = os.path.join(tmp, "ledger")
    env = plain_env()
    procs, hog, client = [], None, None
    try:
        with Server("--fleet-limit", "64MiB") as a:
            sched_file = start_scheduler(tmp, env, procs)
            start_worker(tmp, "A", sched_file, dict(
                env, MT_NODE="A", MEMTALLY_SOCKET=a.socket), procs)
            client = Client(scheduler_file=sched_file, timeout=30 * MULT)
            client.wait_for_workers(1, timeout=60 * MULT)
            client.register_worker_plugin(
                memtally.dask.Admission(interval=0.1, pause=1.0, wait=60))
            wait_for("plugin on the worker", lambda: "memtally: admitting"
                     in procs[1].text(), timeout=30)
            hog = Worker([*worker("hold"), "40"], a.env(group="hog"))
            check(hog.readline().startswith("ready"), "hog not ready")
            wait_for("A counts its hog",
                     lambda: a.status()["fleet"]["bytes"] >= 40 << 20)
            with dask.annotate(memtally_bytes="32MiB"):
                fut = client.submit(work, 0, ledger, pure=False)
            wait_for("the task denied", lambda: "admission denied" in
                     a.logtext() and fut.key in a.logtext(), timeout=30)
            test(a, client, fut, hog, ledger, procs)
    finally:
        if client is not None:
            client.close()
        if hog is not None:
            hog.kill()
        for p in reversed(procs):
            p.stop()
    shutil.rmtree(tmp, ignore_errors=True)


def test_cancelled_while_waiting_never_runs():
    """A denied task waits in its thread for room (`wait`); cancelled
    meanwhile, it must not run once room appears."""
    def test(a, client, fut, hog, ledger, procs):
        fut.cancel()
        wait_for("the task cancelled", lambda: fut.status == "cancelled",
                 timeout=30)
        hog.send("free")
        check(hog.readline() == "freed", "hog did not free")
        # Room now: the waiting thread asks again within 0.5 s.
        wait_for("A has room", lambda: a.status()["fleet"]["bytes"]
                 < 24 << 20)
        time.sleep(2.0 * MULT)
        check(ledger_of(ledger) == [], f"a cancelled task ran: "
              f"{ledger_of(ledger)}")
        check(a.status()["fleet"]["reserved"] == 0, "a reservation left")
    with_a_waiting_task(test)


def test_a_plugin_registered_again_runs_a_waiting_task():
    """Registering the plugin again (a second client does) removes the
    one a task waits under: the task runs, unadmitted, and its result is
    its own, not None."""
    def test(a, client, fut, hog, ledger, procs):
        import memtally.dask
        client.register_worker_plugin(
            memtally.dask.Admission(interval=0.1, pause=1.0, wait=60))
        check(fut.result(timeout=30 * MULT) == "A",
              f"the waiting task's result: {fut.result()!r}")
        check([r[0] for r in ledger_of(ledger)] == [fut.key],
              f"ran: {ledger_of(ledger)}")
    with_a_waiting_task(test)


def test_a_closing_worker_never_runs_a_waiting_task():
    """The worker closes (SIGTERM: as cluster.close(), retire_workers or a
    restart close it) while a denied task waits in its thread for room.
    Its teardown stops the plugin, and the task used to run then,
    unadmitted, on the node memtallyd had just said was full, for a result
    Dask throws away. Its body must never run."""
    def test(a, client, fut, hog, ledger, procs):
        procs[1].stop()
        check(procs[1].proc.returncode is not None, "the worker lives")
        time.sleep(1.0 * MULT)
        check(ledger_of(ledger) == [], "the waiting task ran as its worker "
              f"closed: {ledger_of(ledger)}")
        check(a.status()["fleet"]["reserved"] == 0, "a reservation left")
    with_a_waiting_task(test)


def test_a_waiting_task_outlasts_memtallyds_restart():
    """memtallyd restarts (stopped, back 2 s later on its record) while a
    task waits for room: the task does not start unadmitted meanwhile; it
    waits on, and runs once the restarted server has room."""
    def test(a, client, fut, hog, ledger, procs):
        a.stop()
        time.sleep(2.0 * MULT)
        check(ledger_of(ledger) == [], "the waiting task ran while "
              f"memtallyd was away: {ledger_of(ledger)}")
        with Server("--fleet-limit", "64MiB", after=a) as b:
            wait_for("B counts the hog", lambda: b.status()["fleet"]["bytes"]
                     >= 40 << 20, timeout=30)
            time.sleep(1.0 * MULT)
            check(ledger_of(ledger) == [], "the waiting task ran beside "
                  f"the hog: {ledger_of(ledger)}")
            hog.send("free")
            check(hog.readline() == "freed", "hog did not free")
            check(fut.result(timeout=60 * MULT) == "A", "not run on A")
            check(len(ledger_of(ledger)) == 1, f"ran: {ledger_of(ledger)}")
            check("admission granted" in b.logtext(),
                  "not admitted by the restarted server")
    with_a_waiting_task(test)


def test_a_long_key_is_a_task_name_a_worker_keeps():
    """A worker under the preload keeps 63 bytes of MEMTALLY_TASK: a task
    name from a longer key is cut to them, keys that differ only past the
    cut stay apart, and a short key is itself."""
    sys.path.insert(0, os.path.join(SRC, "python"))
    need_distributed()
    from memtally.dask import _task_name
    base = "preprocess_satellite_imagery_tile-" + "7f3a" * 8
    names = {_task_name(base + x) for x in ("0", "1", "2")}
    check(len(names) == 3, f"long keys collide: {names}")
    check(all(len(n.encode()) <= 63 for n in names), f"too long: {names}")
    check(all(n.startswith(base[:40]) for n in names), f"unreadable: {names}")
    check(_task_name("inc-1234") == "inc-1234", "a short key changed")
    check(len(_task_name(("é" * 60, 3)).encode()) <= 63, "a tuple's")
    # Bad settings are refused where they are made: an interval of 0
    # polled memtallyd in a tight loop (22% of a core for one idle
    # worker), a timeout of 0 ran every task unadmitted.
    from memtally.dask import Admission
    for bad in ({"interval": 0}, {"interval": -1}, {"timeout": 0},
                {"timeout": "x"}, {"pause": -1}, {"wait": -5}):
        try:
            Admission(**bad)
            check(False, f"Admission({bad}) taken")
        except ValueError as e:
            check(list(bad)[0] in str(e), f"{bad}: {e}")
    Admission(interval=0.1, timeout=1, pause=0, wait=0)


if __name__ == "__main__":
    run([test_a_long_key_is_a_task_name_a_worker_keeps, test_two_nodes,
         test_in_process, test_evicted_command_retried,
         test_cancelled_while_waiting_never_runs,
         test_a_plugin_registered_again_runs_a_waiting_task,
         test_a_closing_worker_never_runs_a_waiting_task,
         test_a_waiting_task_outlasts_memtallyds_restart])
