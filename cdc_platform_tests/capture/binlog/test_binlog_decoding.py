"""Binlog events the library does not decode: compressed bodies, MySQL transaction payloads
(built here from real event bytes: MySQL cannot run on this machine), and the loud stop on
every event type the adapter does not know."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pymysql.protocol
import pytest
import zstandard
from pymysqlreplication.event import NotImplementedEvent
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import TableMapEvent, WriteRowsEvent

from cdc_platform.capture.binlog import decoding as binlog_decoding
from cdc_platform.capture.binlog.decoding import (
    TRANSACTION_PAYLOAD_EVENT,
    PayloadError,
    TransactionPayloadEvent,
    deflate,
    inflate,
    payload_events,
)
from cdc_platform.capture.binlog.rowcodec import RowsDecoders
from cdc_platform.capture.binlog.stream import BinlogStream, TableMapError, _library_rows
from cdc_platform.capture.events import (
    EngineError,
    Heartbeat,
    Rows,
    TableMap,
    UnsupportedEvent,
    Xid,
)
from cdc_platform.capture.flavours import flavour_of
from cdc_platform.capture.schema import column_from_information_schema
from cdc_platform_tests.capture.mysql_binlog_files import BuiltColumn, lenenc, table_map_body


def test_inflate_reads_mariadb_compressed_bodies_and_refuses_damaged_ones():
    for raw in (b"", b"x", b"abc" * 500, bytes(range(256)) * 300):
        assert inflate(deflate(raw), "test") == raw
    damaged = bytearray(deflate(b"abc" * 100))
    damaged[-3] ^= 0xFF
    with pytest.raises(UnsupportedEvent, match="does not inflate|inflated to"):
        inflate(bytes(damaged), "test")
    with pytest.raises(UnsupportedEvent, match="not a MariaDB compressed body"):
        inflate(b"\x01abc", "test")


def _stream() -> BinlogStream:
    stream = BinlogStream.__new__(BinlogStream)
    stream._flavour = flavour_of("mysql")
    stream._wanted = lambda database, table: True
    stream._gtid = "3e11fa47-71ca-11e1-9e33-c80aa9429562:23"
    stream._decoders = RowsDecoders()
    stream._table_schemas = {}
    return stream


def _not_implemented(event_type: int) -> NotImplementedEvent:
    event = NotImplementedEvent.__new__(NotImplementedEvent)
    event.event_type = event_type
    return event


@pytest.mark.parametrize("event_type, name", [
    (0x1A, "INCIDENT_EVENT"), (0x22, "ANONYMOUS_GTID_LOG_EVENT"), (0xAC, "UNKNOWN_EVENT"),
    (0x0B, "DELETE_FILE_EVENT"),
])
def test_an_event_the_adapter_does_not_know_is_a_loud_stop(event_type, name):
    with pytest.raises(UnsupportedEvent) as raised:
        list(_stream()._convert(_not_implemented(event_type)))
    message = str(raised.value)
    assert name in message and "c80aa9429562:23" in message and "Fix:" in message


@pytest.mark.parametrize("event_type", sorted(binlog_decoding.IGNORABLE_EVENT_TYPES))
def test_known_ignorable_events_are_dropped(event_type):
    assert list(_stream()._convert(_not_implemented(event_type))) == []


def test_mysql_heartbeat_v2_is_a_heartbeat():
    assert list(_stream()._convert(_not_implemented(0x29))) == [Heartbeat()]


# -- MySQL TRANSACTION_PAYLOAD_EVENT ----------------------------------------------------------


def _packed(value: int) -> bytes:
    if value < 0xFB:
        return bytes([value])
    return b"\xfe" + value.to_bytes(8, "little")


def _payload_body(raw: bytes, data: bytes, compression: int = 0,
                  declared: int | None = None) -> bytes:
    """A TRANSACTION_PAYLOAD_EVENT body holding ``data`` (``raw`` compressed), as MySQL
    writes it; ``declared``: the uncompressed size it claims (default: ``len(raw)``)."""
    body = b""
    fields = ((2, compression), (3, len(raw) if declared is None else declared), (1, len(data)))
    for field, value in fields:
        encoded = _packed(value)
        body += _packed(field) + _packed(len(encoded)) + encoded
    return body + _packed(0) + data


def _payload_event(inner: list[bytes], compression: int = 0) -> bytes:
    """A TRANSACTION_PAYLOAD_EVENT (header + body) around ``inner`` events, as MySQL writes it."""
    raw = b"".join(inner)
    data = zstandard.ZstdCompressor().compress(raw) if compression == 0 else raw
    body = _payload_body(raw, data, compression)
    header = struct.pack("<IBIIIH", 0, TRANSACTION_PAYLOAD_EVENT, 1, 19 + len(body), 0, 0)
    return header + body


def _fake_event(number: int, size: int = 60) -> bytes:
    return struct.pack("<IBIIIH", number, 2, 1, size, 0, 0) + bytes([number]) * (size - 19)


def _events_of_one_transaction(mariadb, table: str) -> list[bytes]:
    """The Table_map, Write_rows and Xid events of one insert, from the real binlog file, with
    their checksums cut (events inside a payload have none)."""
    mariadb.query(f"CREATE TABLE {table} (id INT PRIMARY KEY, v VARCHAR(20))")
    file, start = mariadb.query("SHOW MASTER STATUS")[0][:2]
    mariadb.query(f"INSERT INTO {table} VALUES (7, 'seven'), (8, 'eight')")
    data = (mariadb.binlog_dir / file).read_bytes()
    events = []
    at = int(start)
    while at < len(data):
        size = struct.unpack_from("<I", data, at + 9)[0]
        event_type = data[at + 4]
        if event_type in (0x13, 0x17, 0x10):  # table map, write rows v1, xid
            event = bytearray(data[at:at + size - 4])
            struct.pack_into("<I", event, 9, size - 4)
            events.append(bytes(event))
        at += size
    assert len(events) == 3
    return events


def _parse(raw_event: bytes, table_map: dict) -> BinLogPacketWrapper:
    ctl = SimpleNamespace(_get_dbms=lambda: "mariadb", charset="utf8mb4")
    return BinLogPacketWrapper(
        pymysql.protocol.MysqlPacket(b"\x00" + raw_event, "utf8"), table_map, ctl, (10, 11, 0),
        False, binlog_decoding.ALLOWED_EVENTS, None, None, None, None, False, False, False,
        False, False, False, None)


@pytest.mark.parametrize("compression", [0, 255])
def test_a_transaction_payload_yields_its_rows(mariadb, compression):
    db = f"payload_{compression}"
    mariadb.query(f"CREATE DATABASE IF NOT EXISTS {db}")
    inner = _events_of_one_transaction(mariadb, f"{db}.t")
    wrapper = _parse(_payload_event(inner, compression), {})
    assert isinstance(wrapper.event, TransactionPayloadEvent)
    parsed = list(wrapper.event.events())
    assert [type(e) for e in parsed][:2] == [TableMapEvent, WriteRowsEvent]
    converted = [e for inner_event in parsed for e in _stream()._convert(inner_event)]
    assert isinstance(converted[0], TableMap) and converted[0].schema.table == "t"
    assert isinstance(converted[1], Rows) and converted[1].op == "insert"
    assert converted[1].rows == [(7, "seven"), (8, "eight")]
    assert isinstance(converted[2], Xid)


def _library_event(rows: list[dict], present: int = 0b111) -> SimpleNamespace:
    """A rows event as mysql-replication decodes it: dicts by the table map's column names
    (``present``: the columns-present bitmap of its row images)."""
    columns = [SimpleNamespace(name=name) for name in ("id", "note", "n")]
    return SimpleNamespace(schema="shop", table="t", columns=columns, rows=rows,
                           columns_present_bitmap=bytes([0b111]),
                           columns_present_bitmap2=bytes([present]))


def test_rows_the_library_decodes_are_tuples_in_table_map_order():
    """The native decoder's row shape, whoever decoded the rows: the engine has one."""
    inserted = _library_event([{"values": {"n": 3, "id": 1, "note": "a"}}])
    assert _library_rows(inserted, False, "0-1-5") == [(1, "a", 3)]
    updated = _library_event([{"before_values": {"id": 1, "note": "a", "n": 3},
                               "after_values": {"id": 2, "note": None, "n": 3}}])
    assert _library_rows(updated, True, "0-1-5") == [((1, "a", 3), (2, None, 3))]


