"""Pure value conversion: binlog and SELECT forms of a value land identically."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st
from pymysql.constants import FIELD_TYPE
from pymysql.converters import convert_datetime

from cdc_platform.capture.schema import ColumnSpec
from cdc_platform.capture.source import SOURCE_DECODERS, datetime_from_text
from cdc_platform.capture.values import (
    _fix_binlog_negative_time,
    converter_for,
    format_time,
    row_hash,
)


@given(st.integers(min_value=-(838 * 3600 + 3599) * 10**6 - 999_999,
                   max_value=(838 * 3600 + 3599) * 10**6 + 999_999))
def test_time_text_matches_mysql_and_the_binlog_quirk_is_undone(micros):
    value = dt.timedelta(microseconds=micros)
    text = format_time(value, 6)
    sign = -1 if text.startswith("-") else 1
    hours, minutes, seconds = text.lstrip("-").split(":")
    parsed = sign * ((int(hours) * 3600 + int(minutes) * 60) * 10**6
                     + round(float(seconds) * 10**6))
    assert parsed == micros
    # mysql-replication reflects a negative value's fraction; the fix restores it exactly.
    if micros < 0 and value.microseconds:
        whole = value - dt.timedelta(microseconds=value.microseconds)
        quirky = whole + dt.timedelta(microseconds=10**6 - value.microseconds)
        assert _fix_binlog_negative_time(quirky) == value


def test_binlog_and_select_forms_convert_to_the_same_landing_value():
    pairs = [
        (ColumnSpec("s", "set", values=("a", "b", "c")), {"c", "a"}, "a,c"),
        (ColumnSpec("s", "set", values=("a", "b", "c")), None, ""),
        (ColumnSpec("b", "bit", precision=10), "1010101010", b"\x02\xaa"),
        (ColumnSpec("b", "bit", precision=64), "1" * 64, b"\xff" * 8),
        (ColumnSpec("u", "uint64"), 2**64 - 1, 2**64 - 1),
        (ColumnSpec("f", "float"), 0.12345670163631439, 0.12345670163631439),
        (ColumnSpec("d", "date"), None, "0000-00-00"),
        (ColumnSpec("w", "decimal", precision=50, scale=5), Decimal("0E-5"), Decimal("0.00000")),
        (ColumnSpec("j", "json"), {b"b": 1, b"a": [b"x"]}, '{"a": ["x"], "b": 1}'),
    ]
    for column, from_binlog, from_select in pairs:
        binlog = converter_for(column, from_binlog=True)
        select = converter_for(column, from_binlog=False)
        assert binlog(from_binlog) == select(from_select), column


@given(st.lists(st.one_of(st.none(), st.text(max_size=5)), min_size=2, max_size=2),
       st.lists(st.one_of(st.none(), st.text(max_size=5)), min_size=2, max_size=2))
def test_row_hash_separates_different_rows(a, b):
    if a != b:
        assert row_hash(["string", "string"], a) != row_hash(["string", "string"], b)


def test_excluding_columns_never_removes_key_columns():
    from cdc_platform.capture.schema import TableSchema

    schema = TableSchema("db", "t", (ColumnSpec("id", "int"), ColumnSpec("ssn", "string"),
                                     ColumnSpec("name", "string")), ("id",))
    assert schema.without_columns({"id", "ssn"}).column_names == ("id", "name")


# ---- the DATETIME/TIMESTAMP decoder of source sessions ------------------------------------------

_FIELDS = st.tuples(st.integers(0, 10_000), st.integers(0, 13), st.integers(0, 32),
                    st.integers(0, 24), st.integers(0, 60), st.integers(0, 60))


@given(_FIELDS, st.one_of(st.none(), st.integers(1, 6).flatmap(
    lambda digits: st.integers(0, 10 ** digits - 1).map(lambda f: str(f).zfill(digits)))),
    st.booleans())
def test_the_fast_datetime_decoder_agrees_with_pymysqls(fields, fraction, as_bytes):
    """Every text the server can send for a DATETIME/TIMESTAMP (zero and invalid dates
    included) decodes as pymysql's own decoder decodes it."""
    year, month, day, hour, minute, second = fields
    text = f"{year:04d}-{month:02d}-{day:02d} {hour:02d}:{minute:02d}:{second:02d}"
    if fraction is not None:
        text += "." + fraction
    value = text.encode() if as_bytes else text
    assert datetime_from_text(value) == convert_datetime(value)
    assert type(datetime_from_text(value)) is type(convert_datetime(value))


def test_source_sessions_use_the_fast_decoder():
    assert SOURCE_DECODERS[FIELD_TYPE.DATETIME] is datetime_from_text
    assert SOURCE_DECODERS[FIELD_TYPE.TIMESTAMP] is datetime_from_text
    assert datetime_from_text("2025-01-02 03:04:05.5") == dt.datetime(2025, 1, 2, 3, 4, 5, 500000)
    assert datetime_from_text("0000-00-00 00:00:00") == "0000-00-00 00:00:00"
