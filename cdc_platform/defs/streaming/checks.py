"""The changelog's ``binlog_headroom`` check: passes while the source keeps the binlog file the
engine's checkpoint needs long enough (``capture/binlog/headroom.py`` forecasts it); fails,
naming it, when the headroom is low, the file is purged, or it cannot be told. The sensor
``<server>_binlog_headroom`` (``sensors.py``) records it as it changes, running engine or not;
it can also be run on its own."""


from dataclasses import dataclass
from typing import Any

import dagster as dg

from cdc_platform.capture.binlog.headroom import (
    BinlogHeadroom,
    HeadroomStatus,
    checkpoint_lag_seconds,
)
from cdc_platform.capture.names import joined_name
from cdc_platform.capture.standing import checkpoint_headroom
from cdc_platform.config import Settings
from cdc_platform.defs.names import single_asset_check
from cdc_platform.defs.streaming.runner import STREAM_TAG, changelog_key, standing_metadata

CHECK_NAME = "binlog_headroom"
_PASSING = (HeadroomStatus.OK, HeadroomStatus.UNBOUNDED, HeadroomStatus.NO_CHECKPOINT)
_ACTIVE = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED,
           dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
           dg.DagsterRunStatus.CANCELING]


@dataclass(frozen=True)
class Standing:
    """The checkpoint against the source, seen from outside the engine: its binlog headroom
    and the engine's lag (``checkpoint_lag_seconds``: right whether the engine runs or not)."""

    headroom: BinlogHeadroom
    engine_lag: float | None
    engine_running: bool

    @property
    def passed(self) -> bool:
        return self.headroom.status in _PASSING

    def metadata(self) -> dict[str, Any]:
        return {**standing_metadata(self.engine_lag, self.headroom),
                "engine_running": self.engine_running}


def read_standing(settings: Settings, instance: dg.DagsterInstance) -> Standing:
    checkpoint, headroom = checkpoint_headroom(settings)
    lag = None
    if checkpoint is not None:
        lag = checkpoint_lag_seconds(checkpoint.written_at, checkpoint.lag_seconds,
                                     headroom.caught_up)
    runs = instance.get_runs(filters=dg.RunsFilter(
        statuses=_ACTIVE, tags={STREAM_TAG: settings.source.server_name}), limit=1)
    return Standing(headroom, lag, bool(runs))


def evaluation(settings: Settings, standing: Standing) -> dg.AssetCheckEvaluation:
    return dg.AssetCheckEvaluation(
        asset_key=changelog_key(settings), check_name=CHECK_NAME, passed=standing.passed,
        severity=dg.AssetCheckSeverity.WARN, description=standing.headroom.describe(),
        metadata=standing.metadata())


def headroom_check(settings: Settings) -> dg.AssetChecksDefinition:
    server = settings.source.server_name

    @single_asset_check(
        dg.AssetCheckSpec(
            CHECK_NAME, asset=changelog_key(settings),
            description=f"Passes while {server!r} keeps the binlog file the capture engine's "
            "checkpoint needs for long enough: fails when the source may purge it within a "
            "quarter of its binlog retention or an hour (whichever is longer), when it is "
            "purged already (the engine cannot resume exactly), or when the headroom cannot "
            f"be read (the reason is given). The sensor {server}_binlog_headroom records it "
            "as it changes, while the engine runs and while it is stopped."),
        op_name=joined_name(CHECK_NAME, server),
    )
    def binlog_headroom(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        found = evaluation(settings, read_standing(settings, context.instance))
        return dg.AssetCheckResult(passed=found.passed, severity=found.severity,
                                   description=found.description, metadata=found.metadata)

    return binlog_headroom
