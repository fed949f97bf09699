"""What a statement in the binlog does to capture, recorded before the checkpoint passes it.

A statement outside a transaction's row events (``transactions.Statement``) is classified
(``capture.ddl.statements``) and then:

* a row change logged as SQL that writes a captured table, or may, stops capture loudly
  (its rows are not in the binlog): ``EngineError`` naming the GTID, the tables and the fix;
* table DDL writes the stale-target markers of the tables whose rows it changed without row
  events (``capture.ddl.stale_markers``) and the record of the columns it renamed or dropped
  (``capture.ddl.column_renames``, at a changelog position of its own);
* a dropped database, or a statement the platform cannot classify, writes markers for the
  captured tables it may have changed;

all durably, before the engine's checkpoint passes the statement (a replay writes the same
files again). What the engine then does with its own state (snapshot sessions restarted,
schemas read again) it does with the returned :class:`StatementEffects`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from cdc_platform.capture import names
from cdc_platform.capture.ddl.column_renames import record_column_renames
from cdc_platform.capture.ddl.parse import TableDdl
from cdc_platform.capture.ddl.stale_markers import (
    record_stale_after_statement,
    record_stale_targets,
)
from cdc_platform.capture.ddl.statement_dml import StatementDml
from cdc_platform.capture.ddl.statements import Unclassified, classify_statement
from cdc_platform.capture.events import EngineError
from cdc_platform.capture.landing.records import ColumnRenames, StaleMarker
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.schema import TableSchema
from cdc_platform.capture.source import TableSelector

TableName = tuple[str, str]


@dataclass(frozen=True)
class StatementEffects:
    """What a statement changed for capture: the captured tables it changed without row
    events (their snapshot sessions restart, their schemas are read again), the markers and
    the column record written for it. ``verb`` names the statement in logs."""

    verb: str
    tables: tuple[TableName, ...] = ()
    markers: tuple[StaleMarker, ...] = ()
    renames: ColumnRenames | None = None  # (it took the changelog position given)
    notes: tuple[str, ...] = field(default=())  # for the log: what was left alone, and why


def statement_effects(text: str, database: str, gtid: str, position: int,
                      landing: LandingZone, selector: TableSelector,
                      schemas: Mapping[str, TableSchema]) -> StatementEffects | None:
    """Classify the statement ``text`` (default database ``database``, at ``gtid``) and
    record what it did to captured tables; None when it touches none. ``position`` is the
    engine's next changelog position (markers are at it; a column record takes it). Raises
    ``EngineError`` for a row change logged as SQL on a captured table."""
    statement = classify_statement(text, database)
    if statement is None:
        return None
    if isinstance(statement, StatementDml):
        _refuse_statement_dml(statement, text, gtid, selector, schemas)
        return None
    if isinstance(statement, TableDdl):
        captured = [(d, t) for d, t in statement.tables if selector.captures(d, t)]
        if not captured:
            return None
        markers = record_stale_targets(
            landing, statement, gtid or "?", position, schemas, selector.captures,
            lambda db, table, column: not selector.excluded_columns_of(db, table, [column]))
        renames = record_column_renames(landing, statement, gtid or "?", position,
                                        selector.captures)
        return StatementEffects(statement.verb, tuple(captured), tuple(markers), renames)
    captured_tables = [(s.database, s.table) for s in schemas.values()
                       if selector.captures(s.database, s.table)]
    markers = record_stale_after_statement(landing, statement, gtid or "?", position,
                                           captured_tables)
    if not markers:
        if isinstance(statement, Unclassified):
            return StatementEffects(statement.verb, notes=(
                f"GTID {gtid or '?'}: {statement.verb} statement left alone: it names no "
                "captured table nor a database holding one",))
        return None
    return StatementEffects(statement.verb, tuple((m.database, m.table) for m in markers),
                            tuple(markers))


def _refuse_statement_dml(dml: StatementDml, text: str, gtid: str, selector: TableSelector,
                          schemas: Mapping[str, TableSchema]) -> None:
    """A row change logged as a statement (binlog_format STATEMENT or MIXED, MariaDB's
    DELETE of a MEMORY table emptied by a restart) carries no rows: if it writes a captured
    table, or may (its target is unclear and it names a database holding captured tables),
    capture stops rather than skip it. Other tables' are ignored."""
    captures: Callable[[str, str], bool] = selector.captures
    touched: Iterable[TableName]
    if dml.exact:
        touched = [t for t in dml.tables if t[1] and captures(*t)]
    else:
        captured_dbs = {s.database for s in schemas.values()}
        touched = [(d, t or "?") for d, t in dml.tables if d in captured_dbs]
    if not touched:
        return
    tables = ", ".join(names.table_id(d, t) if t != "?" else f"a table of {d}"
                       for d, t in touched)
    shown = text if len(text) <= 200 else text[:200] + "..."
    raise EngineError(
        f"GTID {gtid or '?'}: {tables} changed by a statement logged as SQL "
        f"({dml.verb}: {shown!r}), not as row events, so its rows cannot be captured. "
        "Fix: set binlog_format=ROW on the replica (globally, and for sessions that set "
        "it), then re-snapshot the table(s) and move the checkpoint past this GTID (or "
        "start from a fresh landing zone with capture.initial_position)")
