"""The binlog adapter's own decisions: the library's events turned into the project's, the
loud stop on every event type it does not know, rows the library decoded in the native
decoder's shape."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pymysqlreplication.event import NotImplementedEvent

from cdc_platform.capture.binlog import decoding as binlog_decoding
from cdc_platform.capture.binlog.rowcodec import RowsDecoders
from cdc_platform.capture.binlog.stream import BinlogStream, _library_rows
from cdc_platform.capture.events import EngineError, Heartbeat, UnsupportedEvent
from cdc_platform.capture.flavours import flavour_of


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
