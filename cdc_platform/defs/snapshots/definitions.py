"""The snapshots domain: one incremental-snapshot asset per captured table.

Materialising ``[server, "snapshot", db, table]`` opens a snapshot session for the table, reads
it in chunks while the ``stream_changes`` job keeps running, and finishes when the engine has
committed the last chunk (docs/snapshots.md). The chunk rows reach the lake table through the
changelog, so the target asset ``[server, db, table]`` is downstream of it. Snapshot assets are
in no job: each materialisation is its own run, and runs of different tables go in parallel.
"""


from collections.abc import Iterator

import dagster as dg
from pydantic import Field

from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.names import joined_name
from cdc_platform.capture.schema import TableSchema
from cdc_platform.capture.snapshot.chunks import (
    DEFAULT_CHUNK_MAX_BYTES,
    SkippedTable,
    snapshot_key_problem,
)
from cdc_platform.capture.snapshot.conditions import UnsafeConditionError, validate_condition
from cdc_platform.capture.snapshot.errors import (
    EngineStalledError,
    SnapshotError,
)
from cdc_platform.capture.snapshot.protocol import (
    DEFAULT_CHUNK_SIZE,
    SignalRef,
)
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
from cdc_platform.defs.names import single_asset, source_resource_key
from cdc_platform.defs.snapshots.runner import notify_skipped, result_metadata, run_reader


class SnapshotConfig(dg.Config):
    """Run config of a snapshot asset."""

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
        "matching rows are snapshotted, and target rows outside it are left alone.",
    )
    surrogate_key: list[str] = Field(
        default_factory=list,
        description="Columns that identify rows of a table without a primary key (in key "
        "order); must match capture.surrogate_keys, where the key is configured for the stream "
        "and the target too. Without a primary key or a configured surrogate key, the table is "
        "skipped.",
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
        description="Retries of the step, each after engine_retry_seconds, when the capture "
        "engine acknowledged the session and then stopped deciding its chunks (stream_changes "
        "went down); a retry resumes the session where it stopped.",
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
    """The start of the session ids a Dagster run's reader opens (``<prefix>-<random>``), so
    the sensor can tell a run's own session in request.json."""
    return f"run-{run_id[:8]}"


def snapshot_key(settings: Settings, schema: TableSchema) -> dg.AssetKey:
    return dg.AssetKey([settings.source.server_name, "snapshot", schema.database, schema.table])


def _current_schema(settings: Settings, source: SourceSession, schema: TableSchema
                    ) -> TableSchema:
    """The table's schema now, after column exclusion: chunks must match the binlog schema."""
    current = source.read_schema(schema.database, schema.table)
    if current is None:
        raise dg.Failure(description=f"snapshot of {schema.table_id} on "
                         f"{settings.source.server_name!r}: {missing_table(schema.table_id)}")
    return current


def _snapshot_asset(settings: Settings, schema: TableSchema) -> dg.AssetsDefinition:
    server = settings.source.server_name
    key_text = ", ".join(schema.primary_key) or "(none: set capture.surrogate_keys)"

    @single_asset(
        dg.AssetSpec(
            key=snapshot_key(settings, schema),
            group_name=f"{server}_snapshots",
            kinds={"mariadb" if settings.source.flavour == "mariadb" else "mysql", "parquet"},
            description=f"Incremental snapshot of {schema.table_id} on {server!r}: reads the "
            "table in keyset chunks between GTID watermarks, without locks or writes on the "
            "source, while the stream_changes job runs; that job commits each chunk into the "
            "changelog. Finishes when the whole table is committed. A snapshot that is stopped "
            "or skipped records an observation with its status, not a materialisation.",
            metadata={"chunk_key": key_text},
        ),
        op_name=joined_name(server, "snapshot", schema.database, schema.table),
        required=False,
        required_resource_keys={source_resource_key(settings)},
    )
    def snapshot(context: dg.AssetExecutionContext, config: SnapshotConfig
                 ) -> Iterator[dg.MaterializeResult | dg.AssetObservation]:
        source: SourceSession = getattr(context.resources, source_resource_key(settings))
        condition = config.condition
        if condition is not None:
            try:
                condition = validate_condition(condition)
            except UnsafeConditionError as error:
                raise dg.Failure(description=f"snapshot of {schema.table_id} on {server!r}: "
                                 f"{error}") from None
        with start_errors_fail_the_run(settings):  # one line: the grant or setting to fix
            check_source(settings)
            current = _current_schema(settings, source, schema)
        if not current.primary_key and config.surrogate_key:
            status = SkippedTable(schema.table_id,
                                  snapshot_key_problem(current, config.surrogate_key) or "").status
            context.log.warning(f"snapshot of {schema.table_id}: {status}")
            notify_skipped(context, settings, schema.table_id,
                           config.signal_id or context.run.run_id, status)
            yield dg.AssetObservation(asset_key=context.asset_key,
                                      metadata={"status": status, "rows": 0, "chunks": 0})
            return
        reader = SnapshotReader(
            LandingZone.from_settings(settings, server),
            settings.source.connection_settings(),
            settings.source.flavour,
            current,
            surrogate_key=config.surrogate_key or None,
            condition=condition,
            chunk_size=config.chunk_size,
            chunk_max_bytes=config.chunk_max_bytes,
            session_id=new_session_id(run_session_prefix(context.run.run_id)),
            selector=selector_from_settings(settings),
            ack_timeout_seconds=config.ack_timeout_seconds,
            stall_timeout_seconds=config.stall_timeout_seconds,
            signal=config.signal_ref(),
        )
        try:
            result = run_reader(context, settings, reader, config.signal_id or context.run.run_id,
                                config.progress_seconds)
        except EngineStalledError as error:
            if context.retry_number < config.engine_retries:
                context.log.warning(f"{error}; retrying in {config.engine_retry_seconds:.0f}s "
                                    f"(retry {context.retry_number + 1} of "
                                    f"{config.engine_retries})")
                raise dg.RetryRequested(max_retries=config.engine_retries,
                                        seconds_to_wait=config.engine_retry_seconds) from error
            raise dg.Failure(description=str(error), allow_retries=False) from error
        except SnapshotError as error:  # the message says what to do: show it as the failure
            raise dg.Failure(description=str(error), allow_retries=False) from error
        metadata = {**result_metadata(result), "chunk_size": config.chunk_size,
                    "condition": condition or ""}
        if result.status is not SnapshotStatus.DONE:
            # Stopped or skipped: the table was not (wholly) snapshotted, so the asset is not
            # shown as freshly materialised; the chunks committed before a stop stay applied.
            if result.skipped:
                context.log.warning(f"snapshot of {schema.table_id}: {result.status_text}")
            yield dg.AssetObservation(asset_key=context.asset_key, metadata=metadata)
            return
        yield dg.MaterializeResult(metadata=metadata)

    return snapshot


def snapshot_assets(settings: Settings, tables: list[TableSchema]
                    ) -> dict[str, dg.AssetsDefinition]:
    """One per captured table (``db.table`` -> asset); a table without a primary key needs a
    configured surrogate key, or its runs end as skipped."""
    return {t.table_id: _snapshot_asset(settings, t) for t in tables}


def build(settings: Settings, assets: dict[str, dg.AssetsDefinition]) -> dg.Definitions:
    return dg.Definitions(assets=list(assets.values()))
