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

Two kinds of rows event no one reads exactly are refused here (``UnsupportedEvent``), whatever
the caller checked before: MySQL's partial updates (PARTIAL_UPDATE_ROWS_EVENT, logged with
binlog_row_value_options=PARTIAL_JSON), whose after images are JSON diffs behind an options
field, which the extension would read as plain images (six rows as seven wrong ones); and a
table map of no columns, whose rows neither the extension nor the library can step through.

``RowsDecoders.columns`` reads the same row images column-wise (``RowColumns``): a column
whose landing type the extension writes (a *target*, chosen from the table map's column and
its ``ColumnSpec`` by ``column_spec``) arrives as a ``pa.Array`` already in landing form,
equal bit for bit to ``pa.array`` of the converted values (``capture.values``), without a
Python object per value; any other column as the list of values ``rows`` would give.
"""

from __future__ import annotations

import codecs
import logging
import sys
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pymysqlreplication.constants import BINLOG, FIELD_TYPE
from pymysqlreplication.row_event import PartialUpdateRowsEvent, UpdateRowsEvent

from cdc_platform.capture.events import UnsupportedEvent
from cdc_platform.capture.schema import ColumnSpec, TableSchema

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


def column_spec(column: Any, charset_to_encoding: Any,
                landing: ColumnSpec | None = None) -> tuple[Any, ...] | None:
    """The extension's (kind, a, b[, members]) for a library table-map column, or None when
    the column is not decoded natively. Mirrors RowsEvent.__read_values_name type by type.

    With ``landing`` (the column's ``ColumnSpec`` in the table map's schema) the spec is
    (kind, a, b, members, target, target_arg): where ``decode_columns`` puts the column's
    values (``landing_target``).
    """
    spec = _library_spec(column, charset_to_encoding)
    if spec is None or landing is None:
        return spec
    members = spec[3] if len(spec) > 3 else None
    return (*spec[:3], members, *landing_target(spec, landing))


def _library_spec(column: Any, charset_to_encoding: Any) -> tuple[Any, ...] | None:
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


# (extension kind, ColumnSpec kind) -> the target holding exactly the landing value
# (``values.converter_for(column, from_binlog=True)`` of the decoded value, in
# ``column.arrow_type()``). Any other pair, or a doubtful one, is T_OBJECT: exactness first.
_TARGETS = {
    **{(kind, "int"): "T_INT64" for kind in (
        "K_INT8", "K_UINT8", "K_INT16", "K_UINT16", "K_INT24", "K_UINT24", "K_INT32",
        "K_UINT32", "K_INT64")},
    ("K_UINT64", "uint64"): "T_DECIMAL128",
    ("K_YEAR", "year"): "T_INT64",
    ("K_FLOAT", "float"): "T_FLOAT32",
    ("K_DOUBLE", "double"): "T_FLOAT64",
    ("K_DECIMAL", "decimal"): "T_DECIMAL128",
    ("K_DATE", "date"): "T_DATE32",
    ("K_DATETIME2", "datetime"): "T_TIMESTAMP_US",
    ("K_TIMESTAMP2", "timestamp"): "T_TIMESTAMP_US",
    ("K_TEXT", "string"): "T_UTF8",
    ("K_BYTES", "binary"): "T_BINARY",
}


def _kind_name(kind: int) -> str:
    return next((name for name in dir(_rowcodec)
                 if name.startswith("K_") and getattr(_rowcodec, name) == kind), "")


def landing_target(spec: tuple[Any, ...], landing: ColumnSpec) -> tuple[int, int]:
    """(target, target_arg) of a column of extension spec ``spec`` landing as ``landing``.

    Arrow buffers are written in the host's byte order as Arrow's little-endian layout: on
    any other host every column is T_OBJECT.
    """
    object_ = (_rowcodec.T_OBJECT, 0)
    if sys.byteorder != "little":
        return object_
    kind, a, b = spec[:3]
    target = _TARGETS.get((_kind_name(kind), landing.kind))
    if target is None:
        return object_
    if target == "T_DECIMAL128" and kind == _rowcodec.K_DECIMAL and not (
            a <= 38 and landing.precision == a and (landing.scale or 0) == b):
        return object_  # (precision > 38 lands as text; a spec that disagrees: doubtful)
    if target == "T_UTF8" and landing.charset is not None:
        return object_  # (text of another charset is decoded by its converter)
    return getattr(_rowcodec, target), (landing.precision or 0) if target == "T_BINARY" else 0


def refuse_unreadable(event: Any) -> None:
    """Raise ``UnsupportedEvent`` for a rows event whose row images cannot be read exactly.

    Checked here, before any decoder, although ``capture/binlog.py`` stops on partial updates
    itself: the extension reads row images as plain ones, and turns a partial update's into
    plausible wrong rows, so it must not depend on every caller remembering. The type byte is
    checked as well as the class, for a library that would parse the event as another class.
    """
    where = f"table {getattr(event, 'schema', '?')}.{getattr(event, 'table', '?')}"
    if isinstance(event, PartialUpdateRowsEvent) or (
            getattr(event, "event_type", None) == BINLOG.PARTIAL_UPDATE_ROWS_EVENT):
        raise UnsupportedEvent(
            f"{where}: a partial update rows event (PARTIAL_UPDATE_ROWS_EVENT, logged with "
            "binlog_row_value_options=PARTIAL_JSON) holds JSON diffs, not row images, and "
            "cannot be captured exactly. Fix: SET PERSIST binlog_row_value_options='' (empty) "
            "on the source (and in sessions that set it), then re-snapshot the table and move "
            "the checkpoint past this event")
    columns = getattr(event, "columns", None)
    if columns is not None and len(columns) == 0:
        raise UnsupportedEvent(
            f"{where}: a rows event of a table map with no columns (a table has at least one: "
            "the binlog is damaged). Check it with mysqlbinlog; re-snapshot the table")


def decoder_for(event: Any, schema: TableSchema | None = None) -> Any:
    """The extension's decoder of the rows of ``event``'s table map, or None (library).

    With ``schema`` (the table map's, every column in table-map order) the decoder also has
    the columns' landing targets, for ``decode_columns``. ``UnsupportedEvent`` for an event no
    decoder reads exactly (``refuse_unreadable``).
    """
    refuse_unreadable(event)
    specs = _specs(event, schema)
    return None if specs is None else _rowcodec.Decoder(specs)


def _specs(event: Any, schema: TableSchema | None) -> list[tuple[Any, ...]] | None:
    if not available() or event._ignore_decode_errors:  # noqa: SLF001 - the library's flag
        return None
    if schema is not None and len(schema.columns) != len(event.columns):
        raise ValueError(f"table {schema.table_id}: the schema has {len(schema.columns)} "
                         f"columns, its table map {len(event.columns)}; columns() needs the "
                         "table map's own schema (binlog.schema_from_table_map), before any "
                         "column is excluded")
    specs = []
    for index, column in enumerate(event.columns):
        landing = schema.columns[index] if schema is not None else None
        spec = column_spec(column, event.charset_to_encoding, landing)
        if spec is None:
            return None
        specs.append(spec)
    return specs


def _full_bitmap(count: int) -> bytes:
    bits = bytearray((count + 7) // 8)
    for i in range(count):
        bits[i // 8] |= 1 << (i % 8)
    return bytes(bits)


@dataclass(frozen=True, slots=True)
class RowColumns:
    """A rows event's row images decoded column-wise.

    ``images``: one (insert, delete) or two (an update's before, after) lists with one entry
    per table-map column: a ``pa.Array`` of ``count`` values of the column's landing type
    (``ColumnSpec.arrow_type``, values converted) when the column has a native target, else
    the list of the ``count`` values ``RowsDecoders.rows`` gives for it (not converted).
    """

    count: int
    images: tuple[list[pa.Array | list[Any]], ...]


@dataclass(slots=True)
class _TableDecoder:
    """The decoder of one table map, and the schema its landing targets were chosen for."""

    table: Any  # the library's table map object it was built for
    decoder: Any  # None: the library decodes this table map's events
    full: bytes  # the columns-present bitmap of a full row image
    specs: tuple[Any, ...] | None = None  # the decoder's column specs (no targets)
    schema: TableSchema | None = None
    columnar: Any = None  # the decoder with the landing targets of ``schema``
    types: tuple[pa.DataType | None, ...] = ()  # per column: the type of a native target


class RowsDecoders:
    """One decoder per table map in use, looked up again when the library's table map
    changes. The server logs a table map before every transaction's rows: decoders are kept
    by what they decode (column specs, and the schema of the landing targets), so a stream of
    small transactions does not build them again each time."""

    def __init__(self) -> None:
        self._by_table_id: dict[int, _TableDecoder] = {}
        self._decoders: dict[tuple[Any, ...], Any] = {}
        self._columnar: dict[tuple[tuple[Any, ...], TableSchema], tuple[Any, tuple[Any, ...]]] = {}

    def rows(self, event: Any) -> list[tuple[Any, ...]] | None:
        """The event's rows as tuples in table-map column order (an update's as (before,
        after) pairs), or None: the library must decode this event (``event.rows``).

        The row images are read from the event's packet here; the library never parses them.
        ``UnsupportedEvent`` for an event neither may read (``refuse_unreadable``).
        """
        refuse_unreadable(event)
        entry = self._entry(event)
        body = self._body(event, entry)
        if body is None:
            return None
        data, images = body
        try:
            return entry.decoder.decode(data, images)
        except _rowcodec.Unsupported:
            event.packet.unread(data)  # the library decodes (and raises on) these bytes
            return None

    def columns(self, event: Any, schema: TableSchema) -> RowColumns | None:
        """The event's row images column-wise (``RowColumns``), or None: the library must
        decode this event (``event.rows``), as for ``rows``.

        ``schema`` is the table map's own (``binlog.schema_from_table_map``: every column,
        in table-map order): it decides which columns arrive as landing-form Arrow arrays.
        A value such an array cannot hold exactly (a DECIMAL past its precision) also sends
        the event to the library, whose values then fail the landing as loudly as ever.
        ``UnsupportedEvent`` for an event neither may read (``refuse_unreadable``).
        """
        refuse_unreadable(event)
        entry = self._entry(event)
        if entry.decoder is not None and entry.schema is not schema:
            key = (entry.specs, schema)
            found = self._columnar.get(key)
            if found is None:
                specs = _specs(event, schema)
                found = self._columnar[key] = (
                    None if specs is None else _rowcodec.Decoder(specs),
                    tuple(None if spec[4] == _rowcodec.T_OBJECT else landing.arrow_type()
                          for spec, landing in zip(specs or (), schema.columns, strict=False)))
            entry.schema = schema
            entry.columnar, entry.types = found
        body = self._body(event, entry)  # (a decoder: so is the columnar one, same specs)
        if body is None:
            return None
        data, images = body
        try:
            count, decoded = entry.columnar.decode_columns(data, images)
        except _rowcodec.Unsupported:
            event.packet.unread(data)  # the library decodes (and raises on) these bytes
            return None
        return RowColumns(count, tuple(
            [column if arrow_type is None else _array(arrow_type, count, column)
             for arrow_type, column in zip(entry.types, image, strict=True)]
            for image in decoded))

    def _entry(self, event: Any) -> _TableDecoder:
        table = event.table_map.get(event.table_id)
        entry = self._by_table_id.get(event.table_id)
        if entry is None or entry.table is not table:
            specs = _specs(event, None) if table is not None else None
            key = None if specs is None else tuple(specs)
            decoder = None if key is None else self._decoders.get(key)
            if key is not None and decoder is None:
                decoder = self._decoders[key] = _rowcodec.Decoder(specs)
            entry = _TableDecoder(table, decoder, _full_bitmap(len(event.columns)), key)
            self._by_table_id[event.table_id] = entry
        return entry

    def _body(self, event: Any, entry: _TableDecoder) -> tuple[bytes, int] | None:
        """(the event's row images, read from its packet; 1 or 2 images a row), or None when
        the extension does not decode this event."""
        if entry.decoder is None or not event.complete or (
                event.number_of_columns != len(event.columns)):
            return None
        update = isinstance(event, UpdateRowsEvent)
        if event.columns_present_bitmap != entry.full or (
                update and event.columns_present_bitmap2 != entry.full):
            return None  # a partial row image: the library's columns-present handling
        packet = event.packet
        return packet.read(event.event_size - packet.read_bytes), 2 if update else 1

    def clear(self) -> None:
        self._by_table_id.clear()
        self._decoders.clear()
        self._columnar.clear()


def _array(arrow_type: pa.DataType, count: int, buffers: tuple[Any, ...]) -> pa.Array:
    """A native column's (validity, data, offsets) bytes as an Arrow array, without a copy."""
    validity, data, offsets = buffers
    wrapped = [None if validity is None else pa.py_buffer(validity)]
    if offsets is not None:
        wrapped.append(pa.py_buffer(offsets))
    wrapped.append(pa.py_buffer(data))
    return pa.Array.from_buffers(arrow_type, count, wrapped,
                                 null_count=0 if validity is None else -1)
