"""Materialising a target table from its changelog: position-aware, merge-on-read, atomic.

One materialisation = read the records after the target's consumed mark and before the
checkpoint's ``next_pos``, fold them to one record per key (highest ``__cdc_pos``), write that as a
delta, and commit a new version together with the new consumed mark. The merge costs a Spark job
over the batch plus a key-only scan of the table for the exact row count (both narrow for the
table side: the batch keys are broadcast); compaction into a new base, the only job that rewrites
the table, runs when the deltas outgrow ``compaction_ratio`` of the base or ``max_deltas``.

Snapshot records (docs/landing-zone.md, "Snapshot records"): chunk rows (``r``) fold like any
row record. Range assertions (``a``) and sweeps (``s``) never become rows: after the fold, the
keys they delete (live keys in their range whose latest record position is below their
threshold) are written as tombstones at the assertion's position, in a second delta file set
of the same version, so readers need no change. Only segments carrying the snapshot columns may
hold them, so a batch without such a segment runs the plain fold; otherwise their count is
observed during the fold's write, and only if there are any, one small job collects them and one
reads the key columns and positions of the asserted ranges (a sweep: of the whole table) and
writes the tombstones.
"""

from __future__ import annotations

import logging
import operator
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import reduce
from typing import Any

import pyarrow.dataset as pads
from pyspark.sql import Column, DataFrame, Observation, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StructField,
    TimestampNTZType,
    TimestampType,
)

from cdc_platform.capture.names import table_id
from cdc_platform.capture.schema import TableSchema
from cdc_platform.lake.changelog import changelog_batch, read_checkpoint, read_table_schemas
from cdc_platform.lake.columns import (
    HI_OPEN,
    LO_OPEN,
    OP,
    POS,
    RANGE_ASSERTION,
    SNAPSHOT_ROW,
    SWEEP,
    THRESHOLD,
    col,
    hi_column,
    key_join,
    table_struct,
)
from cdc_platform.lake.spark import ensure_lake_conf
from cdc_platform.lake.table_format import (
    Commit,
    ConcurrentCommitError,
    DataFile,
    TargetTable,
    fold_latest,
)

log = logging.getLogger(__name__)

FIRST_OP = "__cdc_first_op"
INSTRUCTION = "__cdc_instruction"
KNOWN_OPS = ("c", "u", "d", SNAPSHOT_ROW)  # row records; "r": a snapshot chunk row, an upsert
SNAPSHOT_OPS = (RANGE_ASSERTION, SWEEP)  # instructions to the lake, never rows
# Key types whose Spark order is the source's (ARCHITECTURE section 4: the chunk reader only
# asserts ranges of int, decimal, float, date, datetime, timestamp, bit and binary keys).
RANGE_KEY_TYPES = (LongType, IntegerType, DecimalType, FloatType, DoubleType, DateType,
                   TimestampType, TimestampNTZType, BinaryType)
# Up to this many disjoint asserted spans are pushed down as a disjunction; beyond, their hull.
MAX_FILTER_SPANS = 32


@dataclass(frozen=True)
class MergeResult:
    """What one materialisation did (for Dagster metadata and logs)."""

    table_id: str
    version: int
    rows: int
    inserts: int
    updates: int
    deletes: int
    records_read: int
    consumed_pos: int | None
    consumed_gtid: str | None
    duration_seconds: float
    compacted: bool
    schema_changed: bool
    snapshot_rows: int = 0  # keys whose newest record in the batch is a chunk row (op "r")
    asserted_deletes: int = 0  # live keys deleted by range assertions and sweeps (in deletes)


