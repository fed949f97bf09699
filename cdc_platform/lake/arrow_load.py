"""The initial load without Spark: a batch into a target with no rows, as one pyiceberg append.

Into an empty target a materialisation is an append (``lake.merge``: nothing to match):
folding each key to its newest record, counting, judging the range assertions and sweeps,
dropping deletes and writing the rest are column operations on the segments as pyarrow reads
them (an initial load is mostly snapshot chunks, each key once: then there is nothing to
fold).
Through Spark that cost a 1M-row load 15-25 s (the per-key statistics job, the INSERT, and
the session's start); in Arrow it is about a second, so a cold applier serves an initial
load before its Spark session is up.

Same rules, same result: the segments, their renames and columns come from
``TableChangelog.plan`` / ``arrow_batch`` (as ``batch`` reads them), the verdicts of range
assertions and sweeps from ``range_assertions.intervals`` (as the MERGE's), the consumed mark
travels in the append's own snapshot summary, and the append is published only if the table
is still at the version it was read from (a local Hadoop catalog: ``iceberg.hadoop``; a REST
catalog: the service's compare-and-swap, ``iceberg.rest``; a lost race is
ConcurrentCommitError, and ``materialise`` runs again). Whatever this path does not do
exactly as the Spark path does, it leaves to the Spark path (``load_into_empty`` returns
None): a target with rows (``lake.arrow_merge``), a schema the table does not have yet,
pending column renames or drops, malformed records (the Spark path refuses them
with its error), catalogs other than a Hadoop catalog on a local warehouse or a REST catalog
whose settings ``iceberg.rest`` translates.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

import pyarrow as pa
from pyiceberg.exceptions import (
    CommitFailedException,
    NoSuchTableError,
    TableAlreadyExistsError,
)

# (imported now, with the applier: pyiceberg's writer imports pyarrow.dataset and pandas on
# first use, a second of a cold applier's initial load otherwise)
from pyiceberg.io import pyarrow as _pyiceberg_writer  # noqa: F401
from pyiceberg.schema import Schema
from pyiceberg.table import Table, Transaction

from cdc_platform.capture.landing.records import (
    CREATE,
    SNAPSHOT_ROW,
    UPDATE,
)
from cdc_platform.capture.landing.zone import Checkpoint
from cdc_platform.capture.schema import TableSchema
from cdc_platform.config import S3Settings
from cdc_platform.lake.changelog import BatchPlan, TableChangelog
from cdc_platform.lake.fold import arrow_fold_for_append
from cdc_platform.lake.iceberg import row_delta
from cdc_platform.lake.iceberg.catalog import quote
from cdc_platform.lake.iceberg.commit import ConcurrentCommitError
from cdc_platform.lake.iceberg.hadoop import LocalHadoopCatalog
from cdc_platform.lake.iceberg.properties import (
    PRIMARY_KEY_PROPERTY,
    RENAMED_THROUGH_PROPERTY,
    SOURCE_TABLE_PROPERTY,
)
from cdc_platform.lake.iceberg.pyiceberg_catalog import (
    identifier_of,
    lake_catalog,
    target_location,
)
from cdc_platform.lake.iceberg.pyiceberg_schema import (
    iceberg_schema,
    iceberg_type,
    table_properties,
)
from cdc_platform.lake.iceberg.rest import LakeRestCatalog
from cdc_platform.lake.iceberg.snapshots import (
    CONSUMED_GTID,
    CONSUMED_POS,
    Snapshot,
    live_rows,
    marked_snapshot,
    snapshot_of,
)

log = logging.getLogger(__name__)

# The append holds its batch in memory (read, judged, written at once): a batch whose
# segments hold more than this (uncompressed, as their footers say; the bench's 1M rows of
# six columns: about 70 MB, the applier then peaks near 0.7 GB) is merged by Spark, which
# spills. Memory stays bounded whatever a table's size.
MAX_BATCH_BYTES = 512 << 20

# The files an initial load is written as, at most (one per core: they are written in
# parallel, and Spark scans each in a task of its own), each of at least MIN_ROWS_PER_FILE.
WRITE_FILES = max(1, min(os.cpu_count() or 1, 8))
MIN_ROWS_PER_FILE = 100_000
TARGET_FILE_SIZE = "write.target-file-size-bytes"

@dataclass(frozen=True)
class Loaded:
    """What ``initial_load`` committed (``lake.merge`` makes it a ``MergeResult``)."""

    identifier: str
    snapshot: Snapshot
    records: int
    max_pos: int
    gtid: str | None
    newest_ms: int | None
    oldest_ms: int | None
    inserted: int  # keys whose record is a c
    existing: int  # keys whose record is a u or r (new to an empty table all the same)
    snapshot_rows: int
    asserted: int  # rows the range assertions and sweeps kept out


def load_into_empty(changelog: TableChangelog, lake: LocalHadoopCatalog | LakeRestCatalog,
                    identifier: tuple[str, str], table: Table | None, server_name: str
                    ) -> Loaded | None:
    """Append the changelog's new records to the table's empty (or missing: ``table`` None)
    target without Spark, or None when this path does not apply (see the module's docstring)
    and nothing was done. ConcurrentCommitError: another writer committed first; nothing was
    published. ``table``: the target as loaded through ``lake`` by the caller, who holds its
    lock (``lake.arrow_merge.materialise_without_spark``)."""
    started = time.monotonic()
    after_pos = None
    if table is not None:
        base = table.current_snapshot()
        if base is None or live_rows(base) != 0:
            return None
        marked = marked_snapshot(table)
        after_pos = marked.consumed_pos if marked is not None else None
    checkpoint = changelog.checkpoint()
    if not readable(checkpoint, after_pos):
        return None
    before_pos = checkpoint.next_pos
    renames = changelog.column_renames(before_pos)
    if any(r.dropped for r in renames):
        return None
    plan = changelog.plan(after_pos, before_pos, renames)
    if plan is None:
        return None
    schema = plan.newest
    if not key_columns(schema):
        return None
    wanted = iceberg_schema(schema)
    if table is not None and not fits(table, schema, wanted, renames, after_pos):
        return None
    size = plan.bytes
    if size > MAX_BATCH_BYTES:
        log.info("%s: %d MB of segments to load, above the %d MB an append without Spark "
                 "holds in memory: merged by Spark", changelog.table_id, size >> 20,
                 MAX_BATCH_BYTES >> 20)
        return None
    read = time.monotonic()
    batch = read_exactly(changelog, plan, after_pos, before_pos)
    if batch is None:
        return None
    counted = arrow_fold_for_append(batch, schema, plan.snapshot_columns, changelog.table_id)
    if counted is None:
        return None
    rows, kept, counts = counted
    data = project(rows.filter(kept), wanted)
    prepared = time.monotonic()
    properties = {CONSUMED_POS: str(counts["max_pos"]), CONSUMED_GTID: checkpoint.gtid or ""}
    try:
        if table is None:
            transaction = lake.create_table_transaction(
                identifier, wanted, location=target_location(lake, identifier),
                properties=table_properties(server_name, schema, before_pos - 1))
        else:
            transaction = table.transaction()
        _append(transaction, data, properties)
        committed = transaction.commit_transaction()
    except OSError as error:
        # (a warehouse filesystem without hard links, a full disk: Spark's path does the load,
        # or stops with its own error. Had this commit landed, its MERGE of the same records
        # would change nothing: positions.)
        log.warning("%s: appending without Spark failed (%s); merging with Spark instead",
                    changelog.table_id, error)
        return None
    except (ConcurrentCommitError, CommitFailedException, TableAlreadyExistsError) as error:
        raise ConcurrentCommitError(
            f"{changelog.table_id}: another materialisation committed to "
            f"{'.'.join(identifier)} first ({error}); this one's append was not published: "
            "run it again, it continues from the new snapshot") from None
    current = committed.current_snapshot()
    assert current is not None
    log.info("%s: %d rows appended without Spark (plan %.2f s, read and judged %.2f s, "
             "written and committed %.2f s)", changelog.table_id, data.num_rows,
             read - started, prepared - read, time.monotonic() - prepared)
    return Loaded(
        identifier=f"{quote(lake.name)}.{quote(identifier[0])}.{quote(identifier[1])}",
        snapshot=snapshot_of(current), records=counts["records"], max_pos=counts["max_pos"],
        gtid=checkpoint.gtid, newest_ms=counts["newest_ms"] or None,
        oldest_ms=counts["oldest_ms"] or None,
        inserted=counts[CREATE], existing=counts[UPDATE] + counts[SNAPSHOT_ROW],
        snapshot_rows=counts[SNAPSHOT_ROW], asserted=counts["asserted"])


def readable(checkpoint: Checkpoint | None, after_pos: int | None) -> TypeGuard[Checkpoint]:
    """Whether a batch past ``after_pos`` can be read under ``checkpoint``: there is one, and
    it is past the target's mark (a mark beyond it is the Spark path's to explain)."""
    return checkpoint is not None and (after_pos is None or after_pos < checkpoint.next_pos)


def key_columns(schema: TableSchema) -> list[str] | None:
    """The batch's key columns, or None when it has none the segments carry (Spark's path
    says what is wrong)."""
    keys = list(schema.primary_key)
    if not keys or any(k not in schema.column_names for k in keys):
        return None
    return keys


def read_exactly(changelog: TableChangelog, plan: BatchPlan, after_pos: int | None,
                 before_pos: int) -> pa.Table | None:
    """The planned batch read by pyarrow, or None (logged) when its values do not read
    exactly in Arrow: the batch is then Spark's, which reads them or refuses them saying
    why."""
    try:
        return changelog.arrow_batch(plan, after_pos, before_pos)
    except pa.ArrowException as error:
        log.info("%s: the batch does not read exactly in Arrow (%s): merged by Spark",
                 changelog.table_id, error)
        return None


def create_empty(changelog: TableChangelog, lake: LocalHadoopCatalog | LakeRestCatalog,
                 identifier: tuple[str, str], table: Table | None, server_name: str,
                 schema: TableSchema) -> Table | None:
    """An empty target for a table that has no changelog yet (``LakeTable.ensure_created``'s
    without Spark: the table, then an empty first snapshot every later commit has a base in),
    or None when the landing zone holds records or column renames for it (a batch then
    creates it, or Spark's path does). Completes a creation that stopped before its first
    snapshot. ConcurrentCommitError: another writer created it first."""
    checkpoint = changelog.checkpoint()
    if checkpoint is None or changelog.plan(None, checkpoint.next_pos) is not None or \
            changelog.column_renames(checkpoint.next_pos):
        return None
    keys = list(schema.primary_key)
    if not keys or any(k not in schema.column_names for k in keys):
        return None
    if table is None:
        try:
            lake.create_table(identifier, iceberg_schema(schema),
                              location=target_location(lake, identifier),
                              properties=table_properties(server_name, schema,
                                                          checkpoint.next_pos - 1))
        except (CommitFailedException, TableAlreadyExistsError) as error:
            raise ConcurrentCommitError(f"{changelog.table_id}: {'.'.join(identifier)} was "
                                        f"created by another writer first ({error})") from None
        table = lake.load_table(identifier)
    if table.current_snapshot() is None:
        table = row_delta.commit(lake, table, None, [], {})
    return table


def _append(transaction: Transaction, data: pa.Table, properties: dict[str, str]) -> None:
    """Append ``data`` as one file per core (``WRITE_FILES``), each written in a thread of its
    own. One file of a 1M-row load is one split for Spark: every later MERGE scans the target
    in one task on one core (0.5-1.5 s more per merge until compaction rewrites it). The file
    size is a write setting of the transaction only (set, used, removed: the table's own
    setting, when it has one, wins)."""
    parts = min(WRITE_FILES, data.num_rows // MIN_ROWS_PER_FILE)
    split = parts > 1 and TARGET_FILE_SIZE not in transaction.table_metadata.properties
    if split:
        transaction.set_properties({TARGET_FILE_SIZE: str(data.nbytes * 101 // (100 * parts))})
    transaction.append(data, snapshot_properties=properties)
    if split:
        transaction.remove_properties(TARGET_FILE_SIZE)


def fits(table: Table, schema: TableSchema, wanted: Schema, renames: Sequence[Any],
          after_pos: int | None) -> bool:
    """Whether an existing empty target takes the batch as it is: its columns are the
    batch's (no evolution), its key is the batch's, it follows every column rename, and it
    names its source (else ``schema.prepare`` has work to do first: the Spark path)."""
    properties = table.properties
    if SOURCE_TABLE_PROPERTY not in properties:
        return False
    if properties.get(PRIMARY_KEY_PROPERTY) != json.dumps(list(schema.primary_key)):
        return False
    through = properties.get(RENAMED_THROUGH_PROPERTY)
    followed = int(through) if through not in (None, "") else (after_pos or 0)
    if any(r.position > followed for r in renames):
        return False
    have = [(f.name, f.field_type) for f in table.schema().fields]
    return have == [(f.name, f.field_type) for f in wanted.fields]


def project(rows: pa.Table, schema: Schema) -> pa.Table:
    """The rows in the table's columns (user columns and ``__cdc_pos``), each checked to have
    the Iceberg type its landed Arrow type maps to (``iceberg_type``: pyiceberg then writes
    the values as they are; no cast that could change one)."""
    columns = []
    for field in schema.fields:
        column = rows.column(field.name)
        if iceberg_type(column.type) != field.field_type:
            raise TypeError(f"column {field.name!r} landed as {column.type}, which is not "
                            f"the target's {field.field_type}")
        columns.append(column)
    return pa.Table.from_arrays(columns, names=[f.name for f in schema.fields])


def target_rows(warehouse_url: str, catalog: Any, server_name: str, database: str,
                table: str, s3: S3Settings | None = None) -> int | None:
    """A target's live rows read without Spark (0: no table or no snapshot yet), or None when
    the catalog is not one this module reads (``lake_catalog``)."""
    lake = lake_catalog(warehouse_url, catalog, s3)
    identifier = identifier_of(lake, server_name, database, table) if lake is not None else None
    if lake is None or identifier is None:
        return None
    try:
        found = lake.load_table(identifier)
    except NoSuchTableError:
        return 0
    current = found.current_snapshot()
    return live_rows(current) if current is not None else 0
