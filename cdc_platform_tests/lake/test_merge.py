"""Materialisation into Iceberg tables: folding by position, idempotence, crashes, schema
evolution, time travel, merge-on-read, maintenance, and a third-party reader (pyiceberg) that
must read exactly what Spark reads."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import DecimalType, DoubleType, LongType, StringType

from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.lake import fold, merge
from cdc_platform.lake.iceberg.catalog import quote
from cdc_platform.lake.iceberg.hadoop import LocalHadoopCatalog
from cdc_platform.lake.iceberg.lake import Lake
from cdc_platform.lake.iceberg.maintenance import maintain
from cdc_platform.lake.iceberg.schema import SchemaEvolutionError, evolve
from cdc_platform.lake.iceberg.snapshots import CONSUMED_GTID, CONSUMED_POS, mark_of
from cdc_platform.lake.iceberg.table import LakeTable
from cdc_platform.lake.merge import MergeResult, materialise
from cdc_platform_tests.lake.helpers import (
    SERVER,
    Landing,
    materialise_table,
    rows_of,
    schema,
    target_table,
)
from cdc_platform_tests.lake.third_party import assert_third_party_reads_same, third_party_rows

S = schema("orders")


def run(spark: SparkSession, landing: Landing, warehouse: str, table_schema: TableSchema = S,
        **kwargs: Any) -> MergeResult:
    return materialise_table(spark, landing, warehouse, table_schema, **kwargs)


def target(spark: SparkSession, warehouse: str, table_schema: TableSchema = S) -> LakeTable:
    return target_table(spark, warehouse, table_schema)


def state(spark: SparkSession, warehouse: str, table_schema: TableSchema = S) -> dict:
    """{id: row} as Spark reads the table; pyiceberg must read the same rows."""
    table = target(spark, warehouse, table_schema)
    assert_third_party_reads_same(spark, table)
    return rows_of(table.read())


def r(id_: int, name: str | None = None, amount: str | None = None) -> dict:
    return {"id": id_, "name": name, "amount": None if amount is None else Decimal(amount)}


def test_batches_of_inserts_updates_deletes_fold_to_the_source_state(spark, landing, warehouse):
    landing.segment(S, [("c", r(1, "a", "1.00")), ("c", r(2, "b", "2.00")),
                        ("c", r(3, "c", "3.00"))])
    first = run(spark, landing, warehouse)
    assert first.committed and first.attempts == 1
    assert (first.rows, first.inserts, first.records_read) == (3, 3, 3)
    table = target(spark, warehouse)
    after_first = len(table.history())
    landing.segment(S, [("u", r(1, "a2", "1.50")), ("d", {"id": 2}), ("c", r(4, "d", "4.00"))])
    second = run(spark, landing, warehouse)
    assert second.rows == 3
    assert (second.inserts, second.updates, second.deletes) == (1, 1, 1)
    assert second.snapshot is not None and second.snapshot.parent_id == first.snapshot_id
    assert state(spark, warehouse) == {1: r(1, "a2", "1.50"), 3: r(3, "c", "3.00"),
                                       4: r(4, "d", "4.00")}
    landing.segment(S, [("d", {"id": 3}), ("u", r(4, "d2", "4.40"))])
    landing.segment(S, [("c", r(5, "e", "5.00"))])
    third = run(spark, landing, warehouse)
    assert (third.rows, third.records_read) == (3, 3)
    assert state(spark, warehouse) == {
        1: r(1, "a2", "1.50"), 4: r(4, "d2", "4.40"), 5: r(5, "e", "5.00"),
    }
    assert third.consumed_pos == landing.next_pos - 1
    assert third.consumed_gtid == f"0-1-{landing.txn}"
    # one snapshot on main per materialisation, each the child of the one before
    history = table.history()
    assert len(history) == after_first + 2
    assert [s.snapshot_id for s in history[:3]] == [
        third.snapshot_id, second.snapshot_id, first.snapshot_id]
    current = table.current()
    assert current is not None and current.snapshot_id == third.snapshot_id
    assert current.rows == 3 and current.operation == "overwrite"
    assert current.metadata()["delete_files"] > 0  # merge-on-read: deletes are files


def test_nothing_new_commits_nothing(spark, landing, warehouse):
    landing.segment(S, [("c", r(1, "a", "1.00"))])
    first = run(spark, landing, warehouse)
    snapshots = len(target(spark, warehouse).snapshots())
    landing.checkpoint()  # the checkpoint moves on (other tables), this table has nothing new
    again = run(spark, landing, warehouse)
    assert not again.committed
    assert (again.snapshot_id, again.rows, again.records_read) == (first.snapshot_id, 1, 0)
    assert (again.consumed_pos, again.consumed_gtid) == (first.consumed_pos, first.consumed_gtid)
    assert len(target(spark, warehouse).snapshots()) == snapshots


def test_the_consumed_mark_is_in_the_snapshot_summary_and_a_rerun_commits_nothing(
    spark, landing, warehouse
):
    landing.segment(S, [("c", r(1, "a", "1.00")), ("c", r(2, "b", "2.00"))])
    first = run(spark, landing, warehouse)
    table = target(spark, warehouse)
    summary = table.current().summary
    assert summary[CONSUMED_POS] == "2" == str(first.consumed_pos)
    assert summary[CONSUMED_GTID] == "0-1-2" == first.consumed_gtid
    # the mark is Iceberg metadata any engine sees: here, Spark's snapshots metadata table
    (row,) = spark.sql(f"SELECT summary FROM {table.metadata_table('snapshots')} "
                       f"WHERE snapshot_id = {first.snapshot_id}").collect()
    assert row.summary[CONSUMED_POS] == "2"
    for _ in range(2):
        again = run(spark, landing, warehouse)
        assert not again.committed
        assert again.snapshot_id == first.snapshot_id
        assert table.current().snapshot_id == first.snapshot_id
    landing.segment(S, [("u", r(1, "a2", "1.00"))])
    second = run(spark, landing, warehouse)
    assert second.committed and second.records_read == 1
    assert table.current().summary[CONSUMED_POS] == "3"
    assert run(spark, landing, warehouse).snapshot_id == second.snapshot_id


def test_a_key_updated_several_times_in_one_batch_keeps_the_highest_position(
    spark, landing, warehouse
):
    # Rows deliberately out of position order inside the file: position decides, not file order.
    landing.segment(S, [("u", r(1, "third", "3.00"), 3), ("c", r(1, "first", "1.00"), 1),
                        ("u", r(1, "second", "2.00"), 2), ("c", r(2, "x", "0.00"), 4)])
    landing.segment(S, [("u", r(2, "y", "0.10")), ("u", r(2, "z", "0.20"))])
    result = run(spark, landing, warehouse)
    assert state(spark, warehouse) == {1: r(1, "third", "3.00"), 2: r(2, "z", "0.20")}
    # Both keys were created inside the batch: their effect on the target is an insert each.
    assert (result.rows, result.records_read, result.updates, result.inserts) == (2, 6, 0, 2)


def test_delete_then_reinsert(spark, landing, warehouse):
    landing.segment(S, [("c", r(1, "a", "1.00")), ("c", r(2, "b", "2.00"))])
    run(spark, landing, warehouse)
    # within one batch
    landing.segment(S, [("d", {"id": 1}), ("c", r(1, "a-again", "1.10"))])
    result = run(spark, landing, warehouse)
    # Key 1 existed before the batch and exists after it: an update of the target.
    assert (result.rows, result.updates, result.inserts, result.deletes) == (2, 1, 0, 0)
    # across batches
    landing.segment(S, [("d", {"id": 2})])
    assert run(spark, landing, warehouse).rows == 1
    assert state(spark, warehouse) == {1: r(1, "a-again", "1.10")}
    landing.segment(S, [("c", r(2, "b-again", "2.20"))])
    assert run(spark, landing, warehouse).rows == 2
    assert state(spark, warehouse) == {1: r(1, "a-again", "1.10"), 2: r(2, "b-again", "2.20")}


def test_replayed_records_have_no_duplicate_effect(spark, landing, warehouse):
    landing.segment(S, [("c", r(1, "a", "1.00"), 1), ("u", r(1, "b", "2.00"), 2)])
    # at-least-once: the engine replays positions 1..2 in another segment of the same batch
    landing.segment(S, [("c", r(1, "a", "1.00"), 1), ("u", r(1, "b", "2.00"), 2),
                        ("c", r(2, "x", "9.00"), 3)])
    first = run(spark, landing, warehouse)
    assert (first.rows, first.records_read) == (2, 5)
    landing.segment(S, [("u", r(1, "c", "3.00"), 4)])
    run(spark, landing, warehouse)
    # a replay of already consumed positions in a later segment: ignored by position
    landing.segment(S, [("u", r(1, "b", "2.00"), 2), ("d", {"id": 2}, 3),
                        ("c", r(3, "new", "0.00"), 5)])
    result = run(spark, landing, warehouse)
    assert (result.records_read, result.rows) == (1, 3)
    assert state(spark, warehouse) == {
        1: r(1, "c", "3.00"), 2: r(2, "x", "9.00"), 3: r(3, "new", "0.00"),
    }


def test_records_at_or_after_the_checkpoint_are_ignored(spark, landing, warehouse):
    landing.segment(S, [("c", r(1, "a", "1.00")), ("c", r(2, "b", "2.00"))])  # pos 1, 2
    # a segment straddling the checkpoint, and one entirely after it (crash left-over)
    landing.segment(S, [("u", r(1, "a2", "1.10")), ("u", r(2, "b2", "2.20"))], checkpoint=False)
    landing.segment(S, [("c", r(9, "ghost", "9.99"))], checkpoint=False)
    landing.checkpoint(next_pos=4)
    result = run(spark, landing, warehouse)
    assert (result.records_read, result.consumed_pos) == (3, 3)
    assert state(spark, warehouse) == {1: r(1, "a2", "1.10"), 2: r(2, "b", "2.00")}
    landing.checkpoint()
    result = run(spark, landing, warehouse)
    assert (result.records_read, result.rows) == (2, 3)
    assert state(spark, warehouse)[2] == r(2, "b2", "2.20")


@pytest.mark.parametrize("spark_free", [True, False], ids=["spark-free", "spark"])
def test_a_crash_before_the_commit_leaves_the_previous_snapshot(
    spark, landing, warehouse, monkeypatch, spark_free
):
    landing.segment(S, [("c", r(1, "a", "1.00"))])
    first = run(spark, landing, warehouse)
    landing.segment(S, [("u", r(1, "b", "2.00")), ("c", r(2, "c", "3.00"))])

    def crash(*args, **kwargs):
        raise SystemExit("killed before the commit")

    # (Spark's MERGE, or the catalog commit of the row delta pyiceberg wrote: its data and
    # delete files, manifests and manifest list are written by then)
    monkeypatch.setattr(LocalHadoopCatalog if spark_free else merge,
                        "commit_table" if spark_free else "commit_merge", crash)
    with pytest.raises(SystemExit):
        run(spark, landing, warehouse, spark_free=spark_free)
    monkeypatch.undo()
    table = target(spark, warehouse)
    assert table.current().snapshot_id == first.snapshot_id
    assert state(spark, warehouse) == {1: r(1, "a", "1.00")}
    result = run(spark, landing, warehouse)
    assert result.committed and (result.rows, result.records_read) == (2, 2)
    assert result.snapshot.parent_id == first.snapshot_id
    assert state(spark, warehouse) == {1: r(1, "b", "2.00"), 2: r(2, "c", "3.00")}


def test_a_crash_between_the_merge_and_the_publication_leaves_main_unchanged(
    spark, landing, warehouse, monkeypatch
):
    """The MERGE has written its files and snapshot on the private branch; the writer dies
    before ``fast_forward``: main, and so every reader, still sees the previous snapshot."""
    landing.segment(S, [("c", r(1, "a", "1.00"))])
    first = run(spark, landing, warehouse)
    landing.segment(S, [("u", r(1, "b", "2.00")), ("c", r(2, "c", "3.00"))])
    real_sql = Lake.sql

    def crash_at_publication(self, statement):
        if "fast_forward" in statement:
            raise SystemExit("killed after the MERGE, before fast_forward")
        return real_sql(self, statement)

    monkeypatch.setattr(Lake, "sql", crash_at_publication)
    with pytest.raises(SystemExit):
        run(spark, landing, warehouse, spark_free=False)
    monkeypatch.undo()
    table = target(spark, warehouse)
    unpublished = [s for s in table.snapshots() if s.consumed_pos == 3]
    assert len(unpublished) == 1  # the MERGE did commit, on its branch
    assert table.current().snapshot_id == first.snapshot_id
    assert unpublished[0].snapshot_id not in {s.snapshot_id for s in table.history()}
    assert state(spark, warehouse) == {1: r(1, "a", "1.00")}
    result = run(spark, landing, warehouse)
    assert result.committed and result.attempts == 1 and result.records_read == 2
    assert result.snapshot.parent_id == first.snapshot_id
    assert state(spark, warehouse) == {1: r(1, "b", "2.00"), 2: r(2, "c", "3.00")}


def test_add_column_mid_stream_and_drop_column(spark, landing, warehouse):
    v1 = schema("orders")
    landing.segment(v1, [("c", r(1, "a", "1.00")), ("c", r(2, "b", "2.00")),
                         ("c", r(3, "c", "3.00"))])
    run(spark, landing, warehouse)
    v2 = schema("orders", *v1.columns, ColumnSpec("email", "string"))
    # ALTER TABLE ... ADD COLUMN email inside a batch: old-schema records, then new-schema ones
    landing.segment(v1, [("u", r(3, "c2", "3.30"))])
    landing.segment(v2, [("u", {**r(2, "b", "2.00"), "email": "b@x"}),
                         ("c", {**r(4, "d", "4.00"), "email": "d@x"})])
    result = run(spark, landing, warehouse, v2)
    assert result.schema_changed and result.rows == 4
    table = target(spark, warehouse)
    df = table.read()
    assert df.columns == ["id", "name", "amount", "email"]
    assert df.schema["email"].dataType == StringType()
    assert {k: v["email"] for k, v in state(spark, warehouse).items()} == {
        1: None, 2: "b@x", 3: None, 4: "d@x",
    }
    assert rows_of(df)[3]["name"] == "c2"
    # DROP COLUMN name: it disappears from the target (older snapshots keep it)
    before_drop = table.current().snapshot_id
    v3 = schema("orders", v2.columns[0], v2.columns[2], v2.columns[3])
    landing.segment(v3, [("u", {"id": 1, "amount": Decimal("1.11"), "email": "a@x"})])
    result = run(spark, landing, warehouse, v3)
    assert result.schema_changed and not run(spark, landing, warehouse, v3).schema_changed
    df = table.read()
    assert df.columns == ["id", "amount", "email"]
    assert [(row.id, row.amount, row.email) for row in df.orderBy("id").collect()] == [
        (1, Decimal("1.11"), "a@x"), (2, Decimal("2.00"), "b@x"), (3, Decimal("3.30"), None),
        (4, Decimal("4.00"), "d@x"),
    ]
    assert_third_party_reads_same(spark, table)
    assert "name" in table.read(snapshot_id=before_drop).columns
    assert_third_party_reads_same(spark, table, snapshot_id=before_drop)


def test_type_widening_is_schema_evolution(spark, landing, warehouse):
    """Promotions Iceberg makes in place (float to double, decimal precision up) evolve the
    table; existing rows keep their values under the wider type."""
    v1 = schema("orders", ColumnSpec("id", "int"), ColumnSpec("ratio", "float"),
                ColumnSpec("amount", "decimal", 10, 2))
    landing.segment(v1, [("c", {"id": 1, "ratio": 0.5, "amount": Decimal("12345678.91")})])
    run(spark, landing, warehouse, v1)
    v2 = schema("orders", ColumnSpec("id", "int"), ColumnSpec("ratio", "double"),
                ColumnSpec("amount", "decimal", 20, 2))
    landing.segment(v2, [("c", {"id": 2, "ratio": 0.1,
                                "amount": Decimal("123456789012345678.12")})])
    result = run(spark, landing, warehouse, v2)
    assert result.schema_changed
    table = target(spark, warehouse, v2)
    types = {f.name: f.dataType for f in table.read().schema.fields}
    assert types == {"id": LongType(), "ratio": DoubleType(), "amount": DecimalType(20, 2)}
    assert state(spark, warehouse, v2) == {
        1: {"id": 1, "ratio": 0.5, "amount": Decimal("12345678.91")},
        2: {"id": 2, "ratio": 0.1, "amount": Decimal("123456789012345678.12")},
    }


def test_int_to_bigint_widens_in_place(spark, warehouse):
    """Landing types have no 32-bit int, but a table made by an older release or another
    engine may: ``evolve`` promotes it to bigint with Iceberg's ALTER COLUMN."""
    table = LakeTable(Lake(spark, warehouse), SERVER, "shop", "legacy")
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {quote(table.lake.catalog)}."
              f"{quote(table.namespace)}")
    spark.sql(f"CREATE TABLE {table.identifier} (id bigint, n int, __cdc_pos bigint) "
              "USING iceberg TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {table.identifier} VALUES (1, 2147483647, 1)")
    wide = schema("legacy", ColumnSpec("id", "int"), ColumnSpec("n", "int"))
    assert evolve(table, wide)
    assert table.read().schema["n"].dataType == LongType()
    spark.sql(f"INSERT INTO {table.identifier} VALUES (2, 2147483648, 2)")
    assert sorted(tuple(row) for row in table.read().collect()) == [(1, 2**31 - 1), (2, 2**31)]
    assert_third_party_reads_same(spark, table)
    assert not evolve(table, wide)


