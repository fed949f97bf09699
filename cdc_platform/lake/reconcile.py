"""Reconcile one target (lake) table against its source table by key-range checksums.

Both sides are reduced to ``(primary key, row hash)`` pairs with the capture engine's own value
canonicalisation (``capture.values``): the source inside one read-only consistent snapshot, the
target on the Spark executors. The source's sorted keys are cut into ranges of ``range_rows``
keys; each range gets the checksum ``(count, xor of hashes, sum of hashes mod 2**64)`` on both
sides. Only ranges whose checksums differ are drilled into, key by key, so a table that agrees
costs one pass on each side and moves only per-range sums to the driver.

Ranges partition the whole key space: a key belongs to the last range whose start key is <= it,
and keys below the first start belong to range 0. Source and target use the same function
(:func:`_range_of`), so a target row whose key the source lacks still lands in exactly one range.

The source side keeps ``(key, hash)`` of every row in driver memory (rows are streamed, never
held whole); the target side never leaves the executors except for rows of mismatching ranges.
"""

from __future__ import annotations

import datetime as dt
import logging
import pickle
import time
from bisect import bisect_right
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pymysql
import pymysql.cursors
from pyspark.broadcast import Broadcast
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_platform.capture.keys import Key, KeyOrder, key_order
from cdc_platform.capture.schema import TableSchema
from cdc_platform.capture.snapshot.watermark import WatermarkError, read_with_watermarks
from cdc_platform.capture.source import (
    SourceSession,
    TableSelector,
    connect,
    missing_table,
    quote_identifier,
    server_flavour,
)
from cdc_platform.capture.values import canonical_value, converter_for, row_hash, select_expression
from cdc_platform.lake.iceberg.table import LakeTable

__all__ = ["ReconcileError", "ReconcileResult", "reconcile_table", "reconcile_target"]

log = logging.getLogger(__name__)

_MASK64 = (1 << 64) - 1
_MASK32 = (1 << 32) - 1
_FETCH_ROWS = 10_000  # rows per round trip of the streaming cursor
_DRILL_BATCH_ROWS = 10_000  # rows per Arrow batch the drill-down sends back
# Mixed into the hash of a target row that lacks a schema column, so it never equals the source.
_MISSING_COLUMN_MARK = "\x00cdc_platform: column missing from the target\x00"

Checksum = tuple[int, int, int]  # (rows, xor mod 2**64, sum mod 2**64)
_EMPTY: Checksum = (0, 0, 0)


class ReconcileError(RuntimeError):
    """A table cannot be reconciled as asked; the message names the table and the cause."""


@dataclass
class ReconcileResult:
    """Outcome of one reconciliation; ``ok`` means the target holds exactly the source's rows."""

    table_id: str
    source_rows: int
    target_rows: int
    ranges: int
    mismatched_ranges: int
    missing: int  # keys in the source, not in the target
    extra: int  # keys in the target, not in the source (duplicate target keys count here too)
    different: int  # keys on both sides whose rows differ
    sample_missing: list[str] = field(default_factory=list)
    sample_extra: list[str] = field(default_factory=list)
    sample_different: list[str] = field(default_factory=list)
    source_gtid: str | None = None  # exact GTID position of the source snapshot (MariaDB only)
    duration_seconds: float = 0.0
    primary_key: tuple[str, ...] = ()
    missing_columns: tuple[str, ...] = ()  # schema columns the target lacks (all rows differ)

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.extra == 0 and self.different == 0

    def to_metadata(self) -> dict[str, Any]:
        """JSON-able summary for Dagster asset-check metadata."""
        return {
            "table": self.table_id,
            "ok": self.ok,
            "source_rows": self.source_rows,
            "target_rows": self.target_rows,
            "ranges": self.ranges,
            "mismatched_ranges": self.mismatched_ranges,
            "missing": self.missing,
            "extra": self.extra,
            "different": self.different,
            "sample_missing": list(self.sample_missing),
            "sample_extra": list(self.sample_extra),
            "sample_different": list(self.sample_different),
            "primary_key": list(self.primary_key),
            "missing_columns": list(self.missing_columns),
            "source_gtid": self.source_gtid,
            "duration_seconds": round(self.duration_seconds, 3),
        }


