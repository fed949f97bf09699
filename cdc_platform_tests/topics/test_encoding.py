"""Each column kind as a field of a Debezium MySQL change event: schema and JSON values."""

from __future__ import annotations

import base64
import datetime as dt
import json
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_platform.capture.schema import KINDS, ColumnSpec
from cdc_platform.capture.values import format_time
from cdc_platform.topics.encoding import (
    bits_bytes,
    decimal_bytes,
    decimal_unscaled,
    field_encoding,
    micro_time,
    unscaled_from_bytes,
    unsigned_as_long,
)

UTC = dt.UTC


def encode(column: ColumnSpec, values: list[Any]) -> list[Any]:
    """The JSON values of ``values`` landed in ``column``'s Arrow type (as json.loads reads
    the text the envelope writes)."""
    array = pa.array(values, column.arrow_type())
    return json.loads(json.dumps(field_encoding(column, optional=True).values(array)))


def schema_of(column: ColumnSpec, optional: bool = True) -> dict[str, Any]:
    return field_encoding(column, optional).field_schema()


# ---- decimals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("unscaled", "data"), [
    (0, b"\x00"), (1, b"\x01"), (127, b"\x7f"), (128, b"\x00\x80"), (255, b"\x00\xff"),
    (256, b"\x01\x00"), (-1, b"\xff"), (-128, b"\x80"), (-129, b"\xff\x7f"),
    (1234, b"\x04\xd2"),
])
def test_decimal_bytes_are_javas_big_integer_bytes(unscaled: int, data: bytes) -> None:
    assert decimal_bytes(unscaled) == data


@given(st.integers(min_value=-(10 ** 65), max_value=10 ** 65))
def test_decimal_bytes_round_trip_in_the_fewest_bytes(unscaled: int) -> None:
    data = decimal_bytes(unscaled)
    assert unscaled_from_bytes(data) == unscaled
    # one byte fewer no longer holds it (no redundant sign byte)
    assert len(data) == 1 or unscaled_from_bytes(data[1:]) != unscaled


@given(st.integers(min_value=-(10 ** 40), max_value=10 ** 40), st.integers(0, 30))
def test_decimal_unscaled_is_exact(unscaled: int, scale: int) -> None:
    value = Decimal(f"{unscaled}E-{scale}")  # (exact: scaleb would round to 28 digits)
    assert decimal_unscaled(value, scale) == unscaled
    assert decimal_unscaled(format(value, "f"), scale) == unscaled  # p > 38 lands as text
    assert decimal_unscaled(Decimal(unscaled), 0) == unscaled


def test_decimal_unscaled_refuses_digits_beyond_the_scale() -> None:
    assert decimal_unscaled(Decimal("1.500"), 1) == 15  # (trailing zeros are fine)
    with pytest.raises(ValueError, match="fraction digits"):
        decimal_unscaled(Decimal("1.25"), 1)


def test_decimal_field_is_connects_decimal_with_scale_and_precision() -> None:
    column = ColumnSpec("price", "decimal", precision=10, scale=2)
    assert schema_of(column, optional=False) == {
        "type": "bytes", "optional": False, "name": "org.apache.kafka.connect.data.Decimal",
        "version": 1, "parameters": {"scale": "2", "connect.decimal.precision": "10"},
        "field": "price"}
    assert list(schema_of(column)["parameters"]) == ["scale", "connect.decimal.precision"]
    assert encode(column, [Decimal("12.34"), Decimal("-0.01"), Decimal("0.00"), None]) == \
        ["BNI=", "/w==", "AA==", None]


@given(st.integers(1, 38).flatmap(lambda p: st.tuples(
    st.just(p), st.integers(0, p),
    st.lists(st.none() | st.integers(-(10 ** p) + 1, 10 ** p - 1), max_size=8))),
    st.integers(0, 3))
def test_decimal128_values_are_read_from_their_stored_unscaled_integers(
        case: tuple[int, int, list[int | None]], cut: int) -> None:
    precision, scale, unscaled = case
    column = ColumnSpec("d", "decimal", precision=precision, scale=scale)
    landed = [None if u is None else Decimal(f"{u}E-{scale}") for u in unscaled]
    array = pa.chunked_array([pa.array(landed, column.arrow_type()).slice(cut),
                              pa.array(landed[:cut], column.arrow_type())],
                             column.arrow_type())
    expected = [None if u is None else base64.b64encode(decimal_bytes(u)).decode()
                for u in unscaled[cut:] + unscaled[:cut]]
    assert field_encoding(column, True).values(array) == expected


def test_a_decimal_above_precision_38_lands_as_text_and_is_sent_exactly() -> None:
    column = ColumnSpec("big", "decimal", precision=65, scale=5)
    assert column.arrow_type() == pa.string()
    text = "-" + "9" * 60 + ".12345"
    [sent] = encode(column, [text])
    assert unscaled_from_bytes(base64.b64decode(sent)) == -int("9" * 60 + "12345")
    assert schema_of(column)["parameters"] == {"scale": "5", "connect.decimal.precision": "65"}


