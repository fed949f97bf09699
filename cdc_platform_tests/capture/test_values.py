"""Pure value conversion: binlog and SELECT forms of a value land identically."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pymysql.constants import FIELD_TYPE
from pymysql.converters import convert_datetime

from cdc_platform.capture.schema import ColumnSpec, ColumnValueError
from cdc_platform.capture.source import SOURCE_DECODERS, datetime_from_text
from cdc_platform.capture.values import (
    _fix_binlog_negative_time,
    converter_for,
    format_time,
    json_opaque_text,
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
    # TIME stays the server's text: its landing form, and a key parameter pymysql cannot
    # mangle (it escapes a negative timedelta wrongly).
    assert SOURCE_DECODERS[FIELD_TYPE.TIME](b"-838:59:59.50") == "-838:59:59.50"


# ---- binlog quirks and charsets (issue 13) ------------------------------------------------------


def _both(column: ColumnSpec, from_binlog, from_select):
    binlog = converter_for(column, from_binlog=True)
    select = converter_for(column, from_binlog=False)
    return (binlog(from_binlog) if binlog else from_binlog,
            select(from_select) if select else from_select)


def test_empty_binary_values_arrive_as_empty_text_and_land_as_bytes():
    """mysql-replication decodes b'' with any codec, so an empty (all-padding) BINARY(n) or an
    empty VARBINARY is '' (the TypeError of issue 13 in an UPDATE's before image)."""
    assert _both(ColumnSpec("b", "binary", precision=4), "", b"\x00" * 4) == (b"\x00" * 4,) * 2
    assert _both(ColumnSpec("b", "binary", precision=4), b"a", b"a\x00\x00\x00") == (
        b"a\x00\x00\x00",) * 2
    assert _both(ColumnSpec("v", "binary"), "", b"") == (b"", b"")


def test_zero_timestamp_and_year_zero_land_as_the_select_reads_them():
    ts = ColumnSpec("t", "timestamp", scale=0)
    assert _both(ts, dt.datetime(1970, 1, 1), "0000-00-00 00:00:00") == (None, None)
    assert _both(ts, dt.datetime(1970, 1, 1, 0, 0, 1), dt.datetime(1970, 1, 1, 0, 0, 1)) == (
        dt.datetime(1970, 1, 1, 0, 0, 1),) * 2
    year = ColumnSpec("y", "year")
    assert _both(year, 1900, 0) == (0, 0)
    assert _both(year, 1901, 1901) == (1901, 1901)
    assert _both(year, 2155, 2155) == (2155, 2155)


def test_text_in_other_charsets_decodes_as_the_server_converts_it():
    cases = [
        ("latin1", bytes.fromhex("C3814C"), "Ã\x81L"),  # 0x81: not in Python's cp1252
        ("latin1", bytes([0x81, 0x8D, 0x8F, 0x90, 0x9D, 0x80]), "\x81\x8d\x8f\x90\x9d€"),
        ("utf16", "é😀".encode("utf-16-be"), "é😀"),  # big-endian, no BOM
        ("utf16le", "é😀".encode("utf-16-le"), "é😀"),
        ("utf32", "é😀".encode("utf-32-be"), "é😀"),
        ("ucs2", "é中".encode("utf-16-be"), "é中"),
        ("euckr", "갂".encode("cp949"), "갂"),  # MySQL's euckr is Windows' cp949
        ("sjis", bytes.fromhex("815F"), "\\"),
        ("cp1251", "Привет".encode("cp1251"), "Привет"),
    ]
    for charset, data, text in cases:
        column = ColumnSpec("s", "string", charset=charset)
        assert _both(column, data, text) == (text, text), charset
    assert _both(ColumnSpec("s", "string", charset="latin1"), "", "") == ("", "")


@pytest.mark.parametrize(("charset", "data"), [
    ("cp1250", b"\x81"), ("ascii", b"\x80"), ("ucs2", "😀".encode("utf-16-be")),
    ("utf16", b"\xd8\x00"), ("eucjpms", b"abc"),
])
def test_text_a_charset_cannot_decode_is_a_loud_column_error(charset, data):
    convert = converter_for(ColumnSpec("s", "string", charset=charset), from_binlog=True)
    with pytest.raises(ColumnValueError, match=f"column s \\(string, charset {charset}\\)"):
        convert(data)


def test_enum_and_set_members_in_any_charset():
    enum = ColumnSpec("e", "enum", values=("é", "b"), charset="latin1")
    assert _both(enum, "é".encode("latin1"), "é") == ("é", "é")
    assert _both(enum, "", "") == ("", "")  # the invalid value (index 0)
    members = ("?", "b", "é")  # information_schema shows 😀 as ?
    binlog_set = ColumnSpec("s", "set", values=members)
    assert _both(binlog_set, {"é".encode(), "😀".encode(), b"b"}, "😀,b,é") == ("😀,b,é",) * 2
    assert _both(binlog_set, None, "") == (None, None)
    ambiguous = converter_for(ColumnSpec("s", "set", values=("?", "?")), from_binlog=True)
    with pytest.raises(ColumnValueError, match="ambiguous"):
        ambiguous({"😀".encode(), "😁".encode()})


def test_column_specs_read_back_from_metadata_written_before_charsets():
    old = {"name": "c", "kind": "string", "precision": None, "scale": None, "values": []}
    assert ColumnSpec.from_dict(old) == ColumnSpec("c", "string")
    assert ColumnSpec("c", "string").to_dict() == old  # utf8 columns: metadata unchanged
    latin1 = ColumnSpec("c", "string", charset="latin1")
    assert ColumnSpec.from_dict(latin1.to_dict()) == latin1
    assert ColumnSpec("u", "binary", 16, source_type="uuid").to_dict()["precision"] == 16
    assert "source_type" not in ColumnSpec("u", "binary", 16, source_type="uuid").to_dict()


# MySQL's binary JSON: what the decoder hands over (json_binary with the platform's
# parse_opaque) and the text the server prints for the same document (SELECT side).
_PACKED_DATETIME = ((((2024 * 13 + 2) << 5 | 29) << 17 | (13 << 12 | 5 << 6 | 9)) << 24) | 123
_PACKED_TIME = -((((838 << 12) | (59 << 6) | 58) << 24) | 999_999)


def test_json_typed_scalars_land_as_mysql_prints_them():
    date = json_opaque_text(10, (_PACKED_DATETIME - 123 - ((13 << 12 | 5 << 6 | 9) << 24))
                            .to_bytes(8, "little", signed=True))
    datetime = json_opaque_text(12, _PACKED_DATETIME.to_bytes(8, "little", signed=True))
    time = json_opaque_text(11, _PACKED_TIME.to_bytes(8, "little", signed=True))
    blob = json_opaque_text(252, b"\x00\xff")
    assert (date, datetime, time, blob) == (
        "2024-02-29", "2024-02-29 13:05:09.000123", "-838:59:58.999999", "base64:type252:AP8=")
    from_binlog = {b"d": Decimal("1.50"), b"n": Decimal("-12345678901234567890"),
                   b"when": [date, datetime, time], b"blob": blob, b"f": 0.1, b"s": b"\xc3\xa9"}
    from_select = ('{"d": 1.50, "n": -12345678901234567890, "when": ["2024-02-29", '
                   '"2024-02-29 13:05:09.000123", "-838:59:58.999999"], '
                   '"blob": "base64:type252:AP8=", "f": 0.1, "s": "é"}')
    json_column = ColumnSpec("j", "json")
    binlog, select = _both(json_column, from_binlog, from_select)
    assert binlog == select
    # Python's own temporal values (the library's decoder without the platform's) too:
    assert _both(json_column, [dt.date(2024, 2, 29), dt.datetime(2024, 2, 29, 1, 2, 3)],
                 '["2024-02-29", "2024-02-29 01:02:03.000000"]')[0] == \
        '["2024-02-29","2024-02-29 01:02:03.000000"]'


def test_a_partial_json_update_is_a_loud_column_error():
    from pymysqlreplication.json_binary import JsonDiff, JsonDiffOperation

    convert = converter_for(ColumnSpec("j", "json"), from_binlog=True)
    with pytest.raises(ColumnValueError, match="binlog_row_value_options"):
        convert(JsonDiff(JsonDiffOperation.Replace, b"$.a", b"1"))


@pytest.mark.parametrize("from_binlog", [True, False])
def test_a_decimal_of_more_digits_than_decimal128_holds_is_refused_not_wrapped(from_binlog):
    """pyarrow turns a 39-digit Decimal into a wrong value (modulo 2**128) instead of refusing
    it: the converter refuses it first, naming the column (damaged row bytes can give one)."""
    column = ColumnSpec("amount", "decimal", 38, 10)
    convert = converter_for(column, from_binlog=from_binlog)
    wide = Decimal("3402823669209384634633746074.31768211466")
    with pytest.raises(ColumnValueError, match="column amount"):
        convert(wide)
    fits = Decimal("1234567890123456789012345678.0123456789")
    assert convert(fits) is fits and convert(None) is None
    assert pa.array([fits], column.arrow_type()).to_pylist() == [fits]
