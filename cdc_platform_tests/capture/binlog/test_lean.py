"""The lean decoder (``capture/binlog/lean.py``) against mysql-replication: the same binlog read
both ways gives the same project events, event for event, and the same stop where one stops.

"Both ways": the adapter as it runs (the frequent small events read from the packets, the
rest handed to the library), and the adapter with the lean decoder never started, so every
event is the library's. The binlogs: the real MySQL 8/9 files of ``binlogs/``, a private
MariaDB's mixed workload (with CRC32 checksums, without, and with compressed events), and
random rows events built from MySQL's documented formats (hypothesis).
"""

from __future__ import annotations

import collections
import datetime as dt
import decimal
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_platform.capture.binlog import lean
from cdc_platform.capture.binlog.stream import BinlogStream
from cdc_platform.capture.events import Begin, EngineError, Event, Heartbeat
from cdc_platform.capture.flavours import flavour_of
from cdc_platform.devservices.mariadb import MariaDBServer
from cdc_platform_tests.capture.mysql_binlog_files import (
    BINLOGS,
    BinlogFile,
    BinlogFileServer,
    BuiltColumn,
    datetime2,
    gtid_body,
    query_body,
    read_binlog,
    table_map_body,
    xid_body,
)

CONNECTION = {"host": "binlog-file", "port": 3306, "user": "cdc", "password": ""}
SOURCE_UUID = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
Outcome = tuple[list[Event], str | None]