def test_a_type_change_iceberg_cannot_make_asks_for_a_resnapshot(spark, landing, warehouse):
    v1 = schema("orders", ColumnSpec("id", "int"), ColumnSpec("code", "string"))
    landing.segment(v1, [("c", {"id": 1, "code": "7"}), ("c", {"id": 2, "code": "x"})])
    first = run(spark, landing, warehouse, v1)
    # ALTER TABLE orders MODIFY code INT: string to bigint is no Iceberg promotion
    v2 = schema("orders", ColumnSpec("id", "int"), ColumnSpec("code", "int"))
    landing.segment(v2, [("u", {"id": 1, "code": 8})])
    with pytest.raises(SchemaEvolutionError, match=r"(?s)shop\.orders: column 'code' changed "
                       r"from string to bigint.*re-snapshot the table.*DROP TABLE .*"
                       r"execute-snapshot"):
        run(spark, landing, warehouse, v2)
    table = target(spark, warehouse, v1)
    assert table.current().snapshot_id == first.snapshot_id
    assert state(spark, warehouse, v1) == {1: {"id": 1, "code": "7"}, 2: {"id": 2, "code": "x"}}
    # The fix the error names: drop the target, re-snapshot the table (chunk rows and a sweep)
    table.drop()
    assert not table.exists()
    landing.segment(v2, [("r", {"id": 1, "code": 8}), ("r", {"id": 2, "code": 0}),
                         ("s", {"__cdc_threshold": landing.next_pos})], snapshot=True)
    result = run(spark, landing, warehouse, v2)
    assert result.committed and result.rows == 2
    assert table.read().schema["code"].dataType == LongType()
    assert state(spark, warehouse, v2) == {1: {"id": 1, "code": 8}, 2: {"id": 2, "code": 0}}


