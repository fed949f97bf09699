"""The native rows decoder (capture/binlog/_rowcodec.c) against mysql-replication as cdc_platform
patches it: every row event decoded both ways must give the same values, in type and value.

* Real binlog events of the type matrix (every column type and edge value the type-matrix test
  lands), of hypothesis-generated rows of a table holding every natively decoded type
  (inserts, updates, deletes), and the same written with ``log_bin_compress=ON``.
* Row images of arbitrary bytes under a real table map: the native decoder either gives the
  library's values or hands the event to the library, and only when the library raises on it.
"""

from __future__ import annotations

import datetime as dt
import decimal
import random
import struct
from types import SimpleNamespace
from typing import Any

import pymysql.protocol
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymysqlreplication.constants import FIELD_TYPE
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import TableMapEvent, UpdateRowsEvent

from cdc_platform.capture.binlog import decoding as binlog_decoding
from cdc_platform.capture.binlog import patches as _patches  # noqa: F401 - installs them
from cdc_platform.capture.binlog import rowcodec
from cdc_platform_tests.capture.test_type_matrix import LAX_MODE, _cells

pytestmark = pytest.mark.skipif(not rowcodec.available(), reason="native decoder not built")


def _same(a: Any, b: Any) -> bool:
    """Equal in type and value (-0.0 is not 0.0, Decimal('1.0') is not Decimal('1.00'))."""
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, set):
        return a == b
    return repr(a) == repr(b)


def _library_rows(event: Any) -> list[Any]:
    if isinstance(event, UpdateRowsEvent):
        return [(tuple(r["before_values"].values()), tuple(r["after_values"].values()))
                for r in event.rows]
    return [tuple(r["values"].values()) for r in event.rows]


def _both_ways(event: Any) -> tuple[list[Any] | None, list[Any]]:
    """(native rows or None when the decoder refuses the table map, the library's rows)."""
    decoder = rowcodec.decoder_for(event)
    packet = event.packet
    data = packet.read(event.event_size - packet.read_bytes)
    images = 2 if isinstance(event, UpdateRowsEvent) else 1
    native = decoder.decode(data, images) if decoder is not None else None
    packet.unread(data)
    return native, _library_rows(event)


def _master_status(mariadb: Any) -> tuple[str, int]:
    file, position = mariadb.query("SHOW MASTER STATUS")[0][:2]
    return file, int(position)


_ROWS_EVENT_TYPES = {0x17, 0x18, 0x19, 0x1E, 0x1F, 0x20, *range(0xA6, 0xAC)}


def _rows_events_since(mariadb: Any, start: tuple[str, int]) -> list[tuple[Any, Any, Any]]:
    """Every rows event from ``start`` to the end of its binlog file, read from the file and
    parsed by the library's packet wrapper: (event, native rows, library rows)."""
    data = (mariadb.binlog_dir / start[0]).read_bytes()
    tables: dict = {}
    out = []
    at = start[1]
    while at < len(data):
        size = struct.unpack_from("<I", data, at + 9)[0]
        if data[at + 4] == 0x13 or data[at + 4] in _ROWS_EVENT_TYPES:
            event = _parse(data[at:at + size], tables)
            if event is not None and not isinstance(event, TableMapEvent):
                out.append((event, *_both_ways(event)))
        at += size
    return out


def _assert_same_rows(events: list[tuple[Any, Any, Any]]) -> int:
    """Every natively decoded event equals the library's; returns how many were native."""
    native_events = 0
    for event, native, library in events:
        if native is None:
            continue
        native_events += 1
        assert len(native) == len(library), f"{event.table}: row count"
        for got, want in zip(native, library, strict=True):
            assert _same(got, want), f"{event.table}: native {got!r} != library {want!r}"
    return native_events


# Kinds left to the library (MariaDB's JSON is LONGTEXT, INET4/INET6/UUID are BINARY(n)).
_NOT_NATIVE = ("GEOMETRY", "POINT", "LINESTRING", "POLYGON")


