"""Column renames: read from the ALTER TABLE text (pure), composed over a table's history the
way the server applies them (simultaneously per statement), recorded in the landing zone; and
on the real server: a renamed column keeps every value in the target, with no re-snapshot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_platform.capture.ddl.column_renames import record_column_renames, renamed_columns
from cdc_platform.capture.ddl.parse import parse_table_ddl
from cdc_platform.capture.ddl.stale import stale_tables
from cdc_platform.capture.ddl.stale_markers import read_markers
from cdc_platform.capture.landing.records import ColumnRenames, column_mapping, renamed_schema
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.lake.changelog import TableChangelog
from cdc_platform_tests.conftest import CdcEnv


def renames_of(query: str) -> tuple[tuple[str, str], ...]:
    ddl = parse_table_ddl(query, "s")
    assert ddl is not None, query
    return renamed_columns(ddl)


CASES: dict[str, tuple[tuple[str, str], ...]] = {
    "ALTER TABLE t RENAME COLUMN a TO b": (("a", "b"),),
    "ALTER TABLE `s`.`t` RENAME COLUMN `a b` TO `c``d`": (("a b", "c`d"),),
    "ALTER TABLE t RENAME COLUMN a TO b, RENAME COLUMN b TO a": (("a", "b"), ("b", "a")),
    "ALTER TABLE t RENAME COLUMN IF EXISTS a TO b": (("a", "b"),),
    "ALTER TABLE t CHANGE a b INT": (("a", "b"),),
    "ALTER TABLE t CHANGE COLUMN IF EXISTS a b INT NOT NULL, ADD INDEX (b)": (("a", "b"),),
    "ALTER TABLE t CHANGE a a BIGINT": (),
    "ALTER TABLE t RENAME COLUMN a TO A": (("a", "A"),),
    "ALTER TABLE t MODIFY a BIGINT, RENAME INDEX i TO j, RENAME KEY k TO l": (),
    "ALTER TABLE t /* RENAME COLUMN x TO y, */ ADD COLUMN c INT -- RENAME COLUMN p TO q\n": (),
    "ALTER TABLE t ADD COLUMN c INT COMMENT 'RENAME COLUMN a TO b'": (),
    "ALTER TABLE t RENAME TO u, RENAME COLUMN a TO b": (),  # the table is renamed: re-snapshot
    "RENAME TABLE t TO u": (),
    "ALTER TABLE t RENAME COLUMN id TO `key`, CHANGE `name` title VARCHAR(9)": (
        ("id", "key"), ("name", "title")),
}


@pytest.mark.parametrize("query", list(CASES))
def test_renames_read_from_the_statement(query: str) -> None:
    assert renames_of(query) == CASES[query]


def _record(position: int, *renames: tuple[str, str]) -> ColumnRenames:
    return ColumnRenames("s", "t", f"0-1-{position}", position, tuple(renames))


def test_mapping_composes_statements_and_swaps_within_one() -> None:
    history = [_record(3, ("a", "b"), ("b", "a")), _record(5, ("B", "c")), _record(9, ("c", "d"))]
    assert column_mapping(["id", "a", "b"], history) == {"a": "d", "b": "a"}
    assert column_mapping(["id", "a", "b"], history[1:]) == {"b": "d"}
    assert column_mapping(["id"], history) == {}
    with pytest.raises(ValueError, match=r"GTID 0-1-3 .*several columns"):
        column_mapping(["a", "b"], [_record(3, ("a", "b"))])


def test_a_renamed_key_column_renames_the_key() -> None:
    schema = TableSchema("s", "t", (ColumnSpec("id", "int"), ColumnSpec("a", "string")), ("id",))
    renamed = renamed_schema(schema, [_record(3, ("ID", "code"))])
    assert list(renamed.column_names) == ["code", "a"] and renamed.primary_key == ("code",)
    assert renamed.columns[0].kind == "int"


# ---- against a simulation of the server ---------------------------------------------------

NAMES = ["a", "b", "c", "d", "e"]
SPELLINGS = ["RENAME COLUMN {old} TO {new}", "RENAME COLUMN `{old}` TO `{new}`",
             "CHANGE {old} {new} INT", "CHANGE COLUMN `{old}` {new} VARCHAR(8) NULL",
             "RENAME /* c */ COLUMN {old} TO {new}"]
OTHER_CLAUSES = ["ADD COLUMN z{n} INT", "ADD INDEX i{n} (id)", "RENAME INDEX i{n} TO j{n}",
                 "MODIFY id BIGINT", "COMMENT 'RENAME COLUMN a TO b'"]


@st.composite
def histories(draw: Any) -> tuple[list[str], list[dict[str, str]]]:
    """ALTER statements of valid simultaneous renames over columns a..c, and what each does
    to the table as the server applies it (each old name refers to the table before it)."""
    columns = ["a", "b", "c"]
    statements, effects = [], []
    for n in range(draw(st.integers(1, 4))):
        olds = draw(st.lists(st.sampled_from(columns), min_size=1, max_size=3, unique=True))
        kept = [c for c in columns if c not in olds]
        news = draw(st.lists(st.sampled_from([x for x in NAMES if x not in kept]),
                             min_size=len(olds), max_size=len(olds), unique=True))
        clauses = [draw(st.sampled_from(SPELLINGS)).format(old=o, new=w)
                   for o, w in zip(olds, news, strict=True)]
        for clause in draw(st.lists(st.sampled_from(OTHER_CLAUSES), max_size=2)):
            clauses.insert(draw(st.integers(0, len(clauses))), clause.format(n=n))
        statements.append("ALTER TABLE t " + ", ".join(clauses))
        effects.append(dict(zip(olds, news, strict=True)))
        columns = kept + news
    return statements, effects


@settings(max_examples=300, deadline=None)
@given(histories())
def test_renames_follow_the_server_over_a_history(history: tuple[list[str], list[dict[str, str]]]
                                                  ) -> None:
    statements, effects = history
    records = [_record(10 * (i + 1), *renames_of(q)) for i, q in enumerate(statements)]
    for record, effect in zip(records, effects, strict=True):
        assert dict(record.renames) == {o: w for o, w in effect.items() if o != w}
    # where each original column is after the whole history, simulated
    where = {c: c for c in "abc"}
    for effect in effects:
        where = {o: effect.get(now, now) for o, now in where.items()}
    assert column_mapping(["id", "a", "b", "c"], records) == {
        o: w for o, w in where.items() if o != w}
    # and from any point of the history on (a segment written between two statements)
    for start in range(len(records)):
        names_then = {c: c for c in "abc"}
        for effect in effects[:start]:
            names_then = {o: effect.get(now, now) for o, now in names_then.items()}
        mapping = column_mapping(list(names_then.values()), records[start:])
        assert {names_then[o]: mapping.get(names_then[o], names_then[o]) for o in "abc"} == {
            names_then[o]: where[o] for o in "abc"}


# ---- records in the landing zone ------------------------------------------------------------

def test_records_are_written_for_captured_tables_and_removed_when_uncommitted(tmp_path: Path
                                                                              ) -> None:
    landing = LandingZone(str(tmp_path), "srv")
    ddl = parse_table_ddl("ALTER TABLE t RENAME COLUMN a TO b, RENAME COLUMN b TO a", "s")
    assert ddl is not None
    assert record_column_renames(landing, ddl, "0-1-7", 12, lambda db, t: t != "t") is None
    record = record_column_renames(landing, ddl, "0-1-7", 12, lambda db, t: True)
    assert record is not None and record.renames == (("a", "b"), ("b", "a"))
    assert record_column_renames(landing, ddl, "0-1-7", 12, lambda db, t: True) == record
    later = parse_table_ddl("ALTER TABLE t CHANGE a c INT", "s")
    assert later is not None
    record_column_renames(landing, later, "0-1-9", 20, lambda db, t: True)
    changelog = TableChangelog.open(str(tmp_path), "srv", "s", "t")
    assert [r.position for r in changelog.column_renames(21)] == [
        12, 20]
    # a checkpoint at next_pos 20 does not cover the second: readers leave it alone, and a
    # restart removes it (the replay records it again)
    assert TableChangelog.open(str(tmp_path), "srv", "s", "t").column_renames(20) == [record]
    landing.remove_uncommitted(20)
    assert TableChangelog.open(str(tmp_path), "srv", "s", "t").column_renames(99) == [record]


def test_an_excluded_column_renamed_to_a_captured_name_marks_the_target_stale() -> None:
    ddl = parse_table_ddl("ALTER TABLE t RENAME COLUMN secret TO shown, RENAME COLUMN a TO b",
                          "s")
    assert ddl is not None
    [verdict] = stale_tables(ddl, {}, lambda db, t, column: column != "secret")
    assert "column secret (excluded from capture) renamed to shown" in verdict.reason
    assert stale_tables(ddl, {}, lambda db, t, column: column not in ("secret", "shown")) == []


# ---- on the real server ---------------------------------------------------------------------

def _third_party_rows(env: CdcEnv, spark: Any, table: str, key: str = "id"
                      ) -> list[dict[str, Any]]:
    """The target's rows in key order, after checking that pyiceberg reads the same."""
    from cdc_platform_tests.lake.third_party import assert_third_party_reads_same

    lake_table = env.target(spark, table)
    assert_third_party_reads_same(spark, lake_table)
    return [r.asDict() for r in lake_table.read().orderBy(key).collect()]


