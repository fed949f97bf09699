"""Snapshot records in the lake: chunk rows (r), range assertions (a) and sweeps (s).

docs/landing-zone.md, "Snapshot records". Assertions and sweeps become deletes in the Iceberg
snapshot that reads them (merge-on-read: position delete files), so the checks read back through
``LakeTable.read`` and, after each materialisation, through a third-party reader (pyiceberg) that
must apply those delete files the same way. The property test drives the real chunk commit rule
(``decide_chunk_commit``) on random histories and compares the lake with a model that replays
every record by position, as ``test_commit_rule`` does.
"""

from __future__ import annotations

import random
import tempfile
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from cdc_platform.capture.gtid import MariadbGtid, MariadbPosition
from cdc_platform.capture.landing.records import HI_OPEN, LO_OPEN, THRESHOLD, hi_column
from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.capture.snapshot.chunks import Chunk, ChunkedTable, ChunkKey
from cdc_platform.capture.snapshot.commit_rule import Commit, Touch, decide_chunk_commit
from cdc_platform.lake.iceberg.maintenance import maintain
from cdc_platform.lake.iceberg.snapshots import mark_of
from cdc_platform.lake.iceberg.table import LakeTable
from cdc_platform.lake.merge import MergeResult
from cdc_platform_tests.lake.helpers import (
    Landing,
    materialise_table,
    schema,
    target_table,
)
from cdc_platform_tests.lake.third_party import assert_third_party_reads_same

S = schema("items", ColumnSpec("id", "int"), ColumnSpec("v", "int"))
T0 = datetime(2024, 3, 31, 1, 59, 59, 999_999)


def run(spark: SparkSession, landing: Landing, warehouse: str, table_schema: TableSchema = S,
        **kwargs: Any) -> MergeResult:
    return materialise_table(spark, landing, warehouse, table_schema, **kwargs)


def target(spark: SparkSession, warehouse: str, table_schema: TableSchema = S) -> LakeTable:
    return target_table(spark, warehouse, table_schema)


def state(spark: SparkSession, warehouse: str, table_schema: TableSchema = S) -> dict:
    """{key tuple: other columns as a tuple}, read through LakeTable.read."""
    keys = table_schema.primary_key
    others = [c for c in table_schema.column_names if c not in keys]
    def plain(value: Any) -> Any:
        return bytes(value) if isinstance(value, bytearray) else value

    return {tuple(plain(row[k]) for k in keys): tuple(row[c] for c in others)
            for row in target(spark, warehouse, table_schema).read().collect()}


def ids(spark: SparkSession, warehouse: str) -> dict[int, int]:
    return {k[0]: v[0] for k, v in state(spark, warehouse).items()}


def row(id_: int, v: int = 0) -> dict:
    return {"id": id_, "v": v}


def assertion(low: tuple | None, high: tuple | None, threshold: int,
              table_schema: TableSchema = S) -> tuple[str, dict]:
    """An ``a`` record for ``(low, high]`` (None: open side)."""
    record: dict[str, Any] = {THRESHOLD: threshold, LO_OPEN: low is None, HI_OPEN: high is None}
    for i, key in enumerate(table_schema.primary_key):
        record[key] = None if low is None else low[i]
        record[hi_column(key)] = None if high is None else high[i]
    return ("a", record)


def sweep(threshold: int) -> tuple[str, dict]:
    return ("s", {THRESHOLD: threshold})


def check_counts(spark: SparkSession, warehouse: str, result: MergeResult,
                 table_schema: TableSchema = S) -> None:
    """The snapshot's row count is exact, the snapshot is the result's, and a third-party
    reader (pyiceberg, applying the position delete files itself) reads the same rows."""
    table = target(spark, warehouse, table_schema)
    snapshot = table.current()
    assert snapshot is not None and snapshot.snapshot_id == result.snapshot_id
    assert result.rows == snapshot.rows == len(state(spark, warehouse, table_schema))
    assert_third_party_reads_same(spark, table)