def test_a_library_row_without_a_table_map_column_is_a_loud_stop():
    partial = _library_event([{"values": {"id": 1, "n": 3}}])
    with pytest.raises(EngineError, match=r"table shop\.t: binlog row lacks column 'note' at "
                                          r"GTID 0-1-5; is binlog_row_image FULL\?"):
        _library_rows(partial, False, "0-1-5")


def test_a_partial_row_image_the_library_decodes_is_a_loud_stop():
    """binlog_row_image=MINIMAL set in a session: the library gives absent columns as None."""
    minimal = _library_event([{"before_values": {"id": 1, "note": "a", "n": 3},
                               "after_values": {"id": 1, "note": None, "n": 4}}],
                             present=0b101)
    with pytest.raises(EngineError, match=r"table shop\.t: binlog row lacks column 'note' at "
                                          r"GTID 0-1-5; is binlog_row_image FULL\?"):
        _library_rows(minimal, True, "0-1-5")


def test_payload_events_come_one_at_a_time_from_a_stream():
    raw = b"".join(_fake_event(n) for n in range(5))
    body = _payload_body(raw, zstandard.ZstdCompressor().compress(raw))
    events = payload_events(body)
    assert next(events) == _fake_event(0)  # (a generator: nothing after it is read yet)
    assert list(events) == [_fake_event(n) for n in range(1, 5)]


