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

Table maps are decoded for every table of the server, captured or not (the library parses
each before the adapter can tell), so a table map the library cannot parse must not stop
the capture of other tables: ``_table_map_init`` reads the column metadata and the optional
metadata by their declared lengths, so a column type or optional-metadata field that is new
to the library (MySQL 9's VECTOR and its dimensionality field, say) is skipped by its size,
and anything it cannot decode is kept in ``undecodable`` for the adapter to stop on when,
and only when, the table is captured.

The frequent small events (GTID, XID, QUERY, a table map seen before, a small rows event)
are read from the packets by ``lean.LeanDecoder``, without the library's objects; each
packet it does not read is handed to the library's reader as it came (``_take_packets``).
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pymysql
import pymysql.protocol
from pymysqlreplication import BinLogStreamReader, binlogstream, json_binary
from pymysqlreplication.column import Column
from pymysqlreplication.constants import CHARSET, FIELD_TYPE
from pymysqlreplication.event import (
    BeginLoadQueryEvent,
    BinLogEvent,
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
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    MetadataFieldType,
    OptionalMetaData,
    PartialUpdateRowsEvent,
    RowsEvent,
    TableMapEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)
from pymysqlreplication.table import Table
from pymysqlreplication.util.bytes import decode_decimal

from cdc_platform.capture.binlog import decoding as binlog_decoding
from cdc_platform.capture.binlog.decoding import (
    HEARTBEAT_EVENT_TYPES,
    IGNORABLE_EVENT_TYPES,
    PayloadError,
    TaggedGtidEvent,
    TransactionPayloadEvent,
    event_type_name,
    packed_int,
    read_mariadb_xa_id,
)
from cdc_platform.capture.binlog.lean import LeanDecoder, read_packet
from cdc_platform.capture.binlog.rowcodec import RowsDecoders
from cdc_platform.capture.charsets import (
    UTF8_CHARSETS,
    as_information_schema_shows,
    landing_charset,
    text_decoder,
)
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
from cdc_platform.capture.gtid import MysqlGtidSet, encode_mysql_gtid_set
from cdc_platform.capture.names import table_id
from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.capture.source import SourceDisconnected, is_retriable
from cdc_platform.capture.values import json_opaque_text

log = logging.getLogger(__name__)

_INT_TYPES = {FIELD_TYPE.TINY, FIELD_TYPE.SHORT, FIELD_TYPE.INT24, FIELD_TYPE.LONG}
_STRING_TYPES = {FIELD_TYPE.VARCHAR, FIELD_TYPE.VAR_STRING, FIELD_TYPE.STRING,
                 FIELD_TYPE.BLOB, FIELD_TYPE.TINY_BLOB, FIELD_TYPE.MEDIUM_BLOB,
                 FIELD_TYPE.LONG_BLOB}
_FIXED_KINDS = {
    FIELD_TYPE.FLOAT: "float", FIELD_TYPE.DOUBLE: "double", FIELD_TYPE.DATE: "date",
    FIELD_TYPE.NEWDATE: "date", FIELD_TYPE.DATETIME: "datetime", FIELD_TYPE.DATETIME2: "datetime",
    FIELD_TYPE.TIMESTAMP: "timestamp", FIELD_TYPE.TIMESTAMP2: "timestamp",
    FIELD_TYPE.TIME: "time", FIELD_TYPE.TIME2: "time", FIELD_TYPE.JSON: "json",
    FIELD_TYPE.GEOMETRY: "binary", FIELD_TYPE.YEAR: "year",
}
# MySQL charset of each collation mysql-replication knows (table maps carry collation ids).
_COLLATION_CHARSETS = {
    charset.collation: charset.name
    for by_id in CHARSET.charsets._by_id.values()  # noqa: SLF001 - the library's only table
    for charset in by_id.values()
}


def learn_server_collations(conn: pymysql.Connection, dbms: str) -> list[str]:
    """Teach mysql-replication the collation ids of this server that its table lacks.

    Table maps carry collation ids; for an id mysql-replication does not list it would decode
    the column as UTF-8, and :func:`_charset_of` refuses such a column. The server knows its
    own ids (MariaDB 10.10+ adds uca1400 collations, MySQL adds ids between releases), so they
    are read from it at start: every collation the server has is decodable. Returns the names
    of the collations learnt. ``dbms`` is mysql-replication's flavour name (mysql/mariadb).
    """
    queries = (
        # MariaDB 10.10+: a collation applicable to several charsets has an id per charset.
        "SELECT ID, FULL_COLLATION_NAME, CHARACTER_SET_NAME FROM "
        "information_schema.COLLATION_CHARACTER_SET_APPLICABILITY WHERE ID IS NOT NULL",
        "SELECT ID, COLLATION_NAME, CHARACTER_SET_NAME FROM information_schema.COLLATIONS "
        "WHERE ID IS NOT NULL",
    )
    rows: list[Any] = []
    with conn.cursor() as cur:
        for query in queries:
            try:
                cur.execute(query)
            except pymysql.MySQLError as error:
                if error.args and error.args[0] in (1054, 1109):  # (an older server)
                    continue
                raise
            rows = list(cur.fetchall())
            break
    learnt = []
    for collation_id, collation, charset in rows:
        if CHARSET.charset_by_id(int(collation_id), dbms) is not None:
            continue
        CHARSET.charsets.add(CHARSET.Charset(int(collation_id), str(charset), str(collation),
                                             False, dbms))
        _COLLATION_CHARSETS[str(collation)] = str(charset)
        learnt.append(str(collation))
    return learnt


def column_from_binlog(column: Any) -> ColumnSpec:
    """ColumnSpec from a mysql-replication table-map column (needs binlog_row_metadata=FULL).

    Text columns record their charset when it is not UTF-8: their values arrive as bytes
    (:func:`_keep_text_bytes`) for ``capture.values`` to decode as the server converts them.
    """
    ftype = column.type
    name = column.name
    if getattr(column, "vector_dimensions", None) is not None or ftype == MYSQL_TYPE_VECTOR:
        # MySQL 9 VECTOR: its value is the vector's float32 values, little-endian, as bytes;
        # it lands as those bytes (what SELECT returns for it without VECTOR_TO_STRING).
        return ColumnSpec(name, "binary")
    if ftype in _INT_TYPES:
        return ColumnSpec(name, "int")
    if ftype == FIELD_TYPE.LONGLONG:
        return ColumnSpec(name, "uint64" if column.unsigned else "int")
    if ftype == FIELD_TYPE.NEWDECIMAL:
        return ColumnSpec(name, "decimal", column.precision, column.decimals)
    if ftype == FIELD_TYPE.BIT:
        return ColumnSpec(name, "bit", column.bits)
    if ftype in (FIELD_TYPE.ENUM, FIELD_TYPE.SET):
        charset = _charset_of(column)
        decode = text_decoder(charset or "utf8mb4")
        raw = column.enum_values[1:] if ftype == FIELD_TYPE.ENUM else column.set_values
        try:
            members = tuple(as_information_schema_shows(decode(m)) for m in raw or ())
        except ValueError as error:
            raise ValueError(f"column {name!r}: a member name is not valid {charset} text: "
                             f"{error}") from error
        kind = "enum" if ftype == FIELD_TYPE.ENUM else "set"
        return ColumnSpec(name, kind, values=members, charset=charset)
    if ftype in _FIXED_KINDS:
        kind = _FIXED_KINDS[ftype]
        scale = getattr(column, "fsp", None) if kind in ("datetime", "timestamp", "time") else None
        return ColumnSpec(name, kind, scale=scale or 0 if scale is not None else None)
    if ftype in _STRING_TYPES:
        if column.character_set_name not in (None, "binary"):
            return ColumnSpec(name, "string", charset=_charset_of(column))
        # BINARY(n) arrives as STRING with its 0x00 padding stripped: remember n to restore it.
        fixed = ftype == FIELD_TYPE.STRING
        return ColumnSpec(name, "binary", column.max_length if fixed else None)
    raise NotImplementedError(f"column {name!r}: binlog column type {ftype} is not supported")


def _charset_of(column: Any) -> str | None:
    """The column's MySQL charset as ColumnSpec records it (None: UTF-8 or binary)."""
    collation = getattr(column, "collation_name", None)
    charset = _COLLATION_CHARSETS.get(collation) if collation else None
    if charset is None:
        # mysql-replication falls back to decoding as UTF-8 for a collation id it does not
        # know: that would land wrong text silently.
        raise ValueError(f"column {column.name!r}: its collation id is not known to "
                         "mysql-replication, so its charset (and text) cannot be decoded "
                         "exactly; give the column a collation listed by mysql-replication's "
                         "CHARSET table, or exclude it (capture.excluded_columns)")
    return landing_charset(charset)


def _keep_text_bytes(encoding: str) -> str:
    """mysql-replication asks this for the Python codec of a text column's charset (it passes
    the charset's ``encoding``): only UTF-8 is decoded by the library; any other name is not a
    codec, so the library hands the bytes over (its LookupError path) for capture.values."""
    return encoding if encoding in UTF8_CHARSETS else "cdc-platform-keeps-bytes"


def _type_values_as_bytes(self: TableMapEvent, length: int) -> list[list[bytes]] | None:
    """TableMapEvent._read_type_values keeping ENUM/SET member names as bytes: the library
    decodes them as UTF-8 and turns any other name into '' (they are in the column's charset)."""
    packet = self.packet
    read_until = packet.read_bytes + length
    if packet.read_bytes >= read_until:
        return None
    result = []
    while packet.read_bytes < read_until:
        count = packet.read_length_coded_binary()
        result.append([bytes(packet.read_variable_length_string()) for _ in range(count)])
    return result


def _json_opaque(data: bytes) -> Any:
    """json_binary.parse_opaque, exact: DECIMAL as Decimal, every other opaque scalar as the
    text MySQL prints for it (the library loses TIME's sign and range, DATE vs DATETIME, and
    decodes other opaque bytes with errors ignored)."""
    if len(data) < 1:
        return None
    field_type = data[0]
    length, n = json_binary.decode_variable_length(data[1:])
    payload = bytes(data[1 + n : 1 + n + length])
    if field_type in (FIELD_TYPE.NEWDECIMAL, FIELD_TYPE.DECIMAL):
        return decode_decimal(payload)
    return json_opaque_text(field_type, payload)


def _invalid_date_as_none(read: Any) -> Any:
    """A DATE/DATETIME reader of the library that returns None for an invalid date such as
    2020-02-30 (ALLOW_INVALID_DATES) instead of raising: it lands NULL like zero dates and as
    the SELECT side reads it. The value's bytes are consumed before the date is built."""
    def lenient(self: RowsEvent) -> Any:
        try:
            return read(self)
        except ValueError:
            return None

    return lenient


def _unread_first(self: BinLogPacketWrapper, data: bytes) -> None:
    """BinLogPacketWrapper.unread putting ``data`` back *before* what is still buffered.

    The library appends it after, which is only right when nothing is buffered: a compressed
    rows event's inflated rows (``binlog_decoding``), or rows handed back by the native
    decoder (``rowcodec``), are buffered, and the DECIMAL reader unreads its first byte, which
    then came back at the end of the rows (a wrong value or an error)."""
    name = "_BinLogPacketWrapper__data_buffer"
    self.read_bytes -= len(data)
    setattr(self, name, data + getattr(self, name))


def _table_init(self: Table, table_id: int, schema: str, table: str, columns: list[Any],
                primary_key: Any = None, column_name_flag: bool = False) -> None:
    """Table.__init__ reading each column's name and key flag directly: the library builds a
    dict of every column's attributes to read those two, for every table map, so once per
    transaction (a tenth of streaming small transactions). The same values result."""
    if primary_key is None:
        names = [c.name for c in columns if c.is_primary]
        primary_key = "" if not names else names[0] if len(names) == 1 else tuple(names)
    self.__dict__.update({"table_id": table_id, "schema": schema, "table": table,
                          "columns": columns, "primary_key": primary_key,
                          "column_name_flag": column_name_flag})


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


# -- table maps --------------------------------------------------------------------------------

MYSQL_TYPE_VECTOR = 242  # MySQL 9.0 (include/field_types.h)
_VECTOR_DIMENSIONALITY = 13  # MySQL 9.0's optional-metadata field for VECTOR columns

# Bytes of table-map column metadata each column type has (MySQL and MariaDB write the same:
# ``Field::do_save_field_metadata``); the types of the second set have none.
_COLUMN_METADATA_BYTES = {
    FIELD_TYPE.VARCHAR: 2, FIELD_TYPE.VAR_STRING: 2, FIELD_TYPE.STRING: 2, FIELD_TYPE.FLOAT: 1,
    FIELD_TYPE.DOUBLE: 1, FIELD_TYPE.TIMESTAMP2: 1, FIELD_TYPE.DATETIME2: 1,
    FIELD_TYPE.TIME2: 1, FIELD_TYPE.BLOB: 1, FIELD_TYPE.GEOMETRY: 1, FIELD_TYPE.JSON: 1,
    FIELD_TYPE.NEWDECIMAL: 2, FIELD_TYPE.BIT: 2, MYSQL_TYPE_VECTOR: 1,
}
_COLUMN_WITHOUT_METADATA = {
    FIELD_TYPE.DECIMAL, FIELD_TYPE.TINY, FIELD_TYPE.SHORT, FIELD_TYPE.LONG, FIELD_TYPE.NULL,
    FIELD_TYPE.TIMESTAMP, FIELD_TYPE.LONGLONG, FIELD_TYPE.INT24, FIELD_TYPE.DATE,
    FIELD_TYPE.TIME, FIELD_TYPE.DATETIME, FIELD_TYPE.YEAR, FIELD_TYPE.NEWDATE,
}
_KNOWN_OPTIONAL_METADATA = {field.value for field in MetadataFieldType} - {
    MetadataFieldType.UNKNOWN_METADATA_FIELD_TYPE.value}


def _reader(data: bytes) -> BinLogPacketWrapper:
    """A packet reader over ``data`` alone, with the library's read methods: the library's
    column and optional-metadata parsers run on it and cannot read past its end."""
    reader = object.__new__(BinLogPacketWrapper)
    reader.packet = pymysql.protocol.MysqlPacket(data, "utf8")
    reader.read_bytes = 0
    reader._BinLogPacketWrapper__data_buffer = b""  # noqa: SLF001 - (as the library sets it)
    return reader


def _columns_from_metadata(column_types: bytes, metadata: bytes) -> tuple[list[Column], str]:
    """The table map's columns from their types and their metadata block (its length is
    written before it), and why some cannot be decoded ('' when all can).

    The library reads each column's metadata by its type and knows no size for a type new
    to it, so every later byte of the event (null bitmap, optional metadata) is misread.
    Here a type of unknown metadata size gets what the block has left over once every known
    type took its size: exact when there is one such column. With more, or when the sizes
    do not add up, the columns from the first unknown one on are not decoded."""
    unknown = [i for i, t in enumerate(column_types)
               if t not in _COLUMN_METADATA_BYTES and t not in _COLUMN_WITHOUT_METADATA]
    known_size = sum(_COLUMN_METADATA_BYTES.get(t, 0) for t in column_types)
    spare = len(metadata) - known_size
    reason = ""
    if len(unknown) > 1 or spare < 0 or (spare and not unknown):
        cut = unknown[0] if unknown else len(column_types)
        reason = (f"its column metadata ({len(metadata)} bytes for types "
                  f"{list(column_types)}) does not match the column types' sizes")
    else:
        cut = len(column_types)
    reader = _reader(metadata)
    columns = []
    for i, column_type in enumerate(column_types):
        if i >= cut:  # (its attributes as the library sets them, its metadata unknown)
            column = Column(column_type, _reader(bytes(_COLUMN_METADATA_BYTES.get(column_type,
                                                                                  0))))
        else:
            column = Column(column_type, reader)
            if i in unknown:
                column.metadata = bytes(reader.read(spare))
            elif column_type == MYSQL_TYPE_VECTOR:  # (the library reads nothing for it)
                column.metadata = bytes(reader.read(_COLUMN_METADATA_BYTES[column_type]))
        if i in unknown or i >= cut:
            column.unknown_type = True
        columns.append(column)
    return columns, reason


def _optional_metadata(event: TableMapEvent, data: bytes) -> OptionalMetaData:
    """The library's optional-metadata parser over the fields it knows; each field it does
    not know is skipped by its length (the block is type, length, value triples) and kept in
    ``event.unknown_metadata`` (the library raises ValueError on the first one, and reads
    every later field from the wrong place)."""
    known = b""
    at = 0
    while at < len(data):
        field_type = data[at]
        length, start = packed_int(data, at + 1, "table map")
        value = data[start:start + length]
        if len(value) != length:
            raise ValueError(f"optional metadata field {field_type} runs past the event")
        if field_type in _KNOWN_OPTIONAL_METADATA:
            known += data[at:start + length]
        else:
            event.unknown_metadata[field_type] = bytes(value)
        at = start + length
    packet = event.packet
    # (the library's parser stops 4 bytes before the end, where a checksum would be)
    event.packet = _reader(known + b"\0" * 4)
    try:
        return event._get_optional_meta_data()  # noqa: SLF001
    finally:
        event.packet = packet


def _vector_columns(event: TableMapEvent) -> None:
    """VECTOR columns (MySQL 9) read as the binary BLOBs they are stored as: a length of
    ``length_size`` bytes, then the vector's float32 values. Their dimensions (optional
    metadata field 13, one per VECTOR column in order) are kept in ``vector_dimensions``."""
    dimensions: list[int] = []
    raw = event.unknown_metadata.get(_VECTOR_DIMENSIONALITY, b"")
    at = 0
    while at < len(raw):
        value, at = packed_int(raw, at, "table map")
        dimensions.append(value)
    vectors = [c for c in event.columns if c.type == MYSQL_TYPE_VECTOR]
    for index, column in enumerate(vectors):
        column.type = FIELD_TYPE.BLOB
        column.length_size = column.metadata[0]
        column.unknown_type = False
        column.character_set_name = column.collation_name = "binary"
        column.vector_dimensions = dimensions[index] if index < len(dimensions) else 0


_library_is_character_column = TableMapEvent._is_character_column


def _is_character_column(column_type: int, dbms: str = "mysql") -> bool:
    """The library's test, and VECTOR: MySQL lists a charset (binary) for each VECTOR column
    in the table map's charset metadata, so without it every text column after a VECTOR
    column took its neighbour's charset (a TEXT column decoded as binary, silently)."""
    return column_type == MYSQL_TYPE_VECTOR or _library_is_character_column(column_type,
                                                                           dbms=dbms)


@dataclass
class CachedTableMap:
    """A decoded table map: its parts (``_DECODED_PARTS``, set on each event decoded from the
    same bytes) and the schema the adapter built from it (None until then)."""

    parts: dict[str, Any]
    schema: TableSchema | None = None

    @property
    def weight(self) -> int:
        return len(self.parts["columns"]) + 1


class TableMapCache:
    """Decoded table maps by their bytes (with the flavour, which decides the charset columns,
    and the post-header length the binlog declares for them).

    The server logs a table map before each transaction's rows, so a stream of small
    transactions decodes the same few maps over and over. Decoding is a pure function of those
    bytes, so a map seen before takes its decoded parts from here, with its ``Table`` (the
    rows decoders find theirs again by identity) and its schema. The bytes hold the table id,
    which a server changes when it reopens a table: a wide table reopened often makes many
    entries, so the cache is bounded by the columns it holds (a column's decoded form is most
    of an entry's memory), the oldest entries going first. One per process: streams in
    threads of their own (tests, benches) share it, so a change holds a lock."""

    def __init__(self, max_columns: int) -> None:
        self.max_columns = max_columns
        self.entries: dict[tuple[str, int, bytes], CachedTableMap] = {}
        self.columns = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[str, int, bytes]) -> CachedTableMap | None:
        return self.entries.get(key)

    def put(self, key: tuple[str, int, bytes], entry: CachedTableMap) -> None:
        with self._lock:
            if key in self.entries:  # (decoded by another stream meanwhile)
                return
            while self.entries and self.columns + entry.weight > self.max_columns:
                self.columns -= self.entries.pop(next(iter(self.entries))).weight
            if entry.weight <= self.max_columns:
                self.entries[key] = entry
                self.columns += entry.weight


