"""Rows decoded column-wise (``Decoder.decode_columns``, ``RowsDecoders.columns``) against the
tuple path the engine lands today: for a column with a native target, exactly the Arrow array
``pa.array([converter(v) for v in values], column.arrow_type())`` (``values.converter_for(
column, from_binlog=True)``) of the values ``decode`` gives, bit for bit; for any other column,
exactly those values.

* Real binlog events: the type matrix (plain and ``log_bin_compress=ON``), hypothesis-generated
  rows of every natively decoded type, a table of every target with NULLs in every position,
  and events of more than 64 rows.
* Row images of arbitrary bytes, under a real table map and under hand-built column specs:
  ``decode_columns`` refuses exactly what ``decode`` refuses, and what the tuple path's
  ``pa.array`` refuses (a DECIMAL past its decimal128), and otherwise gives its arrays.
* Which column types get a native target, so that a regression to the list path is noticed.
"""

from __future__ import annotations

import decimal
import struct
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pymysqlreplication.constants import FIELD_TYPE
from pymysqlreplication.row_event import TableMapEvent, UpdateRowsEvent

from cdc_platform.capture.binlog import rowcodec
from cdc_platform.capture.binlog.columns import schema_from_table_map
from cdc_platform.capture.binlog.patches import _keep_text_bytes
from cdc_platform.capture.schema import ColumnSpec, ColumnValueError, TableSchema
from cdc_platform.capture.values import converter_for
from cdc_platform_tests.capture.binlog.test_rowcodec import (
    _ROW,
    _ROWS_EVENT_TYPES,
    _master_status,
    _parse,
    _rarely,
    _rows_event,
    _same,
    _table_map_bytes,
    _value_bytes,
    draw_row_images,
    write_generated_rows,
    write_type_matrix,
)
from cdc_platform_tests.capture.test_type_matrix import LAX_MODE

pytestmark = pytest.mark.skipif(not rowcodec.available(), reason="native decoder not built")

_codec = rowcodec._rowcodec  # noqa: SLF001 - the extension under test


# -- the comparison ---------------------------------------------------------------------------

def _tuple_path(values: list[Any], landing: ColumnSpec) -> pa.Array:
    """The array the engine builds from decoded tuple values today."""
    convert = converter_for(landing, from_binlog=True)
    if convert is not None:
        values = [convert(v) for v in values]
    return pa.array(values, landing.arrow_type())


def _slots(array: pa.Array) -> list[Any]:
    """Per slot: None when NULL, else its bytes (fixed width: NaN payloads and -0.0 count)."""
    if pa.types.is_binary(array.type) or pa.types.is_string(array.type):
        return [None if v is None else v for v in array.to_pylist()]
    width = array.type.bit_width // 8
    buffer = array.buffers()[1]
    data = b"" if buffer is None else buffer.to_pybytes()
    nulls = array.is_null().to_pylist()
    return [None if null else data[(array.offset + i) * width:(array.offset + i + 1) * width]
            for i, null in enumerate(nulls)]


def _assert_same_array(got: pa.Array, want: pa.Array, what: str) -> None:
    got.validate(full=True)
    assert got.type == want.type, f"{what}: type {got.type} != {want.type}"
    assert len(got) == len(want), f"{what}: length"
    assert got.null_count == want.null_count, f"{what}: null count"
    assert got.is_null().to_pylist() == want.is_null().to_pylist(), f"{what}: validity"
    assert (got.buffers()[0] is None) == (want.null_count == 0), f"{what}: validity buffer"
    assert _slots(got) == _slots(want), f"{what}: {got} != {want}"
    nan = pa.types.is_floating(want.type) and any(v != v for v in want.to_pylist() if v)
    assert nan or got.equals(want), f"{what}: {got} != {want}"
    pairs = zip(got.to_pylist(), want.to_pylist(), strict=True)
    assert all(_same(a, b) for a, b in pairs), f"{what}: {got} != {want}"


