"""Schema evolution of a lake table: the source's column renames, added, dropped and widened
columns become Iceberg schema changes, which keep each column's field id (data files keep its
values; older snapshots keep the old names).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import (
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StructField,
)

from cdc_platform.capture.landing.records import ColumnRenames, column_mapping
from cdc_platform.capture.schema import TableSchema
from cdc_platform.lake.columns import user_struct
from cdc_platform.lake.iceberg.properties import (
    PRIMARY_KEY_PROPERTY,
    RENAMED_THROUGH_PROPERTY,
    SOURCE_TABLE_PROPERTY,
)

if TYPE_CHECKING:
    from cdc_platform.lake.iceberg.snapshots import Snapshot
    from cdc_platform.lake.iceberg.table import LakeTable

log = logging.getLogger(__name__)


class SchemaEvolutionError(RuntimeError):
    """The source's new schema has a change Iceberg cannot make in place."""


def prepare(table: LakeTable, schema: TableSchema, renames: Sequence[ColumnRenames] = (), *,
            base: Snapshot | None, through: int, consumed_pos: int | None = None
            ) -> tuple[Snapshot, bool]:
    """Make the table ready to take a batch written in ``schema``, before anything is read
    from it: the key checked, the table created if it is not there (``base`` None) and its
    columns evolved to ``schema``'s. Returns the snapshot the batch applies to and whether
    the columns changed.

    ``renames``: the column renames the landing zone holds below the checkpoint, and
    ``through`` the newest changelog position ``schema`` reflects (a table created from it
    follows them all). Of an existing table only the renames its columns do not follow yet
    are applied (``pending_renames``; ``consumed_pos`` is its mark), and its recorded key,
    renamed by them, must be ``schema``'s.
    """
    check_key_columns(table.table_id, schema)
    if base is None:  # no table yet, or a creation that crashed before its first snapshot
        table.ensure_created(schema, through)
        changed = evolve(table, schema)  # a crashed creation may have older columns
        created = table.current()
        assert created is not None
        return created, changed
    record_source(table)
    pending = pending_renames(table, renames, consumed_pos)
    check_primary_key(table, schema, pending)
    return base, evolve(table, schema, pending)


def record_source(table: LakeTable) -> None:
    """Give a target made before the source properties existed its ``cdc.source-*``."""
    if table.property(SOURCE_TABLE_PROPERTY) is None:
        with table.writing():
            commit_metadata(table, {}, table.source_properties())


def check_key_columns(table_id: str, schema: TableSchema) -> None:
    """The changelog's schema must have a key, and capture its columns: a MERGE matches by
    it."""
    if not schema.primary_key:
        raise ValueError(
            f"changelog of {table_id} has no primary key in its metadata; configure a "
            "surrogate key for this table in the capture engine, or exclude it"
        )
    missing = [k for k in schema.primary_key if k not in schema.column_names]
    if missing:
        raise ValueError(
            f"changelog of {table_id}: primary key columns {missing} are not among its "
            "columns (were they excluded by a column filter?); key columns must be captured"
        )


def pending_renames(table: LakeTable, renames: Sequence[ColumnRenames],
                    consumed_pos: int | None) -> list[ColumnRenames]:
    """The column renames the table's columns do not follow yet: after its
    ``cdc.renamed-through`` (a table made before renames were followed: after its consumed
    mark)."""
    through = table.renamed_through()
    if through is None:
        through = consumed_pos if consumed_pos is not None else 0
    return [r for r in renames if r.position > through]


def check_primary_key(table: LakeTable, schema: TableSchema,
                      pending: Sequence[ColumnRenames]) -> None:
    """The key the table is merged by, renamed by the pending column renames (a renamed key
    column is the same key), must be the changelog's."""
    recorded = table.primary_key()
    if recorded is None:
        return
    mapping = column_mapping(recorded, pending)
    if [mapping.get(k, k) for k in recorded] != list(schema.primary_key):
        raise ValueError(
            f"the primary key of {table.table_id} changed from {recorded} to "
            f"{list(schema.primary_key)}; primary-key changes are not merged: rebuild the "
            f"target from a fresh snapshot (DROP TABLE {table.identifier}, then send an "
            "execute-snapshot signal for the table)"
        )


