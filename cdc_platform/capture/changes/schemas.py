"""The engine's schema of every captured table, and how the binlog's table ids map to them.

The engine learns a table's columns two ways: from the table maps that come before its rows
(the binlog's schema where the engine is), and from the source's ``information_schema`` (after
a DDL no row event followed yet, for a table a snapshot session opens on, at start). The latest
wins; a changed schema is written with the next checkpoint (``take_changed``), so the lake
evolves its target before it reads rows of the new shape.

A table id names one table map's definition until a rotate or a DDL of the table: after those,
the ids are forgotten and the next table map builds the table's ``TableState`` again.
"""

from __future__ import annotations

import logging
from typing import Any

from cdc_platform.capture import names
from cdc_platform.capture.changes.row_images import TableState
from cdc_platform.capture.events import EngineError, Rows, TableMap
from cdc_platform.capture.schema import TableSchema
from cdc_platform.capture.source import SourceSession


class SchemaTracker:
    """Schemas by table id (``db.table``) and row decoding state by binlog table id."""

    def __init__(self, source: SourceSession, schemas: dict[str, TableSchema],
                 log: Any | None = None) -> None:
        self.source = source
        self.selector = source.selector
        self.schemas = schemas
        self.log = log or logging.getLogger(__name__)
        self._changed = False
        self._by_id: dict[int, TableState] = {}

    def state_of(self, event: Rows, gtid: str) -> TableState:
        """The decoding state of a rows event's table map; EngineError when none came before
        it (``gtid`` names the transaction): the stream is inconsistent."""
        state = self._by_id.get(event.table_id)
        if state is None:
            raise EngineError(
                f"table {event.database}.{event.table} at GTID {gtid}: a rows event without "
                "its table map; the binlog stream is inconsistent: restart the engine (it "
                "resumes from its checkpoint)")
        return state

    def on_table_map(self, event: TableMap, gtid: str) -> TableSchema | None:
        """Note a table map's schema (shaped as it lands); returns it when the engine had no
        schema of the table at all (first seen by its rows), else None."""
        if event.table_id in self._by_id:
            return None
        full = event.schema
        kept_keys = self.selector.excluded_columns_of(
            full.database, full.table, full.column_names) & set(full.primary_key)
        if kept_keys:
            self.log.warning(f"table {full.table_id}: key column(s) {sorted(kept_keys)} match "
                             "capture.excluded_columns but are captured: a target needs its key")
        schema = self.selector.shape(full)
        if not schema.primary_key:
            self.log.warning(f"table {schema.table_id} has no primary key: its changes are "
                             "landed but target tables need a key; add one, or set "
                             "capture.surrogate_keys for it")
        previous = self.schemas.get(schema.table_id)
        if previous is not None and (previous.columns != schema.columns
                                     or previous.primary_key != schema.primary_key):
            added = [c for c in schema.column_names if c not in previous.column_names]
            dropped = [c for c in previous.column_names if c not in schema.column_names]
            self.log.info(f"table {schema.table_id}: schema changed at GTID {gtid or '?'} "
                          f"(added {added or 'none'}, dropped {dropped or 'none'})")
        self._note(schema)
        self._by_id[event.table_id] = TableState.of(full, schema)
        return schema if previous is None else None

    def learn(self, database: str, table: str) -> TableSchema | None:
        """Read the table's current schema from the source (shaped as it lands) and make it
        the engine's schema of the table; None when the table does not exist. A later table
        map (the binlog's schema where the engine is then) replaces it.

        Table maps only come with row events: this is how the engine knows a table after a DDL
        that no row event followed (yet), or a table created since it started (both cases
        chunks of a snapshot are decided against).

        The schema read may be newer than the engine's position (DDL the engine has not
        processed yet). That is safe for chunk decisions: a chunk that reflects a later DDL
        has that DDL's GTID in its ``after``, so it can only commit once the engine processed
        the DDL, which restarts the table's snapshot session (the chunk is never decided); a
        chunk read before the DDL does not match the newer schema and is rejected, then read
        again. A schema the engine has not reached can only cause rejections, never a commit
        against the wrong columns. A broken connection is retried once on a new one
        (``SourceSession.run``), then raised.
        """
        schema = self.source.read_schema(database, table)
        if schema is not None:
            self._note(schema)
        return schema

    def learn_table(self, table_id: str) -> TableSchema | None:
        """``learn`` by table id: the snapshot coordinator's way to the source schema."""
        return self.learn(*names.split_table_id(table_id))

    def learn_all(self) -> list[tuple[str, str]]:
        """Read the schema of every captured table again (DDL may have gone unseen: a gap in
        the binlog); returns the captured tables the source has."""
        listed = self.source.list_tables()
        for database, table in listed:
            self.learn(database, table)
        return listed

    def learn_captured(self) -> list[tuple[str, str]]:
        """Note the schema of every captured table the engine has none of, so empty tables
        get a target too; returns the captured tables the source has."""
        listed = self.source.list_tables()
        for database, table in listed:
            if names.table_id(database, table) not in self.schemas:
                self.learn(database, table)
        return listed

    def forget_uncaptured(self) -> list[str]:
        """Drop the recorded schemas of tables the capture filters no longer name (written
        with the next checkpoint), saying so; returns their ids. The record then says which tables the
        changelog follows: one captured again later is "not in the record", and gets its
        history snapshot, since the changes made while it was not captured never landed."""
        dropped = sorted(t for t, s in self.schemas.items()
                         if not self.selector.captures(s.database, s.table))
        for table_id in dropped:
            del self.schemas[table_id]
        self._changed |= bool(dropped)
        if dropped:
            self.log.info(f"{len(dropped)} recorded table(s) no longer captured "
                          f"(capture.tables): {', '.join(dropped)}; captured again later, each "
                          "is snapshotted (capture.snapshot_mode)")
        return dropped

    def forget_ids(self, table_id: str | None = None) -> None:
        """Forget the table ids of one table (its definition changed), or of all (a rotate,
        a gap in the binlog): the next table map of each is decoded afresh."""
        if table_id is None:
            self._by_id.clear()
        else:
            self._by_id = {k: v for k, v in self._by_id.items()
                           if v.schema.table_id != table_id}

    def take_changed(self) -> dict[str, TableSchema] | None:
        """Every schema, when one changed since the last call (for the next checkpoint's
        landing); else None."""
        if not self._changed:
            return None
        self._changed = False
        return dict(self.schemas)

    def _note(self, schema: TableSchema) -> None:
        if self.schemas.get(schema.table_id) != schema:
            self.schemas[schema.table_id] = schema
            self._changed = True