def _images(rows: list[Any], update: bool) -> list[list[tuple[Any, ...]]]:
    return [[r[0] for r in rows], [r[1] for r in rows]] if update else [rows]


def _assert_columns_as_tuples(table: str, schema: TableSchema, targets: list[int],
                              rows: list[Any], count: int, images: Any, update: bool) -> int:
    """``images`` (column-wise, arrays or lists) hold exactly what ``rows`` (tuples) land as;
    returns how many native arrays were compared."""
    assert count == len(rows), f"{table}: row count"
    expected = _images(rows, update)
    assert len(images) == len(expected), f"{table}: images"
    native = 0
    for got_image, tuples in zip(images, expected, strict=True):
        assert len(got_image) == len(schema.columns), f"{table}: columns"
        for index, (got, landing) in enumerate(zip(got_image, schema.columns, strict=True)):
            what = f"{table}.{landing.name} ({landing.kind})"
            values = [t[index] for t in tuples]
            if targets[index] == _codec.T_OBJECT:
                assert isinstance(got, list), what
                assert len(got) == len(values) and all(
                    _same(a, b) for a, b in zip(got, values, strict=True)), what
            else:
                assert isinstance(got, pa.Array), what
                _assert_same_array(got, _tuple_path(values, landing), what)
                native += 1
    return native


# -- real binlog events -----------------------------------------------------------------------

@dataclass
class _Decoded:
    event: Any  # the library's rows event that ``columns`` read
    schema: TableSchema | None
    targets: list[int]
    rows: list[Any] | None  # RowsDecoders.rows
    columns: rowcodec.RowColumns | None  # RowsDecoders.columns


def _decoded_since(mariadb: Any, start: tuple[str, int], db: str) -> list[_Decoded]:
    """Every rows event of ``db`` from ``start`` to the end of its binlog file, decoded with
    one RowsDecoders both ways (rows, then columns, of two parses of the event's bytes)."""
    data = (mariadb.binlog_dir / start[0]).read_bytes()
    tables: dict = {}
    table_maps: dict[int, TableMapEvent] = {}
    decoders = rowcodec.RowsDecoders()
    out = []
    at = start[1]
    while at < len(data):
        size = struct.unpack_from("<I", data, at + 9)[0]
        raw = data[at:at + size]
        at += size
        if raw[4] == 0x13:
            event = _parse(raw, tables)
            if event is not None and event.schema == db:
                table_maps[event.table_id] = event
            continue
        if raw[4] not in _ROWS_EVENT_TYPES:
            continue
        event = _parse(raw, tables)
        if event is None or event.schema != db:
            continue
        rows = decoders.rows(event)
        event = _parse(raw, tables)
        table_map = table_maps[event.table_id]
        try:
            schema = schema_from_table_map(table_map)
        except (ValueError, NotImplementedError):  # (a column the stream refuses)
            out.append(_Decoded(event, None, [], rows, None))
            continue
        targets = [rowcodec.column_spec(c, event.charset_to_encoding, landing)[4]
                   if rows is not None else _codec.T_OBJECT
                   for c, landing in zip(table_map.columns, schema.columns, strict=True)]
        out.append(_Decoded(event, schema, targets, rows, decoders.columns(event, schema)))
    return out


def _assert_all_as_tuples(decoded: list[_Decoded]) -> int:
    """Every event ``rows`` decodes, ``columns`` decodes the same; returns the native arrays
    compared."""
    native = 0
    for d in decoded:
        if d.rows is None or d.schema is None:
            assert d.columns is None, f"{d.event.table}: columns but no rows"
            continue
        assert d.columns is not None, f"{d.event.table}: rows but no columns"
        native += _assert_columns_as_tuples(
            d.event.table, d.schema, d.targets, d.rows, d.columns.count, d.columns.images,
            isinstance(d.event, UpdateRowsEvent))
    return native


