"""memtally for Python: a client for memtallyd (memtally.client), and
Celery and Dask integrations that ask the node's memtallyd before a task
runs (memtally.celery, memtally.dask). `python3 -m memtally` is the client
as a command."""
from .client import (DEFAULT_SOCKET, STATES, Client, MemtallyError,
                     denied_for_ever, human, parse_size, pb, state_name,
                     watch)

__all__ = ["Client", "MemtallyError", "DEFAULT_SOCKET", "STATES",
           "denied_for_ever", "human", "parse_size", "pb", "state_name",
           "watch"]
