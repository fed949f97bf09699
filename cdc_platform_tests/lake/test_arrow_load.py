"""The initial load without Spark (``lake.arrow_load``): the table it creates is the table Spark
creates, its Hadoop-catalog commits are compare-and-swap (one of two racing writers wins, the
other merges after it, nothing twice), Spark and pyiceberg read what it wrote, and it leaves
to the Spark path what it does not do exactly."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.lake import arrow_load
from cdc_platform.lake.arrow_merge import materialise_without_spark
from cdc_platform.lake.changelog import TableChangelog
from cdc_platform.lake.iceberg.commit import ConcurrentCommitError
from cdc_platform.lake.iceberg.hadoop import VERSION_HINT, LocalHadoopCatalog, local_hadoop_catalog
from cdc_platform.lake.iceberg.lake import Lake
from cdc_platform.lake.iceberg.table import LakeTable
from cdc_platform.lake.merge import materialise
from cdc_platform_tests.lake.helpers import (
    SERVER,
    Landing,
    materialise_table,
    rows_of,
    schema,
    target_table,
)
from cdc_platform_tests.lake.test_types import ROWS, SCHEMA
from cdc_platform_tests.lake.third_party import assert_third_party_reads_same, newest_metadata

S = schema("orders")


def r(id_: int, name: str = "x") -> dict:
    return {"id": id_, "name": name, "amount": Decimal("1.00")}


def spark_free(result: Any) -> bool:
    """Whether a result's snapshot was committed by the Arrow path (Spark's carry its app)."""
    return result.appended and "spark.app.id" not in result.snapshot.summary


def metadata(table: Any) -> dict:
    return json.loads(newest_metadata(table).read_text())


def test_the_created_table_is_the_table_spark_creates(spark, tmp_path: Path):
    landing = Landing(tmp_path / "landing")
    landing.segment(SCHEMA, [("c", row) for row in ROWS])
    made = {}
    for path in ("arrow", "spark"):
        warehouse = str(tmp_path / path)
        result = materialise(spark, landing.url, warehouse, SERVER, SCHEMA, "types",
                             "all_types", spark_free=path == "arrow")
        assert spark_free(result) == (path == "arrow")
        table = LakeTable(Lake(spark, warehouse), SERVER, "types", "all_types")
        made[path] = metadata(table)
        assert rows_of(table.read()).keys() == {row["id"] for row in ROWS}
    arrow, by_spark = made["arrow"], made["spark"]

    def fields(data: dict) -> list:
        return next(s for s in data["schemas"] if s["schema-id"] == data["current-schema-id"])[
            "fields"]

    assert fields(arrow) == fields(by_spark)
    assert arrow["properties"] == by_spark["properties"]
    for key in ("format-version", "partition-specs", "sort-orders", "last-partition-id",
                "last-column-id"):
        assert arrow[key] == by_spark[key], key
    assert arrow["location"].replace("/arrow/", "/") == by_spark["location"].replace(
        "/spark/", "/")


def test_spark_merges_into_the_table_the_arrow_path_made(spark, landing, warehouse):
    landing.segment(S, [("c", r(i)) for i in range(5)])
    first = materialise_table(spark, landing, warehouse, S)
    assert spark_free(first) and first.rows == 5 and first.inserts == 5
    landing.segment(S, [("u", r(1, "new")), ("d", {"id": 2}), ("c", r(9))])
    merged = materialise_table(spark, landing, warehouse, S)
    assert not merged.appended and merged.rows == 5
    table = target_table(spark, warehouse, S)
    assert {k: v["name"] for k, v in rows_of(table.read()).items()} == {
        0: "x", 1: "new", 3: "x", 4: "x", 9: "x"}
    assert table.current().consumed_pos == merged.consumed_pos == 8
    assert_third_party_reads_same(spark, table)


def test_a_lazy_session_is_not_started_by_an_initial_load(landing, warehouse, spark):
    landing.segment(S, [("r", r(i)) for i in range(3)])

    def no_spark() -> Any:
        raise AssertionError("the initial load asked for Spark")

    result = materialise_table(no_spark, landing, warehouse, S)
    assert spark_free(result) and result.rows == 3 and result.snapshot_rows == 3
    assert arrow_load.target_rows(warehouse, None, SERVER, "shop", "orders") == 3


def test_an_empty_target_is_created_without_a_session_and_a_later_snapshot_appended_into_it(
        landing, warehouse):
    """Nothing landed: the target is created empty without asking for a Spark session (the
    applier's starts in the background; at 1,000 new tables, waiting for it and creating each
    through Spark took 259 s). A snapshot that lands afterwards is appended into it without
    Spark too."""
    landing.checkpoint()
    asked = []

    def session() -> Any:
        asked.append(1)
        raise AssertionError("no Spark session is needed")

    empty = materialise_table(session, landing, warehouse, S)
    assert empty.rows == 0 and not empty.appended and not empty.spark
    landing.segment(S, [("r", r(i)) for i in range(3)])
    result = materialise_table(session, landing, warehouse, S)

    assert spark_free(result) and result.rows == 3 and result.snapshot_rows == 3
    assert asked == []


def test_a_batch_above_the_memory_bound_is_left_to_spark(spark, landing, warehouse,
                                                         monkeypatch):
    """The segments' uncompressed size (their footers, read once by the plan) is judged before
    anything is read: above MAX_BATCH_BYTES the load is Spark's."""
    landing.segment(S, [("r", r(i)) for i in range(3)])
    changelog = TableChangelog.open(landing.url, SERVER, "shop", "orders")
    plan = changelog.plan(None, landing.next_pos)
    assert plan is not None and plan.rows == 3 and plan.bytes > 0
    monkeypatch.setattr(arrow_load, "MAX_BATCH_BYTES", plan.bytes - 1)

    assert materialise_without_spark(changelog, warehouse, None, SERVER) is None
    assert not (Path(warehouse) / "demo_shop").exists()  # nothing done
    result = materialise_table(spark, landing, warehouse, S)
    assert result.rows == 3 and not spark_free(result)


