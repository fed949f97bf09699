"""How the applier's events show in Dagster: each becomes log lines and asset events."""

from __future__ import annotations

import dagster as dg

from cdc_platform.capture.schema import TableSchema
from cdc_platform.defs.lake.applier import LogLine, _events_to_dagster
from cdc_platform.defs.lake.definitions import target_key
from cdc_platform.lake.applier import Waiting
from cdc_platform_tests.conftest import CdcEnv


def test_a_target_waiting_for_its_snapshot_is_observed_with_the_reason(cdc_env: CdcEnv) -> None:
    settings = cdc_env.settings
    schema = TableSchema(cdc_env.db, "t", (), ("id",))
    line, observation = _events_to_dagster(settings, Waiting(schema, "s1", 30.0))
    assert isinstance(line, LogLine) and "waits for snapshot session s1" in line.text
    assert isinstance(observation, dg.AssetObservation)
    assert observation.asset_key == target_key(settings, schema)
    assert observation.metadata["waiting_for_snapshot"].value == "s1"
    assert "one append" in observation.metadata["waiting_reason"].value
