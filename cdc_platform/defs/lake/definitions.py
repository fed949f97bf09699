"""The lake domain: a PySpark target asset per captured table, each with its ``reconcile`` and
``not_stale`` checks, all of a source's in one subsettable multi-asset.

One definition per source, not one op per table and per check: with a thousand tables the code
location loaded three thousand ops (seconds of every load, and of every job built from them).
A run materialises and checks the tables it selects one after another in one Spark session; one
table's failure leaves the others materialised and checked, and fails the step at the end
naming it.
"""

import time
from collections.abc import Iterator
from datetime import timedelta

import dagster as dg

from cdc_platform.capture.ddl import stale_markers
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.names import joined_name, valid_name
from cdc_platform.capture.schema import TableSchema
from cdc_platform.capture.source import SourceSession, missing_table
from cdc_platform.config import Settings
from cdc_platform.defs.names import scoped_name, source_resource_key, subsettable_assets
from cdc_platform.defs.snapshots.definitions import snapshot_key
from cdc_platform.defs.streaming.runner import changelog_key
from cdc_platform.lake.iceberg.lake import Lake
from cdc_platform.lake.iceberg.table import LakeTable
from cdc_platform.lake.merge import materialise
from cdc_platform.lake.reconcile import reconcile_table


def target_key(settings: Settings, schema: TableSchema) -> dg.AssetKey:
    """``<server>/<db>/<table>``: the real names, whatever characters they hold."""
    return dg.AssetKey([settings.source.server_name, schema.database, schema.table])


def target_group(settings: Settings, schema: TableSchema) -> str:
    return f"{settings.source.server_name}_{valid_name(schema.database)}"


def targets_op_name(settings: Settings) -> str:
    """The op of a source's target assets and their checks."""
    return joined_name(settings.source.server_name, "targets")


# Dagster's freshness policy of a target fails this long after the promise: time for the
# applier's pass and the recording of its materialisation.
FRESHNESS_POLICY_SLACK_SECONDS = 30.0
# Another run committed a table's next version first (ConcurrentCommitError): materialising
# again builds on that version.
MATERIALISE_ATTEMPTS = 3
RETRY_SECONDS = 1.0


def freshness_policy(settings: Settings) -> dg.FreshnessPolicy:
    """Dagster's freshness policy of a target, so that its asset health shows a stale target:
    failing once its last materialisation is older than ``lake.freshness_seconds`` plus
    ``FRESHNESS_POLICY_SLACK_SECONDS``. A merge materialises a target, and the applier
    materialises a quiet target that has merged every landed change every half promise
    (``lake.applier.events.Current``), so only a target that falls behind goes stale; the
    ``fresh`` check says why."""
    return dg.FreshnessPolicy.time_window(fail_window=timedelta(
        seconds=settings.lake.freshness_seconds + FRESHNESS_POLICY_SLACK_SECONDS))


def _target_spec(settings: Settings, schema: TableSchema) -> dg.AssetSpec:
    return dg.AssetSpec(
        key=target_key(settings, schema),
        group_name=target_group(settings, schema),
        kinds={"spark", "iceberg"},
        description=f"Iceberg table for {schema.table_id} on "
        f"{settings.source.server_name!r}: the landed changes and committed snapshot chunks "
        "folded by highest position per key (deletes and snapshot range assertions applied) "
        "and merged as one Iceberg snapshot per run, carrying the changelog mark it consumed.",
        metadata={"primary_key": ", ".join(schema.primary_key) or "(none)"},
        freshness_policy=freshness_policy(settings),
        # Stream records and committed snapshot chunks both arrive through the changelog.
        deps=[changelog_key(settings), snapshot_key(settings, schema)],
    )


def _check_specs(settings: Settings, schema: TableSchema) -> list[dg.AssetCheckSpec]:
    key = target_key(settings, schema)
    return [
        dg.AssetCheckSpec(
            "reconcile", asset=key, blocking=True,
            description=f"Compares {schema.table_id} on the source with its lake table by "
            "key-range checksums, drilling into mismatching ranges; fails on any missing, "
            "extra or different row. Run it when the target has caught up with the source.",
        ),
        dg.AssetCheckSpec(
            "not_stale", asset=key,
            description=f"Fails while a DDL on {schema.table_id} left its lake table with rows "
            "or values the changelog cannot correct (TRUNCATE, RENAME TABLE, partition "
            "DROP/EXCHANGE, ADD COLUMN with a default, type changes, ...), until a snapshot of "
            "the table that opened after the DDL is done and materialised "
            "(capture.resnapshot_on_ddl requests it).",
        ),
    ]


