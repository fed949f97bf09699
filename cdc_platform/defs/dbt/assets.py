"""The dbt models as assets (dagster_dbt): imported by ``definitions.build`` only for a source
with the inventory tables."""

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import dagster as dg
from dagster_dbt import (
    DagsterDbtTranslator,
    DagsterDbtTranslatorSettings,
    DbtCliResource,
    DbtProject,
    dbt_assets,
)

from cdc_platform.config import Settings
from cdc_platform.defs.dbt import project as dbt_project


class LakeDbtTranslator(DagsterDbtTranslator):
    """Model keys ``<server>/<schema>/<model>`` in group ``<server>_<schema>``.

    Sources keep the keys in their ``meta.dagster.asset_key`` (the target assets' keys). A
    model's dbt schema is its catalog namespace, ``<server>_analytics`` (per server, as several
    sources may share a catalog); its key names the server and ``analytics`` apart, so that
    several sources' code locations never collide.
    """

    def __init__(self, server_name: str) -> None:
        super().__init__(settings=DagsterDbtTranslatorSettings(enable_asset_checks=True))
        self.server_name = server_name

    def _schema(self, namespace: str) -> str:
        prefix = f"{self.server_name}_"
        return namespace[len(prefix):] if namespace.startswith(prefix) else namespace

    def get_asset_key(self, dbt_resource_props: Mapping[str, Any]) -> dg.AssetKey:
        if dbt_resource_props["resource_type"] == "model":
            return dg.AssetKey([self.server_name, self._schema(dbt_resource_props["schema"]),
                                dbt_resource_props["name"]])
        return super().get_asset_key(dbt_resource_props)

    def get_group_name(self, dbt_resource_props: Mapping[str, Any]) -> str | None:
        if dbt_resource_props["resource_type"] == "model":
            return f"{self.server_name}_{self._schema(dbt_resource_props['schema'])}"
        return super().get_group_name(dbt_resource_props)


def dbt_models_asset(settings: Settings, database: str, project: DbtProject,
                     manifest_path: Path, resource_key: str) -> dg.AssetsDefinition:
    """The models of ``project`` (parsed into ``manifest_path``) for ``settings``' source."""
    server = settings.source.server_name

    @dbt_assets(
        manifest=manifest_path,
        project=project,
        name=f"{server}_dbt_models",
        dagster_dbt_translator=LakeDbtTranslator(server),
        required_resource_keys={resource_key},
    )
    def dbt_models(context: dg.AssetExecutionContext) -> Iterator[Any]:
        dbt: DbtCliResource = getattr(context.resources, resource_key)
        variables = dbt_project.run_vars(settings, database)
        yield from dbt.cli(["build", "--vars", json.dumps(variables)], context=context).stream()

    return dbt_models
