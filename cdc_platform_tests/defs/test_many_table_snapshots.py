"""Snapshot runs of many tables: one run reads a selection of a source's snapshot assets a few
at a time, each table with its own materialisation and failure; a run killed mid-way is resumed
by the next one. Real MariaDB, the real capture engine, a real Dagster instance and Spark."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from cdc_platform.capture.landing.zone import SNAPSHOTS_CHECKPOINT_KEY
from cdc_platform.capture.snapshot import protocol
from cdc_platform.capture.snapshot.reading import relaunch
from cdc_platform.definitions import build_definitions
from cdc_platform.defs.snapshots.definitions import snapshot_op_name
from cdc_platform.defs.snapshots.sensors import ATTEMPT_TAG
from cdc_platform.demo.run import create_dagster_storage
from cdc_platform_tests.capture.snapshot.reading.live_engine import EngineThread
from cdc_platform_tests.conftest import CdcEnv
from cdc_platform_tests.defs.test_automatic_snapshots import Sensor
from cdc_platform_tests.defs.test_snapshot_assets import snapshot_status, streaming


def _key(env: CdcEnv, table: str) -> dg.AssetKey:
    return dg.AssetKey([env.server_name, "snapshot", env.db, table])


def _tables_with_history(env: CdcEnv, sizes: dict[str, int]) -> None:
    """Tables whose rows the binlog never saw: only their snapshots bring them."""
    for table, rows in sizes.items():
        env.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, name VARCHAR(30), n INT)")
        env.execute("SET SESSION sql_log_bin = 0",
                    f"INSERT INTO {table} SELECT seq, CONCAT('{table}-', seq), seq * 7 "
                    f"FROM seq_1_to_{rows}")
    env.execute(f"ANALYZE TABLE {', '.join(sizes)}")


def _materialise(env: CdcEnv, tables: list[str], instance: dg.DagsterInstance,
                 config: dict[str, Any], tags: dict[str, str] | None = None
                 ) -> dg.ExecuteInProcessResult:
    """One run of the source's snapshot assets, selecting ``tables``."""
    defs = build_definitions(env.settings)
    keys = [_key(env, t) for t in tables]
    return dg.materialize([defs.resolve_assets_def(keys[0])], selection=keys,
                          instance=instance, raise_on_error=False, tags=tags,
                          run_config={"ops": {snapshot_op_name(env.settings): {
                              "config": config}}})