# (about 2 KB a column decoded, its schema included: some 30 MB at most)
TABLE_MAPS = TableMapCache(max_columns=16_384)
_DECODED_PARTS = ("table_id", "flags", "schema_length", "schema", "table_length", "table",
                  "column_count", "columns", "null_bitmask", "table_obj", "optional_metadata",
                  "undecodable", "unknown_metadata")


def _table_map_init(self: TableMapEvent, from_packet: Any, event_size: int, table_map: Any,
                    ctl_connection: Any, **kwargs: Any) -> None:
    """TableMapEvent.__init__ that reads every part of the event by its declared length, and
    takes a map already decoded from ``TABLE_MAPS`` (``cached``: its entry there).

    The same values result for the tables the library decodes. Whatever cannot be decoded
    (a column type of unknown layout, a damaged block) leaves ``undecodable`` saying why,
    and the table still maps to its name (its rows events are named, and skipped when the
    table is not captured); the adapter stops on it only for a captured table."""
    BinLogEvent.__init__(self, from_packet, event_size, table_map, ctl_connection, **kwargs)
    private = {name: kwargs[name] for name in (
        "only_tables", "ignored_tables", "only_schemas", "ignored_schemas", "freeze_schema",
        "optional_meta_data")}
    private["enable_logging"] = kwargs.get("enable_logging", False)
    private["use_column_name_cache"] = kwargs.get("use_column_name_cache", False)
    for name, value in private.items():
        setattr(self, f"_TableMapEvent__{name}", value)
    if any(private[name] for name in ("only_tables", "ignored_tables", "only_schemas",
                                      "ignored_schemas", "freeze_schema")):
        _decode_table_map(self, table_map, private)  # (the library's filters: not cached)
        return
    packet = self.packet
    start = packet.read_bytes
    body = bytes(packet.read(self.event_size - start))
    key = (self.dbms, self._declared_post_header_len(8), body)
    cached = TABLE_MAPS.get(key)
    if cached is None:
        reader = _reader(body)
        reader.read_bytes = start  # (the event's own arithmetic: event_size - read_bytes)
        self.packet = reader
        try:
            _decode_table_map(self, table_map, private)
        finally:
            self.packet = packet
        cached = CachedTableMap({name: self.__dict__[name] for name in _DECODED_PARTS})
        TABLE_MAPS.put(key, cached)
    else:
        self.__dict__.update(cached.parts)
        table_map[self.table_id] = self.table_obj
    self.cached = cached


