"""Committed records -> changelog positions -> durable segments, then the checkpoint.

The engine hands every committed transaction here (``commit``) and the snapshot coordinator's
records too (``add_snapshot``). Each record takes the next changelog position; records wait in
the ``SegmentBuffer`` until a flush (``checkpoint``) or until the buffer is due (a large
transaction lands in bounded batches, without a checkpoint: segments past the checkpoint are
removed at start and the transaction replays, and readers never read past the checkpoint).

Landing runs on the ``LandingWriter``'s thread, one job at a time and in order: a job's
segments, then its checkpoint, so the checkpoint is never durable before the segments it
covers. Everything a job writes is decided here, on the stream thread; the writer reads no
engine state.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from cdc_platform.capture.changes.spill import HeldRecords, SpilledRecords, SpillStore
from cdc_platform.capture.changes.transactions import RecordLog
from cdc_platform.capture.landing.segment_buffer import (
    Landed,
    Queued,
    SegmentBuffer,
    TouchLog,
    write_segments,
)
from cdc_platform.capture.landing.writer import LandingWriter
from cdc_platform.capture.landing.zone import Checkpoint, LandingZone
from cdc_platform.capture.schema import TableSchema


class Lander:
    """Positions and lands the records of one engine (one source server)."""

    def __init__(self, landing: LandingZone, flush_max_rows: int, memory_bytes: int,
                 on_segments: Callable[[Landed], None],
                 on_checkpoint: Callable[[Checkpoint], None], log: Any | None = None) -> None:
        self.landing = landing
        self.next_pos = 1
        self._segments = SegmentBuffer(flush_max_rows, memory_bytes)
        self._writer = LandingWriter(f"landing-{landing.server_name}", log)
        # (called on the writer's thread once a job's segments / checkpoint are durable)
        self._on_segments = on_segments
        self._on_checkpoint = on_checkpoint

    @property
    def due(self) -> bool:
        """The queued records reached the flush's row or memory bound."""
        return self._segments.due

    @property
    def empty(self) -> bool:
        return self._segments.empty

    @property
    def tables_queued(self) -> int:
        """Tables with records queued for the next flush (a segment each)."""
        return self._segments.tables

    @property
    def failed(self) -> bool:
        """A landing job failed (raised on the stream thread at the next ``checkpoint``)."""
        return self._writer.failed

    def commit(self, records: RecordLog, gtid: str, gtid_value: Any, timestamp_ms: int,
               touches: TouchLog) -> int:
        """Give a committed transaction's records their positions and queue them, landing
        queued segments whenever the buffer is due; returns how many records it had. Keys of
        tables under a snapshot session are logged to ``touches``."""
        segments = self._segments
        first = position = self.next_pos
        for part, part_bytes in zip(records.parts, records.part_bytes, strict=True):
            if not isinstance(part, list):  # a block: spilled, or held in memory
                self._log_block_touches(part, gtid_value, position, touches)
                segments.add_block(part, position, gtid, timestamp_ms, part_bytes)
                position += part.count
                if segments.due:
                    self._land_queued()
            else:
                # What a record of this part takes in memory (RecordLog's estimate).
                each = part_bytes / len(part) if part else 0.0
                offset = 0
                while offset < len(part):
                    # At most up to the next landing (by rows or bytes): a large transaction
                    # lands in batches.
                    piece = part[offset:offset + segments.room(each)]
                    position = segments.queue(piece, gtid, gtid_value, timestamp_ms, position,
                                              each, touches)
                    offset += len(piece)
                    if segments.due:
                        self._land_queued()
        self.next_pos = position
        return position - first

    def add_snapshot(self, schema: TableSchema, op: str, rows: list[tuple[Any, ...]] | pa.Table,
                     extra: dict[str, list[Any]] | None) -> int:
        """Queue snapshot records (chunk rows ``r``, assertion ``a``, sweep ``s``) at the
        current position, stamped with the time now; returns the first position they take.
        The snapshot coordinator's one emitter (``snapshot.sessions.SnapshotEmitter``). They
        are built into their changelog form now: records that do not fit the schema raise here
        (the coordinator rejects the chunk) instead of failing the next flush."""
        first = self.next_pos
        self.next_pos += self._segments.add_landed(schema, op, rows, extra, first,
                                                   int(time.time() * 1000))
        return first

    def take_position(self) -> int:
        """A position of its own for a record written outside the segments (a column-rename
        record), so the lake tells the segments before it from those after it."""
        self.next_pos += 1
        return self.next_pos - 1

    def checkpoint(self, checkpoint: Checkpoint, tables: dict[str, TableSchema] | None,
                   spill: SpillStore, spill_named: bool) -> None:
        """Land what is queued, then ``checkpoint`` (with the table schemas, when they
        changed), on the writer's thread; this first waits for the previous job to be durable
        and raises its failure. Spill files landed or dropped before this checkpoint are
        deleted once it is durable, not before: the previous checkpoint may name them.
        ``spill_named``: the checkpoint names spill files (prepared XA transactions), whose
        directory is synced before it."""
        chunks = self._segments.take()
        for part in self._segments.take_landed_spills():
            part.remove()
        doomed = spill.take_removed()

        def land_and_checkpoint() -> None:
            self._write(chunks)
            if tables is not None:
                self.landing.write_tables(tables)
            if spill_named:
                spill.sync_directory()
            self.landing.write_checkpoint(checkpoint)
            _unlink(doomed)
            self._on_checkpoint(checkpoint)

        self._writer.submit(land_and_checkpoint)

    def wait(self) -> None:
        """Until every job submitted is durable (raises a failed one's error)."""
        self._writer.wait()

    def close(self) -> None:
        """Stop the writer: no write may go on once the engine lock is released."""
        self._writer.close()

    @staticmethod
    def _log_block_touches(part: SpilledRecords | HeldRecords, gtid: Any, first: int,
                           touches: TouchLog) -> None:
        """Touched keys of a block's records, for tables under a snapshot session."""
        table_id = part.schema.table_id
        key_columns = touches.key_columns(table_id)
        if key_columns is None or gtid is None:
            return
        table = part.read()
        columns = []
        for name in key_columns:
            if name in part.schema.column_names:
                column = table.column(name)
                if pa.types.is_timestamp(column.type) and column.type.tz is not None:
                    # The binlog's form of a TIMESTAMP: naive UTC (as the row path gives it).
                    column = column.cast(pa.timestamp(column.type.unit))
                columns.append(column.to_pylist())
        for offset, key in enumerate(zip(*columns, strict=True)):
            touches.record_touch(table_id, tuple(key), gtid, first + offset)

    def _land_queued(self) -> None:
        chunks = self._segments.take()
        self._writer.submit(lambda: self._write(chunks))

    def _write(self, chunks: Queued) -> None:
        """On the writer's thread: the chunks' segments, durably; then the callback."""
        self._on_segments(write_segments(self.landing, chunks))


def _unlink(paths: list[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)
