"""memtally.dask - admit Dask tasks on their worker's memtallyd.

    import dask
    from dask.distributed import Client
    import memtally.dask

    client = Client("tcp://scheduler:8786")
    client.register_worker_plugin(memtally.dask.Admission())

    with dask.annotate(memtally_bytes="600MiB", memtally_group="etl"):
        futures = client.map(crunch, paths)
    futures = client.map(parse, paths)      # sized by what "parse" used

Each worker asks its own node's memtallyd ($MEMTALLY_SOCKET in the worker's
environment, else /run/memtally/memtally.sock; or `socket=` for every
worker) before it runs a task. The task's kind is its key's prefix
(`dask.utils.key_split`: "parse-7f3a..." is "parse"), and memtallyd
reserves what that kind's recent tasks used; `memtally_bytes`, when
annotated, is the declaration (the ceiling), and a kind with no history
yet gets memtallyd's `[kinds] default_size` (or the declaration). A node's
operator can install the same plugin on every worker it starts, whoever
the client: `dask worker --preload memtally.dask SCHEDULER`.

- Admitted: the task runs under the reservation, released when it returns
  (or when its worker exits). It is asked for in the executor thread that
  runs the task, as a task run inside this process on this thread: when
  memtallyd counts the worker (it runs under the preload), what that
  thread allocates from then on, within what the worker grows by, is the
  task's use. The reservation sets aside only what the task has not used
  yet, so nothing is counted twice, and the task's kind learns what it
  really held, whatever else the worker's other threads run (give
  memtallyd a lane for each of the worker's threads, `[server] lanes`:
  the worker's threads plus about six; without one, each task is counted
  an equal share of the worker's growth). The
  reservation's task name is the Dask key, so processes the task starts
  with MEMTALLY_TASK=<key> under the preload are counted against it
  instead (and teach its kind). Tasks on an executor that is not a thread
  pool (a process pool, an async task) run without admission.
- Denied: asked again (at most every 0.5 s) for up to `wait` seconds
  (default 30: this node's tasks end, and memtallyd keeps the room of the
  request waiting longest once it has waited memtallyd's queue time, 10 s
  by default; a task that gave up then would leave the head of the queue
  holding room for nobody); then the task goes back to the scheduler (it
  raises distributed.Reschedule before its body runs), and the worker
  pauses itself for `pause` seconds (default 2) so that the scheduler
  places that task, and the next ones, on other workers.
- The worker's own limit: with Dask's memory_limit set, the task is also
  denied (`host_limit`) unless the worker's figure, what its running tasks
  are set aside, and what the task needs beside them (memtallyd pools a
  worker's tasks as it pools the fleet's) stay under the
  fraction where Dask's nanny ends the worker with every task in it
  (`terminate`), a limit memtallyd does not know, less what Dask's
  monitor sees of the idle worker beyond memtallyd's figure (its resident
  file pages). Such a denial goes back
  to the scheduler at once; a task larger than the worker can give one
  beside its own memory at its leanest fails as never admissible.
- Never admissible: denied by a limit smaller than the task's size (the
  fleet's, its group's, the node guard's line, or what one uid may hold),
  which no amount of waiting on that node can change: the task fails at
  once with NeverAdmitted, naming the figures, instead of going round the
  cluster for ever. Its body never ran.
- Over: while its memtallyd reports the fleet `over` (asked every
  `interval` seconds, default 0.5: one GetUsage), the worker stays paused
  and takes no task at all; the tasks it is running go on.
- Idle: a worker running no task that holds 16 MiB more than when it was
  first idle gives its allocator's free memory back (glibc's
  malloc_trim, at most every 5 s, as Dask's advice for unmanaged memory
  does). memtallyd counts what the allocator keeps resident after the
  worker's tasks freed it, and that figure keeps other tasks out of the
  node until it is given back.

A paused worker is Dask's own mechanism (the state its memory monitor puts
a worker in above `distributed.worker.memory.pause`): the scheduler sends
it nothing new and places work on running workers. Dask's monitor resumes
any paused worker whose own process memory is below its pause threshold,
so while memtally holds a worker paused the plugin keeps that check from
resuming it; when memtally lets go, Dask's check applies again.

Why an annotation: it is how Dask attaches scheduling facts to tasks
(`resources`, `retries`, `priority`), it reaches the worker with the task,
and it applies to every task of a collection (dask.array, dask.dataframe,
dask.delayed) as well as to `client.submit`/`client.map`, without wrapping
the function. Dask's own `resources={"MEMORY": ...}` counts declared bytes
per worker only; memtally admits against what the node really uses.

Why a worker plugin and a pause, not a scheduler plugin: memtally answers
per node, so each worker asks its own node's memtallyd over the local
socket, and a paused worker is the one thing Dask's scheduler already
keeps new tasks away from.

Fail open: when the worker's memtallyd cannot be reached, the task runs
and the worker is not held paused (logged once, and again after memtallyd
was back); memtally must never stop work because it is missing. A task
already waiting for room when memtallyd stops answering (most likely it
is restarting) asks on until its wait ends, as `memtally run` does, so a
restart does not start every waiting task at once; one waiting when the
plugin is removed (or registered again) runs unadmitted, and one waiting
when its worker closes never runs there (it goes back to the
scheduler). A reservation's
task name is the key, cut to the 63 bytes a process under the preload
keeps of MEMTALLY_TASK (a longer key: its first 46 bytes and a hash).

Annotations: `memtally_bytes` (int or "600MiB"; unset: the kind's size;
0: this task is not admitted), `memtally_group`, `memtally_ttl` (seconds
the reservation outlives a lost worker; 0: the server's default). Plugin
arguments: `socket`, `interval`, `pause`, `timeout` (seconds per memtallyd
request, default 2), `kinds` (default True; False: only tasks annotated
with `memtally_bytes` are admitted, as before kinds), `wait` (seconds a
denied task asks again before it goes back; 0: at once). Logged as `distributed.memtally`, in the worker's log beside
Dask's own lines.
"""
import asyncio
import hashlib
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from distributed import WorkerPlugin
from distributed.core import Status

