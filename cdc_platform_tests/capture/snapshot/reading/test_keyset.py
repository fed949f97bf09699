"""Reading real tables chunk by chunk (``reading/keyset.py``): every row once in key order,
bounded by rows and bytes, in one read view, with the server's collations and types."""

from __future__ import annotations

import decimal
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_platform.capture.binlog.stream import BinlogStream
from cdc_platform.capture.events import TableMap
from cdc_platform.capture.flavours import flavour_of
from cdc_platform.capture.snapshot.chunks import (
    Chunk,
    ChunkedTable,
    ChunkKey,
    chunk_key_for,
    schema_fingerprint,
)
from cdc_platform.capture.snapshot.conditions import Condition
from cdc_platform.capture.snapshot.reading.keyset import (
    ChunkKeyError,
    read_chunk,
    read_max_key,
    read_nullable_columns,
    with_row_bound,
)
from cdc_platform.capture.source import connect, read_table_schema
from cdc_platform_tests.capture.snapshot.reading.chunk_reading import read_table_in_chunks


@pytest.fixture(scope="module")
def chunk_db(mariadb: Any) -> Iterator[tuple[Any, str]]:
    db = "snapshot_chunks"
    mariadb.query(f"DROP DATABASE IF EXISTS `{db}`")
    mariadb.query(f"CREATE DATABASE `{db}`")
    # A surrogate key with nullable parts (unique, NULL counting as a value, is up to the
    # generator: the server's UNIQUE would admit duplicate NULLs) and a primary-key table.
    mariadb.query(f"CREATE TABLE `{db}`.sk (a INT NOT NULL, b INT NULL, c VARCHAR(3) NULL, "
                  "v INT NOT NULL, KEY (a, b, c))")
    mariadb.query(f"CREATE TABLE `{db}`.pk (a INT NOT NULL, c VARCHAR(3) NOT NULL, "
                  "v INT NOT NULL, PRIMARY KEY (a, c))")
    with connect(mariadb.connection_settings()) as conn:
        yield conn, db
    mariadb.query(f"DROP DATABASE IF EXISTS `{db}`")


def _chunked(conn: Any, db: str, table: str, condition: str | None = None) -> ChunkedTable:
    schema = read_table_schema(conn, db, table)
    key = chunk_key_for(schema, ("a", "b", "c") if table == "sk" else None,
                        read_nullable_columns(conn, db, table))
    assert isinstance(key, ChunkKey)
    return ChunkedTable(schema, key, None if condition is None else Condition(condition))


def _reload(mariadb: Any, db: str, table: str, rows: list[tuple]) -> None:
    with mariadb.root_connect(database=db) as conn, conn.cursor() as cur:
        cur.execute(f"TRUNCATE TABLE {table}")
        if rows:
            marks = ", ".join(["%s"] * len(rows[0]))
            cur.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)


def _sort_key(key: tuple) -> tuple:
    """The server's order: NULL first (c holds only a-c, where collation and bytes agree)."""
    return tuple((value is not None, value) for value in key)


def _check_tiling(chunks: list[Chunk]) -> None:
    """Each chunk starts where the previous one ended; each row lies inside its range."""
    for index, chunk in enumerate(chunks):
        assert chunk.range_low == (chunks[index - 1].range_high if index else None)
        for row in chunk.rows:
            key = _sort_key(chunk.key_of(row))
            assert chunk.range_low is None or key > _sort_key(chunk.range_low)
            assert chunk.range_high is None or key <= _sort_key(chunk.range_high)
        assert chunk.low_watermark == chunk.after
    assert [c.complete for c in chunks] == [False] * (len(chunks) - 1) + [True]


sk_rows = st.dictionaries(
    st.tuples(st.integers(0, 3), st.none() | st.integers(-2, 2),
              st.none() | st.sampled_from(["", "a", "b", "c", "ab"])),
    st.integers(0, 99), max_size=25,
).map(lambda d: [(*k, v) for k, v in d.items()])
pk_rows = st.dictionaries(st.tuples(st.integers(-3, 3), st.sampled_from(["", "a", "b", "bc"])),
                          st.integers(0, 99), max_size=20,
                          ).map(lambda d: [(*k, v) for k, v in d.items()])
DB_SETTINGS = settings(max_examples=100, deadline=None,
                       suppress_health_check=[HealthCheck.function_scoped_fixture])


