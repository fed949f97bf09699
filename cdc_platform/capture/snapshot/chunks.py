"""Keyset chunks of a table: which key, which SELECT, and reading one chunk with watermarks.

A snapshot reads a table in chunks of at most ``chunk_size`` rows ordered by the chunk key,
each strictly after the last key read and up to the maximum key read when the snapshot started
(DBLog's bounded keyset scan: it terminates while inserts continue at the end of the key
space; rows inserted after the start reach the target through the stream).

A chunk is also bounded by bytes (``max_bytes``): its rows are streamed from the server
(unbuffered cursor) and the chunk ends at the row that reaches the budget, so its range ends
at the last row read. Every statement of a chunk runs in the one read view of its watermarks,
so a chunk read as several keyset SELECTs (see :func:`read_chunk`) is as consistent as one.

Query shape: composite keys are expanded lexicographically, ``(a > x) OR (a = x AND b > y)``,
with the leading column also bounded on its own (``a >= x AND (...)``) so that the optimiser
picks a range scan on the key's index; row constructors are avoided because older optimisers do
not use indexes for them. Nullable key parts (only possible for a surrogate key) follow the
server's order, NULL first, with ``IS NULL`` / ``IS NOT NULL`` decided per bound value. Values are
always parameters; identifiers are always quoted.

Every "after this key" is decided by the server, in the key columns' collations: a chunk's
bound is a key read from the server, and the next SELECT asks for ``key > bound``. In a case- or
accent-insensitive or PAD SPACE collation, keys that differ as text ('a@x', 'A@X'; 'b', 'b ')
compare equal there, so ``key > 'a@x'`` also leaves out an unread 'A@X'. A chunk therefore never
ends inside such a group of equal keys: where it ends on a text key, the rest of the group is
read in the same read view (:func:`_read_keyset`). Python compares keys only for identity (the
lake's: a key is its exact value), never for order.
"""

from __future__ import annotations

import functools
import hashlib
import json
import operator
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pymysql
import pymysql.cursors

from cdc_platform.capture.charsets import as_information_schema_shows
from cdc_platform.capture.gtid import GtidSet
from cdc_platform.capture.keys import Key, range_ordered
from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.capture.snapshot import native
from cdc_platform.capture.snapshot.conditions import Condition, require_condition
from cdc_platform.capture.snapshot.watermark import read_with_watermarks
from cdc_platform.capture.source import quote_identifier
from cdc_platform.capture.values import converter_for, select_expression

# Bytes of values a chunk holds at most (besides its first row, which is read whatever its
# size): the reader holds a chunk, its landing form and its Arrow data at once, and the engine
# reads its Parquet file whole, so this bounds both processes' memory per chunk. 32 MiB keeps
# 4096-row chunks of rows up to 8 KB whole (the row count decides for ordinary tables).
DEFAULT_CHUNK_MAX_BYTES = 32 * 2**20
# Rows of a chunk's first SELECT while nothing is known of the table's row size: a budget cut
# leaves the rest of a SELECT's rows to be read off the wire and dropped, so a SELECT asks for
# about as many rows as the budget holds, estimated from the rows read before.
_FIRST_SELECT_ROWS = 64
_FETCH_ROWS = 256
# Bytes counted for a value of fixed width (numbers, dates); text and binary count their length.
_FIXED_VALUE_BYTES = 8
_VARIABLE_KINDS = frozenset({"string", "binary", "json", "set", "enum"})
# Kinds compared in a collation, where different values may compare equal.
COLLATED_KINDS = frozenset({"string"})

# Kinds that cannot be a chunk key: no meaningful order.
UNORDERABLE_KINDS = frozenset({"json"})


class ChunkKeyError(RuntimeError):
    """The chunk key does not identify rows (duplicates); the message names table and key."""