# ---- integers ----------------------------------------------------------------------------------


def test_integers_are_int64() -> None:
    column = ColumnSpec("n", "int")
    assert schema_of(column) == {"type": "int64", "optional": True, "field": "n"}
    assert encode(column, [-(2 ** 63), 0, 2 ** 63 - 1, None]) == [-(2 ** 63), 0, 2 ** 63 - 1,
                                                                  None]


def test_bigint_unsigned_is_a_java_long_that_wraps_above_2_to_63() -> None:
    column = ColumnSpec("u", "uint64")
    assert schema_of(column) == {"type": "int64", "optional": True, "field": "u"}
    assert encode(column, [Decimal(5), Decimal(2 ** 63 - 1), Decimal(2 ** 63),
                           Decimal(2 ** 64 - 1), None]) == [5, 2 ** 63 - 1, -(2 ** 63), -1, None]


@given(st.integers(0, 2 ** 64 - 1))
def test_unsigned_as_long_keeps_the_low_64_bits_signed(value: int) -> None:
    wrapped = unsigned_as_long(value)
    assert -(2 ** 63) <= wrapped < 2 ** 63
    assert wrapped % 2 ** 64 == value


def test_year_is_debeziums_year() -> None:
    column = ColumnSpec("y", "year")
    assert schema_of(column) == {"type": "int32", "optional": True, "name": "io.debezium.time.Year",
                                 "version": 1, "field": "y"}
    assert encode(column, [2024, 0, None]) == [2024, 0, None]


# ---- bits --------------------------------------------------------------------------------------


def test_bit_1_is_a_boolean() -> None:
    column = ColumnSpec("flag", "bit", precision=1)
    assert schema_of(column) == {"type": "boolean", "optional": True, "field": "flag"}
    assert encode(column, [1, 0, None]) == [True, False, None]


def test_bit_n_is_little_endian_bytes_of_its_width() -> None:
    column = ColumnSpec("b", "bit", precision=10)
    assert schema_of(column) == {
        "type": "bytes", "optional": True, "name": "io.debezium.data.Bits", "version": 1,
        "parameters": {"length": "10"}, "field": "b"}
    # 0b10_0000_0001 = 513: low byte first, two bytes for ten bits
    assert encode(column, [513, 0, None]) == ["AQI=", "AAA=", None]


def test_bit_64_lands_as_a_decimal_and_is_sent_as_eight_bytes() -> None:
    column = ColumnSpec("b", "bit", precision=64)
    [sent] = encode(column, [Decimal(2 ** 64 - 2)])
    assert base64.b64decode(sent) == b"\xfe" + b"\xff" * 7


@given(st.integers(1, 64).flatmap(lambda w: st.tuples(st.just(w), st.integers(0, 2 ** w - 1))))
def test_bits_bytes_hold_the_value_in_ceil_width_over_8_bytes(case: tuple[int, int]) -> None:
    width, value = case
    data = bits_bytes(value, width)
    assert len(data) == (width + 7) // 8
    assert int.from_bytes(data, "little") == value


# ---- floating point ----------------------------------------------------------------------------


def test_float_is_float32_sent_as_its_shortest_text() -> None:
    column = ColumnSpec("f", "float")
    assert schema_of(column) == {"type": "float", "optional": True, "field": "f"}
    values = field_encoding(column, True).values(pa.array([0.1, -0.0, 16777217.0, None],
                                                          pa.float32()))
    assert json.dumps(values) == "[0.1, -0.0, 16777216.0, null]"


def test_double_is_float64() -> None:
    column = ColumnSpec("d", "double")
    assert schema_of(column) == {"type": "double", "optional": True, "field": "d"}
    assert encode(column, [0.1, -0.0, 1e300, None]) == [0.1, -0.0, 1e300, None]


# ---- temporal ----------------------------------------------------------------------------------


def test_date_is_days_since_the_epoch() -> None:
    column = ColumnSpec("d", "date")
    assert schema_of(column) == {"type": "int32", "optional": True, "name": "io.debezium.time.Date",
                                 "version": 1, "field": "d"}
    assert encode(column, [dt.date(1970, 1, 2), dt.date(1969, 12, 31), dt.date(1000, 1, 1),
                           None]) == [1, -1, -354285, None]


@pytest.mark.parametrize("fsp", [0, 1, 2, 3])
def test_datetime_up_to_3_digits_is_epoch_milliseconds(fsp: int) -> None:
    column = ColumnSpec("t", "datetime", scale=fsp)
    assert schema_of(column)["name"] == "io.debezium.time.Timestamp"
    assert schema_of(column)["type"] == "int64"
    # the doc's example: 2018-06-20 06:37:03 -> 1529476623000
    assert encode(column, [dt.datetime(2018, 6, 20, 6, 37, 3), dt.datetime(1969, 12, 31, 23, 59,
                                                                         59, 999000), None]) \
        == [1529476623000, -1, None]