def test_time_travel_reads_the_previous_snapshot_exactly(spark, landing, warehouse):
    landing.segment(S, [("c", r(1, "v1", "1.00")), ("c", r(2, "b", "2.00"))])
    first = run(spark, landing, warehouse)
    landing.segment(S, [("u", r(1, "v2", "1.50")), ("d", {"id": 2}), ("c", r(3, "c", "3.00"))])
    second = run(spark, landing, warehouse)
    table = target(spark, warehouse)
    previous = {1: r(1, "v1", "1.00"), 2: r(2, "b", "2.00")}
    assert rows_of(table.read(snapshot_id=first.snapshot_id)) == previous
    assert rows_of(table.read(snapshot_id=second.snapshot_id)) == rows_of(table.read())
    assert rows_of(table.read()) == {1: r(1, "v2", "1.50"), 3: r(3, "c", "3.00")}
    # a third-party reader travels to the same rows
    assert_third_party_reads_same(spark, table, snapshot_id=first.snapshot_id)
    assert {row["id"]: row for row in third_party_rows(table, first.snapshot_id)} == previous


def test_merge_on_read_adds_delete_files_and_keeps_the_data_files(spark, landing, warehouse):
    landing.segment(S, [("c", r(i, f"n{i}", "1.00")) for i in range(200)])
    first = run(spark, landing, warehouse)
    before = first.snapshot.metadata()
    landing.segment(S, [("u", r(i, "changed", "2.00")) for i in range(0, 200, 20)]
                    + [("d", {"id": 7})])
    second = run(spark, landing, warehouse)
    after = second.snapshot.metadata()
    assert second.updates == 10 and second.deletes == 1 and second.rows == 199
    # the batch wrote its 10 new rows and position deletes for the 11 old ones...
    assert after["added_delete_files"] > 0 and after["delete_files"] > before["delete_files"]
    assert after["position_deletes"] - before["position_deletes"] == 11
    # ...and rewrote no data file: the old ones are all still live, a few small ones added
    assert 0 < after["added_data_files"] <= 4
    assert after["data_files"] == before["data_files"] + after["added_data_files"]
    assert after["records"] == before["records"] + 10
    assert second.snapshot.summary.get("deleted-data-files", "0") == "0"
    assert len(state(spark, warehouse)) == 199


