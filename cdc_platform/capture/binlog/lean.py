"""The frequent small binlog events read straight from the packet bytes, without
mysql-replication's objects; every other event goes to the library.

A single-row commit is four events (GTID, table map, rows, XID; MySQL adds a ``BEGIN`` query).
For each, the library builds a ``BinLogPacketWrapper`` and an event object through layers of
small reads, and pymysql resets the socket's timeout before each of the packet's two reads:
about half of the engine's cost per commit. ``LeanDecoder.decode`` reads these events' fields
with ``struct`` from the packet itself and returns the project events the adapter
(``stream.BinlogStream._convert``) would have made of the library's, equal field for field:

* MariaDB GTID events without XA flags; MySQL GTID events (the untagged form);
* XID events; QUERY events whose status variables the library walks to the end of their
  block (the statement and database it would read, the same text);
* table maps already decoded once (``table_maps.TABLE_MAPS``, keyed by the same bytes), whose
  schema was built (``CachedTableMap.schema``) or whose table is not captured;
* WRITE/UPDATE/DELETE rows events (v1 and v2, no extra row data) below the columnar size,
  of a known table map, with full row images the native decoder reads (``RowsDecoders``).

Anything else, and any of these in a form not listed (a length that does not add up, a
status variable the library would refuse, an undecoded table map, a value the native decoder
refuses, a flag such as XA), returns None: the adapter hands the very packet to the library,
which decodes it as before, stopping loudly on what it does not understand. Nothing is
skipped here that the library would have reported. The library's reader state these events
touch (``log_pos``, the table-id map) is kept as ``BinLogStreamReader.fetchone`` keeps it.
"""

from __future__ import annotations

import errno
import struct
from collections.abc import Callable
from typing import Any

import pymysql
from pymysql import err
from pymysql.constants import CR
from pymysqlreplication.row_event import RowsEvent

from cdc_platform.capture.binlog.rowcodec import RowsDecoders
from cdc_platform.capture.events import Event, Query, Rows, TableMap, Xid
from cdc_platform.capture.flavours import Flavour
from cdc_platform.capture.schema import TableSchema

# The OK byte, then the common event header: timestamp, type, server id, size, next position,
# flags (what BinLogPacketWrapper unpacks).
_HEADER = struct.Struct("<xIBIIIH")
_BODY = 20  # (the body's offset in the packet)
_MAX_PACKET_LEN = 0xFFFFFF

_QUERY_EVENT, _XID_EVENT, _TABLE_MAP_EVENT, _GTID_LOG_EVENT = 2, 16, 19, 33
_MARIADB_GTID_EVENT = 0xA2
_ROWS_OPS = {23: "insert", 24: "update", 25: "delete",  # v1 (MariaDB)
             30: "insert", 31: "update", 32: "delete"}  # v2 (MySQL)
_ROWS_V2 = {30, 31, 32}
_UPDATES = {24, 31}
_MARIADB_FL_XA = 64 | 128

# Query status variables: the bytes the library reads for each key it knows
# (QueryEvent._read_status_vars_value_for_key, keys 0x00-0x14, 0x80, 0x81); keys 0x05, 0x06,
# 0x0B and 0x0C have lengths inside them. A key missing here the library refuses.
_STATUS_VAR_BYTES = {0x00: 4, 0x01: 8, 0x02: 0, 0x03: 4, 0x04: 6, 0x07: 2, 0x08: 2, 0x09: 8,
                     0x0A: 0, 0x0D: 3, 0x0E: 0, 0x0F: 0, 0x10: 1, 0x11: 8, 0x12: 2, 0x13: 1,
                     0x14: 1, 0x80: 3, 0x81: 8}
_ONE_STRING_VARS = {0x05, 0x06}
_INVOKER, _UPDATED_DB_NAMES = 0x0B, 0x0C


class _Gtid:
    """What ``Flavour.begin`` reads of a library GTID event (no ``xa_id``: XA goes to the
    library). MySQL's event has no ``flags`` attribute, so the flavour reads 0, as here."""

    __slots__ = ("flags", "gtid", "timestamp")

    def __init__(self, gtid: str, timestamp: int, flags: int) -> None:
        self.gtid, self.timestamp, self.flags = gtid, timestamp, flags


