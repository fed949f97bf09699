"""The embedded session's settings (values depend on them) and getOrCreate semantics."""

from __future__ import annotations

from cdc_platform.lake.spark import LAKE_SQL_CONF, build_spark_session, ensure_lake_conf


def test_session_defaults_and_one_session_per_process(spark):
    conf = spark.conf
    assert conf.get("spark.sql.catalogImplementation") == "in-memory"
    assert conf.get("spark.sql.session.timeZone") == "UTC"
    assert conf.get("spark.sql.shuffle.partitions") == "4"
    assert "cdc-spark-warehouse-" in conf.get("spark.sql.warehouse.dir")
    assert build_spark_session() is spark


def test_ensure_lake_conf_repairs_a_session_configured_elsewhere(spark):
    key = "spark.sql.parquet.datetimeRebaseModeInRead"
    spark.conf.set(key, "LEGACY")
    try:
        ensure_lake_conf(spark)
        assert {k: spark.conf.get(k) for k in LAKE_SQL_CONF} == LAKE_SQL_CONF
    finally:
        spark.conf.set(key, LAKE_SQL_CONF[key])