@dataclass(frozen=True)
class SkippedTable:
    """A table the snapshot cannot read, with the reason a user sees as its status."""

    table_id: str
    reason: str

    @property
    def status(self) -> str:
        return f"skipped: {self.reason}"

    def __str__(self) -> str:
        return f"{self.table_id}: {self.status}"


@dataclass(frozen=True)
class ChunkKey:
    """The columns chunks are ordered and bounded by, and which of them may be NULL."""

    columns: tuple[str, ...]
    nullable: tuple[bool, ...]
    origin: str  # "primary key" or "surrogate key"

    def __post_init__(self) -> None:
        if not self.columns or len(self.columns) != len(self.nullable):
            raise ValueError("a chunk key needs one nullable flag per column")


def chunk_key_for(
    schema: TableSchema,
    surrogate_key: str | Sequence[str] | None = None,
    nullable_columns: Collection[str] = (),
) -> ChunkKey | SkippedTable:
    """The table's chunk key: its primary key, else the signal's ``surrogate-key`` columns.

    A surrogate key must identify rows (unique, NULL counting as a value): the target merges
    by it. On a table with a primary key the surrogate key must be that key, so the chunk key
    and the lake's merge key stay the same.
    """
    wanted = (surrogate_key,) if isinstance(surrogate_key, str) else tuple(surrogate_key or ())
    if schema.primary_key:
        if wanted and wanted != schema.primary_key:
            return SkippedTable(schema.table_id, (
                f"it has a primary key ({', '.join(schema.primary_key)}); surrogate-key "
                f"({', '.join(wanted)}) is only for tables without one: drop it from the signal"
            ))
        # A configured surrogate key (capture.surrogate_keys) lands as the primary key; its
        # columns may admit NULL.
        return ChunkKey(schema.primary_key,
                        tuple(n in nullable_columns for n in schema.primary_key), "primary key")
    if not wanted:
        return SkippedTable(schema.table_id,
                            "no primary key and no surrogate key (set capture.surrogate_keys)")
    for name in wanted:
        if name not in schema.column_names:
            return SkippedTable(schema.table_id,
                                f"surrogate-key column {name!r} does not exist (or is excluded)")
        kind = schema.column(name).kind
        if kind in UNORDERABLE_KINDS:
            return SkippedTable(schema.table_id,
                                f"surrogate-key column {name!r} is {kind}, which has no order")
    if len(set(wanted)) != len(wanted):
        return SkippedTable(schema.table_id, "surrogate-key names a column twice")
    return ChunkKey(wanted, tuple(n in nullable_columns for n in wanted), "surrogate key")


def snapshot_key_problem(schema: TableSchema,
                         surrogate_key: str | Sequence[str] | None = None) -> str | None:
    """Why a snapshot of ``schema`` (as the config shapes it: a configured surrogate key is its
    primary key) with the asked ``surrogate_key`` would be skipped; None when it can run.

    The snapshot run decides with this, and so does the signal sensor before launching one.
    """
    wanted = (surrogate_key,) if isinstance(surrogate_key, str) else tuple(surrogate_key or ())
    if not schema.primary_key and wanted:
        return (f"no primary key; the surrogate key {list(wanted)} must be configured as "
                f"capture.surrogate_keys['{schema.table_id}'], so that the stream and the "
                "target use it too")
    key = chunk_key_for(schema, wanted)
    return key.reason if isinstance(key, SkippedTable) else None


def read_nullable_columns(conn: pymysql.Connection, database: str, table: str) -> frozenset[str]:
    """Columns of the table that admit NULL (information_schema.COLUMNS.IS_NULLABLE)."""
    with conn.cursor(pymysql.cursors.Cursor) as cur:
        cur.execute(
            "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s "
            "AND TABLE_NAME = %s AND IS_NULLABLE = 'YES'", (database, table))
        names = frozenset(str(r[0]) for r in cur.fetchall())
        conn.commit()
    return names


