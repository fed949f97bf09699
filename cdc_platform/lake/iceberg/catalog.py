"""How a Spark session reaches the lake: the Iceberg runtime, the catalog's properties, and the
names sources take in the catalog.

The catalog (Hadoop on the warehouse path by default, or REST, JDBC, Hive, Glue) is
configuration (``warehouse.catalog``), never code; a warehouse on S3 is read and written through
Iceberg's ``S3FileIO`` (``lake.s3``). Names: a source database becomes the
namespace ``<server>_<db>`` and a table keeps its name wherever the catalog accepts it
(``catalog_name``: lower case, Unicode letters where the catalog keeps them, else a slug and a
hash), so ``lake.demo_inventory.orders`` for the demo.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from cdc_platform.capture.names import valid_name
from cdc_platform.capture.store import open_store
from cdc_platform.config import S3Settings
from cdc_platform.lake.s3 import catalog_s3_properties, warehouse_on_s3

ICEBERG_VERSION = "1.10.2"
ICEBERG_JAR = f"iceberg-spark-runtime-3.5_2.12-{ICEBERG_VERSION}.jar"
EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
SPARK_CATALOG = "org.apache.iceberg.spark.SparkCatalog"


def iceberg_jar() -> str:
    """The Iceberg Spark runtime jar, from the pinned ``snowpark-connect-deps-iceberg`` wheel
    (scripts/bootstrap.sh checks its sha256; the Dockerfile takes the same jar)."""
    import snowpark_connect_deps_iceberg as wheel

    path = Path(wheel.__file__).parent / "jars" / ICEBERG_JAR
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: install snowpark-connect-deps-iceberg==1.0.2 "
                                "(pyproject.toml pins it; 1.0.3's jar is broken)")
    return str(path)


def session_conf() -> dict[str, str]:
    """Static settings a Spark session needs before it starts to use Iceberg tables."""
    return {"spark.jars": iceberg_jar(), "spark.sql.extensions": EXTENSIONS}


def catalog_properties(warehouse_url: str, catalog: Any, s3: S3Settings | None = None
                       ) -> dict[str, str]:
    """The Iceberg catalog's properties (``spark.sql.catalog.<name>.<key>`` without prefix).

    ``catalog`` is a ``config.CatalogSettings`` (or None: Hadoop on the warehouse). The table
    cache is off: each read and each commit sees what other processes committed.

    A warehouse on S3 (``s3://bucket/prefix``, or an S3 Tables bucket's ARN) gets Iceberg's
    ``S3FileIO`` with the endpoint, region and addressing style of ``s3`` (the config's ``s3``
    section, resolved against the AWS environment: ``config.S3Settings.resolved``); the session
    needs the S3 jars (``lake.s3.s3_session_conf``). ``catalog.properties`` override any of them.
    """
    kind = getattr(catalog, "type", "hadoop")
    uri = getattr(catalog, "uri", "")
    warehouse = open_store(warehouse_url).uri if "://" not in warehouse_url or \
        warehouse_url.startswith("file:") else warehouse_url
    props: dict[str, str] = {"cache-enabled": "false"}
    if kind == "glue":
        props["catalog-impl"] = "org.apache.iceberg.aws.glue.GlueCatalog"
    else:
        props["type"] = kind
    if kind in ("rest", "jdbc", "hive"):
        if not uri:
            raise ValueError(f"warehouse.catalog.uri must name the {kind} catalog service")
        props["uri"] = uri
    props["warehouse"] = warehouse
    if warehouse_on_s3(warehouse):
        props.update(catalog_s3_properties(s3))
    props.update(getattr(catalog, "properties", None) or {})
    return props


# Catalogs that keep any Unicode name as it is (a Hadoop catalog's directories, a JDBC
# catalog's rows); Hive and Glue take ASCII letters, digits and "_" (Hive's name rule), and REST
# services vary (S3 Tables: lower-case ASCII), so there names keep the ASCII rule.
UNICODE_CATALOGS = frozenset({"hadoop", "jdbc"})
_UNICODE_WORD = re.compile(r"\w+")


def catalog_name(name: str, unicode_names: bool = False) -> str:
    """A source name in the catalog: the real name wherever the catalog accepts it.

    Every catalog takes lower-case ASCII letters, digits and ``_``, so such a name stays as
    it is; where the catalog keeps Unicode (``unicode_names``), a lower-case name of Unicode
    letters, digits and ``_`` (``ünï``) stays too. Any other name (capitals: catalogs compare
    names case-insensitively; dashes, spaces, dots) becomes ``names.valid_name``'s slug plus a
    hash of the real name, so two source names never share a catalog name. The real names are
    table properties of every target (``cdc.source-database``, ``cdc.source-table``).
    """
    if unicode_names and name == name.lower() and _UNICODE_WORD.fullmatch(name):
        return name
    return valid_name(name, case_sensitive=False)


def namespace_name(server_name: str, database: str) -> str:
    """The namespace of a source database's tables: ``<server>_<db>`` in the ASCII rule of
    ``catalog_name`` (dbt's sources and every catalog find it under that one name)."""
    return catalog_name(f"{server_name}_{database}")


def table_name(table: str, unicode_names: bool = False) -> str:
    """A source table's name in the catalog (``catalog_name``)."""
    return catalog_name(table, unicode_names)


def quote(identifier: str) -> str:
    """A Spark SQL identifier, whatever characters it holds."""
    return "`" + identifier.replace("`", "``") + "`"


def sql_string(value: str) -> str:
    """The inside of a Spark SQL string literal (the default parser treats backslash as an
    escape)."""
    return value.replace("\\", "\\\\").replace("'", "\\'")
