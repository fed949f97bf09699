"""The lake's Spark work on ``local[2]`` and on a standalone cluster of 2 workers x 1 core, on
this same machine (issue 38): a 1M-row initial load, a merge of 100k changes into it, and a
reconcile of the 1M rows, each by Spark and (load, merge) without Spark in the driver.

On one machine a cluster cannot be faster: the figures show its overhead (executors in JVMs of
their own, shuffles between them, Python workers on each), and the tasks per worker show that
the work left the driver. The driver-side paths (``lake/arrow_load.py``, ``lake/arrow_merge.py``)
run in the driver whatever the master, so their figure is the same on both; they are what the
platform takes by default where they apply.

``python -m bench.cluster [ROWS] [CHANGES]`` (default 1,000,000 and 100,000); ``make bench``
prints it as the ``cluster`` section. Each measured call runs in a driver process of its own
(a process holds one SparkContext), timed after the session has started and run a warm-up job.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench._lake import command_env, write_config
from cdc_platform.devservices.mariadb import MariaDBServer
from cdc_platform.devservices.spark_cluster import SparkCluster

SERVER_NAME = "bench_cluster"
DATABASE = "bench_cluster"
TABLE = "orders"


def _fill(server: MariaDBServer, rows: int) -> None:
    """``rows`` rows written through the binlog, 100k a transaction."""
    with server.root_connect() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {DATABASE}")
        cur.execute(f"CREATE TABLE {DATABASE}.{TABLE} (id BIGINT PRIMARY KEY, customer INT, "
                    "total DECIMAL(12,2), status VARCHAR(8), placed DATETIME(6))")
        for start in range(0, rows, 100_000):
            cur.execute(
                f"INSERT INTO {DATABASE}.{TABLE} SELECT seq, seq % 1000, (seq % 99991) / 100, "
                "ELT(1 + seq % 3, 'new', 'paid', 'shipped'), TIMESTAMP('2025-01-01') + "
                f"INTERVAL seq SECOND FROM {DATABASE}.seq_{start + 1}_to_{min(rows, start + 100_000)}")
            conn.commit()


def _change(server: MariaDBServer, rows: int, changes: int) -> None:
    """``changes`` changes spread over the table: updates, with a delete every tenth."""
    every = max(1, rows // changes)
    with server.root_connect() as conn, conn.cursor() as cur:
        cur.execute(f"UPDATE {DATABASE}.{TABLE} SET total = total + 1, status = 'changed' "
                    f"WHERE id % {every} = 0 AND id % {every * 10} != 0")
        cur.execute(f"DELETE FROM {DATABASE}.{TABLE} WHERE id % {every * 10} = 0")
        conn.commit()


def _catch_up(config: Path) -> None:
    from cdc_platform.capture.engine import CaptureEngine, EngineOptions
    from cdc_platform.capture.landing.zone import LandingZone
    from cdc_platform.config import load_settings

    settings = load_settings(config)
    CaptureEngine(EngineOptions.from_settings(settings),
                  LandingZone.from_settings(settings)).run(stop_when_caught_up=True)


def _drive(config: Path, step: str, spark_free: bool, cluster_dir: str) -> dict[str, Any]:
    """In a driver process: one step on the config's master, timed after a warm-up."""
    from cdc_platform.capture.source import SourceSession, selector_from_settings
    from cdc_platform.config import load_settings
    from cdc_platform.lake.iceberg.lake import Lake
    from cdc_platform.lake.iceberg.table import LakeTable
    from cdc_platform.lake.merge import materialise
    from cdc_platform.lake.reconcile import reconcile_table
    from cdc_platform.lake.spark import build_spark_session, settings_conf

    settings = load_settings(config)
    spark = build_spark_session(settings.spark.master, "bench_cluster", settings_conf(settings))
    spark.range(0, 100_000, numPartitions=4).selectExpr("sum(id)").collect()  # (warm-up)
    cluster = SparkCluster(Path(cluster_dir)) if cluster_dir else None
    if cluster is not None and not cluster.attach():
        raise RuntimeError(f"no Spark cluster in {cluster_dir}")
    before = cluster.tasks_per_worker(spark) if cluster is not None else {}
    started = time.monotonic()
    if step in ("load", "merge"):
        result = materialise(spark, settings.landing_zone.url, settings.warehouse.url,
                             SERVER_NAME, None, DATABASE, TABLE, spark_free=spark_free)
        detail = {"records": result.records_read, "rows": result.rows, "spark": result.spark}
    else:
        connection = settings.source.connection_settings()
        with SourceSession(connection, selector_from_settings(settings)) as source:
            schema = source.read_schema(DATABASE, TABLE)
        target = LakeTable(Lake.from_settings(spark, settings), SERVER_NAME, DATABASE, TABLE).read()
        checked = reconcile_table(spark, target, connection, schema)
        detail = {"rows": checked.source_rows, "ok": checked.ok}
    seconds = time.monotonic() - started
    tasks: dict[str, int] = {}
    if cluster is not None:
        time.sleep(2.0)  # (the driver's status API counts tasks asynchronously)
        after = cluster.tasks_per_worker(spark)
        tasks = {worker: after.get(worker, 0) - before.get(worker, 0) for worker in after}
    return {"seconds": seconds, "tasks": tasks, **detail}


