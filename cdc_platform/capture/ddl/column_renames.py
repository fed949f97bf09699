"""Column renames (and drops) of captured tables: read from ALTER TABLE, recorded in the
landing zone. The record (``ColumnRenames``) and how it renames older columns
(``column_mapping``, ``renamed_schema``) are the landing contract's, ``capture.landing.records``,
read by the lake; this module decides what an ALTER renames or drops and writes the record.

A rename changes no value, but the binlog carries it only as statement text: the segments
before it hold the column under its old name, the ones after under the new name. Read by name,
the lake would see the old column dropped and a new one added (NULL in every older row). So the
engine records each ALTER's renames of a captured table, durably, before its checkpoint passes
the DDL, and the lake (``lake.changelog``, ``lake.iceberg.schema.evolve``) renames the
older segments' columns and the Iceberg column (which keeps its field id, so its data files
keep their values).

The renames of one ALTER are **simultaneous**: every old name refers to the table before the
statement (``RENAME COLUMN a TO b, RENAME COLUMN b TO a`` swaps; ``RENAME COLUMN a TO x, RENAME
COLUMN x TO y`` is refused by the server), as MariaDB and MySQL apply them. A record takes a
changelog position of its own (the engine's next position, which it then skips): records
below it precede the rename, records above it follow it, and a checkpoint covers it when its
``next_pos`` is above it. Column names compare case-insensitively, as at the source.

The same record names the columns the ALTER **drops**: the binlog shows a drop only in the
next row event's table map, and a table no row of which changes after the DROP would keep the
column in its target with its old values. With the drop at a position, the lake drops the
column from the target once no segment of the table holds records between the drop and its
checkpoint (a later segment's schema decides otherwise: the column was added again).
Format: docs/landing-zone.md, "Column renames".
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from cdc_platform.capture.ddl.parse import (
    TableDdl,
    alter_clauses,
    dropped_column,
    name_at,
    statement_tokens,
    token_at,
    word_of,
)
from cdc_platform.capture.landing.records import ColumnRenames, Rename
from cdc_platform.capture.landing.zone import (
    LandingZone,
    column_renames_name,
    column_renames_parts,
)


def renamed_columns(ddl: TableDdl) -> tuple[Rename, ...]:
    """The column renames of an ALTER TABLE, in statement order (pure, from its text).

    ``RENAME COLUMN [IF EXISTS] a TO b`` and ``CHANGE [COLUMN] [IF EXISTS] a b <definition>``
    with ``b`` other than ``a``. An ALTER that also renames the table renames nothing here: the
    table under the new name is stale and re-snapshotted, the old name is gone
    (``capture.ddl.stale``).
    """
    if ddl.verb != "ALTER" or ddl.renames:
        return ()
    found: list[Rename] = []
    for clause in alter_clauses(statement_tokens(ddl.query)):
        first, second = word_of(token_at(clause, 0)), word_of(token_at(clause, 1))
        if first == "RENAME" and second == "COLUMN":
            position = 2
        elif first == "CHANGE":
            position = 2 if second == "COLUMN" else 1
        else:
            continue
        if word_of(token_at(clause, position)) == "IF" and (
                word_of(token_at(clause, position + 1)) == "EXISTS"):
            position += 2
        old = name_at(clause, position)
        new = name_at(clause, position + (2 if first == "RENAME" else 1))
        if "?" not in (old, new) and old != new:
            found.append((old, new))
    return tuple(found)


def dropped_columns(ddl: TableDdl) -> tuple[str, ...]:
    """The columns an ALTER TABLE drops, in statement order (pure, from its text); none when
    it also renames the table (the new name's target is re-snapshotted)."""
    if ddl.verb != "ALTER" or ddl.renames:
        return ()
    return tuple(column for clause in alter_clauses(statement_tokens(ddl.query))
                 if (column := dropped_column(clause)) is not None)


def record_column_renames(landing: LandingZone, ddl: TableDdl, gtid: str, position: int,
                          captures: Callable[[str, str], bool]) -> ColumnRenames | None:
    """Write the column renames and drops ``ddl`` makes to a captured table at ``position``,
    durably (the engine calls this before its checkpoint passes the DDL; a replay writes the
    same file again); None when it renames or drops no column of a captured table."""
    renames, dropped = renamed_columns(ddl), dropped_columns(ddl)
    if not (renames or dropped) or not ddl.tables or not captures(*ddl.tables[0]):
        return None
    database, table = ddl.tables[0]
    record = ColumnRenames(database, table, gtid, position, renames,
                           dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), dropped)
    landing.store.write_atomically(*column_renames_parts(database, table),
                                   column_renames_name(position), data=record.to_json())
    return record

