"""The verdicts of range assertions and sweeps applied to a batch: in Spark for the MERGE and
its append, in Arrow for the merges and loads without Spark.

``range_assertions`` decides, with no engine, which keys each instruction judges and by which
threshold (its interval algebra). This module holds what each engine needs to apply those
verdicts, side by side so the two implementations of each rule sit together: reading the
batch's ``a``/``s`` records as instructions (``_collect_instructions`` by a Spark job,
``instructions_of`` by pyarrow), and judging keys (``tombstones`` and ``not_asserted_away``
as Spark column expressions, ``asserted_away`` over Arrow's sorted keys). ``lake.merge``
orchestrates the Spark side; ``lake.arrow_merge`` and ``lake.fold`` the Arrow one.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    DataType,
    LongType,
    StructField,
    TimestampNTZType,
    TimestampType,
)

from cdc_platform.capture.keys import Key, key_order, range_ordered
from cdc_platform.capture.landing.records import (
    DELETE,
    HI_OPEN,
    INSTRUCTION_OPS,
    LO_OPEN,
    OP,
    POS,
    SNAPSHOT_ROW,
    SWEEP,
    THRESHOLD,
    hi_column,
)
from cdc_platform.capture.schema import TableSchema
from cdc_platform.lake.columns import col, table_struct
from cdc_platform.lake.range_assertions import (
    Instruction,
    Interval,
    Span,
    Split,
    Verdict,
    covered_spans,
    intervals,
    verdict_tree,
)

log = logging.getLogger(__name__)


# ---- in Spark (the MERGE and its append) -----------------------------------------------------

# Up to this many disjoint asserted spans are pushed down as a disjunction; beyond, their hull.
MAX_FILTER_SPANS = 32


@dataclass(frozen=True)
class _Verdicts:
    """What a batch's range assertions and sweeps decide, as Spark expressions on the key."""

    keys: list[str]
    key_types: list[DataType]
    tree: Split | Verdict | None  # ``verdict_tree``
    span_filter: Column | None  # the key spans the verdicts cover (None: all of them)

    def tombstone_position(self, latest_pos: Column) -> Column:
        """The tombstone's position for a key whose latest record is at ``latest_pos`` (NULL:
        the key stays)."""
        return _verdict_expression(self.tree, self.keys, self.key_types, latest_pos)


def _verdicts(table_id: str, batch: DataFrame, schema: TableSchema) -> _Verdicts | None:
    """The batch's instructions (job A1, ``_collect_instructions``) as verdicts, or None when
    none can delete anything."""
    keys = list(schema.primary_key)
    types = {f.name: f.dataType for f in table_struct(schema).fields}
    key_types = [types[k] for k in keys]
    instructions = _collect_instructions(batch, table_id, keys, key_types,
                                         unordered_key_columns(schema))
    cut = intervals(instructions)
    if all(verdict is None for _, verdict in cut):
        return None
    log.info("%s: applying %d range assertions/sweeps", table_id, len(instructions))
    return _Verdicts(keys, key_types, verdict_tree(cut),
                     _span_filter(covered_spans(cut, MAX_FILTER_SPANS), keys, key_types))


def not_asserted_away(table_id: str, batch: DataFrame, schema: TableSchema) -> Column | None:
    """For a batch into an empty table, folded to one record per key: the condition its rows
    meet unless a range assertion or sweep deletes their key (the rule of ``tombstones``,
    where each key's latest record is its own row), or None when no instruction deletes
    anything. Never NULL (``_key_le``)."""
    verdicts = _verdicts(table_id, batch, schema)
    if verdicts is None:
        return None
    away = verdicts.tombstone_position(col(POS)).isNotNull()
    if verdicts.span_filter is not None:
        away = away & verdicts.span_filter
    return ~away


def tombstones(
    table_id: str, batch: DataFrame, folded: DataFrame, state: DataFrame, schema: TableSchema,
) -> DataFrame | None:
    """The deletes the batch's range assertions and sweeps call for, or None if none can.

    ``folded`` holds the batch's row records, one per key (newest), and ``state`` the table's
    rows (keys and ``__cdc_pos``) as of the snapshot the batch applies to (an empty table:
    ``not_asserted_away``). A key live after the batch whose latest position is below the
    highest threshold of the instructions covering it gets a tombstone at that instruction's
    position (never below the threshold, so above the key's latest record).
    """
    verdicts = _verdicts(table_id, batch, schema)
    if verdicts is None:
        return None
    keys = verdicts.keys
    latest_pos, latest_op = "__cdc_latest_pos", "__cdc_latest_op"
    candidates = folded.select(*[col(k) for k in keys], col(POS), col(OP)).unionByName(
        state.select(*[col(k) for k in keys], col(POS), F.lit(SNAPSHOT_ROW).alias(OP)))
    if verdicts.span_filter is not None:
        candidates = candidates.where(verdicts.span_filter)  # pushed down to the table's scan
    latest = candidates.groupBy(*[col(k) for k in keys]).agg(
        F.max(col(POS)).alias(latest_pos), F.max_by(col(OP), col(POS)).alias(latest_op)
    )
    tombstone_pos = verdicts.tombstone_position(col(latest_pos))
    victims = latest.where(col(latest_op) != DELETE).select(
        *[col(k) for k in keys], tombstone_pos.alias(POS)
    ).where(col(POS).isNotNull())

    def tombstone(field: StructField) -> Column:
        if field.name in keys or field.name == POS:
            return col(field.name)
        if field.name == OP:
            return F.lit(DELETE).alias(OP)
        return F.lit(None).cast(field.dataType).alias(field.name)

    return victims.select(*[tombstone(f) for f in table_struct(schema).fields])


