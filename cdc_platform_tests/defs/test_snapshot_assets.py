"""Snapshot assets on a real Dagster instance, real MariaDB, the real capture engine and Spark."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster as dg

from cdc_platform.capture.snapshot import protocol
from cdc_platform.definitions import build_definitions
from cdc_platform.defs.snapshots.definitions import snapshot_op_name
from cdc_platform.demo.run import create_dagster_storage
from cdc_platform_tests.capture.snapshot.reading.live_engine import EngineThread
from cdc_platform_tests.conftest import CdcEnv


@contextmanager
def streaming(env: CdcEnv) -> Iterator[None]:
    """The capture engine running in a thread, as the stream_changes job runs it."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            env.engine().run(stop)
        except BaseException as error:  # noqa: BLE001 - re-raised below
            errors.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(60)
    if errors:
        raise errors[0]


def _seed(env: CdcEnv) -> None:
    env.execute("CREATE TABLE orders (id BIGINT UNSIGNED PRIMARY KEY, total DECIMAL(10,2))")
    env.execute("CREATE TABLE notes (line VARCHAR(20))")
    env.execute("SET SESSION sql_log_bin = 0",
                "INSERT INTO orders SELECT seq, seq / 4 FROM seq_1_to_300")


def _key(env: CdcEnv, table: str) -> dg.AssetKey:
    return dg.AssetKey([env.server_name, "snapshot", env.db, table])


def _materialise(env: CdcEnv, table: str, instance: dg.DagsterInstance,
                 config: dict[str, Any]) -> dg.ExecuteInProcessResult:
    """A run of one table's snapshot asset (a subset of the source's snapshot assets)."""
    defs = build_definitions(env.settings)
    asset = defs.resolve_assets_def(_key(env, table))
    return dg.materialize([asset], selection=[_key(env, table)], instance=instance,
                          raise_on_error=False,
                          run_config={"ops": {snapshot_op_name(env.settings): {"config": config}}})


def snapshot_status(instance: dg.DagsterInstance, key: dg.AssetKey) -> str | None:
    """The status a stopped or skipped snapshot recorded (an observation, not a
    materialisation: the table was not wholly snapshotted)."""
    for record in instance.fetch_observations(key, limit=100).records:  # newest first
        status = record.asset_observation.metadata.get("status")
        if status is not None:
            return str(status.value)
    return None


def _failure(result: dg.ExecuteInProcessResult) -> str:
    """The step's failure as the run shows it (a dg.Failure's description)."""
    [failure] = result.get_step_failure_events()
    data = failure.step_failure_data.user_failure_data
    assert data is not None, failure.step_failure_data.error
    return str(data.description)


def test_snapshot_assets_exist_per_table_outside_the_batch_jobs(cdc_env: CdcEnv) -> None:
    env = cdc_env
    _seed(env)
    defs = build_definitions(env.settings)
    graph = defs.resolve_asset_graph()
    keys = {k for k in graph.get_all_asset_keys() if k.path[1:2] == ["snapshot"]}
    assert keys == {_key(env, "orders"), _key(env, "notes")}
    for key in keys:
        assert graph.get(key).group_name == f"{env.server_name}_snapshots"
    for name in ("materialise_targets", "catch_up_and_reconcile"):
        selected = defs.resolve_job_def(name).asset_layer.selected_asset_keys
        assert not selected & keys, name


