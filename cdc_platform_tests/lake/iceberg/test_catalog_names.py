"""A source table's name in the catalog: the real name wherever the catalog accepts it, a slug
and a hash elsewhere, and the real names as table properties of every target."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_platform.lake.iceberg.catalog import catalog_name, quote
from cdc_platform.lake.iceberg.lake import Lake
from cdc_platform.lake.iceberg.properties import (
    SOURCE_DATABASE_PROPERTY,
    SOURCE_SERVER_PROPERTY,
    SOURCE_TABLE_PROPERTY,
)
from cdc_platform.lake.iceberg.table import LakeTable
from cdc_platform_tests.lake.helpers import SERVER, materialise_table, schema


@pytest.mark.parametrize(("name", "unicode_names", "expected"), [
    ("orders", False, "orders"), ("orders", True, "orders"),
    ("ünï", True, "ünï"), ("日本語_表", True, "日本語_表"),
    ("Ünï", True, None), ("order-items", True, None), ("a b", True, None), ("", True, None),
])
def test_the_real_name_is_kept_where_the_catalog_accepts_it(name, unicode_names, expected):
    got = catalog_name(name, unicode_names)
    if expected is not None:
        assert got == expected
    else:  # a slug and a hash: ASCII letters, digits and "_"
        assert got != name and got.isascii() and got.replace("_", "").isalnum()
    assert catalog_name("ünï") != "ünï"  # Hive, Glue, REST: the ASCII rule


@given(st.lists(st.text(min_size=1, max_size=6), min_size=2, max_size=2, unique=True),
       st.booleans())
def test_two_names_never_share_a_catalog_name(pair, unicode_names):
    assert catalog_name(pair[0], unicode_names) != catalog_name(pair[1], unicode_names)


def test_a_target_has_its_real_name_and_records_its_source(spark, landing, warehouse):
    items = schema("ünï")
    landing.segment(items, [("c", {"id": 1, "name": "a", "amount": Decimal("1.00")})])
    materialise_table(spark, landing, warehouse, items)
    table = LakeTable(Lake(spark, warehouse), SERVER, items.database, "ünï")
    assert table.name == "ünï" and table.exists()
    assert table.read().count() == 1
    assert (table.property(SOURCE_SERVER_PROPERTY), table.property(SOURCE_DATABASE_PROPERTY),
            table.property(SOURCE_TABLE_PROPERTY)) == (SERVER, items.database, "ünï")


def test_a_target_made_under_the_ascii_name_before_keeps_it(spark, warehouse):
    lake = Lake(spark, warehouse)
    legacy = catalog_name("ïtems")
    namespace = LakeTable(lake, SERVER, "db", "x").namespace
    lake.sql(f"CREATE NAMESPACE IF NOT EXISTS {quote(lake.catalog)}.{quote(namespace)}")
    lake.sql(f"CREATE TABLE {quote(lake.catalog)}.{quote(namespace)}.{quote(legacy)} (id int) "
             "USING iceberg")
    assert LakeTable(lake, SERVER, "db", "ïtems").name == legacy
    assert LakeTable(lake, SERVER, "db", "ötems").name == "ötems"
