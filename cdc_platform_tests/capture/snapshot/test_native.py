"""Chunks read over mysqlclient into Arrow land exactly what the PyMySQL path landed, for every
type of the torture suite's type matrix (NULLs, extremes, zero dates, charsets), as values and
as chunk keys; and errors of both drivers are handled alike. Every test runs both ways of
reading a mysqlclient result: column-wise in C (``_rawrows``, the default) and through
mysqlclient's rows (the fallback where the extension is not built or linked otherwise)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import MySQLdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_platform.capture.snapshot import native
from cdc_platform.capture.snapshot.chunks import Chunk, ChunkedTable, ChunkKey, chunk_key_for
from cdc_platform.capture.snapshot.protocol import chunk_arrow_table
from cdc_platform.capture.snapshot.reading.keyset import (
    read_chunk,
    read_max_key,
    read_nullable_columns,
    with_row_bound,
)
from cdc_platform.capture.source import connect, is_retriable, read_table_schema
from cdc_platform.capture.start_errors import describe_start_error
from cdc_platform_tests.capture.snapshot.reading.chunk_reading import read_table_in_chunks
from cdc_platform_tests.torture import cells

DB = "native_types"
TYPE_CELLS = [c for c in (cells._text_cells() + cells._number_cells()  # noqa: SLF001
                          + cells._temporal_cells() + cells._other_cells())]  # noqa: SLF001
# Kinds a primary key can be without a prefix length (and with a meaningful order).
_KEYABLE = ("text", "blob", "json", "geometry", "point", "linestring", "polygon", "multi",
            "collection", "set_", "boolean")


@pytest.fixture(autouse=True, params=["columnar", "rows"])
def reads(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How mysqlclient results are read: the C reader, or mysqlclient's rows."""
    monkeypatch.setattr(native, "COLUMNAR", request.param == "columnar")
    return str(request.param)


def test_the_columnar_reader_is_built_against_mysqlclient_s_library(reads: str) -> None:
    """bootstrap builds ``_rawrows`` and mysqlclient against the same libmariadb: anything
    else would leave snapshots on the slow path without a word."""
    assert native._columnar_available()  # noqa: SLF001


def _edges(cell: cells.Cell) -> str:
    """The cell's INSERT of its edge values (the statement after CREATE TABLE)."""
    return next(s for s in cell.statements if isinstance(s, str) and s.startswith("INSERT"))


@pytest.fixture(scope="module")
def types_db(mariadb: Any) -> Iterator[tuple[Any, Any]]:
    mariadb.query(f"DROP DATABASE IF EXISTS {DB}")
    mariadb.query(f"CREATE DATABASE {DB}")
    with mariadb.root_connect() as root, root.cursor() as cur:
        cur.execute("SET SESSION sql_mode = 'ALLOW_INVALID_DATES'")  # zero and invalid dates
        for cell in TYPE_CELLS:
            create = cell.statements[0].replace(cells.quote(cells.TYPES_DB), DB)
            cur.execute(create)
            cur.execute(_edges(cell).replace(cells.quote(cells.TYPES_DB), DB))
            if not any(word in cell.name for word in _KEYABLE):
                column_type = create.split(" v ", 1)[1].rsplit(", note", 1)[0].replace(
                    " NULL DEFAULT NULL", "")
                cur.execute(f"CREATE TABLE {DB}.`k_{cell.name}` (v {column_type} NOT NULL "
                            "PRIMARY KEY)")
                cur.execute(f"INSERT IGNORE INTO {DB}.`k_{cell.name}` SELECT v FROM "
                            f"{DB}.`{cell.name}` WHERE v IS NOT NULL")
        # What the matrix lacks: dates Python refuses but the server holds, -0.0, mixed chunks.
        cur.execute(f"CREATE TABLE {DB}.extra (id INT PRIMARY KEY, d DATE, dt DATETIME(3), "
                    "ts TIMESTAMP(6) NULL, f FLOAT, g DOUBLE, n DECIMAL(38,10), "
                    "y YEAR, t TIME(2), e ENUM('', 'a'), s SET('a', 'b'))")
        cur.execute(f"INSERT IGNORE INTO {DB}.extra VALUES "
                    "(1, '2024-02-30', '2024-02-30 10:00:00.5', '2001-02-03 04:05:06.7', -0e0, "
                    " -0e0, -1234567890123456789012345678.0123456789, 1901, '-838:59:59.99', "
                    " '', ''),"
                    "(2, '0000-01-01', '0000-01-01 00:00:00', '0000-00-00', 1e-45, 5e-324, 0, "
                    " 0, '00:00:00.01', 'a', 'a,b'),"
                    "(3, '2024-00-05', '2024-00-05 00:00:00', NULL, 3.4e38, 1e308, NULL, "
                    " NULL, NULL, NULL, NULL),"
                    "(4, '0999-12-31', '0999-12-31 23:59:59.999', '2038-01-19 03:14:07', "
                    " 0.5, 0.1, 0.0000000001, 2155, '12:00:00', NULL, 'b'),"
                    "(5, '2024-02-29', '2024-02-29 12:00:00', '1970-01-01 00:00:01', NULL, NULL,"
                    " 1, 1999, '-00:00:00.01', 'a', NULL)")
    with connect(mariadb.connection_settings()) as conn:
        chunk_conn = native.connect(mariadb.connection_settings())
        try:
            yield conn, chunk_conn
        finally:
            chunk_conn.close()
    mariadb.query(f"DROP DATABASE IF EXISTS {DB}")


