"""The lake's Spark work on a real Spark standalone cluster (issue 38): ``dagster job execute``
of ``materialise_targets`` with ``spark.master: spark://...`` merges (updates, deletes, key
changes and a schema change, which take Spark's MERGE) and reconciles on the executors of both
workers, with the package the platform shipped to them, and the target equals the source.

The cluster's workers run on this machine, so the local landing zone and warehouse are shared
paths (``spark.shared_filesystem``); without that setting the config is refused.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from cdc_platform.config import parse_settings
from cdc_platform.devservices import SparkCluster
from cdc_platform_tests.conftest import CdcEnv

pytestmark = pytest.mark.integration

DAGSTER = str(Path(sys.executable).with_name("dagster"))


MATERIALISE = [DAGSTER, "job", "execute", "-m", "cdc_platform.definitions", "-j",
               "materialise_targets"]


def _on_the_cluster(env: CdcEnv, cluster: SparkCluster, home: Path) -> dict[str, str]:
    """The environment of a Dagster command whose config runs Spark on ``cluster`` (the paths
    are shared: its workers are on this machine)."""
    conf = cluster.driver_conf(executor_memory="512m")
    env.overrides["spark"] = {"master": cluster.master_url, "shared_filesystem": True,
                              "conf": {k: v for k, v in conf.items() if k != "spark.master"}}
    home.mkdir()
    return {**os.environ, **cluster.driver_env(), "CDC_PLATFORM_CONFIG": str(env.write_config()),
            "DAGSTER_HOME": str(home)}


def _executor_dirs(cluster: SparkCluster) -> dict[str, list[Path]]:
    """Each worker's executor directories (``work/<app-id>/<executor-id>``), by worker."""
    return {worker.base_dir.name: sorted(path for path in worker.work_dir.glob("app-*/*")
                                         if path.is_dir())
            for worker in cluster.worker_daemons}


def _finished_tasks(directory: Path) -> int:
    stderr = directory / "stderr"
    return stderr.read_text(errors="replace").count("Finished task") if stderr.exists() else 0


def _finished_tasks_per_worker(cluster: SparkCluster) -> dict[str, int]:
    """Tasks each worker's executors logged as finished, by worker folder."""
    return {worker: sum(_finished_tasks(d) for d in dirs)
            for worker, dirs in _executor_dirs(cluster).items()}


def test_a_local_landing_zone_with_a_cluster_master_is_refused_in_one_line(
        cdc_env: CdcEnv) -> None:
    data = cdc_env.settings_dict()
    data["spark"] = {"master": "spark://spark-master:7077"}
    with pytest.raises(ValueError, match="spark.shared_filesystem: true") as refused:
        parse_settings(data, "test")
    assert "landing_zone.url" in str(refused.value) and "warehouse.url" in str(refused.value)
    data["spark"]["shared_filesystem"] = True
    assert parse_settings(data, "test").spark.shared_filesystem
    # object storage needs no shared path; a catalog service's warehouse may be a name
    data["spark"] = {"master": "spark://spark-master:7077"}
    data["landing_zone"] = {"url": "s3://cdc/landing"}
    data["warehouse"] = {"url": "cdc_lake", "catalog": {"type": "rest", "uri": "http://rest"}}
    assert parse_settings(data, "test").spark.master == "spark://spark-master:7077"
    data["warehouse"] = {"url": "/data/warehouse", "catalog": {"type": "rest",
                                                               "uri": "http://rest"}}
    with pytest.raises(ValueError, match="local warehouse.url '/data/warehouse'"):
        parse_settings(data, "test")


