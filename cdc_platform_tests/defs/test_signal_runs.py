"""Signals end to end: the signal CLI, the Tansu broker, the real Dagster daemon running the
sensor and launching snapshot runs, the capture engine, MariaDB, Spark.

The daemon runs as in production (``dagster-daemon run`` on a workspace file, its own
DAGSTER_HOME); these tests only send signals, restart things and watch runs and tables.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from confluent_kafka import Consumer, TopicPartition

from cdc_platform.capture.landing.zone import SNAPSHOTS_CHECKPOINT_KEY
from cdc_platform.capture.signals.kafka import SignalCursor
from cdc_platform.defs.lake.applier import PID_TAG
from cdc_platform.defs.signals.sensors import SNAPSHOT_TABLE_TAG, sensor_name
from cdc_platform.defs.snapshots.definitions import run_session_prefix
from cdc_platform.demo.run import create_dagster_storage
from cdc_platform_tests.capture.snapshot.reading.live_engine import (
    EngineThread,
    finish_and_reconcile,
)
from cdc_platform_tests.conftest import CdcEnv
from cdc_platform_tests.defs.test_snapshot_assets import snapshot_status

BIN = Path(sys.executable).parent


class Daemon:
    """``dagster-daemon run`` for the test's config, in a Dagster home of its own."""

    def __init__(self, env: CdcEnv, root: Path) -> None:
        self.home = root / "dagster_home"
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "dagster.yaml").write_text(
            "telemetry:\n  enabled: false\n"
            "run_coordinator:\n  module: dagster.core.run_coordinator\n"
            "  class: QueuedRunCoordinator\n  config:\n    dequeue_interval_seconds: 1\n")
        create_dagster_storage(self.home)
        self.workspace = root / "workspace.yaml"
        self.workspace.write_text(
            "load_from:\n  - python_module:\n      module_name: cdc_platform.definitions\n"
            "      location_name: cdc_platform\n")
        self.environ = dict(os.environ, CDC_PLATFORM_CONFIG=str(env.write_config()),
                            DAGSTER_HOME=str(self.home), PYSPARK_PYTHON=sys.executable)
        self.log = root / "daemon.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.sensor = sensor_name(env.settings)

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [str(BIN / "dagster-daemon"), "run", "-w", str(self.workspace)],
                env=self.environ, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)

    def kill(self) -> None:
        """kill -9 of the daemon process. Its code server notices the missing heartbeats and
        exits; the runs it launched go on (in production they are pods of their own)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()

    def instance(self) -> dg.DagsterInstance:
        return dg.DagsterInstance.from_config(str(self.home))

    def set_cursor(self, cursor: str) -> None:
        """``dagster sensor cursor --set``: what an operator would use to replay signals."""
        done = subprocess.run(
            [str(BIN / "dagster"), "sensor", "cursor", self.sensor, "--set", cursor, "-w",
             str(self.workspace)], env=self.environ, capture_output=True, text=True,
            timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""


@contextmanager
def daemon(env: CdcEnv, root: Path) -> Iterator[Daemon]:
    running = Daemon(env, root)
    running.start()
    try:
        yield running
    finally:
        running.stop()
        # A run the daemon launched may still be running: stop it with the test.
        with running.instance() as instance:
            for run in instance.get_runs(filters=dg.RunsFilter(statuses=[
                    dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING])):
                pid = run.tags.get(PID_TAG)  # (the applier's; other runs end by themselves)
                if pid:
                    with suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGTERM)


def cli_signal(env: CdcEnv, *args: str) -> str:
    """``python -m cdc_platform signal ...`` as an operator types it."""
    done = subprocess.run([sys.executable, "-m", "cdc_platform", "signal", *args,
                           "--config", str(env.write_config())],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def wait_for(what: str, condition: Callable[[], Any], timeout: float = 180,
             daemon_: Daemon | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}\n" + (daemon_.tail() if daemon_ else ""))


def snapshot_runs(instance: dg.DagsterInstance, table_id: str) -> list[dg.DagsterRun]:
    return list(instance.get_runs(filters=dg.RunsFilter(tags={SNAPSHOT_TABLE_TAG: table_id})))


def run_failure(instance: dg.DagsterInstance, run_id: str) -> str:
    """The run's error and warning lines, for an assertion's message."""
    return "\n".join(str(e.message) for e in instance.all_logs(run_id)
                     if e.level >= 30 or (e.dagster_event is not None
                                          and e.dagster_event.is_step_failure))


def engine_session(env: CdcEnv, table: str) -> dict[str, Any]:
    checkpoint = env.landing.read_checkpoint()
    if checkpoint is None:
        return {}
    return (checkpoint.extra.get(SNAPSHOTS_CHECKPOINT_KEY) or {}).get(f"{env.db}.{table}") or {}


def notifications(env: CdcEnv) -> list[dict[str, Any]]:
    signals = env.settings.signals
    consumer = Consumer({"bootstrap.servers": signals.kafka.bootstrap_servers,
                         "group.id": "test-notes", "enable.auto.commit": False})
    consumer.assign([TopicPartition(signals.notification_topic, 0, 0)])
    found, quiet = [], time.monotonic()
    while time.monotonic() - quiet < 3:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            found.append(json.loads(message.value()))
            quiet = time.monotonic()
    consumer.close()
    return found


class Writes:
    """Single-row changes on the table while the test runs (inserts, updates, deletes)."""

    def __init__(self, env: CdcEnv, table: str, keys: int) -> None:
        self.env, self.table, self.keys = env, table, keys
        self.stop = threading.Event()
        self.count = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        rng = random.Random(3)
        with self.env.connect() as conn, conn.cursor() as cur:
            while not self.stop.is_set():
                key = rng.randint(1, self.keys + 500)
                kind = rng.random()
                if kind < 0.5:
                    cur.execute(f"UPDATE {self.table} SET v = %s WHERE id = %s",
                                (f"w{self.count}", key))
                elif kind < 0.75:
                    cur.execute(f"DELETE FROM {self.table} WHERE id = %s", (key,))
                else:
                    cur.execute(f"INSERT IGNORE INTO {self.table} VALUES (%s, 'new')", (key,))
                conn.commit()
                self.count += 1
                time.sleep(0.01)

    def __enter__(self) -> Writes:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def _orders(env: CdcEnv, rows: int) -> None:
    env.execute("CREATE TABLE orders (id INT PRIMARY KEY, v VARCHAR(20))")
    env.execute("SET SESSION sql_log_bin = 0",
                f"INSERT INTO orders SELECT seq, CONCAT('v', seq) FROM seq_1_to_{rows}")


def test_cli_signal_pause_duplicate_daemon_restart_replay_resume_ends_reconciled(
        signal_env: CdcEnv, spark: Any, tmp_path: Path) -> None:
    """Each signal is acted on exactly once, whatever restarts, and the snapshot taken while
    writes run ends with the target equal to the source."""
    env = signal_env
    _orders(env, 3000)
    table_id = f"{env.db}.orders"
    engine = EngineThread(env)
    with daemon(env, tmp_path) as running, running.instance() as instance, \
            Writes(env, "orders", 3000) as writes:
        # The engine is down: the run opens its session and waits for it.
        cli_signal(env, "execute-snapshot", table_id, "--id", "snap-1")
        [run] = wait_for("the sensor to launch the snapshot run",
                         lambda: snapshot_runs(instance, table_id), daemon_=running)
        assert run.tags["dagster/sensor_name"] == running.sensor
        assert run.tags["cdc_platform/signal_id"] == "snap-1"
        wait_for("the run to request its session", lambda: (
            env.landing.root / "snapshots" / env.db / "orders" / "request.json").exists(),
            daemon_=running)
        cli_signal(env, "pause-snapshot", table_id)
        wait_for("the pause to reach request.json", lambda: json.loads(
            (env.landing.root / "snapshots" / env.db / "orders" / "request.json"
             ).read_text())["action"] == "pause", daemon_=running)
        engine.start()  # the engine comes up and opens the session paused
        wait_for("the paused session", lambda: engine_session(env, "orders").get("state")
                 == "paused")
        # A duplicate signal while the table is being snapshotted starts nothing.
        cli_signal(env, "execute-snapshot", table_id)
        cursor_after_duplicate = wait_for(
            "the sensor to read the duplicate", lambda: _cursor_at_least(instance, running, 3))
        # The daemon is killed; the next one replays every signal from offset 0.
        running.kill()
        topic_id = SignalCursor.from_json(cursor_after_duplicate).topic_id
        running.set_cursor(SignalCursor(topic_id, 0).to_json())
        # The engine restarts too, mid-snapshot.
        engine.stop()
        engine.start()
        running.start()
        wait_for("the replay", lambda: _cursor_at_least(instance, running, 3),
                 daemon_=running)
        assert len(snapshot_runs(instance, table_id)) == 1
        cli_signal(env, "resume-snapshot")
        wait_for("the snapshot run to finish", lambda: instance.get_run_by_id(
            run.run_id).is_finished, timeout=300, daemon_=running)
        finished = instance.get_run_by_id(run.run_id)
        assert finished.status == dg.DagsterRunStatus.SUCCESS, running.tail()
        event = instance.get_latest_materialization_event(
            dg.AssetKey([env.server_name, "snapshot", env.db, "orders"]))
        assert event.asset_materialization.metadata["status"].value == "done"
        assert len(snapshot_runs(instance, table_id)) == 1
        logs = "\n".join(e.message for e in instance.all_logs(run.run_id))
    engine.stop()
    assert writes.count > 50
    kinds = [n["type"] for n in notifications(env) if n["id"] == "snap-1"]
    assert kinds[:2] == ["STARTED", "PAUSED"] and "RESUMED" in kinds
    assert kinds[-2:] == ["TABLE_SCAN_COMPLETED", "COMPLETED"]
    assert "notification COMPLETED" in logs
    finish_and_reconcile(env, spark, "orders")


def _cursor_at_least(instance: dg.DagsterInstance, running: Daemon, offset: int
                     ) -> str | None:
    """The sensor's cursor once it has read every message before ``offset``."""
    states = [s for s in instance.all_instigator_state() if s.name == running.sensor]
    if not states or states[0].instigator_data is None:
        return None
    cursor = states[0].instigator_data.cursor
    if cursor is None or SignalCursor.from_json(cursor).offset < offset:
        return None
    return cursor