def _materialise_and_reconcile(env: CdcEnv, spark: Any, table: str) -> Any:
    env.catch_up()
    result = env.materialise(spark, table)
    report = env.reconcile(spark, table)
    assert report.ok, report
    return result


def test_a_renamed_column_keeps_its_values_without_a_re_snapshot(cdc_env: CdcEnv,
                                                                  spark: Any) -> None:
    env = cdc_env
    env.execute("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40), price DECIMAL(10,2))",
                "INSERT INTO items SELECT seq, CONCAT('n', seq), seq / 4 FROM seq_1_to_30")
    first = _materialise_and_reconcile(env, spark, "items")
    env.query("ALTER TABLE items RENAME COLUMN name TO title")
    env.execute("UPDATE items SET price = price + 1 WHERE id <= 5",
                "UPDATE items SET title = 'renamed' WHERE id = 6",
                "INSERT INTO items VALUES (31, 'new', 7.5)")
    result = _materialise_and_reconcile(env, spark, "items")

    assert read_markers(env.landing) == []  # no re-snapshot for a rename
    [record] = TableChangelog.open(env.settings.landing_zone.url, env.server_name, env.db,
                                   "items").column_renames(result.consumed_pos + 1)
    assert record.renames == (("name", "title"),) and record.gtid
    assert result.schema_changed
    rows = _third_party_rows(env, spark, "items")
    assert list(rows[0]) == ["id", "title", "price"]
    assert [r["title"] for r in rows] == [f"n{i}" for i in range(1, 6)] + ["renamed"] + [
        f"n{i}" for i in range(7, 31)] + ["new"]
    # time travel to before the rename: the old name, the old values
    table = env.target(spark, "items")
    before = table.read(snapshot_id=first.snapshot_id)
    assert before.columns == ["id", "name", "price"]
    assert before.where("id = 6").first().name == "n6"


