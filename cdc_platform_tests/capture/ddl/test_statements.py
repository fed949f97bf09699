"""Statements the server runs behind a prefix (``SET STATEMENT ... FOR``, comments,
executable comments) are read as the statements they wrap, and every statement is placed:
table DDL, a row change logged as SQL, a dropped database, known to change no rows, or
unclassified, which marks the captured tables it may touch stale (``capture.ddl.statements``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_platform.capture.ddl.parse import TableDdl, parse_table_ddl
from cdc_platform.capture.ddl.stale import stale_after_statement, stale_tables
from cdc_platform.capture.ddl.statement_dml import StatementDml, parse_statement_dml
from cdc_platform.capture.ddl.statements import DatabaseDrop, Unclassified, classify_statement
from cdc_platform_tests.capture.ddl.test_stale import CASES, SCHEMAS

# Every prefix the server accepts before a statement, as DBAs, online schema tools, dump and
# migration tools write them ({} is the statement).
WRAPPERS = [
    "SET STATEMENT lock_wait_timeout=5 FOR {}",
    "SET STATEMENT max_statement_time=60, foreign_key_checks = 0 FOR {}",
    "set statement sql_mode='STRICT_ALL_TABLES,NO_ZERO_DATE' for {}",
    "SET STATEMENT x=(SELECT 1) FOR SET STATEMENT y=2 FOR {}",
    "/*!100100 {} */",
    "/*!50001 {}*/",
    "/*M!100100 {} */",
    "/*!{} */",
    "/* a comment */ {}",
    "-- a comment\n{}",
    "# a comment\n{}",
    "SET STATEMENT lock_wait_timeout=5 FOR /*!100100 {} */",
    "/*!100100 SET STATEMENT lock_wait_timeout=5 FOR */ {}",
]


def _verdicts(query: str) -> dict[str, tuple[bool, str]]:
    ddl = parse_table_ddl(query, "s")
    assert ddl is not None, query
    return {v.table_id: (v.gone, v.reason) for v in stale_tables(ddl, SCHEMAS)}


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("query", list(CASES))
def test_a_wrapped_ddl_makes_the_same_targets_stale(query: str, wrapper: str) -> None:
    assert _verdicts(wrapper.format(query)) == _verdicts(query)


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_the_issue_repros_are_seen(wrapper: str) -> None:
    truncate = classify_statement(wrapper.format("TRUNCATE TABLE ss.t"), "")
    assert isinstance(truncate, TableDdl) and truncate.tables == (("ss", "t"),)
    alter = parse_table_ddl(
        wrapper.format("ALTER TABLE ss.u ADD COLUMN z INT NOT NULL DEFAULT 5"), "")
    assert alter is not None
    assert [v.table_id for v in stale_tables(alter)] == ["ss.u"]


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_a_wrapped_row_change_logged_as_sql_is_seen(wrapper: str) -> None:
    dml = parse_statement_dml(wrapper.format("DELETE FROM d.t WHERE id = 1"), "")
    assert dml == StatementDml("DELETE", (("d", "t"),), exact=True)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(CASES)), st.lists(st.sampled_from(WRAPPERS), min_size=1,
                                               max_size=3))
def test_nested_wrappers_do_not_change_the_verdict(query: str, wrappers: list[str]) -> None:
    wrapped = query
    for wrapper in wrappers:
        if "*/" in wrapper and "*/" in wrapped:
            continue  # comments do not nest
        wrapped = wrapper.format(wrapped)
    assert _verdicts(wrapped) == _verdicts(query)


def test_text_after_a_comment_closer_outside_an_executable_comment_is_kept() -> None:
    # A "*/" outside an executable comment is two punctuation characters, not a closer.
    ddl = parse_table_ddl("ALTER TABLE t ADD COLUMN c INT AS (a */*x*/ 2)", "s")
    assert ddl is not None and [v.table_id for v in stale_tables(ddl)] == ["s.t"]


@pytest.mark.parametrize("query", [
    "GRANT SELECT ON d.* TO 'u'@'%'", "CREATE USER 'u'@'%' IDENTIFIED BY 'x'",
    "CREATE DATABASE d", "CREATE DATABASE IF NOT EXISTS d CHARACTER SET utf8mb4",
    "ALTER DATABASE d CHARACTER SET latin1",
    "CREATE OR REPLACE ALGORITHM=MERGE DEFINER=`root`@`localhost` SQL SECURITY INVOKER "
    "VIEW v AS SELECT * FROM t",
    "CREATE DEFINER=`root`@`localhost` TRIGGER trg BEFORE INSERT ON t FOR EACH ROW "
    "SET NEW.a = 1",
    "DROP VIEW IF EXISTS v", "CREATE INDEX i ON t (a)", "CREATE UNIQUE INDEX i ON t (a)",
    "DROP INDEX i ON t", "FLUSH PRIVILEGES", "ANALYZE TABLE t", "OPTIMIZE TABLE t",
    "CREATE DEFINER=`root`@`localhost` PROCEDURE p() BEGIN DELETE FROM t; END",
    "SET STATEMENT max_statement_time=5 FOR CREATE INDEX i ON t (a)",
    "/*!50001 CREATE ALGORITHM=UNDEFINED */ /*!50013 DEFINER=`root`@`localhost` */ "
    "/*!50001 VIEW `v` AS select 1 */",
    "RENAME USER a TO b", "SET PASSWORD FOR 'u'@'%' = PASSWORD('x')",
    "CREATE SEQUENCE s START WITH 1", "LOAD INDEX INTO CACHE t",
])
def test_statements_that_change_no_rows(query: str) -> None:
    assert classify_statement(query, "s") is None


@pytest.mark.parametrize(("query", "database", "verb"), [
    ("DROP DATABASE d", "d", "DROP DATABASE"),
    ("DROP SCHEMA IF EXISTS `d-1`", "d-1", "DROP DATABASE"),
    ("SET STATEMENT lock_wait_timeout=5 FOR DROP DATABASE d", "d", "DROP DATABASE"),
    ("/*!40000 DROP DATABASE `d` */", "d", "DROP DATABASE"),
    ("CREATE OR REPLACE DATABASE d", "d", "CREATE OR REPLACE DATABASE"),
])
def test_a_dropped_database_takes_every_captured_table_of_it(query: str, database: str,
                                                              verb: str) -> None:
    statement = classify_statement(query, "other")
    assert statement == DatabaseDrop(database, verb)
    captured = [(database, "a"), (database, "b"), ("other", "a")]
    stale = stale_after_statement(statement, captured)
    assert {(v.database, v.table) for v in stale} == {(database, "a"), (database, "b")}
    assert all(v.gone and verb in v.reason for v in stale)


def test_an_unclassified_statement_marks_the_captured_tables_it_names() -> None:
    statement = classify_statement("FROBNICATE TABLE t, o.u WITH care", "s")
    assert isinstance(statement, Unclassified) and statement.wide
    captured = [("s", "t"), ("o", "U"), ("s", "other"), ("x", "t")]
    stale = stale_after_statement(statement, captured)
    assert {(v.database, v.table) for v in stale} == {("s", "t"), ("o", "U")}
    assert all("FROBNICATE" in v.reason and not v.gone for v in stale)


def test_an_unclassified_statement_naming_no_captured_table_marks_its_databases() -> None:
    statement = classify_statement("EXECUTE IMMEDIATE 'TRUNCATE t'", "s")
    assert isinstance(statement, Unclassified)
    stale = stale_after_statement(statement, [("s", "a"), ("s", "b"), ("o", "c")])
    assert {(v.database, v.table) for v in stale} == {("s", "a"), ("s", "b")}


@pytest.mark.parametrize("query", ["REPAIR TABLE t", "DROP SEQUENCE t", "ALTER SEQUENCE t "
                                   "RESTART", "DROP INDEX `PRIMARY` ON t"])
def test_statements_on_named_tables_mark_only_those(query: str) -> None:
    statement = classify_statement(query, "s")
    assert isinstance(statement, Unclassified) and not statement.wide
    assert [v.table_id for v in stale_after_statement(statement, [("s", "t"), ("s", "u")])] == [
        "s.t"]
    assert stale_after_statement(statement, [("s", "u")]) == []
