"""Source names in the platform's other namespaces: table ids, paths, Dagster/catalog names.

Pure mappings, property-tested: every one injective and (ids, paths) reversible, with the plain
names of existing deployments mapped exactly as before.
"""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_platform.capture.landing.records import segment_metadata, table_schema_of_segment
from cdc_platform.capture.landing.zone import changelog_parts, tables_from_json, tables_to_json
from cdc_platform.capture.names import (
    AmbiguousTableError,
    joined_name,
    name_of_path_component,
    path_component,
    qualified_name,
    resolve_table_id,
    split_qualified_name,
    split_table_id,
    table_id,
    valid_name,
)
from cdc_platform.capture.schema import ColumnSpec, TableSchema

# What MySQL accepts in a quoted identifier: the BMP without U+0000 (names cannot end with a
# space, which these tests do not rely on). Awkward characters are over-represented.
_AWKWARD = st.sampled_from(list("./`%-_ ü\\*?[]{}:'\"#\t\u200b\u0301") + ["..", "A", "a"])
names = st.lists(
    st.one_of(_AWKWARD, st.characters(min_codepoint=1, max_codepoint=0xFFFF,
                                      exclude_categories=("Cs",))),
    min_size=1, max_size=12,
).map("".join)

AWKWARD_NAMES = ["ünï", "order-items", "2024 sales", "we.ird-db ü", "a`b", "`x`", "select",
                 "a/b", "..", ".", ".hidden", "_hidden", "100%", "a*b?[c]{d}", "c:d", "x y."]


@given(names, names)
def test_table_ids_round_trip(database, table):
    assert split_table_id(table_id(database, table)) == (database, table)


@given(st.lists(names, min_size=1, max_size=4))
def test_qualified_names_round_trip(parts):
    assert split_qualified_name(qualified_name(*parts), len(parts)) == tuple(parts)


@given(names, names)
def test_ids_without_a_dot_in_the_database_keep_the_plain_form(database, table):
    """Ids written before quoting existed (``f"{db}.{table}"``, split at the first dot) read
    the same: only a database with a dot, or a name starting with a backtick, is quoted."""
    if "." not in database and not database.startswith("`") and not table.startswith("`"):
        assert table_id(database, table) == f"{database}.{table}"
        assert split_table_id(f"{database}.{table}") == (database, table)


def test_a_dot_in_the_database_is_quoted():
    assert table_id("inventory", "orders") == "inventory.orders"
    assert table_id("my.db", "t") == "`my.db`.t"
    assert table_id("db", "t.x") == "db.t.x"
    assert split_table_id("`my.db`.t") == ("my.db", "t")
    assert split_table_id("`my``db`.`t`") == ("my`db", "t")
    assert table_id("a`b", "`c") == "a`b.```c`"
    for bad in ("nodot", "a.", ".t", "`a`.", "``"):
        with pytest.raises(ValueError):
            split_table_id(bad)
    # Not quoted ids: ids written before quoting existed, split at the first dot as then.
    assert split_table_id("db.`x") == ("db", "`x")
    assert split_table_id("`a`b.t") == ("`a`b", "t")


def test_plain_user_input_resolves_against_the_known_tables():
    known = ["shop.orders", "`my.db`.t", "a.b.c", "`a.b`.c"]
    assert resolve_table_id("shop.orders", known) == "shop.orders"
    assert resolve_table_id("`shop`.`orders`", known) == "shop.orders"
    assert resolve_table_id("my.db.t", known) == "`my.db`.t"
    assert resolve_table_id("`my.db`.`t`", known) == "`my.db`.t"
    assert resolve_table_id("a.`b.c`", known) == "a.b.c"
    assert resolve_table_id("`a.b`.c", known) == "`a.b`.c"
    assert resolve_table_id("shop.nothing", known) is None
    assert resolve_table_id("shop\\..*", known) is None  # a regular expression: not a name
    with pytest.raises(AmbiguousTableError, match="`my.db`.`table`"):
        resolve_table_id("a.b.c", known)


@given(names)
def test_path_components_are_single_safe_reversible_names(name):
    component = path_component(name)
    assert name_of_path_component(component) == name
    assert "/" not in component and "\\" not in component
    assert component not in (".", "..") and not component.startswith(".")
    assert not re.search(r"[*?\[\]{}:\s`'\"#]", component)


@given(names, names)
def test_path_components_are_injective(a, b):
    if a != b:
        assert path_component(a) != path_component(b)


def test_plain_names_keep_their_paths_and_awkward_ones_stay_inside():
    assert changelog_parts("inventory", "order_items") == ("changelog", "inventory",
                                                           "order_items")
    assert path_component("Order-Items.v2") == "Order-Items.v2"
    assert path_component("ünï") == "ünï"
    assert path_component("..") == "%2E."
    assert path_component("a/b") == "a%2Fb"
    assert path_component("100%") == "100%25"
    assert path_component("2024 sales") == "2024%20sales"
    with pytest.raises(ValueError, match="exclude the table"):
        path_component("\u200b" * 64)  # 64 zero-width spaces: 576 bytes escaped


