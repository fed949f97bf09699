"""Rows events decoded natively (``_rowcodec.c``), with mysql-replication as the fallback.

mysql-replication decodes every value of every row in Python and builds a dict per row image:
most of the engine's time. mysql-replication still reads the protocol (packets, table maps,
the rows event's header and columns-present bitmaps); for a table map whose every column is
of a kind the extension decodes, the rest of the event (the row images) is read here and
decoded by the extension into tuples in table-map column order, equal in type and value to
what the library returns for the column as ``capture/binlog/patches.py`` patches it.

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
its ``ColumnSpec`` by ``column_codec``) arrives as a ``pa.Array`` already in landing form,
equal bit for bit to ``pa.array`` of the converted values (``capture.values``), without a
Python object per value; any other column as the list of values ``rows`` would give.

Each column is described to the extension by a ``ColumnCodec``: its ``Kind``, the sizes that
kind reads under their own names, its ENUM/SET members, its ``Target``. The extension takes
positional tuples; ``ColumnCodec.native`` makes them, and nothing else does.
"""

from __future__ import annotations

import codecs
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import IntEnum
from typing import Any

import pyarrow as pa
from pymysqlreplication.constants import BINLOG, FIELD_TYPE
from pymysqlreplication.row_event import PartialUpdateRowsEvent, UpdateRowsEvent

from cdc_platform.capture.events import UnsupportedEvent
from cdc_platform.capture.schema import ColumnSpec, TableSchema

log = logging.getLogger(__name__)

try:
    from cdc_platform.capture.binlog import _rowcodec
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


def _constants(name: str, table: str, doc: str) -> type[IntEnum]:
    """An IntEnum of the extension's constants (``KINDS``/``TARGETS``: name -> value, the C
    file's own enums), so no value is written twice. Empty when the extension is not built:
    no codec is made then (``available()`` is False)."""
    values = getattr(_rowcodec, table) if _rowcodec is not None else {}
    enum = IntEnum(name, values, module=__name__)  # type: ignore[misc]
    enum.__doc__ = doc
    return enum


Kind = _constants("Kind", "KINDS", "How the extension reads a column's bytes (_rowcodec.c K_*).")
Target = _constants("Target", "TARGETS", "Where decode_columns puts a column's values: an Arrow "
                    "layout of its landing type, or OBJECT, the values decode gives (T_*).")

# Per kind, the ColumnCodec fields the extension reads, in the order of its (a, b) arguments;
# a kind not listed reads none. This and ColumnCodec.native are the whole positional boundary.
_NATIVE_ARGS: dict[str, tuple[str, ...]] = {
    "DATETIME2": ("fsp",), "TIMESTAMP2": ("fsp",), "TIME2": ("fsp",),
    "DECIMAL": ("precision", "scale"),
    "TEXT": ("length_bytes",), "BYTES": ("length_bytes",),
    "ENUM": ("storage_bytes",), "SET": ("storage_bytes",),
    "BIT": ("bits", "storage_bytes"),
}
_SIZES = ("length_bytes", "fsp", "precision", "scale", "storage_bytes", "bits")


