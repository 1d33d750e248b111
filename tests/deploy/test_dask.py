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
prefix, on that kind's size. Environment: as for the integration tests,
and MEMTALLY_SOURCE_DIR.
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


def start_scheduler(tmp, env, procs):
    sched_file = os.path.join(tmp, "scheduler.json")
    procs.append(Proc(tmp, "scheduler", [
        sys.executable, "-m", "distributed.cli.dask_scheduler",
        "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
        "--scheduler-file", sched_file], env))
    wait_for("scheduler file", lambda: procs[-1].alive()
             and os.path.exists(sched_file), timeout=30)
    return sched_file


def start_worker(tmp, name, sched_file, env, procs):
    procs.append(Proc(tmp, f"worker-{name}", [
        sys.executable, "-m", "distributed.cli.dask_worker",
        "--scheduler-file", sched_file, "--name", name,
        "--nthreads", "1", "--no-nanny", "--no-dashboard"], env))
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
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(SRC, "python"), env.get("PYTHONPATH", "")])
    env.pop("LD_PRELOAD", None)
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
            client.register_worker_plugin(
                memtally.dask.Admission(interval=0.1, pause=1.0))
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
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(SRC, "python"), env.get("PYTHONPATH", "")])
    env.pop("LD_PRELOAD", None)
    procs, client = [], None
    gate = os.path.join(tmp, "gate")
    try:
        with Server("--fleet-limit", "256MiB") as srv:
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

            # Larger than the fleet limit even on an empty node: fails at
            # once with the figures, its body never runs.
            started = os.path.join(tmp, "started-2")
            t0 = time.monotonic()
            with dask.annotate(memtally_bytes="512MiB"):
                f = client.submit(hold, MiB, gate, started, pure=False)
            err = f.exception(timeout=30 * MULT)
            took = time.monotonic() - t0
            check(err is not None and "NeverAdmitted" in type(err).__name__,
                  f"not failed as unadmittable: {err!r}")
            msg = str(err)
            check("512.0 MiB" in msg and "256.0 MiB" in msg
                  and "fleet limit" in msg, f"message: {msg}")
            check(not os.path.exists(started), "the body ran")
            check(w.text().count("never be admitted") == 1,
                  "not tried once:\n" + w.text()[-3000:])
            print(f"unadmittable task failed in {took:.1f} s: {msg}")

            # No annotation: admitted as its key's prefix ("hold"), on
            # the kind's default size (12.5% of the fleet limit, 32 MiB:
            # no history yet).
            started = os.path.join(tmp, "started-3")
            f = client.submit(hold, 0, gate, started, pure=False)
            wait_for("task started", lambda: os.path.exists(started),
                     timeout=30)
            f3 = fleet()
            kinds = {k["kind"]: k for k in srv.cli("kinds")["kinds"]}
            check(f3["reserved"] == 32 * MiB, f"not reserved: {f3}")
            check(kinds.get("hold", {}).get("outstanding") == 1,
                  f"kinds: {kinds}")
            open(gate, "w").close()
            check(f.result(timeout=30) == 0, "task result")
            wait_for("reservation released",
                     lambda: fleet()["reserved"] == 0, timeout=20)
            print(f"in-process: reserved {f0['reserved'] / MiB:.1f} MiB of "
                  f"96 MiB declared while the worker held 64 MiB for it")
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


if __name__ == "__main__":
    run([test_two_nodes, test_in_process])