def _decode_table_map(self: TableMapEvent, table_map: Any, private: dict[str, Any]) -> None:
    """The table map's parts from ``self.packet`` (see ``_table_map_init``)."""
    self.undecodable = ""
    self.unknown_metadata = {}
    self.table_id = self._read_table_id()
    if self.table_id in table_map and private["freeze_schema"]:
        self._processed = False
        return
    self.flags = struct.unpack("<H", self.packet.read(2))[0]
    self._advance_to_payload(8)
    self.schema_length = self.packet.read(1)[0]
    self.schema = self.packet.read(self.schema_length).decode()
    self.packet.advance(1)
    self.table_length = self.packet.read(1)[0]
    self.table = self.packet.read(self.table_length).decode()
    only_tables, only_schemas = private["only_tables"], private["only_schemas"]
    ignored_tables, ignored_schemas = private["ignored_tables"], private["ignored_schemas"]
    if (only_tables is not None and self.table not in only_tables) or (
            ignored_tables is not None and self.table in ignored_tables) or (
            only_schemas is not None and self.schema not in only_schemas) or (
            ignored_schemas is not None and self.schema in ignored_schemas):
        self._processed = False
        return
    self.packet.advance(1)
    self.column_count = self.packet.read_length_coded_binary()
    self.dbms = self.dbms or self._ctl_connection._get_dbms()  # noqa: SLF001
    self.columns = []
    try:
        column_types = bytes(self.packet.read(self.column_count))
        metadata = bytes(self.packet.read(self.packet.read_length_coded_binary()))
        self.null_bitmask = self.packet.read((self.column_count + 7) // 8)
        optional = bytes(self.packet.read(self.event_size - self.packet.read_bytes))
        self.columns, self.undecodable = _columns_from_metadata(column_types, metadata)
        self.table_obj = Table(self.table_id, self.schema, self.table, self.columns)
        table_map[self.table_id] = self.table_obj
        self.optional_metadata = _optional_metadata(self, optional)
        self._sync_column_info()
        _vector_columns(self)
    except Exception as error:  # noqa: BLE001 - kept for the adapter: see the docstring
        # (the first reason found; one line, whatever the library's message holds)
        self.undecodable = self.undecodable or " ".join(
            f"its table map does not decode ({type(error).__name__}: {error})".split())
        self.optional_metadata = getattr(self, "optional_metadata", OptionalMetaData())
        self.null_bitmask = getattr(self, "null_bitmask", b"")
        self.table_obj = Table(self.table_id, self.schema, self.table, self.columns)
        table_map[self.table_id] = self.table_obj


# Installed once, for every stream of this process (the library has no hooks for these).
Table.__init__ = _table_init
BinLogPacketWrapper.unread = _unread_first
RowsEvent._RowsEvent__read_date = _invalid_date_as_none(RowsEvent._RowsEvent__read_date)
RowsEvent._RowsEvent__read_datetime = _invalid_date_as_none(RowsEvent._RowsEvent__read_datetime)
RowsEvent.charset_to_encoding = staticmethod(_keep_text_bytes)
TableMapEvent._read_type_values = _type_values_as_bytes  # noqa: SLF001
TableMapEvent.__init__ = _table_map_init
TableMapEvent._is_character_column = staticmethod(_is_character_column)  # noqa: SLF001
json_binary.parse_opaque = _json_opaque


class _DumpGtidSet:
    """What mysql-replication's COM_BINLOG_DUMP_GTID asks of its ``GtidSet``: the binary
    form of the position the stream starts after. The library's own cannot parse a tagged set
    (``uuid:tag:1-5``, MySQL 8.3+), so a stream could not resume after a tagged transaction;
    this one encodes both formats (``gtid.encode_mysql_gtid_set``; untagged sets as before)."""

    def __init__(self, text: str) -> None:
        self._encoded = encode_mysql_gtid_set(MysqlGtidSet.parse(text))

    @property
    def encoded_length(self) -> int:
        return len(self._encoded)

    def encoded(self) -> bytes:
        return self._encoded


binlogstream.GtidSet = _DumpGtidSet


def schema_from_table_map(event: TableMapEvent) -> TableSchema:
    """The table's schema as the binlog describes it at this event (key in index order)."""
    try:
        columns = tuple(column_from_binlog(c) for c in event.columns)
    except ValueError as error:
        raise ValueError(f"table {event.schema}.{event.table}: {error}") from error
    key_indexes = list(getattr(event.optional_metadata, "simple_primary_key_list", None) or [])
    if not key_indexes:
        key_indexes = [i for i, c in enumerate(event.columns) if getattr(c, "is_primary", False)]
    primary_key = tuple(columns[i].name for i in key_indexes)
    return TableSchema(event.schema, event.table, columns, primary_key)


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
                                 TABLE_MAPS, COLUMNAR_MIN_EVENT_BYTES)
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