def test_what_the_arrow_path_does_not_do_exactly_goes_to_spark(spark, landing, warehouse):
    landing.segment(S, [("c", r(1)), ("x", r(2))])  # an unknown op: refused by Spark, saying why
    changelog = TableChangelog.open(landing.url, SERVER, "shop", "orders")
    assert materialise_without_spark(changelog, warehouse, None, SERVER) is None
    assert not (Path(warehouse) / "demo_shop").exists()  # nothing done


def test_a_key_with_several_records_is_folded_into_the_append(spark, landing, warehouse):
    """Stream changes beside a snapshot's chunk rows: each key's newest record is appended,
    counted as Spark's MERGE into an empty table counts."""
    landing.segment(S, [("c", r(1)), ("u", r(1, "again")), ("r", r(2)), ("d", {"id": 2}),
                        ("r", r(3)), ("u", r(3, "later")), ("c", r(4))])
    result = materialise_table(spark, landing, warehouse, S)
    assert spark_free(result) and result.appended
    assert (result.rows, result.inserts, result.records_read) == (3, 3, 7)
    table = target_table(spark, warehouse, S)
    assert {k: v["name"] for k, v in rows_of(table.read()).items()} == {
        1: "again", 3: "later", 4: r(4)["name"]}
    assert_third_party_reads_same(spark, table)


def test_deletes_and_assertions_keep_rows_out_of_the_append(spark, landing, warehouse):
    from cdc_platform_tests.lake.test_snapshot_records import S as ITEMS
    from cdc_platform_tests.lake.test_snapshot_records import assertion, sweep

    landing.segment(ITEMS, [("r", {"id": i, "v": i}) for i in range(10)], snapshot=True)
    # positions 1..10; then: a delete of a key the batch has no other record of (30), an assertion over (4, 7] at threshold 11 (keys
    # 5, 6, 7 are older: gone), a sweep at threshold 2 (key 0 is older: gone)
    landing.segment(ITEMS, [("d", {"id": 30}), assertion((4,), (7,), 11, ITEMS), sweep(2)],
                    snapshot=True)
    result = materialise_table(spark, landing, warehouse, ITEMS)
    assert spark_free(result)
    table = target_table(spark, warehouse, ITEMS)
    assert sorted(rows_of(table.read())) == [1, 2, 3, 4, 8, 9]
    assert result.rows == 6 and result.asserted_deletes == 4 and result.records_read == 13
    assert_third_party_reads_same(spark, table)


def test_two_hadoop_commits_racing_for_one_version_one_wins(tmp_path: Path):
    import pyarrow as pa
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    catalog = LocalHadoopCatalog("lake", tmp_path, f"file://{tmp_path}")
    (tmp_path / "ns").mkdir()
    catalog.create_table(("ns", "t"), Schema(NestedField(1, "x", LongType(), required=False)),
                         location=catalog.location(("ns", "t")))
    one, two = catalog.load_table(("ns", "t")), catalog.load_table(("ns", "t"))
    data = pa.table({"x": pa.array([1, 2], pa.int64())})
    one.append(data)
    with pytest.raises(ConcurrentCommitError):  # (not retried by pyiceberg: rows twice)
        two.append(data)
    table = catalog.load_table(("ns", "t"))
    assert table.scan().to_arrow().num_rows == 2
    assert (tmp_path / "ns" / "t" / "metadata" / VERSION_HINT).read_text() == "2"
    # a creation racing an existing table loses too
    with pytest.raises(ConcurrentCommitError):
        catalog.create_table(("ns", "t"), Schema(NestedField(1, "x", LongType())),
                             location=catalog.location(("ns", "t")))