class LeanDecoder:
    """Project events from packets of the frequent small event types (see the module).

    ``wanted`` and ``decoders`` are the adapter's; ``table_schemas`` its map of table id ->
    the schema of the table map last seen, which table maps decoded here update as the
    adapter does; ``table_maps`` the cache of decoded table maps (``table_maps.TABLE_MAPS``);
    rows events from ``columnar_min_bytes`` on are the library's (the adapter decodes them
    column-wise). ``sync`` takes the reader's state after each event the library decoded
    (a FORMAT_DESCRIPTION changes the post-header lengths, a ROTATE the table-id map)."""

    def __init__(self, flavour: Flavour, wanted: Callable[[str, str], bool],
                 decoders: RowsDecoders, table_schemas: dict[int, TableSchema],
                 table_maps: Any, columnar_min_bytes: int) -> None:
        self._flavour = flavour
        self._wanted = wanted
        self._decoders = decoders
        self._table_schemas = table_schemas
        self._table_maps = table_maps
        self._columnar_min_bytes = columnar_min_bytes
        self._checksum = 0
        self._post_header_lengths: Any = None
        self._new_gtid_fields = False
        self._dbms = ""
        self.reader: Any = None
        self._sids: dict[bytes, str] = {}
        self._handlers: dict[int, Callable[[bytes, int, int, int], tuple[Event, ...] | None]] = {
            _MARIADB_GTID_EVENT: self._mariadb_gtid, _GTID_LOG_EVENT: self._mysql_gtid,
            _XID_EVENT: self._xid, _QUERY_EVENT: self._query, _TABLE_MAP_EVENT: self._table_map,
            **dict.fromkeys(_ROWS_OPS, self._rows)}

    def sync(self, reader: Any, use_checksum: bool, post_header_lengths: Any) -> None:
        """The library reader's state that decoding depends on, as it is now."""
        self.reader = reader
        self._checksum = 4 if use_checksum else 0
        self._post_header_lengths = post_header_lengths
        self._new_gtid_fields = reader.mysql_version >= (5, 7)
        self._dbms = reader.dbms

    def decode(self, packet: bytes) -> tuple[Event, ...] | None:
        """The packet's project events (often none), or None: the library decodes it."""
        if len(packet) < _BODY or packet[0] != 0:
            return None
        timestamp, event_type, server_id, size, log_pos, _ = _HEADER.unpack_from(packet)
        handler = self._handlers.get(event_type)
        end = size + 1 - self._checksum  # (the body: packet[_BODY:end])
        if handler is None or len(packet) != size + 1 or end < _BODY:
            return None
        events = handler(packet, end, timestamp, server_id)
        if events is not None and log_pos:
            self.reader.log_pos = log_pos  # (BinLogStreamReader.fetchone's)
        return events

    def _post_header_length(self, event_type: int, default: int) -> int:
        """BinLogEvent._declared_post_header_len."""
        lengths = self._post_header_lengths
        if not lengths or not 0 <= event_type - 1 < len(lengths):
            return default
        return int(lengths[event_type - 1])

    def _payload_at(self, event_type: int, known: int, at: int, end: int) -> int | None:
        """BinLogEvent._advance_to_payload from ``at`` (``known`` bytes of post-header read):
        where the payload starts, None where the library raises."""
        declared = self._post_header_length(event_type, known)
        if declared < known or at + declared - known > end:
            return None
        return at + declared - known

    def _begin(self, gtid: _Gtid) -> tuple[Event, ...]:
        return (self._flavour.begin(gtid),)

    def _mariadb_gtid(self, packet: bytes, end: int, timestamp: int, server_id: int
                      ) -> tuple[Event, ...] | None:
        if end < _BODY + 13:
            return None
        sequence, domain, flags = struct.unpack_from("<QIB", packet, _BODY)
        if flags & _MARIADB_FL_XA:  # (the XA id follows: read_mariadb_xa_id)
            return None
        return self._begin(_Gtid(f"{domain}-{server_id}-{sequence}", timestamp, flags))

    def _mysql_gtid(self, packet: bytes, end: int, timestamp: int, server_id: int
                    ) -> tuple[Event, ...] | None:
        if end < _BODY + (42 if self._new_gtid_fields else 26):
            return None
        sid = packet[_BODY + 1:_BODY + 17]
        uuid = self._sids.get(sid)
        if uuid is None:
            hexed = sid.hex()
            uuid = self._sids[sid] = (f"{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-"
                                      f"{hexed[16:20]}-{hexed[20:]}")
        gno = int.from_bytes(packet[_BODY + 17:_BODY + 25], "little")
        return self._begin(_Gtid(f"{uuid}:{gno}", timestamp, 0))

    def _xid(self, packet: bytes, end: int, timestamp: int, server_id: int
             ) -> tuple[Event, ...] | None:
        return (Xid(timestamp),) if end == _BODY + 8 else None

    def _query(self, packet: bytes, end: int, timestamp: int, server_id: int
               ) -> tuple[Event, ...] | None:
        if end < _BODY + 13:
            return None
        schema_length = packet[_BODY + 8]
        status_length = packet[_BODY + 11] | packet[_BODY + 12] << 8
        at = self._payload_at(_QUERY_EVENT, 13, _BODY + 13, end)
        if at is None:
            return None
        status_end = at + status_length
        if status_end + schema_length + 1 > end:
            return None
        while at < status_end:
            at = _status_var_end(packet, at)
            if at is None:
                return None
        if at != status_end:
            return None
        query_at = at + schema_length + 1
        try:
            database = packet[at:at + schema_length].decode()
        except UnicodeDecodeError:  # (the adapter says what)
            return None
        text = packet[query_at:end].decode("utf-8", errors="backslashreplace")
        return (Query(text, database, timestamp),)

    def _table_map(self, packet: bytes, end: int, timestamp: int, server_id: int
                   ) -> tuple[Event, ...] | None:
        key = (self._dbms, self._post_header_length(_TABLE_MAP_EVENT, 8), packet[_BODY:end])
        cached = self._table_maps.get(key)
        if cached is None:
            return None
        parts = cached.parts
        wanted = self._wanted(parts["schema"], parts["table"])
        if wanted and cached.schema is None:
            return None  # (the adapter builds the schema, or stops on why it cannot)
        table_id = parts["table_id"]
        self.reader.table_map[table_id] = parts["table_obj"]
        if not wanted:
            return ()
        self._table_schemas[table_id] = cached.schema
        return (TableMap(table_id, cached.schema),)

    def _rows(self, packet: bytes, end: int, timestamp: int, server_id: int
              ) -> tuple[Event, ...] | None:
        event_type = packet[5]
        if end - _BODY >= self._columnar_min_bytes or end < _BODY + 10:
            return None
        table_id = int.from_bytes(packet[_BODY:_BODY + 6], "little")
        table = self.reader.table_map.get(table_id)
        if table is None:
            return None
        if event_type in _ROWS_V2:
            if packet[_BODY + 8] | packet[_BODY + 9] << 8 > 2:  # (extra row data)
                return None
            at = self._payload_at(event_type, 10, _BODY + 10, end)
        else:
            at = self._payload_at(event_type, 8, _BODY + 8, end)
        if at is None or at >= end:
            return None
        count = packet[at]
        columns = table.columns
        if count >= 0xFB or count != len(columns) or not columns:
            return None
        width = (count + 7) // 8
        images = 2 if event_type in _UPDATES else 1
        data_at = at + 1 + width * images
        if data_at > end:
            return None
        if not self._wanted(table.schema, table.table):
            return ()
        present = tuple(packet[at + 1 + width * i:at + 1 + width * (i + 1)]
                        for i in range(images))
        rows = self._decoders.rows_of(table_id, table, present, packet[data_at:end],
                                      RowsEvent.charset_to_encoding)
        if rows is None:
            return None
        return (Rows(table_id, table.schema, table.table, _ROWS_OPS[event_type], rows,
                     end - _BODY),)