# ---- examples ------------------------------------------------------------------------------------


def test_orphans_inside_a_chunk_range_are_removed(spark, landing, warehouse):
    landing.segment(S, [("c", row(i, i)) for i in range(1, 11)])  # positions 1..10
    run(spark, landing, warehouse)
    # The chunk (3, 7] read 4 and 6; 5 and 7 are orphans (e.g. deleted by a TRUNCATE).
    first = landing.next_pos
    landing.segment(S, [("r", row(4, 40)), ("r", row(6, 60)), assertion((3,), (7,), first)],
                    snapshot=True)
    result = run(spark, landing, warehouse)
    assert ids(spark, warehouse) == {1: 1, 2: 2, 3: 3, 4: 40, 6: 60, 8: 8, 9: 9, 10: 10}
    assert (result.asserted_deletes, result.deletes, result.snapshot_rows) == (2, 2, 2)
    assert (result.records_read, result.consumed_pos) == (3, landing.next_pos - 1)
    check_counts(spark, warehouse, result)
    # The orphans and the re-read rows' old versions are position deletes of this snapshot:
    # the third-party reader above had to apply them (2 orphans + 2 superseded rows).
    snapshot = result.snapshot.metadata()
    assert snapshot["delete_files"] > 0 and snapshot["added_delete_files"] > 0
    assert snapshot["position_deletes"] == 4


def test_keys_touched_after_the_threshold_are_kept(spark, landing, warehouse):
    landing.segment(S, [("c", row(i, i)) for i in range(1, 6)])  # positions 1..5
    run(spark, landing, warehouse)
    # The chunk (open, 10] read {1, 2, 4}; then, outside its low watermark, the stream updated 3
    # (position 6, so keep_from_pos = 6) and inserted 9. 5 is an orphan.
    landing.segment(S, [("u", row(3, 33)), ("c", row(9, 9))])  # 6, 7
    landing.segment(S, [("r", row(1, 1)), ("r", row(2, 2)), ("r", row(4, 4)),
                        assertion(None, (10,), 6)], snapshot=True)
    result = run(spark, landing, warehouse)
    assert ids(spark, warehouse) == {1: 1, 2: 2, 3: 33, 4: 4, 9: 9}
    assert (result.asserted_deletes, result.deletes) == (1, 1)
    check_counts(spark, warehouse, result)


def test_a_stream_record_after_the_assertion_survives(spark, landing, warehouse):
    landing.segment(S, [("c", row(i, i)) for i in range(1, 4)])  # positions 1..3
    run(spark, landing, warehouse)
    landing.segment(S, [("r", row(1, 10)), assertion((0,), (5,), 4),  # 4, 5
                        ("c", row(2, 20)), ("c", row(4, 40))], snapshot=True)  # 6, 7: later
    result = run(spark, landing, warehouse)
    # 2 and 3 were judged at position 5 (deleted); 2's later insert brings it back.
    assert ids(spark, warehouse) == {1: 10, 2: 20, 4: 40}
    assert result.asserted_deletes == 1  # only 3: 2's latest record is after the threshold
    check_counts(spark, warehouse, result)


def test_an_assertion_judges_rows_committed_by_an_earlier_batch(spark, landing, warehouse):
    landing.segment(S, [("c", row(i, i)) for i in range(1, 5)])  # positions 1..4
    run(spark, landing, warehouse)
    landing.segment(S, [("u", row(4, 44)), ("r", row(1, 10)), ("r", row(2, 20))])  # 5, 6, 7
    run(spark, landing, warehouse)
    assert ids(spark, warehouse) == {1: 10, 2: 20, 3: 3, 4: 44}
    landing.segment(S, [assertion(None, None, 6)], snapshot=True)  # 8: the chunk's assertion
    result = run(spark, landing, warehouse)
    assert ids(spark, warehouse) == {1: 10, 2: 20}
    assert (result.asserted_deletes, result.deletes, result.records_read) == (2, 2, 1)
    assert result.consumed_pos == 8
    check_counts(spark, warehouse, result)


