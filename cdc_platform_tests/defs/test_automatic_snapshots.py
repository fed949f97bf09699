"""The re-snapshot sensor launching the snapshots of capture.snapshot_mode: a real engine
writes the markers, a real Dagster instance holds the runs, ticks are evaluated as the daemon
evaluates them."""

from __future__ import annotations

from typing import Any

import dagster as dg
import pytest

from cdc_platform.capture.ddl.stale_markers import armed, read_markers, target_staleness
from cdc_platform.capture.landing.records import StaleMarker
from cdc_platform.capture.landing.session_records import SignalRef
from cdc_platform.capture.landing.zone import Checkpoint
from cdc_platform.capture.snapshot.reading import relaunch
from cdc_platform.capture.snapshot.reading.actions import signal_action
from cdc_platform.definitions import build_definitions
from cdc_platform.defs.signals.sensors import SNAPSHOT_TABLE_TAG
from cdc_platform.defs.snapshots.sensors import (
    ATTEMPT_TAG,
    AUTOMATIC_TAG,
    MARKER_TAG,
    REASON_TAG,
    RELAUNCH_TAG,
    TABLE_COUNT_TAG,
    run_key,
    sensor_name,
)
from cdc_platform_tests.conftest import CdcEnv


class Sensor:
    """The re-snapshot sensor of ``env``'s definitions, ticked like the daemon ticks it."""

    def __init__(self, env: CdcEnv, instance: dg.DagsterInstance) -> None:
        self.instance = instance
        self.defs = build_definitions(env.settings)
        self.sensor = self.defs.resolve_sensor_def(sensor_name(env.settings))

    def tick(self) -> Any:
        with dg.build_sensor_context(instance=self.instance, definitions=self.defs) as context:
            return self.sensor.evaluate_tick(context)

    def create_run(self, request: dg.RunRequest, status: dg.DagsterRunStatus) -> dg.DagsterRun:
        """The run the daemon creates from ``request``, in ``status``."""
        job = self.defs.resolve_implicit_global_asset_job_def()
        return self.instance.create_run_for_job(
            job, tags=request.tags, asset_selection=frozenset(request.asset_selection),
            status=status)


def _tables_with_history(env: CdcEnv, *tables: str) -> None:
    """Tables with rows the engine's first start does not stream (created before it)."""
    for table in tables:
        env.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, v INT)",
                    f"INSERT INTO {table} SELECT seq, seq FROM seq_1_to_20")
    env.start_position = env.mariadb.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0] or ""


def _tables(requests: list[dg.RunRequest]) -> list[str]:
    return sorted(r.asset_selection[0].path[-1] for r in requests)


@pytest.fixture
def instance() -> Any:
    with dg.instance_for_test() as instance:
        yield instance


@pytest.mark.cdc_config(capture={"max_parallel_snapshots": 2, "tables_per_snapshot_run": 1})
def test_a_first_start_launches_at_most_max_parallel_snapshot_runs_at_a_time(
        cdc_env: CdcEnv, instance: dg.DagsterInstance) -> None:
    """Runs of one table each (tables_per_snapshot_run 1): two at a time, the third table
    waits for a free slot, a marker whose run ended is not launched again."""
    env = cdc_env
    _tables_with_history(env, "a", "b", "c")
    env.execute("CREATE TABLE keyless (x INT, y INT)", "INSERT INTO keyless VALUES (1, 2)")
    env.catch_up()
    assert sorted(m.table for m in read_markers(env.landing)) == ["a", "b", "c"]
    sensor = Sensor(env, instance)

    first = sensor.tick().run_requests
    assert len(first) == 2
    for request in first:
        assert request.tags[AUTOMATIC_TAG] == env.server_name
        assert request.tags[REASON_TAG].startswith("initial snapshot (INITIAL): history not "
                                                   "loaded yet")
        assert request.run_key == request.tags[MARKER_TAG]
    # Until the daemon created those runs, a tick asks for the same ones (same run keys).
    assert [r.run_key for r in sensor.tick().run_requests] == [r.run_key for r in first]

    runs = [sensor.create_run(r, dg.DagsterRunStatus.NOT_STARTED) for r in first]
    result = sensor.tick()
    assert result.run_requests == [] and "1 for a free slot" in (result.skip_message or "")

    # One run ends (here: cancelled, the marker stays open): its slot goes to the third
    # table, and its own marker is not launched again.
    instance.report_run_canceled(runs[0])
    [third] = sensor.tick().run_requests
    assert _tables([third]) == sorted({"a", "b", "c"} - set(_tables(first)))
    sensor.create_run(third, dg.DagsterRunStatus.STARTED)
    assert sensor.tick().run_requests == []

    # A keyless table gets no snapshot, and its asset still says what it needs.
    key = dg.AssetKey([env.server_name, "snapshot", env.db, "keyless"])
    [spec] = [s for s in sensor.defs.resolve_assets_def(key).specs if s.key == key]
    assert spec.metadata["chunk_key"] == "(none: set capture.surrogate_keys)"


