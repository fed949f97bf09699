"""The files through which a snapshot reader and the capture engine talk (docs/snapshots.md).

One section per section of docs/snapshots.md, in its order: the layout under
``<landing>/<server>/snapshots/<db>/<table>/``, ``request.json`` (reader -> engine) and the
notice that it changed (``snapshot_requests/``), ``control.json`` (a signal -> a run that has
not opened its session yet), the chunk files and their manifest (reader -> engine), the
engine's session state in ``checkpoint.json`` and, once ended sessions left it,
``ended_sessions.json`` (engine -> reader), and ``reader.lock`` (``reader.lease`` on object
storage). Nothing else is shared
between the two processes; what each side does with these files is in ``reader`` and
``sessions``. The request and session records themselves (``SnapshotRequest``, ``Action``,
``SignalRef``, ``SnapshotSession``, ``SessionState``, ``EndedSessions``) are the landing zone's
(``capture.landing.zone``, a floor below, so that retention reads them with the same parsers)
and are imported from there. Every file is read and written through the zone's store (``landing.store``, path
parts below the server's folder), so one code path serves a local zone and an ``s3://`` one.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from cdc_platform.capture.keys import Key
from cdc_platform.capture.landing.session_records import (
    ENDED_SESSIONS_FILE,
    Action,
    EndedSessions,
    SignalRef,
    SnapshotRequest,
    SnapshotSession,
    timestamp_now,
)
from cdc_platform.capture.landing.zone import (
    READER_LEASE_FILE,
    READER_LOCK_FILE,
    SNAPSHOT_CHUNKS_DIR,
    SNAPSHOT_CONTROL_FILE,
    SNAPSHOT_REQUEST_FILE,
    SNAPSHOTS_DIR,
    Checkpoint,
    LandingReader,
    LandingZone,
    snapshot_parts,
    table_of_parts,
    table_parts,
)
from cdc_platform.capture.schema import ColumnSpec, ColumnValueError, TableSchema, landing_arrays
from cdc_platform.capture.snapshot import native
from cdc_platform.capture.snapshot.chunks import Chunk
from cdc_platform.capture.snapshot.errors import SnapshotError
from cdc_platform.capture.store.lease import Lease, process_holder

# The reader's record of its session (``progress_parts``), beside the session's chunks.
READER_STATE_FILE = "reader.state"
log = logging.getLogger(__name__)
# A chunk's rows beside its manifest (``<seq:08d>.arrow``): ``write_chunk``, ``read_chunk_rows``.
CHUNK_ROWS_SUFFIX = ".arrow"
# Notices that a table's request.json changed (``write_request``), below the server's folder:
# the engine lists this one folder instead of looking at every table's request.
REQUEST_NOTICES_DIR = "snapshot_requests"


# ---- the layout ----------------------------------------------------------------------------------
# Path parts below the server's folder, for the zone's store (``landing.store``): the same code
# reads and writes a local zone and an ``s3://`` one.


def request_parts(database: str, table: str) -> tuple[str, ...]:
    return (*snapshot_parts(database, table), SNAPSHOT_REQUEST_FILE)


def chunk_parts(database: str, table: str, session_id: str) -> tuple[str, ...]:
    """A session's chunk directory: chunk files, manifests and ``reader.state``."""
    return (*snapshot_parts(database, table), SNAPSHOT_CHUNKS_DIR, session_id)


def control_parts(database: str, table: str) -> tuple[str, ...]:
    """The pause or resume a signal asked for while no session of the table was open."""
    return (*snapshot_parts(database, table), SNAPSHOT_CONTROL_FILE)


def progress_parts(database: str, table: str, session_id: str) -> tuple[str, ...]:
    """The reader's record of its ranges still to read and chunks written (docs/snapshots.md)."""
    return (*chunk_parts(database, table, session_id), READER_STATE_FILE)


def manifest_name(seq: int) -> str:
    return f"{seq:08d}.json"


