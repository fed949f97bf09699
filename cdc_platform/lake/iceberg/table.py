"""One lake table: create it, read it (now or at a snapshot), walk its snapshots to the
consumed mark, and the exclusive right to commit to it.

Every target table is an Iceberg v2 table, merge-on-read (row-level changes write position
delete files, so a batch costs what the batch touches, not the table's size). Everything else in
the platform names a table by (server, database, table) and goes through ``Lake`` and
``LakeTable``; every target records its source's real names as table properties
(``cdc.source-*``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StructType,
)

from cdc_platform.capture.ddl.column_renames import ColumnRenames, column_mapping
from cdc_platform.capture.landing_contract import POS
from cdc_platform.capture.names import table_id
from cdc_platform.capture.schema import TableSchema
from cdc_platform.lake.columns import user_struct
from cdc_platform.lake.iceberg.catalog import namespace_name, quote, sql_string, table_name
from cdc_platform.lake.iceberg.snapshots import (
    CONSUMED_GTID,
    CONSUMED_POS,
    Snapshot,
    mark_of,
    snapshot_from_java,
)

if TYPE_CHECKING:
    from cdc_platform.lake.iceberg.lake import Lake

log = logging.getLogger(__name__)


# Table properties: the key the table is merged by (JSON list), and the changelog position of
# the newest column-rename record (capture.ddl.column_renames) the table's columns follow.
PRIMARY_KEY_PROPERTY = "cdc.primary-key"
RENAMED_THROUGH_PROPERTY = "cdc.renamed-through"
# The source a target reflects, by its real names (a catalog name may be a slug with a hash).
SOURCE_SERVER_PROPERTY = "cdc.source-server"
SOURCE_DATABASE_PROPERTY = "cdc.source-database"
SOURCE_TABLE_PROPERTY = "cdc.source-table"
BRANCH_PREFIX = "cdc_commit_"
# A private branch older than this belongs to a writer that died (a MERGE takes minutes).
STALE_BRANCH_HOURS = 6.0

TABLE_PROPERTIES: dict[str, str] = {
    "format-version": "2",
    "write.delete.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.merge.mode": "merge-on-read",
    "write.merge.isolation-level": "serializable",
    "write.parquet.compression-codec": "zstd",
    # Every commit writes a metadata file (a batch: about four, with its branch); keep 100.
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "100",
}


class ConcurrentCommitError(RuntimeError):
    """Another writer committed to the table after this one read its mark; run again."""


class SchemaEvolutionError(RuntimeError):
    """The source's new schema has a change Iceberg cannot make in place."""


_commit_lock = threading.RLock()  # commit properties and branch writes of one process
_held_locks = threading.local()  # table lock files this thread holds (LakeTable.writing)


