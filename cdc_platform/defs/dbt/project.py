"""The dbt project beside the package (``dbt_project/``), prepared for the configured source.

Two kinds of dbt vars, both computed here so that Dagster, the image build and a person running
dbt by hand agree:

* **parse vars** (server name, captured inventory database, its catalog schema) decide the
  sources' schema and their ``meta.dagster.asset_key``, so they shape the manifest Dagster loads.
  Each (server, database) gets its own manifest under ``dbt_project/target/<schema>/``: the image
  build prepares the demo's, anything else is parsed once, when the code location first loads.
* **run vars** add, per run, the file holding the statements that register the lake in dbt's
  in-memory Spark catalog (``cdc_platform.lake.catalog``; the project's on-run-start hook runs
  them), the model tables' location under the warehouse and the lake's Spark settings for dbt's
  own session.

``python -m cdc_platform.defs.dbt.project prepare|vars`` prepares a manifest (image build) or
writes a catalog file and prints the run vars for the configured source, for running dbt by hand
(``cd dbt_project && dbt build --profiles-dir . --vars "$(python -m ... vars)"``).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import posixpath
import sys
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dagster_dbt import DbtCliResource, DbtProject

from cdc_platform.capture.schema import TableSchema
from cdc_platform.config import Settings, settings
from cdc_platform.lake.catalog import catalog_database, parquet_table_sql, quote, target_table_sql
from cdc_platform.lake.paths import Location, resolve
from cdc_platform.lake.spark import DEFAULT_CONF
from cdc_platform.lake.table_format import TargetTable

PROJECT_DIR_ENV = "CDC_DBT_PROJECT_DIR"
INVENTORY_TABLES = ("customers", "products", "orders")
DEFAULT_INVENTORY_DATABASE = "inventory"
# Under the warehouse, beside the servers' folders; server names cannot start with "_".
MODELS_FOLDER = "_dbt"


def dbt_executable() -> str:
    """The ``dbt`` of this interpreter's environment (an unactivated venv is not on PATH)."""
    sibling = Path(sys.executable).with_name("dbt")
    return str(sibling) if sibling.exists() else "dbt"


def dbt_resource(project: DbtProject) -> DbtCliResource:
    return DbtCliResource(project_dir=project, dbt_executable=dbt_executable())


def project_dir() -> Path:
    """``$CDC_DBT_PROJECT_DIR``, else ``dbt_project/`` beside the package (a source checkout)."""
    configured = os.environ.get(PROJECT_DIR_ENV)
    return Path(configured) if configured else Path(__file__).resolve().parents[3] / "dbt_project"


def inventory_database(tables: list[TableSchema]) -> str | None:
    """The captured database holding the inventory tables the dbt project is about, if any.

    The demo's is ``inventory``; tests load the same schema into databases of other names.
    """
    by_database: dict[str, set[str]] = {}
    for table in tables:
        if table.primary_key:
            by_database.setdefault(table.database, set()).add(table.table)
    candidates = sorted(db for db, names in by_database.items()
                        if set(INVENTORY_TABLES) <= names)
    if DEFAULT_INVENTORY_DATABASE in candidates:
        return DEFAULT_INVENTORY_DATABASE
    return candidates[0] if candidates else None


def parse_vars(server_name: str, database: str) -> dict[str, str]:
    return {
        "cdc_server_name": server_name,
        "cdc_inventory_database": database,
        "cdc_inventory_schema": catalog_database(server_name, database),
    }


def dbt_project(server_name: str, database: str) -> DbtProject:
    """The project with its own manifest location for this (server, database)."""
    return DbtProject(project_dir=project_dir(),
                      target_path=Path("target") / catalog_database(server_name, database))


def _newest_source_mtime(root: Path) -> float:
    generated = {"target", "logs", "dbt_packages"}
    return max(path.stat().st_mtime for path in root.rglob("*")
               if path.is_file() and path.relative_to(root).parts[0] not in generated)


def _is_fresh(project: DbtProject) -> bool:
    manifest = project.manifest_path
    return manifest.exists() and manifest.stat().st_mtime >= _newest_source_mtime(
        project.project_dir)


