"""The lake runs itself, under the real Dagster daemon: nobody launches a snapshot or a merge.

The engine streams (as ``stream_changes`` would), the daemon runs the definitions as in
production, and the test only writes to the source, kills things and watches: the table's rows
older than the changelog are snapshotted by a run the sensor launches, the sensor launches
``apply_changes``, targets follow the writes within ``lake.freshness_seconds`` (the
``fresh`` check passes, merges carry their lag), a ``kill -9`` of the applier shows as "not
fresh" naming the applier, the sensor relaunches it, and the target ends equal to the source.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from cdc_platform.defs.lake.applier import APPLIER_TAG, CHILD_PID_TAG, PID_TAG
from cdc_platform.defs.long_running import REASON_TAG
from cdc_platform.defs.signals.sensors import SNAPSHOT_TABLE_TAG
from cdc_platform_tests.capture.snapshot.reading.live_engine import EngineThread
from cdc_platform_tests.conftest import CdcEnv
from cdc_platform_tests.defs.test_signal_runs import Writes, daemon, wait_for
from cdc_platform_tests.lake.applier.test_process import parent_of


def _applier_runs(instance: dg.DagsterInstance, env: CdcEnv) -> list[dg.DagsterRun]:
    return list(instance.get_runs(filters=dg.RunsFilter(tags={APPLIER_TAG: env.server_name})))


def _started(instance: dg.DagsterInstance, env: CdcEnv) -> dg.DagsterRun | None:
    for run in _applier_runs(instance, env):
        if run.status == dg.DagsterRunStatus.STARTED and run.tags.get(PID_TAG):
            return run
    return None


def _fresh(instance: dg.DagsterInstance, env: CdcEnv, table: str) -> list[Any]:
    """The table's ``fresh`` check evaluations, oldest first."""
    key = dg.AssetKey([env.server_name, env.db, table])
    records = instance.get_event_records(dg.EventRecordsFilter(
        event_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION), limit=1000, ascending=True)
    found = []
    for record in records:
        evaluation = record.event_log_entry.dagster_event.event_specific_data
        if evaluation.asset_key == key and evaluation.check_name == "fresh":
            found.append(evaluation)
    return found


def _merges(instance: dg.DagsterInstance, env: CdcEnv, table: str) -> list[dict[str, Any]]:
    key = dg.AssetKey([env.server_name, env.db, table])
    records = instance.fetch_materializations(key, limit=1000).records
    metadata = [{k: getattr(v, "value", v) for k, v in r.asset_materialization.metadata.items()}
                for r in records]
    return [m for m in metadata if "current" not in m]  # (not the applier's "still current")


@pytest.mark.cdc_config(lake={"applier": True, "freshness_seconds": 30, "poll_seconds": 1})
def test_applier_launched_by_itself_keeps_targets_fresh_and_recovers_from_kill_9(
        cdc_env: CdcEnv, spark: Any, tmp_path: Path) -> None:
    env = cdc_env
    # 400 rows older than the changelog (the engine starts after them: capture.snapshot_mode
    # initial must load them by itself), then 100 it streams.
    env.execute("CREATE TABLE orders (id INT PRIMARY KEY, v VARCHAR(20))")
    env.execute("INSERT INTO orders SELECT seq, CONCAT('v', seq) FROM seq_1_to_400")
    env.start_position = env.mariadb.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0]
    env.execute("INSERT INTO orders SELECT seq, CONCAT('v', seq) FROM seq_401_to_500")
    engine = EngineThread(env)
    engine.start()
    try:
        with daemon(env, tmp_path) as running, running.instance() as instance:
            wait_for("the initial snapshot run", lambda: instance.get_runs(
                filters=dg.RunsFilter(tags={SNAPSHOT_TABLE_TAG: f"{env.db}.orders"})),
                timeout=240, daemon_=running)
            first = wait_for("the sensor to launch apply_changes",
                             lambda: _started(instance, env), timeout=240, daemon_=running)
            assert first.tags[REASON_TAG] == "no run of it yet"
            wait_for("the first merge", lambda: _merges(instance, env, "orders"), timeout=240,
                     daemon_=running)
            with Writes(env, "orders", keys=500):
                wait_for("a passing fresh check",
                         lambda: any(e.passed for e in _fresh(instance, env, "orders")),
                         timeout=120, daemon_=running)
                wait_for("merges during the writes",
                         lambda: len(_merges(instance, env, "orders")) >= 3, timeout=120,
                         daemon_=running)
                # the merges run in a process of the run's own, which dies with the run
                tagged = wait_for("the applier's process", lambda: (run := instance.get_run_by_id(
                    first.run_id)) is not None and run.tags.get(CHILD_PID_TAG) and run,
                    timeout=60, daemon_=running)
                child = int(tagged.tags[CHILD_PID_TAG])
                assert parent_of(child) == int(first.tags[PID_TAG])
                os.kill(int(first.tags[PID_TAG]), signal.SIGKILL)
                wait_for("the applier's process to die with its run",
                         lambda: parent_of(child) is None, timeout=30, daemon_=running)
                failed = wait_for(
                    "the fresh check to fail naming the applier",
                    lambda: [e for e in _fresh(instance, env, "orders")
                             if not e.passed and e.metadata["cause"].value == "applier"],
                    timeout=120, daemon_=running)
                assert "applier" in failed[0].description
                second = wait_for("a new applier run",
                                  lambda: (run := _started(instance, env)) is not None
                                  and run.run_id != first.run_id and run, timeout=240,
                                  daemon_=running)
                # (the sensor saw the process gone, or Dagster marked the run failed first)
                assert first.run_id[:8] in second.tags[REASON_TAG], second.tags[REASON_TAG]
                assert instance.get_run_by_id(first.run_id).status == \
                    dg.DagsterRunStatus.FAILURE
                passes = len([e for e in _fresh(instance, env, "orders") if e.passed])
                wait_for("the fresh check to pass again",
                         lambda: len([e for e in _fresh(instance, env, "orders")
                                      if e.passed]) > passes, timeout=240, daemon_=running)
            # History included: nobody launched a snapshot or a merge.
            wait_for("the target to equal the source",
                     lambda: env.reconcile(spark, "orders").ok, timeout=300, daemon_=running)
            merges = _merges(instance, env, "orders")
            lags = [m["lag_seconds"] for m in merges if "lag_seconds" in m]
            assert lags and max(lags) < 120, lags
            assert any(m["write"] == "append" for m in merges)
    finally:
        engine.stop()