def _damaged_payloads() -> dict[str, bytes]:
    raw = b"".join(_fake_event(n) for n in range(20))
    frame = zstandard.ZstdCompressor().compress(raw)
    return {
        "a truncated frame": _payload_body(raw, frame[:-4]),
        "a frame cut in half": _payload_body(raw, frame[:len(frame) // 2]),
        "trailing bytes after the frame": _payload_body(raw, frame + b"junk"),
        "a second frame": _payload_body(raw, frame + frame),
        "more declared than decompressed": _payload_body(raw, frame, declared=len(raw) + 60),
        "less declared than decompressed": _payload_body(raw, frame, declared=len(raw) - 60),
        "a damaged frame": _payload_body(raw, frame[:20] + bytes(len(frame) - 20)),
        "an event cut short": _payload_body(raw[:-10], zstandard.ZstdCompressor().compress(
            raw[:-10])),
        "bytes after the data": _payload_body(raw, frame) + b"xx",
        "an unknown compression": _payload_body(raw, raw, compression=1),
        "an impossible event size": _payload_body(
            b"x" * 40, zstandard.ZstdCompressor().compress(
                struct.pack("<IBIIIH", 0, 2, 1, 5, 0, 0) + b"x" * 21)),
    }


@pytest.mark.parametrize("case", sorted(_damaged_payloads()))
def test_damaged_transaction_payloads_are_a_loud_stop(case):
    with pytest.raises(PayloadError):
        list(payload_events(_damaged_payloads()[case]))


def test_a_damaged_payload_stops_the_stream_naming_the_gtid(mariadb):
    mariadb.query("CREATE DATABASE IF NOT EXISTS payload_damaged")
    inner = _events_of_one_transaction(mariadb, "payload_damaged.t")
    raw = b"".join(inner)
    body = _payload_body(raw, zstandard.ZstdCompressor().compress(raw)[:-4])
    damaged = struct.pack("<IBIIIH", 0, TRANSACTION_PAYLOAD_EVENT, 1, 19 + len(body), 0,
                          0) + body
    stream = _stream()
    stream._reader = SimpleNamespace(fetchone=lambda: _parse(damaged, {}).event)
    with pytest.raises(UnsupportedEvent, match=r"GTID 3e11fa47-71ca-11e1-9e33-c80aa9429562:23:"
                                               r".*re-snapshot"):
        list(stream)


@pytest.mark.parametrize("flags", [64, 64 | 2, 128 | 1, 128 | 1 | 2])
def test_mariadb_gtid_events_name_their_xa_transaction(flags):
    """(Read by the adapter: the library's own GTID class stays what every user gets.)"""
    body = struct.pack("<QIB", 42, 0, flags)
    if flags & 2:  # FL_GROUP_COMMIT_ID: a commit id comes before the XA id
        body += struct.pack("<Q", 99)
    body += struct.pack("<IBB", 7, 2, 1) + b"x1" + b"b"
    header = struct.pack("<IBIIIH", 1700000000, 0xA2, 5, 19 + len(body), 0, 0)
    stream = _stream()
    stream._flavour = flavour_of("mariadb")
    [begin] = stream._convert(_parse(header + body, {}).event)
    assert begin.gtid == "0-5-42"
    assert begin.xid == binlog_decoding.xa_id(7, b"x1", b"b")
    assert begin.standalone is bool(flags & 1)


def test_registration_adds_event_types_and_replaces_none_the_library_maps():
    from pymysqlreplication import constants
    from pymysqlreplication.event import MariadbGtidEvent, QueryEvent

    event_map = BinLogPacketWrapper._BinLogPacketWrapper__event_map
    assert event_map[constants.MARIADB_GTID_EVENT] is MariadbGtidEvent
    assert event_map[constants.QUERY_EVENT] is QueryEvent
    assert event_map[TRANSACTION_PAYLOAD_EVENT] is TransactionPayloadEvent
    assert event_map[binlog_decoding.QUERY_COMPRESSED_EVENT] is (
        binlog_decoding.CompressedQueryEvent)


def test_an_undecodable_table_map_column_is_a_loud_stop_naming_the_gtid(monkeypatch):
    """A charset or ENUM member the adapter cannot decode (ValueError) stops like an
    unsupported type (NotImplementedError): with the table, the GTID and the fix."""
    from cdc_platform.capture.binlog import stream as binlog
    from cdc_platform.capture.binlog.stream import TableMapError

    def undecodable(event):
        try:
            raise ValueError("column c: unknown collation 999")
        except ValueError as error:
            raise ValueError(f"table {event.schema}.{event.table}: {error}") from error

    monkeypatch.setattr(binlog, "schema_from_table_map", undecodable)
    event = SimpleNamespace(schema="db", table="t")
    with pytest.raises(TableMapError, match=r"table db\.t at GTID .*c80aa9429562:23: column c: "
                                            r"unknown collation 999; exclude the column"):
        _stream()._table_schema(event)


def test_a_statement_whose_default_database_is_not_utf8_is_a_loud_stop():
    """The default database decides which tables a DDL or statement names: a name that does
    not decode is never guessed at (no replacement characters)."""
    from pymysqlreplication.event import QueryEvent

    from cdc_platform.capture.events import Query

    event = QueryEvent.__new__(QueryEvent)
    event.schema, event.query, event.timestamp = b"shop", "TRUNCATE t", 7
    assert list(_stream()._convert(event)) == [Query("TRUNCATE t", "shop", 7)]
    event.schema = b"sh\xffop"
    with pytest.raises(UnsupportedEvent, match=r"GTID .*c80aa9429562:23: its default database"):
        list(_stream()._convert(event))


# -- table maps the library does not know all of (MySQL 9 and later) ---------------------------


def _mysql_table_map(body: bytes) -> TableMapEvent:
    """A TABLE_MAP_EVENT parsed as the stream parses it (no checksum; a MySQL 8.0 source)."""
    raw = struct.pack("<IBIIIH", 1700000000, 0x13, 1, 19 + len(body), 0, 0) + body
    ctl = SimpleNamespace(_get_dbms=lambda: "mysql", charset="utf8mb4")
    wrapper = BinLogPacketWrapper(
        pymysql.protocol.MysqlPacket(b"\x00" + raw, "utf8"), {}, ctl, (8, 0, 40), False,
        binlog_decoding.ALLOWED_EVENTS, None, None, None, None, False, False, False, True,
        False, False, None)
    return wrapper.event


def _field(field_type: int, value: bytes) -> bytes:
    return bytes([field_type]) + lenenc(len(value)) + value


_ID = BuiltColumn("id", 3)
_NAME = BuiltColumn("name", 15, (40).to_bytes(2, "little"), collation=255)


def test_an_optional_metadata_field_the_library_does_not_know_is_skipped_by_its_length():
    """(mysql-replication raised ValueError: 99 is not a valid MetadataFieldType, and read
    every later field from the wrong place)"""
    event = _mysql_table_map(table_map_body(
        5, "shop", "t", [_ID, _NAME], extra_optional=_field(99, b"\x01\x02\x03")))
    assert event.unknown_metadata == {99: b"\x01\x02\x03"} and not event.undecodable
    [table_map] = _stream()._convert(event)
    assert [(c.name, c.kind) for c in table_map.schema.columns] == [("id", "int"),
                                                                     ("name", "string")]
    assert table_map.schema.primary_key == ("id",)


def test_a_column_type_the_library_does_not_know_stops_only_a_captured_table():
    """One column of an unknown type: its metadata is what the block has left over, so the
    columns after it and the optional metadata still decode; its values cannot."""
    event = _mysql_table_map(table_map_body(
        5, "shop", "t", [_ID, BuiltColumn("v", 243, b"\x07\x07"), _NAME]))
    assert [c.name for c in event.columns] == ["id", "v", "name"]
    assert event.columns[2].max_length == 40 and event.columns[2].collation_name
    stream = _stream()
    stream._wanted = lambda database, table: False
    assert list(stream._convert(event)) == []
    with pytest.raises(TableMapError) as raised:
        list(_stream()._convert(event))
    message = str(raised.value)
    assert message.startswith("table shop.t at GTID 3e11fa47-71ca-11e1-9e33-c80aa9429562:23: "
                              "column 'v' has binlog column type 243")
    assert "exclude the table (capture.tables)" in message


@pytest.mark.parametrize("case", ["two unknown types", "metadata cut short",
                                  "optional metadata cut short"])
def test_a_table_map_that_does_not_decode_stops_only_a_captured_table(case):
    columns = [_ID, BuiltColumn("v", 243, b"\x07"), BuiltColumn("w", 244, b"\x07"), _NAME]
    body = table_map_body(5, "shop", "t", columns if case == "two unknown types"
                          else [_ID, _NAME])
    if case == "metadata cut short":  # (VARCHAR's 2 bytes of metadata declared as 1)
        body = body.replace(b"\x02\x28\x00", b"\x01\x28", 1)
    elif case == "optional metadata cut short":
        body = body[:-2]
    event = _mysql_table_map(body)
    assert event.undecodable and event.table == "t"
    stream = _stream()
    stream._wanted = lambda database, table: False
    assert list(stream._convert(event)) == []
    with pytest.raises(TableMapError, match=r"^table shop\.t at GTID .*:23: (its column "
                                            r"metadata|its table map does not decode).*"
                                            r"exclude the table"):
        list(_stream()._convert(event))


def test_vector_columns_decode_as_binary_with_their_dimensions():
    """(MySQL lists a charset, binary, for each VECTOR column: the text column between them
    keeps its own)"""
    columns = [_ID, BuiltColumn("v", 242, b"\x04", collation=63), _NAME,
               BuiltColumn("w", 242, b"\x04", collation=63)]
    event = _mysql_table_map(table_map_body(5, "shop", "t", columns,
                                            extra_optional=_field(13, b"\x03\x7f")))
    assert not event.undecodable and event.columns[2].collation_name == "utf8mb4_0900_ai_ci"
    assert [getattr(c, "vector_dimensions", None) for c in event.columns] == [None, 3, None, 127]
    [table_map] = _stream()._convert(event)
    assert [c.kind for c in table_map.schema.columns] == ["int", "binary", "string", "binary"]
    # A snapshot's chunks describe the column from information_schema: the same spec, or
    # every chunk of the table would be rejected as read with other columns.
    vector = {"COLUMN_NAME": "v", "DATA_TYPE": "vector", "COLUMN_TYPE": "vector(3)",
              "CHARACTER_SET_NAME": None, "CHARACTER_OCTET_LENGTH": 12}
    assert column_from_information_schema(vector) == table_map.schema.columns[1]


def test_a_table_map_without_column_names_names_binlog_row_metadata():
    body = table_map_body(5, "shop", "t", [_ID, _NAME])
    names = _field(4, lenenc(2) + b"id" + lenenc(4) + b"name")
    event = _mysql_table_map(body.replace(names, b""))
    with pytest.raises(TableMapError) as raised:
        list(_stream()._convert(event))
    message = str(raised.value)
    assert "table shop.t at GTID 3e11fa47-71ca-11e1-9e33-c80aa9429562:23" in message
    assert "binlog_row_metadata=MINIMAL" in message and "binlog_row_metadata=FULL" in message
    assert "collation" not in message


# -- tagged GTIDs (MySQL 8.3+) -----------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 1, 63, 64, 127, 128, 2**14 - 1, 2**14, 2**56 - 1, 2**56,
                                   2**63 - 1, 2**64 - 1])