def _matrix_tables(cur: Any) -> dict[str, str]:
    definitions: dict[str, str] = {}
    for column_type, value in _cells():
        name = next((t for t, d in definitions.items() if d == column_type), None)
        if name is None:
            name = f"m{len(definitions):03d}"
            definitions[name] = column_type
            cur.execute(f"CREATE TABLE `{name}` (id INT PRIMARY KEY AUTO_INCREMENT, "
                        f"v {column_type}, n INT)")
        cur.execute(f"INSERT INTO `{name}` (v) VALUES ({value})")
    return definitions


def write_type_matrix(mariadb: Any, db: str, compressed: bool) -> tuple[tuple[str, int],
                                                                          dict[str, str]]:
    """Every type-matrix cell into its table of ``db`` (``log_bin_compress`` on when
    ``compressed``), then updated, its value set NULL in every other row, deleted. Returns
    the binlog position they start at and the tables' column types."""
    mariadb.query(f"DROP DATABASE IF EXISTS {db}")
    mariadb.query(f"CREATE DATABASE {db}")
    if compressed:
        mariadb.query("SET GLOBAL log_bin_compress = ON")
        mariadb.query("SET GLOBAL log_bin_compress_min_len = 10")
    try:
        start = _master_status(mariadb)
        with mariadb.root_connect(database=db) as conn, conn.cursor() as cur:
            cur.execute(LAX_MODE)
            definitions = _matrix_tables(cur)
            for name in definitions:
                cur.execute(f"UPDATE `{name}` SET n = 1")
                cur.execute(f"UPDATE `{name}` SET v = NULL WHERE id % 2 = 0")
                cur.execute(f"DELETE FROM `{name}`")
    finally:
        if compressed:
            mariadb.query("SET GLOBAL log_bin_compress = OFF")
    return start, definitions


@pytest.mark.parametrize("compressed", [False, True])
def test_type_matrix_events_decode_natively_as_the_library_does(mariadb, compressed):
    db = f"rowcodec_matrix_{int(compressed)}"
    start, definitions = write_type_matrix(mariadb, db, compressed)
    events = [e for e in _rows_events_since(mariadb, start) if e[0].schema == db]
    assert _assert_same_rows(events) > 0
    if compressed:
        assert any(getattr(e, "compressed", False) for e, _, _ in events)
    by_table: dict[str, bool] = {}
    for event, native, _ in events:
        by_table[event.table] = by_table.get(event.table, True) and native is not None
    for name, column_type in definitions.items():
        if not column_type.startswith(_NOT_NATIVE):
            assert by_table[name], f"{column_type} is not decoded natively"
        else:
            assert not by_table[name], f"{column_type} must be left to the library"


# -- hypothesis-generated rows of every native type -------------------------------------------

_ENUM = ["a", "b", "é", "😀"]
_SET64 = [f"m{i}" for i in range(64)]


def _time_text(micros: int, fsp: int) -> str:
    sign = "-" if micros < 0 else ""
    seconds, fraction = divmod(abs(micros), 1_000_000)
    text = f"{sign}{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    return text + (f".{fraction:06d}"[: fsp + 1] if fsp else "")


