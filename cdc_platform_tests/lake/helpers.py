"""Writing a landing zone in the contract format (docs/landing-zone.md) for lake tests.

The tests do not depend on the capture engine: segments are built here from a TableSchema and
plain Python rows with pyarrow, exactly as the contract describes them.
"""

from __future__ import annotations

import json
import os
import random
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from cdc_platform.capture.landing.records import (
    ColumnRenames,
    segment_schema,
    snapshot_arrow_fields,
)
from cdc_platform.capture.landing.zone import (
    changelog_parts,
    column_renames_name,
    column_renames_parts,
)
from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.lake.iceberg.lake import Lake
from cdc_platform.lake.iceberg.table import LakeTable

SERVER = "demo"


def schema(table: str = "t", *columns: ColumnSpec, db: str = "shop",
           key: tuple[str, ...] = ("id",)) -> TableSchema:
    """A TableSchema; default columns: id int, name string, amount decimal(10,2)."""
    if not columns:
        columns = (
            ColumnSpec("id", "int"),
            ColumnSpec("name", "string"),
            ColumnSpec("amount", "decimal", 10, 2),
        )
    return TableSchema(db, table, tuple(columns), key)


class Landing:
    """A landing zone for one server: segments with increasing positions, and the checkpoint."""

    def __init__(self, root: Path, server: str = SERVER) -> None:
        self.root = root
        self.server = server
        self.next_pos = 1
        self.txn = 0

    @property
    def url(self) -> str:
        return str(self.root)

    def segment(self, table_schema: TableSchema, changes: list[tuple[Any, ...]],
                checkpoint: bool = True, snapshot: bool = False) -> tuple[int, int]:
        """Write one segment; ``changes`` are ``(op, row)`` or ``(op, row, pos)`` tuples.

        Positions are allocated from a counter unless given (to simulate replays). Each change
        is its own transaction. Returns (first_pos, last_pos); by default also checkpoints.
        ``snapshot`` adds the snapshot-record columns (``__cdc_threshold``...), taken from the
        rows by name like the user columns.
        """
        positions, ops, gtids, rows = [], [], [], []
        for change in changes:
            op, row = change[0], change[1]
            pos = change[2] if len(change) > 2 else self.next_pos
            self.next_pos = max(self.next_pos, pos + 1)
            self.txn += 1
            positions.append(pos)
            ops.append(op)
            gtids.append(f"0-1-{self.txn}")
            rows.append(row)
        arrow_schema = segment_schema(table_schema)
        if snapshot:
            for field in snapshot_arrow_fields(table_schema):
                arrow_schema = arrow_schema.append(field)
        data: dict[str, list[Any]] = {
            "__cdc_pos": positions,
            "__cdc_gtid": gtids,
            "__cdc_op": ops,
            "__cdc_ts_ms": [1_700_000_000_000 + p for p in positions],
        }
        for name in arrow_schema.names[len(data):]:
            data[name] = [row.get(name) for row in rows]
        table = pa.Table.from_pydict(data, schema=arrow_schema)
        first, last = min(positions), max(positions)
        directory = (self.root / self.server).joinpath(
            *changelog_parts(table_schema.database, table_schema.table))
        directory.mkdir(parents=True, exist_ok=True)
        final = directory / f"{first:020d}-{last:020d}.parquet"
        tmp = directory / f".{final.name}.tmp-{os.getpid()}"
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, final)
        if checkpoint:
            self.checkpoint()
        return first, last

    def rename_columns(self, table_schema: TableSchema, *renames: tuple[str, str],
                       checkpoint: bool = True, dropped: tuple[str, ...] = ()) -> int:
        """Record one ALTER's column renames (and drops) as the engine does
        (capture.ddl.column_renames), at a position of their own; returns it."""
        position = self.next_pos
        self.next_pos += 1
        self.txn += 1
        record = ColumnRenames(table_schema.database, table_schema.table, f"0-1-{self.txn}",
                               position, tuple(renames), dropped=dropped)
        directory = (self.root / self.server).joinpath(
            *column_renames_parts(table_schema.database, table_schema.table))
        directory.mkdir(parents=True, exist_ok=True)
        (directory / column_renames_name(position)).write_bytes(record.to_json())
        if checkpoint:
            self.checkpoint()
        return position

    def checkpoint(self, next_pos: int | None = None) -> None:
        """Write checkpoint.json covering everything written so far (or up to ``next_pos``)."""
        data = {
            "server_name": self.server,
            "flavour": "mariadb",
            "gtid": f"0-1-{self.txn}",
            "next_pos": self.next_pos if next_pos is None else next_pos,
            "written_at": "2026-01-01T00:00:00Z",
            "lag_seconds": 0.1,
        }
        path = self.root / self.server / "checkpoint.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(".checkpoint.json.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)


