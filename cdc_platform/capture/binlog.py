"""The binlog as a stream of events from a GTID position, one connection at a time.

mysql-replication reconnects on its own after a dropped connection, but from the position it
was *created* with, replaying everything since. The engine must own its position, so this
adapter refuses the library's silent reconnect and raises ``SourceDisconnected`` instead; the
engine then reopens a stream from its own processed position, with backoff.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.constants import FIELD_TYPE
from pymysqlreplication.event import (
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    XidEvent,
)
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    TableMapEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)

from cdc_platform.capture.schema import ColumnSpec, TableSchema

log = logging.getLogger(__name__)

STREAM_EVENTS = [
    GtidEvent, MariadbGtidEvent, QueryEvent, XidEvent, TableMapEvent, WriteRowsEvent,
    UpdateRowsEvent, DeleteRowsEvent, HeartbeatLogEvent, RotateEvent,
]

# pymysql error codes after which reconnecting may succeed (network, restart, kill).
RETRIABLE_MYSQL_ERRORS = {1040, 1053, 1158, 1159, 1160, 1161, 1317, 1927, 2002, 2003, 2006,
                          2013, 2055}


class SourceDisconnected(ConnectionError):
    """The binlog connection dropped or could not be opened; reconnecting may succeed."""


def is_retriable(error: BaseException) -> bool:
    if isinstance(error, SourceDisconnected | ConnectionError | TimeoutError | EOFError):
        return True
    if isinstance(error, pymysql.err.OperationalError | pymysql.err.InterfaceError):
        code = error.args[0] if error.args else None
        return code in RETRIABLE_MYSQL_ERRORS or not isinstance(code, int)
    return False


_INT_TYPES = {FIELD_TYPE.TINY, FIELD_TYPE.SHORT, FIELD_TYPE.INT24, FIELD_TYPE.LONG,
              FIELD_TYPE.YEAR}
_STRING_TYPES = {FIELD_TYPE.VARCHAR, FIELD_TYPE.VAR_STRING, FIELD_TYPE.STRING,
                 FIELD_TYPE.BLOB, FIELD_TYPE.TINY_BLOB, FIELD_TYPE.MEDIUM_BLOB,
                 FIELD_TYPE.LONG_BLOB}
_FIXED_KINDS = {
    FIELD_TYPE.FLOAT: "float", FIELD_TYPE.DOUBLE: "double", FIELD_TYPE.DATE: "date",
    FIELD_TYPE.NEWDATE: "date", FIELD_TYPE.DATETIME: "datetime", FIELD_TYPE.DATETIME2: "datetime",
    FIELD_TYPE.TIMESTAMP: "timestamp", FIELD_TYPE.TIMESTAMP2: "timestamp",
    FIELD_TYPE.TIME: "time", FIELD_TYPE.TIME2: "time", FIELD_TYPE.JSON: "json",
    FIELD_TYPE.GEOMETRY: "binary",
}


def column_from_binlog(column: Any) -> ColumnSpec:
    """ColumnSpec from a mysql-replication table-map column (needs binlog_row_metadata=FULL)."""
    ftype = column.type
    name = column.name
    if ftype in _INT_TYPES:
        return ColumnSpec(name, "int")
    if ftype == FIELD_TYPE.LONGLONG:
        return ColumnSpec(name, "uint64" if column.unsigned else "int")
    if ftype == FIELD_TYPE.NEWDECIMAL:
        return ColumnSpec(name, "decimal", column.precision, column.decimals)
    if ftype == FIELD_TYPE.BIT:
        return ColumnSpec(name, "bit", column.bits)
    if ftype == FIELD_TYPE.ENUM:
        return ColumnSpec(name, "enum", values=tuple(column.enum_values or ())[1:])
    if ftype == FIELD_TYPE.SET:
        return ColumnSpec(name, "set", values=tuple(column.set_values or ()))
    if ftype in _FIXED_KINDS:
        kind = _FIXED_KINDS[ftype]
        scale = getattr(column, "fsp", None) if kind in ("datetime", "timestamp", "time") else None
        return ColumnSpec(name, kind, scale=scale or 0 if scale is not None else None)
    if ftype in _STRING_TYPES:
        if column.character_set_name not in (None, "binary"):
            return ColumnSpec(name, "string")
        # BINARY(n) arrives as STRING with its 0x00 padding stripped: remember n to restore it.
        fixed = ftype == FIELD_TYPE.STRING
        return ColumnSpec(name, "binary", column.max_length if fixed else None)
    raise NotImplementedError(f"column {name!r}: binlog column type {ftype} is not supported")


def schema_from_table_map(event: TableMapEvent) -> TableSchema:
    """The table's schema as the binlog describes it at this event (key in index order)."""
    columns = tuple(column_from_binlog(c) for c in event.columns)
    key_indexes = list(getattr(event.optional_metadata, "simple_primary_key_list", None) or [])
    if not key_indexes:
        key_indexes = [i for i, c in enumerate(event.columns) if getattr(c, "is_primary", False)]
    primary_key = tuple(columns[i].name for i in key_indexes)
    return TableSchema(event.schema, event.table, columns, primary_key)


