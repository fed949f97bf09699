"""What each binlog column lands as: a table map's columns -> the project's ``ColumnSpec`` and
``TableSchema`` (``schema_from_table_map``), with the collations the server knows
(``learn_server_collations``).

Separate from the decoding of table maps (``table_maps.py``): this is the type mapping the
snapshot side must agree with (``capture/schema.py``), read on its own without the bytes.
"""

from __future__ import annotations

from typing import Any

import pymysql
from pymysqlreplication.constants import CHARSET, FIELD_TYPE
from pymysqlreplication.row_event import TableMapEvent

from cdc_platform.capture.binlog.table_maps import MYSQL_TYPE_VECTOR
from cdc_platform.capture.charsets import (
    as_information_schema_shows,
    landing_charset,
    text_decoder,
)
from cdc_platform.capture.schema import ColumnSpec, TableSchema

_INT_TYPES = {FIELD_TYPE.TINY, FIELD_TYPE.SHORT, FIELD_TYPE.INT24, FIELD_TYPE.LONG}
_STRING_TYPES = {FIELD_TYPE.VARCHAR, FIELD_TYPE.VAR_STRING, FIELD_TYPE.STRING,
                 FIELD_TYPE.BLOB, FIELD_TYPE.TINY_BLOB, FIELD_TYPE.MEDIUM_BLOB,
                 FIELD_TYPE.LONG_BLOB}
_FIXED_KINDS = {
    FIELD_TYPE.FLOAT: "float", FIELD_TYPE.DOUBLE: "double", FIELD_TYPE.DATE: "date",
    FIELD_TYPE.NEWDATE: "date", FIELD_TYPE.DATETIME: "datetime", FIELD_TYPE.DATETIME2: "datetime",
    FIELD_TYPE.TIMESTAMP: "timestamp", FIELD_TYPE.TIMESTAMP2: "timestamp",
    FIELD_TYPE.TIME: "time", FIELD_TYPE.TIME2: "time", FIELD_TYPE.JSON: "json",
    FIELD_TYPE.GEOMETRY: "binary", FIELD_TYPE.YEAR: "year",
}
# MySQL charset of each collation mysql-replication knows (table maps carry collation ids).
_COLLATION_CHARSETS = {
    charset.collation: charset.name
    for by_id in CHARSET.charsets._by_id.values()  # noqa: SLF001 - the library's only table
    for charset in by_id.values()
}


def learn_server_collations(conn: pymysql.Connection, dbms: str) -> list[str]:
    """Teach mysql-replication the collation ids of this server that its table lacks.

    Table maps carry collation ids; for an id mysql-replication does not list it would decode
    the column as UTF-8, and :func:`_charset_of` refuses such a column. The server knows its
    own ids (MariaDB 10.10+ adds uca1400 collations, MySQL adds ids between releases), so they
    are read from it at start: every collation the server has is decodable. Returns the names
    of the collations learnt. ``dbms`` is mysql-replication's flavour name (mysql/mariadb).
    """
    queries = (
        # MariaDB 10.10+: a collation applicable to several charsets has an id per charset.
        "SELECT ID, FULL_COLLATION_NAME, CHARACTER_SET_NAME FROM "
        "information_schema.COLLATION_CHARACTER_SET_APPLICABILITY WHERE ID IS NOT NULL",
        "SELECT ID, COLLATION_NAME, CHARACTER_SET_NAME FROM information_schema.COLLATIONS "
        "WHERE ID IS NOT NULL",
    )
    rows: list[Any] = []
    with conn.cursor() as cur:
        for query in queries:
            try:
                cur.execute(query)
            except pymysql.MySQLError as error:
                if error.args and error.args[0] in (1054, 1109):  # (an older server)
                    continue
                raise
            rows = list(cur.fetchall())
            break
    learnt = []
    for collation_id, collation, charset in rows:
        if CHARSET.charset_by_id(int(collation_id), dbms) is not None:
            continue
        CHARSET.charsets.add(CHARSET.Charset(int(collation_id), str(charset), str(collation),
                                             False, dbms))
        _COLLATION_CHARSETS[str(collation)] = str(charset)
        learnt.append(str(collation))
    return learnt


