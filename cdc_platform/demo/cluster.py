"""``make demo-cluster`` / ``python -m cdc_platform demo --spark-cluster``: the S3 demo with the
lake's Spark work on a real Spark standalone cluster.

The demo of ``make demo-s3`` (landing zone and lake on the demo's SeaweedFS, tables in its
Iceberg REST catalog), with a private Spark standalone master and two workers of one core each
(``devservices.spark_cluster``, started from the pinned pyspark's own launcher classes). The
config's ``spark.master`` is the master's ``spark://`` URL: every Spark session of the demo's
runs (``materialise_targets``' merges and reconciles, dbt's models) is a driver in its Dagster
run's process whose tasks run on the workers' executors, which read the landing zone and write
the lake on S3 (nothing is shared through the driver's disk). The executors get the package
and the jars from the driver, as any cluster's would (``lake.spark.cluster_conf``).

The drivers keep event logs, and at the end Spark's history server serves their status API:
the summary says how many tasks ran on each worker's executors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cdc_platform.devservices.spark_cluster import SparkCluster

#: Two workers of one core and 1 GiB each: the cluster of the issue, on this machine.
WORKERS = 2
WORKER_CORES = 1
WORKER_MEMORY = "1g"
EXECUTOR_MEMORY = "512m"


def demo_cluster(base_dir: Path, worker_env: dict[str, str]) -> SparkCluster:
    """The demo's Spark cluster (not started), keeping its drivers' event logs; its workers'
    executors get ``worker_env`` (the S3 server's credentials, as a real node has its own)."""
    return SparkCluster(base_dir, worker_count=WORKERS, worker_cores=WORKER_CORES,
                        worker_memory=WORKER_MEMORY, event_log=True, worker_env=worker_env)


def spark_section(demo_spark: dict[str, Any], cluster: SparkCluster) -> dict[str, Any]:
    """The demo config's ``spark`` section (parsed YAML) pointed at the running ``cluster``:
    its master, and the settings a driver on this machine needs to use it. Several drivers
    share it, the appliers the daemon keeps running among them: dynamic allocation gives
    executors back when a driver is idle (without it the first applier kept both cores and the
    demo's runs waited for them)."""
    conf = {key: value for key, value in
            cluster.driver_conf(EXECUTOR_MEMORY, dynamic_allocation=True).items()
            if key != "spark.master"}
    return {**demo_spark, "master": cluster.master_url,
            "conf": {**demo_spark.get("conf", {}), **conf}}


def tasks_line(cluster: SparkCluster) -> tuple[str, dict[str, int]]:
    """Where the Spark tasks of the demo's drivers (its runs, and the appliers the daemon
    keeps running) ran: per worker, from Spark's status API (the history server's: most
    drivers have ended). The line, and the tasks by worker name."""
    applications, tasks = cluster.logged_tasks_per_worker()
    folders = {(daemon.host, daemon.port): daemon.base_dir.name
               for daemon in cluster.worker_daemons}
    names = {info.id: folders.get((info.host, info.port), info.id)
             for info in cluster.workers()}
    named = sorted((names.get(worker, worker), count) for worker, count in tasks.items())
    per_worker = ", ".join(f"{name} {count:,}" for name, count in named)
    line = (f"Spark tasks run on each worker's executors ({cluster.master_url}; "
            f"{applications} applications: the runs' and the appliers' drivers): {per_worker}")
    return line, dict(named)
