"""The table properties every target carries: Iceberg's write settings and the platform's own
(``cdc.*``), which let any engine find a target's source and key without the Dagster UI."""

import json
from collections.abc import Sequence

from cdc_platform.capture.names import table_id

# Table properties: the key the table is merged by (JSON list), and the changelog position of
# the newest column-rename record (capture.ddl.column_renames) the table's columns follow.
PRIMARY_KEY_PROPERTY = "cdc.primary-key"
RENAMED_THROUGH_PROPERTY = "cdc.renamed-through"
# The source a target reflects, by its real names (a catalog name may be a slug with a hash).
SOURCE_SERVER_PROPERTY = "cdc.source-server"
SOURCE_DATABASE_PROPERTY = "cdc.source-database"
SOURCE_TABLE_PROPERTY = "cdc.source-table"

TABLE_PROPERTIES: dict[str, str] = {
    "format-version": "2",
    "write.delete.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.merge.mode": "merge-on-read",
    "write.merge.isolation-level": "serializable",
    "write.parquet.compression-codec": "zstd",
    # Every commit writes a metadata file (a batch: about four, with its branch); keep 100.
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "100",
}


def source_properties(server_name: str, database: str, table: str) -> dict[str, str]:
    """The properties that name a target's source table by its real names."""
    return {SOURCE_SERVER_PROPERTY: server_name, SOURCE_DATABASE_PROPERTY: database,
            SOURCE_TABLE_PROPERTY: table}


def target_properties(server_name: str, database: str, table: str,
                      primary_key: Sequence[str], renamed_through: int) -> dict[str, str]:
    """The properties a target is created with, by Spark (``LakeTable.ensure_created``) or
    without it (``pyiceberg_schema.table_properties``): the lake's write settings, its source
    table, the key it is merged by and the newest column rename its columns follow."""
    return {**TABLE_PROPERTIES, **source_properties(server_name, database, table),
            PRIMARY_KEY_PROPERTY: json.dumps(list(primary_key)),
            RENAMED_THROUGH_PROPERTY: str(renamed_through)}


def target_comment(server_name: str, database: str, table: str) -> str:
    """A target's table comment."""
    return f"cdc_platform target of {table_id(database, table)} on {server_name}"
