"""kill -9 of the engine at several points, then restart: the target still equals the source."""

from __future__ import annotations

import subprocess
import sys
import time

from cdc_platform.demo.inventory import Workload, create_schema, load_initial_data
from cdc_platform_tests.conftest import CdcEnv

TABLES = ("customers", "products", "orders", "audit_log")


def _start_engine(env: CdcEnv) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "cdc_platform", "stream", "--config", str(env.write_config())],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_kill_9_at_several_points_then_restart_keeps_the_target_exact(cdc_env, spark):
    env = cdc_env
    env.overrides["capture"] = {"flush_interval_seconds": 0.1, "flush_max_rows": 500}
    with env.connect() as conn:
        create_schema(conn, env.db)
        load_initial_data(conn, env.db, customers=200, products=50, orders=4_000, batch=500)
    workload = Workload(env.mariadb.connection_settings(user="root"), db=env.db, rate=250,
                        customers=200, products=50, orders=4_000)
    workload.start(seconds=14)

    landed: list[int] = []
    for lifetime in (0.4, 1.3, 2.2, 3.1):  # start-up, first flushes, mid-stream, catching up
        engine = _start_engine(env)
        time.sleep(lifetime)
        engine.kill()  # SIGKILL: no flush, no checkpoint, maybe a half-written segment
        engine.wait()
        checkpoint = env.landing.read_checkpoint()
        landed.append(checkpoint.next_pos if checkpoint else 1)
        # Between crashes the lake only sees what the last checkpoint covers: a consistent
        # prefix with no duplicate effect, whatever the dead engine left behind.
        if checkpoint:
            env.materialise(spark, "orders")
    assert landed == sorted(landed) and landed[-1] > 1, landed

    stats = workload.join()
    assert stats.transactions > 500 and not stats.errors
    env.catch_up()
    for table in TABLES:
        env.materialise(spark, table)
        result = env.reconcile(spark, table)
        assert result.ok, (table, result.to_metadata())
        assert result.source_rows > 0

