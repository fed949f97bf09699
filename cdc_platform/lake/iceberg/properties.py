"""The table properties every target carries: Iceberg's write settings and the platform's own
(``cdc.*``), which let any engine find a target's source and key without the Dagster UI."""

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
