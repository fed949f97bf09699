"""Lake tables as Spark SQL catalog entries, for Spark sessions that are not the lake's own.

The lake keeps table metadata in the warehouse (``_commits/*.json``), not in a metastore, so a
separate Spark process (dbt's ``session`` connection, an analyst's notebook) has nothing in its
catalog. This module turns a table's current commit into SQL statements that any Spark session
can run to see the table under a plain name:

* one external Parquet table per file set of the commit, declared with the columns that file set
  was written with (``cdc_lake_files``), so no schema is inferred and old file sets read by name;
* one view ``<server>_<db>.<table>`` (names made valid for the catalog by ``catalog_name``) that
  folds them exactly as ``TargetTable.state`` does: base
  rows whose key occurs in a delta are superseded, deltas are folded by highest ``__cdc_pos``
  per key, tombstones are dropped.

The statements pin one committed version: a materialisation that commits later does not change
what a session that ran them reads (its file sets are never deleted while they are among the
newest versions; see ``TargetTable.collect_garbage``).
"""

from __future__ import annotations

import posixpath
from dataclasses import replace

from pyspark.sql.types import StructType

from cdc_platform.capture.names import valid_name
from cdc_platform.lake.columns import OP, POS, table_struct
from cdc_platform.lake.table_format import BROADCAST_MAX_DELTA_ROWS, Commit, DataFile, TargetTable

FILES_DATABASE = "cdc_lake_files"


def quote(identifier: str) -> str:
    """A Spark SQL identifier, whatever characters it holds."""
    return "`" + identifier.replace("`", "``") + "`"


def string_literal(value: str) -> str:
    """A Spark SQL string literal (the default parser treats backslash as an escape)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def catalog_name(name: str) -> str:
    """A name Spark's session catalog accepts and tells apart (``names.valid_name``).

    Names of lower-case letters, digits and underscores stay as they are; others become a slug
    plus a short hash of the original, so that ``a-b`` and ``a_b`` differ, and (the catalog
    ignores case) ``A`` and ``a`` too.
    """
    return valid_name(name, case_sensitive=False)


def catalog_database(server_name: str, database: str) -> str:
    """The catalog database a source database's lake tables appear in: ``<server>_<db>``."""
    return catalog_name(f"{server_name}_{database}")


def _columns_ddl(struct: StructType) -> str:
    return ", ".join(f"{quote(f.name)} {f.dataType.simpleString()}" for f in struct.fields)


def parquet_table_sql(database: str, table: str, location: str,
                      struct: StructType | None = None) -> str:
    """Declare an external Parquet table (schema read from the files when ``struct`` is None)."""
    columns = f" ({_columns_ddl(struct)})" if struct is not None else ""
    return (f"CREATE TABLE IF NOT EXISTS {quote(database)}.{quote(table)}{columns} "
            f"USING parquet LOCATION {string_literal(location)}")


def _file_set_table(target: TargetTable, data_file: DataFile) -> str:
    name = posixpath.basename(data_file.path.rstrip("/"))  # <version>-<kind>-<uuid>: unique
    return catalog_name(f"{target.server_name}_{target.database}_{target.table}_"
                        f"{name.replace('-', '_')}")


def _conformed_select(commit: Commit, data_file: DataFile, source: str) -> str:
    """Select the commit's columns from one file set: by name, cast where the type changed,
    NULL where the file set predates the column (mirrors ``columns.conform``)."""
    written_columns = data_file.columns if data_file.columns is not None else commit.schema.columns
    written = {f.name: f.dataType for f in
               table_struct(replace(commit.schema, columns=written_columns)).fields}
    selected = []
    for field in table_struct(commit.schema).fields:
        name, type_sql = quote(field.name), field.dataType.simpleString()
        if field.name not in written:
            selected.append(f"CAST(NULL AS {type_sql}) AS {name}")
        elif written[field.name] != field.dataType:
            selected.append(f"CAST({name} AS {type_sql}) AS {name}")
        else:
            selected.append(name)
    return f"SELECT {', '.join(selected)} FROM {source}"


def fold_sql(commit: Commit, sources: dict[str, str]) -> str:
    """The query reading ``commit``'s current rows, given the relation name of each file set.

    ``sources`` maps ``DataFile.path`` to a relation (e.g. a catalog table over that file set).
    The output has the user columns in schema order, like ``TargetTable.read``.
    """
    struct = table_struct(commit.schema)
    user_columns = ", ".join(quote(c) for c in commit.schema.column_names)
    keys = [quote(k) for k in commit.schema.primary_key]
    bases = [f for f in commit.files if f.kind == "base"]
    deltas = [f for f in commit.files if f.kind == "delta"]

    def union(files: list[DataFile]) -> str:
        return " UNION ALL ".join(_conformed_select(commit, f, sources[f.path]) for f in files)

    if not bases and not deltas:
        nulls = ", ".join(f"CAST(NULL AS {f.dataType.simpleString()}) AS {quote(f.name)}"
                          for f in struct.fields if f.name not in (POS, OP))
        return f"SELECT {nulls} WHERE false"
    if not deltas:
        return f"SELECT {user_columns} FROM ({union(bases)}) AS `__base`"
    if not keys:
        raise ValueError(f"{commit.schema.table_id}: a table with deltas needs a primary key "
                         "to fold them")
    latest = (
        f"WITH `__deltas` AS ({union(deltas)}), "
        f"`__latest` AS (SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY "
        f"{', '.join(keys)} ORDER BY {quote(POS)} DESC) AS `__cdc_rank` FROM `__deltas`) "
        f"WHERE `__cdc_rank` = 1) "
    )
    live = f"SELECT {user_columns} FROM `__latest` WHERE {quote(OP)} <> 'd'"
    if not bases:
        return latest + live
    hint = ("/*+ BROADCAST(`__latest`) */ "
            if sum(f.rows for f in deltas) <= BROADCAST_MAX_DELTA_ROWS else "")
    on = " AND ".join(f"`__base`.{k} <=> `__latest`.{k}" for k in keys)  # NULL key parts
    kept = (f"SELECT {hint}{', '.join(f'`__base`.{quote(c)}' for c in commit.schema.column_names)}"
            f" FROM ({union(bases)}) AS `__base` LEFT ANTI JOIN `__latest` ON {on}")
    return f"{latest}{kept} UNION ALL {live}"


def target_table_sql(target: TargetTable, commit: Commit | None = None) -> list[str]:
    """Statements making ``<server>_<db>.<table>`` read ``commit`` (default: the current one).

    Empty when the table has never been materialised: there is nothing to read yet, and a
    query naming it should fail rather than read an empty table.
    """
    commit = target.current() if commit is None else commit
    if commit is None:
        return []
    database = catalog_database(target.server_name, target.database)
    statements = [f"CREATE DATABASE IF NOT EXISTS {quote(FILES_DATABASE)}",
                  f"CREATE DATABASE IF NOT EXISTS {quote(database)}"]
    sources = {}
    for data_file in commit.files:
        written = data_file.columns if data_file.columns is not None else commit.schema.columns
        name = _file_set_table(target, data_file)
        statements.append(parquet_table_sql(
            FILES_DATABASE, name, target.data_location(data_file.path).spark_uri,
            table_struct(replace(commit.schema, columns=written))))
        sources[data_file.path] = f"{quote(FILES_DATABASE)}.{quote(name)}"
    view = f"{quote(database)}.{quote(catalog_name(target.table))}"
    statements.append(f"CREATE OR REPLACE VIEW {view} AS {fold_sql(commit, sources)}")
    return statements