from .client import (DEFAULT_SOCKET, EVICTED_STATUS, Client, MemtallyError,
                     denied_for_ever, human, never_fits, pb, positive,
                     printable, refused, state_name, task_name,
                     task_settings)

# Under "distributed": a worker's log shows these beside Dask's own lines,
# at the levels Dask's logging configuration sets for that tree.
log = logging.getLogger("distributed.memtally")

_failing_open = set()   # sockets we already said we run without
_kinds_refused = set()  # kinds memtallyd refused (its kinds cap): said once


# The names as memtallyd takes them (client.py: Celery's too).
_printable = printable
_task_name = task_name


def _kind(key):
    """The kind of a Dask key: its prefix (dask.utils.key_split:
    "read-csv-7f3a..." and ("read-csv-7f3a...", 4) are "read-csv"), the
    thing that runs again and again."""
    try:
        from dask.utils import key_split
        return _printable(key_split(key), 255)  # what memtallyd takes
    except Exception:  # noqa: BLE001 - no kind is no worse than before
        return ""


# An idle worker holding this much more than it first held has its heap
# trimmed, at most every TRIM_EVERY seconds (_Gate._idle).
TRIM_ABOVE = 16 << 20
TRIM_EVERY = 5.0


def _malloc_trim():
    """glibc's malloc_trim(0): free memory the allocator keeps goes back to
    the kernel. False where there is none."""
    try:
        import ctypes
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


def _resident():
    """This process's resident set as Dask's memory monitor reads it, or
    0."""
    try:
        import psutil
        return psutil.Process().memory_info().rss
    except Exception:  # noqa: BLE001 - no figure, no correction
        return 0


def _host_limit(worker):
    """What this worker may hold, as Dask limits it: its memory_limit at
    the fraction where Dask's nanny ends it, with every task it runs
    (`distributed.worker.memory.terminate`, 0.95 by default). Tasks are
    admitted on their learned sizes, each with its kind's margin, up to
    that line. 0: no limit of its own."""
    mm = getattr(worker, "memory_manager", None)
    limit = getattr(mm, "memory_limit", None) or 0
    try:
        import dask
        frac = dask.config.get("distributed.worker.memory.terminate")
    except Exception:  # noqa: BLE001 - Dask's default
        frac = 0.95
    return int(limit * frac) if limit and frac else 0


class Evicted(Exception):
    """A task's command was ended by its node, not by its own fault:
    memtallyd's node guard (`memtally run` exits 75 then) or a SIGKILL.
    Raised by run_tasks' tasks so that Dask retries them."""