def test_first_chunk_open_low_last_chunk_open_high_and_the_boundary_key(spark, landing,
                                                                       warehouse):
    landing.segment(S, [("c", row(i, i)) for i in (-5, 1, 2, 3, 4, 5, 6, 100)])  # 1..8
    run(spark, landing, warehouse)
    # Chunk 1 is (open, 3], chunk 2 (3, open]: 3 belongs to chunk 1 (committed first, below
    # chunk 2's threshold); chunk 2's low bound is exclusive, so 3 survives it.
    first = landing.next_pos
    landing.segment(S, [("r", row(1, 1)), ("r", row(3, 3)), assertion(None, (3,), first)],
                    snapshot=True)
    second = landing.next_pos
    landing.segment(S, [("r", row(5, 5)), assertion((3,), None, second)], snapshot=True)
    result = run(spark, landing, warehouse)
    assert ids(spark, warehouse) == {1: 1, 3: 3, 5: 5}
    assert result.asserted_deletes == 5  # -5 and 2 by chunk 1; 4, 6 and 100 by chunk 2
    check_counts(spark, warehouse, result)


def test_composite_keys_compare_lexicographically(spark, landing, warehouse):
    table = schema("events", ColumnSpec("a", "int"), ColumnSpec("ts", "datetime", scale=6),
                   ColumnSpec("v", "int"), key=("a", "ts"))
    t = [T0 + timedelta(microseconds=i) for i in range(3)]
    keys = [(1, t[0]), (1, t[1]), (1, t[2]), (2, t[0]), (2, t[1]), (2, t[2]), (3, t[0])]
    landing.segment(table, [("c", {"a": a, "ts": ts, "v": i}) for i, (a, ts) in enumerate(keys)])
    run(spark, landing, warehouse, table)
    # The chunk ((1, t1), (2, t1)] re-read (2, t0) only: (1, t2) and (2, t1) are orphans; (1, t1)
    # is the exclusive low bound, (2, t2) sorts above the high bound.
    first = landing.next_pos
    landing.segment(table, [("r", {"a": 2, "ts": t[0], "v": 30}),
                            assertion((1, t[1]), (2, t[1]), first, table)], snapshot=True)
    result = run(spark, landing, warehouse, table)
    assert state(spark, warehouse, table) == {
        (1, t[0]): (0,), (1, t[1]): (1,), (2, t[0]): (30,), (2, t[2]): (5,), (3, t[0]): (6,),
    }
    assert result.asserted_deletes == 2
    check_counts(spark, warehouse, result, table)


KEY_VALUES = [
    pytest.param("int", {}, [-(2**40), -1, 0, 2**40], id="int"),
    pytest.param("uint64", {}, [Decimal(0), Decimal(2**63 - 1), Decimal(2**63),
                                Decimal(2**64 - 1)], id="bigint-unsigned"),
    pytest.param("decimal", {"precision": 12, "scale": 3},
                 [Decimal("-1.001"), Decimal("-1.000"), Decimal("0.999"), Decimal("12.5")],
                 id="decimal"),
    pytest.param("double", {}, [-1e300, -0.5, 0.25, 1e300], id="double"),
    pytest.param("date", {}, [date(1000, 1, 1), date(1969, 12, 31), date(1970, 1, 1),
                              date(9999, 12, 31)], id="date"),
    pytest.param("datetime", {"scale": 6}, [datetime(1000, 1, 1), T0, T0 + timedelta(
        microseconds=1), datetime(9999, 12, 31, 23, 59, 59)], id="datetime"),
    pytest.param("timestamp", {"scale": 6}, [datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC),
                                             datetime(2024, 10, 27, 0, 30, tzinfo=UTC),
                                             datetime(2024, 10, 27, 1, 30, tzinfo=UTC),
                                             datetime(2038, 1, 19, 3, 14, 8, tzinfo=UTC)],
                 id="timestamp"),
    pytest.param("bit", {"precision": 64}, [Decimal(1), Decimal(2), Decimal(2**63),
                                            Decimal(2**64 - 1)], id="bit64"),
    pytest.param("binary", {}, [b"", b"\x00", b"\x7f\xff", b"\x80"], id="binary"),
]


