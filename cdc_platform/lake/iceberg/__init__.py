"""The one package that touches lake tables: Apache Iceberg tables in a catalog, through Spark.

Its modules name the concepts; this file only re-exports the public names, so callers import
``cdc_platform.lake.iceberg`` whatever module a name lives in.
"""

from cdc_platform.lake.iceberg.catalog import (
    EXTENSIONS,
    ICEBERG_JAR,
    ICEBERG_VERSION,
    SPARK_CATALOG,
    UNICODE_CATALOGS,
    catalog_name,
    catalog_properties,
    iceberg_jar,
    namespace_name,
    quote,
    session_conf,
    sql_string,
    table_name,
)
from cdc_platform.lake.iceberg.commit import (
    BRANCH_PREFIX,
    STALE_BRANCH_HOURS,
    ConcurrentCommitError,
    branch_created,
    branch_name,
    commit_properties,
)
from cdc_platform.lake.iceberg.lake import Lake
from cdc_platform.lake.iceberg.properties import (
    PRIMARY_KEY_PROPERTY,
    RENAMED_THROUGH_PROPERTY,
    SOURCE_DATABASE_PROPERTY,
    SOURCE_SERVER_PROPERTY,
    SOURCE_TABLE_PROPERTY,
    TABLE_PROPERTIES,
)
from cdc_platform.lake.iceberg.schema import SchemaEvolutionError
from cdc_platform.lake.iceberg.snapshots import CONSUMED_GTID, CONSUMED_POS, Snapshot
from cdc_platform.lake.iceberg.table import LakeTable

__all__ = [
    "BRANCH_PREFIX",
    "CONSUMED_GTID",
    "CONSUMED_POS",
    "EXTENSIONS",
    "ICEBERG_JAR",
    "ICEBERG_VERSION",
    "PRIMARY_KEY_PROPERTY",
    "RENAMED_THROUGH_PROPERTY",
    "SOURCE_DATABASE_PROPERTY",
    "SOURCE_SERVER_PROPERTY",
    "SOURCE_TABLE_PROPERTY",
    "SPARK_CATALOG",
    "STALE_BRANCH_HOURS",
    "TABLE_PROPERTIES",
    "UNICODE_CATALOGS",
    "ConcurrentCommitError",
    "Lake",
    "LakeTable",
    "SchemaEvolutionError",
    "Snapshot",
    "branch_created",
    "branch_name",
    "catalog_name",
    "catalog_properties",
    "commit_properties",
    "iceberg_jar",
    "namespace_name",
    "quote",
    "session_conf",
    "sql_string",
    "table_name",
]