@pytest.mark.parametrize("compressed", [False, True])
def test_type_matrix_events_decode_column_wise_as_their_tuples_land(mariadb, compressed):
    db = f"rowcodec_columns_matrix_{int(compressed)}"
    start, _ = write_type_matrix(mariadb, db, compressed)
    decoded = _decoded_since(mariadb, start, db)
    assert _assert_all_as_tuples(decoded) > 0
    if compressed:
        assert any(getattr(d.event, "compressed", False) for d in decoded)
    columns = [d for d in decoded if d.columns is not None]
    assert len(columns) > len(decoded) // 2


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(rows=st.lists(_ROW, min_size=1, max_size=8), seed=st.integers(0, 2**32))
def test_generated_rows_decode_column_wise_as_their_tuples_land(mariadb, rows, seed):
    db = "rowcodec_columns_generated"
    start = write_generated_rows(mariadb, db, rows, seed)
    decoded = _decoded_since(mariadb, start, db)
    assert all(d.columns is not None for d in decoded) and decoded
    assert _assert_all_as_tuples(decoded) > 0


# Every target, and the kinds left as lists: (column type, target, SQL values). A regression
# of a type to T_OBJECT fails here.
_TARGET_COLUMNS = [
    ("TINYINT", "T_INT64", ["-128", "127", "0"]),
    ("TINYINT UNSIGNED", "T_INT64", ["0", "255"]),
    ("SMALLINT", "T_INT64", ["-32768", "32767"]),
    ("SMALLINT UNSIGNED", "T_INT64", ["65535", "1"]),
    ("MEDIUMINT", "T_INT64", ["-8388608", "8388607"]),
    ("MEDIUMINT UNSIGNED", "T_INT64", ["16777215"]),
    ("INT", "T_INT64", ["-2147483648", "2147483647", "-1"]),
    ("INT UNSIGNED", "T_INT64", ["4294967295", "0"]),
    ("BIGINT", "T_INT64", ["-9223372036854775808", "9223372036854775807"]),
    ("BIGINT UNSIGNED", "T_DECIMAL128", ["18446744073709551615", "0", "9223372036854775808"]),
    ("YEAR", "T_INT64", ["0", "1901", "2155", "2000"]),
    ("FLOAT", "T_FLOAT32", ["-0.0", "3.40282e38", "1.17549e-38", "0.1", "-1.5"]),
    ("DOUBLE", "T_FLOAT64", ["-0.0", "1.7976931348623157e308", "5e-324", "0.1"]),
    ("DECIMAL(10,2)", "T_DECIMAL128", ["-99999999.99", "0.01", "0", "99999999.99"]),
    ("DECIMAL(38,10)", "T_DECIMAL128", ["-" + "9" * 28 + "." + "9" * 10, "0.0000000001"]),
    ("DECIMAL(38,0)", "T_DECIMAL128", ["9" * 38, "-" + "9" * 38, "-1"]),
    ("DECIMAL(5,5)", "T_DECIMAL128", ["-0.99999", "0.00001", "0"]),
    ("DECIMAL(1,0)", "T_DECIMAL128", ["-9", "9"]),
    ("DECIMAL(39,2)", "T_OBJECT", ["1.5"]),
    ("DECIMAL(65,30)", "T_OBJECT", ["-1." + "0" * 29 + "1"]),
    ("DATE", "T_DATE32", ["'1000-01-01'", "'9999-12-31'", "'0000-00-00'", "'2020-02-30'",
                          "'1970-01-01'", "'1969-12-31'", "'2020-00-00'"]),
    ("DATETIME", "T_TIMESTAMP_US", ["'1000-01-01 00:00:00'", "'9999-12-31 23:59:59'",
                                    "'0000-00-00 00:00:00'", "'1970-01-01 00:00:00'"]),
    ("DATETIME(3)", "T_TIMESTAMP_US", ["'1969-12-31 23:59:59.999'", "'2020-02-30 01:00:00'"]),
    ("DATETIME(6)", "T_TIMESTAMP_US", ["'1969-12-31 23:59:59.999999'",
                                       "'9999-12-31 23:59:59.999999'", "'2020-00-00 00:00:00'"]),
    ("TIMESTAMP NULL", "T_TIMESTAMP_US", ["'1970-01-01 00:00:01'", "'0000-00-00 00:00:00'"]),
    ("TIMESTAMP(5) NULL", "T_TIMESTAMP_US", ["'2038-01-19 03:14:07.99999'",
                                             "'1970-01-01 00:00:00.00001'"]),
    ("TIMESTAMP(6) NULL", "T_TIMESTAMP_US", ["'2038-01-19 03:14:07.999999'",
                                             "'0000-00-00 00:00:00'"]),
    ("TIME(3)", "T_OBJECT", ["'-838:59:59'", "'00:00:00.5'"]),
    ("CHAR(10) CHARACTER SET utf8mb4", "T_UTF8", ["''", "'😀 é'", "'a'"]),
    ("VARCHAR(300) CHARACTER SET utf8mb3", "T_UTF8", ["'é ß 中'", "''", "'x'"]),
    ("TEXT CHARACTER SET utf8mb4", "T_UTF8", ["'𝄞'", "''"]),
    ("LONGTEXT CHARACTER SET utf8mb4", "T_UTF8", ["'a b '", "'中文'"]),
    ("JSON", "T_UTF8", ["'{\"a\": [1, \"😀\"]}'", "'null'"]),
    ("VARCHAR(20) CHARACTER SET latin1", "T_OBJECT", ["'é'", "''"]),
    ("VARCHAR(20) CHARACTER SET utf16", "T_OBJECT", ["'😀'"]),
    ("BINARY(4)", "T_BINARY", ["''", "'a'", "UNHEX('00000000')", "UNHEX('61000000')",
                               "UNHEX('ffffffff')"]),
    ("VARBINARY(300)", "T_BINARY", ["''", "UNHEX('00ff')", "UNHEX('00')"]),
    ("VARCHAR(10) CHARACTER SET binary", "T_BINARY", ["UNHEX('00ff')", "''"]),
    ("BLOB", "T_BINARY", ["''", "UNHEX('0001020300')"]),
    ("LONGBLOB", "T_BINARY", ["UNHEX('ff')"]),
    ("INET6", "T_BINARY", ["'::1'", "'ffff::ffff'"]),
    ("UUID", "T_BINARY", ["'123e4567-e89b-12d3-a456-426655440000'"]),
    ("ENUM('a','b') CHARACTER SET utf8mb4", "T_OBJECT", ["'a'", "'b'"]),
    ("SET('a','b') CHARACTER SET utf8mb4", "T_OBJECT", ["'a,b'", "''"]),
    ("BIT(8)", "T_OBJECT", ["b'101'"]),
]