class LeanCounts:
    """How many packets of each event type the lean decoder read (True) or handed on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.counts: collections.Counter[tuple[int, bool]] = collections.Counter()
        decode = lean.LeanDecoder.decode

        def counted(decoder: lean.LeanDecoder, packet: bytes) -> Any:
            events = decode(decoder, packet)
            self.counts[packet[5], events is not None] += 1
            return events

        monkeypatch.setattr(lean.LeanDecoder, "decode", counted)

    def read(self, *event_types: int) -> int:
        return sum(self.counts[t, True] for t in event_types)


def _outcome(stream: BinlogStream, until_heartbeat: int = 1) -> Outcome:
    """The stream's events up to its ``until_heartbeat``-th heartbeat, and the stop (its
    type and message) when it stops before."""
    events: list[Event] = []
    try:
        for event in stream:
            if isinstance(event, Heartbeat):
                until_heartbeat -= 1
                if not until_heartbeat:
                    return events, None
                continue
            events.append(event)
    except (EngineError, ValueError, KeyError, AssertionError) as error:
        return events, f"{type(error).__name__}: {error}"
    finally:
        stream.close()
    raise AssertionError("the stream ended without a heartbeat")


def _both_ways(monkeypatch: pytest.MonkeyPatch, open_stream: Any) -> tuple[Outcome, Outcome]:
    """(lean, library) outcomes of the streams ``open_stream()`` opens."""
    leaned = _outcome(open_stream())
    with monkeypatch.context() as patch:
        patch.setattr(BinlogStream, "_sync_lean", lambda self: None)  # (never starts)
        library = _outcome(open_stream())
    return leaned, library


# -- the MySQL 8/9 files ---------------------------------------------------------------------

BINLOG_FILES = sorted(p.name for p in BINLOGS.iterdir() if p.name != "README.md")


def _file_stream(monkeypatch: pytest.MonkeyPatch, binlog: BinlogFile, wanted: Any) -> Any:
    def open_stream() -> BinlogStream:
        server = BinlogFileServer(binlog)
        monkeypatch.setattr(pymysql, "connect", server.connect)
        return BinlogStream(CONNECTION, 77, flavour_of("mysql"), "", 1, wanted)
    return open_stream


@pytest.mark.parametrize("name", BINLOG_FILES)
@pytest.mark.parametrize("captured", ["all", "some"])
def test_mysql_files_decode_the_same_both_ways(monkeypatch, name, captured):
    binlog = read_binlog(name)
    wanted = ((lambda database, table: True) if captured == "all" else
              (lambda database, table: len(table) % 2 == 0))
    leaned, library = _both_ways(monkeypatch, _file_stream(monkeypatch, binlog, wanted))
    assert leaned == library
    assert leaned[0] or leaned[1]


def test_the_mysql_files_go_the_lean_way_for_the_frequent_events(monkeypatch):
    counts = LeanCounts(monkeypatch)
    for name in BINLOG_FILES:
        _both_ways(monkeypatch, _file_stream(monkeypatch, read_binlog(name),
                                             lambda database, table: True))
    assert counts.read(33) >= 20 and counts.read(16) >= 10 and counts.read(2) >= 30
    assert counts.read(19) >= 10


# -- random rows events (MySQL's formats) ------------------------------------------------------

_INT, _BIGINT, _VARCHAR, _DATETIME6, _DOUBLE = 3, 8, 15, 18, 5
_COLUMNS = {
    "int": (BuiltColumn("i", _INT), st.integers(-2**31, 2**31 - 1).map(
        lambda v: v.to_bytes(4, "little", signed=True))),
    "ubigint": (BuiltColumn("u", _BIGINT, unsigned=True), st.integers(0, 2**64 - 1).map(
        lambda v: v.to_bytes(8, "little"))),
    "varchar": (BuiltColumn("s", _VARCHAR, (400).to_bytes(2, "little"), collation=255),
                st.text(max_size=40).map(lambda v: _short_string(v.encode()))),
    "latin1": (BuiltColumn("l", _VARCHAR, (20).to_bytes(2, "little"), collation=8),
               st.binary(max_size=20).map(lambda v: bytes([len(v)]) + v)),
    "datetime6": (BuiltColumn("d", _DATETIME6, b"\x06"), st.datetimes(
        dt.datetime(1000, 1, 1), dt.datetime(9999, 12, 31)).map(
        lambda v: datetime2(v.year, v.month, v.day, v.hour, v.minute, v.second,
                            v.microsecond, 6))),
    "double": (BuiltColumn("x", _DOUBLE, b"\x08"), st.floats(allow_nan=False).map(
        lambda v: struct.pack("<d", v))),
}


def _short_string(raw: bytes) -> bytes:
    return len(raw).to_bytes(2, "little") + raw


@st.composite
def _binlogs(draw: Any) -> BinlogFile:
    """A file of transactions of one random table: GTID, BEGIN, table map, rows, XID."""
    kinds = draw(st.lists(st.sampled_from(sorted(_COLUMNS)), min_size=1, max_size=5,
                          unique=True))
    columns = [BuiltColumn("id", _INT)] + [_COLUMNS[k][0] for k in kinds]
    values = [st.integers(0, 2**31 - 1).map(lambda v: v.to_bytes(4, "little"))] + [
        st.one_of(st.none(), _COLUMNS[k][1]) for k in kinds]
    real = read_binlog("time_issue.000001")
    binlog = BinlogFile("built.000001", real.server_version, draw(st.booleans()),
                        real.events[:1])
    table_map = table_map_body(300, "rand", "t", columns)
    for gno in range(1, draw(st.integers(1, 4)) + 1):
        rows_type = draw(st.sampled_from([30, 31, 32]))
        images = 2 if rows_type == 31 else 1
        rows = draw(st.lists(st.tuples(*values), min_size=images, max_size=4 * images))
        rows = rows[:len(rows) // images * images]
        for event_type, body in (
                (33, gtid_body(SOURCE_UUID, gno)), (2, query_body("rand", "BEGIN")),
                (19, table_map), (rows_type, _rows_body(300, len(columns), images, rows)),
                (16, xid_body(gno))):
            binlog.events.append(binlog.event(event_type, body, 1_700_000_000 + gno))
    return binlog


def _rows_body(table_id: int, count: int, images: int, rows: list[tuple[bytes | None, ...]]
               ) -> bytes:
    """A v2 rows event's body, every column present (the bitmap's unused bits clear, as the
    server writes it); ``rows`` in order (an update's before and after images in turn)."""
    present = ((1 << count) - 1).to_bytes((count + 7) // 8, "little")
    width = (count + 7) // 8
    body = table_id.to_bytes(6, "little") + b"\x00\x00\x02\x00" + bytes([count])
    body += present * images
    for row in rows:
        nulls = sum(1 << i for i, v in enumerate(row) if v is None)
        body += nulls.to_bytes(width, "little") + b"".join(v for v in row if v is not None)
    return body


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.data_too_large])
@given(binlog=_binlogs())
def test_random_rows_events_decode_the_same_both_ways(binlog):
    with pytest.MonkeyPatch.context() as monkeypatch:
        counts = LeanCounts(monkeypatch)
        leaned, library = _both_ways(monkeypatch, _file_stream(
            monkeypatch, binlog, lambda database, table: True))
    assert leaned == library
    assert leaned[1] is None and any(isinstance(e, Begin) for e in leaned[0])
    # (every rows event of these column kinds is read the lean way)
    assert counts.read(30, 31, 32) == sum(1 for e in binlog.events if e[4] in (30, 31, 32))


# -- a private MariaDB, a mixed workload ---------------------------------------------------------

_WORKLOAD = """
CREATE DATABASE lean;
CREATE DATABASE lean_other;
CREATE TABLE lean.kinds (id BIGINT UNSIGNED PRIMARY KEY, i INT, si SMALLINT UNSIGNED,
  d DECIMAL(12,3), f FLOAT, x DOUBLE, dd DATE, t DATETIME(6), ts TIMESTAMP(3) NULL,
  tm TIME(2), y YEAR, c CHAR(5), vc VARCHAR(300), l1 VARCHAR(20) CHARACTER SET latin1,
  bn BINARY(4), vb VARBINARY(10), bl BLOB, e ENUM('a','b'), st SET('x','y'), b BIT(10))
  ENGINE=InnoDB;
CREATE TABLE lean.docs (id INT PRIMARY KEY, j JSON, g GEOMETRY NULL);
CREATE TABLE lean.plain (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=MyISAM;
CREATE TABLE lean_other.skipped (id INT PRIMARY KEY, v INT);
"""


