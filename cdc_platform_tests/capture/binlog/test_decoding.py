"""Binlog events the library does not decode: compressed bodies, MySQL transaction payloads
(built here from real event bytes: MySQL cannot run on this machine), MariaDB XA GTIDs, tagged
GTIDs (``binlog/decoding.py``)."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pymysql.protocol
import pytest
import zstandard
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
from cdc_platform.capture.events import (
    Rows,
    TableMap,
    UnsupportedEvent,
    Xid,
)
from cdc_platform.capture.flavours import flavour_of
from cdc_platform_tests.capture.binlog.test_stream import _stream


def test_inflate_reads_mariadb_compressed_bodies_and_refuses_damaged_ones():
    for raw in (b"", b"x", b"abc" * 500, bytes(range(256)) * 300):
        assert inflate(deflate(raw), "test") == raw
    damaged = bytearray(deflate(b"abc" * 100))
    damaged[-3] ^= 0xFF
    with pytest.raises(UnsupportedEvent, match="does not inflate|inflated to"):
        inflate(bytes(damaged), "test")
    with pytest.raises(UnsupportedEvent, match="not a MariaDB compressed body"):
        inflate(b"\x01abc", "test")


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
