"""Row changes logged as statements: which tables they write (capture/ddl/statement_dml.py)."""

from __future__ import annotations

import pytest

from cdc_platform.capture.ddl.statement_dml import parse_statement_dml


@pytest.mark.parametrize(("query", "verb", "tables"), [
    ("INSERT INTO t VALUES (1)", "INSERT", [("d", "t")]),
    ("  /* c */ insert low_priority ignore into `x`.`t` (a) SELECT 1", "INSERT", [("x", "t")]),
    ("-- note\nREPLACE t2 SET a = 1", "REPLACE", [("d", "t2")]),
    ("UPDATE t SET v = 2", "UPDATE", [("d", "t")]),
    ("UPDATE IGNORE db.t AS a SET a.v = 2", "UPDATE", [("db", "t")]),
    ("DELETE FROM `db`.`mem`", "DELETE", [("db", "mem")]),
    ("DELETE QUICK FROM t WHERE id = 1", "DELETE", [("d", "t")]),
    ("LOAD DATA INFILE 'f' INTO TABLE db.t", "LOAD DATA", [("db", "t")]),
])
def test_single_table_dml_names_its_table(query, verb, tables):
    dml = parse_statement_dml(query, "d")
    assert dml is not None and dml.exact
    assert dml.verb == verb and list(dml.tables) == tables


@pytest.mark.parametrize("query", [
    "UPDATE a JOIN other.b ON a.id = b.id SET a.v = b.v",
    "UPDATE a, b SET a.v = 1",
    "DELETE a, b FROM a JOIN b USING (id)",
    "DELETE FROM a, b USING a JOIN b",
    "WITH c AS (SELECT 1) UPDATE t SET v = 1",
])
def test_multi_table_dml_is_inexact_and_names_its_databases(query):
    dml = parse_statement_dml(query, "d")
    assert dml is not None and not dml.exact
    assert "d" in dml.databases


@pytest.mark.parametrize("query", [
    "BEGIN", "COMMIT", "CREATE TABLE t (id INT)", "SELECT 1", "WITH c AS (SELECT 1) SELECT 1",
    "SAVEPOINT s", "XA END X'01'", "SET @a = 1", "ALTER TABLE t ADD c INT", "",
])
def test_other_statements_are_not_dml(query):
    assert parse_statement_dml(query, "d") is None
