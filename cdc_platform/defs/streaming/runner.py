"""Run the capture engine inside a Dagster step (in a thread: see ``defs/threaded.py``); on
interrupt the engine flushes and checkpoints before the step ends. What the changelog asset
shows of the run: the engine's stats, its lag behind the source and the binlog headroom of
its checkpoint (``capture/binlog/headroom.py``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import dagster as dg

from cdc_platform.capture.binlog.headroom import (
    BinlogHeadroom,
    HeadroomStatus,
    LagClock,
    read_headroom,
)
from cdc_platform.capture.engine import CaptureEngine, EngineOptions, EngineStats
from cdc_platform.capture.landing.zone import Checkpoint, LandingReader, LandingZone
from cdc_platform.capture.start_errors import check_source
from cdc_platform.config import Settings
from cdc_platform.defs.failures import start_errors_fail_the_run
from cdc_platform.defs.threaded import QueueLog, run_in_thread

STOP_GRACE_SECONDS = 60.0
#: The tag of ``stream_changes`` runs (value: the server name): one engine per source.
STREAM_TAG = "cdc_platform/stream"
#: The streaming run reads the binlog headroom from the source at most this often.
HEADROOM_EVERY_SECONDS = 60.0
#: While the headroom stays low, the run repeats its warning this often.
HEADROOM_WARN_EVERY_SECONDS = 900.0


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


def checkpoint_headroom(settings: Settings) -> tuple[Checkpoint | None, BinlogHeadroom]:
    """The engine's checkpoint and its binlog headroom, read now (a short-lived source
    session; never raises: what cannot be read is an UNKNOWN headroom naming it)."""
    try:
        checkpoint = LandingReader.open(settings.landing_zone.url, settings.source.server_name,
                                        s3=settings.s3).read_checkpoint()
    except (OSError, ValueError) as error:
        return None, BinlogHeadroom(HeadroomStatus.UNKNOWN,
                                    reason=f"the checkpoint cannot be read: {error}")
    headroom = read_headroom(settings.source.connection_settings(), settings.source.flavour,
                             None if checkpoint is None else checkpoint.gtid)
    return checkpoint, headroom


def changelog_metadata(settings: Settings, stats: EngineStats) -> dict[str, Any]:
    """The metadata of the changelog materialisation that ends a run: its stats, its lag and
    the headroom of the checkpoint it leaves."""
    lag = 0.0 if stats.caught_up else stats.lag_seconds
    return {**stats_metadata(stats), **standing_metadata(lag, checkpoint_headroom(settings)[1])}


class HeadroomProbe:
    """The binlog headroom, read at most every ``every`` seconds on a thread of its own: the
    step's thread (which relays the engine's log and handles interrupts) never waits for the
    source, and a slow or unreachable source leaves the previous reading standing."""

    def __init__(self, read: Callable[[], BinlogHeadroom],
                 every: float = HEADROOM_EVERY_SECONDS) -> None:
        self._read = read
        self._every = every
        self._thread: threading.Thread | None = None
        self._started_at = float("-inf")
        # (count, reading): replaced whole by the reading thread, so a poll sees both as one
        self._reading: tuple[int, BinlogHeadroom | None] = (0, None)
        self._seen = 0

    def poll(self) -> tuple[BinlogHeadroom | None, bool]:
        """The newest reading and whether it is new since the last poll; starts the next
        reading when one is due and none is under way."""
        count, latest = self._reading
        new, self._seen = count != self._seen, count
        now = time.monotonic()
        idle = self._thread is None or not self._thread.is_alive()
        if idle and now - self._started_at >= self._every:
            self._started_at = now
            self._thread = threading.Thread(target=self._run, name="binlog-headroom",
                                            daemon=True)
            self._thread.start()
        return latest, new

    def _run(self) -> None:
        self._reading = (self._reading[0] + 1, self._read())


class StandingReport:
    """What each progress tick adds to the run: the engine's lag (``LagClock``) and the newest
    headroom reading (``HeadroomProbe``), with a warning in the run's log when the headroom is
    low (when it becomes low, then every ``HEADROOM_WARN_EVERY_SECONDS``)."""

    def __init__(self, read: Callable[[], BinlogHeadroom], log: Any,
                 every: float = HEADROOM_EVERY_SECONDS) -> None:
        self._log = log
        self._clock = LagClock()
        self._probe = HeadroomProbe(read, every)
        self._status: HeadroomStatus | None = None
        self._warned_at = float("-inf")
        self._probe.poll()  # (the first reading starts now)

    def tick(self, stats: EngineStats) -> tuple[float | None, BinlogHeadroom | None]:
        headroom, new = self._probe.poll()
        caught_up = stats.caught_up or bool(new and headroom is not None and headroom.caught_up)
        lag = self._clock.lag(time.time(), stats.lag_seconds, stats.transactions, stats.events,
                              caught_up)
        if new and headroom is not None:
            self.tell(headroom)
        return lag, headroom

    def tell(self, headroom: BinlogHeadroom) -> None:
        """Log a new reading: a warning when low (rate-limited), its text when it changes."""
        now = time.monotonic()
        changed, self._status = headroom.status != self._status, headroom.status
        if headroom.low:
            if changed or now - self._warned_at >= HEADROOM_WARN_EVERY_SECONDS:
                self._warned_at = now
                self._log.warning(f"binlog headroom {headroom.describe()}")
        elif changed:
            self._log.info(f"binlog headroom: {headroom.describe()}")


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
