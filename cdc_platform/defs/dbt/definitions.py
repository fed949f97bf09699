"""The dbt domain: the inventory models of ``dbt_project/`` as assets downstream of the lake
(and ``customer_billing``, downstream of another source's billing tables too).

dbt runs in its own process with its own Spark session (dbt-spark ``session`` method), which
has the lake's Iceberg catalog as its default catalog (``project.spark_conf``): the models read
the lake tables directly and are Iceberg tables themselves, in ``<server>_analytics``. The
sources carry the target assets' keys, so the asset graph reads
changelog -> target tables -> dbt models, and dbt tests become asset checks on the models.
dagster_dbt (some 1.8 s of imports) is imported only for a source with the inventory tables
(``assets.py``): every process loading the code location pays it, each run's too.
"""

import json
from collections.abc import Mapping
from typing import Any

import dagster as dg

from cdc_platform.capture.schema import TableSchema
from cdc_platform.config import Settings
from cdc_platform.defs.dbt import project as dbt_project
from cdc_platform.defs.names import scoped_name
from cdc_platform.lake.iceberg.catalog import namespace_name

JOB_NAME = "build_dbt_models"


def _check_lineage(settings: Settings, database: str, manifest: Mapping[str, Any],
                   keyed: list[TableSchema], billing: str | None) -> None:
    """Every dbt source must be a target asset of this code location, or lineage breaks: one
    of this source's targets, or a billing table the ``billing`` source's config captures
    (its assets are built beside these, from its own discovery)."""
    targets = {(settings.source.server_name, t.database, t.table) for t in keyed}
    if billing:
        targets |= {(billing, dbt_project.BILLING_DATABASE, table)
                    for table in dbt_project.BILLING_TABLES}
    for source in manifest["sources"].values():
        key = tuple(source.get("meta", {}).get("dagster", {}).get("asset_key") or ())
        if key not in targets:
            raise ValueError(
                f"dbt source {source['source_name']}.{source['name']} has asset key {list(key)}, "
                f"which is not a target asset of server {settings.source.server_name!r} "
                f"(database {database!r}) nor a billing table of another configured source; "
                "remove dbt_project/target and load again"
            )


def _check_models_namespace(settings: Settings, keyed: list[TableSchema]) -> None:
    """The models' namespace must hold no lake table: ``create or replace`` would overwrite it."""
    server = settings.source.server_name
    namespace = dbt_project.models_schema(server)
    clashing = sorted({t.database for t in keyed
                       if namespace_name(server, t.database) == namespace})
    if clashing:
        raise ValueError(
            f"captured database {clashing[0]!r} of server {server!r} has the lake namespace "
            f"{namespace!r}, where the dbt models are built; exclude it from capture "
            f"(capture.tables.exclude: '{clashing[0]}\\..*') or rename the server")


def build(settings: Settings, tables: list[TableSchema]) -> dg.Definitions:
    """dbt assets and the ``build_dbt_models`` job, when the inventory tables are captured.

    Without them (another source, another schema) the location loads without dbt assets.
    When another configured source captures the billing tables, the model ``customer_billing``
    joins them to these customers: two sources feeding one model.
    """
    keyed = [t for t in tables if t.primary_key]
    database = dbt_project.inventory_database(keyed)
    if database is None:
        return dg.Definitions()
    server = settings.source.server_name
    _check_models_namespace(settings, keyed)
    billing = dbt_project.billing_server(settings)
    project = dbt_project.dbt_project(server, database, billing)
    manifest_path = dbt_project.prepare(project, server, database, billing)
    manifest = json.loads(manifest_path.read_text())
    _check_lineage(settings, database, manifest, keyed, billing)
    from cdc_platform.defs.dbt.assets import dbt_models_asset

    # Each source's own resource: two sources with the inventory tables have two projects.
    resource_key = scoped_name(settings, "dbt")
    dbt_models = dbt_models_asset(settings, database, project, manifest_path, resource_key)
    job = dg.define_asset_job(
        scoped_name(settings, JOB_NAME),
        selection=dg.AssetSelection.assets(dbt_models),
        description="Build the dbt models on the lake's inventory tables and run their dbt "
        "tests (as asset checks). Run it after materialise_targets.",
        executor_def=dg.in_process_executor,
    )
    return dg.Definitions(
        assets=[dbt_models],
        jobs=[job],
        resources={resource_key: dbt_project.dbt_resource(project)},
    )
