"""The dbt project on a real lake: MariaDB inventory -> capture -> lake tables -> dbt (Spark).

One lake and one ``dbt build`` (through Dagster, as production runs it) per module: dbt on Spark
takes tens of seconds here, so every assertion about the models reads that one build.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.definitions import build_definitions
from cdc_platform.defs.dbt import definitions as dbt_defs
from cdc_platform.defs.dbt import project as dbt_project
from cdc_platform.demo.inventory import create_schema, load_initial_data
from cdc_platform.devservices.mariadb import MariaDBServer
from cdc_platform.lake.iceberg.catalog import SPARK_CATALOG, catalog_properties, quote
from cdc_platform.lake.iceberg.lake import Lake
from cdc_platform.lake.merge import materialise
from cdc_platform_tests.conftest import CdcEnv

MODELS = ("customer_order_totals", "daily_order_volume", "product_stock")
_lakes = itertools.count(1)


@pytest.fixture(scope="module")
def lake(mariadb: MariaDBServer, spark: Any, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[CdcEnv]:
    """An inventory database captured and materialised twice (then updates, deletes and
    cancellations), so the dbt sources read Iceberg tables with position delete files."""
    n = next(_lakes)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CDC_TEST_SOURCE_PASSWORD", mariadb.cdc_password)
        position = mariadb.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0] or ""
        env = CdcEnv(mariadb, f"dbt_inventory{n}", f"dbt{n}",
                     tmp_path_factory.mktemp("dbt_lake"), {}, position)
        with env.mariadb.root_connect() as conn:
            create_schema(conn, env.db)
            load_initial_data(conn, env.db, customers=60, products=25, orders=900, batch=300)
        env.catch_up()
        _materialise_all(env, spark)
        env.execute("UPDATE orders SET status = 'cancelled' WHERE id % 7 = 0",
                    "UPDATE products SET stock = stock + 5 WHERE sku <= 'SKU000010'",
                    "DELETE FROM orders WHERE id % 11 = 0")
        env.execute("DELETE FROM orders WHERE customer_id = 3",
                    "DELETE FROM customers WHERE id = 3")
        env.catch_up()
        _materialise_all(env, spark)
        yield env


def _materialise_all(env: CdcEnv, spark: Any) -> None:
    s = env.settings
    for table in ("customers", "products", "orders"):
        materialise(spark, s.landing_zone.url, s.warehouse.url, env.server_name, None, env.db,
                    table)


@pytest.fixture(scope="module")
def build(lake: CdcEnv, spark: Any) -> dict[str, Any]:
    """The ``build_dbt_models`` job, run once in process on a test Dagster instance.

    A stale ``daily_order_volume`` from an "earlier build" (another schema, wrong rows) is in
    the models' namespace first: dbt must replace it, not add to it.
    """
    stale = _model_table(spark, lake, "daily_order_volume")
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {stale.rsplit('.', 1)[0]}")
    spark.sql(f"CREATE TABLE {stale} USING iceberg AS "
              "SELECT DATE'1999-01-01' AS ordered_on, 42L AS order_count, 'x' AS extra")
    defs = build_definitions(lake.settings)
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def(dbt_defs.JOB_NAME).execute_in_process(
            instance=instance, raise_on_error=False)
        materialized = {e.asset_key for e in result.get_asset_materialization_events()}
    return {"result": result, "materialized": materialized, "defs": defs}


def _model_key(env: CdcEnv, model: str) -> dg.AssetKey:
    return dg.AssetKey([env.server_name, "analytics", model])


def _model_table(spark: Any, env: CdcEnv, model: str) -> str:
    """The model's Iceberg table in the lake's catalog, as this test session names it."""
    lake = Lake.from_settings(spark, env.settings)
    return (f"{quote(lake.catalog)}.{quote(dbt_project.models_schema(env.server_name))}."
            f"{quote(model)}")


def _model_rows(spark: Any, env: CdcEnv, model: str) -> list[dict[str, Any]]:
    return [row.asDict() for row in spark.table(_model_table(spark, env, model)).collect()]


def test_dbt_build_materialises_every_model_and_its_tests_pass(lake, build):
    result = build["result"]
    assert result.success, [e.message for e in result.all_events if e.is_failure]
    assert build["materialized"] == {_model_key(lake, m) for m in MODELS}
    checks = result.get_asset_check_evaluations()
    assert len(checks) == 13  # unique / not_null / relationships / sums_to_row_count
    assert all(c.passed for c in checks), [c.check_name for c in checks if not c.passed]


def test_customer_totals_match_the_source(lake, build, spark):
    rows = {r["customer_id"]: r for r in _model_rows(spark, lake, "customer_order_totals")}
    source = {row[0]: row[1:] for row in lake.query(
        "SELECT c.id, COUNT(o.id), COALESCE(SUM(IF(o.status <> 'cancelled', "
        "o.quantity * o.unit_price, 0)), 0) FROM customers c LEFT JOIN orders o "
        "ON o.customer_id = c.id GROUP BY c.id")}
    assert set(rows) == set(source) and 3 not in rows
    assert {k: (r["order_count"], r["revenue"]) for k, r in rows.items()} == {
        k: (count, Decimal(revenue).quantize(Decimal("0.01")))
        for k, (count, revenue) in source.items()}


def test_daily_volume_counts_every_order_of_the_source(lake, build, spark):
    rows = {r["ordered_on"]: r["order_count"] for r in _model_rows(spark, lake,
                                                                     "daily_order_volume")}
    source = dict(lake.query("SELECT ordered_on, COUNT(*) FROM orders GROUP BY ordered_on"))
    assert rows == source
    assert sum(rows.values()) == lake.query("SELECT COUNT(*) FROM orders")[0][0]


def test_product_stock_matches_the_source(lake, build, spark):
    rows = {r["sku"]: (r["stock"], r["units_on_open_orders"])
            for r in _model_rows(spark, lake, "product_stock")}
    source = {sku: (stock, int(units)) for sku, stock, units in lake.query(
        "SELECT p.sku, p.stock, COALESCE(SUM(IF(o.status IN ('new', 'paid'), o.quantity, 0)), 0)"
        " FROM products p LEFT JOIN orders o ON o.sku = p.sku GROUP BY p.sku, p.stock")}
    assert rows == source


def test_asset_graph_links_changelog_targets_and_models(lake, build):
    graph = build["defs"].resolve_asset_graph()
    server, db = lake.server_name, lake.db

    def parents(key: dg.AssetKey) -> set[dg.AssetKey]:
        return set(graph.get(key).parent_keys)

    target = {t: dg.AssetKey([server, db, t]) for t in ("customers", "products", "orders")}
    assert parents(_model_key(lake, "customer_order_totals")) == {target["customers"],
                                                                  target["orders"]}
    assert parents(_model_key(lake, "daily_order_volume")) == {target["orders"]}
    assert parents(_model_key(lake, "product_stock")) == {target["products"], target["orders"]}
    assert dg.AssetKey([server, "changelog"]) in parents(target["orders"])
    assert graph.get(_model_key(lake, "product_stock")).group_name == f"{server}_analytics"


def test_models_are_iceberg_tables_in_the_lake_catalog(lake, build, spark):
    """Any engine reading the catalog sees the models: Iceberg tables with one snapshot per
    build, the stale table of an "earlier build" replaced by a newer snapshot."""
    for model in MODELS:
        table = _model_table(spark, lake, model)
        details = {r.col_name: r.data_type for r in spark.sql(
            f"DESCRIBE TABLE EXTENDED {table}").collect()}
        assert details["Provider"] == "iceberg", (model, details)
        snapshots = spark.sql(f"SELECT operation FROM {table}.snapshots").collect()
        assert snapshots, model
    volume = spark.table(_model_table(spark, lake, "daily_order_volume"))
    assert "extra" not in volume.columns
    assert volume.where("ordered_on = DATE'1999-01-01'").count() == 0
    history = spark.sql(f"SELECT * FROM {_model_table(spark, lake, 'daily_order_volume')}"
                        ".history").collect()
    assert len(history) == 2  # the stale table's snapshot, then dbt's replacement


def test_run_vars_give_dbt_the_lake_catalog_as_its_default(lake):
    """What ``python -m cdc_platform.defs.dbt.project vars`` prints for a run by hand."""
    variables = dbt_project.run_vars(lake.settings, lake.db)
    conf = variables["cdc_spark_conf"]
    properties = catalog_properties(lake.settings.warehouse.url, lake.settings.warehouse.catalog)
    assert conf["spark.sql.defaultCatalog"] == "lake"
    assert conf["spark.sql.catalog.lake"] == SPARK_CATALOG
    assert {k: conf[f"spark.sql.catalog.lake.{k}"] for k in properties} == properties
    assert conf["spark.jars"].endswith(".jar") and "iceberg" in conf["spark.sql.extensions"]
    assert variables["cdc_inventory_schema"] == f"{lake.server_name}_{lake.db}"
    assert variables["cdc_models_schema"] == f"{lake.server_name}_analytics"


def test_without_the_inventory_tables_the_location_loads_without_dbt_assets(cdc_env):
    cdc_env.execute("CREATE TABLE customers (id INT PRIMARY KEY)")
    defs = build_definitions(cdc_env.settings)
    keys = defs.resolve_asset_graph().get_all_asset_keys()
    assert dg.AssetKey([cdc_env.server_name, cdc_env.db, "customers"]) in keys
    assert not any("analytics" in key.path for key in keys)
    with pytest.raises(Exception, match=dbt_defs.JOB_NAME):
        defs.resolve_job_def(dbt_defs.JOB_NAME)


def test_project_dir_can_be_relocated(monkeypatch, tmp_path: Path):
    monkeypatch.setenv(dbt_project.PROJECT_DIR_ENV, str(tmp_path))
    assert dbt_project.project_dir() == tmp_path


def test_a_captured_database_in_the_models_namespace_is_refused(lake):
    """``create or replace table`` would overwrite its lake tables: refused at load, by name."""
    tables = [TableSchema(db, table, (ColumnSpec("id", "int"),), ("id",))
              for db in (lake.db, "analytics") for table in dbt_project.INVENTORY_TABLES]
    with pytest.raises(ValueError, match=f"'analytics'.*'{lake.server_name}_analytics'"):
        dbt_defs.build(lake.settings, tables)


def _with_billing_source(settings: Any) -> Any:
    """``settings`` and a second source of the deployment capturing the billing tables."""
    source = settings.source
    tables = source.capture.tables.model_copy(update={"include": (r"billing\..*",),
                                                      "exclude": ()})
    billing = source.model_copy(update={
        "server_name": f"{source.server_name}_billing", "server_id": source.server_id + 1,
        "capture": source.capture.model_copy(update={"tables": tables})})
    return settings.model_copy(update={"sources": (source, billing)})


def test_another_sources_billing_tables_feed_the_joined_model(lake):
    """Two sources feeding one model: the inventory source's dbt assets take the billing
    source's target keys as the parents of ``customer_billing`` (the config names which source
    captures billing), and the lineage check accepts them."""
    deployment = _with_billing_source(lake.settings)
    inventory = deployment.for_source(lake.server_name)
    billing = deployment.server_names[1]
    assert dbt_project.billing_server(inventory) == billing
    assert dbt_project.billing_server(deployment.for_source(billing)) is None
    assert dbt_project.run_vars(inventory, lake.db)["cdc_billing_schema"] == \
        f"{billing}_billing"
    tables = [TableSchema(lake.db, table, (ColumnSpec("id", "int"),), ("id",))
              for table in dbt_project.INVENTORY_TABLES]
    graph = dbt_defs.build(inventory, tables).resolve_asset_graph()
    assert set(graph.get(_model_key(lake, "customer_billing")).parent_keys) == {
        dg.AssetKey([lake.server_name, lake.db, "customers"]),
        dg.AssetKey([billing, "billing", "invoices"]),
        dg.AssetKey([billing, "billing", "payments"]),
    }


def test_without_a_billing_source_the_joined_model_is_disabled(lake, build):
    assert dbt_project.billing_server(lake.settings) is None
    keys = build["defs"].resolve_asset_graph().get_all_asset_keys()
    assert _model_key(lake, "customer_billing") not in keys