def prepare(project: DbtProject, server_name: str, database: str) -> Path:
    """Parse the project unless its manifest is newer than every project file; return its path.

    Processes loading the code location at the same time take turns on a lock file, so one
    parse serves them all.
    """
    if not _is_fresh(project):
        target = project.project_dir / project.target_path
        target.mkdir(parents=True, exist_ok=True)
        with open(target.with_name(target.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if not _is_fresh(project):
                    args = ["parse", "--quiet", "--vars",
                            json.dumps(parse_vars(server_name, database))]
                    dbt_resource(project).cli(args, target_path=target).wait()
            finally:
                with contextlib.suppress(OSError):
                    fcntl.flock(lock, fcntl.LOCK_UN)
    if not project.manifest_path.exists():
        raise FileNotFoundError(f"dbt parse did not write {project.manifest_path}; run "
                                f"`dbt parse` in {project.project_dir} to see why")
    return project.manifest_path


def models_location(settings: Settings) -> Location:
    """Where the model tables of this source live: ``<warehouse>/_dbt/<server>/<model>``."""
    return resolve(settings.warehouse.url).join(MODELS_FOLDER, settings.source.server_name)


def spark_conf(settings: Settings) -> dict[str, str]:
    """dbt's Spark session: the lake's settings, plus what dbt's table rebuilds need.

    dbt-spark rebuilds a table by ``DROP TABLE`` (files of an external table stay) and
    ``CREATE TABLE ... LOCATION ... AS SELECT``, which Spark refuses on a non-empty location
    unless allowed; the write then replaces the files.
    """
    return {
        **DEFAULT_CONF,
        "spark.master": settings.spark.master,
        "spark.app.name": f"{settings.spark.app_name}_dbt",
        "spark.sql.warehouse.dir": f"{tempfile.gettempdir()}/cdc-dbt-spark-warehouse",
        "spark.sql.legacy.allowNonEmptyLocationInCTAS": "true",
        **settings.spark.conf,
    }


def _has_parquet(location: Location) -> bool:
    return any(name.endswith(".parquet") for name in location.list_names())


def catalog_statements(settings: Settings, manifest: Mapping[str, Any]) -> tuple[
        list[str], list[str]]:
    """Statements registering the sources' lake tables and the model tables built earlier.

    Returns (statements, missing): ``missing`` lists sources whose target table has never been
    materialised (dbt fails on the models reading them).
    """
    statements: list[str] = []
    missing: list[str] = []
    for source in manifest["sources"].values():
        key = source.get("meta", {}).get("dagster", {}).get("asset_key")
        if not key or len(key) != 3:
            continue
        server, database, table = key
        registered = target_table_sql(TargetTable(settings.warehouse.url, server, database,
                                                  table))
        statements += registered
        if not registered:
            missing.append("/".join(key))
    root = models_location(settings)
    for node in manifest["nodes"].values():
        if node["resource_type"] != "model" or node["config"].get("materialized") != "table":
            continue
        location = root.join(node["alias"])
        if _has_parquet(location):
            statements.append(f"CREATE DATABASE IF NOT EXISTS {quote(node['schema'])}")
            statements.append(parquet_table_sql(node["schema"], node["alias"],
                                                location.spark_uri))
    return statements, missing


def write_catalog(settings: Settings, statements: list[str]) -> Location:
    """Store a run's catalog statements where dbt's Spark session can read them.

    They go to a file under the warehouse rather than onto dbt's command line: one statement per
    file set of every source table outgrows a command-line argument, and the warehouse is
    readable wherever the Spark session's executors run. Delete it after the run.
    """
    location = models_location(settings).join("_catalog", f"{uuid.uuid4().hex}.json")
    location.fs.create_dir(posixpath.dirname(location.path), recursive=True)
    lines = "".join(json.dumps({"seq": i, "statement": s}) + "\n"
                    for i, s in enumerate(statements))
    with location.fs.open_output_stream(location.path) as stream:
        stream.write(lines.encode())
    return location


def run_vars(settings: Settings, database: str, catalog: Location) -> dict[str, Any]:
    """All vars of one dbt invocation, given the file holding its catalog statements."""
    return {
        **parse_vars(settings.source.server_name, database),
        "cdc_location_root": models_location(settings).spark_uri,
        "cdc_spark_conf": spark_conf(settings),
        "cdc_catalog_file": catalog.spark_uri,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdc_platform.defs.dbt.project",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["prepare", "vars"])
    parser.add_argument("--server", help="prepare: server name (default: the config's)")
    parser.add_argument("--database", default=DEFAULT_INVENTORY_DATABASE,
                        help="captured database holding the inventory tables")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        server = args.server or settings().source.server_name
        print(prepare(dbt_project(server, args.database), server, args.database))
        return 0
    config = settings()
    server = config.source.server_name
    manifest_path = prepare(dbt_project(server, args.database), server, args.database)
    statements, missing = catalog_statements(config, json.loads(manifest_path.read_text()))
    if missing:
        print(f"not materialised yet: {', '.join(missing)}", file=sys.stderr)
    print(json.dumps(run_vars(config, args.database, write_catalog(config, statements))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