def _chunked(conn: Any, table: str) -> ChunkedTable:
    schema = read_table_schema(conn, DB, table)
    key = chunk_key_for(schema, None, read_nullable_columns(conn, DB, table))
    assert isinstance(key, ChunkKey)
    return ChunkedTable(schema, key)


def _shown(value: Any) -> str:
    """repr, which tells -0.0 from 0.0, Decimal('1.50') from Decimal('1.5'), naive from aware."""
    return repr(value)


def _landed(chunk: Chunk) -> pa.Table:
    if chunk.arrow is not None:
        return chunk.arrow
    return chunk_arrow_table(chunk.table.schema, chunk.rows, chunk.columns)


def _assert_same(old: list[Chunk], new: list[Chunk]) -> None:
    assert len(old) == len(new)
    for a, b in zip(old, new, strict=True):
        assert b.arrow is not None  # (the mysqlclient path built Arrow itself)
        ta, tb = _landed(a), _landed(b)
        assert ta.schema == tb.schema
        for name in ta.column_names:
            assert [_shown(v) for v in ta[name].to_pylist()] == \
                [_shown(v) for v in tb[name].to_pylist()], name
        assert [tuple(map(_shown, r)) for r in a.rows] == \
            [tuple(map(_shown, r)) for r in b.rows]
        for attribute in ("resume_key", "range_low", "range_high", "complete",
                          "low_watermark", "after", "schema_fingerprint", "bytes_read"):
            if attribute == "bytes_read":  # (text counts bytes on mysqlclient: >= chars)
                assert getattr(b, attribute) >= getattr(a, attribute)
                continue
            assert _shown(getattr(a, attribute)) == _shown(getattr(b, attribute)), attribute


@pytest.mark.parametrize("cell", TYPE_CELLS, ids=lambda c: c.name)
def test_mysqlclient_chunks_land_what_pymysql_chunks_landed(
        types_db: tuple[Any, Any], cell: cells.Cell, reads: str) -> None:
    conn, chunk_conn = types_db
    table = _chunked(conn, cell.name)
    for chunk_size in (100, 2):
        old = read_table_in_chunks(conn, "mariadb", table, chunk_size)
        new = read_table_in_chunks(conn, "mariadb", table, chunk_size, chunk_conn=chunk_conn)
        _assert_same(old, new)
    # As the reader reads: cast when the rows are first looked at (its writer thread).
    deferred = read_chunk(chunk_conn, "mariadb", with_row_bound(conn, table), 100, None,
                          read_max_key(conn, table), defer_landing=True)
    first = read_table_in_chunks(conn, "mariadb", table, 100)[:1]
    assert (deferred.arrow is None) == (reads == "columnar")
    _assert_same(first, [replace(deferred, arrow=deferred.rows.table)])


@pytest.mark.parametrize(
    "cell", [c for c in TYPE_CELLS if not any(w in c.name for w in _KEYABLE)],
    ids=lambda c: c.name)
def test_mysqlclient_chunk_keys_resume_as_pymysql_keys_did(
        types_db: tuple[Any, Any], cell: cells.Cell) -> None:
    """Every edge value as a primary key, one row per chunk: each resume key is bound as a
    parameter of the next SELECT and persisted, so it must be PyMySQL's value."""
    conn, chunk_conn = types_db
    table = _chunked(conn, f"k_{cell.name}")
    old = read_table_in_chunks(conn, "mariadb", table, 1)
    new = read_table_in_chunks(conn, "mariadb", table, 1, chunk_conn=chunk_conn)
    assert len(old) >= 2
    _assert_same(old, new)


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 100])
def test_values_python_refuses_and_mixed_chunks_land_alike(
        types_db: tuple[Any, Any], chunk_size: int) -> None:
    conn, chunk_conn = types_db
    table = _chunked(conn, "extra")
    old = read_table_in_chunks(conn, "mariadb", table, chunk_size)
    new = read_table_in_chunks(conn, "mariadb", table, chunk_size, chunk_conn=chunk_conn)
    _assert_same(old, new)
    rows = [r for c in new for r in c.rows]
    assert [r[1] for r in rows][:4] == [None, None, None, rows[3][1]]  # invalid/zero -> NULL


