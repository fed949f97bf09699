"""Transaction records out of memory: Arrow IPC files under the landing zone's ``spill/``.

A transaction larger than ``capture.transaction_memory_bytes`` keeps its older records here
(one file per run of one table schema), and a prepared XA transaction keeps all of its records
here so that it survives engine restarts (the checkpoint names its files). Files are removed
only after the checkpoint that no longer needs them is written (``take_removed``), so a crash
never leaves a checkpoint pointing at a deleted file; files no checkpoint names are removed at
start.
"""

from __future__ import annotations

import itertools
import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from cdc_platform.capture.events import EngineError
from cdc_platform.capture.landing.records import OP
from cdc_platform.capture.schema import ColumnValueError, TableSchema, landing_arrays

# The op column of spilled records is the changelog's (records land as they are spilled).
OP_COLUMN = OP
_SCHEMA_KEY = b"cdc_table_schema"


class SpillStore:
    """The spill folder of one engine (one source server)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._names = itertools.count()
        self._doomed: list[Path] = []
        # Unique per engine run: a restored XA transaction's files keep their names.
        self._prefix = uuid.uuid4().hex[:16]

    def bytes_on_disk(self) -> int:
        """The bytes of the spill files there now (also those a restart restored), read from
        the folder: for the ``cdc_capture_spill_bytes`` metric, at each scrape."""
        total = 0
        try:
            with os.scandir(self.directory) as entries:
                for entry in entries:
                    try:
                        total += entry.stat().st_size
                    except FileNotFoundError:  # removed since the listing
                        continue
        except FileNotFoundError:  # nothing spilled yet
            return 0
        return total

    def write_table(self, schema: TableSchema, table: pa.Table) -> SpilledRecords:
        """Write records of one schema durably (``records_table``'s form: the op, then the
        landing columns)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{self._prefix}-{next(self._names):08d}.arrow"
        _write(path, table)
        return SpilledRecords(self, path, schema, table.num_rows)

    def spill(self, held: Sequence[Sequence[tuple[Any, str, tuple[Any, ...]]] | HeldRecords],
              limit: int, gtid: str | None) -> list[SpilledRecords]:
        """Write consecutive held parts of a transaction (lists of records ``(table state, op,
        row)``, Arrow blocks) to files, one per run of one schema of at most ``limit`` records
        (a larger block alone): a landing reads one file at a time, and converting records to
        Arrow costs memory. A record that does not fit its schema stops capture naming the
        table and ``gtid``."""
        runs: list[tuple[TableSchema, list[pa.Table]]] = []
        for part in held:
            tables = [(part.schema, part.table)] if isinstance(part, HeldRecords) else \
                _record_tables(part, limit, gtid)
            for schema, table in tables:
                last = runs[-1] if runs else None
                if last is not None and last[0] == schema and (
                        sum(t.num_rows for t in last[1]) + table.num_rows <= limit):
                    last[1].append(table)
                else:
                    runs.append((schema, [table]))
        return [self.write_table(schema, tables[0] if len(tables) == 1 else
                                 pa.concat_tables(tables).combine_chunks())
                for schema, tables in runs]

    def sync_directory(self) -> None:
        """Make the names of written files durable (before a checkpoint names them): a file
        fsynced and renamed can still vanish in a crash until its directory is synced."""
        if self.directory.is_dir():
            fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def remove_later(self, path: Path) -> None:
        self._doomed.append(path)

    @property
    def removal_pending(self) -> bool:
        """Whether dropped files wait for the next checkpoint to be deleted. A flush with
        nothing else to write should still write one then: a transaction discarded at a
        reconnect is read (and spilled) again, so its old files would otherwise stay until
        it finally lands, one copy per reconnect."""
        return bool(self._doomed)

    def take_removed(self) -> list[Path]:
        """The files dropped since the last call, for the caller to delete once the checkpoint
        it builds now (which no longer names them) is durable; the previous checkpoint may
        still name them."""
        doomed, self._doomed = self._doomed, []
        return doomed

    def remove_unreferenced(self, keep: set[Path]) -> list[Path]:
        """At start: files of transactions that never finished (they are read again)."""
        if not self.directory.is_dir():
            return []
        removed = [p for p in self.directory.iterdir() if p not in keep]
        for path in removed:
            path.unlink(missing_ok=True)
        return removed

    def part_from_dict(self, data: dict[str, Any]) -> SpilledRecords:
        path = self.directory / data["file"]
        with pa.memory_map(str(path)) as source:
            schema = pa.ipc.open_file(source).schema
        table_schema = TableSchema.from_dict(json.loads(schema.metadata[_SCHEMA_KEY]))
        return SpilledRecords(self, path, table_schema, int(data["count"]))