def _mixed_workload(server: MariaDBServer) -> None:
    """Single-row commits, multi-row and multi-table transactions, big events, JSON, a
    MyISAM table, an ALTER (a new table map), an XA transaction, rollbacks, savepoints."""
    for statement in _WORKLOAD.strip().split(";\n"):
        server.query(statement)
    conn = server.root_connect(autocommit=True)
    cur = conn.cursor()
    kinds = ("INSERT INTO lean.kinds VALUES (%s, %s, %s, %s, %s, %s, '2024-02-29', "
             "'2024-02-29 23:59:59.999999', '2001-01-01 00:00:00.5', '-12:00:00.25', 2024, "
             "%s, %s, %s, X'00010000', X'ff00', %s, 'b', 'x,y', b'1010101010')")
    for n in range(1, 200):
        cur.execute(kinds, (n, -n, n % 65536, decimal.Decimal(n) / 7, n / 3, n / 9, f"c{n % 9}",
                            "ünï 😀 " * (n % 5), "caf\xe9", b"\x00\xff" * n))
        cur.execute("UPDATE lean.kinds SET i = i + 1, vc = NULL WHERE id = %s", (n // 2 + 1,))
        cur.execute("INSERT INTO lean_other.skipped VALUES (%s, %s)", (n, n))
        cur.execute("INSERT INTO lean.docs VALUES (%s, %s, NULL)",
                    (n, '{"a": [1, 2.5, "x"], "n": null}'))
        cur.execute("INSERT INTO lean.plain VALUES (%s, 'p')", (n,))
        if n % 40 == 0:
            cur.execute("DELETE FROM lean.kinds WHERE id = %s", (n - 1,))
    cur.execute("BEGIN")
    cur.execute("UPDATE lean.kinds SET x = x * 2")  # (a big event: column-wise)
    cur.execute("DELETE FROM lean_other.skipped WHERE id > 100")
    cur.execute("SAVEPOINT s1")
    cur.execute("UPDATE lean.docs SET j = JSON_SET(j, '$.b', 1) WHERE id < 5")
    cur.execute("ROLLBACK TO SAVEPOINT s1")
    cur.execute("COMMIT")
    cur.execute("BEGIN")
    cur.execute("INSERT INTO lean.kinds (id) VALUES (100000)")
    cur.execute("ROLLBACK")
    cur.execute("ALTER TABLE lean.kinds ADD COLUMN extra INT DEFAULT 7")
    for n in range(300, 340):
        cur.execute("INSERT INTO lean.kinds (id, extra) VALUES (%s, %s)", (n, n))
    cur.execute("XA START 'lean-xa'")
    cur.execute("INSERT INTO lean.kinds (id) VALUES (500)")
    cur.execute("XA END 'lean-xa'")
    cur.execute("XA PREPARE 'lean-xa'")
    cur.execute("XA COMMIT 'lean-xa'")
    cur.execute("INSERT INTO lean.kinds (id) VALUES (501)")
    conn.close()


@pytest.fixture(params=["crc32", "no-checksum", "compressed"])
def mixed_mariadb(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MariaDBServer]:
    extra = {"crc32": (), "no-checksum": ("--binlog-checksum=NONE",),
             "compressed": ("--log-bin-compress=ON", "--log-bin-compress-min-len=10")}
    server = MariaDBServer(base_dir=tmp_path / "mariadb", server_id=5,
                           extra_args=extra[request.param])
    server.start()
    try:
        _mixed_workload(server)
        yield server
    finally:
        server.stop()


def test_a_mariadb_mixed_workload_decodes_the_same_both_ways(monkeypatch, mixed_mariadb):
    counts = LeanCounts(monkeypatch)

    def open_stream() -> BinlogStream:
        return BinlogStream(mixed_mariadb.connection_settings(), 8801, flavour_of("mariadb"),
                            "", 1, lambda database, table: database == "lean")

    leaned, library = _both_ways(monkeypatch, open_stream)
    assert leaned == library
    events, stop = leaned
    assert stop is None
    last = mixed_mariadb.gtid_position()
    assert any(isinstance(e, Begin) and e.gtid == last for e in events)
    assert counts.read(0xA2) > 600 and counts.read(16) > 600  # (the GTIDs, the XIDs)
    if "--log-bin-compress=ON" not in mixed_mariadb.extra_args:
        assert counts.read(23, 24, 25) > 400  # (the small rows events of the kinds)
    assert counts.read(19) > 400
