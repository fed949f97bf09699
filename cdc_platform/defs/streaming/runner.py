"""Run the capture engine inside a Dagster step.

The engine runs in its own thread so that Dagster's interrupt (run cancellation, SIGTERM),
which arrives as an exception in the step's main thread at an arbitrary point, never lands in
the middle of the engine's bookkeeping: the main thread turns it into a stop request and waits
for the engine to flush and checkpoint. Engine log lines are relayed to the run's log from the
main thread (the Dagster log manager is not meant to be called from other threads).
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import dagster as dg

from cdc_platform.capture.engine import CaptureEngine, EngineOptions, EngineStats
from cdc_platform.capture.landing import LandingZone
from cdc_platform.config import Settings

STOP_GRACE_SECONDS = 60.0


class _QueueLog:
    """A logger-shaped object the engine thread writes to; the step's thread drains it."""

    def __init__(self) -> None:
        self.lines: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()

    def __getattr__(self, level: str) -> Any:
        def emit(message: str, *args: Any, **_: Any) -> None:
            self.lines.put((level, message % args if args else message))
        return emit


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
    """Run the engine until it stops; relay its log; stop it cleanly on interrupt."""
    log = _QueueLog()
    landing = LandingZone(settings.landing_zone.url, settings.source.server_name)
    engine = CaptureEngine(EngineOptions.from_settings(settings), landing, log=log)
    stop = threading.Event()
    failure: list[BaseException] = []

    done = threading.Event()

    def target() -> None:
        try:
            engine.run(stop, stop_when_caught_up, caught_up_idle_seconds)
        except BaseException as error:  # noqa: BLE001 - handed to the step's thread
            failure.append(error)
        finally:
            done.set()

    def relay() -> None:
        while True:
            try:
                level, message = log.lines.get_nowait()
            except queue.Empty:
                return
            getattr(context.log, level if level in ("info", "warning", "error") else "info")(
                message)

    # Completion is signalled by an Event, not Thread.is_alive(): on CPython 3.11 a join()
    # interrupted by a signal can leave is_alive() False while the thread still runs.
    threading.Thread(target=target, name="capture-engine", daemon=True).start()
    next_progress = time.monotonic() + progress_seconds
    try:
        while not done.wait(timeout=0.5):
            relay()
            if time.monotonic() >= next_progress:
                next_progress = time.monotonic() + progress_seconds
                stats = engine.stats
                context.log.info(
                    f"capture engine: {stats.records} records in {stats.transactions} "
                    f"transactions, GTID {stats.position or '-'}, lag {stats.lag_seconds}s"
                )
                if report_materializations:
                    context.log_event(dg.AssetMaterialization(
                        asset_key=changelog_key(settings), metadata=stats_metadata(stats)))
    except BaseException:
        context.log.info("capture engine: stop requested (run cancelled or interrupted); "
                         "flushing and checkpointing")
        stop.set()
        if not done.wait(timeout=STOP_GRACE_SECONDS):
            context.log.error(f"capture engine did not stop within {STOP_GRACE_SECONDS}s; "
                              "the next run resumes from the last checkpoint")
        relay()
        raise
    relay()
    if failure:
        raise failure[0]
    return engine.stats