class _Worker:
    """A snapshot run in a process of its own (``dagster asset materialize``, its own Dagster
    home), as a run worker pod runs it: what a test kills with SIGKILL."""

    def __init__(self, env: CdcEnv, tmp_path: Path) -> None:
        home = tmp_path / "dagster_home"
        home.mkdir(exist_ok=True)
        (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
        create_dagster_storage(home)
        self.config = tmp_path / "run_config.yaml"
        self.config.write_text(f"ops:\n  {snapshot_op_name(env.settings)}:\n    config:\n"
                               "      chunk_size: 10\n      parallel_tables: 2\n")
        self.env = env
        self.process_env = dict(os.environ, CDC_PLATFORM_CONFIG=str(env.write_config()),
                                DAGSTER_HOME=str(home))

    def start(self, tables: list[str], log: Path) -> subprocess.Popen[bytes]:
        selection = ",".join("/".join(_key(self.env, t).path) for t in sorted(tables))
        with open(log, "wb") as out:
            return subprocess.Popen(
                [str(Path(sys.executable).with_name("dagster")), "asset", "materialize", "-m",
                 "cdc_platform.definitions", "--select", selection, "-c", str(self.config)],
                env=self.process_env, stdout=out, stderr=subprocess.STDOUT)


def _kill_when_mid_way(env: CdcEnv, worker: subprocess.Popen[bytes], tables: list[str],
                       log: Path) -> set[str]:
    """SIGKILL ``worker`` once two of ``tables`` are mid-way (5 chunks committed, session
    open); the tables whose sessions it left open."""
    def committed(table: str) -> int:
        return len(_sessions(env).get(f"{env.db}.{table}", {}).get("committed", ()))

    try:
        deadline = time.monotonic() + 180
        # (smallest first: z, then x and y; kill while two are mid-way)
        while sum(committed(t) >= 5 and _sessions(env)[f"{env.db}.{t}"]["state"] == "open"
                  for t in tables) < 2:
            assert worker.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the run made no progress"
            time.sleep(0.05)
        worker.kill()  # SIGKILL: no stop request, the sessions stay open
        worker.wait(30)
    finally:
        if worker.poll() is None:
            worker.kill()
    interrupted = {t for t in tables if _sessions(env).get(f"{env.db}.{t}", {}).get(
        "state") == "open"}
    assert len(interrupted) >= 2, _sessions(env)
    return interrupted


def _sessions(env: CdcEnv) -> dict[str, dict[str, Any]]:
    """Each table's newest session the engine recorded: the checkpoint's, else the one that
    left it for ended_sessions.json."""
    checkpoint = env.landing.read_checkpoint()
    left = protocol.read_ended_sessions(env.landing).sessions
    recorded = dict(checkpoint.extra.get(SNAPSHOTS_CHECKPOINT_KEY) or {}) if checkpoint else {}
    return {**{t: s.to_dict() for t, s in left.items()}, **recorded}


def _source_rows(env: CdcEnv, table: str) -> list[tuple[Any, ...]]:
    return sorted(env.query(f"SELECT id, name, n FROM {table}"))


def _target_equals_source(env: CdcEnv, spark: Any, table: str) -> None:
    env.materialise(spark, table)
    rows = sorted((r["id"], r["name"], r["n"]) for r in env.target_rows(spark, table))
    assert rows == _source_rows(env, table), table


def _failure(result: dg.ExecuteInProcessResult) -> str:
    [failure] = result.get_step_failure_events()
    data = failure.step_failure_data.user_failure_data
    assert data is not None, failure.step_failure_data.error
    return str(data.description)


def test_one_run_snapshots_sixty_tables_a_few_at_a_time_and_every_target_is_exact(
        cdc_env: CdcEnv, spark: Any) -> None:
    env = cdc_env
    sizes = {f"t{i:02d}": 5 + (i * 37) % 400 for i in range(60)}
    _tables_with_history(env, sizes)
    with dg.instance_for_test() as instance, streaming(env):
        result = _materialise(env, sorted(sizes), instance,
                              {"parallel_tables": 4, "chunk_size": 64})
        assert result.success
        logs = [e.message for e in instance.all_logs(result.run_id)]
        for table, rows in sizes.items():  # each table its own materialisation
            event = instance.get_latest_materialization_event(_key(env, table))
            assert event is not None and event.run_id == result.run_id, table
            metadata = event.asset_materialization.metadata
            assert (metadata["status"].value, metadata["rows"].value) == ("done", rows), table
    assert any(m.startswith(f"snapshot of 60 tables of '{env.server_name}', 4 at a time, "
                            "smallest first: ") for m in logs)
    # The tables were read side by side: sessions of different tables were open at once.
    spans = sorted((dt.datetime.fromisoformat(s["started_at"]),
                    dt.datetime.fromisoformat(s["ended_at"])) for s in _sessions(env).values())
    assert len(spans) == 60
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:], strict=False))
    # Smallest first: the smallest table's session opened before the largest one's.
    sessions = _sessions(env)
    smallest, largest = min(sizes, key=sizes.__getitem__), max(sizes, key=sizes.__getitem__)
    assert sessions[f"{env.db}.{smallest}"]["started_at"] <= \
        sessions[f"{env.db}.{largest}"]["started_at"]
    env.catch_up()
    for table in sizes:
        _target_equals_source(env, spark, table)


def test_one_table_failing_leaves_the_others_materialised_and_the_step_names_it(
        cdc_env: CdcEnv, spark: Any) -> None:
    """Every table's reader waits for the engine; one table is dropped meanwhile. When the
    engine comes, the others are snapshotted and materialised; the dropped one fails, with
    an observation saying why, and the step fails naming it."""
    env = cdc_env
    sizes = {"a": 50, "b": 80, "doomed": 30, "c": 120}
    _tables_with_history(env, sizes)
    engine = EngineThread(env)
    with dg.instance_for_test() as instance:
        results: list[dg.ExecuteInProcessResult] = []
        run = threading.Thread(target=lambda: results.append(_materialise(
            env, sorted(sizes), instance, {"parallel_tables": 4, "chunk_size": 16})),
            daemon=True)
        run.start()
        snapshots = env.landing.root / "snapshots" / env.db
        deadline = time.monotonic() + 120
        while not all((snapshots / t / "request.json").exists() for t in sizes):
            assert time.monotonic() < deadline and run.is_alive(), "no session requested"
            time.sleep(0.1)
        env.execute("DROP TABLE doomed")
        engine.start()
        try:
            run.join(240)
        finally:
            engine.stop()
        [result] = results
        assert not result.success
        message = _failure(result)
        materialised = {t: instance.get_latest_materialization_event(_key(env, t))
                        for t in sizes}
        doomed_status = snapshot_status(instance, _key(env, "doomed"))
    assert message.startswith(f"snapshot of 1 of 4 tables of '{env.server_name}' failed")
    assert f"{env.db}.doomed: " in message and f"{env.db}.a" not in message
    assert materialised["doomed"] is None
    assert doomed_status is not None and doomed_status.startswith("failed: ")
    for table in ("a", "b", "c"):
        assert materialised[table] is not None, table
    env.catch_up()
    for table in ("a", "b", "c"):
        _target_equals_source(env, spark, table)


