"""Column values in their landing-zone form, whether they came from the binlog or a SELECT.

mysql-replication and pymysql decode the same stored value differently (BIT as a bit string vs
bytes, SET as a Python set vs ``'a,b'``, FLOAT widened exactly vs printed with 6 digits, ...).
Every value that lands, and every value reconciliation compares, goes through one converter per
column kind here, so that streamed rows, snapshot chunks and reconciliation agree to the bit.

Kinds whose decoded value is already in landing form have no converter (``None``): the hot path
of the engine skips them.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import struct
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

from cdc_platform.capture.schema import ColumnSpec

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
    if value is None:
        return None
    if isinstance(value, bytes | bytearray):
        value = value.decode()
    if isinstance(value, str):
        value = json.loads(value)
    return json.dumps(_decode_json_bytes(value), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False)


def _decode_json_bytes(value: Any) -> Any:
    """mysql-replication's binary-JSON decoder returns bytes for keys and strings."""
    if isinstance(value, bytes | bytearray):
        return value.decode()
    if isinstance(value, dict):
        return {_decode_json_bytes(k): _decode_json_bytes(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode_json_bytes(v) for v in value]
    return value


def _set_converter(members: Sequence[str]) -> Converter:
    order = {m: i for i, m in enumerate(members)}

    def convert(value: Any) -> str | None:
        if value is None:
            return None
        if isinstance(value, str):
            value = value.split(",") if value else ()
        # An empty SET decodes as None from the binlog; land it as NULL from SELECTs too.
        if not value:
            return None
        return ",".join(sorted(value, key=lambda m: order.get(m, len(order))))

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


def _date_or_null(value: Any) -> dt.date | None:
    """Zero and invalid dates come back from SELECTs as text; the binlog gives None."""
    return value if isinstance(value, dt.date) else None


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


def _binary_padder(length: int) -> Converter:
    def convert(value: Any) -> bytes | None:
        if value is None:
            return None
        value = bytes(value)
        return value + b"\x00" * (length - len(value)) if len(value) < length else value

    return convert


def converter_for(column: ColumnSpec, from_binlog: bool) -> Converter | None:
    """The function turning a decoded value of ``column`` into its landing form, or None."""
    kind = column.kind
    if kind == "uint64":
        return _to_decimal
    if kind == "bit":
        return _bit_converter(column.precision or 1)
    if kind == "decimal":
        return _decimal_text if (column.precision or 10) > 38 else None
    if kind == "float":
        return _float32
    if kind == "binary" and column.precision and from_binlog:
        return _binary_padder(column.precision)
    if kind == "time":
        return _time_converter(column.scale or 0, from_binlog)
    if kind == "set":
        return _set_converter(column.values)
    if kind == "json":
        return _canonical_json
    if kind in ("date", "datetime", "timestamp"):
        return _date_or_null
    return None


def select_expression(column: ColumnSpec, quoted_name: str) -> str:
    """The SELECT expression that reads ``column`` without losing bits over the text protocol.

    FLOAT is printed with 6 significant digits by the server; widening to DOUBLE is exact
    (a multiplication, not ``+ 0e0``, so that -0.0 keeps its sign).
    """
    if column.kind == "float":
        return f"({quoted_name} * 1e0)"
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
