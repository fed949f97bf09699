"""Maintenance without Spark (``lake.iceberg.upkeep``): a small table's compaction and its
snapshot expiry, read back by Spark and by pyiceberg as third parties, with the consumed mark
kept and no file a kept snapshot needs deleted."""

from __future__ import annotations

import random
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.lake.iceberg.commit import ConcurrentCommitError
from cdc_platform.lake.iceberg.hadoop import local_hadoop_catalog
from cdc_platform.lake.iceberg.live_files import entries
from cdc_platform.lake.iceberg.upkeep import compact, expire
from cdc_platform_tests.lake.helpers import (
    Changelog,
    materialise_table,
    random_changes,
    rows_of,
    schema,
    target_table,
)
from cdc_platform_tests.lake.third_party import assert_third_party_reads_same

S = schema("orders")
IDENTIFIER = ("demo_shop", "orders")


def _merged(spark, landing, warehouse, merges: int, seed: int = 3) -> Changelog:
    """A table merged ``merges`` times without Spark (each merge a data and a delete file)."""
    rng = random.Random(seed)
    changelog = Changelog(landing)
    live: set[int] = set()
    for batch in range(merges):
        changelog.write(random_changes(rng, live, batch))
        result = materialise_table(spark, landing, warehouse, S)
        assert result.committed and (batch == 0 or not result.spark)
    return changelog


def _referenced(table) -> set[str]:
    """Every file the table's kept snapshots reach: manifest lists, manifests, data and
    delete files."""
    found: set[str] = set()
    for snapshot in table.metadata.snapshots:
        found.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            found.add(manifest.manifest_path)
        found |= {e.data_file.file_path for e in entries(table, snapshot)}
    return found


def _local(path: str) -> Path:
    return Path(path.removeprefix("file:"))


def test_compaction_rewrites_a_small_table_into_one_file_keeping_rows_and_mark(
        spark, landing, warehouse):
    changelog = _merged(spark, landing, warehouse, 12)
    catalog = local_hadoop_catalog(warehouse)
    table = catalog.load_table(IDENTIFIER)
    before = table.current_snapshot()
    assert int(before.summary["total-delete-files"]) > 0
    report = compact(catalog, table)
    assert report is not None and report["added_data_files_count"] == 1
    assert report["rewritten_delete_files_count"] > 0
    target = target_table(spark, warehouse, S)
    current = target.current()
    assert current.operation == "replace" and current.parent_id == before.snapshot_id
    assert current.metadata()["data_files"] == 1 and current.metadata()["delete_files"] == 0
    assert current.rows == len(changelog.fold()) == report["rows"]
    assert current.consumed_pos == int(before.summary["cdc.consumed-pos"])
    assert rows_of(target.read()) == changelog.fold()
    assert_third_party_reads_same(spark, target)
    # merges continue from the compacted snapshot, without Spark
    changelog.write([("u", {"id": k, "name": "after", "amount": Decimal("2.00")})
                     for k in list(changelog.fold())[:3]])
    result = materialise_table(spark, landing, warehouse, S)
    assert result.committed and not result.spark and result.snapshot.parent_id == \
        current.snapshot_id
    assert rows_of(target.read()) == changelog.fold()
    # compactions and merges alternate (the files a merge without Spark just wrote, known to
    # this process without reading them, are compacted as any)
    rng = random.Random(8)
    live = set(changelog.fold())
    for batch in range(3):
        assert compact(catalog, catalog.load_table(IDENTIFIER)) is not None
        changelog.write(random_changes(rng, live, 100 + batch))
        assert not materialise_table(spark, landing, warehouse, S).spark
    assert rows_of(target.read()) == changelog.fold()
    for snapshot in target.history():  # (the compaction's repeats the mark it rewrote)
        assert rows_of(target.read(snapshot_id=snapshot.snapshot_id)) == changelog.fold(
            snapshot.consumed_pos)


def test_compaction_refuses_a_table_above_its_size_bound(spark, landing, warehouse,
                                                         monkeypatch):
    from cdc_platform.lake.iceberg import upkeep

    _merged(spark, landing, warehouse, 2)
    catalog = local_hadoop_catalog(warehouse)
    monkeypatch.setattr(upkeep, "MAX_COMPACTION_BYTES", 10)
    table = catalog.load_table(IDENTIFIER)
    assert compact(catalog, table) is None
    assert catalog.load_table(IDENTIFIER).current_snapshot().snapshot_id == \
        table.current_snapshot().snapshot_id


def test_a_compaction_that_loses_the_race_publishes_nothing(spark, landing, warehouse):
    changelog = _merged(spark, landing, warehouse, 4)
    catalog = local_hadoop_catalog(warehouse)
    stale = catalog.load_table(IDENTIFIER)
    changelog.write([("c", {"id": 999, "name": "new", "amount": Decimal("1.00")})])
    materialise_table(spark, landing, warehouse, S)
    with pytest.raises(ConcurrentCommitError):
        compact(catalog, stale)
    target = target_table(spark, warehouse, S)
    assert target.current().operation != "replace"
    assert rows_of(target.read()) == changelog.fold()


def test_expiry_keeps_the_newest_snapshots_and_deletes_only_what_the_others_reached(
        spark, landing, warehouse):
    changelog = _merged(spark, landing, warehouse, 10)
    catalog = local_hadoop_catalog(warehouse)
    compact(catalog, catalog.load_table(IDENTIFIER))  # (files only old snapshots reach)
    for batch in range(3):
        changelog.write([("u", {"id": k, "name": f"late {batch}", "amount": Decimal("1.00")})
                         for k in list(changelog.fold())[:2]])
        materialise_table(spark, landing, warehouse, S)
    table = catalog.load_table(IDENTIFIER)
    before = len(table.metadata.snapshots)
    every_file = _referenced(table)
    report = expire(catalog, table, keep=3)
    assert report is not None and report["expired_snapshots"] == before - 3
    table = catalog.load_table(IDENTIFIER)
    assert len(table.metadata.snapshots) == 3
    kept = _referenced(table)
    assert all(_local(path).exists() for path in kept)  # nothing a kept snapshot needs
    gone = every_file - kept
    assert gone and not any(_local(path).exists() for path in gone)  # and the rest deleted
    target = target_table(spark, warehouse, S)
    assert rows_of(target.read()) == changelog.fold()
    assert_third_party_reads_same(spark, target)
    for snapshot in target.history():  # time travel to every kept snapshot still reads
        assert rows_of(target.read(snapshot_id=snapshot.snapshot_id)) == changelog.fold(
            snapshot.consumed_pos)
    assert expire(catalog, table, keep=3) is None  # nothing more to remove


def test_compactions_and_expiries_between_merges_of_one_process(landing, warehouse, spark):
    """What this process wrote (its data and delete files, known without reading them) is
    compacted, expired and merged again, with no Spark session at all."""
    def no_spark() -> Any:
        raise AssertionError("a merge asked for Spark")

    rng = random.Random(1)
    changelog = Changelog(landing)
    live: set[int] = set()
    catalog = None
    for batch in range(12):
        changelog.write(random_changes(rng, live, batch))
        materialise_table(no_spark, landing, warehouse, S)
        catalog = local_hadoop_catalog(warehouse)
        if batch in (4, 8):
            assert compact(catalog, catalog.load_table(IDENTIFIER)) is not None
        if batch == 6:
            assert expire(catalog, catalog.load_table(IDENTIFIER), 3) is not None
    target = target_table(spark, warehouse, S)
    assert rows_of(target.read()) == changelog.fold()
    assert_third_party_reads_same(spark, target)