def test_materialising_the_snapshot_asset_lands_the_table_with_metadata(cdc_env: CdcEnv,
                                                                       spark: Any) -> None:
    env = cdc_env
    _seed(env)
    with dg.instance_for_test() as instance, streaming(env):
        result = _materialise(env, "orders", instance, {"chunk_size": 64,
                                                        "progress_seconds": 0.2})
        assert result.success
        event = instance.get_latest_materialization_event(_key(env, "orders"))
        metadata = {k: v.value for k, v in event.asset_materialization.metadata.items()}
        logs = [e.message for e in instance.all_logs(result.run_id)]
        observed = instance.fetch_observations(_key(env, "orders"), limit=50).records
    assert {"rows", "chunks", "rejected_chunks", "reselected_chunks", "duration_seconds",
            "rows_per_second", "start_gtid", "end_gtid", "status"} <= set(metadata)
    assert (metadata["status"], metadata["rows"], metadata["chunks"]) == ("done", 300, 5)
    assert metadata["rejected_chunks"] == 0 and metadata["rows_per_second"] > 0
    assert metadata["start_gtid"] and metadata["end_gtid"]
    assert any("acknowledged by the capture engine" in m for m in logs)
    assert any("notification IN_PROGRESS" in m and "last_processed_key=[" in m
               and "rows_scanned=" in m for m in logs)
    assert "notification TABLE_SCAN_COMPLETED" in "\n".join(logs)
    for kind in ("STARTED", "IN_PROGRESS", "TABLE_SCAN_COMPLETED", "COMPLETED"):
        assert f"notification {kind} " in "\n".join(logs), kind
    # While the table is read, the notes of one relay of the run's log are one observation
    # (the newest note's data, and the types of all); the last ones come with the result.
    for record in observed:
        note = record.asset_observation.metadata
        assert note["notification"].value in note["notifications"].value
    env.catch_up()
    env.materialise(spark, "orders")
    assert env.reconcile(spark, "orders").ok


def test_table_without_a_key_is_skipped_with_its_status(cdc_env: CdcEnv) -> None:
    env = cdc_env
    _seed(env)
    with dg.instance_for_test() as instance:
        result = _materialise(env, "notes", instance, {})
        assert result.success
        assert instance.get_latest_materialization_event(_key(env, "notes")) is None
        status = snapshot_status(instance, _key(env, "notes"))
    assert status == "skipped: no primary key and no surrogate key (set capture.surrogate_keys)"


def test_unsafe_condition_fails_naming_the_table(cdc_env: CdcEnv) -> None:
    env = cdc_env
    _seed(env)
    with dg.instance_for_test() as instance:
        result = _materialise(env, "orders", instance,
                              {"condition": "total > 0) OR (1=1; DELETE FROM orders"})
        assert not result.success
        message = _failure(result)
    assert f"snapshot of {env.db}.orders on '{env.server_name}'" in message
    assert "additional condition refused" in message
    assert not (env.landing.root / "snapshots").exists()  # nothing was requested


def test_without_the_engine_the_run_fails_saying_to_start_the_stream(cdc_env: CdcEnv) -> None:
    env = cdc_env
    _seed(env)
    with dg.instance_for_test() as instance:
        result = _materialise(env, "orders", instance, {
            "ack_timeout_seconds": 1, "engine_retries": 1, "engine_retry_seconds": 0})
        assert not result.success
        message = _failure(result)
        logs = [e.message for e in instance.all_logs(result.run_id)]
    assert f"no capture engine is streaming {env.server_name}: start the stream_changes job" \
        in message
    # The wait for an acknowledgement is the time given to a restarting engine: no retry.
    assert sum("requested (chunk key id" in m for m in logs) == 1
    assert not any("retrying" in m for m in logs)


