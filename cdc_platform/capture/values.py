"""Column values in their landing-zone form, whether they came from the binlog or a SELECT.

mysql-replication and pymysql decode the same stored value differently (BIT as a bit string vs
bytes, SET as a Python set vs ``'a,b'``, FLOAT widened exactly vs printed with 6 digits, ...).
Every value that lands, and every value reconciliation compares, goes through one converter per
column kind here, so that streamed rows, snapshot chunks and reconciliation agree to the bit.

Kinds whose decoded value is already in landing form have no converter (``None``): the hot path
of the engine skips them.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import struct
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

from cdc_platform.capture.charsets import (
    UndecodableText,
    as_information_schema_shows,
    text_decoder,
)
from cdc_platform.capture.schema import ColumnSpec, ColumnValueError

Converter = Callable[[Any], Any]

_ONE_SECOND_US = 1_000_000


def format_time(value: dt.timedelta, fsp: int) -> str:
    """MySQL's text form of a TIME value: ``[-]HH:MM:SS[.f]`` with ``fsp`` fraction digits."""
    total_us = value.days * 86_400 * _ONE_SECOND_US + value.seconds * _ONE_SECOND_US
    total_us += value.microseconds
    sign = "-" if total_us < 0 else ""
    total_us = abs(total_us)
    seconds, micros = divmod(total_us, _ONE_SECOND_US)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{sign}{hours:02d}:{minutes:02d}:{secs:02d}"
    if fsp:
        text += "." + f"{micros:06d}"[:fsp]
    return text


def _fix_binlog_negative_time(value: dt.timedelta) -> dt.timedelta:
    """mysql-replication 1.0 decodes a negative TIME's fraction as (1 s - fraction).

    Seen on MariaDB 10.11: ``-00:00:01.25`` arrives as ``-1 day, 23:59:58.250000``
    (that is -1.75 s). Reflect the fraction back so binlog and SELECT agree.
    """
    if value.days < 0 and value.microseconds:
        return value - dt.timedelta(microseconds=value.microseconds) + dt.timedelta(
            microseconds=_ONE_SECOND_US - value.microseconds
        )
    return value


def _float32(value: float | None) -> float | None:
    if value is None:
        return None
    return struct.unpack("<f", struct.pack("<f", value))[0]


def _canonical_json(value: Any) -> str | None:
    """Sorted keys, compact; numbers as ``json.loads`` reads MySQL's text of them.

    The SELECT side parses the server's JSON text; the binlog side gets mysql-replication's
    decoding of binary JSON (bytes strings, Decimal for DECIMAL scalars, and for temporal and
    opaque scalars the text MySQL prints: see :func:`json_opaque_text`). Both end as the same
    Python structure before dumping.
    """
    if value is None:
        return None
    if isinstance(value, bytes | bytearray):
        value = value.decode()
    if isinstance(value, str):
        value = json.loads(value)
    return json.dumps(_binlog_json_scalars(value), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False)


def _binlog_json_scalars(value: Any) -> Any:
    """Binary-JSON scalars as ``json.loads`` reads the text MySQL prints for them."""
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, bytes | bytearray):
        return value.decode()
    if isinstance(value, dict):
        return {_binlog_json_scalars(k): _binlog_json_scalars(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_binlog_json_scalars(v) for v in value]
    if isinstance(value, Decimal):
        # MySQL prints a JSON DECIMAL in plain notation with its scale (1.50): a float or an int
        # once parsed, as on the SELECT side.
        return json.loads(format(value, "f"))
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, dt.time):
        return value.strftime("%H:%M:%S.%f")
    raise ValueError(
        f"a JSON value of type {type(value).__name__} ({value!r:.80}) has no exact landing form "
        "(a partial JSON update? set binlog_row_value_options='' on the source)")


# MySQL field types of binary-JSON opaque scalars (include/field_types.h).
_JSON_DATE_TYPES = {10, 14}  # DATE, NEWDATE
_JSON_TIME_TYPES = {11, 19}  # TIME, TIME2
_JSON_DATETIME_TYPES = {7, 12, 17, 18}  # TIMESTAMP, DATETIME, TIMESTAMP2, DATETIME2


