"""The embedded Spark session the lake runs on.

Lake tables are Iceberg tables in the catalog ``lake.iceberg`` registers at run time (Hadoop on
the warehouse by default), so the session catalog stays the in-memory one: no Derby lock, and
any number of Spark processes (one per Dagster step) may run at the same time. The session
loads the Iceberg runtime jar and its SQL extensions (MERGE INTO, procedures) at start. Values must survive exactly, so the session pins the
time zone to UTC, writes timestamps as INT64 micros (not legacy INT96) and reads/writes dates and
timestamps in the proleptic Gregorian calendar (MySQL's DATETIME goes back to year 1000).

A deployment whose landing zone or warehouse is on S3 adds ``settings_conf``: the S3 jars and
the ``s3a`` filesystem's settings (``lake.s3``); they are static, so they must be given to the
session that starts the JVM.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

import cdc_platform
from cdc_platform.config import is_cluster_master
from cdc_platform.lake.iceberg.catalog import session_conf
from cdc_platform.lake.iceberg.lake import LAKE_SQL_CONF
from cdc_platform.lake.s3 import settings_s3_conf

log = logging.getLogger(__name__)

# The directory holding the ``cdc_platform`` package this process runs (a checkout, an editable
# install's source tree or site-packages): Python workers import the same code from it.
PACKAGE_PARENT = str(Path(cdc_platform.__file__).resolve().parents[1])

# Runtime and static settings; callers may override any of them through ``conf``.
DEFAULT_CONF: dict[str, str] = {
    **LAKE_SQL_CONF,
    **session_conf(),
    # Python workers (reconciliation's mapInArrow) must run this interpreter, which has pyarrow,
    # and import this cdc_platform (see prepare_python_workers); on a cluster, override both
    # with the executors' interpreter and path via spark.conf.
    "spark.pyspark.python": sys.executable,
    "spark.executorEnv.PYTHONPATH": PACKAGE_PARENT,
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
    prepare_python_workers()
    settings = dict(DEFAULT_CONF)
    if SparkSession.getActiveSession() is None and "spark.sql.warehouse.dir" not in (conf or {}):
        settings["spark.sql.warehouse.dir"] = tempfile.mkdtemp(prefix="cdc-spark-warehouse-")
    settings = merge_conf(settings, conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    started = set(_jars(session.sparkContext.getConf().get("spark.jars", "")))
    missing = [jar for jar in _jars(settings.get("spark.jars", "")) if jar not in started]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        log.warning(f"this process's Spark session started without {missing[0]}{more}; jars "
                    "are static: give them to the first session the process builds")
    return session


def _jars(value: str) -> list[str]:
    return [jar for jar in (part.strip() for part in value.split(",")) if jar]


def merge_conf(*confs: dict[str, str]) -> dict[str, str]:
    """The settings of ``confs``, later ones overriding earlier ones, except ``spark.jars``
    and ``spark.submit.pyFiles``: their lists are joined (each entry once), so a user's extra
    jar (a JDBC driver) does not drop the Iceberg runtime or the S3 jars, nor a user's Python
    file the platform's package."""
    merged: dict[str, str] = {}
    for conf in confs:
        for key, value in conf.items():
            if key in ("spark.jars", "spark.submit.pyFiles") and merged.get(key):
                value = ",".join(dict.fromkeys(_jars(merged[key]) + _jars(value)))
            merged[key] = value
    return merged


def settings_conf(settings: Any) -> dict[str, str]:
    """The session settings of a ``config.Settings`` beyond ``DEFAULT_CONF``: the S3 jars and
    ``s3a`` settings when its landing zone or warehouse is on S3 (``lake.s3.settings_s3_conf``),
    then its ``spark.conf`` (which may override any of them; its ``spark.jars`` add to them).

    ``build_spark_session(settings.spark.master, settings.spark.app_name,
    settings_conf(settings))`` builds a deployment's session.
    """
    return merge_conf(settings_s3_conf(settings), cluster_conf(settings.spark.master),
                      dict(settings.spark.conf))


def deployment_conf(settings: Any, **settings_first: str) -> dict[str, str]:
    """The whole configuration of a deployment's Spark session, for the sessions a library
    starts from a conf (the Dagster steps' resource, dbt's): ``DEFAULT_CONF``, the config's
    master and application name, ``settings_first`` (keys with dots, given as a mapping:
    ``**{"spark.sql.warehouse.dir": ...}``), then ``settings_conf``, so the config's own
    ``spark.conf`` has the last word."""
    return merge_conf(DEFAULT_CONF, {"spark.master": settings.spark.master,
                                     "spark.app.name": settings.spark.app_name},
                      settings_first, settings_conf(settings))


def cluster_conf(master: str) -> dict[str, str]:
    """With a cluster master, what executors need from the driver: this ``cdc_platform`` as a
    zip in ``spark.submit.pyFiles`` (PySpark sends it to every executor and puts it first on
    its Python workers' path: reconciliation's ``mapInArrow`` runs the package's code there,
    whatever copy, if any, the executors' image has). The jars need nothing: Spark serves the
    driver's ``spark.jars`` to its executors. ``local[N]``: nothing (the workers import the
    driver's own copy)."""
    return {"spark.submit.pyFiles": str(package_zip())} if is_cluster_master(master) else {}


def package_zip(into: Path | None = None) -> Path:
    """A zip of the ``cdc_platform`` package this process runs (its Python files; the native
    decoders are capture's, which executors never run, and each has a Python fallback), named
    by a digest of its content so that each version is built once and an executor never
    caches a stale one under the same name."""
    root, files, digest = _package_files()
    target = (into or Path(tempfile.gettempdir()) / "cdc-platform-pyfiles") / \
        f"cdc_platform-{digest}.zip"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in files:
            archive.write(path, str(path.relative_to(root.parent)))
    os.replace(partial, target)  # (atomic: a concurrent builder writes the same bytes)
    return target


@functools.cache
def _package_files() -> tuple[Path, tuple[Path, ...], str]:
    """The package's directory, its Python files and their digest: read once a process (every
    source's Spark settings are built at a code-location load)."""
    root = Path(cdc_platform.__file__).resolve().parent
    files = tuple(sorted(path for path in root.rglob("*.py") if "__pycache__" not in path.parts))
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(root.parent)).encode() + b"\0" + path.read_bytes())
    return root, files, digest.hexdigest()[:16]


def prepare_python_workers() -> None:
    """Make the Python workers of a session created after this call run this interpreter.

    PySpark starts its workers with the interpreter named by the environment variable
    ``PYSPARK_PYTHON`` when the session is created (``spark.pyspark.python`` in the session's
    conf does not reach them); without it they run the system ``python3``, which fails on
    ``import pyarrow`` or ``cdc_platform`` (a user's own ``dagster job execute`` from another
    directory). A value the user set is kept. The workers' PYTHONPATH gets the package's
    directory through ``spark.executorEnv.PYTHONPATH`` (DEFAULT_CONF).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