@dataclass(frozen=True, slots=True)
class ColumnCodec:
    """How the extension reads one table-map column, and where ``decode_columns`` puts it.

    Each kind uses only the fields named for it (the others stay 0 / None):

    * integers, FLOAT, DOUBLE, DATE, YEAR: none (the width follows from the kind);
    * DATETIME2, TIMESTAMP2, TIME2: ``fsp``, the fraction digits (0..6);
    * DECIMAL: ``precision`` (1..65) and ``scale`` (0..precision);
    * TEXT, BYTES: ``length_bytes``, the little-endian length before each value (1..4);
    * ENUM, SET: ``storage_bytes`` (1, 2, 3, 4, 8) and ``members`` (None: the library has
      none, and reads the value as None);
    * BIT: ``bits`` (1..64) in ``storage_bytes`` ((bits + 7) // 8).

    ``target``: the landing layout ``decode_columns`` writes (``with_landing_target``), None
    for the list of the values ``decode`` gives; ``pad_to``: for Target.BINARY, the length
    BINARY(n) values are padded back to with 0x00.
    """

    kind: Kind
    length_bytes: int = 0
    fsp: int = 0
    precision: int = 0
    scale: int = 0
    storage_bytes: int = 0
    bits: int = 0
    members: tuple[str, ...] | None = None
    target: Target | None = None
    pad_to: int = 0

    def native(self) -> tuple[Any, ...]:
        """The extension's (kind, a, b, members, target, target_arg) for this column: the one
        place the named fields become positions. ValueError for a field the kind does not
        use (it would be dropped silently)."""
        used = _NATIVE_ARGS.get(self.kind.name, ())
        unused = [name for name in _SIZES if name not in used and getattr(self, name)]
        if self.members is not None and self.kind.name not in ("ENUM", "SET"):
            unused.append("members")
        if self.pad_to and self.target != Target["BINARY"]:
            unused.append("pad_to")
        if unused:
            raise ValueError(f"{self.kind.name} column codec: {', '.join(unused)} not used by "
                             "the kind")
        a, b = (*(getattr(self, name) for name in used), 0, 0)[:2]
        target = Target["OBJECT"] if self.target is None else self.target
        return (int(self.kind), a, b, self.members, int(target), self.pad_to)


def native_decoder(codecs: Sequence[ColumnCodec]) -> Any:
    """The extension's Decoder of columns ``codecs`` (table-map order)."""
    return _rowcodec.Decoder([codec.native() for codec in codecs])


_FIXED = {FIELD_TYPE.FLOAT: "FLOAT", FIELD_TYPE.DOUBLE: "DOUBLE", FIELD_TYPE.DATE: "DATE",
          FIELD_TYPE.YEAR: "YEAR"}
_INTS = {  # type -> (signed kind, unsigned kind)
    FIELD_TYPE.TINY: ("INT8", "UINT8"), FIELD_TYPE.SHORT: ("INT16", "UINT16"),
    FIELD_TYPE.INT24: ("INT24", "UINT24"), FIELD_TYPE.LONG: ("INT32", "UINT32"),
    FIELD_TYPE.LONGLONG: ("INT64", "UINT64"),
}
_FRACTIONAL = {FIELD_TYPE.DATETIME2: "DATETIME2", FIELD_TYPE.TIMESTAMP2: "TIMESTAMP2",
               FIELD_TYPE.TIME2: "TIME2"}


def _text_kind(column: Any, charset_to_encoding: Any) -> str | None:
    """TEXT when the library decodes the column's bytes as strict UTF-8, BYTES when it
    keeps them (its LookupError path), None for any other codec."""
    name = column.character_set_name
    if name is None:
        return "TEXT"  # the library's default: UTF-8
    encoding = charset_to_encoding(name)
    try:
        codec = codecs.lookup(encoding)
    except LookupError:
        return "BYTES"
    return "TEXT" if codec.name == "utf-8" else None


def column_codec(column: Any, charset_to_encoding: Any,
                 landing: ColumnSpec | None = None) -> ColumnCodec | None:
    """The extension's codec of a library table-map column, or None when the column is not
    decoded natively. Mirrors RowsEvent.__read_values_name type by type.

    With ``landing`` (the column's ``ColumnSpec`` in the table map's schema) the codec has a
    target: where ``decode_columns`` puts the column's values (``with_landing_target``).
    """
    codec = _library_codec(column, charset_to_encoding)
    if codec is None or landing is None:
        return codec
    return with_landing_target(codec, landing)


def column_spec(column: Any, charset_to_encoding: Any,
                landing: ColumnSpec | None = None) -> tuple[Any, ...] | None:
    """``column_codec`` as the extension's positional tuple (``ColumnCodec.native``), for
    callers that build a ``_rowcodec.Decoder`` themselves."""
    codec = column_codec(column, charset_to_encoding, landing)
    return None if codec is None else codec.native()


