"""memtally.celery - ask the node's memtallyd before a Celery task runs.

    from celery import Celery
    import memtally.celery

    app = Celery("jobs", broker="redis://broker:6379/0")
    memtally.celery.setup(app)

    @app.task(base=memtally.celery.AdmittedTask, memtally_bytes="600MiB",
              memtally_group="etl")
    def crunch(path):
        ...

Each worker asks its own node's memtallyd (`memtally_socket` in the app's
config, else $MEMTALLY_SOCKET, else /run/memtally/memtally.sock) for
`memtally_bytes` before it runs such a task. Admitted: the task runs under
the reservation (released when it returns, or by its TTL if the worker
dies), as a task run inside its pool process on its thread: when the pool
process runs under memtally's preload, what that thread allocates from
then on is the task's use, so the reservation stops counting what the
process's figure already does, and the task's kind (its name) learns what
it really holds. Denied: the message goes back to the broker's queue untouched, for
another node's worker (or this one, later) to take.

How a denied task goes back, and why this way:

- `Reject(requeue=True)`, not `retry()`. A retry acknowledges the message and
  publishes a new one (with a retry count that can run out: the task would
  be lost after max_retries), and with a countdown the new message sits in
  one worker's memory until then. A reject hands the same message back to
  the broker before any of the task's code ran: same id, no count, nothing
  stored in the result backend, so no task is lost and none runs twice.
- That needs late acknowledgement (`acks_late = True`, set on the class):
  with Celery's default early acknowledgement the message is already gone
  when the task starts. Late acknowledgement has a cost of its own: a task
  whose worker is killed mid-run is delivered again (redis: after the
  broker transport's visibility_timeout), as with any acks_late task. Leave
  `worker_prefetch_multiplier` at its default (4) with the redis broker: at
  1 an acks_late worker restarts its BRPOP only when its event loop next
  wakes up, which cost 1.3 s per task here (4 s with --without-heartbeat)
  against 0.1 s. Prefetched messages a worker cannot admit go back to the
  queue one by one, as above.
- A node whose memtallyd says no would otherwise take its own requeued task
  straight back (the redis transport puts it at the far end of the queue,
  but a short queue comes round fast) and deny it again, in a loop. So the
  worker that denied stops consuming (its consumer cancels its queues; the
  tasks it runs go on) for `memtally_pause` seconds (default 2), and
  resumes only once its memtallyd no longer reports the fleet `over` (asked
  once per pause: one GetUsage, on a thread, never on the worker's event
  loop). Other nodes' workers take the queue
  meanwhile. `setup(app)` installs this consumer step.

Evicted: when the node nears its edge, memtallyd's guard may evict a
task's processes; `memtally run` then exits 75 (EX_TEMPFAIL). A task that
raises Evicted (`memtally.celery.run(argv)` does when its command exits
75) or subprocess.CalledProcessError with status 75 (`subprocess.run(...,
check=True)`) is retried with Celery's own retry after
`memtally_retry_delay` seconds (default 1), at most `memtally_retries`
times (default 3; then it fails with Evicted): an eviction is the node's
failure, not the task's, and the guard records it against the task's kind
so its next run is sized larger. Retry, not Reject: the message's retry
count bounds a task that is evicted every time. A pool process evicted
mid-task (a task that holds its memory in the pool process itself) is
Celery's WorkerLostError: with acks_late the task fails, as Celery does
by default, unless the task sets `reject_on_worker_lost = True`, which
requeues it without a bound.

Fail open: when the node's memtallyd cannot be reached, the task runs (each
worker process says so once, and again after memtallyd was back); memtally
must never stop work because it is missing.

Task options (class attributes, or keyword arguments of @app.task):
`memtally_bytes` (int or "600MiB"; unset or 0: no admission),
`memtally_group`, `memtally_ttl` (seconds the reservation outlives a lost
worker; 0: the server's default), `memtally_retries`,
`memtally_retry_delay`. App config: `memtally_socket`,
`memtally_pause`, `memtally_timeout` (seconds per memtallyd request,
default 2).
"""
import logging
import os
import subprocess
import threading

from celery import Task, bootsteps
from celery.exceptions import (Reject, SoftTimeLimitExceeded, Terminated,
                               TimeLimitExceeded)
from celery.worker.request import Request

from .client import (DEFAULT_SOCKET, EVICTED_STATUS, NAME_MAX, Client,
                     MemtallyError, denied_for_ever, never_fits, pb,
                     positive, printable, refused, state_name, task_name,
                     task_settings)

log = logging.getLogger("memtally.celery")

