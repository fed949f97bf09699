"""Column renames (and drops) of captured tables: read from ALTER TABLE, recorded in the
landing zone.

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

import dataclasses
import datetime as dt
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from cdc_platform.capture import names
from cdc_platform.capture.ddl.parse import (
    TableDdl,
    alter_clauses,
    dropped_column,
    name_at,
    statement_tokens,
    token_at,
    word_of,
)
from cdc_platform.capture.landing.zone import (
    LandingZone,
    column_renames_name,
    column_renames_parts,
)
from cdc_platform.capture.schema import TableSchema

Rename = tuple[str, str]  # (old column name, new column name) as the statement writes them


@dataclass(frozen=True)
class ColumnRenames:
    """The column renames one ALTER TABLE made to one captured table, in statement order."""

    database: str
    table: str
    gtid: str  # the DDL's GTID
    position: int  # the record's own changelog position (see the module docstring)
    renames: tuple[Rename, ...]
    recorded_at: str = ""
    # Columns the ALTER drops (as written): the lake drops them from the target once it has
    # consumed the changelog past the record, whether or not a row change followed.
    dropped: tuple[str, ...] = ()

    @property
    def table_id(self) -> str:
        return names.table_id(self.database, self.table)

    def describe(self) -> str:
        changes = [f"{old} -> {new}" for old, new in self.renames]
        changes += [f"{column} dropped" for column in self.dropped]
        return (f"table {self.table_id}: column(s) renamed or dropped at GTID {self.gtid} "
                f"(changelog position {self.position}): {', '.join(changes)}")

    def to_json(self) -> bytes:
        data = dataclasses.asdict(self)
        data["renames"] = [list(pair) for pair in self.renames]
        data["dropped"] = list(self.dropped)
        if not self.dropped:
            del data["dropped"]  # (the files of renames alone read as before)
        return json.dumps(data, indent=1).encode()

    @staticmethod
    def from_json(text: bytes | str) -> ColumnRenames:
        data = json.loads(text)
        return ColumnRenames(
            database=str(data["database"]), table=str(data["table"]), gtid=str(data["gtid"]),
            position=int(data["position"]),
            renames=tuple((str(old), str(new)) for old, new in data["renames"]),
            recorded_at=str(data.get("recorded_at", "")),
            dropped=tuple(str(column) for column in data.get("dropped", ())))


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


def column_mapping(columns: Iterable[str], records: Sequence[ColumnRenames]) -> dict[str, str]:
    """Each of ``columns`` (names before ``records``) -> its name after them, in order.

    Only columns whose name changes are in the result. Raises ValueError when two columns
    would end under one name (the renames do not belong to these columns).
    """
    current = {c: c for c in columns}  # original -> name now
    for record in records:
        by_name = {now.lower(): original for original, now in current.items()}
        moves = {by_name[old.lower()]: new for old, new in record.renames
                 if old.lower() in by_name}
        current.update(moves)
        finals = [n.lower() for n in current.values()]
        if len(set(finals)) != len(finals):
            clash = sorted({n for n in current.values() if finals.count(n.lower()) > 1})
            raise ValueError(
                f"table {record.table_id}: the column renames at GTID {record.gtid} (changelog "
                f"position {record.position}) would give several columns the name(s) {clash}; "
                "the landing zone's column renames do not match its segments")
    return {original: now for original, now in current.items() if original != now}


def renamed_schema(schema: TableSchema, records: Sequence[ColumnRenames]) -> TableSchema:
    """``schema`` (as before ``records``) with its columns and key renamed by them."""
    mapping = column_mapping(schema.column_names, records)
    if not mapping:
        return schema
    columns = tuple(dataclasses.replace(c, name=mapping.get(c.name, c.name))
                    for c in schema.columns)
    key = tuple(mapping.get(k, k) for k in schema.primary_key)
    return dataclasses.replace(schema, columns=columns, primary_key=key)


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