def test_a_byte_budget_cut_reads_the_same_rows(types_db: tuple[Any, Any]) -> None:
    conn, chunk_conn = types_db
    table = _chunked(conn, "longblob")
    old = read_table_in_chunks(conn, "mariadb", table, 100, max_bytes=1000)
    new = read_table_in_chunks(conn, "mariadb", table, 100, max_bytes=1000,
                               chunk_conn=chunk_conn)
    assert [len(c.rows) for c in old] == [len(c.rows) for c in new]
    _assert_same(old, new)


def test_errors_of_both_drivers_are_retriable_and_described_alike(
        types_db: tuple[Any, Any], mariadb: Any) -> None:
    _, chunk_conn = types_db
    with pytest.raises(MySQLdb.ProgrammingError) as missing:  # (PyMySQL's class too)
        read_chunk(chunk_conn, "mariadb", _chunked(types_db[0], "extra").__class__(
            read_table_schema(types_db[0], DB, "extra").__class__(
                DB, "no_such_table", read_table_schema(types_db[0], DB, "extra").columns,
                ("id",)), ChunkKey(("id",), (False,), "primary key")), 10, None, None)
    assert missing.value.args[0] == 1146 and not is_retriable(missing.value)
    lost = MySQLdb.OperationalError(2013, "Lost connection to server during query")
    assert is_retriable(lost)
    settings = {**mariadb.connection_settings(), "password": "wrong"}
    with pytest.raises(MySQLdb.OperationalError) as denied:
        native.connect(settings)
    assert "access denied" in (describe_start_error(denied.value) or "").lower()


def test_settings_without_a_mysqlclient_form_fall_back(mariadb: Any) -> None:
    settings = mariadb.connection_settings()
    assert native.native_settings(settings) is not None
    assert native.native_settings({**settings, "local_infile": True}) is None
    assert native.native_settings({**settings, "connect_timeout": 2.5})["connect_timeout"] == 3


CI_VALUES = ["a@x", "A@X", "Á@x", "b", "b ", "B  ", "e", "é", "E", "È", "z", "", " "]


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.sampled_from(CI_VALUES) | st.none(), st.integers(0, 2)),
                     unique=True, max_size=20),
       chunk_size=st.integers(1, 4))
def test_collation_groups_are_read_whole_over_mysqlclient(
        mariadb: Any, types_db: tuple[Any, Any], rows: list[tuple[Any, int]],
        chunk_size: int) -> None:
    """The equal-keys SELECT of a text key runs over mysqlclient too, bound with keys decoded
    as PyMySQL decoded them: the same chunks, every row once."""
    conn, chunk_conn = types_db
    mariadb.query(f"CREATE TABLE IF NOT EXISTS {DB}.ci (email VARCHAR(10) CHARACTER SET "
                  "utf8mb4 COLLATE utf8mb4_general_ci NULL, n INT NOT NULL, v INT, "
                  "KEY (email, n))")
    with mariadb.root_connect(database=DB) as root, root.cursor() as cur:
        cur.execute("TRUNCATE TABLE ci")
        if rows:
            cur.executemany("INSERT INTO ci VALUES (%s, %s, %s)",
                            [(e, n, i) for i, (e, n) in enumerate(rows)])
    schema = read_table_schema(conn, DB, "ci")
    key = chunk_key_for(schema, ("email", "n"), read_nullable_columns(conn, DB, "ci"))
    assert isinstance(key, ChunkKey)
    table = ChunkedTable(schema, key)
    old = read_table_in_chunks(conn, "mariadb", table, chunk_size)
    new = read_table_in_chunks(conn, "mariadb", table, chunk_size, chunk_conn=chunk_conn)
    _assert_same(old, new)
    assert sorted((r for c in new for r in c.rows), key=repr) == sorted(
        ((e, n, i) for i, (e, n) in enumerate(rows)), key=repr)


def test_a_connection_lost_mid_result_is_a_retriable_error(
        mariadb: Any, types_db: tuple[Any, Any], reads: str) -> None:
    """The C reader reads a streamed result with the GIL released: a connection killed while
    it reads raises mysqlclient's OperationalError with the client's error number (retried
    by the reader), and the reader returns no partial rows."""
    conn = native.connect(mariadb.connection_settings())
    try:
        thread_id = conn.thread_id()

        def kill() -> None:
            time.sleep(0.3)
            mariadb.query(f"KILL CONNECTION {thread_id}")

        killer = threading.Thread(target=kill)
        killer.start()
        sql = (f"SELECT a.seq, REPEAT('x', 100) FROM {DB}.seq_1_to_100000 a, "
               f"{DB}.seq_1_to_1000 b WHERE %s = %s")
        try:
            with pytest.raises(MySQLdb.OperationalError) as lost:
                if reads == "columnar":
                    native.read_columns(conn, sql, (1, 1), (1,), 8)
                else:
                    result = native.query_raw(conn, sql, (1, 1))
                    while result.fetch_row(10_000, 0):
                        pass
        finally:
            killer.join()
        assert is_retriable(lost.value), lost.value
    finally:
        conn.close()