def _null_at(row: int, column: int) -> bool:
    """NULL in every column, at rows that move across validity-bitmap bytes; row 0 and every
    13th are all NULL."""
    return row % 13 == 0 or (row * 31 + column * 17) % 7 == 0


def _insert(cur: Any, table: str, columns: list[tuple[str, str, list[str]]], count: int,
            shift: int = 0) -> None:
    rows = []
    for i in range(count):
        cells = ["NULL" if _null_at(i + shift, j) else values[(i + j + shift) % len(values)]
                 for j, (_, _, values) in enumerate(columns)]
        rows.append(f"({i}, {', '.join(cells)})")
    names = ", ".join(f"`{name}`" for name, _, _ in columns)
    cur.execute(f"INSERT INTO `{table}` (id, {names}) VALUES {', '.join(rows)}")


def _insert_update_delete(mariadb: Any, db: str, columns: list[tuple[str, str, Any]],
                          count: int, shift: int) -> list[Any]:
    """``count`` rows into ``db.t``, each then updated to the values of ``db.u``'s rows
    (the same values ``shift`` rows on: other NULLs after than before), then all deleted;
    the events decoded both ways."""
    definition = ", ".join(f"`{name}` {kind}" for name, kind, _ in columns)
    start = _master_status(mariadb)
    with mariadb.root_connect(database=db) as conn, conn.cursor() as cur:
        cur.execute(LAX_MODE)
        for table in ("t", "u"):
            cur.execute(f"CREATE TABLE `{table}` (id INT PRIMARY KEY, {definition})")
        _insert(cur, "t", columns, count)
        _insert(cur, "u", columns, count, shift=shift)
        sets = ", ".join(f"t.`{name}` = u.`{name}`" for name, _, _ in columns)
        cur.execute(f"UPDATE t JOIN u USING (id) SET {sets}")
        cur.execute("DELETE FROM t")
    return _decoded_since(mariadb, start, db)


