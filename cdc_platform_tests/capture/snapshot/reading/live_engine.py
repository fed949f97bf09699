"""Helpers of tests that take whole snapshots beside the real capture engine, running in a thread
as the stream_changes job runs it, and end with target == source (used by the reader's tests
and by tests elsewhere that need a snapshot or an engine beside them).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq

from cdc_platform.capture import source as source_sql
from cdc_platform.capture.landing.zone import Checkpoint
from cdc_platform.capture.snapshot.protocol import (
    latest_session,
    read_request,
)
from cdc_platform.capture.snapshot.reading.reader import SnapshotReader
from cdc_platform.capture.source import selector_from_settings

if TYPE_CHECKING:  # (a helper module, not a test: it does not import the conftest)
    from cdc_platform_tests.conftest import CdcEnv


def _wait_until(condition: Callable[[], bool], timeout: float = 90.0) -> None:
    """Poll until ``condition`` holds; the generous default is for a loaded CI machine
    (the engine's snapshot tick under load average 10 took over 30 s), a passing wait ends
    at once."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


@contextmanager
def streaming(env: CdcEnv) -> Iterator[Any]:
    """The capture engine running in a thread, as the stream_changes job runs it."""
    engine = env.engine()
    stop_engine = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            engine.run(stop_engine)
        except BaseException as error:  # noqa: BLE001 - re-raised below
            errors.append(error)

    thread = threading.Thread(target=run, name="test-engine", daemon=True)
    thread.start()
    try:
        yield engine
    finally:
        stop_engine.set()
        thread.join(60)
    if errors:
        raise errors[0]


def snapshot_reader(env: CdcEnv, table: str, **options: Any) -> SnapshotReader:
    options.setdefault("poll_seconds", 0.05)
    options.setdefault("ack_timeout_seconds", 30)
    options.setdefault("stall_timeout_seconds", 60)
    selector = selector_from_settings(env.settings)
    options.setdefault("selector", selector)
    connection = env.settings.source.connection_settings()
    with source_sql.source_connection(connection) as conn:
        schema = selector.shape(source_sql.read_table_schema(conn, env.db, table))
    return SnapshotReader(env.landing, connection, "mariadb", schema, **options)


def snapshot_while_writing(env: CdcEnv, table: str, write: Callable[[threading.Event], None],
                           **options: Any) -> Any:
    """Snapshot ``table`` (``snapshot_reader`` with ``options``) with the engine streaming and
    ``write(done)`` running in a thread until the snapshot ended (``done`` is set then); the
    reader's result."""
    done = threading.Event()
    with streaming(env):
        writer = threading.Thread(target=write, args=(done,), daemon=True)
        writer.start()
        try:
            return snapshot_reader(env, table, **options).run()
        finally:
            done.set()
            writer.join(30)


def finish_and_reconcile(env: CdcEnv, spark: Any, *tables: str) -> None:
    """Land everything, materialise, and require target == source for each table."""
    env.catch_up()
    for table in tables:
        env.materialise(spark, table)
        result = env.reconcile(spark, table)
        assert result.ok, (table, result.to_metadata())


def invisible(env: CdcEnv, *statements: str) -> None:
    """Statements the binlog never sees: only a snapshot can bring their effect to the target."""
    env.execute("SET SESSION sql_log_bin = 0", *statements)


def _items(env: CdcEnv, table: str = "items") -> None:
    env.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, name VARCHAR(40), "
                "price DECIMAL(10,2), status VARCHAR(8))")


def _landed_rows(env: CdcEnv, table: str, op: str) -> list[tuple[Any, ...]]:
    checkpoint = env.landing.read_checkpoint()
    assert checkpoint is not None
    rows = []
    for first, _, path in env.landing.segments(env.db, table):
        if first >= checkpoint.next_pos:
            continue
        data = pq.read_table(path)
        user = [f.name for f in data.schema if not f.name.startswith("__cdc")]
        for record in data.to_pylist():
            if record["__cdc_op"] == op and record["__cdc_pos"] < checkpoint.next_pos:
                rows.append(tuple(record[c] for c in user))
    return rows


def _requested(env: CdcEnv, table: str) -> str | None:
    request = read_request(env.landing, env.db, table)
    return request.action if request else None


def _engine_session(env: CdcEnv, table: str) -> dict[str, Any]:
    """The table's newest session the engine recorded (the checkpoint's, else the one that
    left it for ended_sessions.json)."""
    session = latest_session(env.landing, env.landing.read_checkpoint(), f"{env.db}.{table}")
    assert session is not None
    return session.to_dict()


def _engine_state(env: CdcEnv, table: str) -> str | None:
    session = latest_session(env.landing, env.landing.read_checkpoint(), f"{env.db}.{table}")
    return None if session is None else str(session.state)


class EngineThread:
    """The capture engine in a thread that a test can stop and start again."""

    def __init__(self, env: CdcEnv) -> None:
        self.env = env
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop = threading.Event()
        engine, stop_engine = self.env.engine(), self._stop

        def run() -> None:
            try:
                engine.run(stop_engine)
            except BaseException as error:  # noqa: BLE001 - checked by the test
                self.errors.append(error)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
        assert not self.errors, self.errors


def _wait_paused_and_caught_up(env: CdcEnv, table: str) -> None:
    """The engine holds the table's session paused and has checkpointed all of the binlog."""
    _wait_until(lambda: _engine_state(env, table) == "paused")
    _wait_caught_up(env)


def _wait_caught_up(env: CdcEnv) -> None:
    """Until the engine's checkpoint is at the source's binlog position: past the table's
    CREATE TABLE, so that a session it opens now does not end for a restart at that DDL (the
    tests that stop the engine after the acknowledgement could not acknowledge a new one)."""
    _wait_until(lambda: (env.landing.read_checkpoint() or Checkpoint("", "")).gtid == env.query(
        "SELECT @@GLOBAL.gtid_binlog_pos")[0][0])
