"""Binlog files written by real MySQL servers (8.0.22 to 9.6.0), decoded by the binlog adapter
and the capture engine down to landed values, without a server (``mysql_binlog_files``).

The files and the values expected of them come from the test suites of rust_mysql_common and
mysql-binlog-connector-java (``binlogs/README.md``). Several were written with
``binlog_row_metadata=MINIMAL`` (those projects read it; capture needs FULL): they must stop
with that cause, the table and the GTID. Files written with ``gtid_mode=OFF`` have their
anonymous GTID events turned into GTID events first.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pymysql
import pytest
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import PartialUpdateRowsEvent, TableMapEvent

from cdc_platform.capture.binlog import table_maps
from cdc_platform.capture.binlog.decoding import (
    GTID_TAGGED_LOG_EVENT,
    TaggedGtid,
    encode_tagged_gtid,
)
from cdc_platform.capture.binlog.stream import BinlogStream, TableMapError
from cdc_platform.capture.engine import CaptureEngine, EngineOptions
from cdc_platform.capture.events import (
    Begin,
    EngineError,
    Event,
    Heartbeat,
    Rows,
    TableMap,
    UnsupportedEvent,
)
from cdc_platform.capture.flavours import flavour_of
from cdc_platform.capture.gtid import MysqlGtidSet
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.source import TableSelector
from cdc_platform_tests.capture.mysql_binlog_files import (
    ANONYMOUS_UUID,
    BINLOGS,
    BinlogFile,
    BinlogFileServer,
    BuiltColumn,
    datetime2,
    gtid_body,
    query_body,
    read_binlog,
    table_map_body,
    write_rows_body,
    xa_prepare_body,
    xid_body,
)

CONNECTION = {"host": "binlog-file", "port": 3306, "user": "cdc", "password": ""}
MINIMAL_FILES = {  # file -> (the first table its stop names, the GTID it names)
    "minimal_row_metadata.000001": ("noria.t1", f"{ANONYMOUS_UUID}:1"),
    "time_issue.000001": ("noria.t", f"{ANONYMOUS_UUID}:1"),
    "transaction_compression.000001": ("test.tb1", f"{ANONYMOUS_UUID}:1"),  # zstd payload
    "mysql-bin.compressed": ("demo.movies", f"{ANONYMOUS_UUID}:1"),  # zstd payload
    "json.binlog.000001": ("mysql.t", f"{ANONYMOUS_UUID}:3"),
    "binlog_transaction_with_GTID_TAG.000001": (
        "test.orders", "55778904-0299-11f1-b1b8-4ef0c4956feb:mytag:3"),
}


def _stream(monkeypatch: pytest.MonkeyPatch, binlog: BinlogFile, position: str = "",
            wanted: Any = lambda database, table: True, **variables: str
            ) -> tuple[BinlogStream, BinlogFileServer]:
    server = BinlogFileServer(binlog, **variables)
    monkeypatch.setattr(pymysql, "connect", server.connect)
    return BinlogStream(CONNECTION, 77, flavour_of("mysql"), position, 1, wanted), server


def _events(stream: BinlogStream) -> list[Event]:
    """The stream's events up to the first heartbeat (the end of the file)."""
    out = []
    for event in stream:
        if isinstance(event, Heartbeat):
            return out
        out.append(event)
    raise AssertionError("the stream ended without a heartbeat")


def _named_rows(events: list[Event]) -> list[tuple[Rows, list[dict[str, Any]]]]:
    """Each rows event with its rows as {column: value} (after-images of updates), named by
    the columns of its table map."""
    names: dict[int, tuple[str, ...]] = {}
    out = []
    for event in events:
        if isinstance(event, TableMap):
            names[event.table_id] = event.schema.column_names
        elif isinstance(event, Rows):
            assert not event.columnar
            images = [row[1] for row in event.rows] if event.op == "update" else event.rows
            out.append((event, [dict(zip(names[event.table_id], image, strict=True))
                                for image in images]))
    return out


def test_the_files_are_the_mysql_servers_own():
    versions = {p.name: BinlogFile.read(p).server_version for p in sorted(BINLOGS.iterdir())
                if p.name != "README.md"}
    assert set(versions.values()) >= {"8.0.22", "8.0.26", "8.0.28", "8.0.32", "8.0.40",
                                      "9.0.1", "9.6.0"}


