"""The lake domain: one PySpark target asset per captured table, each with a reconcile check."""


import dagster as dg
from dagster_pyspark import LazyPySparkResource

from cdc_platform.capture.ddl import stale_markers
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.names import joined_name, valid_name
from cdc_platform.capture.schema import TableSchema
from cdc_platform.capture.source import SourceSession, missing_table
from cdc_platform.config import Settings
from cdc_platform.defs.names import (
    scoped_name,
    single_asset,
    single_asset_check,
    source_resource_key,
)
from cdc_platform.defs.snapshots.definitions import snapshot_key
from cdc_platform.defs.streaming.runner import changelog_key
from cdc_platform.lake.iceberg import Lake
from cdc_platform.lake.merge import materialise
from cdc_platform.lake.reconcile import reconcile_table


def target_key(settings: Settings, schema: TableSchema) -> dg.AssetKey:
    """``<server>/<db>/<table>``: the real names, whatever characters they hold."""
    return dg.AssetKey([settings.source.server_name, schema.database, schema.table])


def target_group(settings: Settings, schema: TableSchema) -> str:
    return f"{settings.source.server_name}_{valid_name(schema.database)}"


def _target_asset(settings: Settings, schema: TableSchema) -> dg.AssetsDefinition:
    server = settings.source.server_name

    @single_asset(
        dg.AssetSpec(
            key=target_key(settings, schema),
            group_name=target_group(settings, schema),
            kinds={"spark", "iceberg"},
            description=f"Iceberg table for {schema.table_id} on {server!r}: the landed changes "
            "and committed snapshot chunks folded by highest position per key (deletes and "
            "snapshot range assertions applied) and merged as one Iceberg snapshot per run, "
            "carrying the changelog mark it consumed.",
            metadata={"primary_key": ", ".join(schema.primary_key) or "(none)"},
        ),
        op_name=joined_name(server, schema.database, schema.table),
        # Stream records and committed snapshot chunks both arrive through the changelog.
        deps=[changelog_key(settings), snapshot_key(settings, schema)],
        # Another run committed this table's next version first (ConcurrentCommitError):
        # running again builds on that version.
        retry_policy=dg.RetryPolicy(max_retries=2, delay=1.0),
    )
    def target(context: dg.AssetExecutionContext, pyspark: LazyPySparkResource
               ) -> dg.MaterializeResult:
        result = materialise(
            pyspark.spark_session,
            settings.landing_zone.url,
            settings.warehouse.url,
            server,
            schema,
            schema.database,
            schema.table,
            catalog=settings.warehouse.catalog,
            s3=settings.s3.options(),
        )
        context.log.info(
            f"{schema.table_id}: {result.identifier} snapshot {result.snapshot_id} "
            f"({'new' if result.committed else 'unchanged'}), {result.records_read} changelog "
            f"records merged, {result.rows} rows"
        )
        stale_reason = staleness(settings, schema, result.consumed_pos)
        if stale_reason:
            context.log.warning(f"{schema.table_id}: target stale: {stale_reason}")
        return dg.MaterializeResult(metadata={
            "stale": stale_reason is not None,
            "stale_reason": stale_reason or "",
            **result.metadata(),
        })

    return target


def staleness(settings: Settings, schema: TableSchema, consumed_pos: int | None) -> str | None:
    """Why the target (consumed up to ``consumed_pos``) is stale after a DDL, or None; markers
    whose re-snapshot the target has applied are forgotten (``capture.ddl.stale_markers``)."""
    landing = LandingZone.from_settings(settings)
    markers = stale_markers.resolve_markers(landing)
    stale_markers.forget_applied(landing, markers, schema.table_id, consumed_pos)
    return stale_markers.target_staleness(markers, schema.table_id, consumed_pos)


def _not_stale_check(settings: Settings, schema: TableSchema) -> dg.AssetChecksDefinition:
    server = settings.source.server_name

    @single_asset_check(
        dg.AssetCheckSpec(
            "not_stale",
            asset=target_key(settings, schema),
            description=f"Fails while a DDL on {schema.table_id} left its lake table with rows "
            "or values the changelog cannot correct (TRUNCATE, RENAME TABLE, partition "
            "DROP/EXCHANGE, ADD COLUMN with a default, type changes, ...), "
            "until a snapshot of the table that opened after the DDL is done and materialised "
            "(capture.resnapshot_on_ddl requests it).",
        ),
        op_name=joined_name("not_stale", server, schema.database, schema.table),
    )
    def not_stale(context: dg.AssetCheckExecutionContext, pyspark: LazyPySparkResource
                  ) -> dg.AssetCheckResult:
        target = Lake.from_settings(pyspark.spark_session, settings).table(
            server, schema.database, schema.table)
        _, marked = target.base_and_mark()
        reason = staleness(settings, schema, marked.consumed_pos if marked else None)
        return dg.AssetCheckResult(
            passed=reason is None,
            severity=dg.AssetCheckSeverity.ERROR,
            metadata={"stale_reason": reason or ""},
            description=reason,
        )

    return not_stale