def test_maintenance_compacts_and_expires_but_keeps_rows_and_mark(spark, tmp_path):
    """Iceberg's compaction (rewrite_data_files applying the delete files) and snapshot expiry
    give the same rows as the un-maintained table, and the next materialisation continues
    from the mark the maintenance snapshot carries (no replay, nothing skipped)."""
    rng = random.Random(7)
    landing = Landing(tmp_path / "landing")
    plain, maintained = str(tmp_path / "plain"), str(tmp_path / "maintained")
    live: dict[int, dict] = {}
    for batch in range(5):
        changes = []
        for _ in range(40):
            key = rng.randrange(60)
            if key in live and rng.random() < 0.3:
                changes.append(("d", {"id": key}))
                live.pop(key)
            else:
                row = r(key, f"n{batch}-{rng.randrange(1000)}", f"{rng.randrange(10000) / 100:.2f}")
                changes.append(("u" if key in live else "c", row))
                live[key] = row
        landing.segment(S, changes)
        lazy = run(spark, landing, plain)
        eager = run(spark, landing, maintained)
        assert lazy.rows == eager.rows == len(live)
        assert eager.consumed_pos == lazy.consumed_pos
        table = target(spark, maintained)
        report = maintain(table, datetime.now() + timedelta(hours=1), retain_last=1)
        assert report["rewritten_data_files_count"] > 0 or batch == 0
        current = table.current()
        assert current.consumed_pos == eager.consumed_pos  # the mark survives compaction
        assert len(table.history()) == 1 and len(table.snapshots()) == 1  # expired
        assert state(spark, plain) == state(spark, maintained) == live
    compacted = target(spark, maintained).current().metadata()
    assert compacted["position_deletes"] == 0 and compacted["records"] == len(live)
    assert target(spark, plain).current().metadata()["position_deletes"] > 0
    # nothing new: the maintained table commits nothing; new records apply once
    assert not run(spark, landing, maintained).committed
    landing.segment(S, [("c", r(1000, "new", "0.00"))])
    assert run(spark, landing, maintained).records_read == 1
    assert state(spark, maintained) == {**live, 1000: r(1000, "new", "0.00")}