@pytest.mark.parametrize(("kind", "options", "values"), KEY_VALUES)
def test_range_bounds_of_every_orderable_key_kind(spark, landing, warehouse, kind, options,
                                                  values):
    table = schema("keyed", ColumnSpec("k", kind, **options), ColumnSpec("id", "int"),
                   key=("k",))
    changes = [("c", {"k": value, "id": i}) for i, value in enumerate(values)]
    changes.append(assertion((values[0],), (values[2],), len(values) + 1, table))
    landing.segment(table, changes, snapshot=True)
    result = run(spark, landing, warehouse, table)  # the first snapshot: rows and deletes
    assert sorted(v[0] for v in state(spark, warehouse, table).values()) == [0, 3]
    assert result.asserted_deletes == 2
    check_counts(spark, warehouse, result, table)


def test_sweep_removes_keys_older_than_the_threshold_and_keeps_newer(spark, landing, warehouse):
    landing.segment(S, [("c", row(i, i)) for i in range(1, 6)])  # positions 1..5
    run(spark, landing, warehouse)
    opening = landing.next_pos  # the session opens at position 6
    landing.segment(S, [("u", row(2, 22)), ("r", row(1, 1)), ("r", row(3, 3)),  # 6, 7, 8
                        sweep(opening), ("c", row(7, 7))], snapshot=True)  # 9, 10
    result = run(spark, landing, warehouse)
    assert ids(spark, warehouse) == {1: 1, 2: 22, 3: 3, 7: 7}
    assert (result.asserted_deletes, result.deletes) == (2, 2)
    check_counts(spark, warehouse, result)


def test_the_first_materialisation_may_be_a_snapshot(spark, landing, warehouse):
    # A stream record from before the snapshot session whose delete the changelog never saw
    # (TRUNCATE), then the whole table as one chunk.
    landing.segment(S, [("c", row(9, 9)), ("r", row(1, 1)), ("r", row(2, 2)),  # 1, 2, 3
                        assertion(None, None, 2)], snapshot=True)  # 4
    result = run(spark, landing, warehouse)
    assert ids(spark, warehouse) == {1: 1, 2: 2}
    assert (result.committed, result.rows, result.asserted_deletes, result.snapshot_rows) == (
        True, 2, 1, 2)
    # one MERGE into the empty table: key 9 is asserted away in the batch, never written
    assert result.snapshot.metadata()["records"] == 2
    check_counts(spark, warehouse, result)
    landing.segment(S, [("c", row(5, 5))])
    again = run(spark, landing, warehouse)
    assert again.rows == 3
    assert ids(spark, warehouse) == {1: 1, 2: 2, 5: 5}
    check_counts(spark, warehouse, again)


def test_a_snapshot_of_an_empty_range_deletes_nothing_it_should_not(spark, landing, warehouse):
    landing.segment(S, [("r", row(1, 1)), assertion((1,), (5,), 2)], snapshot=True)
    result = run(spark, landing, warehouse)
    assert ids(spark, warehouse) == {1: 1}
    assert (result.asserted_deletes, result.rows) == (0, 1)
    assert result.snapshot.metadata()["delete_files"] == 0
    check_counts(spark, warehouse, result)