def test_an_engine_gone_mid_snapshot_is_retried_then_the_next_run_resumes(
        cdc_env: CdcEnv, spark: Any) -> None:
    """The engine acknowledged the session and then went away: the run retries (the retry
    adopts the session) and fails when it stays away; with the engine back, the next run
    resumes where they stopped and the table ends equal to the source."""
    env = cdc_env
    _seed(env)
    env.execute("SET SESSION sql_log_bin = 0",
                "INSERT INTO orders SELECT seq, 1 FROM seq_301_to_5000")
    engine = EngineThread(env)
    engine.start()
    config = {"chunk_size": 10, "stall_timeout_seconds": 2, "engine_retries": 1,
              "engine_retry_seconds": 0}
    with dg.instance_for_test() as instance:
        results: list[dg.ExecuteInProcessResult] = []
        run = threading.Thread(target=lambda: results.append(
            _materialise(env, "orders", instance, config)), daemon=True)
        run.start()
        deadline = time.monotonic() + 120
        while len(_session(env).get("committed", ())) < 5:
            assert time.monotonic() < deadline and run.is_alive(), "no progress"
            time.sleep(0.05)
        engine.stop()
        run.join(180)
        [failed] = results
        assert not failed.success
        assert "no capture engine is streaming" in _failure(failed)
        logs = [e.message for e in instance.all_logs(failed.run_id)]
        assert sum("retrying in 0s (retry 1 of 1)" in m for m in logs) == 1
        assert any("resuming the session of a reader that stopped" in m for m in logs)
        engine.start()
        try:
            resumed = _materialise(env, "orders", instance, {"chunk_size": 10})
        finally:
            engine.stop()
        assert resumed.success
        logs = [e.message for e in instance.all_logs(resumed.run_id)]
    assert any("resuming the session of a reader that stopped" in m for m in logs)
    assert _session(env)["state"] == "done"
    env.catch_up()
    env.materialise(spark, "orders")
    assert env.reconcile(spark, "orders").ok


def test_a_run_started_before_the_engine_waits_for_it(cdc_env: CdcEnv, spark: Any) -> None:
    """The stream_changes run may be restarting when a snapshot starts: the snapshot waits."""
    env = cdc_env
    _seed(env)
    with dg.instance_for_test() as instance:
        results: list[dg.ExecuteInProcessResult] = []
        run = threading.Thread(target=lambda: results.append(_materialise(
            env, "orders", instance, {"chunk_size": 100, "progress_seconds": 0.2})),
            daemon=True)
        run.start()
        deadline = time.monotonic() + 60
        while not (env.landing.root / "snapshots" / env.db / "orders" / "request.json").exists():
            assert time.monotonic() < deadline, "the run requested no session"
            time.sleep(0.1)
        time.sleep(2)  # the engine is still down
        with streaming(env):
            run.join(120)
        assert results and results[0].success
        logs = [e.message for e in instance.all_logs(results[0].run_id)]
    # progress is in the run's log while it runs (here: while it waits for the engine)
    assert any(m.startswith(f"snapshot of {env.db}.orders: waiting for the capture engine")
               for m in logs)
    env.catch_up()
    env.materialise(spark, "orders")
    assert env.reconcile(spark, "orders").ok


def test_target_assets_are_downstream_of_their_snapshot(cdc_env: CdcEnv) -> None:
    env = cdc_env
    _seed(env)
    graph = build_definitions(env.settings).resolve_asset_graph()
    target = dg.AssetKey([env.server_name, env.db, "orders"])
    assert _key(env, "orders") in graph.get(target).parent_keys