@pytest.mark.parametrize("arrow_load", [True, False], ids=["arrow-initial-load", "spark-only"])
def test_batches_fold_like_a_model_over_random_changelogs(spark, tmp_path, arrow_load):
    for seed in (1, 2, 3):
        rng = random.Random(seed)
        landing = Landing(tmp_path / f"landing{seed}")
        warehouse = str(tmp_path / f"warehouse{seed}")
        live: dict[int, dict] = {}
        for _ in range(5):
            changes = []
            for _ in range(rng.randrange(1, 30)):
                key = rng.randrange(25)
                op = rng.choice("cud")
                if op == "d":
                    changes.append(("d", {"id": key}))
                    live.pop(key, None)
                else:
                    live[key] = r(key, op, "0.00")
                    changes.append((op, live[key]))
            landing.segment(S, changes)
            result = run(spark, landing, warehouse, spark_free=arrow_load)
            assert result.rows == len(live)
        assert state(spark, warehouse) == live


def test_an_empty_table_materialises_to_an_empty_target_with_its_columns(spark, landing,
                                                                          warehouse):
    # no checkpoint at all yet: the target still exists, from the schema hint
    result = run(spark, landing, warehouse)
    assert (result.committed, result.rows, result.consumed_pos) == (False, 0, None)
    table = target(spark, warehouse)
    empty = table.current()
    assert empty is not None and empty.rows == 0  # the empty first snapshot
    df = table.read()
    assert df.columns == ["id", "name", "amount"]
    assert [f.dataType for f in df.schema.fields] == [LongType(), StringType(), DecimalType(10, 2)]
    assert df.count() == 0
    assert state(spark, warehouse) == {}
    # the engine runs, other tables change, this one does not: still nothing to commit
    other = schema("other")
    landing.segment(other, [("c", r(1, "a", "1.00"))])
    again = run(spark, landing, warehouse)
    assert not again.committed and again.snapshot_id == empty.snapshot_id
    # then the table's first records arrive
    landing.segment(S, [("c", r(1, "a", "1.00"))])
    result = run(spark, landing, warehouse)
    assert result.committed and result.rows == 1
    assert result.snapshot.parent_id == empty.snapshot_id
    assert state(spark, warehouse) == {1: r(1, "a", "1.00")}