def _run_driver(config: Path, step: str, spark_free: bool, cluster: SparkCluster | None,
                env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "bench.cluster", "--drive", str(config), step,
         "1" if spark_free else "0", str(cluster.base_dir) if cluster is not None else ""],
        env={**os.environ, **env, **(cluster.driver_env() if cluster is not None else {})},
        capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"the {step} driver failed:\n{(done.stdout + done.stderr)[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_cluster(rows: int, changes: int, work: Path) -> None:
    print(f"\n## the lake's Spark work: local[2] vs a standalone cluster of 2 workers x 1 core "
          f"(this machine, pyspark's own launcher): a {rows:,}-row initial load, a merge of "
          f"~{changes:,} changes (updates, a tenth deletes) into it, a reconcile of the rows; "
          "each in a driver of its own, timed after a warm-up job")
    root = work / "cluster"
    root.mkdir(parents=True)
    server = MariaDBServer(base_dir=root / "mariadb", server_id=1)
    server.start()
    try:
        with SparkCluster(root / "spark", worker_count=2, worker_cores=1,
                          worker_memory="2g") as cluster:
            driver_conf = {k: v for k, v in cluster.driver_conf(executor_memory="1g").items()
                           if k != "spark.master"}
            configs: dict[str, Path] = {}
            for label, master, conf in (("local[2]", "local[2]", {}),
                                        ("cluster", cluster.master_url, driver_conf)):
                for path in ("spark", "arrow"):
                    name = f"{label}/{path}"
                    configs[name] = write_config(
                        root / f"config-{label[:5]}-{path}.yaml", server, SERVER_NAME, 7401,
                        rf"{DATABASE}\..*", root, sections={
                            "warehouse": {"url": str(root / f"warehouse-{label[:5]}-{path}")},
                            "spark": {"master": master, "shared_filesystem": True,
                                      "conf": conf}})
            env = command_env(server)
            os.environ.update(env)
            _fill(server, rows)
            _catch_up(next(iter(configs.values())))
            results: dict[str, dict[str, dict[str, Any]]] = {}
            for step in ("load", "merge", "reconcile"):
                if step == "merge":
                    _change(server, rows, changes)
                    _catch_up(next(iter(configs.values())))
                for name, config in configs.items():
                    if step == "reconcile" and name.endswith("/arrow"):
                        continue  # (reconcile is Spark's work in both)
                    spark_free = name.endswith("/arrow")
                    who = "cluster" in name
                    results.setdefault(step, {})[name] = _run_driver(
                        config, step, spark_free, cluster if who else None, env)
    finally:
        server.stop()
    for step, by_name in results.items():
        for name, result in by_name.items():
            rate = (f", {result['records'] / result['seconds']:,.0f} records/s"
                    if "records" in result else f", {result['rows']:,} rows")
            tasks = (" tasks per worker " + ", ".join(f"{w[:24]}: {n}" for w, n in
                                                      sorted(result["tasks"].items()))
                     if result["tasks"] else "")
            how = ("Spark" if result.get("spark", True) else "without Spark, in the driver")
            print(f"  {step:9} {name:16} {result['seconds']:7.2f} s{rate} ({how}){tasks}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("rows", type=int, nargs="?", default=1_000_000)
    parser.add_argument("changes", type=int, nargs="?", default=100_000)
    parser.add_argument("--drive", nargs=4, metavar=("CONFIG", "STEP", "SPARK_FREE", "CLUSTER"))
    args = parser.parse_args()
    if args.drive:
        config, step, spark_free, cluster_dir = args.drive
        print(json.dumps(_drive(Path(config), step, spark_free == "1", cluster_dir)))
        return 0
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        bench_cluster(args.rows, args.changes, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
