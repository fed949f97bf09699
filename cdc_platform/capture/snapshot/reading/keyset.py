"""Reading one chunk of a table: keyset SELECTs in one read view between watermarks.

The reader's side of the chunk words in ``snapshot/chunks.py``: a chunk's rows are read by the
``ChunkedTable``'s keyset SELECTs inside the read view of its watermarks
(``watermark.read_with_watermarks``), through PyMySQL or mysqlclient (``native``: rows, or
columns read in C), then cast to their landing form. The engine never reads a chunk this way;
it takes the chunk's files from the landing zone.

A chunk is also bounded by bytes (``max_bytes``): its rows are streamed from the server
(unbuffered cursor) and the chunk ends at the row that reaches the budget, so its range ends
at the last row read. Every statement of a chunk runs in the one read view of its watermarks,
so a chunk read as several keyset SELECTs (see :func:`read_chunk`) is as consistent as one;
where it ends on a text key, the rest of the server's group of equal keys is read in the same
read view (:func:`_read_keyset`).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pymysql
import pymysql.cursors

from cdc_platform.capture.keys import Key
from cdc_platform.capture.schema import TableSchema
from cdc_platform.capture.snapshot import native
from cdc_platform.capture.snapshot.chunks import (
    DEFAULT_CHUNK_MAX_BYTES,
    Chunk,
    ChunkedTable,
    schema_fingerprint,
)
from cdc_platform.capture.snapshot.watermark import read_with_watermarks
from cdc_platform.capture.values import converter_for

# Rows of a chunk's first SELECT while nothing is known of the table's row size: a budget cut
# leaves the rest of a SELECT's rows to be read off the wire and dropped, so a SELECT asks for
# about as many rows as the budget holds, estimated from the rows read before.
_FIRST_SELECT_ROWS = 64
_FETCH_ROWS = 256
# Bytes counted for a value of fixed width (numbers, dates); text and binary count their length.
_FIXED_VALUE_BYTES = 8


class ChunkKeyError(RuntimeError):
    """The chunk key does not identify rows (duplicates); the message names table and key."""


def read_nullable_columns(conn: pymysql.Connection, database: str, table: str) -> frozenset[str]:
    """Columns of the table that admit NULL (information_schema.COLUMNS.IS_NULLABLE)."""
    with conn.cursor(pymysql.cursors.Cursor) as cur:
        cur.execute(
            "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s "
            "AND TABLE_NAME = %s AND IS_NULLABLE = 'YES'", (database, table))
        names = frozenset(str(r[0]) for r in cur.fetchall())
        conn.commit()
    return names


def with_row_bound(conn: pymysql.Connection, table: ChunkedTable) -> ChunkedTable:
    """``table`` with its ``max_row_bytes`` from the declared column widths
    (``information_schema.COLUMNS.CHARACTER_OCTET_LENGTH``; a value of another kind counts
    ``_FIXED_VALUE_BYTES``, as the budget counts it). Columns without a declared width (JSON
    on MySQL, geometry) leave it unbounded."""
    with conn.cursor(pymysql.cursors.Cursor) as cur:
        cur.execute("SELECT COLUMN_NAME, CHARACTER_OCTET_LENGTH FROM information_schema.COLUMNS "
                    "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                    (table.schema.database, table.schema.table))
        widths = {str(name): octets for name, octets in cur.fetchall()}
        conn.commit()
    total = 0
    for index, column in enumerate(table.schema.columns):
        if index not in table.variable_indexes:
            total += _FIXED_VALUE_BYTES
        elif widths.get(column.name) is None:
            return replace(table, max_row_bytes=None)
        else:
            total += int(widths[column.name])
    return replace(table, max_row_bytes=total)


def read_max_key(conn: pymysql.Connection, table: ChunkedTable) -> Key | None:
    """The largest chunk key when the snapshot starts (raw values), or None if no row matches."""
    sql, params = table.max_key_query()
    with conn.cursor(pymysql.cursors.Cursor) as cur:
        cur.execute(sql, params)
        row = cur.fetchone()
        conn.commit()
    return None if row is None else tuple(row)




def _landing_converters(schema: TableSchema) -> list[Callable[[Any], Any] | None]:
    return [converter_for(c, from_binlog=False) for c in schema.columns]


def _to_landing(row: Sequence[Any], converters: Sequence[Callable[[Any], Any] | None]) -> tuple:
    return tuple(v if convert is None else convert(v)
                 for convert, v in zip(converters, row, strict=True))


def landing_key(table: ChunkedTable, raw_key: Key | None) -> Key | None:
    """A raw key (as read by SELECT) in landing form, the form target keys have."""
    if raw_key is None:
        return None
    columns = [table.schema.column(name) for name in table.key.columns]
    return _to_landing(raw_key, [converter_for(c, from_binlog=False) for c in columns])


def read_chunk(
    conn: pymysql.Connection,
    flavour: str,
    table: ChunkedTable,
    chunk_size: int,
    after_key: Key | None,
    max_key: Key | None,
    max_bytes: int = DEFAULT_CHUNK_MAX_BYTES,
    row_bytes_hint: float | None = None,
    defer_landing: bool = False,
) -> Chunk:
    """Read the chunk after ``after_key`` up to ``max_key`` inside one read view with watermarks:
    at most ``chunk_size`` rows and about ``max_bytes`` of values (at least one row).

    ``row_bytes_hint`` (bytes per row of the chunk before) sizes the first SELECT; the chunk's
    ``bytes_read`` gives the next one. ``schema_fingerprint`` is of the columns as selected; the
    caller re-reads the table's schema and restarts the chunk when the SELECT fails on a column
    a DDL dropped.

    ``defer_landing``: where the rows were read column-wise (``native.RawRows``), cast them to
    their landing form (and check their keys for repeats) only when the chunk's rows are first
    looked at (``native.ArrowRows.table``): the reader does that in its writer thread, while
    it reads the next chunk. A value without a landing form or a repeated key then raises
    there, before the chunk's files are written.
    """
    if chunk_size < 1 or max_bytes < 1:
        raise ValueError(f"chunk size and byte budget must be at least 1, got {chunk_size} rows "
                         f"and {max_bytes} bytes")

    native_conn = native.is_native(conn)
    source: _RowSource = (_ColumnarRows if native.COLUMNAR else _NativeRows)(conn, table) \
        if native_conn else _PyMySQLRows(conn, table)

    def select(cur: Any) -> _KeysetRead:
        return _read_keyset(source, table, chunk_size, after_key, max_key, max_bytes,
                            row_bytes_hint)

    read, marks = read_with_watermarks(conn, flavour, select)
    raw_rows = read.rows
    # Column-wise from here: one C-level transpose (none when read column-wise), one converter
    # pass per column, Arrow arrays built from columns (per-row Python is what a chunk's cost
    # is made of).
    arrow: pa.Table | None = None
    columns: list[Sequence[Any]] | None = None
    rows: Sequence[tuple[Any, ...]]
    if isinstance(raw_rows, native.RawRows):
        assert isinstance(source, _NativeRows)
        last_key = tuple(raw_rows[-1][i] for i in table.key_indexes) if raw_rows else None
        land = functools.partial(_landed_columns, table, raw_rows, source)
        rows = native.ArrowRows(build=land, count=len(raw_rows))
        if not defer_landing:
            arrow = rows.table
    else:
        raw_columns = list(zip(*raw_rows, strict=True)) if raw_rows else \
            [() for _ in table.schema.columns]
        raw_keys = list(zip(*(raw_columns[i] for i in table.key_indexes), strict=True))
        if len(set(raw_keys)) != len(raw_keys):
            _raise_repeated_key(table, raw_rows, source)
        last_key = raw_keys[-1] if raw_keys else None
        if native_conn:
            assert isinstance(source, _NativeRows)
            arrow = _landing_table(table, raw_columns, source)
            rows = native.ArrowRows(arrow)
        else:
            columns = [values if convert is None else [convert(v) for v in values]
                       for convert, values in zip(_landing_converters(table.schema),
                                                  raw_columns, strict=True)]
            rows = tuple(zip(*columns, strict=True))
    resume_key = source.key(last_key) if last_key is not None else None
    range_high = landing_key(table, max_key) if read.exhausted else landing_key(table, resume_key)
    complete = read.exhausted or (max_key is not None and resume_key == max_key)
    return Chunk(
        table=table,
        rows=rows,  # type: ignore[arg-type]
        range_low=landing_key(table, after_key),
        range_high=range_high,
        low_watermark=marks.low_watermark,
        after=marks.after,
        schema_fingerprint=schema_fingerprint(table.schema),
        resume_key=resume_key,
        complete=complete,
        columns=None if columns is None else tuple(columns),
        bytes_read=read.bytes,
        arrow=arrow,
    )


def _landing_table(table: ChunkedTable, raw_columns: Sequence[Sequence[Any] | pa.Array],
                   source: _NativeRows) -> pa.Table:
    """Raw mysqlclient columns as a landing Arrow table; ColumnValueError naming a column
    whose value has no exact landing form."""
    arrays = native.landing_columns(table.schema, raw_columns, source.field_types(),
                                    source.encoding)
    return pa.Table.from_arrays(arrays, schema=table.schema.arrow_schema())


def _landed_columns(table: ChunkedTable, raw_rows: native.RawRows, source: _NativeRows
                    ) -> pa.Table:
    """Rows read column-wise in their landing form; ChunkKeyError if a key repeats, and
    ColumnValueError naming a column whose value has no exact landing form."""
    raw_columns = raw_rows.columns()
    landed = _landing_table(table, raw_columns, source)
    if native.repeated_key(raw_columns, table.key_indexes, landed.columns):
        _raise_repeated_key(table, raw_rows, source)
    return landed


def _raise_repeated_key(table: ChunkedTable, raw_rows: Sequence[tuple[Any, ...]],
                        source: _RowSource) -> None:
    """ChunkKeyError naming the first key that appears twice among ``raw_rows`` (raw keys:
    bytes on mysqlclient, decoded one to one, so duplicates are the same)."""
    # (not only neighbours: rows whose keys a collation holds equal come in any order)
    seen: set[Key] = set()
    for row in raw_rows:
        current = tuple(row[i] for i in table.key_indexes)
        if current in seen:
            raise ChunkKeyError(
                f"{table.table_id}: chunk key ({', '.join(table.key.columns)}) = "
                f"{source.key(current)!r} appears twice: the {table.key.origin} does not "
                "identify rows; pick a unique surrogate-key"
            )
        seen.add(current)


@dataclass
class _KeysetRead:
    rows: list[tuple[Any, ...]] | native.RawRows
    bytes: int
    exhausted: bool  # every row of the range is in ``rows`` (else they end at a cut)


class _RowSource:
    """How a chunk's SELECTs are run and their rows read, per driver. Rows are tuples in
    schema column order; ``key`` turns a row's key values into the form keys are bound in."""

    def __init__(self, conn: Any, table: ChunkedTable) -> None:
        self.conn = conn
        self.table = table

    def buffered(self, sql: str, params: Sequence[Any]) -> tuple[list[tuple[Any, ...]], int]:
        raise NotImplementedError

    def bounded(self, sql: str, params: Sequence[Any], max_bytes: int, take_one: bool
                ) -> tuple[list[tuple[Any, ...]], int, bool]:
        raise NotImplementedError

    def select(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def key(self, raw: Key) -> Key:
        return raw

    def empty(self) -> list[tuple[Any, ...]] | native.RawRows:
        """Where a chunk's rows are gathered (``+=`` of what ``buffered``/``bounded`` read)."""
        return []


class _PyMySQLRows(_RowSource):
    def buffered(self, sql: str, params: Sequence[Any]) -> tuple[list[tuple[Any, ...]], int]:
        rows, size, _ = _read_buffered(self.conn, self.table, sql, params)
        return rows, size

    def bounded(self, sql: str, params: Sequence[Any], max_bytes: int, take_one: bool
                ) -> tuple[list[tuple[Any, ...]], int, bool]:
        return _read_bounded(self.conn, self.table, sql, params, max_bytes, take_one)

    def select(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        with self.conn.cursor(pymysql.cursors.Cursor) as cur:
            cur.execute(sql, tuple(params))
            return list(cur.fetchall())


class _NativeRows(_RowSource):
    """mysqlclient, values raw (bytes): ``native`` turns them into Arrow arrays; keys are
    decoded as PyMySQL decoded them."""

    def __init__(self, conn: Any, table: ChunkedTable) -> None:
        super().__init__(conn, table)
        self.encoding = native.encoding_of(conn)
        self._types: tuple[int, ...] | None = None

    def _note(self, result: Any) -> None:
        if self._types is None:
            self._types = tuple(d[1] for d in result.describe())

    def field_types(self) -> tuple[int, ...]:
        if self._types is None:  # (no SELECT ran: an empty chunk; the types are not used)
            return tuple(0 for _ in self.table.schema.columns)
        return self._types

    def buffered(self, sql: str, params: Sequence[Any]) -> tuple[list[tuple[Any, ...]], int]:
        result = native.select_raw(self.conn, sql, params)
        if self._types is None:
            self._types = result.field_types
        variable = self.table.variable_indexes
        fixed = _FIXED_VALUE_BYTES * (len(self.table.schema.columns) - len(variable))
        return result.rows, _size_of(result.rows, variable, fixed)

    def bounded(self, sql: str, params: Sequence[Any], max_bytes: int, take_one: bool
                ) -> tuple[list[tuple[Any, ...]], int, bool]:
        result = native.query_raw(self.conn, sql, params)
        self._note(result)
        try:
            return _within_budget(lambda: result.fetch_row(_FETCH_ROWS, 0), self.table,
                                  max_bytes, take_one)
        finally:
            while result.fetch_row(_FETCH_ROWS * 16, 0):  # the rest off the wire
                pass

    def select(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        result = native.select_raw(self.conn, sql, params)
        if self._types is None:
            self._types = result.field_types
        return result.rows

    def key(self, raw: Key) -> Key:
        columns = [self.table.schema.column(name) for name in self.table.key.columns]
        types = [self.field_types()[i] for i in self.table.key_indexes]
        return native.decode_key(columns, types, raw, self.encoding)


class _ColumnarRows(_NativeRows):
    """mysqlclient's connection, results read column-wise in C (``native.read_columns``):
    rows stay raw Arrow binary columns until ``native.landing_columns`` casts them."""

    def _read(self, sql: str, params: Sequence[Any], max_bytes: int = -1,
              take_one: bool = False) -> native.ColumnarRead:
        variable = self.table.variable_indexes
        fixed = _FIXED_VALUE_BYTES * (len(self.table.schema.columns) - len(variable))
        read = native.read_columns(self.conn, sql, params, variable, fixed, max_bytes, take_one)
        if self._types is None:
            self._types = read.field_types
        return read

    def buffered(self, sql: str, params: Sequence[Any]) -> tuple[native.RawRows, int]:
        read = self._read(sql, params)
        return read.rows, read.size

    def bounded(self, sql: str, params: Sequence[Any], max_bytes: int, take_one: bool
                ) -> tuple[native.RawRows, int, bool]:
        read = self._read(sql, params, max_bytes, take_one)
        return read.rows, read.size, read.cut

    def select(self, sql: str, params: Sequence[Any]) -> native.RawRows:
        return self._read(sql, params).rows

    def empty(self) -> native.RawRows:
        return native.RawRows(len(self.table.schema.columns))


def _read_keyset(source: _RowSource, table: ChunkedTable, chunk_size: int,
                 after_key: Key | None, max_key: Key | None, max_bytes: int,
                 row_bytes_hint: float | None) -> _KeysetRead:
    """The rows of one chunk, by keyset SELECTs in the caller's read view.

    Each SELECT asks for the rows the budget still holds (estimated from the rows read so far)
    and is streamed, so an underestimate costs rows read off the wire, never memory; the next
    one starts strictly after the last key read, compared by the server. Where a SELECT stops
    short of its range's end on a text key, the rows the server holds equal to the last key
    are read too (their group may pass ``chunk_size`` and the budget): ``key > last`` leaves
    out the whole group.
    """
    read = _KeysetRead(source.empty(), 0, exhausted=False)
    after = after_key
    limit = min(chunk_size, _FIRST_SELECT_ROWS if row_bytes_hint is None else
                _rows_fitting(max_bytes, row_bytes_hint))
    while True:
        sql, params = table.chunk_query(after, max_key, limit)
        if table.max_row_bytes is not None and \
                limit * table.max_row_bytes <= max_bytes - read.bytes:
            rows, size = source.buffered(sql, params)
            cut = False
        else:
            rows, size, cut = source.bounded(sql, params, max_bytes - read.bytes,
                                             take_one=not read.rows)
        read.rows += rows
        read.bytes += size
        if not cut and len(rows) < limit:
            read.exhausted = True
            return read
        last = tuple(read.rows[-1][i] for i in table.key_indexes)
        if rows and table.key_collated:
            read.bytes += _read_equal_keys(source, table, last, read.rows)
        if cut or len(read.rows) >= chunk_size:
            return read
        after = source.key(last)
        limit = min(chunk_size - len(read.rows),
                    _rows_fitting(max_bytes - read.bytes, read.bytes / len(read.rows)))


def _read_equal_keys(source: _RowSource, table: ChunkedTable, key: Key,
                     rows: list[tuple[Any, ...]]) -> int:
    """Append to ``rows`` the rows the server holds equal to ``key`` (raw, as read) that are
    not in them yet (the same exact key is the same row); the bytes added."""
    sql, params = table.equal_keys_query(source.key(key))
    group = source.select(sql, params)
    if len(group) <= 1:
        return 0
    indexes = table.key_indexes
    have = {tuple(row[i] for i in indexes) for row in rows[-len(group):]}
    added = [row for row in group if tuple(row[i] for i in indexes) not in have]
    rows += added
    variable = table.variable_indexes
    return _size_of(added, variable,
                    _FIXED_VALUE_BYTES * (len(table.schema.columns) - len(variable)))


def _rows_fitting(budget: float, row_bytes: float) -> int:
    return max(1, int(budget / max(row_bytes, 1.0)))


def _read_buffered(conn: pymysql.Connection, table: ChunkedTable, sql: str,
                   params: Sequence[Any]) -> tuple[list[tuple[Any, ...]], int, bool]:
    """The rows of one SELECT that cannot pass the budget (by declared widths), read whole."""
    with conn.cursor(pymysql.cursors.Cursor) as cur:
        cur.execute(sql, tuple(params))
        rows = list(cur.fetchall())
    variable = table.variable_indexes
    fixed = _FIXED_VALUE_BYTES * (len(table.schema.columns) - len(variable))
    return rows, _size_of(rows, variable, fixed), False


def _read_bounded(conn: pymysql.Connection, table: ChunkedTable, sql: str,
                  params: Sequence[Any], max_bytes: int, take_one: bool,
                  ) -> tuple[list[tuple[Any, ...]], int, bool]:
    """The rows of one SELECT, streamed, up to the row that would pass ``max_bytes`` (the
    first row always, with ``take_one``); also their size, and whether the budget cut them."""
    # (closing an unbuffered cursor reads what is left of its result off the wire)
    with conn.cursor(pymysql.cursors.SSCursor) as cur:
        cur.execute(sql, tuple(params))
        return _within_budget(lambda: cur.fetchmany(_FETCH_ROWS), table, max_bytes, take_one)


def _within_budget(fetch: Callable[[], Sequence[tuple[Any, ...]]], table: ChunkedTable,
                   max_bytes: int, take_one: bool) -> tuple[list[tuple[Any, ...]], int, bool]:
    """Rows from ``fetch`` (a batch a call, empty at the end) up to the row that would pass
    ``max_bytes`` (the first row always, with ``take_one``); their size, and whether the
    budget cut them. Either driver's streamed result."""
    variable = table.variable_indexes
    fixed = _FIXED_VALUE_BYTES * (len(table.schema.columns) - len(variable))
    rows: list[tuple[Any, ...]] = []
    size = 0
    while True:
        batch = fetch()
        if not batch:
            return rows, size, False
        batch_bytes = _size_of(batch, variable, fixed)
        if size + batch_bytes <= max_bytes:
            rows += batch
            size += batch_bytes
            continue
        for row in batch:
            row_bytes = _size_of((row,), variable, fixed)
            if (rows or not take_one) and size + row_bytes > max_bytes:
                return rows, size, True
            rows.append(row)
            size += row_bytes


def _size_of(rows: Sequence[Sequence[Any]], variable: Sequence[int], fixed: int) -> int:
    """Bytes counted for ``rows``: the lengths of their variable-width values (text in
    characters), ``fixed`` per row for the rest."""
    total = fixed * len(rows)
    for i in variable:
        try:  # (C-level iteration: this runs for every row read)
            total += sum(map(len, filter(None, map(operator.itemgetter(i), rows))))
        except TypeError:  # (a value the SELECT returned as a number)
            total += sum(len(v) if hasattr(v, "__len__") else _FIXED_VALUE_BYTES
                         for v in map(operator.itemgetter(i), rows) if v is not None)
    return total
