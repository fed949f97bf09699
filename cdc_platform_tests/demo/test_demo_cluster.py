"""``make demo-cluster`` / ``python -m cdc_platform demo --spark-cluster`` (issue 38): the S3 demo
with the lake's Spark work on a private Spark standalone cluster of two one-core workers.

Its config is the S3 demo's with ``spark.master`` at the cluster and the settings a driver on
this machine needs; run to the end, every table reconciles with zero differences, the dbt model
is built, and the summary says how many tasks ran on each worker's executors (both > 0: the
work left the drivers), read from Spark's status API.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

from cdc_platform.config import DEMO_CONFIG, is_cluster_master
from cdc_platform.demo import object_storage
from cdc_platform.demo.cluster import spark_section
from cdc_platform.devservices.spark_cluster import SparkCluster
from cdc_platform_tests.demo.test_demo_s3 import FAKE_SERVER, _settings
from cdc_platform_tests.test_cli_signals import _demo_env, _started, needs_services

#: The whole demo on this 2-core machine: servers, streams, a snapshot, three Spark runs on
#: single-core executors, dbt, and the history server at the end.
DEMO_BOUND_SECONDS = 1500


class _Unstarted(SparkCluster):
    """A cluster as the config sees it: its settings for drivers, without its processes."""

    @property
    def master_url(self) -> str:
        return "spark://127.0.0.1:7077"


def test_the_cluster_config_is_the_s3_demos_with_spark_on_the_cluster(tmp_path: Path) -> None:
    cluster = _Unstarted(tmp_path / "spark", event_log=True)
    path = object_storage.write_config(tmp_path / "config.yaml", DEMO_CONFIG, FAKE_SERVER,
                                       lambda section: spark_section(section, cluster))
    settings = _settings(yaml.safe_load(path.read_text()))
    assert settings.spark.master == "spark://127.0.0.1:7077"
    assert is_cluster_master(settings.spark.master)
    # the executors need no path of the driver's: the landing zone and the lake are on S3
    assert not settings.spark.shared_filesystem
    assert settings.landing_zone.url.startswith("s3://")
    conf = settings.spark.conf
    assert conf["spark.driver.memory"] == "2g"  # (the embedded demo config's)
    # several drivers share two cores, long-running appliers among them: executors are given
    # back when a driver is idle, and no driver waits for executors at its start
    assert conf["spark.dynamicAllocation.enabled"] == "true"
    assert conf["spark.dynamicAllocation.shuffleTracking.enabled"] == "true"
    assert conf["spark.scheduler.minRegisteredResourcesRatio"] == "0"
    assert conf["spark.eventLog.enabled"] == "true"
    assert conf["spark.eventLog.dir"] == (tmp_path / "spark" / "events").resolve().as_uri()
    embedded = _settings(yaml.safe_load(DEMO_CONFIG.read_text()))
    assert embedded.spark.master.startswith("local[")  # `make demo` keeps local Spark


@pytest.mark.integration
@needs_services
def test_demo_cluster_reconciles_everything_with_tasks_on_both_workers(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "cdc_platform", "demo", "--spark-cluster", "--orders", "3000",
            "--workload-seconds", "5"]
    with _started(argv, tmp_path, _demo_env(tmp_path)) as command:
        code = command.process.wait(timeout=DEMO_BOUND_SECONDS)
        output = command.output()
        assert code == 0, output[-6000:]
        assert "all tables of both sources reconcile: zero differences" in output, output[-6000:]
        line = next(line for line in output.splitlines()
                    if line.startswith("Spark tasks run on each worker's executors"))
        tasks = {name: int(count.replace(",", "")) for name, count in
                 re.findall(r"(worker-\d+) ([\d,]+)", line)}
        assert set(tasks) == {"worker-1", "worker-2"} and all(tasks.values()), line
        assert not command.survivors(), "the demo left processes behind"
