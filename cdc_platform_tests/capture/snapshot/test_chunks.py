"""Keyset chunks: query shape (pure) and chunk keys (``snapshot/chunks.py``); reading real tables
chunk by chunk is ``reading/test_keyset.py``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.capture.snapshot.chunks import (
    ChunkedTable,
    ChunkKey,
    SkippedTable,
    chunk_key_for,
    range_ordered,
    schema_fingerprint,
)
from cdc_platform.capture.snapshot.conditions import Condition, UnsafeConditionError

ABC = TableSchema("shop", "t", (ColumnSpec("a", "int"), ColumnSpec("b", "int"),
                                ColumnSpec("c", "string"), ColumnSpec("v", "float")))


def _table(nullable: tuple[bool, ...] = (False, True, True), condition: str | None = None
           ) -> ChunkedTable:
    """A table over ABC; ``condition`` is checked as a signal's text would be."""
    return ChunkedTable(ABC, ChunkKey(("a", "b", "c"), nullable, "surrogate key"),
                        None if condition is None else Condition(condition))


# ---- query shape -------------------------------------------------------------------------------


def test_composite_key_expands_lexicographically_with_the_leading_column_bounded() -> None:
    sql, params = _table((False, False, False)).chunk_query((1, 2, "x"), (9, 8, "z"), 5)
    assert sql == (
        "SELECT `a`, `b`, `c`, (`v` * 1e0) FROM `shop`.`t` WHERE "
        "`a` >= %s AND ((`a` > %s) OR (`a` = %s AND `b` > %s) OR "
        "(`a` = %s AND `b` = %s AND `c` > %s)) AND "
        "`a` <= %s AND ((`a` < %s) OR (`a` = %s AND `b` < %s) OR "
        "(`a` = %s AND `b` = %s AND `c` <= %s)) ORDER BY `a`, `b`, `c` LIMIT %s"
    )
    assert params == (1, 1, 1, 2, 1, 2, "x", 9, 9, 9, 8, 9, 8, "z", 5)


def test_null_key_parts_sort_first_and_are_never_parameters() -> None:
    sql, params = _table().chunk_query((1, None, None), (3, None, "q"), 2)
    assert "`a` >= %s AND ((`a` > %s) OR (`a` = %s AND `b` IS NOT NULL) OR " \
           "(`a` = %s AND `b` IS NULL AND `c` IS NOT NULL))" in sql
    # Nothing sorts below NULL, so "b < NULL" drops out; nullable parts admit NULL below a value.
    assert "`a` <= %s AND ((`a` < %s) OR (`a` = %s AND `b` IS NULL AND " \
           "(`c` IS NULL OR `c` <= %s)))" in sql
    assert None not in params and params == (1, 1, 1, 1, 3, 3, 3, "q", 2)


def test_first_chunk_is_unbounded_below_and_filter_is_parenthesised() -> None:
    sql, params = _table(condition=" v > 1 AND note LIKE 'a%' ").chunk_query(None, (5, 1, "a"), 3)
    assert "WHERE `a` <= %s AND" in sql
    # pymysql formats with ``sql % params``: a literal % must reach the server as one %.
    assert sql.endswith("AND (v > 1 AND note LIKE 'a%%') ORDER BY `a`, `b`, `c` LIMIT %s")
    assert (sql % tuple(repr(p) for p in params)).count("'a%'") == 1


def test_identifiers_are_quoted_and_percent_signs_escaped() -> None:
    schema = TableSchema("we`ird", "100%", (ColumnSpec("k`%s", "int"),), ("k`%s",))
    table = ChunkedTable(schema, ChunkKey(("k`%s",), (False,), "primary key"))
    sql, params = table.chunk_query((7,), None, 10)
    assert sql == ("SELECT `k``%%s` FROM `we``ird`.`100%%` WHERE `k``%%s` > %s "
                   "ORDER BY `k``%%s` LIMIT %s")
    assert params == (7, 10)
    assert table.max_key_query() == (
        "SELECT `k``%%s` FROM `we``ird`.`100%%` ORDER BY `k``%%s` DESC LIMIT 1", ())


def test_max_key_is_selected_as_exactly_as_the_chunk_rows() -> None:
    """The server prints FLOAT with 6 digits: the maximum read raw (0.3 for a stored
    0.30000001) would bound the last chunk below its own row."""
    schema = TableSchema("shop", "m", (ColumnSpec("f", "float"), ColumnSpec("d", "double"),
                                       ColumnSpec("v", "int")), ("f", "d"))
    table = ChunkedTable(schema, ChunkKey(("f", "d"), (False, False), "primary key"))
    assert table.max_key_query() == (
        "SELECT (`f` * 1e0), `d` FROM `shop`.`m` ORDER BY `f` DESC, `d` DESC LIMIT 1", ())
    assert table.chunk_query(None, None, 1)[0].startswith("SELECT (`f` * 1e0), `d`, `v` FROM")


