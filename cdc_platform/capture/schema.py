"""Table schemas as the capture engine sees them, and their landing-zone (Arrow) types.

A schema can be built from two places that must agree: the binlog's table-map metadata
(with ``binlog_row_metadata=FULL``) for streamed rows, and ``information_schema`` for rows read
with SELECTs (reconciliation, snapshot chunks). Both are reduced to the same ``ColumnSpec.kind``
vocabulary, so a value converted from either side lands with the same Arrow type and the same
canonical value (see ``capture.values``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

from cdc_platform.capture.charsets import landing_charset
from cdc_platform.capture.names import table_id

# The kinds a source column is reduced to. One landing type per kind.
KINDS = (
    "int", "uint64", "decimal", "float", "double", "date", "datetime", "timestamp", "time",
    "year", "string", "binary", "enum", "set", "json", "bit",
)

# information_schema.DATA_TYPE -> kind (for columns whose kind needs no further detail).
_INFORMATION_SCHEMA_KINDS = {
    "tinyint": "int", "smallint": "int", "mediumint": "int", "int": "int", "integer": "int",
    "year": "year", "float": "float", "double": "double", "real": "double",
    "decimal": "decimal", "numeric": "decimal", "date": "date", "datetime": "datetime",
    "timestamp": "timestamp", "time": "time", "char": "string", "varchar": "string",
    "tinytext": "string", "text": "string", "mediumtext": "string", "longtext": "string",
    "binary": "binary", "varbinary": "binary", "tinyblob": "binary", "blob": "binary",
    "mediumblob": "binary", "longblob": "binary", "enum": "enum", "set": "set", "json": "json",
    "bit": "bit", "geometry": "binary", "point": "binary", "linestring": "binary",
    "polygon": "binary", "multipoint": "binary", "multilinestring": "binary",
    "multipolygon": "binary", "geometrycollection": "binary",
    # MariaDB's INET4/INET6/UUID reach the binlog as BINARY(n) that no table map tells apart
    # from BINARY(n): they land as their n bytes (SELECTs read them with CAST ... AS BINARY(n)).
    "inet4": "binary", "inet6": "binary", "uuid": "binary",
    # MySQL 9's VECTOR: its float32 values as bytes, as the binlog carries it
    # (capture.binlog.columns.column_from_binlog), so chunks and the stream agree on its kind.
    "vector": "binary",
}
_FIXED_BINARY_LENGTHS = {"inet4": 4, "inet6": 16, "uuid": 16}


@dataclass(frozen=True)
class ColumnSpec:
    """One source column, reduced to what decides its landing type and value form."""

    name: str
    kind: str
    precision: int | None = None  # decimal precision, bit width, BINARY(n) length
    scale: int | None = None  # decimal scale, fractional-second digits of time kinds
    values: tuple[str, ...] = ()  # ENUM/SET members in definition order
    # Text charset when not UTF-8 (``charsets.landing_charset``): the binlog carries such text
    # as bytes, decoded the way the server converts it for SELECTs.
    charset: str | None = None
    # information_schema.DATA_TYPE where the spec was read from there. Not part of the column's
    # identity (the binlog does not carry it): chunks use it where the landing form sorts
    # differently from the source (MariaDB's UUID orders by swapped segments, not bytes).
    source_type: str | None = field(default=None, compare=False)

    def arrow_type(self) -> pa.DataType:
        """The Arrow type this column lands as (docs/landing-zone.md has the table). Built
        once per spec: the stream asks for it per table map, so per transaction."""
        cached = self.__dict__.get("_arrow_type")
        if cached is None:
            cached = self._build_arrow_type()
            object.__setattr__(self, "_arrow_type", cached)  # (frozen: not a field)
        return cached

    def _build_arrow_type(self) -> pa.DataType:
        kind = self.kind
        if kind in ("int", "year"):
            return pa.int64()
        if kind == "uint64":
            return pa.decimal128(20, 0)
        if kind == "bit":
            return pa.decimal128(20, 0) if (self.precision or 1) >= 64 else pa.int64()
        if kind == "decimal":
            precision = self.precision or 10
            if precision > 38:
                return pa.string()
            return pa.decimal128(precision, self.scale or 0)
        if kind == "float":
            return pa.float32()
        if kind == "double":
            return pa.float64()
        if kind == "date":
            return pa.date32()
        if kind == "datetime":
            return pa.timestamp("us")
        if kind == "timestamp":
            return pa.timestamp("us", tz="UTC")
        if kind == "binary":
            return pa.binary()
        return pa.string()  # string, enum, set, json, time

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["values"] = list(self.values)
        del data["source_type"]
        if self.charset is None:  # the form written before charsets were recorded
            del data["charset"]
        return data

    @staticmethod
    def from_dict(data: dict[str, Any]) -> ColumnSpec:
        return ColumnSpec(
            name=data["name"],
            kind=data["kind"],
            precision=data.get("precision"),
            scale=data.get("scale"),
            values=tuple(data.get("values") or ()),
            charset=data.get("charset"),
        )


@dataclass(frozen=True)
class TableSchema:
    """Columns (in source order) and primary key of one captured table."""

    database: str
    table: str
    columns: tuple[ColumnSpec, ...]
    primary_key: tuple[str, ...] = field(default=())

    @property
    def table_id(self) -> str:
        """``db.table``, quoted where a name holds a dot (``capture.names.table_id``)."""
        return table_id(self.database, self.table)

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> ColumnSpec:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(f"{self.table_id} has no column {name!r}")

    def without_columns(self, excluded: set[str]) -> TableSchema:
        """The schema with excluded columns removed (they never reach the landing zone).

        Key columns are never removed: without them no change could be applied to a target.
        """
        excluded = set(excluded) - set(self.primary_key)
        if not excluded:
            return self
        kept = tuple(c for c in self.columns if c.name not in excluded)
        return TableSchema(self.database, self.table, kept, self.primary_key)

    def arrow_schema(self) -> pa.Schema:
        """The user columns' Arrow schema, in source order (a segment's, with the change
        metadata before them, is ``landing.records.segment_schema``). Built once per schema
        (the stream asks for it per block of rows)."""
        schema = self.__dict__.get("_arrow_schema")
        if schema is None:
            schema = pa.schema([pa.field(c.name, c.arrow_type()) for c in self.columns])
            object.__setattr__(self, "_arrow_schema", schema)  # (frozen: not a field)
        return schema

    def to_dict(self) -> dict[str, Any]:
        return {
            "database": self.database,
            "table": self.table,
            "primary_key": list(self.primary_key),
            "columns": [c.to_dict() for c in self.columns],
        }

    @staticmethod
    def from_dict(data: dict[str, Any]) -> TableSchema:
        return TableSchema(
            database=data["database"],
            table=data["table"],
            columns=tuple(ColumnSpec.from_dict(c) for c in data["columns"]),
            primary_key=tuple(data.get("primary_key") or ()),
        )


class ColumnValueError(ValueError):
    """A value does not fit its column's landing type (``column``: the column concerned)."""

    def __init__(self, column: ColumnSpec, error: Exception, converting: bool = False) -> None:
        """``converting``: the value could not be turned into its landing form at all (an
        undecodable text, an unsupported JSON scalar); ``error`` says why and what to do."""
        what = f"{column.kind}, charset {column.charset}" if column.charset else column.kind
        if converting:
            super().__init__(f"column {column.name} ({what}): {error}")
        else:
            super().__init__(f"column {column.name} ({what}): a value does not fit the "
                             f"landing type {column.arrow_type()}: {error}")
        self.column = column