@dataclass(frozen=True)
class SchemaChanges:
    """Everything that brings a table's columns to the source's, staged to commit at once.

    Names after ``renames`` are the columns' new names: ``widened``, ``added`` (each with the
    column it follows, None: first) and ``dropped`` name columns as the table will have them.
    """

    renames: Mapping[str, str] = field(default_factory=dict)  # old -> new, simultaneous
    widened: Sequence[tuple[str, DataType]] = ()
    added: Sequence[tuple[str, DataType, str | None]] = ()
    dropped: Sequence[str] = ()

    def __bool__(self) -> bool:
        return bool(self.renames or self.widened or self.added or self.dropped)


def plan_changes(table_id: str, identifier: str, columns: Sequence[StructField],
                 schema: TableSchema, mapping: Mapping[str, str]) -> SchemaChanges:
    """The changes from the table's ``columns`` (renamed by ``mapping``) to ``schema``'s, by
    name: new columns added in source order, dropped columns dropped, types widened where
    Iceberg can (``_widens``). SchemaEvolutionError names a type change Iceberg cannot make,
    before anything is committed."""
    current = {mapping.get(f.name, f.name): f.dataType for f in columns}
    wanted = user_struct(schema.columns).fields
    names = {f.name for f in wanted}
    widened = []
    for f in wanted:
        old = current.get(f.name)
        if old is not None and old != f.dataType:
            if not _widens(old, f.dataType):
                raise SchemaEvolutionError(
                    f"{table_id}: column {f.name!r} changed from "
                    f"{old.simpleString()} to {f.dataType.simpleString()}, which Iceberg "
                    f"cannot change in place; re-snapshot the table: drop the target "
                    f"(DROP TABLE {identifier}) and send an execute-snapshot "
                    "signal for it (or let capture.resnapshot_on_ddl request one)")
            widened.append((f.name, f.dataType))
    added = []
    previous = None
    for f in wanted:
        if f.name not in current:
            added.append((f.name, f.dataType, previous))
        previous = f.name
    dropped = [name for name in current if name not in names]
    return SchemaChanges(dict(mapping), widened, added, dropped)


def evolve(table: LakeTable, schema: TableSchema, renames: Sequence[ColumnRenames] = ()
           ) -> bool:
    """Bring the table's columns to ``schema``'s through Iceberg schema evolution, in ONE
    metadata commit.

    The column renames after ``cdc.renamed-through`` (``renames``, in changelog order)
    rename the Iceberg columns, so their values stay, and move ``cdc.renamed-through`` and
    the key property (a renamed key column is the same key); then, by name, columns are
    added, dropped and widened (``plan_changes``). All of it, properties included, is one
    Iceberg transaction (``commit_changes``), as iceberg-python's ``UpdateSchema`` stages
    every change and commits once: a crash leaves the table wholly before or wholly after,
    and a run that dies after it never applies a rename twice (a swap twice would undo it).
    Everything is checked before the commit: returns whether a column changed;
    SchemaEvolutionError names a type change Iceberg cannot make, or renames that do not
    fit the table, and then nothing changed.
    """
    fields = table.user_struct().fields
    mapping = _rename_mapping(table, [f.name for f in fields], renames) if renames else {}
    changes = plan_changes(table.table_id, table.identifier, fields, schema, mapping)
    properties = _renamed_properties(table, mapping, renames) if renames else {}
    if changes or properties:
        with table.writing():
            commit_changes(table, changes, properties)
        for record in renames:
            log.info("%s: %s", table.identifier, record.describe())
    return bool(changes)


def drop_columns(table: LakeTable, columns: Sequence[str]) -> None:
    """Drop columns the source dropped, in one metadata commit (Iceberg keeps their values
    in older snapshots)."""
    if columns:
        with table.writing():
            commit_changes(table, SchemaChanges(dropped=list(columns)), {})


def commit_metadata(table: LakeTable, renames: Mapping[str, str],
                    properties: Mapping[str, str]) -> None:
    """Rename columns (``old -> new``, simultaneously) and set table properties in ONE
    Iceberg metadata commit (``commit_changes``)."""
    commit_changes(table, SchemaChanges(renames=dict(renames)), properties)