def test_asserted_deletes_are_applied_by_compaction(spark, landing, warehouse):
    landing.segment(S, [("c", row(i, i)) for i in range(1, 9)])  # positions 1..8
    run(spark, landing, warehouse)
    landing.segment(S, [("r", row(2, 2)), assertion(None, (4,), 9), ("c", row(20, 20))],
                    snapshot=True)
    result = run(spark, landing, warehouse)
    assert ids(spark, warehouse) == {2: 2, 5: 5, 6: 6, 7: 7, 8: 8, 20: 20}
    assert result.asserted_deletes == 3
    assert result.snapshot.metadata()["position_deletes"] == 4  # 1, 3, 4 and the old 2
    check_counts(spark, warehouse, result)
    table = target(spark, warehouse)
    maintain(table, datetime.now() + timedelta(hours=1), retain_last=1)
    compacted = table.current()
    assert compacted.metadata()["position_deletes"] == 0 and compacted.rows == 6
    assert compacted.consumed_pos == result.consumed_pos
    assert ids(spark, warehouse) == {2: 2, 5: 5, 6: 6, 7: 7, 8: 8, 20: 20}
    assert_third_party_reads_same(spark, table)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        pytest.param(assertion((1,), (2,), 99), "above its own position", id="threshold>pos"),
        pytest.param(("a", {THRESHOLD: 1}), "lacks __cdc_lo_open", id="no-bounds"),
        pytest.param(("s", {}), "has no __cdc_threshold", id="no-threshold"),
    ],
)
def test_malformed_instructions_are_refused_and_nothing_is_committed(spark, landing, warehouse,
                                                                     record, message):
    landing.segment(S, [("c", row(1, 1))])
    first = run(spark, landing, warehouse)
    snapshots = len(target(spark, warehouse).snapshots())
    landing.segment(S, [("r", row(1, 1)), record], snapshot=True)
    with pytest.raises(ValueError, match=message):
        run(spark, landing, warehouse)
    assert target(spark, warehouse).current().snapshot_id == first.snapshot_id
    assert len(target(spark, warehouse).snapshots()) == snapshots


def test_instructions_in_a_segment_without_the_snapshot_columns_are_refused(spark, landing,
                                                                            warehouse):
    landing.segment(S, [("r", row(1, 1)), ("a", {"id": 0})])
    with pytest.raises(ValueError, match="segments without the __cdc_threshold"):
        run(spark, landing, warehouse)
    table = target(spark, warehouse)
    assert mark_of(table.history()) is None and table.read().count() == 0


def test_range_assertions_on_text_keys_are_refused(spark, landing, warehouse):
    table = schema("named", ColumnSpec("name", "string"), ColumnSpec("v", "int"), key=("name",))
    landing.segment(table, [("r", {"name": "b", "v": 1}), assertion(("a",), ("c",), 1, table)],
                    snapshot=True)
    with pytest.raises(ValueError, match="do not sort in the lake as at the source"):
        run(spark, landing, warehouse, table)


def test_a_sweep_needs_no_key_order(spark, landing, warehouse):
    table = schema("named", ColumnSpec("name", "string"), ColumnSpec("v", "int"), key=("name",))
    landing.segment(table, [("c", {"name": "x", "v": 0}), ("r", {"name": "b", "v": 1}),
                            sweep(2)], snapshot=True)
    result = run(spark, landing, warehouse, table)
    assert state(spark, warehouse, table) == {("b",): (1,)}
    assert result.asserted_deletes == 1


def test_a_batch_without_instructions_runs_no_extra_spark_job(spark, tmp_path):
    """(Spark's MERGE: a merge without Spark runs no job at all)"""
    def jobs(landing: Landing, warehouse: str, changes: list, snapshot: bool) -> int:
        landing.segment(S, changes, snapshot=snapshot)
        group = f"jobs-{random.getrandbits(32)}"
        spark.sparkContext.setJobGroup(group, "counting jobs")
        try:
            run(spark, landing, warehouse, spark_free=False)
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
        return len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))

    counts = []
    for name, snapshot, changes in [
        ("plain", False, [("u", row(1, 2)), ("c", row(3, 3))]),
        ("rows", True, [("r", row(1, 2)), ("r", row(3, 3))]),
        ("asserted", True, [("r", row(1, 2)), ("r", row(3, 3)), assertion(None, None, 3)]),
    ]:
        landing = Landing(tmp_path / name / "landing")
        warehouse = str(tmp_path / name / "warehouse")
        landing.segment(S, [("c", row(1, 1)), ("c", row(2, 2))])
        run(spark, landing, warehouse)
        counts.append(jobs(landing, warehouse, changes, snapshot))
    plain, rows, asserted = counts
    assert plain == rows < asserted