def test_valid_names_are_dagster_names_and_distinct():
    outputs = {valid_name(n) for n in [*AWKWARD_NAMES, "a-b", "a_b", "A", "a"]}
    assert len(outputs) == len(AWKWARD_NAMES) + 4
    assert all(re.fullmatch(r"[A-Za-z0-9_]+", n) for n in outputs)
    assert valid_name("orders") == "orders" and valid_name("Orders") == "Orders"
    assert valid_name("ünï").startswith("uni_")
    # Spark's catalog ignores case: there, capitals are lossy too.
    assert valid_name("A", case_sensitive=False) != valid_name("a", case_sensitive=False)
    assert valid_name("a", case_sensitive=False) == "a"


@given(st.lists(names, min_size=1, max_size=4), st.lists(names, min_size=1, max_size=4))
def test_joined_names_are_valid_and_injective(a, b):
    assert re.fullmatch(r"[A-Za-z0-9_]+", joined_name(*a))
    if a != b:
        assert joined_name(*a) != joined_name(*b)


def test_joined_names_of_plain_names_are_dagster_defaults_and_ambiguous_joins_differ():
    assert joined_name("demo", "inventory", "orders") == "demo__inventory__orders"
    assert joined_name("s", "a", "b__c") != joined_name("s", "a__b", "c")
    assert joined_name("s", "a-b", "c") != joined_name("s", "a_b", "c")
    assert joined_name("s", "t_") != joined_name("s", "t", "")


def test_tables_json_is_keyed_by_the_schemas_own_ids():
    schema = TableSchema("my.db", "t", (ColumnSpec("id", "int"),), ("id",))
    legacy = json.dumps({"tables": {"my.db.t": schema.to_dict()}})  # the key of old files
    assert tables_from_json(legacy) == {"`my.db`.t": schema}
    assert tables_from_json(tables_to_json({"x": schema})) == {"`my.db`.t": schema}


def test_segment_metadata_keeps_database_and_table_apart():
    schema = TableSchema("my.db", "a.b", (ColumnSpec("id", "int"),), ("id",))
    metadata = segment_metadata(schema)
    assert table_schema_of_segment(metadata) == schema
    legacy = {k: v for k, v in metadata.items() if k not in (b"cdc.database", b"cdc.table_name")}
    legacy[b"cdc.table"] = b"shop.a.b"  # written before: database without a dot
    assert table_schema_of_segment(legacy).table == "a.b"


def test_the_engine_moves_directories_written_before_names_were_escaped(tmp_path):
    """A table `2024 sales` landed by an earlier engine (raw directory names) is moved to its
    escaped directory when the next engine takes the landing zone; plain names stay."""
    from cdc_platform.capture.landing.zone import LandingZone, snapshot_parts
    from cdc_platform.lake.changelog import TableChangelog

    landing = LandingZone(str(tmp_path), "s1")
    legacy = landing.root / "changelog" / "shop" / "2024 sales"
    legacy.mkdir(parents=True)
    (legacy / "00000000000000000001-00000000000000000002.parquet").write_bytes(b"old")
    plain = landing.root / "changelog" / "shop" / "orders"
    plain.mkdir()
    (landing.root / "snapshots" / "my db" / "t").mkdir(parents=True)
    new = landing.table_dir("shop", "2024 sales")
    new.mkdir()
    (new / "00000000000000000003-00000000000000000003.parquet").write_bytes(b"new")
    with landing.engine_lock():
        pass
    assert not legacy.exists() and plain.is_dir()
    assert sorted(p.name[:20] for p in new.iterdir()) == ["0" * 19 + "1", "0" * 19 + "3"]
    changelog = TableChangelog.open(str(tmp_path), "s1", "shop", "2024 sales")
    assert [s.first_pos for s in changelog.segments(None, None)] == [1, 3]
    assert landing.root.joinpath(*snapshot_parts("my db", "t")).is_dir()
    assert not (landing.root / "snapshots" / "my db").exists()
    with landing.engine_lock():  # nothing left to move
        assert landing.escape_legacy_dirs() == []


def test_capture_patterns_match_the_plain_text_or_the_table_id() -> None:
    """A database with a dot: Debezium-style `db.table` patterns and id patterns both work,
    and an exclude in either form wins."""
    from cdc_platform.capture.source import TableSelector

    plain = TableSelector(include=(r"db\.dot\.t\.dot",))
    quoted = TableSelector(include=(r"`db\.dot`\.t\.dot",))
    assert plain.captures("db.dot", "t.dot") and quoted.captures("db.dot", "t.dot")
    excluded = TableSelector(include=(".*",), exclude=(r"db\.dot\..*",))
    assert not excluded.captures("db.dot", "t.dot")
    columns = TableSelector(excluded_columns=(r"db\.dot\.t\.dot\.secret",))
    assert columns.excluded_columns_of("db.dot", "t.dot", ["id", "secret"]) == {"secret"}
