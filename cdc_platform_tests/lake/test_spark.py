"""The embedded session's settings (values depend on them) and getOrCreate semantics."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import cdc_platform
from cdc_platform.lake.iceberg.lake import LAKE_SQL_CONF, Lake, ensure_lake_conf
from cdc_platform.lake.spark import build_spark_session


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


def test_the_lake_repairs_the_session_it_is_given(spark, tmp_path):
    """A session built elsewhere (a Dagster resource, a user's) is set right where the lake
    takes it, the one place every table read and write goes through."""
    key = "spark.sql.parquet.outputTimestampType"
    spark.conf.set(key, "INT96")
    try:
        Lake(spark, str(tmp_path / "warehouse"))
        assert spark.conf.get(key) == LAKE_SQL_CONF[key]
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


def test_a_cluster_master_gets_the_package_shipped_and_local_ones_do_not(tmp_path: Path) -> None:
    from cdc_platform.config import is_cluster_master
    from cdc_platform.lake.spark import cluster_conf, merge_conf, package_zip

    assert not any(is_cluster_master(m) for m in ("local", "local[2]", "local[*]", " local[4] "))
    assert all(is_cluster_master(m) for m in ("spark://m:7077", "k8s://https://k8s", "yarn",
                                               "local-cluster[2,1,1024]"))
    assert cluster_conf("local[2]") == {}
    shipped = cluster_conf("spark://m:7077")["spark.submit.pyFiles"]
    assert Path(shipped).name.startswith("cdc_platform-") and Path(shipped).exists()
    # one build per content: the same name again; the zip holds the package's modules
    built = package_zip(tmp_path)
    assert package_zip(tmp_path) == built and built.name == Path(shipped).name
    names = zipfile.ZipFile(built).namelist()
    assert "cdc_platform/lake/reconcile.py" in names and not [n for n in names if ".pyc" in n]
    # a user's own Python files and jars add to the platform's, never replace them
    merged = merge_conf({"spark.submit.pyFiles": shipped, "spark.jars": "a.jar"},
                        {"spark.submit.pyFiles": "mine.py", "spark.jars": "b.jar"})
    assert merged == {"spark.submit.pyFiles": f"{shipped},mine.py", "spark.jars": "a.jar,b.jar"}
