"""The embedded Spark session the lake runs on.

Table metadata lives in the warehouse (``_commits/*.json``), not in a Hive metastore, so the
session uses the in-memory catalog: no Derby lock, and any number of Spark processes (one per
Dagster step) may run at the same time. Values must survive exactly, so the session pins the
time zone to UTC, writes timestamps as INT64 micros (not legacy INT96) and reads/writes dates and
timestamps in the proleptic Gregorian calendar (MySQL's DATETIME goes back to year 1000).
"""

from __future__ import annotations

import sys
import tempfile

from pyspark.sql import SparkSession

# Runtime SQL settings the lake's values depend on; ``ensure_lake_conf`` applies them to a session
# built elsewhere (e.g. by a Dagster resource) before the lake reads or writes with it.
LAKE_SQL_CONF: dict[str, str] = {
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.datetimeRebaseModeInRead": "CORRECTED",
    "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
    "spark.sql.parquet.int96RebaseModeInRead": "CORRECTED",
    "spark.sql.parquet.int96RebaseModeInWrite": "CORRECTED",
}

# Runtime and static settings; callers may override any of them through ``conf``.
DEFAULT_CONF: dict[str, str] = {
    **LAKE_SQL_CONF,
    # Python workers (reconciliation's mapInArrow) must run this interpreter, which has pyarrow;
    # on a cluster, override with the executors' interpreter via spark.conf.
    "spark.pyspark.python": sys.executable,
    "spark.sql.catalogImplementation": "in-memory",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "1g",
    "spark.sql.parquet.inferTimestampNTZ.enabled": "true",
    # A batch may span many segment files: list them on the driver, not with a Spark job.
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "1024",
    "spark.sql.adaptive.enabled": "true",
}


def build_spark_session(
    master: str = "local[2]",
    app_name: str = "cdc_platform",
    conf: dict[str, str] | None = None,
) -> SparkSession:
    """Return this process's Spark session, creating it with the lake's defaults if needed.

    ``getOrCreate`` semantics: a second call returns the same session (static settings such as
    the catalog only take effect for the first one). The SQL warehouse directory goes to a fresh
    temporary directory so that nothing lands in the working directory.
    """
    settings = dict(DEFAULT_CONF)
    if SparkSession.getActiveSession() is None and "spark.sql.warehouse.dir" not in (conf or {}):
        settings["spark.sql.warehouse.dir"] = tempfile.mkdtemp(prefix="cdc-spark-warehouse-")
    settings.update(conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def ensure_lake_conf(spark: SparkSession) -> None:
    """Pin the settings exact values depend on (cheap; a no-op on our own sessions).

    Without them Spark refuses (EXCEPTION) or shifts (LEGACY) dates before 1582 and timestamps
    before 1900 written by pyarrow, and writes timestamps as legacy INT96.
    """
    for key, value in LAKE_SQL_CONF.items():
        if spark.conf.get(key, None) != value:
            spark.conf.set(key, value)
