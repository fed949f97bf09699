"""What the engine does at a statement outside row events, and when the binlog it needs is gone.

A statement's effects are recorded durably by ``effects.statement_effects`` (markers, the
column record); here the engine's own knowledge follows: a CREATE or RENAME withdraws history
markers of the names it brought, the changed tables' table ids are forgotten and their
schemas read again (no row event may follow for a while, and chunks of a new snapshot session
are compared with the new schema). Which snapshot sessions restart is the caller's: it gets
the tables back.
"""

from __future__ import annotations

from typing import Any

import pymysql

from cdc_platform.capture import names
from cdc_platform.capture.changes.schemas import SchemaTracker
from cdc_platform.capture.changes.transactions import Statement
from cdc_platform.capture.ddl.effects import StatementEffects, statement_effects
from cdc_platform.capture.ddl.history import HistoryMarkers
from cdc_platform.capture.landing.zone import LandingZone


class DdlTracking:
    """The engine's reaction to DDL and other statements of one source."""

    def __init__(self, landing: LandingZone, tracker: SchemaTracker, history: HistoryMarkers,
                 log: Any) -> None:
        self.landing = landing
        self.tracker = tracker
        self.history = history
        self.log = log

    def on_statement(self, statement: Statement, position: int, open_gtid: str
                     ) -> StatementEffects | None:
        """Record the statement's effects (``position``: the engine's next changelog
        position, which a column record takes) and learn the changed tables again; returns
        the effects when it changed captured tables, else None."""
        effects = statement_effects(statement.text, statement.database, statement.gtid,
                                    position, self.landing, self.tracker.selector,
                                    self.tracker.schemas)
        if effects is None:
            return None
        if effects.verb in ("CREATE", "RENAME", "ALTER") and effects.tables:
            self.history.tables_arrived(statement.text, statement.database, effects.verb,
                                        open_gtid)
        for note in effects.notes:
            self.log.info(note)
        if not effects.tables:
            return None
        for marker in effects.markers:
            self.log.warning(marker.describe())
        if effects.renames is not None:
            self.log.info(effects.renames.describe())
        gtid = statement.gtid or "?"
        for database, table in effects.tables:
            table_id = names.table_id(database, table)
            self.log.info(f"table {table_id}: {effects.verb} at GTID {gtid} (tracked, not "
                          "replicated; the new columns arrive with the next rows)")
            # Table ids of the old definition are stale from here on.
            self.tracker.forget_ids(table_id)
            try:
                self.tracker.learn(database, table)
            except pymysql.MySQLError as error:
                self.log.warning(f"table {table_id}: schema not read after the {effects.verb} "
                                 f"at GTID {gtid} ({error}); the engine reads it again when a "
                                 "snapshot session of the table opens")
        return effects
