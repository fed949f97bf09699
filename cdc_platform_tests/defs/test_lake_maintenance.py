"""Lake maintenance on real Iceberg tables: compaction and expiry keep the rows and the consumed
mark; the Dagster job and its schedule on a real Dagster instance."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import SparkSession

from cdc_platform.config import Settings, parse_settings
from cdc_platform.defs.lake import maintenance
from cdc_platform.defs.lake.definitions import target_key
from cdc_platform.lake.iceberg.commit import BRANCH_PREFIX, branch_name
from cdc_platform.lake.iceberg.lake import Lake
from cdc_platform.lake.iceberg.maintenance import maintain
from cdc_platform.lake.iceberg.snapshots import mark_of
from cdc_platform.lake.iceberg.table import LakeTable
from cdc_platform.lake.merge import MergeResult
from cdc_platform_tests.lake.helpers import SERVER, Landing, materialise_table, rows_of, schema

S = schema("orders")


def r(id_: int, name: str, amount: str) -> dict[str, Any]:
    return {"id": id_, "name": name, "amount": Decimal(amount)}


def table(spark: SparkSession, warehouse: str) -> LakeTable:
    return LakeTable(Lake(spark, warehouse), SERVER, S.database, S.table)


def two_batches(spark: SparkSession, landing: Landing, warehouse: str) -> MergeResult:
    """Two materialisations: inserts, then updates and deletes (delete files to compact)."""
    landing.segment(S, [("c", r(i, f"n{i}", f"{i}.00")) for i in range(1, 41)])
    materialise_table(spark, landing, warehouse, S)
    landing.segment(S, [("u", r(i, f"u{i}", "0.50")) for i in range(1, 11)]
                    + [("d", {"id": i}) for i in range(31, 36)])
    second = materialise_table(spark, landing, warehouse, S)
    assert second.snapshot is not None and second.snapshot.count("total-delete-files") > 0
    return second


def test_maintenance_expires_old_snapshots_and_keeps_rows_and_mark(spark, landing, warehouse):
    second = two_batches(spark, landing, warehouse)
    target = table(spark, warehouse)
    rows_before = rows_of(target.read())
    materialised = {s.snapshot_id for s in target.snapshots()}
    time.sleep(0.05)

    report = maintain(target, older_than=datetime.now(), retain_last=1)

    assert report["rewritten_data_files_count"] == 2
    assert report["added_data_files_count"] == 1
    assert report["failed_data_files_count"] == 0
    assert report["rewritten_delete_files_count"] == 1  # dangling after the compaction
    # every snapshot the materialisations made (with Spark's initial append, its empty
    # first snapshot too)
    assert report["expired_snapshots"] == len(materialised)
    assert report["deleted_data_files_count"] == 2
    assert not materialised & {s.snapshot_id for s in target.snapshots()}
    history = target.history()
    mark = mark_of(history)
    assert mark is not None and mark.snapshot_id == history[0].snapshot_id
    assert (mark.consumed_pos, mark.consumed_gtid) == (second.consumed_pos, second.consumed_gtid)
    assert history[0].count("total-delete-files") == 0
    assert history[0].rows == len(rows_before) == 35
    assert rows_of(target.read()) == rows_before

    landing.segment(S, [("c", r(100, "new", "1.00")), ("u", r(1, "u1b", "0.75"))])
    third = materialise_table(spark, landing, warehouse, S)
    assert (third.records_read, third.inserts, third.updates, third.rows) == (2, 1, 1, 36)
    assert rows_of(target.read()) == {**rows_before, 100: r(100, "new", "1.00"),
                                      1: r(1, "u1b", "0.75")}


def test_maintenance_keeps_every_snapshot_newer_than_the_retention(spark, landing, warehouse):
    """Nothing older than the retention: the rewrites add their snapshots, none is expired
    (and expiry's action is not run for nothing), the mark stays on main."""
    second = two_batches(spark, landing, warehouse)
    target = table(spark, warehouse)
    kept = {s.snapshot_id for s in target.snapshots()}

    report = maintain(target, older_than=datetime.now() - timedelta(hours=1), retain_last=1)

    assert report["expired_snapshots"] == report["deleted_data_files_count"] == 0
    assert report["rewritten_data_files_count"] == 2
    assert kept < {s.snapshot_id for s in target.snapshots()}
    assert mark_of(target.history()).consumed_pos == second.consumed_pos


def test_maintenance_of_a_compacted_table_changes_nothing(spark, landing, warehouse):
    two_batches(spark, landing, warehouse)
    target = table(spark, warehouse)
    maintain(target, older_than=datetime.now(), retain_last=1)
    current = target.current()

    again = maintain(target, older_than=datetime.now(), retain_last=1)

    assert again["rewritten_data_files_count"] == again["rewritten_delete_files_count"] == 0
    assert target.current() == current


def test_expiry_keeps_the_newest_marked_snapshot_behind_unmarked_ones(spark, landing, warehouse):
    """A snapshot committed without a mark (an operator's own compaction) never lets expiry take
    the mark with the snapshots behind it."""
    second = two_batches(spark, landing, warehouse)
    target = table(spark, warehouse)
    maintain(target, older_than=datetime.now(), retain_last=1)  # nothing left to compact after
    spark.sql(f"CALL `{target.lake.catalog}`.system.rewrite_data_files(table => "
              f"'{target.namespace}.{target.name}', options => map('rewrite-all', 'true'))")
    by_hand = target.current()
    assert by_hand is not None and by_hand.consumed_pos is None

    maintain(target, older_than=datetime.now(), retain_last=1)

    history = target.history()
    assert history[0] == by_hand
    mark = mark_of(history)
    assert mark is not None and mark.consumed_pos == second.consumed_pos


def test_stale_private_branches_are_dropped_and_live_ones_kept(spark, landing, warehouse):
    two_batches(spark, landing, warehouse)
    target = table(spark, warehouse)
    crashed, live = branch_name(created=time.time() - 7 * 3600), branch_name()
    for branch in (crashed, live):
        spark.sql(f"ALTER TABLE {target.identifier} CREATE BRANCH `{branch}`")

    report = maintain(target, older_than=datetime.now(), retain_last=1)

    refs = {row.name for row in spark.sql(
        f"SELECT name FROM {target.metadata_table('refs')}").collect()}
    assert report["dropped_stale_branches"] == 1
    assert refs == {"main", live} and live.startswith(BRANCH_PREFIX)


def settings_for(landing: Landing, warehouse: str, **overrides: Any) -> Settings:
    return parse_settings({
        "source": {"flavour": "mariadb", "host": "127.0.0.1", "user": "cdc", "server_id": 7,
                   "server_name": SERVER},
        "landing_zone": {"url": landing.url},
        "warehouse": {"url": warehouse, **overrides},
    })


def test_lake_maintenance_job_maintains_every_table_and_reports_it(spark, landing, warehouse):
    second = two_batches(spark, landing, warehouse)
    never_materialised = schema("customers")
    settings = settings_for(landing, warehouse, snapshot_retention_hours=0.0001,
                            min_snapshots_to_keep=1, maintenance_cron="15 4 * * 0")
    defs = dg.Definitions.merge(
        maintenance.build(settings, [S, never_materialised]),
        dg.Definitions(resources={"pyspark": LazyPySparkResource(spark_config={})}),
    )
    time.sleep(1)  # the materialisations' snapshots are now older than the retention

    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def(maintenance.JOB_NAME).execute_in_process(
            instance=instance)
        assert result.success
        [observation] = instance.fetch_observations(target_key(settings, S), limit=1).records
        metadata = {k: v.value for k, v in observation.asset_observation.metadata.items()}
        logs = [e.message for e in instance.all_logs(result.run_id)]
        never_observed = instance.fetch_observations(
            target_key(settings, never_materialised), limit=1).records

    assert metadata["rewritten_data_files_count"] == 2
    assert metadata["rewritten_delete_files_count"] == 1
    assert metadata["deleted_orphan_files_count"] == 0  # (none older than three days)
    assert metadata["expired_snapshots"] == 2  # both materialisations' (the first an append
    # without Spark: no empty first snapshot before it)
    assert metadata["consumed_position"] == second.consumed_pos
    assert metadata["delete_files"] == 0 and metadata["records"] == 35
    assert metadata["snapshots"] == 2  # the two rewrites (newer than the retention)
    # the table never materialised has nothing to maintain: said, and nothing observed
    assert any(m.startswith("shop.customers: ") and m.endswith("does not exist yet")
               for m in logs)
    assert not never_observed
    assert not table(spark, warehouse).lake.spark.catalog.tableExists(
        LakeTable(Lake(spark, warehouse), SERVER, "shop", "customers").identifier)

    schedule = defs.resolve_schedule_def(maintenance.SCHEDULE_NAME)
    assert schedule.cron_schedule == "15 4 * * 0"
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    assert schedule.job_name == maintenance.JOB_NAME