def materialise(
    spark: SparkSession,
    landing_url: str,
    warehouse_url: str,
    server_name: str,
    schema_hint: TableSchema | None,
    database: str,
    table: str,
    compaction_ratio: float = 0.25,
    max_deltas: int = 8,
    keep_versions: int = 3,
) -> MergeResult:
    """Fold the table's new changelog records into a new target version and commit it.

    Idempotent: with no new committed records it returns the current version without a commit.
    A crash before the commit leaves the previous version current; a writer that loses a race
    for the version gets ConcurrentCommitError and can simply run again.
    """
    started = time.monotonic()
    ensure_lake_conf(spark)
    target = TargetTable(warehouse_url, server_name, database, table)
    previous = target.current()
    checkpoint = read_checkpoint(landing_url, server_name)

    if checkpoint is None:
        if previous is not None:
            return _unchanged(target, previous, started)
        schema = _fallback_schema(landing_url, server_name, database, table, schema_hint)
        return _commit_empty(target, schema, None, None, started)

    before_pos = checkpoint["next_pos"]
    gtid = checkpoint.get("gtid")
    after_pos = previous.consumed_pos if previous is not None else None
    if after_pos is not None and after_pos >= before_pos:
        raise RuntimeError(
            f"target {target.table_id} already consumed the changelog up to position {after_pos}, "
            f"but the checkpoint's next_pos is {before_pos}: the landing zone was reset or belongs "
            f"to another source. Rebuild the target by removing {target.root.spark_uri}"
        )
    batch, newest = changelog_batch(
        spark, landing_url, server_name, database, table, after_pos, before_pos,
        snapshot_columns=True,
    )
    if batch is None or newest is None:
        if previous is not None:
            return _unchanged(target, previous, started)
        schema = _fallback_schema(landing_url, server_name, database, table, schema_hint)
        return _commit_empty(target, schema, None, gtid, started)

    _check_schema(target, previous, newest)
    version = previous.version + 1 if previous is not None else 1
    first_base = previous is None or not previous.files

    kind = "base" if first_base else "delta"
    path = target.new_data_path(version, kind)
    written = [path]
    counts = _fold_and_write(batch, newest, target, path, drop_tombstones=first_base)
    if counts["records"] == 0:  # segments overlapped the range but held no record inside it
        target.discard(written)
        if previous is not None:
            return _unchanged(target, previous, started)
        return _commit_empty(target, newest, None, gtid, started)
    unknown = counts["total"] - sum(counts[op] for op in KNOWN_OPS)
    if unknown:
        target.discard(written)
        raise ValueError(
            f"changelog of {target.table_id} has {unknown} records with an __cdc_op outside "
            f"{KNOWN_OPS + SNAPSHOT_OPS} before position {before_pos}, or {SNAPSHOT_OPS} records "
            f"in segments without the {THRESHOLD}... columns; the segments were not written "
            "by a compatible capture engine"
        )
    records_read = int(counts["records"])
    inserts, updates, deletes = counts["inserted"], counts["updated"], counts["deleted"]
    consumed_pos = int(counts["max_pos"])
    schema_changed = previous is not None and previous.schema != newest
    compacted = False

    if first_base:
        previous_files: list[DataFile] = []
        folded = DataFile(path, "base", inserts + updates, newest.columns)
    else:
        assert previous is not None
        previous_files = [
            f if f.columns is not None else replace(f, columns=previous.schema.columns)
            for f in previous.files
        ]
        folded = DataFile(path, "delta", counts["total"], newest.columns)
    files = [*previous_files, folded]
    asserted = 0
    if counts["assertions"]:
        try:
            tombstones = _apply_assertions(
                spark, target, batch, Commit(version, tuple(files), consumed_pos, gtid, newest)
            )
        except Exception:
            target.discard(written)
            raise
        if tombstones is not None:
            written.append(tombstones.path)
            files.append(tombstones)
            asserted = tombstones.rows
    deletes += asserted

    if first_base:
        rows = inserts + updates - asserted
    else:
        assert previous is not None
        pending = Commit(version, tuple(files), consumed_pos, gtid, newest)
        base_rows = sum(f.rows for f in files if f.kind == "base")
        delta_files = [f for f in files if f.kind == "delta"]
        if (
            sum(f.rows for f in delta_files) > compaction_ratio * base_rows
            or len(delta_files) > max_deltas
        ):
            base = _compact(spark, target, pending)
            written.append(base.path)
            rows, files, compacted = base.rows, [base], True
        else:
            # Exact row count: the previous count, corrected by the batch keys' old state and
            # the keys the assertions deleted (each was live, and is counted once).
            live_before = _live_before(spark, target, pending, previous_files, folded)
            rows = previous.rows + inserts + updates - live_before - asserted

    stats: dict[str, Any] = {
        "rows": rows,
        "records_read": records_read,
        "inserts": inserts,
        "updates": updates,
        "deletes": deletes,
        "snapshot_rows": counts[SNAPSHOT_ROW],
        "asserted_deletes": asserted,
        "compacted": compacted,
        "schema_changed": schema_changed,
        "duration_seconds": round(time.monotonic() - started, 3),
    }
    try:
        target.commit(version, files, consumed_pos, gtid, newest, stats)
    except ConcurrentCommitError:
        target.discard(written)
        raise
    if compacted:
        target.discard(written[:-1])  # this version's deltas, folded into the new base
    _collect_garbage(target, keep_versions)
    result = MergeResult(
        table_id=target.table_id,
        version=version,
        rows=rows,
        inserts=inserts,
        updates=updates,
        deletes=deletes,
        records_read=records_read,
        consumed_pos=consumed_pos,
        consumed_gtid=gtid,
        duration_seconds=time.monotonic() - started,
        compacted=compacted,
        schema_changed=schema_changed,
        snapshot_rows=counts[SNAPSHOT_ROW],
        asserted_deletes=asserted,
    )
    log.info("materialised %s", result)
    return result