def test_mysql_serialization_integers_round_trip(value):
    encoded = binlog_decoding.write_varlen_uint(value)
    assert binlog_decoding.read_varlen_uint(encoded + b"tail", 0) == (value, len(encoded))
    for signed in (value >> 1, -(value >> 1) - 1):
        encoded = binlog_decoding.write_varlen_int(signed)
        assert binlog_decoding.read_varlen_int(encoded, 0) == (signed, len(encoded))


def test_the_mysql_9_6_tagged_gtid_event_decodes():
    """The body of rust_mysql_common's GTID_TAG file's event (checksum cut)."""
    body = bytes.fromhex(
        "027800000002aaee25020804650222c503c502e1029cc10311035502dead03040c060a6d797461670800"
        "0a040c7f1cf3b814244a0610a10412430f0b7872")
    tagged = binlog_decoding.decode_tagged_gtid(body)
    assert tagged.gtid == "55778904-0299-11f1-b1b8-4ef0c4956feb:mytag:3"
    assert binlog_decoding.decode_tagged_gtid(binlog_decoding.encode_tagged_gtid(tagged)) == (
        tagged)


@pytest.mark.parametrize("tag, gno", [("a", 1), ("_x9", 2**63 - 1), ("t" * 32, 1000)])
def test_tagged_gtid_events_round_trip(tag, gno):
    gtid = binlog_decoding.TaggedGtid("3e11fa47-71ca-11e1-9e33-c80aa9429562", tag, gno, 1, 5)
    assert binlog_decoding.decode_tagged_gtid(binlog_decoding.encode_tagged_gtid(gtid)) == gtid