def test_vector_columns_land_as_their_bytes_and_text_beside_them_keeps_its_charset(
        monkeypatch):
    stream, _ = _events_of(monkeypatch, "vector.binlog")
    maps = {e.schema.table: e.schema for e in stream if isinstance(e, TableMap)}
    assert [(c.name, c.kind) for c in maps["bar"].columns] == [
        ("id", "uint64"), ("vector_column", "binary"), ("foo", "string"),
        ("vector_column2", "binary")]
    rows = [(e.table, e.op, named) for e, named in _named_rows(stream)]
    # rust_mysql_common's expectation for table foo (VECTOR(3) of 1.1, 2.2, 3.3 and 1, -1, 0)
    assert rows[0] == ("foo", "insert", [
        {"id": 1, "vector_column": bytes([205, 204, 140, 63, 205, 204, 12, 64, 51, 51, 83, 64])},
        {"id": 2, "vector_column": bytes([0, 0, 128, 63, 0, 0, 128, 191, 0, 0, 0, 0])}])
    bar = [r for table, _, rs in rows if table == "bar" for r in rs]
    assert [struct.unpack("<2f", r["vector_column"]) for r in bar][:2] == [
        pytest.approx((1.1, 2.2)), pytest.approx((1.01, -1.01))]
    assert [r["foo"] for r in bar][:2] == [None, "bar"]  # (text: utf8mb4, not VECTOR's binary)
    assert struct.unpack("<4f", bar[1]["vector_column2"]) == (42.0, 43.0, 44.0, 45.0)


def _events_of(monkeypatch: pytest.MonkeyPatch, name: str, **kwargs: Any
               ) -> tuple[list[Event], BinlogFileServer]:
    stream, server = _stream(monkeypatch, read_binlog(name), **kwargs)
    try:
        return _events(stream), server
    finally:
        stream.close()


def test_json_opaque_scalars_of_mysql_9(monkeypatch):
    events, _ = _events_of(monkeypatch, "json-opaque.binlog")
    values = [rows[0]["a"] for _, rows in _named_rows(events)]
    # rust_mysql_common's expectations, as the adapter gives them (keys as bytes; landed as
    # JSON text by the engine)
    assert [{k.decode(): str(v) if k in (b"d", b"e") and i in (4, 5) else v
             for k, v in value.items()} for i, value in enumerate(values)] == [
        {"a": "base64:type15:VQ=="}, {"b": "2012-03-18"}, {"c": "2012-03-18 11:30:45.000000"},
        {"c": "87:31:46.654321"}, {"d": "123.456"}, {"e": "9.00"}, {"e": [0, 1, True, False]},
        {"e": None}]


def test_enum_set_text_and_bit_columns_of_mysql_8(monkeypatch):
    events, _ = _events_of(monkeypatch, "mysql-enum-string-set.000001")
    rows = _named_rows(events)
    assert [e.op for e, _ in rows] == ["insert", "update", "delete"]
    digits = "0123456789"
    long_text = (digits * 12 + "012345678") * 2 + digits * 4  # (rust_mysql_common's literal)
    inserted = rows[0][1][0]
    assert inserted["f1"] == digits * 10 and inserted["f2"] == long_text
    assert inserted["f3"] == b"var1" and inserted["f4"] == {b"one", b"three"}  # 1, 0b101
    assert inserted["f5"] == digits
    deleted = rows[2][1][0]
    assert (deleted["f1"], deleted["f2"], deleted["f3"], deleted["f4"]) == (
        "field1", "field_2", b"variant2", {b"two", b"four"})  # 2, 0b1010
    assert deleted["f5"] == long_text
    events, _ = _events_of(monkeypatch, "mysql_type_bit.000001")
    [(_, bits)] = _named_rows(events)
    assert bits == [{"a": "100", "b": "foo", "c": "00100000"}]  # 0b100, 0b100000


@pytest.mark.parametrize("name", sorted(MINIMAL_FILES))
def test_a_table_map_without_column_names_stops_naming_binlog_row_metadata(monkeypatch, name):
    table, gtid = MINIMAL_FILES[name]
    with pytest.raises(TableMapError) as raised:
        _events_of(monkeypatch, name)
    message = str(raised.value)
    assert f"table {table} at GTID {gtid}:" in message
    assert "binlog_row_metadata=MINIMAL" in message and "binlog_row_metadata=FULL" in message
    assert "collation" not in message and "column None" not in message