def _fold_and_write(
    batch: DataFrame,
    schema: TableSchema,
    target: TargetTable,
    path: str,
    drop_tombstones: bool,
) -> dict[str, int]:
    """Job 1: fold the batch's row records to one record per key and write them; return what
    was observed.

    Counts (records read, max position, instructions read, final op per key) are collected by
    observations during the write itself, so they cost no extra Spark job.
    """
    tag = uuid.uuid4().hex[:12]  # observation names must not collide across concurrent queries
    read_obs, fold_obs = Observation(f"batch_{tag}"), Observation(f"folded_{tag}")
    read_counts = [F.count(F.lit(1)).alias("records"), F.max(col(POS)).alias("max_pos")]
    keys = list(schema.primary_key)
    # Only segments with the snapshot columns may hold range assertions and sweeps: a batch
    # without such a segment runs the plain fold (an "a"/"s" record there is an unknown op).
    instructions = THRESHOLD in batch.columns
    if instructions:
        # They are applied after the fold. They go through the fold's shuffle in partitions
        # of their own and are dropped after it (by a filter on the op, which Spark cannot
        # push below the windows): filtered out before, a batch of nothing but them would
        # leave the shuffle empty, and adaptive execution would then drop the observations.
        instruction = F.coalesce(col(OP).isin(*SNAPSHOT_OPS), F.lit(False))
        read_counts.append(F.count(F.when(instruction, 1)).alias("assertions"))
        observed = batch.observe(read_obs, *read_counts).withColumn(INSTRUCTION, instruction)
        keys.append(INSTRUCTION)
    else:
        observed = batch.observe(read_obs, *read_counts)
    # The key's first op in the batch says whether it existed before the batch ("c": it did
    # not), its last op whether it exists after ("d": it does not): effects, not event counts.
    history = Window.partitionBy(*[col(k) for k in keys]).orderBy(col(POS).desc()).rowsBetween(
        Window.unboundedPreceding, Window.unboundedFollowing)
    with_first = observed.withColumn(FIRST_OP, F.last(col(OP)).over(history))
    folded = fold_latest(with_first, keys)
    if instructions:
        folded = folded.where(~instruction)
    folded = folded.select(
        *[col(c) for c in schema.column_names], col(POS), col(OP), col(FIRST_OP)
    )
    existed, exists = col(FIRST_OP) != "c", col(OP) != "d"
    folded = folded.observe(
        fold_obs,
        *[F.count(F.when(col(OP) == op, 1)).alias(op) for op in KNOWN_OPS],
        F.count(F.when(~existed & exists, 1)).alias("inserted"),
        F.count(F.when(existed & exists, 1)).alias("updated"),
        F.count(F.when(existed & ~exists, 1)).alias("deleted"),
        F.count(F.lit(1)).alias("total"),
    ).drop(FIRST_OP)
    out = folded.where(col(OP) != "d") if drop_tombstones else folded
    out.write.mode("errorifexists").parquet(target.data_location(path).spark_uri)
    counts = {"assertions": 0, **read_obs.get, **fold_obs.get}
    return {k: int(v) if v is not None else 0 for k, v in counts.items()}


