"""Lake tables registered by SQL read exactly what ``TargetTable.read`` reads."""

from __future__ import annotations

import datetime as dt
import itertools
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.lake.catalog import catalog_database, catalog_name, quote, target_table_sql
from cdc_platform.lake.merge import materialise
from cdc_platform.lake.table_format import TargetTable
from cdc_platform_tests.lake.helpers import SERVER, Landing, schema

_tables = itertools.count(1)


def _run(spark: SparkSession, landing: Landing, warehouse: str, table_schema: TableSchema,
         **kwargs: Any) -> None:
    materialise(spark, landing.url, warehouse, SERVER, table_schema, table_schema.database,
                table_schema.table, **kwargs)


def _registered(spark: SparkSession, target: TargetTable) -> DataFrame:
    statements = target_table_sql(target)
    assert statements, f"{target} has a version: it must be registrable"
    for statement in statements:
        spark.sql(statement)
    return spark.table(f"{quote(catalog_database(SERVER, target.database))}."
                       f"{quote(catalog_name(target.table))}")


def _assert_same(spark: SparkSession, target: TargetTable) -> DataFrame:
    view, expected = _registered(spark, target), target.read(spark)
    assert [(f.name, f.dataType) for f in view.schema.fields] == [
        (f.name, f.dataType) for f in expected.schema.fields]
    assert sorted(view.collect(), key=repr) == sorted(expected.collect(), key=repr)
    return view


@pytest.fixture
def landing(tmp_path: Path) -> Landing:
    return Landing(tmp_path / "landing")


@pytest.fixture
def warehouse(landing: Landing) -> str:
    return str(landing.root.with_name("warehouse"))


def _unique_db() -> str:
    return f"catalog{next(_tables)}"


def test_base_deltas_tombstones_and_an_added_column_fold_like_the_lake(spark, landing,
                                                                     warehouse):
    db = _unique_db()
    v1 = schema("orders", db=db)
    landing.segment(v1, [("c", {"id": i, "name": f"n{i}", "amount": Decimal(f"{i}.25")})
                         for i in range(1, 21)])
    _run(spark, landing, warehouse, v1)
    # delta 1: updates, deletes, a delete and re-insert of the same key
    landing.segment(v1, [("u", {"id": 1, "name": "n1b", "amount": Decimal("9.99")}),
                         ("d", {"id": 2}), ("d", {"id": 3}),
                         ("c", {"id": 3, "name": "again", "amount": Decimal("3.00")}),
                         ("c", {"id": 21, "name": "new", "amount": None})])
    _run(spark, landing, warehouse, v1, compaction_ratio=10)
    # delta 2, after ALTER TABLE ADD COLUMN: older file sets lack the column
    v2 = schema("orders", *v1.columns, ColumnSpec("email", "string"), db=db)
    landing.segment(v2, [("u", {"id": 1, "name": "n1c", "amount": Decimal("1.00"),
                                "email": "a@x"}),
                         ("d", {"id": 21}), ("d", {"id": 4})])
    _run(spark, landing, warehouse, v2, compaction_ratio=10)
    target = TargetTable(warehouse, SERVER, db, "orders")
    commit = target.current()
    assert [f.kind for f in commit.files] == ["base", "delta", "delta"]

    rows = {r.id: r for r in _assert_same(spark, target).collect()}
    assert set(rows) == set(range(1, 21)) - {2, 4}
    assert (rows[1].name, rows[1].email, rows[3].name) == ("n1c", "a@x", "again")
    assert rows[5].email is None


def test_every_landing_type_and_a_composite_key_with_awkward_names(spark, landing, warehouse):
    db = _unique_db()
    odd = TableSchema(db, "odd `table`", (
        ColumnSpec("tenant", "string"), ColumnSpec("id", "uint64"),
        ColumnSpec("a.b c`d", "double"), ColumnSpec("f", "float"),
        ColumnSpec("price", "decimal", 12, 3), ColumnSpec("huge", "decimal", 60, 0),
        ColumnSpec("day", "date"), ColumnSpec("at", "datetime", scale=6),
        ColumnSpec("ts", "timestamp", scale=3), ColumnSpec("blob", "binary"),
        ColumnSpec("flag", "bit", 1),
    ), ("tenant", "id"))

    def row(tenant: str, id_: int, x: float) -> dict[str, Any]:
        return {"tenant": tenant, "id": Decimal(id_), "a.b c`d": x, "f": x, "price":
                Decimal("1.125"), "huge": "1" * 50, "day": dt.date(1001, 1, 1),
                "at": dt.datetime(1500, 2, 3, 4, 5, 6, 7),
                "ts": dt.datetime(2025, 1, 1, tzinfo=dt.UTC), "blob": b"\x00\xff",
                "flag": 1}

    landing.segment(odd, [("c", row("x", 1, 1.0)), ("c", row("y", 1, 2.0)),
                          ("c", row("y", 2**64 - 1, 3.0))])
    _run(spark, landing, warehouse, odd)
    landing.segment(odd, [("u", row("x", 1, 1.5)), ("d", {"tenant": "y", "id": Decimal(1)})])
    _run(spark, landing, warehouse, odd, compaction_ratio=10)
    view = _assert_same(spark, TargetTable(warehouse, SERVER, db, "odd `table`"))
    assert view.count() == 2


def test_deltas_without_a_base_and_an_empty_table(spark, landing, warehouse):
    db = _unique_db()
    empty = schema("empty", db=db)
    landing.checkpoint()
    _run(spark, landing, warehouse, empty)
    assert _assert_same(spark, TargetTable(warehouse, SERVER, db, "empty")).count() == 0
    late = schema("late", db=db)
    landing.segment(late, [("c", {"id": 1, "name": "a", "amount": None}),
                           ("c", {"id": 2, "name": "b", "amount": None})])
    _run(spark, landing, warehouse, late)  # the first commit of `late` with files: a base
    landing.segment(late, [("d", {"id": 1})])
    _run(spark, landing, warehouse, late, compaction_ratio=10)
    assert [r.id for r in _assert_same(spark, TargetTable(warehouse, SERVER, db, "late"))
            .collect()] == [2]


def test_a_table_never_materialised_has_no_statements(warehouse):
    assert target_table_sql(TargetTable(warehouse, SERVER, "shop", "nothing")) == []


def test_the_statements_pin_the_version_they_were_made_from(spark, landing, warehouse):
    db = _unique_db()
    s = schema("pinned", db=db)
    landing.segment(s, [("c", {"id": 1, "name": "a", "amount": None})])
    _run(spark, landing, warehouse, s)
    target = TargetTable(warehouse, SERVER, db, "pinned")
    view = _registered(spark, target)
    landing.segment(s, [("c", {"id": 2, "name": "b", "amount": None})])
    _run(spark, landing, warehouse, s, compaction_ratio=10)
    assert [r.id for r in view.collect()] == [1]
    assert sorted(r.id for r in _registered(spark, target).collect()) == [1, 2]


def test_catalog_names_are_valid_and_distinct():
    assert catalog_name("orders") == "orders"
    assert catalog_name("a-b") != catalog_name("a_b")
    assert catalog_name("a-b").startswith("a_b_")
    assert catalog_name("odd `table`").replace("_", "").isalnum()
