"""One lake table: create it, read it (now or at a snapshot), walk its snapshots to the
consumed mark, and the exclusive right to commit to it.

Every target table is an Iceberg v2 table, merge-on-read (row-level changes write position
delete files, so a batch costs what the batch touches, not the table's size). Everything else in
the platform names a table by (server, database, table) and goes through ``Lake`` and
``LakeTable``; every target records its source's real names as table properties
(``cdc.source-*``).

What is done to a table is a function of its own module that takes a ``LakeTable``: committing
(``commit.commit_merge``), schema evolution (``schema.prepare``, ``schema.evolve``,
``schema.drop_columns``) and maintenance (``maintenance.maintain``,
``maintenance.remove_orphans``). This module imports none of them: they call the table, never
the other way round.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from cdc_platform.capture.landing.records import POS
from cdc_platform.capture.names import table_id
from cdc_platform.capture.schema import TableSchema
from cdc_platform.lake.columns import user_struct
from cdc_platform.lake.iceberg.catalog import namespace_name, quote, sql_string, table_name
from cdc_platform.lake.iceberg.lake import Lake
from cdc_platform.lake.iceberg.locks import spark_commits, table_lock
from cdc_platform.lake.iceberg.properties import (
    PRIMARY_KEY_PROPERTY,
    RENAMED_THROUGH_PROPERTY,
    TABLE_PROPERTIES,
    source_properties,
    target_comment,
    target_properties,
)
from cdc_platform.lake.iceberg.snapshots import Snapshot, mark_of, snapshot_from_java


class LakeTable:
    """One target table: its names and properties, create and drop, its snapshots, and reads
    (now or at a snapshot)."""

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

    def source_properties(self) -> dict[str, str]:
        """The table properties that name the source table by its real names."""
        return source_properties(self.server_name, self.database, self.table)

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
        sharing a local Hadoop-catalog warehouse (see ``Lake.lock_dir``); and the process's
        turn for Spark commits (``locks.spark_commits``)."""
        with spark_commits(), table_lock(self.lake.lock_dir, self.namespace, self.name):
            yield

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
        comment = target_comment(self.server_name, self.database, self.table)
        self.lake.sql(
            f"CREATE TABLE IF NOT EXISTS {self.identifier} ({columns}, {quote(POS)} bigint) "
            f"USING iceberg COMMENT '{sql_string(comment)}' TBLPROPERTIES ({properties})")

    def ensure_created(self, schema: TableSchema, renamed_through: int) -> None:
        """Create the table with an empty first snapshot (so every later commit has a base to
        be compared with), recording the primary key it folds by and the newest column rename
        its columns follow (``renamed_through``: ``schema`` has the names after it).
        Idempotent: it also completes a creation that crashed before the first snapshot."""
        with self.writing():
            if not self.exists():
                self.create(schema, target_properties(self.server_name, self.database,
                                                      self.table, schema.primary_key,
                                                      renamed_through))
            if self.current() is None:
                empty = self.spark.createDataFrame([], self.spark.table(self.identifier).schema)
                empty.writeTo(self.identifier).append()

    def property(self, key: str) -> str | None:
        """A table property's value, or None when the table does not have it."""
        value = self.java_table().properties().get(key)
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

    def drop(self) -> None:
        self.lake.sql(f"DROP TABLE IF EXISTS {self.identifier} PURGE")

    # -- snapshots ----------------------------------------------------------------------------

    def java_table(self) -> Any:
        """The table's Iceberg ``Table`` object in the driver JVM, freshly loaded (metadata
        reads through it need no Spark job)."""
        jvm = self.spark.sparkContext._jvm
        return jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
            self.spark._jsparkSession, self.identifier)

    def snapshot_of(self, java_snapshot: Any) -> Snapshot:
        """The platform's view of one of the table's Java snapshots."""
        return snapshot_from_java(self.spark.sparkContext._jvm, java_snapshot)

    def snapshots(self) -> list[Snapshot]:
        """Every snapshot the table's metadata keeps (any branch), oldest first."""
        if not self.exists():
            return []
        found = [self.snapshot_of(s) for s in self.java_table().snapshots()]
        return sorted(found, key=lambda s: s.committed_at)

    def snapshot_count(self) -> int:
        """How many snapshots the table's metadata keeps (one call: no snapshot is read)."""
        return int(self.java_table().snapshots().size()) if self.exists() else 0

    def snapshot_times(self) -> list[datetime]:
        """When each kept snapshot was committed, oldest first (a call per snapshot, no
        summary read)."""
        if not self.exists():
            return []
        return sorted(datetime.fromtimestamp(s.timestampMillis() / 1000, UTC)
                      for s in self.java_table().snapshots())

    def current(self) -> Snapshot | None:
        """The main branch's current snapshot, or None (no table, or no commit yet)."""
        chain = self.history(limit=1)
        return chain[0] if chain else None

    def history(self, limit: int | None = None) -> list[Snapshot]:
        """The main branch's ancestry, newest first (``limit``: at most that many)."""
        return list(self.ancestry(limit))

    def ancestry(self, limit: int | None = None) -> Iterator[Snapshot]:
        """The main branch's ancestry, newest first, read as iterated (``history``'s list is
        the whole of it)."""
        if not self.exists():
            return
        table = self.java_table()
        java_snapshot = table.currentSnapshot()
        count = 0
        while java_snapshot is not None and (limit is None or count < limit):
            yield self.snapshot_of(java_snapshot)
            count += 1
            parent = java_snapshot.parentId()
            java_snapshot = table.snapshot(parent) if parent is not None else None

    def base_and_mark(self) -> tuple[Snapshot | None, Snapshot | None]:
        """Main's current snapshot and the newest snapshot of its ancestry with a consumed
        mark (walking back only as far as needed)."""
        base = None
        for snapshot in self.ancestry():
            base = base or snapshot
            if mark_of([snapshot]) is not None:
                return base, snapshot
        return base, None

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