def _compact(spark: SparkSession, target: TargetTable, pending: Commit) -> DataFile:
    """Job 2a: write the folded state of base + deltas as a new base (tombstones dropped).

    The only job that rewrites the whole table; its row count is observed while writing.
    """
    count_obs = Observation(f"compacted_{uuid.uuid4().hex[:12]}")
    path = target.new_data_path(pending.version, "base")
    state = target.state(spark, pending).observe(count_obs, F.count(F.lit(1)).alias("n"))
    state.write.mode("errorifexists").parquet(target.data_location(path).spark_uri)
    return DataFile(path, "base", int(count_obs.get["n"]), pending.schema.columns)


def _live_before(
    spark: SparkSession,
    target: TargetTable,
    pending: Commit,
    previous_files: list[DataFile],
    folded: DataFile,
) -> int:
    """Job 2b: how many keys of the batch's folded delta were live rows in the previous version.

    Reads only key columns, position and op. Spark broadcasts the (small) delta keys, so only
    matches are shuffled.
    """
    if not previous_files:
        return 0
    keys = list(pending.schema.primary_key)
    new_keys = target.read_files(spark, pending, [folded], columns=keys).select(
        *[col(k) for k in keys]
    )
    old = target.read_files(spark, pending, previous_files, columns=keys)
    matched = key_join(old, new_keys, keys, "left_semi")
    latest = matched.groupBy(*[col(k) for k in keys]).agg(
        F.max_by(col(OP), col(POS)).alias("op")
    )
    return latest.where(F.col("op") != "d").count()


# ---- range assertions and sweeps -------------------------------------------------------------

Key = tuple[Any, ...]
Verdict = tuple[int, int]  # (threshold, position of the instruction that sets it)


@dataclass(frozen=True)
class _Instruction:
    """One ``a`` or ``s`` record: delete keys in ``(low, high]`` whose latest position is below
    ``threshold`` (``None`` bounds are open; a sweep has both open)."""

    pos: int
    threshold: int
    low: Key | None
    high: Key | None


def _apply_assertions(
    spark: SparkSession, target: TargetTable, batch: DataFrame, pending: Commit
) -> DataFile | None:
    """Jobs A1-A2: the tombstones that the batch's range assertions and sweeps call for.

    ``pending``'s files are the state after folding the batch's row records. A live key whose
    latest position is below the highest threshold of the instructions covering it gets a
    tombstone at that instruction's position (never below the threshold, so above the key's
    latest record). Returns the tombstone delta, or None (nothing written) if no key qualifies.
    """
    schema = pending.schema
    keys = list(schema.primary_key)
    types = {f.name: f.dataType for f in table_struct(schema).fields}
    key_types = [types[k] for k in keys]
    instructions = _collect_instructions(batch, target.table_id, keys, key_types)
    intervals = _intervals(instructions)
    if all(verdict is None for _, verdict in intervals):
        return None
    state = target.read_files(spark, pending, list(pending.files), columns=keys)
    span_filter = _span_filter(intervals, keys, key_types)
    if span_filter is not None:
        state = state.where(span_filter)  # pushed down to the Parquet scans
    latest_pos, latest_op = "__cdc_latest_pos", "__cdc_latest_op"
    latest = state.groupBy(*[col(k) for k in keys]).agg(
        F.max(col(POS)).alias(latest_pos), F.max_by(col(OP), col(POS)).alias(latest_op)
    )
    tombstone_pos = _verdict_expression(intervals, keys, key_types, col(latest_pos))
    victims = latest.where(col(latest_op) != "d").select(
        *[col(k) for k in keys], tombstone_pos.alias(POS)
    ).where(col(POS).isNotNull())

    def tombstone(field: StructField) -> Column:
        if field.name in keys or field.name == POS:
            return col(field.name)
        if field.name == OP:
            return F.lit("d").alias(OP)
        return F.lit(None).cast(field.dataType).alias(field.name)

    tombstones = victims.select(*[tombstone(f) for f in table_struct(schema).fields])
    # Counted from the written footers: an observation is lost when adaptive execution finds
    # the shuffle empty (no key in the asserted ranges) and drops the plan above it.
    path = target.new_data_path(pending.version, "delta")
    location = target.data_location(path)
    tombstones.write.mode("errorifexists").parquet(location.spark_uri)
    deleted = pads.dataset(location.path, filesystem=location.fs, format="parquet").count_rows()
    if deleted == 0:
        target.discard([path])
        return None
    log.info("%s: %d range assertions/sweeps deleted %d keys", target.table_id,
             len(instructions), deleted)
    return DataFile(path, "delta", deleted, schema.columns)


