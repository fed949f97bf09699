"""The signals domain: the sensor that turns signal-topic messages into snapshot runs."""

import dagster as dg

from cdc_platform.config import Settings
from cdc_platform.defs.signals.sensors import build_sensor


def build(settings: Settings, snapshot_assets: dict[str, dg.AssetsDefinition]) -> dg.Definitions:
    return dg.Definitions(sensors=[build_sensor(settings, snapshot_assets)])
