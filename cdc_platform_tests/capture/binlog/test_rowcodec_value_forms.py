"""The two directions of one value form in the native rows decoder (capture/binlog/_rowcodec.c):
``read_value`` (a column's bytes -> the Python value the library gives, ``decode``) and
``put_value`` (the same bytes -> the landing value in an Arrow buffer, ``decode_columns`` with a
target). They must refuse exactly the same bytes, or an event would take the native path one
way and the library's the other, and land differently.

The one refusal ``put_value`` adds is deliberate: a value its Arrow type cannot hold, which the
tuple path (read_value, then ``values.converter_for`` and ``pa.array``) refuses as well, only
later. Both directions are generated here, kind by kind, from the same codec
(``rowcodec.ColumnCodec``) with and without its landing target (hypothesis).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from cdc_platform.capture.binlog import rowcodec
from cdc_platform.capture.schema import ColumnSpec, ColumnValueError
from cdc_platform.capture.values import converter_for

pytestmark = pytest.mark.skipif(not rowcodec.available(), reason="native decoder not built")

_codec = rowcodec._rowcodec  # noqa: SLF001 - the extension under test
Kind = rowcodec.Kind

# Kinds with a landing target: (bytes of a value, the landing kind).
_INT_WIDTHS = {"INT8": 1, "UINT8": 1, "INT16": 2, "UINT16": 2, "INT24": 3, "UINT24": 3,
               "INT32": 4, "UINT32": 4, "INT64": 8}
_FSP_BYTES = [0, 1, 1, 2, 2, 3, 3]
_DIG2BYTES = [0, 1, 1, 2, 2, 3, 3, 4, 4, 4]


def _decimal_layout(precision: int, scale: int) -> list[int]:
    """Digits per group of a DECIMAL(precision, scale) as the server stores it."""
    integral = precision - scale
    return ([integral % 9] if integral % 9 else []) + [9] * (integral // 9) + [9] * (
        scale // 9) + ([scale % 9] if scale % 9 else [])


@st.composite
def _decimal_bytes(draw: st.DrawFn, precision: int, scale: int) -> bytes:
    """A DECIMAL's bytes: digit groups in range (as a server writes them), groups past their
    digits (a value of more digits than its precision: read, but not landed), or anything."""
    size = sum(_DIG2BYTES[digits] for digits in _decimal_layout(precision, scale))
    groups = draw(st.sampled_from(["server", "wide", "any"]))
    if groups == "any":
        return draw(st.binary(min_size=size, max_size=size))
    out = bytearray()
    for digits in _decimal_layout(precision, scale):
        width = _DIG2BYTES[digits]
        top = 10 ** digits - 1 if groups == "server" else 2 ** (8 * width - 1) - 1
        out += draw(st.integers(0, top)).to_bytes(width, "big")
    if draw(st.booleans()):  # negative: every byte inverted
        out = bytearray(b ^ 0xFF for b in out)
    out[0] ^= 0x80
    return bytes(out)


@st.composite
def _date_bytes(draw: st.DrawFn) -> bytes:
    if draw(st.booleans()):
        return draw(st.binary(min_size=3, max_size=3))
    year, month, day = draw(st.integers(0, 9999)), draw(st.integers(0, 13)), draw(
        st.integers(0, 31))
    return ((year << 9) | (month << 5) | day).to_bytes(3, "little")


@st.composite
def _datetime2_bytes(draw: st.DrawFn, fsp: int) -> bytes:
    fraction = draw(st.binary(min_size=_FSP_BYTES[fsp], max_size=_FSP_BYTES[fsp]))
    if draw(st.booleans()):
        return draw(st.binary(min_size=5, max_size=5)) + fraction
    year_month = draw(st.integers(0, 9999)) * 13 + draw(st.integers(0, 12))
    packed = (1 << 39) | (year_month << 22) | (draw(st.integers(0, 31)) << 17) | (
        draw(st.integers(0, 24)) << 12) | (draw(st.integers(0, 60)) << 6) | draw(
        st.integers(0, 60))
    if draw(st.booleans()):
        fraction = (draw(st.integers(0, 10 ** fsp - 1)) * (10 if fsp % 2 else 1)
                    ).to_bytes(_FSP_BYTES[fsp], "big") if fsp else b""
    return packed.to_bytes(5, "big") + fraction


@st.composite
def _counted_bytes(draw: st.DrawFn, length_bytes: int, text: bool) -> bytes:
    """A length-prefixed string or blob: well-formed (UTF-8 text, for TEXT, now and then), or
    with any prefix."""
    if text and draw(st.booleans()):
        data = draw(st.text(max_size=6)).encode()
    else:
        data = draw(st.binary(max_size=10))
    length = len(data) if draw(st.integers(0, 4)) else draw(st.integers(0, 12))
    return length.to_bytes(8, "little")[:length_bytes] + data


@st.composite
def _case(draw: st.DrawFn) -> tuple[rowcodec.ColumnCodec, ColumnSpec, Any]:
    """A codec with a landing target, its landing spec, and a value strategy for its bytes."""
    name = draw(st.sampled_from([*_INT_WIDTHS, "UINT64", "YEAR", "FLOAT", "DOUBLE", "DECIMAL",
                                 "DATE", "DATETIME2", "TIMESTAMP2", "TEXT", "BYTES"]))
    kind = Kind[name]
    if name in _INT_WIDTHS or name in ("UINT64", "YEAR", "FLOAT", "DOUBLE"):
        width = {"UINT64": 8, "YEAR": 1, "FLOAT": 4, "DOUBLE": 8}.get(name) or _INT_WIDTHS[name]
        landing = {"UINT64": "uint64", "YEAR": "year", "FLOAT": "float",
                   "DOUBLE": "double"}.get(name, "int")
        return (rowcodec.ColumnCodec(kind), ColumnSpec("c", landing),
                st.binary(min_size=width, max_size=width))
    if name == "DECIMAL":
        precision = draw(st.integers(1, 38))
        scale = draw(st.integers(0, precision))
        return (rowcodec.ColumnCodec(kind, precision=precision, scale=scale),
                ColumnSpec("c", "decimal", precision, scale), _decimal_bytes(precision, scale))
    if name == "DATE":
        return rowcodec.ColumnCodec(kind), ColumnSpec("c", "date"), _date_bytes()
    if name in ("DATETIME2", "TIMESTAMP2"):
        fsp = draw(st.integers(0, 6))
        fraction = _FSP_BYTES[fsp]
        values = _datetime2_bytes(fsp) if name == "DATETIME2" else st.binary(
            min_size=4 + fraction, max_size=4 + fraction)
        return (rowcodec.ColumnCodec(kind, fsp=fsp),
                ColumnSpec("c", "datetime" if name == "DATETIME2" else "timestamp", None, fsp),
                values)
    length_bytes = draw(st.integers(1, 4))
    landing = ColumnSpec("c", "string") if name == "TEXT" else ColumnSpec(
        "c", "binary", draw(st.none() | st.integers(1, 12)))
    return (rowcodec.ColumnCodec(kind, length_bytes=length_bytes), landing,
            _counted_bytes(length_bytes, name == "TEXT"))


@st.composite
def _column_and_body(draw: st.DrawFn) -> tuple[rowcodec.ColumnCodec, ColumnSpec, bytes]:
    """A one-column table's codec and landing, and a body of row images for it: each a null
    bitmap (mostly "not NULL") and the value's bytes; sometimes cut short or followed by junk
    (the data ends inside a value, or a value reads past its own bytes)."""
    codec, landing, values = draw(_case())
    rows = draw(st.lists(st.tuples(st.sampled_from([0, 0, 0, 1]), values), min_size=1,
                         max_size=4))
    body = b"".join(bytes([null]) + (b"" if null else value) for null, value in rows)
    tail = draw(st.sampled_from(["whole", "whole", "cut", "junk"]))
    if tail == "cut":
        body = body[:draw(st.integers(0, len(body)))]
    elif tail == "junk":
        body += draw(st.binary(min_size=1, max_size=6))
    return codec, landing, body


def _verdict(decoder: Any, body: bytes) -> Any:
    try:
        return decoder.decode_columns(body, 1)
    except _codec.Unsupported:
        return None


def _lands(values: list[Any], landing: ColumnSpec) -> bool:
    """Whether the tuple path lands ``values`` (read_value's) at all."""
    convert = converter_for(landing, from_binlog=True)
    try:
        pa.array([v if convert is None else convert(v) for v in values], landing.arrow_type())
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ColumnValueError, ValueError):
        return False
    return True


