"""The sensor that watches the changelog's binlog headroom, above all while the capture engine
is stopped (then nothing moves the checkpoint on, and nothing keeps the source from purging
the binlog it needs). Each evaluation records an observation of the changelog with the
engine's lag and the headroom, warns in its log when the headroom is low, and records the
``binlog_headroom`` check (``checks.py``) when its outcome changes, and at least hourly."""

from __future__ import annotations

import json
import time

import dagster as dg

from cdc_platform.capture.standing import HEADROOM_EVERY_SECONDS
from cdc_platform.config import Settings
from cdc_platform.defs.streaming.checks import evaluation, read_standing
from cdc_platform.defs.streaming.runner import changelog_key

#: The check's result is recorded when it changes, and at least this often.
REPORT_EVERY_SECONDS = 3600.0


def sensor_name(settings: Settings) -> str:
    return f"{settings.source.server_name}_binlog_headroom"


def build_headroom_sensor(settings: Settings) -> dg.SensorDefinition:
    server = settings.source.server_name

    @dg.sensor(
        name=sensor_name(settings),
        minimum_interval_seconds=int(HEADROOM_EVERY_SECONDS),
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Records how far {server!r}'s capture checkpoint stands from losing its "
        "binlog, running engine or not: an observation of the changelog with the engine's lag "
        "and the binlog headroom (until the source may purge the file the checkpoint needs), "
        "and the changelog's binlog_headroom check, which fails when it is low.",
    )
    def binlog_headroom(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        standing = read_standing(settings, context.instance)
        headroom = standing.headroom
        if headroom.low:
            context.log.warning(f"{server}: binlog headroom {headroom.describe()}")
        events: list[dg.AssetObservation | dg.AssetCheckEvaluation] = [
            dg.AssetObservation(asset_key=changelog_key(settings),
                                metadata=standing.metadata())]
        try:
            previous = json.loads(context.cursor) if context.cursor else {}
        except ValueError:
            previous = {}
        if not isinstance(previous, dict):
            previous = {}
        now = time.time()
        state = [standing.passed, headroom.status.value]
        if previous.get("state") != state or now - previous.get("at", 0) >= REPORT_EVERY_SECONDS:
            events.append(evaluation(settings, standing))
            previous = {"state": state, "at": now}
        return dg.SensorResult(asset_events=events, cursor=json.dumps(previous))

    return binlog_headroom
