"""The binlog as a stream of the project's events (``capture/events.py``), one connection at
a time.

mysql-replication reconnects on its own after a dropped connection, but from the position it
was *created* with, replaying everything since. The engine must own its position, so this
adapter refuses the library's silent reconnect and raises ``SourceDisconnected`` instead; the
engine then reopens a stream from its own processed position, with backoff.

Every event type is either turned into a project event, known to be ignorable
(``IGNORABLE_EVENT_TYPES``), or a loud stop (``UnsupportedEvent`` naming the type, the GTID
and the fix): an event the adapter does not understand may carry rows, and must never be
filtered out silently.

The frequent small events (GTID, XID, QUERY, a table map seen before, a small rows event)
are read from the packets by ``lean.LeanDecoder``, without the library's objects; each
packet it does not read is handed to the library's reader as it came (``_take_packets``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pymysql
import pymysql.protocol
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    BeginLoadQueryEvent,
    ExecuteLoadQueryEvent,
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    NotImplementedEvent,
    QueryEvent,
    RotateEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    PartialUpdateRowsEvent,
    RowsEvent,
    TableMapEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)

from cdc_platform.capture.binlog import decoding as binlog_decoding
from cdc_platform.capture.binlog import (
    patches,  # noqa: F401 - installs the library patches
    table_maps,
)
from cdc_platform.capture.binlog.columns import schema_from_table_map
from cdc_platform.capture.binlog.decoding import (
    HEARTBEAT_EVENT_TYPES,
    IGNORABLE_EVENT_TYPES,
    PayloadError,
    TaggedGtidEvent,
    TransactionPayloadEvent,
    event_type_name,
    read_mariadb_xa_id,
)
from cdc_platform.capture.binlog.lean import LeanDecoder, read_packet
from cdc_platform.capture.binlog.rowcodec import RowsDecoders
from cdc_platform.capture.events import (
    Begin,
    EngineError,
    Event,
    Heartbeat,
    Query,
    Rotate,
    Rows,
    TableMap,
    UnsupportedEvent,
    XaPrepare,
    Xid,
    xa_id,
)
from cdc_platform.capture.flavours import Flavour
from cdc_platform.capture.names import table_id
from cdc_platform.capture.schema import TableSchema
from cdc_platform.capture.source import SourceDisconnected, is_retriable

log = logging.getLogger(__name__)


def _library_rows(event: RowsEvent, update: bool, gtid: str) -> list[Any]:
    """The rows of an event the native decoder left to mysql-replication (its dicts by column
    name) in the native decoder's shape: tuples in the table map's column order, an update's
    as ``(before, after)`` pairs. So the engine has one row shape.

    A partial row image (``binlog_row_image`` MINIMAL or NOBLOB, set in a session since the
    engine started) is a loud stop: the library gives its absent columns as None, which
    would land as NULLs."""
    names = [column.name for column in event.columns]

    def lacks(column: object) -> EngineError:
        return EngineError(
            f"table {table_id(event.schema, event.table)}: binlog row lacks column "
            f"{column} at GTID {gtid or '?'}; is binlog_row_image FULL?")

    bitmaps = [event.columns_present_bitmap]
    if update:
        bitmaps.append(event.columns_present_bitmap2)
    for bitmap in bitmaps:
        for index, name in enumerate(names):
            if not bitmap[index // 8] >> (index % 8) & 1:
                raise lacks(repr(name))

    def image(values: dict[str, Any]) -> tuple[Any, ...]:
        try:
            return tuple([values[name] for name in names])
        except KeyError as missing:
            raise lacks(missing) from None

    if update:
        return [(image(row["before_values"]), image(row["after_values"])) for row in event.rows]
    return [image(row["values"]) for row in event.rows]


# The library classes the stream asks for. Classes of ignorable events are left out (the
# packet wrapper then skips them unparsed); the unsupported ones are asked for, to stop on.
STREAM_EVENTS = frozenset({
    GtidEvent, MariadbGtidEvent, QueryEvent, XidEvent, XAPrepareEvent, TableMapEvent,
    WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, HeartbeatLogEvent, RotateEvent,
    NotImplementedEvent, BeginLoadQueryEvent, ExecuteLoadQueryEvent, PartialUpdateRowsEvent,
})
binlog_decoding.register(STREAM_EVENTS)

_UNSUPPORTED_FIXES = {
    BeginLoadQueryEvent: "LOAD DATA logged as a statement: set binlog_format=ROW",
    ExecuteLoadQueryEvent: "LOAD DATA logged as a statement: set binlog_format=ROW",
}
_ANONYMOUS_GTID = 0x22

# Rows events at least this large are decoded column-wise into Arrow (``rowcodec.columns``):
# building a block of arrays costs tens of microseconds an event, which pays from about a
# dozen rows on; smaller events (single-row commits) are decoded into tuples.
COLUMNAR_MIN_EVENT_BYTES = 2048


class TableMapError(UnsupportedEvent):
    """A captured table's column the engine cannot decode from the binlog."""