# ---- shared by both sides ---------------------------------------------------------------------


def _key_value(value: Any) -> Any:
    """A key component in one Python form on both sides, so keys compare and hash alike.

    Spark hands TIMESTAMP values to Python as aware datetimes (session zone), the source as naive
    UTC; everything else already agrees after conversion.
    """
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC).replace(tzinfo=None)
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def _range_of(order: KeyOrder, starts: Sequence[Any]) -> int:
    """The range a key belongs to: the last range starting at or before it, else range 0.

    With no starts (empty source) everything is range 0; keys past the last start fall into the
    last range. So the ranges partition the whole key space, on both sides alike.
    """
    return max(bisect_right(starts, order) - 1, 0)


@dataclass(frozen=True)
class _Hasher:
    """Turns rows (schema column order) into ``(key, hash)``; shipped to the executors."""

    kinds: tuple[str, ...]
    key_columns: tuple[int, ...]  # schema-column indices of the primary key, in key order
    incomplete: bool = False  # the target lacks some schema column: no row may match

    def pair(self, values: Sequence[Any]) -> tuple[Key, int]:
        digest = row_hash(self.kinds, values)
        if self.incomplete:
            digest = row_hash(("string", "int"), (_MISSING_COLUMN_MARK, digest))
        return tuple(_key_value(values[i]) for i in self.key_columns), digest

    def pairs_of_batch(
        self, batch: pa.RecordBatch, positions: tuple[int | None, ...]
    ) -> Iterator[tuple[Key, int]]:
        """Pairs of an Arrow batch whose columns are the target's; None = column missing."""
        blank = [None] * batch.num_rows
        columns = [blank if p is None else batch.column(p).to_pylist() for p in positions]
        for values in zip(*columns, strict=True):
            yield self.pair(values)


def _add(acc: dict[int, list[int]], range_id: int, digest: int) -> None:
    entry = acc.get(range_id)
    if entry is None:
        acc[range_id] = [1, digest, digest]
    else:
        entry[0] += 1
        entry[1] ^= digest
        entry[2] += digest


def _render_key(kinds: Sequence[str], key: Key) -> str:
    """A key as text for samples: ``(v1, v2)`` with the values' canonical forms."""
    return "(" + ", ".join(canonical_value(k, v) for k, v in zip(kinds, key, strict=True)) + ")"


# ---- source side ------------------------------------------------------------------------------


@dataclass
class _SourceSide:
    pairs: list[tuple[Key, int]]  # sorted by key
    gtid: str | None


def _read_source(settings: dict[str, Any], schema: TableSchema, hasher: _Hasher) -> _SourceSide:
    """All ``(key, hash)`` of the source table, read in one read-only consistent snapshot.

    REPEATABLE READ is set explicitly: under READ COMMITTED the SELECT would take a newer read
    view than the snapshot whose binlog position we record.
    """
    columns = ", ".join(
        select_expression(c, quote_identifier(c.name)) for c in schema.columns
    )
    sql = (
        f"SELECT {columns} FROM {quote_identifier(schema.database)}."
        f"{quote_identifier(schema.table)}"
    )
    converters = [converter_for(c, from_binlog=False) for c in schema.columns]
    pairs: list[tuple[Key, int]] = []
    try:
        conn = connect(settings)
    except pymysql.MySQLError as exc:
        raise ReconcileError(f"{schema.table_id}: cannot connect to the source: {exc}") from exc
    def stream_rows(cur: Any) -> None:
        # Unbuffered, inside the watermarked read view: a big table never sits in memory twice.
        with cur.connection.cursor(pymysql.cursors.SSCursor) as stream:
            stream.execute(sql)
            while rows := stream.fetchmany(_FETCH_ROWS):
                for row in rows:
                    values = [
                        v if convert is None else convert(v)
                        for convert, v in zip(converters, row, strict=True)
                    ]
                    pairs.append(hasher.pair(values))

    try:
        _, marks = read_with_watermarks(conn, server_flavour(conn), stream_rows)
        gtid = str(marks.after) or None
    except (pymysql.MySQLError, WatermarkError) as exc:
        raise ReconcileError(f"{schema.table_id}: reading the source failed: {exc}") from exc
    finally:
        conn.close()
    pairs.sort(key=lambda pair: key_order(pair[0]))
    return _SourceSide(pairs, gtid)


