"""The snapshot reader: one table's side of an incremental snapshot (docs/snapshots.md).

The reader runs outside the capture engine (in the snapshot asset's run), so it never blocks
the stream and several tables can be read at once. It talks to the engine only through the
landing zone: it writes ``request.json`` (open/pause/resume/stop) and, per chunk, the chunk's
rows (Parquet) and then its manifest; the engine acknowledges the session and reports committed
and rejected chunks in ``checkpoint.json`` under ``"snapshots"``. Deciding what a chunk may emit
is the engine's job (``commit_rule``); the reader only reads, waits and re-reads rejected ranges.

Pure Python, no Dagster: ``defs/snapshots`` runs it in a thread and relays its log.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import datetime as dt
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pymysql

from cdc_platform.capture import names
from cdc_platform.capture import source as source_sql
from cdc_platform.capture.binlog import is_retriable
from cdc_platform.capture.landing import Checkpoint, LandingZone, write_atomically
from cdc_platform.capture.schema import ColumnSpec, ColumnValueError, TableSchema, landing_arrays
from cdc_platform.capture.snapshot.chunks import (
    Chunk,
    ChunkedTable,
    ChunkKey,
    Key,
    SkippedTable,
    chunk_key_for,
    landing_key,
    read_chunk,
    read_max_key,
    read_nullable_columns,
    schema_fingerprint,
)
from cdc_platform.capture.snapshot.conditions import UnsafeConditionError, validate_condition
from cdc_platform.capture.snapshot.watermark import (
    read_with_watermarks,
    require_snapshot_prerequisites,
)
from cdc_platform.capture.source import PrerequisiteError, TableSelector, selector_from_settings

# Rows per chunk, chosen by measurement (MariaDB 10.11 dev server, 300k-row 6-column table;
# read_chunk with watermarks + landing conversion + Parquet encoding, rows/s):
#   256: 23k   1024: 36k   2048: 53k   4096: 60k   8192: 64k   16384: 66k   65536: 68k
# Each chunk pays a fixed ~6 ms (watermark statements, opening the read view, planning the
# SELECT; the two chunk files add their fsyncs): 9 % of a 4096-row chunk, 40 % of a 1024-row
# one. Beyond 4096 the rate gains < 10 %, while reader and engine hold whole chunks in memory, a
# chunk's window (keys touched while it waits are dropped) widens, and a rejected chunk costs
# more to read again. Measured again end to end (reader + engine in its own process, 500k
# rows, after the column-wise conversion and background chunk writes), rows/s, ±15 % noise:
#   2048: 70k   4096: 79k   8192: 62k   16384: 80k
DEFAULT_CHUNK_SIZE = 4096
# Chunks written but not yet decided by the engine before the reader waits: enough to keep
# reading while the engine catches up to the chunks' ``after`` (with 8, the reader waited for
# the engine a third of the time), bounded so a stalled engine does not make the reader copy
# the whole table into the landing zone (32 x 4096 rows).
DEFAULT_MAX_PENDING = 32
# How long a reader waits for the capture engine to acknowledge its session: long enough for
# the stream_changes run to be restarted (a pod rescheduled, a deploy) before the snapshot
# fails; the wait is reported as progress (state "waiting").
DEFAULT_ACK_TIMEOUT_SECONDS = 600.0
DEFAULT_STALL_TIMEOUT_SECONDS = 300.0
DEFAULT_POLL_SECONDS = 0.1
_READ_ATTEMPTS = 5
_ER_BAD_FIELD = 1054

ACTIONS = ("open", "pause", "resume", "stop")


class SnapshotError(RuntimeError):
    """The snapshot cannot go on; the message names the table, session or chunk and what to do."""


class NoEngineError(SnapshotError):
    """No capture engine acknowledged or decided the session: the stream is not running."""


class EngineStalledError(NoEngineError):
    """The engine acknowledged the session, then stopped deciding its chunks (it went down):
    a later run adopts the session and goes on where this one stopped."""


# ---- key values in manifests -------------------------------------------------------------------


def _spec(column: ColumnSpec | str) -> ColumnSpec:
    """A column spec from a spec or a bare kind (the engine may only know kinds)."""
    return column if isinstance(column, ColumnSpec) else ColumnSpec("?", column)


def encode_key_value(column: ColumnSpec | str, value: Any) -> Any:
    """One landing-form key value as JSON, by column kind (docs/snapshots.md).

    Integers as numbers; decimals (also unsigned BIGINT and BIT(64), which land as decimals) as
    plain strings, so no JSON reader rounds them; dates and datetimes in ISO form (an aware
    timestamp keeps its offset); binary as hex; text kinds as they are.
    """
    if value is None:
        return None
    spec = _spec(column)
    arrow_type = spec.arrow_type()
    if pa.types.is_integer(arrow_type) and not isinstance(value, bool | Decimal):
        return int(value)
    if pa.types.is_decimal(arrow_type) or isinstance(value, Decimal):
        return format(Decimal(value), "f")
    if pa.types.is_floating(arrow_type):
        return float(value)
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, str):
        return value
    raise ValueError(f"key column {spec.name!r} ({spec.kind}): cannot encode {value!r} "
                     f"({type(value).__name__}) for a chunk manifest")


def decode_key_value(column: ColumnSpec | str, value: Any) -> Any:
    """The inverse of :func:`encode_key_value`: the landing-form value back."""
    if value is None:
        return None
    spec = _spec(column)
    arrow_type = spec.arrow_type()
    if pa.types.is_integer(arrow_type):
        # A bare "bit" kind cannot tell BIT(64) (a decimal, encoded as a string) from BIT(n).
        return Decimal(value) if isinstance(value, str) else int(value)
    if pa.types.is_decimal(arrow_type):
        return Decimal(value)
    if pa.types.is_floating(arrow_type):
        return float(value)
    if pa.types.is_date(arrow_type):
        return dt.date.fromisoformat(value)
    if pa.types.is_timestamp(arrow_type):
        return dt.datetime.fromisoformat(value)
    if pa.types.is_binary(arrow_type):
        return bytes.fromhex(value)
    return str(value)


def encode_key(key: Key | None, columns: Sequence[ColumnSpec | str]) -> list[Any] | None:
    """A landing-form key (chunk-key order) as a JSON list; None (an open side) stays None."""
    if key is None:
        return None
    if len(key) != len(columns):
        raise ValueError(f"key {key!r} has {len(key)} values for {len(columns)} key columns")
    return [encode_key_value(c, v) for c, v in zip(columns, key, strict=True)]


def decode_key(values: Sequence[Any] | None, columns: Sequence[ColumnSpec | str]) -> Key | None:
    """A manifest's ``range_low``/``range_high`` back to a landing-form key (None if open).

    Pass the key's ColumnSpecs where known: a bare kind cannot tell a DECIMAL wider than 38
    digits (landed as text) from a narrower one (landed as a decimal).
    """
    if values is None:
        return None
    if len(values) != len(columns):
        raise ValueError(f"key {values!r} has {len(values)} values for {len(columns)} key "
                         "columns")
    return tuple(decode_key_value(c, v) for c, v in zip(columns, values, strict=True))


# ---- files in the landing zone -----------------------------------------------------------------


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def snapshot_dir(landing: LandingZone, database: str, table: str) -> Path:
    return landing.snapshot_dir(database, table)


def request_path(landing: LandingZone, database: str, table: str) -> Path:
    return snapshot_dir(landing, database, table) / "request.json"


def chunk_dir(landing: LandingZone, database: str, table: str, session_id: str) -> Path:
    return snapshot_dir(landing, database, table) / "chunks" / session_id


@dataclass(frozen=True)
class SignalRef:
    """The signal behind a request: its id and its place in the signal topic.

    Offsets order signals only within one topic incarnation (``topic_id``): a signal is newer
    than another when both come from the same topic and its offset is higher.
    """

    id: str
    topic_id: str
    offset: int

    def newer_than(self, other: SignalRef | None) -> bool:
        return other is not None and self.topic_id == other.topic_id and \
            self.offset > other.offset

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "topic_id": self.topic_id, "offset": self.offset}

    @staticmethod
    def from_dict(data: dict[str, Any] | None) -> SignalRef | None:
        if not data:
            return None
        return SignalRef(str(data["id"]), str(data["topic_id"]), int(data["offset"]))


# request.json of a table with no session, written by a stop-snapshot signal: runs launched by
# earlier signals that have not opened their session yet must not open one.
NO_SESSION = "none"


@dataclass(frozen=True)
class SnapshotRequest:
    """``request.json``: what the reader asks of the engine for one table (and the signal
    that asked, if one did)."""

    session_id: str
    action: str
    chunk_key: tuple[str, ...]
    condition: str | None
    chunk_size: int
    requested_at: str = field(default_factory=_now)
    signal: SignalRef | None = None

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"snapshot request action {self.action!r}: want one of {ACTIONS}")

    def to_json(self) -> bytes:
        return json.dumps({
            "session_id": self.session_id, "action": self.action,
            "chunk_key": list(self.chunk_key), "condition": self.condition,
            "chunk_size": self.chunk_size, "requested_at": self.requested_at,
            "signal": None if self.signal is None else self.signal.to_dict(),
        }, indent=1).encode()

    @staticmethod
    def from_json(text: bytes | str) -> SnapshotRequest:
        data = json.loads(text)
        return SnapshotRequest(
            session_id=str(data["session_id"]), action=str(data["action"]),
            chunk_key=tuple(data.get("chunk_key") or ()), condition=data.get("condition"),
            chunk_size=int(data.get("chunk_size") or DEFAULT_CHUNK_SIZE),
            requested_at=str(data.get("requested_at") or ""),
            signal=SignalRef.from_dict(data.get("signal")),
        )


def write_request(landing: LandingZone, database: str, table: str,
                  request: SnapshotRequest) -> Path:
    path = request_path(landing, database, table)
    write_atomically(path, request.to_json())
    return path


def read_request(landing: LandingZone, database: str, table: str) -> SnapshotRequest | None:
    """The table's ``request.json``; None when there is none, or when it cannot be read (it is
    written atomically, so only a hand edit breaks it: logged, and the next write replaces it).
    """
    path = request_path(landing, database, table)
    try:
        return SnapshotRequest.from_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        try:
            stat = path.stat()
            version: tuple[int, int] | None = (stat.st_mtime_ns, stat.st_size)
        except OSError:
            version = None
        if _unreadable_requests.get(path) != version:  # once per version of the file
            _unreadable_requests[path] = version
            logging.getLogger(__name__).warning(
                f"snapshot request {path} is unreadable ({error!r}); treated as absent: the "
                f"next snapshot run or signal for {database}.{table} writes it again")
        return None


_unreadable_requests: dict[Path, tuple[int, int] | None] = {}


def request_action(landing: LandingZone, database: str, table: str, action: str,
                   session_id: str | None = None) -> SnapshotRequest:
    """Rewrite ``request.json`` with a new action for the current (or the given) session."""
    if action not in ("pause", "resume", "stop"):
        raise ValueError(f"snapshot action {action!r}: want pause, resume or stop ('open' "
                         "starts a new session: materialise the snapshot asset)")
    current = read_request(landing, database, table)
    if current is None or current.session_id == NO_SESSION:
        raise SnapshotError(f"snapshot of {database}.{table} on {landing.server_name}: no "
                            f"session to {action} (no request.json); materialise the snapshot "
                            "asset to start one")
    if session_id is not None and current.session_id != session_id:
        raise SnapshotError(f"snapshot of {database}.{table}: session {session_id} was replaced "
                            f"by session {current.session_id}; {action} that one instead")
    request = replace(current, action=action, requested_at=_now())
    write_request(landing, database, table, request)
    return request


def session_live(landing: LandingZone, database: str, table: str,
                 request: SnapshotRequest | None) -> bool:
    """Whether ``request`` (the table's request.json) is a session still running: the engine
    reports it open or paused, or has not seen it yet while its reader is alive. A finished
    session's request stays behind with its last action."""
    if request is None or request.session_id == NO_SESSION or request.action == "stop":
        return False
    state = read_session_state(landing.read_checkpoint(), names.table_id(database, table))
    if state is not None and state.get("session_id") == request.session_id:
        return state.get("state") in ("open", "paused")
    return reader_alive(landing, database, table)


def control_path(landing: LandingZone, database: str, table: str) -> Path:
    """The pause or resume a signal asked for while no session of the table was open."""
    return snapshot_dir(landing, database, table) / "control.json"


def read_control(landing: LandingZone, database: str, table: str
                 ) -> tuple[str, SignalRef] | None:
    """``control.json``: (``pause`` or ``resume``, the signal), or None."""
    try:
        data = json.loads(control_path(landing, database, table).read_bytes())
        signal = SignalRef.from_dict(data["signal"])
        action = str(data["action"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # (only a hand edit breaks it; the next pause or resume rewrites it)
    if signal is None or action not in ("pause", "resume"):
        return None
    return action, signal


def signal_action(landing: LandingZone, database: str, table: str, action: str,
                  signal: SignalRef, run_pending: bool = False) -> str:
    """Apply a stop/pause/resume signal to the table's session, once; what happened, for the
    log.

    A signal acts only on a session that no newer signal opened or steered, so a signal read
    twice (a sensor tick retried after a crash) does nothing the second time. When no session
    is running, the signal is still recorded if a run may yet open one:

    * a stop, in ``request.json`` (session ``NO_SESSION``): runs that earlier signals launched
      and that have not opened their session yet never open it;
    * a pause or resume, when ``run_pending`` (a snapshot run of the table is queued or
      starting), in ``control.json``: a run of an earlier signal opens its session paused or
      running. The run looks at it just after requesting its session and this looks at
      ``request.json`` again just after writing it, so one of the two always sees the other.
    """
    if action not in ("pause", "resume", "stop"):
        raise ValueError(f"signal action {action!r}: want pause, resume or stop")
    current = read_request(landing, database, table)
    table_id = names.table_id(database, table)
    if current is not None and current.signal is not None and not signal.newer_than(
            current.signal):
        if current.signal == signal:
            return f"{table_id}: already {action}ped by this signal" if action == "stop" else \
                f"{table_id}: {action} already applied by this signal"
        if current.signal.topic_id == signal.topic_id:
            return (f"{table_id}: session {current.session_id} follows a newer signal "
                    f"({current.signal.id}); left alone")
    live = session_live(landing, database, table, current)
    if action == "stop" and (current is None or not live):
        barrier = SnapshotRequest(NO_SESSION, "stop", (), None, DEFAULT_CHUNK_SIZE,
                                  signal=signal)
        write_request(landing, database, table, barrier)
        return f"{table_id}: no running snapshot session; runs of earlier signals will not start"
    if current is None or not live:
        if not run_pending:
            return f"{table_id}: no running snapshot session to {action}"
        control = read_control(landing, database, table)
        if control is not None and not signal.newer_than(control[1]):
            return f"{table_id}: {action} already recorded by this or a newer signal"
        write_atomically(control_path(landing, database, table), json.dumps(
            {"action": action, "signal": signal.to_dict(), "requested_at": _now()}).encode())
        current = read_request(landing, database, table)
        if current is None or not session_live(landing, database, table, current) or (
                current.signal is not None and not signal.newer_than(current.signal)):
            return (f"{table_id}: no session open yet; the snapshot run of an earlier signal "
                    f"opens it {'paused' if action == 'pause' else 'running'}")
        # (the run requested its session meanwhile: steer it as below)
    if current.action == action or (action == "resume" and current.action == "open"):
        updated = replace(current, signal=signal, requested_at=_now())
        write_request(landing, database, table, updated)
        return f"{table_id}: session {current.session_id} is already " + (
            "paused" if action == "pause" else "running")
    write_request(landing, database, table, replace(
        current, action=action, signal=signal, requested_at=_now()))
    return f"{table_id}: session {current.session_id}: {action} requested"


def pause(landing: LandingZone, database: str, table: str) -> SnapshotRequest:
    """Pause the table's session: the reader reads no more chunks, the engine commits none."""
    return request_action(landing, database, table, "pause")


def resume(landing: LandingZone, database: str, table: str) -> SnapshotRequest:
    """Resume a paused session where it stopped."""
    return request_action(landing, database, table, "resume")


def stop(landing: LandingZone, database: str, table: str) -> SnapshotRequest:
    """Stop the session for good (committed chunks stay applied; a new run starts over)."""
    return request_action(landing, database, table, "stop")


@dataclass(frozen=True)
class ChunkManifest:
    """A chunk's manifest, written after its Parquet file: its presence publishes the chunk."""

    session_id: str
    seq: int
    rows: int
    complete: bool
    range_low: list[Any] | None
    range_high: list[Any] | None
    low_watermark: str
    after: str
    fingerprint: str
    read_at: str = field(default_factory=_now)

    @property
    def low_open(self) -> bool:
        return self.range_low is None

    @property
    def high_open(self) -> bool:
        return self.range_high is None

    def to_json(self) -> bytes:
        return json.dumps({
            "session_id": self.session_id, "seq": self.seq, "rows": self.rows,
            "complete": self.complete, "range_low": self.range_low,
            "range_high": self.range_high, "low_open": self.low_open,
            "high_open": self.high_open, "low_watermark": self.low_watermark,
            "after": self.after, "fingerprint": self.fingerprint, "read_at": self.read_at,
        }, indent=1).encode()

    @staticmethod
    def from_json(text: bytes | str) -> ChunkManifest:
        data = json.loads(text)
        return ChunkManifest(
            session_id=str(data["session_id"]), seq=int(data["seq"]), rows=int(data["rows"]),
            complete=bool(data["complete"]),
            range_low=None if data.get("low_open") else data.get("range_low"),
            range_high=None if data.get("high_open") else data.get("range_high"),
            low_watermark=str(data["low_watermark"]), after=str(data["after"]),
            fingerprint=str(data["fingerprint"]), read_at=str(data.get("read_at") or ""),
        )


def chunk_arrow_table(schema: TableSchema, rows: Sequence[Sequence[Any]],
                      columns: Sequence[Sequence[Any]] | None = None) -> pa.Table:
    """Chunk rows (landing form, schema column order; or the same ``columns``) as an Arrow
    table with landing types."""
    try:
        arrays = landing_arrays(schema, list(rows), columns)
    except ColumnValueError as error:
        raise SnapshotError(f"snapshot of {schema.table_id}: {error}") from error
    return pa.Table.from_arrays(arrays, schema=schema.arrow_schema(metadata_columns=False))


def write_chunk(landing: LandingZone, chunk: Chunk, session_id: str, seq: int,
                complete: bool) -> ChunkManifest:
    """Write the chunk's Parquet, then its manifest, each atomically (temp file + rename).

    The engine lists manifests: one that exists always has its complete rows file beside it.
    """
    schema = chunk.table.schema
    directory = chunk_dir(landing, schema.database, schema.table, session_id)
    sink = pa.BufferOutputStream()
    # Uncompressed: the file lives until the engine commits it, and encoding time counts.
    pq.write_table(chunk_arrow_table(schema, chunk.rows, chunk.columns), sink,
                   compression="none")
    # (the manifest's directory fsync makes this rename durable too)
    write_atomically(directory / f"{seq:08d}.parquet", sink.getvalue().to_pybytes(),
                     sync_dir=False)
    key_columns = [schema.column(name) for name in chunk.table.key.columns]
    manifest = ChunkManifest(
        session_id=session_id, seq=seq, rows=len(chunk.rows), complete=complete,
        range_low=encode_key(chunk.range_low, key_columns),
        range_high=encode_key(chunk.range_high, key_columns),
        low_watermark=str(chunk.low_watermark), after=str(chunk.after),
        fingerprint=chunk.schema_fingerprint,
    )
    write_atomically(directory / f"{seq:08d}.json", manifest.to_json())
    return manifest


def read_session_state(checkpoint: Checkpoint | None, table_id: str) -> dict[str, Any] | None:
    """The engine's state of the table's snapshot session, from its checkpoint."""
    if checkpoint is None:
        return None
    state = (checkpoint.extra.get("snapshots") or {}).get(table_id)
    return state if isinstance(state, dict) else None


# ---- the reader's own progress (for resuming after the reader's process died) ------------------

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


def _encode_range(rng: _Range) -> dict[str, Any]:
    def key(k: Key | None) -> list[Any] | None:
        return None if k is None else [_encode_raw(v) for v in k]
    return {"after": key(rng.after), "high": key(rng.high), "last": rng.last}


def _decode_range(data: dict[str, Any]) -> _Range:
    def key(k: list[Any] | None) -> Key | None:
        return None if k is None else tuple(_decode_raw(v) for v in k)
    return _Range(key(data["after"]), key(data["high"]), bool(data["last"]))


class _ReaderLock:
    """At most one live reader per table: an exclusive ``flock`` on ``reader.lock``, released
    when the reader ends or its process dies (so a dead reader's session can be adopted)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle: Any = None

    def try_acquire(self) -> bool:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")  # noqa: SIM115 - held for the run
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}")
        handle.flush()
        self._handle = handle
        return True

    @property
    def held(self) -> bool:
        return self._handle is not None

    def holder(self) -> str:
        try:
            return self.path.read_text().strip() or "unknown"
        except OSError:
            return "unknown"

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def reader_alive(landing: LandingZone, database: str, table: str) -> bool:
    """Whether a live reader holds the table's ``reader.lock`` (a dead one's lock is gone with
    its process)."""
    import fcntl

    path = snapshot_dir(landing, database, table) / "reader.lock"
    try:
        with open(path, "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
    except OSError:
        return False
    return False


def progress_path(landing: LandingZone, database: str, table: str, session_id: str) -> Path:
    """The reader's record of its ranges still to read and chunks written (docs/snapshots.md)."""
    return chunk_dir(landing, database, table, session_id) / "reader.state"


# ---- progress and result -----------------------------------------------------------------------


@dataclass(frozen=True)
class SnapshotProgress:
    """Where a running snapshot is; handed to ``on_progress`` after every change."""

    table_id: str
    session_id: str
    state: str  # waiting | open | paused | done
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
    if progress.state == "waiting":
        return (f"snapshot of {progress.table_id}: waiting for the capture engine (the "
                f"stream_changes job) to acknowledge session {progress.session_id}; "
                f"{progress.elapsed_seconds:.0f}s")
    last = ", ".join(str(v) for v in progress.last_key) if progress.last_key else "-"
    return (f"snapshot of {progress.table_id}: {progress.state}, {progress.rows} rows in "
            f"{progress.chunks} committed chunks, {progress.pending} pending, "
            f"{progress.rejected} rejected; last key read {last}; "
            f"{progress.elapsed_seconds:.0f}s")


@dataclass(frozen=True)
class SnapshotResult:
    """What a snapshot did; ``status`` is ``done``, ``stopped`` or ``skipped: <reason>``."""

    table_id: str
    session_id: str
    status: str
    rows: int = 0
    chunks: int = 0
    rejected: int = 0
    reselected: int = 0
    duration_seconds: float = 0.0
    start_gtid: str = ""
    end_gtid: str = ""
    rows_emitted: int | None = None  # what the engine landed (touched keys are dropped)
    restarts: int = 0  # sessions the engine ended for a DDL, each followed by a full re-read

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.duration_seconds if self.duration_seconds > 0 else 0.0

    @property
    def skipped(self) -> bool:
        return self.status.startswith("skipped")


# ---- the reader --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Range:
    """A key range still to read: strictly after ``after``, up to ``high`` (raw values).

    ``high`` None: up to whatever the largest key is (only when the table looked empty).
    ``last``: the range ends at the session's maximum key, so its last chunk is ``complete``.
    """

    after: Key | None
    high: Key | None
    last: bool


@dataclass
class _Written:
    seq: int
    range: _Range
    rows: int
    complete: bool
    after_gtid: str


class SnapshotReader:
    """Reads one table in chunks for the engine to commit (docs/snapshots.md).

    ``schema`` is the table's schema after column exclusion (``TableSchema.without_columns``);
    ``selector`` re-reads it the same way when a DDL changes the table mid-snapshot. The chunk
    key is the primary key, else ``surrogate_key``; a table with neither is skipped.
    """

    def __init__(
        self,
        landing: LandingZone,
        connection_settings: dict[str, Any],
        flavour: str,
        schema: TableSchema,
        *,
        surrogate_key: Sequence[str] | str | None = None,
        condition: str | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        session_id: str | None = None,
        log: Any | None = None,
        selector: TableSelector | None = None,
        max_pending: int = DEFAULT_MAX_PENDING,
        ack_timeout_seconds: float = DEFAULT_ACK_TIMEOUT_SECONDS,
        stall_timeout_seconds: float = DEFAULT_STALL_TIMEOUT_SECONDS,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        keep_chunks: bool = False,
        adopt_open_session: bool = True,
        signal: SignalRef | None = None,
    ) -> None:
        if chunk_size < 1:
            raise ValueError(f"snapshot of {schema.table_id}: chunk size must be at least 1, "
                             f"got {chunk_size}")
        if max_pending < 1:
            raise ValueError(f"snapshot of {schema.table_id}: max_pending must be at least 1")
        if condition is not None:
            try:
                condition = validate_condition(condition)
            except UnsafeConditionError as error:
                raise UnsafeConditionError(f"snapshot of {schema.table_id}: {error}") from None
        self.landing = landing
        self.connection_settings = connection_settings
        self.flavour = flavour
        self.schema = schema
        self.surrogate_key = surrogate_key
        self.condition = condition
        self.chunk_size = chunk_size
        self.session_id = session_id or f"run-{uuid.uuid4().hex[:12]}"
        self.log = log or logging.getLogger(__name__)
        self.selector = selector
        self.max_pending = max_pending
        self.ack_timeout_seconds = ack_timeout_seconds
        self.stall_timeout_seconds = stall_timeout_seconds
        self.poll_seconds = poll_seconds
        self.keep_chunks = keep_chunks
        self.adopt_open_session = adopt_open_session
        self.signal = signal
        # The newest signal that steered this run's session (its own, or a later pause,
        # resume or stop): request.json keeps it, so a replayed signal stays a no-op.
        self._steering = signal
        self._conn: pymysql.Connection | None = None
        self._table: ChunkedTable | None = None
        self._checkpoint_stamp: tuple[int, int] | None = None
        self._checkpoint: Checkpoint | None = None
        self._checkpoint_changed_at = time.monotonic()
        self._lock = _ReaderLock(Path(os.devnull))

    @property
    def table_id(self) -> str:
        return self.schema.table_id

    def _where(self) -> str:
        return f"snapshot of {self.table_id} (session {self.session_id})"

    # -- control from other threads --------------------------------------------------------

    def pause(self) -> None:
        request_action(self.landing, self.schema.database, self.schema.table, "pause",
                       self.session_id)

    def resume(self) -> None:
        request_action(self.landing, self.schema.database, self.schema.table, "resume",
                       self.session_id)

    def stop(self) -> None:
        request_action(self.landing, self.schema.database, self.schema.table, "stop",
                       self.session_id)

    # -- the run ---------------------------------------------------------------------------

    def run(self, stop_event: threading.Event | None = None,
            on_progress: Callable[[SnapshotProgress], None] | None = None) -> SnapshotResult:
        """Open the session, read and publish chunks, wait for the engine to commit them.

        Returns when the session is done, stopped (``stop_event``, or a ``stop`` request from
        elsewhere), or the table is skipped. Raises SnapshotError (NoEngineError when the
        capture engine is not running) naming the table and session.
        """
        stop_event = stop_event or threading.Event()
        started = time.monotonic()
        try:
            self._check_source()
            key = self._chunk_key(self.schema)
            if isinstance(key, SkippedTable):
                self.log.warning(f"snapshot of {self.table_id}: {key.status}")
                return SnapshotResult(self.table_id, self.session_id, key.status)
            self._lock = _ReaderLock(snapshot_dir(self.landing, self.schema.database,
                                                  self.schema.table) / "reader.lock")
            self._lock.try_acquire()
            self._table = ChunkedTable(self.schema, key, self.condition)
            run = _Run(self, stop_event, on_progress, started)
            try:
                return run.run()
            finally:
                run.writer.shutdown(wait=True)  # chunk files being written are finished
        finally:
            self._lock.release()
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _connection(self) -> pymysql.Connection:
        """The read-only source session, opened on first use (not before the engine's ack)."""
        if self._conn is None:
            self._conn = source_sql.connect(self.connection_settings)
        return self._conn

    def _check_source(self) -> None:
        """The source's settings make watermarks exact (GTIDs, ROW/FULL binlog, and on a
        replica log_slave_updates and commit order): checked once per run, before anything is
        requested, so a misconfigured replica fails the snapshot naming the setting."""
        def check(conn: pymysql.Connection) -> None:
            try:
                require_snapshot_prerequisites(conn, self.flavour, self.landing.server_name)
            finally:
                conn.commit()
        try:
            self._with_connection("checking the source's settings", check)
        except PrerequisiteError as error:
            raise SnapshotError(f"snapshot of {self.table_id}: {error}") from None

    def _chunk_key(self, schema: TableSchema) -> ChunkKey | SkippedTable:
        # A real primary key never admits NULL; a surrogate key (configured, so landed as the
        # primary key, or passed for this snapshot) may.
        nullable = self._with_connection(
            "reading the nullable columns",
            lambda conn: read_nullable_columns(conn, schema.database, schema.table))
        return chunk_key_for(schema, self.surrogate_key, nullable)

    # -- helpers used by _Run --------------------------------------------------------------

    def _request(self, action: str) -> None:
        assert self._table is not None
        write_request(self.landing, self.schema.database, self.schema.table, SnapshotRequest(
            self.session_id, action, self._table.key.columns, self.condition, self.chunk_size,
            signal=self._steering))

    def _poll_checkpoint(self) -> Checkpoint | None:
        """The engine's checkpoint, re-parsed only when the file changed."""
        try:
            stat = self.landing.checkpoint_path.stat()
        except FileNotFoundError:
            return None
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp != self._checkpoint_stamp:
            self._checkpoint_stamp = stamp
            self._checkpoint_changed_at = time.monotonic()
            try:
                self._checkpoint = self.landing.read_checkpoint()
            except ValueError:
                self._checkpoint_stamp = None  # caught mid-replace on a non-POSIX filesystem
        return self._checkpoint

    def _reconnect(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # broken anyway
                self._conn.close()
        self._conn = None  # the next attempt connects again

    def _with_connection(self, what: str, action: Callable[[pymysql.Connection], Any]) -> Any:
        """Run a read, reconnecting with backoff when the connection drops; re-read the schema
        once when the table lost a selected column (a DDL)."""
        schema_reloaded = False
        for attempt in range(1, _READ_ATTEMPTS + 1):
            try:
                return action(self._connection())
            except pymysql.MySQLError as error:
                code = error.args[0] if error.args else None
                if code == _ER_BAD_FIELD and not schema_reloaded:
                    schema_reloaded = True
                    self.log.info(f"{self._where()}: {what} failed ({error}); the table changed, "
                                  "re-reading its schema")
                    self.reload_schema()
                    continue
                if not is_retriable(error) or attempt == _READ_ATTEMPTS:
                    raise SnapshotError(f"{self._where()}: {what} failed: {error}; check that "
                                        "the source is reachable, then materialise the "
                                        "snapshot again") from error
                self.log.warning(f"{self._where()}: {what} failed ({error}); reconnecting "
                                 f"(attempt {attempt} of {_READ_ATTEMPTS})")
                time.sleep(min(5.0, 0.2 * 2 ** attempt))
                self._reconnect()
        raise AssertionError("unreachable")

    def reload_schema(self) -> bool:
        """Re-read the table's schema (after exclusions); True when its columns changed.

        A chunk read with the old columns is rejected by the engine (fingerprint); re-reads use
        the new ones. A changed chunk key is not supported: it fails the snapshot.
        """
        assert self._table is not None
        conn = self._connection()
        try:
            current = source_sql.read_table_schema(conn, self.schema.database, self.schema.table)
        except LookupError:
            raise SnapshotError(f"{self._where()}: the table no longer exists on the source "
                                "(dropped or renamed during the snapshot); snapshot it again "
                                "under its current name if it was renamed") from None
        finally:
            conn.commit()
        if self.selector is not None:
            current = self.selector.shape(current)
        if schema_fingerprint(current) == schema_fingerprint(self.schema):
            return False
        key = self._chunk_key(current)
        if isinstance(key, SkippedTable) or key.columns != self._table.key.columns:
            raise SnapshotError(
                f"{self._where()}: the table's key changed during the snapshot (was "
                f"{', '.join(self._table.key.columns)}, now "
                f"{key.reason if isinstance(key, SkippedTable) else ', '.join(key.columns)}); "
                "primary-key changes during a snapshot are not supported: snapshot it again"
            )
        self.log.info(f"{self._where()}: columns changed to "
                      f"{', '.join(current.column_names)}; reading with them from now on")
        self.schema = current
        self._table = ChunkedTable(current, key, self.condition)
        return True


class _Run:
    """The state of one ``SnapshotReader.run``: the session's chunks and counters."""

    def __init__(self, reader: SnapshotReader, stop_event: threading.Event,
                 on_progress: Callable[[SnapshotProgress], None] | None,
                 started: float) -> None:
        self.r = reader
        self.stop_event = stop_event
        self.on_progress = on_progress
        self.started = started
        self.todo: collections.deque[_Range] = collections.deque()
        self.pending: dict[int, _Written] = {}
        self.held: tuple[Chunk, _Range] | None = None
        self.next_seq = 0
        self.rows = self.chunks = self.rejected = self.reselected = 0
        self.start_gtid = self.end_gtid = ""
        self.last_key: list[Any] | None = None
        self.maximum_key: list[str] | None = None
        self.final_seq: int | None = None
        self.state = "waiting"
        self.engine_rows: int | None = None
        self.restarts = 0
        self.restart_requested = False
        self.base_session_id = reader.session_id
        self.writer = concurrent.futures.ThreadPoolExecutor(1, "snapshot-chunk-writer")
        self.writes: collections.deque[concurrent.futures.Future[ChunkManifest]] = \
            collections.deque()

    @property
    def table(self) -> ChunkedTable:
        assert self.r._table is not None
        return self.r._table

    def result(self, status: str) -> SnapshotResult:
        return SnapshotResult(
            table_id=self.r.table_id, session_id=self.r.session_id, status=status,
            rows=self.rows, chunks=self.chunks, rejected=self.rejected,
            reselected=self.reselected, duration_seconds=time.monotonic() - self.started,
            start_gtid=self.start_gtid, end_gtid=self.end_gtid, rows_emitted=self.engine_rows,
            restarts=self.restarts)

    def progress(self) -> None:
        if self.on_progress is not None:
            self.on_progress(SnapshotProgress(
                self.r.table_id, self.r.session_id, self.state, self.rows, self.chunks,
                len(self.pending) + (self.held is not None), self.rejected, self.reselected,
                self.last_key, time.monotonic() - self.started, self.maximum_key))

    def stopped(self, why: str) -> SnapshotResult:
        self.r.log.info(f"{self.r._where()}: stopped ({why}) after {self.chunks} committed "
                        f"chunks, {self.rows} rows; committed chunks stay applied")
        return self.result("stopped")

    # -- phases ----------------------------------------------------------------------------

    def stop_for(self, barrier: SnapshotRequest) -> None:
        """A stop-snapshot signal raced with this session's opening (its request replaced
        ours): stop this session, keeping the signal on record for runs launched before it."""
        r = self.r
        write_request(r.landing, r.schema.database, r.schema.table, SnapshotRequest(
            r.session_id, "stop", self.table.key.columns, r.condition, r.chunk_size,
            signal=barrier.signal))

    def superseded(self) -> SnapshotRequest | None:
        """The table's request if a newer signal wrote it (a stop-snapshot, or a snapshot it
        started): this run's signal is then out of date and the run must not open a session.
        """
        signal = self.r.signal
        if signal is None:
            return None
        current = read_request(self.r.landing, self.r.schema.database, self.r.schema.table)
        # A newer stop, or a newer snapshot of the table; a pause or resume a newer signal
        # applied to an earlier session says nothing about this run.
        if current is not None and current.signal is not None and \
                current.signal.newer_than(signal) and current.action in ("stop", "open"):
            return current
        return None

    def run(self) -> SnapshotResult:
        r = self.r
        newer = self.superseded()
        if newer is not None:
            assert newer.signal is not None
            return self.stopped(f"signal {newer.signal.id} ({newer.action}) came after this "
                                f"run's signal {r.signal.id if r.signal else '-'}; nothing "
                                "was read")
        if r._lock.held and r.adopt_open_session and self.resume_session():
            self.state = "open"
            self.progress()
        else:
            stopped = self.open_session()
            if stopped is not None:
                return stopped
        while True:
            outcome = self.loop()
            if outcome is not None:
                return outcome
            stopped = self.open_session(restart=True)  # the engine ended it for a DDL
            if stopped is not None:
                return stopped

    def follow_control(self) -> str | None:
        """Just after requesting a session: a pause (or resume) signal that found no session
        of the table open while this run was queued left ``control.json``
        (``signal_action``); a run of an earlier signal follows it. Runs of later signals, and
        runs started by hand, do not."""
        r = self.r
        control = read_control(r.landing, r.schema.database, r.schema.table)
        if control is None or r.signal is None:
            return None
        action, signal = control
        if not signal.newer_than(r._steering or r.signal):
            return None
        r._steering = signal
        r._request(action)  # (a "resume" opens a session the engine has not seen yet)
        r.log.info(f"{r._where()}: {action} requested by signal {signal.id}, sent before "
                   "this run opened its session")
        return action

    def open_session(self, restart: bool = False) -> SnapshotResult | None:
        """Request a session (a new one after a restart, paused if the run was paused), wait
        for the engine's acknowledgement, read the maximum key; a result if it was stopped."""
        r = self.r
        paused = self.state == "paused"
        if restart:
            self.check_writes(wait=True)  # the old session's files, before it is removed
            current = read_request(r.landing, r.schema.database, r.schema.table)
            if current is not None and (current.session_id == NO_SESSION or (
                    current.session_id == r.session_id and current.action == "stop")):
                return self.stopped("a stop request while the session restarted")
            self.restarts += 1
            r.session_id = f"{self.base_session_id}-r{self.restarts}"
            self.todo.clear()
            self.pending.clear()
            self.held = self.final_seq = None
            self.next_seq = self.rows = self.chunks = 0
            r._with_connection("re-reading the table's schema", lambda _c: r.reload_schema())
        r._request("pause" if paused else "open")
        paused = {"pause": True, "resume": False}.get(self.follow_control() or "", paused)
        if not r._lock.held:
            self.wait_for_the_replaced_reader()
        r.log.info(f"{r._where()}: requested (chunk key {', '.join(self.table.key.columns)}, "
                   f"chunk size {r.chunk_size}"
                   + (f", condition {r.condition!r}" if r.condition else "")
                   + (f"; restart {self.restarts}" if restart else "") + ")")
        if not self.wait_for_acknowledgement():
            return self.stopped("stop requested before the engine acknowledged the session")
        self.remove_other_sessions()
        max_key = r._with_connection("reading the maximum key",
                                     lambda conn: read_max_key(conn, self.table))
        self.todo.append(_Range(None, max_key, True))
        self.maximum_key = None if max_key is None else [str(v) for v in max_key]
        self.state = "paused" if paused else "open"
        self.progress()
        return None

    # -- resuming a session whose reader died ---------------------------------------------

    def resume_session(self) -> bool:
        """Adopt the table's open session if its reader died (a killed run) and this run asks
        for the same snapshot; True when adopted.

        The engine kept deciding the dead reader's chunks; ``reader.state`` (JSON) says which ranges
        were still to read and which chunks were written. A chunk recorded as written whose
        manifest never appeared is read again; so is a held (unpublished) last chunk.
        """
        r = self.r
        request = read_request(r.landing, r.schema.database, r.schema.table)
        if request is None or request.action == "stop":
            return False
        state = read_session_state(r._poll_checkpoint(), r.table_id)
        if (state is None or state.get("session_id") != request.session_id
                or state.get("state") not in ("open", "paused")):
            return False
        if request.chunk_key != self.table.key.columns or request.condition != r.condition:
            r.log.info(f"snapshot of {r.table_id}: session {request.session_id} is open with "
                       f"another chunk key or condition; starting a new session replaces it")
            return False
        path = progress_path(r.landing, r.schema.database, r.schema.table, request.session_id)
        try:
            saved = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return False
        r.session_id = request.session_id
        self.base_session_id = r.session_id.rsplit("-r", 1)[0] if re.fullmatch(
            r".*-r\d+", r.session_id) else r.session_id
        self.todo = collections.deque(_decode_range(d) for d in saved["todo"])
        directory = chunk_dir(r.landing, r.schema.database, r.schema.table, r.session_id)
        for seq_text, data in sorted(saved["pending"].items(), key=lambda i: int(i[0])):
            written = _Written(int(seq_text), _decode_range(data["range"]), int(data["rows"]),
                               bool(data["complete"]), str(data["after_gtid"]))
            if (directory / f"{written.seq:08d}.json").exists():
                self.pending[written.seq] = written
                if written.complete:
                    self.final_seq = written.seq
            else:  # died before publishing it: read it again first
                self.todo.appendleft(written.range)
        if saved.get("held") is not None:
            self.todo.append(_decode_range(saved["held"]))
        published = [int(p.stem) for p in directory.glob("*.json") if p.stem.isdigit()]
        self.next_seq = max([int(saved["next_seq"]), *(p + 1 for p in published)])
        self.rows, self.chunks = int(saved["rows"]), int(saved["chunks"])
        self.rejected = self.reselected = int(saved["rejected"])
        self.start_gtid, self.end_gtid = str(saved["start_gtid"]), str(saved["end_gtid"])
        r.log.info(f"{r._where()}: resuming the session of a reader that stopped: "
                   f"{self.chunks} chunks ({self.rows} rows) committed, {len(self.pending)} "
                   f"waiting for the engine, {len(self.todo)} ranges still to read")
        return True

    def wait_for_the_replaced_reader(self) -> None:
        """Another reader of the table is alive: this session replaces its session (it notices
        and ends); read only once it is gone."""
        r = self.r
        holder = r._lock.holder()
        r.log.info(f"{r._where()}: replacing the session of a running reader ({holder})")
        deadline = time.monotonic() + r.ack_timeout_seconds
        while not r._lock.try_acquire():
            if time.monotonic() >= deadline:
                raise SnapshotError(
                    f"{r._where()}: the reader of the replaced session ({holder}) did not end "
                    f"within {r.ack_timeout_seconds:.0f}s; stop its run, then start again")
            time.sleep(r.poll_seconds)

    def save(self) -> None:
        """Record the ranges still to read and the chunks written, before publishing a chunk
        and after the engine decided some (see ``resume_session``)."""
        r = self.r
        data = {
            "todo": [_encode_range(x) for x in self.todo],
            "pending": {str(w.seq): {"range": _encode_range(w.range), "rows": w.rows,
                                     "complete": w.complete, "after_gtid": w.after_gtid}
                        for w in self.pending.values()},
            "held": None if self.held is None else _encode_range(self.held[1]),
            "next_seq": self.next_seq, "rows": self.rows, "chunks": self.chunks,
            "rejected": self.rejected, "start_gtid": self.start_gtid,
            "end_gtid": self.end_gtid,
        }
        # Not fsynced: a stale or lost reader.state after a machine crash only means ranges
        # read again (chunks are idempotent upserts); the engine's checkpoint is the record.
        write_atomically(
            progress_path(r.landing, r.schema.database, r.schema.table, r.session_id),
            json.dumps(data).encode(), durable=False)

    def wait_for_acknowledgement(self) -> bool:
        r = self.r
        deadline = time.monotonic() + r.ack_timeout_seconds
        while True:
            if self.state == "waiting":
                self.progress()  # (how long it has waited: the run's progress lines say)
            if self.stop_event.is_set():
                r._request("stop")
                return False
            request = read_request(r.landing, r.schema.database, r.schema.table)
            if request is not None and (request.action == "stop"
                                        or request.session_id != r.session_id):
                # stopped (a signal, the CLI) or replaced before the engine saw it
                if request.session_id == NO_SESSION:
                    self.stop_for(request)
                return False
            state = read_session_state(r._poll_checkpoint(), r.table_id)
            if state is not None and state.get("session_id") == r.session_id:
                r.log.info(f"{r._where()}: acknowledged by the capture engine at GTID "
                           f"{state.get('opening') or '(start)'}, changelog position "
                           f"{state.get('opening_pos')}")
                return True
            if time.monotonic() >= deadline:
                # A later engine must not open a session nobody reads.
                r._request("stop")
                raise NoEngineError(
                    f"no capture engine is streaming {r.landing.server_name}: start the "
                    f"stream_changes job (snapshot session {r.session_id} of {r.table_id} was "
                    f"not acknowledged within {r.ack_timeout_seconds:.0f}s; the engine picks "
                    "up requests at every flush)"
                )
            time.sleep(r.poll_seconds)

    def remove_other_sessions(self) -> None:
        """Chunk files of sessions this one replaced: the engine no longer reads them."""
        if self.r.keep_chunks:
            return
        schema = self.r.schema
        parent = chunk_dir(self.r.landing, schema.database, schema.table, self.r.session_id).parent
        if parent.is_dir():
            for path in parent.iterdir():
                if path.name != self.r.session_id and path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)

    def loop(self) -> SnapshotResult | None:
        """Read, publish and follow the engine until the session ends; None when the engine
        ended it for a restart."""
        r = self.r
        while True:
            if self.stop_event.is_set():
                r._request("stop")
                return self.stopped("stop requested")
            self.check_writes()
            outcome = self.absorb_engine_state()
            if outcome is not None or self.restart_requested:
                self.restart_requested = False
                return outcome
            request = read_request(r.landing, r.schema.database, r.schema.table)
            if request is not None and request.session_id == NO_SESSION:
                self.stop_for(request)
                return self.stopped("a stop-snapshot signal")
            if request is not None and request.session_id == r.session_id and \
                    request.signal is not None:
                r._steering = request.signal
            if request is not None and request.session_id != r.session_id:
                raise SnapshotError(f"{r._where()}: replaced by session {request.session_id} "
                                    "(another snapshot of the table started); this one ends")
            if request is not None and request.action == "stop":
                return self.stopped("a stop request")
            # (no readable request: keep the state; read_request logged why)
            paused = request.action == "pause" if request is not None else \
                self.state == "paused"
            if paused != (self.state == "paused"):
                self.state = "paused" if paused else "open"
                r.log.info(f"{r._where()}: {'paused' if paused else 'resumed'}")
                self.progress()
            if paused:
                time.sleep(r.poll_seconds)
                continue
            if self.todo and len(self.pending) < r.max_pending:
                self.read_next()
                continue
            if self.held is not None and not self.pending and not self.todo:
                chunk, rng = self.held
                self.held = None
                self.publish(chunk, rng, complete=True)
                continue
            self.check_stall()
            time.sleep(r.poll_seconds)

    def read_next(self) -> None:
        chunk, rng = self.read_range(self.todo.popleft())
        if not chunk.complete:
            self.todo.appendleft(_Range(chunk.resume_key, rng.high, rng.last))
        final = chunk.complete and rng.last
        if final and (self.pending or self.todo):
            # The engine ends the session when the complete chunk commits: publish it only
            # once every earlier chunk is committed, or a rejected one could never be re-read.
            self.held = (chunk, rng)
            self.save()
            return
        self.publish(chunk, rng, complete=final)

    def read_range(self, rng: _Range) -> tuple[Chunk, _Range]:
        """The next chunk of ``rng``, and the range it was read against."""
        r = self.r
        if rng.high is None:
            # The table looked empty at the start. Look again inside a read view: still empty,
            # that view proves the (empty) last chunk; else read up to the key found there.
            sql, params = self.table.max_key_query()

            def max_key_in_view(conn: pymysql.Connection) -> tuple[Key | None, Any]:
                def read(cur: Any) -> Key | None:
                    cur.execute(sql, params)
                    row = cur.fetchone()
                    return None if row is None else tuple(row)
                return read_with_watermarks(conn, r.flavour, read)

            found, marks = r._with_connection("reading the maximum key", max_key_in_view)
            if found is None:
                return Chunk(
                    table=self.table, rows=(), range_low=landing_key(self.table, rng.after),
                    range_high=None, low_watermark=marks.low_watermark, after=marks.after,
                    schema_fingerprint=schema_fingerprint(self.table.schema), resume_key=None,
                    complete=True), rng
            rng = _Range(rng.after, found, rng.last)
        chunk = r._with_connection(
            f"reading chunk {self.next_seq} (keys after {rng.after!r})",
            lambda conn: read_chunk(conn, r.flavour, self.table, r.chunk_size, rng.after,
                                    rng.high))
        return chunk, rng

    def publish(self, chunk: Chunk, rng: _Range, complete: bool) -> None:
        """Record the chunk as written, then write its files in the background: encoding and
        fsyncs overlap the next chunk's SELECT (one writer thread keeps manifests in order)."""
        r = self.r
        seq = self.next_seq
        self.next_seq += 1
        written_range = _Range(rng.after, chunk.resume_key if not chunk.complete else rng.high,
                               complete)
        self.pending[seq] = _Written(seq, written_range, len(chunk.rows), complete,
                                     str(chunk.after))
        self.save()  # first: a reader that dies now reads this range again when resumed
        self.check_writes()
        self.writes.append(self.writer.submit(
            write_chunk, r.landing, chunk, r.session_id, seq, complete))
        if complete:
            self.final_seq = seq
        if not self.start_gtid:
            self.start_gtid = str(chunk.low_watermark)
        key_columns = [chunk.table.schema.column(n) for n in chunk.table.key.columns]
        self.last_key = encode_key(chunk.range_high, key_columns)
        self.progress()

    def check_writes(self, wait: bool = False) -> None:
        """Raise the first failed chunk write; with ``wait``, wait for all of them first."""
        while self.writes and (wait or self.writes[0].done()):
            self.writes.popleft().result()

    def absorb_engine_state(self) -> SnapshotResult | None:
        """Apply what the engine decided since the last look; a result when the run ends."""
        r = self.r
        state = read_session_state(r._poll_checkpoint(), r.table_id)
        if state is None or state.get("session_id") != r.session_id:
            if state is not None and self.state != "waiting":
                raise SnapshotError(f"{r._where()}: replaced by session "
                                    f"{state.get('session_id')} (another snapshot of the table "
                                    "started); this one ends")
            return None
        committed = {int(s) for s in state.get("committed") or ()}
        rejected = {int(s): str(reason) for s, reason in (state.get("rejected") or {}).items()}
        changed = False
        reread: list[_Range] = []
        for seq in sorted(self.pending):
            written = self.pending[seq]
            if seq in committed:
                del self.pending[seq]
                self.chunks += 1
                self.rows += written.rows
                self.end_gtid = written.after_gtid
                changed = True
            elif seq in rejected:
                del self.pending[seq]
                self.rejected += 1
                self.reselected += 1
                r.log.info(f"{r._where()}: chunk {seq} rejected ({rejected[seq]}); reading "
                           "its range again")
                reread.append(written.range)
                if written.complete:
                    self.final_seq = None
                changed = True
        if reread:
            # A rejection may be a schema change (the engine compares fingerprints): read the
            # columns again before reading the ranges again, in key order, before new ranges.
            r._with_connection("re-reading the table's schema", lambda _c: r.reload_schema())
            self.todo.extendleft(reversed(reread))
        self.engine_rows = int(state.get("rows") or 0)
        if changed:
            self.save()
            self.progress()
        if state.get("state") == "restart":
            r.log.info(f"{r._where()}: the capture engine ended the session for a restart "
                       f"({state.get('reason')}): the table is read again in a new session, "
                       "so rows the DDL changed without row events reach the target")
            self.restart_requested = True
            return None
        if state.get("state") == "stopped":
            if state.get("reason"):  # the engine gave up on the session: an error, not a stop
                raise SnapshotError(f"{r._where()}: the capture engine stopped the session: "
                                    f"{state['reason']}; fix the cause (the engine's log has "
                                    "each rejection), then snapshot the table again")
            return self.stopped("the engine stopped the session")
        # (done without our final chunk: a resumed reader's predecessor published it unrecorded)
        if (self.final_seq is not None and self.final_seq in committed) or (
                state.get("state") == "done"):
            if state.get("state") != "done":
                raise SnapshotError(f"{r._where()}: the engine committed the complete chunk "
                                    f"{self.final_seq} but reports state "
                                    f"{state.get('state')!r}, not 'done'")
            self.state = "done"
            self.progress()
            self.check_writes(wait=True)  # nothing recreates the directory removed next
            if not r.keep_chunks:
                shutil.rmtree(chunk_dir(r.landing, r.schema.database, r.schema.table,
                                        r.session_id), ignore_errors=True)
            result = self.result("done")
            r.log.info(f"{r._where()}: done, {result.rows} rows in {result.chunks} chunks "
                       f"({result.rejected} rejected and read again), "
                       f"{result.rows_per_second:,.0f} rows/s")
            return result
        return None

    def check_stall(self) -> None:
        """Chunks wait, and the engine has not written a checkpoint for too long: it is down."""
        r = self.r
        if not self.pending:
            return
        quiet = time.monotonic() - r._checkpoint_changed_at
        if quiet < r.stall_timeout_seconds:
            return
        waiting = ", ".join(str(s) for s in sorted(self.pending))
        raise EngineStalledError(
            f"no capture engine is streaming {r.landing.server_name}: start the stream_changes "
            f"job (chunks {waiting} of {r.table_id}, session {r.session_id}, waited "
            f"{quiet:.0f}s for a checkpoint); then materialise the snapshot again"
        )


def new_session_id(prefix: str = "run") -> str:
    """A fresh session id (request.json / chunk directory name)."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"



def reader_from_settings(settings: Any, table_id: str, **options: Any) -> SnapshotReader:
    """A reader for ``db.table`` as the config captures it (columns, surrogate key), with the
    table's current schema; ``options`` go to :class:`SnapshotReader`.

    Raises SnapshotError when the table is not captured or does not exist.
    """

    server = settings.source.server_name
    selector = selector_from_settings(settings)
    with source_sql.source_connection(settings.source.connection_settings()) as conn:
        try:
            named = source_sql.resolve_table(conn, selector, table_id)
            if named is None:
                raise SnapshotError(f"snapshot of {table_id!r} on {server!r}: not a captured "
                                    "table (want database.table, matching capture.tables)")
            schema = source_sql.read_table_schema(conn, *named)
        except (LookupError, names.AmbiguousTableError) as error:
            raise SnapshotError(f"snapshot of {table_id} on {server!r}: {error}") from None
    options.setdefault("selector", selector)
    return SnapshotReader(LandingZone(settings.landing_zone.url, server),
                          settings.source.connection_settings(), settings.source.flavour,
                          selector.shape(schema), **options)
