"""Rows events decoded natively (``_rowcodec.c``), with mysql-replication as the fallback.

mysql-replication decodes every value of every row in Python and builds a dict per row image:
most of the engine's time. mysql-replication still reads the protocol (packets, table maps,
the rows event's header and columns-present bitmaps); for a table map whose every column is
of a kind the extension decodes, the rest of the event (the row images) is read here and
decoded by the extension into tuples in table-map column order, equal in type and value to
what the library returns for the column as ``capture/binlog.py`` patches it.

Anything else is left to the library, event by event: a column kind not decoded natively
(JSON, GEOMETRY, the old DATETIME/TIMESTAMP/TIME formats, an unknown type), a text column
whose charset the library would decode with another codec, a partial row image
(binlog_row_image != FULL), a library told to ignore decode errors, and any bytes the library
would raise on (the extension then raises ``Unsupported`` and the library decodes the event,
raising its own error). If the extension is not built, every event takes the library's path
(logged once): slower, never different.
"""

from __future__ import annotations

import codecs
import logging
from typing import Any

from pymysqlreplication.constants import FIELD_TYPE
from pymysqlreplication.row_event import UpdateRowsEvent

log = logging.getLogger(__name__)

try:
    from cdc_platform.capture import _rowcodec
except ImportError as error:  # not built: the library decodes every rows event
    _rowcodec = None
    _IMPORT_ERROR: ImportError | None = error
else:
    _IMPORT_ERROR = None

_warned = False


def available() -> bool:
    """True when the native decoder is built and importable (says why once, when not)."""
    global _warned
    if _rowcodec is None and not _warned:
        _warned = True
        log.warning(f"native rows decoder off ({_IMPORT_ERROR}): rows are decoded by "
                    "mysql-replication alone, several times slower. Build it with "
                    "scripts/bootstrap.sh (or `python setup.py build_ext --inplace`)")
    return _rowcodec is not None


_FIXED = {
    FIELD_TYPE.FLOAT: "K_FLOAT", FIELD_TYPE.DOUBLE: "K_DOUBLE", FIELD_TYPE.DATE: "K_DATE",
    FIELD_TYPE.YEAR: "K_YEAR",
}
_INTS = {  # type -> (signed kind, unsigned kind)
    FIELD_TYPE.TINY: ("K_INT8", "K_UINT8"), FIELD_TYPE.SHORT: ("K_INT16", "K_UINT16"),
    FIELD_TYPE.INT24: ("K_INT24", "K_UINT24"), FIELD_TYPE.LONG: ("K_INT32", "K_UINT32"),
    FIELD_TYPE.LONGLONG: ("K_INT64", "K_UINT64"),
}
_FRACTIONAL = {FIELD_TYPE.DATETIME2: "K_DATETIME2", FIELD_TYPE.TIMESTAMP2: "K_TIMESTAMP2",
               FIELD_TYPE.TIME2: "K_TIME2"}


def _text_kind(column: Any, charset_to_encoding: Any) -> str | None:
    """K_TEXT when the library decodes the column's bytes as strict UTF-8, K_BYTES when it
    keeps them (its LookupError path), None for any other codec."""
    name = column.character_set_name
    if name is None:
        return "K_TEXT"  # the library's default: UTF-8
    encoding = charset_to_encoding(name)
    try:
        codec = codecs.lookup(encoding)
    except LookupError:
        return "K_BYTES"
    return "K_TEXT" if codec.name == "utf-8" else None