def _source_checksums(
    pairs: list[tuple[Key, int]], starts: list[Any]
) -> tuple[dict[int, Checksum], dict[int, tuple[int, int]]]:
    """Per-range checksums and each range's slice of the (sorted) pairs."""
    acc: dict[int, list[int]] = {}
    bounds: dict[int, tuple[int, int]] = {}
    for index, (key, digest) in enumerate(pairs):
        range_id = _range_of(key_order(key), starts)
        _add(acc, range_id, digest)
        first, _ = bounds.get(range_id, (index, index))
        bounds[range_id] = (first, index + 1)
    sums = {r: (a[0], a[1] & _MASK64, a[2] & _MASK64) for r, a in acc.items()}
    return sums, bounds


# ---- target side ------------------------------------------------------------------------------


def _spark_family(data_type: T.DataType) -> str:
    if isinstance(data_type, T.ByteType | T.ShortType | T.IntegerType | T.LongType):
        return "integer"
    if isinstance(data_type, T.DecimalType):
        return "decimal"
    if isinstance(data_type, T.FloatType | T.DoubleType):
        return "floating"
    if isinstance(data_type, T.DateType):
        return "date"
    if isinstance(data_type, T.TimestampType | T.TimestampNTZType):
        return "timestamp"
    if isinstance(data_type, T.BinaryType):
        return "binary"
    if isinstance(data_type, T.StringType):
        return "string"
    return data_type.simpleString()


def _arrow_family(data_type: pa.DataType) -> str:
    checks: list[tuple[Callable[[pa.DataType], bool], str]] = [
        (pa.types.is_integer, "integer"), (pa.types.is_decimal, "decimal"),
        (pa.types.is_floating, "floating"), (pa.types.is_date, "date"),
        (pa.types.is_timestamp, "timestamp"), (pa.types.is_binary, "binary"),
        (pa.types.is_string, "string"),
    ]
    return next((name for check, name in checks if check(data_type)), str(data_type))


def _target_columns(
    schema: TableSchema, target_df: DataFrame
) -> tuple[list[str], tuple[int | None, ...], tuple[str, ...]]:
    """Target columns to read, each schema column's position among them, and missing columns.

    Key columns must be present with a type of the landing type's family: keys of different
    Python types cannot be ordered against the source's.
    """
    fields = {f.name.lower(): f for f in target_df.schema.fields}
    selected: list[str] = []
    positions: list[int | None] = []
    missing: list[str] = []
    for column in schema.columns:
        found = fields.get(column.name.lower())
        if found is None:
            missing.append(column.name)
            positions.append(None)
            continue
        if column.name in schema.primary_key:
            want, have = _arrow_family(column.arrow_type()), _spark_family(found.dataType)
            if want != have:
                raise ReconcileError(
                    f"{schema.table_id}: primary-key column {column.name!r} is "
                    f"{found.dataType.simpleString()} in the target, expected a {want} type "
                    f"({column.arrow_type()}); cannot compare keys"
                )
        positions.append(len(selected))
        selected.append(found.name)
    absent_keys = [c for c in schema.primary_key if c in missing]
    if absent_keys:
        raise ReconcileError(
            f"{schema.table_id}: the target lacks primary-key column(s) {absent_keys}"
        )
    return selected, tuple(positions), tuple(missing)