@DB_SETTINGS
@given(rows=sk_rows, chunk_size=st.integers(1, 7), filtered=st.booleans())
def test_chunks_visit_every_row_once_in_key_order_with_null_key_parts(
    mariadb: Any, chunk_db: tuple[Any, str], rows: list[tuple], chunk_size: int, filtered: bool
) -> None:
    conn, db = chunk_db
    _reload(mariadb, db, "sk", rows)
    table = _chunked(conn, db, "sk", "v % 3 <> 0 OR c LIKE 'a%'" if filtered else None)
    chunks = read_table_in_chunks(conn, "mariadb", table, chunk_size)
    read = [row for chunk in chunks for row in chunk.rows]
    expected = [r for r in rows if not filtered or r[3] % 3 != 0 or (r[2] or "").startswith("a")]
    expected.sort(key=lambda r: _sort_key(r[:3]))
    assert read == expected
    assert all(len(c.rows) <= chunk_size for c in chunks)
    if chunks:
        _check_tiling(chunks)
    assert not table.range_assertions_allowed  # text key part (and possibly a filter)


@DB_SETTINGS
@given(rows=pk_rows, chunk_size=st.integers(1, 7))
def test_chunks_of_a_composite_primary_key(mariadb: Any, chunk_db: tuple[Any, str],
                                           rows: list[tuple], chunk_size: int) -> None:
    conn, db = chunk_db
    _reload(mariadb, db, "pk", rows)
    table = _chunked(conn, db, "pk")
    assert table.key == ChunkKey(("a", "c"), (False, False), "primary key")
    chunks = read_table_in_chunks(conn, "mariadb", table, chunk_size)
    assert [row for chunk in chunks for row in chunk.rows] == sorted(
        rows, key=lambda r: _sort_key(r[:2]))
    if chunks:
        _check_tiling(chunks)


def test_rows_inserted_after_the_start_stay_out_of_bounded_chunks(
        mariadb: Any, chunk_db: tuple[Any, str]) -> None:
    conn, db = chunk_db
    _reload(mariadb, db, "pk", [(1, "a", 1), (2, "a", 2)])
    table = _chunked(conn, db, "pk")
    max_key = read_max_key(conn, table)
    assert max_key == (2, "a")
    mariadb.query(f"INSERT INTO `{db}`.pk VALUES (3, 'a', 3), (0, 'a', 0)")
    chunk = read_chunk(conn, "mariadb", table, 10, None, max_key)
    assert [r[0] for r in chunk.rows] == [0, 1, 2] and chunk.complete
    assert chunk.range_high == (2, "a")


def test_empty_table_has_no_chunks(mariadb: Any, chunk_db: tuple[Any, str]) -> None:
    conn, db = chunk_db
    _reload(mariadb, db, "pk", [])
    assert read_table_in_chunks(conn, "mariadb", _chunked(conn, db, "pk"), 3) == []


def test_duplicate_surrogate_key_is_reported(mariadb: Any, chunk_db: tuple[Any, str]) -> None:
    conn, db = chunk_db
    _reload(mariadb, db, "sk", [(1, None, "a", 1), (1, None, "a", 2)])
    with pytest.raises(ChunkKeyError, match=r"snapshot_chunks\.sk: chunk key \(a, b, c\) = "
                                            r"\(1, None, 'a'\) appears twice"):
        read_table_in_chunks(conn, "mariadb", _chunked(conn, db, "sk"), 5)


@pytest.mark.parametrize("chunk_size", [1, 2])
def test_enum_set_and_bit_keys_follow_the_servers_order(mariadb: Any, chunk_db: tuple[Any, str],
                                                        chunk_size: int) -> None:
    """ENUM and SET sort by number, not text; BIT arrives as bytes: compare like ORDER BY."""
    conn, db = chunk_db
    mariadb.query(f"CREATE TABLE IF NOT EXISTS `{db}`.odd (e ENUM('z','a','m') NOT NULL, "
                  "s SET('x','b') NOT NULL, bits BIT(4) NOT NULL, f FLOAT, u BIGINT UNSIGNED, "
                  "PRIMARY KEY (e, s, bits))")
    rows = [(e, s, b, 0.1, 2**64 - 1) for e in ("z", "a", "m") for s in ("x", "b", "x,b")
            for b in (1, 8)]
    _reload(mariadb, db, "odd", rows)
    table = _chunked(conn, db, "odd")
    chunks = read_table_in_chunks(conn, "mariadb", table, chunk_size)
    read = [row for chunk in chunks for row in chunk.rows]
    assert [(r[0], r[1], r[2]) for r in read] == [(e, s, b) for e, s, b, _, _ in rows]
    assert read[0][3:] == (pytest.approx(0.1, rel=1e-7), decimal.Decimal(2**64 - 1))
    assert not table.range_assertions_allowed  # ENUM lands as text


