"""What a snapshot run would refuse, checked before the signal sensor launches it.

An execute-snapshot the sensor accepts becomes a run; a run that then skips the table (a
surrogate key naming no column, one given for a table with a primary key, a table with no key
at all) or fails on its condition (an unknown column, a function the server lacks) was a bad
signal accepted in silence. So, for each table a signal would start, the sensor asks the same
questions the run asks, of the same source: the table's schema as the config shapes it
(``chunks.snapshot_key_problem``), and the server itself whether the condition compiles on the
table (``SELECT 1 ... WHERE (<condition>) LIMIT 0``: resolved, never executed).

When the source cannot be asked (down, a timeout), the signal is not refused: the run checks
again, and a refusal that only means "the source was unreachable" would lose the signal.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import pymysql

from cdc_platform.capture import names
from cdc_platform.capture.schema import TableSchema
from cdc_platform.capture.snapshot.chunks import snapshot_key_problem
from cdc_platform.capture.snapshot.conditions import Condition, require_condition
from cdc_platform.capture.source import (
    SourceSession,
    TableSelector,
    is_retriable,
    missing_table,
    quote_identifier,
)

# (table_id, surrogate key, condition) -> why a run would refuse it, or None
SnapshotCheck = Callable[[str, Sequence[str], Condition | None], str | None]

log = logging.getLogger(__name__)


class SourceChecks:
    """A :data:`SnapshotCheck` against the source; connects on first use, ``close`` after
    the tick. Schemas are read once per table per instance."""

    def __init__(self, connection_settings: dict[str, Any], selector: TableSelector) -> None:
        self.connection_settings = connection_settings
        self.selector = selector
        self._source = SourceSession(connection_settings, selector)
        self._schemas: dict[str, TableSchema | str] = {}

    def __call__(self, table_id: str, surrogate_key: Sequence[str],
                 condition: Condition | None) -> str | None:
        try:
            schema = self._schema(table_id)
            if isinstance(schema, str):
                return schema
            problem = snapshot_key_problem(schema, surrogate_key)
            if problem is None and condition is not None:
                problem = self._condition_problem(schema, condition)
            return problem
        except (pymysql.MySQLError, OSError) as error:
            self.close()
            log.warning(f"the source could not be asked whether a snapshot of {table_id} can "
                        f"run ({error}); the run checks it")
            return None

    def _schema(self, table_id: str) -> TableSchema | str:
        if table_id not in self._schemas:
            database, table = names.split_table_id(table_id)
            schema = self._source.read_schema(database, table)
            self._schemas[table_id] = schema if schema is not None else missing_table(table_id)
        return self._schemas[table_id]

    def _condition_problem(self, schema: TableSchema, condition: Condition) -> str | None:
        """The server's error for the condition on the table, as the run's SELECT would get
        it; None when it compiles. Only a :class:`Condition` is put into the SELECT."""
        text = require_condition(condition).sql
        conn = self._source.connection()
        sql = (f"SELECT 1 FROM {quote_identifier(schema.database)}."
               f"{quote_identifier(schema.table)} WHERE ({text}) LIMIT 0")
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                cur.fetchall()
        except pymysql.MySQLError as error:
            if is_retriable(error):
                raise
            code, message = (error.args + ("",))[:2] if error.args else ("?", str(error))
            return (f"the additional condition {condition!r} does not run on the table: "
                    f"{message} (error {code})")
        finally:
            conn.commit()
        return None

    def close(self) -> None:
        self._source.close()