def commit_changes(table: LakeTable, changes: SchemaChanges,
                   properties: Mapping[str, str]) -> None:
    """Stage ``changes`` and ``properties`` in one Iceberg transaction through the table's
    Java API and commit it: ONE new metadata file, however many columns change.

    Spark SQL's ALTER TABLE commits once per statement and renames one column per commit, so
    a swap, or a crash between a rename and the property that says it is done, could not be
    told apart afterwards. Iceberg keeps each column's field id, so data files keep its
    values; older snapshots keep the old names (time travel). Iceberg's ``UpdateSchema``
    finds the columns it renames, widens, drops and places by their names before the update
    (an added column by its own name); it refuses to add a name the table still has, so
    when an added column takes the old name of a renamed one the renames are staged first,
    as an update of their own in the same transaction. Types convert as Spark's ALTER TABLE
    converts them (``SparkSchemaUtil``), added columns nullable.
    """
    transaction = table.java_table().newTransaction()
    if changes:
        before = {new: old for old, new in changes.renames.items()}
        renamed_away = set(changes.renames) - set(changes.renames.values())
        separately = any(name in renamed_away for name, _, _ in changes.added)
        update = transaction.updateSchema()
        for old, new in changes.renames.items():
            update = update.renameColumn(old, new)
        if separately:
            update.commit()
            update = transaction.updateSchema()
            before = {}
        added = {name for name, _, _ in changes.added}

        def found(name: str) -> str:  # a column as UpdateSchema finds it (see above)
            return name if name in added else before.get(name, name)

        for name, data_type in changes.widened:
            update = update.updateColumn(found(name),
                                         _iceberg_type(table, data_type).asPrimitiveType())
        for name in changes.dropped:
            update = update.deleteColumn(found(name))
        for name, data_type, after in changes.added:
            # (parent None: a top-level column, whatever characters its name holds)
            update = update.addColumn(None, name, _iceberg_type(table, data_type))
            update = update.moveFirst(name) if after is None else update.moveAfter(
                name, found(after))
        update.commit()
    if properties:
        update = transaction.updateProperties()
        for key, value in properties.items():
            update = update.set(key, value)
        update.commit()
    transaction.commitTransaction()


def _iceberg_type(table: LakeTable, data_type: DataType) -> Any:
    """The Iceberg type of a Spark type, as Iceberg's Spark catalog converts it."""
    jvm = table.spark.sparkContext._jvm
    java_type = jvm.org.apache.spark.sql.types.DataType.fromJson(data_type.json())
    return jvm.org.apache.iceberg.spark.SparkSchemaUtil.convert(java_type)


def _rename_mapping(table: LakeTable, columns: list[str], records: Sequence[ColumnRenames]
                    ) -> dict[str, str]:
    """The table's columns -> their names after ``records`` (only those that change). A
    rename of a column the table does not have (excluded from capture) changes nothing."""
    try:
        return column_mapping(columns, records)
    except ValueError as error:
        raise SchemaEvolutionError(
            f"{error} ({table.identifier} has columns {columns}); rebuild the target: DROP "
            f"TABLE {table.identifier}, then send an execute-snapshot signal for it"
        ) from None


def _renamed_properties(table: LakeTable, mapping: Mapping[str, str],
                        records: Sequence[ColumnRenames]) -> dict[str, str]:
    """The properties that record ``records`` as followed: ``cdc.renamed-through``, and the
    key (``cdc.primary-key``) under its columns' new names."""
    properties = {RENAMED_THROUGH_PROPERTY: str(max(r.position for r in records))}
    key = table.primary_key()
    if key is not None:
        properties[PRIMARY_KEY_PROPERTY] = json.dumps([mapping.get(k, k) for k in key])
    return properties


def _widens(old: DataType, new: DataType) -> bool:
    """Iceberg's type promotions: int to long, float to double, decimal precision up."""
    if isinstance(old, IntegerType) and isinstance(new, LongType):
        return True
    if isinstance(old, FloatType) and isinstance(new, DoubleType):
        return True
    return (isinstance(old, DecimalType) and isinstance(new, DecimalType)
            and old.scale == new.scale and new.precision > old.precision)
