"""Reading lake tables as a third-party engine would: pyiceberg, with no Spark and no catalog.

Issue 14's promise is that any Iceberg reader gets the platform's rows. pyiceberg opens the
newest metadata file of a Hadoop-catalog table directly (``StaticTable.from_metadata``), applies
the position delete files of merge-on-read itself, and must return exactly what Spark reads.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
from pyiceberg.table import StaticTable
from pyspark.sql import SparkSession
from pyspark.sql.types import TimestampType

from cdc_platform.capture.landing.records import POS
from cdc_platform.lake.iceberg.table import LakeTable


def table_location(lake_table: LakeTable) -> Path:
    """Where the Hadoop catalog keeps the table: ``<warehouse>/<namespace>/<table>``."""
    warehouse = lake_table.lake.properties["warehouse"]
    parsed = urlparse(warehouse)
    root = Path(parsed.path if parsed.scheme in ("file", "") else warehouse)
    return root / lake_table.namespace / lake_table.name


def newest_metadata(lake_table: LakeTable) -> Path:
    """The table's current metadata file, as the Hadoop catalog's ``version-hint.text`` names
    it (checked against the highest ``v<N>.metadata.json`` present)."""
    metadata = table_location(lake_table) / "metadata"
    versions = [int(p.name[1:].split(".")[0]) for p in metadata.glob("v*.metadata.json")]
    if not versions:
        raise FileNotFoundError(f"{metadata} holds no v<N>.metadata.json: is {lake_table} a "
                                "Hadoop-catalog table that was created?")
    hint = int((metadata / "version-hint.text").read_text().strip())
    assert hint == max(versions), f"version-hint.text says v{hint}, newest is v{max(versions)}"
    return metadata / f"v{hint}.metadata.json"


def open_table(lake_table: LakeTable) -> StaticTable:
    return StaticTable.from_metadata(str(newest_metadata(lake_table)))


def third_party_columns(lake_table: LakeTable) -> list[str]:
    """The user columns pyiceberg sees, in table order."""
    return [f.name for f in open_table(lake_table).schema().fields if f.name != POS]


def third_party_arrow(lake_table: LakeTable, snapshot_id: int | None = None) -> pa.Table:
    """The table as pyiceberg reads it (user columns only), now or at a snapshot."""
    table = open_table(lake_table)
    scan = table.scan() if snapshot_id is None else table.scan(snapshot_id=snapshot_id)
    arrow = scan.to_arrow()
    return arrow.drop_columns([POS]) if POS in arrow.column_names else arrow


def third_party_rows(lake_table: LakeTable, snapshot_id: int | None = None) -> list[dict]:
    """The table's rows as pyiceberg reads them (user columns only), now or at a snapshot."""
    return third_party_arrow(lake_table, snapshot_id).to_pylist()


def canonical(value: Any, utc: bool = False) -> Any:
    """One value in a form both readers agree on only if the values are exactly equal.

    Decimals compare by exact value (the column's type fixes the scale; PySpark may collect
    1E-10 of a DECIMAL(38,10) as ``Decimal('1.00E-10')``), binary is ``bytes``, floats compare
    bit for bit, instants are aware UTC datetimes (``utc``: Spark collects TIMESTAMP values as
    naive local time).
    """
    if isinstance(value, Decimal):
        return ("decimal", str(value.normalize()))
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, datetime) and utc:
        return value.astimezone(UTC)  # naive: local time, as PySpark collects instants
    if isinstance(value, float):
        return ("float", value.hex())
    return value


def assert_third_party_reads_same(spark: SparkSession, lake_table: LakeTable,
                                  snapshot_id: int | None = None) -> list[tuple]:
    """pyiceberg reads exactly the rows Spark reads (as multisets, column by column).

    Returns the canonical rows, so a test can also compare them with what it expects.
    """
    del spark  # the table's own session reads; the parameter names who the first reader is
    frame = lake_table.read(snapshot_id=snapshot_id)
    columns = frame.columns
    instants = {f.name for f in frame.schema.fields if isinstance(f.dataType, TimestampType)}
    arrow = third_party_arrow(lake_table, snapshot_id)
    assert arrow.column_names == columns
    spark_rows = Counter(
        tuple(canonical(row[i], c in instants) for i, c in enumerate(columns))
        for row in frame.collect())
    other = Counter(
        tuple(canonical(row[c], c in instants) for c in columns) for row in arrow.to_pylist())
    assert other == spark_rows, (
        f"pyiceberg and Spark disagree on {lake_table}: only pyiceberg "
        f"{sorted(map(repr, (other - spark_rows).elements()))[:5]}, only Spark "
        f"{sorted(map(repr, (spark_rows - other).elements()))[:5]}")
    return sorted(spark_rows.elements(), key=repr)