_failing_open = set()   # sockets we already said we run without
_kinds_refused = set()  # kinds memtallyd refused (its kinds cap): said once
# What the pool raises into a running task to stop it (its time limits, a
# revoke with terminate): never mistaken for memtallyd failing, even while
# the task waits on memtallyd's answer.
_STOPS = (SoftTimeLimitExceeded, TimeLimitExceeded, Terminated)


class Denied(Reject):
    """A task memtallyd did not admit; requeued for another worker."""

    def __init__(self, reason, node):
        super().__init__(f"memtally denied on {node}: {reason}", requeue=True)
        self.reason = reason
        self.node = node

    def __reduce__(self):
        # It crosses from the pool process to the worker: rebuild it from
        # its own arguments, not Reject's.
        return (Denied, (self.reason, self.node))


def _conf(app, key, default):
    v = app.conf.get(key)
    return default if v is None else v


_bad_conf = set()  # settings already said to be wrong


def _seconds(app, key, default):
    """Setting `key` as seconds above 0; its default, said once, when it
    is not (0 or less polled memtallyd in a tight loop, or timed every
    request out at once)."""
    try:
        return positive(_conf(app, key, default), key)
    except ValueError as e:
        if key not in _bad_conf:
            _bad_conf.add(key)
            log.warning("memtally: %s; %ss used", e, default)
        return float(default)


def _socket(app):
    return (_conf(app, "memtally_socket", None)
            or os.environ.get("MEMTALLY_SOCKET") or DEFAULT_SOCKET)


def _fail_open(sock, err):
    if sock not in _failing_open:
        _failing_open.add(sock)
        log.warning("memtally: memtallyd at %s not reachable (%s); running "
                    "tasks without admission", sock, err)


# `memtally run`'s exit status when the node guard evicted its command:
# sysexits' EX_TEMPFAIL, "try again later", which job runners retry.
EX_TEMPFAIL = 75


class Evicted(Exception):
    """The node guard evicted the task's processes: a failure of the node,
    not of the task, so the task is retried."""


def run(args, **kwargs):
    """subprocess.run for a task's command (e.g. `memtally run ...`):
    raises Evicted when its node ended it (exit 75, `memtally run` evicted
    by the node guard; or SIGKILL), so that the task is retried, as
    memtally.dask does; otherwise the CompletedProcess."""
    p = subprocess.run(args, **kwargs)
    if p.returncode in EVICTED_STATUS:
        raise Evicted(f"{args!r} ended by its node (status "
                      f"{p.returncode}: evicted or killed)")
    return p


class NeverAdmitted(Exception):
    """A task its node's memtallyd can never admit: a group its worker's
    user may not use, or a size above the limit that denied it (the fleet's,
    its group's, the node guard's line, what one uid may reserve). It fails
    (not requeued to be denied again)."""


def _task_thread():
    """The thread Admit names as the task's: none (the whole process's
    growth is its use) in a process's main thread, where Celery's prefork
    and solo pools run one task at a time; this thread in a thread pool.
    Measured by one thread, a task would leave out what its process grows
    by elsewhere (pymalloc's arenas, helper threads), and its kind would
    learn too small a size. The gevent and eventlet pools run several
    tasks at once on one thread: memtallyd counts each an equal share of
    what that thread grew by."""
    if threading.current_thread() is threading.main_thread():
        return 0
    return threading.get_native_id()


def _evicted(exc):
    """The eviction `exc` stands for, or None: Evicted itself, or a
    command run with check=True that its node ended (EVICTED_STATUS)."""
    if isinstance(exc, Evicted):
        return exc
    if (isinstance(exc, subprocess.CalledProcessError)
            and exc.returncode in EVICTED_STATUS):
        return Evicted(f"{exc.cmd!r} ended by its node (status "
                       f"{exc.returncode}: evicted or killed)")
    return None


class AdmittedRequest(Request):
    """The worker side of a denial: the task's message is rejected (the
    Reject raised in the pool process does that) and this worker stops
    taking tasks for a while, so that it does not take the same one back."""

    def on_failure(self, exc_info, send_failed_event=True, return_ok=False):
        exc = getattr(exc_info, "exception", None)
        # billiard wraps it (ExceptionWithTraceback); only the prefork
        # pool's pickling unwraps it on the way, so the solo, threads,
        # gevent and eventlet pools see the wrapper.
        exc = getattr(exc, "exc", exc)
        if isinstance(exc, Denied):
            log.info("memtally: task %s[%s] denied on %s (%s); requeued",
                     self.name, self.id, exc.node, exc.reason)
            try:
                _Pauser.pause_current()
            except Exception:  # noqa: BLE001 - the message is rejected still
                log.exception("memtally: pausing the consumer")
        return super().on_failure(exc_info, send_failed_event, return_ok)


