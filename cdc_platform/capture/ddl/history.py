"""When a captured table's older rows are not in the changelog: the engine's history markers
(``capture.snapshot_mode``, docs/snapshots.md "Automatic snapshots").

Three moments tell it: the engine's start (a first start finds tables with rows; a later start
finds tables it has no record of), a table map of a table the engine has no record of and saw
no CREATE TABLE for (created without binlog, or before a purged binlog), and a CREATE TABLE or
RENAME TABLE into a captured name (its rows are in the binlog from there on: markers written
for the name are withdrawn). The markers themselves, and the purged-binlog ones the engine
writes when it repositions, are ``stale_markers``'.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pymysql

from cdc_platform.capture import names
from cdc_platform.capture import source as source_sql
from cdc_platform.capture.ddl import stale_markers
from cdc_platform.capture.ddl.stale import StaleTable, arrived_tables
from cdc_platform.capture.flavours import Flavour
from cdc_platform.capture.gtid import GtidSet
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.schema import TableSchema


class HistoryMarkers:
    """The engine's side of history markers for one source; ``arrived`` holds the tables this
    run saw created or renamed into place (never "first seen by row events")."""

    def __init__(self, landing: LandingZone, flavour: Flavour, snapshot_mode: str,
                 server_name: str, log: Any) -> None:
        self.landing = landing
        self.flavour = flavour
        self.snapshot_mode = snapshot_mode
        self.server_name = server_name
        self.log = log
        self.arrived: set[str] = set()

    def at_start(self, control: pymysql.Connection, first_start: bool, processed: GtidSet,
                 next_pos: int, schemas: Mapping[str, TableSchema], recorded: set[str],
                 listed: list[tuple[str, str]]) -> None:
        """A history marker for every captured table with a key and rows whose older rows the
        changelog lacks: on a first start, every such table; later, one the engine has no
        record of (a widened filter; also a table created while the engine was down, whose
        marker the replayed CREATE TABLE withdraws). The re-snapshot sensor launches their
        snapshots once the checkpoint contains the source's executed set read here (after the
        listing: every listed table was created before it, so by then the engine has seen the
        CREATE TABLE of each table whose whole history is in the binlog)."""
        if self.snapshot_mode == "never":
            return
        start = str(processed) or "the start of the binlog"
        tables = []
        for database, table in listed:
            table_id = names.table_id(database, table)
            schema = schemas.get(table_id)
            if (table_id in recorded and not first_start) or schema is None:
                continue
            if not schema.primary_key:
                self.log.warning(f"table {table_id}: no primary key and no capture.surrogate_keys"
                                 " entry, so its older rows are not snapshotted (and its target "
                                 "needs a key): set capture.surrogate_keys for it")
            elif has_rows(control, database, table, self.log):
                tables.append(StaleTable(database, table, (
                    f"found with rows at the engine's first start (from GTID position {start}):"
                    " rows written before are not in the changelog" if first_start else
                    "newly captured: not in the engine's record of tables (the capture filters "
                    "were widened, or it came while the engine was down): rows written before "
                    "are not in the changelog")))
        if not tables:
            return
        since = self.flavour.executed_gtid_text(control)
        verb = "INITIAL" if first_start else "CAPTURED"
        written = stale_markers.record_history(self.landing, verb, tables, "", next_pos, since)
        for marker in written:
            self.log.info(marker.describe())
        self.log.warning(
            f"capture engine {self.server_name}: {len(tables)} table(s) with rows older "
            f"than the changelog ({verb}; capture.snapshot_mode "
            f"{self.snapshot_mode}): the re-snapshot sensor snapshots them once the "
            f"engine has passed GTID position {since or '(empty)'}, unless it sees them created "
            "in the binlog first")

    def first_seen(self, schema: TableSchema, gtid: str, processed: GtidSet,
                   next_pos: int) -> None:
        """A captured table the engine first meets in a table map (``gtid``'s), with no
        record of it: unless this run saw it created, its older rows are not in the
        changelog."""
        if self.snapshot_mode == "never" or not schema.primary_key or (
                schema.table_id in self.arrived):
            return
        since = processed.add(self.flavour.parse_gtid(gtid)) if gtid else processed
        reason = (f"first seen by its row events at GTID {gtid or '?'}, with no CREATE TABLE in "
                  "the binlog the engine read: rows written before are not in the changelog")
        for marker in stale_markers.record_history(
                self.landing, "CAPTURED", [StaleTable(schema.database, schema.table, reason)],
                gtid, next_pos, str(since)):
            self.log.warning(marker.describe())

    def tables_arrived(self, query: str, database: str, verb: str, gtid: str) -> None:
        """A CREATE TABLE (its rows are in the binlog from here on) or a RENAME into a name
        (the DDL's marker stands for the rows it brought): history markers written for the
        name (found at start, before the engine reached this statement) are withdrawn."""
        # (MariaDB logs a CREATE TABLE IF NOT EXISTS only when it created the table)
        for arrived in arrived_tables(query, database,
                                      logged_when_present=self.flavour.name != "mariadb"):
            table_id = names.table_id(*arrived)
            self.arrived.add(table_id)
            for marker in stale_markers.withdraw_history(self.landing, table_id):
                self.log.info(f"table {table_id}: {verb} at GTID {gtid or '?'} in the binlog "
                              f"the engine reads: its {marker.verb} marker is withdrawn"
                              + (", no snapshot needed" if verb == "CREATE" else
                                 f" (the {verb} marker stands for its rows)"))


    def purged(self, listed: list[tuple[str, str]], schemas: Mapping[str, TableSchema],
               selector: source_sql.TableSelector, old: str, current: str,
               next_pos: int) -> None:
        """The binlog after ``old`` was purged and capture goes on from ``current``: a PURGED
        marker for every captured keyed table the source has (``listed``), and a gone one for
        each recorded table the source no longer has (dropped in the gap), written before the
        checkpoint passes the new position. Their snapshots bring every change of the gap,
        deletes included (range assertions and the end-of-snapshot sweep)."""
        present = {names.table_id(d, t) for d, t in listed}
        reason = (f"the binlog after GTID position {old} was purged before the engine read it; "
                  f"capture went on from the source's GTID position {current or '(empty)'}"
                  ": changes in between (deletes included) are not in the changelog")
        tables = [StaleTable(d, t, reason) for d, t in listed
                  if (s := schemas.get(names.table_id(d, t))) and s.primary_key]
        # (a table whose DROP the engine saw has its open gone marker already)
        known_gone = {m.table_id for m in stale_markers.read_markers(self.landing)
                      if m.gone and not m.resolved}
        tables += [StaleTable(s.database, s.table, f"{reason}; the table is gone from the "
                              "source (dropped in between)", gone=True)
                   for table_id, s in sorted(schemas.items())
                   if table_id not in present and table_id not in known_gone
                   and selector.captures(s.database, s.table)]
        for marker in stale_markers.record_history(self.landing, "PURGED", tables, "",
                                                   next_pos, current):
            self.log.warning(marker.describe())


def has_rows(control: pymysql.Connection, database: str, table: str, log: Any) -> bool:
    """Whether the table holds a row now (read-only). An empty table needs no snapshot of its
    history: rows it held when the engine's position was taken were deleted since, and those
    deletes are in the binlog the engine reads. (True when it cannot be read.)"""
    try:
        with control.cursor(pymysql.cursors.Cursor) as cur:
            cur.execute(f"SELECT 1 FROM {source_sql.quote_identifier(database)}."
                        f"{source_sql.quote_identifier(table)} LIMIT 1")
            found = cur.fetchone() is not None
        control.commit()
        return found
    except pymysql.MySQLError as error:
        log.warning(f"table {names.table_id(database, table)}: not read ({error}); "
                    "taken as holding rows")
        return True