def _with_field(body: bytes, field: bytes, last_non_ignorable: int) -> bytes:
    """The event with ``field`` appended and the message header rewritten."""
    size, at = binlog_decoding.read_varlen_uint(body, 1)
    _, at = binlog_decoding.read_varlen_uint(body, at)
    fields = body[at:size] + field
    head = binlog_decoding.write_varlen_uint(last_non_ignorable)
    for extra in (1, 2):
        total = 1 + extra + len(head) + len(fields)
        encoded = binlog_decoding.write_varlen_uint(total)
        if len(encoded) == extra:
            return b"\x02" + encoded + head + fields
    raise AssertionError


def test_tagged_gtid_events_that_do_not_check_out_are_refused():
    gtid = binlog_decoding.TaggedGtid("3e11fa47-71ca-11e1-9e33-c80aa9429562", "t", 5)
    body = binlog_decoding.encode_tagged_gtid(gtid)
    unknown = binlog_decoding.write_varlen_uint(40) + binlog_decoding.write_varlen_uint(1)
    # an unknown field after the last one a reader must understand is ignorable
    assert binlog_decoding.decode_tagged_gtid(_with_field(body, unknown, 0)) == gtid
    damaged = {
        "an unknown field a reader must understand": _with_field(body, unknown, 40),
        "an unknown format": b"\x04" + body[1:],
        "a message longer than the event": body[:-3],
        "no transaction number": b"\x02\x0a\x00\x00\x00",  # (only the flags field)
    }
    for case, data in damaged.items():
        with pytest.raises(ValueError):
            binlog_decoding.decode_tagged_gtid(data)
            raise AssertionError(case)
