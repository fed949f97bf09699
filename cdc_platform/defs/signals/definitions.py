"""The signals domain: the sensor that turns signal-topic messages into snapshot runs."""

import dagster as dg

from cdc_platform.config import Settings
from cdc_platform.defs.signals.sensors import build_sensor
from cdc_platform.defs.snapshots.definitions import SnapshotAssets


def build(settings: Settings, snapshot_assets: SnapshotAssets) -> dg.Definitions:
    return dg.Definitions(sensors=[build_sensor(settings, snapshot_assets)])
