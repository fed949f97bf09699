"""Materialising a target table from its changelog: one Iceberg MERGE per batch, exactly once.

One materialisation = read the records after the consumed mark stored in the table's newest
snapshot and before the checkpoint's ``next_pos``, fold them to one record per key (highest
``__cdc_pos``), and MERGE that into the Iceberg table by key: deletes delete, other records
upsert (``r`` chunk rows included). The MERGE is one snapshot, merge-on-read (position delete
files, so its cost follows the batch, not the table), and carries the new consumed mark in its
summary; it is published only if the table has not moved since the mark was read
(``iceberg.commit.commit_merge``), and retried from the new snapshot otherwise.

Snapshot records (docs/landing-zone.md, "Snapshot records"): range assertions (``a``) and
sweeps (``s``) never become rows. The keys they delete (live keys in their range whose latest
record position is below their threshold, judged on the table as of the snapshot the batch
applies to plus the batch itself) become deletes at the instruction's position in the same
MERGE (``lake.verdicts``, which judges them in Spark here and in Arrow for the merges without
Spark). Only segments carrying the snapshot columns may hold them.

Every target row keeps ``__cdc_pos``, the position of the record that wrote it: the range
assertions judge by it, and a MERGE never lets an older record overwrite a newer row.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import SparkSession

from cdc_platform.capture.landing.records import (
    DELETE,
    INSTRUCTION_OPS,
    OP,
    POS,
    ROW_OPS,
    SNAPSHOT_ROW,
    THRESHOLD,
    ColumnRenames,
)
from cdc_platform.capture.schema import TableSchema
from cdc_platform.config import S3Settings
from cdc_platform.lake.arrow_merge import Merged, materialise_without_spark
from cdc_platform.lake.changelog import TableChangelog
from cdc_platform.lake.columns import col
from cdc_platform.lake.fold import INSTRUCTION, arrow_counts, fold, fold_latest
from cdc_platform.lake.iceberg.catalog import quote
from cdc_platform.lake.iceberg.commit import ConcurrentCommitError, commit_merge
from cdc_platform.lake.iceberg.lake import Lake
from cdc_platform.lake.iceberg.schema import drop_columns, prepare
from cdc_platform.lake.iceberg.snapshots import CONSUMED_GTID, CONSUMED_POS, Snapshot
from cdc_platform.lake.iceberg.table import LakeTable
from cdc_platform.lake.verdicts import not_asserted_away, tombstones

log = logging.getLogger(__name__)

# A materialisation that loses the commit race to another runs again from the new snapshot.
COMMIT_ATTEMPTS = 3


@dataclass(frozen=True)
class MergeResult:
    """What one materialisation did (for Dagster metadata and logs)."""

    table_id: str
    identifier: str  # the Iceberg table, as Spark SQL names it
    snapshot: Snapshot | None  # the main branch's snapshot after the run
    committed: bool  # this run made ``snapshot``
    rows: int
    inserts: int
    updates: int
    deletes: int
    records_read: int
    consumed_pos: int | None
    consumed_gtid: str | None
    duration_seconds: float
    schema_changed: bool
    snapshot_rows: int = 0  # keys whose newest record in the batch is a chunk row (op "r")
    asserted_deletes: int = 0  # live keys deleted by range assertions and sweeps (in deletes)
    attempts: int = 1
    newest_source_ms: int | None = None  # source commit time of the newest record applied
    oldest_source_ms: int | None = None  # and of the oldest
    appended: bool = False  # the batch went into an empty table as an append, not a MERGE
    spark: bool = True  # Spark wrote it (else pyarrow and pyiceberg: ``lake.arrow_merge``)
    snapshot_count: int | None = None  # the table's snapshots after it (known without Spark)

    @property
    def lag_seconds(self) -> float | None:
        """From the source commit of the newest record applied to the Iceberg commit."""
        return self._since(self.newest_source_ms)

    @property
    def wait_seconds(self) -> float | None:
        """From the source commit of the oldest record applied to the Iceberg commit: how
        long the batch's first change waited, which is the table's staleness just before the
        commit (``lag_seconds`` is the newest change's, small however long the batch
        waited)."""
        return self._since(self.oldest_source_ms)

    def _since(self, source_ms: int | None) -> float | None:
        if source_ms is None or self.snapshot is None or not self.committed:
            return None
        committed_ms = self.snapshot.committed_at.timestamp() * 1000
        return round(max(0.0, committed_ms - source_ms) / 1000, 3)

    @property
    def snapshot_id(self) -> int | None:
        return self.snapshot.snapshot_id if self.snapshot is not None else None

    def metadata(self) -> dict[str, Any]:
        """Dagster metadata: what the run did and which Iceberg snapshot it made."""
        data: dict[str, Any] = {
            "table": self.identifier,
            "committed": self.committed,
            "rows": self.rows,
            "inserts": self.inserts,
            "updates": self.updates,
            "deletes": self.deletes,
            "snapshot_rows": self.snapshot_rows,
            "asserted_deletes": self.asserted_deletes,
            "records_read": self.records_read,
            "consumed_position": self.consumed_pos if self.consumed_pos is not None else -1,
            "consumed_gtid": self.consumed_gtid or "",
            "schema_changed": self.schema_changed,
            "commit_attempts": self.attempts,
            "duration_seconds": round(self.duration_seconds, 3),
            "write": "append" if self.appended else "merge",
            "written_by": "spark" if self.spark else "pyarrow",
        }
        if self.newest_source_ms is not None:
            data["newest_source_commit"] = _iso(self.newest_source_ms)
        if self.oldest_source_ms is not None:
            data["oldest_source_commit"] = _iso(self.oldest_source_ms)
        if self.lag_seconds is not None:
            data["lag_seconds"] = self.lag_seconds
        if self.wait_seconds is not None:
            data["wait_seconds"] = self.wait_seconds
        if self.snapshot is not None:
            data.update(self.snapshot.metadata())
        return data


def materialise(
    spark: SparkSession | Callable[[], SparkSession],
    landing_url: str,
    warehouse_url: str,
    server_name: str,
    schema_hint: TableSchema | None,
    database: str,
    table: str,
    catalog: Any = None,
    s3: S3Settings | None = None,
    spark_free: bool = True,
    changelog: TableChangelog | None = None,
) -> MergeResult:
    """Fold the table's new changelog records into its Iceberg table, as one snapshot.

    Idempotent: with no new committed records it changes nothing. A crash before the commit
    leaves the table as it was. A writer that loses the commit race to another runs again
    from the new snapshot, up to ``COMMIT_ATTEMPTS`` times, then raises
    ConcurrentCommitError. ``catalog``: ``config.CatalogSettings`` (default: Hadoop on the
    warehouse). ``s3``: the config's ``s3`` options, for a landing zone at an S3 URL.

    Without Spark where it applies (``lake.arrow_merge``: the batch folded and matched by
    pyarrow, written by pyiceberg; an append into an empty target), else by Spark's MERGE;
    ``spark_free=False``: always Spark. So ``spark`` may be a function that returns the
    session: it is called only when Spark is needed. ``changelog``: the table's changelog as
    the caller opened it (the applier's, with its pass's ``survey`` of the landing zone).
    """
    started = time.monotonic()
    if changelog is None:
        changelog = TableChangelog.open(landing_url, server_name, database, table, s3=s3)
    target: LakeTable | None = None

    def without_spark() -> Merged | None:
        if not spark_free:
            return None
        return materialise_without_spark(changelog, warehouse_url, catalog, server_name, s3,
                                         schema_hint)

    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        try:
            merged = without_spark()
            if merged is None and target is None:
                session = spark if isinstance(spark, SparkSession) else spark()
                target = LakeTable(Lake(session, warehouse_url, catalog), server_name, database,
                                   table)
                if not isinstance(spark, SparkSession):
                    # (getting the session may have waited seconds for its start: the
                    # applier's, in the background; a snapshot that landed meanwhile into
                    # the empty target is still an append without Spark)
                    merged = without_spark()
            if merged is not None:
                return _merged_result(changelog, merged, started, attempt)
            # Writers of one table in this process (and, on a local Hadoop-catalog warehouse,
            # in other processes) take turns from the mark read to the publication, so they
            # do not keep invalidating each other; the commit itself stays a compare-and-swap.
            with target.writing():
                return _materialise_once(target.spark, changelog, target, schema_hint,
                                         started, attempt)
        except ConcurrentCommitError:
            if attempt == COMMIT_ATTEMPTS:
                raise
            log.warning("%s: lost the commit race (attempt %d); running again from the new "
                        "snapshot", changelog.table_id, attempt)
    raise AssertionError("unreachable")


def _merged_result(changelog: TableChangelog, merged: Merged, started: float,
                   attempt: int) -> MergeResult:
    """The ``MergeResult`` of a materialisation without Spark."""
    result = MergeResult(
        table_id=changelog.table_id,
        identifier=merged.identifier,
        snapshot=merged.snapshot,
        committed=merged.committed,
        rows=merged.snapshot.rows,
        inserts=merged.inserts,
        updates=merged.updates,
        deletes=merged.deletes,
        records_read=merged.records,
        consumed_pos=merged.consumed_pos,
        consumed_gtid=merged.consumed_gtid,
        duration_seconds=time.monotonic() - started,
        schema_changed=False,
        snapshot_rows=merged.snapshot_rows,
        asserted_deletes=merged.asserted,
        attempts=attempt,
        newest_source_ms=merged.newest_ms,
        oldest_source_ms=merged.oldest_ms,
        appended=merged.appended,
        spark=False,
        snapshot_count=merged.snapshot_count,
    )
    if merged.committed:
        log.info("materialised %s", result)
    return result


def _materialise_once(
    spark: SparkSession,
    changelog: TableChangelog,
    target: LakeTable,
    schema_hint: TableSchema | None,
    started: float,
    attempt: int,
) -> MergeResult:
    """One pass, one way: the table's mark, the changelog after it, the table prepared for
    the batch's schema, the fold, the MERGE."""
    base, marked = target.base_and_mark()
    after_pos = marked.consumed_pos if marked is not None else None
    checkpoint = changelog.checkpoint()

    # Renames below the checkpoint's next_pos are covered: a schema from the landing zone
    # reflects them, so a table created from it follows them all.
    before_pos = checkpoint.next_pos if checkpoint is not None else 1
    renames = changelog.column_renames(before_pos) if checkpoint is not None else []

    def unchanged() -> MergeResult:
        dropped = False
        if base is None:
            target.ensure_created(_fallback_schema(changelog, schema_hint), before_pos - 1)
        elif checkpoint is not None:
            dropped = _drop_columns_dropped_at_source(changelog, target, renames, before_pos)
        return _result(target, started, attempt, schema_changed=dropped)

    if checkpoint is None:
        return unchanged()
    gtid = checkpoint.gtid
    if after_pos is not None and after_pos >= before_pos:
        raise RuntimeError(
            f"target {target.table_id} already consumed the changelog up to position {after_pos}, "
            f"but the checkpoint's next_pos is {before_pos}: the landing zone was reset or belongs "
            f"to another source. Rebuild the target: DROP TABLE {target.identifier}, then "
            "materialise it again"
        )
    plan = changelog.plan(after_pos, before_pos, renames)
    if plan is None:
        return unchanged()
    newest = plan.newest
    batch = changelog.frame(spark, plan, after_pos, before_pos, snapshot_columns=True)
    base, schema_changed = prepare(target, newest, renames, base=base, through=before_pos - 1,
                                   consumed_pos=after_pos)

    # Not persisted: building Spark's cache of a folded batch costs several times computing
    # it (1M snapshot rows: 5.8 s against 0.7 s), and each use below computes it again from
    # the same segments (unconsumed ones are never compacted or deleted: retention).
    folded, sorted_rows, counts = fold(
        batch, newest, arrow_counts(changelog, plan, after_pos, before_pos))
    if counts["records"] == 0:  # segments overlapped the range but held no record in it
        return unchanged()
    unknown = counts["total"] - sum(counts[op] for op in ROW_OPS) - counts["instructions"]
    if unknown:
        raise ValueError(
            f"changelog of {target.table_id} has {unknown} records with an __cdc_op outside "
            f"{ROW_OPS + INSTRUCTION_OPS} before position {before_pos}, or {INSTRUCTION_OPS} "
            f"records in segments without the {THRESHOLD}... columns; the segments were not "
            "written by a compatible capture engine"
        )
    rows_folded = folded.where(~col(INSTRUCTION)) if INSTRUCTION in folded.columns else folded
    rows_folded = rows_folded.select(*[col(c) for c in newest.column_names], col(POS), col(OP))
    source = rows_folded
    asserted = 0
    victims = None
    # Into a table with no rows (an initial load) the batch is an append: nothing to
    # match, and the writer skips the MERGE's join and its delete files.
    appended = base.rows == 0
    live_keys = sum(counts[op] for op in ROW_OPS if op != DELETE)
    if counts["instructions"] and appended:
        # An empty table has no rows to judge: the batch's own keys are the candidates, each
        # its own newest record, so the verdicts filter the append in its one scan (counting
        # tombstones first was a job over the whole batch: 5.5 s of a 23 s 1M-row load).
        kept = not_asserted_away(target.table_id, batch, newest)
        if kept is not None:
            source = rows_folded.where(kept)
    elif counts["instructions"]:
        state = target.read(snapshot_id=base.snapshot_id, with_position=True,
                            current_schema=True)  # (evolved)
        victims = tombstones(target.table_id, batch, rows_folded, state, newest)
    if victims is not None:
        victims = victims.persist(StorageLevel.MEMORY_AND_DISK)
        asserted = victims.count()
        if asserted:
            source = fold_latest(rows_folded.unionByName(victims), list(newest.primary_key))
    consumed_pos = int(counts["max_pos"])
    properties = {CONSUMED_POS: str(consumed_pos), CONSUMED_GTID: gtid or ""}
    view = f"cdc_merge_source_{uuid.uuid4().hex}"
    source.createOrReplaceTempView(view)
    statement = (partial(append_statement, rebalance=sorted_rows) if appended
                 else merge_statement)
    try:
        snapshot = commit_merge(
            target, base, lambda name: statement(name, view, newest), properties)
    finally:
        spark.catalog.dropTempView(view)
        if victims is not None:
            victims.unpersist()
    if appended:  # (the keys the verdicts kept out of the append)
        asserted = live_keys - (snapshot.rows - base.rows)
    schema_changed = _drop_columns_dropped_at_source(changelog, target, renames,
                                                     before_pos) or schema_changed

    result = MergeResult(
        table_id=target.table_id,
        identifier=target.identifier,
        snapshot=snapshot,
        committed=True,
        rows=snapshot.rows,
        # (into an empty table every row written is new, whatever the batch's first op of
        # its key: a chunk row or an update; and nothing was there to delete)
        inserts=counts["inserted"] + (counts["updated"] if appended else 0),
        updates=0 if appended else counts["updated"],
        deletes=0 if appended else counts["deleted"] + asserted,
        records_read=counts["records"],
        consumed_pos=consumed_pos,
        consumed_gtid=gtid,
        duration_seconds=time.monotonic() - started,
        schema_changed=schema_changed,
        snapshot_rows=counts[SNAPSHOT_ROW],
        asserted_deletes=asserted,
        attempts=attempt,
        newest_source_ms=counts["newest_ms"] or None,
        oldest_source_ms=counts["oldest_ms"] or None,
        appended=appended,
    )
    log.info("materialised %s", result)
    return result


