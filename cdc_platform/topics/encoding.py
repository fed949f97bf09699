"""One column of the landing zone as a field of Debezium's MySQL change events: its Kafka Connect
schema (as the JSON converter writes it) and its values (as the JSON converter writes them),
under Debezium's default settings: ``decimal.handling.mode=precise``,
``time.precision.mode=adaptive_time_microseconds``, ``bigint.unsigned.handling.mode=long``,
``binary.handling.mode=bytes``. docs/change-topics.md, "Type mapping", has the table.

Values are converted a column at a time from the Arrow arrays the landing zone holds
(``ColumnSpec.arrow_type``), to Python values ``json.dumps`` writes as the JSON converter does:
bytes become base64 text (Jackson's binary nodes), decimals their unscaled two's-complement
bytes in base64 (Connect's ``Decimal``), temporal values Debezium's epoch counts or ISO text.

What the landing zone does not keep cannot be sent: the integer width (every integer kind lands
as ``int``: the field is ``int64`` where Debezium says int8/int16/int32), a column's
nullability (every non-key field is optional), its default and comment, and the zero dates
MySQL allows (they land, and are sent, as null).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_platform.capture.schema import ColumnSpec

# Connect's logical decimal and the parameter Debezium adds to it.
DECIMAL_NAME = "org.apache.kafka.connect.data.Decimal"
DECIMAL_PRECISION_PARAMETER = "connect.decimal.precision"

_TWO_TO_64 = 1 << 64
_TWO_TO_63 = 1 << 63
# DATETIME(fsp) up to this many fraction digits is io.debezium.time.Timestamp (ms), above it
# MicroTimestamp (µs): adaptive_time_microseconds.
_MILLISECOND_FSP = 3

Schema = dict[str, Any]  # a Connect schema as the JSON converter writes it, without "field"
Values = Callable[[pa.Array | pa.ChunkedArray], list[Any]]


@dataclass(frozen=True)
class FieldEncoding:
    """A column as an event field: ``schema`` (its JSON-converter form, key order included)
    and ``values``, which turns the column's landed array into JSON-ready values (None: null)."""

    column: ColumnSpec
    schema: Schema
    values: Values

    def field_schema(self) -> Schema:
        """The schema as a struct's field (the JSON converter adds ``field`` last)."""
        return {**self.schema, "field": self.column.name}


def field_encoding(column: ColumnSpec, optional: bool) -> FieldEncoding:
    """The event field of ``column``; ``optional``: may be null (every column but the key's:
    the landing zone does not keep NOT NULL)."""
    kind = column.kind
    if kind == "bit" and (column.precision or 1) == 1:
        return _field(column, "boolean", optional, values=_bit_as_boolean)
    builder = _BUILDERS.get(kind)
    if builder is None:
        raise ValueError(f"column {column.name}: kind {kind!r} has no change-event encoding")
    return builder(column, optional)


# ---- pure rules (property-tested) --------------------------------------------------------------


def decimal_unscaled(value: Decimal | str, scale: int) -> int:
    """The unscaled integer of a DECIMAL(p, scale) value: ``value * 10**scale``, exactly.

    ValueError when ``value`` has non-zero digits beyond ``scale`` (the column cannot hold it).
    """
    sign, digits, exponent = Decimal(value).as_tuple()
    if not isinstance(exponent, int):
        raise ValueError(f"{value!r} is not a finite decimal")
    magnitude = int("".join(map(str, digits)) or "0")
    shift = exponent + scale
    if shift >= 0:
        magnitude *= 10 ** shift
    else:
        magnitude, rest = divmod(magnitude, 10 ** -shift)
        if rest:
            raise ValueError(f"{value} has more than {scale} fraction digits")
    return -magnitude if sign else magnitude


def decimal_bytes(unscaled: int) -> bytes:
    """Java's ``BigInteger.toByteArray``: the shortest big-endian two's-complement form (one
    byte at least), which Connect's ``Decimal`` carries."""
    length = (unscaled if unscaled >= 0 else ~unscaled).bit_length() // 8 + 1
    return unscaled.to_bytes(length, "big", signed=True)


def unscaled_from_bytes(data: bytes) -> int:
    """The inverse of ``decimal_bytes`` (what a consumer does)."""
    return int.from_bytes(data, "big", signed=True)


