"""The engine's chunk decisions (docs/snapshots.md, "The commit rule"): each pending chunk a
reader published is committed, rejected or left waiting by ``commit_rule.decide_chunk_commit``,
and a committed chunk lands as snapshot records (its rows, its range assertion, the sweep after a
complete snapshot). The snapshot coordinator (``sessions.SnapshotCoordinator``) holds the
sessions and decides when; this is how one chunk is decided and landed, apart from the
sessions' life so each reads as one concept.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from cdc_platform.capture import names
from cdc_platform.capture.gtid import Gtid, GtidSet, parse_position
from cdc_platform.capture.landing.records import (
    HI_OPEN,
    LO_OPEN,
    RANGE_ASSERTION,
    SNAPSHOT_ROW,
    SWEEP,
    THRESHOLD,
    hi_column,
)
from cdc_platform.capture.landing.session_records import SessionState, SnapshotSession, session_time
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.capture.snapshot.chunks import (
    Chunk,
    ChunkedTable,
    ChunkKey,
    schema_fingerprint,
)
from cdc_platform.capture.snapshot.commit_rule import (
    Commit,
    RangeAssertion,
    Reject,
    TouchedKeyLog,
    decide_chunk_commit,
    sweep_after_snapshot,
)
from cdc_platform.capture.snapshot.conditions import Condition
from cdc_platform.capture.snapshot.protocol import (
    ChunkManifest,
    chunk_parts,
    decode_key,
    manifest_name,
    manifest_seqs,
    read_chunk_rows,
)


class SnapshotEmitter(Protocol):
    """The one way the coordinator's records reach the changelog: at the engine's current
    point, after every change it processed (the engine's ``Lander``)."""

    @property
    def next_pos(self) -> int:
        """The changelog position the next record takes: where a session opening now opens."""
        ...

    def add_snapshot(self, schema: TableSchema, op: str, rows: list[tuple[Any, ...]] | pa.Table,
                     extra: dict[str, list[Any]] | None) -> int:
        """Queue records of one op (chunk rows, a range assertion, a sweep); the first position
        they take. Rows are tuples in schema column order, or (chunk rows) an Arrow table of
        the user columns. Raises, queueing nothing, when they do not fit the schema."""
        ...


class TableSchemas(Protocol):
    """The engine's schemas, which chunks are decided against (``changes.schemas.
    SchemaTracker``): as the binlog's table maps gave them, or read from the source."""

    schemas: dict[str, TableSchema]

    def learn_table(self, table_id: str) -> TableSchema | None:
        """The table's current schema read from the source (shaped by the selector), recorded
        as the engine's; None when the table does not exist."""
        ...


def _key_values(column: pa.ChunkedArray) -> list[Any]:
    """A key column of a chunk's Parquet as Python values in the landing form the binlog
    gives: TIMESTAMP columns come back as aware UTC datetimes, the binlog (and a SELECT) gives
    naive UTC ones, and touched keys must compare equal to chunk keys (one Arrow cast, not a
    conversion per value)."""
    if pa.types.is_timestamp(column.type) and column.type.tz is not None:
        column = column.cast(pa.timestamp(column.type.unit))  # naive UTC
    return column.to_pylist()


def _touch_candidates(rows: pa.Table, key_names: tuple[str, ...],
                      touches: dict[Any, Any]) -> pa.Array | None:
    """Indexes of the chunk rows whose key may be a touched key, or None for every row.

    Column by column, a row is a candidate when each of its key values is among the touched
    keys' values of that column (a superset of the rows whose whole key was touched): the
    commit rule then compares only those in Python. Columns whose Arrow equality may differ
    from Python's (floating point: -0.0 == 0.0) are not filtered on."""
    keys = [key for key in touches if len(key) == len(key_names)]  # (not ALL_KEYS)
    if not rows.num_rows or len(keys) * 4 > rows.num_rows:
        return None
    mask = None
    for index, name in enumerate(key_names):
        column = rows.column(name)
        if pa.types.is_floating(column.type):
            continue
        if pa.types.is_timestamp(column.type) and column.type.tz is not None:
            column = column.cast(pa.timestamp(column.type.unit))  # touched keys: naive UTC
        try:
            values = pa.array([key[index] for key in keys], column.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            return None  # a touched value of another form: let the rule see every row
        member = pc.is_in(column, value_set=values)
        mask = member if mask is None else pc.and_(mask, member)
    if mask is None:
        return None
    return pc.indices_nonzero(pc.fill_null(mask, False).combine_chunks()) \
        if isinstance(mask, pa.ChunkedArray) else pc.indices_nonzero(pc.fill_null(mask, False))


@dataclass(slots=True)
class TrackedSession:
    """What the engine holds in memory for a session it tracks (open or paused); it goes
    when the session ends, and is rebuilt empty at engine start."""

    touched: TouchedKeyLog
    key_columns: tuple[str, ...]
    ddl: list[Gtid] = field(default_factory=list)  # DDL on the table since the opening
    # When the source must be asked for the table's schema next (None: not needed while the
    # engine has one). Due at once when tracking starts: the engine's schema may predate a DDL
    # no row event followed; later, the time a failed read may be tried again.
    schema_due_at: float | None = 0.0
    rejections_in_a_row: int = 0


@dataclass(frozen=True, slots=True)
class _Decisions:
    """What every pending chunk of a session is decided with, computed once per tick."""

    schema: TableSchema
    key_specs: tuple[ColumnSpec, ...]
    # The commit rule needs only the chunk's keys: it is decided on a key-only view of the
    # chunk, and the rows go from the chunk's Parquet to the changelog as Arrow data.
    keys_only: ChunkedTable
    fingerprint: str
    opening: GtidSet


class ChunkDecisions:
    """The chunk decisions of ``SnapshotCoordinator`` (which it inherits): what a tick does with
    each session's pending chunks. Reads the coordinator's landing zone, flavour, log, emitter
    and tracked sessions; ends a session through its ``_end``."""

    landing: LandingZone
    flavour: str
    log: Any
    max_rejections_in_a_row: int
    _emitter: SnapshotEmitter
    _schemas: TableSchemas
    _tracked: dict[str, TrackedSession]

    def _end(self, table_id: str) -> None:
        raise NotImplementedError

    def _schema_for_decisions(self, session: SnapshotSession) -> TableSchema | None:
        raise NotImplementedError

    def _pending(self, session: SnapshotSession) -> list[int]:
        """The seqs of the session's published chunks not decided yet, in order."""
        decided = set(session.committed) | {int(s) for s in session.rejected}
        database, table = names.split_table_id(session.table_id)
        return [seq for seq in manifest_seqs(self.landing, database, table, session.session_id)
                if seq not in decided]

    def _decide_pending(self, session: SnapshotSession, processed: GtidSet) -> bool:
        changed = False
        schema = self._schema_for_decisions(session)
        if schema is None:
            return False
        tracked = self._tracked[session.table_id]
        decisions: _Decisions | None = None
        for seq in self._pending(session):
            try:
                if decisions is None:  # in the try: a schema that lacks a key column
                    decisions = self._decisions(session, schema)  # rejects, as a bad chunk
                decision = self._decide_one(session, tracked, decisions, seq, processed)
            except Exception as error:  # noqa: BLE001 - one bad chunk must not stop the engine
                # (a chunk that cannot be read, decoded or landed: rejecting is always safe,
                # the reader reads the range again; a stop ends a loop of such rejections)
                decision = Reject(
                    f"chunk {seq} of {session.table_id} could not be decided or landed "
                    f"({type(error).__name__}: {error}); re-select it")
                self.log.warning(f"snapshot of {session.table_id}: session "
                                 f"{session.session_id}: {decision.reason}", exc_info=True)
            if decision is None:
                break  # Wait: later chunks wait too, so commits stay in reading order
            changed = True
            if isinstance(decision, Reject):
                self._reject(session, tracked, seq, decision.reason)
                if session.state != SessionState.OPEN:
                    break
                continue
            tracked.rejections_in_a_row = 0
            if session.state == SessionState.DONE:
                break
        return changed

    def _decisions(self, session: SnapshotSession, schema: TableSchema) -> _Decisions:
        """What the session's chunks are decided with against ``schema``."""
        key_names = tuple(session.chunk_key)
        key_specs = tuple(schema.column(c) for c in key_names)
        keys_only = ChunkedTable(
            TableSchema(schema.database, schema.table, key_specs, key_names),
            ChunkKey(key_names, (False,) * len(key_names),
                     "primary key" if schema.primary_key else "surrogate key"),
            # text from request.json or the checkpoint (files anyone may edit): checked here
            None if session.condition is None else Condition(session.condition))
        return _Decisions(schema, key_specs, keys_only, schema_fingerprint(schema),
                          parse_position(self.flavour, session.opening))

    def _decide_one(self, session: SnapshotSession, tracked: TrackedSession, decisions: _Decisions,
                    seq: int, processed: GtidSet) -> Reject | Commit | None:
        """Decide one pending chunk, and land it if it commits; None when it must wait.

        Whether a chunk waits or is rejected depends on its manifest alone (watermarks, range,
        fingerprint), so its rows are read only when it may commit: a chunk waiting for a
        lagging engine is looked at every ``SNAPSHOT_POLL_SECONDS`` without re-reading its
        file each time."""
        key_names = decisions.keys_only.key.columns
        database, table = names.split_table_id(session.table_id)
        data = self.landing.store.read_bytes(*chunk_parts(database, table, session.session_id),
                                             manifest_name(seq))
        if data is None:
            raise FileNotFoundError(f"manifest of chunk {seq} vanished")
        manifest = ChunkManifest.from_json(data)
        # Bounds decode by the key's column specs: a bare kind cannot tell a DECIMAL wider
        # than 38 digits (landed as text) from a narrower one.
        chunk = Chunk(
            table=decisions.keys_only, rows=(),
            range_low=decode_key(manifest.range_low, decisions.key_specs),
            range_high=decode_key(manifest.range_high, decisions.key_specs),
            low_watermark=parse_position(self.flavour, manifest.low_watermark),
            after=parse_position(self.flavour, manifest.after),
            schema_fingerprint=manifest.fingerprint, resume_key=None,
            complete=manifest.complete)
        decision = self._decide(chunk, processed, decisions, tracked)
        if not isinstance(decision, Commit):
            return decision
        rows = read_chunk_rows(self.landing, database, table, session.session_id, seq)
        if not tracked.touched.touches:
            # No key of the table touched since the opening: none can be dropped, and the
            # rule decided from the manifest alone (the chunk's keys in Python cost as much
            # as the rest of the commit).
            self._commit(session, decisions.schema, seq, chunk, rows, decision)
            return decision
        # Only rows whose key may be a touched one can be dropped: the rule sees those (all
        # rows when no column-wise filter applies), the rest of the chunk stays in Arrow.
        candidates = _touch_candidates(rows, key_names, tracked.touched.touches)
        subset = rows if candidates is None else rows.take(candidates)
        keys = list(zip(*(_key_values(subset.column(name)) for name in key_names),
                        strict=True)) if subset.num_rows else []
        chunk = replace(chunk, rows=tuple(keys))
        decision = self._decide(chunk, processed, decisions, tracked)
        if not isinstance(decision, Commit):  # (the rule's Wait and Reject ignore the rows)
            return decision
        if decision.dropped_keys:
            keep = [k not in decision.dropped_keys for k in keys]
            if candidates is not None:
                mask = [True] * rows.num_rows
                for index, kept in zip(candidates.to_pylist(), keep, strict=True):
                    mask[index] = kept
                keep = mask
            rows = rows.filter(pa.array(keep, pa.bool_()))
        self._commit(session, decisions.schema, seq, chunk, rows, decision)
        return decision

    @staticmethod
    def _decide(chunk: Chunk, processed: GtidSet, decisions: _Decisions,
                tracked: TrackedSession) -> Reject | Commit | None:
        decision = decide_chunk_commit(
            chunk, processed, decisions.opening, tracked.touched.horizon,
            tracked.touched.touches, decisions.fingerprint, tracked.ddl)
        return decision if isinstance(decision, Reject | Commit) else None

    def _reject(self, session: SnapshotSession, tracked: TrackedSession, seq: int,
                reason: str) -> None:
        """Record a rejection (the reader reads the range again); stop the session when its
        chunks keep being rejected with no commit between (MAX_REJECTIONS_IN_A_ROW)."""
        session.rejected[str(seq)] = reason
        self.log.info(f"snapshot of {session.table_id}: chunk {seq} rejected ({reason})")
        table_id = session.table_id
        tracked.rejections_in_a_row += 1
        count = tracked.rejections_in_a_row
        if count < self.max_rejections_in_a_row:
            return
        session.state = SessionState.STOPPED
        session.ended_at = session_time()
        session.reason = (f"{count} chunks in a row were rejected with no commit between (the "
                          f"last, chunk {seq}: {reason})")
        self._end(table_id)
        self.log.error(f"snapshot of {table_id}: session {session.session_id} stopped: "
                       f"{session.reason}. The reader ends with status 'stopped'; fix the "
                       "cause (see the rejection reasons in the engine log) and snapshot the "
                       "table again")

    def _commit(self, session: SnapshotSession, schema: TableSchema, seq: int, chunk: Chunk,
                rows: pa.Table, decision: Commit) -> None:
        # Each emit lands all of its records or none. Should a later one fail, the chunk is
        # rejected with the earlier records landed: harmless, they are the rows' values at
        # this point (an assertion or a sweep only ever deletes).
        emit = self._emitter.add_snapshot
        first_pos = emit(schema, SNAPSHOT_ROW, rows, None)
        if decision.assertion is not None:
            self._emit_assertion(schema, decision.assertion, first_pos)
        sweep = sweep_after_snapshot(session.table_id, session.opening_pos,
                                     filtered=session.condition is not None) if (
            chunk.complete) else None
        if sweep is not None:
            emit(schema, SWEEP, [(None,) * len(schema.columns)],
                 {THRESHOLD: [sweep.before_pos]})
        session.committed.append(seq)
        session.rows += rows.num_rows
        if chunk.complete:
            session.state = SessionState.DONE
            session.ended_at = session_time()
            self._end(session.table_id)
            self.log.info(f"snapshot of {session.table_id}: session {session.session_id} done, "
                          f"{session.rows} rows in {len(session.committed)} chunks")

    def _emit_assertion(self, schema: TableSchema, assertion: RangeAssertion,
                        first_pos: int) -> None:
        """One ``a`` record: key columns hold the (exclusive) low key, ``__cdc_hi__<k>`` the
        (inclusive) high key; see docs/landing-zone.md."""
        key = list(self._tracked[assertion.table_id].key_columns)
        row: list[Any] = [None] * len(schema.columns)
        if assertion.range_low is not None:
            for name, value in zip(key, assertion.range_low, strict=True):
                row[schema.column_names.index(name)] = value
        high = assertion.range_high
        extra: dict[str, list[Any]] = {
            LO_OPEN: [assertion.range_low is None],
            HI_OPEN: [high is None],
            THRESHOLD: [assertion.threshold(first_pos)],
        }
        for index, name in enumerate(key):
            extra[hi_column(name)] = [None if high is None else high[index]]
        self._emitter.add_snapshot(schema, RANGE_ASSERTION, [tuple(row)], extra)