@settings(max_examples=800, deadline=None)
@given(case=_column_and_body())
def test_read_value_and_put_value_refuse_the_same_bytes(case):
    """Refused by ``put_value`` (a target) exactly when refused by ``read_value`` (no target),
    or when read_value's values do not land (a DECIMAL past its decimal128: the tuple path
    refuses it too); otherwise both read as many rows."""
    codec, landing, body = case
    targeted = rowcodec.with_landing_target(codec, landing)
    assert targeted.target is not None, (codec, landing)
    read = _verdict(rowcodec.native_decoder([codec]), body)
    put = _verdict(rowcodec.native_decoder([targeted]), body)
    if read is None:
        event(f"{codec.kind.name}: both refuse" if put is None else "put_value reads more")
        assert put is None, f"put_value read bytes read_value refuses: {codec}, {body!r}"
        return
    count, ((values,),) = read
    if not _lands(values, landing):
        event(f"{codec.kind.name}: the value does not land")
        assert landing.kind == "decimal", (codec, values)
        assert put is None, f"put_value wrote values the tuple path refuses: {values}"
        return
    event(f"{codec.kind.name}: both read")
    assert put is not None, f"put_value refused bytes read_value reads: {codec}, {body!r}"
    assert put[0] == count


def test_codec_fields_reach_the_extension_by_name():
    """Each kind's named fields land in the extension's positions, and a field the kind does
    not read is refused instead of dropped."""
    codecs = {
        rowcodec.ColumnCodec(Kind.DECIMAL, precision=12, scale=3): (12, 3),
        rowcodec.ColumnCodec(Kind.TIME2, fsp=4): (4, 0),
        rowcodec.ColumnCodec(Kind.BYTES, length_bytes=2): (2, 0),
        rowcodec.ColumnCodec(Kind.SET, storage_bytes=8, members=("a",)): (8, 0),
        rowcodec.ColumnCodec(Kind.BIT, bits=9, storage_bytes=2): (9, 2),
        rowcodec.ColumnCodec(Kind.INT24): (0, 0),
    }
    for codec, (a, b) in codecs.items():
        kind, got_a, got_b, members, target, pad_to = codec.native()
        assert (kind, got_a, got_b, members, target, pad_to) == (
            codec.kind, a, b, codec.members, _codec.T_OBJECT, 0)
    rowcodec.native_decoder(list(codecs))  # (the extension accepts every one)
    with pytest.raises(ValueError, match="fsp not used"):
        rowcodec.ColumnCodec(Kind.TEXT, length_bytes=1, fsp=2).native()
    with pytest.raises(ValueError, match="members not used"):
        rowcodec.ColumnCodec(Kind.INT8, members=("a",)).native()


def test_kinds_and_targets_are_the_extensions_constants():
    assert {k.name: k.value for k in rowcodec.Kind} == _codec.KINDS
    assert {t.name: t.value for t in rowcodec.Target} == _codec.TARGETS
    assert all(getattr(_codec, f"K_{k.name}") == k for k in rowcodec.Kind)
    assert all(getattr(_codec, f"T_{t.name}") == t for t in rowcodec.Target)