def _reconcile_check(settings: Settings, schema: TableSchema) -> dg.AssetChecksDefinition:
    server = settings.source.server_name

    @single_asset_check(
        dg.AssetCheckSpec(
            "reconcile",
            asset=target_key(settings, schema),
            blocking=True,
            description=f"Compares {schema.table_id} on the source with its lake table by "
            "key-range checksums, drilling into mismatching ranges; fails on any missing, extra "
            "or different row. Run it when the target has caught up with the source.",
        ),
        # Not "<target op>_reconcile": a table named `orders_reconcile` has that op name.
        op_name=joined_name("reconcile", server, schema.database, schema.table),
        required_resource_keys={"pyspark", source_resource_key(settings)},
    )
    def reconcile(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        spark = context.resources.pyspark.spark_session
        source: SourceSession = getattr(context.resources, source_resource_key(settings))
        connection = settings.source.connection_settings()
        current = source.read_schema(schema.database, schema.table)
        if current is None:
            return dg.AssetCheckResult(
                passed=False, severity=dg.AssetCheckSeverity.ERROR,
                description=f"{missing_table(schema.table_id)}: nothing to compare its "
                            "target with")
        target = Lake.from_settings(spark, settings).table(server, schema.database, schema.table)
        snapshot, marked = target.base_and_mark()
        if snapshot is None:
            return dg.AssetCheckResult(
                passed=False, severity=dg.AssetCheckSeverity.ERROR,
                description=f"{target.identifier} has no snapshot yet: materialise it first")
        result = reconcile_table(
            spark, target.read(snapshot_id=snapshot.snapshot_id), connection, current,
            range_rows=settings.reconcile.range_rows, sample_keys=settings.reconcile.sample_keys,
        )
        context.log.info(
            f"{schema.table_id}: source {result.source_rows} rows, target {result.target_rows}; "
            f"missing {result.missing}, extra {result.extra}, different {result.different}"
        )
        metadata = result.to_metadata()
        # Differences with a target behind the source may only be lag: show both positions.
        metadata["target_gtid"] = marked.consumed_gtid if marked else None
        metadata["iceberg_snapshot_id"] = str(snapshot.snapshot_id)
        return dg.AssetCheckResult(
            passed=result.ok,
            severity=dg.AssetCheckSeverity.ERROR,
            metadata=metadata,
            description=None if result.ok else (
                f"{result.missing} missing, {result.extra} extra, {result.different} different "
                f"rows; if the target is behind the source (target_gtid vs source_gtid), "
                "materialise it again first, otherwise re-snapshot the table"),
        )

    return reconcile


def build(settings: Settings, tables: list[TableSchema]) -> dg.Definitions:
    keyed = [t for t in tables if t.primary_key]
    assets = [_target_asset(settings, t) for t in keyed]
    checks = [_reconcile_check(settings, t) for t in keyed] + [
        _not_stale_check(settings, t) for t in keyed]
    target_keys = [target_key(settings, t) for t in keyed]
    # The applier's freshness is no part of a batch run (no applier runs there).
    fresh = dg.AssetSelection.checks(*[dg.AssetCheckKey(k, "fresh") for k in target_keys])
    jobs = [
        dg.define_asset_job(
            scoped_name(settings, "materialise_targets"),
            selection=dg.AssetSelection.assets(*target_keys) - fresh,
            description="Fold the landed changes into every lake table and reconcile each "
            "against the source.",
            executor_def=dg.in_process_executor,
        ),
        dg.define_asset_job(
            scoped_name(settings, "catch_up_and_reconcile"),
            selection=dg.AssetSelection.assets(changelog_key(settings), *target_keys) - fresh,
            description="Batch run (CI, demo): land the binlog up to the source's current "
            "position, materialise every lake table, fail if any reconciliation fails.",
            executor_def=dg.in_process_executor,
        ),
    ]
    return dg.Definitions(assets=assets, asset_checks=checks, jobs=jobs)
