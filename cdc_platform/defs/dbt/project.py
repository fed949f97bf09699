"""The dbt project beside the package (``dbt_project/``), prepared for the configured source.

dbt reads the lake's Iceberg tables directly: its Spark session (dbt-spark ``session`` method,
in dbt's own process) gets the lake's Iceberg catalog as its default catalog, so the sources'
two-part names ``<server>_<db>.<table>`` are the lake tables themselves (the namespace and
table names of ``cdc_platform.lake.iceberg``), and the models are Iceberg tables in the same
catalog, in the namespace ``<server>_analytics`` (``models_schema``). Nothing is registered
before a run: every engine that reads the catalog sees the models beside the lake tables.

Two kinds of dbt vars, both computed here so that Dagster, the image build and a person running
dbt by hand agree:

* **parse vars** (server name, captured inventory database, the sources' namespace, the models'
  namespace) decide the sources' schema and ``meta.dagster.asset_key`` and the models' schema,
  so they shape the manifest Dagster loads. Each (server, database) gets its own manifest under
  ``dbt_project/target/<server>_<db>/``: the image build prepares the demo's, anything else is
  parsed once, when the code location first loads.
* **run vars** add the Spark settings of dbt's own session (``spark_conf``).

``python -m cdc_platform.defs.dbt.project prepare|vars`` prepares a manifest (image build) or
prints the run vars for the configured source, for running dbt by hand
(``cd dbt_project && dbt build --profiles-dir . --vars "$(python -m ... vars)"``).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdc_platform.capture.schema import TableSchema
from cdc_platform.config import Settings, settings
from cdc_platform.lake.iceberg.catalog import SPARK_CATALOG, catalog_properties, namespace_name
from cdc_platform.lake.spark import deployment_conf

if TYPE_CHECKING:  # (dagster_dbt costs some 1.8 s of imports: only where dbt is used)
    from dagster_dbt import DbtCliResource, DbtProject

PROJECT_DIR_ENV = "CDC_DBT_PROJECT_DIR"
INVENTORY_TABLES = ("customers", "products", "orders")
DEFAULT_INVENTORY_DATABASE = "inventory"
# The billing tables the model ``customer_billing`` joins to the inventory customers.
BILLING_DATABASE = "billing"
BILLING_TABLES = ("invoices", "payments")
# The models' namespace is ``<server>_analytics``; asset keys say ``<server>/analytics/<model>``.
MODELS_SCHEMA = "analytics"


def dbt_executable() -> str:
    """The ``dbt`` of this interpreter's environment (an unactivated venv is not on PATH)."""
    sibling = Path(sys.executable).with_name("dbt")
    return str(sibling) if sibling.exists() else "dbt"


def dbt_resource(project: DbtProject) -> DbtCliResource:
    from dagster_dbt import DbtCliResource

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


def models_schema(server_name: str) -> str:
    """The catalog namespace of this source's model tables: ``<server>_analytics``.

    Per server, because several sources may share one catalog; beside the lake's own
    ``<server>_<db>`` namespaces (a captured database named ``analytics`` would share it, which
    ``definitions.build`` refuses).
    """
    return namespace_name(server_name, MODELS_SCHEMA)


def billing_server(settings: Settings) -> str | None:
    """Another source of the deployment whose config captures the billing tables, if any: its
    ``billing`` dbt source and the model joining it to this source's customers are enabled.

    Read from the config alone (no source is asked), so every process parses the same project.
    """
    from cdc_platform.capture.source import selector_from_settings

    deployment = settings.deployment
    for name in deployment.server_names:
        if name == settings.source.server_name:
            continue
        selector = selector_from_settings(deployment.for_source(name))
        if all(selector.captures(BILLING_DATABASE, table) for table in BILLING_TABLES):
            return name
    return None


