"""The changelog shows the engine's lag and the binlog headroom in Dagster: the sensor's
observations and ``binlog_headroom`` check while the engine is stopped, the check run on its
own, and the streaming run's materialisations; on a private MariaDB whose binlogs expire."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from cdc_platform.definitions import build_definitions
from cdc_platform.defs.streaming.checks import CHECK_NAME
from cdc_platform.defs.streaming.sensors import sensor_name
from cdc_platform.devservices import MariaDBServer
from cdc_platform_tests.capture.binlog.test_headroom import EXPIRE, active_file, rotated
from cdc_platform_tests.capture.binlog.test_headroom import source as source  # (fixture)
from cdc_platform_tests.conftest import CdcEnv
from cdc_platform_tests.devservices.test_devservices import needs_mariadb

# ---- on a real source -----------------------------------------------------------------------------

@pytest.fixture
def env(source: MariaDBServer, tmp_path: Path, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[CdcEnv]:
    """A test's database, server name and landing zone on the private source."""
    name = "".join(c if c.isalnum() else "_" for c in request.node.name[:30]).lower()
    monkeypatch.setenv("CDC_TEST_SOURCE_PASSWORD", source.cdc_password)
    source.query(f"CREATE DATABASE `{name}`")
    env = CdcEnv(source, name, f"h_{name}"[:40], tmp_path, {})
    env.start_position = source.gtid_position()
    try:
        yield env
    finally:
        source.query(f"SET GLOBAL binlog_expire_logs_seconds = {EXPIRE}")


def values(event: dg.AssetObservation | dg.AssetMaterialization) -> dict[str, Any]:
    return {k: v.value for k, v in event.metadata.items()}


@pytest.mark.integration
@needs_mariadb
def test_the_sensor_shows_lag_and_headroom_while_the_engine_is_stopped(
        env: CdcEnv, source: MariaDBServer, capfd: pytest.CaptureFixture[str]) -> None:
    defs = build_definitions(env.settings)
    sensor = defs.resolve_sensor_def(sensor_name(env.settings))
    assert sensor.default_status is dg.DefaultSensorStatus.RUNNING
    assert sensor.minimum_interval_seconds == 60
    changelog = dg.AssetKey([env.server_name, "changelog"])
    cursor: list[str | None] = [None]

    def tick(instance: dg.DagsterInstance) -> tuple[dict[str, Any],
                                                    list[dg.AssetCheckEvaluation]]:
        with dg.build_sensor_context(instance=instance, definitions=defs,
                                     cursor=cursor[0]) as context:
            result = sensor.evaluate_tick(context)
        cursor[0] = result.cursor
        [observation] = [e for e in result.asset_events if isinstance(e, dg.AssetObservation)]
        assert observation.asset_key == changelog
        return values(observation), [e for e in result.asset_events
                                     if isinstance(e, dg.AssetCheckEvaluation)]

    with dg.instance_for_test() as instance:
        metadata, [check] = tick(instance)
        assert metadata["binlog_headroom_status"] == "no_checkpoint" and check.passed
        assert "engine_lag_seconds" not in metadata

        env.execute("CREATE TABLE items (id INT PRIMARY KEY)")
        env.execute("INSERT INTO items VALUES (1)")
        env.catch_up()  # then the engine stops
        needed = active_file(source)
        metadata, [check] = tick(instance)
        assert check.passed and check.check_name == CHECK_NAME
        assert metadata["engine_lag_seconds"] == 0.0  # caught up
        assert (metadata["binlog_headroom_status"], metadata["binlog_needed_file"],
                metadata["binlog_headroom_seconds"], metadata["binlog_retention_seconds"],
                metadata["engine_running"]) == ("ok", needed, EXPIRE, EXPIRE, False)
        assert tick(instance)[1] == []  # the check is recorded again only when it changes

        env.execute("INSERT INTO items VALUES (2)")  # the source goes on, the engine is stopped
        rotated(source, 2)
        source.query("SET GLOBAL binlog_expire_logs_seconds = 3000")
        metadata, [check] = tick(instance)
        assert metadata["binlog_headroom_status"] == "low"
        assert metadata["binlog_needed_file"] == needed
        assert 2900 < metadata["binlog_headroom_seconds"] < 3000
        assert metadata["engine_lag_seconds"] >= 2.0  # the checkpoint's age
        assert not check.passed and check.severity is dg.AssetCheckSeverity.WARN
        assert check.description == metadata["binlog_headroom"]
        assert check.description.startswith(f"LOW: 49 min until {needed}, which the "
                                             "checkpoint needs, may be purged")
        logged = capfd.readouterr().err  # (the sensor's log, in the tick's log in the UI)
        assert f"WARNING - {env.server_name}: binlog headroom LOW: 49 min until {needed}" in logged

        # The check also runs on its own (the UI's "execute"), with the same verdict.
        check_key = dg.AssetCheckKey(changelog, CHECK_NAME)
        job = dg.define_asset_job("check_headroom", selection=dg.AssetSelection.checks(check_key))
        merged = dg.Definitions.merge(defs, dg.Definitions(jobs=[job]))
        run = merged.resolve_job_def("check_headroom").execute_in_process(instance=instance)
        [evaluation] = run.get_asset_check_evaluations()
        assert not evaluation.passed and evaluation.description.startswith("LOW: ")


@pytest.mark.integration
@needs_mariadb
def test_the_streaming_run_materialises_lag_and_headroom(env: CdcEnv,
                                                         source: MariaDBServer) -> None:
    env.execute("CREATE TABLE items (id INT PRIMARY KEY)")
    env.execute("INSERT INTO items VALUES (1), (2)")
    defs = build_definitions(env.settings)
    config = {"stop_when_caught_up": True, "caught_up_idle_seconds": 2.0,
              "progress_seconds": 0.25}

    def stream() -> list[dict[str, Any]]:
        with dg.instance_for_test() as instance:
            result = defs.resolve_job_def("stream_changes").execute_in_process(
                instance=instance, run_config={"ops": {"capture_changes": {"config": config}}})
            return [values(m) for m in result.asset_materializations_for_node("capture_changes")]

    *periodic, last = stream()  # a first run: the first reading finds no checkpoint yet
    # (readings every 0.25 s for the 2 s idle at least; a busy machine's CI saw 3, not 8)
    assert len(periodic) >= 2
    assert any("engine_lag_seconds" in m for m in periodic)
    assert {m.get("binlog_headroom_status") for m in periodic} <= {None, "no_checkpoint"}
    assert all("lag_seconds" not in m for m in [*periodic, last])  # (the old, ambiguous name)
    expected = {"engine_lag_seconds": 0.0, "binlog_headroom_status": "ok",
                "binlog_needed_file": active_file(source), "binlog_headroom_seconds": EXPIRE,
                "binlog_retention_seconds": EXPIRE,
                "binlog_headroom": f"at least 2 h (the checkpoint needs the active binlog "
                                   f"file {active_file(source)}) "
                                   f"(binlog_expire_logs_seconds={EXPIRE})"}
    assert {k: last.get(k) for k in expected} == expected

    env.execute("INSERT INTO items VALUES (3)")
    *periodic, last = stream()  # a run that resumes: its readings find the checkpoint
    assert any(m.get("binlog_headroom_status") == "ok"
               and m["binlog_needed_file"] == active_file(source) for m in periodic)
    assert {k: last.get(k) for k in expected} == expected