def test_an_initial_append_judges_its_assertions_in_its_own_scan(spark, tmp_path):
    """Into an empty target, range assertions cost collecting them, not a count of tombstones
    over the whole batch besides: the keys they delete are filtered out of the
    append itself, and still reported as asserted deletes."""
    def load(name: str, changes: list) -> tuple[MergeResult, int, str]:
        landing = Landing(tmp_path / name / "landing")
        warehouse = str(tmp_path / name / "warehouse")
        landing.segment(S, changes, snapshot=True)
        group = f"jobs-{random.getrandbits(32)}"
        spark.sparkContext.setJobGroup(group, "counting jobs")
        try:  # (Spark's own initial append: lake.arrow_load's is in test_arrow_load)
            result = run(spark, landing, warehouse, spark_free=False)
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
        return result, len(spark.sparkContext.statusTracker().getJobIdsForGroup(group)), warehouse

    rows = [("r", row(i, i)) for i in range(1, 6)]  # positions 1..5
    plain, plain_jobs, _ = load("plain", rows)
    # 9 and 6: stream records (positions 6, 7) whose deletes the changelog never saw; the
    # chunk (5, 10] read 7 alone (at 8), asserted at 9 with threshold 8
    asserted, asserted_jobs, warehouse = load(
        "asserted", [*rows, ("c", row(9, 9)), ("c", row(6, 6)), ("r", row(7, 70)),
                     assertion((5,), (10,), 8)])
    assert (plain.appended, plain.asserted_deletes, plain.rows) == (True, 0, 5)
    assert (asserted.appended, asserted.asserted_deletes, asserted.rows) == (True, 2, 6)
    assert ids(spark, warehouse) == {1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 7: 70}
    check_counts(spark, warehouse, asserted)
    # collecting the instructions, and the shuffle stage of their fold (adaptive execution
    # runs it as a job); with the tombstones counted first it was 7 jobs more, not 2
    assert asserted_jobs <= plain_jobs + 2


def test_an_initial_append_of_distinct_keys_shuffles_nothing(spark, tmp_path):
    """Snapshot rows of distinct keys skip the fold, and their append skips the REBALANCE
    too: the INSERT's plan has no exchange. A batch that folds (a key twice) shuffles, and
    its append is rebalanced."""
    store = spark._jsparkSession.sharedState().statusStore()  # (the SQL tab's executions)

    def insert_plan(name: str, changes: list) -> str:
        landing = Landing(tmp_path / name / "landing")
        landing.segment(S, changes, snapshot=True)
        def executions() -> list:
            found = store.executionsList()  # (the newest retained: spark.sql.ui.retained...)
            return [found.apply(i) for i in range(found.size())]

        before = max((e.executionId() for e in executions()), default=-1)
        result = run(spark, landing, str(tmp_path / name / "warehouse"), spark_free=False)
        assert result.appended
        plans = [e.physicalPlanDescription() for e in
                 sorted(executions(), key=lambda e: e.executionId())
                 if e.executionId() > before]
        # (the last: creating the table writes its first, empty, snapshot before)
        appends = [p for p in plans if "AppendData" in p]
        assert appends, plans
        return appends[-1]

    assert "Exchange" not in insert_plan("distinct", [("r", row(i, i)) for i in range(50)])
    folded = insert_plan("folded", [("r", row(1, 1)), ("u", row(1, 2)), ("r", row(2, 2))])
    assert "RebalancePartitions" in folded or "REBALANCE" in folded.upper(), folded


# ---- random histories through the real commit rule -------------------------------------------

E = schema("events", ColumnSpec("a", "int"), ColumnSpec("ts", "datetime", scale=6),
           ColumnSpec("v", "int"), key=("a", "ts"))
CHUNKED = ChunkedTable(E, ChunkKey(("a", "ts"), (False, False), "primary key"))