def _collect_instructions(
    batch: DataFrame, table_id: str, keys: list[str], key_types: list[DataType]
) -> list[_Instruction]:
    """Job A1: the batch's ``a``/``s`` records on the driver (few: one per chunk commit)."""

    def exact(name: str, data_type: DataType, alias: str) -> Column:
        # Instants as microseconds: Python datetimes of TIMESTAMP values go through local time.
        value = F.unix_micros(col(name)) if isinstance(data_type, TimestampType) else col(name)
        return value.alias(alias)

    rows = batch.where(col(OP).isin(*SNAPSHOT_OPS)).select(
        col(POS).alias("pos"), col(OP).alias("op"), col(THRESHOLD).alias("threshold"),
        col(LO_OPEN).alias("lo_open"), col(HI_OPEN).alias("hi_open"),
        *[exact(k, t, f"lo{i}") for i, (k, t) in enumerate(zip(keys, key_types, strict=True))],
        *[exact(hi_column(k), t, f"hi{i}")
          for i, (k, t) in enumerate(zip(keys, key_types, strict=True))],
    ).collect()
    where = f"changelog of {table_id}"
    instructions = []
    for row in rows:
        what = f"{where}: {row.op!r} record at position {row.pos}"
        if row.threshold is None:
            raise ValueError(f"{what} has no {THRESHOLD}; snapshot instructions must carry "
                             "it (docs/landing-zone.md, Snapshot records)")
        if row.threshold > row.pos:
            raise ValueError(f"{what} has {THRESHOLD} {row.threshold} above its own position: "
                             "it would judge records that follow it")
        if row.op == SWEEP:
            instructions.append(_Instruction(row.pos, row.threshold, None, None))
            continue
        if row.lo_open is None or row.hi_open is None:
            raise ValueError(f"{what} lacks {LO_OPEN}/{HI_OPEN}; range assertions must carry "
                             "their bounds (docs/landing-zone.md, Snapshot records)")
        unordered = [k for k, t in zip(keys, key_types, strict=True)
                     if not isinstance(t, RANGE_KEY_TYPES)]
        if unordered:
            raise ValueError(f"{what}: key columns {unordered} do not sort in the lake as at "
                             "the source (text); such tables take the end-of-snapshot sweep, "
                             "not range assertions")
        low = None if row.lo_open else _key(row, "lo", len(keys))
        high = None if row.hi_open else _key(row, "hi", len(keys))
        instructions.append(_Instruction(row.pos, row.threshold, low, high))
    return instructions


def _key(row: Any, prefix: str, width: int) -> Key:
    """A collected bound as a hashable tuple (binary values collect as bytearray)."""
    values = (row[f"{prefix}{i}"] for i in range(width))
    return tuple(bytes(v) if isinstance(v, bytearray) else v for v in values)


