"""The Dask side of bench/fleet.py's policies "dask" and "memtally-dask":
a real dask.distributed LocalCluster, run as this process inside the
node's memory cgroup (so the scheduler, the nannies and every worker
process are charged to the node, as on a machine that runs Dask).

    python3 fleet_dask.py SPEC.json

SPEC (written by fleet.py): tasks (fleet.Task.as_dict()), n_workers,
threads, memory_limit (bytes per worker), workdir, memtally (install
memtally.dask.Admission and annotate each task with its declared bytes),
deadline (seconds after the start), stall (seconds without any task
running, tasks still waiting: then they are lost). Everything else is Dask's default
(pause 0.8, terminate 0.95, monitor-interval 100ms, allowed-failures 3).

Protocol: once the cluster is up, WORKDIR/ready appears; the run starts
when a line arrives on stdin (so cluster start-up is not in the
makespan), tasks are submitted at their arrival times, and WORKDIR/result.json
holds what Dask said of each task and what its nannies did.

Each task runs its memory profile INSIDE the worker process (a Python
function, as Dask users run memory-heavy work), so Dask's own memory
monitor sees it. Every attempt keeps a small file in WORKDIR/attempts
(worker pid, CPU-seconds so far, done): the attempts a killed worker took
with it are read from there, even when the whole cluster dies.
"""
import json
import logging
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fleet_worker  # noqa: E402  (the profiles, shared with the processes)

MIB = 1 << 20