def json_opaque_text(field_type: int, data: bytes) -> str:
    """The JSON string MySQL prints for an opaque (non-DECIMAL) binary-JSON scalar.

    Temporal scalars are packed int64s (``TIME_to_longlong_*_packed``) printed with six
    fraction digits (``my_TIME_to_str(..., 6)``; a DATE without time); any other opaque value
    is ``base64:type<field type>:<base64 of the bytes>`` (``Json_wrapper::to_string``).
    """
    if field_type in _JSON_DATE_TYPES | _JSON_TIME_TYPES | _JSON_DATETIME_TYPES:
        packed = int.from_bytes(bytes(data[:8]), "little", signed=True)
        sign, packed = ("-" if packed < 0 else ""), abs(packed)
        fraction, whole = packed % (1 << 24), packed >> 24
        if field_type in _JSON_TIME_TYPES:
            hours, minutes, seconds = (whole >> 12) % (1 << 10), (whole >> 6) % 64, whole % 64
            return f"{sign}{hours:02d}:{minutes:02d}:{seconds:02d}.{fraction:06d}"
        ymd, hms = whole >> 17, whole % (1 << 17)
        year, month = divmod(ymd >> 5, 13)
        text = f"{year:04d}-{month:02d}-{ymd % 32:02d}"
        if field_type in _JSON_DATE_TYPES:
            return text
        hours, minutes, seconds = hms >> 12, (hms >> 6) % 64, hms % 64
        return f"{text} {hours:02d}:{minutes:02d}:{seconds:02d}.{fraction:06d}"
    return f"base64:type{field_type}:{base64.b64encode(bytes(data)).decode()}"


def _set_converter(members: Sequence[str], decode: Callable[[bytes], str] | None) -> Converter:
    """A SET value as the server prints it: members comma-joined in definition order.

    A SELECT already has that text. The binlog gives a Python set of member names (bytes, with
    ``decode``); they are ordered by ``members`` (as information_schema shows them: names with
    characters beyond U+FFFF read '?', see ``charsets.as_information_schema_shows``).
    """
    order = {m: i for i, m in enumerate(members)}

    def from_select(value: Any) -> str | None:
        # An empty SET decodes as None from the binlog; land it as NULL from SELECTs too.
        return value or None

    def from_binlog(value: Any) -> str | None:
        if not value:
            return None
        names = [decode(m) if decode and isinstance(m, bytes | bytearray) else m for m in value]
        keys = [order.get(as_information_schema_shows(m), len(order)) for m in names]
        if len(set(keys)) < len(keys):
            raise ValueError(f"the order of SET members {sorted(names)} is ambiguous (their "
                             "names differ only in characters beyond U+FFFF)")
        return ",".join(m for _, m in sorted(zip(keys, names, strict=True)))

    return from_binlog if decode is not None else from_select


def _text_converter(column: ColumnSpec, decode: Callable[[bytes], str]) -> Converter:
    """Binlog text kept as bytes (non-UTF-8 charsets, ENUM members) -> the SELECT's text.

    An empty value arrives as ``''`` (mysql-replication decodes b'' with any codec)."""
    def convert(value: Any) -> str | None:
        if value is None or isinstance(value, str):
            return value
        try:
            return decode(value)
        except UndecodableText as error:
            raise ColumnValueError(column, error, converting=True) from error

    return convert


def _bit_converter(width: int) -> Converter:
    wide = width >= 64

    def convert(value: Any) -> int | Decimal | None:
        if value is None:
            return None
        if isinstance(value, str):
            number = int(value, 2) if value else 0
        elif isinstance(value, bytes | bytearray):
            number = int.from_bytes(value, "big")
        else:
            number = int(value)
        return Decimal(number) if wide else number

    return convert


def _to_decimal(value: Any) -> Decimal | None:
    return None if value is None else Decimal(value)


def _decimal_text(value: Any) -> str | None:
    """Plain notation (``0.00000``, never ``0E-5``), as the server prints it."""
    return None if value is None else format(Decimal(value), "f")


def _decimal128(value: Any) -> Decimal | None:
    """A DECIMAL (precision <= 38) value as it lands: pyarrow wraps a Decimal of more than 38
    digits modulo 2**128 instead of refusing it (a 39-digit value became 1E-10), so such a
    value, which only damaged row bytes can give, is refused here."""
    if isinstance(value, Decimal) and len(value.as_tuple().digits) > 38:
        raise ValueError(f"{value} has more digits than its column can hold (a damaged row "
                         "image?); check the source's binlog")
    return value


def _date_or_null(value: Any) -> dt.date | None:
    """Zero and invalid dates come back from SELECTs as text; the binlog gives None."""
    return value if isinstance(value, dt.date) else None


_EPOCH = dt.datetime(1970, 1, 1)


def _binlog_timestamp(value: Any) -> dt.datetime | None:
    """The zero TIMESTAMP is stored as 0 seconds; mysql-replication decodes it as the epoch.

    No other TIMESTAMP is 0 (the type starts at 1970-01-01 00:00:01 UTC), and the SELECT side
    reads the zero TIMESTAMP as the text '0000-00-00 00:00:00': both land NULL, like zero dates.
    """
    return None if value == _EPOCH else value


def _binlog_year(value: Any) -> int | None:
    """YEAR is one byte: 0 is the year 0000, 1..255 are 1901..2155. mysql-replication adds 1900
    to every byte, so 0000 arrives as 1900 (which YEAR cannot hold); SELECT reads it as 0."""
    return 0 if value == 1900 else value


