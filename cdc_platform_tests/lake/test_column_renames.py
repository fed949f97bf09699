"""Column renames in the lake, from a landing zone written by hand (no engine): older segments
are read under the new names, the Iceberg column is renamed (its data files keep their values),
and a renamed key column stays the key. The engine side and the real server are in
cdc_platform_tests/capture/ddl/test_column_renames.py."""

from __future__ import annotations

from decimal import Decimal

import pytest

from cdc_platform.capture.schema import ColumnSpec
from cdc_platform.lake.changelog import TableChangelog
from cdc_platform.lake.iceberg.properties import RENAMED_THROUGH_PROPERTY
from cdc_platform.lake.iceberg.schema import SchemaEvolutionError, evolve
from cdc_platform.lake.merge import materialise
from cdc_platform_tests.lake.helpers import (
    SERVER,
    materialise_table,
    rows_of,
    schema,
    target_table,
)
from cdc_platform_tests.lake.test_snapshot_records import assertion
from cdc_platform_tests.lake.third_party import assert_third_party_reads_same

BEFORE = schema("items")  # id, name, amount
AFTER = schema("items", ColumnSpec("id", "int"), ColumnSpec("title", "string"),
               ColumnSpec("amount", "decimal", 10, 2))


def _rows(spark, warehouse, table_schema=AFTER):
    table = target_table(spark, warehouse, table_schema)
    assert_third_party_reads_same(spark, table)
    return rows_of(table.read())


def test_segments_before_and_after_a_rename_in_one_batch(spark, landing, warehouse):
    landing.segment(BEFORE, [("c", {"id": i, "name": f"n{i}", "amount": Decimal(i)})
                             for i in range(1, 4)])
    position = landing.rename_columns(BEFORE, ("name", "title"))
    landing.segment(AFTER, [("u", {"id": 1, "title": "one", "amount": Decimal("1.5")}),
                            ("c", {"id": 4, "title": "n4", "amount": Decimal(4)})])
    changelog = TableChangelog.open(landing.url, SERVER, "shop", "items")
    [record] = changelog.column_renames(landing.next_pos)
    assert record.position == position and record.renames == (("name", "title"),)
    batch, newest = changelog.batch(spark, None, landing.next_pos, renames=[record])
    assert newest is not None and list(newest.column_names) == ["id", "title", "amount"]
    assert batch is not None and sorted(r.title for r in batch.collect()) == [
        "n1", "n2", "n3", "n4", "one"]

    result = materialise_table(spark, landing, warehouse, AFTER)
    rows = _rows(spark, warehouse)
    assert {k: r["title"] for k, r in rows.items()} == {1: "one", 2: "n2", 3: "n3", 4: "n4"}
    assert list(rows[1]) == ["id", "title", "amount"] and result.consumed_pos == position + 2
    table = target_table(spark, warehouse, AFTER)
    assert table.property(RENAMED_THROUGH_PROPERTY) == str(landing.next_pos - 1)


def test_a_rename_between_materialisations_renames_the_iceberg_column(spark, landing,
                                                                      warehouse):
    landing.segment(BEFORE, [("c", {"id": i, "name": f"n{i}", "amount": Decimal(i)})
                             for i in range(1, 4)])
    first = materialise_table(spark, landing, warehouse, BEFORE)
    landing.rename_columns(BEFORE, ("name", "title"))
    # a materialisation with the rename covered but no record after it: nothing to commit,
    # the table keeps its columns until records come
    assert not materialise_table(spark, landing, warehouse, AFTER).committed
    landing.segment(AFTER, [("u", {"id": 2, "title": "two", "amount": Decimal(2)})])
    second = materialise_table(spark, landing, warehouse, AFTER)
    assert second.schema_changed
    rows = _rows(spark, warehouse)
    assert {k: r["title"] for k, r in rows.items()} == {1: "n1", 2: "two", 3: "n3"}
    # time travel to before the rename: the old name
    old = target_table(spark, warehouse, AFTER).read(snapshot_id=first.snapshot_id)
    assert old.columns == ["id", "name", "amount"] and old.where("id = 2").first().name == "n2"