def _order(key: Key) -> tuple[tuple[bool, Any], ...]:
    """Sort key of a key tuple: lexicographic, NULL first (the source's ORDER BY)."""
    return tuple((False, 0) if v is None else (True, v) for v in key)


def _intervals(instructions: Sequence[_Instruction]) -> list[tuple[Key | None, Verdict | None]]:
    """The key space cut at every bound into ``(previous upper, upper]`` intervals, in order,
    each with the highest (threshold, position) of the instructions covering it (None: none).

    Every bound is a low (exclusive) or high (inclusive) end, so each instruction covers whole
    intervals. The last upper is None (to the last key); neighbours with equal verdicts merge.
    """
    bounds: dict[tuple, Key] = {}
    for ins in instructions:
        for bound in (ins.low, ins.high):
            if bound is not None:
                bounds.setdefault(_order(bound), bound)
    ordered = sorted(bounds)
    index = {o: i for i, o in enumerate(ordered)}
    verdicts: list[Verdict | None] = [None] * (len(ordered) + 1)
    for ins in instructions:
        first = 0 if ins.low is None else index[_order(ins.low)] + 1
        last = len(ordered) if ins.high is None else index[_order(ins.high)]
        for j in range(first, last + 1):  # empty when low >= high
            current = verdicts[j]
            if current is None or (ins.threshold, ins.pos) > current:
                verdicts[j] = (ins.threshold, ins.pos)
    uppers: list[Key | None] = [bounds[o] for o in ordered] + [None]
    merged: list[tuple[Key | None, Verdict | None]] = []
    for upper, verdict in zip(uppers, verdicts, strict=True):
        if merged and merged[-1][1] == verdict:
            merged[-1] = (upper, verdict)
        else:
            merged.append((upper, verdict))
    return merged


def _literal(value: Any, data_type: DataType) -> Column:
    """A Spark literal of a collected key value (see ``_collect_instructions``), exactly."""
    if isinstance(data_type, TimestampType):
        return F.timestamp_micros(F.lit(value))
    if isinstance(data_type, TimestampNTZType):
        return F.lit(value.isoformat()).cast(data_type)
    if isinstance(data_type, BinaryType):
        return F.lit(bytearray(value))
    return F.lit(value).cast(data_type)


def _key_le(keys: list[str], key_types: list[DataType], bound: Key) -> Column:
    """``key <= bound`` lexicographically, NULL first; never NULL itself."""
    terms, equal = [], []
    last = len(keys) - 1
    for i, (name, data_type, value) in enumerate(zip(keys, key_types, bound, strict=True)):
        column = col(name)
        if value is None:
            compare = column.isNull() if i == last else None  # nothing sorts below NULL
            equal.append(column.isNull())
        else:
            literal = _literal(value, data_type)
            compare = column.isNull() | (column <= literal if i == last else column < literal)
            equal.append(column.eqNullSafe(literal))
        if compare is not None:
            terms.append(reduce(operator.and_, [*equal[:-1], compare]))
    return reduce(operator.or_, terms)


def _span_filter(
    intervals: list[tuple[Key | None, Verdict | None]], keys: list[str],
    key_types: list[DataType],
) -> Column | None:
    """A filter on the key columns keeping the covered intervals (None: the whole key space)."""
    spans: list[tuple[Key | None, Key | None]] = []
    previous_upper: Key | None = None
    running = False
    for j, (upper, verdict) in enumerate(intervals):
        if verdict is not None and not running:
            spans.append((previous_upper if j else None, upper))
            running = True
        elif verdict is not None:
            spans[-1] = (spans[-1][0], upper)
        else:
            running = False
        previous_upper = upper
    if len(spans) > MAX_FILTER_SPANS:
        spans = [(spans[0][0], spans[-1][1])]
    conditions = []
    for low, high in spans:
        parts = []
        if low is not None:
            parts.append(~_key_le(keys, key_types, low))
        if high is not None:
            parts.append(_key_le(keys, key_types, high))
        if not parts:
            return None
        conditions.append(reduce(operator.and_, parts))
    return reduce(operator.or_, conditions)


