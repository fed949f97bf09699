"""The snapshots domain: an incremental-snapshot asset per captured table, all of a source's
in one subsettable multi-asset.

Materialising ``[server, "snapshot", db, table]`` opens a snapshot session for the table, reads
it in chunks while the ``stream_changes`` job keeps running, and finishes when the engine has
committed the last chunk (docs/snapshots.md). The chunk rows reach the lake table through the
changelog, so the target asset ``[server, db, table]`` is downstream of it.

The assets of one source are one ``@multi_asset`` (op ``<server>__snapshot``, ``can_subset``):
a run materialises the tables it selects, a few at a time (``defs/snapshots/runner.py``), so
many tables cost one run's start rather than one each, and one definition loads where a
thousand tables made a thousand ops. Each table still has its own asset, materialisation (or
observation when stopped or skipped), progress lines, notifications and failure. Snapshot
assets are in no job: the sensors and the UI launch runs of a selection of them.
"""

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import dagster as dg
from pydantic import Field

from cdc_platform.capture.landing.session_records import DEFAULT_CHUNK_SIZE, SignalRef
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.names import joined_name
from cdc_platform.capture.schema import TableSchema
from cdc_platform.capture.snapshot.chunks import (
    DEFAULT_CHUNK_MAX_BYTES,
    SkippedTable,
    snapshot_key_problem,
)
from cdc_platform.capture.snapshot.conditions import UnsafeConditionError, validate_condition
from cdc_platform.capture.snapshot.reading.metrics import ReadingTable, serve_snapshot_metrics
from cdc_platform.capture.snapshot.reading.progress import SnapshotStatus
from cdc_platform.capture.snapshot.reading.reader import (
    DEFAULT_ACK_TIMEOUT_SECONDS,
    DEFAULT_STALL_TIMEOUT_SECONDS,
    SnapshotReader,
    new_session_id,
)
from cdc_platform.capture.source import SourceSession, missing_table, selector_from_settings
from cdc_platform.capture.start_errors import check_source
from cdc_platform.config import Settings
from cdc_platform.defs.failures import start_errors_fail_the_run
from cdc_platform.defs.names import source_resource_key, subsettable_assets
from cdc_platform.defs.snapshots.runner import (
    Notifications,
    Retries,
    TableOutcome,
    TableRun,
    notify_skipped,
    result_metadata,
    run_tables,
)


class SnapshotConfig(dg.Config):
    """Run config of a source's snapshot assets (op ``<server>__snapshot``): the same for every
    table the run selects; ``condition`` and ``surrogate_key`` need a run of one table."""

    chunk_size: int = Field(
        default=DEFAULT_CHUNK_SIZE, ge=1,
        description="Rows per chunk (the default is where throughput levels off; see "
        "capture/snapshot/protocol.py).",
    )
    chunk_max_bytes: int = Field(
        default=DEFAULT_CHUNK_MAX_BYTES, ge=1,
        description="Bytes of values per chunk at most (a chunk holds at least one row): bounds "
        "the reader's and the engine's memory for tables of wide rows.",
    )
    condition: str | None = Field(
        default=None,
        description="Additional condition: a SQL boolean over the table's own columns; only "
        "matching rows are snapshotted, and target rows outside it are left alone. Only in a "
        "run of one table.",
    )
    surrogate_key: list[str] = Field(
        default_factory=list,
        description="Columns that identify rows of a table without a primary key (in key "
        "order); must match capture.surrogate_keys, where the key is configured for the stream "
        "and the target too. Without a primary key or a configured surrogate key, the table is "
        "skipped. Only in a run of one table.",
    )
    parallel_tables: int | None = Field(
        default=None, ge=1, le=64,
        description="Tables read at the same time, smallest first (default: "
        "capture.snapshot_readers).",
    )
    progress_seconds: float = Field(default=5.0, gt=0, description="Interval of progress lines.")
    ack_timeout_seconds: float = Field(
        default=DEFAULT_ACK_TIMEOUT_SECONDS, gt=0,
        description="How long to wait for the capture engine (stream_changes) to acknowledge "
        "the session before failing (the wait is logged).",
    )
    stall_timeout_seconds: float = Field(
        default=DEFAULT_STALL_TIMEOUT_SECONDS, gt=0,
        description="How long chunks may wait without the capture engine writing a checkpoint "
        "before the engine counts as gone (see engine_retries).",
    )
    engine_retries: int = Field(
        default=2, ge=0,
        description="Retries of a table's reading, each after engine_retry_seconds, when the "
        "capture engine acknowledged its session and then stopped deciding its chunks "
        "(stream_changes went down); a retry resumes the session where it stopped.",
    )
    engine_retry_seconds: float = Field(default=60.0, ge=0,
                                        description="Wait before such a retry.")
    signal_id: str | None = Field(
        default=None,
        description="Set by the signal sensor: the execute-snapshot signal behind this run (the "
        "id of its notifications).",
    )
    signal_topic_id: str | None = Field(
        default=None, description="Set by the signal sensor: the signal topic's Kafka id."
    )
    signal_offset: int | None = Field(
        default=None, description="Set by the signal sensor: the signal's offset in its topic."
    )

    def signal_ref(self) -> SignalRef | None:
        if self.signal_id is None or self.signal_topic_id is None or self.signal_offset is None:
            return None
        return SignalRef(self.signal_id, self.signal_topic_id, self.signal_offset)