def test_a_swap_of_columns_of_different_types(spark, landing, warehouse):
    pair = schema("pair", ColumnSpec("id", "int"), ColumnSpec("a", "string"),
                  ColumnSpec("b", "int"))
    swapped = schema("pair", ColumnSpec("id", "int"), ColumnSpec("b", "string"),
                     ColumnSpec("a", "int"))
    landing.segment(pair, [("c", {"id": i, "a": f"a{i}", "b": 10 * i}) for i in (1, 2)])
    materialise_table(spark, landing, warehouse, pair)
    landing.segment(pair, [("c", {"id": 3, "a": "a3", "b": 30})])  # in the next batch, before
    landing.rename_columns(pair, ("a", "b"), ("b", "a"))
    landing.segment(swapped, [("u", {"id": 1, "b": "x", "a": 11})])
    # a run that evolved the table and died before its MERGE committed: the next run must
    # not swap the columns back
    records = TableChangelog.open(landing.url, SERVER, "shop", "pair").column_renames(
        landing.next_pos)
    evolve(target_table(spark, warehouse, swapped), swapped, records)
    materialise_table(spark, landing, warehouse, swapped)
    rows = _rows(spark, warehouse, swapped)
    assert rows == {1: {"id": 1, "b": "x", "a": 11}, 2: {"id": 2, "b": "a2", "a": 20},
                    3: {"id": 3, "b": "a3", "a": 30}}


def test_a_renamed_key_column_keeps_the_key_and_range_assertions(spark, landing, warehouse):
    old = schema("k", ColumnSpec("id", "int"), ColumnSpec("v", "int"))
    new = schema("k", ColumnSpec("code", "int"), ColumnSpec("v", "int"), key=("code",))
    landing.segment(old, [("c", {"id": i, "v": i}) for i in range(1, 9)])
    materialise_table(spark, landing, warehouse, old)
    # a chunk committed before the rename: (2, 5] re-read without 4 (an orphan)
    threshold = landing.next_pos
    landing.segment(old, [("r", {"id": 3, "v": 30}), ("r", {"id": 5, "v": 50}),
                          assertion((2,), (5,), threshold, old)], snapshot=True)
    landing.rename_columns(old, ("id", "code"))
    landing.segment(new, [("u", {"code": 1, "v": -1}), ("d", {"code": 8})])
    materialise_table(spark, landing, warehouse, new)
    table = target_table(spark, warehouse, new)
    assert table.primary_key() == ["code"]
    rows = {r["code"]: r["v"] for r in table.read().collect()}
    assert rows == {1: -1, 2: 2, 3: 30, 5: 50, 6: 6, 7: 7}
    assert_third_party_reads_same(spark, table)
    # and a real key change is still refused
    other = schema("k", ColumnSpec("code", "int"), ColumnSpec("v", "int"), key=("v",))
    landing.segment(other, [("c", {"code": 9, "v": 9})])
    with pytest.raises(ValueError, match=r"primary key of shop\.k changed from \['code'\]"):
        materialise_table(spark, landing, warehouse, other)


def test_a_rename_that_does_not_fit_the_table_changes_nothing(spark, landing, warehouse):
    landing.segment(BEFORE, [("c", {"id": 1, "name": "n1", "amount": Decimal(1)})])
    materialise_table(spark, landing, warehouse, BEFORE)
    table = target_table(spark, warehouse, BEFORE)
    table.lake.sql(f"ALTER TABLE {table.identifier} ADD COLUMN title string")  # (by hand)
    landing.rename_columns(BEFORE, ("name", "title"))
    landing.segment(AFTER, [("c", {"id": 2, "title": "t2", "amount": Decimal(2)})])
    clash = r"shop\.items: the column renames at GTID .* several columns the name\(s\) \['title'\]"
    with pytest.raises(SchemaEvolutionError, match=clash):
        materialise(spark, landing.url, warehouse, SERVER, AFTER, "shop", "items")
    assert table.read().columns == ["id", "name", "amount", "title"]