def merge_statement(target: str, source: str, schema: TableSchema) -> str:
    """The MERGE applying a folded batch (one record per key, ``__cdc_op`` and ``__cdc_pos``).

    Keys match NULL-safely (surrogate keys may have NULL parts). A record older than the row
    it matches is ignored, so replaying a batch from an older mark changes nothing.
    """
    keys = list(schema.primary_key)
    on = " AND ".join(f"t.{quote(k)} <=> s.{quote(k)}" for k in keys)
    columns = [*schema.column_names, POS]
    assign = ", ".join(f"t.{quote(c)} = s.{quote(c)}" for c in columns)
    names = ", ".join(quote(c) for c in columns)
    values = ", ".join(f"s.{quote(c)}" for c in columns)
    newer = f"s.{quote(POS)} > t.{quote(POS)}"
    return (
        f"MERGE INTO {target} t USING {quote(source)} s ON {on} "
        f"WHEN MATCHED AND s.{quote(OP)} = '{DELETE}' AND {newer} THEN DELETE "
        f"WHEN MATCHED AND {newer} THEN UPDATE SET {assign} "
        f"WHEN NOT MATCHED AND s.{quote(OP)} <> '{DELETE}' THEN INSERT ({names}) VALUES ({values})"
    )


def append_statement(target: str, source: str, schema: TableSchema,
                     rebalance: bool = True) -> str:
    """The INSERT applying a folded batch to a table that had no rows: every key's newest
    record that is not a delete becomes a row (what the MERGE does into an empty table).

    ``rebalance`` when the rows went through the fold's shuffle: adaptive execution then sizes
    the files as the MERGE's are (one for a small batch) instead of one per shuffle partition.
    Rows that skipped the fold (each key once: an initial load) are still in the segments'
    file splits, already few and large; a REBALANCE there only shuffles them once more (a
    1M-row initial append: 6.9 s with it, 5.4 s without, the same two files)."""
    columns = [*schema.column_names, POS]
    names = ", ".join(quote(c) for c in columns)
    hint = "/*+ REBALANCE */ " if rebalance else ""
    return (f"INSERT INTO {target} ({names}) SELECT {hint}{names} FROM "
            f"{quote(source)} WHERE {quote(OP)} <> '{DELETE}'")