class BinlogStream:
    """Events from ``position`` over one connection; ``SourceDisconnected`` when it drops."""

    def __init__(
        self,
        connection_settings: dict[str, Any],
        server_id: int,
        flavour: str,
        position: str,
        heartbeat_seconds: float,
    ) -> None:
        settings = {k: v for k, v in connection_settings.items() if k != "connect_timeout"}
        settings["passwd"] = settings.pop("password", "")
        # A silent dead connection must not block forever: heartbeats arrive every
        # heartbeat_seconds, so three missed heartbeats mean the link is gone.
        settings["read_timeout"] = max(10, int(heartbeat_seconds * 3))
        settings["connect_timeout"] = int(connection_settings.get("connect_timeout", 10))
        self._connects = 0
        kwargs: dict[str, Any] = {}
        if flavour == "mariadb":
            # An empty MariaDB connect state means "from the oldest binlog".
            kwargs.update(is_mariadb=True, auto_position=position)
        elif position:
            kwargs["auto_position"] = position
        else:
            kwargs.update(self._earliest_mysql_position(connection_settings))
        self._reader = BinLogStreamReader(
            connection_settings=settings,
            server_id=server_id,
            blocking=True,
            resume_stream=True,
            only_events=STREAM_EVENTS,
            slave_heartbeat=heartbeat_seconds,
            pymysql_wrapper=self._connect,
            enable_logging=False,
            **kwargs,
        )

    @staticmethod
    def _earliest_mysql_position(settings: dict[str, Any]) -> dict[str, Any]:
        """MySQL with no GTID position to resume from: start at the oldest binlog file."""
        conn = pymysql.connect(**settings)
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW BINARY LOGS")
                first = cur.fetchone()
        finally:
            conn.close()
        if not first:
            raise RuntimeError("source has no binary logs: is log_bin enabled?")
        return {"log_file": first[0], "log_pos": 4}

    def _connect(self, **settings: Any) -> pymysql.Connection:
        is_control = settings.get("db") == "information_schema"
        if not is_control:
            self._connects += 1
            if self._connects > 1:
                raise SourceDisconnected("binlog connection dropped")
        try:
            return pymysql.connect(**settings)
        except pymysql.err.OperationalError as error:
            raise SourceDisconnected(f"cannot connect to the source: {error}") from error

    def __iter__(self) -> Iterator[Any]:
        while True:
            try:
                event = self._reader.fetchone()
            except (pymysql.err.OperationalError, pymysql.err.InterfaceError, OSError) as error:
                if is_retriable(error):
                    raise SourceDisconnected(str(error)) from error
                raise
            if event is None:  # the server ended the stream (non-blocking only)
                raise SourceDisconnected("binlog stream ended by the server")
            yield event

    def close(self) -> None:
        try:
            self._reader.close()
        except Exception:  # noqa: BLE001 - closing a dead connection may fail; nothing to do
            log.debug("closing the binlog reader failed", exc_info=True)