class AdmittedTask(Task):
    """A task that runs only when its node's memtallyd admits it."""

    acks_late = True            # a rejected message must still be ours
    Request = "memtally.celery:AdmittedRequest"
    memtally_bytes = 0
    memtally_group = ""
    memtally_ttl = 0
    memtally_retries = 3        # evictions retried; then the task fails
    memtally_retry_delay = 1.0  # seconds before an evicted task runs again

    def __call__(self, *args, **kwargs):
        try:
            return self._admitted_call(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - only an eviction is ours
            ev = _evicted(e)
            if ev is None:
                raise
            log.warning("memtally: task %s[%s] evicted (%s); retry %d of "
                        "%d in %ss", self.name, self.request.id, ev,
                        self.request.retries + 1, self.memtally_retries,
                        self.memtally_retry_delay)
            # Celery's retry: a new message with the retry count, so a
            # task evicted every time fails after memtally_retries.
            raise self.retry(exc=ev, countdown=self.memtally_retry_delay,
                             max_retries=self.memtally_retries)

    def _body(self, *args, **kwargs):
        """The task's body. In a worker Celery has pushed the task's
        request already: Task.__call__ would push an empty one over it
        (self.request.id None, self.retry() re-raising), so the body is
        self.run there, as Celery advises for a class with its own
        __call__; called directly, Task.__call__ as usual."""
        if self.request.called_directly:
            return super().__call__(*args, **kwargs)
        return self.run(*args, **kwargs)

    def _admitted_call(self, *args, **kwargs):
        try:
            nbytes, group, ttl = task_settings(
                self.memtally_bytes, self.memtally_group, self.memtally_ttl)
        except ValueError as e:  # a bad setting must not fail the task
            log.warning("memtally: task %s: %s; running it without "
                        "admission", self.name, e)
            nbytes = 0
        # Called as a function, or run eagerly in the caller's process: no
        # worker's task to admit (a denial would raise into plain code).
        if (not nbytes or self.request.called_directly
                or getattr(self.request, "is_eager", False)):
            return self._body(*args, **kwargs)
        sock = _socket(self.app)
        # As memtallyd takes them: a name with a control or bidi
        # character, or past its length, was refused, and every run of
        # the task went unadmitted.
        task_id = task_name(self.request.id or "")
        kind = printable(self.name or "", NAME_MAX)
        try:
            with Client(sock, timeout=_seconds(self.app,
                                            "memtally_timeout", 2)) as c:
                # The task's name is its kind: memtallyd reserves what
                # this task's recent runs used, nbytes being its ceiling.
                # It runs here, in this pool process: memtallyd counts
                # what it allocates from now on as its use (processes it
                # starts with MEMTALLY_TASK, as theirs): the whole
                # process's growth where it runs one task at a time (the
                # prefork and solo pools run it in the main thread), this
                # thread's where a thread pool runs several.
                r = c.admit(nbytes, group=group, task=task_id,
                            ttl_seconds=ttl,
                            kind=kind, in_process=True,
                            thread=_task_thread())
            forever = denied_for_ever(r)
            if forever == "kinds":
                # This uid keeps as many kinds as it may: admitted on
                # its declaration, without a kind, rather than requeued
                # until old kinds age out (days).
                if self.name not in _kinds_refused:
                    _kinds_refused.add(self.name)
                    log.warning("memtally: kind %s refused (%s); its tasks "
                                "are admitted on memtally_bytes",
                                self.name, r.reason)
                with Client(sock, timeout=_seconds(
                        self.app, "memtally_timeout", 2)) as c:
                    r = c.admit(nbytes, group=group, task=task_id,
                                ttl_seconds=ttl,
                                in_process=True, thread=_task_thread())
                forever = denied_for_ever(r)
        except _STOPS:
            raise
        except Exception as e:  # noqa: BLE001 - whatever breaks, fail open
            if refused(e):
                # memtallyd answers, and refuses what this task asks
                # (a group name it does not take): the task's settings.
                log.warning("memtally: task %s: memtallyd refused its "
                            "request (%s); running it without admission",
                            self.name, e)
            else:
                _fail_open(sock, e)
            return self._body(*args, **kwargs)
        _failing_open.discard(sock)
        # Larger than the limit that denied it, which others' use can at
        # best leave empty: as memtally.dask does, failed at once.
        fits = "" if forever or r.admitted else never_fits(r)
        if forever or fits:
            # No room that frees will change it: failed, not requeued.
            raise NeverAdmitted(f"memtally: task {self.name}[{task_id}] "
                                f"can never be admitted on "
                                f"{self.request.hostname or sock}: "
                                f"{fits + ' ' if fits else ''}{r.reason}")
        if not r.admitted:
            raise Denied(r.reason, self.request.hostname or sock)
        try:
            return self._body(*args, **kwargs)
        finally:
            try:
                with Client(sock, timeout=_seconds(
                        self.app, "memtally_timeout", 2)) as c:
                    c.release(r.reservation)
            except MemtallyError as e:
                # Not found: ended already (its TTL, or a memtallyd that
                # restarted since, which keeps no grants). Else its TTL
                # ends it; nothing else to do.
                if e.code != pb.ERROR_NOT_FOUND:
                    log.warning("memtally: releasing %s: %s",
                                r.reservation, e)
            except Exception as e:  # noqa: BLE001 - never the task's outcome
                log.warning("memtally: releasing %s: %s", r.reservation, e)


class _Pauser(bootsteps.StartStopStep):
    """Consumer step: stop and resume taking tasks after a denial. The
    consumer is the worker's event loop's: with an event loop (a hub) it
    is touched only from the loop's thread. The prefork and solo pools
    run on_failure there; a thread pool runs it on the task's thread,
    which only asks, and the loop's next tick (at most a second away)
    pauses. Without a hub (green pools, a transport that cannot poll) the
    resume timer may run on a thread of its own: `mutex` keeps the list
    of paused queues whole, so none is left cancelled for good."""

    requires = {"celery.worker.consumer.tasks:Tasks"}
    current = None
    lock = threading.Lock()

    def __init__(self, c, **kwargs):
        super().__init__(c, **kwargs)
        self.c = c
        self.paused = []        # the kombu queues we stopped consuming
        self.timer = None
        self.asking = None      # (thread, its answer) while one asks
        self.mutex = threading.RLock()
        self.loop = None        # the thread the consumer's loop runs on
        self.wanted = False     # a pause asked for off that thread

    def start(self, c):
        self.c = c
        self.loop = threading.get_ident()
        hub = getattr(c, "hub", None)
        if hub is not None:
            hub.on_tick.add(self._tick)
        with _Pauser.lock:
            _Pauser.current = self

    def stop(self, c):
        with _Pauser.lock:
            if _Pauser.current is self:
                _Pauser.current = None
        hub = getattr(c, "hub", None)
        if hub is not None:
            hub.on_tick.discard(self._tick)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    @classmethod
    def pause_current(cls):
        with cls.lock:
            p = cls.current
        if p is None:
            return
        if getattr(p.c, "hub", None) is not None and \
                threading.get_ident() != p.loop:
            p.wanted = True
            return
        p.pause()

    def _tick(self):
        if self.wanted:
            self.wanted = False
            self.pause()

    def pause(self):
        c = self.c
        tc = getattr(c, "task_consumer", None)
        if tc is None:
            return
        with self.mutex:
            for q in list(tc.queues):
                if tc.consuming_from(q.name):
                    tc.cancel_by_queue(q.name)
                    self.paused.append(q)
            if self.paused and self.timer is None:
                log.info("memtally: not taking tasks from %s for %ss",
                         ",".join(q.name for q in self.paused),
                         self._delay())
                self._arm()

    def _delay(self):
        return _seconds(self.c.app, "memtally_pause", 2)

    def _arm(self):
        self.timer = self.c.timer.call_after(self._delay(), self._maybe_resume)

    def _fleet_over(self):
        sock = _socket(self.c.app)
        try:
            with Client(sock, timeout=_seconds(
                    self.c.app, "memtally_timeout", 2)) as cl:
                return state_name(cl.usage().state) == "over"
        except Exception as e:  # noqa: BLE001 - fail open: resume
            _fail_open(sock, e)
            return False

    def _maybe_resume(self):
        with self.mutex:
            self.timer = None
            # Asked on a thread of its own: a stalled memtallyd must not
            # hold the worker's event loop (heartbeats, acks, the pool's
            # results) for its timeouts. The loop looks again every 50 ms.
            if self.asking is None:
                box = {}
                t = threading.Thread(
                    target=lambda: box.setdefault("over", self._fleet_over()),
                    name="memtally-resume", daemon=True)
                t.start()
                self.asking = (t, box)
            t, box = self.asking
            if t.is_alive():
                self.timer = self.c.timer.call_after(0.05, self._maybe_resume)
                return
            self.asking = None
            if box.get("over"):
                self._arm()
                return
            tc = self.c.task_consumer
            for q in self.paused:
                if not tc.consuming_from(q.name):
                    tc.add_queue(q)
            self.paused = []
            tc.consume()
            log.info("memtally: taking tasks again")


def setup(app):
    """Install the consumer step that pauses a worker after a denial.
    Call it before the worker starts (where the app is made)."""
    app.steps["consumer"].add(_Pauser)
    return app