def bits_bytes(value: int, width: int) -> bytes:
    """BIT(width) as Debezium's ``io.debezium.data.Bits``: little-endian, ``ceil(width / 8)``
    bytes."""
    return value.to_bytes((width + 7) // 8, "little")


def unsigned_as_long(value: int) -> int:
    """BIGINT UNSIGNED under ``bigint.unsigned.handling.mode=long``: Debezium keeps the low 64
    bits as a Java long, so values from 2**63 on wrap to negative numbers (value - 2**64)."""
    return value - _TWO_TO_64 if value >= _TWO_TO_63 else value


def micro_time(text: str) -> int:
    """MySQL's TIME text ``[-]HH:MM:SS[.f]`` (as it lands) -> signed microseconds, as Debezium's
    ``io.debezium.time.MicroTime`` carries a TIME's duration (hours may exceed 23)."""
    negative = text.startswith("-")
    clock, _, fraction = text.lstrip("-").partition(".")
    hours, minutes, seconds = (int(part) for part in clock.split(":"))
    micros = ((hours * 60 + minutes) * 60 + seconds) * 1_000_000 + int((fraction + "000000")[:6])
    return -micros if negative else micros


def zoned_timestamp_texts(array: pa.Array | pa.ChunkedArray, fsp: int) -> list[str | None]:
    """TIMESTAMP(fsp) values (timestamp[us, UTC]) as Debezium's ``io.debezium.time.ZonedTimestamp``:
    ISO 8601 in UTC with exactly ``fsp`` fraction digits (none for fsp 0), zone ``Z``."""
    naive = array.cast(pa.timestamp("us"))  # (the same instants, in UTC; no zone database)
    texts = pc.strftime(naive, format="%Y-%m-%dT%H:%M:%S").to_pylist()  # SS.ffffff
    keep = 19 + (fsp + 1 if fsp else 0)
    return [None if t is None else t[:keep] + "Z" for t in texts]


def escaped_members(members: tuple[str, ...]) -> str:
    """ENUM/SET members as Debezium's ``allowed`` parameter: comma-separated, with ``\\`` and
    ``,`` escaped by a backslash."""
    return ",".join(m.replace("\\", "\\\\").replace(",", "\\,") for m in members)


# ---- per kind ----------------------------------------------------------------------------------


def _field(column: ColumnSpec, connect_type: str, optional: bool, values: Values,
           name: str | None = None, version: int | None = None,
           parameters: dict[str, str] | None = None) -> FieldEncoding:
    schema: Schema = {"type": connect_type, "optional": optional}
    if name is not None:
        schema["name"] = name
    if version is not None:
        schema["version"] = version
    if parameters is not None:
        schema["parameters"] = parameters
    return FieldEncoding(column, schema, values)


def _as_is(array: pa.Array | pa.ChunkedArray) -> list[Any]:
    return array.to_pylist()


def _mapped(convert: Callable[[Any], Any]) -> Values:
    def values(array: pa.Array | pa.ChunkedArray) -> list[Any]:
        return [None if v is None else convert(v) for v in array.to_pylist()]
    return values


def _base64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _int64(column: ColumnSpec, optional: bool) -> FieldEncoding:
    return _field(column, "int64", optional, _as_is)


def _uint64(column: ColumnSpec, optional: bool) -> FieldEncoding:
    return _field(column, "int64", optional, _mapped(lambda v: unsigned_as_long(int(v))))


def _decimal128_values(array: pa.Array | pa.ChunkedArray) -> list[str | None]:
    """decimal128 values from their 16-byte little-endian unscaled integers, as stored."""
    chunks = array.chunks if isinstance(array, pa.ChunkedArray) else [array]
    return [None if raw is None else _base64(decimal_bytes(int.from_bytes(raw, "little",
                                                                          signed=True)))
            for chunk in chunks for raw in chunk.view(pa.binary(16)).to_pylist()]


def _decimal(column: ColumnSpec, optional: bool) -> FieldEncoding:
    precision, scale = column.precision or 10, column.scale or 0
    values = _decimal128_values if pa.types.is_decimal128(column.arrow_type()) else _mapped(
        lambda v: _base64(decimal_bytes(decimal_unscaled(v, scale))))  # (p > 38: text)
    return _field(
        column, "bytes", optional, values, name=DECIMAL_NAME, version=1,
        parameters={"scale": str(scale), DECIMAL_PRECISION_PARAMETER: str(precision)})


def _float32_values(array: pa.Array | pa.ChunkedArray) -> list[float | None]:
    # The shortest text that reads back as the same float32 (Java's Float.toString does the
    # same): 0.1f is sent as 0.1, not as its exact double 0.10000000149011612.
    return [None if t is None else float(t) for t in array.cast(pa.string()).to_pylist()]


def _float(column: ColumnSpec, optional: bool) -> FieldEncoding:
    return _field(column, "float", optional, _float32_values)


def _double(column: ColumnSpec, optional: bool) -> FieldEncoding:
    return _field(column, "double", optional, _as_is)


def _date(column: ColumnSpec, optional: bool) -> FieldEncoding:
    return _field(column, "int32", optional, lambda a: a.cast(pa.int32()).to_pylist(),
                  name="io.debezium.time.Date", version=1)


def _datetime(column: ColumnSpec, optional: bool) -> FieldEncoding:
    micros = (column.scale or 0) > _MILLISECOND_FSP
    if micros:
        return _field(column, "int64", optional, lambda a: a.cast(pa.int64()).to_pylist(),
                      name="io.debezium.time.MicroTimestamp", version=1)

    def millis(array: pa.Array | pa.ChunkedArray) -> list[int | None]:
        return [None if v is None else v // 1000 for v in array.cast(pa.int64()).to_pylist()]

    return _field(column, "int64", optional, millis, name="io.debezium.time.Timestamp",
                  version=1)


def _timestamp(column: ColumnSpec, optional: bool) -> FieldEncoding:
    fsp = column.scale or 0
    return _field(column, "string", optional, lambda a: zoned_timestamp_texts(a, fsp),
                  name="io.debezium.time.ZonedTimestamp", version=1)


def _time(column: ColumnSpec, optional: bool) -> FieldEncoding:
    return _field(column, "int64", optional, _mapped(micro_time),
                  name="io.debezium.time.MicroTime", version=1)


def _year(column: ColumnSpec, optional: bool) -> FieldEncoding:
    return _field(column, "int32", optional, _as_is, name="io.debezium.time.Year", version=1)


def _string(column: ColumnSpec, optional: bool) -> FieldEncoding:
    return _field(column, "string", optional, _as_is)


def _binary(column: ColumnSpec, optional: bool) -> FieldEncoding:
    return _field(column, "bytes", optional, _mapped(_base64))


def _enum(column: ColumnSpec, optional: bool) -> FieldEncoding:
    return _field(column, "string", optional, _as_is, name="io.debezium.data.Enum", version=1,
                  parameters={"allowed": escaped_members(column.values)})


def _set(column: ColumnSpec, optional: bool) -> FieldEncoding:
    return _field(column, "string", optional, _as_is, name="io.debezium.data.EnumSet",
                  version=1, parameters={"allowed": escaped_members(column.values)})


def _json(column: ColumnSpec, optional: bool) -> FieldEncoding:
    return _field(column, "string", optional, _as_is, name="io.debezium.data.Json", version=1)


def _bits(column: ColumnSpec, optional: bool) -> FieldEncoding:
    width = column.precision or 1
    return _field(column, "bytes", optional, _mapped(lambda v: _base64(bits_bytes(int(v), width))),
                  name="io.debezium.data.Bits", version=1, parameters={"length": str(width)})


def _bit_as_boolean(array: pa.Array | pa.ChunkedArray) -> list[bool | None]:
    return [None if v is None else bool(v) for v in array.to_pylist()]


_BUILDERS: dict[str, Callable[[ColumnSpec, bool], FieldEncoding]] = {
    "int": _int64, "uint64": _uint64, "decimal": _decimal, "float": _float, "double": _double,
    "date": _date, "datetime": _datetime, "timestamp": _timestamp, "time": _time, "year": _year,
    "string": _string, "binary": _binary, "enum": _enum, "set": _set, "json": _json,
    "bit": _bits,
}