def _time_converter(fsp: int, from_binlog: bool) -> Converter:
    def convert(value: Any) -> str | None:
        if value is None:
            return None
        if isinstance(value, str):
            return value
        if from_binlog:
            value = _fix_binlog_negative_time(value)
        return format_time(value, fsp)

    return convert


def _binlog_binary(column: ColumnSpec) -> Converter:
    """BINARY(n) arrives with its 0x00 padding stripped (restore it: the server pads), and an
    empty value arrives as ``''`` (mysql-replication decodes b'' with any codec)."""
    length = column.precision

    def convert(value: Any) -> bytes | None:
        if value is None:
            return None
        if isinstance(value, str):
            if value:
                raise ColumnValueError(
                    column, ValueError(f"binary value arrived as text {value[:40]!r}"),
                    converting=True)
            value = b""
        if length and len(value) < length:
            return bytes(value) + b"\x00" * (length - len(value))
        return value

    return convert


def _loudly(column: ColumnSpec, convert: Converter) -> Converter:
    """A converter whose failure is a ColumnValueError naming the column (a loud stop)."""
    def checked(value: Any) -> Any:
        try:
            return convert(value)
        except (UndecodableText, ValueError, TypeError) as error:
            raise ColumnValueError(column, error, converting=True) from error

    return checked


def converter_for(column: ColumnSpec, from_binlog: bool) -> Converter | None:
    """The function turning a decoded value of ``column`` into its landing form, or None.

    A value that cannot be converted exactly raises ColumnValueError naming the column.
    """
    kind = column.kind
    if kind == "uint64":
        return _to_decimal
    if kind == "bit":
        return _bit_converter(column.precision or 1)
    if kind == "decimal":
        return _decimal_text if (column.precision or 10) > 38 else _loudly(column, _decimal128)
    if kind == "float":
        return _float32
    if kind == "time":
        return _time_converter(column.scale or 0, from_binlog)
    if kind == "json":
        return _loudly(column, _canonical_json)
    if kind in ("date", "datetime"):
        return _date_or_null
    if kind == "timestamp":
        return _binlog_timestamp if from_binlog else _date_or_null
    if not from_binlog:
        return _set_converter(column.values, None) if kind == "set" else None
    # The binlog side: text it keeps as bytes, and the library's own quirks.
    if kind == "binary":
        return _binlog_binary(column)
    if kind == "year":
        return _binlog_year
    if kind in ("string", "enum", "set"):
        # ENUM/SET member names are always bytes (any charset); other text only when not UTF-8.
        if column.charset is None and kind == "string":
            return None
        decode = text_decoder(column.charset or "utf8mb4")
        if kind == "set":
            return _loudly(column, _set_converter(column.values, decode))
        return _text_converter(column, decode)
    return None


def select_expression(column: ColumnSpec, quoted_name: str) -> str:
    """The SELECT expression that reads ``column`` without losing bits over the text protocol.

    FLOAT is printed with 6 significant digits by the server; widening to DOUBLE is exact
    (a multiplication, not ``+ 0e0``, so that -0.0 keeps its sign). Fixed-length binary
    columns are cast to their bytes (MariaDB's INET6 would print as text).
    """
    if column.kind == "float":
        return f"({quoted_name} * 1e0)"
    if column.kind == "binary" and column.precision:
        # BINARY(n) as is; MariaDB's INET4/INET6/UUID as the n bytes the binlog carries.
        return f"CAST({quoted_name} AS BINARY({int(column.precision)}))"
    return quoted_name


def canonical_value(kind: str, value: Any) -> str:
    """A stable text form of a landing value, for checksums that both sides must agree on.

    Values read back from Arrow/Spark differ from freshly converted ones only in form
    (aware vs naive UTC datetimes, float32 vs float): normalise those here.
    """
    if value is None:
        return "\\N"
    if kind == "timestamp" and isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return value.isoformat()
    if isinstance(value, bytes | bytearray):
        return "0x" + bytes(value).hex()
    if isinstance(value, float):
        return repr(_float32(value) if kind == "float" else value)
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    return str(value)


def row_hash(kinds: Sequence[str], values: Sequence[Any]) -> int:
    """A 64-bit hash of a row's canonical values (order-independent sums use it).

    Each value is framed (NULL flag, length) so that no two different rows share an encoding:
    NULL vs the text ``\\N``, or a separator inside a value, cannot collide.
    """
    digest = hashlib.blake2b(digest_size=8)
    for kind, value in zip(kinds, values, strict=True):
        if value is None:
            digest.update(b"\x00")
            continue
        encoded = canonical_value(kind, value).encode()
        digest.update(b"\x01" + len(encoded).to_bytes(4, "big") + encoded)
    return int.from_bytes(digest.digest(), "big", signed=True)