def test_a_multi_table_run_killed_mid_way_is_resumed_by_the_next_run(
        cdc_env: CdcEnv, spark: Any, tmp_path: Path) -> None:
    """A run of three tables, two read at a time, gets SIGKILL while both readers are mid-way:
    their sessions stay open. The next run of the same selection adopts them, reads the third,
    and every target ends equal to its source, no chunk committed twice."""
    env = cdc_env
    sizes = {"x": 4000, "y": 4000, "z": 1500}
    _tables_with_history(env, sizes)
    worker = _Worker(env, tmp_path)

    def committed(table: str) -> list[int]:
        return list(_sessions(env).get(f"{env.db}.{table}", {}).get("committed", ()))

    with streaming(env):
        interrupted = _kill_when_mid_way(env, worker.start(sorted(sizes), tmp_path / "first.log"),
                                         sorted(sizes), tmp_path / "first.log")
        before = {t: len(committed(t)) for t in interrupted}
        again = worker.start(sorted(sizes), tmp_path / "again.log")
        assert again.wait(300) == 0, (tmp_path / "again.log").read_text()[-3000:]
    log = (tmp_path / "again.log").read_text()
    assert log.count("resuming the session of a reader that stopped") >= len(interrupted)
    for table in sizes:
        session = _sessions(env)[f"{env.db}.{table}"]
        assert session["state"] == "done", (table, session)
        assert len(session["committed"]) == len(set(session["committed"])), table  # none twice
    for table in interrupted:
        assert len(committed(table)) > before[table], table
    env.catch_up()
    for table in sizes:
        _target_equals_source(env, spark, table)


@pytest.mark.cdc_config(capture={"max_parallel_snapshots": 1, "tables_per_snapshot_run": 10})
def test_a_platform_run_killed_mid_way_is_launched_again_by_itself_and_every_target_is_exact(
        cdc_env: CdcEnv, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nobody materialises anything: the re-snapshot sensor launches one run of three tables
    whose history predates the binlog; its worker is killed (SIGKILL) while two are mid-way
    and run monitoring reports the run failed. After the wait the sensor launches the tables
    it did not load again (tagged as a relaunch), that run adopts their open sessions, and
    every target ends equal to its source."""
    env = cdc_env
    sizes = {"x": 4000, "y": 4000, "z": 1500}
    _tables_with_history(env, sizes)
    env.start_position = env.mariadb.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0] or ""
    worker = _Worker(env, tmp_path)
    with dg.instance_for_test() as instance, streaming(env):
        sensor = Sensor(env, instance)
        deadline = time.monotonic() + 120
        while not (requests := sensor.tick().run_requests):  # (until the markers are armed)
            assert time.monotonic() < deadline, "the sensor launched nothing"
            time.sleep(0.2)
        [first] = requests
        tables = sorted(key.path[-1] for key in first.asset_selection)
        assert tables == sorted(sizes)
        run = sensor.create_run(first, dg.DagsterRunStatus.STARTED)
        interrupted = _kill_when_mid_way(env, worker.start(tables, tmp_path / "first.log"),
                                         tables, tmp_path / "first.log")
        instance.report_run_failed(run)  # (run monitoring, once the worker is gone)
        assert sensor.tick().run_requests == []  # (the wait before a relaunch)
        monkeypatch.setattr(relaunch, "RELAUNCH_BACKOFF_SECONDS", 0.0)
        [again] = sensor.tick().run_requests
        relaunched = sorted(key.path[-1] for key in again.asset_selection)
        assert interrupted <= set(relaunched), (interrupted, relaunched)
        assert again.tags[ATTEMPT_TAG] == "2" and again.run_key != first.run_key
        result = _materialise(env, relaunched, instance, {"chunk_size": 10,
                                                          "parallel_tables": 2},
                              tags=dict(again.tags))
        assert result.success
        logs = [e.message for e in instance.all_logs(result.run_id)]
        # (a pass's reader lines of all tables are one log event)
        assert sum(m.count("resuming the session of a reader that stopped")
                   for m in logs) >= len(interrupted)
        assert sensor.tick().run_requests == []  # (every marker resolved)
    for table in sizes:
        session = _sessions(env)[f"{env.db}.{table}"]
        assert session["state"] == "done", (table, session)
        assert len(session["committed"]) == len(set(session["committed"])), table
    env.catch_up()
    for table in sizes:
        _target_equals_source(env, spark, table)