@pytest.mark.cdc_config(capture={"max_parallel_snapshots": 2, "tables_per_snapshot_run": 2,
                                  "rows_per_snapshot_run": 1000})
def test_tables_waiting_together_share_runs_smallest_first_and_a_large_one_runs_alone(
        cdc_env: CdcEnv, instance: dg.DagsterInstance) -> None:
    env = cdc_env
    _tables_with_history(env, "a", "b", "c")
    env.execute("CREATE TABLE big (id INT PRIMARY KEY, v INT)",
                "INSERT INTO big SELECT seq, seq FROM seq_1_to_5000")
    env.execute("ANALYZE TABLE a, b, c, big")  # (the row estimates the sensor packs by)
    env.start_position = env.mariadb.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0] or ""
    env.catch_up()
    sensor = Sensor(env, instance)

    first = sensor.tick().run_requests
    # Smallest first: two small tables share a run (tables_per_snapshot_run), the third goes
    # to the second slot; the large table (above rows_per_snapshot_run with them) waits.
    assert [sorted(k.path[-1] for k in r.asset_selection) for r in first] == [["a", "b"], ["c"]]
    pair, single = first
    assert pair.tags[TABLE_COUNT_TAG] == "2" and SNAPSHOT_TABLE_TAG not in pair.tags
    assert pair.tags[REASON_TAG].startswith("initial snapshot (INITIAL)")
    assert pair.tags[REASON_TAG].endswith("(2 tables)")
    assert pair.run_key.startswith("snapshots:2:") and pair.run_key == pair.tags[MARKER_TAG]
    assert single.tags[SNAPSHOT_TABLE_TAG] == f"{env.db}.c"
    # Until the daemon created those runs, a tick asks for the same ones (same run keys).
    assert [r.run_key for r in sensor.tick().run_requests] == [pair.run_key, single.run_key]

    runs = [sensor.create_run(r, dg.DagsterRunStatus.STARTED) for r in first]
    result = sensor.tick()
    assert result.run_requests == [] and "1 for a free slot" in (result.skip_message or "")
    # The run of a and b ends without resolving their markers (here: cancelled): its slot
    # goes to the large table, alone, and a and b are not launched again.
    instance.report_run_canceled(runs[0])
    [large] = sensor.tick().run_requests
    assert [k.path[-1] for k in large.asset_selection] == ["big"]
    sensor.create_run(large, dg.DagsterRunStatus.STARTED)
    assert sensor.tick().run_requests == []


