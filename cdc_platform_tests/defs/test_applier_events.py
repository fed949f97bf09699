"""How the applier's events show in Dagster: each becomes log lines and asset events."""

from __future__ import annotations

from datetime import UTC, datetime

import dagster as dg

from cdc_platform.capture.schema import TableSchema
from cdc_platform.defs.lake.applier import MERGE_LINES, LogLine, _events_to_dagster
from cdc_platform.defs.lake.definitions import (
    FRESHNESS_POLICY_SLACK_SECONDS,
    freshness_policy,
    target_key,
)
from cdc_platform.lake.applier.events import Applied, Current, Waiting
from cdc_platform.lake.iceberg.snapshots import Snapshot
from cdc_platform.lake.merge import MergeResult
from cdc_platform_tests.conftest import CdcEnv


def test_a_target_waiting_for_its_snapshot_is_observed_with_the_reason(cdc_env: CdcEnv) -> None:
    settings = cdc_env.settings
    schema = TableSchema(cdc_env.db, "t", (), ("id",))
    line, observation = _events_to_dagster(settings, [Waiting(schema, "s1", 30.0)])
    assert isinstance(line, LogLine) and "waits for snapshot session s1" in line.text
    assert isinstance(observation, dg.AssetObservation)
    assert observation.asset_key == target_key(settings, schema)
    assert observation.metadata["waiting_for_snapshot"].value == "s1"
    assert "one append" in observation.metadata["waiting_reason"].value


def _merged(schema: TableSchema, waited_ms: int) -> Applied:
    committed = datetime(2026, 11, 28, 12, 0, 10, tzinfo=UTC)
    now_ms = int(committed.timestamp() * 1000)
    return Applied(schema, MergeResult(
        table_id=schema.table_id, identifier=f"lake.x.{schema.table}",
        snapshot=Snapshot(1, None, committed, "overwrite", {"total-records": "3"}),
        committed=True, rows=3, inserts=1, updates=1, deletes=0, records_read=4,
        consumed_pos=7, consumed_gtid="0-1-7", duration_seconds=0.02, schema_changed=False,
        newest_source_ms=now_ms - 1000, oldest_source_ms=now_ms - waited_ms, spark=False))


def test_many_merges_relayed_at_once_are_one_line_and_a_materialisation_each(
        cdc_env: CdcEnv) -> None:
    """A thousand tables merging every few seconds would be a log line each: a batch of many
    merges is said in one line; each table still has its materialisation, with the oldest
    change's wait beside the newest's lag."""
    settings = cdc_env.settings
    schemas = [TableSchema(cdc_env.db, f"t{i}", (), ("id",)) for i in range(MERGE_LINES + 3)]
    items = list(_events_to_dagster(settings, [_merged(s, 1000 * (i + 2))
                                               for i, s in enumerate(schemas)]))
    lines = [item for item in items if isinstance(item, LogLine)]
    assert len(lines) == 1 and lines[0].text.startswith(f"applier: {len(schemas)} tables merged")
    assert f"oldest change waited up to {len(schemas) + 1:.1f} s" in lines[0].text
    materialised = [item for item in items if isinstance(item, dg.AssetMaterialization)]
    assert [m.asset_key for m in materialised] == [target_key(settings, s) for s in schemas]
    first = materialised[0].metadata
    assert (first["lag_seconds"].value, first["wait_seconds"].value) == (1.0, 2.0)
    assert first["written_by"].value == "pyarrow" and first["stale"].value is False
    few = list(_events_to_dagster(settings, [_merged(s, 2000) for s in schemas[:2]]))
    assert [type(item).__name__ for item in few] == [
        "LogLine", "AssetMaterialization", "LogLine", "AssetMaterialization"]


def test_the_fresh_checks_of_every_target_are_one_definition_judging_the_selected(
        cdc_env: CdcEnv) -> None:
    """One definition for every target's ``fresh`` check; a run of some of them judges those
    (here the engine never ran: not fresh, naming the engine)."""
    from cdc_platform.defs.lake import applier as lake_applier

    settings = cdc_env.settings
    schemas = [TableSchema(cdc_env.db, name, (), ("id",)) for name in ("a", "b", "c")]
    built = lake_applier.build(settings, schemas)
    [checks] = built.asset_checks
    selected = [dg.AssetCheckKey(target_key(settings, schemas[i]), "fresh") for i in (0, 2)]
    defs = dg.Definitions(
        assets=[dg.AssetSpec(target_key(settings, s)) for s in schemas], asset_checks=[checks],
        jobs=[dg.define_asset_job("judge", selection=dg.AssetSelection.checks(*selected))])
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def("judge").execute_in_process(instance=instance)
    evaluations = result.get_asset_check_evaluations()
    assert sorted(e.asset_key.path[-1] for e in evaluations) == ["a", "c"]
    assert all(not e.passed and e.metadata["cause"].value == "engine" for e in evaluations)


def test_a_quiet_current_target_is_materialised_with_its_mark_and_every_target_has_a_policy(
        cdc_env: CdcEnv) -> None:
    """Dagster's freshness policy counts from the last materialisation: the applier says a
    quiet target is current, and that keeps the consumed position the fresh check reads."""
    settings = cdc_env.settings
    schema = TableSchema(cdc_env.db, "t", (), ("id",))
    [current] = list(_events_to_dagster(settings, [Current(schema, 42, 7)]))
    assert isinstance(current, dg.AssetMaterialization)
    assert current.asset_key == target_key(settings, schema)
    assert current.metadata["current"].value is True
    assert current.metadata["consumed_position"].value == 42
    assert current.metadata["rows"].value == 7
    policy = freshness_policy(settings)
    assert policy.fail_window.to_timedelta().total_seconds() == (
        settings.lake.freshness_seconds + FRESHNESS_POLICY_SLACK_SECONDS)