class NeverAdmitted(Exception):
    """A task larger than its node's memtallyd could ever grant, even with
    nothing else running: rescheduling it would only ask again."""


class Admission(WorkerPlugin):
    """Worker plugin: admit annotated tasks on the worker's memtallyd and
    keep the worker paused while its node is over budget."""

    name = "memtally"

    def __init__(self, socket=None, interval=0.5, pause=2.0, timeout=2.0,
                 kinds=True, wait=30.0):
        self.socket = socket
        self.kinds = bool(kinds)
        # 0 or less: memtallyd polled in a tight loop, or every request
        # timed out at once and every task run unadmitted.
        self.interval = positive(interval, "interval")
        self.timeout = positive(timeout, "timeout")
        self.pause = float(pause)
        self.wait = float(wait)
        if not (self.pause >= 0 and self.wait >= 0):
            raise ValueError(f"pause {pause!r}, wait {wait!r}: seconds, "
                             f"0 or more")
        self._gate = None

    def __getstate__(self):
        # Sent to every worker: the settings, never a worker's gate.
        d = dict(self.__dict__)
        d["_gate"] = None
        return d

    async def setup(self, worker):
        sock = (self.socket or os.environ.get("MEMTALLY_SOCKET")
                or DEFAULT_SOCKET)
        self._gate = _Gate(worker, sock, self.interval, self.pause,
                           self.timeout, self.kinds, self.wait)
        self._gate.start()

    def teardown(self, worker):
        if self._gate is not None:
            self._gate.stop()
            self._gate = None