class LakeTable:
    """One target table: create, evolve, read (now or at a snapshot), commit a MERGE."""

    def __init__(self, lake: Lake, server_name: str, database: str, table: str) -> None:
        self.lake = lake
        self.server_name = server_name
        self.database = database
        self.table = table
        self.namespace = namespace_name(server_name, database)
        self.name = table_name(table, lake.unicode_names)
        if self.name != table_name(table):
            self.name = self._existing_name(table_name(table))
        self.identifier = f"{quote(lake.catalog)}.{quote(self.namespace)}.{quote(self.name)}"

    def _existing_name(self, ascii_name: str) -> str:
        """The real name of a table with a Unicode name, unless its target already exists
        under the ASCII name the platform gave such tables before (kept: a target is never
        moved behind its readers' backs)."""
        def exists(name: str) -> bool:
            return bool(self.spark.catalog.tableExists(
                f"{quote(self.lake.catalog)}.{quote(self.namespace)}.{quote(name)}"))

        return ascii_name if not exists(self.name) and exists(ascii_name) else self.name

    def record_source(self) -> None:
        """Give a target made before the source properties existed its ``cdc.source-*``."""
        if self.property(SOURCE_TABLE_PROPERTY) is None:
            with self.writing():
                self._commit_metadata({}, self.source_properties())

    def source_properties(self) -> dict[str, str]:
        """The table properties that name the source table by its real names."""
        return {SOURCE_SERVER_PROPERTY: self.server_name,
                SOURCE_DATABASE_PROPERTY: self.database, SOURCE_TABLE_PROPERTY: self.table}

    @property
    def table_id(self) -> str:
        return table_id(self.database, self.table)

    @property
    def spark(self) -> SparkSession:
        return self.lake.spark

    def __repr__(self) -> str:
        return f"LakeTable({self.identifier})"

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Exclusive right to commit to this table: within the process, and across processes
        sharing a local Hadoop-catalog warehouse (see ``Lake.lock_dir``)."""
        with _commit_lock:
            if self.lake.lock_dir is None:
                yield
                return
            os.makedirs(self.lake.lock_dir, exist_ok=True)
            path = os.path.join(self.lake.lock_dir, f".{self.namespace}.{self.name}.cdc-lock")
            held = _held_locks.__dict__.setdefault("paths", set())
            if path in held:  # re-entered by this thread: flock on a new descriptor would wait
                yield
                return
            with open(path, "a") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                held.add(path)
                try:
                    yield
                finally:
                    held.discard(path)
                    fcntl.flock(handle, fcntl.LOCK_UN)

    def metadata_table(self, name: str) -> str:
        return f"{self.identifier}.{quote(name)}"

    # -- existence and schema -----------------------------------------------------------------

    def exists(self) -> bool:
        return bool(self.spark.catalog.tableExists(self.identifier))

    def user_struct(self) -> StructType:
        """The table's columns without the lake's own (``__cdc_pos``)."""
        fields = self.spark.table(self.identifier).schema.fields
        return StructType([f for f in fields if f.name != POS])

    def create(self, schema: TableSchema, properties: Mapping[str, str] | None = None) -> None:
        """Create the table (and its namespace) with the schema's columns plus ``__cdc_pos``,
        and ``properties`` besides the lake's own (in the creating commit)."""
        self.lake.sql(f"CREATE NAMESPACE IF NOT EXISTS {quote(self.lake.catalog)}."
                      f"{quote(self.namespace)}")
        columns = ", ".join(f"{quote(f.name)} {f.dataType.simpleString()}"
                            for f in user_struct(schema.columns).fields)
        properties = ", ".join(f"'{sql_string(k)}'='{sql_string(v)}'"
                               for k, v in {**TABLE_PROPERTIES, **self.source_properties(),
                                            **(properties or {})}.items())
        comment = f"cdc_platform target of {self.table_id} on {self.server_name}"
        self.lake.sql(
            f"CREATE TABLE IF NOT EXISTS {self.identifier} ({columns}, {quote(POS)} bigint) "
            f"USING iceberg COMMENT '{sql_string(comment)}' TBLPROPERTIES ({properties})")

    def property(self, key: str) -> str | None:
        """A table property's value, or None when the table does not have it."""
        value = self._java_table().properties().get(key)
        return str(value) if value is not None else None

    def primary_key(self) -> list[str] | None:
        """The key the table is merged by (``cdc.primary-key``), or None when not recorded."""
        recorded = self.property(PRIMARY_KEY_PROPERTY)
        return json.loads(recorded) if recorded else None

    def renamed_through(self) -> int | None:
        """The position of the newest column-rename record the columns follow, or None
        (a table made before renames were followed)."""
        value = self.property(RENAMED_THROUGH_PROPERTY)
        return int(value) if value not in (None, "") else None

    def _commit_metadata(self, renames: Mapping[str, str], properties: Mapping[str, str]
                         ) -> None:
        """Rename columns (``old -> new``, simultaneously: a swap is one entry each way) and
        set table properties in ONE Iceberg metadata commit, through the table's Java API
        (Spark SQL renames one column per commit, so a swap or a crash between a rename and
        the property that says it is done could not be told apart afterwards). Iceberg keeps
        each column's field id, so data files keep its values; older snapshots keep the old
        name (time travel)."""
        transaction = self._java_table().newTransaction()
        if renames:
            update = transaction.updateSchema()
            for old, new in renames.items():
                update = update.renameColumn(old, new)
            update.commit()
        if properties:
            update = transaction.updateProperties()
            for key, value in properties.items():
                update = update.set(key, value)
            update.commit()
        transaction.commitTransaction()

    def evolve(self, schema: TableSchema, renames: Sequence[ColumnRenames] = ()) -> bool:
        """Bring the table's columns to ``schema``'s through Iceberg schema evolution.

        First the column renames after ``cdc.renamed-through`` (``renames``, in changelog
        order): one metadata commit renames the Iceberg columns, so their values stay, and
        moves ``cdc.renamed-through`` and the key property (a renamed key column is the same
        key). Then, by name: new columns are added in source order, dropped columns dropped,
        types widened where Iceberg can (int to bigint, float to double, decimal precision up
        at the same scale). Everything is checked before the first commit: returns whether
        anything changed; SchemaEvolutionError names a type change Iceberg cannot make, or
        renames that do not fit the table, and then nothing changed.
        """
        fields = self.user_struct().fields
        mapping = self._rename_mapping([f.name for f in fields], renames) if renames else {}
        current = {mapping.get(f.name, f.name): f.dataType for f in fields}
        wanted = user_struct(schema.columns).fields
        names = {f.name for f in wanted}
        statements = []
        for f in wanted:
            old = current.get(f.name)
            if old is not None and old != f.dataType:
                if not _widens(old, f.dataType):
                    raise SchemaEvolutionError(
                        f"{self.table_id}: column {f.name!r} changed from "
                        f"{old.simpleString()} to {f.dataType.simpleString()}, which Iceberg "
                        f"cannot change in place; re-snapshot the table: drop the target "
                        f"(DROP TABLE {self.identifier}) and send an execute-snapshot "
                        "signal for it (or let capture.resnapshot_on_ddl request one)")
                statements.append(f"ALTER TABLE {self.identifier} ALTER COLUMN {quote(f.name)} "
                                  f"TYPE {f.dataType.simpleString()}")
        previous = None
        for f in wanted:
            if f.name not in current:
                where = f"AFTER {quote(previous)}" if previous else "FIRST"
                statements.append(f"ALTER TABLE {self.identifier} ADD COLUMN {quote(f.name)} "
                                  f"{f.dataType.simpleString()} {where}")
            previous = f.name
        for name in current:
            if name not in names:
                statements.append(f"ALTER TABLE {self.identifier} DROP COLUMN {quote(name)}")
        with self.writing():
            if renames:
                self._rename(mapping, renames)
            for statement in statements:
                self.lake.sql(statement)
        return bool(mapping) or bool(statements)

    def drop_columns(self, columns: Sequence[str]) -> None:
        """Drop columns the source dropped (Iceberg keeps their values in older snapshots)."""
        with self.writing():
            for column in columns:
                self.lake.sql(f"ALTER TABLE {self.identifier} DROP COLUMN {quote(column)}")

    def _rename_mapping(self, columns: list[str], records: Sequence[ColumnRenames]
                        ) -> dict[str, str]:
        """The table's columns -> their names after ``records`` (only those that change). A
        rename of a column the table does not have (excluded from capture) changes nothing."""
        try:
            return column_mapping(columns, records)
        except ValueError as error:
            raise SchemaEvolutionError(
                f"{error} ({self.identifier} has columns {columns}); rebuild the target: DROP "
                f"TABLE {self.identifier}, then send an execute-snapshot signal for it"
            ) from None

    def _rename(self, mapping: Mapping[str, str], records: Sequence[ColumnRenames]) -> None:
        """Rename the columns and record ``records`` as followed, in one metadata commit."""
        properties = {RENAMED_THROUGH_PROPERTY: str(max(r.position for r in records))}
        key = self.primary_key()
        if key is not None:
            properties[PRIMARY_KEY_PROPERTY] = json.dumps([mapping.get(k, k) for k in key])
        self._commit_metadata(mapping, properties)
        for record in records:
            log.info("%s: %s", self.identifier, record.describe())

    def drop(self) -> None:
        self.lake.sql(f"DROP TABLE IF EXISTS {self.identifier} PURGE")

    # -- snapshots ----------------------------------------------------------------------------

    def _java_table(self) -> Any:
        """The table's Iceberg ``Table`` object in the driver JVM, freshly loaded (metadata
        reads through it need no Spark job)."""
        jvm = self.spark.sparkContext._jvm
        return jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
            self.spark._jsparkSession, self.identifier)

    def _snapshot(self, java_snapshot: Any) -> Snapshot:
        return snapshot_from_java(self.spark.sparkContext._jvm, java_snapshot)

    def snapshots(self) -> list[Snapshot]:
        """Every snapshot the table's metadata keeps (any branch), oldest first."""
        if not self.exists():
            return []
        found = [self._snapshot(s) for s in self._java_table().snapshots()]
        return sorted(found, key=lambda s: s.committed_at)

    def snapshot_count(self) -> int:
        """How many snapshots the table's metadata keeps (one call: no snapshot is read)."""
        return int(self._java_table().snapshots().size()) if self.exists() else 0

    def snapshot_times(self) -> list[datetime]:
        """When each kept snapshot was committed, oldest first (a call per snapshot, no
        summary read)."""
        if not self.exists():
            return []
        return sorted(datetime.fromtimestamp(s.timestampMillis() / 1000, UTC)
                      for s in self._java_table().snapshots())

    def current(self) -> Snapshot | None:
        """The main branch's current snapshot, or None (no table, or no commit yet)."""
        chain = self.history(limit=1)
        return chain[0] if chain else None

    def history(self, limit: int | None = None) -> list[Snapshot]:
        """The main branch's ancestry, newest first (``limit``: at most that many)."""
        return list(self._ancestry(limit))

    def _ancestry(self, limit: int | None = None) -> Iterator[Snapshot]:
        if not self.exists():
            return
        table = self._java_table()
        java_snapshot = table.currentSnapshot()
        count = 0
        while java_snapshot is not None and (limit is None or count < limit):
            yield self._snapshot(java_snapshot)
            count += 1
            parent = java_snapshot.parentId()
            java_snapshot = table.snapshot(parent) if parent is not None else None

    def base_and_mark(self) -> tuple[Snapshot | None, Snapshot | None]:
        """Main's current snapshot and the newest snapshot of its ancestry with a consumed
        mark (walking back only as far as needed)."""
        base = None
        for snapshot in self._ancestry():
            base = base or snapshot
            if self.mark_of([snapshot]) is not None:
                return base, snapshot
        return base, None

    @staticmethod
    def mark_of(chain: list[Snapshot]) -> Snapshot | None:
        """The newest snapshot of ``chain`` (newest first) that carries a consumed mark
        (``snapshots.mark_of``)."""
        return mark_of(chain)

    # -- reading ------------------------------------------------------------------------------

    def read(self, snapshot_id: int | None = None, with_position: bool = False,
             current_schema: bool = False) -> DataFrame:
        """The table's rows (user columns; ``with_position`` adds ``__cdc_pos``), now or at a
        snapshot (time travel), with the snapshot's column names, or (``current_schema``) with
        today's: a column renamed since reads under its new name."""
        if snapshot_id is None:
            df = self.spark.read.table(self.identifier)
        elif current_schema:  # the read option: today's schema
            df = self.spark.read.option("snapshot-id", str(int(snapshot_id))).table(
                self.identifier)
        else:  # VERSION AS OF reads with the snapshot's schema
            df = self.spark.sql(f"SELECT * FROM {self.identifier} VERSION AS OF {int(snapshot_id)}")
        return df if with_position else df.drop(POS)

    # -- committing ---------------------------------------------------------------------------

    def commit_merge(
        self,
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
        with self.writing():
            branch = branch_name()
            with self._race_lost():
                self.lake.sql(f"ALTER TABLE {self.identifier} CREATE BRANCH {quote(branch)} "
                              f"AS OF VERSION {base.snapshot_id}")
            try:
                target = f"{self.identifier}.{quote('branch_' + branch)}"
                if prepare is not None:
                    prepare(branch)
                with self._race_lost():
                    self._with_properties(properties, lambda: self.lake.sql(merge_sql(target)))
                published = self._branch_head(branch)
                with self._race_lost():
                    self.lake.sql(f"CALL {quote(self.lake.catalog)}.system.fast_forward("
                                  f"table => '{sql_string(self._procedure_name())}', "
                                  f"branch => 'main', to => '{branch}')").collect()
            finally:
                try:
                    self._drop_branch(branch)
                except Exception as error:  # noqa: BLE001 - the commit's outcome stands
                    log.warning("%s: could not drop the private branch %s (%s); the "
                                "lake_maintenance job drops it after %s h", self.table_id,
                                branch, str(error).splitlines()[0], STALE_BRANCH_HOURS)
            # main may have moved on since (another process): report the snapshot published
            return self._snapshot(self._java_table().snapshot(published))

    def _drop_branch(self, branch: str) -> None:
        self.lake.sql(f"ALTER TABLE {self.identifier} DROP BRANCH IF EXISTS {quote(branch)}")

    @contextlib.contextmanager
    def _race_lost(self) -> Iterator[None]:
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
                raise ConcurrentCommitError(self._race_message()) from None
            raise

    def _branch_head(self, branch: str) -> int:
        rows = self.lake.sql(f"SELECT snapshot_id FROM {self.metadata_table('refs')} "
                             f"WHERE name = '{sql_string(branch)}'").collect()
        if not rows:
            raise ConcurrentCommitError(self._race_message())  # dropped by another writer
        return int(rows[0].snapshot_id)

    def _race_message(self) -> str:
        return (f"{self.table_id}: another materialisation committed to {self.identifier} "
                "first; this one's changes were not published: run it again, it continues "
                "from the new snapshot")

    def _procedure_name(self) -> str:
        return f"{quote(self.namespace)}.{quote(self.name)}"

    def _with_properties(self, properties: Mapping[str, str], action: Callable[[], Any]) -> None:
        """Run ``action`` with ``properties`` added to the summary of the snapshot it commits
        (Iceberg's ``CommitMetadata``, thread-local in the driver JVM)."""
        with commit_properties(self.spark, properties) as run:
            run(action)

    # -- maintenance --------------------------------------------------------------------------

    def maintain(self, older_than: datetime, retain_last: int) -> dict[str, Any]:
        """Compaction and snapshot expiry with Iceberg's own Spark actions, keeping the mark.

        In order: drop the private ``cdc_commit_*`` branches of writers that died between
        creating and dropping them (``STALE_BRANCH_HOURS``); ``rewriteDataFiles`` (the action
        behind the ``rewrite_data_files`` procedure), which rewrites every data file with a
        delete file applying to it, and small files; ``rewritePositionDeletes`` with
        ``rewrite-all`` (``rewrite_position_delete_files``), which drops the delete entries
        the compaction left dangling (so a snapshot's ``rows`` stays exact); then
        ``expireSnapshots`` older than ``older_than``, keeping the ``retain_last`` newest
        snapshots of main, and deleting the files only expired snapshots referenced.

        The actions, not the SQL procedures: only the actions take snapshot properties
        (``snapshotProperty``; the procedures ignore ``CommitMetadata``), and both rewrite
        snapshots must carry the consumed mark of the snapshot they rewrote, or expiry would
        leave main with no mark and the next materialisation would replay the whole
        changelog. Expiry also never removes the newest snapshot carrying a mark. If a
        materialisation commits while a rewrite runs, the rewrite fails (it conflicts with
        the new deletes) or lands on top with the older mark; replaying from an older mark
        is idempotent (a MERGE never lets an older record overwrite a newer row).

        Files a crashed writer wrote but never committed are not removed: that is the
        ``remove_orphan_files`` procedure, not run here (it needs an age limit longer than
        any write; docs/iceberg.md). Returns what each action did, by its output's name.
        """
        report: dict[str, Any] = {}
        base, mark = self.base_and_mark()
        if base is None:
            return report
        jvm = self.spark.sparkContext._jvm
        jspark = self.spark._jsparkSession  # type: ignore[attr-defined]
        actions = jvm.org.apache.iceberg.spark.actions.SparkActions.get(jspark)

        def table() -> Any:  # fresh metadata for each action (the catalog cache is off)
            return jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
                jspark, self.identifier)

        def marked(action: Any) -> Any:
            mark = self.mark_of(self.history())
            if mark is not None:
                for key in (CONSUMED_POS, CONSUMED_GTID):
                    action = action.snapshotProperty(key, mark.summary.get(key, ""))
            return action

        with self.writing():
            stale = self._stale_branches()
            for branch in stale:
                self._drop_branch(branch)
            report["dropped_stale_branches"] = len(stale)
            rewrite = marked(actions.rewriteDataFiles(table())).option(
                "delete-file-threshold", "1").option("min-input-files", "2").option(
                "remove-dangling-deletes", "true").execute()
            report["rewritten_data_files_count"] = rewrite.rewrittenDataFilesCount()
            report["added_data_files_count"] = rewrite.addedDataFilesCount()
            report["rewritten_bytes_count"] = rewrite.rewrittenBytesCount()
            report["failed_data_files_count"] = rewrite.failedDataFilesCount()
            deletes = marked(actions.rewritePositionDeletes(table())).option(
                "rewrite-all", "true").execute()
            report["rewritten_delete_files_count"] = deletes.rewrittenDeleteFilesCount()
            report["added_delete_files_count"] = deletes.addedDeleteFilesCount()
            before = self.snapshot_count()
            chain = self.history()
            mark = self.mark_of(chain)
            keep = max(int(retain_last), 1, chain.index(mark) + 1 if mark is not None else 1)
            expired = actions.expireSnapshots(table()).expireOlderThan(
                int(older_than.timestamp() * 1000)).retainLast(keep).execute()
        report["expired_snapshots"] = before - self.snapshot_count()
        report["deleted_data_files_count"] = expired.deletedDataFilesCount()
        report["deleted_position_delete_files_count"] = \
            expired.deletedPositionDeleteFilesCount()
        report["deleted_manifest_files_count"] = expired.deletedManifestsCount()
        report["deleted_manifest_lists_count"] = expired.deletedManifestListsCount()
        return report

    def _stale_branches(self) -> list[str]:
        """Private branches of writers that died between creating and dropping them: older
        than ``STALE_BRANCH_HOURS`` by the time in their name (by their snapshot's time for
        names without one)."""
        rows = self.lake.sql(f"SELECT name, snapshot_id FROM {self.metadata_table('refs')} "
                             f"WHERE type = 'BRANCH' AND name LIKE '{BRANCH_PREFIX}%'").collect()
        if not rows:
            return []
        by_id = {s.snapshot_id: s for s in self.snapshots()}
        now = time.time()
        stale = []
        for row in rows:
            created = branch_created(row.name)
            if created is None:
                snapshot = by_id.get(row.snapshot_id)
                created = snapshot.committed_at.timestamp() if snapshot is not None else 0.0
            if now - created > STALE_BRANCH_HOURS * 3600:
                stale.append(row.name)
        return stale


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


def _widens(old: DataType, new: DataType) -> bool:
    """Iceberg's type promotions: int to long, float to double, decimal precision up."""
    if isinstance(old, IntegerType) and isinstance(new, LongType):
        return True
    if isinstance(old, FloatType) and isinstance(new, DoubleType):
        return True
    return (isinstance(old, DecimalType) and isinstance(new, DecimalType)
            and old.scale == new.scale and new.precision > old.precision)