def schema_fingerprint(schema: TableSchema) -> str:
    """A short stable digest of the columns (names, kinds, sizes, members) and primary key.

    A chunk carries the fingerprint of the schema it was read with; the engine compares it with
    the fingerprint of the table's binlog schema at commit (ARCHITECTURE section 4).
    """
    data = {"columns": [c.to_dict() for c in schema.columns],
            "primary_key": list(schema.primary_key)}
    encoded = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]


# ---- SQL -------------------------------------------------------------------------------------

# pymysql formats every statement executed with parameters with ``sql % params``: a literal
# '%' in an identifier or in the condition must be doubled, or it is read as a placeholder.


def _q(name: str) -> str:
    return quote_identifier(name).replace("%", "%%")


def _selected(column: ColumnSpec) -> str:
    """How chunk SELECTs read a column: exactly (``values.select_expression``). Chunk rows and
    the maximum key both use it, so keys read by either compare equal."""
    return select_expression(column, _q(column.name))


@dataclass
class _Sql:
    """SQL text with its parameters, built together so placeholders and values line up."""

    text: str = ""
    params: list[Any] = field(default_factory=list)


def _param(column: ColumnSpec, value: Any) -> Any:
    """A key value as a parameter that compares in the same order as ORDER BY.

    ENUM and SET sort by their numbers, not their text: compare them with numbers too.
    BIT arrives as bytes from SELECTs; compare as an integer.
    """
    if column.kind == "enum" and isinstance(value, str):
        value = as_information_schema_shows(value)  # as column.values holds member names
        return column.values.index(value) + 1 if value in column.values else 0
    if column.kind == "set" and isinstance(value, str):
        members = {m: 1 << i for i, m in enumerate(column.values)}
        return sum(members.get(as_information_schema_shows(m), 0)
                   for m in value.split(",") if m)
    if column.kind == "bit" and isinstance(value, bytes | bytearray):
        return int.from_bytes(value, "big")
    return value


class _KeyComparisons:
    """Lexicographic comparisons of the chunk key against bound values, NULL sorting first."""

    def __init__(self, schema: TableSchema, key: ChunkKey) -> None:
        self.columns = [schema.column(name) for name in key.columns]
        self.quoted = [_q(name) for name in key.columns]
        self.nullable = key.nullable

    def _eq(self, i: int, value: Any) -> _Sql:
        if value is None:
            return _Sql(f"{self.quoted[i]} IS NULL")
        return _Sql(f"{self.quoted[i]} = %s", [_param(self.columns[i], value)])

    def _gt(self, i: int, value: Any) -> _Sql:
        if value is None:
            return _Sql(f"{self.quoted[i]} IS NOT NULL")
        return _Sql(f"{self.quoted[i]} > %s", [_param(self.columns[i], value)])

    def _ge(self, i: int, value: Any) -> _Sql | None:
        if value is None:
            return None  # everything is >= NULL
        return _Sql(f"{self.quoted[i]} >= %s", [_param(self.columns[i], value)])

    def _lt(self, i: int, value: Any) -> _Sql | None:
        if value is None:
            return None  # nothing is < NULL: the disjunct is false
        text = f"{self.quoted[i]} < %s"
        if self.nullable[i]:
            text = f"({self.quoted[i]} IS NULL OR {text})"
        return _Sql(text, [_param(self.columns[i], value)])

    def _le(self, i: int, value: Any) -> _Sql:
        if value is None:
            return _Sql(f"{self.quoted[i]} IS NULL")
        text = f"{self.quoted[i]} <= %s"
        if self.nullable[i]:
            text = f"({self.quoted[i]} IS NULL OR {text})"
        return _Sql(text, [_param(self.columns[i], value)])

    def _lexicographic(
        self, bound: Key, strict: Callable[[int, Any], _Sql | None],
        last: Callable[[int, Any], Any], leading: _Sql | None,
    ) -> _Sql:
        """OR over i of (k_0 = b_0 AND ... AND k_{i-1} = b_{i-1} AND k_i <op_i> b_i)."""
        if len(bound) != len(self.columns):
            raise ValueError(f"key bound {bound!r} has {len(bound)} values, the chunk key "
                             f"has {len(self.columns)} columns")
        disjuncts: list[_Sql] = []
        for i in range(len(bound)):
            op = last(i, bound[i]) if i == len(bound) - 1 else strict(i, bound[i])
            if op is None:
                continue
            parts = [self._eq(j, bound[j]) for j in range(i)] + [op]
            disjuncts.append(_Sql(" AND ".join(p.text for p in parts),
                                  [v for p in parts for v in p.params]))
        if not disjuncts:
            return _Sql("FALSE")
        if len(disjuncts) == 1:
            result = disjuncts[0]
        else:
            result = _Sql("(" + " OR ".join(f"({d.text})" for d in disjuncts) + ")",
                          [v for d in disjuncts for v in d.params])
        if leading is not None and len(bound) > 1:
            result = _Sql(f"{leading.text} AND {result.text}", leading.params + result.params)
        return result

    def equal(self, key: Key) -> _Sql:
        """key = key, column by column in the server's collations (NULL matching NULL)."""
        parts = [self._eq(i, value) for i, value in enumerate(key)]
        return _Sql(" AND ".join(p.text for p in parts), [v for p in parts for v in p.params])

    def after(self, bound: Key) -> _Sql:
        """key > bound."""
        return self._lexicographic(bound, self._gt, self._gt, self._ge(0, bound[0]))

    def up_to(self, bound: Key) -> _Sql:
        """key <= bound."""
        return self._lexicographic(bound, self._lt, self._le, self._le(0, bound[0]))