class _AdmittingThreadPoolExecutor:
    """A worker's thread pool whose tasks are admitted in the thread that
    runs them (see _Gate.admitted). Dask runs a task on an executor whose
    type's name says ThreadPoolExecutor through `apply_function`, with
    the task's function first and its key fifth; everything else is the
    wrapped pool's."""

    def __init__(self, inner, gate):
        self._inner = inner
        self._gate = gate

    def submit(self, fn, *args, **kwargs):
        from distributed.worker import apply_function
        if fn is apply_function and len(args) >= 5:
            args = (self._gate.admitted(args[0], args[4]),) + args[1:]
        return self._inner.submit(fn, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _Gate:
    """One worker's admission and pause state. Tasks are admitted in the
    executor thread that runs them; the pause and the fleet's state live
    on the worker's event loop, and its memtallyd requests run on a small
    thread pool of its own, so a slow memtallyd (bounded by the timeout)
    never stalls the loop."""

    def __init__(self, worker, sock, interval, pause, timeout, kinds, wait):
        self.worker = worker
        self.kinds = kinds          # admit tasks without memtally_bytes
        self.sock = sock
        self.interval = interval
        self.pause = pause
        self.timeout = timeout
        self.wait = wait
        self.host_limit = _host_limit(worker)
        self.gap = 0                # Dask's figure of it less memtally's
        self.lean = None            # the least it held of its own, idle
        self.first = None           # ... when first idle
        self.trimmed = 0.0          # its heap last trimmed then
        self.trim_from = None       # ... from this figure
        self.pool = ThreadPoolExecutor(2, thread_name_prefix="memtally")
        self.loop = None
        self.over = False           # memtallyd's fleet state, last asked
        self.denied_until = 0.0     # paused after a denial until then
        self.holding = False        # memtally keeps the worker paused
        self.watcher = None
        self.stopped = False        # removed: a late denial pauses nothing
        self.orig_executors = {}
        self.orig_pause_check = None

    # -- install / remove -------------------------------------------------
    def start(self):
        w = self.worker
        self.loop = asyncio.get_running_loop()
        # Every task passes through its executor's submit with its key.
        # Admitting it there, in the thread that will run it, tells
        # memtallyd which thread's allocations are the task's.
        for name, e in list(w.executors.items()):
            if "ThreadPoolExecutor" in str(type(e)):
                self.orig_executors[name] = e
                w.executors[name] = _AdmittingThreadPoolExecutor(e, self)
        mm = getattr(w, "memory_manager", None)
        if mm is not None and hasattr(mm, "_maybe_pause_or_unpause"):
            self.orig_pause_check = mm._maybe_pause_or_unpause
            mm._maybe_pause_or_unpause = self._dask_pause_check
        self.watcher = self.loop.create_task(self._watch())
        log.info("memtally: admitting %s on %s",
                 "tasks" if self.kinds else "annotated tasks", self.sock)

    def stop(self):
        w = self.worker
        self.stopped = True
        if self.watcher is not None:
            self.watcher.cancel()
        for name, e in self.orig_executors.items():
            if isinstance(w.executors.get(name),
                          _AdmittingThreadPoolExecutor):
                w.executors[name] = e
        if self.orig_pause_check is not None:
            # Our own check only: another plugin's may have replaced it.
            mm = w.memory_manager
            if mm.__dict__.get("_maybe_pause_or_unpause") == \
                    self._dask_pause_check:
                del mm._maybe_pause_or_unpause
        self._release_pause()
        self.pool.shutdown(wait=False)

    # -- memtallyd requests -----------------------------------------------
    def _client(self):
        return Client(self.sock, timeout=self.timeout)

    def _failed(self, err):
        if self.sock not in _failing_open:
            _failing_open.add(self.sock)
            log.warning("memtally: memtallyd at %s not reachable (%s); "
                        "running tasks without admission", self.sock, err)

    def _admit(self, nbytes, group, task, ttl, kind, thread):
        """The AdmitResult, or None when memtallyd cannot be asked."""
        try:
            with self._client() as c:
                r = c.admit(nbytes, group=group, task=task, ttl_seconds=ttl,
                            kind=kind, in_process=True, thread=thread,
                            host_limit=max(1, self.host_limit - self.gap)
                            if self.host_limit else 0)
        except Exception as e:  # noqa: BLE001 - whatever breaks, fail open
            if refused(e):
                # memtallyd answers, and refuses what the task asks (a
                # group name it does not take): the task's annotations.
                log.warning("memtally: task %s: memtallyd refused its "
                            "request (%s); running it without admission",
                            task, e)
            else:
                self._failed(e)
            return None
        _failing_open.discard(self.sock)
        return r

    def _release(self, reservation):
        try:
            with self._client() as c:
                c.release(reservation)
        except MemtallyError as e:
            # Ended already (its command's processes took it over and
            # exited): nothing stays set aside.
            if e.code != pb.ERROR_NOT_FOUND:
                log.warning("memtally: releasing %s: %s; its room stays "
                            "set aside until this worker exits or its TTL",
                            reservation, e)
        except Exception as e:  # noqa: BLE001 - never the task's outcome
            # Its worker's exit ends it, or its TTL (a day at most).
            log.warning("memtally: releasing %s: %s; its room stays set "
                        "aside until this worker exits or its TTL",
                        reservation, e)

    def _fleet_over(self):
        try:
            with self._client() as c:
                over = state_name(c.usage().state) == "over"
        except Exception as e:  # noqa: BLE001 - whatever breaks, fail open
            self._failed(e)
            return False
        _failing_open.discard(self.sock)
        return over

    # -- the task's thread ------------------------------------------------
    def _request(self, key):
        """What to ask memtallyd for the task `key`: (bytes, group, ttl,
        kind), or None to run it without admission."""
        ts = self.worker.state.tasks.get(key)
        ann = (ts.annotations or {}) if ts is not None else {}
        try:
            nbytes, group, ttl = task_settings(ann.get("memtally_bytes"),
                                               ann.get("memtally_group"),
                                               ann.get("memtally_ttl"))
        except ValueError as e:  # a bad annotation must not fail the task
            log.warning("memtally: task %s: %s; running it without "
                        "admission", key, e)
            return None
        # The key's prefix is its kind: memtallyd reserves what the
        # prefix's recent tasks used, nbytes (if any) being their ceiling,
        # and a task of a kind with no history its default size.
        kind = _kind(key)
        if not nbytes and ("memtally_bytes" in ann or not self.kinds
                           or not kind):
            return None     # memtally_bytes=0: this task is not admitted
        return nbytes, group, ttl, kind

    def admitted(self, function, key):
        """`function` run as the task `key` once memtallyd admits it, in
        the executor thread that runs it. The Admit says the task runs in
        this process on this thread: memtallyd counts what the thread
        allocates from then on (within what the process grows by) as the
        task's use, so the reservation sets aside only what the task has
        not used yet, nothing is counted twice, and the kind learns what
        such tasks really hold."""
        def run(*args, **kwargs):
            req = self._request(key)
            if req is None:
                return function(*args, **kwargs)
            nbytes, group, ttl, kind = req
            task = _task_name(key)
            tid = threading.get_native_id()
            r = self._admit(nbytes, group, task, ttl, kind, tid)
            if r is not None and denied_for_ever(r) == "kinds":
                # This uid keeps as many kinds as it may: the task goes
                # without one (on its declaration, or unadmitted), not
                # back to the scheduler, which would bring it back here
                # until old kinds aged out (days).
                if kind not in _kinds_refused:
                    _kinds_refused.add(kind)
                    log.warning("memtally: kind %s refused (%s); its tasks "
                                "run %s", kind, r.reason,
                                "on their memtally_bytes" if nbytes else
                                "without admission")
                kind = ""
                if not nbytes:
                    return function(*args, **kwargs)
                r = self._admit(nbytes, group, task, ttl, kind, tid)
            # Room this node may have soon (tasks end, memtallyd's queue
            # keeps the longest waiter's place): asked again for up to
            # `wait` seconds before the task goes back to the scheduler.
            end = time.monotonic() + self.wait
            delay = 0.05
            while (r is not None and not r.admitted
                   and r.limit_scope != "host" and not never_fits(r)
                   and time.monotonic() < end):
                time.sleep(min(delay, max(0.0, end - time.monotonic())))
                delay = min(delay * 2, 0.5)
                if self.stopped:
                    if self._closing():
                        # The worker closes (cluster.close(),
                        # retire_workers, a restart): its body never
                        # runs on a node memtallyd said is full, and the
                        # task goes back to the scheduler (a None
                        # returned could still reach it as the task's
                        # result while the worker closes gracefully).
                        from distributed import Reschedule
                        raise Reschedule()
                    # The plugin was removed (or registered again,
                    # which removes it first) while it waited: the task
                    # runs as it would without memtally.
                    return function(*args, **kwargs)
                if not self._wanted(key):
                    # Cancelled while it waited: its body never runs;
                    # Dask drops what it returns.
                    return None
                got = self._admit(nbytes, group, task, ttl, kind, tid)
                if got is None and time.monotonic() < end:
                    # memtallyd said "no room" and now does not answer:
                    # most likely restarting. Failing open now would
                    # start every waiting task on the node at once;
                    # asked again until the wait ends, as `memtally
                    # run` does.
                    continue
                r = got
            if r is None:
                return function(*args, **kwargs)
            if not r.admitted:
                self._refuse(key, task, r)
            try:
                return function(*args, **kwargs)
            finally:
                self._release(r.reservation)
        return run

    def _closing(self):
        """Is the worker closing or closed (its teardown stopped us)?"""
        st = getattr(self.worker, "status", None)
        return getattr(st, "name", str(st)) in (
            "closing", "closed", "closing_gracefully", "failed")

    def _wanted(self, key):
        """Is the task still to run here? Read from the executor thread: a
        dict lookup and an attribute of the loop's state, each whole
        under the GIL; a state read a moment late only waits one more
        round."""
        if self.stopped:
            return False
        try:
            ts = self.worker.state.tasks.get(key)
            return ts is not None and ts.state not in (
                "cancelled", "released", "forgotten")
        except Exception:  # noqa: BLE001 - another Dask: as before
            return True

    def _refuse(self, key, task, r):
        """Raise what Dask does with a denied task: NeverAdmitted (it
        fails, naming the figures) when no amount of waiting on this node
        can admit it, else Reschedule (back to the scheduler, its body
        never ran) after pausing the worker."""
        never = self._never_in_worker(r) if r.limit_scope == "host" \
            else never_fits(r)
        if never:
            err = NeverAdmitted(f"memtally: task {task} {never} on "
                                f"{self.worker.address} (memtallyd at "
                                f"{self.sock}): it can never be admitted "
                                f"there")
            log.warning("%s", err)
            raise err
        from distributed import Reschedule
        log.info("memtally: task %s denied on %s (%s); rescheduled", key,
                 self.sock, r.reason)
        # Queued on the loop before the task's end is: the worker is
        # paused before the reschedule reaches the scheduler (both go out
        # on the same ordered stream), so it is not sent back here.
        self.loop.call_soon_threadsafe(self._denied)
        raise Reschedule()

    def _never_in_worker(self, r):
        """Why a host-limit denial can never become a grant in this
        worker, or "": the task is larger than the worker's limit less
        the least it has held of its own while it ran no task, as Dask's
        monitor reads it. (What it holds now may be more: memory its
        finished tasks left, which it gives back; a task that fits beside
        its leanest goes back to the scheduler instead.)"""
        if self.lean is None or not self.host_limit:
            return ""
        room = max(0, self.host_limit - self.lean)
        if r.requested_bytes <= room:
            return ""
        why = r.sized_by.split(": ", 1)[-1] if r.sized_by else "declared"
        return (f"needs {human(r.requested_bytes)} ({why}), more than this "
                f"worker can hold beside its own {human(self.lean)} at its "
                f"leanest, under "
                f"its limit of {human(self.host_limit)} (Dask's "
                f"terminate line),")

    def _own_bytes(self):
        """What memtallyd counts for this worker process (per its
        `measure`), or None when it counts nothing."""
        try:
            with self._client() as c:
                u = c.usage(pid=os.getpid())
        except Exception:  # noqa: BLE001 - counted nothing, as unreachable
            return None
        p = u.process
        if not p.pid:
            return None
        if u.measure == "rss":
            return p.rss_bytes
        if u.measure == "max":
            return max(p.bytes, p.rss_bytes)
        return p.bytes

    # -- the worker side (event loop) -------------------------------------
    def _denied(self):
        # Queued from a task's thread: the plugin may have been removed
        # since, and nothing would then resume the worker.
        if self.stopped:
            return
        self.denied_until = time.monotonic() + self.pause
        self._apply()

    async def _ask(self, fn, *args):
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self.pool, fn, *args)
        except RuntimeError:    # the plugin was removed meanwhile
            return None

    async def _watch(self):
        while True:
            try:
                self.over = await self._ask(self._fleet_over)
                self._apply()
                if not self.worker.state.executing_count:
                    await self._idle()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - keep watching
                log.exception("memtally: checking the fleet's state")
            await asyncio.sleep(self.interval)

    async def _idle(self):
        """The worker runs no task: note what it holds of its own. Freed
        memory its allocator keeps (glibc's per-thread arenas, after
        tasks on several threads) is part of that until given back, so a
        worker well above what it first held trims its heap first
        (malloc_trim, at most every TRIM_EVERY seconds), as Dask's own
        advice for unmanaged memory does."""
        base = await self._ask(self._own_bytes)
        if base is None or self.worker.state.executing_count:
            return      # a task started meanwhile: not the idle worker's
        if self.first is None:
            self.first = base
        now = time.monotonic()
        if base <= self.first + TRIM_ABOVE:
            self.trim_from = None
        elif now >= self.trimmed + TRIM_EVERY:
            if self.trim_from is not None and base >= self.trim_from:
                # The last trim gave nothing back (memtallyd's figure
                # follows the kernel's within a second): the worker holds
                # that much now, and trimming again would cost the loop's
                # pool a heap walk every few seconds for nothing.
                self.first = base
                self.trim_from = None
            else:
                self.trimmed = now
                self.trim_from = base
                # A heap walk under the arenas' locks: off the loop.
                await self._ask(_malloc_trim)
            return      # noted at the next look, once the figure follows
        # What Dask's monitor sees of the worker beyond memtally's figure
        # (its resident file pages: libraries, the interpreter), which
        # the limit memtallyd checks must leave room for.
        rss = _resident()
        if rss:
            self.gap = max(0, rss - base)
        own = base + self.gap
        self.lean = own if self.lean is None else min(self.lean, own)

    def _apply(self):
        """Pause the worker while memtally wants it paused; resume it when
        memtally no longer does (a pause of Dask's own is left alone)."""
        w = self.worker
        want = self.over or time.monotonic() < self.denied_until
        if want:
            if w.status == Status.running:
                log.info("memtally: not taking tasks (%s)",
                         "fleet over" if self.over else "denied")
                w.status = Status.paused
                # Ours only when we paused it: a pause Dask made for its
                # own memory stays Dask's to end (its monitor's check),
                # not ours to lift when memtally no longer wants one.
                self.holding = True
        elif self.holding:
            self._release_pause()

    def _release_pause(self):
        if self.holding:
            self.holding = False
            if self.worker.status == Status.paused:
                log.info("memtally: taking tasks again")
                self.worker.status = Status.running

    def _dask_pause_check(self, worker, memory):
        # Dask's memory monitor resumes a paused worker whose process is
        # under its pause threshold: not while memtally holds it.
        if self.holding and worker.status == Status.paused:
            return
        self.orig_pause_check(worker, memory)