def _status_var_end(packet: bytes, at: int) -> int | None:
    """Where the query status variable at ``at`` ends as the library reads it; None for a
    key it refuses, or bytes it cannot read (past the packet)."""
    key = packet[at]
    at += 1
    size = _STATUS_VAR_BYTES.get(key)
    if size is not None:
        at += size
    elif key in _ONE_STRING_VARS:
        if at >= len(packet):
            return None
        at += 1 + packet[at]
    elif key == _INVOKER:
        if at >= len(packet):
            return None
        at += 1 + packet[at]
        if at >= len(packet):
            return None
        at += 1 + packet[at]
    elif key == _UPDATED_DB_NAMES:
        if at >= len(packet):
            return None
        names = packet[at]
        at += 1
        if names != 254:
            for _ in range(names):
                zero = packet.find(b"\0", at)
                if zero < 0:
                    return None
                at = zero + 1
    else:
        return None
    return at if at <= len(packet) else None


def read_packet(conn: pymysql.Connection) -> bytes:
    """``conn._read_packet()``'s bytes, with its checks and errors, without setting the
    socket's timeout before each read: it is the connection's read timeout already (pymysql
    sets it before every read and the stream connection only reads), and setting it twice a
    packet was a tenth of the packet's cost. An error packet is returned as it is: the
    library's reader raises it (``BinlogStream`` hands such packets to it)."""
    data = b""
    while True:
        header = _read_bytes(conn, 4)
        low, high, number = struct.unpack("<HBB", header)
        length = low + (high << 16)
        if number != conn._next_seq_id:  # noqa: SLF001 - pymysql's reader state
            conn._force_close()  # noqa: SLF001
            if number == 0:
                raise err.OperationalError(CR.CR_SERVER_LOST,
                                           "Lost connection to MySQL server during query")
            raise err.InternalError(f"Packet sequence number wrong - got {number} expected "
                                    f"{conn._next_seq_id}")  # noqa: SLF001
        conn._next_seq_id = (number + 1) % 256  # noqa: SLF001
        data += _read_bytes(conn, length)
        if length < _MAX_PACKET_LEN:
            return data


def _read_bytes(conn: pymysql.Connection, count: int) -> bytes:
    """pymysql's Connection._read_bytes without its settimeout (``read_packet``)."""
    while True:
        try:
            data = conn._rfile.read(count)  # noqa: SLF001
            break
        except OSError as error:
            if error.errno == errno.EINTR:
                continue
            conn._force_close()  # noqa: SLF001
            raise err.OperationalError(
                CR.CR_SERVER_LOST, f"Lost connection to MySQL server during query ({error})"
            ) from None
        except BaseException:
            conn._force_close()  # noqa: SLF001
            raise
    if len(data) < count:
        conn._force_close()  # noqa: SLF001
        raise err.OperationalError(CR.CR_SERVER_LOST,
                                   "Lost connection to MySQL server during query")
    return data