def _columns() -> list[tuple[str, str, st.SearchStrategy]]:
    """(name, type, strategy of a parameter pymysql binds for it)."""
    columns: list[tuple[str, str, st.SearchStrategy]] = []
    for name, bits in (("TINYINT", 8), ("SMALLINT", 16), ("MEDIUMINT", 24), ("INT", 32),
                       ("BIGINT", 64)):
        columns.append((f"s{bits}", name, st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)))
        columns.append((f"u{bits}", f"{name} UNSIGNED", st.integers(0, 2 ** bits - 1)))
    columns += [
        ("f", "FLOAT", st.floats(width=32, allow_nan=False, allow_infinity=False)),
        ("d", "DOUBLE", st.floats(allow_nan=False, allow_infinity=False)),
        ("y", "YEAR", st.sampled_from([0, 1901, 2155]) | st.integers(1901, 2155)),
        ("dt", "DATE", st.dates(dt.date(1000, 1, 1), dt.date(9999, 12, 31)).map(str)),
    ]
    for precision, scale in ((10, 2), (65, 30), (5, 5), (20, 0), (1, 0), (18, 9), (38, 10)):
        limit = decimal.Decimal(10) ** (precision - scale) - decimal.Decimal(10) ** -scale
        columns.append((f"dec_{precision}_{scale}", f"DECIMAL({precision},{scale})",
                        st.decimals(-limit, limit, places=scale).map(lambda v: format(v, "f"))))
    for fsp in range(7):
        columns += [
            (f"dt{fsp}", f"DATETIME({fsp})",
             st.datetimes(dt.datetime(1000, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59))
             .map(lambda v: v.strftime("%Y-%m-%d %H:%M:%S.%f"))),
            (f"ts{fsp}", f"TIMESTAMP({fsp}) NULL",
             st.datetimes(dt.datetime(1970, 1, 2), dt.datetime(2038, 1, 18))
             .map(lambda v: v.strftime("%Y-%m-%d %H:%M:%S.%f"))),
            (f"t{fsp}", f"TIME({fsp})",
             st.integers(-(838 * 3600 + 3599) * 10**6, (838 * 3600 + 3599) * 10**6)
             .map(lambda v, fsp=fsp: _time_text(v, fsp))),
        ]
    text = st.text(st.characters(exclude_categories=("Cs",)), max_size=10)
    columns += [
        ("c", "CHAR(10) CHARACTER SET utf8mb4", text.map(str.rstrip)),
        ("c_wide", "CHAR(100) CHARACTER SET utf8mb4", text.map(str.rstrip)),
        ("vc", "VARCHAR(20) CHARACTER SET utf8mb4", text),
        ("vc_long", "VARCHAR(300) CHARACTER SET utf8mb4", text),
        ("vc_latin1", "VARCHAR(300) CHARACTER SET latin1", st.binary(max_size=20)),
        ("vc_cp1251", "VARCHAR(20) CHARACTER SET cp1251", st.binary(max_size=20)),
        ("tx", "TEXT CHARACTER SET utf8mb4", text),
        ("tt", "TINYTEXT", text),
        ("lt", "LONGTEXT", text),
        ("bn", "BINARY(4)", st.binary(max_size=4)),
        ("vb", "VARBINARY(300)", st.binary(max_size=300)),
        ("tb", "TINYBLOB", st.binary(max_size=20)),
        ("b", "BLOB", st.binary(max_size=20)),
        ("mb", "MEDIUMBLOB", st.binary(max_size=20)),
        ("lb", "LONGBLOB", st.binary(max_size=20)),
        ("e", "ENUM('a','b','é','😀') CHARACTER SET utf8mb4", st.sampled_from(_ENUM)),
        ("e_latin1", "ENUM('a','é') CHARACTER SET latin1", st.sampled_from(["a", "é"])),
        ("set4", "SET('a','b','é','😀') CHARACTER SET utf8mb4",
         st.sets(st.sampled_from(_ENUM)).map(",".join)),
        ("set64", f"SET({','.join(repr(m) for m in _SET64)})",
         st.sets(st.sampled_from(_SET64)).map(",".join)),
    ]
    for bits in (1, 7, 8, 9, 16, 63, 64):
        columns.append((f"bit{bits}", f"BIT({bits})", st.integers(0, 2**bits - 1)))
    return columns


_COLUMNS = _columns()
_ROW = st.tuples(*(st.none() | strategy for _, _, strategy in _COLUMNS))