def column_from_binlog(column: Any) -> ColumnSpec:
    """ColumnSpec from a mysql-replication table-map column (needs binlog_row_metadata=FULL).

    Text columns record their charset when it is not UTF-8: their values arrive as bytes
    (``patches._keep_text_bytes``) for ``capture.values`` to decode as the server converts them.
    """
    ftype = column.type
    name = column.name
    if getattr(column, "vector_dimensions", None) is not None or ftype == MYSQL_TYPE_VECTOR:
        # MySQL 9 VECTOR: its value is the vector's float32 values, little-endian, as bytes;
        # it lands as those bytes (what SELECT returns for it without VECTOR_TO_STRING).
        return ColumnSpec(name, "binary")
    if ftype in _INT_TYPES:
        return ColumnSpec(name, "int")
    if ftype == FIELD_TYPE.LONGLONG:
        return ColumnSpec(name, "uint64" if column.unsigned else "int")
    if ftype == FIELD_TYPE.NEWDECIMAL:
        return ColumnSpec(name, "decimal", column.precision, column.decimals)
    if ftype == FIELD_TYPE.BIT:
        return ColumnSpec(name, "bit", column.bits)
    if ftype in (FIELD_TYPE.ENUM, FIELD_TYPE.SET):
        charset = _charset_of(column)
        decode = text_decoder(charset or "utf8mb4")
        raw = column.enum_values[1:] if ftype == FIELD_TYPE.ENUM else column.set_values
        try:
            members = tuple(as_information_schema_shows(decode(m)) for m in raw or ())
        except ValueError as error:
            raise ValueError(f"column {name!r}: a member name is not valid {charset} text: "
                             f"{error}") from error
        kind = "enum" if ftype == FIELD_TYPE.ENUM else "set"
        return ColumnSpec(name, kind, values=members, charset=charset)
    if ftype in _FIXED_KINDS:
        kind = _FIXED_KINDS[ftype]
        scale = getattr(column, "fsp", None) if kind in ("datetime", "timestamp", "time") else None
        return ColumnSpec(name, kind, scale=scale or 0 if scale is not None else None)
    if ftype in _STRING_TYPES:
        if column.character_set_name not in (None, "binary"):
            return ColumnSpec(name, "string", charset=_charset_of(column))
        # BINARY(n) arrives as STRING with its 0x00 padding stripped: remember n to restore it.
        fixed = ftype == FIELD_TYPE.STRING
        return ColumnSpec(name, "binary", column.max_length if fixed else None)
    raise NotImplementedError(f"column {name!r}: binlog column type {ftype} is not supported")


def _charset_of(column: Any) -> str | None:
    """The column's MySQL charset as ColumnSpec records it (None: UTF-8 or binary)."""
    collation = getattr(column, "collation_name", None)
    charset = _COLLATION_CHARSETS.get(collation) if collation else None
    if charset is None:
        # mysql-replication falls back to decoding as UTF-8 for a collation id it does not
        # know: that would land wrong text silently.
        raise ValueError(f"column {column.name!r}: its collation id is not known to "
                         "mysql-replication, so its charset (and text) cannot be decoded "
                         "exactly; give the column a collation listed by mysql-replication's "
                         "CHARSET table, or exclude it (capture.excluded_columns)")
    return landing_charset(charset)


def schema_from_table_map(event: TableMapEvent) -> TableSchema:
    """The table's schema as the binlog describes it at this event (key in index order)."""
    try:
        columns = tuple(column_from_binlog(c) for c in event.columns)
    except ValueError as error:
        raise ValueError(f"table {event.schema}.{event.table}: {error}") from error
    key_indexes = list(getattr(event.optional_metadata, "simple_primary_key_list", None) or [])
    if not key_indexes:
        key_indexes = [i for i, c in enumerate(event.columns) if getattr(c, "is_primary", False)]
    primary_key = tuple(columns[i].name for i in key_indexes)
    return TableSchema(event.schema, event.table, columns, primary_key)
