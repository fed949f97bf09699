"""Schema evolution of a lake table: the source's column renames, added, dropped and widened
columns become Iceberg schema changes, which keep each column's field id (data files keep its
values; older snapshots keep the old names).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from pyspark.sql.types import (
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
)

from cdc_platform.capture.ddl.column_renames import ColumnRenames, column_mapping
from cdc_platform.capture.schema import TableSchema
from cdc_platform.lake.columns import user_struct
from cdc_platform.lake.iceberg.catalog import quote
from cdc_platform.lake.iceberg.properties import PRIMARY_KEY_PROPERTY, RENAMED_THROUGH_PROPERTY

if TYPE_CHECKING:
    from cdc_platform.lake.iceberg.table import LakeTable

log = logging.getLogger(__name__)


class SchemaEvolutionError(RuntimeError):
    """The source's new schema has a change Iceberg cannot make in place."""


def evolve(table: LakeTable, schema: TableSchema, renames: Sequence[ColumnRenames] = ()
           ) -> bool:
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
    fields = table.user_struct().fields
    mapping = _rename_mapping(table, [f.name for f in fields], renames) if renames else {}
    current = {mapping.get(f.name, f.name): f.dataType for f in fields}
    wanted = user_struct(schema.columns).fields
    names = {f.name for f in wanted}
    statements = []
    for f in wanted:
        old = current.get(f.name)
        if old is not None and old != f.dataType:
            if not _widens(old, f.dataType):
                raise SchemaEvolutionError(
                    f"{table.table_id}: column {f.name!r} changed from "
                    f"{old.simpleString()} to {f.dataType.simpleString()}, which Iceberg "
                    f"cannot change in place; re-snapshot the table: drop the target "
                    f"(DROP TABLE {table.identifier}) and send an execute-snapshot "
                    "signal for it (or let capture.resnapshot_on_ddl request one)")
            statements.append(f"ALTER TABLE {table.identifier} ALTER COLUMN {quote(f.name)} "
                              f"TYPE {f.dataType.simpleString()}")
    previous = None
    for f in wanted:
        if f.name not in current:
            where = f"AFTER {quote(previous)}" if previous else "FIRST"
            statements.append(f"ALTER TABLE {table.identifier} ADD COLUMN {quote(f.name)} "
                              f"{f.dataType.simpleString()} {where}")
        previous = f.name
    for name in current:
        if name not in names:
            statements.append(f"ALTER TABLE {table.identifier} DROP COLUMN {quote(name)}")
    with table.writing():
        if renames:
            _rename(table, mapping, renames)
        for statement in statements:
            table.lake.sql(statement)
    return bool(mapping) or bool(statements)


def drop_columns(table: LakeTable, columns: Sequence[str]) -> None:
    """Drop columns the source dropped (Iceberg keeps their values in older snapshots)."""
    with table.writing():
        for column in columns:
            table.lake.sql(f"ALTER TABLE {table.identifier} DROP COLUMN {quote(column)}")


def commit_metadata(table: LakeTable, renames: Mapping[str, str],
                    properties: Mapping[str, str]) -> None:
    """Rename columns (``old -> new``, simultaneously: a swap is one entry each way) and
    set table properties in ONE Iceberg metadata commit, through the table's Java API
    (Spark SQL renames one column per commit, so a swap or a crash between a rename and
    the property that says it is done could not be told apart afterwards). Iceberg keeps
    each column's field id, so data files keep its values; older snapshots keep the old
    name (time travel)."""
    transaction = table.java_table().newTransaction()
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


def _rename(table: LakeTable, mapping: Mapping[str, str],
            records: Sequence[ColumnRenames]) -> None:
    """Rename the columns and record ``records`` as followed, in one metadata commit."""
    properties = {RENAMED_THROUGH_PROPERTY: str(max(r.position for r in records))}
    key = table.primary_key()
    if key is not None:
        properties[PRIMARY_KEY_PROPERTY] = json.dumps([mapping.get(k, k) for k in key])
    commit_metadata(table, mapping, properties)
    for record in records:
        log.info("%s: %s", table.identifier, record.describe())


def _widens(old: DataType, new: DataType) -> bool:
    """Iceberg's type promotions: int to long, float to double, decimal precision up."""
    if isinstance(old, IntegerType) and isinstance(new, LongType):
        return True
    if isinstance(old, FloatType) and isinstance(new, DoubleType):
        return True
    return (isinstance(old, DecimalType) and isinstance(new, DecimalType)
            and old.scale == new.scale and new.precision > old.precision)
