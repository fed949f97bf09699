"""The torture's fault run (kill -9s of the engine, snapshot rounds with kill -9s of their
readers, a failover to the other replica, the snapshots the platform asks for, the compare)
with the landing zone and the warehouse on a SeaweedFS the run starts: ``s3://`` landing zone, SeaweedFS's Iceberg REST catalog, and every
target read back with pyiceberg through that catalog.

Run it apart from ``make torture`` (``make torture-s3``): Spark's S3 jars are static, so this
module's Spark session must be the first its process builds.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from cdc_platform.devservices.seaweedfs import SeaweedFS
from cdc_platform_tests.torture import harness
from cdc_platform_tests.torture.harness import REPORT, Cluster, FaultResult, run_faults

pytestmark = [pytest.mark.torture_s3, pytest.mark.integration, pytest.mark.timeout(3600)]


@pytest.fixture(scope="module")
def s3_storage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.ObjectStorage]:
    """A SeaweedFS with the landing bucket and the catalog's table bucket; its credentials in
    the standard AWS variables, where the engine's child processes and Spark take them."""
    server = SeaweedFS(tmp_path_factory.mktemp("seaweedfs"), table_bucket="lake")
    server.start()
    saved = dict(os.environ)
    os.environ.update({**server.client_env(), "AWS_EC2_METADATA_DISABLED": "true"})
    os.environ.pop("AWS_ENDPOINT_URL", None)  # the stores take the endpoint from the config
    storage = harness.ObjectStorage(s3=server)
    server.create_bucket(storage.landing_bucket)
    harness.STORAGE = storage
    try:
        yield storage
    finally:
        harness.STORAGE = harness.ObjectStorage()
        os.environ.clear()
        os.environ.update(saved)
        server.stop()


@pytest.fixture(scope="module")
def s3_spark(s3_storage: harness.ObjectStorage, tmp_path_factory: pytest.TempPathFactory
             ) -> Any:
    """The lake's Spark session with the S3 jars and ``s3a`` settings of an S3 config."""
    from cdc_platform.config import parse_settings
    from cdc_platform.lake.spark import build_spark_session, settings_conf

    root = tmp_path_factory.mktemp("spark-conf")
    data = {"source": {"flavour": "mariadb", "host": "127.0.0.1", "port": 3306, "user": "u",
                       "server_id": 1, "server_name": "conf"},
            **s3_storage.sections(root)}
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return build_spark_session(master="local[2]", app_name="torture_s3",
                               conf=settings_conf(parse_settings(data, "torture s3 spark")))


@pytest.fixture(scope="module")
def s3_fault_result(cluster: Cluster, s3_spark: Any, tmp_path_factory: pytest.TempPathFactory
                    ) -> FaultResult:
    result = run_faults(
        cluster, s3_spark, [], tmp_path_factory.mktemp("torture-faults-s3"),
        # Each kill costs a lease's ttl on S3 (the restart waits the dead engine's lease out).
        kills=int(os.environ.get("TORTURE_KILLS", "3")),
        seed=int(os.environ.get("TORTURE_SEED", "13")),
        workload_seconds=float(os.environ.get("TORTURE_WORKLOAD_SECONDS", "45")),
        snapshot_rounds=int(os.environ.get("TORTURE_SNAPSHOT_ROUNDS", "3")),
        reader_kills=int(os.environ.get("TORTURE_READER_KILLS", "2")))
    REPORT["faults"] = result.to_dict()
    return result


def test_every_target_on_s3_equals_the_primary_after_kills_and_failover(
        s3_fault_result: FaultResult) -> None:
    bad = [v.summary() for v in s3_fault_result.tables if not v.ok]
    assert not bad, "targets differ from the primary after the faults:\n" + "\n".join(bad)
    assert len(s3_fault_result.tables) >= 5


def test_snapshots_on_s3_end_done_after_reader_kills(s3_fault_result: FaultResult) -> None:
    assert s3_fault_result.snapshot_rounds > 0 and s3_fault_result.reader_kills > 0
    assert not s3_fault_result.snapshot_problems, s3_fault_result.snapshot_problems
    assert s3_fault_result.snapshots_done == s3_fault_result.snapshot_rounds


def test_engine_on_s3_survives_every_kill_and_the_failover(s3_fault_result: FaultResult
                                                           ) -> None:
    assert s3_fault_result.kills > 0
    assert s3_fault_result.kills_survived == s3_fault_result.kills, s3_fault_result.engine_exits
    assert not s3_fault_result.engine_exits, s3_fault_result.engine_exits
    assert s3_fault_result.failover == "ok", s3_fault_result.failover
    assert s3_fault_result.transactions > 100
