"""Binlog event types mysql-replication 1.0.17 does not decode, taught to it.

* MariaDB ``log_bin_compress=ON``: QUERY_COMPRESSED_EVENT (0xA5) and the compressed rows events
  (0xA6-0xA8 v1, 0xA9-0xAB v2). The compressed part (the query text; for rows events the rows
  data after the column count and bitmaps, checked on MariaDB 10.11) is a header byte
  ``0x80 | n``, ``n`` bytes of big-endian uncompressed length, then zlib data. Each event is
  parsed as its uncompressed twin with the rows data inflated.
* MariaDB's GTID event (0xA2): the library stops after the flags; an XA group's GTID event also
  names the XA transaction (``read_mariadb_xa_id``).
* MySQL ``binlog_transaction_compression=ON``: TRANSACTION_PAYLOAD_EVENT (40) holds a whole
  transaction's events, zstd-compressed, without checksums. They are decompressed as a
  stream and parsed with the library's own classes one at a time, in order (``events()``).
* MySQL 8.3+ tagged GTIDs (``SET gtid_next='AUTOMATIC:tag'``, ``uuid:tag:n``):
  GTID_TAGGED_LOG_EVENT (42), written in MySQL's "mysql::serialization" format
  (``libs/mysql/serialization``: variable-length integers, numbered fields) instead of the
  fixed layout of GTID_LOG_EVENT (``TaggedGtidEvent``).

Without this the library turns these into ``NotImplementedEvent`` and the rows are lost
silently. New event types are registered into the library's packet event map (``register``,
called by the binlog adapter); no class the library already maps is replaced, so other users
of the library in the same process (e.g. a bare benchmark loop) are unaffected.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pymysql.protocol
import zstandard
from pymysqlreplication import constants
from pymysqlreplication.event import BinLogEvent, MariadbGtidEvent, QueryEvent
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from cdc_platform.capture.events import UnsupportedEvent, xa_id

QUERY_COMPRESSED_EVENT = 0xA5
WRITE_ROWS_COMPRESSED_EVENT_V1 = 0xA6
UPDATE_ROWS_COMPRESSED_EVENT_V1 = 0xA7
DELETE_ROWS_COMPRESSED_EVENT_V1 = 0xA8
WRITE_ROWS_COMPRESSED_EVENT = 0xA9
UPDATE_ROWS_COMPRESSED_EVENT = 0xAA
DELETE_ROWS_COMPRESSED_EVENT = 0xAB
TRANSACTION_PAYLOAD_EVENT = 40
GTID_TAGGED_LOG_EVENT = 42

# compressed type -> the uncompressed type it is parsed as
_UNCOMPRESSED = {
    WRITE_ROWS_COMPRESSED_EVENT_V1: constants.WRITE_ROWS_EVENT_V1,
    UPDATE_ROWS_COMPRESSED_EVENT_V1: constants.UPDATE_ROWS_EVENT_V1,
    DELETE_ROWS_COMPRESSED_EVENT_V1: constants.DELETE_ROWS_EVENT_V1,
    WRITE_ROWS_COMPRESSED_EVENT: constants.WRITE_ROWS_EVENT_V2,
    UPDATE_ROWS_COMPRESSED_EVENT: constants.UPDATE_ROWS_EVENT_V2,
    DELETE_ROWS_COMPRESSED_EVENT: constants.DELETE_ROWS_EVENT_V2,
}

_FL_GROUP_COMMIT_ID = 2
_FL_XA = 64 | 128


def inflate(data: bytes, what: str) -> bytes:
    """MariaDB's compressed binlog body -> its bytes (header ``0x80|n``, length, zlib)."""
    if not data or not data[0] & 0x80:
        raise UnsupportedEvent(f"{what}: not a MariaDB compressed body (header byte "
                               f"{data[:1].hex() or 'missing'})")
    width = data[0] & 0x07
    expected = int.from_bytes(data[1:1 + width], "big")
    try:
        raw = zlib.decompress(data[1 + width:])
    except zlib.error as error:
        raise UnsupportedEvent(f"{what}: zlib data does not inflate ({error})") from None
    if len(raw) != expected:
        raise UnsupportedEvent(f"{what}: inflated to {len(raw)} bytes, header says {expected}")
    return raw