def manifest_seqs(landing: LandingReader, database: str, table: str,
                  session_id: str) -> list[int]:
    """The seqs of a session's published chunks (those whose manifest exists), in order."""
    found = []
    for name in landing.store.list_names(*chunk_parts(database, table, session_id)):
        stem, _, suffix = name.partition(".")
        if suffix == "json" and stem.isdigit():
            found.append(int(stem))
    return sorted(found)


def requested_tables(landing: LandingReader) -> list[tuple[str, str]]:
    """``(database, table)`` of every table with a snapshot directory (a request, a control
    or chunks), in directory order; names not in escaped form are left out."""
    found = []
    for db_dir in landing.store.list_names(SNAPSHOTS_DIR):
        for table_dir in landing.store.list_names(SNAPSHOTS_DIR, db_dir):
            try:
                names = table_of_parts(db_dir, table_dir)
            except ValueError:  # (invalid %-escapes, or too long)
                continue
            if table_parts(*names) == (db_dir, table_dir):
                found.append(names)
    return found


# ---- request.json (reader -> engine) ------------------------------------------------------------
# (the record, ``SnapshotRequest``, and its one parser are ``landing.zone``'s: see the imports)


def write_request(landing: LandingZone, database: str, table: str,
                  request: SnapshotRequest) -> str:
    """Replace the table's ``request.json`` atomically, then leave a notice that it changed
    (``request_notices``); its URL (a path locally)."""
    parts = request_parts(database, table)
    landing.store.write_atomically(*parts, data=request.to_json())
    # After the request: the engine that reads the notice reads this request (or a newer
    # one). A notice lost with its writer (killed in between) is made up for by the engine's
    # look at every request now and then (``sessions.REQUEST_SCAN_SECONDS``).
    name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:12]}.json"
    landing.store.write_atomically(REQUEST_NOTICES_DIR, name, data=json.dumps(
        {"database": database, "table": table}).encode(), durable=False)
    return str(landing.where(*parts))


@dataclass(frozen=True)
class RequestNotice:
    """A notice that a table's ``request.json`` changed: its file name, and the table (None
    when the notice does not read: not one ``write_request`` wrote)."""

    name: str
    table: tuple[str, str] | None


def request_notices(landing: LandingReader) -> list[RequestNotice]:
    """The notices in ``snapshot_requests/``, oldest first: one listing (and a read of each
    notice) where looking at every table's request was a ``stat`` each (a request each on
    object storage), whatever the number of tables. The engine deletes each notice once it
    has read the table's request (``delete_request_notice``)."""
    notices = []
    for name in landing.store.list_names(REQUEST_NOTICES_DIR):
        if name.startswith(".") or not name.endswith(".json"):
            continue  # (a temporary file of a write under way)
        data = landing.store.read_bytes(REQUEST_NOTICES_DIR, name)
        if data is None:
            continue  # (deleted meanwhile)
        try:
            raw = json.loads(data)
            table: tuple[str, str] | None = (str(raw["database"]), str(raw["table"]))
        except (ValueError, KeyError, TypeError):
            table = None
        notices.append(RequestNotice(name, table))
    return notices


def delete_request_notice(landing: LandingZone, notice: RequestNotice) -> None:
    landing.store.delete(REQUEST_NOTICES_DIR, notice.name)


def read_request(landing: LandingReader, database: str, table: str) -> SnapshotRequest | None:
    """The table's ``request.json``; None when there is none, or when it cannot be read (it is
    written atomically, so only a hand edit breaks it: logged, and the next write replaces it).
    """
    parts = request_parts(database, table)
    data = landing.store.read_bytes(*parts)
    if data is None:
        return None
    try:
        return SnapshotRequest.from_json(data)
    except (ValueError, KeyError, TypeError) as error:
        where = landing.store.uri_of(*parts)
        version = hash(data)
        if _unreadable_requests.get(where) != version:  # once per version of the file
            _unreadable_requests[where] = version
            log.warning(
                f"snapshot request {where} is unreadable ({error!r}); treated as absent: the "
                f"next snapshot run or signal for {database}.{table} writes it again")
        return None