def parse_vars(server_name: str, database: str,
               billing: str | None = None) -> dict[str, str]:
    """The vars shaping the manifest; ``billing``: the server of the billing source (empty:
    the billing source and its model are disabled)."""
    return {
        "cdc_server_name": server_name,
        "cdc_inventory_database": database,
        "cdc_inventory_schema": namespace_name(server_name, database),
        "cdc_models_schema": models_schema(server_name),
        "cdc_billing_server_name": billing or "",
        "cdc_billing_schema": namespace_name(billing, BILLING_DATABASE) if billing else "",
    }


def dbt_project(server_name: str, database: str, billing: str | None = None) -> DbtProject:
    """The project with its own manifest location for this (server, database, billing)."""
    from dagster_dbt import DbtProject

    name = namespace_name(server_name, database) + (f"+{billing}" if billing else "")
    return DbtProject(project_dir=project_dir(), target_path=Path("target") / name)


def _newest_source_mtime(root: Path) -> float:
    generated = {"target", "logs", "dbt_packages"}
    return max(path.stat().st_mtime for path in root.rglob("*")
               if path.is_file() and path.relative_to(root).parts[0] not in generated)


def _is_fresh(project: DbtProject) -> bool:
    manifest = project.manifest_path
    return manifest.exists() and manifest.stat().st_mtime >= _newest_source_mtime(
        project.project_dir)


def prepare(project: DbtProject, server_name: str, database: str,
            billing: str | None = None) -> Path:
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
                            json.dumps(parse_vars(server_name, database, billing))]
                    dbt_resource(project).cli(args, target_path=target).wait()
            finally:
                with contextlib.suppress(OSError):
                    fcntl.flock(lock, fcntl.LOCK_UN)
    if not project.manifest_path.exists():
        raise FileNotFoundError(f"dbt parse did not write {project.manifest_path}; run "
                                f"`dbt parse` in {project.project_dir} to see why")
    return project.manifest_path


def spark_conf(settings: Settings) -> dict[str, str]:
    """dbt's Spark session: the lake's settings and its Iceberg catalog, as the default catalog.

    The catalog gets the configured name and properties
    (``lake.iceberg.catalog.catalog_properties``, as ``Lake`` registers it in the platform's
    sessions). It is the session's default catalog
    because dbt-spark names relations ``schema.table``: the sources' namespace
    ``<server>_<db>`` and the models' ``<server>_analytics`` then resolve in it.
    """
    catalog = settings.warehouse.catalog
    prefix = f"spark.sql.catalog.{catalog.name}"
    properties = catalog_properties(settings.warehouse.url, catalog, settings.s3)
    return deployment_conf(settings, **{
        "spark.app.name": f"{settings.spark.app_name}_dbt",
        "spark.sql.warehouse.dir": f"{tempfile.gettempdir()}/cdc-dbt-spark-warehouse",
        prefix: SPARK_CATALOG,
        **{f"{prefix}.{key}": value for key, value in properties.items()},
        "spark.sql.defaultCatalog": catalog.name,
    })


def run_vars(settings: Settings, database: str) -> dict[str, Any]:
    """All vars of one dbt invocation on the inventory tables of ``database``."""
    return {
        **parse_vars(settings.source.server_name, database, billing_server(settings)),
        "cdc_spark_conf": spark_conf(settings),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdc_platform.defs.dbt.project",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["prepare", "vars"])
    parser.add_argument("--server", help="server name (default: the config's only source; "
                        "vars: one of the config's sources)")
    parser.add_argument("--database", default=DEFAULT_INVENTORY_DATABASE,
                        help="captured database holding the inventory tables")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        server = args.server or settings().for_source(None).source.server_name
        configured = settings()
        billing = (billing_server(configured.for_source(server))
                   if server in configured.server_names else None)
        print(prepare(dbt_project(server, args.database, billing), server, args.database,
                      billing))
        return 0
    print(json.dumps(run_vars(settings().for_source(args.server), args.database)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