def run_session_prefix(run_id: str) -> str:
    """The start of the session ids a Dagster run's readers open (``<prefix>-<random>``), so
    the sensor can tell a run's own sessions in request.json."""
    return f"run-{run_id[:8]}"


def snapshot_key(settings: Settings, schema: TableSchema) -> dg.AssetKey:
    return dg.AssetKey([settings.source.server_name, "snapshot", schema.database, schema.table])


def snapshot_op_name(settings: Settings) -> str:
    """The op of a source's snapshot assets: run config goes under ``ops.<this>.config``."""
    return joined_name(settings.source.server_name, "snapshot")


@dataclass(frozen=True)
class SnapshotAssets:
    """A source's snapshot assets: the multi-asset (None without tables), and each captured
    table's asset key by table id (what the sensors launch runs of)."""

    asset: dg.AssetsDefinition | None
    keys: dict[str, dg.AssetKey]
    op_name: str


def _spec(settings: Settings, schema: TableSchema) -> dg.AssetSpec:
    server = settings.source.server_name
    key_text = ", ".join(schema.primary_key) or "(none: set capture.surrogate_keys)"
    return dg.AssetSpec(
        key=snapshot_key(settings, schema),
        group_name=f"{server}_snapshots",
        kinds={"mariadb" if settings.source.flavour == "mariadb" else "mysql", "parquet"},
        description=f"Incremental snapshot of {schema.table_id} on {server!r}: reads the "
        "table in keyset chunks between GTID watermarks, without locks or writes on the "
        "source, while the stream_changes job runs; that job commits each chunk into the "
        "changelog. Finishes when the whole table is committed. A snapshot that is stopped "
        "or skipped records an observation with its status, not a materialisation.",
        metadata={"chunk_key": key_text},
    )


def _failure(settings: Settings, schema: TableSchema, text: str) -> dg.Failure:
    return dg.Failure(description=f"snapshot of {schema.table_id} on "
                      f"{settings.source.server_name!r}: {text}", allow_retries=False)


def _by_size(source: SourceSession, tables: Sequence[TableSchema]) -> list[TableSchema]:
    """Smallest first, by the server's row estimates: a large table read first would hold the
    small ones back (each is visible in the lake once its snapshot is done)."""
    estimates = source.estimated_rows([(t.database, t.table) for t in tables])
    return sorted(tables, key=lambda t: (estimates.get((t.database, t.table), 0), t.table_id))


def snapshot_assets(settings: Settings, tables: list[TableSchema]) -> SnapshotAssets:
    """The snapshot asset of every captured table; a table without a primary key needs a
    configured surrogate key, or its snapshots end as skipped."""
    server = settings.source.server_name
    op_name = snapshot_op_name(settings)
    keys = {t.table_id: snapshot_key(settings, t) for t in tables}
    if not tables:
        return SnapshotAssets(None, keys, op_name)
    by_key = {snapshot_key(settings, t): t for t in tables}
    resource_key = source_resource_key(settings)

    @subsettable_assets(
        op_name, [_spec(settings, t) for t in tables],
        required_resource_keys={resource_key},
        description=f"Incremental snapshots of the selected tables of {server!r}, a few at a "
        "time (parallel_tables), smallest first.",
    )
    def snapshot(context: dg.AssetExecutionContext, config: SnapshotConfig
                 ) -> Iterator[dg.MaterializeResult | dg.AssetObservation]:
        source: SourceSession = getattr(context.resources, resource_key)
        selected = sorted((by_key[k] for k in context.selected_asset_keys),
                          key=lambda t: t.table_id)
        condition = config.condition
        if len(selected) > 1 and (condition is not None or config.surrogate_key):
            raise dg.Failure(description=f"snapshot of {len(selected)} tables of {server!r}: "
                             "condition and surrogate_key are a table's own; select one table "
                             "for them", allow_retries=False)
        if condition is not None:
            try:
                condition = validate_condition(condition)
            except UnsafeConditionError as error:
                raise _failure(settings, selected[0], str(error)) from None
        with start_errors_fail_the_run(settings):  # one line: the grant or setting to fix
            check_source(settings)
            current = source.read_schemas([(t.database, t.table) for t in selected])
            ordered = _by_size(source, selected)
        plan = _Plan(context, settings, config, condition)
        notifications = Notifications(context, settings)
        try:
            yield from plan.run(notifications, ordered, current)
        finally:
            notifications.close()

    return SnapshotAssets(snapshot, keys, op_name)