async def dask_setup(worker):
    """`dask worker --preload memtally.dask`: the plugin on this worker,
    with its defaults (MEMTALLY_SOCKET from the worker's environment)."""
    from distributed import Worker
    if isinstance(worker, Worker):
        await worker.plugin_add(Admission(), name=Admission.name)


def _run_command(command, env):
    """One shell command as a task: its exit status and when it ran. The
    reservation's task name goes to the command as MEMTALLY_TASK, so a
    command under memtally's preload is counted against it."""
    import socket as _socket
    import subprocess
    from distributed import get_worker
    w = get_worker()
    key = w.get_current_task()
    # The task's name wins over one `env` (or the worker) carries.
    e = dict(os.environ)
    e.update(env or {})
    e["MEMTALLY_TASK"] = _task_name(key)
    start = time.time()
    rc = subprocess.run(command, shell=True, env=e).returncode
    if rc in EVICTED_STATUS:
        # The node's failure, not the command's: Dask runs it again (its
        # retries bound how often).
        raise Evicted(f"memtally: task {key}: command ended with status "
                      f"{rc} (evicted or killed by its node)")
    return {"returncode": rc, "start": start, "end": time.time(),
            "worker": w.address, "host": _socket.gethostname()}


def _command_kind(cmd, kind):
    """run_tasks' key prefix for `cmd`: the kind given (its dashes, which
    would split it, as underscores), else one per distinct command."""
    if kind and kind[0]:
        return str(kind[0]).replace("-", "_")
    return "cmd_" + hashlib.sha1(cmd.encode()).hexdigest()[:8]