def _library_codec(column: Any, charset_to_encoding: Any) -> ColumnCodec | None:
    ftype = column.type
    if ftype in _INTS:
        return ColumnCodec(Kind[_INTS[ftype][1 if column.unsigned else 0]])
    if ftype in _FIXED:
        return ColumnCodec(Kind[_FIXED[ftype]])
    if ftype in _FRACTIONAL:
        fsp = getattr(column, "fsp", None)
        if not isinstance(fsp, int) or not 0 <= fsp <= 6:
            return None
        return ColumnCodec(Kind[_FRACTIONAL[ftype]], fsp=fsp)
    if ftype == FIELD_TYPE.NEWDECIMAL:
        precision, scale = column.precision, column.decimals
        if not 1 <= precision <= 65 or not 0 <= scale <= precision:
            return None
        return ColumnCodec(Kind["DECIMAL"], precision=precision, scale=scale)
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
        return ColumnCodec(Kind[kind], length_bytes=length_bytes)
    if ftype in (FIELD_TYPE.ENUM, FIELD_TYPE.SET):
        if column.size not in (1, 2, 3, 4, 8):
            return None
        members = column.enum_values if ftype == FIELD_TYPE.ENUM else column.set_values
        return ColumnCodec(Kind["ENUM" if ftype == FIELD_TYPE.ENUM else "SET"],
                           storage_bytes=column.size,
                           members=tuple(members) if members else None)
    if ftype == FIELD_TYPE.BIT:
        if not 1 <= column.bits <= 64 or column.bytes != (column.bits + 7) // 8:
            return None
        return ColumnCodec(Kind["BIT"], bits=column.bits, storage_bytes=column.bytes)
    return None


# (Kind, ColumnSpec kind) -> the target holding exactly the landing value
# (``values.converter_for(column, from_binlog=True)`` of the decoded value, in
# ``column.arrow_type()``). Any other pair, or a doubtful one, has none: exactness first.
_TARGETS = {
    **{(kind, "int"): "INT64" for kind in (
        "INT8", "UINT8", "INT16", "UINT16", "INT24", "UINT24", "INT32", "UINT32", "INT64")},
    ("UINT64", "uint64"): "DECIMAL128",
    ("YEAR", "year"): "INT64",
    ("FLOAT", "float"): "FLOAT32",
    ("DOUBLE", "double"): "FLOAT64",
    ("DECIMAL", "decimal"): "DECIMAL128",
    ("DATE", "date"): "DATE32",
    ("DATETIME2", "datetime"): "TIMESTAMP_US",
    ("TIMESTAMP2", "timestamp"): "TIMESTAMP_US",
    ("TEXT", "string"): "UTF8",
    ("BYTES", "binary"): "BINARY",
}


def with_landing_target(codec: ColumnCodec, landing: ColumnSpec) -> ColumnCodec:
    """``codec`` with the target of a column landing as ``landing`` (target None: none).

    Arrow buffers are written in the host's byte order as Arrow's little-endian layout: on
    any other host no column has a target.
    """
    none = replace(codec, target=None, pad_to=0)
    if sys.byteorder != "little":
        return none
    target = _TARGETS.get((codec.kind.name, landing.kind))
    if target is None:
        return none
    if target == "DECIMAL128" and codec.kind.name == "DECIMAL" and not (
            codec.precision <= 38 and landing.precision == codec.precision
            and (landing.scale or 0) == codec.scale):
        return none  # (precision > 38 lands as text; a codec that disagrees: doubtful)
    if target == "UTF8" and landing.charset is not None:
        return none  # (text of another charset is decoded by its converter)
    return replace(codec, target=Target[target],
                   pad_to=(landing.precision or 0) if target == "BINARY" else 0)