def deflate(raw: bytes) -> bytes:
    """The inverse of ``inflate`` (for tests that build compressed events)."""
    length = len(raw)
    width = max(1, (length.bit_length() + 7) // 8)
    return bytes([0x80 | width]) + length.to_bytes(width, "big") + zlib.compress(raw)


class _CompressedRows:
    """Mixin: parse a compressed rows event as its uncompressed twin, rows data inflated."""

    compressed = True

    def __init__(self, from_packet: Any, event_size: int, *args: Any, **kwargs: Any) -> None:
        from_packet.event_type = _UNCOMPRESSED[from_packet.event_type]
        super().__init__(from_packet, event_size, *args, **kwargs)  # type: ignore[call-arg]
        if not self._processed:  # type: ignore[attr-defined]
            return
        packet = self.packet  # type: ignore[attr-defined]
        rest = packet.read(event_size - packet.read_bytes)
        raw = inflate(rest, f"compressed rows event of {self.schema}.{self.table}")  # type: ignore[attr-defined]
        # (what the rows take uncompressed: the basis of the buffer's memory estimate)
        self.uncompressed_size = event_size - len(rest) + len(raw)
        packet.unread(raw)


class CompressedWriteRowsEvent(_CompressedRows, WriteRowsEvent):
    pass


class CompressedUpdateRowsEvent(_CompressedRows, UpdateRowsEvent):
    pass


class CompressedDeleteRowsEvent(_CompressedRows, DeleteRowsEvent):
    pass


class CompressedQueryEvent(QueryEvent):
    """QUERY_COMPRESSED_EVENT: a query event whose statement text is compressed."""

    compressed = True

    def __init__(self, from_packet: Any, event_size: int, table_map: Any, ctl_connection: Any,
                 **kwargs: Any) -> None:
        BinLogEvent.__init__(self, from_packet, event_size, table_map, ctl_connection, **kwargs)
        packet = self.packet
        self.slave_proxy_id = packet.read_uint32()
        self.execution_time = packet.read_uint32()
        self.schema_length = struct.unpack("!B", packet.read(1))[0]
        self.error_code = packet.read_uint16()
        self.status_vars_length = packet.read_uint16()
        self._advance_to_payload(13)
        end = packet.read_bytes + self.status_vars_length
        while packet.read_bytes < end:
            self._read_status_vars_value_for_key(packet.read_uint8())
        self.schema = packet.read(self.schema_length)
        packet.advance(1)
        raw = inflate(packet.read(event_size - packet.read_bytes), "compressed query event")
        self.query = raw.decode("utf-8", errors="backslashreplace")


def read_mariadb_xa_id(event: MariadbGtidEvent) -> str | None:
    """The XA id a MariaDB GTID event names (XA groups), read from the rest of its body.

    The library stops after the flags; the id follows them (after the commit id when
    FL_GROUP_COMMIT_ID is set). Read once, right after the event was parsed, while its packet
    is still positioned there. (A subclass registered for the GTID event type would change
    the class every user of the library in this process receives.)
    """
    if not event.flags & _FL_XA:
        return None
    if not hasattr(event, "xa_id"):
        packet = event.packet
        if event.flags & _FL_GROUP_COMMIT_ID:
            packet.read(8)
        format_id = packet.read_uint32()
        gtrid_length = packet.read_uint8()
        bqual_length = packet.read_uint8()
        event.xa_id = xa_id(format_id, packet.read(gtrid_length), packet.read(bqual_length))
    return event.xa_id


# -- MySQL transaction payloads ------------------------------------------------------------

_PAYLOAD_END, _PAYLOAD_SIZE, _PAYLOAD_COMPRESSION, _PAYLOAD_UNCOMPRESSED_SIZE = 0, 1, 2, 3
_ZSTD, _NONE = 0, 255
_NO_CHECKSUM = b"\x00" * 4


def packed_int(data: bytes, at: int, what: str = "transaction payload") -> tuple[int, int]:
    """A MySQL length-encoded integer at ``at`` -> (value, next offset); ``what`` names the
    event in the error."""
    if at >= len(data):
        raise UnsupportedEvent(f"{what}: a length-encoded integer runs past the end")
    first = data[at]
    if first < 0xFB:
        return first, at + 1
    width = {0xFC: 2, 0xFD: 3, 0xFE: 8}.get(first)
    if width is None:
        raise UnsupportedEvent(f"{what}: bad length-encoded integer 0x{first:x}")
    return int.from_bytes(data[at + 1:at + 1 + width], "little"), at + 1 + width


class PayloadError(UnsupportedEvent):
    """A TRANSACTION_PAYLOAD_EVENT whose content does not check out (the adapter adds the
    GTID and the fix)."""


@dataclass(frozen=True)
class PayloadHeader:
    """A TRANSACTION_PAYLOAD_EVENT's fields: where its data starts, and what it declares."""

    offset: int
    size: int | None
    compression: int
    uncompressed_size: int | None


def payload_header(body: bytes) -> PayloadHeader:
    """The fields before a TRANSACTION_PAYLOAD_EVENT body's data."""
    at, size, compression, uncompressed = 0, None, _ZSTD, None
    while at < len(body):
        field, at = packed_int(body, at)
        if field == _PAYLOAD_END:
            break
        length, at = packed_int(body, at)
        if field in (_PAYLOAD_SIZE, _PAYLOAD_COMPRESSION, _PAYLOAD_UNCOMPRESSED_SIZE):
            value, at = packed_int(body, at)
            if field == _PAYLOAD_SIZE:
                size = value
            elif field == _PAYLOAD_COMPRESSION:
                compression = value
            else:
                uncompressed = value
        else:
            at += length
    return PayloadHeader(at, size, compression, uncompressed)


class _Stream:
    """The payload's uncompressed bytes, read as needed (zstd decompressed as a stream)."""

    def __init__(self, data: bytes | memoryview, compression: int) -> None:
        if compression == _NONE:
            self._reader: Any = io.BytesIO(data)
        elif compression == _ZSTD:
            self._reader = zstandard.ZstdDecompressor().stream_reader(
                data, read_across_frames=False)
        else:
            raise PayloadError(f"transaction payload compressed with type {compression}, "
                               "which the engine does not know (zstd is 0)")
        self.read_bytes = 0

    def read(self, count: int) -> bytes:
        """Up to ``count`` bytes (fewer only at the end of the payload)."""
        out = b""
        try:
            while len(out) < count:
                more = self._reader.read(count - len(out))
                if not more:
                    break
                out += more
        except zstandard.ZstdError as error:
            raise PayloadError(f"transaction payload does not decompress ({error})") from None
        self.read_bytes += len(out)
        return out


def payload_events(body: bytes) -> Iterator[bytes]:
    """A TRANSACTION_PAYLOAD_EVENT body -> its embedded events' bytes (19-byte header each,
    no checksum), one at a time, decompressed as they are read: memory holds one event.

    The payload must end exactly after its last event, with exactly the uncompressed size it
    declares and no data after its frame: a truncated frame (which zstd decompresses to
    nothing) or extra bytes are a ``PayloadError``, never fewer events.
    """
    header = payload_header(body)
    end = len(body) if header.size is None else header.offset + header.size
    if end > len(body):
        raise PayloadError(f"transaction payload declares {header.size} bytes of data, the "
                           f"event holds {len(body) - header.offset}")
    if end < len(body):
        raise PayloadError(f"transaction payload: {len(body) - end} bytes after its data")
    stream = _Stream(memoryview(body)[header.offset:end], header.compression)
    while True:
        event_header = stream.read(19)
        if not event_header:
            break
        size = struct.unpack_from("<I", event_header, 9)[0] if len(event_header) == 19 else 0
        if size < 19:
            raise PayloadError(f"transaction payload: a truncated event at offset "
                               f"{stream.read_bytes - len(event_header)}")
        rest = stream.read(size - 19)
        if len(rest) != size - 19:
            raise PayloadError(f"transaction payload: event of {size} bytes at offset "
                               f"{stream.read_bytes - len(rest) - 19} does not fit the payload")
        yield event_header + rest
    if header.uncompressed_size is not None and stream.read_bytes != header.uncompressed_size:
        raise PayloadError(f"transaction payload decompressed to {stream.read_bytes} bytes, "
                           f"it declares {header.uncompressed_size}")
    if header.uncompressed_size is None and header.compression == _ZSTD and (
            stream.read_bytes == 0):
        raise PayloadError("transaction payload decompressed to nothing (a truncated frame?)")


class TransactionPayloadEvent(BinLogEvent):
    """MySQL's compressed transaction: its events, parsed one at a time by ``events()``."""

    def __init__(self, from_packet: Any, event_size: int, table_map: Any, ctl_connection: Any,
                 **kwargs: Any) -> None:
        super().__init__(from_packet, event_size, table_map, ctl_connection, **kwargs)
        self._body = self.packet.read(event_size)
        self._table_map = table_map
        self._ctl_connection = ctl_connection
        self._kwargs = kwargs

    def events(self) -> Iterator[Any]:
        """The embedded events, parsed in order as they are consumed (a table map is known
        to the rows events after it). ``PayloadError`` when the payload does not check out."""
        table_map, kwargs = self._table_map, self._kwargs
        for raw in payload_events(self._body):
            wrapper = BinLogPacketWrapper(
                # (the OK byte a packet starts with; and 4 bytes where the library expects a
                # checksum: it reads a table map's optional metadata up to them)
                pymysql.protocol.MysqlPacket(b"\x00" + raw + _NO_CHECKSUM, "utf8"), table_map,
                self._ctl_connection,
                kwargs.get("mysql_version", (0, 0, 0)), False, ALLOWED_EVENTS, None, None,
                None, None, False, False, False, True, False, False,
                kwargs.get("post_header_lengths"))
            event = wrapper.event
            if event is None and wrapper.event_type not in IGNORABLE_EVENT_TYPES:
                raise UnsupportedEvent(
                    f"event type {event_type_name(wrapper.event_type)} inside a transaction "
                    "payload could not be decoded")
            if event is None:
                continue
            if wrapper.event_type == constants.TABLE_MAP_EVENT:
                table_map[event.table_id] = event.get_table()
            yield event


# -- MySQL tagged GTIDs (mysql::serialization) -----------------------------------------------


def read_varlen_uint(data: bytes, at: int) -> tuple[int, int]:
    """A "mysql::serialization" unsigned integer at ``at`` -> (value, next offset).

    The number of trailing one bits of the first byte is the number of bytes that follow;
    the value is the little-endian whole shifted right by that count plus one. A first byte
    0xFF is followed by the 8 bytes of the value itself
    (``libs/mysql/serialization/variable_length_integers.h``)."""
    if at >= len(data):
        raise ValueError("a variable-length integer runs past the end of the event")
    first = data[at]
    ones = 0
    while ones < 8 and first >> ones & 1:
        ones += 1
    if ones == 8:
        if at + 9 > len(data):
            raise ValueError("a 9-byte variable-length integer runs past the end of the event")
        return int.from_bytes(data[at + 1:at + 9], "little"), at + 9
    width = ones + 1
    if at + width > len(data):
        raise ValueError("a variable-length integer runs past the end of the event")
    return int.from_bytes(data[at:at + width], "little") >> width, at + width


def write_varlen_uint(value: int) -> bytes:
    """The inverse of ``read_varlen_uint`` (MySQL writes the shortest form)."""
    if value < 0 or value >= 1 << 64:
        raise ValueError(f"{value} does not fit an unsigned 64-bit integer")
    for width in range(1, 9):
        if value < 1 << (7 * width):
            marker = (1 << (width - 1)) - 1
            return ((value << width) | marker).to_bytes(width, "little")
    return b"\xff" + value.to_bytes(8, "little")


def read_varlen_int(data: bytes, at: int) -> tuple[int, int]:
    """A signed "mysql::serialization" integer (zig-zag: the lowest bit is the sign)."""
    raw, at = read_varlen_uint(data, at)
    return (-(raw >> 1) - 1 if raw & 1 else raw >> 1), at


def write_varlen_int(value: int) -> bytes:
    return write_varlen_uint(value << 1 if value >= 0 else ((-value - 1) << 1) | 1)


#: Gtid_event's fields in the tagged format (libs/mysql/binlog/event/control_events.h).
_TAGGED_GTID_FIELDS = ("flags", "sid", "gno", "tag", "last_committed", "sequence_number",
                       "immediate_commit_timestamp", "original_commit_timestamp",
                       "transaction_length", "immediate_server_version",
                       "original_server_version", "commit_group_ticket")
_SIGNED_GTID_FIELDS = {"gno", "last_committed", "sequence_number"}
_TAGGED_GTID_FORMAT = 2  # (the format byte MySQL 8.3-9.x write; rust_mysql_common's "V2")


@dataclass(frozen=True)
class TaggedGtid:
    """What a GTID_TAGGED_LOG_EVENT says about its transaction."""

    sid: str
    tag: str
    gno: int
    flags: int = 0
    immediate_commit_timestamp: int = 0

    @property
    def gtid(self) -> str:
        """``uuid:tag:gno`` (``uuid:gno`` when the tag is empty), as MySQL prints it."""
        return f"{self.sid}:{self.tag}:{self.gno}" if self.tag else f"{self.sid}:{self.gno}"


def decode_tagged_gtid(body: bytes) -> TaggedGtid:
    """A GTID_TAGGED_LOG_EVENT body (after the common header, without checksum).

    Layout: a format byte; then the message: its size (counting from the format byte), the
    id of its last field a reader must understand, and ``field id, value`` pairs in id order.
    A field this reader does not know is an error when it is at or below that id; after it,
    the rest of the message is ignorable (it cannot be skipped field by field: its width is
    not written). ValueError says what does not check out."""
    if not body:
        raise ValueError("the event is empty")
    if body[0] != _TAGGED_GTID_FORMAT:
        raise ValueError(f"serialization format {body[0]}, which cdc_platform does not know "
                         f"(it reads {_TAGGED_GTID_FORMAT})")
    size, at = read_varlen_uint(body, 1)
    last_non_ignorable, at = read_varlen_uint(body, at)
    if size < at or size > len(body):
        raise ValueError(f"the message declares {size} bytes, the event holds {len(body)}")
    data = body[:size]
    values: dict[str, object] = {}
    while at < size:
        field_id, at = read_varlen_uint(data, at)
        if field_id >= len(_TAGGED_GTID_FIELDS):
            if field_id <= last_non_ignorable:
                raise ValueError(f"field {field_id} must be understood and is not known here")
            break
        name = _TAGGED_GTID_FIELDS[field_id]
        if name == "sid":
            uuid = bytearray()
            for _ in range(16):
                byte, at = read_varlen_uint(data, at)
                if byte > 0xFF:
                    raise ValueError(f"a UUID byte is {byte}")
                uuid.append(byte)
            values[name] = uuid
        elif name == "tag":
            length, at = read_varlen_uint(data, at)
            if at + length > size:
                raise ValueError("the tag runs past the end of the event")
            try:
                values[name] = data[at:at + length].decode("ascii")
            except UnicodeDecodeError:
                raise ValueError(f"the tag {data[at:at + length]!r} is not ASCII") from None
            at += length
        elif name in _SIGNED_GTID_FIELDS:
            values[name], at = read_varlen_int(data, at)
        else:
            values[name], at = read_varlen_uint(data, at)
    if "sid" not in values or "gno" not in values:
        raise ValueError("the event names no UUID or no transaction number")
    sid = bytes(values["sid"]).hex()  # type: ignore[arg-type]
    gno = int(values["gno"])  # type: ignore[call-overload]
    if gno < 1:
        raise ValueError(f"transaction number {gno}")
    return TaggedGtid(f"{sid[:8]}-{sid[8:12]}-{sid[12:16]}-{sid[16:20]}-{sid[20:]}",
                      str(values.get("tag", "")), gno, int(values.get("flags", 0)),  # type: ignore[call-overload]
                      int(values.get("immediate_commit_timestamp", 0)))  # type: ignore[call-overload]


def encode_tagged_gtid(gtid: TaggedGtid, last_committed: int = 0,
                       sequence_number: int = 1) -> bytes:
    """A GTID_TAGGED_LOG_EVENT body as MySQL writes it (for tests that build events)."""
    fields = write_varlen_uint(0) + write_varlen_uint(gtid.flags)
    fields += write_varlen_uint(1) + b"".join(
        write_varlen_uint(b) for b in bytes.fromhex(gtid.sid.replace("-", "")))
    fields += write_varlen_uint(2) + write_varlen_int(gtid.gno)
    if gtid.tag:
        fields += write_varlen_uint(3) + write_varlen_uint(len(gtid.tag)) + gtid.tag.encode()
    fields += write_varlen_uint(4) + write_varlen_int(last_committed)
    fields += write_varlen_uint(5) + write_varlen_int(sequence_number)
    fields += write_varlen_uint(6) + write_varlen_uint(gtid.immediate_commit_timestamp)
    head = write_varlen_uint(0)  # last_non_ignorable_field_id
    size = 1 + len(head) + len(fields)
    while True:  # (the size counts its own encoding)
        total = size + len(write_varlen_uint(size))
        if total == size + len(write_varlen_uint(total)):
            return bytes([_TAGGED_GTID_FORMAT]) + write_varlen_uint(total) + head + fields
        size += 1


class TaggedGtidEvent(BinLogEvent):
    """GTID_TAGGED_LOG_EVENT: ``gtid`` is ``uuid:tag:gno``. An event that does not decode
    keeps its reason in ``error`` (the adapter stops naming the GTID before it)."""

    def __init__(self, from_packet: Any, event_size: int, table_map: Any, ctl_connection: Any,
                 **kwargs: Any) -> None:
        super().__init__(from_packet, event_size, table_map, ctl_connection, **kwargs)
        self.error: str | None = None
        self.gtid = ""
        try:
            decoded = decode_tagged_gtid(bytes(self.packet.read(event_size)))
        except ValueError as error:
            self.error = str(error)
            return
        self.gtid = decoded.gtid
        self.sid, self.tag, self.gno = decoded.sid, decoded.tag, decoded.gno
        self.commit_flag = bool(decoded.flags & 1)


# -- the registry ----------------------------------------------------------------------------

#: Event types that never carry row data or transaction boundaries the engine needs: dropped
#: without a word. Anything else the engine does not handle stops it (``UnsupportedEvent``).
IGNORABLE_EVENT_TYPES = {
    constants.FORMAT_DESCRIPTION_EVENT, constants.PREVIOUS_GTIDS_LOG_EVENT,
    constants.MARIADB_GTID_GTID_LIST_EVENT, constants.MARIADB_BINLOG_CHECKPOINT_EVENT,
    constants.MARIADB_ANNOTATE_ROWS_EVENT, constants.ROWS_QUERY_LOG_EVENT,
    constants.STOP_EVENT, constants.INTVAR_EVENT, constants.RAND_EVENT,
    constants.USER_VAR_EVENT, constants.IGNORABLE_LOG_EVENT,
    constants.MARIADB_START_ENCRYPTION_EVENT,
    0x24,  # TRANSACTION_CONTEXT_EVENT (group replication certification info)
    0x25,  # VIEW_CHANGE_EVENT (group replication membership)
}
HEARTBEAT_EVENT_TYPES = {constants.HEARTBEAT_LOG_EVENT, 0x29}  # 0x29: HEARTBEAT_LOG_EVENT_V2

_EVENT_NAMES = {value: name for name, value in vars(constants.BINLOG).items()
                if isinstance(value, int) and name.endswith(("_EVENT", "_EVENT_V1", "_EVENT_V2"))}
_EVENT_NAMES.update({
    QUERY_COMPRESSED_EVENT: "QUERY_COMPRESSED_EVENT",
    WRITE_ROWS_COMPRESSED_EVENT_V1: "WRITE_ROWS_COMPRESSED_EVENT_V1",
    UPDATE_ROWS_COMPRESSED_EVENT_V1: "UPDATE_ROWS_COMPRESSED_EVENT_V1",
    DELETE_ROWS_COMPRESSED_EVENT_V1: "DELETE_ROWS_COMPRESSED_EVENT_V1",
    WRITE_ROWS_COMPRESSED_EVENT: "WRITE_ROWS_COMPRESSED_EVENT",
    UPDATE_ROWS_COMPRESSED_EVENT: "UPDATE_ROWS_COMPRESSED_EVENT",
    DELETE_ROWS_COMPRESSED_EVENT: "DELETE_ROWS_COMPRESSED_EVENT",
    TRANSACTION_PAYLOAD_EVENT: "TRANSACTION_PAYLOAD_EVENT",
    0x24: "TRANSACTION_CONTEXT_EVENT", 0x25: "VIEW_CHANGE_EVENT",
    0x28: "TRANSACTION_PAYLOAD_EVENT", 0x29: "HEARTBEAT_LOG_EVENT_V2",
    GTID_TAGGED_LOG_EVENT: "GTID_TAGGED_LOG_EVENT",
})


def event_type_name(event_type: int) -> str:
    return f"{_EVENT_NAMES.get(event_type, 'UNKNOWN_EVENT')} (type {event_type}, " \
           f"0x{event_type:02x})"


_REGISTERED = {
    QUERY_COMPRESSED_EVENT: CompressedQueryEvent,
    WRITE_ROWS_COMPRESSED_EVENT_V1: CompressedWriteRowsEvent,
    UPDATE_ROWS_COMPRESSED_EVENT_V1: CompressedUpdateRowsEvent,
    DELETE_ROWS_COMPRESSED_EVENT_V1: CompressedDeleteRowsEvent,
    WRITE_ROWS_COMPRESSED_EVENT: CompressedWriteRowsEvent,
    UPDATE_ROWS_COMPRESSED_EVENT: CompressedUpdateRowsEvent,
    DELETE_ROWS_COMPRESSED_EVENT: CompressedDeleteRowsEvent,
    TRANSACTION_PAYLOAD_EVENT: TransactionPayloadEvent,
    GTID_TAGGED_LOG_EVENT: TaggedGtidEvent,
}

#: The library classes the adapter receives (the packet wrapper parses nothing else).
ALLOWED_EVENTS: frozenset[type] = frozenset()


def register(allowed: frozenset[type]) -> None:
    """Add the classes above to the library's event map (idempotent)."""
    global ALLOWED_EVENTS
    ALLOWED_EVENTS = allowed | frozenset(_REGISTERED.values())
    event_map = BinLogPacketWrapper._BinLogPacketWrapper__event_map  # type: ignore[attr-defined]
    for event_type, cls in _REGISTERED.items():
        if event_map.setdefault(event_type, cls) is not cls:
            raise RuntimeError(f"mysql-replication now decodes {event_type_name(event_type)} "
                               "itself: drop cdc_platform's decoder of it")