def rows_of(df: Any) -> dict[Any, dict[str, Any]]:
    """Collect a target frame into {key: row dict} (key = value of ``id``)."""
    return {row["id"]: row.asDict() for row in df.collect()}


def materialise_table(spark: Any, landing: Landing, warehouse: str, table_schema: TableSchema,
                      **kwargs: Any) -> Any:
    """``lake.merge.materialise`` of one table of the test landing zone."""
    from cdc_platform.lake.merge import materialise

    return materialise(spark, landing.url, warehouse, SERVER, table_schema,
                       table_schema.database, table_schema.table, **kwargs)


def target_table(spark: Any, warehouse: str, table_schema: TableSchema) -> LakeTable:
    """The Iceberg table a test landing zone's table materialises into (default catalog)."""
    return LakeTable(Lake(spark, warehouse), SERVER, table_schema.database, table_schema.table)


class Changelog:
    """A test landing zone's table and the model of what its changelog holds (every record
    with its position), so a test can say what any snapshot must contain."""

    def __init__(self, landing: Landing, table_schema: TableSchema | None = None) -> None:
        self.landing = landing
        self.schema = table_schema or schema("orders")
        self.records: list[tuple[int, str, dict]] = []

    def write(self, changes: list[tuple[str, dict]]) -> None:
        first, _ = self.landing.segment(self.schema, changes)
        for offset, (op, row) in enumerate(changes):
            self.records.append((first + offset, op, row))

    def fold(self, up_to: int | None = None) -> dict[Any, dict]:
        """{id: row} after every record up to position ``up_to`` (all by default)."""
        live: dict[Any, dict] = {}
        for pos, op, row in sorted(self.records, key=lambda record: record[0]):
            if up_to is not None and pos > up_to:
                break
            if op == "d":
                live.pop(row["id"], None)
            else:
                live[row["id"]] = row
        return live


def random_changes(rng: random.Random, live: set[int], batch: int) -> list[tuple[str, dict]]:
    """A batch of inserts, updates and deletes of ``schema("orders")`` rows; ``live`` keeps
    the keys that exist."""
    changes: list[tuple[str, dict]] = []
    for _ in range(rng.randrange(1, 12)):
        key = rng.randrange(30)
        if key in live and rng.random() < 0.3:
            changes.append(("d", {"id": key}))
            live.discard(key)
        else:
            row = {"id": key, "name": f"b{batch}-{rng.randrange(999)}", "amount": Decimal("1.00")}
            changes.append(("u" if key in live else "c", row))
            live.add(key)
    return changes


def assert_every_published_snapshot_is_a_fold(table: LakeTable, changelog: Changelog) -> None:
    """Along main, marks only grow, and each snapshot holds exactly the fold up to its mark:
    no commit lost another's update, none published a partial batch."""
    marked = [s for s in table.history() if s.consumed_pos is not None]
    marks = [s.consumed_pos for s in marked]
    assert marks == sorted(marks, reverse=True) and len(set(marks)) == len(marks), marks
    for snapshot in marked:
        assert rows_of(table.read(snapshot_id=snapshot.snapshot_id)) == changelog.fold(
            snapshot.consumed_pos), f"snapshot {snapshot.snapshot_id} at {snapshot.consumed_pos}"
