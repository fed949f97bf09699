"""Snapshot progress notifications, in Debezium's format.

Debezium publishes incremental-snapshot notifications as ``{"id", "aggregate_type", "type",
"additional_data", "timestamp"}`` with ``id`` = the execute-snapshot signal's id, string-valued
``additional_data`` and the timestamp in epoch milliseconds (as a string). We emit the same
types for one table's snapshot run: STARTED, PAUSED, RESUMED, IN_PROGRESS (at most once per
``min_interval`` seconds, with the last key read), TABLE_SCAN_COMPLETED (with the row count and
a status: SUCCEEDED, EMPTY, NO_PRIMARY_KEY, SKIPPED), COMPLETED and ABORTED (stopped, or failed
with the reason).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

AGGREGATE_TYPE = "Incremental Snapshot"
STARTED, PAUSED, RESUMED, IN_PROGRESS = "STARTED", "PAUSED", "RESUMED", "IN_PROGRESS"
TABLE_SCAN_COMPLETED, COMPLETED, ABORTED = "TABLE_SCAN_COMPLETED", "COMPLETED", "ABORTED"


def notification(kind: str, notification_id: str, additional_data: dict[str, Any],
                 timestamp_ms: int | None = None) -> dict[str, Any]:
    """One notification (values of ``additional_data`` as strings, as Debezium sends them)."""
    return {
        "id": notification_id,
        "aggregate_type": AGGREGATE_TYPE,
        "type": kind,
        "additional_data": {k: "" if v is None else str(v) for k, v in additional_data.items()},
        "timestamp": str(timestamp_ms if timestamp_ms is not None else int(time.time() * 1000)),
    }


def encode(note: dict[str, Any]) -> bytes:
    return json.dumps(note, separators=(",", ":")).encode()


def describe(note: dict[str, Any]) -> str:
    """One log line for a notification."""
    data = note["additional_data"]
    details = ", ".join(f"{k}={v}" for k, v in data.items()
                        if k not in ("connector_name", "data_collections") and v != "")
    return f"notification {note['type']} ({note['aggregate_type']} {note['id']}" + (
        f"; {details})" if details else ")")


class SnapshotNotifier:
    """Turns one table's snapshot progress into notifications, each handed to ``publish``.

    ``on_progress`` takes the reader's progress (state ``waiting``, ``open``, ``paused`` or
    ``done``, committed ``chunks`` and ``rows``, ``last_key``, ``maximum_key``) and emits on
    changes; ``finished``/``aborted`` end the run.
    """

    def __init__(self, server_name: str, table_id: str, notification_id: str,
                 publish: Callable[[dict[str, Any]], None], min_interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.server_name, self.table_id = server_name, table_id
        self.notification_id = notification_id
        self.publish = publish
        self.min_interval = min_interval
        self.clock = clock
        self._state = "waiting"
        self._chunks = 0
        self._last_progress_at: float | None = None
        self._ended = False

    def _emit(self, kind: str, **data: Any) -> None:
        self.publish(notification(kind, self.notification_id, {
            "connector_name": self.server_name, "data_collections": self.table_id, **data}))

    def on_progress(self, state: str, chunks: int, rows: int, last_key: Any = None,
                    maximum_key: Any = None) -> None:
        if self._ended:
            return
        previous, self._state = self._state, state
        if previous == "waiting" and state in ("open", "paused"):
            self._emit(STARTED)
            previous = "open"  # paused before its first chunk: STARTED, then PAUSED
        if previous == "open" and state == "paused":
            self._emit(PAUSED)
        elif previous == "paused" and state == "open":
            self._emit(RESUMED)
        if chunks > self._chunks:
            self._chunks = chunks
            now = self.clock()
            if self._last_progress_at is None or now - self._last_progress_at >= \
                    self.min_interval:
                self._last_progress_at = now
                self._emit(IN_PROGRESS, current_collection_in_progress=self.table_id,
                           maximum_key=_key_text(maximum_key),
                           last_processed_key=_key_text(last_key), rows_scanned=rows)

    def finished(self, status: str, rows: int) -> None:
        """The run ended: ``status`` is ``done``, ``stopped`` or ``skipped: <why>``."""
        if self._ended:
            return
        self._ended = True
        if status == "stopped":
            self._emit(ABORTED, reason="stopped")
            return
        if self._state == "waiting" and not status.startswith("skipped"):
            self._emit(STARTED)
        if status.startswith("skipped"):
            scan_status = "NO_PRIMARY_KEY" if "no primary key" in status else "SKIPPED"
        else:
            scan_status = "SUCCEEDED" if rows else "EMPTY"
        self._emit(TABLE_SCAN_COMPLETED, scanned_collection=self.table_id,
                   total_rows_scanned=rows, status=scan_status)
        self._emit(COMPLETED)

    def aborted(self, reason: str) -> None:
        """The run failed or was cancelled before its session ended."""
        if self._ended:
            return
        self._ended = True
        self._emit(ABORTED, reason=reason[:1000])


def _key_text(key: Any) -> str:
    if key is None:
        return ""
    if isinstance(key, list | tuple):
        return "[" + ", ".join(str(v) for v in key) + "]"
    return str(key)
