"""Which DDL leaves a captured table's target stale, and why (pure, from the statement).

The binlog carries a DDL as its text, without row events. Most DDL changes no row value
(an index, a table option, a nullable column without a default), but some change rows or
values of every row: TRUNCATE, RENAME TABLE, DROP/EXCHANGE/TRUNCATE/REORGANIZE/COALESCE
PARTITION, ADD COLUMN with a default (explicit, implicit through NOT NULL, generated,
AUTO_INCREMENT), CHANGE/MODIFY COLUMN (a type change rewrites values), CONVERT TO
CHARACTER SET, a primary-key change. A target folded from the changelog would keep the old rows
or values silently. So the engine writes a **marker** per table such a DDL makes stale, in the
landing zone, before its checkpoint moves past the DDL; Dagster shows the markers (target
metadata, the ``not_stale`` asset check) and re-snapshots the table (``capture.resnapshot_on_ddl``).
A marker is resolved by a snapshot of the whole table that opened after the DDL
(``capture.ddl.stale_markers``).

A RENAME COLUMN changes no value: the engine records it (``capture.ddl.column_renames``) and the
lake renames the column, so it marks nothing (unless the old name was excluded from capture).
A CHANGE to a new name keeps its marker (its new definition may rewrite values; the old one is
not in the binlog) and is recorded as a rename too.

Deciding from the statement text is conservative: a clause this module does not know counts as
changing rows (a needless re-snapshot costs time; a missed one leaves the target wrong).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from cdc_platform.capture import names
from cdc_platform.capture.ddl.column_renames import renamed_columns
from cdc_platform.capture.ddl.parse import (
    TableDdl,
    Token,
    alter_clauses,
    dropped_column,
    name_at,
    parse_table_ddl,
    split_top_level,
    statement_tokens,
    token_at,
    word_of,
)
from cdc_platform.capture.ddl.statements import DatabaseDrop, Unclassified
from cdc_platform.capture.schema import TableSchema

TableName = tuple[str, str]
ColumnCaptured = Callable[[str, str, str], bool]

# ALTER TABLE clauses (by their first word) that change no row and no value.
_SAFE_OPTIONS = frozenset({
    "ALGORITHM", "LOCK", "FORCE", "ENABLE", "DISABLE", "ORDER", "DEFAULT", "CHARACTER",
    "CHARSET", "COLLATE", "AUTO_INCREMENT", "AVG_ROW_LENGTH", "CHECKSUM", "TABLE_CHECKSUM",
    "COMMENT", "COMPRESSION", "CONNECTION", "DATA", "INDEX", "DELAY_KEY_WRITE", "ENCRYPTED",
    "ENCRYPTION", "ENCRYPTION_KEY_ID", "IETF_QUOTES", "INSERT_METHOD", "KEY_BLOCK_SIZE",
    "MAX_ROWS", "MIN_ROWS", "PACK_KEYS", "PAGE_CHECKSUM", "PAGE_COMPRESSED",
    "PAGE_COMPRESSION_LEVEL", "PASSWORD", "ROW_FORMAT", "STATS_AUTO_RECALC", "STATS_PERSISTENT",
    "STATS_SAMPLE_PAGES", "TABLESPACE", "TRANSACTIONAL", "AUTOEXTEND_SIZE", "ENGINE",
    "SECONDARY_ENGINE", "NOWAIT", "WAIT",
    # Re-partitioning moves rows between partitions without changing them.
    "PARTITION", "PARTITIONS", "REMOVE", "SUBPARTITION",
})
# <word> PARTITION ...: maintenance that keeps every row.
_SAFE_PARTITION_MAINTENANCE = frozenset({"ANALYZE", "CHECK", "OPTIMIZE", "REBUILD", "REPAIR"})
# <word> PARTITION | TABLESPACE ...: rows removed, replaced or swapped without row events.
_ROW_CHANGING_PARTITION_OPS = {
    "TRUNCATE": "TRUNCATE PARTITION removed rows",
    "EXCHANGE": "EXCHANGE PARTITION swapped rows with another table",
    "REORGANIZE": "REORGANIZE PARTITION rewrote partitions",
    "COALESCE": "COALESCE PARTITION rewrote partitions",
    "DISCARD": "DISCARD of a tablespace or partition removed rows",
    "IMPORT": "IMPORT of a tablespace or partition replaced rows",
}
_INDEX_WORDS = frozenset({"INDEX", "KEY", "FULLTEXT", "SPATIAL", "UNIQUE", "FOREIGN", "CHECK",
                          "VECTOR", "CONSTRAINT"})
_SAFE_COLUMN_ALTERATIONS = frozenset({"DEFAULT", "VISIBLE", "INVISIBLE"})
_NO_ROW_EVENTS = "without row events"


@dataclass(frozen=True)
class StaleTable:
    """A table a DDL made stale, and why. ``gone``: the source has no table under this name
    any more (dropped, or renamed away), so it cannot be re-snapshotted."""

    database: str
    table: str
    reason: str
    gone: bool = False
    # A rename's source name: rows that arrived under this name from there (see
    # ``stale_markers.record_stale_targets``: from a table not captured, they are new to capture).
    origin: TableName | None = None

    @property
    def table_id(self) -> str:
        return names.table_id(self.database, self.table)


def _column_added(definition: Sequence[Token]) -> str | None:
    """Why adding the column ``definition`` (name, type, attributes) gives older rows a value
    without row events; None when older rows read NULL, which the target already shows."""
    name = name_at(definition, 0)
    words = [word_of(t) for t in definition[1:]]
    type_word = words[0] if words else None
    if "GENERATED" in words or any(
            words[i] == "AS" and token_at(definition, i + 2) == ("punct", "(")
            for i in range(len(words))):
        return f"generated column {name} added: computed for every older row"
    if "AUTO_INCREMENT" in words or type_word == "SERIAL":
        return f"AUTO_INCREMENT column {name} added: every older row was numbered"
    for i, word in enumerate(words):
        if word == "DEFAULT" and (i + 1 >= len(words) or words[i + 1] != "NULL"):
            return f"column {name} added with a DEFAULT: every older row took it"
        if word == "NOT" and i + 1 < len(words) and words[i + 1] == "NULL":
            return f"column {name} added NOT NULL: every older row took its implicit default"
    if type_word == "TIMESTAMP" and "NULL" not in words:
        return (f"TIMESTAMP column {name} added without NULL: older rows may have taken an "
                "implicit default")
    return None


def _add_clause(spec: Sequence[Token]) -> str | None:
    position = 1
    if word_of(token_at(spec, position)) == "CONSTRAINT":
        position += 1
        if word_of(token_at(spec, position)) not in _INDEX_WORDS | {"PRIMARY"}:
            position += 1  # the constraint's name
    what = word_of(token_at(spec, position))
    if what in _INDEX_WORDS:
        return None
    if what == "PRIMARY":
        return "primary key added: target rows are keyed by the old key"
    if what == "PARTITION":
        return None  # a new, empty partition (or rows moved between partitions)
    if what in ("PERIOD", "SYSTEM"):
        return "system versioning changed (not followed by the platform)"
    if what == "COLUMN":
        position += 1
    if word_of(token_at(spec, position)) == "IF":  # IF NOT EXISTS
        position += 3
    if token_at(spec, position) == ("punct", "("):
        inner = list(spec[position + 1:])
        if inner and inner[-1] == ("punct", ")"):
            inner = inner[:-1]
        definitions = split_top_level(inner)
    else:
        definitions = [list(spec[position:])]
    reasons = [r for d in definitions if (r := _column_added(d)) is not None]
    return "; ".join(reasons) or None


def _drop_clause(spec: Sequence[Token], schema: TableSchema | None) -> str | None:
    what = word_of(token_at(spec, 1))
    if what in ("INDEX", "KEY", "FOREIGN", "CONSTRAINT", "CHECK"):
        return None
    if what == "PRIMARY":
        return "primary key dropped: target rows are keyed by the old key"
    if what == "PARTITION":
        return "DROP PARTITION removed rows"
    if what == "SYSTEM":
        return "system versioning changed (not followed by the platform)"
    column = dropped_column(spec)
    if column is None:
        return f"ALTER TABLE clause {' '.join(t[1] for t in spec[:2])!r} is not known to keep rows"
    if schema is None:
        return f"column {column} dropped from a table whose key the engine does not know"
    if column.lower() in (c.lower() for c in schema.primary_key):
        return f"key column {column} dropped: target rows are keyed by the old key"
    return None


def _alter_column_clause(spec: Sequence[Token]) -> str | None:
    what = word_of(token_at(spec, 1))
    if what in ("INDEX", "KEY", "CHECK", "CONSTRAINT"):
        return None
    position = 2 if what == "COLUMN" else 1
    if word_of(token_at(spec, position)) == "IF":
        position += 2
    column = name_at(spec, position)
    action, what = word_of(token_at(spec, position + 1)), word_of(token_at(spec, position + 2))
    if action in ("SET", "DROP") and what in _SAFE_COLUMN_ALTERATIONS:
        return None  # SET/DROP DEFAULT, SET [IN]VISIBLE: no existing value changes
    return f"column {column} altered ({' '.join(t[1] for t in spec[position + 1:])})"


def _redefinition(spec: Sequence[Token], verb: str) -> str:
    position = 2 if word_of(token_at(spec, 1)) == "COLUMN" else 1
    if word_of(token_at(spec, position)) == "IF":
        position += 2
    old = name_at(spec, position)
    if verb == "CHANGE":
        new = name_at(spec, position + 1)
        position += 1
        if new != old:
            # The old definition is not in the binlog (and the engine's schemas may already be
            # newer than this DDL), so "the same type" cannot be proven: the values may have
            # been rewritten. The rename itself is followed (capture.ddl.column_renames).
            return (f"column {old} renamed to {new} and redefined as "
                    f"{_type_text(spec[position + 1:])} (CHANGE): a type, character-set or "
                    "NULL change rewrites every value; the lake keeps the values under "
                    f"{new} until the re-snapshot (RENAME COLUMN renames without one)")
    return (f"column {old} redefined as {_type_text(spec[position + 1:])} ({verb}): a type or "
            "character-set change rewrites every value")


def _type_text(definition: Sequence[Token]) -> str:
    """The type at the start of a column definition, as written (``DATETIME(6)``)."""
    if not definition:
        return "?"
    text = definition[0][1]
    if token_at(definition, 1) == ("punct", "("):
        inner = []
        for token in definition[2:]:
            if token == ("punct", ")"):
                break
            inner.append(token[1])
        text += f"({''.join(inner)})"
    return text


def _alter_clause(spec: Sequence[Token], schema: TableSchema | None) -> str | None:
    """Why one ALTER TABLE clause changes rows or values; None when it changes none."""
    first = word_of(token_at(spec, 0))
    second = word_of(token_at(spec, 1))
    if first == "ADD":
        return _add_clause(spec)
    if first == "DROP":
        return _drop_clause(spec, schema)
    if first == "ALTER":
        return _alter_column_clause(spec)
    if first in ("MODIFY", "CHANGE"):
        return _redefinition(spec, first)
    if first == "RENAME":
        # RENAME COLUMN changes no value: the lake renames the column (capture.ddl.column_renames).
        # RENAME INDEX/KEY change no row; RENAME TO is a table rename (see stale_tables).
        return None
    if first == "CONVERT":
        if second == "TO":
            return "table converted to another character set: every text value rewritten"
        return "CONVERT between a partition and a table moved rows"
    if first in _ROW_CHANGING_PARTITION_OPS:
        return _ROW_CHANGING_PARTITION_OPS[first]
    if first in _SAFE_PARTITION_MAINTENANCE and second == "PARTITION":
        return None
    if first in ("WITH", "WITHOUT"):
        return None if second == "VALIDATION" else "system versioning changed"
    if first in _SAFE_OPTIONS:
        words = [word_of(t) for t in spec]
        if "BLACKHOLE" in words:
            return "ENGINE=BLACKHOLE discarded every row"
        if "UNION" in words:
            return "the MERGE table's UNION changed: other rows under the same name"
        return None
    return f"ALTER TABLE clause {' '.join(t[1] for t in spec[:2])!r} is not known to keep rows"


def _renamed(renames: Sequence[tuple[TableName, TableName]]
             ) -> tuple[dict[TableName, TableName], set[TableName]]:
    """After a sequence of renames: which name holds which original table's rows (only names
    whose rows changed), and which names are gone."""
    holds: dict[TableName, TableName] = {}
    existed: set[TableName] = set()  # names first seen as an old name: tables before it
    seen: set[TableName] = set()
    for old, new in renames:
        if old not in seen:
            existed.add(old)
        seen |= {old, new}
        holds[new] = holds.pop(old, old)
    changed = {name: origin for name, origin in holds.items() if origin != name}
    gone = {name for name in existed if name not in holds}
    return changed, gone


def _qualified(name: TableName) -> str:
    return names.table_id(name[0], name[1])


def _uncaptured_renames(ddl: TableDdl, column_captured: ColumnCaptured | None) -> list[str]:
    """A column excluded from capture (``capture.excluded_columns``) renamed to a captured
    name: its values in older rows never landed, so the lake cannot carry them over."""
    if column_captured is None or not ddl.tables:
        return []
    database, table = ddl.tables[0]
    return [f"column {old} (excluded from capture) renamed to {new} (captured): its values "
            "in older rows never landed"
            for old, new in renamed_columns(ddl)
            if not column_captured(database, table, old)
            and column_captured(database, table, new)]


def stale_tables(ddl: TableDdl, schemas: Mapping[str, TableSchema] | None = None,
                 column_captured: ColumnCaptured | None = None) -> list[StaleTable]:
    """The tables whose targets ``ddl`` leaves stale, with the reason (pure; conservative).

    ``schemas``: the engine's schemas from before the DDL (``db.table`` -> schema), to tell a
    dropped key column from another. ``column_captured(db, table, column)``: whether a column
    is captured, so that renaming an excluded column to a captured name marks the target (a
    plain column rename does not: the lake follows it). A plain CREATE TABLE makes nothing
    stale here: a table created again under the name of a gone one is the marker writer's case
    (:func:`record_stale_targets`).
    """
    schemas = schemas or {}
    tokens = statement_tokens(ddl.query)
    head = {word_of(t) for t in tokens[:4]}
    verb = ddl.verb
    out: dict[TableName, StaleTable] = {}

    def mark(name: TableName, reason: str, gone: bool = False,
             origin: TableName | None = None) -> None:
        if name in out:
            reason = f"{out[name].reason}; {reason}"
            origin = origin or out[name].origin
        out[name] = StaleTable(name[0], name[1], reason, gone, origin)

    if "TEMPORARY" in head:
        return []  # temporary tables are not captured
    if verb == "TRUNCATE":
        for name in ddl.tables:
            mark(name, f"TRUNCATE removed every row {_NO_ROW_EVENTS}")
    elif verb == "DROP":
        for name in ddl.tables:
            mark(name, "dropped (DROP TABLE); the source table is gone", gone=True)
    elif verb == "CREATE":
        if "REPLACE" in head:
            mark(ddl.tables[0], f"replaced by CREATE OR REPLACE TABLE {_NO_ROW_EVENTS}")
    elif verb == "RENAME":
        changed, gone = _renamed(ddl.renames)
        final = {origin: name for name, origin in changed.items()}
        for name in gone:
            where = final.get(name)
            moved = f"renamed to {_qualified(where)}" if where else "renamed away"
            mark(name, f"{moved}; the source table is gone", gone=True)
        for name, origin in changed.items():
            mark(name, f"renamed from {_qualified(origin)} (RENAME TABLE): the rows under "
                       f"this name changed {_NO_ROW_EVENTS}", origin=origin)
    elif verb == "ALTER":
        table = ddl.tables[0]
        schema = schemas.get(_qualified(table))
        reasons = []
        if "IGNORE" in head:
            reasons.append("ALTER IGNORE may delete rows")
        reasons += [r for spec in alter_clauses(tokens)
                    if (r := _alter_clause(spec, schema)) is not None]
        reasons += _uncaptured_renames(ddl, column_captured)
        renamed_to = {new for old, new in ddl.renames if old == table}
        for other in ddl.tables[1:]:
            if other in renamed_to:
                mark(other, f"renamed from {_qualified(table)} (ALTER TABLE .. RENAME): the "
                            f"rows under this name changed {_NO_ROW_EVENTS}", origin=table)
                for reason in reasons:
                    mark(other, f"ALTER TABLE {_NO_ROW_EVENTS}: {reason}")
            else:
                mark(other, f"partition exchange or conversion with {_qualified(table)} moved "
                            f"rows {_NO_ROW_EVENTS}")
        if renamed_to:
            mark(table, f"renamed to {_qualified(sorted(renamed_to)[0])}; the source table is "
                        "gone", gone=True)
        else:
            for reason in reasons:
                mark(table, f"ALTER TABLE {_NO_ROW_EVENTS}: {reason}")
    return list(out.values())


def arrived_tables(query: str, default_db: str, logged_when_present: bool = True
                   ) -> list[TableName]:
    """Tables whose rows a statement replaced wholesale: the table a CREATE TABLE created (its
    rows are all in the binlog from there on), and the names a RENAME brought another table's
    rows to (the DDL's own marker stands for those). Rows older than the changelog that were
    under such a name are gone: history markers of the name are withdrawn. Not a TEMPORARY
    table (never captured). ``logged_when_present``: the server also logs a ``CREATE TABLE IF
    NOT EXISTS`` that found the table there (with its rows), so such a statement proves
    nothing: MySQL does (documented); MariaDB logs it only when it created the table (10.11,
    every form: plain, LIKE, SELECT, any binlog_format)."""
    ddl = parse_table_ddl(query, default_db)
    if ddl is None or not ddl.tables:
        return []
    if ddl.verb in ("RENAME", "ALTER"):
        return list(_renamed(ddl.renames)[0])
    if ddl.verb != "CREATE":
        return []
    words = [word_of(t) for t in statement_tokens(query)[:8]]
    if "TEMPORARY" in words[:4] or "TABLE" not in words:
        return []
    after = words.index("TABLE") + 1
    if_not_exists = words[after:after + 3] == ["IF", "NOT", "EXISTS"]
    return [] if if_not_exists and logged_when_present else [ddl.tables[0]]


def stale_after_statement(statement: DatabaseDrop | Unclassified,
                          captured: Iterable[TableName]) -> list[StaleTable]:
    """The captured tables (of ``captured``) a statement other than table DDL leaves stale.

    A dropped database takes every table of it. An unclassified statement marks the captured
    tables it names (names compared case-insensitively, erring on marking); one that names
    none marks every captured table of the databases it names when what it does is unknown
    (``wide``): a needless re-snapshot costs time, a missed one leaves a target wrong.
    """
    captured = list(dict.fromkeys(captured))
    if isinstance(statement, DatabaseDrop):
        return [StaleTable(d, t, f"{statement.verb} {statement.database}: the source table "
                                 "is gone", gone=True)
                for d, t in captured if d.lower() == statement.database.lower()]
    by_name = {(d.lower(), t.lower()): (d, t) for d, t in captured}
    touched = [by_name[key] for d, t in statement.names
               if (key := (d.lower(), t.lower())) in by_name]
    if not touched and statement.wide:
        databases = {d.lower() for d in statement.databases}
        touched = [(d, t) for d, t in captured if d.lower() in databases]
    text = " ".join(statement.query.split())
    text = text if len(text) <= 160 else text[:160] + "..."
    return [StaleTable(d, t, f"{statement.reason} {_NO_ROW_EVENTS}: {text!r}")
            for d, t in dict.fromkeys(touched)]
