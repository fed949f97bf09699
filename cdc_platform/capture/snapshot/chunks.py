"""Keyset chunks of a table: which key, which SELECT, and reading one chunk with watermarks.

A snapshot reads a table in chunks of at most ``chunk_size`` rows ordered by the chunk key,
each strictly after the last key read and up to the maximum key read when the snapshot started
(DBLog's bounded keyset scan: it terminates while inserts continue at the end of the key
space; rows inserted after the start reach the target through the stream).

Query shape: composite keys are expanded lexicographically, ``(a > x) OR (a = x AND b > y)``,
with the leading column also bounded on its own (``a >= x AND (...)``) so that the optimiser
picks a range scan on the key's index; row constructors are avoided because older optimisers do
not use indexes for them. Nullable key parts (only possible for a surrogate key) follow the
server's order, NULL first, with ``IS NULL`` / ``IS NOT NULL`` decided per bound value. Values are
always parameters; identifiers are always quoted.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pymysql
import pymysql.cursors

from cdc_platform.capture.charsets import as_information_schema_shows
from cdc_platform.capture.gtid import GtidSet
from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.capture.snapshot.conditions import validate_condition
from cdc_platform.capture.snapshot.watermark import read_with_watermarks
from cdc_platform.capture.source import quote_identifier
from cdc_platform.capture.values import converter_for, select_expression

Key = tuple[Any, ...]

# Keys whose landing (Arrow) type sorts in the lake as the source's ORDER BY sorts them: only
# chunks keyed by these carry a per-chunk range assertion (the lake compares target keys with
# the range). Decided by the landed type, not the kind: a DECIMAL wider than 38 digits lands as
# text. Text sorts by collation at the source and bytewise in the lake (TIME, ENUM, SET and
# JSON land as text too). Keep in step with ``cdc_platform.lake.merge.RANGE_KEY_TYPES``, the
# Spark types whose range assertions the lake accepts (it refuses them on text keys).
_RANGE_ORDERED_TYPES: tuple[Callable[[pa.DataType], bool], ...] = (
    pa.types.is_integer, pa.types.is_decimal, pa.types.is_floating, pa.types.is_date,
    pa.types.is_timestamp, pa.types.is_binary,
)


def range_ordered(column: ColumnSpec) -> bool:
    """Whether the lake orders ``column``'s landed values as the source orders the column."""
    arrow_type = column.arrow_type()
    if column.source_type == "uuid":  # lands as bytes, sorts by swapped segments
        return False
    return any(test(arrow_type) for test in _RANGE_ORDERED_TYPES)


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
        return SkippedTable(schema.table_id, "no primary key and no surrogate key (set capture.surrogate_keys)")
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
        self, bound: Key, strict: Callable[[int, Any], _Sql | None], last: Callable[[int, Any], Any],
        leading: _Sql | None,
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

    def after(self, bound: Key) -> _Sql:
        """key > bound."""
        return self._lexicographic(bound, self._gt, self._gt, self._ge(0, bound[0]))

    def up_to(self, bound: Key) -> _Sql:
        """key <= bound."""
        return self._lexicographic(bound, self._lt, self._le, self._le(0, bound[0]))


@dataclass(frozen=True)
class ChunkedTable:
    """A table as a snapshot reads it: schema (after column exclusions), chunk key, filter."""

    schema: TableSchema
    key: ChunkKey
    condition: str | None = None

    def __post_init__(self) -> None:
        if self.condition is not None:
            object.__setattr__(self, "condition", validate_condition(self.condition))
        for name in self.key.columns:
            self.schema.column(name)  # KeyError naming the table if a key column is missing

    @property
    def table_id(self) -> str:
        return self.schema.table_id

    @functools.cached_property
    def key_indexes(self) -> tuple[int, ...]:
        names = self.schema.column_names
        return tuple(names.index(name) for name in self.key.columns)

    def _from_where(self, *bounds: _Sql) -> _Sql:
        conditions = list(bounds)
        if self.condition is not None:
            conditions.append(_Sql(f"({self.condition.replace('%', '%%')})"))
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

    @property
    def table_id(self) -> str:
        return self.table.table_id

    def key_of(self, row: Sequence[Any]) -> Key:
        return tuple(row[i] for i in self.table.key_indexes)

    def rows_by_key(self) -> dict[Key, tuple[Any, ...]]:
        return {self.key_of(row): row for row in self.rows}


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
) -> Chunk:
    """Read the chunk after ``after_key`` up to ``max_key`` inside one read view with watermarks.

    ``schema_fingerprint`` is of the columns as selected; the caller re-reads the table's schema
    and restarts the chunk when the SELECT fails on a column a DDL dropped.
    """
    sql, params = table.chunk_query(after_key, max_key, chunk_size)

    def select(cur: Any) -> list[tuple[Any, ...]]:
        cur.execute(sql, params)
        return list(cur.fetchall())

    raw_rows, marks = read_with_watermarks(conn, flavour, select)
    # Column-wise from here: one C-level transpose, one converter pass per column, Arrow
    # arrays built from columns (per-row Python is what a chunk's cost is made of).
    raw_columns = list(zip(*raw_rows, strict=True)) if raw_rows else \
        [() for _ in table.schema.columns]
    key_columns = [raw_columns[i] for i in table.key_indexes]
    raw_keys = list(zip(*key_columns, strict=True))
    for previous, current in zip(raw_keys, raw_keys[1:], strict=False):
        if previous == current:
            raise ChunkKeyError(
                f"{table.table_id}: chunk key ({', '.join(table.key.columns)}) = {current!r} "
                f"appears twice: the {table.key.origin} does not identify rows; pick a unique "
                "surrogate-key"
            )
    columns = [values if convert is None else [convert(v) for v in values]
               for convert, values in zip(_landing_converters(table.schema), raw_columns,
                                          strict=True)]
    rows = tuple(zip(*columns, strict=True))
    full = len(raw_rows) == chunk_size
    resume_key = raw_keys[-1] if raw_keys else None
    range_high = landing_key(table, resume_key) if full else landing_key(table, max_key)
    complete = not full or (max_key is not None and resume_key == max_key)
    return Chunk(
        table=table,
        rows=rows,
        range_low=landing_key(table, after_key),
        range_high=range_high,
        low_watermark=marks.low_watermark,
        after=marks.after,
        schema_fingerprint=schema_fingerprint(table.schema),
        resume_key=resume_key,
        complete=complete,
        columns=tuple(columns),
    )


def read_table_in_chunks(
    conn: pymysql.Connection, flavour: str, table: ChunkedTable, chunk_size: int
) -> list[Chunk]:
    """All chunks of a table, one after the other (tests and benchmarks; the snapshot asset
    persists progress between chunks instead)."""
    max_key = read_max_key(conn, table)
    chunks: list[Chunk] = []
    if max_key is None:
        return chunks  # nothing existed at the start: rows inserted since come by the stream
    after_key: Key | None = None
    while True:
        chunk = read_chunk(conn, flavour, table, chunk_size, after_key, max_key)
        chunks.append(chunk)
        if chunk.complete:
            return chunks
        after_key = chunk.resume_key