def _iso(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="milliseconds")


def _drop_columns_dropped_at_source(changelog: TableChangelog, target: LakeTable,
                                    records: Sequence[ColumnRenames], before_pos: int) -> bool:
    """Drop the target's columns that a covered column record (``capture.ddl.column_renames``;
    ``records``: those below ``before_pos``) says the source dropped, when no segment of the
    table holds records between that record and the checkpoint (``before_pos``): the source's
    schema there is the one after the DROP. Needed where no row of the table changed after the
    DROP (a batch's ``evolve`` follows its newest segment, which then predates the DROP); a
    segment after the record decides instead (``evolve``: the column is gone from it, or was
    added again). Returns whether it dropped.
    """
    drops = [r for r in records if r.dropped]
    if not drops:
        return False
    current = {f.name.lower(): f.name for f in target.user_struct().fields}
    gone: set[str] = set()
    for record in drops:
        columns = [current[c.lower()] for c in record.dropped if c.lower() in current]
        if columns and not changelog.segments(record.position, before_pos):
            gone.update(columns)
    if gone:
        drop_columns(target, sorted(gone))
    return bool(gone)


def _fallback_schema(changelog: TableChangelog, schema_hint: TableSchema | None
                     ) -> TableSchema:
    """The schema to create an empty target from, for a table with no changelog yet."""
    schema = schema_hint if schema_hint is not None else changelog.recorded_schema()
    if schema is None:
        raise LookupError(
            f"{changelog.table_id} has no changelog yet and no schema to create an empty target "
            "from: pass schema_hint, or let the capture engine record it in tables.json first"
        )
    return schema


def _result(target: LakeTable, started: float, attempt: int,
            schema_changed: bool = False) -> MergeResult:
    """A run that committed no snapshot: the table as it is (its schema may have changed)."""
    snapshot, marked = target.base_and_mark()
    return MergeResult(
        table_id=target.table_id,
        identifier=target.identifier,
        snapshot=snapshot,
        committed=False,
        rows=snapshot.rows if snapshot is not None else 0,
        inserts=0,
        updates=0,
        deletes=0,
        records_read=0,
        consumed_pos=marked.consumed_pos if marked is not None else None,
        consumed_gtid=marked.consumed_gtid if marked is not None else None,
        duration_seconds=time.monotonic() - started,
        schema_changed=schema_changed,
        attempts=attempt,
    )