@pytest.mark.parametrize(("column", "ordered"), [
    (ColumnSpec("k", "int"), True), (ColumnSpec("k", "uint64"), True),
    (ColumnSpec("k", "decimal", 38, 2), True), (ColumnSpec("k", "decimal", 39, 0), False),
    (ColumnSpec("k", "decimal", 65, 30), False), (ColumnSpec("k", "float"), True),
    (ColumnSpec("k", "double"), True), (ColumnSpec("k", "date"), True),
    (ColumnSpec("k", "datetime", scale=6), True), (ColumnSpec("k", "timestamp"), True),
    (ColumnSpec("k", "bit", 1), True), (ColumnSpec("k", "bit", 64), True),
    (ColumnSpec("k", "binary", 16), True), (ColumnSpec("k", "time"), False),
    (ColumnSpec("k", "string"), False), (ColumnSpec("k", "enum", values=("a",)), False),
    (ColumnSpec("k", "set", values=("a",)), False),
], ids=lambda v: f"{v.kind}{v.precision or ''}" if isinstance(v, ColumnSpec) else str(v))
def test_range_assertions_follow_the_landed_type_as_the_lake_does(column: ColumnSpec,
                                                                  ordered: bool) -> None:
    """Range assertions only for keys the lake accepts them on (it refuses text keys: a DECIMAL
    above 38 digits lands as text, whatever its kind)."""
    pytest.importorskip("pyspark")
    from cdc_platform.lake.verdicts import unordered_key_columns

    assert range_ordered(column) is ordered
    schema = TableSchema("shop", "t", (column, ColumnSpec("v", "int")), ("k",))
    assert (unordered_key_columns(schema) == []) is ordered
    table = ChunkedTable(schema, ChunkKey(("k",), (False,), "primary key"))
    assert table.range_assertions_allowed is ordered


def test_unsafe_filters_never_reach_sql() -> None:
    with pytest.raises(UnsafeConditionError):
        _table(condition="1=1) OR (1=1")


@given(text=st.one_of(st.sampled_from(["v > 1", "1=1) OR (1=1", "1; DROP TABLE t", ""]),
                      st.text(max_size=40)))
def test_text_nobody_checked_never_becomes_sql(text: str) -> None:
    """Only a Condition is embedded in a SELECT: a plain str is refused, however harmless it
    looks, so a caller cannot skip the check by passing the text along."""
    key = ChunkKey(("a", "b", "c"), (False, True, True), "surrogate key")
    with pytest.raises(TypeError, match="must be a Condition"):
        ChunkedTable(ABC, key, text)
    try:
        condition = Condition(text)
    except UnsafeConditionError:
        return
    sql, _ = ChunkedTable(ABC, key, condition).chunk_query(None, None, 3)
    assert sql.endswith(f"WHERE ({condition.sql.replace('%', '%%')}) ORDER BY `a`, `b`, `c` "
                        "LIMIT %s")


def test_chunk_key_choice_and_skip_statuses() -> None:
    with_pk = TableSchema("shop", "orders", (ColumnSpec("id", "int"), ColumnSpec("j", "json")),
                          ("id",))
    no_pk = TableSchema("shop", "log", with_pk.columns)
    assert chunk_key_for(with_pk) == ChunkKey(("id",), (False,), "primary key")
    assert chunk_key_for(with_pk, "id") == ChunkKey(("id",), (False,), "primary key")
    assert chunk_key_for(no_pk, "id", {"id"}) == ChunkKey(("id",), (True,), "surrogate key")
    skipped = chunk_key_for(no_pk)
    assert isinstance(skipped, SkippedTable)
    assert str(skipped) == "shop.log: skipped: no primary key and no surrogate key (set capture.surrogate_keys)"
    for schema, key, reason in [
        (with_pk, "j", "has a primary key (id)"),
        (no_pk, "nope", "'nope' does not exist"),
        (no_pk, "j", "json, which has no order"),
        (no_pk, ("id", "id"), "names a column twice"),
    ]:
        result = chunk_key_for(schema, key)
        assert isinstance(result, SkippedTable) and reason in result.reason


def test_fingerprint_changes_with_columns_not_with_table_name() -> None:
    assert schema_fingerprint(ABC) == schema_fingerprint(
        TableSchema("other", "name", ABC.columns))
    assert schema_fingerprint(ABC) != schema_fingerprint(
        TableSchema("shop", "t", ABC.columns[:3] + (ColumnSpec("v", "double"),)))