@dataclass(frozen=True)
class ChunkedTable:
    """A table as a snapshot reads it: schema (after column exclusions), chunk key, filter.

    The filter is a :class:`Condition`, checked where its text entered; a plain ``str`` is
    refused (TypeError), since this is where it becomes SQL.
    """

    schema: TableSchema
    key: ChunkKey
    condition: Condition | None = None
    # The most a row can count against a chunk's byte budget, by the columns' declared widths
    # (None: unbounded or unknown). A SELECT whose rows cannot pass the budget is read
    # buffered, which pymysql does some 10 % faster than streamed (see with_row_bound).
    max_row_bytes: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.condition is not None:
            require_condition(self.condition)
        for name in self.key.columns:
            self.schema.column(name)  # KeyError naming the table if a key column is missing

    @property
    def table_id(self) -> str:
        return self.schema.table_id

    @functools.cached_property
    def key_indexes(self) -> tuple[int, ...]:
        names = self.schema.column_names
        return tuple(names.index(name) for name in self.key.columns)

    @functools.cached_property
    def variable_indexes(self) -> tuple[int, ...]:
        """Columns whose values are counted by length against a chunk's byte budget."""
        return tuple(i for i, c in enumerate(self.schema.columns) if c.kind in _VARIABLE_KINDS)

    def _from_where(self, *bounds: _Sql) -> _Sql:
        conditions = list(bounds)
        if self.condition is not None:
            conditions.append(_Sql(f"({self.condition.sql.replace('%', '%%')})"))
        text = f" FROM {_q(self.schema.database)}.{_q(self.schema.table)}"
        if conditions:
            text += " WHERE " + " AND ".join(c.text for c in conditions)
        return _Sql(text, [v for c in conditions for v in c.params])

    def chunk_query(self, after_key: Key | None, max_key: Key | None,
                    chunk_size: int) -> tuple[str, tuple[Any, ...]]:
        """The SELECT of the chunk after ``after_key`` (exclusive) up to ``max_key`` (inclusive).

        ``None`` leaves that side open. The text is a pymysql format string: execute it with
        the returned parameters (never with ``None``).
        """
        if chunk_size < 1:
            raise ValueError(f"chunk size must be at least 1, got {chunk_size}")
        keys = _KeyComparisons(self.schema, self.key)
        bounds = []
        if after_key is not None:
            bounds.append(keys.after(after_key))
        if max_key is not None:
            bounds.append(keys.up_to(max_key))
        columns = ", ".join(_selected(c) for c in self.schema.columns)
        where = self._from_where(*bounds)
        order = ", ".join(_q(name) for name in self.key.columns)
        sql = f"SELECT {columns}{where.text} ORDER BY {order} LIMIT %s"
        return sql, (*where.params, chunk_size)

    def equal_keys_query(self, key: Key) -> tuple[str, tuple[Any, ...]]:
        """The SELECT of every row whose key the server holds equal to ``key`` (matching the
        condition): the collation group a chunk ending at ``key`` must hold whole."""
        columns = ", ".join(_selected(c) for c in self.schema.columns)
        where = self._from_where(_KeyComparisons(self.schema, self.key).equal(key))
        return f"SELECT {columns}{where.text}", tuple(where.params)

    @functools.cached_property
    def key_collated(self) -> bool:
        """Whether distinct keys may compare equal on the server (a text key column)."""
        return any(self.schema.column(name).kind in COLLATED_KINDS for name in self.key.columns)

    def max_key_query(self) -> tuple[str, tuple[Any, ...]]:
        """The SELECT of the largest chunk key (matching the condition), NULLs sorting first.

        The key is selected as the chunk rows select it: the maximum bounds the last chunk
        (``key <= max``) and is compared with the last row's key, so a lossy form (the server
        prints FLOAT with 6 digits: 0.3 for 0.30000001) would leave the largest row out.
        """
        columns = ", ".join(_selected(self.schema.column(name)) for name in self.key.columns)
        where = self._from_where()
        order = ", ".join(f"{_q(name)} DESC" for name in self.key.columns)
        return f"SELECT {columns}{where.text} ORDER BY {order} LIMIT 1", tuple(where.params)

    @property
    def range_assertions_allowed(self) -> bool:
        """Whether the lake may apply this table's per-chunk range assertions.

        Not with a filter (a row absent from a filtered chunk may exist), and not for keys
        whose landing form sorts differently from the source (text: collations, TIME, DECIMAL
        above 38 digits; see :func:`range_ordered`); those tables rely on the end-of-snapshot
        sweep instead (see commit_rule).
        """
        return self.condition is None and all(
            range_ordered(self.schema.column(name)) for name in self.key.columns)


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


