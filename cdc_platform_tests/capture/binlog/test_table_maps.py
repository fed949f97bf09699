"""Table maps the library does not know all of (MySQL 9 and later): read by their declared
lengths, stopping the stream only for a captured table."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pymysql.protocol
import pytest
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import TableMapEvent

from cdc_platform.capture.binlog import decoding as binlog_decoding
from cdc_platform.capture.binlog.stream import TableMapError
from cdc_platform.capture.schema import column_from_information_schema
from cdc_platform_tests.capture.binlog.test_stream import _stream
from cdc_platform_tests.capture.mysql_binlog_files import BuiltColumn, lenenc, table_map_body


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