def landing_arrays(schema: TableSchema, rows: list[Any] | tuple[Any, ...],
                   columns: Sequence[Sequence[Any]] | None = None) -> list[pa.Array]:
    """The user columns of ``rows`` (tuples in schema column order; or ``columns``, the same
    values column-wise) as Arrow arrays of their landing types; ColumnValueError names the
    column a value does not fit."""
    if columns is None:
        columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema.columns]
    arrays = []
    for index, column in enumerate(schema.columns):
        try:
            arrays.append(pa.array(columns[index], column.arrow_type()))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as error:
            raise ColumnValueError(column, error) from error
    return arrays


def column_from_information_schema(row: dict[str, Any]) -> ColumnSpec:
    """Build a ColumnSpec from one ``information_schema.COLUMNS`` row (dict cursor)."""
    data_type = str(row["DATA_TYPE"]).lower()
    column_type = str(row["COLUMN_TYPE"]).lower()
    kind = _INFORMATION_SCHEMA_KINDS.get(data_type, "string")
    unsigned = "unsigned" in column_type
    precision = scale = None
    values: tuple[str, ...] = ()
    if data_type == "bigint":
        kind = "uint64" if unsigned else "int"
    elif kind == "decimal":
        precision, scale = int(row["NUMERIC_PRECISION"]), int(row["NUMERIC_SCALE"])
    elif kind == "bit":
        precision = int(row["NUMERIC_PRECISION"])
    elif kind in ("datetime", "timestamp", "time"):
        scale = int(row.get("DATETIME_PRECISION") or 0)
    elif kind in ("enum", "set"):
        values = _parse_enum_members(str(row["COLUMN_TYPE"]))
    elif kind == "string" and row.get("CHARACTER_SET_NAME") in (None, "binary") and data_type in (
        "char", "varchar"
    ):
        kind = "binary"
    if data_type == "binary" or (data_type == "char" and kind == "binary"):
        # Fixed-length binary: the server pads with 0x00, the binlog strips the padding.
        precision = int(row.get("CHARACTER_OCTET_LENGTH") or 0) or None
    precision = _FIXED_BINARY_LENGTHS.get(data_type, precision)
    charset = None
    if kind in ("string", "enum", "set"):
        charset = landing_charset(row.get("CHARACTER_SET_NAME"))
    return ColumnSpec(str(row["COLUMN_NAME"]), kind, precision, scale, values, charset,
                      source_type=data_type)


def _parse_enum_members(column_type: str) -> tuple[str, ...]:
    """``enum('a','b''c')`` -> ('a', "b'c"). Members are SQL string literals."""
    inner = column_type[column_type.index("(") + 1 : column_type.rindex(")")]
    members: list[str] = []
    current: list[str] = []
    i, in_quote = 0, False
    while i < len(inner):
        ch = inner[i]
        if in_quote:
            if ch == "'" and i + 1 < len(inner) and inner[i + 1] == "'":
                current.append("'")
                i += 1
            elif ch == "\\" and i + 1 < len(inner):
                current.append(inner[i + 1])
                i += 1
            elif ch == "'":
                in_quote = False
                members.append("".join(current))
                current = []
            else:
                current.append(ch)
        elif ch == "'":
            in_quote = True
        i += 1
    return tuple(members)