def test_every_target_with_nulls_in_every_position(mariadb):
    db = "rowcodec_columns_targets"
    mariadb.query(f"DROP DATABASE IF EXISTS {db}")
    mariadb.query(f"CREATE DATABASE {db}")
    columns = [(f"c{i}", kind, values) for i, (kind, _, values) in enumerate(_TARGET_COLUMNS)]
    decoded = _insert_update_delete(mariadb, db, columns, 40, shift=5)
    assert {type(d.event).__name__ for d in decoded} == {
        "WriteRowsEvent", "UpdateRowsEvent", "DeleteRowsEvent"}
    assert all(d.columns is not None for d in decoded)
    assert _assert_all_as_tuples(decoded) > 0
    expected = [_codec.T_INT64] + [getattr(_codec, target) for _, target, _ in _TARGET_COLUMNS]
    names = {getattr(_codec, n): n for n in dir(_codec) if n.startswith("T_")}
    for d in decoded:
        got = [names[t] for t in d.targets]
        assert got == [names[t] for t in expected], list(zip(
            ["id", *(kind for kind, _, _ in _TARGET_COLUMNS)], got, strict=True))
        for image in d.columns.images:
            assert [isinstance(c, pa.Array) for c in image] == [
                t != _codec.T_OBJECT for t in expected]


def test_events_of_more_than_64_rows(mariadb):
    db = "rowcodec_columns_many"
    mariadb.query(f"DROP DATABASE IF EXISTS {db}")
    mariadb.query(f"CREATE DATABASE {db}")
    columns = [("a", "BIGINT", ["-1", "9223372036854775807"]),
               ("s", "VARCHAR(8) CHARACTER SET utf8mb4", ["''", "'é'", "'abcdefgh'"]),
               ("d", "DECIMAL(10,2)", ["-0.01", "12345678.90"]),
               ("b", "BINARY(2)", ["''", "'a'"]),
               ("t", "TIMESTAMP(3) NULL", ["'0000-00-00 00:00:00'", "'2001-02-03 04:05:06.789'"])]
    decoded = _insert_update_delete(mariadb, db, columns, 100, shift=3)
    assert _assert_all_as_tuples(decoded) > 0
    for op in ("WriteRowsEvent", "UpdateRowsEvent", "DeleteRowsEvent"):
        counts = [d.columns.count for d in decoded if type(d.event).__name__ == op]
        assert max(counts) > 64, f"{op}: no event of more than 64 rows ({counts})"
    for d in decoded:
        for image in d.columns.images:
            assert all(isinstance(c, pa.Array) for c in image)
            if d.columns.count > 64:
                assert all(c.null_count for c in image[1:])  # (NULLs in every column)


# -- arbitrary row-image bytes ----------------------------------------------------------------