_unreadable_requests: dict[str, int] = {}


# ---- control.json (signal -> a run not started yet) --------------------------------------------


def read_control(landing: LandingReader, database: str, table: str
                 ) -> tuple[str, SignalRef] | None:
    """``control.json``: (``pause`` or ``resume``, the signal), or None."""
    data = landing.store.read_bytes(*control_parts(database, table))
    if data is None:
        return None
    try:
        raw = json.loads(data)
        signal = SignalRef.from_dict(raw["signal"])
        action = str(raw["action"])
    except (ValueError, KeyError, TypeError):
        return None  # (only a hand edit breaks it; the next pause or resume rewrites it)
    if signal is None or action not in ("pause", "resume"):
        return None
    return action, signal


def write_control(landing: LandingZone, database: str, table: str, action: str,
                  signal: SignalRef) -> None:
    """Record a pause or resume for a run that has not opened its session yet."""
    landing.store.write_atomically(*control_parts(database, table), data=json.dumps(
        {"action": str(Action(action)), "signal": signal.to_dict(),
         "requested_at": timestamp_now()}).encode())


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


# ---- chunk files (reader -> engine) ------------------------------------------------------------


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
    read_at: str = field(default_factory=timestamp_now)

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
    return pa.Table.from_arrays(arrays, schema=schema.arrow_schema())


def write_chunk(landing: LandingZone, chunk: Chunk, session_id: str, seq: int,
                complete: bool) -> ChunkManifest:
    """Write the chunk's rows file, then its manifest, each created exclusively (a temporary
    file, fsync and link locally; a PUT with ``If-None-Match`` on object storage).

    The engine lists manifests: one that exists always has its complete rows file beside it.
    Exclusive, because a seq is written once per session: should a reader that lost its lock
    (frozen past its lease) write on beside the reader that adopted its session, one of the two
    fails loudly here instead of pairing its manifest with the other's rows.
    The rows are an Arrow IPC file (uncompressed): the file lives only until the engine
    commits it, so what counts is the time to write and read it, and Arrow's own layout costs
    a copy each way where Parquet encodes and decodes every value.
    """
    schema = chunk.table.schema
    parts = chunk_parts(schema.database, schema.table, session_id)
    if chunk.arrow is not None:
        table = chunk.arrow
    elif isinstance(chunk.rows, native.ArrowRows):
        table = chunk.rows.table  # (cast now, if the reader deferred it: ``read_chunk``)
    else:
        table = chunk_arrow_table(schema, chunk.rows, chunk.columns)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    key_columns = [schema.column(name) for name in chunk.table.key.columns]
    manifest = ChunkManifest(
        session_id=session_id, seq=seq, rows=len(chunk.rows), complete=complete,
        range_low=encode_key(chunk.range_low, key_columns),
        range_high=encode_key(chunk.range_high, key_columns),
        low_watermark=str(chunk.low_watermark), after=str(chunk.after),
        fingerprint=chunk.schema_fingerprint,
    )
    for name, data in ((f"{seq:08d}{CHUNK_ROWS_SUFFIX}", memoryview(sink.getvalue())),
                       (manifest_name(seq), manifest.to_json())):
        if not landing.store.write_exclusively(*parts, name, data=data):
            raise SnapshotError(
                f"snapshot of {schema.table_id}: chunk {seq} of session {session_id} already "
                f"exists ({landing.where(*parts, name)}): another reader writes this session "
                "(this one lost its reader lock); this reader stops")
    return manifest


