"""memtally.celery with real Celery workers and a real redis broker: two
"nodes" (a memtallyd each, 64 MiB fleet limit), one Celery worker per node
pointed at its node's memtallyd, one broker. With node A over budget every
task completes on node B, each exactly once, and A's worker did take and
requeue some; then with B over and A back under, A takes every task; and
with A's memtallyd gone, A's worker runs tasks anyway (fail open). A
task declared above every node's fleet limit fails at once, once.
test_thread_pool_pauses_on_the_loop: under the threads pool, denials
pause and resume the consumer on the event loop's thread only.
test_evicted_is_retried: a task whose `memtally run` is evicted by the
node guard (memtallyd in a small memory cgroup, as in
tests/integration/test_guard.py) is retried by Celery and succeeds;
test_killed_command_is_retried: so is one whose command died of SIGKILL.
test_soft_time_limit_while_admitted: a task's soft time limit that comes
while its Admit waits on memtallyd (stopped) ends the task (its body never
runs), and the grant memtallyd makes once it goes on is released.
Environment: as for the integration tests, and MEMTALLY_SOURCE_DIR.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile

from harness import MULT, Server, Skip, Worker, check, run, wait_for, worker

SRC = os.environ["MEMTALLY_SOURCE_DIR"]
HERE = os.path.dirname(os.path.abspath(__file__))


def need_modules():
    missing = []
    for mod, pkg in (("celery", "python3-celery"), ("redis", "python3-redis")):
        try:
            __import__(mod)
        except ImportError:
            missing.append(pkg)
    if missing:
        raise Skip(f"{' '.join(missing)} not installed for {sys.executable} "
                   f"(apt-get install {' '.join(missing)})")
    if not shutil.which("redis-server"):
        raise Skip("redis-server is not installed (apt-get install redis-server)")


class Redis:
    def __init__(self, tmp):
        self.sock = os.path.join(tmp, "redis.sock")
        self.log = open(os.path.join(tmp, "redis.log"), "w+")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", "0", "--unixsocket", self.sock,
             "--save", "", "--appendonly", "no", "--dir", tmp],
            stdout=self.log, stderr=subprocess.STDOUT)
        import redis
        self.r = redis.Redis(unix_socket_path=self.sock)
        wait_for("redis-server", lambda: os.path.exists(self.sock)
                 and self.r.ping(), timeout=20)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=20)


class CeleryWorker:
    def __init__(self, tmp, node, server, env, pool=("-c", "1", "-P", "prefork")):
        self.node = node
        self.logpath = os.path.join(tmp, f"worker-{node}.log")
        self.log = open(self.logpath, "w+")
        e = dict(env, MT_NODE=node, MEMTALLY_SOCKET=server.socket)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "celery_app", "worker",
             "-n", f"{node}@%h", *pool, "-Q", "mt",
             "--without-gossip", "--without-mingle",
             "-l", "info"], env=e, cwd=tmp, stdout=self.log,
            stderr=subprocess.STDOUT)

    def text(self):
        with open(self.logpath) as f:
            return f.read()

    def ready(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"worker {self.node} exited: {self.text()}")
        return " ready." in self.text()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()   # warm shutdown
            try:
                self.proc.wait(timeout=30 * MULT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def broker_and_app():
    """A scratch directory, a redis broker in it, the workers' environment
    and the test app (celery_app, imported afresh: it binds to the broker
    its module reads at import)."""
    tmp = tempfile.mkdtemp(prefix="mt-celery-")
    rd = Redis(tmp)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(SRC, "python"), HERE, env.get("PYTHONPATH", "")])
    env["MT_REDIS_SOCKET"] = rd.sock
    os.environ["MT_REDIS_SOCKET"] = rd.sock
    sys.path[:0] = [os.path.join(SRC, "python"), HERE]
    sys.modules.pop("celery_app", None)
    import celery_app
    return tmp, rd, env, celery_app


def ledger(rd):
    return [x.decode().split() for x in rd.r.lrange("mt:ran", 0, -1)]


def run_batch(rd, app_mod, n, first):
    ids = [app_mod.work.delay(first + i).id for i in range(n)]
    wait_for(f"{n} tasks ran", lambda: len(ledger(rd)) >= first + n,
             timeout=60, interval=0.1)
    # Nothing left in the queue or unacknowledged: no task is still to run
    # (and so none can run a second time later).
    wait_for("queue drained", lambda: rd.r.llen("mt") == 0
             and rd.r.hlen("unacked") == 0, timeout=20, interval=0.1)
    return ids


def test_two_nodes_one_broker():
    need_modules()
    tmp, rd, env, celery_app = broker_and_app()
    workers = []
    hogs = []
    try:
        with Server("--fleet-limit", "64MiB") as a, \
                Server("--fleet-limit", "64MiB") as b:
            # Node A over budget: 80 MiB held against 64 MiB.
            hog_a = Worker([*worker("hold"), "80"], a.env(group="hog"))
            hogs.append(hog_a)
            check(hog_a.readline().startswith("ready"), "hog not ready")
            wait_for("node A over", lambda: a.status()["fleet"]["state"] == "over")
            workers = [CeleryWorker(tmp, "A", a, env),
                       CeleryWorker(tmp, "B", b, env)]
            for w in workers:
                wait_for(f"celery worker {w.node} ready", w.ready, timeout=60)

            ids1 = run_batch(rd, celery_app, 10, 0)
            ran = ledger(rd)
            check(sorted(r[0] for r in ran) == sorted(ids1),
                  f"ran {ran}, sent {ids1}")
            check({r[1] for r in ran} == {"B"}, f"nodes while A over: {ran}")
            denied_a = workers[0].text().count("denied on")
            check(denied_a >= 1, "A's worker never took (and requeued) a task:\n"
                  + workers[0].text())
            # ...and then stopped taking tasks, and stays so while over.
            check("not taking tasks from mt" in workers[0].text()
                  and "taking tasks again" not in workers[0].text(),
                  "A's worker did not pause:\n" + workers[0].text()[-3000:])
            check(a.status()["fleet"]["reserved"] == 0
                  and b.status()["fleet"]["reserved"] == 0,
                  "reservations left behind")

            # A has room again, B is over: every task runs on A.
            hog_a.send("free")
            check(hog_a.readline() == "freed", "hog did not free")
            wait_for("node A ok", lambda: a.status()["fleet"]["state"] == "ok")
            hog_b = Worker([*worker("hold"), "80"], b.env(group="hog"))
            hogs.append(hog_b)
            check(hog_b.readline().startswith("ready"), "hog not ready")
            wait_for("node B over", lambda: b.status()["fleet"]["state"] == "over")
            ids2 = run_batch(rd, celery_app, 10, 10)
            ran = ledger(rd)
            check(sorted(r[0] for r in ran) == sorted(ids1 + ids2),
                  f"ran {ran}, sent {ids1 + ids2}")
            second = [r for r in ran if r[0] in set(ids2)]
            check({r[1] for r in second} == {"A"},
                  f"nodes once A had room and B was over: {second}")
            check(a.status()["fleet"]["reserved"] == 0, "reservations on A")
            check("taking tasks again" in workers[0].text()
                  and "not taking tasks from mt" in workers[1].text(),
                  "A did not resume, or B did not pause")
            # Declared above the fleet limit: failed at once with the
            # figures, not requeued for ever.
            celery_app.too_big.delay()
            wait_for("the task larger than any node failed", lambda: any(
                "can never be admitted" in w.text() for w in workers),
                timeout=60)
            text = "".join(w.text() for w in workers)
            check("more than the fleet limit" in text
                  and text.count("can never be admitted") == 1
                  and b"too_big" not in rd.r.lrange("mt:ran", 0, -1),
                  "not failed once with its figures:\n" + text[-3000:])

            # Fail open: with node A's memtallyd gone, A's worker runs
            # tasks without asking (B, still over, takes none), and says so
            # once.
            a.stop()
            ids3 = run_batch(rd, celery_app, 6, 20)
            ran = ledger(rd)
            check(sorted(r[0] for r in ran) == sorted(ids1 + ids2 + ids3),
                  f"ran {ran}, sent {ids1 + ids2 + ids3}")
            third = [r for r in ran if r[0] in set(ids3)]
            check({r[1] for r in third} == {"A"},
                  f"nodes with A's memtallyd gone: {third}")
            check(workers[0].text().count("not reachable") == 1,
                  "A's worker did not say once that it runs without memtallyd:\n"
                  + workers[0].text()[-3000:])
            print(f"A denied {denied_a} while over; B denied "
                  f"{workers[1].text().count('denied on')} while over")
            for h in hogs:
                h.close()
            hogs = []
            for w in workers:
                w.stop()
    except BaseException:
        for w in workers:
            sys.stderr.write(f"---- celery worker {w.node} ----\n"
                             + w.text()[-4000:])
        raise
    finally:
        for h in hogs:
            h.kill()
        for w in workers:
            w.stop()
        rd.stop()
    shutil.rmtree(tmp, ignore_errors=True)


def test_thread_pool_pauses_on_the_loop():
    """Under the threads pool a denied task's on_failure runs on the
    task's thread; the consumer is the event loop's, so its queues are
    cancelled and added back on the loop's thread (MainThread) only, and
    every task runs once the node has room."""
    need_modules()
    tmp, rd, env, celery_app = broker_and_app()
    w = hog = None
    try:
        with Server("--fleet-limit", "64MiB") as a:
            hog = Worker([*worker("hold"), "80"], a.env(group="hog"))
            check(hog.readline().startswith("ready"), "hog not ready")
            wait_for("node over", lambda: a.status()["fleet"]["state"] == "over")
            w = CeleryWorker(tmp, "A", a, env, pool=("-c", "4", "-P", "threads"))
            wait_for("celery worker ready", w.ready, timeout=60)
            ids = [celery_app.work.delay(i).id for i in range(6)]
            wait_for("a denial and a pause", lambda: "denied on" in w.text()
                     and "not taking tasks from mt" in w.text(), timeout=60,
                     interval=0.1)
            lines = w.text().splitlines()
            denials = [x for x in lines if "denied on" in x]
            check(all("MainThread" not in x for x in denials),
                  "the denials were not on the pool's threads:\n"
                  + "\n".join(denials))
            pauses = [x for x in lines if "not taking tasks from" in x]
            check(all(" MainThread] " in x for x in pauses),
                  "the consumer was paused off its loop's thread:\n"
                  + "\n".join(pauses))
            check(ledger(rd) == [], f"ran while over: {ledger(rd)}")
            hog.send("free")
            check(hog.readline() == "freed", "hog did not free")
            wait_for("6 tasks ran", lambda: len(ledger(rd)) >= 6,
                     timeout=60, interval=0.1)
            wait_for("queue drained", lambda: rd.r.llen("mt") == 0
                     and rd.r.hlen("unacked") == 0, timeout=20, interval=0.1)
            ran = ledger(rd)
            check(sorted(r[0] for r in ran) == sorted(ids),
                  f"ran {ran}, sent {ids}")
            resumes = [x for x in w.text().splitlines()
                       if "taking tasks again" in x]
            check(resumes and all(" MainThread] " in x for x in resumes),
                  "not resumed, or resumed off the loop's thread:\n"
                  + "\n".join(resumes))
            hog.close()
            hog = None
            w.stop()
    except BaseException:
        if w is not None:
            sys.stderr.write("---- celery worker ----\n" + w.text()[-4000:])
        raise
    finally:
        if hog is not None:
            hog.kill()
        if w is not None:
            w.stop()
        rd.stop()
    shutil.rmtree(tmp, ignore_errors=True)


def test_killed_command_is_retried():
    """A task whose command died of SIGKILL (the kernel's OOM killer, or a
    guard that kills without `memtally run`) is retried as an eviction:
    status -9 from subprocess itself, 137 through a shell."""
    need_modules()
    tmp, rd, env, celery_app = broker_and_app()
    w = None
    try:
        with Server("--fleet-limit", "64MiB") as a:
            w = CeleryWorker(tmp, "A", a, env)
            wait_for("celery worker ready", w.ready, timeout=60)
            # Killed the first time, exit 0 the next: itself (-9), and a
            # shell's child (the shell exits 137).
            self_kill = ["/bin/sh", "-c", 'if [ -e "$0" ]; then exit 0; fi;'
                         ' touch "$0"; kill -9 $$', os.path.join(tmp, "a")]
            child_kill = ["/bin/sh", "-c", 'if [ -e "$0" ]; then exit 0; fi;'
                          ' touch "$0"; sh -c \'kill -9 $$\'; exit $?',
                          os.path.join(tmp, "b")]
            ids = [celery_app.evictable.delay(argv).id
                   for argv in (self_kill, child_kill)]
            wait_for("both tasks done", lambda: rd.r.llen("mt:done") >= 2,
                     timeout=60, interval=0.1)
            done = sorted(x.decode().split()
                          for x in rd.r.lrange("mt:done", 0, -1))
            check(done == sorted([i, "0"] for i in ids),
                  f"not each done once, exit 0: {done}")
            attempts = sorted(x.decode().split()
                              for x in rd.r.lrange("mt:attempts", 0, -1))
            check(attempts == sorted([i, n] for i in ids for n in "01"),
                  f"attempts: {attempts}")
            text = w.text()
            check("status -9" in text and "status 137" in text
                  and text.count("retry 1 of 3") == 2,
                  "the worker did not retry both as evictions:\n"
                  + text[-3000:])
            w.stop()
    except BaseException:
        if w is not None:
            sys.stderr.write("---- celery worker ----\n" + w.text()[-4000:])
        raise
    finally:
        if w is not None:
            w.stop()
        rd.stop()
    shutil.rmtree(tmp, ignore_errors=True)


def test_evicted_is_retried():
    need_modules()
    import test_guard
    from harness import CLI
    cg = test_guard.node("celery")
    tmp, rd, env, celery_app = broker_and_app()
    w = None
    marker = os.path.join(tmp, "leaked-once")
    try:
        with test_guard.guard_server(cg) as s:
            w = CeleryWorker(tmp, "A", s, env)
            wait_for("celery worker ready", w.ready, timeout=60)
            # In the node, under `memtally run`: a leak the first time (the
            # guard evicts it, memtally run exits 75), 16 MiB steady for a
            # second the next.
            argv = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"',
                    cg.procs(), CLI, "--socket", s.socket, "run",
                    "--bytes", "32MiB", "--", "/bin/sh", "-c",
                    'if [ -e "$0" ]; then exec "$1" "$2" steady 16 1;'
                    ' else touch "$0"; exec "$1" "$2" leak 400 40; fi',
                    marker, *worker("fleet")]
            res = celery_app.evictable.delay(argv)
            # The run ends: done, or failed (nothing left to run).
            wait_for("the task done", lambda: rd.r.llen("mt:done") > 0 or (
                "evictable" in w.text() and (" raised " in w.text()
                                             or "succeeded" in w.text())),
                timeout=120, interval=0.2)
            done = [x.decode().split() for x in rd.r.lrange("mt:done", 0, -1)]
            check(done == [[res.id, "0"]], f"not done once, exit 0: {done}\n"
                  + w.text()[-3000:])
            attempts = [x.decode().split()
                        for x in rd.r.lrange("mt:attempts", 0, -1)]
            check(attempts == [[res.id, "0"], [res.id, "1"]],
                  f"attempts: {attempts}")
            log = s.logtext()
            check(log.count('msg="node guard: evicting"') == 1,
                  "not one eviction by the guard:\n" + log[-3000:])
            check("evicted" in w.text() and "retry 1 of 3" in w.text(),
                  "the worker did not say it retries:\n" + w.text()[-3000:])
            check(cg.oom_kills() == 0,
                  f"the kernel OOM-killed {cg.oom_kills()} in the node")
            wait_for("reservations released",
                     lambda: s.status()["fleet"]["reserved"] == 0)
            w.stop()
    except BaseException:
        if w is not None:
            sys.stderr.write("---- celery worker ----\n" + w.text()[-4000:])
        raise
    finally:
        if w is not None:
            w.stop()
        rd.stop()
        cg.remove()
    shutil.rmtree(tmp, ignore_errors=True)


def test_soft_time_limit_while_admitted():
    need_modules()
    tmp, rd, env, celery_app = broker_and_app()
    w = None
    try:
        with Server("--fleet-limit", "64MiB") as a:
            w = CeleryWorker(tmp, "A", a, dict(env, MT_TIMEOUT="5"))
            wait_for("celery worker ready", w.ready, timeout=60)
            a.proc.send_signal(signal.SIGSTOP)
            try:
                celery_app.limited.delay()
                wait_for("the soft time limit", lambda: "SoftTimeLimit"
                         in w.text(), timeout=30, interval=0.1)
            finally:
                a.proc.send_signal(signal.SIGCONT)
            wait_for("the late grant released", lambda: "granted" in
                     w.text() and "released" in w.text(), timeout=30,
                     interval=0.1)
            check(ledger(rd) == [], f"the body ran: {ledger(rd)}")
            check("not reachable" not in w.text(),
                  "the time limit taken for memtallyd failing")
            wait_for("nothing reserved",
                     lambda: a.status()["fleet"]["reserved"] == 0)
            w.stop()
    except BaseException:
        if w is not None:
            sys.stderr.write("---- celery worker ----\n" + w.text()[-4000:])
        raise
    finally:
        if w is not None:
            w.stop()
        rd.stop()
    shutil.rmtree(tmp, ignore_errors=True)


def test_a_name_memtallyd_refuses_is_still_admitted():
    """A task whose name (its kind) has a bidi character and is 306 bytes
    long: memtallyd refused the request ("kind: not a valid name"), and
    every run of the task went unadmitted. The name is made printable and
    cut to what memtallyd takes, and the task is admitted."""
    need_modules()
    tmp, rd, env, celery_app = broker_and_app()
    w = None
    try:
        with Server("--fleet-limit", "64MiB") as a:
            w = CeleryWorker(tmp, "A", a, env)
            wait_for("celery worker ready", w.ready, timeout=60)
            celery_app.oddly_named.delay()
            wait_for("the task ran", lambda: ledger(rd) != [], timeout=30,
                     interval=0.1)
            check("refused its request" not in w.text() and
                  "without admission" not in w.text(),
                  "the task ran unadmitted:\n" + w.text()[-3000:])
            check('msg="admission granted"' in a.logtext() and
                  "mtjobs.?xxx" in a.logtext(),
                  "not admitted under its cleaned kind: " + a.tail())
            wait_for("nothing reserved",
                     lambda: a.status()["fleet"]["reserved"] == 0)
            w.stop()
    except BaseException:
        if w is not None:
            sys.stderr.write("---- celery worker ----\n" + w.text()[-4000:])
        raise
    finally:
        if w is not None:
            w.stop()
        rd.stop()
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    run([test_two_nodes_one_broker, test_thread_pool_pauses_on_the_loop,
         test_killed_command_is_retried, test_evicted_is_retried,
         test_soft_time_limit_while_admitted,
         test_a_name_memtallyd_refuses_is_still_admitted])