@pytest.mark.cdc_config(capture={"max_parallel_snapshots": 1, "tables_per_snapshot_run": 10})
def test_a_run_that_failed_is_launched_again_a_few_times_then_left_with_the_reason(
        cdc_env: CdcEnv, instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of three tables fails (killed: run monitoring reports it failed) without loading
    them: after a wait it is launched again, with its own run key and tags saying why, up to
    SNAPSHOT_RELAUNCHES times; then the platform leaves the tables, and their targets'
    not_stale check says why and what to do. A cancelled run is not launched again."""
    env = cdc_env
    _tables_with_history(env, "a", "b", "c")
    env.catch_up()
    sensor = Sensor(env, instance)
    [first] = sensor.tick().run_requests
    assert ATTEMPT_TAG not in first.tags and len(first.asset_selection) == 3
    run = sensor.create_run(first, dg.DagsterRunStatus.STARTED)
    instance.report_run_failed(run)

    # Within the wait nothing is launched; the tick says when it will be.
    result = sensor.tick()
    assert result.run_requests == []
    assert "3 to be launched again later" in (result.skip_message or "")
    monkeypatch.setattr(relaunch, "RELAUNCH_BACKOFF_SECONDS", 0.0)
    keys = {first.run_key}
    for attempt in range(2, 2 + relaunch.SNAPSHOT_RELAUNCHES):
        [again] = sensor.tick().run_requests
        assert [r.run_key for r in sensor.tick().run_requests] == [again.run_key]  # (same)
        assert again.run_key not in keys and len(again.asset_selection) == 3
        keys.add(again.run_key)
        assert again.tags[ATTEMPT_TAG] == str(attempt)
        assert again.tags[RELAUNCH_TAG].startswith(f"its snapshot run {run.run_id[:8]} failed")
        assert f"relaunch {attempt - 1} of {relaunch.SNAPSHOT_RELAUNCHES}" in \
            again.tags[RELAUNCH_TAG]
        run = sensor.create_run(again, dg.DagsterRunStatus.STARTED)
        assert sensor.tick().run_requests == []  # (its slot is taken, its tables busy)
        instance.report_run_failed(run)
    result = sensor.tick()
    assert result.run_requests == [] and "3 left alone" in (result.skip_message or "")
    markers = read_markers(env.landing)
    staleness = target_staleness(markers, f"{env.db}.a", None) or ""
    assert staleness.startswith("history not loaded yet: initial snapshot not loaded: 4 "
                                "snapshot runs ended without loading it, the last: run "
                                f"{run.run_id[:8]} failed")
    assert f"materialise the snapshot asset {env.server_name}/snapshot/{env.db}/a" in staleness
    assert sensor.tick().run_requests == []


@pytest.mark.cdc_config(capture={"max_parallel_snapshots": 1, "tables_per_snapshot_run": 10})
@pytest.mark.parametrize("ending", ["cancelled", "stop signal"])
def test_a_cancelled_run_or_a_stop_signal_is_not_overridden(
        cdc_env: CdcEnv, instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch,
        ending: str) -> None:
    """A person's decision stands: a run cancelled in Dagster, or a table a stop-snapshot
    signal stopped after its run failed, is not launched again (the other table of that
    failed run is)."""
    env = cdc_env
    monkeypatch.setattr(relaunch, "RELAUNCH_BACKOFF_SECONDS", 0.0)
    _tables_with_history(env, "a", "b")
    env.catch_up()
    sensor = Sensor(env, instance)
    [first] = sensor.tick().run_requests
    run = sensor.create_run(first, dg.DagsterRunStatus.STARTED)
    if ending == "cancelled":
        instance.report_run_canceled(run)
        assert sensor.tick().run_requests == []
        for table in ("a", "b"):
            staleness = target_staleness(read_markers(env.landing), f"{env.db}.{table}",
                                         None) or ""
            assert f"run {run.run_id[:8]} was cancelled at " in staleness
            assert "without loading it and is not launched again" in staleness
        return
    instance.report_run_failed(run)
    signal_action(env.landing, env.db, "a", "stop", SignalRef("stop-a", "topic", 7))
    [again] = sensor.tick().run_requests
    assert [k.path[-1] for k in again.asset_selection] == ["b"]
    assert "stopped by signal stop-a" in (
        target_staleness(read_markers(env.landing), f"{env.db}.a", None) or "")


@pytest.mark.cdc_config(capture={"snapshot_mode": "never"})
def test_never_launches_nothing_and_ddl_re_snapshots_still_run(
        cdc_env: CdcEnv, instance: dg.DagsterInstance) -> None:
    env = cdc_env
    _tables_with_history(env, "a")
    env.catch_up()
    assert read_markers(env.landing) == []
    env.query("TRUNCATE TABLE a")
    env.catch_up()
    [request] = Sensor(env, instance).tick().run_requests
    assert request.run_key.startswith(f"resnapshot:{env.db}.a:")


def _marker(**fields: Any) -> StaleMarker:
    data: dict[str, Any] = {"database": "shop", "table": "items", "gtid": "", "verb": "INITIAL",
                            "reason": "found with rows at the engine's first start", "position": 1,
                            "since": "0-1-40"}
    return StaleMarker(**{**data, **fields})


def test_a_history_marker_waits_for_the_checkpoint_to_pass_its_point() -> None:
    marker = _marker()
    assert not armed(marker, None)
    assert not armed(marker, Checkpoint("s", "mariadb", gtid="0-1-39"))
    assert armed(marker, Checkpoint("s", "mariadb", gtid="0-1-40"))
    assert armed(_marker(verb="TRUNCATE", since=None, gtid="0-1-41"), None)  # DDL: at once


def test_the_target_says_why_it_is_incomplete_and_what_happens() -> None:
    pending = target_staleness([_marker()], "shop.items", None) or ""
    assert pending.startswith("history not loaded yet: initial snapshot pending")
    assert "found with rows at the engine's first start" in pending
    running = target_staleness([_marker(running="session run-1 open, 4,096 rows loaded so "
                                        "far")], "shop.items", None) or ""
    assert running.startswith("history not loaded yet: initial snapshot running (session "
                              "run-1 open, 4,096 rows")
    purged = target_staleness([_marker(verb="PURGED", reason="the binlog after 0-1-9 was "
                                       "purged")], "shop.items", None) or ""
    assert purged.startswith("changes lost to a purged binlog not loaded yet: recovery "
                             "snapshot pending")
    done = _marker(resolved_by="run-1", resolved_pos=90)
    assert "materialise the target" in (target_staleness([done], "shop.items", 10) or "")
    assert target_staleness([done], "shop.items", 90) is None
    assert run_key(_marker()) != run_key(_marker(recorded_at="2027-01-01T00:00:00+00:00"))
    assert "running" not in _marker(running="x").to_json().decode()
