"""The exclusive right to commit to one lake table, for every writer of it: Spark's MERGEs
(``LakeTable.writing``) and the Spark-free writers (``lake.arrow_merge``) take the same lock,
so they take turns instead of invalidating each other's metadata commits. Writers of
different tables do not wait for each other, except Spark's, which take turns in a process
(``spark_commits``: their commit properties and private branches go through one driver)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator

_spark_lock = threading.RLock()  # Spark's commits of one process, whatever the table
_locks_lock = threading.Lock()
_table_locks: dict[tuple[str | None, str, str], threading.RLock] = {}
_held_locks = threading.local()  # table lock files this thread holds (table_lock)


@contextlib.contextmanager
def spark_commits() -> Iterator[None]:
    """Hold the process's turn for Spark commits (commit properties are set in the driver's
    JVM for the committing thread; branch writes of two tables at once were never needed)."""
    with _spark_lock:
        yield


@contextlib.contextmanager
def table_lock(lock_dir: str | None, namespace: str, name: str) -> Iterator[None]:
    """Hold the table's lock: within the process always, and across processes sharing a
    local Hadoop-catalog warehouse when ``lock_dir`` is its root (``Lake.lock_dir``: there the
    Java catalog's rename onto the next metadata file overwrites, so two processes could both
    "commit" one version; catalog services are atomic by themselves). Re-entrant per
    thread."""
    key = (lock_dir, namespace, name)
    with _locks_lock:
        lock = _table_locks.setdefault(key, threading.RLock())
    with lock:
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