def write_generated_rows(mariadb: Any, db: str, rows: list[tuple[Any, ...]],
                         seed: int) -> tuple[str, int]:
    """Generated rows into ``db.w`` (every natively decoded type): inserted, each then
    updated to another row's values in a random half of its columns, every other deleted.
    Returns the binlog position they start at."""
    mariadb.query(f"CREATE DATABASE IF NOT EXISTS {db}")
    names = [name for name, _, _ in _COLUMNS]
    rng = random.Random(seed)
    with mariadb.root_connect(database=db) as conn, conn.cursor() as cur:
        cur.execute(LAX_MODE)
        cur.execute("DROP TABLE IF EXISTS w")
        definition = ", ".join(f"`{name}` {kind}" for name, kind, _ in _COLUMNS)
        cur.execute(f"CREATE TABLE w (id INT PRIMARY KEY, {definition})")
        start = _master_status(mariadb)
        placeholders = ", ".join(["%s"] * (len(names) + 1))
        columns = ", ".join(f"`{n}`" for n in ["id", *names])
        cur.executemany(f"INSERT INTO w ({columns}) VALUES ({placeholders})",
                        [(i, *row) for i, row in enumerate(rows)])
        for i in range(len(rows)):  # each row takes another generated row's values
            other = rows[rng.randrange(len(rows))]
            changed = [n for n in names if rng.random() < 0.5]
            if changed:
                cur.execute(f"UPDATE w SET {', '.join(f'`{n}` = %s' for n in changed)} "
                            "WHERE id = %s", (*[other[names.index(n)] for n in changed], i))
        cur.execute("DELETE FROM w WHERE id % 2 = 0")
    return start


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(rows=st.lists(_ROW, min_size=1, max_size=8), seed=st.integers(0, 2**32))
def test_generated_rows_decode_natively_as_the_library_does(mariadb, rows, seed):
    db = "rowcodec_generated"
    start = write_generated_rows(mariadb, db, rows, seed)
    events = [e for e in _rows_events_since(mariadb, start) if e[0].schema == db]
    assert _assert_same_rows(events) == len(events) > 0


# -- arbitrary row-image bytes under a real table map -----------------------------------------

def _table_map_bytes(mariadb: Any) -> bytes:
    """The table-map event (with its checksum) of the generated table ``w``, as logged."""
    db = "rowcodec_bytes"
    mariadb.query(f"CREATE DATABASE IF NOT EXISTS {db}")
    mariadb.query(f"DROP TABLE IF EXISTS {db}.w")
    definition = ", ".join(f"`{name}` {kind}" for name, kind, _ in _COLUMNS)
    mariadb.query(f"CREATE TABLE {db}.w (id INT PRIMARY KEY, {definition})")
    file, at = _master_status(mariadb)
    mariadb.query(f"INSERT INTO {db}.w (id) VALUES (1)")
    data = (mariadb.binlog_dir / file).read_bytes()
    while at < len(data):
        size = struct.unpack_from("<I", data, at + 9)[0]
        if data[at + 4] == 0x13:
            return data[at:at + size]
        at += size
    raise AssertionError("no table map event")


def _parse(raw_event: bytes, table_map: dict) -> Any:
    ctl = SimpleNamespace(_get_dbms=lambda: "mariadb", charset="utf8mb4")
    return BinLogPacketWrapper(
        pymysql.protocol.MysqlPacket(b"\x00" + raw_event, "utf8"), table_map, ctl, (10, 11, 0),
        True, binlog_decoding.ALLOWED_EVENTS, None, None, None, None, False, False, False,
        True, False, False, None).event


def _rows_event(table_id: int, columns: int, body: bytes, update: bool) -> bytes:
    bitmap = rowcodec._full_bitmap(columns)
    payload = (table_id.to_bytes(6, "little") + b"\x00\x00" + bytes([columns]) + bitmap
               + (bitmap if update else b"") + body + b"\x00" * 4)
    event_type = 0x18 if update else 0x17  # UPDATE_ROWS_EVENT_V1, WRITE_ROWS_EVENT_V1
    return struct.pack("<IBIIIH", 0, event_type, 1, 19 + len(payload), 0, 0) + payload


def _mostly(good: st.SearchStrategy[bytes], size: int) -> st.SearchStrategy[bytes]:
    """``good`` mostly, sometimes any ``size`` bytes (which the library may refuse: a row with
    such a value rarely reaches the columns after it)."""
    return _rarely(st.binary(min_size=size, max_size=size), good)


def _rarely(odd: st.SearchStrategy[bytes], good: st.SearchStrategy[bytes]
            ) -> st.SearchStrategy[bytes]:
    """``odd`` about one time in 30, else ``good`` (hypothesis favours the ends of ranges and
    the first branch of ``one_of``: neither picks the odd branch here)."""
    return st.integers(0, 99).flatmap(lambda k: odd if 40 <= k < 43 else good)


def _fsp_bytes(fsp: int) -> int:
    return (fsp + 1) // 2