def test_empty_table_with_a_checkpoint_but_no_segments(spark, landing, warehouse):
    """Made without Spark (pyiceberg: the table, then its empty first snapshot), with the
    columns, types and properties Spark's creation gives it."""
    landing.checkpoint()
    result = run(spark, landing, warehouse)
    assert (result.committed, result.rows, result.consumed_pos) == (False, 0, None)
    assert not result.spark
    table = target(spark, warehouse)
    assert table.exists() and table.current() is not None and table.current().rows == 0
    df = table.read()
    assert [(f.name, f.dataType) for f in df.schema.fields] == [
        ("id", LongType()), ("name", StringType()), ("amount", DecimalType(10, 2))]
    assert table.primary_key() == ["id"] and table.property("cdc.source-table") == "orders"
    landing.segment(S, [("c", r(1, "a", "1.00"))])
    first = run(spark, landing, warehouse)
    assert first.committed and not first.spark and first.snapshot.parent_id == \
        result.snapshot_id
    assert state(spark, warehouse) == {1: r(1, "a", "1.00")}


def test_without_schema_hint_or_changelog_the_error_says_what_to_do(spark, landing, warehouse):
    with pytest.raises(LookupError, match="shop.orders .*schema_hint"):
        materialise(spark, landing.url, warehouse, SERVER, None, "shop", "orders")