def race_twice(load: Callable[[], Any]) -> list[Any]:
    """``load`` in two threads at once: what each returned, or its ConcurrentCommitError."""
    outcomes: list[Any] = []

    def racer() -> None:
        try:
            outcomes.append(load())
        except ConcurrentCommitError as error:
            outcomes.append(error)

    threads = [threading.Thread(target=racer) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def test_two_appenders_racing_on_an_empty_table_one_wins_the_other_merges(
        spark, landing, warehouse, monkeypatch):
    """Both read "no table", both write; one publishes, the other's commit is refused and
    its materialisation runs again: a MERGE (the table has rows now). No row twice."""
    landing.segment(S, [("c", r(i)) for i in range(20)])
    landing.segment(S, [("u", r(i, "later")) for i in range(0, 20, 2)])  # (folds: Spark)
    landing.checkpoint(next_pos=21)  # the first batch only, for the racers
    changelog = TableChangelog.open(landing.url, SERVER, "shop", "orders")
    hadoop = local_hadoop_catalog(warehouse)
    assert hadoop is not None
    both_ready = threading.Barrier(2, timeout=60)
    real_commit = LocalHadoopCatalog.commit_table

    def commit_together(self, table, requirements, updates):
        both_ready.wait()
        return real_commit(self, table, requirements, updates)

    monkeypatch.setattr(LocalHadoopCatalog, "commit_table", commit_together)
    # (past the table lock: the race the compare-and-swap decides)
    outcomes = race_twice(lambda: arrow_load.load_into_empty(changelog, hadoop,
                                                             ("demo_shop", "orders"), None,
                                                             SERVER))
    monkeypatch.setattr(LocalHadoopCatalog, "commit_table", real_commit)
    assert sorted(type(o).__name__ for o in outcomes) == ["ConcurrentCommitError", "Loaded"]
    table = target_table(spark, warehouse, S)
    assert table.current().rows == 20 and table.current().consumed_pos == 20
    # the loser runs again: the table has rows, so it merges (here, the rest of the changelog)
    landing.checkpoint()
    again = materialise_table(spark, landing, warehouse, S)
    assert not again.appended and again.rows == 20
    rows = rows_of(table.read())
    assert len(rows) == 20 and {v["name"] for k, v in rows.items() if k % 2 == 0} == {"later"}
    assert_third_party_reads_same(spark, table)


def test_a_warehouse_without_hard_links_is_loaded_by_spark(spark, landing, warehouse,
                                                           monkeypatch):
    import os

    def no_links(source: str, target: str) -> None:
        raise PermissionError(1, "hard links not supported", target)

    monkeypatch.setattr(os, "link", no_links)
    landing.segment(S, [("c", r(i)) for i in range(4)])
    result = materialise_table(spark, landing, warehouse, S)
    assert result.appended and not spark_free(result) and result.rows == 4
    assert sorted(rows_of(target_table(spark, warehouse, S).read())) == [0, 1, 2, 3]


def test_a_load_is_written_as_one_file_per_core_and_leaves_no_write_setting(
        spark, landing, warehouse, monkeypatch):
    """Spark scans a file in one task: a load as one file made every later MERGE scan the
    target on one core. The file size is the transaction's setting only: the table is left
    with the properties Spark gives it (and a table's own setting wins)."""
    monkeypatch.setattr(arrow_load, "WRITE_FILES", 3)
    monkeypatch.setattr(arrow_load, "MIN_ROWS_PER_FILE", 10)
    landing.segment(S, [("c", r(i, "n" * 50)) for i in range(300)])
    loaded = materialise_table(spark, landing, warehouse, S)
    assert spark_free(loaded) and loaded.rows == 300
    table = target_table(spark, warehouse, S)
    files = table.lake.sql(f"SELECT record_count FROM {table.identifier}.files").collect()
    assert len(files) == 3 and sum(f.record_count for f in files) == 300
    assert arrow_load.TARGET_FILE_SIZE not in metadata(table)["properties"]
    assert rows_of(table.read()).keys() == set(range(300))