def _check_bytes(decoder: Any, schema: TableSchema, targets: list[int], body: bytes,
                 update: bool) -> None:
    """``decode_columns`` refuses ``body`` exactly when ``decode`` or the tuple path do, and
    otherwise gives what the tuple path lands."""
    images = 2 if update else 1
    try:
        rows = decoder.decode(body, images)
    except _codec.Unsupported:
        rows = None
    try:
        count, columns = decoder.decode_columns(body, images)
    except _codec.Unsupported:
        columns = None
    if rows is None:
        event("decode refuses")
        assert columns is None, "decode_columns read bytes decode refuses"
        return
    landing_fails = False
    for tuples in _images(rows, update):
        for index, landing in enumerate(schema.columns):
            if targets[index] != _codec.T_OBJECT:
                try:
                    _tuple_path([t[index] for t in tuples], landing)
                except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ColumnValueError):
                    # (a DECIMAL of more than 38 digits: the converter refuses it before
                    # pyarrow, which would wrap it modulo 2**128)
                    landing_fails = True
                    assert landing.kind == "decimal", landing
    if landing_fails:
        event("the tuple path refuses a DECIMAL")
        assert columns is None, "decode_columns gave a DECIMAL the tuple path refuses"
        return
    assert columns is not None, "decode_columns refused bytes decode and the tuple path read"
    arrays = [[column if target == _codec.T_OBJECT else rowcodec._array(  # (as columns() does)
        landing.arrow_type(), count, column)
        for column, target, landing in zip(image, targets, schema.columns, strict=True)]
        for image in columns]
    event("decoded alike")
    _assert_columns_as_tuples("w", schema, targets, rows, count, arrays, update)


@pytest.fixture(scope="module")
def table_map(mariadb):
    raw = _table_map_bytes(mariadb)
    tables: dict = {}
    event = _parse(raw, tables)
    assert isinstance(event, TableMapEvent)
    return tables, event, schema_from_table_map(event)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), update=st.booleans())
def test_arbitrary_row_bytes_decode_column_wise_as_their_tuples_land(table_map, data, update):
    tables, table_event, schema = table_map
    columns = table_event.columns
    body, _ = draw_row_images(data, columns, _value_bytes, 2 if update else 1,
                              st.integers(1, 3), cut_one_in=2)
    event = _parse(_rows_event(table_event.table_id, len(columns), body, update), tables)
    specs = [rowcodec.column_spec(c, event.charset_to_encoding, landing)
             for c, landing in zip(columns, schema.columns, strict=True)]
    _check_bytes(rowcodec.decoder_for(event, schema), schema, [s[4] for s in specs], body,
                 update)


# Hand-built columns (no server): every target, fed any bytes and the values near their edges
# (NaN payloads, decimal digit groups past 10**9, the zero TIMESTAMP, invalid UTF-8).
_F = FIELD_TYPE
_library_column = SimpleNamespace  # (the fields of a library table-map column read here)
_SYNTHETIC: list[tuple[SimpleNamespace, ColumnSpec]] = [
    (_library_column(type=_F.TINY, unsigned=False), ColumnSpec("i8", "int")),
    (_library_column(type=_F.INT24, unsigned=False), ColumnSpec("i24", "int")),
    (_library_column(type=_F.LONG, unsigned=True), ColumnSpec("u32", "int")),
    (_library_column(type=_F.LONGLONG, unsigned=False), ColumnSpec("i64", "int")),
    (_library_column(type=_F.LONGLONG, unsigned=True), ColumnSpec("u64", "uint64")),
    (_library_column(type=_F.YEAR), ColumnSpec("y", "year")),
    (_library_column(type=_F.FLOAT), ColumnSpec("f", "float")),
    (_library_column(type=_F.DOUBLE), ColumnSpec("d", "double")),
    (_library_column(type=_F.DATE), ColumnSpec("dt", "date")),
    *[(_library_column(type=_F.NEWDECIMAL, precision=p, decimals=s),
       ColumnSpec(f"dec{p}_{s}", "decimal", p, s))
      for p, s in ((10, 2), (38, 10), (38, 0), (5, 5), (1, 0), (20, 0), (19, 19), (27, 9))],
    *[(_library_column(type=_F.DATETIME2, fsp=fsp), ColumnSpec(f"dt{fsp}", "datetime", scale=fsp))
      for fsp in range(7)],
    *[(_library_column(type=_F.TIMESTAMP2, fsp=fsp),
       ColumnSpec(f"ts{fsp}", "timestamp", scale=fsp)) for fsp in range(7)],
    (_library_column(type=_F.VARCHAR, max_length=20, character_set_name="utf8"),
     ColumnSpec("s", "string")),
    (_library_column(type=_F.BLOB, length_size=2, character_set_name="utf8"),
     ColumnSpec("tx", "string")),
    (_library_column(type=_F.STRING, max_length=4, character_set_name="binary"),
     ColumnSpec("bn", "binary", 4)),
    (_library_column(type=_F.VARCHAR, max_length=300, character_set_name="binary"),
     ColumnSpec("vb", "binary")),
]