def _write_attempt(path, cpu, done):
    """Rewritten in place (small, one write): what the harness reads if
    this attempt's worker is killed."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d %.3f %d %.3f\n" % (os.getpid(), cpu, done,
                                       time.monotonic()))
    os.replace(tmp, path)


def run_profile(idx, kind, profile, peak_mib, secs, attempts_dir):
    """One task of the fleet in the worker's own memory: the profile of
    bench/fleet_worker.py, held as 1 MiB bytes objects. The task's own
    memory is its true peak less the process it no longer needs (a Python
    task's interpreter, fleet_worker.BASE_MIB; a C task's is ~nothing).
    CPU: the same 10% busy share, measured per thread."""
    peak = max(2.0, peak_mib - (fleet_worker.BASE_MIB if kind == "py" else 0))
    path = os.path.join(attempts_dir, "%d.%d.%d" % (
        idx, os.getpid(), time.monotonic_ns()))
    cpu0 = time.thread_time()
    _write_attempt(path, 0.0, 0)
    blocks = []
    t0 = time.monotonic()
    last_note = t0
    step, cpu = 0.02, 0.1
    while True:
        now = time.monotonic()
        f = (now - t0) / secs
        if f >= 1:
            break
        want = int(fleet_worker.level(profile, peak, f))
        while len(blocks) < want:
            blocks.append(b"\x01" * fleet_worker.CHUNK)
        del blocks[want:]
        end = time.monotonic() + step * cpu
        while time.monotonic() < end:
            pass
        if now - last_note >= 0.25:
            _write_attempt(path, time.thread_time() - cpu0, 0)
            last_note = now
        time.sleep(step * (1 - cpu))
    blocks.clear()
    _write_attempt(path, time.thread_time() - cpu0, 1)
    return idx


class NannyLog(logging.Handler):
    """What the nannies (in this process, under LocalCluster) say about
    their workers: terminations for memory (Dask's terminate threshold)
    and deaths (a SIGKILL the nanny did not send is the kernel's)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.events = []            # (monotonic, pid, what)

    def emit(self, record):
        msg = record.getMessage()
        now = time.monotonic()
        if "memory budget. Restarting" in msg:
            pid = int(msg.split("(pid=")[1].split(")")[0])
            self.events.append((now, pid, "terminate"))
        elif msg.startswith("Worker process ") and " was killed by " in msg:
            pid = int(msg.split()[2])
            sig = msg.rsplit(" ", 1)[-1]
            self.events.append((now, pid, "signal " + sig))
        elif msg.startswith("Restarting worker"):
            self.events.append((now, 0, "restart"))


def submit_all(client, spec, attempts_dir, t0):
    """Each task submitted at its arrival time (seconds after t0), with
    memtally's annotation when the spec asks for it. Its key is its job's
    name and its number ("job02-17"): Dask's key prefix, the task's kind,
    is the job, as in Dask's own naming ("read-csv-<token>")."""
    import dask
    futs = {}
    for t in sorted(spec["tasks"], key=lambda t: (t["arrival"], t["idx"])):
        delay = t0 + t["arrival"] - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        ann = {"memtally_bytes": t["declared_mib"] * MIB} \
            if spec["memtally"] else {}
        with dask.annotate(**ann):
            futs[t["idx"]] = client.submit(
                run_profile, t["idx"], t["kind"], t["profile"], t["peak_mib"],
                t["secs"], attempts_dir, key="%s-%d" % (t["job"], t["idx"]),
                pure=False)
    return futs


def last_progress(attempts_dir):
    """When an attempt last wrote its file (every 0.25 s while it runs)."""
    latest = 0.0
    for e in os.scandir(attempts_dir):
        try:
            latest = max(latest, e.stat().st_mtime)
        except OSError:
            pass
    return latest


def wait_or_give_up(futs, attempts_dir, deadline, stall):
    """Until every future is done; or the deadline; or no task has run
    for `stall` seconds while some are still waiting (a task that can
    never be placed: Dask, or memtally, keeps it waiting for ever).
    Returns why it gave up, or None."""
    from distributed import wait
    while True:
        if all(f.done() for f in futs):
            return None
        if time.monotonic() > deadline:
            return "deadline"
        if time.time() - max(last_progress(attempts_dir), start_wall) > stall:
            return "stalled: no task ran for %.0f s" % stall
        try:
            wait(futs, timeout=1.0)
        except Exception:  # noqa: BLE001 - distributed's TimeoutError
            pass


start_wall = time.time()


def scheduler_view(sched):
    """Where the scheduler's tasks are and what its workers are doing,
    when the run ends: what a stalled run was waiting on."""
    states = {}
    for ts in list(sched.tasks.values()):
        states[ts.state] = states.get(ts.state, 0) + 1
    workers = {ws.address: {"status": str(ws.status),
                            "processing": len(ws.processing),
                            "memory": ws.memory.process}
               for ws in list(sched.workers.values())}
    return {"task_states": states, "workers": workers,
            "queued": len(getattr(sched, "queued", ()))}


def main(spec_path):
    with open(spec_path) as f:
        spec = json.load(f)
    workdir = spec["workdir"]
    attempts_dir = os.path.join(workdir, "attempts")
    os.makedirs(attempts_dir, exist_ok=True)
    nanny_log = NannyLog()
    logging.getLogger("distributed").addHandler(nanny_log)

    from distributed import Client, LocalCluster
    cluster = LocalCluster(n_workers=spec["n_workers"],
                           threads_per_worker=spec["threads"],
                           processes=True, memory_limit=spec["memory_limit"],
                           dashboard_address=None)
    client = Client(cluster)
    if spec["memtally"]:
        import memtally.dask
        client.register_worker_plugin(memtally.dask.Admission())
    open(os.path.join(workdir, "ready"), "w").close()
    sys.stdin.readline()
    t0 = time.monotonic()
    global start_wall
    start_wall = time.time()

    futs = {}
    submitter = threading.Thread(
        target=lambda: futs.update(submit_all(client, spec, attempts_dir, t0)),
        daemon=True)
    submitter.start()
    submitter.join(max(1.0, spec["deadline"]))
    why = wait_or_give_up(list(futs.values()), attempts_dir,
                          t0 + spec["deadline"], spec["stall"])

    tasks = {}
    for idx, fu in futs.items():
        st = {"status": fu.status}
        if fu.status == "error":
            st["error"] = repr(fu.exception())
        tasks[idx] = st
    out = {"t0": t0, "end": time.monotonic(), "tasks": tasks,
           "nanny": nanny_log.events, "gave_up": why,
           "scheduler": scheduler_view(cluster.scheduler)}
    with open(os.path.join(workdir, "result.json"), "w") as f:
        json.dump(out, f)
    try:
        client.close(timeout=10)
        cluster.close(timeout=10)
    except Exception:  # noqa: BLE001 - the figures are written; the harness removes the node
        pass


if __name__ == "__main__":
    main(sys.argv[1])