@pytest.mark.parametrize("name", sorted(MINIMAL_FILES))
def test_tables_that_are_not_captured_never_stop_the_stream(monkeypatch, name):
    """Their table maps (MINIMAL here), rows and partial JSON updates pass unread."""
    events, _ = _events_of(monkeypatch, name, wanted=lambda database, table: False)
    assert not [e for e in events if isinstance(e, Rows | TableMap)]
    assert [e for e in events if isinstance(e, Begin)]


def test_the_tagged_gtid_of_mysql_9_6_begins_its_transaction(monkeypatch):
    events, _ = _events_of(monkeypatch, "binlog_transaction_with_GTID_TAG.000001",
                           wanted=lambda database, table: False)
    assert [e.gtid for e in events if isinstance(e, Begin)] == [
        "55778904-0299-11f1-b1b8-4ef0c4956feb:mytag:3"]


def _library_events(binlog: BinlogFile, only: list[type]) -> list[Any]:
    server = BinlogFileServer(binlog)
    reader = BinLogStreamReader(
        connection_settings={"host": "binlog-file", "port": 3306, "user": "cdc", "passwd": ""},
        server_id=77, blocking=False, pymysql_wrapper=server.connect, only_events=only,
        log_file=binlog.name, log_pos=4)
    try:
        return list(reader)
    finally:
        reader.close()


def test_a_partial_json_update_stops_naming_the_setting_table_and_gtid():
    """MySQL 8.0.22's PARTIAL_UPDATE_ROWS_EVENT (binlog_row_value_options=PARTIAL_JSON)."""
    events = _library_events(read_binlog("json.binlog.000001"),
                             [TableMapEvent, PartialUpdateRowsEvent])
    [partial] = [e for e in events if isinstance(e, PartialUpdateRowsEvent)]
    stream = BinlogStream.__new__(BinlogStream)
    stream._wanted = lambda database, table: True
    stream._gtid = f"{ANONYMOUS_UUID}:7"
    with pytest.raises(UnsupportedEvent) as raised:
        list(stream._convert(partial))
    message = str(raised.value)
    assert f"table mysql.t at GTID {ANONYMOUS_UUID}:7" in message
    assert "binlog_row_value_options=PARTIAL_JSON" in message
    assert "binlog_row_value_options=''" in message and "re-snapshot" in message
    stream._wanted = lambda database, table: False
    assert list(stream._convert(partial)) == []


def test_the_tagged_previous_gtids_event_reads_as_the_tagged_set_mysql_wrote():
    """PREVIOUS_GTIDS_LOG_EVENT holds a GTID set in the binary form COM_BINLOG_DUMP_GTID sends
    (``gtid.encode_mysql_gtid_set``): checked against MySQL 9.6's own bytes."""
    from cdc_platform.capture.gtid import decode_mysql_gtid_set, encode_mysql_gtid_set

    binlog = read_binlog("binlog_transaction_with_GTID_TAG.000001")
    [previous] = [e for e in binlog.events if e[4] == 35]
    body = previous[19:-4]
    expected = MysqlGtidSet.parse("55778904-0299-11f1-b1b8-4ef0c4956feb:1-13:mytag:1-2")
    assert decode_mysql_gtid_set(body) == expected
    assert encode_mysql_gtid_set(expected) == body
    [untagged] = [e for e in read_binlog("binlog_transaction_previous_GTID_no_tag.000001").events
                  if e[4] == 35]
    assert decode_mysql_gtid_set(untagged[19:-4]) == MysqlGtidSet.parse(
        "b9b88c66-0755-11f1-9899-4a9da94c4d71:1-2")


# -- the engine, down to landed values ----------------------------------------------------------