def _checksum_mapper(
    hasher: _Hasher, positions: tuple[int | None, ...], starts: Broadcast
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """Executor function: partial per-range checksums of one partition.

    The sum goes out as two 32-bit halves so Spark's int64 ``sum`` cannot overflow.
    """

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        range_starts = starts.value
        acc: dict[int, list[int]] = {}
        for batch in batches:
            for key, digest in hasher.pairs_of_batch(batch, positions):
                _add(acc, _range_of(key_order(key), range_starts), digest)
        if not acc:
            return
        ranges = sorted(acc)
        sums = [acc[r][2] & _MASK64 for r in ranges]
        yield pa.RecordBatch.from_pydict(
            {
                "range_id": pa.array(ranges, pa.int32()),
                "rows": pa.array([acc[r][0] for r in ranges], pa.int64()),
                "hash_xor": pa.array([acc[r][1] for r in ranges], pa.int64()),
                "sum_hi": pa.array([s >> 32 for s in sums], pa.int64()),
                "sum_lo": pa.array([s & _MASK32 for s in sums], pa.int64()),
            }
        )

    return run


def _drill_mapper(
    hasher: _Hasher, positions: tuple[int | None, ...], starts: Broadcast, wanted: Broadcast
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """Executor function: ``(range, pickled key, hash)`` of the rows in mismatching ranges."""

    def emit(out: dict[str, list[Any]]) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict(
            {
                "range_id": pa.array(out["range_id"], pa.int32()),
                "key": pa.array(out["key"], pa.binary()),
                "hash": pa.array(out["hash"], pa.int64()),
            }
        )

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        range_starts, ranges = starts.value, wanted.value
        out: dict[str, list[Any]] = {"range_id": [], "key": [], "hash": []}
        for batch in batches:
            for key, digest in hasher.pairs_of_batch(batch, positions):
                range_id = _range_of(key_order(key), range_starts)
                if range_id in ranges:
                    out["range_id"].append(range_id)
                    out["key"].append(pickle.dumps(key, protocol=pickle.HIGHEST_PROTOCOL))
                    out["hash"].append(digest)
            if len(out["key"]) >= _DRILL_BATCH_ROWS:
                yield emit(out)
                out = {"range_id": [], "key": [], "hash": []}
        if out["key"]:
            yield emit(out)

    return run


def _target_checksums(
    prepared: DataFrame, hasher: _Hasher, positions: tuple[int | None, ...], starts: Broadcast
) -> dict[int, Checksum]:
    mapped = prepared.mapInArrow(
        _checksum_mapper(hasher, positions, starts),
        "range_id int, rows long, hash_xor long, sum_hi long, sum_lo long",
    )
    totals = mapped.groupBy("range_id").agg(
        F.sum("rows").alias("rows"),
        F.bit_xor("hash_xor").alias("hash_xor"),
        F.sum("sum_hi").alias("sum_hi"),
        F.sum("sum_lo").alias("sum_lo"),
    )
    return {
        row["range_id"]: (
            int(row["rows"]),
            int(row["hash_xor"]) & _MASK64,
            ((int(row["sum_hi"]) << 32) + int(row["sum_lo"])) & _MASK64,
        )
        for row in totals.collect()
    }


# ---- the entry point --------------------------------------------------------------------------


def reconcile_table(
    spark: SparkSession,
    target_df: DataFrame,
    source_settings: dict[str, Any],
    schema: TableSchema,
    range_rows: int = 10_000,
    sample_keys: int = 10,
) -> ReconcileResult:
    """Compare ``target_df`` (the lake table's current rows) with the source table ``schema``.

    ``source_settings`` are the kwargs of ``capture.source.connect``. Target columns missing from
    the schema are ignored; schema columns missing from the target make every row different.
    Raises :class:`ReconcileError` (naming the table) when the table has no primary key, the
    target lacks or mistypes a key column, or the source cannot be read.
    """
    started = time.monotonic()
    if not schema.primary_key:
        raise ReconcileError(
            f"{schema.table_id} has no primary key: it cannot be reconciled by key "
            "(set capture.surrogate_keys for it)"
        )
    if range_rows < 1:
        raise ValueError(f"{schema.table_id}: range_rows must be >= 1, got {range_rows}")
    names = schema.column_names
    key_columns = tuple(names.index(name) for name in schema.primary_key)
    key_kinds = [schema.columns[i].kind for i in key_columns]
    selected, positions, missing_columns = _target_columns(schema, target_df)
    kinds = tuple(c.kind for c in schema.columns)

    source = _read_source(source_settings, schema, _Hasher(kinds, key_columns))
    pairs = source.pairs
    starts = [key_order(pairs[i][0]) for i in range(0, len(pairs), range_rows)]
    n_ranges = max(len(starts), 1)
    source_sums, bounds = _source_checksums(pairs, starts)

    target_hasher = _Hasher(kinds, key_columns, incomplete=bool(missing_columns))
    prepared = target_df.select(
        *[F.col("`" + name.replace("`", "``") + "`").alias(f"c{i}") for i, name in
          enumerate(selected)]
    )
    starts_bc = spark.sparkContext.broadcast(starts)
    wanted_bc: Broadcast | None = None
    try:
        target_sums = _target_checksums(prepared, target_hasher, positions, starts_bc)
        mismatched = [
            r for r in range(n_ranges)
            if source_sums.get(r, _EMPTY) != target_sums.get(r, _EMPTY)
        ]
        missing: list[Key] = []
        extra: list[Key] = []
        different: list[Key] = []
        if mismatched:
            wanted_bc = spark.sparkContext.broadcast(frozenset(mismatched))
            drilled = prepared.mapInArrow(
                _drill_mapper(target_hasher, positions, starts_bc, wanted_bc),
                "range_id int, key binary, hash long",
            )
            target_pairs: dict[int, list[tuple[Key, int]]] = {r: [] for r in mismatched}
            for row in drilled.collect():
                target_pairs[row["range_id"]].append((pickle.loads(row["key"]), row["hash"]))
            for range_id in mismatched:
                first, end = bounds.get(range_id, (0, 0))
                expected = dict(pairs[first:end])
                for key, digest in target_pairs[range_id]:
                    want = expected.pop(key, None)
                    if want is None:
                        extra.append(key)
                    elif want != digest:
                        different.append(key)
                missing.extend(expected)
    finally:
        starts_bc.destroy()
        if wanted_bc is not None:
            wanted_bc.destroy()

    def samples(keys: list[Key]) -> list[str]:
        return [_render_key(key_kinds, k) for k in sorted(keys, key=key_order)[:sample_keys]]

    result = ReconcileResult(
        table_id=schema.table_id,
        source_rows=len(pairs),
        target_rows=sum(s[0] for s in target_sums.values()),
        ranges=n_ranges,
        mismatched_ranges=len(mismatched),
        missing=len(missing),
        extra=len(extra),
        different=len(different),
        sample_missing=samples(missing),
        sample_extra=samples(extra),
        sample_different=samples(different),
        source_gtid=source.gtid,
        duration_seconds=time.monotonic() - started,
        primary_key=tuple(schema.primary_key),
        missing_columns=missing_columns,
    )
    log.info(
        "reconciled %s: %d source / %d target rows, %d of %d ranges differ, "
        "%d missing, %d extra, %d different (%.1f s)",
        result.table_id, result.source_rows, result.target_rows, result.mismatched_ranges,
        result.ranges, result.missing, result.extra, result.different, result.duration_seconds,
    )
    return result


def reconcile_target(spark: SparkSession, target: LakeTable, connection: Mapping[str, Any],
                     selector: TableSelector, schema: TableSchema, range_rows: int,
                     sample_keys: int) -> tuple[ReconcileResult, str | None]:
    """Compare a target's current snapshot with its source table (shaped by the capture
    filters as the stream shapes it). Returns the result and the target's consumed GTID.
    Raises LookupError when the target has no snapshot yet, or the source no such table."""
    with SourceSession(dict(connection), selector) as source:
        current = source.read_schema(schema.database, schema.table)
    if current is None:
        raise LookupError(f"{missing_table(schema.table_id)}: nothing to compare "
                          f"{target.identifier} with")
    snapshot, marked = target.base_and_mark()
    if snapshot is None:
        raise LookupError(f"{target.identifier} has no snapshot yet: materialise it first")
    result = reconcile_table(spark, target.read(snapshot_id=snapshot.snapshot_id),
                             dict(connection), current, range_rows=range_rows,
                             sample_keys=sample_keys)
    return result, marked.consumed_gtid if marked else None
