"""Committing to a lake table: one MERGE as one snapshot on main, compare-and-swap.

Commits are compare-and-swap on the table's main branch (``commit_merge``): the MERGE goes to a
private branch made at the snapshot the consumed mark was read from, and ``fast_forward``
publishes it only if main is still there. The mark travels in the same snapshot's summary
(``commit_properties``), so data and mark are one Iceberg commit.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pyspark.sql import SparkSession

from cdc_platform.lake.iceberg.catalog import quote, sql_string
from cdc_platform.lake.iceberg.snapshots import Snapshot

if TYPE_CHECKING:
    from cdc_platform.lake.iceberg.table import LakeTable

log = logging.getLogger(__name__)

BRANCH_PREFIX = "cdc_commit_"
# A private branch older than this belongs to a writer that died (a MERGE takes minutes).
STALE_BRANCH_HOURS = 6.0


class ConcurrentCommitError(RuntimeError):
    """Another writer committed to the table after this one read its mark; run again."""


def commit_merge(
    table: LakeTable,
    base: Snapshot,
    merge_sql: Callable[[str], str],
    properties: Mapping[str, str],
    prepare: Callable[[str], None] | None = None,
) -> Snapshot:
    """Run one MERGE as one snapshot on main, only if main is still at ``base``.

    ``merge_sql(target)`` returns the MERGE statement for a target identifier. The MERGE
    writes to a private branch made at ``base``; ``fast_forward`` then moves main to it,
    which Iceberg refuses when main moved since ``base`` (another writer committed): then
    ConcurrentCommitError, and nothing of this writer is visible. Every table has a first
    (empty) snapshot from its creation, so there always is a ``base``.
    """
    with table.writing():
        branch = branch_name()
        with _race_lost(table):
            table.lake.sql(f"ALTER TABLE {table.identifier} CREATE BRANCH {quote(branch)} "
                           f"AS OF VERSION {base.snapshot_id}")
        try:
            target = f"{table.identifier}.{quote('branch_' + branch)}"
            if prepare is not None:
                prepare(branch)
            with _race_lost(table):
                _with_properties(table, properties, lambda: table.lake.sql(merge_sql(target)))
            published = _branch_head(table, branch)
            with _race_lost(table):
                table.lake.sql(f"CALL {quote(table.lake.catalog)}.system.fast_forward("
                               f"table => '{sql_string(_procedure_name(table))}', "
                               f"branch => 'main', to => '{branch}')").collect()
        finally:
            try:
                drop_branch(table, branch)
            except Exception as error:  # noqa: BLE001 - the commit's outcome stands
                log.warning("%s: could not drop the private branch %s (%s); the "
                            "lake_maintenance job drops it after %s h", table.table_id,
                            branch, str(error).splitlines()[0], STALE_BRANCH_HOURS)
        # main may have moved on since (another process): report the snapshot published
        return table.snapshot_of(table.java_table().snapshot(published))


def drop_branch(table: LakeTable, branch: str) -> None:
    table.lake.sql(f"ALTER TABLE {table.identifier} DROP BRANCH IF EXISTS {quote(branch)}")


@contextlib.contextmanager
def _race_lost(table: LakeTable) -> Iterator[None]:
    """Iceberg's refusals of a commit because another writer changed the table first, as
    ConcurrentCommitError: ``fast_forward`` when main is no longer an ancestor of the
    branch, and any metadata commit (branch creation, the MERGE, the fast-forward) that
    lost the swap of the table's metadata to another process (CommitFailedException)."""
    try:
        yield
    except Exception as error:  # noqa: BLE001 - Py4J wraps Iceberg's exceptions
        text = str(error)
        if "ancestor" in text or "fast-forward" in text.lower() or \
                "CommitFailedException" in text:
            raise ConcurrentCommitError(_race_message(table)) from None
        raise


def _branch_head(table: LakeTable, branch: str) -> int:
    """The snapshot at the head of ``branch``, from the table's metadata in the driver (the
    ``refs`` metadata table is a Spark job: 0.4 s of each merge under a write load)."""
    ref = table.java_table().refs().get(branch)
    if ref is None:
        raise ConcurrentCommitError(_race_message(table))  # dropped by another writer
    return int(ref.snapshotId())


def _race_message(table: LakeTable) -> str:
    return (f"{table.table_id}: another materialisation committed to {table.identifier} "
            "first; this one's changes were not published: run it again, it continues "
            "from the new snapshot")


def _procedure_name(table: LakeTable) -> str:
    return f"{quote(table.namespace)}.{quote(table.name)}"


def _with_properties(table: LakeTable, properties: Mapping[str, str],
                     action: Callable[[], Any]) -> None:
    """Run ``action`` with ``properties`` added to the summary of the snapshot it commits
    (Iceberg's ``CommitMetadata``, thread-local in the driver JVM)."""
    with commit_properties(table.spark, properties) as run:
        run(action)


def branch_name(created: float | None = None) -> str:
    """A writer's private branch: ``cdc_commit_<unix seconds>_<uuid>``. The time lets
    maintenance tell a crashed writer's branch from one in use, whatever its base's age."""
    stamp = int(time.time() if created is None else created)
    return f"{BRANCH_PREFIX}{stamp}_{uuid.uuid4().hex}"


def branch_created(name: str) -> float | None:
    """The creation time (unix seconds) in a ``branch_name``, or None."""
    stamp = name[len(BRANCH_PREFIX):].split("_", 1)[0]
    return float(stamp) if name.startswith(BRANCH_PREFIX) and stamp.isdigit() else None


@contextlib.contextmanager
def commit_properties(spark: SparkSession, properties: Mapping[str, str]) -> Iterator[
        Callable[[Callable[[], Any]], Any]]:
    """Yield ``run(action)``: ``action`` runs with ``properties`` in the summary of every
    snapshot it commits from this thread.

    Iceberg's ``CommitMetadata.withCommitProperties`` takes a Java ``Callable``; Py4J calls
    back into Python on this same thread (PySpark's pinned threads), so the statements the
    action runs commit on the JVM thread that holds the properties.
    """
    from pyspark.java_gateway import ensure_callback_server_started

    gateway = spark.sparkContext._gateway
    ensure_callback_server_started(gateway)
    jvm = spark.sparkContext._jvm

    def run(action: Callable[[], Any]) -> Any:
        if not properties:
            return action()
        java_map = jvm.java.util.HashMap()
        for key, value in properties.items():
            java_map.put(key, value)
        callable_ = _JavaCallable(action)
        jvm.org.apache.iceberg.spark.CommitMetadata.withCommitProperties(
            java_map, callable_, jvm.java.lang.Class.forName("java.lang.RuntimeException"))
        if callable_.error is not None:
            raise callable_.error
        return callable_.result

    yield run


class _JavaCallable:
    """A Python function as a ``java.util.concurrent.Callable`` (Py4J callback)."""

    def __init__(self, action: Callable[[], Any]) -> None:
        self.action = action
        self.result: Any = None
        self.error: BaseException | None = None

    def call(self) -> None:
        try:
            self.result = self.action()
        except BaseException as error:  # noqa: BLE001 - re-raised on the caller's side
            self.error = error
        return None

    class Java:
        implements = ["java.util.concurrent.Callable"]
