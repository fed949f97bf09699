"""What a statement in the binlog may do to captured tables (pure): the one classifier of the
statements a transaction buffer hands the engine (everything but transaction control).

With ``binlog_format=ROW`` every row change reaches the binlog as row events, except what a
statement does by itself: table DDL (``capture.ddl.parse``), a row change logged as SQL
(``capture.ddl.statement_dml``), a dropped database. Most other statements change no row of
any table (GRANT, CREATE VIEW, CREATE INDEX, ...). A statement this module cannot place must
never pass silently: it is :class:`Unclassified`, and the engine marks the captured tables it
may touch stale (docs/landing-zone.md, "Stale-target markers"), so that their targets are
re-snapshotted rather than silently wrong.

Every parser here reads the statement the server ran (``ddl.statement_tokens``): executable
comments are read as the server reads them and ``SET STATEMENT ... FOR`` prefixes removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cdc_platform.capture.ddl.parse import (
    TableDdl,
    Token,
    parse_table_ddl,
    statement_tokens,
    word_of,
)
from cdc_platform.capture.ddl.statement_dml import StatementDml, parse_statement_dml

TableName = tuple[str, str]

# First words of statements that change no row of any table.
_NO_ROWS = frozenset({
    "GRANT", "REVOKE", "FLUSH", "ANALYZE", "OPTIMIZE", "INSTALL", "UNINSTALL", "DO", "USE",
    "SET", "SHOW", "CHECK", "CHECKSUM", "CACHE", "HELP", "EXPLAIN", "DESCRIBE", "DESC",
    "HANDLER", "LOCK", "UNLOCK", "BACKUP", "KILL", "RESET", "PURGE", "SIGNAL", "RESIGNAL",
    "SELECT", "VALUES", "TABLE", "BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE",
    "START", "STOP", "XA", "DEALLOCATE", "PREPARE", "BINLOG", "SHUTDOWN", "CLONE",
    "LOAD",  # LOAD INDEX INTO CACHE (LOAD DATA and LOAD XML are row changes: statement_dml)
})
# First words of statements that may change rows of the tables they name, and no other's.
_NAMED_TABLES_ONLY = frozenset({"REPAIR"})  # REPAIR TABLE may drop rows it cannot read
# Kinds of object whose CREATE / ALTER / DROP changes no row of any table.
_NO_ROW_OBJECTS = frozenset({
    "VIEW", "TRIGGER", "PROCEDURE", "FUNCTION", "EVENT", "USER", "ROLE", "SERVER", "INDEX",
    "TABLESPACE", "LOGFILE", "RESOURCE", "SPATIAL", "PACKAGE", "INSTANCE", "UNDO", "SYNONYM",
})
# Objects that hold rows under a table's name (MariaDB sequences are tables).
_TABLE_LIKE_OBJECTS = frozenset({"SEQUENCE"})
_DATABASE_OBJECTS = frozenset({"DATABASE", "SCHEMA"})
# How far after the verb the object kind is looked for (CREATE OR REPLACE ALGORITHM=MERGE
# DEFINER=`u`@`h` SQL SECURITY INVOKER VIEW ...).
_OBJECT_SEARCH = 16


@dataclass(frozen=True)
class DatabaseDrop:
    """``DROP DATABASE d`` or ``CREATE OR REPLACE DATABASE d``: every table of ``d`` is gone,
    without a DROP TABLE of its own in the binlog."""

    database: str
    verb: str  # DROP DATABASE | CREATE OR REPLACE DATABASE
    query: str = field(default="", compare=False)


@dataclass(frozen=True)
class Unclassified:
    """A statement the platform cannot tell changes no rows. ``names``: every ``(database,
    name)`` it mentions that may be a table (unqualified names in the default database);
    ``wide``: when it names no captured table, it may still touch every table of the
    databases it names (``databases``), since what it does is unknown."""

    verb: str
    names: tuple[TableName, ...]
    databases: tuple[str, ...]
    wide: bool = True
    reason: str = "a statement the platform cannot classify may have changed rows"
    query: str = field(default="", compare=False)


Classified = TableDdl | StatementDml | DatabaseDrop | Unclassified


def classify_statement(query: str, default_db: str) -> Classified | None:
    """What ``query`` (run with default database ``default_db``) may do to tables' rows:
    table DDL, a row change logged as SQL, a dropped database, or :class:`Unclassified`;
    None for a statement known to change no row."""
    ddl = parse_table_ddl(query, default_db)
    if ddl is not None:
        return ddl
    dml = parse_statement_dml(query, default_db)
    if dml is not None:
        return dml
    tokens = statement_tokens(query)
    verb = word_of(tokens[0]) if tokens else None
    if verb is None:
        return None if not tokens else _unclassified(query, tokens, default_db, "?")
    if verb in ("CREATE", "ALTER", "DROP"):
        return _object_statement(query, tokens, verb, default_db)
    if verb == "RENAME" and word_of(tokens[1] if len(tokens) > 1 else None) == "USER":
        return None
    if verb in _NO_ROWS:
        return None
    return _unclassified(query, tokens, default_db, verb, wide=verb not in _NAMED_TABLES_ONLY)


def _object_statement(query: str, tokens: list[Token], verb: str,
                      default_db: str) -> Classified | None:
    """CREATE / ALTER / DROP of something other than a table (a table's is ``TableDdl``)."""
    head = [word_of(t) for t in tokens[1:_OBJECT_SEARCH]]
    kind = next((w for w in head if w in _NO_ROW_OBJECTS | _TABLE_LIKE_OBJECTS
                 | _DATABASE_OBJECTS), None)
    if kind in _DATABASE_OBJECTS:
        replaced = verb == "CREATE" and "REPLACE" in head[:head.index(kind)]
        if verb == "DROP" or replaced:
            database = _name_after(tokens, 1 + head.index(kind) + 1)
            if database is not None:
                what = "DROP DATABASE" if verb == "DROP" else "CREATE OR REPLACE DATABASE"
                return DatabaseDrop(database, what, query)
        return None  # CREATE DATABASE, ALTER DATABASE: no table's rows
    if kind == "INDEX" and verb == "DROP" and any(
            t == ("name", "PRIMARY") or word_of(t) == "PRIMARY" for t in tokens[2:6]):
        # DROP INDEX `PRIMARY` ON t: the key the target's rows are keyed by is gone.
        return _unclassified(query, tokens, default_db, "DROP INDEX", wide=False,
                             reason="primary key dropped: target rows are keyed by the old key")
    if kind in _NO_ROW_OBJECTS:
        return None
    if kind in _TABLE_LIKE_OBJECTS:
        if verb == "CREATE" and "REPLACE" not in head[:head.index(kind)]:
            return None  # a new object: no rows before it
        return _unclassified(query, tokens, default_db, f"{verb} {kind}", wide=False,
                             reason=f"{verb} {kind} changed a table-like object's rows")
    return _unclassified(query, tokens, default_db, verb)


def _name_after(tokens: list[Token], at: int) -> str | None:
    """The identifier at ``at``, past ``IF [NOT] EXISTS``."""
    while word_of(tokens[at] if at < len(tokens) else None) in ("IF", "NOT", "EXISTS"):
        at += 1
    if at < len(tokens) and tokens[at][0] in ("word", "name"):
        return tokens[at][1]
    return None


def _unclassified(query: str, tokens: list[Token], default_db: str, verb: str,
                  wide: bool = True, reason: str | None = None) -> Unclassified:
    names: list[TableName] = []
    databases = [default_db] if default_db else []
    at = 0
    while at < len(tokens):
        kind, text = tokens[at]
        if kind in ("word", "name"):
            if (at + 2 < len(tokens) and tokens[at + 1] == ("punct", ".")
                    and tokens[at + 2][0] in ("word", "name")):
                names.append((text, tokens[at + 2][1]))
                databases.append(text)
                at += 3
                continue
            if default_db:
                names.append((default_db, text))
        at += 1
    if reason is None:
        reason = (f"{verb} statement, which the platform cannot classify, may have changed rows "
                  "without row events")
    return Unclassified(verb, tuple(dict.fromkeys(names)), tuple(dict.fromkeys(databases)),
                        wide, reason, query)