def test_materialise_targets_merges_and_reconciles_on_the_clusters_executors(
        cdc_env: CdcEnv, spark: Any, tmp_path: Path) -> None:
    env = cdc_env
    env.execute("CREATE TABLE orders (id INT PRIMARY KEY, customer INT, total DECIMAL(10,2))",
                "INSERT INTO orders SELECT seq, seq % 7, seq / 4 FROM seq_1_to_3000")
    env.catch_up()
    env.materialise(spark, "orders")  # (the initial load: appended in the driver)
    env.execute("UPDATE orders SET total = total + 1 WHERE id % 5 = 0",
                "DELETE FROM orders WHERE id % 11 = 0",
                "UPDATE orders SET id = id + 10000 WHERE id % 13 = 1",  # key changes
                "ALTER TABLE orders ADD COLUMN note VARCHAR(20)",  # (NULL in older rows)
                "UPDATE orders SET note = CONCAT('x', id) WHERE id % 3 = 0")
    env.catch_up()

    with SparkCluster(tmp_path / "spark", worker_count=2, worker_cores=1,
                      worker_memory="1g") as cluster:
        home = tmp_path / "dagster_home"
        run_env = _on_the_cluster(env, cluster, home)
        done = subprocess.run(MATERIALISE, env=run_env, capture_output=True, text=True,
                              timeout=900)
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-4000:]
        assert "RUN_SUCCESS" in output
        executors = _executor_dirs(cluster)
        tasks = _finished_tasks_per_worker(cluster)

    # The work left the driver: both workers' executors finished tasks, and each executor got
    # the package the driver shipped (spark.submit.pyFiles), whatever it has installed.
    assert len(tasks) == 2 and all(count > 0 for count in tasks.values()), tasks
    shipped = {worker: [p.name for d in dirs for p in d.glob("cdc_platform-*.zip")]
               for worker, dirs in executors.items()}
    assert all(shipped.values()), shipped
    # The merge was Spark's MERGE (a column the target did not have), and the target is exact.
    with dg.DagsterInstance.from_config(str(home)) as instance:
        record = instance.get_latest_materialization_event(
            dg.AssetKey([env.server_name, env.db, "orders"]))
    assert record is not None and record.asset_materialization is not None
    merged = {k: getattr(v, "value", v) for k, v in record.asset_materialization.metadata.items()}
    assert merged["written_by"] == "spark" and merged["write"] == "merge", merged
    assert "note" in [f.name for f in env.target(spark, "orders").read().schema.fields]
    assert env.reconcile(spark, "orders").ok
    expected = env.query("SELECT COUNT(*) FROM orders")[0][0]
    assert len(env.target_rows(spark, "orders")) == expected


def _running_tasks(directory: Path) -> int:
    stderr = directory / "stderr"
    return stderr.read_text(errors="replace").count("Running task") if stderr.exists() else 0


def test_a_worker_lost_in_the_middle_of_a_merge_leaves_the_target_exact(
        cdc_env: CdcEnv, spark: Any, tmp_path: Path) -> None:
    """A worker and its executor SIGKILLed (a lost machine) while ``materialise_targets``
    runs Spark's MERGE of 100k changes: Spark runs the lost tasks again on the other worker,
    or the run fails and the next one (as the applier retries) merges; either way exact."""
    env = cdc_env
    env.execute("CREATE TABLE orders (id INT PRIMARY KEY, customer INT, total DECIMAL(10,2))",
                "INSERT INTO orders SELECT seq, seq % 7, seq / 4 FROM seq_1_to_200000")
    env.catch_up()
    env.materialise(spark, "orders")
    env.execute("ALTER TABLE orders ADD COLUMN note VARCHAR(20)",  # (Spark's MERGE)
                "UPDATE orders SET total = total + 1, note = 'u' WHERE id % 2 = 0",
                "DELETE FROM orders WHERE id % 17 = 0",
                "UPDATE orders SET id = id + 1000000 WHERE id % 101 = 1")
    env.catch_up()

    with SparkCluster(tmp_path / "spark", worker_count=2, worker_cores=1,
                      worker_memory="1g") as cluster:
        run_env = _on_the_cluster(env, cluster, tmp_path / "dagster_home")
        command = MATERIALISE
        log = tmp_path / "first-run.log"
        with open(log, "w") as out:
            first = subprocess.Popen(command, env=run_env, stdout=out, stderr=subprocess.STDOUT)
            try:
                deadline = time.monotonic() + 600
                lost = cluster.worker_daemons[1]
                while not any(_running_tasks(d) for d in lost.work_dir.glob("app-*/*")):
                    assert first.poll() is None, log.read_text()[-4000:]
                    assert time.monotonic() < deadline, "no task ever ran on the second worker"
                    time.sleep(0.2)
                cluster.kill_worker(1, executors=True)
                assert first.poll() is None  # (killed while the run was at work)
                first_code = first.wait(600)
            finally:
                if first.poll() is None:
                    first.kill()
        if first_code != 0:  # the merge failed with the worker: the next run merges
            again = subprocess.run(command, env=run_env, capture_output=True, text=True,
                                   timeout=900)
            assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]

    assert env.reconcile(spark, "orders").ok, log.read_text()[-4000:]
    assert len(env.target_rows(spark, "orders")) == env.query("SELECT COUNT(*) FROM orders")[0][0]


