"""The exclusive right to commit to one lake table, for every writer of it: Spark's MERGEs
(``LakeTable.writing``) and the Spark-free initial append (``lake.arrow_load``) take the same
lock, so they take turns instead of invalidating each other's metadata commits."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator

_commit_lock = threading.RLock()  # commit properties and branch writes of one process
_held_locks = threading.local()  # table lock files this thread holds (table_lock)


@contextlib.contextmanager
def table_lock(lock_dir: str | None, namespace: str, name: str) -> Iterator[None]:
    """Hold the table's lock: within the process always, and across processes sharing a
    local Hadoop-catalog warehouse when ``lock_dir`` is its root (``Lake.lock_dir``: there the
    Java catalog's rename onto the next metadata file overwrites, so two processes could both
    "commit" one version; catalog services are atomic by themselves). Re-entrant per
    thread."""
    with _commit_lock:
        if lock_dir is None:
            yield
            return
        os.makedirs(lock_dir, exist_ok=True)
        path = os.path.join(lock_dir, f".{namespace}.{name}.cdc-lock")
        held = _held_locks.__dict__.setdefault("paths", set())
        if path in held:  # re-entered by this thread: flock on a new descriptor would wait
            yield
            return
        with open(path, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            held.add(path)
            try:
                yield
            finally:
                held.discard(path)
                fcntl.flock(handle, fcntl.LOCK_UN)
