"""Materialising a target table from its changelog: position-aware, merge-on-read, atomic.

One materialisation = read the records after the target's consumed mark and before the
checkpoint's ``next_pos``, fold them to one record per key (highest ``__cdc_pos``), write that as a
delta, and commit a new version together with the new consumed mark. The merge costs a Spark job
over the batch plus a key-only scan of the table for the exact row count (both narrow for the
table side: the batch keys are broadcast); compaction into a new base, the only job that rewrites
the table, runs when the deltas outgrow ``compaction_ratio`` of the base or ``max_deltas``.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql import DataFrame, Observation, SparkSession, Window
from pyspark.sql import functions as F

from cdc_platform.capture.schema import TableSchema
from cdc_platform.lake.changelog import changelog_batch, read_checkpoint, read_table_schemas
from cdc_platform.lake.columns import OP, POS, col
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
KNOWN_OPS = ("c", "u", "d", "r")  # "r": a snapshot read, treated like an insert


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
        spark, landing_url, server_name, database, table, after_pos, before_pos
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
            f"{KNOWN_OPS} before position {before_pos}; the segments were not written by a "
            "compatible capture engine"
        )
    records_read = int(counts["records"])
    inserts, updates, deletes = counts["inserted"], counts["updated"], counts["deleted"]
    consumed_pos = int(counts["max_pos"])
    schema_changed = previous is not None and previous.schema != newest
    compacted = False

    if previous is None or first_base:
        rows = inserts + updates
        files = [DataFile(path, "base", rows, newest.columns)]
    else:
        carried = [
            f if f.columns is not None else replace(f, columns=previous.schema.columns)
            for f in previous.files
        ]
        files = [*carried, DataFile(path, "delta", counts["total"], newest.columns)]
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
            # Exact row count: the previous count, corrected by the batch keys' old state.
            rows = previous.rows + inserts + updates - _live_before(spark, target, pending, path)

    stats: dict[str, Any] = {
        "rows": rows,
        "records_read": records_read,
        "inserts": inserts,
        "updates": updates,
        "deletes": deletes,
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
        target.discard(written[:1])  # this version's delta, folded into the new base
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
    """Job 1: fold the batch to one record per key and write it; return what was observed.

    Counts (records read, max position, final op per key) are collected by observations during
    the write itself, so they cost no extra Spark job.
    """
    tag = uuid.uuid4().hex[:12]  # observation names must not collide across concurrent queries
    read_obs, fold_obs = Observation(f"batch_{tag}"), Observation(f"folded_{tag}")
    observed = batch.observe(
        read_obs, F.count(F.lit(1)).alias("records"), F.max(col(POS)).alias("max_pos")
    )
    # The key's first op in the batch says whether it existed before the batch ("c": it did
    # not), its last op whether it exists after ("d": it does not): effects, not event counts.
    keys = [col(k) for k in schema.primary_key]
    history = Window.partitionBy(*keys).orderBy(col(POS).desc()).rowsBetween(
        Window.unboundedPreceding, Window.unboundedFollowing)
    with_first = observed.withColumn(FIRST_OP, F.last(col(OP)).over(history))
    folded = fold_latest(with_first, schema.primary_key).select(
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
    counts = {**read_obs.get, **fold_obs.get}
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


def _live_before(spark: SparkSession, target: TargetTable, pending: Commit, delta_path: str) -> int:
    """Job 2b: how many of the new delta's keys were live rows in the previous version.

    Reads only key columns, position and op. The previous files are all of ``pending``'s files
    but the new delta; Spark broadcasts the (small) delta keys, so only matches are shuffled.
    """
    previous_files = [f for f in pending.files if f.path != delta_path]
    if not previous_files:
        return 0
    keys = list(pending.schema.primary_key)
    delta = [f for f in pending.files if f.path == delta_path]
    new_keys = target.read_files(spark, pending, delta, columns=keys).select(
        *[col(k) for k in keys]
    )
    old = target.read_files(spark, pending, previous_files, columns=keys)
    matched = old.join(new_keys, on=keys, how="left_semi")
    latest = matched.groupBy(*[col(k) for k in keys]).agg(
        F.max_by(col(OP), col(POS)).alias("op")
    )
    return latest.where(F.col("op") != "d").count()


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
    schema = read_table_schemas(landing_url, server_name).get(f"{database}.{table}")
    if schema is None:
        raise LookupError(
            f"{database}.{table} has no changelog yet and no schema to create an empty target "
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
             "compacted": False, "schema_changed": False}
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