def test_a_swap_of_two_columns_keeps_both_columns_values(cdc_env: CdcEnv, spark: Any) -> None:
    env = cdc_env
    env.execute("CREATE TABLE pair (id INT PRIMARY KEY, a VARCHAR(10), b INT)",
                "INSERT INTO pair SELECT seq, CONCAT('a', seq), seq * 10 FROM seq_1_to_20")
    _materialise_and_reconcile(env, spark, "pair")
    env.query("ALTER TABLE pair RENAME COLUMN a TO b, RENAME COLUMN b TO a")
    env.execute("UPDATE pair SET a = a + 1 WHERE id = 1", "INSERT INTO pair VALUES (21, 'x', 5)")
    _materialise_and_reconcile(env, spark, "pair")
    assert read_markers(env.landing) == []
    rows = _third_party_rows(env, spark, "pair")
    assert rows[0] == {"id": 1, "b": "a1", "a": 11}
    assert rows[1] == {"id": 2, "b": "a2", "a": 20}
    assert rows[-1] == {"id": 21, "b": "x", "a": 5}


def test_a_renamed_key_column_is_the_same_key(cdc_env: CdcEnv, spark: Any) -> None:
    env = cdc_env
    env.execute("CREATE TABLE keyed (id INT PRIMARY KEY, v INT)",
                "INSERT INTO keyed SELECT seq, seq FROM seq_1_to_20")
    _materialise_and_reconcile(env, spark, "keyed")
    env.query("ALTER TABLE keyed RENAME COLUMN id TO code")
    env.execute("UPDATE keyed SET v = -v WHERE code <= 3", "DELETE FROM keyed WHERE code = 4",
                "INSERT INTO keyed VALUES (21, 21)")
    _materialise_and_reconcile(env, spark, "keyed")
    assert read_markers(env.landing) == []
    assert env.target(spark, "keyed").primary_key() == ["code"]
    rows = _third_party_rows(env, spark, "keyed", key="code")
    assert len(rows) == 20 and rows[0] == {"code": 1, "v": -1} and rows[3]["code"] == 5


def test_a_change_that_rewrites_values_is_marked_and_the_re_snapshot_makes_it_exact(
        cdc_env: CdcEnv, spark: Any) -> None:
    """CHANGE to a new name and a shorter type (sql_mode '' truncates instead of failing): the
    marker stays, the values stay under the new name meanwhile, the snapshot fixes them."""
    from cdc_platform_tests.capture.snapshot.reading.live_engine import (
        finish_and_reconcile,
        snapshot_reader,
        streaming,
    )

    env = cdc_env
    env.execute("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40), price INT)",
                "INSERT INTO items SELECT seq, CONCAT('name', seq), seq FROM seq_1_to_30")
    _materialise_and_reconcile(env, spark, "items")
    env.execute("SET SESSION sql_mode = ''", "ALTER TABLE items CHANGE name title VARCHAR(3)")
    env.execute("INSERT INTO items VALUES (31, 'new', 31)")
    env.catch_up()
    [marker] = read_markers(env.landing)
    assert "column name renamed to title and redefined as VARCHAR(3)" in marker.reason
    result = env.materialise(spark, "items")
    assert result.schema_changed
    rows = env.target_rows(spark, "items")
    assert [r["title"] for r in rows[:2]] + [rows[-1]["title"]] == ["name1", "name2", "new"]
    assert not env.reconcile(spark, "items").ok  # the source truncated them: stale
    with streaming(env):
        assert snapshot_reader(env, "items", chunk_size=16).run().status == "done"
    finish_and_reconcile(env, spark, "items")
    assert [r["title"] for r in env.target_rows(spark, "items")][:2] == ["nam", "nam"]
