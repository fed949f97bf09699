"""The private Spark standalone cluster: a job's tasks run on the executors of both workers,
Python workers on those executors run this interpreter, a killed worker is noticed and
replaced, and nothing keeps running after stop.

The driver runs in a child process (``python -m`` this module): a process holds one
SparkContext, and in a whole test run this process may already hold the suite's local session,
which ``getOrCreate()`` would hand back instead of a session on the cluster. The child attaches
to the cluster through its state files, as another process would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.devservices import SparkCluster, find_processes

pytestmark = pytest.mark.integration

_ROWS = 1_000_000
_PARTITIONS = 8


def _drive(base_dir: Path) -> dict[str, Any]:
    """In the child: a session on the cluster, a SQL job and a Python job, what ran where."""
    cluster = SparkCluster(base_dir, event_log=True)
    if not cluster.attach():
        raise RuntimeError(f"no running Spark cluster recorded in {base_dir}")
    os.environ.update(cluster.driver_env())
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("test_spark_cluster")
    conf = {**cluster.driver_conf(executor_memory="512m"),
            "spark.ui.showConsoleProgress": "false"}
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        total = spark.range(0, _ROWS, numPartitions=_PARTITIONS).selectExpr("sum(id)").collect()
        python_tasks = (spark.sparkContext.parallelize(range(_PARTITIONS), _PARTITIONS)
                        .map(lambda i: (i, sys.executable, os.getcwd())).collect())
        # The driver counts tasks asynchronously: wait for the 2 jobs' tasks (8 + 1 + 8).
        deadline = time.monotonic() + 120
        while True:
            per_worker = cluster.tasks_per_worker(spark)
            if sum(per_worker.values()) >= 2 * _PARTITIONS + 1 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        return {
            "app_id": spark.sparkContext.applicationId,
            "master": spark.sparkContext.master,
            "sum": total[0][0],
            "python_tasks": python_tasks,
            "tasks_per_worker": per_worker,
            "executors": [[e.executor_id, e.worker_id, e.total_tasks]
                          for e in cluster.executors(spark)],
        }
    finally:
        spark.stop()


def _run_driver(cluster: SparkCluster) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "cdc_platform_tests.devservices.test_spark_cluster",
         str(cluster.base_dir)],
        capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, f"driver failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def _wait_for(condition: Any, timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)
    return True


def test_a_job_runs_on_the_executors_of_both_workers(tmp_path: Path) -> None:
    cluster = SparkCluster(tmp_path / "spark", worker_count=2, worker_memory="1g",
                           event_log=True)
    daemons = [cluster.master, *cluster.worker_daemons, cluster.history]
    with cluster:
        assert cluster.start() is cluster  # (already running: a no-op)
        assert cluster.master_url.startswith("spark://127.0.0.1:")
        workers = cluster.workers()
        assert sorted(w.port for w in workers) == sorted(d.port for d in cluster.worker_daemons)
        assert {(w.state, w.cores) for w in workers} == {("ALIVE", 1)}

        result = _run_driver(cluster)
        app_id = result["app_id"]
        assert result["master"] == cluster.master_url
        assert result["sum"] == _ROWS * (_ROWS - 1) // 2

        per_worker = result["tasks_per_worker"]
        assert set(per_worker) == {w.id for w in workers}, per_worker  # every executor mapped
        assert all(count > 0 for count in per_worker.values()), per_worker
        assert sum(per_worker.values()) >= 2 * _PARTITIONS  # (8 + 8, and the sum's final task)

        # Python tasks ran this interpreter, in executor directories of both workers
        # (<worker>/work/<app-id>/<executor-id>): the helper's mapping, seen independently.
        dir_of_worker = {w.id: d.work_dir for w in workers for d in cluster.worker_daemons
                         if d.port == w.port}
        assert sorted(i for i, _, _ in result["python_tasks"]) == list(range(_PARTITIONS))
        assert {executable for _, executable, _ in result["python_tasks"]} == {sys.executable}
        ran_in = {(worker_id, Path(cwd).name) for _, _, cwd in result["python_tasks"]
                  for worker_id, work_dir in dir_of_worker.items()
                  if Path(cwd).parent == work_dir / app_id}
        assert all(any(Path(cwd).parent == work_dir / app_id for work_dir in dir_of_worker.values())
                   for _, _, cwd in result["python_tasks"]), result["python_tasks"]
        assert {worker_id for worker_id, _ in ran_in} == set(dir_of_worker), ran_in
        placed = {(worker_id, executor_id) for executor_id, worker_id, _ in result["executors"]}
        assert ran_in == placed, (ran_in, placed)

        # The driver has ended: the history server's status API, from its event log, says
        # the same as the driver's own did while it ran.
        applications, logged = cluster.logged_tasks_per_worker()
        assert applications == 1
        assert logged == per_worker, (logged, per_worker)
        assert cluster.history.is_running()

        # A crashed worker: the master marks it DEAD; a restart brings a second one back.
        killed = cluster.worker_daemons[0]
        cluster.kill_worker(0)
        assert not killed.is_running()
        assert _wait_for(lambda: any(w.port == killed.port and w.state == "DEAD"
                                     for w in cluster.workers()))
        cluster.restart_worker(0)
        alive = [w for w in cluster.workers() if w.state == "ALIVE"]
        assert sorted(w.port for w in alive) == sorted(d.port for d in cluster.worker_daemons)

    for daemon in daemons:
        assert not find_processes("java", str(daemon.properties_file)), daemon
        assert not daemon.state_file.exists()
    assert not find_processes("java", app_id)  # executors (--app-id) are gone too
    assert not cluster.state_file.exists()


def test_a_temporary_cluster_removes_its_directory() -> None:
    cluster = SparkCluster(worker_count=1)
    base = cluster.base_dir
    assert base is not None and not base.exists()  # nothing until started
    with cluster:
        assert base.exists() and len(cluster.workers()) == 1
    assert not base.exists()
    assert not find_processes("java", str(cluster.master.properties_file))


if __name__ == "__main__":
    print(json.dumps(_drive(Path(sys.argv[1]))))
