"""The fold of a batch: one record per key, the newest by ``__cdc_pos``, and the batch's counts.

Spark's fold (``fold``, ``fold_latest``) runs inside the MERGE's plan; the counts come from
pyarrow (``arrow_stats``, one read of the keys, position, op and commit time of each record)
or, where Arrow would group keys otherwise or the batch is too large, from Spark's job
(``spark_stats``). Each rule is written once per engine, side by side, and the two are
property-tested against each other (``test_fold_counts``). An append into an empty target
without Spark folds, counts and judges its batch in one pass (``arrow_fold_for_append``).
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from cdc_platform.capture.landing.records import (
    CREATE,
    DELETE,
    INSTRUCTION_OPS,
    OP,
    POS,
    ROW_OPS,
    THRESHOLD,
    TS_MS,
)
from cdc_platform.capture.schema import TableSchema
from cdc_platform.lake.changelog import BatchPlan, TableChangelog
from cdc_platform.lake.columns import col
from cdc_platform.lake.range_assertions import intervals
from cdc_platform.lake.verdicts import asserted_away, instructions_of

log = logging.getLogger(__name__)

FIRST_OP = "__cdc_first_op"
RECORDS = "__cdc_records"
INSTRUCTION = "__cdc_instruction"


def fold_latest(df: DataFrame, keys: list[str]) -> DataFrame:
    """Keep, per key, the record with the highest ``__cdc_pos`` (replayed duplicates collapse)."""
    window = Window.partitionBy(*[col(k) for k in keys]).orderBy(col(POS).desc())
    return df.withColumn("__cdc_rank", F.row_number().over(window)).where(
        col("__cdc_rank") == 1).drop("__cdc_rank")


def arrow_fold_latest(rows: pa.Table, keys: list[str]) -> pa.Table:
    """``fold_latest`` in Arrow: per key (NULL key parts equal, as Spark groups them), the
    record with the highest ``__cdc_pos``. The records sorted by key and, within a key,
    newest first; each key's first record is kept. Floating-point keys are the caller's to
    refuse (``arrow_stats`` returns None for them): Arrow orders -0.0 and 0.0, and NaNs,
    apart where Spark groups them."""
    if rows.num_rows < 2:
        return rows
    order = pc.sort_indices(rows, sort_keys=[*[(k, "ascending", "at_start") for k in keys],
                                             (POS, "descending", "at_start")])
    first = ~same_as_previous(rows.select(keys).take(order))
    return rows.take(pc.filter(order, pa.array(first)))


def same_as_previous(ordered: pa.Table) -> np.ndarray:
    """For rows sorted by their key columns: whether each equals the row before it in every
    column (NULL equal to NULL, as Spark groups; the first row: False)."""
    same = np.zeros(ordered.num_rows, dtype=bool)
    if ordered.num_rows < 2:
        return same
    equal = None
    for column in ordered.columns:
        after, before = column.slice(1), column.slice(0, len(column) - 1)
        parts = pc.or_(pc.fill_null(pc.equal(after, before), False),
                       pc.and_(pc.is_null(after), pc.is_null(before)))
        equal = parts if equal is None else pc.and_(equal, parts)
    assert equal is not None
    same[1:] = np.asarray(equal.to_numpy(zero_copy_only=False), dtype=bool)
    return same


def fold(batch: DataFrame, schema: TableSchema, counts: dict[str, int] | None = None
          ) -> tuple[DataFrame, bool, dict[str, int]]:
    """The batch folded to one record per key; whether its row records went through the fold's
    shuffle (``append_statement``'s rebalance); and the batch's counts (``spark_stats``, unless
    given: ``arrow_counts``).

    Each key keeps its newest record, the op of its first record in the batch (``c``: the key
    did not exist before the batch) and its number of records. Range assertions and sweeps
    (only in segments with the snapshot columns) are folded apart from the rows, in partitions
    of their own (flag ``__cdc_instruction``), and are never rows of the table.

    When no key has more than one row record (an initial load: snapshot chunks, each key once)
    each record is already its key's fold: the rows then skip the shuffle and sort of every
    column that folding takes (most of an initial load's merge).
    """
    keys = list(schema.primary_key)
    if THRESHOLD not in batch.columns:
        counts = counts if counts is not None else spark_stats(batch, keys, None)
        unique = counts["most"] <= 1
        return ((_unique_rows(batch), False, counts) if unique
                else (_fold_window(batch, keys), True, counts))
    batch = batch.withColumn(
        INSTRUCTION, F.coalesce(col(OP).isin(*INSTRUCTION_OPS), F.lit(False)))
    counts = counts if counts is not None else spark_stats(batch, keys, INSTRUCTION)
    if counts["most"] > 1:
        return _fold_window(batch, [*keys, INSTRUCTION]), True, counts
    rows = _unique_rows(batch.where(~col(INSTRUCTION)))
    if not counts["instructions"]:
        return rows, False, counts
    return rows.unionByName(
        _fold_window(batch.where(col(INSTRUCTION)), [*keys, INSTRUCTION])), False, counts


# ``spark_stats``'s codes of the ops in a packed (position, op) long; any other op is _OTHER_OP.
# (Positions count records from 1: far below 2**60, the most a packed long holds.)
_OP_CODES = (*ROW_OPS, *INSTRUCTION_OPS)
_OTHER_OP = len(_OP_CODES)
_CODES = 8


def spark_stats(batch: DataFrame, keys: list[str], flag: str | None) -> dict[str, int]:
    """One job over the batch, grouped per key as the fold groups it (NULL key parts equal;
    records flagged ``flag`` are instructions, folded apart): what the fold will hold, without
    folding every column. ``records`` read, ``max_pos``, ``newest_ms`` and ``oldest_ms``
    (the newest and oldest commit time), ``instructions`` and
    ``total`` folded records, the final op of the row keys (one count per op), the effects
    (inserted: absent before and present after, and so on) and ``most``, the most row records
    of one key (1: each record is its key's fold).

    A key's final op is its record at the highest ``__cdc_pos`` and its first op the one at
    the lowest, as in ``_fold_window`` (records at one position are one record replayed).
    Each record is one long, its position and its op's code (``_OP_CODES``), so that the
    per-key minimum and maximum are fixed-width (hash) aggregates: ``min_by``/``max_by`` of
    a string op made Spark sort every key of a 1M-row initial load."""
    instruction = col(flag) if flag is not None else F.lit(False)
    code = F.coalesce(*[F.when(col(OP) == op, F.lit(i)) for i, op in enumerate(_OP_CODES)],
                      F.lit(_OTHER_OP))
    packed = col(POS).cast("long") * _CODES + code
    per_key = batch.groupBy(*[col(k) for k in keys], instruction.alias("__cdc_flag")).agg(
        F.count(F.lit(1)).alias("__cdc_n"),
        F.min(packed).alias("__cdc_first"),
        F.max(packed).alias("__cdc_last"),
        F.max(col(TS_MS)).alias(TS_MS),
        F.min(col(TS_MS)).alias("__cdc_oldest"))
    first_op, last_op = col("__cdc_first") % _CODES, col("__cdc_last") % _CODES
    is_instruction = col("__cdc_flag")
    row = ~is_instruction
    existed = first_op != _OP_CODES.index(CREATE)
    exists = last_op != _OP_CODES.index(DELETE)
    aggregates = [
        F.sum(col("__cdc_n")).alias("records"),
        F.max(col("__cdc_last")).alias("max_pos"),  # (packed: decoded below)
        F.max(col(TS_MS)).alias("newest_ms"),
        F.min(col("__cdc_oldest")).alias("oldest_ms"),
        F.count(F.when(is_instruction, 1)).alias("instructions"),
        F.count(F.lit(1)).alias("total"),
        F.max(F.when(row, col("__cdc_n"))).alias("most"),
        *[F.count(F.when(row & (last_op == _OP_CODES.index(op)), 1)).alias(op)
          for op in ROW_OPS],
        F.count(F.when(row & ~existed & exists, 1)).alias("inserted"),
        F.count(F.when(row & existed & exists, 1)).alias("updated"),
        F.count(F.when(row & existed & ~exists, 1)).alias("deleted"),
    ]
    values = per_key.agg(*aggregates).first()
    assert values is not None
    counts = {k: int(v) if v is not None else 0 for k, v in values.asDict().items()}
    counts["max_pos"] //= _CODES
    return counts


# A batch of more records than this (its segments' footers) is counted by Spark's job
# (``spark_stats``): pyarrow holds the keys and three columns of each record in memory.
MAX_ARROW_COUNT_RECORDS = 1_000_000


def arrow_counts(changelog: TableChangelog, plan: BatchPlan, after_pos: int | None,
                  before_pos: int) -> dict[str, int] | None:
    """``spark_stats``'s counts of the batch, read and grouped by pyarrow in this process (the
    keys, position, op and commit time of each record only), or None when Spark's job counts
    it: a batch above ``MAX_ARROW_COUNT_RECORDS``, keys that Arrow would group otherwise
    (``arrow_stats``), a key the newest schema lacks, or values the exact read refuses (the
    Spark path then meets them, and reports them, as before).

    Spark's job was a second read of the batch's segments (the MERGE reads them again):
    1.0-1.2 s of a 5 s merge of 25-30k records under a write load; this read takes tens of
    milliseconds."""
    keys = list(plan.newest.primary_key)
    if plan.rows > MAX_ARROW_COUNT_RECORDS or not keys or \
            any(k not in plan.newest.column_names for k in keys):
        return None
    try:
        records = changelog.arrow_batch(plan, after_pos, before_pos,
                                        columns=[*keys, POS, OP, TS_MS])
        return arrow_stats(records, keys, plan.snapshot_columns)
    except (pa.ArrowException, OSError) as error:
        log.debug("%s: counting the batch with pyarrow failed (%s); Spark counts it",
                  changelog.table_id, error)
        return None


def arrow_stats(records: pa.Table, keys: list[str], instructions: bool
                ) -> dict[str, int] | None:
    """``spark_stats`` by pyarrow over ``records`` (the key columns, ``__cdc_pos``, ``__cdc_op``
    and ``__cdc_ts_ms``): the same counts, grouping the keys as Spark does (NULL key parts
    equal; ``instructions``: the segments have the snapshot columns, and instruction records
    are grouped apart). None for floating-point keys: Spark groups -0.0 with 0.0 and every
    NaN together, Arrow by their bits."""
    if any(pa.types.is_floating(records.schema.field(k).type) for k in keys):
        return None
    ops = records.column(OP)
    code = pc.fill_null(pc.index_in(ops, value_set=pa.array(_OP_CODES, type=ops.type)),
                        _OTHER_OP).cast(pa.int64())
    packed = pc.add(pc.multiply(records.column(POS).cast(pa.int64()), _CODES), code)
    flag = pc.fill_null(pc.is_in(ops, value_set=pa.array(INSTRUCTION_OPS, type=ops.type)),
                        False) if instructions else pa.repeat(False, records.num_rows)
    # (the keys under names of their own: a key column named as an aggregate's output)
    grouped = pa.table([*[records.column(k) for k in keys], flag, packed],
                       names=[*[f"k{i}" for i in range(len(keys))], "flag", "packed"])
    per_key = grouped.group_by([*[f"k{i}" for i in range(len(keys))], "flag"]).aggregate([
        ("packed", "count", pc.CountOptions(mode="all")), ("packed", "min"),
        ("packed", "max")])
    is_instruction = per_key.column("flag").to_numpy(zero_copy_only=False).astype(bool)
    row = ~is_instruction
    n = per_key.column("packed_count").to_numpy(zero_copy_only=False)
    first_op = per_key.column("packed_min").to_numpy(zero_copy_only=False) % _CODES
    last_op = per_key.column("packed_max").to_numpy(zero_copy_only=False) % _CODES
    existed = first_op != _OP_CODES.index(CREATE)
    exists = last_op != _OP_CODES.index(DELETE)
    newest_ms = pc.max(records.column(TS_MS)).as_py()
    oldest_ms = pc.min(records.column(TS_MS)).as_py()
    max_pos = pc.max(records.column(POS)).as_py()
    counts = {
        "records": records.num_rows,
        "max_pos": int(max_pos) if max_pos is not None else 0,
        "newest_ms": int(newest_ms) if newest_ms is not None else 0,
        "oldest_ms": int(oldest_ms) if oldest_ms is not None else 0,
        "instructions": int(np.count_nonzero(is_instruction)),
        "total": per_key.num_rows,
        "most": int(n[row].max()) if row.any() else 0,
        **{op: int(np.count_nonzero(row & (last_op == _OP_CODES.index(op))))
           for op in ROW_OPS},
        "inserted": int(np.count_nonzero(row & ~existed & exists)),
        "updated": int(np.count_nonzero(row & existed & exists)),
        "deleted": int(np.count_nonzero(row & existed & ~exists)),
    }
    return counts


def arrow_fold_for_append(batch: pa.Table, schema: TableSchema, snapshot_columns: bool,
                          table_id: str
                          ) -> tuple[pa.Table, pa.ChunkedArray, dict[str, int]] | None:
    """For an append into an empty target (``lake.arrow_load``): the batch's row records
    folded (each key's newest: ``arrow_fold_latest``), which of them become rows (not deletes,
    not judged away: ``verdicts.asserted_away``), and ``spark_stats``'s counts; None when a record is not one
    this path reads exactly (an unknown op, an instruction without the snapshot columns or
    with bad fields: the Spark path refuses those with its error)."""
    ops = batch.column(OP)
    known = pc.is_in(ops, value_set=pa.array(ROW_OPS + INSTRUCTION_OPS))
    if ops.null_count or not pc.all(known).as_py():
        return None
    is_instruction = pc.is_in(ops, value_set=pa.array(INSTRUCTION_OPS))
    instructions_found = pc.any(is_instruction).as_py()
    if instructions_found and not snapshot_columns:
        return None
    keys = list(schema.primary_key)
    rows = batch.filter(pc.invert(is_instruction)) if instructions_found else batch
    if any(pa.types.is_floating(rows.schema.field(k).type) for k in keys):
        return None  # (Spark groups -0.0 with 0.0 and NaN with NaN: its path folds them)
    # The keys sorted once (lexicographic, NULL first: keys.key_order): a repeat is a
    # neighbour, and the range assertions' intervals are runs (asserted_away).
    order = pc.sort_indices(rows, sort_keys=[(k, "ascending", "at_start") for k in keys])
    ordered = rows.select(keys).take(order)
    if same_as_previous(ordered).any():  # a key with several records: its newest counts
        rows = arrow_fold_latest(rows, keys)
        order = pc.sort_indices(rows, sort_keys=[(k, "ascending", "at_start") for k in keys])
        ordered = rows.select(keys).take(order)
    counts = {op: pc.sum(pc.equal(rows.column(OP), op)).as_py() or 0 for op in ROW_OPS}
    counts["records"] = batch.num_rows
    counts["max_pos"] = int(pc.max(batch.column(POS)).as_py())
    counts["newest_ms"] = int(pc.max(batch.column(TS_MS)).as_py() or 0)
    counts["oldest_ms"] = int(pc.min(batch.column(TS_MS)).as_py() or 0)
    removed = np.zeros(rows.num_rows, dtype=bool)
    if instructions_found:
        found = instructions_of(batch.filter(is_instruction), schema)
        if found is None:
            return None
        cut = intervals(found)
        if any(verdict is not None for _, verdict in cut):
            log.info("%s: applying %d range assertions/sweeps", table_id, len(found))
            removed = asserted_away(rows, order, ordered, cut)
    live = pc.not_equal(rows.column(OP), DELETE)
    kept = pc.and_(live, pa.array(~removed))
    counts["asserted"] = int(np.count_nonzero(
        removed & np.asarray(live.to_numpy(zero_copy_only=False), dtype=bool)))
    return rows, kept, counts


def _unique_rows(rows: DataFrame) -> DataFrame:
    """Records of distinct keys as their own folds: first op their op, one record each."""
    return rows.withColumn(FIRST_OP, col(OP)).withColumn(RECORDS, F.lit(1).cast("long"))


def _fold_window(batch: DataFrame, keys: list[str]) -> DataFrame:
    """``fold`` by sorting each key's records by position (any batch)."""
    history = Window.partitionBy(*[col(k) for k in keys]).orderBy(col(POS).desc()).rowsBetween(
        Window.unboundedPreceding, Window.unboundedFollowing)
    with_first = batch.withColumn(FIRST_OP, F.last(col(OP)).over(history)).withColumn(
        RECORDS, F.count(F.lit(1)).over(history))
    return fold_latest(with_first, keys)