def refuse_unreadable(event: Any) -> None:
    """Raise ``UnsupportedEvent`` for a rows event whose row images cannot be read exactly.

    Checked here, before any decoder, although ``capture/binlog/stream.py`` stops on partial updates
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
    codecs_ = _codecs(event, schema)
    return None if codecs_ is None else native_decoder(codecs_)


def _codecs(event: Any, schema: TableSchema | None) -> tuple[ColumnCodec, ...] | None:
    if event._ignore_decode_errors:  # noqa: SLF001 - the library's flag
        return None
    return _table_codecs(event.columns, event.charset_to_encoding, schema)


def _table_codecs(columns: Sequence[Any], charset_to_encoding: Any,
                  schema: TableSchema | None) -> tuple[ColumnCodec, ...] | None:
    """The codecs of a table map's ``columns`` (None: not every column decodes natively)."""
    if not available():
        return None
    if schema is not None and len(schema.columns) != len(columns):
        raise ValueError(f"table {schema.table_id}: the schema has {len(schema.columns)} "
                         f"columns, its table map {len(columns)}; columns() needs the "
                         "table map's own schema (binlog.schema_from_table_map), before any "
                         "column is excluded")
    found = []
    for index, column in enumerate(columns):
        landing = schema.columns[index] if schema is not None else None
        codec = column_codec(column, charset_to_encoding, landing)
        if codec is None:
            return None
        found.append(codec)
    return tuple(found)


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
    codecs: tuple[ColumnCodec, ...] | None = None  # the decoder's columns (no targets)
    schema: TableSchema | None = None
    columnar: Any = None  # the decoder with the landing targets of ``schema``
    types: tuple[pa.DataType | None, ...] = ()  # per column: the type of a native target


class RowsDecoders:
    """One decoder per table map in use, looked up again when the library's table map
    changes. The server logs a table map before every transaction's rows: decoders are kept
    by what they decode (column codecs, and the schema of the landing targets), so a stream of
    small transactions does not build them again each time."""

    def __init__(self) -> None:
        self._by_table_id: dict[int, _TableDecoder] = {}
        self._decoders: dict[tuple[ColumnCodec, ...], Any] = {}
        self._columnar: dict[tuple[tuple[ColumnCodec, ...], TableSchema],
                             tuple[Any, tuple[Any, ...]]] = {}

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
            key = (entry.codecs, schema)
            found = self._columnar.get(key)
            if found is None:
                targeted = _codecs(event, schema)
                found = self._columnar[key] = (
                    None if targeted is None else native_decoder(targeted),
                    tuple(None if codec.target is None else landing.arrow_type()
                          for codec, landing in zip(targeted or (), schema.columns,
                                                    strict=False)))
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

    def rows_of(self, table_id: int, table: Any, present: tuple[bytes, ...], data: bytes,
                charset_to_encoding: Any) -> list[tuple[Any, ...]] | None:
        """``rows`` for a rows event read without the library (``binlog/lean.py``): its
        table map's ``table`` (the library's, as ``rows`` finds it), its columns-present
        bitmaps (two for an update), and its row images ``data``. None: not decoded here
        (the caller hands the event to the library). The caller has refused what
        ``refuse_unreadable`` refuses (it reads only plain rows events of columns)."""
        entry = self._by_table_id.get(table_id)
        if entry is None or entry.table is not table:
            entry = self._new_entry(table_id, table, _table_codecs(
                table.columns, charset_to_encoding, None), len(table.columns))
        if entry.decoder is None or any(bitmap != entry.full for bitmap in present):
            return None
        try:
            return entry.decoder.decode(data, len(present))
        except _rowcodec.Unsupported:
            return None

    def _entry(self, event: Any) -> _TableDecoder:
        table = event.table_map.get(event.table_id)
        entry = self._by_table_id.get(event.table_id)
        if entry is None or entry.table is not table:
            entry = self._new_entry(event.table_id, table,
                                    _codecs(event, None) if table is not None else None,
                                    len(event.columns))
        return entry

    def _new_entry(self, table_id: int, table: Any, key: tuple[ColumnCodec, ...] | None,
                   column_count: int) -> _TableDecoder:
        decoder = None if key is None else self._decoders.get(key)
        if key is not None and decoder is None:
            decoder = self._decoders[key] = native_decoder(key)
        entry = _TableDecoder(table, decoder, _full_bitmap(column_count), key)
        self._by_table_id[table_id] = entry
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