def test_range_assertions_only_for_unfiltered_orderable_keys(
        mariadb: Any, chunk_db: tuple[Any, str]) -> None:
    conn, db = chunk_db
    mariadb.query(f"CREATE TABLE IF NOT EXISTS `{db}`.ints (id BIGINT UNSIGNED PRIMARY KEY, "
                  "d DATETIME(6))")
    assert _chunked(conn, db, "ints").range_assertions_allowed
    assert not _chunked(conn, db, "ints", "d > '2024-01-01'").range_assertions_allowed


def test_chunk_schema_fingerprint_matches_the_binlog_schema(mariadb: Any,
                                                            chunk_db: tuple[Any, str]) -> None:
    """The engine compares a chunk's fingerprint (information_schema) with the binlog's at
    commit: for an unchanged table of every column kind they must agree."""
    conn, db = chunk_db
    start = mariadb.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0]
    mariadb.query(f"""CREATE TABLE `{db}`.all_kinds (id BIGINT UNSIGNED PRIMARY KEY, i INT,
        si SMALLINT UNSIGNED, bi BIGINT, d1 DECIMAL(10,2), d2 DECIMAL(50,5), f FLOAT, x DOUBLE,
        d DATE, dt DATETIME(6), ts TIMESTAMP(3) NULL, tm TIME(2), y YEAR, c CHAR(5),
        vc VARCHAR(20), tx TEXT, bn BINARY(4), vb VARBINARY(10), bl BLOB, e ENUM('a','b'),
        st SET('x','y'), j JSON, b1 BIT(1), b64 BIT(64), g GEOMETRY)""")
    mariadb.query(f"INSERT INTO `{db}`.all_kinds (id) VALUES (1)")
    stream = BinlogStream(mariadb.connection_settings(), 8765, flavour_of("mariadb"), start, 1)
    try:
        binlog_schema = next(event.schema for event in stream
                             if isinstance(event, TableMap) and event.schema.table == "all_kinds")
    finally:
        stream.close()
    selected = _chunked(conn, db, "all_kinds").schema
    assert selected == binlog_schema
    assert schema_fingerprint(selected) == schema_fingerprint(binlog_schema)


@pytest.mark.parametrize("kind", ["FLOAT", "DOUBLE"])
def test_float_keys_one_per_chunk_reach_the_largest_row(mariadb: Any, chunk_db: tuple[Any, str],
                                                        kind: str) -> None:
    conn, db = chunk_db
    mariadb.query(f"CREATE OR REPLACE TABLE `{db}`.fk (k {kind} PRIMARY KEY, v INT)")
    mariadb.query(f"INSERT INTO `{db}`.fk VALUES (0.1, 1), (0.2, 2), (0.3, 3)")
    table = _chunked(conn, db, "fk")
    chunks = read_table_in_chunks(conn, "mariadb", table, 1)
    assert [row[1] for chunk in chunks for row in chunk.rows] == [1, 2, 3]
    assert [len(c.rows) for c in chunks] == [1, 1, 1] and chunks[-1].complete
    _check_tiling(chunks)


@DB_SETTINGS
@given(sizes=st.lists(st.sampled_from([0, 10, 900, 3000, 12_000]), max_size=30),
       chunk_size=st.integers(1, 9), max_bytes=st.sampled_from([1, 1000, 5000, 40_000]))
