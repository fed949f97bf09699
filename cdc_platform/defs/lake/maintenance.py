"""Lake table maintenance as Dagster work: compaction, snapshot expiry and orphan files
(docs/iceberg.md).

A merge-on-read table gathers a delete file and a small data file per materialisation, and a
snapshot per materialisation: reads slow down and storage grows until something rewrites and
expires them. The job ``lake_maintenance`` does that with Iceberg's own actions
(``iceberg.maintenance.maintain``), one table after another in one op and one Spark session: one table's
failure leaves the others maintained and fails the op at the end naming it (one op per table
made a thousand ops at every code-location load). The schedule runs it on
``warehouse.maintenance_cron`` once turned on (it starts stopped: compaction rewrites data,
which an operator should choose to schedule). What each action did is an observation on the
table's asset, and a line of the run's log.
"""

from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
from dagster_pyspark import LazyPySparkResource

from cdc_platform.capture.names import joined_name
from cdc_platform.capture.schema import TableSchema
from cdc_platform.config import Settings
from cdc_platform.defs.lake.definitions import target_key
from cdc_platform.defs.names import scoped_name
from cdc_platform.lake.iceberg.lake import Lake
from cdc_platform.lake.iceberg.maintenance import ORPHAN_MIN_AGE, maintain, remove_orphans
from cdc_platform.lake.iceberg.snapshots import mark_of
from cdc_platform.lake.iceberg.table import LakeTable

JOB_NAME = "lake_maintenance"
SCHEDULE_NAME = "lake_maintenance_schedule"


def _maintain(settings: Settings, spark: Any, schema: TableSchema
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Maintain one table's Iceberg table: what its actions did, and its observation's
    metadata (nothing to do before the table exists)."""
    server, warehouse = settings.source.server_name, settings.warehouse
    target = LakeTable(Lake.from_settings(spark, settings), server, schema.database, schema.table)
    if not target.exists():
        return {}, {"table": target.identifier, "exists": False}
    older_than = datetime.now() - timedelta(hours=warehouse.snapshot_retention_hours)
    report = maintain(target, older_than, warehouse.min_snapshots_to_keep)
    report.update(remove_orphans(target, datetime.now(UTC) - ORPHAN_MIN_AGE))
    current = target.current()
    marked = mark_of(target.history())
    return report, {
        "table": target.identifier,
        "exists": True,
        **report,
        "snapshots": len(target.snapshots()),
        "expired_before": older_than.isoformat(timespec="seconds"),
        "consumed_position": (marked.consumed_pos if marked and marked.consumed_pos is not None
                              else -1),
        **(current.metadata() if current is not None else {}),
    }


def maintenance_op(settings: Settings, tables: list[TableSchema]) -> dg.OpDefinition:
    """The op maintaining every table's Iceberg table, one after another."""
    server = settings.source.server_name
    warehouse = settings.warehouse

    @dg.op(
        name=joined_name("maintain", server),
        description=f"Compacts the Iceberg table of each of the {len(tables)} captured tables "
        f"of {server!r} (data files with deletes and small files rewritten, dangling deletes "
        f"dropped) and expires its snapshots older than {warehouse.snapshot_retention_hours:g} "
        f"h, keeping the newest {warehouse.min_snapshots_to_keep}; the consumed changelog mark "
        f"is kept. Files no snapshot references, older than {ORPHAN_MIN_AGE.days} days, are "
        "deleted.",
        out=dg.Out(dg.Nothing),
    )
    def maintain(context: dg.OpExecutionContext, pyspark: LazyPySparkResource) -> None:
        spark = pyspark.spark_session
        failed: list[str] = []
        for schema in tables:
            try:
                report, metadata = _maintain(settings, spark, schema)
            except Exception as error:  # noqa: BLE001 - the table's failure, said at the end
                line = " ".join(str(error).split()) or type(error).__name__
                context.log.error(f"{schema.table_id}: maintenance failed: {line}")
                failed.append(f"{schema.table_id}: {line}")
                continue
            if not metadata["exists"]:
                context.log.info(f"{schema.table_id}: {metadata['table']} does not exist yet")
                continue
            context.log.info(f"{schema.table_id}: maintained {metadata['table']}: {report}")
            context.log_event(dg.AssetObservation(asset_key=target_key(settings, schema),
                                                  metadata=metadata))
        if failed:
            raise dg.Failure(description=f"maintenance of {len(failed)} of {len(tables)} "
                             f"tables of {server!r} failed (the others are maintained): "
                             + "; ".join(failed), allow_retries=False)

    return maintain


def build(settings: Settings, tables: list[TableSchema]) -> dg.Definitions:
    """The ``lake_maintenance`` job over the tables with a target asset (none yet: an empty
    job), and its schedule."""
    keyed = [t for t in tables if t.primary_key]
    job = dg.GraphDefinition(
        name=scoped_name(settings, JOB_NAME),
        node_defs=[maintenance_op(settings, keyed)] if keyed else [],
        description="Compaction and snapshot expiry of every lake table (Iceberg's "
        "rewrite-data-files, rewrite-position-deletes and expire-snapshots actions), keeping "
        "each table's consumed changelog mark.",
    ).to_job(executor_def=dg.in_process_executor)  # one Spark session for every table
    schedule = dg.ScheduleDefinition(
        name=scoped_name(settings, SCHEDULE_NAME),
        job=job,
        cron_schedule=settings.warehouse.maintenance_cron,
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description="Runs lake_maintenance on warehouse.maintenance_cron; stopped until "
        "turned on.",
    )
    return dg.Definitions(jobs=[job], schedules=[schedule])
