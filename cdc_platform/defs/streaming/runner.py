"""Run the capture engine inside a Dagster step (in a thread: see ``defs/threaded.py``); on
interrupt the engine flushes and checkpoints before the step ends. What the changelog asset
shows of the run: the engine's stats, its lag behind the source and the binlog headroom of
its checkpoint (``capture/binlog/headroom.py``)."""

from __future__ import annotations

from typing import Any

import dagster as dg

from cdc_platform.capture.binlog.headroom import (
    BinlogHeadroom,
)
from cdc_platform.capture.engine import CaptureEngine, EngineOptions, EngineStats
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.metrics import serve_engine_metrics
from cdc_platform.capture.standing import StandingReport, checkpoint_headroom
from cdc_platform.capture.start_errors import check_source
from cdc_platform.config import Settings
from cdc_platform.defs.failures import start_errors_fail_the_run
from cdc_platform.defs.threaded import QueueLog, run_in_thread

STOP_GRACE_SECONDS = 60.0
#: The tag of ``stream_changes`` runs (value: the server name): one engine per source.
STREAM_TAG = "cdc_platform/stream"


def changelog_key(settings: Settings) -> dg.AssetKey:
    return dg.AssetKey([settings.source.server_name, "changelog"])


def stats_metadata(stats: EngineStats) -> dict[str, Any]:
    return {
        "events": stats.events,
        "transactions": stats.transactions,
        "records_landed": stats.records,
        "records_by_table": dg.MetadataValue.json(stats.records_by_table),
        "gtid_position": stats.position,
        "next_changelog_position": stats.next_pos,
        "engine_state": stats.state,
        "reconnects": stats.reconnects,
        "ddl_statements": stats.ddl_statements,
        "segments_written": stats.segments_written,
        "duration_seconds": round(stats.elapsed_seconds, 2),
        "records_per_second": round(stats.records / max(stats.elapsed_seconds, 1e-9), 1),
    }


def standing_metadata(engine_lag: float | None, headroom: BinlogHeadroom | None
                      ) -> dict[str, Any]:
    """The engine's lag and the binlog headroom as changelog metadata; a figure that is not
    known is left out (``binlog_headroom`` says why)."""
    metadata: dict[str, Any] = {}
    if engine_lag is not None:
        metadata["engine_lag_seconds"] = round(engine_lag, 1)
    if headroom is None:
        return metadata
    metadata["binlog_headroom"] = headroom.describe()
    metadata["binlog_headroom_status"] = headroom.status.value
    if headroom.seconds is not None:
        metadata["binlog_headroom_seconds"] = round(headroom.seconds, 1)
    if headroom.bytes_left is not None:
        metadata["binlog_headroom_bytes"] = headroom.bytes_left
    if headroom.needed_file:
        metadata["binlog_needed_file"] = headroom.needed_file
    if headroom.retention_seconds is not None:
        metadata["binlog_retention_seconds"] = headroom.retention_seconds
    return metadata


def changelog_metadata(settings: Settings, stats: EngineStats) -> dict[str, Any]:
    """The metadata of the changelog materialisation that ends a run: its stats, its lag and
    the headroom of the checkpoint it leaves."""
    lag = 0.0 if stats.caught_up else stats.lag_seconds
    return {**stats_metadata(stats), **standing_metadata(lag, checkpoint_headroom(settings)[1])}


def run_engine(
    context: dg.OpExecutionContext | dg.AssetExecutionContext,
    settings: Settings,
    stop_when_caught_up: bool,
    caught_up_idle_seconds: float = 0.0,
    progress_seconds: float = 30.0,
    report_materializations: bool = False,
) -> EngineStats:
    """Run the engine until it stops; relay its log; stop it cleanly on interrupt. The
    account and source settings are checked first; a start error or an engine stop fails the
    run with its one line (``defs.failures``)."""
    with start_errors_fail_the_run(settings):
        check_source(settings)
        return _run_engine(context, settings, stop_when_caught_up, caught_up_idle_seconds,
                           progress_seconds, report_materializations)


def _run_engine(
    context: dg.OpExecutionContext | dg.AssetExecutionContext,
    settings: Settings,
    stop_when_caught_up: bool,
    caught_up_idle_seconds: float,
    progress_seconds: float,
    report_materializations: bool,
) -> EngineStats:
    log = QueueLog()
    landing = LandingZone.from_settings(settings)
    engine = CaptureEngine(EngineOptions.from_settings(settings), landing, log=log)
    standing = StandingReport(lambda: checkpoint_headroom(settings)[1], context.log)

    def progress() -> None:
        stats = engine.stats
        lag, headroom = standing.tick(stats)
        lag_text = "-" if lag is None else f"{lag:.1f}s"
        context.log.info(f"capture engine: {stats.records} records in {stats.transactions} "
                         f"transactions, GTID {stats.position or '-'}, lag {lag_text}")
        if report_materializations:
            context.log_event(dg.AssetMaterialization(
                asset_key=changelog_key(settings),
                metadata={**stats_metadata(stats), **standing_metadata(lag, headroom)}))

    endpoint = serve_engine_metrics(engine, settings, standing.headroom)
    if endpoint is not None:
        context.log.info(f"capture engine metrics: {endpoint.url}")
    try:
        run_in_thread(
            context, "capture-engine",
            lambda stop: engine.run(stop, stop_when_caught_up, caught_up_idle_seconds), log,
            every=progress_seconds, on_tick=progress,
            stopping="capture engine: stop requested (run cancelled or interrupted); flushing "
            "and checkpointing",
            grace_seconds=STOP_GRACE_SECONDS,
            not_stopped=f"capture engine did not stop within {STOP_GRACE_SECONDS}s; the next "
            "run resumes from the last checkpoint")
    finally:
        if endpoint is not None:
            endpoint.close()
    return engine.stats
