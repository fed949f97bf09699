"""The snapshot reader's sessions on the source and their retries.

A reader reads a table for minutes or hours from a replica that may restart or fail over
meanwhile: every read goes through :class:`ReplicaConnection`, which reconnects with backoff
when the connection drops and re-reads the schema once when a DDL removed a selected column.
Kept apart from ``reader``, which decides what to read and when; this module only knows how a
read reaches the server.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import pymysql

from cdc_platform.capture.snapshot import native
from cdc_platform.capture.snapshot.errors import SnapshotError
from cdc_platform.capture.snapshot.native import SQL_ERRORS
from cdc_platform.capture.source import SourceSession, is_retriable

_READ_ATTEMPTS = 5
_ER_BAD_FIELD = 1054


class ReplicaConnection:
    """The reader's sessions on the source (a replica, usually) and its retries.

    Two sessions, each opened on first use (not before the engine's ack): chunks (watermarks
    and SELECTs) are read over mysqlclient, raw into Arrow (see ``native``); everything else
    over PyMySQL. ``native_chunks`` False: chunks over PyMySQL too. A read that fails on a
    dropped connection is tried again on new sessions, with backoff."""

    def __init__(self, connection_settings: dict[str, Any], native_chunks: bool) -> None:
        self.connection_settings = connection_settings
        self._source = SourceSession(connection_settings)
        self.native_chunks = native_chunks and native.available()
        self._native_conn: Any = None

    def connection(self) -> pymysql.Connection:
        """The read-only source session, opened on first use (not before the engine's ack)."""
        return self._source.connection()

    def chunk_connection(self, where: str, log: Any) -> Any:
        """The session chunks are read on: mysqlclient's, opened on first use; PyMySQL's
        when the connection settings have no mysqlclient form (logged once)."""
        if not self.native_chunks:
            return self.connection()
        if self._native_conn is None:
            if native.native_settings(self.connection_settings) is None:
                log.warning(f"{where}: the source connection settings "
                            f"({', '.join(sorted(self.connection_settings))}) have no "
                            "mysqlclient form; reading chunks with PyMySQL (slower)")
                self.native_chunks = False
                return self.connection()
            self._native_conn = native.connect(self.connection_settings)
        return self._native_conn

    def reconnect(self) -> None:
        """Close both sessions: the next read connects again."""
        self._source.close()
        if self._native_conn is not None:
            with contextlib.suppress(Exception):  # broken anyway
                self._native_conn.close()
        self._native_conn = None  # the next attempt connects again

    def read(self, what: str, action: Callable[[pymysql.Connection], Any], *, where: str,
             log: Any, reload_schema: Callable[[], Any], chunks: bool = False) -> Any:
        """Run a read (on the chunk session with ``chunks``), reconnecting with backoff when
        the connection drops; ``reload_schema`` once when the table lost a selected column
        (a DDL). ``what`` and ``where`` name the read and the snapshot in errors and logs."""
        schema_reloaded = False
        for attempt in range(1, _READ_ATTEMPTS + 1):
            try:
                return action(self.chunk_connection(where, log) if chunks else self.connection())
            except SQL_ERRORS as error:
                code = error.args[0] if error.args else None
                if code == _ER_BAD_FIELD and not schema_reloaded:
                    schema_reloaded = True
                    log.info(f"{where}: {what} failed ({error}); the table changed, "
                             "re-reading its schema")
                    reload_schema()
                    continue
                if not is_retriable(error) or attempt == _READ_ATTEMPTS:
                    raise SnapshotError(f"{where}: {what} failed: {error}; check that "
                                        "the source is reachable, then materialise the "
                                        "snapshot again") from error
                log.warning(f"{where}: {what} failed ({error}); reconnecting "
                            f"(attempt {attempt} of {_READ_ATTEMPTS})")
                time.sleep(min(5.0, 0.2 * 2 ** attempt))
                self.reconnect()
        raise AssertionError("unreachable")
