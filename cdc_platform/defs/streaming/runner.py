"""Run the capture engine inside a Dagster step (in a thread: see ``defs/threaded.py``); on
interrupt the engine flushes and checkpoints before the step ends."""

from __future__ import annotations

from typing import Any

import dagster as dg

from cdc_platform.capture.engine import CaptureEngine, EngineOptions, EngineStats
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.start_errors import check_source
from cdc_platform.config import Settings
from cdc_platform.defs.failures import start_errors_fail_the_run
from cdc_platform.defs.threaded import QueueLog, run_in_thread

STOP_GRACE_SECONDS = 60.0


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
        "lag_seconds": stats.lag_seconds if stats.lag_seconds is not None else -1.0,
        "reconnects": stats.reconnects,
        "ddl_statements": stats.ddl_statements,
        "segments_written": stats.segments_written,
        "duration_seconds": round(stats.elapsed_seconds, 2),
        "records_per_second": round(stats.records / max(stats.elapsed_seconds, 1e-9), 1),
    }


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
    landing = LandingZone(settings.landing_zone.url, settings.source.server_name)
    engine = CaptureEngine(EngineOptions.from_settings(settings), landing, log=log)

    def progress() -> None:
        stats = engine.stats
        context.log.info(f"capture engine: {stats.records} records in {stats.transactions} "
                         f"transactions, GTID {stats.position or '-'}, lag {stats.lag_seconds}s")
        if report_materializations:
            context.log_event(dg.AssetMaterialization(
                asset_key=changelog_key(settings), metadata=stats_metadata(stats)))

    run_in_thread(
        context, "capture-engine",
        lambda stop: engine.run(stop, stop_when_caught_up, caught_up_idle_seconds), log,
        every=progress_seconds, on_tick=progress,
        stopping="capture engine: stop requested (run cancelled or interrupted); flushing and "
        "checkpointing",
        grace_seconds=STOP_GRACE_SECONDS,
        not_stopped=f"capture engine did not stop within {STOP_GRACE_SECONDS}s; the next run "
        "resumes from the last checkpoint")
    return engine.stats