def unordered_key_columns(schema: TableSchema) -> list[str]:
    """Key columns whose landed values the lake does not order as the source does
    (``capture.keys.range_ordered``, the rule the chunk reader asserts ranges by): a range
    assertion over them would judge the wrong keys, so it is refused."""
    return [k for k in schema.primary_key if not range_ordered(schema.column(k))]


def _collect_instructions(
    batch: DataFrame, table_id: str, keys: list[str], key_types: list[DataType],
    unordered: list[str],
) -> list[Instruction]:
    """Job A1: the batch's ``a``/``s`` records on the driver (few: one per chunk commit)."""

    def exact(name: str, data_type: DataType, alias: str) -> Column:
        # Instants as microseconds: Python datetimes of TIMESTAMP values go through local time.
        value = F.unix_micros(col(name)) if isinstance(data_type, TimestampType) else col(name)
        return value.alias(alias)

    rows = batch.where(col(OP).isin(*INSTRUCTION_OPS)).select(
        col(POS).alias("pos"), col(OP).alias("op"), col(THRESHOLD).alias("threshold"),
        col(LO_OPEN).alias("lo_open"), col(HI_OPEN).alias("hi_open"),
        *[exact(k, t, f"lo{i}") for i, (k, t) in enumerate(zip(keys, key_types, strict=True))],
        *[exact(hi_column(k), t, f"hi{i}")
          for i, (k, t) in enumerate(zip(keys, key_types, strict=True))],
    ).collect()
    where = f"changelog of {table_id}"
    instructions = []
    for row in rows:
        what = f"{where}: {row.op!r} record at position {row.pos}"
        if row.threshold is None:
            raise ValueError(f"{what} has no {THRESHOLD}; snapshot instructions must carry "
                             "it (docs/landing-zone.md, Snapshot records)")
        if row.threshold > row.pos:
            raise ValueError(f"{what} has {THRESHOLD} {row.threshold} above its own position: "
                             "it would judge records that follow it")
        if row.op == SWEEP:
            instructions.append(Instruction(row.pos, row.threshold, None, None))
            continue
        if row.lo_open is None or row.hi_open is None:
            raise ValueError(f"{what} lacks {LO_OPEN}/{HI_OPEN}; range assertions must carry "
                             "their bounds (docs/landing-zone.md, Snapshot records)")
        if unordered:
            raise ValueError(f"{what}: key columns {unordered} do not sort in the lake as at "
                             "the source (text); such tables take the end-of-snapshot sweep, "
                             "not range assertions")
        low = None if row.lo_open else _key(row, "lo", len(keys))
        high = None if row.hi_open else _key(row, "hi", len(keys))
        instructions.append(Instruction(row.pos, row.threshold, low, high))
    return instructions


def _key(row: Any, prefix: str, width: int) -> Key:
    """A collected bound as a hashable tuple (binary values collect as bytearray)."""
    values = (row[f"{prefix}{i}"] for i in range(width))
    return tuple(bytes(v) if isinstance(v, bytearray) else v for v in values)


def _literal(value: Any, data_type: DataType) -> Column:
    """A Spark literal of a collected key value (see ``_collect_instructions``), exactly."""
    if isinstance(data_type, TimestampType):
        return F.timestamp_micros(F.lit(value))
    if isinstance(data_type, TimestampNTZType):
        return F.lit(value.isoformat()).cast(data_type)
    if isinstance(data_type, BinaryType):
        return F.lit(bytearray(value))
    return F.lit(value).cast(data_type)


