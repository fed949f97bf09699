"""Reading one table's changelog from the landing zone (docs/landing-zone.md).

Only records with ``__cdc_pos < checkpoint.next_pos`` are committed; segment files are selected
by their names (``<first_pos>-<last_pos>.parquet``), so a batch touches only the segments it
needs. Segments written before and after an ``ALTER TABLE`` have different columns: each group of
files with the same Arrow schema is read with its own explicit Spark schema and then conformed to
the newest segment's columns by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import reduce
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from cdc_platform.capture.landing import (
    CHECKPOINT_FILE,
    SEGMENT_NAME,
    TABLES_FILE,
    changelog_parts,
    tables_from_json,
)
from cdc_platform.capture.names import table_id
from cdc_platform.capture.schema import TableSchema
from cdc_platform.lake.columns import (
    CHANGELOG_META,
    POS,
    THRESHOLD,
    col,
    conform,
    refuse_reserved_columns,
    snapshot_struct,
    struct_from_arrow,
    user_struct,
)
from cdc_platform.lake.paths import Location, resolve


@dataclass(frozen=True)
class Segment:
    """One changelog segment file and the position range its name declares."""

    first_pos: int
    last_pos: int
    location: Location


def _server(landing_url: str, server_name: str) -> Location:
    return resolve(landing_url).join(server_name)


def read_checkpoint(landing_url: str, server_name: str) -> dict[str, Any] | None:
    """The engine's checkpoint (``gtid``, ``next_pos``...), or None before its first one."""
    location = _server(landing_url, server_name).join(CHECKPOINT_FILE)
    data = location.read_bytes()
    if data is None:
        return None
    try:
        checkpoint = json.loads(data)
        checkpoint["next_pos"] = int(checkpoint["next_pos"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"checkpoint {location.spark_uri} is not valid (expected JSON with next_pos): {exc}; "
            "it is written by the capture engine, check that the landing URL is right"
        ) from exc
    return checkpoint


def read_table_schemas(landing_url: str, server_name: str) -> dict[str, TableSchema]:
    """The engine's ``tables.json`` (table id -> newest schema); empty if absent or unreadable.

    Used only as a fallback schema for a table that has no changelog yet.
    """
    data = _server(landing_url, server_name).join(TABLES_FILE).read_bytes()
    if data is None:
        return {}
    try:
        return tables_from_json(data)
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}


def list_segments(
    landing_url: str,
    server_name: str,
    database: str,
    table: str,
    after_pos: int | None = None,
    before_pos: int | None = None,
) -> list[Segment]:
    """Segments that may hold records with ``after_pos < pos < before_pos``, oldest first.

    Temporary files (written before a rename) and anything not named like a segment are ignored.
    """
    directory = _server(landing_url, server_name).join(*changelog_parts(database, table))
    segments = []
    for name in directory.list_names():
        match = SEGMENT_NAME.match(name)
        if not match:
            continue
        first, last = int(match.group(1)), int(match.group(2))
        if after_pos is not None and last <= after_pos:
            continue
        if before_pos is not None and first >= before_pos:
            continue
        segments.append(Segment(first, last, directory.join(name)))
    return sorted(segments, key=lambda s: (s.first_pos, s.last_pos))


def segment_schema(segment: Segment) -> TableSchema:
    """The TableSchema a segment carries in its Parquet key/value metadata."""
    metadata = pq.read_schema(segment.location.path, filesystem=segment.location.fs).metadata
    return _schema_from_metadata(metadata, segment)


def _schema_from_metadata(metadata: dict[bytes, bytes] | None, segment: Segment) -> TableSchema:
    try:
        return TableSchema.from_parquet_metadata(metadata or {})
    except (KeyError, ValueError) as exc:
        raise ValueError(
            f"segment {segment.location.spark_uri} lacks valid cdc.table / cdc.primary_key / "
            f"cdc.columns metadata ({exc!r}); only files written by the capture engine belong "
            "in the changelog directory"
        ) from exc


def changelog_batch(
    spark: SparkSession,
    landing_url: str,
    server_name: str,
    database: str,
    table: str,
    after_pos: int | None,
    before_pos: int,
    snapshot_columns: bool = False,
) -> tuple[DataFrame | None, TableSchema | None]:
    """Records with ``after_pos < __cdc_pos < before_pos`` and the newest segment's schema.

    The frame has the changelog metadata columns followed by the newest schema's user columns;
    rows from older segments lacking a column carry NULL there. With ``snapshot_columns``, if
    any segment of the batch carries the snapshot-record columns (only those may hold range
    assertions and sweeps), they follow (``columns.snapshot_struct``, typed after the newest
    key; NULL in segments without them). Returns (None, None) when no segment overlaps the
    range. Reading the footers is pyarrow work; the frame itself is lazy.
    """
    segments = list_segments(landing_url, server_name, database, table, after_pos, before_pos)
    if not segments:
        return None, None
    groups: list[tuple[pa.Schema, list[str]]] = []
    newest_metadata = None
    for segment in segments:
        arrow_schema = pq.read_schema(segment.location.path, filesystem=segment.location.fs)
        newest_metadata = arrow_schema.metadata
        plain = arrow_schema.remove_metadata()
        for schema, uris in groups:
            if schema.equals(plain):
                uris.append(segment.location.spark_uri)
                break
        else:
            groups.append((plain, [segment.location.spark_uri]))
    newest = _schema_from_metadata(newest_metadata, segments[-1])
    if (newest.database, newest.table) != (database, table):
        raise ValueError(
            f"segment {segments[-1].location.spark_uri} says it belongs to {newest.table_id}, "
            f"not {table_id(database, table)}; the landing zone's changelog directory is "
            "inconsistent"
        )
    refuse_reserved_columns(newest)
    target = StructType(CHANGELOG_META.fields + user_struct(newest.columns).fields)
    if snapshot_columns and any(THRESHOLD in schema.names for schema, _ in groups):
        target = StructType(target.fields + snapshot_struct(newest).fields)
    frames = [
        conform(spark.read.schema(struct_from_arrow(schema)).parquet(*uris), target)
        for schema, uris in groups
    ]
    batch = reduce(DataFrame.unionByName, frames)
    condition = col(POS) < before_pos
    if after_pos is not None:
        condition = condition & (col(POS) > after_pos)
    return batch.where(condition), newest