def test_a_dropped_column_leaves_the_target_without_a_later_change(spark, landing, warehouse):
    """A column record's drop, with no segment after it: the target drops the column (older
    snapshots keep it); a segment after the drop that has the column again keeps it."""
    landing.segment(BEFORE, [("c", {"id": i, "name": f"n{i}", "amount": Decimal(i)})
                             for i in range(1, 4)])
    materialise_table(spark, landing, warehouse, BEFORE)
    before = target_table(spark, warehouse, BEFORE).current()
    landing.rename_columns(BEFORE, dropped=("NAME",))  # (names compare case-insensitively)
    result = materialise_table(spark, landing, warehouse, BEFORE)
    assert result.schema_changed
    table = target_table(spark, warehouse, BEFORE)
    assert table.read().columns == ["id", "amount"]
    assert "name" in table.read(snapshot_id=before.snapshot_id).columns
    # Added again (ALTER TABLE .. ADD name), with rows: the segment after the drop decides.
    landing.segment(BEFORE, [("u", {"id": 1, "name": "again", "amount": Decimal(1)})])
    materialise_table(spark, landing, warehouse, BEFORE)
    assert {r["id"]: r["name"] for r in rows_of(table.read()).values()} == {
        1: "again", 2: None, 3: None}


def test_a_drop_in_the_same_batch_as_the_rows_before_it(spark, landing, warehouse):
    """Rows, then the DROP, in one batch (the newest segment predates the drop): the merge
    applies the rows, then drops the column."""
    landing.segment(BEFORE, [("c", {"id": 1, "name": "a", "amount": Decimal(1)})])
    landing.rename_columns(BEFORE, dropped=("name",))
    result = materialise_table(spark, landing, warehouse, BEFORE)
    assert result.committed and result.schema_changed
    assert rows_of(target_table(spark, warehouse, BEFORE).read()) == {
        1: {"id": 1, "amount": Decimal("1.00")}}


def _metadata_commits(table) -> int:
    """How many metadata files the table's log holds (each commit writes one)."""
    return table.lake.sql(
        f"SELECT count(*) FROM {table.metadata_table('metadata_log_entries')}").first()[0]


@pytest.mark.parametrize("old_name_added_again", [False, True], ids=["renames_and_adds",
                                                                      "old_name_reused"])
def test_several_column_changes_are_one_metadata_commit(spark, landing, warehouse,
                                                        old_name_added_again):
    """Renames, an added column, widened types and a dropped column (several ALTERs between
    two materialisations) are staged and committed once: one new metadata file, and the
    renamed, widened and kept columns keep their values. Adding a column under the old name
    of a renamed one is staged in the same transaction."""
    v1 = schema("many", ColumnSpec("id", "int"), ColumnSpec("a", "string"),
                ColumnSpec("b", "string"), ColumnSpec("ratio", "float"),
                ColumnSpec("amount", "decimal", 10, 2), ColumnSpec("gone", "string"))
    added = "a" if old_name_added_again else "extra"
    v2 = schema("many", ColumnSpec("id", "int"), ColumnSpec("title", "string"),
                ColumnSpec("b", "string"), ColumnSpec(added, "string"),
                ColumnSpec("ratio", "double"), ColumnSpec("amount", "decimal", 20, 2))
    landing.segment(v1, [("c", {"id": 1, "a": "a1", "b": "b1", "ratio": 0.5,
                                "amount": Decimal("1.25"), "gone": "g1"})])
    materialise_table(spark, landing, warehouse, v1)
    table = target_table(spark, warehouse, v2)
    landing.rename_columns(v1, ("a", "title"))
    landing.rename_columns(v1, ("b", "b2"))
    landing.rename_columns(v1, ("b2", "b"))  # back again: no net rename of b
    records = TableChangelog.open(landing.url, SERVER, "shop", "many").column_renames(
        landing.next_pos)
    before = _metadata_commits(table)

    assert evolve(table, v2, records)

    assert _metadata_commits(table) == before + 1
    assert table.property(RENAMED_THROUGH_PROPERTY) == str(records[-1].position)
    assert table.read().columns == ["id", "title", "b", added, "ratio", "amount"]
    assert rows_of(table.read()) == {1: {"id": 1, "title": "a1", "b": "b1", added: None,
                                         "ratio": 0.5, "amount": Decimal("1.25")}}
    landing.segment(v2, [("c", {"id": 2, "title": "t2", "b": "b2", added: "x2", "ratio": 0.25,
                                "amount": Decimal("123456789012345678.12")})])
    result = materialise_table(spark, landing, warehouse, v2)
    assert result.committed and not result.schema_changed  # (the renames are followed)
    rows = _rows(spark, warehouse, v2)
    assert rows[2] == {"id": 2, "title": "t2", "b": "b2", added: "x2", "ratio": 0.25,
                       "amount": Decimal("123456789012345678.12")}
    assert rows[1]["title"] == "a1" and rows[1][added] is None