def test_primary_key_change_is_refused(spark, landing, warehouse):
    landing.segment(S, [("c", r(1, "a", "1.00"))])
    run(spark, landing, warehouse)
    rekeyed = schema("orders", *S.columns, key=("name",))
    landing.segment(rekeyed, [("c", r(2, "b", "1.00"))])
    with pytest.raises(ValueError, match="primary key of shop.orders changed"):
        run(spark, landing, warehouse)


def test_unknown_op_is_refused(spark, landing, warehouse):
    landing.segment(S, [("x", r(1, "a", "1.00"))])
    with pytest.raises(ValueError, match="shop.orders .*__cdc_op"):
        run(spark, landing, warehouse)
    table = target(spark, warehouse)
    assert mark_of(table.history()) is None
    assert table.read().count() == 0


def test_a_reset_landing_zone_is_detected(spark, landing, warehouse, tmp_path):
    landing.segment(S, [("c", r(1, "a", "1.00")), ("c", r(2, "b", "1.00"))])
    run(spark, landing, warehouse)
    fresh = Landing(tmp_path / "fresh")
    fresh.checkpoint()
    with pytest.raises(RuntimeError, match="landing zone was reset"):
        materialise(spark, fresh.url, warehouse, SERVER, S, "shop", "orders")


def test_a_table_that_was_never_materialised_does_not_exist(spark, warehouse):
    table = target(spark, warehouse)
    assert not table.exists()
    assert table.current() is None and table.history() == []


