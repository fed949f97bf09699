"""dbt's own Spark session reads a lake table exactly as the lake does (``LakeTable.read``).

A dbt project of one ``select *`` model per lake table, in a temporary directory with the real
``profiles.yml``, is built once with the run vars Dagster passes (``project.run_vars``): dbt's
session gets the lake's catalog from them alone. Each model table, read back in the test's
session, must equal its lake table in schema and rows: after updates and deletes (position
delete files), an added column, every landing type, a composite key, names the catalog had to
change, and an empty table.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.config import Settings, parse_settings
from cdc_platform.defs.dbt import project as dbt_project
from cdc_platform.lake.iceberg.catalog import namespace_name, quote, table_name
from cdc_platform.lake.iceberg.lake import Lake
from cdc_platform.lake.iceberg.table import LakeTable
from cdc_platform.lake.merge import materialise
from cdc_platform_tests.lake.helpers import SERVER, Landing, schema

DB = "reads"
ODD = TableSchema(DB, "Odd `table`", (
    ColumnSpec("tenant", "string"), ColumnSpec("id", "uint64"),
    ColumnSpec("a.b c`d", "double"), ColumnSpec("f", "float"),
    ColumnSpec("price", "decimal", 12, 3), ColumnSpec("huge", "decimal", 60, 0),
    ColumnSpec("day", "date"), ColumnSpec("at", "datetime", scale=6),
    ColumnSpec("ts", "timestamp", scale=3), ColumnSpec("blob", "binary"),
    ColumnSpec("flag", "bit", 1),
), ("tenant", "id"))


def _odd_row(tenant: str, id_: int, x: float) -> dict[str, Any]:
    return {"tenant": tenant, "id": Decimal(id_), "a.b c`d": x, "f": x,
            "price": Decimal("1.125"), "huge": "1" * 50, "day": dt.date(1001, 1, 1),
            "at": dt.datetime(1500, 2, 3, 4, 5, 6, 7),
            "ts": dt.datetime(2025, 1, 1, tzinfo=dt.UTC), "blob": b"\x00\xff", "flag": 1}


def _fill(spark: Any, landing: Landing, warehouse: str) -> list[TableSchema]:
    """Three lake tables, each materialised in several snapshots; returns their schemas."""
    def run(table_schema: TableSchema) -> None:
        materialise(spark, landing.url, warehouse, SERVER, table_schema, DB, table_schema.table)

    v1 = schema("orders", db=DB)
    landing.segment(v1, [("c", {"id": i, "name": f"n{i}", "amount": Decimal(f"{i}.25")})
                         for i in range(1, 21)])
    run(v1)
    landing.segment(v1, [("u", {"id": 1, "name": "n1b", "amount": Decimal("9.99")}),
                         ("d", {"id": 2}), ("d", {"id": 3}),
                         ("c", {"id": 3, "name": "again", "amount": Decimal("3.00")}),
                         ("c", {"id": 21, "name": "new", "amount": None})])
    run(v1)
    v2 = schema("orders", *v1.columns, ColumnSpec("email", "string"), db=DB)
    landing.segment(v2, [("u", {"id": 1, "name": "n1c", "amount": Decimal("1.00"),
                                "email": "a@x"}), ("d", {"id": 21}), ("d", {"id": 4})])
    run(v2)

    landing.segment(ODD, [("c", _odd_row("x", 1, 1.0)), ("c", _odd_row("y", 1, 2.0)),
                          ("c", _odd_row("y", 2**64 - 1, 3.0))])
    run(ODD)
    landing.segment(ODD, [("u", _odd_row("x", 1, 1.5)),
                          ("d", {"tenant": "y", "id": Decimal(1)})])
    run(ODD)

    empty = schema("empty", db=DB)
    run(empty)
    return [v2, ODD, empty]


def _settings(root: Path, landing: Landing, warehouse: str) -> Settings:
    return parse_settings({
        "source": {"flavour": "mariadb", "host": "127.0.0.1", "user": "cdc", "server_id": 1,
                   "server_name": SERVER},
        "landing_zone": {"url": landing.url},
        "warehouse": {"url": warehouse},
        "spark": {"master": "local[2]"},
    }, f"test config in {root}")


def _copy_project(root: Path, tables: list[TableSchema]) -> Path:
    """A dbt project with the real profile and one ``select *`` model per lake table."""
    project = root / "dbt_copy"
    (project / "models").mkdir(parents=True)
    shutil.copy(dbt_project.project_dir() / "profiles.yml", project / "profiles.yml")
    (project / "dbt_project.yml").write_text(yaml.safe_dump({
        "name": "lake_reads", "version": "1.0.0", "config-version": 2,
        "profile": "cdc_platform", "model-paths": ["models"],
        "flags": {"send_anonymous_usage_stats": False},
        "models": {"lake_reads": {"+materialized": "table", "+file_format": "iceberg"}},
    }))
    sources = [{"name": f"t{i}", "identifier": table_name(t.table)}
               for i, t in enumerate(tables)]
    (project / "models" / "sources.yml").write_text(yaml.safe_dump({"version": 2, "sources": [{
        "name": "lake", "schema": "{{ var('cdc_inventory_schema') }}", "tables": sources}]}))
    for i in range(len(tables)):
        (project / "models" / f"copy_t{i}.sql").write_text(
            f"select * from {{{{ source('lake', 't{i}') }}}}\n")
    return project


@pytest.fixture(scope="module")
def built(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("dbt_reads")
    landing = Landing(root / "landing")
    warehouse = str(root / "warehouse")
    tables = _fill(spark, landing, warehouse)
    settings = _settings(root, landing, warehouse)
    project = _copy_project(root, tables)
    variables = dbt_project.run_vars(settings, DB)
    result = subprocess.run(
        [dbt_project.dbt_executable(), "build", "--project-dir", str(project),
         "--profiles-dir", str(project), "--vars", json.dumps(variables)],
        cwd=project, capture_output=True, text=True, timeout=900)
    return {"result": result, "tables": tables, "lake": Lake(spark, warehouse),
            "settings": settings}


def _model(built: dict[str, Any], index: int) -> str:
    lake: Lake = built["lake"]
    return (f"{quote(lake.catalog)}.{quote(dbt_project.models_schema(SERVER))}."
            f"{quote(f'copy_t{index}')}")


def test_dbt_builds_a_model_on_every_lake_table(built):
    result = built["result"]
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "PASS=3" in result.stdout


@pytest.mark.parametrize("index", [0, 1, 2], ids=["evolved", "every_type", "empty"])
def test_the_model_has_the_lake_tables_schema_and_rows(built, spark, index):
    assert built["result"].returncode == 0, built["result"].stdout[-4000:]
    table_schema: TableSchema = built["tables"][index]
    lake_table: LakeTable = LakeTable(built["lake"], SERVER, DB, table_schema.table)
    expected = lake_table.read(with_position=True)
    model = spark.table(_model(built, index))
    assert [(f.name, f.dataType) for f in model.schema.fields] == [
        (f.name, f.dataType) for f in expected.schema.fields]
    assert sorted(model.collect(), key=repr) == sorted(expected.collect(), key=repr)


def test_the_lake_tables_read_as_the_source_left_them(built):
    """The comparison above is not vacuous: the lake tables hold the merged rows."""
    lake: Lake = built["lake"]
    orders = {r.id: r for r in LakeTable(lake, SERVER, DB, "orders").read().collect()}
    assert set(orders) == set(range(1, 21)) - {2, 4}
    assert (orders[1].name, orders[1].email, orders[3].name, orders[5].email) == (
        "n1c", "a@x", "again", None)
    odd = LakeTable(lake, SERVER, DB, ODD.table).read().collect()
    assert sorted((r.tenant, r.id, r["a.b c`d"]) for r in odd) == [
        ("x", Decimal(1), 1.5), ("y", Decimal(2**64 - 1), 3.0)]
    assert table_name(ODD.table) != ODD.table  # the source identifier had to be the lake's
    assert LakeTable(lake, SERVER, DB, "empty").read().count() == 0


def test_the_sources_namespace_is_the_lakes(built):
    assert dbt_project.run_vars(built["settings"], DB)["cdc_inventory_schema"] == \
        namespace_name(SERVER, DB) == f"{SERVER}_{DB}"