def key_of(index: int) -> tuple[int, datetime]:
    """Key indexes map to composite keys in the same order (a first, then ts)."""
    return (index // 3, T0 + timedelta(microseconds=7 * (index % 3)))


def bound_of(index: int | None) -> tuple[int, datetime] | None:
    return None if index is None else key_of(index)


def in_range(key: tuple, low: tuple | None, high: tuple | None) -> bool:
    return (low is None or key > low) and (high is None or key <= high)


def model_fold(records: list[dict]) -> dict[tuple, int]:
    """The lake as a replay by position: an assertion or sweep at position P deletes the keys
    (in its range) whose latest record before P is below its threshold."""
    state: dict[tuple, tuple[int | None, int]] = {}
    for record in sorted(records, key=lambda r: r["pos"]):
        if record["op"] in "cur":
            state[record["key"]] = (record["v"], record["pos"])
        elif record["op"] == "d":
            state[record["key"]] = (None, record["pos"])
        else:
            for key, (value, position) in list(state.items()):
                if value is not None and position < record["threshold"] and (
                    record["op"] == "s" or in_range(key, record["low"], record["high"])
                ):
                    state[key] = (None, record["pos"])
    return {k: v for k, (v, _) in state.items() if v is not None}


@st.composite
def histories(draw: st.DrawFn) -> dict[str, Any]:
    """A source, a changelog (garbage, stream, chunk commits by the real rule, maybe a sweep)
    and the source's final state. MariaDB with exact watermarks: a chunk read after
    ``txns[:read]`` has ``lw = after`` = those transactions and commits at any later point."""
    n_keys = draw(st.integers(1, 8))
    keys = st.integers(0, n_keys - 1)
    values = iter(range(100, 100_000))
    source = {k: next(values) for k in draw(st.sets(keys))}
    # Keys the lake holds from history the changelog lost (a TRUNCATE, a reset source...).
    garbage = draw(st.sets(keys, min_size=1))
    if draw(st.booleans()):
        garbage |= set(range(n_keys)) - set(source)  # orphans: rows the source no longer has
    n_txns = draw(st.integers(0, 10))
    txns = [draw(st.lists(st.tuples(keys, st.booleans()), min_size=1, max_size=3))
            for _ in range(n_txns)]
    txns = [[(k, None if delete else next(values)) for k, delete in t] for t in txns]
    opening = draw(st.integers(0, n_txns))
    size = draw(st.integers(1, n_keys + 1))
    bounds = list(range(size - 1, n_keys - 1, size))
    ranges = list(zip([None, *bounds], [*bounds, None], strict=True))
    chunks = []
    for low, high in ranges:
        read = draw(st.integers(opening, n_txns))
        chunks.append((low, high, read, draw(st.integers(read, n_txns))))
    shuffle = draw(st.randoms(use_true_random=False))
    asserted, swept = draw(st.booleans()), draw(st.booleans())

    records: list[dict] = []
    pos = 1
    for k in sorted(garbage):
        records.append({"op": "c", "key": key_of(k), "v": -1 - k, "pos": pos})
        pos += 1
    states = [dict(source)]
    for txn in txns:
        after = dict(states[-1])
        for k, value in txn:
            if value is None:
                after.pop(k, None)
            else:
                after[k] = value
        states.append(after)
    gtids = [MariadbGtid(0, 1, i + 1) for i in range(n_txns)]
    touched: dict[tuple, list[Touch]] = {}
    opening_pos = pos
    for point in range(n_txns + 1):
        if point:
            current = dict(states[point - 1])
            for k, value in txns[point - 1]:
                if value is None and k not in current:
                    continue  # deleting a missing row logs no row event
                op = "d" if value is None else ("u" if k in current else "c")
                records.append({"op": op, "key": key_of(k), "v": value, "pos": pos})
                if point > opening:
                    touched.setdefault(key_of(k), []).append(Touch(gtids[point - 1], pos))
                pos += 1
                if value is None:
                    current.pop(k)
                else:
                    current[k] = value
        if point == opening:
            opening_pos = pos
        due = [c for c in chunks if c[3] == point]
        shuffle.shuffle(due)
        for low, high, read, _ in due:
            seen = MariadbPosition.from_gtids(gtids[:read])
            rows = tuple((*key_of(k), v) for k, v in sorted(states[read].items())
                         if in_range(key_of(k), bound_of(low), bound_of(high)))
            chunk = Chunk(CHUNKED, rows, bound_of(low), bound_of(high), seen, seen, "fp", None,
                          True)
            decision = decide_chunk_commit(
                chunk, MariadbPosition.from_gtids(gtids[:point]),
                MariadbPosition.from_gtids(gtids[:opening]), MariadbPosition(), touched, "fp")
            assert isinstance(decision, Commit)
            first = pos
            for a, ts, v in decision.rows_to_emit:
                records.append({"op": "r", "key": (a, ts), "v": v, "pos": pos})
                pos += 1
            if asserted and decision.assertion is not None:
                records.append({"op": "a", "low": decision.assertion.range_low,
                                "high": decision.assertion.range_high, "pos": pos,
                                "threshold": decision.assertion.threshold(first)})
                pos += 1
    if swept:
        records.append({"op": "s", "threshold": opening_pos, "pos": pos})
        pos += 1
    n_cuts = draw(st.integers(0, 2))  # materialisations between records
    cuts = sorted(set(draw(st.lists(st.integers(1, pos - 1), min_size=n_cuts,
                                    max_size=n_cuts))))
    truth = {key_of(k): v for k, v in states[-1].items()}
    return {"records": records, "cuts": cuts, "truth": truth, "exact": asserted or swept}


def landing_row(record: dict) -> tuple[str, dict, int]:
    op = record["op"]
    if op == "s":
        return (op, {THRESHOLD: record["threshold"]}, record["pos"])
    if op == "a":
        return (*assertion(record["low"], record["high"], record["threshold"], E), record["pos"])
    a, ts = record["key"]
    return (op, {"a": a, "ts": ts, "v": record["v"]}, record["pos"])


@pytest.mark.parametrize("arrow_load", [True, False], ids=["arrow-initial-load", "spark-only"])
@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(history=histories())
def test_the_lake_folds_random_snapshot_histories_like_the_model(spark, arrow_load, history):
    """Both ways into an empty target (lake.arrow_load's append without Spark, where it
    applies, and Spark's) give the model's result."""
    records, truth = history["records"], history["truth"]
    with tempfile.TemporaryDirectory() as tmp:
        landing = Landing(Path(tmp) / "landing")
        warehouse = str(Path(tmp) / "warehouse")
        bounds = [0, *history["cuts"], len(records) + 1]
        batches = [[r for r in records if lo < r["pos"] <= hi]
                   for lo, hi in zip(bounds, bounds[1:], strict=False)]
        done: list[dict] = []
        results = []
        for batch in batches:
            if not batch:
                continue
            landing.segment(E, [landing_row(r) for r in batch], snapshot=True)
            done += batch
            results.append(run(spark, landing, warehouse, E, spark_free=arrow_load))
            lake = {k: v[0] for k, v in state(spark, warehouse, E).items()}
            assert lake == model_fold(done)
            assert results[-1].rows == len(lake)
        if records and history["exact"]:
            assert {k: v[0] for k, v in state(spark, warehouse, E).items()} == truth
    event(f"materialisations: {len(results)}")
    event("appended without Spark: " + ("yes" if any(
        r.appended and "spark.app.id" not in r.snapshot.summary for r in results) else "no"))
    event(f"asserted deletes: {'some' if any(r.asserted_deletes for r in results) else 'none'}")
    event(f"sweep: {'yes' if any(r['op'] == 's' for r in records) else 'no'}")
    later = any(r["op"] in "cud" and any(a["op"] in "as" and a["pos"] < r["pos"] for a in b)
                for b in batches for r in b)
    event(f"stream record after an assertion in its batch: {'yes' if later else 'no'}")
