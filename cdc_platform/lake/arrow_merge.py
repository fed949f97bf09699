"""Materialising without Spark: a batch merged into its target by pyarrow and pyiceberg.

A Spark MERGE costs about a second whatever its size (planning, jobs, the commit's branch
and fast-forward), so a hundred busy tables merged one after another were each minutes
behind. Most batches are small, and so is what they touch: this path folds the batch in
Arrow, reads only the key columns (and ``__cdc_pos``) of the data files the batch's keys may
be in, and writes what a merge-on-read MERGE writes - the new row versions as a data file,
the rows they replace or delete as a position delete file - as one snapshot carrying the
consumed mark (``iceberg.row_delta``). Into an empty target it is the initial load's append
(``lake.arrow_load``).

Same rule as the MERGE (``lake.merge``), so the same table: per key the newest record of the
batch (``fold.arrow_fold_latest``); a record not newer than the row it matches is ignored; a
delete deletes; range assertions and sweeps delete the live keys they judge
(``range_assertions``, as ``verdicts.asserted_away`` judges them), keys in the batch and in the table
alike. The mark is read from the table and the snapshot is published only if main has not
moved since (compare-and-swap); a lost race is ConcurrentCommitError, and ``materialise``
runs again from the new snapshot.

Whatever this path does not do exactly as the Spark path does, it leaves to it (``None``):
a schema the table does not have yet (evolution, renames, drops), floating-point keys,
records the Spark path refuses with its error, catalogs pyiceberg does not commit to here,
and work too large for one process's memory and time: a batch above ``MAX_BATCH_BYTES`` of
segments, or data files of more than ``MAX_SCANNED_ROWS`` rows to match its keys in.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.exceptions import NoSuchTableError, RESTError
from pyiceberg.table import Table

from cdc_platform.capture.landing.records import (
    DELETE,
    INSTRUCTION_OPS,
    OP,
    POS,
    ROW_OPS,
    SNAPSHOT_ROW,
    TS_MS,
)
from cdc_platform.capture.schema import TableSchema
from cdc_platform.config import S3Settings
from cdc_platform.lake.arrow_load import (
    Loaded,
    create_empty,
    fits,
    key_columns,
    load_into_empty,
    project,
    read_exactly,
    readable,
)
from cdc_platform.lake.changelog import TableChangelog
from cdc_platform.lake.fold import arrow_fold_latest, arrow_stats
from cdc_platform.lake.iceberg import upkeep
from cdc_platform.lake.iceberg.catalog import quote
from cdc_platform.lake.iceberg.commit import ConcurrentCommitError
from cdc_platform.lake.iceberg.hadoop import LocalHadoopCatalog
from cdc_platform.lake.iceberg.live_files import (
    FILE,
    ROW,
    UnsupportedFiles,
    key_pruning,
    key_rows,
    plan_files,
    remember_rows,
)
from cdc_platform.lake.iceberg.locks import table_lock
from cdc_platform.lake.iceberg.pyiceberg_catalog import identifier_of, lake_catalog
from cdc_platform.lake.iceberg.pyiceberg_schema import iceberg_schema
from cdc_platform.lake.iceberg.rest import LakeRestCatalog
from cdc_platform.lake.iceberg.row_delta import commit, write_position_deletes, write_rows
from cdc_platform.lake.iceberg.snapshots import (
    CONSUMED_GTID,
    CONSUMED_POS,
    Snapshot,
    live_rows,
    marked_snapshot,
    snapshot_of,
)
from cdc_platform.lake.range_assertions import intervals
from cdc_platform.lake.verdicts import asserted_away, instructions_of

log = logging.getLogger(__name__)

# A batch's keys are matched against the key columns of the data files they may be in; past
# this many rows in those files (a large table whose batch touches keys all over it) the
# Spark path merges, in parallel tasks that spill.
MAX_SCANNED_ROWS = 20_000_000
# A batch whose segments hold more than this (uncompressed) is merged by Spark, which
# spills: this path holds the batch, its fold and the rows it writes in memory.
MAX_MERGE_BATCH_BYTES = 256 << 20

_T_POS, _T_FILE, _T_ROW, _S_INDEX = "__cdc_t_pos", "__cdc_t_file", "__cdc_t_row", "__cdc_s_index"


@dataclass(frozen=True)
class Merged:
    """What a materialisation without Spark did (``lake.merge`` makes it a MergeResult)."""

    identifier: str  # the table as Spark SQL names it
    snapshot: Snapshot  # main's snapshot after it
    committed: bool
    records: int = 0
    consumed_pos: int | None = None
    consumed_gtid: str | None = None
    newest_ms: int | None = None
    oldest_ms: int | None = None
    inserts: int = 0
    updates: int = 0
    deletes: int = 0
    snapshot_rows: int = 0
    asserted: int = 0
    appended: bool = False
    snapshot_count: int | None = None  # the table's snapshots after it
    seconds: dict[str, float] = field(default_factory=dict)  # where the time went


def materialise_without_spark(changelog: TableChangelog, warehouse_url: str, catalog: Any,
                              server_name: str, s3: S3Settings | None = None,
                              schema_hint: TableSchema | None = None) -> Merged | None:
    """Fold the table's new changelog records into its target without Spark (an append into
    an empty one; an empty target for a table with no changelog yet, in ``schema_hint`` or
    the schema the engine recorded), or None when this path does not apply (module
    docstring) and nothing was done. ConcurrentCommitError: another writer committed first;
    nothing was published."""
    lake = lake_catalog(warehouse_url, catalog, s3)
    identifier = identifier_of(lake, server_name, changelog.database, changelog.table) \
        if lake is not None else None
    if lake is None or identifier is None:
        return None
    with _locked(lake, identifier), _forgotten_on_error(lake, identifier):
        started = time.monotonic()
        try:
            table: Table | None = lake.table_as_committed(identifier) if isinstance(
                lake, LakeRestCatalog) else lake.load_table(identifier)
        except NoSuchTableError:
            table = None
        except (RESTError, OSError) as error:  # (Spark's path reports the catalog's problem)
            log.warning("%s: the catalog did not answer pyiceberg (%s); merging with Spark "
                        "instead", changelog.table_id, error)
            return None
        base = table.current_snapshot() if table is not None else None
        if base is None or live_rows(base) == 0:
            loaded = load_into_empty(changelog, lake, identifier, table, server_name)
            if loaded is not None:
                return _from_loaded(loaded, time.monotonic() - started)
        if table is None or base is None:
            schema = schema_hint or changelog.recorded_schema()
            created = create_empty(changelog, lake, identifier, table, server_name, schema) \
                if schema is not None else None
            if created is None:
                return None
            current = created.current_snapshot()
            assert current is not None
            return Merged(identifier=_spark_name(lake, identifier),
                          snapshot=snapshot_of(current), committed=False,
                          snapshot_count=len(created.metadata.snapshots))
        return _merge(changelog, lake, identifier, table, started)


def _spark_name(lake: LocalHadoopCatalog | LakeRestCatalog, identifier: tuple[str, str]) -> str:
    """The target as Spark SQL names it."""
    return f"{quote(lake.name)}.{quote(identifier[0])}.{quote(identifier[1])}"


def upkeep_without_spark(warehouse_url: str, catalog: Any, server_name: str, database: str,
                         table: str, s3: S3Settings | None = None, *, compact: bool,
                         keep: int | None) -> dict[str, Any] | None:
    """Compact the target (``compact``) and expire its snapshots down to ``keep`` (None: no
    expiry) without Spark (``iceberg.upkeep``), under its commit lock. The report of what was
    done ({} when nothing was due); None when the catalog is not one this path commits to.
    A compaction the table is too large for is left out of the report (Spark's, then); a
    writer committing meanwhile leaves it to the next merge (logged)."""
    lake = lake_catalog(warehouse_url, catalog, s3)
    identifier = identifier_of(lake, server_name, database, table) if lake is not None \
        else None
    if lake is None or identifier is None:
        return None
    report: dict[str, Any] = {}
    with _locked(lake, identifier):
        try:
            target = lake.load_table(identifier)
            if compact:
                report.update(upkeep.compact(lake, target) or {})
                target = lake.load_table(identifier)
            if keep is not None:
                report.update(upkeep.expire(lake, target, keep) or {})
        except ConcurrentCommitError as error:
            log.info("%s.%s: maintenance met a concurrent commit (%s); the next merge judges "
                     "again", database, table, error)
            report["concurrent_commit"] = True
    return report


@contextlib.contextmanager
def _forgotten_on_error(lake: LocalHadoopCatalog | LakeRestCatalog,
                        identifier: tuple[str, str]) -> Iterator[None]:
    """A REST catalog's table as this process committed it is forgotten when a merge with it
    fails: the retry, or the next pass, loads it (another writer may have moved it)."""
    try:
        yield
    except BaseException:
        if isinstance(lake, LakeRestCatalog):
            lake.forget(identifier)
        raise


@contextlib.contextmanager
def _locked(lake: LocalHadoopCatalog | LakeRestCatalog, identifier: tuple[str, str]
            ) -> Iterator[None]:
    """The table's commit lock (``locks.table_lock``; across processes on a local
    warehouse, whose Java writers' rename could overwrite a version)."""
    lock_dir = str(lake.root) if isinstance(lake, LocalHadoopCatalog) else None
    with table_lock(lock_dir, *identifier):
        yield


def _from_loaded(loaded: Loaded, seconds: float) -> Merged:
    """An initial load's outcome as a merge's: every row written is new to the table."""
    return Merged(
        identifier=loaded.identifier, snapshot=loaded.snapshot, committed=True,
        records=loaded.records, consumed_pos=loaded.max_pos, consumed_gtid=loaded.gtid,
        newest_ms=loaded.newest_ms, oldest_ms=loaded.oldest_ms,
        inserts=loaded.inserted + loaded.existing, snapshot_rows=loaded.snapshot_rows,
        asserted=loaded.asserted, appended=True, seconds={"total": round(seconds, 3)})


def _merge(changelog: TableChangelog, lake: LocalHadoopCatalog | LakeRestCatalog,
           identifier: tuple[str, str], table: Table, started: float) -> Merged | None:
    base = table.current_snapshot()
    assert base is not None
    name = _spark_name(lake, identifier)
    marked = marked_snapshot(table)
    after_pos = marked.consumed_pos if marked is not None else None
    checkpoint = changelog.checkpoint()
    if not readable(checkpoint, after_pos):
        return None
    before_pos = checkpoint.next_pos
    renames = changelog.column_renames(before_pos)
    columns = {f.name.lower() for f in table.schema().fields}
    if any(c.lower() in columns for r in renames for c in r.dropped):
        return None  # (a column the source dropped: the Spark path drops it)

    def unchanged() -> Merged:
        return Merged(identifier=name, snapshot=snapshot_of(base), committed=False,
                      consumed_pos=after_pos,
                      consumed_gtid=marked.consumed_gtid if marked is not None else None)

    plan = changelog.plan(after_pos, before_pos, renames)
    if plan is None:
        return unchanged()
    schema = plan.newest
    keys = key_columns(schema)
    if keys is None:
        return None
    wanted = iceberg_schema(schema)
    if not fits(table, schema, wanted, renames, after_pos):
        return None
    if plan.bytes > MAX_MERGE_BATCH_BYTES:
        return None
    planned = time.monotonic()
    batch = read_exactly(changelog, plan, after_pos, before_pos)
    if batch is None:
        return None
    if batch.num_rows == 0:
        return unchanged()
    counts = arrow_stats(batch.select([*keys, POS, OP, TS_MS]), keys, plan.snapshot_columns)
    if counts is None:
        return None  # (floating-point keys: Spark groups them)
    if counts["total"] - sum(counts[op] for op in ROW_OPS) - counts["instructions"]:
        return None  # (ops no engine writes: the Spark path refuses them, saying why)
    is_instruction = pc.fill_null(pc.is_in(batch.column(OP), value_set=pa.array(
        INSTRUCTION_OPS)), False)
    rows = arrow_fold_latest(batch.filter(pc.invert(is_instruction)), keys)
    cut = None
    if counts["instructions"]:
        found = instructions_of(batch.filter(is_instruction), schema)
        if found is None:
            return None
        cut = intervals(found)
        if all(verdict is None for _, verdict in cut):
            cut = None
    try:
        files = plan_files(table, base, (lambda _: True) if cut is not None else key_pruning(
            table, keys[0], rows.column(keys[0])))
    except UnsupportedFiles as error:
        log.info("%s: %s: merged by Spark", changelog.table_id, error)
        return None
    if files.rows > MAX_SCANNED_ROWS:
        log.info("%s: the batch's keys may be in data files of %d rows, above the %d this "
                 "path reads: merged by Spark", changelog.table_id, files.rows,
                 MAX_SCANNED_ROWS)
        return None
    read = time.monotonic()
    changes = _changes(table, files, rows, keys, cut)
    if changes is None:
        return None
    inserts, deletes, asserted = changes
    judged = time.monotonic()
    rows_written = project(inserts, wanted)
    data_files = write_rows(table, rows_written)
    if len(data_files) == 1:  # (the next merge matches its keys without reading it)
        remember_rows(table, data_files[0], rows_written, [*keys, POS])
    added = [*data_files, *write_position_deletes(table, deletes)]
    written = time.monotonic()
    max_pos = int(counts["max_pos"])
    properties = {CONSUMED_POS: str(max_pos), CONSUMED_GTID: checkpoint.gtid or ""}
    committed = commit(lake, table, base, added, properties)
    current = committed.current_snapshot()
    assert current is not None
    appended = live_rows(base) == 0
    seconds = {"plan": planned - started, "read": read - planned, "judge": judged - read,
               "write": written - judged, "commit": time.monotonic() - written}
    log.info("%s: %d records merged without Spark: %d rows written, %d deleted (%s)",
             changelog.table_id, counts["records"], inserts.num_rows, deletes.num_rows,
             ", ".join(f"{k} {v:.3f} s" for k, v in seconds.items()))
    return Merged(
        identifier=name, snapshot=snapshot_of(current), committed=True,
        records=counts["records"], consumed_pos=max_pos, consumed_gtid=checkpoint.gtid,
        newest_ms=counts["newest_ms"] or None, oldest_ms=counts["oldest_ms"] or None,
        # (into an empty table every row written is new, and nothing was there to delete)
        inserts=counts["inserted"] + (counts["updated"] if appended else 0),
        updates=0 if appended else counts["updated"],
        deletes=0 if appended else counts["deleted"] + asserted,
        snapshot_rows=counts[SNAPSHOT_ROW], asserted=asserted, appended=appended,
        snapshot_count=len(committed.metadata.snapshots),
        seconds={k: round(v, 4) for k, v in seconds.items()})


def _changes(table: Table, files: Any, rows: pa.Table, keys: list[str], cut: Any
             ) -> tuple[pa.Table, pa.Table, int] | None:
    """The rows to write, the positions to delete (``__cdc_file``, ``__cdc_row``) and how
    many live keys the range assertions deleted; None when the table holds a key twice (the
    Spark path then does what it does).

    Each key of the batch (its newest record) meets its row in the table, if any: a record
    newer than the row deletes it, and unless it is a delete writes its new version; a record
    not newer is ignored (a replay). With range assertions and sweeps (``cut``), each key of
    the batch and of the table is judged by its newest record of either (``asserted_away``):
    a judged key that is live is deleted from the table and not written."""
    key_types = {k: rows.schema.field(k).type for k in keys}
    wanted_keys = rows.column(keys[0]).combine_chunks()
    existing = []
    for part in key_rows(table, files, [*keys, POS]):
        part = pa.table({**{k: part.column(k).cast(key_types[k]) for k in keys},
                         _T_POS: part.column(POS), _T_FILE: part.column(FILE),
                         _T_ROW: part.column(ROW)})
        if cut is None and len(keys) == 1:  # (only rows the batch can match)
            part = part.filter(pc.is_in(part.column(keys[0]), value_set=wanted_keys,
                                        skip_nulls=False))
        existing.append(part)
    state = pa.concat_tables(existing) if existing else pa.table(
        {**{k: pa.array([], key_types[k]) for k in keys}, _T_POS: pa.array([], pa.int64()),
         _T_FILE: pa.array([], pa.string()), _T_ROW: pa.array([], pa.int64())})
    files_index = pc.unique(state.column(_T_FILE)) if state.num_rows else pa.array(
        [], pa.string())
    batch_side = pa.table({**{k: rows.column(k) for k in keys},
                           _S_INDEX: pa.array(np.arange(rows.num_rows, dtype=np.int64))})
    table_side = pa.table({**{k: state.column(k) for k in keys},
                           _T_POS: state.column(_T_POS),
                           _T_FILE: pc.index_in(state.column(_T_FILE), value_set=files_index),
                           _T_ROW: state.column(_T_ROW)})
    both = pa.concat_tables([batch_side, table_side], promote_options="default")
    per_key = both.group_by(keys, use_threads=False).aggregate([
        (_S_INDEX, "max"), (_T_POS, "max"), (_T_FILE, "max"), (_T_ROW, "max"),
        (_T_ROW, "count")])
    if per_key.num_rows and pc.max(per_key.column(f"{_T_ROW}_count")).as_py() > 1:
        log.warning("%s holds a key more than once; merged by Spark", ".".join(table.name()))
        return None
    index = per_key.column(f"{_S_INDEX}_max")
    t_pos = per_key.column(f"{_T_POS}_max")
    in_batch = pc.is_valid(index)
    s_pos = pc.take(rows.column(POS), index)  # (NULL where the key is not in the batch)
    s_op = pc.take(rows.column(OP), index)
    in_table = pc.is_valid(t_pos)
    newer = pc.and_(in_batch, pc.or_(pc.invert(in_table),
                                     pc.fill_null(pc.greater(s_pos, t_pos), False)))
    asserted = 0
    gone = np.zeros(per_key.num_rows, dtype=bool)
    if cut is not None:
        # each key's newest record: the batch's when newer than the table's row, else the row
        latest_pos = pc.if_else(newer, s_pos, t_pos)
        latest_live = pc.if_else(newer, pc.not_equal(s_op, DELETE), True)
        latest = pa.table({**{k: per_key.column(k) for k in keys}, POS: latest_pos})
        order = pc.sort_indices(latest, sort_keys=[(k, "ascending", "at_start") for k in keys])
        judged = asserted_away(latest, order, latest.select(keys).take(order), cut)
        gone = judged & np.asarray(latest_live.to_numpy(zero_copy_only=False), dtype=bool)
        asserted = int(np.count_nonzero(gone))
    gone_array = pa.array(gone)
    # delete the table's row: a newer record of its key, or its key judged away
    delete = pc.and_(in_table, pc.or_(newer, gone_array))
    deleted = per_key.filter(delete)
    deletes = pa.table({FILE: pc.take(files_index, deleted.column(f"{_T_FILE}_max")),
                        ROW: deleted.column(f"{_T_ROW}_max")})
    # write the batch's record: newer than the table's row, not a delete, not judged away
    write = pc.and_(pc.and_(newer, pc.not_equal(s_op, DELETE)), pc.invert(gone_array))
    inserts = rows.take(per_key.filter(write).column(f"{_S_INDEX}_max"))
    return inserts, deletes, asserted

