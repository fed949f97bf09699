"""The lake on object storage (issue 23), against a real SeaweedFS this module starts.

SeaweedFS's ``weed mini`` serves S3 and, for its table bucket, an Iceberg REST catalog (SigV4 or
OAuth2 client credentials, with the S3 keys). A Spark session built by
``lake.spark.build_spark_session`` with ``lake.s3.s3_session_conf`` creates an Iceberg table
through that catalog (``Lake`` registers it; ``S3FileIO`` writes the files to the bucket),
inserts, MERGEs and reads back; it reads, through ``s3a://``, Parquet files the landing zone's
store (``capture.store.open_store``) put in another bucket; pyiceberg reads the table through the same catalog and sees the same rows.

The S3 jars are static settings of a JVM, and the suite's other lake tests start theirs first
in this process, so the Spark part runs in a child interpreter of its own (one session for the
module, ``_spark_child``); the tests check what it reports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from cdc_platform.capture.store import open_store
from cdc_platform.capture.store.storage import is_s3_url
from cdc_platform.config import S3Settings
from cdc_platform.devservices.seaweedfs import SeaweedFS
from cdc_platform.lake.iceberg.catalog import catalog_properties
from cdc_platform.lake.iceberg.maintenance import remove_orphans
from cdc_platform.lake.s3 import (
    S3_FILE_IO,
    resolved_s3,
    s3_jars,
    s3_session_conf,
    s3a_conf,
    settings_s3_conf,
    warehouse_on_s3,
)
from cdc_platform.lake.spark import deployment_conf, merge_conf

REGION = "us-east-1"
TABLE_BUCKET = "lake"
LANDING_BUCKET = "landing"
NAMESPACE = "s3_inventory"
TABLE = "orders"
CHILD_ENV = "CDC_TEST_S3_LAKE"

INITIAL = [(1, "apple", 10), (2, "pear", 20), (3, "plum", 30)]
# (id, name, qty, op): update 2, delete 3, insert 4
CHANGES = [(2, "PEAR", 21, "u"), (3, None, None, "d"), (4, "fig", 40, "i")]
EXPECTED = [
    {"id": 1, "name": "apple", "qty": 10},
    {"id": 2, "name": "PEAR", "qty": 21},
    {"id": 4, "name": "fig", "qty": 40},
]
LANDING_ROWS = [
    [{"id": 1, "op": "c", "after": "one"}, {"id": 2, "op": "c", "after": "two"}],
    [{"id": 2, "op": "u", "after": "zwei"}],
]


# ---------------------------------------------------------------------------------------------
# The session's settings (no service needed)


def test_s3_urls_and_warehouses() -> None:
    assert is_s3_url("s3://bucket/lz") and is_s3_url("S3A://bucket") and is_s3_url("s3n://b")
    assert not is_s3_url("/tmp/lz") and not is_s3_url("file:///tmp") and not is_s3_url("")
    assert warehouse_on_s3("arn:aws:s3tables:us-east-1:111122223333:bucket/lake")
    assert not warehouse_on_s3("my_polaris_catalog")


def test_endpoint_from_arguments_then_the_aws_environment(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    assert S3Settings.from_environment() == S3Settings(endpoint_url="", region="us-east-1",
                                                       path_style=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://seaweed:8333/")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    assert S3Settings.from_environment() == S3Settings(
        endpoint_url="http://seaweed:8333", region="eu-west-1", path_style=True)
    settings_s3 = S3Settings(endpoint_url="https://minio:9000", region="", path_style=False)
    assert resolved_s3(settings_s3) == S3Settings(endpoint_url="https://minio:9000",
                                                  region="eu-west-1", path_style=False)
    assert resolved_s3(None) == S3Settings.from_environment()


def test_catalog_properties_of_a_warehouse_on_s3() -> None:
    s3 = S3Settings(endpoint_url="http://seaweed:8333", region="eu-west-1", path_style=True)
    rest = SimpleNamespace(type="rest", uri="http://catalog:8181",
                           properties={"rest.auth.type": "sigv4", "client.region": "us-west-2"})
    props = catalog_properties("s3://lake/warehouse", rest, s3)
    assert props["io-impl"] == S3_FILE_IO
    assert props["s3.endpoint"] == "http://seaweed:8333"
    assert props["s3.path-style-access"] == "true"
    assert props["client.region"] == "us-west-2"  # the catalog's own properties win
    assert props["warehouse"] == "s3://lake/warehouse"
    assert "s3.endpoint" not in catalog_properties(
        "s3://lake", rest, S3Settings(endpoint_url="", region="us-east-1", path_style=False))
    assert "io-impl" not in catalog_properties("/tmp/warehouse", None, s3)


def test_session_conf_only_for_s3_deployments() -> None:
    def settings(landing: str, warehouse: str, **spark_conf: str) -> Any:
        return SimpleNamespace(landing_zone=SimpleNamespace(url=landing),
                               warehouse=SimpleNamespace(url=warehouse),
                               spark=SimpleNamespace(master="local[2]", app_name="t",
                                                     conf=spark_conf),
                               s3=S3Settings(endpoint_url="http://seaweed:8333",
                                             region="us-east-1", path_style=True))

    assert settings_s3_conf(settings("/tmp/lz", "/tmp/wh")) == {}
    polaris = settings("/tmp/lz", "cdc_lake")
    assert settings_s3_conf(polaris) == {}
    polaris.warehouse.catalog = SimpleNamespace(type="rest", properties={"io-impl": S3_FILE_IO})
    assert settings_s3_conf(polaris)["spark.jars"]
    conf = deployment_conf(settings("s3://landing/lz", "/tmp/wh",
                                    **{"spark.jars": "/x/jdbc.jar"}))
    jars = conf["spark.jars"].split(",")
    assert jars[-1] == "/x/jdbc.jar" and set(s3_jars()) <= set(jars)
    assert any(Path(jar).name.startswith("iceberg-spark-runtime") for jar in jars)
    assert any(Path(jar).name.startswith("hadoop-aws-") for jar in jars)
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://seaweed:8333"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert "EnvironmentVariableCredentialsProvider" in \
        conf["spark.hadoop.fs.s3a.aws.credentials.provider"]
    assert not any("secret" in key or "access.key" in key for key in conf)
    assert settings_s3_conf(settings("/tmp/lz", "s3://lake")) == s3_session_conf(
        S3Settings(endpoint_url="http://seaweed:8333", region="us-east-1", path_style=True))
    assert "spark.hadoop.fs.s3a.endpoint" not in s3a_conf(S3Settings(region="us-east-1"))
    assert merge_conf({"spark.jars": "a,b", "k": "1"}, {"spark.jars": "b,c", "k": "2"}) == \
        {"spark.jars": "a,b,c", "k": "2"}


# ---------------------------------------------------------------------------------------------
# SeaweedFS


@pytest.fixture(scope="module")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    server = SeaweedFS(tmp_path_factory.mktemp("seaweedfs"), table_bucket=TABLE_BUCKET,
                       region=REGION)
    server.start()  # (ready: its REST catalog serves the table bucket)
    try:
        yield server
    finally:
        server.stop()


def _arrow(server: SeaweedFS) -> pafs.S3FileSystem:
    return pafs.S3FileSystem(access_key=server.access_key, secret_key=server.secret_key,
                             region=REGION, endpoint_override=server.endpoint_url, scheme="http")


# ---------------------------------------------------------------------------------------------
# The Spark side, in a child interpreter


@pytest.fixture(scope="module")
def spark_report(seaweedfs: SeaweedFS) -> dict[str, Any]:
    """Write the landing files, then run ``_spark_child`` and return what it reported."""
    seaweedfs.create_bucket(LANDING_BUCKET)
    # The landing zone's own store (boto3) publishes the Parquet files pyarrow encodes, and
    # names them as Spark reads them (s3a://).
    # (its credentials from the AWS environment, as always)
    with pytest.MonkeyPatch.context() as env:
        for name, value in seaweedfs.client_env().items():
            env.setenv(name, value)
        store = open_store(f"s3://{LANDING_BUCKET}/changelog/inventory/orders", s3=S3Settings(
            endpoint_url=seaweedfs.endpoint_url, region=REGION, path_style=True),
            setting="landing_zone.url")
        for number, rows in enumerate(LANDING_ROWS):
            sink = pa.BufferOutputStream()
            pq.write_table(pa.Table.from_pylist(rows), sink)
            store.write_atomically(f"{number:06d}.parquet", data=sink.getvalue().to_pybytes())
    job = {"s3_endpoint": seaweedfs.endpoint_url, "catalog_uri": seaweedfs.catalog_uri,
           "landing": store.uri}
    env = {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}
    # The credentials only in the AWS environment; AWS_ENDPOINT_URL also reaches Lake's catalog
    # properties (it passes no endpoint: config.S3Settings.resolved's fallback, as boto3 and pyarrow).
    env.update(seaweedfs.client_env(), PYSPARK_PYTHON=sys.executable)
    env[CHILD_ENV] = json.dumps(job)
    child = subprocess.run(
        [sys.executable, "-c", "from cdc_platform_tests.lake.test_s3_lake import _spark_child; "
         "_spark_child()"], env=env, capture_output=True, text=True, timeout=600,
        cwd=str(Path(__file__).resolve().parents[2]))
    reports = [line[len("REPORT "):] for line in child.stdout.splitlines()
               if line.startswith("REPORT ")]
    if child.returncode != 0 or not reports:
        pytest.fail(f"the Spark child failed ({child.returncode}):\n{child.stderr[-6000:]}")
    report: dict[str, Any] = json.loads(reports[-1])
    return report


def _spark_child() -> None:
    """One Spark session on SeaweedFS: the table through the REST catalog, MERGE, the s3a read.

    Prints ``REPORT <json>``; runs in a fresh interpreter (see the module's docstring).
    """
    from cdc_platform.config import CatalogSettings
    from cdc_platform.lake.iceberg.lake import Lake
    from cdc_platform.lake.iceberg.table import LakeTable
    from cdc_platform.lake.spark import build_spark_session

    job = json.loads(os.environ[CHILD_ENV])
    s3 = S3Settings(endpoint_url=job["s3_endpoint"], region=REGION, path_style=True)
    spark = build_spark_session(app_name="cdc_platform_tests.s3_lake", conf=s3_session_conf(s3))
    spark.sparkContext.setLogLevel("ERROR")
    try:
        catalog = CatalogSettings(type="rest", uri=job["catalog_uri"], properties={
            "rest.auth.type": "sigv4", "rest.signing-name": "s3tables",
            "rest.signing-region": REGION})
        lake = Lake(spark, f"s3://{TABLE_BUCKET}", catalog)
        table = f"{lake.catalog}.{NAMESPACE}.{TABLE}"
        lake.sql(f"CREATE NAMESPACE IF NOT EXISTS {lake.catalog}.{NAMESPACE}")
        lake.sql(f"CREATE TABLE {table} (id BIGINT NOT NULL, name STRING, qty INT) "
                 "USING iceberg TBLPROPERTIES ('format-version'='2')")
        values = ", ".join(f"({i}, '{name}', {qty})" for i, name, qty in INITIAL)
        lake.sql(f"INSERT INTO {table} VALUES {values}")
        spark.createDataFrame(CHANGES, "id BIGINT, name STRING, qty INT, op STRING") \
            .createOrReplaceTempView("changes")
        lake.sql(f"""
            MERGE INTO {table} t USING changes s ON t.id = s.id
            WHEN MATCHED AND s.op = 'd' THEN DELETE
            WHEN MATCHED THEN UPDATE SET t.name = s.name, t.qty = s.qty
            WHEN NOT MATCHED AND s.op <> 'd' THEN INSERT (id, name, qty)
                VALUES (s.id, s.name, s.qty)""")
        rows = [row.asDict() for row in spark.table(table).orderBy("id").collect()]
        files = [row.file_path for row in lake.sql(f"SELECT file_path FROM {table}.files")
                 .collect()]
        snapshots = lake.sql(f"SELECT count(*) AS n FROM {table}.snapshots").collect()[0].n
        landing = [row.asDict() for row in spark.read.parquet(job["landing"])
                   .orderBy("id", "op").collect()]
        # A crashed writer's file in the table's data: removed through S3FileIO's listing,
        # the live files kept (older_than ahead of now: S3 object times cannot be set back)
        target = LakeTable(lake, "s3", "inventory", TABLE)
        io = target.java_table().io()
        orphan = f"{str(target.java_table().location()).rstrip('/')}/data/crashed-writer.parquet"
        stream = io.newOutputFile(orphan).createOrOverwrite()
        stream.write(bytearray(b"PAR1 not committed"))
        stream.close()
        removed = remove_orphans(target, datetime.now(UTC) + timedelta(minutes=1))
        orphans = {"orphan": orphan, "removed": removed["deleted_orphan_files"],
                   "exists_after": bool(io.newInputFile(orphan).exists()),
                   "rows_after": [row.asDict() for row in
                                  spark.table(table).orderBy("id").collect()]}
        report = {"catalog": lake.catalog, "rows": rows, "files": files, "orphans": orphans,
                  "snapshots": snapshots, "landing": landing, "landing_url": job["landing"],
                  "properties": {key: spark.conf.get(f"spark.sql.catalog.{lake.catalog}.{key}")
                                 for key in ("io-impl", "s3.endpoint", "s3.path-style-access")}}
        print("REPORT " + json.dumps(report), flush=True)
    finally:
        spark.stop()


@pytest.mark.integration
def test_spark_merges_an_iceberg_table_on_s3_through_the_rest_catalog(
        spark_report: dict[str, Any], seaweedfs: SeaweedFS) -> None:
    assert spark_report["rows"] == EXPECTED
    assert spark_report["snapshots"] >= 2  # the insert and the merge
    assert spark_report["properties"] == {"io-impl": S3_FILE_IO,
                                          "s3.endpoint": seaweedfs.endpoint_url,
                                          "s3.path-style-access": "true"}
    assert spark_report["files"], "no data files"
    assert all(path.startswith(f"s3://{TABLE_BUCKET}/") for path in spark_report["files"])
    # ... and they are objects in the bucket
    fs = _arrow(seaweedfs)
    for path in spark_report["files"]:
        assert fs.get_file_info(path.split("://", 1)[1]).type == pafs.FileType.File, path


@pytest.mark.integration
def test_orphan_files_are_removed_from_s3_and_the_table_kept(spark_report: dict[str, Any]
                                                              ) -> None:
    orphans = spark_report["orphans"]
    assert orphans["removed"] == [orphans["orphan"]]
    assert not orphans["exists_after"]
    assert orphans["rows_after"] == EXPECTED


@pytest.mark.integration
def test_pyiceberg_reads_the_same_rows_through_the_rest_catalog(
        spark_report: dict[str, Any], seaweedfs: SeaweedFS) -> None:
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("seaweedfs", **{
        "type": "rest", "uri": seaweedfs.catalog_uri, "warehouse": f"s3://{TABLE_BUCKET}",
        "credential": f"{seaweedfs.access_key}:{seaweedfs.secret_key}", "scope": "catalog",
        "oauth2-server-uri": f"{seaweedfs.catalog_uri}/v1/oauth/tokens",
        "s3.endpoint": seaweedfs.endpoint_url, "s3.region": REGION,
        "s3.access-key-id": seaweedfs.access_key, "s3.secret-access-key": seaweedfs.secret_key,
    })
    table = catalog.load_table((NAMESPACE, TABLE))
    rows = table.scan().to_arrow().sort_by("id").to_pylist()
    assert rows == EXPECTED == spark_report["rows"]


@pytest.mark.integration
def test_spark_reads_landing_zone_parquet_through_s3a(spark_report: dict[str, Any]) -> None:
    assert spark_report["landing_url"] == \
        f"s3a://{LANDING_BUCKET}/changelog/inventory/orders"
    expected = sorted((row for rows in LANDING_ROWS for row in rows),
                      key=lambda row: (row["id"], row["op"]))
    assert spark_report["landing"] == expected