def _key_le(keys: list[str], key_types: list[DataType], bound: Key) -> Column:
    """``key <= bound`` lexicographically, NULL first; never NULL itself."""
    terms, equal = [], []
    last = len(keys) - 1
    for i, (name, data_type, value) in enumerate(zip(keys, key_types, bound, strict=True)):
        column = col(name)
        if value is None:
            compare = column.isNull() if i == last else None  # nothing sorts below NULL
            equal.append(column.isNull())
        else:
            literal = _literal(value, data_type)
            compare = column.isNull() | (column <= literal if i == last else column < literal)
            equal.append(column.eqNullSafe(literal))
        if compare is not None:
            terms.append(reduce(operator.and_, [*equal[:-1], compare]))
    return reduce(operator.or_, terms)


def _span_filter(spans: list[Span], keys: list[str], key_types: list[DataType]
                 ) -> Column | None:
    """A filter on the key columns keeping the ``covered_spans`` (None: the whole key
    space)."""
    conditions = []
    for low, high in spans:
        parts = []
        if low is not None:
            parts.append(~_key_le(keys, key_types, low))
        if high is not None:
            parts.append(_key_le(keys, key_types, high))
        if not parts:
            return None
        conditions.append(reduce(operator.and_, parts))
    return reduce(operator.or_, conditions)


def _verdict_expression(
    tree: Split | Verdict | None, keys: list[str], key_types: list[DataType],
    latest_pos: Column,
) -> Column:
    """The tombstone position for a key with latest position ``latest_pos`` (NULL: keep it):
    ``verdict_tree`` as nested ``CASE WHEN key <= upper``, each leaf
    ``range_assertions.tombstone_position``."""
    if not isinstance(tree, Split):
        if tree is None:
            return F.lit(None).cast(LongType())
        threshold, pos = tree
        return F.when(latest_pos < F.lit(threshold), F.lit(pos).cast(LongType()))
    return F.when(_key_le(keys, key_types, tree.upper),
                  _verdict_expression(tree.below, keys, key_types, latest_pos)).otherwise(
        _verdict_expression(tree.above, keys, key_types, latest_pos))


# ---- in Arrow (merges and loads without Spark) -----------------------------------------------


def instructions_of(records: pa.Table, schema: TableSchema) -> list[Instruction] | None:
    """``_collect_instructions`` in Arrow: the ``a``/``s`` records as instructions with
    their bounds as Python values (compared only with the batch's own keys read the same
    way); None for any record the Spark path would refuse (it says why)."""
    keys = list(schema.primary_key)
    instructions = []
    for record in records.to_pylist():
        pos, threshold = record[POS], record[THRESHOLD]
        if threshold is None or threshold > pos:
            return None
        if record[OP] == SWEEP:
            instructions.append(Instruction(pos, threshold, None, None))
            continue
        if record[LO_OPEN] is None or record[HI_OPEN] is None:
            return None
        low: Key | None = None if record[LO_OPEN] else tuple(record[k] for k in keys)
        high: Key | None = None if record[HI_OPEN] else tuple(record[hi_column(k)]
                                                              for k in keys)
        instructions.append(Instruction(pos, threshold, low, high))
    ranged = any(i.low is not None or i.high is not None for i in instructions)
    if ranged and not all(range_ordered(schema.column(k)) for k in keys):
        return None  # (text keys take sweeps only: the Spark path refuses their assertions)
    return instructions


def asserted_away(rows: pa.Table, order: pa.Array, ordered: pa.Table,
                   cut: Sequence[Interval]) -> np.ndarray:
    """For each row record (one per key, so each key's latest record): whether a range
    assertion or sweep deletes its key (``range_assertions.tombstone_position`` not None:
    its interval has a verdict whose threshold is above the record's position).

    ``ordered``: the keys sorted by ``order`` (lexicographic, NULL first: ``keys.key_order``,
    which Arrow's order of the range-ordered types is); each interval's end is found by
    bisection, so the cost is that sort, not a comparison per key and interval."""
    count = rows.num_rows
    thresholds = np.full(count, np.iinfo(np.int64).min, dtype=np.int64)
    if len(cut) == 1:
        verdict = cut[0][1]
        if verdict is not None:
            thresholds[:] = verdict[0]
        return rows.column(POS).to_numpy() < thresholds
    columns = ordered.columns

    def order_at(index: int) -> tuple:
        return key_order(tuple(column[index].as_py() for column in columns))

    start = 0
    for upper, verdict in cut:
        if upper is None:
            end = count
        else:
            bound, low, high = key_order(upper), start, count
            while low < high:  # the first sorted key above ``upper``
                middle = (low + high) // 2
                if order_at(middle) <= bound:
                    low = middle + 1
                else:
                    high = middle
            end = low
        if verdict is not None:
            thresholds[start:end] = verdict[0]
        start = end
    positions = rows.column(POS).take(order).to_numpy()
    removed = np.zeros(count, dtype=bool)
    removed[order.to_numpy()] = positions < thresholds
    return removed