def test_composite_key_and_awkward_column_names(spark, landing, warehouse):
    odd = TableSchema("shop", "odd", (
        ColumnSpec("tenant", "string"), ColumnSpec("id", "int"), ColumnSpec("a.b c`d", "double"),
    ), ("tenant", "id"))
    landing.segment(odd, [("c", {"tenant": "x", "id": 1, "a.b c`d": 1.0}),
                          ("c", {"tenant": "y", "id": 1, "a.b c`d": 2.0})])
    run(spark, landing, warehouse, odd)
    landing.segment(odd, [("u", {"tenant": "x", "id": 1, "a.b c`d": 1.5}),
                          ("d", {"tenant": "y", "id": 1}),
                          ("c", {"tenant": "y", "id": 2, "a.b c`d": 3.0})])
    result = run(spark, landing, warehouse, odd)
    assert result.rows == 2
    table = target(spark, warehouse, odd)
    rows = sorted(tuple(row) for row in table.read().collect())
    assert rows == [("x", 1, 1.5), ("y", 2, 3.0)]
    assert_third_party_reads_same(spark, table)
    landing.segment(odd, [("d", {"tenant": "x", "id": 1})])
    assert run(spark, landing, warehouse, odd).rows == 1
    assert [tuple(row) for row in table.read().collect()] == [("y", 2, 3.0)]
    assert_third_party_reads_same(spark, table)


def test_a_record_with_an_op_no_engine_writes_stops_the_merge_unapplied(spark, landing,
                                                                        warehouse):
    """The counts' op codes leave no op unnamed: one the contract does not know (a segment
    another writer made) is a loud stop, and the target does not move."""
    landing.segment(S, [("c", r(1, "a", "1.00"))])
    first = run(spark, landing, warehouse)
    landing.segment(S, [("u", r(1, "b", "1.00")), ("x", r(2, "c", "2.00"))])
    with pytest.raises(ValueError, match="1 records with an __cdc_op outside"):
        run(spark, landing, warehouse)
    assert target(spark, warehouse).current().snapshot_id == first.snapshot_id


def test_a_merge_counts_its_batch_with_pyarrow_not_a_spark_job(spark, tmp_path, monkeypatch):
    """The batch's counts (``fold.arrow_stats``) cost no Spark job: the same merge counted
    by Spark (a batch above ``MAX_ARROW_COUNT_RECORDS``) runs more (its aggregate and adaptive
    execution's stages), with the same result."""
    def merge_jobs(name: str) -> tuple[int, MergeResult]:
        landing = Landing(tmp_path / name / "landing")
        warehouse = str(tmp_path / name / "warehouse")
        landing.segment(S, [("c", r(i, f"n{i}", "1.00")) for i in range(20)])
        run(spark, landing, warehouse)
        landing.segment(S, [("u", r(1, "a", "2.00")), ("u", r(1, "b", "3.00")),
                            ("d", {"id": 2}), ("c", r(30, "new", "0.50"))])
        group = f"jobs-{random.getrandbits(32)}"
        spark.sparkContext.setJobGroup(group, "counting jobs")
        try:  # (Spark's MERGE: a merge without Spark runs no job at all)
            result = run(spark, landing, warehouse, spark_free=False)
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
        assert state(spark, warehouse)[1] == r(1, "b", "3.00")
        return len(spark.sparkContext.statusTracker().getJobIdsForGroup(group)), result

    arrow_jobs, by_arrow = merge_jobs("arrow")
    monkeypatch.setattr(fold, "MAX_ARROW_COUNT_RECORDS", 0)
    spark_jobs, by_spark = merge_jobs("spark")

    assert arrow_jobs < spark_jobs
    assert (by_arrow.records_read, by_arrow.inserts, by_arrow.updates, by_arrow.deletes,
            by_arrow.rows) == (by_spark.records_read, by_spark.inserts, by_spark.updates,
                               by_spark.deletes, by_spark.rows) == (4, 1, 1, 1, 20)