# ---- chunks ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Chunk:
    """One chunk as read: rows in landing form, the key range it covers, its watermarks.

    The range is ``(range_low, range_high]`` in chunk-key order with NULL first; ``None`` leaves
    a side open. Every row of the table inside the range at the chunk's read view is in
    ``rows``: that is what lets the engine assert that the other keys in the range do not exist.
    ``resume_key`` is the last row's key as read (raw): the next chunk reads strictly after it.
    """

    table: ChunkedTable
    rows: tuple[tuple[Any, ...], ...]
    range_low: Key | None
    range_high: Key | None
    low_watermark: GtidSet
    after: GtidSet
    schema_fingerprint: str
    resume_key: Key | None
    complete: bool  # no chunk follows: the range reached the snapshot's maximum key
    # The same rows column-wise, when the reader has them so (it builds Arrow data from them).
    columns: tuple[Sequence[Any], ...] | None = field(default=None, compare=False, repr=False)
    bytes_read: int = field(default=0, compare=False)  # as counted against the byte budget
    # The rows as landing Arrow arrays, when the reader built them so (mysqlclient: ``rows``
    # is then made from them only when looked at).
    arrow: pa.Table | None = field(default=None, compare=False, repr=False)

    @property
    def table_id(self) -> str:
        return self.table.table_id

    def key_of(self, row: Sequence[Any]) -> Key:
        return tuple(row[i] for i in self.table.key_indexes)


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
    return pa.Table.from_arrays(arrays, schema=table.schema.arrow_schema(metadata_columns=False))


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