def read_chunk_rows(landing: LandingReader, database: str, table: str, session_id: str,
                    seq: int) -> pa.Table:
    """The rows file beside a chunk's manifest: Arrow IPC, or Parquet as readers before
    issue 15 wrote it (a session a reader of that version left open)."""
    parts = chunk_parts(database, table, session_id)
    data = landing.store.read_bytes(*parts, f"{seq:08d}{CHUNK_ROWS_SUFFIX}")
    if data is None:
        legacy = landing.store.read_bytes(*parts, f"{seq:08d}.parquet")
        if legacy is not None:
            return pq.read_table(pa.BufferReader(legacy))
        raise FileNotFoundError(f"chunk {seq} of session {session_id} of {database}.{table}: "
                                f"no rows file beside its manifest in "
                                f"{landing.store.uri_of(*parts)}")
    return pa.ipc.open_file(pa.BufferReader(data)).read_all()


# ---- the engine's session state (engine -> reader) --------------------------------------------


def read_session_state(checkpoint: Checkpoint | None, table_id: str) -> SnapshotSession | None:
    """The engine's record of the table's snapshot session, from its checkpoint: a session it
    tracks (open, paused), or one that ended a little while ago. Enough for whoever asks
    about running sessions; an ended session may have left it (``latest_session``)."""
    return None if checkpoint is None else checkpoint.snapshot_session(table_id)