def _verdict_expression(
    intervals: list[tuple[Key | None, Verdict | None]], keys: list[str],
    key_types: list[DataType], latest_pos: Column,
) -> Column:
    """The tombstone position for a key with latest position ``latest_pos`` (NULL: keep it).

    A balanced tree of ``key <= upper`` tests finds the key's interval, so a row costs about
    log2(intervals) comparisons however many instructions the batch holds.
    """

    def tree(lo: int, hi: int) -> Column:
        if lo == hi:
            verdict = intervals[lo][1]
            if verdict is None:
                return F.lit(None).cast(LongType())
            threshold, pos = verdict
            return F.when(latest_pos < F.lit(threshold), F.lit(pos).cast(LongType()))
        mid = (lo + hi) // 2
        upper = intervals[mid][0]
        assert upper is not None  # only the last interval is open above
        return F.when(_key_le(keys, key_types, upper), tree(lo, mid)).otherwise(
            tree(mid + 1, hi)
        )

    return tree(0, len(intervals) - 1)


def _check_schema(target: TargetTable, previous: Commit | None, newest: TableSchema) -> None:
    if not newest.primary_key:
        raise ValueError(
            f"changelog of {target.table_id} has no primary key in its metadata; configure a "
            "surrogate key for this table in the capture engine, or exclude it"
        )
    missing = [k for k in newest.primary_key if k not in newest.column_names]
    if missing:
        raise ValueError(
            f"changelog of {target.table_id}: primary key columns {missing} are not among its "
            "columns (were they excluded by a column filter?); key columns must be captured"
        )
    if previous is not None and previous.files and previous.schema.primary_key != newest.primary_key:
        raise ValueError(
            f"the primary key of {target.table_id} changed from {list(previous.schema.primary_key)}"
            f" to {list(newest.primary_key)}; primary-key changes are not merged: rebuild the "
            f"target from a fresh snapshot (remove {target.root.spark_uri})"
        )


def _fallback_schema(
    landing_url: str,
    server_name: str,
    database: str,
    table: str,
    schema_hint: TableSchema | None,
) -> TableSchema:
    if schema_hint is not None:
        return schema_hint
    schema = read_table_schemas(landing_url, server_name).get(table_id(database, table))
    if schema is None:
        raise LookupError(
            f"{table_id(database, table)} has no changelog yet and no schema to create an empty target "
            "from: pass schema_hint, or let the capture engine record it in tables.json first"
        )
    return schema


def _commit_empty(
    target: TargetTable,
    schema: TableSchema,
    consumed_pos: int | None,
    gtid: str | None,
    started: float,
) -> MergeResult:
    """Version 1 without data files, so that the target exists (with its columns) from the start."""
    stats = {"rows": 0, "records_read": 0, "inserts": 0, "updates": 0, "deletes": 0,
             "snapshot_rows": 0, "asserted_deletes": 0, "compacted": False,
             "schema_changed": False}
    commit = target.commit(1, [], consumed_pos, gtid, schema, stats)
    return _result(target, commit, started)


def _unchanged(target: TargetTable, commit: Commit, started: float) -> MergeResult:
    return _result(target, commit, started)


def _result(target: TargetTable, commit: Commit, started: float) -> MergeResult:
    return MergeResult(
        table_id=target.table_id,
        version=commit.version,
        rows=commit.rows,
        inserts=0,
        updates=0,
        deletes=0,
        records_read=0,
        consumed_pos=commit.consumed_pos,
        consumed_gtid=commit.consumed_gtid,
        duration_seconds=time.monotonic() - started,
        compacted=False,
        schema_changed=False,
    )


def _collect_garbage(target: TargetTable, keep_versions: int) -> None:
    try:
        target.collect_garbage(keep_versions)
    except OSError as exc:  # never fail a committed materialisation over housekeeping
        log.warning("%s: garbage collection failed: %s", target.table_id, exc)
