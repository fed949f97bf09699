"""Keyset chunks of a table, the words both sides of a snapshot use: which key, which SELECT,
and what a chunk is.

The reader (``reading/``, in the snapshot asset's process) reads a table in chunks; the engine
(``sessions.py``) decides them. Both speak of a ``ChunkKey``, a ``ChunkedTable`` and a ``Chunk``,
defined here with the keyset SQL and the schema fingerprint; running the SELECTs is the
reader's (``reading/keyset.py``), so nothing here talks to a server.

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

Every "after this key" is decided by the server, in the key columns' collations: a chunk's
bound is a key read from the server, and the next SELECT asks for ``key > bound``. In a case- or
accent-insensitive or PAD SPACE collation, keys that differ as text ('a@x', 'A@X'; 'b', 'b ')
compare equal there, so ``key > 'a@x'`` also leaves out an unread 'A@X'. A chunk therefore never
ends inside such a group of equal keys (``ChunkedTable.equal_keys_query``: the reader reads the
rest of the group in the same read view). Python compares keys only for identity (the lake's: a
key is its exact value), never for order.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from cdc_platform.capture.charsets import as_information_schema_shows
from cdc_platform.capture.gtid import GtidSet
from cdc_platform.capture.keys import Key, range_ordered
from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.capture.snapshot.conditions import Condition, require_condition
from cdc_platform.capture.source import quote_identifier
from cdc_platform.capture.values import select_expression

# Bytes of values a chunk holds at most (besides its first row, which is read whatever its
# size): the reader holds a chunk, its landing form and its Arrow data at once, and the engine
# reads its Parquet file whole, so this bounds both processes' memory per chunk. 32 MiB keeps
# 4096-row chunks of rows up to 8 KB whole (the row count decides for ordinary tables).
DEFAULT_CHUNK_MAX_BYTES = 32 * 2**20
_VARIABLE_KINDS = frozenset({"string", "binary", "json", "set", "enum"})
# Kinds compared in a collation, where different values may compare equal.
COLLATED_KINDS = frozenset({"string"})

# Kinds that cannot be a chunk key: no meaningful order.
UNORDERABLE_KINDS = frozenset({"json"})



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
    # buffered, which pymysql does some 10 % faster than streamed (see
    # ``reading.keyset.with_row_bound``).
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