@dataclass(eq=False)
class SpilledRecords:
    """One spilled file: ``count`` records of one table schema (a ``SpilledPart``)."""

    store: SpillStore = field(repr=False)
    path: Path
    schema: TableSchema
    count: int
    in_memory = False

    def read(self) -> pa.Table:
        """Columns: the op, then the schema's columns in landing form."""
        with pa.memory_map(str(self.path)) as source:
            return pa.ipc.open_file(source).read_all()

    def truncate(self, keep: int) -> SpilledRecords:
        table = self.read().slice(0, keep)
        part = self.store.write_table(self.schema, table)
        self.remove()
        return part

    def remove(self) -> None:
        self.store.remove_later(self.path)

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.path.name, "count": self.count}


@dataclass(eq=False)
class HeldRecords:
    """Records of one table schema held in memory in the spilled files' form (the op, then
    the landing columns): rows the column-wise decoder gave as Arrow, kept as Arrow until
    they land or the transaction's memory budget spills them (``SpillStore.write_table``)."""

    schema: TableSchema
    table: pa.Table
    in_memory = True

    @property
    def count(self) -> int:
        return self.table.num_rows

    def read(self) -> pa.Table:
        return self.table

    def truncate(self, keep: int) -> HeldRecords:
        return HeldRecords(self.schema, self.table.slice(0, keep))

    def remove(self) -> None:
        """Nothing backs it but memory."""


def records_schema(schema: TableSchema) -> pa.Schema:
    """The Arrow schema of records of ``schema`` out of the changelog: the op, then the landing
    columns, with the table schema in the metadata (spilled files are read back by it)."""
    fields = [pa.field(OP_COLUMN, pa.string()), *schema.arrow_schema()]
    return pa.schema(fields, metadata={_SCHEMA_KEY: json.dumps(schema.to_dict()).encode()})


def records_table(schema: TableSchema, ops: list[str], rows: list[tuple[Any, ...]]) -> pa.Table:
    """Records (ops, and rows in landing form) as a table of the spilled files' form."""
    arrays = [pa.array(ops, pa.string()), *landing_arrays(schema, rows)]
    return pa.Table.from_arrays(arrays, schema=records_schema(schema))


def _record_tables(records: Sequence[tuple[Any, str, tuple[Any, ...]]], limit: int,
                   gtid: str | None) -> list[tuple[TableSchema, pa.Table]]:
    """Records as Arrow tables in the spilled form, one per run of one schema of at most
    ``limit`` records."""
    tables = []
    start = 0
    for index in range(1, len(records) + 1):
        if index == len(records) or index - start >= limit or (
                records[index][0].schema is not records[start][0].schema):
            run = records[start:index]
            schema = run[0][0].schema
            try:
                tables.append((schema, records_table(schema, [r[1] for r in run],
                                                     [r[2] for r in run])))
            except (ColumnValueError, pa.ArrowInvalid, pa.ArrowTypeError) as error:
                raise EngineError(f"table {schema.table_id} at GTID {gtid or '?'}: {error}"
                                  ) from error
            start = index
    return tables


def _write(path: Path, table: pa.Table) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    with open(tmp, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)
