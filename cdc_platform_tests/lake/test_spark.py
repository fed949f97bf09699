"""The embedded session's settings (values depend on them) and getOrCreate semantics."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import cdc_platform
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


_WORKER_IMPORTS = """
import sys
sys.path.insert(0, sys.argv[1])  # the driver imports this checkout's cdc_platform, as a user's
import cdc_platform                # installed (or editable) package would be importable
from cdc_platform.lake.spark import build_spark_session

def where(batches):
    import pyarrow as pa
    import cdc_platform
    for batch in batches:
        yield pa.RecordBatch.from_pydict({"file": [cdc_platform.__file__] * batch.num_rows})

spark = build_spark_session(master="local[1]")
files = {r.file for r in spark.range(2).mapInArrow(where, "file string").collect()}
print("WORKERS", sorted(files), "DRIVER", cdc_platform.__file__)
assert files == {cdc_platform.__file__}, files
"""


def test_python_workers_import_this_cdc_platform_from_any_directory(tmp_path):
    """A user's `dagster job execute` from outside the checkout, without PYSPARK_PYTHON or
    PYTHONPATH: the workers (reconcile's mapInArrow) run this interpreter and import the
    driver's cdc_platform, not the system python's (ModuleNotFoundError) or another copy."""
    script = tmp_path / "workers.py"
    script.write_text(_WORKER_IMPORTS)
    package_parent = str(Path(cdc_platform.__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYTHONPATH")}
    done = subprocess.run([sys.executable, str(script), package_parent], cwd="/tmp", env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "WORKERS" in done.stdout