def test_a_million_rows_load_then_upkeep_and_the_applier_on_the_cluster(
        cdc_env: CdcEnv, spark: Any, tmp_path: Path) -> None:
    """1M rows' initial load by ``materialise_targets`` on the cluster (appended in the driver,
    the driver-side path: the work a cluster must never make slower), reconciled on both
    workers' executors; ``lake_maintenance`` on the cluster; then the applier
    (``python -m cdc_platform apply``, the loop ``apply_changes`` runs) with the cluster as its
    master merges updates, deletes and key changes as they land, and the target stays exact."""
    env = cdc_env
    rows = 1_000_000
    env.execute("CREATE TABLE events (id INT PRIMARY KEY, kind TINYINT, amount DECIMAL(12,2), "
                "label VARCHAR(16), at DATETIME(3))",
                f"INSERT INTO events SELECT seq, seq % 5, seq / 8, CONCAT('e', seq % 1000), "
                f"TIMESTAMP('2024-01-01') + INTERVAL seq SECOND FROM seq_1_to_{rows}")
    env.catch_up()

    with SparkCluster(tmp_path / "spark", worker_count=2, worker_cores=1,
                      worker_memory="1g") as cluster:
        home = tmp_path / "dagster_home"
        run_env = _on_the_cluster(env, cluster, home)
        loaded = subprocess.run(MATERIALISE, env=run_env, capture_output=True, text=True,
                                timeout=1200)
        assert loaded.returncode == 0, (loaded.stdout + loaded.stderr)[-4000:]
        after_load = _finished_tasks_per_worker(cluster)
        with dg.DagsterInstance.from_config(str(home)) as instance:
            record = instance.get_latest_materialization_event(
                dg.AssetKey([env.server_name, env.db, "events"]))
            checks = instance.event_log_storage.get_asset_check_execution_history(
                dg.AssetCheckKey(dg.AssetKey([env.server_name, env.db, "events"]), "reconcile"),
                limit=1)
        assert record is not None and record.asset_materialization is not None
        meta = {k: getattr(v, "value", v) for k, v in record.asset_materialization.metadata.items()}
        assert meta["rows"] == rows and meta["write"] == "append", meta
        assert meta["written_by"] == "pyarrow", meta  # the initial load stayed in the driver
        check = checks[0].event.dagster_event.event_specific_data
        assert check.passed, check.metadata
        # the reconcile of the million rows ran on the cluster's executors (in 2 tasks, one
        # stage after the other: both may land on one executor)
        assert len(after_load) == 2 and sum(after_load.values()) > 0, after_load

        upkeep = subprocess.run([DAGSTER, "job", "execute", "-m", "cdc_platform.definitions",
                                 "-j", "lake_maintenance"], env=run_env, capture_output=True,
                                text=True, timeout=900)
        assert upkeep.returncode == 0, (upkeep.stdout + upkeep.stderr)[-4000:]

        log = tmp_path / "apply.log"
        with open(log, "w") as out:
            applier = subprocess.Popen([sys.executable, "-m", "cdc_platform", "apply"],
                                       env=run_env, stdout=out, stderr=subprocess.STDOUT)
            try:
                env.execute("ALTER TABLE events ADD COLUMN note VARCHAR(8)",  # (Spark's MERGE)
                            "UPDATE events SET amount = amount + 1, note = 'u' "
                            "WHERE id % 50 = 0",
                            "DELETE FROM events WHERE id % 97 = 0",
                            "UPDATE events SET id = id + 2000000 WHERE id % 301 = 1")
                env.catch_up()
                expected = env.query("SELECT COUNT(*) FROM events")[0][0]
                deadline = time.monotonic() + 600
                while True:
                    assert applier.poll() is None, log.read_text()[-4000:]
                    if (len(env.target(spark, "events").read().columns) >= 6
                            and env.target(spark, "events").read().count() == expected
                            and env.reconcile(spark, "events").ok):
                        break
                    assert time.monotonic() < deadline, log.read_text()[-4000:]
                    time.sleep(5)
            finally:
                applier.terminate()
                code = applier.wait(120)
        assert code == 0, log.read_text()[-4000:]
        total = _finished_tasks_per_worker(cluster)
    # the applier's session (its own application) ran tasks on the cluster too (that a
    # MERGE's stages spread over both workers: test_materialise_targets_merges_...)
    assert sum(total.values()) > sum(after_load.values()), (after_load, total)
    assert env.reconcile(spark, "events").ok
