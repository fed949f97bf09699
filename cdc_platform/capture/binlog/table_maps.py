"""Table maps decoded by their declared lengths, and the cache of decoded table maps.

Table maps are decoded for every table of the server, captured or not (the library parses
each before the adapter can tell), so a table map the library cannot parse must not stop
the capture of other tables: ``table_map_init`` reads the column metadata and the optional
metadata by their declared lengths, so a column type or optional-metadata field that is new
to the library (MySQL 9's VECTOR and its dimensionality field, say) is skipped by its size,
and anything it cannot decode is kept in ``undecodable`` for the adapter to stop on when,
and only when, the table is captured.

The server logs a table map before each transaction's rows: a map seen before is taken from
``TABLE_MAPS`` (here for the library's path, and by ``lean.py`` for its own). The functions
here replace the library's; ``patches.py`` installs them.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass
from typing import Any

import pymysql.protocol
from pymysqlreplication.column import Column
from pymysqlreplication.constants import FIELD_TYPE
from pymysqlreplication.event import BinLogEvent
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import MetadataFieldType, OptionalMetaData, TableMapEvent
from pymysqlreplication.table import Table

from cdc_platform.capture.binlog.decoding import packed_int
from cdc_platform.capture.schema import TableSchema

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


def is_character_column(column_type: int, dbms: str = "mysql") -> bool:
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


def table_map_init(self: TableMapEvent, from_packet: Any, event_size: int, table_map: Any,
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
    """The table map's parts from ``self.packet`` (see ``table_map_init``)."""
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
