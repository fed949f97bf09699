"""The dbt project on a real lake: MariaDB inventory -> capture -> lake tables -> dbt (Spark).

One lake and one ``dbt build`` (through Dagster, as production runs it) per module: dbt on Spark
takes tens of seconds here, so every assertion about the models reads that one build.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from cdc_platform.definitions import build_definitions
from cdc_platform.defs.dbt import definitions as dbt_defs
from cdc_platform.defs.dbt import project as dbt_project
from cdc_platform.demo.inventory import create_schema, load_initial_data
from cdc_platform.devservices.mariadb import MariaDBServer
from cdc_platform.lake.merge import materialise
from cdc_platform_tests.conftest import CdcEnv

MODELS = ("customer_order_totals", "daily_order_volume", "product_stock")
_lakes = itertools.count(1)


@pytest.fixture(scope="module")
def lake(mariadb: MariaDBServer, spark: Any, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[CdcEnv]:
    """An inventory database captured and materialised twice (a base, then deltas with updates,
    deletes and cancellations), so the dbt sources read folded merge-on-read tables."""
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
                    table, compaction_ratio=10)


@pytest.fixture(scope="module")
def build(lake: CdcEnv, spark: Any) -> dict[str, Any]:
    """The ``build_dbt_models`` job, run once in process on a test Dagster instance.

    A stale ``daily_order_volume`` from an "earlier build" is left in the warehouse first: the
    run registers it, and dbt must replace its files, not add to them.
    """
    stale = dbt_project.models_location(lake.settings).join("daily_order_volume").spark_uri
    spark.sql("SELECT DATE'1999-01-01' AS ordered_on, 42L AS order_count").write.parquet(stale)
    defs = build_definitions(lake.settings)
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def(dbt_defs.JOB_NAME).execute_in_process(
            instance=instance, raise_on_error=False)
        materialized = {e.asset_key for e in result.get_asset_materialization_events()}
    return {"result": result, "materialized": materialized, "defs": defs}


def _model_key(env: CdcEnv, model: str) -> dg.AssetKey:
    return dg.AssetKey([env.server_name, "analytics", model])


def _model_rows(spark: Any, env: CdcEnv, model: str) -> list[dict[str, Any]]:
    location = dbt_project.models_location(env.settings).join(model).spark_uri
    return [row.asDict() for row in spark.read.parquet(location).collect()]


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


def test_the_next_run_registers_the_lake_and_the_models_built_before(lake, build, spark):
    """The catalog file of the next run, read as the dbt hook reads it, in another session."""
    manifest_path = dbt_project.prepare(dbt_project.dbt_project(lake.server_name, lake.db),
                                        lake.server_name, lake.db)
    statements, missing = dbt_project.catalog_statements(
        lake.settings, json.loads(manifest_path.read_text()))
    assert missing == []
    catalog = dbt_project.write_catalog(lake.settings, statements)
    rows = spark.sql(f"select get_json_object(value, '$.statement') as s from "
                     f"text.`{catalog.spark_uri}` order by cast(get_json_object(value, "
                     f"'$.seq') as int)").collect()
    assert [r.s for r in rows] == statements
    models = [s for s in statements if s.startswith("CREATE TABLE IF NOT EXISTS `analytics`")]
    assert len(models) == len(MODELS)
    for statement in statements:
        spark.sql(statement)
    assert spark.table("analytics.product_stock").count() == 25
    orders = spark.table(f"{lake.server_name}_{lake.db}.orders")
    assert orders.count() == lake.query("SELECT COUNT(*) FROM orders")[0][0]


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