def _engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, binlog: BinlogFile,
            **variables: str) -> tuple[CaptureEngine, BinlogFileServer]:
    server = BinlogFileServer(binlog, heartbeats=1000, **variables)
    monkeypatch.setattr(pymysql, "connect", server.connect)
    options = EngineOptions(
        server_name="mysql_files", flavour="mysql", server_id=77, connection_settings=CONNECTION,
        # (several files write their tables into the `mysql` database)
        selector=TableSelector(system_databases=()), heartbeat_seconds=1,
        flush_interval_seconds=0.05, initial_backoff_seconds=0.05, initial_position="earliest")
    return CaptureEngine(options, LandingZone(str(tmp_path / "landing"), "mysql_files")), server


def _landed(engine: CaptureEngine, database: str, table: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for _, _, path in engine.landing.segments(database, table):
        rows += pq.read_table(path).to_pylist()
    return sorted(rows, key=lambda r: r["__cdc_pos"])


def _values(rows: list[dict[str, Any]], *columns: str) -> list[tuple[Any, ...]]:
    return [(r["__cdc_op"], *(r[c] for c in columns)) for r in rows]


def test_the_engine_lands_mysql_9_vectors_and_text(tmp_path, monkeypatch):
    engine, _ = _engine(tmp_path, monkeypatch, read_binlog("vector.binlog"))
    engine.run(stop_when_caught_up=True)
    foo = _landed(engine, "dtb", "foo")
    # (the file creates, fills, drops and creates the tables again: twice the same rows;
    # SERIAL is BIGINT UNSIGNED, landed as DECIMAL(20))
    assert _values(foo, "id", "vector_column") == 2 * [
        ("c", 1, bytes([205, 204, 140, 63, 205, 204, 12, 64, 51, 51, 83, 64])),
        ("c", 2, bytes([0, 0, 128, 63, 0, 0, 128, 191, 0, 0, 0, 0]))]
    assert [r["__cdc_gtid"] for r in foo] == [f"{ANONYMOUS_UUID}:{n}" for n in (4, 4, 9, 9)]
    bar = _landed(engine, "dtb", "bar")
    assert _values(bar, "id", "foo")[-4:] == [("c", 1, None), ("c", 2, "bar"), ("d", 2, None),
                                              ("c", 3, None)]
    assert struct.unpack("<4f", bar[1]["vector_column2"]) == (42.0, 43.0, 44.0, 45.0)


def test_the_engine_lands_enum_set_text_bit_and_invisible_columns(tmp_path, monkeypatch):
    for name, table in (("mysql-enum-string-set.000001", "t"), ("mysql_type_bit.000001", "foo"),
                        ("binlog-invisible-columns.000001", "t1")):
        engine, _ = _engine(tmp_path / name, monkeypatch, read_binlog(name))
        engine.run(stop_when_caught_up=True)
        landed = _landed(engine, "mysql", table)
        if table == "t":  # (no primary key: the delete lands as a tombstone without one)
            assert _values(landed, "f1", "f3", "f4", "f5")[:2] == [
                ("c", "0123456789" * 10, "var1", "one,three", "0123456789"),
                ("u", "field1", "variant2", "two,four", landed[0]["f2"])]
            assert [r["__cdc_op"] for r in landed] == ["c", "u", "d"]
        elif table == "foo":
            assert _values(landed, "a", "b", "c") == [("c", 0b100, "foo", 0b100000)]
        else:
            assert _values(landed, "f1", "f2", "f3", "f4", "f5", "f6") == [
                ("c", 1, 2, -3, "4", b"\x05", 6000000000),
                ("c", None, None, -33, "44", b"U", None),
                ("u", 111, 222, -333, "444", b"U", None)]


def _tagged(binlog: BinlogFile, tag: str) -> BinlogFile:
    """The file with each GTID event replaced by the GTID_TAGGED_LOG_EVENT MySQL 8.3+ writes
    for it under ``SET gtid_next='AUTOMATIC:tag'`` (built from the documented format)."""
    events = []
    for event in binlog.events:
        gtid = binlog.gtid_of(event)
        if gtid is not None:
            body = encode_tagged_gtid(TaggedGtid(gtid.uuid, tag, gtid.gno))
            event = binlog.event(GTID_TAGGED_LOG_EVENT, body, struct.unpack_from("<I", event)[0])
        events.append(event)
    return BinlogFile(binlog.name, binlog.server_version, binlog.checksum, events)


def test_tagged_gtids_end_to_end_land_checkpoint_and_resume(tmp_path, monkeypatch):
    binlog = _tagged(read_binlog("vector.binlog"), "orders")
    engine, _ = _engine(tmp_path, monkeypatch, binlog)
    engine.run(stop_when_caught_up=True)
    foo = _landed(engine, "dtb", "foo")
    assert [r["__cdc_gtid"] for r in foo] == [
        f"{ANONYMOUS_UUID}:orders:{n}" for n in (4, 4, 9, 9)]
    checkpoint = engine.landing.read_checkpoint()
    assert checkpoint.gtid == f"{ANONYMOUS_UUID}:orders:1-10"
    landed = {t: len(_landed(engine, "dtb", t)) for t in ("foo", "bar")}

    # A second run resumes after the tagged set: the server is asked, in the tagged binary
    # format, for what the set lacks, and nothing lands twice.
    again, server = _engine(tmp_path, monkeypatch, binlog)
    again.run(stop_when_caught_up=True)
    [stream] = [c for c in server.connections if c.requested is not None]
    assert stream.requested == MysqlGtidSet.parse(checkpoint.gtid)
    assert {t: len(_landed(again, "dtb", t)) for t in ("foo", "bar")} == landed


def test_a_tagged_gtid_event_that_does_not_decode_stops_naming_the_gtid_before_it(
        tmp_path, monkeypatch):
    binlog = _tagged(read_binlog("vector.binlog"), "orders")
    index = [i for i, e in enumerate(binlog.events) if e[4] == GTID_TAGGED_LOG_EVENT][2]
    damaged = bytearray(binlog.events[index])
    damaged[19] = 7  # an unknown serialization format
    binlog.events[index] = binlog._sealed(damaged)
    engine, _ = _engine(tmp_path, monkeypatch, binlog)
    with pytest.raises(EngineError, match=rf"GTID_TAGGED_LOG_EVENT after GTID "
                                          rf"{ANONYMOUS_UUID}:orders:2 does not decode: "
                                          r"serialization format 7"):
        engine.run(stop_when_caught_up=True)


def test_the_engine_stops_on_a_minimal_table_map_naming_the_setting(tmp_path, monkeypatch):
    engine, _ = _engine(tmp_path, monkeypatch, read_binlog("transaction_compression.000001"))
    with pytest.raises(EngineError, match=r"table test\.tb1 at GTID .*binlog_row_metadata="
                                          r"MINIMAL"):
        engine.run(stop_when_caught_up=True)


# -- what no public file holds: events built from MySQL's documented formats --------------------

SOURCE_UUID = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
_SHOP_COLUMNS = [
    BuiltColumn("id", 3),  # INT
    BuiltColumn("dt", 18, b"\x06"),  # DATETIME(6)
    BuiltColumn("g", 255, b"\x04"),  # GEOMETRY (4-byte length)
    BuiltColumn("s", 15, (400).to_bytes(2, "little"), collation=255),  # VARCHAR(100) utf8mb4
]
_POINT = (0).to_bytes(4, "little") + bytes.fromhex("0101000000") + struct.pack("<2d", 1.5, -2)


def _shop_rows(first_id: int) -> list[list[bytes | None]]:
    text = "😀 ünï 𝄞".encode()
    return [
        [first_id.to_bytes(4, "little"), datetime2(2024, 2, 29, 23, 59, 59, 999999, 6),
         len(_POINT).to_bytes(4, "little") + _POINT, len(text).to_bytes(2, "little") + text],
        [(first_id + 1).to_bytes(4, "little"), datetime2(1000, 1, 1, 0, 0, 0, 1, 6), None,
         (5).to_bytes(2, "little") + "𝄞".encode() + b"\x00"],  # (then a NUL)
    ]


def _built_binlog() -> BinlogFile:
    """MySQL 8.0.40 (its real format description event) writing an XA transaction (XA
    PREPARE, then XA COMMIT as its own GTID) and a plain one, over DATETIME(6), GEOMETRY and
    4-byte UTF-8 values."""
    real = read_binlog("time_issue.000001")
    binlog = BinlogFile("built.000001", real.server_version, real.checksum, real.events[:1])
    xa = "X'7831',X'',1"
    table_map = table_map_body(200, "shop", "things", _SHOP_COLUMNS)
    for event_type, body in (
        (33, gtid_body(SOURCE_UUID, 1)), (2, query_body("shop", f"XA START {xa}")),
        (19, table_map), (30, write_rows_body(200, 4, _shop_rows(1))),
        (2, query_body("shop", f"XA END {xa}")), (38, xa_prepare_body(1, b"x1", b"")),
        (33, gtid_body(SOURCE_UUID, 2)), (2, query_body("shop", f"XA COMMIT {xa}")),
        (33, gtid_body(SOURCE_UUID, 3)), (2, query_body("shop", "BEGIN")),
        (19, table_map), (30, write_rows_body(200, 4, _shop_rows(3))), (16, xid_body(9)),
    ):
        binlog.events.append(binlog.event(event_type, body, 1_700_000_000))
    return binlog


def test_xa_datetime6_geometry_and_4_byte_utf8_land_exactly(tmp_path, monkeypatch):
    import datetime as dt

    engine, _ = _engine(tmp_path, monkeypatch, _built_binlog())
    engine.run(stop_when_caught_up=True)
    landed = _landed(engine, "shop", "things")
    expected = []
    for first, gtid in ((1, 2), (3, 3)):  # (the XA rows land under the XA COMMIT's GTID)
        expected += [
            ("c", first, dt.datetime(2024, 2, 29, 23, 59, 59, 999999), _POINT, "😀 ünï 𝄞",
             f"{SOURCE_UUID}:{gtid}"),
            ("c", first + 1, dt.datetime(1000, 1, 1, 0, 0, 0, 1), None, "𝄞\x00",
             f"{SOURCE_UUID}:{gtid}")]
    got = [(*v, r["__cdc_gtid"]) for v, r in zip(_values(landed, "id", "dt", "g", "s"),
                                                 landed, strict=True)]
    assert [(op, i, d.replace(tzinfo=None) if d else d, g, s, gtid)
            for op, i, d, g, s, gtid in got] == expected
    assert MysqlGtidSet.parse(engine.landing.read_checkpoint().gtid) == MysqlGtidSet.parse(
        f"{SOURCE_UUID}:1-3")


@pytest.mark.parametrize("name", ["transaction_compression.000001", "mysql-bin.compressed"])
def test_zstd_transaction_payloads_of_mysql_8_0_hold_their_transaction(name):
    """The payloads (MySQL 8.0.32 and 8.0.28, binlog_transaction_compression=ON) decompress
    to a statement, a table map, the rows and the commit (rust_mysql_common expects these
    four for its file; mysql-binlog-connector-java reads its file as 5 events, the payload
    one of them)."""
    from pymysqlreplication.event import QueryEvent, XidEvent
    from pymysqlreplication.row_event import UpdateRowsEvent, WriteRowsEvent

    from cdc_platform.capture.binlog.decoding import TransactionPayloadEvent

    binlog = read_binlog(name)
    assert len(binlog.events) == 5
    [payload] = _library_events(binlog, [TransactionPayloadEvent])
    rows = WriteRowsEvent if name.startswith("transaction") else UpdateRowsEvent
    assert [type(e) for e in payload.events()] == [QueryEvent, TableMapEvent, rows, XidEvent]


def test_a_file_written_with_gtid_mode_off_stops_at_its_first_transaction(monkeypatch):
    """(Unconverted: MySQL 9.0's ANONYMOUS_GTID_LOG_EVENT, a transaction without a GTID.)"""
    stream, _ = _stream(monkeypatch, read_binlog("json-opaque.binlog", with_gtids=False))
    with pytest.raises(UnsupportedEvent, match=r"ANONYMOUS_GTID_LOG_EVENT .*Fix: a transaction "
                                               r"without a GTID: set gtid_mode=ON"):
        _events(stream)


def _decoded(monkeypatch: pytest.MonkeyPatch, name: str) -> list[Any]:
    """Every project event of a file, comparable: a stop ends the list with its message."""
    out: list[Any] = []
    stream, _ = _stream(monkeypatch, read_binlog(name))
    try:
        for event in stream:
            if isinstance(event, Heartbeat):
                break
            if isinstance(event, Rows):
                rows = event.rows
                if event.columnar:
                    rows = [[c.to_pylist() if hasattr(c, "to_pylist") else list(c)
                             for c in image] for image in rows.images]
                out.append(("rows", event.table, event.op, repr(rows)))
            else:
                out.append(event)
    except UnsupportedEvent as error:
        out.append(("stop", str(error)))
    finally:
        stream.close()
    return out


@pytest.mark.parametrize("name", sorted(p.name for p in BINLOGS.iterdir()
                                        if p.name != "README.md"))
def test_a_table_map_decoded_again_from_the_cache_gives_the_same_events(monkeypatch, name):
    """The adapter keeps decoded table maps by their bytes (``TABLE_MAPS``): a file read again
    with every map cached gives the same schemas, rows and stops as read cold, and its maps
    come from the cache (the same ``Table`` objects and schemas, no new entries)."""
    monkeypatch.setattr(table_maps, "TABLE_MAPS", table_maps.TableMapCache(16_384))
    cold = _decoded(monkeypatch, name)
    cached = dict(table_maps.TABLE_MAPS.entries)
    tables = {id(entry.parts["table_obj"]) for entry in cached.values()}
    schemas = {id(entry.schema) for entry in cached.values()}
    warm = _decoded(monkeypatch, name)
    assert warm == cold
    assert table_maps.TABLE_MAPS.entries.keys() == cached.keys()
    entries = table_maps.TABLE_MAPS.entries.values()
    assert {id(e.parts["table_obj"]) for e in entries} == tables
    assert {id(e.schema) for e in entries} == schemas
    if any(isinstance(e, TableMap) for e in cold):
        assert cached
        assert all(e.schema is not None for e in cached.values()) or any(
            "stop" in str(e) for e in cold if isinstance(e, tuple))


def test_the_table_map_cache_is_bounded_by_the_columns_it_holds(monkeypatch):
    """vector.binlog maps ``foo`` (2 columns) and ``bar`` (4): room for 5 columns holds one
    map at a time (a map weighs its columns and one), and a map larger than the room none."""
    monkeypatch.setattr(table_maps, "TABLE_MAPS", table_maps.TableMapCache(5))
    events = _decoded(monkeypatch, "vector.binlog")
    assert len({e.schema.table for e in events if isinstance(e, TableMap)}) == 2
    cache = table_maps.TABLE_MAPS
    assert len(cache.entries) == 1 and cache.columns <= 5
    assert cache.columns == sum(e.weight for e in cache.entries.values())
    monkeypatch.setattr(table_maps, "TABLE_MAPS", table_maps.TableMapCache(2))
    again = _decoded(monkeypatch, "vector.binlog")
    assert again == events  # (decoded each time, the same)
    assert table_maps.TABLE_MAPS.entries == {} and table_maps.TABLE_MAPS.columns == 0


def test_the_same_table_map_under_a_new_table_id_maps_its_rows(monkeypatch):
    """A server gives a table a new id after a flush or an ALTER: the map's bytes then differ
    only in the id, and the rows that follow name the new id, so a cached map must never
    answer for it (its rows would find no table and vanish)."""
    real = read_binlog("time_issue.000001")
    binlog = BinlogFile("ids.000001", real.server_version, real.checksum, real.events[:1])
    for gno, table_id in ((1, 200), (2, 201), (3, 200)):
        for event_type, body in (
                (33, gtid_body(SOURCE_UUID, gno)), (2, query_body("shop", "BEGIN")),
                (19, table_map_body(table_id, "shop", "things", _SHOP_COLUMNS)),
                (30, write_rows_body(table_id, 4, _shop_rows(gno * 10))), (16, xid_body(gno))):
            binlog.events.append(binlog.event(event_type, body, 1_700_000_000))
    monkeypatch.setattr(table_maps, "TABLE_MAPS", table_maps.TableMapCache(16_384))
    stream, _ = _stream(monkeypatch, binlog)
    try:
        events = _events(stream)
    finally:
        stream.close()
    assert [e.table_id for e in events if isinstance(e, TableMap)] == [200, 201, 200]
    rows = [e for e in events if isinstance(e, Rows)]
    assert [(e.table_id, len(e.rows if not e.columnar else e.rows.images[0][0]))
            for e in rows] == [(200, 2), (201, 2), (200, 2)]
    assert len(table_maps.TABLE_MAPS.entries) == 2