@pytest.mark.parametrize("fsp", [4, 5, 6])
def test_datetime_of_4_to_6_digits_is_epoch_microseconds(fsp: int) -> None:
    column = ColumnSpec("t", "datetime", scale=fsp)
    assert schema_of(column) == {"type": "int64", "optional": True,
                                 "name": "io.debezium.time.MicroTimestamp", "version": 1,
                                 "field": "t"}
    assert encode(column, [dt.datetime(2018, 6, 20, 6, 37, 3, 123456), None]) == \
        [1529476623123456, None]


@pytest.mark.parametrize(("fsp", "text"), [
    (0, "2018-06-20T13:37:03Z"),
    (1, "2018-06-20T13:37:03.1Z"),
    (3, "2018-06-20T13:37:03.120Z"),
    (5, "2018-06-20T13:37:03.12000Z"),
    (6, "2018-06-20T13:37:03.120000Z"),
])
def test_timestamp_is_utc_iso_text_with_exactly_fsp_digits(fsp: int, text: str) -> None:
    column = ColumnSpec("ts", "timestamp", scale=fsp)
    assert schema_of(column) == {"type": "string", "optional": True,
                                 "name": "io.debezium.time.ZonedTimestamp", "version": 1,
                                 "field": "ts"}
    value = dt.datetime(2018, 6, 20, 13, 37, 3, 120000 if fsp else 0, tzinfo=UTC)
    assert encode(column, [value, None]) == [text, None]


def test_time_is_signed_microseconds() -> None:
    column = ColumnSpec("t", "time", scale=6)
    assert schema_of(column) == {"type": "int64", "optional": True,
                                 "name": "io.debezium.time.MicroTime", "version": 1, "field": "t"}
    assert encode(column, ["00:00:00.000000", "12:00:00.5", "-00:00:01.25", "838:59:59", None]) \
        == [0, 43_200_500_000, -1_250_000, 3_020_399_000_000, None]


@given(st.integers(-3_020_399_999_999, 3_020_399_999_999), st.integers(0, 6))
def test_micro_time_reads_the_landed_time_text(micros: int, fsp: int) -> None:
    sign = -1 if micros < 0 else 1
    kept = sign * (abs(micros) - abs(micros) % 10 ** (6 - fsp))  # the digits fsp keeps
    assert micro_time(format_time(dt.timedelta(microseconds=micros), fsp)) == kept


# ---- text and bytes ----------------------------------------------------------------------------


def test_strings_are_strings() -> None:
    column = ColumnSpec("s", "string")
    assert schema_of(column) == {"type": "string", "optional": True, "field": "s"}
    assert encode(column, ["", "ünï 😀", None]) == ["", "ünï 😀", None]


def test_binary_is_base64_bytes() -> None:
    column = ColumnSpec("b", "binary", precision=4)
    assert schema_of(column) == {"type": "bytes", "optional": True, "field": "b"}
    assert encode(column, [b"\x00\x01\xfe\xff", b"", None]) == ["AAH+/w==", "", None]


def test_enum_and_set_carry_their_members_escaped() -> None:
    enum = ColumnSpec("e", "enum", values=("a", "b,c", "d\\e"))
    assert schema_of(enum) == {"type": "string", "optional": True, "name": "io.debezium.data.Enum",
                               "version": 1, "parameters": {"allowed": "a,b\\,c,d\\\\e"},
                               "field": "e"}
    assert encode(enum, ["b,c", "", None]) == ["b,c", "", None]
    members = ColumnSpec("s", "set", values=("x", "y"))
    assert schema_of(members) == {"type": "string", "optional": True,
                                  "name": "io.debezium.data.EnumSet", "version": 1,
                                  "parameters": {"allowed": "x,y"}, "field": "s"}
    assert encode(members, ["x,y", None]) == ["x,y", None]


def test_json_is_its_text() -> None:
    column = ColumnSpec("j", "json")
    assert schema_of(column) == {"type": "string", "optional": True, "name": "io.debezium.data.Json",
                                 "version": 1, "field": "j"}
    assert encode(column, ['{"a":[1,2.5,null]}', "null", None]) == ['{"a":[1,2.5,null]}', "null",
                                                                    None]


# ---- every kind --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_has_a_field_and_sends_null_as_null(kind: str) -> None:
    column = ColumnSpec("c", kind, precision=10 if kind in ("decimal", "bit") else None, scale=2
                        if kind == "decimal" else None, values=("a",) if kind in ("enum", "set")
                        else ())
    encoding = field_encoding(column, optional=False)
    assert encoding.schema["optional"] is False
    assert list(encoding.schema)[:2] == ["type", "optional"]
    assert encoding.values(pa.array([None, None], column.arrow_type())) == [None, None]


def test_an_unknown_kind_is_refused_with_the_column_named() -> None:
    with pytest.raises(ValueError, match="column g.*'geometry'"):
        field_encoding(ColumnSpec("g", "geometry"), optional=True)
