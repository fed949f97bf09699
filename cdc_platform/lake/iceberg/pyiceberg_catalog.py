"""Which catalog a writer without Spark (``lake.arrow_load``, ``lake.arrow_merge``, the
applier's row counts) commits through, and how it names and places a target there: the local
Hadoop catalog (``iceberg.hadoop``) or the REST catalog (``iceberg.rest``), or None, and then
the write is Spark's. One module for the choice, so every Spark-free path reaches the table Spark
would.
"""

from __future__ import annotations

from typing import Any

from cdc_platform.config import S3Settings
from cdc_platform.lake.iceberg.catalog import namespace_name, table_name
from cdc_platform.lake.iceberg.hadoop import LocalHadoopCatalog, local_hadoop_catalog
from cdc_platform.lake.iceberg.rest import LakeRestCatalog, rest_catalog


def lake_catalog(warehouse_url: str, catalog: Any = None, s3: S3Settings | None = None
                 ) -> LocalHadoopCatalog | LakeRestCatalog | None:
    """The lake's catalog as a writer without Spark commits through it (a Hadoop catalog on a
    local warehouse, or a REST catalog: ``iceberg.rest``), or None: Spark's path."""
    return local_hadoop_catalog(warehouse_url, catalog) or rest_catalog(warehouse_url,
                                                                        catalog, s3)


def identifier_of(lake: LocalHadoopCatalog | LakeRestCatalog, server_name: str, database: str,
                table: str) -> tuple[str, str] | None:
    """The target's identifier as Spark's ``LakeTable`` names it, or None for a Unicode name
    in a Hadoop catalog (``LakeTable`` decides between it and an older ASCII one)."""
    name = table_name(table)
    if isinstance(lake, LocalHadoopCatalog) and table_name(table, unicode_names=True) != name:
        return None
    return namespace_name(server_name, database), name


def target_location(lake: LocalHadoopCatalog | LakeRestCatalog, identifier: tuple[str, str]
                    ) -> str | None:
    """Where a new target goes (its namespace made first): the Hadoop layout's directory on
    a local warehouse; None where a catalog service places it."""
    if isinstance(lake, LocalHadoopCatalog):
        (lake.root / identifier[0]).mkdir(parents=True, exist_ok=True)
        return lake.location(identifier)
    lake.create_namespace_if_not_exists(identifier[0])
    return None