class _SharedEndedSessions:
    """The newest parsed ``ended_sessions.json`` of each landing zone in this process, by the
    file's stamp (a ``stat`` locally, a HEAD on object storage): it changes only when sessions
    leave the checkpoint, and readers look at it far more often."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: dict[str, tuple[str, EndedSessions]] = {}

    def read(self, landing: LandingReader) -> EndedSessions:
        key = landing.store.uri
        stamp = landing.store.stamp(ENDED_SESSIONS_FILE)
        if stamp is None:
            return EndedSessions()
        with self._lock:
            cached = self._latest.get(key)
            if cached is not None and cached[0] == stamp:
                return cached[1]
        data = landing.store.read_bytes(ENDED_SESSIONS_FILE)
        ended = EndedSessions() if data is None else EndedSessions.from_json(data)
        with self._lock:  # (under the stamp read before it: a later look reads it again)
            self._latest[key] = (stamp, ended)
        return ended


_ENDED_SESSIONS = _SharedEndedSessions()


def read_ended_sessions(landing: LandingReader) -> EndedSessions:
    """``ended_sessions.json``: each table's newest session that ended and left the
    checkpoint (parsed again only when the file changed)."""
    return _ENDED_SESSIONS.read(landing)


def latest_session(landing: LandingReader, checkpoint: Checkpoint | None,
                   table_id: str) -> SnapshotSession | None:
    """The table's newest session the engine recorded: the checkpoint's record, else the one
    that left it (``ended_sessions.json``). Read the checkpoint first: the engine writes the
    ended sessions before any checkpoint that lacks them, so the pair read in this order
    never misses a session."""
    return read_session_state(checkpoint, table_id) or read_ended_sessions(landing).get(table_id)


# ---- reader.lock / reader.lease: one reader per table -----------------------------------------

# The reader's lease on object storage, renewed every third of it: a killed reader's lease
# blocks the next reader of the table at most this long (locally the flock goes at once).
READER_LEASE_TTL_SECONDS = 30.0


class ReaderLock:
    """At most one live reader per table.

    Locally an exclusive ``flock`` on ``reader.lock``, released when the reader ends or its
    process dies, at once (so a dead reader's session can be adopted by the next run). On
    object storage, where no process holds a file lock, a ``Lease`` (``reader.lease``, see
    ``capture.store.lease``) renewed by a daemon thread every third of its ttl: a killed reader's
    lease blocks the next reader until it expires, and a reader whose lease was lost (frozen
    past the ttl, or taken over) must stop writing: ``check`` raises, and the reader calls it
    before every write.
    """

    def __init__(self, landing: LandingReader, database: str, table: str,
                 ttl_seconds: float | None = None) -> None:
        self.landing = landing
        self.table_id = f"{database}.{table}"
        self._local = _reader_lock_file(landing, database, table)
        self._lease = None if self._local is not None else Lease(
            landing.store, *snapshot_parts(database, table), READER_LEASE_FILE)
        self.ttl_seconds = READER_LEASE_TTL_SECONDS if ttl_seconds is None else ttl_seconds
        self._handle: Any = None
        self._lost = threading.Event()
        self._stop_renewing = threading.Event()
        self._renewer: threading.Thread | None = None

    def try_acquire(self) -> bool:
        """Take the lock; False while another live reader holds it."""
        holder = process_holder()
        if self._lease is not None:
            if not self._lease.acquire(holder, self.ttl_seconds):
                return False
            self._lost.clear()
            self._stop_renewing.clear()
            self._renewer = threading.Thread(target=self._renew, daemon=True,
                                             name=f"reader-lease-{self.table_id}")
            self._renewer.start()
            return True
        assert self._local is not None
        self._local.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self._local, "a+")  # noqa: SIM115 - held for the run
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        handle.seek(0)
        handle.truncate()
        handle.write(holder)
        handle.flush()
        self._handle = handle
        return True

    def _renew(self) -> None:
        assert self._lease is not None
        while not self._stop_renewing.wait(self.ttl_seconds / 3):
            try:
                renewed = self._lease.renew()
            except Exception:  # noqa: BLE001 - retried at the next interval while held
                log.warning(f"snapshot of {self.table_id}: renewing the reader lease failed",
                            exc_info=True)
                renewed = self._lease.held
            if not renewed:
                self._lost.set()
                log.error(f"snapshot of {self.table_id}: the reader lease "
                          f"{self._lease.store.uri_of(*self._lease.parts)} was lost (expired or "
                          "taken by another reader); this reader writes nothing more")
                return

    @property
    def held(self) -> bool:
        if self._lease is not None:
            return self._lease.held and not self._lost.is_set()
        return self._handle is not None

    def check(self) -> None:
        """Raise SnapshotError if this reader held the lock and lost it (object storage): it
        must not write another file."""
        if self._lease is not None and self._renewer is not None and not self.held:
            raise SnapshotError(
                f"snapshot of {self.table_id}: this reader's lease "
                f"{self._lease.store.uri_of(*self._lease.parts)} was lost (expired while the "
                "reader was stalled, or taken by another reader); it stops without writing")

    def holder(self) -> str:
        """Who holds the lock, for messages."""
        if self._lease is not None:
            current = self._lease.current()
            return current.holder if current is not None and current.holder else "unknown"
        assert self._local is not None
        try:
            return self._local.read_text().strip() or "unknown"
        except OSError:
            return "unknown"

    def release(self) -> None:
        if self._lease is not None:
            if self._renewer is not None:
                self._stop_renewing.set()
                self._renewer.join()
                self._renewer = None
                try:
                    self._lease.release()
                except Exception:  # noqa: BLE001 - it expires on its own
                    log.warning(f"snapshot of {self.table_id}: releasing the reader lease "
                                "failed (it expires on its own)", exc_info=True)
            return
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def _reader_lock_file(landing: LandingReader, database: str, table: str) -> Path | None:
    """The local ``reader.lock`` of a local zone, else None (object storage: the lease)."""
    root = landing.store.local_root
    return None if root is None else root.joinpath(*snapshot_parts(database, table),
                                                   READER_LOCK_FILE)


def reader_alive(landing: LandingReader, database: str, table: str) -> bool:
    """Whether a live reader holds the table's lock (a dead one's flock is gone with its
    process; on object storage its lease has not expired yet)."""
    path = _reader_lock_file(landing, database, table)
    if path is None:
        current = Lease(landing.store, *snapshot_parts(database, table),
                        READER_LEASE_FILE).current()
        return current is not None and current.expires_at > time.time()
    try:
        with open(path, "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
    except OSError:
        return False
    return False