def staleness(settings: Settings, schema: TableSchema, consumed_pos: int | None) -> str | None:
    """Why the target (consumed up to ``consumed_pos``) is stale after a DDL, or None; markers
    whose re-snapshot the target has applied are forgotten (``capture.ddl.stale_markers``)."""
    return stalenesses(settings, [(schema, consumed_pos)])[schema.table_id]


def stalenesses(settings: Settings, targets: list[tuple[TableSchema, int | None]]
                ) -> dict[str, str | None]:
    """``staleness`` of several targets, the markers read once (the applier's merges of a
    thousand tables: one read of the markers, not one per merge)."""
    landing = LandingZone.from_settings(settings)
    markers = stale_markers.resolve_markers(landing)
    found = {}
    for schema, consumed_pos in targets:
        stale_markers.forget_applied(landing, markers, schema.table_id, consumed_pos)
        found[schema.table_id] = stale_markers.target_staleness(markers, schema.table_id,
                                                                consumed_pos)
    return found


class _Targets:
    """One run of the target assets: each selected table materialised, then its selected
    checks, in one Spark session; what failed, by table."""

    def __init__(self, context: dg.AssetExecutionContext, settings: Settings) -> None:
        self.context, self.settings = context, settings
        self.server = settings.source.server_name
        self.spark = context.resources.pyspark.spark_session
        self.source: SourceSession = getattr(context.resources, source_resource_key(settings))
        self.failed: list[str] = []

    def table(self, schema: TableSchema, materialise_it: bool, checks: set[str]
              ) -> Iterator[dg.MaterializeResult | dg.AssetCheckResult]:
        if materialise_it:
            try:
                yield self._materialise(schema)
            except Exception as error:  # noqa: BLE001 - the table's failure, said at the end
                self._failed(schema, "materialisation", error)
                return  # (its checks would judge a target this run did not make)
        for name, check in (("not_stale", self._not_stale), ("reconcile", self._reconcile)):
            if name in checks:
                try:
                    yield check(schema)
                except Exception as error:  # noqa: BLE001 - as above
                    self._failed(schema, f"{name} check", error)
                    yield dg.AssetCheckResult(
                        asset_key=target_key(self.settings, schema), check_name=name,
                        passed=False, severity=dg.AssetCheckSeverity.ERROR,
                        description=f"the check failed to run: {_one_line(error)}"[:1000])

    def _failed(self, schema: TableSchema, what: str, error: BaseException) -> None:
        self.context.log.error(f"{schema.table_id}: {what} failed: {_one_line(error)}")
        self.failed.append(f"{schema.table_id} ({what}): {_one_line(error)}")

    def _materialise(self, schema: TableSchema) -> dg.MaterializeResult:
        for attempt in range(1, MATERIALISE_ATTEMPTS + 1):
            try:
                result = materialise(
                    self.spark, self.settings.landing_zone.url, self.settings.warehouse.url,
                    self.server, schema, schema.database, schema.table,
                    catalog=self.settings.warehouse.catalog, s3=self.settings.s3)
                break
            except Exception as error:
                if attempt == MATERIALISE_ATTEMPTS:
                    raise
                self.context.log.warning(f"{schema.table_id}: {_one_line(error)}; materialising "
                                         f"again in {RETRY_SECONDS:g}s (attempt {attempt + 1} "
                                         f"of {MATERIALISE_ATTEMPTS})")
                time.sleep(RETRY_SECONDS)
        self.context.log.info(
            f"{schema.table_id}: {result.identifier} snapshot {result.snapshot_id} "
            f"({'new' if result.committed else 'unchanged'}), {result.records_read} changelog "
            f"records merged, {result.rows} rows"
        )
        stale_reason = staleness(self.settings, schema, result.consumed_pos)
        if stale_reason:
            self.context.log.warning(f"{schema.table_id}: target stale: {stale_reason}")
        return dg.MaterializeResult(asset_key=target_key(self.settings, schema), metadata={
            "stale": stale_reason is not None,
            "stale_reason": stale_reason or "",
            **result.metadata(),
        })

    def _not_stale(self, schema: TableSchema) -> dg.AssetCheckResult:
        target = LakeTable(Lake.from_settings(self.spark, self.settings),
                           self.server, schema.database, schema.table)
        _, marked = target.base_and_mark()
        reason = staleness(self.settings, schema, marked.consumed_pos if marked else None)
        return dg.AssetCheckResult(
            asset_key=target_key(self.settings, schema), check_name="not_stale",
            passed=reason is None,
            severity=dg.AssetCheckSeverity.ERROR,
            metadata={"stale_reason": reason or ""},
            description=reason,
        )

    def _reconcile(self, schema: TableSchema) -> dg.AssetCheckResult:
        settings, key = self.settings, target_key(self.settings, schema)
        connection = settings.source.connection_settings()
        current = self.source.read_schema(schema.database, schema.table)
        if current is None:
            return dg.AssetCheckResult(
                asset_key=key, check_name="reconcile", passed=False,
                severity=dg.AssetCheckSeverity.ERROR,
                description=f"{missing_table(schema.table_id)}: nothing to compare its "
                            "target with")
        target = LakeTable(Lake.from_settings(self.spark, settings),
                           self.server, schema.database, schema.table)
        snapshot, marked = target.base_and_mark()
        if snapshot is None:
            return dg.AssetCheckResult(
                asset_key=key, check_name="reconcile", passed=False,
                severity=dg.AssetCheckSeverity.ERROR,
                description=f"{target.identifier} has no snapshot yet: materialise it first")
        result = reconcile_table(
            self.spark, target.read(snapshot_id=snapshot.snapshot_id), connection, current,
            range_rows=settings.reconcile.range_rows, sample_keys=settings.reconcile.sample_keys,
        )
        self.context.log.info(
            f"{schema.table_id}: source {result.source_rows} rows, target {result.target_rows}; "
            f"missing {result.missing}, extra {result.extra}, different {result.different}"
        )
        metadata = result.to_metadata()
        # Differences with a target behind the source may only be lag: show both positions.
        metadata["target_gtid"] = marked.consumed_gtid if marked else None
        metadata["iceberg_snapshot_id"] = str(snapshot.snapshot_id)
        return dg.AssetCheckResult(
            asset_key=key, check_name="reconcile",
            passed=result.ok,
            severity=dg.AssetCheckSeverity.ERROR,
            metadata=metadata,
            description=None if result.ok else (
                f"{result.missing} missing, {result.extra} extra, {result.different} different "
                f"rows; if the target is behind the source (target_gtid vs source_gtid), "
                "materialise it again first, otherwise re-snapshot the table"),
        )


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def target_assets(settings: Settings, keyed: list[TableSchema]) -> dg.AssetsDefinition:
    """The target assets of the tables with a key, with their ``reconcile`` and ``not_stale``
    checks, as one subsettable multi-asset (a run materialises the selected tables one after
    another, then checks each)."""
    server = settings.source.server_name
    by_key = {target_key(settings, t): t for t in keyed}

    @subsettable_assets(
        targets_op_name(settings), [_target_spec(settings, t) for t in keyed],
        check_specs=[spec for t in keyed for spec in _check_specs(settings, t)],
        required_resource_keys={"pyspark", source_resource_key(settings)},
        description=f"Materialises the selected lake tables of {server!r} (one MERGE INTO "
        "each), then runs their selected checks; one table's failure fails the step at the "
        "end, naming it, after the others.",
    )
    def targets(context: dg.AssetExecutionContext
                ) -> Iterator[dg.MaterializeResult | dg.AssetCheckResult]:
        run = _Targets(context, settings)
        selected = set(context.selected_asset_keys)
        checks: dict[dg.AssetKey, set[str]] = {}
        for check in context.selected_asset_check_keys:
            checks.setdefault(check.asset_key, set()).add(check.name)
        for key in sorted(selected | set(checks), key=lambda k: k.to_user_string()):
            yield from run.table(by_key[key], key in selected, checks.get(key, set()))
        if run.failed:
            raise dg.Failure(description=f"{len(run.failed)} of the selected tables of "
                             f"{server!r} failed (the others are recorded): "
                             + "; ".join(run.failed), allow_retries=False)

    return targets


def build(settings: Settings, tables: list[TableSchema]) -> dg.Definitions:
    keyed = [t for t in tables if t.primary_key]
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
    return dg.Definitions(assets=[target_assets(settings, keyed)] if keyed else [], jobs=jobs)
