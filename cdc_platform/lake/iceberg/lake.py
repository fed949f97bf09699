"""The lake's catalog in one Spark session: where every ``LakeTable`` is reached from
(``LakeTable(lake, server, database, table)``; this module knows nothing of tables, so a table
depends on its catalog and not the other way round)."""

from __future__ import annotations

import hashlib
import threading
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from cdc_platform.capture.store import open_store
from cdc_platform.lake.iceberg.catalog import SPARK_CATALOG, UNICODE_CATALOGS, catalog_properties
from cdc_platform.lake.s3 import check_warehouse, s3_settings_of_session, warehouse_on_s3

# Runtime SQL settings the lake's values depend on; every ``Lake`` applies them to its
# session (``ensure_lake_conf``), whoever built it: ours have them already, a Dagster resource's or
# a user's may not.
LAKE_SQL_CONF: dict[str, str] = {
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.datetimeRebaseModeInRead": "CORRECTED",
    "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
    "spark.sql.parquet.int96RebaseModeInRead": "CORRECTED",
    "spark.sql.parquet.int96RebaseModeInWrite": "CORRECTED",
}

def ensure_lake_conf(spark: SparkSession) -> None:
    """Pin the settings exact values depend on (cheap; a no-op on our own sessions).

    Without them Spark refuses (EXCEPTION) or shifts (LEGACY) dates before 1582 and timestamps
    before 1900 written by pyarrow, and writes timestamps as legacy INT96.
    """
    for key, value in LAKE_SQL_CONF.items():
        if spark.conf.get(key, None) != value:
            spark.conf.set(key, value)


_register_lock = threading.Lock()
_checked_catalogs: set[str] = set()  # (the properties of catalogs check_warehouse passed)


class Lake:
    """The lake's catalog in one Spark session.

    The catalog is registered in the session at run time under ``warehouse.catalog.name``; a
    session that already has a catalog of that name with other properties (a test session
    used with several warehouses) gets it under that name plus a hash of the properties.
    """

    def __init__(self, spark: SparkSession, warehouse_url: str, catalog: Any = None) -> None:
        # (the one place it is applied: every read and write of a table comes through a Lake)
        ensure_lake_conf(spark)
        self.spark = spark
        self.warehouse_url = warehouse_url
        conf = spark.conf
        s3 = s3_settings_of_session(lambda key: conf.get(key, None)) if warehouse_on_s3(
            warehouse_url) else None
        self.properties = catalog_properties(warehouse_url, catalog, s3)
        self.unicode_names = getattr(catalog, "type", "hadoop") in UNICODE_CATALOGS
        base = getattr(catalog, "name", "lake")
        self.catalog = self._register(base)
        self._check_once()
        store = open_store(warehouse_url) if getattr(catalog, "type", "hadoop") == "hadoop" \
            else None
        # The Hadoop catalog commits a table version by checking that the next metadata file
        # does not exist and renaming onto it; on a local or mounted filesystem the rename
        # overwrites, so two processes could both "commit" one version. Writers of one table
        # take an exclusive file lock in the warehouse around their metadata commits (catalog
        # services are atomic by themselves).
        # The lock files are files in the warehouse root, which the catalog never lists (its
        # namespaces are directories).
        root = store.local_root if store is not None else None
        self.lock_dir = str(root) if root is not None else None

    def _register(self, base: str) -> str:
        conf = self.spark.conf
        with _register_lock:
            digest = hashlib.sha1(repr(sorted(self.properties.items())).encode()).hexdigest()[:10]
            for name in (base, f"{base}_{digest}"):
                prefix = f"spark.sql.catalog.{name}"
                implementation = conf.get(prefix, None)
                if implementation is None:
                    conf.set(prefix, SPARK_CATALOG)
                    for key, value in self.properties.items():
                        conf.set(f"{prefix}.{key}", value)
                    return name
                if all(conf.get(f"{prefix}.{k}", None) == v for k, v in self.properties.items()):
                    return name
            raise RuntimeError(f"Spark catalog {base}_{digest} is registered with other "
                               "properties")

    def _check_once(self) -> None:
        """Once per process and catalog, before any Spark statement: the warehouse and its
        catalog answer as the session will ask them, else one line naming the setting to fix
        (``lake.s3.check_warehouse``: a missing warehouse bucket, refused credentials, an
        unreachable catalog URI) instead of a Java stack trace later."""
        key = repr(sorted(self.properties.items()))
        if key not in _checked_catalogs:
            check_warehouse(self.properties)
            _checked_catalogs.add(key)

    @classmethod
    def from_settings(cls, spark: SparkSession, settings: Any) -> Lake:
        """The lake of a ``config.Settings`` (its warehouse and catalog)."""
        return cls(spark, settings.warehouse.url, settings.warehouse.catalog)

    def sql(self, statement: str) -> DataFrame:
        return self.spark.sql(statement)