_YEARS = st.sampled_from([0, 1, 2000, 2024, 9999, 10000]) | st.integers(0, 10000)
_DAYS = st.sampled_from([0, 1, 28, 29, 30, 31]) | st.integers(0, 31)


_DIG2BYTES = [0, 1, 1, 2, 2, 3, 3, 4, 4, 4]


def _fraction(fsp: int) -> st.SearchStrategy[bytes]:
    """A TIME2/DATETIME2/TIMESTAMP2 fraction: mostly in range, or any bytes."""
    size = _fsp_bytes(fsp)
    return _mostly(st.integers(0, 10 ** (2 * size) - 1).map(lambda v: v.to_bytes(size, "big")),
                   size)


def _decimal_bytes(precision: int, scale: int) -> st.SearchStrategy[bytes]:
    """MySQL's binary DECIMAL of random digit groups and sign (or, sometimes, any bytes)."""
    integral = precision - scale
    groups = ([integral % 9] if integral % 9 else []) + [9] * (integral // 9) + (
        [9] * (scale // 9) + ([scale % 9] if scale % 9 else []))

    def encode(negative: bool, values: list[int]) -> bytes:
        out = bytearray()
        for digits, value in zip(groups, values, strict=True):
            out += value.to_bytes(_DIG2BYTES[digits], "big")
        if negative:
            out = bytearray(b ^ 0xFF for b in out)
        out[0] ^= 0x80
        return bytes(out)

    size = sum(_DIG2BYTES[d] for d in groups)
    return _mostly(st.builds(encode, st.booleans(), st.tuples(
        *(st.integers(0, 10**d - 1) for d in groups)).map(list)), size)


def _value_bytes(column: Any) -> st.SearchStrategy[bytes]:
    """Bytes of one value of ``column``: mostly well-formed, with fields near and past their
    ranges, and sometimes any bytes at all."""
    fixed = {FIELD_TYPE.TINY: 1, FIELD_TYPE.SHORT: 2, FIELD_TYPE.INT24: 3, FIELD_TYPE.LONG: 4,
             FIELD_TYPE.LONGLONG: 8, FIELD_TYPE.FLOAT: 4, FIELD_TYPE.DOUBLE: 8,
             FIELD_TYPE.DATE: 3, FIELD_TYPE.YEAR: 1}
    kind = column.type
    if kind == FIELD_TYPE.DATE:  # fields near and past their ranges, or any bytes
        return st.binary(min_size=3, max_size=3) | st.builds(
            lambda y, m, d: (y << 9 | m << 5 | d).to_bytes(3, "little"),
            _YEARS, st.integers(0, 15), _DAYS)
    if kind == FIELD_TYPE.DATETIME2:
        datetime2 = st.builds(
            lambda y, m, d, h, mi, s, fraction: (
                1 << 39 | (y * 13 + m) << 22 | d << 17 | h << 12 | mi << 6 | s
            ).to_bytes(5, "big") + fraction,
            _YEARS, st.integers(0, 12), _DAYS,
            st.sampled_from([0, 23, 24, 31]) | st.integers(0, 31),
            st.sampled_from([0, 59, 60, 63]) | st.integers(0, 63),
            st.sampled_from([0, 59, 60, 63]) | st.integers(0, 63),
            _fraction(column.fsp),
        )
        return _mostly(datetime2, 5 + _fsp_bytes(column.fsp))
    if kind in (FIELD_TYPE.TIMESTAMP2, FIELD_TYPE.TIME2):
        size = 4 if kind == FIELD_TYPE.TIMESTAMP2 else 3
        return st.builds(bytes.__add__, st.binary(min_size=size, max_size=size),
                         _fraction(column.fsp))
    if kind == FIELD_TYPE.NEWDECIMAL:
        return _decimal_bytes(column.precision, column.decimals)
    if kind in (FIELD_TYPE.ENUM, FIELD_TYPE.SET):
        members = len(column.enum_values or column.set_values or [])
        return _mostly(st.integers(0, min(max(members - 1, 0), 2 ** (8 * column.size) - 1)).map(
            lambda v, n=column.size: v.to_bytes(n, "little")), column.size)
    if kind in fixed:
        size = fixed[kind]
    elif kind == FIELD_TYPE.DATETIME2:
        size = 5 + _fsp_bytes(column.fsp)
    elif kind == FIELD_TYPE.TIMESTAMP2:
        size = 4 + _fsp_bytes(column.fsp)
    elif kind == FIELD_TYPE.TIME2:
        size = 3 + _fsp_bytes(column.fsp)
    elif kind == FIELD_TYPE.NEWDECIMAL:
        dig = [0, 1, 1, 2, 2, 3, 3, 4, 4, 4]
        integral = column.precision - column.decimals
        size = (dig[integral % 9] + 4 * (integral // 9) + 4 * (column.decimals // 9)
                + dig[column.decimals % 9])
    elif kind in (FIELD_TYPE.ENUM, FIELD_TYPE.SET):
        size = column.size
    elif kind == FIELD_TYPE.BIT:
        size = column.bytes
    else:  # text and blobs: a length, then that many bytes
        width = column.length_size if kind == FIELD_TYPE.BLOB else (
            2 if column.max_length > 255 else 1)
        text = st.text(max_size=10).map(lambda s: s.encode("utf-8", "surrogatepass"))
        payload = _rarely(st.binary(max_size=30), text)
        return payload.map(lambda b, w=width: len(b).to_bytes(w, "little") + b)
    return st.binary(min_size=size, max_size=size)


def draw_row_images(data: Any, columns: list[Any], value_bytes: Any, images: int,
                    rows: st.SearchStrategy[int], cut_one_in: int) -> tuple[bytes, bool]:
    """Arbitrary row images of ``columns``: ``rows`` rows of ``images`` images, each a null
    bitmap then every non-NULL value's bytes (``value_bytes(column)``); one body in
    ``cut_one_in`` is cut at a random byte. Returns the body and whether it was cut."""
    n = len(columns)
    body = b""
    for _ in range(data.draw(rows) * images):
        nulls = data.draw(st.binary(min_size=(n + 7) // 8, max_size=(n + 7) // 8))
        body += nulls
        for i, column in enumerate(columns):
            if not nulls[i // 8] & (1 << (i % 8)):  # (a NULL takes no bytes)
                body += data.draw(value_bytes(column))
    cut = data.draw(st.integers(0, cut_one_in - 1)) == 0
    if cut:
        body = body[:data.draw(st.integers(0, len(body)))]
    return body, cut


@pytest.fixture(scope="module")
def table_map(mariadb):
    raw = _table_map_bytes(mariadb)
    tables: dict = {}
    event = _parse(raw, tables)
    assert isinstance(event, TableMapEvent)
    return raw, tables, event


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), update=st.booleans())
def test_arbitrary_row_bytes_decode_as_the_library_does_or_go_to_it(table_map, data, update):
    _, tables, table_event = table_map
    columns = table_event.columns
    # (a body cut short: the library then reads on into the checksum; refusing it is fine)
    body, cut = draw_row_images(data, columns, _value_bytes, 2 if update else 1,
                                st.integers(1, 3), cut_one_in=2)
    event = _parse(_rows_event(table_event.table_id, len(columns), body, update), tables)
    decoder = rowcodec.decoder_for(event)
    assert decoder is not None
    try:
        native = decoder.decode(body, 2 if update else 1)
    except rowcodec._rowcodec.Unsupported:
        native = None
    try:
        library = _library_rows(event)
    except Exception:  # noqa: BLE001 - the library's own error on bad bytes
        assert native is None, "the native decoder read bytes the library refuses"
        return
    if native is None and cut:
        return
    assert native is not None, "the native decoder refused bytes the library reads"
    assert len(native) == len(library)
    for got, want in zip(native, library, strict=True):
        assert _same(got, want), f"native {got!r} != library {want!r}"


def test_without_the_extension_every_event_goes_to_the_library(table_map, monkeypatch):
    _, tables, table_event = table_map
    n = len(table_event.columns)
    body = b"\xff" * ((n + 7) // 8)  # one row, every column NULL
    monkeypatch.setattr(rowcodec, "_rowcodec", None)
    event = _parse(_rows_event(table_event.table_id, n, body, False), tables)
    assert rowcodec.RowsDecoders().rows(event) is None
    assert _library_rows(event) == [(None,) * n]
