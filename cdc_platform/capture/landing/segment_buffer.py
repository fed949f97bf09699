"""Committed records waiting for the next flush, and how they become changelog segments.

The engine gives committed records their positions and queues them here (``queue``: records
of the row path; ``add_block``: Arrow blocks of the column path, held in memory or spilled;
``add_landed``: snapshot records, already in changelog form). At a flush it ``take``s what is
queued and hands it to the landing writer, whose thread calls ``write_segments``: one segment
per run of one table under one schema (a spilled block is a segment of its own, read one at a
time), durably, before the checkpoint that covers them.

The buffer bounds memory: ``due`` says when the queued records reached ``flush_max_rows``
rows or ``transaction_memory_bytes`` of (estimated) memory, so that many transactions of big
rows never pile up between flushes, and a large transaction lands in bounded batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from cdc_platform.capture.changes.row_images import Record
from cdc_platform.capture.changes.spill import HeldRecords, SpilledRecords
from cdc_platform.capture.events import EngineError
from cdc_platform.capture.landing.records import OP, segment_schema, snapshot_field
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.schema import (
    ColumnSpec,
    ColumnValueError,
    TableSchema,
    landing_arrays,
)

# A segment whose pieces average fewer rows than this is made contiguous before it is written
# (``_run_table``).
_CONTIGUOUS_PIECE_ROWS = 8192


class TouchLog(Protocol):
    """Where the keys of records of tables under a snapshot session are logged
    (``snapshot.sessions.SnapshotCoordinator``)."""

    def key_columns(self, table_id: str) -> tuple[str, ...] | None: ...

    def record_touch(self, table_id: str, key: tuple[Any, ...], gtid: Any,
                     position: int) -> None: ...


@dataclass
class _Chunk:
    """Committed records of one table under one schema, waiting for the next flush."""

    schema: TableSchema
    # (snapshot records: a range, with one GTID, op and timestamp for all in ``same``)
    positions: list[int] | range = field(default_factory=list)
    gtids: list[str] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    same: tuple[str, str, int] | None = None
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    # Snapshot assertion/sweep records carry extra typed columns (docs/landing-zone.md).
    extra: dict[str, list[Any]] | None = None
    # Snapshot records are built into their changelog form when emitted (so a chunk that does
    # not fit is rejected then, not found at the flush), and held only in that form (their
    # ``rows`` stay empty); nothing is appended to them after.
    landed: pa.Table | None = None


@dataclass
class _BlockChunk:
    """Committed records of one block: a spilled file (landed as one segment of its own,
    read one at a time), or held in memory (landed with the table's other records)."""

    part: SpilledRecords | HeldRecords
    first_pos: int
    gtid: str
    timestamp_ms: int

    @property
    def schema(self) -> TableSchema:
        return self.part.schema


Queued = dict[str, list[_Chunk | _BlockChunk]]  # table id -> its queued chunks, in order


@dataclass
class Landed:
    """What ``write_segments`` wrote: records per table id, the number of segments and their
    bytes."""

    records_by_table: dict[str, int]
    segments: int
    bytes: int = 0


class SegmentBuffer:
    """Committed records queued for the next flush (see the module docstring)."""

    def __init__(self, flush_max_rows: int, memory_bytes: int) -> None:
        self.flush_max_rows = flush_max_rows
        self.memory_bytes = memory_bytes
        self._chunks: Queued = {}
        self.rows = 0
        self.bytes = 0  # the queued records' estimated memory (RecordLog's estimate)
        self._landed_spills: list[SpilledRecords] = []

    @property
    def empty(self) -> bool:
        return not self._chunks

    @property
    def tables(self) -> int:
        """How many tables have records queued: the segments the next flush writes."""
        return len(self._chunks)

    @property
    def due(self) -> bool:
        """Queued records reached ``flush_max_rows`` rows, or ``transaction_memory_bytes``
        of (estimated) memory: many transactions of big rows must not pile up between
        flushes."""
        return self.rows >= self.flush_max_rows or bool(
            self.memory_bytes and self.bytes >= self.memory_bytes)

    def room(self, bytes_per_record: float) -> int:
        """How many records of ``bytes_per_record`` fit before the buffer is due (at least
        one): a large transaction lands in batches."""
        room = self.flush_max_rows - self.rows
        if bytes_per_record and self.memory_bytes:
            room = min(room, int((self.memory_bytes - self.bytes) / bytes_per_record))
        return max(1, room)

    def add_block(self, part: SpilledRecords | HeldRecords, first_pos: int, gtid: str,
                  timestamp_ms: int, part_bytes: int) -> None:
        """A block of committed records (spilled, or held in memory) from ``first_pos``."""
        self._chunks.setdefault(part.schema.table_id, []).append(
            _BlockChunk(part, first_pos, gtid, timestamp_ms))
        self.rows += part.count
        self.bytes += part_bytes

    def queue(self, records: Sequence[Record], gtid: str, gtid_value: Any, timestamp_ms: int,
              position: int, each_bytes: float, touches: TouchLog) -> int:
        """Queue committed records from ``position``; returns the next one. Keys of tables
        under a snapshot session are logged to ``touches`` (with ``gtid_value``).

        Records come in runs of one table: its chunk and touch-log key are looked up once a
        run, not once a record (the per-record cost of streaming)."""
        current = None
        for state, op, row in records:
            if state is not current:
                current = state
                table_id = state.schema.table_id
                key_columns = touches.key_columns(table_id)
                touch = None
                if key_columns is not None and gtid_value is not None:
                    names = state.schema.column_names
                    touch = tuple(names.index(c) for c in key_columns if c in names)
                chunks = self._chunks.setdefault(table_id, [])
                last = chunks[-1] if chunks else None
                if not isinstance(last, _Chunk) or last.schema is not state.schema or (
                        last.landed is not None):
                    last = _Chunk(state.schema)
                    chunks.append(last)
            if touch is not None:
                touches.record_touch(table_id, tuple(row[i] for i in touch), gtid_value,
                                     position)
            last.positions.append(position)
            last.gtids.append(gtid)
            last.ops.append(op)
            last.timestamps.append(timestamp_ms)
            last.rows.append(row)
            position += 1
        self.rows += len(records)
        self.bytes += int(each_bytes * len(records))
        return position

    def add_landed(self, schema: TableSchema, op: str, rows: list[tuple[Any, ...]] | pa.Table,
                   extra: dict[str, list[Any]] | None, first: int, timestamp_ms: int) -> int:
        """Snapshot records (chunk rows ``r``, assertion ``a``, sweep ``s``) from position
        ``first``, built into their changelog form now: records that do not fit the schema
        raise here, before anything is queued. Returns how many were queued."""
        count = rows.num_rows if isinstance(rows, pa.Table) else len(rows)
        if not count:
            return 0
        chunk = _Chunk(schema, positions=range(first, first + count),
                       same=("", op, timestamp_ms), extra=extra)
        chunk.landed = _arrow_table(chunk, rows)
        self._chunks.setdefault(schema.table_id, []).append(chunk)
        self.rows += count
        self.bytes += chunk.landed.nbytes
        return count

    def take(self) -> Queued:
        """The queued chunks, for the landing writer; the buffer starts empty again."""
        chunks = self._chunks
        self._chunks = {}
        self.rows = 0
        self.bytes = 0
        for table_chunks in chunks.values():
            self._landed_spills += [c.part for c in table_chunks if isinstance(c, _BlockChunk)
                                    and not c.part.in_memory]
        return chunks

    def take_landed_spills(self) -> list[SpilledRecords]:
        """Spill files taken for landing since the last call: removable once a checkpoint
        after them is durable (and not before: the previous checkpoint may name them)."""
        spills, self._landed_spills = self._landed_spills, []
        return spills


def write_segments(landing: LandingZone, chunks: Queued) -> Landed:
    """Write queued chunks as segments, durably (on the landing writer's thread); the
    checkpoint that covers them comes after. One segment per run of one schema; a spilled
    part is a segment of its own, read one at a time."""
    written = []
    landed: dict[str, int] = {}
    bytes_before = landing.segment_bytes
    for table_id, table_chunks in chunks.items():
        for run in _same_schema_runs(table_chunks):
            if isinstance(run[0], _BlockChunk) and not run[0].part.in_memory:
                spilled = run[0]
                table = _blocks_table([spilled])
                first, last = spilled.first_pos, spilled.first_pos + table.num_rows - 1
            else:
                # One segment per run: snapshot commits add a chunk's rows and its
                # assertion as separate pieces, and a flush may commit several chunks.
                table = _run_table(run)
                first, last = _first_position(run[0]), _last_position(run[-1])
            written.append(landing.write_segment(run[0].schema, table, first, last))
            landed[table_id] = landed.get(table_id, 0) + table.num_rows
    if written:
        landing.sync_dirs(written)
    return Landed(landed, len(written), landing.segment_bytes - bytes_before)


def _run_table(run: list[_Chunk | _BlockChunk]) -> pa.Table:
    """One segment's records: consecutive blocks in changelog form together, chunks of
    records each, in order; made contiguous where its pieces are small (a column of many
    small pieces writes slowly; snapshot chunks, tens of thousands of rows each with a
    one-row assertion between them, write as fast as they are, and copying them cost a
    tenth of a snapshot's engine time)."""
    tables: list[pa.Table] = []
    blocks: list[_BlockChunk] = []
    for chunk in [*run, None]:
        if isinstance(chunk, _BlockChunk):
            blocks.append(chunk)
            continue
        if blocks:
            tables.append(_blocks_table(blocks))
            blocks = []
        if chunk is not None:
            tables.append(chunk.landed if chunk.landed is not None else _arrow_table(chunk))
    table = tables[0] if len(tables) == 1 else pa.concat_tables(
        tables, promote_options="default")
    pieces = table.column(0).num_chunks if table.num_columns else 0
    return table.combine_chunks() if pieces > 1 and (
        table.num_rows < pieces * _CONTIGUOUS_PIECE_ROWS) else table


def _blocks_table(blocks: list[_BlockChunk]) -> pa.Table:
    """Blocks of one schema in changelog form, numbered column-wise (each block's records
    take consecutive positions from its first); EngineError (table, GTID, file) when a
    spilled file does not read back as the schema it was written with."""
    schema = blocks[0].schema
    try:
        parts = [block.part.read() for block in blocks]
        records = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
        counts = np.fromiter((part.num_rows for part in parts), np.int64, len(parts))
        owner = np.repeat(np.arange(len(blocks)), counts)  # the block of each record
        starts = np.fromiter((b.first_pos for b in blocks), np.int64, len(blocks))
        within = np.arange(records.num_rows, dtype=np.int64) - np.repeat(
            np.cumsum(counts) - counts, counts)
        stamps = np.fromiter((b.timestamp_ms for b in blocks), np.int64, len(blocks))
        arrays = [
            pa.array(starts[owner] + within),
            pa.array([b.gtid for b in blocks], pa.string()).take(pa.array(owner)),
            records.column(OP),
            pa.array(stamps[owner]),
        ]
        arrays += [records.column(column.name) for column in schema.columns]
        return pa.Table.from_arrays(arrays, schema=segment_schema(schema))
    except (pa.ArrowException, KeyError, OSError) as error:
        block = blocks[0]
        where = getattr(block.part, "path", None)
        raise EngineError(
            f"table {schema.table_id} at GTID {block.gtid or '?'}: the "
            f"{f'spilled records of {where}' if where else 'records held in memory'} do not "
            f"read back as the table's schema ({error}). Fix: restart the engine; if it "
            "stops here again, re-snapshot the table and move the checkpoint past this "
            "GTID") from error


def _arrow_table(chunk: _Chunk, rows: list[tuple[Any, ...]] | pa.Table | None = None
                 ) -> pa.Table:
    """The chunk's records in changelog form. Their user columns are ``rows`` when given
    (snapshot records, which the chunk does not hold: Arrow chunk rows are cast column by
    column), else the chunk's own ``rows``."""
    schema = chunk.schema
    if rows is None:
        rows = chunk.rows
    arrow_schema = segment_schema(schema)
    if chunk.extra:
        for name in chunk.extra:
            arrow_schema = arrow_schema.append(snapshot_field(schema, name))
    if chunk.same is not None:  # (no Python object per record)
        assert isinstance(chunk.positions, range)
        count = len(chunk.positions)
        gtid, op, timestamp = chunk.same
        arrays = [
            pa.array(np.arange(chunk.positions.start, chunk.positions.stop, dtype=np.int64)),
            pa.repeat(pa.scalar(gtid, pa.string()), count),
            pa.repeat(pa.scalar(op, pa.string()), count),
            pa.repeat(pa.scalar(timestamp, pa.int64()), count),
        ]
    else:
        arrays = [
            pa.array(chunk.positions, pa.int64()),
            pa.array(chunk.gtids, pa.string()),
            pa.array(chunk.ops, pa.string()),
            pa.array(chunk.timestamps, pa.int64()),
        ]
    try:
        if isinstance(rows, pa.Table):
            arrays += [_cast_column(rows, column) for column in schema.columns]
        else:
            arrays += landing_arrays(schema, rows)
        for name, values in (chunk.extra or {}).items():
            arrays.append(pa.array(values, arrow_schema.field(name).type))
    except (ColumnValueError, pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as error:
        raise EngineError(
            f"table {schema.table_id}, between positions {chunk.positions[0]} and "
            f"{chunk.positions[-1]}: {error}") from error
    return pa.Table.from_arrays(arrays, schema=arrow_schema)


def _cast_column(table: pa.Table, column: ColumnSpec) -> pa.ChunkedArray:
    """A chunk's column in its landing type; ColumnValueError names the column that does not
    fit (KeyError if the chunk lacks it)."""
    try:
        return table.column(column.name).cast(column.arrow_type())
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as error:
        raise ColumnValueError(column, error) from error


def _same_schema_runs(chunks: list[_Chunk | _BlockChunk]) -> list[list[_Chunk | _BlockChunk]]:
    """Consecutive chunks of one table grouped while the schema stays the same (a segment
    has one column list; records keep their order). A spilled chunk is a run of its own."""
    runs: list[Any] = []
    for chunk in chunks:
        spilled = isinstance(chunk, _BlockChunk) and not chunk.part.in_memory
        last = runs[-1][-1] if runs else None
        if spilled or last is None or (
                isinstance(last, _BlockChunk) and not last.part.in_memory) or (
                last.schema != chunk.schema):
            runs.append([chunk])
        else:
            runs[-1].append(chunk)
    return runs


def _first_position(chunk: _Chunk | _BlockChunk) -> int:
    return chunk.first_pos if isinstance(chunk, _BlockChunk) else chunk.positions[0]


def _last_position(chunk: _Chunk | _BlockChunk) -> int:
    if isinstance(chunk, _BlockChunk):
        return chunk.first_pos + chunk.part.count - 1
    return chunk.positions[-1]