_FLOAT_EDGES = [0x7F800001, 0xFF800001, 0x7FC00000, 0x7FBFFFFF, 0x7F800000, 0x80000000, 1]
_DOUBLE_EDGES = [0x7FF0000000000001, 0xFFF7FFFFFFFFFFFF, 0x7FF8000000000000, 1 << 63]


def _decimal_groups(precision: int, scale: int) -> st.SearchStrategy[bytes]:
    """DECIMAL bytes whose digit groups take any non-negative value their bytes hold (past
    their digits, as no server writes them)."""
    integral = precision - scale
    dig2bytes = [0, 1, 1, 2, 2, 3, 3, 4, 4, 4]
    sizes = ([dig2bytes[integral % 9]] if integral % 9 else []) + [4] * (integral // 9) + (
        [4] * (scale // 9) + ([dig2bytes[scale % 9]] if scale % 9 else []))

    def encode(negative: bool, values: list[int]) -> bytes:
        out = bytearray()
        for size, value in zip(sizes, values, strict=True):
            out += value.to_bytes(size, "big")
        if negative:
            out = bytearray(b ^ 0xFF for b in out)
        out[0] ^= 0x80
        return bytes(out)

    tops = [2 ** (8 * size - 1) - 1 for size in sizes]
    groups = st.tuples(*(st.sampled_from(sorted({0, min(10 ** 9, top), top})) |
                         st.integers(0, top) for top in tops))
    return st.builds(encode, st.booleans(), groups.map(list))


def _synthetic_value(column: SimpleNamespace) -> st.SearchStrategy[bytes]:
    kind = column.type
    if kind == _F.FLOAT:
        return _rarely(st.sampled_from(_FLOAT_EDGES).map(lambda v: v.to_bytes(4, "little")),
                       st.binary(min_size=4, max_size=4))
    if kind == _F.DOUBLE:
        return _rarely(st.sampled_from(_DOUBLE_EDGES).map(lambda v: v.to_bytes(8, "little")),
                       st.binary(min_size=8, max_size=8))
    if kind == _F.NEWDECIMAL:
        return _value_bytes(column) | _decimal_groups(column.precision, column.decimals)
    if kind == _F.TIMESTAMP2:
        zero = b"\x00" * (4 + (column.fsp + 1) // 2)
        return _rarely(st.just(zero), _value_bytes(column))
    if kind in (_F.VARCHAR, _F.BLOB, _F.STRING) and column.character_set_name == "utf8":
        width = column.length_size if kind == _F.BLOB else 1
        odd = st.sampled_from([b"\xc0\x80", b"\xe0\x9f\xbf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
                               b"\xf0\x8f\xbf\xbf", b"\xf8", b"\xe2\x82", b"abcdefgh\xff",
                               b"\xef\xbf\xbf", b"\xf4\x8f\xbf\xbf", b"\xed\x9f\xbf"])
        return (_value_bytes(column) | odd.map(lambda b, w=width: len(b).to_bytes(w, "little")
                                              + b))
    return _value_bytes(column)


@settings(max_examples=500, deadline=None)
@given(data=st.data(), update=st.booleans())
def test_arbitrary_bytes_of_every_target_decode_as_their_tuples_land(data, update):
    chosen = data.draw(st.lists(st.sampled_from(_SYNTHETIC), min_size=1, max_size=6))
    schema = TableSchema("db", "w", tuple(landing for _, landing in chosen))
    specs = [rowcodec.column_spec(column, _keep_text_bytes, landing) for column, landing in chosen]
    assert all(spec[4] != _codec.T_OBJECT for spec in specs)
    body, _ = draw_row_images(data, [column for column, _ in chosen], _synthetic_value,
                              2 if update else 1, st.integers(0, 20), cut_one_in=10)
    _check_bytes(_codec.Decoder(specs), schema, [s[4] for s in specs], body, update)


def test_utf8_is_refused_exactly_as_python_refuses_it():
    decoder = _codec.Decoder([(_codec.K_TEXT, 1, 0, None, _codec.T_UTF8, 0)])
    edges = [0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xFF]
    cases = [bytes([a]) for a in range(256)]
    cases += [bytes([a, b]) for a in range(0x80, 0x100) for b in range(256)]
    cases += [bytes([a, b, c]) for a in range(0xC0, 0x100) for b in range(256) for c in edges]
    cases += [bytes([a, b, c, d]) for a in range(0xF0, 0xF8) for b in range(256)
              for c in edges for d in edges]
    mismatches = []
    for case in cases:
        for value in (case, b"abcdefgh" + case + b"ijklmnop"):
            try:
                value.decode("utf-8")
                python = True
            except UnicodeDecodeError:
                python = False
            try:
                (_, ((column,),)) = decoder.decode_columns(b"\x00" + bytes([len(value)]) + value,
                                                           1)
                native = True
                assert column[1] == value
            except _codec.Unsupported:
                native = False
            if native != python:
                mismatches.append(value)
    assert not mismatches, mismatches[:10]


def test_a_decimal_of_more_digits_than_128_bits_hold_is_refused():
    """DECIMAL(38,10) bytes with a fraction group past 999999999 (no server writes them):
    decode reads 39 digits, which pyarrow would parse modulo 2**128; decode_columns refuses."""
    groups = [(9, 1), (999999999, 4), (999999999, 4), (999999999, 4), (2147483647, 4), (0, 1)]
    raw = bytearray(b"".join(v.to_bytes(size, "big") for v, size in groups))
    raw[0] ^= 0x80
    decoder = _codec.Decoder([(_codec.K_DECIMAL, 38, 10, None, _codec.T_DECIMAL128, 0)])
    body = b"\x00" + bytes(raw)
    assert decoder.decode(body, 1) == [(decimal.Decimal("9" * 28 + ".21474836470"),)]
    with pytest.raises(_codec.Unsupported, match="128 bits"):
        decoder.decode_columns(body, 1)


# -- the contract around the decoder ----------------------------------------------------------

def test_a_schema_other_than_the_table_maps_is_refused(table_map):
    tables, table_event, schema = table_map
    n = len(table_event.columns)
    event = _parse(_rows_event(table_event.table_id, n, b"\xff" * ((n + 7) // 8), False), tables)
    narrower = TableSchema(schema.database, schema.table, schema.columns[1:])
    with pytest.raises(ValueError, match="table map's own schema"):
        rowcodec.RowsDecoders().columns(event, narrower)


def test_refused_bytes_are_left_to_the_library(table_map):
    tables, table_event, schema = table_map
    n = len(table_event.columns)
    body = b"\x00" * ((n + 7) // 8) + b"\x01"  # a row cut inside its values
    event = _parse(_rows_event(table_event.table_id, n, body, False), tables)
    before = event.packet.read_bytes
    assert rowcodec.RowsDecoders().columns(event, schema) is None
    assert event.packet.read_bytes == before  # (unread: the library reads the same bytes)


def test_without_the_extension_every_event_goes_to_the_library(table_map, monkeypatch):
    tables, table_event, schema = table_map
    n = len(table_event.columns)
    monkeypatch.setattr(rowcodec, "_rowcodec", None)
    event = _parse(_rows_event(table_event.table_id, n, b"\xff" * ((n + 7) // 8), False), tables)
    assert rowcodec.RowsDecoders().columns(event, schema) is None
