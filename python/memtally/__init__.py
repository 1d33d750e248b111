"""memtally for Python: a client for memtallyd (memtally.client) and a
Celery integration that asks the node's memtallyd before a task runs
(memtally.celery). `python3 -m memtally` is the client as a command."""
from .client import (DEFAULT_SOCKET, STATES, Client, MemtallyError, human,
                     parse_size, pb)

__all__ = ["Client", "MemtallyError", "DEFAULT_SOCKET", "STATES", "human",
           "parse_size", "pb"]