def run_tasks(commands_with_bytes, n_workers=2, memory_limit="auto",
              use_memtally=True, socket=None, env=None, plugin_args=None,
              retries=3):
    """Run shell commands as Dask tasks on a LocalCluster of `n_workers`
    one-thread worker processes (`memory_limit` per worker, as Dask takes
    it; Dask's other settings are its defaults). With `use_memtally`, each
    task is annotated with its declared bytes and admitted on the
    memtallyd at `socket` (default $MEMTALLY_SOCKET) by the Admission
    plugin (`plugin_args`: its keyword arguments).

    commands_with_bytes: [(shell command, declared bytes or "600MiB"[,
    kind]), ...]. A task's key is KIND-N, so its kind (Dask's key prefix)
    is `kind`, or by default one of its own for each distinct command
    ("cmd_" and 8 hex digits of its text): the same command run again
    learns from its earlier runs, and different ones do not share a size.
    env: extra environment for the commands (e.g. LD_PRELOAD).
    Returns one dict per command, in order: command, bytes, returncode
    (negative: killed by that signal), start, end (time.time()), worker,
    or error (the task's exception, e.g. its worker was lost). A command
    its node ended (evicted: exit 75, or SIGKILL) raises Evicted, which
    Dask retries up to `retries` times.
    Dask's memory thresholds watch each worker process's own RSS, not the
    commands it starts: without memtally, nothing here holds them back.
    The workers are spawned processes: call it from under
    `if __name__ == "__main__":` in a script."""
    import dask
    from distributed import Client, LocalCluster, wait

    with LocalCluster(n_workers=n_workers, threads_per_worker=1,
                      processes=True, memory_limit=memory_limit,
                      dashboard_address=None) as cluster, \
            Client(cluster) as client:
        if use_memtally:
            client.register_worker_plugin(
                Admission(socket=socket, **(plugin_args or {})))
        futs = []
        for i, (cmd, nbytes, *kind) in enumerate(commands_with_bytes):
            ann = {"memtally_bytes": nbytes} if use_memtally else {}
            with dask.annotate(**ann):
                futs.append(client.submit(_run_command, cmd, env,
                                          key=f"{_command_kind(cmd, kind)}-{i}",
                                          pure=False, retries=retries))
        wait(futs)
        out = []
        for (cmd, nbytes, *_), f in zip(commands_with_bytes, futs):
            r = {"command": cmd, "bytes": nbytes}
            try:
                r.update(f.result())
            except Exception as e:  # noqa: BLE001 - reported per task
                r["error"] = repr(e)
            out.append(r)
        return out
