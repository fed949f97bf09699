"""The config's ``s3`` section reaches every Spark session the platform builds (the Dagster
steps', the applier's, dbt's) and the Iceberg catalog registered in them: pure settings, no
Spark started (the S3 round trip itself is ``test_s3_lake``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_platform.config import S3Settings, parse_settings
from cdc_platform.definitions import spark_config
from cdc_platform.defs.dbt.project import spark_conf as dbt_spark_conf
from cdc_platform.lake.iceberg.catalog import iceberg_jar
from cdc_platform.lake.s3 import s3_jars, s3_settings_of_session, s3a_conf
from cdc_platform.lake.spark import deployment_conf, settings_conf

ENDPOINT = "http://127.0.0.1:18333"


def _settings(landing: str, warehouse: str, spark_conf: dict[str, str] | None = None):
    return parse_settings({
        "source": {"flavour": "mariadb", "host": "db", "user": "u", "server_id": 2,
                   "server_name": "x"},
        "landing_zone": {"url": landing},
        "warehouse": {"url": warehouse, "catalog": {"type": "rest", "uri": "http://cat:8181"}},
        "s3": {"endpoint_url": ENDPOINT, "region": "eu-west-3", "path_style": True},
        "spark": {"conf": spark_conf or {}},
    }, "test")


@pytest.fixture(autouse=True)
def _jars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "hadoop-aws.jar").write_bytes(b"")
    monkeypatch.setenv("CDC_PLATFORM_S3_JARS", str(tmp_path))


def test_a_session_on_s3_gets_the_jars_and_the_sections_endpoint():
    settings = _settings("s3://landing/cdc", "s3://lake/warehouse",
                         {"spark.jars": "/opt/jdbc.jar", "spark.executor.memory": "2g"})
    for conf in (deployment_conf(settings), spark_config(settings), dbt_spark_conf(settings)):
        jars = conf["spark.jars"].split(",")
        assert iceberg_jar() in jars and set(s3_jars()) <= set(jars)
        assert "/opt/jdbc.jar" in jars  # (a user's jar adds to them)
        assert conf["spark.hadoop.fs.s3a.endpoint"] == ENDPOINT
        assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-3"
        assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
        assert conf["spark.executor.memory"] == "2g"
    dbt = dbt_spark_conf(settings)
    assert dbt["spark.sql.catalog.lake.io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
    assert dbt["spark.sql.catalog.lake.s3.endpoint"] == ENDPOINT
    assert dbt["spark.sql.catalog.lake.client.region"] == "eu-west-3"


def test_a_local_deployment_gets_no_s3_settings():
    settings = _settings("/tmp/landing", "/tmp/warehouse")
    assert settings_conf(settings) == {}
    assert not any("s3a" in key for key in spark_config(settings))
    assert spark_config(settings)["spark.jars"] == iceberg_jar()


def test_the_catalog_takes_the_endpoint_its_session_was_built_with(monkeypatch):
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    settings = _settings("s3://landing/cdc", "s3://lake/warehouse")
    session = s3a_conf(settings.s3)
    assert s3_settings_of_session(session.get) == S3Settings(
        endpoint_url=ENDPOINT, region="eu-west-3", path_style=True)
    assert s3_settings_of_session({}.get) == S3Settings(region="us-east-1")
