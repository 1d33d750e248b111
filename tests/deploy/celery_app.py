"""The Celery app of tests/deploy/test_celery.py: one task that needs
16 MiB from its node's memtallyd and records where it ran."""
import os
import time

import redis
from celery import Celery

import memtally.celery

BROKER_SOCKET = os.environ["MT_REDIS_SOCKET"]
app = Celery("mtjobs", broker="redis+socket://" + BROKER_SOCKET)
app.conf.update(
    task_default_queue="mt",
    memtally_pause=float(os.environ.get("MT_PAUSE", "1")),
    memtally_timeout=float(os.environ.get("MT_TIMEOUT", "2")),
    broker_connection_retry_on_startup=True,
    # Each line names its thread: the test of a thread pool checks which
    # thread touched the consumer.
    worker_log_format="[%(asctime)s: %(levelname)s/%(processName)s "
                      "%(threadName)s] %(message)s",
)
memtally.celery.setup(app)
ledger = redis.Redis(unix_socket_path=BROKER_SOCKET)


@app.task(base=memtally.celery.AdmittedTask, memtally_bytes="16MiB",
          memtally_group="celery", memtally_ttl=60)
def work(i):
    node = os.environ.get("MT_NODE", "?")
    ledger.rpush("mt:ran", f"{work.request.id} {node} {i}")
    time.sleep(0.1)
    return node


@app.task(base=memtally.celery.AdmittedTask, memtally_bytes="1GiB",
          memtally_ttl=60)
def too_big():
    """Declared above any node's fleet limit: never admitted anywhere."""
    ledger.rpush("mt:ran", "too_big")


@app.task(bind=True, base=memtally.celery.AdmittedTask,
          memtally_bytes="8MiB", memtally_ttl=60)
def evictable(self, argv):
    """Runs `argv` (a `memtally run` of a command), as a task would with
    subprocess.run(check=True); each attempt is noted in the ledger."""
    import subprocess
    ledger.rpush("mt:attempts", f"{self.request.id} {self.request.retries}")
    rc = subprocess.run(argv, check=True).returncode
    ledger.rpush("mt:done", f"{self.request.id} {rc}")
    return rc


@app.task(base=memtally.celery.AdmittedTask, memtally_bytes="16MiB",
          memtally_ttl=600, soft_time_limit=0.5)
def limited():
    """Its soft time limit is shorter than memtallyd's answer may take."""
    ledger.rpush("mt:ran", "limited")


@app.task(base=memtally.celery.AdmittedTask, memtally_bytes="16MiB",
          memtally_ttl=60, name="mtjobs.\u202e" + "x" * 300)
def oddly_named():
    """A name memtallyd takes as no kind (a bidi character, 300 bytes
    past the 255 it takes): the task is admitted all the same."""
    ledger.rpush("mt:ran", "oddly_named")
