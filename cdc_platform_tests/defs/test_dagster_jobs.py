"""The Dagster code location on a real Dagster instance, real MariaDB and real Spark."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from cdc_platform.definitions import build_definitions
from cdc_platform_tests.conftest import CdcEnv

DAGSTER = str(Path(sys.executable).with_name("dagster"))


def _seed(env: CdcEnv) -> None:
    env.execute("CREATE TABLE customers (id INT PRIMARY KEY, name VARCHAR(40))")
    env.execute("CREATE TABLE orders (id BIGINT UNSIGNED PRIMARY KEY, customer_id INT, "
                "total DECIMAL(10,2), placed_at DATETIME(6))")
    env.execute("CREATE TABLE empty_table (id INT PRIMARY KEY)")
    env.execute("INSERT INTO customers VALUES (1,'ann'),(2,'bob'),(3,'cy')")
    env.execute(*[f"INSERT INTO orders VALUES ({i}, {i % 3 + 1}, {i}.50, "
                  f"'2025-01-01 00:00:{i % 60:02d}.{i:06d}')" for i in range(1, 200)])
    env.execute("UPDATE orders SET total = total * 2 WHERE id % 10 = 0",
                "DELETE FROM customers WHERE id = 3")


def _env_for_cli(env: CdcEnv, dagster_home: Path) -> dict[str, str]:
    dagster_home.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "CDC_PLATFORM_CONFIG": str(env.write_config()),
            "DAGSTER_HOME": str(dagster_home), "PYSPARK_PYTHON": sys.executable}


def test_catch_up_and_reconcile_job_materialises_every_table(cdc_env, spark):
    env = cdc_env
    _seed(env)
    defs = build_definitions(env.settings)
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def("catch_up_and_reconcile").execute_in_process(instance=instance)
        assert result.success
        orders = instance.get_latest_materialization_event(
            dg.AssetKey([env.server_name, env.db, "orders"])).asset_materialization
        assert orders.metadata["rows"].value == 199
        assert orders.metadata["inserts"].value == 199
        empty = instance.get_latest_materialization_event(
            dg.AssetKey([env.server_name, env.db, "empty_table"])).asset_materialization
        assert empty.metadata["rows"].value == 0
        checks = result.get_asset_check_evaluations()
        # (no "fresh": a batch run has no applier to judge)
        assert sorted(c.check_name for c in checks) == ["binlog_headroom"] + [
            "not_stale"] * 3 + ["reconcile"] * 3
        assert all(c.passed for c in checks)
        changelog = instance.get_latest_materialization_event(
            dg.AssetKey([env.server_name, "changelog"])).asset_materialization
        # customers: 3 inserts + 1 delete; orders: 199 inserts + 19 updates (ids 10, 20 ... 190)
        assert changelog.metadata["records_landed"].value == 3 + 1 + 199 + 19


def test_one_tables_check_runs_alone_and_a_failing_table_leaves_the_others_materialised(
        cdc_env, spark):
    """The targets of a source are one multi-asset: a run may select one table's check
    alone (the UI's "execute check"); a table that cannot be materialised fails the step
    naming it, after the others were materialised and checked."""
    env = cdc_env
    _seed(env)
    defs = build_definitions(env.settings)
    orders = dg.AssetKey([env.server_name, env.db, "orders"])
    with dg.instance_for_test() as instance:
        assert defs.resolve_job_def("catch_up_and_reconcile").execute_in_process(
            instance=instance).success
        job = dg.define_asset_job("orders_reconcile", selection=dg.AssetSelection.checks(
            dg.AssetCheckKey(orders, "reconcile")))
        alone = dg.Definitions.merge(defs, dg.Definitions(jobs=[job])).resolve_job_def(
            "orders_reconcile").execute_in_process(instance=instance)
        assert [(c.asset_key, c.check_name, c.passed) for c in
                alone.get_asset_check_evaluations()] == [(orders, "reconcile", True)]
        assert not alone.get_asset_materialization_events()

        # customers' changelog is unreadable: its merge fails, the other tables are merged
        env.execute("INSERT INTO orders VALUES (900, 1, 9.50, '2025-01-02 00:00:00')",
                    "INSERT INTO customers VALUES (4, 'di')")
        env.catch_up()
        for segment in (env.landing.root / "changelog" / env.db / "customers").glob("*"):
            segment.write_bytes(b"not parquet")
        result = defs.resolve_job_def("materialise_targets").execute_in_process(
            instance=instance, raise_on_error=False)
        assert not result.success
        [failure] = result.get_step_failure_events()
        description = failure.step_failure_data.user_failure_data.description
        materialised = {e.asset_key.path[-1] for e in result.get_asset_materialization_events()}
        checked = {(c.asset_key.path[-1], c.check_name) for c in
                   result.get_asset_check_evaluations() if c.passed}
    assert description.startswith(f"1 of the selected tables of '{env.server_name}' failed")
    assert f"{env.db}.customers (materialisation): " in description
    assert materialised == {"orders", "empty_table"}
    assert {("orders", "reconcile"), ("orders", "not_stale")} <= checked


def test_reconcile_check_fails_the_job_when_target_and_source_differ(cdc_env, spark):
    env = cdc_env
    _seed(env)
    # Changes the binlog never sees: the source drifts away from what the stream can know.
    env.execute("SET SESSION sql_log_bin = 0", "DELETE FROM orders WHERE id = 5",
                "UPDATE orders SET total = 0 WHERE id = 6", "INSERT INTO orders VALUES "
                "(500, 1, 1.00, '2025-01-01 00:00:00')")
    defs = build_definitions(env.settings)
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def("catch_up_and_reconcile").execute_in_process(
            instance=instance, raise_on_error=False)
        assert not result.success
        failed = [c for c in result.get_asset_check_evaluations() if not c.passed]
        assert [c.asset_key.path[-1] for c in failed] == ["orders"]
        metadata = {k: v.value for k, v in failed[0].metadata.items()}
        assert (metadata["missing"], metadata["extra"], metadata["different"]) == (1, 1, 1)


def test_dagster_job_execute_cli_runs_the_ci_job(cdc_env, tmp_path):
    """What CI runs: the job through the `dagster job execute` command line."""
    env = cdc_env
    _seed(env)
    done = subprocess.run(
        [DAGSTER, "job", "execute", "-m", "cdc_platform.definitions", "-j",
         "catch_up_and_reconcile"],
        env=_env_for_cli(env, tmp_path / "dagster_home"), capture_output=True, text=True,
        timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "RUN_SUCCESS" in done.stdout + done.stderr


def test_stream_job_stops_cleanly_on_sigterm_and_checkpoints(cdc_env, tmp_path):
    env = cdc_env
    env.execute("CREATE TABLE ticks (id INT AUTO_INCREMENT PRIMARY KEY, v INT)")
    process = subprocess.Popen(
        [DAGSTER, "job", "execute", "-m", "cdc_platform.definitions", "-j", "stream_changes"],
        env=_env_for_cli(env, tmp_path / "dagster_home"), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        for i in range(30):
            env.execute("INSERT INTO ticks (v) VALUES (%s)", args=(i,))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            checkpoint = env.landing.read_checkpoint()
            if checkpoint and checkpoint.next_pos > 30:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the streaming run never landed the 30 rows")
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert "stop requested" in output
    assert "stopping -> stopped" in output or "-> stopped" in output
    assert env.landing.read_checkpoint().next_pos == 31