class _Plan:
    """One snapshot run: the readers of its tables and what each table's end records."""

    def __init__(self, context: dg.AssetExecutionContext, settings: Settings,
                 config: SnapshotConfig, condition: str | None) -> None:
        self.context, self.settings, self.config = context, settings, config
        self.condition = condition
        self.server = settings.source.server_name
        self.landing = LandingZone.from_settings(settings, self.server)
        self.failed: list[str] = []

    def run(self, notifications: Notifications, ordered: list[TableSchema],
            current: dict[tuple[str, str], TableSchema]
            ) -> Iterator[dg.MaterializeResult | dg.AssetObservation]:
        context, config = self.context, self.config
        tables: list[TableRun] = []
        schemas: dict[str, TableSchema] = {}
        for schema in ordered:
            key = snapshot_key(self.settings, schema)
            now = current.get((schema.database, schema.table))
            if now is None:
                self._failed(schema.table_id, missing_table(schema.table_id))
                yield dg.AssetObservation(asset_key=key, metadata={
                    "status": f"failed: {missing_table(schema.table_id)}"})
                continue
            table = TableRun(schema.table_id, key, self._reader_factory(now),
                             config.signal_id or context.run.run_id)
            if not now.primary_key and config.surrogate_key:
                status = SkippedTable(now.table_id, snapshot_key_problem(
                    now, config.surrogate_key) or "").status
                context.log.warning(f"snapshot of {now.table_id}: {status}")
                notify_skipped(notifications, table, status)
                yield dg.AssetObservation(asset_key=key,
                                          metadata={"status": status, "rows": 0, "chunks": 0})
                continue
            tables.append(table)
            schemas[table.table_id] = now
        if len(tables) > 1:
            parallel = min(config.parallel_tables or self.settings.capture.snapshot_readers,
                           len(tables))
            context.log.info(f"snapshot of {len(tables)} tables of {self.server!r}, "
                             f"{parallel} at a time, smallest first: "
                             f"{', '.join(t.table_id for t in tables[:20])}"
                             f"{' ...' if len(tables) > 20 else ''}")
        endpoint = serve_snapshot_metrics(self.settings, lambda: [
            ReadingTable(t.table_id, t.latest[0] if t.latest else None, t.ended)
            for t in tables], context.log)
        # (closed at once if the step stops here: that stops every reader)
        with contextlib.ExitStack() as stack:
            if endpoint is not None:
                stack.callback(endpoint.close)
            outcomes = stack.enter_context(contextlib.closing(run_tables(
                context, notifications, tables,
                parallel=config.parallel_tables or self.settings.capture.snapshot_readers,
                retries=Retries(config.engine_retries, config.engine_retry_seconds),
                progress_seconds=config.progress_seconds)))
            for outcome in outcomes:
                yield self._recorded(outcome)
        if self.failed:
            raise dg.Failure(
                description=f"snapshot of {len(self.failed)} of {len(ordered)} tables of "
                f"{self.server!r} failed (the others are recorded): " + "; ".join(self.failed),
                allow_retries=False)

    def _reader_factory(self, schema: TableSchema) -> Callable[[], SnapshotReader]:
        config, settings = self.config, self.settings

        def make() -> SnapshotReader:
            return SnapshotReader(
                self.landing,
                settings.source.connection_settings(),
                settings.source.flavour,
                schema,
                surrogate_key=config.surrogate_key or None,
                condition=self.condition,
                chunk_size=config.chunk_size,
                chunk_max_bytes=config.chunk_max_bytes,
                session_id=new_session_id(run_session_prefix(self.context.run.run_id)),
                selector=selector_from_settings(settings),
                ack_timeout_seconds=config.ack_timeout_seconds,
                stall_timeout_seconds=config.stall_timeout_seconds,
                signal=config.signal_ref(),
            )

        return make

    def _failed(self, table_id: str, reason: str) -> None:
        self.context.log.error(f"snapshot of {table_id} on {self.server!r} failed: {reason}")
        self.failed.append(f"{table_id}: {reason}")

    def _recorded(self, outcome: TableOutcome) -> dg.MaterializeResult | dg.AssetObservation:
        """A done table's materialisation; an observation for any other end (its status)."""
        table, result = outcome.table, outcome.result
        if result is None:
            reason = str(outcome.error) or type(outcome.error).__name__
            self._failed(table.table_id, reason)
            return dg.AssetObservation(asset_key=table.asset_key,
                                       metadata={"status": f"failed: {reason}"[:1000]})
        metadata = {**result_metadata(result), "chunk_size": self.config.chunk_size,
                    "condition": self.condition or ""}
        if result.status is not SnapshotStatus.DONE:
            # Stopped or skipped: the table was not (wholly) snapshotted, so the asset is not
            # shown as freshly materialised; the chunks committed before a stop stay applied.
            if result.skipped:
                self.context.log.warning(f"snapshot of {table.table_id}: {result.status_text}")
            return dg.AssetObservation(asset_key=table.asset_key, metadata=metadata)
        return dg.MaterializeResult(asset_key=table.asset_key, metadata=metadata)


def build(assets: SnapshotAssets) -> dg.Definitions:
    return dg.Definitions(assets=[assets.asset] if assets.asset is not None else [])