def test_stop_signal_stops_an_open_snapshot_session_and_its_run(
        signal_env: CdcEnv, tmp_path: Path) -> None:
    env = signal_env
    _orders(env, 500)
    table_id = f"{env.db}.orders"
    engine = EngineThread(env)
    request_json = env.landing.root / "snapshots" / env.db / "orders" / "request.json"
    try:
        with daemon(env, tmp_path) as running, running.instance() as instance:
            cli_signal(env, "execute-snapshot", table_id, "--id", "to-stop")
            [run] = wait_for("the snapshot run", lambda: snapshot_runs(instance, table_id),
                             daemon_=running)
            wait_for("the run to request its session", request_json.exists, daemon_=running)
            cli_signal(env, "pause-snapshot", table_id)  # holds it open mid-snapshot
            wait_for("the pause", lambda: json.loads(request_json.read_text())["action"]
                     == "pause", daemon_=running)
            engine.start()
            wait_for("the engine's paused session",
                     lambda: engine_session(env, "orders").get("state") == "paused")
            cli_signal(env, "stop-snapshot", table_id)
            wait_for("the run to end", lambda: instance.get_run_by_id(run.run_id).is_finished,
                     daemon_=running)
            assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.SUCCESS, \
                run_failure(instance, run.run_id)
            key = dg.AssetKey([env.server_name, "snapshot", env.db, "orders"])
            assert instance.get_latest_materialization_event(key) is None
            assert snapshot_status(instance, key) == "stopped"
            # (stopped, or already followed by another session: the engine's first start
            # may have left the table's history to the platform's own snapshot)
            own = f"{run_session_prefix(run.run_id)}-"
            wait_for("the engine to stop the session", lambda: (
                (session := engine_session(env, "orders")).get("state") == "stopped"
                or not str(session.get("session_id", own)).startswith(own)))
    finally:
        engine.stop()
    kinds = [n["type"] for n in notifications(env) if n["id"] == "to-stop"]
    assert kinds == ["STARTED", "PAUSED", "ABORTED"], kinds
