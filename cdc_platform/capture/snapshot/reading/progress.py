"""Where a snapshot reader is: its progress and result for the run's log and metadata, and
``reader.state``, its own record of ranges still to read and chunks written, from which a later
reader resumes the session of one that died (docs/snapshots.md)."""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from cdc_platform.capture.keys import Key
from cdc_platform.capture.snapshot.chunks import SkippedTable

# ---- progress and result -----------------------------------------------------------------------


class ReaderState(enum.StrEnum):
    """Where a reader's session is, as its progress reports it."""

    WAITING = "waiting"  # for the capture engine to acknowledge the session
    OPEN = "open"
    PAUSED = "paused"
    DONE = "done"


@dataclass(frozen=True)
class SnapshotProgress:
    """Where a running snapshot is; handed to ``on_progress`` after every change."""

    table_id: str
    session_id: str
    state: ReaderState
    rows: int  # rows of committed chunks, as read
    chunks: int  # committed chunks
    pending: int  # chunks written, not yet decided
    rejected: int
    reselected: int
    last_key: list[Any] | None  # the upper key of the last chunk read (manifest encoding)
    elapsed_seconds: float
    maximum_key: list[str] | None = None  # the largest key at the session's start, as text


def describe_progress(progress: SnapshotProgress) -> str:
    """One line for a log: where the snapshot is."""
    if progress.state == ReaderState.WAITING:
        return (f"snapshot of {progress.table_id}: waiting for the capture engine (the "
                f"stream_changes job) to acknowledge session {progress.session_id}; "
                f"{progress.elapsed_seconds:.0f}s")
    last = ", ".join(str(v) for v in progress.last_key) if progress.last_key else "-"
    return (f"snapshot of {progress.table_id}: {progress.state}, {progress.rows} rows in "
            f"{progress.chunks} committed chunks, {progress.pending} pending, "
            f"{progress.rejected} rejected; last key read {last}; "
            f"{progress.elapsed_seconds:.0f}s")


class SnapshotStatus(enum.StrEnum):
    """How a snapshot run ended: the one spelling for the reader, the asset and the CLI."""

    DONE = "done"  # every chunk committed: the table was read whole
    STOPPED = "stopped"  # a stop (signal or run) ended it; committed chunks stay applied
    SKIPPED = "skipped"  # not read at all (``reason``: no usable chunk key)


@dataclass(frozen=True)
class SnapshotResult:
    """What a snapshot did: its ``status`` (``reason``: why it was skipped)."""

    table_id: str
    session_id: str
    status: SnapshotStatus  # (a plain string is converted: ValueError if it is none of them)
    rows: int = 0
    chunks: int = 0
    rejected: int = 0
    reselected: int = 0
    duration_seconds: float = 0.0
    start_gtid: str = ""
    end_gtid: str = ""
    rows_emitted: int | None = None  # what the engine landed (touched keys are dropped)
    restarts: int = 0  # sessions the engine ended for a DDL, each followed by a full re-read
    reason: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", SnapshotStatus(self.status))

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.duration_seconds if self.duration_seconds > 0 else 0.0

    @property
    def skipped(self) -> bool:
        return self.status is SnapshotStatus.SKIPPED

    @property
    def status_text(self) -> str:
        """The status as a user reads it: ``done``, ``stopped`` or ``skipped: <reason>``."""
        if self.skipped:
            return SkippedTable(self.table_id, self.reason).status
        return str(self.status)


# ---- reader.state: the reader's own progress (to resume after its process died) ---------------


@dataclass(frozen=True)
class KeyRange:
    """A key range still to read: strictly after ``after``, up to ``high`` (raw values).

    ``high`` None: up to whatever the largest key is (only when the table looked empty).
    ``last``: the range ends at the session's maximum key, so its last chunk is ``complete``.
    """

    after: Key | None
    high: Key | None
    last: bool


@dataclass
class WrittenChunk:
    """A chunk the reader published (or is about to), until the engine decides it."""

    seq: int
    range: KeyRange
    rows: int
    complete: bool
    after_gtid: str


_RAW_TYPES: dict[str, Callable[[Any], Any]] = {
    "int": int, "dec": Decimal, "float": float, "str": str, "bytes": bytes.fromhex,
    "date": dt.date.fromisoformat, "datetime": dt.datetime.fromisoformat,
    "time": lambda v: dt.timedelta(microseconds=int(v)),
}


def _encode_raw(value: Any) -> Any:
    """A raw key value (as a SELECT returns it) as tagged JSON; exact for every key kind."""
    if value is None:
        return None
    if isinstance(value, bool):
        return ["int", int(value)]
    if isinstance(value, int):
        return ["int", value]
    if isinstance(value, Decimal):
        return ["dec", format(value, "f")]
    if isinstance(value, float):
        return ["float", value]
    if isinstance(value, str):
        return ["str", value]
    if isinstance(value, bytes | bytearray | memoryview):
        return ["bytes", bytes(value).hex()]
    if isinstance(value, dt.datetime):
        return ["datetime", value.isoformat()]
    if isinstance(value, dt.date):
        return ["date", value.isoformat()]
    if isinstance(value, dt.timedelta):
        return ["time", value // dt.timedelta(microseconds=1)]
    raise ValueError(f"cannot record key value {value!r} ({type(value).__name__})")


def _decode_raw(value: Any) -> Any:
    if value is None:
        return None
    tag, data = value
    return _RAW_TYPES[tag](data)


def encode_range(rng: KeyRange) -> dict[str, Any]:
    def key(k: Key | None) -> list[Any] | None:
        return None if k is None else [_encode_raw(v) for v in k]
    return {"after": key(rng.after), "high": key(rng.high), "last": rng.last}


def decode_range(data: dict[str, Any]) -> KeyRange:
    def key(k: list[Any] | None) -> Key | None:
        return None if k is None else tuple(_decode_raw(v) for v in k)
    return KeyRange(key(data["after"]), key(data["high"]), bool(data["last"]))
