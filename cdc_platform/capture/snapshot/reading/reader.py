"""The snapshot reader: one table's side of an incremental snapshot (docs/snapshots.md).

The reader runs outside the capture engine (in the snapshot asset's run), so it never blocks
the stream and several tables can be read at once. It talks to the engine only through the
landing zone: it writes ``request.json`` (open/pause/resume/stop) and, per chunk, the chunk's
rows (Parquet) and then its manifest; the engine acknowledges the session and reports committed
and rejected chunks in ``checkpoint.json`` under ``"snapshots"``. Deciding what a chunk may emit
is the engine's job (``commit_rule``); the reader only reads, waits and re-reads rejected ranges.

The files are ``protocol``'s; pause/resume/stop from outside a run are ``actions``; the run's
progress, result and ``reader.state`` are ``progress``. :class:`SnapshotReader` owns the run:
how it opens, adopts or replaces its session is ``opening``'s (which it inherits), the run's
state is a ``run_state.ReadRun``, the engine's decisions reach it through
``engine_view.EngineView`` and its reads reach the source through
``connection.ReplicaConnection``; what is here is the loop of reading, publishing and
following the engine.

Pure Python, no Dagster: ``defs/snapshots`` runs it in a thread and relays its log.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import pymysql

from cdc_platform.capture import names
from cdc_platform.capture import source as source_sql
from cdc_platform.capture.keys import Key
from cdc_platform.capture.landing.session_records import (
    DEFAULT_CHUNK_SIZE,
    NO_SESSION,
    Action,
    SessionState,
    SignalRef,
    SnapshotRequest,
)
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.schema import TableSchema
from cdc_platform.capture.snapshot.chunks import (
    DEFAULT_CHUNK_MAX_BYTES,
    Chunk,
    ChunkedTable,
    ChunkKey,
    SkippedTable,
    chunk_key_for,
    schema_fingerprint,
)
from cdc_platform.capture.snapshot.conditions import Condition, UnsafeConditionError
from cdc_platform.capture.snapshot.errors import (
    EngineStalledError,
    SnapshotError,
)
from cdc_platform.capture.snapshot.protocol import (
    ChunkManifest,
    ReaderLock,
    chunk_parts,
    encode_key,
    progress_parts,
    read_request,
    write_chunk,
    write_request,
)
from cdc_platform.capture.snapshot.reading.actions import request_action
from cdc_platform.capture.snapshot.reading.connection import ReplicaConnection
from cdc_platform.capture.snapshot.reading.engine_view import EngineView
from cdc_platform.capture.snapshot.reading.keyset import (
    landing_key,
    read_chunk,
    read_nullable_columns,
    with_row_bound,
)
from cdc_platform.capture.snapshot.reading.opening import SessionOpening
from cdc_platform.capture.snapshot.reading.progress import (
    KeyRange,
    ReaderState,
    SnapshotProgress,
    SnapshotResult,
    SnapshotStatus,
    WrittenChunk,
)
from cdc_platform.capture.snapshot.reading.run_state import ReadRun
from cdc_platform.capture.snapshot.watermark import (
    read_with_watermarks,
    require_snapshot_prerequisites,
)
from cdc_platform.capture.source import (
    PrerequisiteError,
    TableSelector,
    selector_from_settings,
)

__all__ = ["DEFAULT_CHUNK_SIZE", "SnapshotError", "SnapshotReader", "reader_from_settings"]


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
# How often a reader that can only wait for the engine's decisions looks at the checkpoint (a
# stat; parsed only when it changed): every chunk's commit reaches the reader this much later
# at most, which at 200k rows/s is a fifth of a 4096-row chunk's reading time.
COMMIT_POLL_SECONDS = 0.005
# The same on object storage, where each look is a request (a HEAD of the checkpoint, a GET of
# request.json): 20 looks a second.
OBJECT_STORE_POLL_SECONDS = 0.05


class SnapshotReader(SessionOpening):
    """Reads one table in chunks for the engine to commit (docs/snapshots.md).

    ``schema`` is the table's schema after column exclusion (``TableSchema.without_columns``);
    ``selector`` re-reads it the same way when a DDL changes the table mid-snapshot. The chunk
    key is the primary key, else ``surrogate_key``; a table with neither is skipped.

    One instance is one table's reader and owns its run loop (``run``): it opens or adopts the
    session, reads ranges into chunks, publishes them, and follows the engine's decisions.
    """

    def __init__(
        self,
        landing: LandingZone,
        connection_settings: dict[str, Any],
        flavour: str,
        schema: TableSchema,
        *,
        surrogate_key: Sequence[str] | str | None = None,
        condition: Condition | str | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        chunk_max_bytes: int = DEFAULT_CHUNK_MAX_BYTES,
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
        native_chunks: bool = True,
    ) -> None:
        if chunk_size < 1:
            raise ValueError(f"snapshot of {schema.table_id}: chunk size must be at least 1, "
                             f"got {chunk_size}")
        if chunk_max_bytes < 1:
            raise ValueError(f"snapshot of {schema.table_id}: chunk_max_bytes must be at least "
                             f"1, got {chunk_max_bytes}")
        if max_pending < 1:
            raise ValueError(f"snapshot of {schema.table_id}: max_pending must be at least 1")
        if condition is not None:  # text from the CLI or a run's config; a Condition passes
            try:
                condition = Condition(condition)
            except UnsafeConditionError as error:
                raise UnsafeConditionError(f"snapshot of {schema.table_id}: {error}") from None
        self.landing = landing
        self.connection_settings = connection_settings
        self.flavour = flavour
        self.schema = schema
        self.surrogate_key = surrogate_key
        self.condition = condition
        self.chunk_size = chunk_size
        self.chunk_max_bytes = chunk_max_bytes
        self._row_bytes: float | None = None  # bytes per row of the last chunk read
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
        self._replica = ReplicaConnection(connection_settings, native_chunks)
        self._table: ChunkedTable | None = None
        self._run: ReadRun  # (each run's own: made by ``_begin_run``)
        self._engine = EngineView(landing, schema.table_id)
        self._lock = ReaderLock(landing, schema.database, schema.table)
        # How often the loop looks for the engine's decisions while it can only wait: a look
        # is a stat locally, a request on object storage.
        self._commit_poll_seconds = COMMIT_POLL_SECONDS if landing.is_local else \
            OBJECT_STORE_POLL_SECONDS

    @property
    def table_id(self) -> str:
        return self.schema.table_id

    def _where(self) -> str:
        return f"snapshot of {self.table_id} (session {self.session_id})"

    # -- control from other threads --------------------------------------------------------

    def pause(self) -> None:
        request_action(self.landing, self.schema.database, self.schema.table, Action.PAUSE,
                       self.session_id)

    def resume(self) -> None:
        request_action(self.landing, self.schema.database, self.schema.table, Action.RESUME,
                       self.session_id)

    def stop(self) -> None:
        request_action(self.landing, self.schema.database, self.schema.table, Action.STOP,
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
                return SnapshotResult(self.table_id, self.session_id, SnapshotStatus.SKIPPED,
                                      reason=key.reason)
            self._lock.try_acquire()
            self._table = self._with_connection(
                "reading the column widths", lambda conn: with_row_bound(
                    conn, ChunkedTable(self.schema, key, self.condition)))
            self._begin_run(stop_event, on_progress, started)
            try:
                return self._run_session()
            finally:
                self._run.writer.shutdown(wait=True)  # chunk files being written are finished
        finally:
            self._lock.release()
            self._replica.reconnect()

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

    # -- the source and the engine --------------------------------------------------------

    def _request(self, action: str) -> None:
        assert self._table is not None
        self._lock.check()
        write_request(self.landing, self.schema.database, self.schema.table, SnapshotRequest(
            self.session_id, action, self._table.key.columns, self.condition, self.chunk_size,
            signal=self._steering))

    def _with_connection(self, what: str, action: Callable[[pymysql.Connection], Any],
                         chunks: bool = False) -> Any:
        """``action`` on the replica (``ReplicaConnection.read``: reconnects with backoff, and
        re-reads the schema once when the table lost a selected column)."""
        return self._replica.read(what, action, where=self._where(), log=self.log,
                                  reload_schema=self.reload_schema, chunks=chunks)

    def reload_schema(self) -> bool:
        """Re-read the table's schema (after exclusions); True when its columns changed.

        A chunk read with the old columns is rejected by the engine (fingerprint); re-reads use
        the new ones. A changed chunk key is not supported: it fails the snapshot.
        """
        assert self._table is not None
        conn = self._replica.connection()
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
        self._table = with_row_bound(conn, ChunkedTable(current, key, self.condition))
        return True

    # -- one run: open or adopt the session, read and publish chunks, follow the engine ---

    def _begin_run(self, stop_event: threading.Event,
                   on_progress: Callable[[SnapshotProgress], None] | None,
                   started: float) -> None:
        """The state of one run: the session's ranges, chunks and counters."""
        self._run = ReadRun(
            stop_event, on_progress, started, base_session_id=self.session_id,
            writer=concurrent.futures.ThreadPoolExecutor(1, "snapshot-chunk-writer"))

    @property
    def _chunked(self) -> ChunkedTable:
        assert self._table is not None
        return self._table

    def _result(self, status: SnapshotStatus) -> SnapshotResult:
        run = self._run
        return SnapshotResult(
            table_id=self.table_id, session_id=self.session_id, status=status,
            rows=run.rows, chunks=run.chunks, rejected=run.rejected,
            reselected=run.reselected, duration_seconds=time.monotonic() - run.started,
            start_gtid=run.start_gtid, end_gtid=run.end_gtid, rows_emitted=run.engine_rows,
            restarts=run.restarts)

    def _progress(self) -> None:
        run = self._run
        if run.on_progress is not None:
            run.on_progress(SnapshotProgress(
                self.table_id, self.session_id, run.state, run.rows, run.chunks,
                len(run.pending) + (run.held is not None), run.rejected, run.reselected,
                run.last_key, time.monotonic() - run.started, run.maximum_key))

    def _stopped(self, why: str) -> SnapshotResult:
        self.log.info(f"{self._where()}: stopped ({why}) after {self._run.chunks} committed "
                        f"chunks, {self._run.rows} rows; committed chunks stay applied")
        return self._result(SnapshotStatus.STOPPED)

    # -- phases ----------------------------------------------------------------------------

    def _run_session(self) -> SnapshotResult:
        newer = self._superseded()
        if newer is not None:
            assert newer.signal is not None
            return self._stopped(f"signal {newer.signal.id} ({newer.action}) came after this "
                                 f"run's signal {self.signal.id if self.signal else '-'}; nothing "
                                 "was read")
        if self._lock.held and self.adopt_open_session and self._resume_session():
            self._run.state = ReaderState.OPEN
            self._progress()
        else:
            stopped = self._open_session()
            if stopped is not None:
                return stopped
        while True:
            outcome = self._loop()
            if outcome is not None:
                return outcome
            stopped = self._open_session(restart=True)  # the engine ended it for a DDL
            if stopped is not None:
                return stopped

    def _save(self) -> None:
        """Record the ranges still to read and the chunks written, before publishing a chunk
        and after the engine decided some (see ``_resume_session``)."""
        # Not fsynced: a stale or lost reader.state after a machine crash only means ranges
        # read again (chunks are idempotent upserts); the engine's checkpoint is the record.
        self._lock.check()
        self.landing.store.write_atomically(
            *progress_parts(self.schema.database, self.schema.table, self.session_id),
            data=json.dumps(self._run.record()).encode(), durable=False)

    def _loop(self) -> SnapshotResult | None:
        """Read, publish and follow the engine until the session ends; None when the engine
        ended it for a restart."""
        while True:
            if self._run.stop_event.is_set():
                self._request(Action.STOP)
                return self._stopped("stop requested")
            self._check_writes()
            outcome = self._absorb_engine_state()
            if outcome is not None or self._run.restart_requested:
                self._run.restart_requested = False
                return outcome
            request = read_request(self.landing, self.schema.database, self.schema.table)
            if request is not None and request.session_id == NO_SESSION:
                self._stop_for(request)
                return self._stopped("a stop-snapshot signal")
            if request is not None and request.session_id == self.session_id and \
                    request.signal is not None:
                self._steering = request.signal
            if request is not None and request.session_id != self.session_id:
                raise SnapshotError(f"{self._where()}: replaced by session {request.session_id} "
                                    "(another snapshot of the table started); this one ends")
            if request is not None and request.action == Action.STOP:
                # (the chunks the engine committed before it saw the stop count too)
                outcome = self._absorb_engine_state()
                return outcome if outcome is not None else self._stopped("a stop request")
            # (no readable request: keep the state; read_request logged why)
            paused = request.action == Action.PAUSE if request is not None else \
                self._run.state == ReaderState.PAUSED
            if paused != (self._run.state == ReaderState.PAUSED):
                self._run.state = ReaderState.PAUSED if paused else ReaderState.OPEN
                self.log.info(f"{self._where()}: {'paused' if paused else 'resumed'}")
                self._progress()
            if paused:
                time.sleep(self.poll_seconds)
                continue
            if self._run.todo and len(self._run.pending) < self.max_pending:
                self._read_next()
                continue
            if self._run.held is not None and not self._run.pending and not self._run.todo:
                chunk, rng = self._run.held
                self._run.held = None
                self._publish(chunk, rng, complete=True)
                continue
            self._check_stall()
            time.sleep(min(self.poll_seconds, self._commit_poll_seconds))

    def _read_next(self) -> None:
        chunk, rng = self._read_range(self._run.todo.popleft())
        if not chunk.complete:
            self._run.todo.appendleft(KeyRange(chunk.resume_key, rng.high, rng.last))
        final = chunk.complete and rng.last
        if final and (self._run.pending or self._run.todo):
            # The engine ends the session when the complete chunk commits: publish it only
            # once every earlier chunk is committed, or a rejected one could never be re-read.
            self._run.held = (chunk, rng)
            self._save()
            return
        self._publish(chunk, rng, complete=final)

    def _read_range(self, rng: KeyRange) -> tuple[Chunk, KeyRange]:
        """The next chunk of ``rng``, and the range it was read against."""
        if rng.high is None:
            # The table looked empty at the start. Look again inside a read view: still empty,
            # that view proves the (empty) last chunk; else read up to the key found there.
            sql, params = self._chunked.max_key_query()

            def max_key_in_view(conn: pymysql.Connection) -> tuple[Key | None, Any]:
                def read(cur: Any) -> Key | None:
                    cur.execute(sql, params)
                    row = cur.fetchone()
                    return None if row is None else tuple(row)
                return read_with_watermarks(conn, self.flavour, read)

            found, marks = self._with_connection("reading the maximum key", max_key_in_view)
            if found is None:
                return Chunk(
                    table=self._chunked, rows=(), range_low=landing_key(self._chunked, rng.after),
                    range_high=None, low_watermark=marks.low_watermark, after=marks.after,
                    schema_fingerprint=schema_fingerprint(self._chunked.schema), resume_key=None,
                    complete=True), rng
            rng = KeyRange(rng.after, found, rng.last)
        chunk = self._with_connection(
            f"reading chunk {self._run.next_seq} (keys after {rng.after!r})",
            # (cast to landing form in the writer thread, while the next chunk is read)
            lambda conn: read_chunk(conn, self.flavour, self._chunked, self.chunk_size, rng.after,
                                    rng.high, self.chunk_max_bytes, self._row_bytes,
                                    defer_landing=True),
            chunks=True)
        if chunk.rows:
            self._row_bytes = chunk.bytes_read / len(chunk.rows)
        return chunk, rng

    def _publish(self, chunk: Chunk, rng: KeyRange, complete: bool) -> None:
        """Record the chunk as written, then write its files in the background: encoding and
        fsyncs overlap the next chunk's SELECT (one writer thread keeps manifests in order)."""
        seq = self._run.next_seq
        self._run.next_seq += 1
        written_range = KeyRange(rng.after, chunk.resume_key if not chunk.complete else rng.high,
                                 complete)
        self._run.pending[seq] = WrittenChunk(seq, written_range, len(chunk.rows), complete,
                                          str(chunk.after))
        self._save()  # first: a reader that dies now reads this range again when resumed
        # One chunk being written while the next is read: a writer slower than the reader
        # must not make the reader hold many chunks (memory is bounded by chunk_max_bytes).
        self._check_writes(wait_until=1)
        self._run.writes.append(self._run.writer.submit(self._write_chunk, chunk, seq, complete))
        if complete:
            self._run.final_seq = seq
        if not self._run.start_gtid:
            self._run.start_gtid = str(chunk.low_watermark)
        key_columns = [chunk.table.schema.column(n) for n in chunk.table.key.columns]
        self._run.last_key = encode_key(chunk.range_high, key_columns)
        self._progress()

    def _write_chunk(self, chunk: Chunk, seq: int, complete: bool) -> ChunkManifest:
        """(In the writer thread.) A reader that lost its lock writes no chunk."""
        self._lock.check()
        return write_chunk(self.landing, chunk, self.session_id, seq, complete)

    def _check_writes(self, wait: bool = False, wait_until: int | None = None) -> None:
        """Raise the first failed chunk write; with ``wait``, wait for all of them first, with
        ``wait_until``, until no more than that many are being written."""
        while self._run.writes and (wait or self._run.writes[0].done() or (
                wait_until is not None and len(self._run.writes) > wait_until)):
            self._run.writes.popleft().result()

    def _absorb_engine_state(self) -> SnapshotResult | None:
        """Apply what the engine decided since the last look; a result when the run ends."""
        state = self._engine.session(self.session_id)
        if state is None or state.session_id != self.session_id:
            if state is not None and self._run.state != ReaderState.WAITING:
                raise SnapshotError(f"{self._where()}: replaced by session "
                                    f"{state.session_id} (another snapshot of the table "
                                    "started); this one ends")
            return None
        committed = {int(s) for s in state.committed}
        rejected = {int(s): str(reason) for s, reason in state.rejected.items()}
        changed = False
        reread: list[KeyRange] = []
        for seq in sorted(self._run.pending):
            written = self._run.pending[seq]
            if seq in committed:
                del self._run.pending[seq]
                self._run.chunks += 1
                self._run.rows += written.rows
                self._run.end_gtid = written.after_gtid
                changed = True
            elif seq in rejected:
                del self._run.pending[seq]
                self._run.rejected += 1
                self._run.reselected += 1
                self.log.info(f"{self._where()}: chunk {seq} rejected ({rejected[seq]}); reading "
                              "its range again")
                reread.append(written.range)
                if written.complete:
                    self._run.final_seq = None
                changed = True
        if reread:
            # A rejection may be a schema change (the engine compares fingerprints): read the
            # columns again before reading the ranges again, in key order, before new ranges.
            self._with_connection("re-reading the table's schema", lambda _c: self.reload_schema())
            self._run.todo.extendleft(reversed(reread))
        self._run.engine_rows = state.rows
        if changed:
            self._save()
            self._progress()
        if state.state == SessionState.RESTART:
            self.log.info(f"{self._where()}: the capture engine ended the session for a restart "
                          f"({state.reason}): the table is read again in a new session, "
                          "so rows the DDL changed without row events reach the target")
            self._run.restart_requested = True
            return None
        if state.state == SessionState.STOPPED:
            if state.reason:  # the engine gave up on the session: an error, not a stop
                raise SnapshotError(f"{self._where()}: the capture engine stopped the session: "
                                    f"{state.reason}; fix the cause (the engine's log has "
                                    "each rejection), then snapshot the table again")
            return self._stopped("the engine stopped the session")
        # (done without our final chunk: a resumed reader's predecessor published it unrecorded)
        if (self._run.final_seq is not None and self._run.final_seq in committed) or (
                state.state == SessionState.DONE):
            if state.state != SessionState.DONE:
                raise SnapshotError(f"{self._where()}: the engine committed the complete chunk "
                                    f"{self._run.final_seq} but reports state "
                                    f"{str(state.state)!r}, not 'done'")
            self._run.state = ReaderState.DONE
            self._progress()
            self._check_writes(wait=True)  # nothing recreates the directory removed next
            if not self.keep_chunks:
                self.landing.store.delete_directory(*chunk_parts(
                    self.schema.database, self.schema.table, self.session_id))
            result = self._result(SnapshotStatus.DONE)
            self.log.info(f"{self._where()}: done, {result.rows} rows in {result.chunks} chunks "
                          f"({result.rejected} rejected and read again), "
                          f"{result.rows_per_second:,.0f} rows/s")
            return result
        return None

    def _check_stall(self) -> None:
        """Chunks wait, and the engine has not written a checkpoint for too long: it is down."""
        if not self._run.pending:
            return
        quiet = time.monotonic() - self._engine.changed_at
        if quiet < self.stall_timeout_seconds:
            return
        waiting = ", ".join(str(s) for s in sorted(self._run.pending))
        raise EngineStalledError(
            f"no capture engine is streaming {self.landing.server_name}: start the stream_changes "
            f"job (chunks {waiting} of {self.table_id}, session {self.session_id}, waited "
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
    return SnapshotReader(LandingZone.from_settings(settings, server),
                          settings.source.connection_settings(), settings.source.flavour,
                          selector.shape(schema), **options)