def test_chunks_are_bounded_by_bytes_and_still_tile_the_table(
        mariadb: Any, chunk_db: tuple[Any, str], sizes: list[int], chunk_size: int,
        max_bytes: int) -> None:
    """Rows of mixed widths under a byte budget: a chunk ends at the row that reaches the
    budget (one row at least), its range ends at the last row read, and together the chunks
    hold every row once, in key order."""
    conn, db = chunk_db
    mariadb.query(f"CREATE TABLE IF NOT EXISTS `{db}`.wide (id INT PRIMARY KEY, b LONGBLOB, "
                  "t MEDIUMTEXT)")
    rows = [(i * 3, bytes([i % 256]) * size, "é" * (size // 2)) for i, size in enumerate(sizes)]
    _reload(mariadb, db, "wide", rows)
    table = ChunkedTable(read_table_schema(conn, db, "wide"),
                         ChunkKey(("id",), (False,), "primary key"))
    chunks = read_table_in_chunks(conn, "mariadb", table, chunk_size, max_bytes=max_bytes)
    assert [row for chunk in chunks for row in chunk.rows] == rows
    if not chunks:
        return
    _check_tiling(chunks)
    for chunk in chunks:
        width = [8 + len(b) + len(t) for _, b, t in chunk.rows]
        assert 1 <= len(chunk.rows) <= chunk_size
        assert sum(width) <= max_bytes or len(chunk.rows) == 1
        assert chunk.bytes_read == sum(width)
    for chunk, following in zip(chunks, chunks[1:], strict=False):
        if len(chunk.rows) < chunk_size:  # cut by the budget: the next row did not fit
            assert chunk.bytes_read + 8 + len(following.rows[0][1]) + len(
                following.rows[0][2]) > max_bytes


def test_a_huge_row_is_one_chunk_and_the_budget_picks_up_after_it(
        mariadb: Any, chunk_db: tuple[Any, str]) -> None:
    conn, db = chunk_db
    mariadb.query(f"CREATE TABLE IF NOT EXISTS `{db}`.wide (id INT PRIMARY KEY, b LONGBLOB, "
                  "t MEDIUMTEXT)")
    rows = [(1, b"a" * 10, ""), (2, b"h" * 3_000_000, ""), *((i, b"s", "") for i in range(3, 60))]
    _reload(mariadb, db, "wide", rows)
    table = ChunkedTable(read_table_schema(conn, db, "wide"),
                         ChunkKey(("id",), (False,), "primary key"))
    chunks = read_table_in_chunks(conn, "mariadb", table, 1000, max_bytes=100_000)
    assert [len(c.rows) for c in chunks] == [1, 1, 57]
    assert [row for chunk in chunks for row in chunk.rows] == rows


# Values a case-, accent- or PAD SPACE-insensitive collation holds equal in groups.
CI_VALUES = ["a@x", "A@X", "Á@x", "b", "b ", "B  ", "e", "é", "E", "È", "z", "", " "]


@DB_SETTINGS
@given(rows=st.lists(st.tuples(st.sampled_from(CI_VALUES) | st.none(), st.integers(0, 2)),
                     unique=True, max_size=25),
       chunk_size=st.integers(1, 4),
       collation=st.sampled_from(["utf8mb4_general_ci", "utf8mb4_unicode_ci"]))
def test_chunks_never_skip_keys_their_collation_holds_equal(
        mariadb: Any, chunk_db: tuple[Any, str], rows: list[tuple[Any, int]], chunk_size: int,
        collation: str) -> None:
    """A surrogate key (email, n) where 'a@x' and 'A@X' (and 'b', 'b '; 'e', 'é') are equal to
    the server but distinct rows to the lake: ``key > ('a@x', 1)`` leaves out ('A@X', 1), so a
    chunk must not end between them. Every row is read exactly once."""
    conn, db = chunk_db
    name = f"ci_{collation}"
    mariadb.query(f"CREATE TABLE IF NOT EXISTS `{db}`.{name} (email VARCHAR(10) CHARACTER SET "
                  f"utf8mb4 COLLATE {collation} NULL, n INT NOT NULL, v INT, KEY (email, n))")
    _reload(mariadb, db, name, [(e, n, i) for i, (e, n) in enumerate(rows)])
    schema = read_table_schema(conn, db, name)
    key = chunk_key_for(schema, ("email", "n"), read_nullable_columns(conn, db, name))
    assert isinstance(key, ChunkKey)
    table = ChunkedTable(schema, key)
    assert table.key_collated and not table.range_assertions_allowed
    chunks = read_table_in_chunks(conn, "mariadb", table, chunk_size)
    read = [row for chunk in chunks for row in chunk.rows]
    assert sorted(read, key=repr) == sorted(((e, n, i) for i, (e, n) in enumerate(rows)),
                                            key=repr)
    assert [c.complete for c in chunks] == [False] * (len(chunks) - 1) + [True] * bool(chunks)


def test_the_row_bound_comes_from_declared_widths(mariadb: Any,
                                                  chunk_db: tuple[Any, str]) -> None:
    """Rows that cannot pass the budget are read buffered: the bound must never be below what
    the budget counts for a row (text counted in characters, at most its octets)."""
    conn, db = chunk_db
    mariadb.query(f"CREATE TABLE IF NOT EXISTS `{db}`.narrow (id INT PRIMARY KEY, "
                  "c VARCHAR(10) CHARACTER SET utf8mb4, b VARBINARY(7), e ENUM('ab', 'cde'))")
    narrow = with_row_bound(conn, _chunked(conn, db, "narrow"))
    assert narrow.max_row_bytes == 8 + 40 + 7 + 3 * 4
    rows = [(1, "é" * 10, b"x" * 7, "cde")]
    _reload(mariadb, db, "narrow", rows)
    [chunk] = read_table_in_chunks(conn, "mariadb", narrow, 10)
    assert chunk.rows == tuple(rows) and chunk.bytes_read <= narrow.max_row_bytes
    mariadb.query(f"CREATE TABLE IF NOT EXISTS `{db}`.shapes (id INT PRIMARY KEY, g GEOMETRY)")
    assert with_row_bound(conn, _chunked(conn, db, "shapes")).max_row_bytes is None