class BinlogStream:
    """Project events from ``position`` over one connection; ``SourceDisconnected`` when it
    drops. Rows and table maps of tables ``wanted`` refuses are not decoded."""

    # The lean decoder reads packets once the library has read the stream's first event
    # over a connection this stream opened (``_take_packets``: its packets).
    _lean_ready = False
    _read_raw: Callable[[], bytes] | None = None

    def __init__(
        self,
        connection_settings: dict[str, Any],
        server_id: int,
        flavour: Flavour,
        position: str,
        heartbeat_seconds: float,
        wanted: Callable[[str, str], bool] = lambda database, table: True,
    ) -> None:
        settings = {k: v for k, v in connection_settings.items() if k != "connect_timeout"}
        settings["passwd"] = settings.pop("password", "")
        # A silent dead connection must not block forever: heartbeats arrive every
        # heartbeat_seconds, so three missed heartbeats mean the link is gone.
        settings["read_timeout"] = max(10, int(heartbeat_seconds * 3))
        settings["connect_timeout"] = int(connection_settings.get("connect_timeout", 10))
        self._connects = 0
        self._flavour = flavour
        self._wanted = wanted
        self._gtid = ""
        self._decoders = RowsDecoders()
        self._table_schemas: dict[int, TableSchema] = {}  # table id -> its table map's schema
        # The frequent small events are read from the packets (``lean.py``); the rest, and
        # what the lean decoder leaves, is handed to the library's reader (``_handoff``).
        self._lean = LeanDecoder(flavour, wanted, self._decoders, self._table_schemas,
                                 table_maps.TABLE_MAPS, COLUMNAR_MIN_EVENT_BYTES)
        self._handoff: bytes | Exception | None = None
        start = flavour.stream_start(position, lambda: pymysql.connect(**connection_settings))
        self._reader = BinLogStreamReader(
            connection_settings=settings,
            server_id=server_id,
            blocking=True,
            resume_stream=True,
            only_events=list(binlog_decoding.ALLOWED_EVENTS),
            filter_non_implemented_events=False,
            slave_heartbeat=heartbeat_seconds,
            pymysql_wrapper=self._connect,
            enable_logging=False,
            **start,
        )

    def _connect(self, **settings: Any) -> pymysql.Connection:
        is_control = settings.get("db") == "information_schema"
        if not is_control:
            self._connects += 1
            if self._connects > 1:
                raise SourceDisconnected("binlog connection dropped")
        try:
            conn = pymysql.connect(**settings)
        except pymysql.err.OperationalError as error:
            raise SourceDisconnected(f"cannot connect to the source: {error}") from error
        if not is_control:
            self._take_packets(conn)
        return conn

    def _take_packets(self, conn: Any) -> None:
        """Read the stream connection's packets here, and hand to the library's reader those
        the lean decoder leaves: its ``_read_packet`` returns the packet in ``_handoff`` (or
        raises the error reading it raised) before reading the connection again, so the
        library decodes it, and handles the error, exactly as if it had read it itself."""
        library_read = conn._read_packet  # noqa: SLF001 - the reader's only way in
        if isinstance(conn, pymysql.connections.Connection):
            self._read_raw = lambda: read_packet(conn)
        else:  # (a test's stand-in for a server)
            self._read_raw = lambda: library_read().get_all_data()

        def read(*packet_type: Any) -> Any:
            handoff, self._handoff = self._handoff, None
            if handoff is None:
                return library_read(*packet_type)
            if isinstance(handoff, Exception):
                raise handoff
            packet = (packet_type[0] if packet_type else pymysql.protocol.MysqlPacket)(
                handoff, conn.encoding)
            if packet.is_error_packet():  # (what pymysql's _read_packet does with one)
                result = getattr(conn, "_result", None)
                if result is not None and result.unbuffered_active is True:
                    result.unbuffered_active = False
                packet.raise_for_error()
            return packet

        conn._read_packet = read  # noqa: SLF001

    def _sync_lean(self) -> None:
        """After the library read an event: the reader's state the lean decoder needs; it
        starts once the library has connected and read the stream's first event."""
        reader = self._reader
        self._lean_ready = bool(self._read_raw is not None and reader.dbms
                                and reader._BinLogStreamReader__connected_stream)  # noqa: SLF001
        if self._lean_ready:
            self._lean.sync(reader, reader._BinLogStreamReader__use_checksum,  # noqa: SLF001
                            reader._BinLogStreamReader__post_header_lengths)  # noqa: SLF001

    def _lean_events(self) -> tuple[Event, ...] | None:
        """The next packet's events from the lean decoder, or None: the library reads the
        packet (``_handoff``), or the error reading it, next."""
        try:
            data = self._read_raw()  # type: ignore[misc]
        except Exception as error:  # noqa: BLE001 - handed to the library, which handles it
            self._handoff = error
            return None
        events = self._lean.decode(data)
        if events is None:
            self._handoff = data
        return events

    def __iter__(self) -> Iterator[Event]:
        while True:
            if self._lean_ready:
                events = self._lean_events()
                if events is not None:
                    for lean_event in events:
                        if type(lean_event) is Begin:
                            self._gtid = lean_event.gtid
                        yield lean_event
                    continue
            try:
                event = self._reader.fetchone()
            except (pymysql.err.OperationalError, pymysql.err.InterfaceError, OSError) as error:
                if is_retriable(error):
                    raise SourceDisconnected(str(error)) from error
                raise
            self._sync_lean()
            if event is None:  # the server ended the stream (non-blocking only)
                raise SourceDisconnected("binlog stream ended by the server")
            if isinstance(event, TransactionPayloadEvent):
                try:
                    for inner in event.events():
                        yield from self._convert(inner)
                except PayloadError as error:
                    raise UnsupportedEvent(
                        f"GTID {self._gtid or '?'}: {error}. Its rows cannot be read exactly, "
                        "so the engine stops. Check the source's binlog with mysqlbinlog; if "
                        "it is damaged, re-snapshot the captured tables and move the "
                        "checkpoint past this GTID") from None
            else:
                yield from self._convert(event)

    def _convert(self, event: Any) -> Iterator[Event]:
        """The library's event -> the project's (none for ignorable or unwanted ones)."""
        if isinstance(event, PartialUpdateRowsEvent):
            if self._wanted(event.schema, event.table):
                raise UnsupportedEvent(
                    f"table {event.schema}.{event.table} at GTID {self._gtid or '?'}: a "
                    "PARTIAL_UPDATE_ROWS_EVENT: the source logs partial JSON updates "
                    "(binlog_row_value_options=PARTIAL_JSON, set since the engine started, "
                    "globally or in a session), whose after-images hold only the changed parts "
                    "of JSON values, so the row cannot be captured exactly. Fix: SET PERSIST "
                    "binlog_row_value_options='' on the replica (and in sessions that set it), "
                    "then re-snapshot the table and move the checkpoint past this GTID (or "
                    "start from a fresh landing zone with capture.initial_position)")
        elif isinstance(event, WriteRowsEvent | UpdateRowsEvent | DeleteRowsEvent):
            if self._wanted(event.schema, event.table):
                op = ("insert" if isinstance(event, WriteRowsEvent) else
                      "update" if isinstance(event, UpdateRowsEvent) else "delete")
                size = getattr(event, "uncompressed_size", event.event_size)
                schema = self._table_schemas.get(event.table_id)
                if schema is not None and size >= COLUMNAR_MIN_EVENT_BYTES:
                    columns = self._decoders.columns(event, schema)
                    if columns is not None:
                        yield Rows(event.table_id, event.schema, event.table, op, columns, size,
                                   columnar=True)
                        return
                rows = self._decoders.rows(event)
                if rows is None:
                    rows = _library_rows(event, op == "update", self._gtid)
                yield Rows(event.table_id, event.schema, event.table, op, rows, size)
        elif isinstance(event, TableMapEvent):
            if self._wanted(event.schema, event.table):
                schema = self._table_schema(event)
                self._table_schemas[event.table_id] = schema
                yield TableMap(event.table_id, schema)
        elif isinstance(event, MariadbGtidEvent | GtidEvent | TaggedGtidEvent):
            if isinstance(event, TaggedGtidEvent) and event.error:
                raise UnsupportedEvent(
                    f"a GTID_TAGGED_LOG_EVENT after GTID {self._gtid or '(none)'} does not "
                    f"decode: {event.error}. The transaction after it cannot be told, so the "
                    "engine stops. Check the source's binlog with mysqlbinlog; if the server "
                    "is newer than cdc_platform knows, upgrade cdc_platform")
            if isinstance(event, MariadbGtidEvent):
                read_mariadb_xa_id(event)
            begin = self._flavour.begin(event)
            self._gtid = begin.gtid
            yield begin
        elif isinstance(event, QueryEvent):
            schema = event.schema
            try:  # (identifiers are UTF-8 on the server: anything else is not a real name)
                database = schema.decode() if isinstance(schema, bytes) else schema
            except UnicodeDecodeError as error:
                raise UnsupportedEvent(
                    f"statement at GTID {self._gtid or '?'}: its default database name is not "
                    f"UTF-8 ({error}); the tables it names cannot be told exactly. Check the "
                    "source's binlog; re-snapshot the tables it changed") from error
            yield Query(event.query, database or "", event.timestamp)
        elif isinstance(event, XidEvent):
            yield Xid(event.timestamp)
        elif isinstance(event, XAPrepareEvent):
            yield XaPrepare(xa_id(event.xid_format_id, event.xid_gtrid, event.xid_bqual),
                            event.one_phase, event.timestamp)
        elif isinstance(event, HeartbeatLogEvent):
            yield Heartbeat()
        elif isinstance(event, RotateEvent):
            self._decoders.clear()  # (table ids of the old file are stale)
            self._table_schemas.clear()
            yield Rotate(event.next_binlog)
        elif isinstance(event, NotImplementedEvent):
            if event.event_type in HEARTBEAT_EVENT_TYPES:
                yield Heartbeat()
            elif event.event_type not in IGNORABLE_EVENT_TYPES:
                raise self._unsupported(event.event_type)
        else:
            raise self._unsupported(event.event_type, _UNSUPPORTED_FIXES.get(type(event)))

    def _unsupported(self, event_type: int, fix: str | None = None) -> UnsupportedEvent:
        if fix is None and event_type == _ANONYMOUS_GTID:
            fix = "a transaction without a GTID: set gtid_mode=ON (and enforce_gtid_consistency)"
        return UnsupportedEvent(
            f"binlog event {event_type_name(event_type)} after GTID {self._gtid or '(none)'} "
            "is not supported, and it may carry row changes: the engine stops rather than "
            f"skip it. Fix: {fix or 'turn off the server feature that writes it, or upgrade cdc_platform'}"
            "; then restart the engine (it resumes from its checkpoint)")

    def _table_schema(self, event: TableMapEvent) -> TableSchema:
        """The table map's schema; a map decoded before (``TABLE_MAPS``) has the schema built
        for it then."""
        cached = getattr(event, "cached", None)
        if cached is not None and cached.schema is not None:
            return cached.schema
        schema = self._checked_schema(event)
        if cached is not None:
            cached.schema = schema
        return schema

    def _checked_schema(self, event: TableMapEvent) -> TableSchema:
        where = f"table {event.schema}.{event.table} at GTID {self._gtid or '?'}"
        if getattr(event, "undecodable", ""):
            raise TableMapError(
                f"{where}: {event.undecodable}, so its rows cannot be read exactly. Fix: "
                "exclude the table (capture.tables), or upgrade cdc_platform to a version "
                "that reads it; then restart the engine")
        unknown = [(i, c) for i, c in enumerate(getattr(event, "columns", ()))
                   if getattr(c, "unknown_type", False)]
        if unknown:
            index, column = unknown[0]
            name = repr(column.name) if column.name else f"#{index + 1}"
            raise TableMapError(
                f"{where}: column {name} has binlog column type {column.type}, which "
                "cdc_platform cannot decode, and its rows cannot be read past it. Fix: "
                "exclude the table (capture.tables), or upgrade cdc_platform to a version "
                "that reads the type; then restart the engine")
        metadata = getattr(event, "optional_metadata", None)
        if metadata is not None and not metadata.column_name_list:
            raise TableMapError(
                f"{where}: its table map carries no column names: the source wrote it with "
                "binlog_row_metadata=MINIMAL (changed at runtime; capture needs FULL), so "
                "its columns, their charsets and key cannot be told exactly. Fix: SET PERSIST "
                "binlog_row_metadata=FULL on the replica, then re-snapshot the table and move "
                "the checkpoint past the transactions written meanwhile (or start from a "
                "fresh landing zone with capture.initial_position)")
        try:
            return schema_from_table_map(event)
        except (NotImplementedError, ValueError) as error:
            # (a ValueError is an unknown charset or an undecodable ENUM/SET member, already
            # prefixed with the table by schema_from_table_map: its cause says what)
            detail = error.__cause__ if isinstance(error, ValueError) and (
                error.__cause__ is not None) else error
            raise TableMapError(
                f"table {event.schema}.{event.table} at GTID {self._gtid or '?'}: {detail}; "
                "exclude the column (capture.excluded_columns) or the table (capture.tables)"
            ) from None

    def close(self) -> None:
        try:
            self._reader.close()
        except Exception:  # noqa: BLE001 - closing a dead connection may fail; nothing to do
            log.debug("closing the binlog reader failed", exc_info=True)