def test_terminating_the_run_stops_the_session(cdc_env: CdcEnv, tmp_path: Path) -> None:
    """SIGTERM is what run termination sends; the step turns it into a stop request."""
    env = cdc_env
    _seed(env)
    env.execute("SET SESSION sql_log_bin = 0",
                "INSERT INTO orders SELECT seq, 1 FROM seq_301_to_5000")
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    config = tmp_path / "run_config.yaml"
    config.write_text(f"ops:\n  {snapshot_op_name(env.settings)}:\n    config:\n"
                      "      chunk_size: 5\n")
    process_env = dict(os.environ, CDC_PLATFORM_CONFIG=str(env.write_config()),
                       DAGSTER_HOME=str(home))
    with streaming(env):
        run = subprocess.Popen(
            [str(Path(sys.executable).with_name("dagster")), "asset", "materialize", "-m",
             "cdc_platform.definitions", "--select", "/".join(_key(env, "orders").path),
             "-c", str(config)],
            env=process_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 120
            while len(_session(env).get("committed", ())) < 3:
                assert run.poll() is None, run.stderr.read().decode()[-3000:]
                assert time.monotonic() < deadline, "the snapshot run made no progress"
                time.sleep(0.1)
            run.send_signal(signal.SIGTERM)
            run.wait(90)
        finally:
            if run.poll() is None:
                run.kill()
        deadline = time.monotonic() + 30
        while _session(env).get("state") != "stopped":
            assert time.monotonic() < deadline, _session(env)
            time.sleep(0.1)
    assert run.returncode != 0  # the run ends as failed/canceled, not as a materialisation


def test_parallel_snapshot_runs_and_a_killed_run_resumed_by_the_next(
        cdc_env: CdcEnv, spark: Any, tmp_path: Path) -> None:
    """Two tables snapshotted by two runs at once (two processes, as the daemon launches them);
    one run is killed with SIGKILL mid-snapshot; materialising its asset again resumes the
    session where it stopped; both tables end equal to the source."""
    env = cdc_env
    _seed(env)
    env.execute("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(20))",
                "SET SESSION sql_log_bin = 0",
                "INSERT INTO orders SELECT seq, 1 FROM seq_301_to_6000",
                "INSERT INTO items SELECT seq, CONCAT('i', seq) FROM seq_1_to_3000")
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    create_dagster_storage(home)
    process_env = dict(os.environ, CDC_PLATFORM_CONFIG=str(env.write_config()),
                       DAGSTER_HOME=str(home))

    def materialise(table: str, chunk_size: int, log: Path) -> subprocess.Popen[bytes]:
        config = tmp_path / f"{table}.yaml"
        config.write_text(f"ops:\n  {snapshot_op_name(env.settings)}:\n    config:\n"
                          f"      chunk_size: {chunk_size}\n")
        with open(log, "wb") as out:
            return subprocess.Popen(
                [str(Path(sys.executable).with_name("dagster")), "asset", "materialize", "-m",
                 "cdc_platform.definitions", "--select", "/".join(_key(env, table).path),
                 "-c", str(config)], env=process_env, stdout=out, stderr=subprocess.STDOUT)

    with streaming(env):
        orders = materialise("orders", 5, tmp_path / "orders.log")
        items = materialise("items", 10, tmp_path / "items.log")
        try:
            deadline = time.monotonic() + 180
            while len(_session(env).get("committed", ())) < 20 or \
                    not _session(env, "items").get("committed"):
                assert orders.poll() is None, (tmp_path / "orders.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the snapshot runs made no progress"
                time.sleep(0.1)
            orders.kill()  # SIGKILL: no stop request, the session stays open
            orders.wait(30)
            assert items.wait(240) == 0, (tmp_path / "items.log").read_text()[-3000:]
        finally:
            for process in (orders, items):
                if process.poll() is None:
                    process.kill()
        assert _session(env)["state"] == "open"
        committed_before = len(_session(env)["committed"])
        again = materialise("orders", 5, tmp_path / "orders-again.log")
        assert again.wait(300) == 0, (tmp_path / "orders-again.log").read_text()[-3000:]
    log = (tmp_path / "orders-again.log").read_text()
    assert "resuming the session of a reader that stopped" in log
    session = _session(env)
    assert session["state"] == "done" and len(session["committed"]) > committed_before
    assert len(session["committed"]) == len(set(session["committed"]))  # none twice
    assert _session(env, "items")["state"] == "done"
    env.catch_up()
    for table in ("orders", "items"):
        env.materialise(spark, table)
        assert env.reconcile(spark, table).ok, table


def _session(env: CdcEnv, table: str = "orders") -> dict[str, Any]:
    """The table's newest session the engine recorded (an ended one leaves the checkpoint
    for ended_sessions.json a while after it ended)."""
    session = protocol.latest_session(env.landing, env.landing.read_checkpoint(),
                                      f"{env.db}.{table}")
    return {} if session is None else session.to_dict()
