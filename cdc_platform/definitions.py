"""The one Dagster entry point: merges the domains under ``defs/``.

One code location serves every source of the config (``sources``): each source's assets carry
its server name as their key prefix and group prefix. Which target assets exist depends on
which tables are captured: they are discovered from the source (tables matching its filters)
and from the landing zone's record of tables its engine has seen, so a table created later, or
a source added to the config, appears on the next code-location reload.
"""

from __future__ import annotations

import logging
import tempfile
from concurrent.futures import ThreadPoolExecutor

import dagster as dg
from dagster_pyspark import LazyPySparkResource

from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.names import table_id
from cdc_platform.capture.schema import TableSchema
from cdc_platform.capture.source import SourceSession, selector_from_settings
from cdc_platform.config import Settings, settings
from cdc_platform.defs.dbt import definitions as dbt_defs
from cdc_platform.defs.failures import load_problem_sensor
from cdc_platform.defs.lake import applier as lake_applier
from cdc_platform.defs.lake import definitions as lake_defs
from cdc_platform.defs.lake import maintenance as lake_maintenance
from cdc_platform.defs.names import source_resource_key
from cdc_platform.defs.resources import source_resource
from cdc_platform.defs.signals import definitions as signals_defs
from cdc_platform.defs.snapshots import definitions as snapshots_defs
from cdc_platform.defs.snapshots import sensors as snapshots_sensors
from cdc_platform.defs.streaming import definitions as streaming_defs
from cdc_platform.defs.topics import definitions as topics_defs
from cdc_platform.lake.spark import deployment_conf, prepare_python_workers

log = logging.getLogger(__name__)


def discover_tables(config: Settings) -> tuple[list[TableSchema], str]:
    """Captured tables of one source: what the engine recorded, plus what the source has now;
    and why the source could not be read ('' when it could)."""
    server = config.source.server_name
    tables = LandingZone.from_settings(config, server).read_tables()
    selector = selector_from_settings(config)
    problem = ""
    try:
        with SourceSession(dict(config.source.connection_settings(), connect_timeout=3),
                           selector, attempts=1) as source:
            new = [(database, table) for database, table in source.list_tables()
                   if table_id(database, table) not in tables]
            for schema in source.read_schemas(new).values():
                tables[schema.table_id] = schema
    except Exception as error:  # noqa: BLE001 - an unreachable source must not break loading
        problem = (f"unreachable while loading definitions ({_one_line(error)}); its target "
                   f"assets come from the landing zone only ({len(tables)} tables)")
        log.warning(f"source {server!r} {problem}")
    return [tables[k] for k in sorted(tables) if selector.captures(tables[k].database,
                                                                   tables[k].table)], problem


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def spark_config(config: Settings) -> dict[str, str]:
    """The Dagster steps' Spark session: the lake's defaults, the S3 jars and settings when the
    landing zone or the warehouse is on S3, then the config's own ``spark.conf``."""
    return deployment_conf(config, **{
        "spark.sql.warehouse.dir": f"{tempfile.gettempdir()}/cdc-spark-warehouse"})


class LakeSparkResource(LazyPySparkResource):
    """The lazy PySpark resource, with Python workers that run this interpreter and import this
    cdc_platform from any working directory (``lake.spark.prepare_python_workers``)."""

    def _init_session(self) -> None:
        prepare_python_workers()
        super()._init_session()


def source_definitions(config: Settings) -> dg.Definitions:
    """Everything of one source (``config`` is one source's settings, ``Settings.for_source``):
    its streaming job, snapshot assets and sensors, targets and checks, applier, dbt models and
    its session resource. A source whose definitions cannot be built gets only a sensor that
    says why in one line (``failures.load_problem_sensor``); the others load as usual."""
    server = config.source.server_name
    try:
        tables, problem = discover_tables(config)
        snapshot_assets = snapshots_defs.snapshot_assets(config, tables)
        built = dg.Definitions.merge(
            streaming_defs.build(config),
            lake_defs.build(config, tables),
            lake_applier.build(config, tables),
            lake_maintenance.build(config, tables),
            snapshots_defs.build(snapshot_assets),
            snapshots_sensors.build(config, snapshot_assets),
            signals_defs.build(config, snapshot_assets),
            dbt_defs.build(config, tables),
            topics_defs.build(config),
            dg.Definitions(resources={source_resource_key(config): source_resource(config)}),
        )
    except Exception as error:  # noqa: BLE001 - one source must not keep the others from loading
        line = f"not loaded: {_one_line(error)}"
        log.error(f"source {server!r} {line}")
        return dg.Definitions(sensors=[load_problem_sensor(server, line)])
    if problem:
        built = dg.Definitions.merge(
            built, dg.Definitions(sensors=[load_problem_sensor(server, problem)]))
    return built


def build_definitions(config: Settings) -> dg.Definitions:
    """Every source's definitions (discovered side by side: each may wait for its source to
    answer), with what they share: the Spark resource and the executor."""
    sources = config.per_source()
    with ThreadPoolExecutor(max_workers=min(8, len(sources))) as pool:
        per_source = list(pool.map(source_definitions, sources))
    shared = dg.Definitions(
        resources={"pyspark": LakeSparkResource(spark_config=spark_config(config))},
        executor=dg.in_process_executor,
    )
    merged, _ = _loadable(shared, *per_source)
    if merged is not None:
        return merged
    # Two sources' definitions clash (a name the server does not scope): rather than no source
    # at all, every source that clashes with the ones before it is a load problem, in one line.
    loaded = shared
    for source, definitions in zip(sources, per_source, strict=True):
        candidate, error = _loadable(loaded, definitions)
        if candidate is None:
            server = source.source.server_name
            line = f"not loaded: its definitions clash with another source's: {error}"
            log.error(f"source {server!r} {line}")
            candidate = dg.Definitions.merge(
                loaded, dg.Definitions(sensors=[load_problem_sensor(server, line)]))
        loaded = candidate
    return loaded


def _loadable(*definitions: dg.Definitions) -> tuple[dg.Definitions | None, str]:
    """The merge of ``definitions`` if Dagster can load it (no two assets with one key, no two
    jobs, sensors or resources with one name), else None and why, in one line."""
    try:
        merged = dg.Definitions.merge(*definitions)
        dg.Definitions.validate_loadable(merged)
    except Exception as error:  # noqa: BLE001 - said as the clashing source's load problem
        return None, _one_line(error)
    return merged, ""


defs = build_definitions(settings())