def column_spec(column: Any, charset_to_encoding: Any) -> tuple[Any, ...] | None:
    """The extension's (kind, a, b[, members]) for a library table-map column, or None when
    the column is not decoded natively. Mirrors RowsEvent.__read_values_name type by type."""
    ftype = column.type
    if ftype in _INTS:
        kind = _INTS[ftype][1 if column.unsigned else 0]
        return (getattr(_rowcodec, kind), 0, 0)
    if ftype in _FIXED:
        return (getattr(_rowcodec, _FIXED[ftype]), 0, 0)
    if ftype in _FRACTIONAL:
        fsp = getattr(column, "fsp", None)
        if not isinstance(fsp, int) or not 0 <= fsp <= 6:
            return None
        return (getattr(_rowcodec, _FRACTIONAL[ftype]), fsp, 0)
    if ftype == FIELD_TYPE.NEWDECIMAL:
        precision, scale = column.precision, column.decimals
        if not 1 <= precision <= 65 or not 0 <= scale <= precision:
            return None
        return (_rowcodec.K_DECIMAL, precision, scale)
    if ftype in (FIELD_TYPE.VARCHAR, FIELD_TYPE.STRING, FIELD_TYPE.BLOB):
        kind = _text_kind(column, charset_to_encoding)
        if kind is None:
            return None
        if ftype == FIELD_TYPE.BLOB:
            length_bytes = column.length_size
            if not 1 <= length_bytes <= 4:
                return None
        else:
            length_bytes = 2 if column.max_length > 255 else 1
        return (getattr(_rowcodec, kind), length_bytes, 0)
    if ftype in (FIELD_TYPE.ENUM, FIELD_TYPE.SET):
        if column.size not in (1, 2, 3, 4, 8):
            return None
        members = column.enum_values if ftype == FIELD_TYPE.ENUM else column.set_values
        kind = _rowcodec.K_ENUM if ftype == FIELD_TYPE.ENUM else _rowcodec.K_SET
        return (kind, column.size, 0, tuple(members) if members else None)
    if ftype == FIELD_TYPE.BIT:
        if not 1 <= column.bits <= 64 or column.bytes != (column.bits + 7) // 8:
            return None
        return (_rowcodec.K_BIT, column.bits, column.bytes)
    return None


def decoder_for(event: Any) -> Any:
    """The extension's decoder of the rows of ``event``'s table map, or None (library)."""
    if not available() or event._ignore_decode_errors:  # noqa: SLF001 - the library's flag
        return None
    specs = []
    for column in event.columns:
        spec = column_spec(column, event.charset_to_encoding)
        if spec is None:
            return None
        specs.append(spec)
    return _rowcodec.Decoder(specs)


def _full_bitmap(count: int) -> bytes:
    bits = bytearray((count + 7) // 8)
    for i in range(count):
        bits[i // 8] |= 1 << (i % 8)
    return bytes(bits)


class RowsDecoders:
    """One decoder per table map in use, rebuilt when the library's table map changes."""

    def __init__(self) -> None:
        self._by_table_id: dict[int, tuple[Any, Any, bytes]] = {}

    def rows(self, event: Any) -> list[tuple[Any, ...]] | None:
        """The event's rows as tuples in table-map column order (an update's as (before,
        after) pairs), or None: the library must decode this event (``event.rows``).

        The row images are read from the event's packet here; the library never parses them.
        """
        table = event.table_map.get(event.table_id)
        entry = self._by_table_id.get(event.table_id)
        if entry is None or entry[0] is not table:
            decoder = decoder_for(event) if table is not None else None
            entry = (table, decoder, _full_bitmap(len(event.columns)))
            self._by_table_id[event.table_id] = entry
        _, decoder, full = entry
        if decoder is None or not event.complete or event.number_of_columns != len(event.columns):
            return None
        update = isinstance(event, UpdateRowsEvent)
        if event.columns_present_bitmap != full or (
                update and event.columns_present_bitmap2 != full):
            return None  # a partial row image: the library's columns-present handling
        packet = event.packet
        data = packet.read(event.event_size - packet.read_bytes)
        try:
            return decoder.decode(data, 2 if update else 1)
        except _rowcodec.Unsupported:
            packet.unread(data)  # the library decodes (and raises on) these bytes
            return None

    def clear(self) -> None:
        self._by_table_id.clear()
