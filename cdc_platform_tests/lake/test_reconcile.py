"""Reconciliation against a real private MariaDB and a real local Spark session.

Targets are built the way the lake lands rows: source rows read through the capture converters,
put into an Arrow table with the landing schema, written to Parquet and read by Spark. Tests then
mutate those rows to create exactly the differences they expect to find.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_platform.capture import source
from cdc_platform.capture.keys import key_order
from cdc_platform.capture.schema import TableSchema
from cdc_platform.capture.values import converter_for, row_hash, select_expression
from cdc_platform.devservices.mariadb import MariaDBServer
from cdc_platform.lake.reconcile import (
    ReconcileError,
    ReconcileResult,
    _checksum_mapper,
    _Hasher,
    _range_of,
    _source_checksums,
    reconcile_table,
)

pytestmark = pytest.mark.integration

DB = "rec"

# ---- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spark(spark: SparkSession) -> SparkSession:
    """The shared lake session, its Python workers pinned to this interpreter.

    Reconciliation hashes rows in Python on the executors, which need pyarrow and this package.
    pyspark takes the worker interpreter from PYSPARK_PYTHON, else ``python3`` on PATH (not
    necessarily the venv's); it reads ``SparkContext.pythonExec`` whenever it ships a function.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark.sparkContext.pythonExec = sys.executable
    return spark


@pytest.fixture(scope="module", autouse=True)
def rec_database(mariadb: MariaDBServer) -> Iterator[None]:
    """This module's database on the shared private MariaDB (``mariadb`` from the conftest)."""
    mariadb.query(f"DROP DATABASE IF EXISTS {DB}")
    mariadb.query(f"CREATE DATABASE {DB}")
    yield
    mariadb.query(f"DROP DATABASE IF EXISTS {DB}")


@pytest.fixture()
def settings_of(mariadb: MariaDBServer) -> dict[str, Any]:
    """Connection settings of the least-privileged CDC account (SELECT + replication grants)."""
    return mariadb.connection_settings()


# ---- helpers ----------------------------------------------------------------------------------


def create_table(
    server: MariaDBServer, name: str, ddl: str, rows: list[tuple[Any, ...]] | None = None
) -> TableSchema:
    """(Re)create ``rec.name`` with ``ddl`` (the column list), insert ``rows``, return its schema."""
    with server.root_connect() as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")  # zero dates and invalid ENUMs are allowed
        cur.execute(f"DROP TABLE IF EXISTS {DB}.{name}")
        cur.execute(f"CREATE TABLE {DB}.{name} ({ddl})")
        for start in range(0, len(rows or []), 5000):
            chunk = (rows or [])[start : start + 5000]
            marks = ", ".join(["%s"] * len(chunk[0]))
            cur.executemany(f"INSERT INTO {DB}.{name} VALUES ({marks})", chunk)
    with source.source_connection(server.connection_settings()) as conn:
        return source.read_table_schema(conn, DB, name)


def source_rows(server: MariaDBServer, schema: TableSchema) -> list[dict[str, Any]]:
    """The table's rows in landing form (the same converters the capture engine uses)."""
    exprs = ", ".join(select_expression(c, source.quote_identifier(c.name)) for c in schema.columns)
    converters = [converter_for(c, from_binlog=False) for c in schema.columns]
    with source.source_connection(server.connection_settings()) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT {exprs} FROM {DB}.{schema.table}")
        return [
            {
                c.name: v if conv is None else conv(v)
                for c, conv, v in zip(schema.columns, converters, row, strict=True)
            }
            for row in cur.fetchall()
        ]


def target_df(
    spark: SparkSession, tmp_path: Path, schema: TableSchema, rows: list[dict[str, Any]]
) -> DataFrame:
    """A Spark DataFrame of ``rows`` with the landing types, read back from Parquet."""
    table = pa.Table.from_pylist(rows, schema=schema.arrow_schema())
    path = tmp_path / f"target-{uuid.uuid4().hex}.parquet"
    pq.write_table(table, path)
    return spark.read.parquet(str(path))


def by_key(rows: list[dict[str, Any]], **key: Any) -> dict[str, Any]:
    return next(r for r in rows if all(r[k] == v for k, v in key.items()))


def assert_counts(result: ReconcileResult, missing: int, extra: int, different: int) -> None:
    got = (result.missing, result.extra, result.different)
    assert got == (missing, extra, different), result


# ---- every column type ------------------------------------------------------------------------

ALL_TYPES_DDL = """
    id INT PRIMARY KEY,
    d DECIMAL(12,4), big_d DECIMAL(50,20), dt DATETIME(6), ts TIMESTAMP(3) NULL DEFAULT NULL,
    day DATE, t TIME(2), y YEAR, j JSON, b BLOB, bin BINARY(4), vb VARBINARY(10),
    e ENUM('a','b','c d'), s SET('x','y','z'), bit10 BIT(10), bit64 BIT(64),
    u BIGINT UNSIGNED, i8 TINYINT, si BIGINT, f FLOAT, db DOUBLE,
    txt VARCHAR(50), lt LONGTEXT, ch CHAR(5)
"""

ALL_TYPES_ROWS: list[tuple[Any, ...]] = [
    (1, Decimal("12345678.1234"), Decimal("1234567890123456789012345678.12345678901234567890"),
     "9999-12-31 23:59:59.999999", "2038-01-19 03:14:07.999", "1000-01-01", "-00:00:01.25",
     2155, '{"b": [1, 2.5, "x"], "a": null}', bytes(range(256)), b"\x00\x01\x02\x03",
     b"\xff\x00", "c d", "z,x", 1023, 2**64 - 1, 2**64 - 1, -128, -(2**63), 3.14,
     0.1 + 0.2, "emoji \U0001f600 and \u00fc", "x" * 1000, "ab"),
    (2, *([None] * 23)),
    (3, Decimal(0), Decimal(0), "0000-00-00 00:00:00", "1970-01-01 00:00:01", "0000-00-00",
     "00:00:00", 1901, "[]", b"", b"", b"", "", "", 0, 0, 0, 0, 0, 0.0, 0.0, "", "", ""),
    (4, Decimal("-0.0001"), Decimal("-" + "9" * 30 + "." + "9" * 20),
     "1000-01-01 00:00:00.000001", "2000-02-29 12:00:00.5", "9999-12-31", "-838:59:59.99",
     1970, '{"\u00fc": "\U0001f600", "n": 1.5e300}', b"\x00" * 10, b"ab", b"\x00", "a",
     "x,y,z", 1, 2**63, 2**63, 127, 2**63 - 1, -1.5e-38, 5e-324, "\U0001d11e 4-byte",
     "a\nb\tc", "abcde"),
]


def test_identical_tables_with_every_column_type_are_ok(
    mariadb: MariaDBServer, spark: SparkSession, tmp_path: Path, settings_of: dict[str, Any]
) -> None:
    schema = create_table(mariadb, "all_types", ALL_TYPES_DDL, ALL_TYPES_ROWS)
    rows = source_rows(mariadb, schema)
    assert by_key(rows, id=4)["t"] == "-838:59:59.99"
    assert by_key(rows, id=1)["bit64"] == Decimal(2**64 - 1)
    target = target_df(spark, tmp_path, schema, rows)
    # A non-UTC session zone must not matter: TIMESTAMP values are instants on both sides.
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/Sao_Paulo")
    try:
        result = reconcile_table(spark, target, settings_of, schema)
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    assert result.ok, result
    assert_counts(result, 0, 0, 0)
    assert (result.source_rows, result.target_rows) == (4, 4)
    assert (result.ranges, result.mismatched_ranges) == (1, 0)
    assert result.missing_columns == ()
    # The snapshot's exact position: nothing else writes, so it is the server's current one.
    assert result.source_gtid == mariadb.query("SELECT @@gtid_binlog_pos")[0][0]
    metadata = result.to_metadata()
    assert json.loads(json.dumps(metadata)) == metadata
    assert metadata["ok"] is True and metadata["table"] == f"{DB}.all_types"


def test_one_value_changed_in_any_column_type_is_found(
    mariadb: MariaDBServer, spark: SparkSession, tmp_path: Path, settings_of: dict[str, Any]
) -> None:
    """A change in any one column, including NULL <-> value, makes exactly that row different."""
    schema = create_table(mariadb, "all_types_diff", ALL_TYPES_DDL, ALL_TYPES_ROWS)
    rows = source_rows(mariadb, schema)
    changed = {
        "d": Decimal("12345678.1235"), "dt": dt.datetime(9999, 12, 31, 23, 59, 59, 999998),
        "ts": None, "t": "-00:00:01.24", "j": '{"b": [1, 2.5, "x"], "a": 0}',
        "b": bytes(range(255)), "s": "x", "bit64": Decimal(2**64 - 2), "f": 3.0,
        "txt": "emoji \U0001f601 and \u00fc",
    }
    for name, value in changed.items():
        mutated = [dict(r) for r in rows]
        by_key(mutated, id=1)[name] = value
        result = reconcile_table(spark, target_df(spark, tmp_path, schema, mutated), settings_of,
                                 schema)
        assert_counts(result, 0, 0, 1)
        assert result.sample_different == ["(1)"], name


# ---- finding differences ----------------------------------------------------------------------

SIMPLE_DDL = "id INT PRIMARY KEY, name VARCHAR(40), amount DECIMAL(10,2)"


def simple_rows(ids: list[int]) -> list[tuple[Any, ...]]:
    return [(i, f"name-{i}", Decimal(i) / 4) for i in ids]


def test_one_missing_one_extra_one_different(
    mariadb: MariaDBServer, spark: SparkSession, tmp_path: Path, settings_of: dict[str, Any]
) -> None:
    schema = create_table(mariadb, "simple", SIMPLE_DDL, simple_rows(list(range(1, 101))))
    rows = source_rows(mariadb, schema)
    rows = [r for r in rows if r["id"] != 17]  # missing
    rows.append({"id": 500, "name": "ghost", "amount": Decimal("1.00")})  # extra
    by_key(rows, id=42)["amount"] = Decimal("0.01")  # different
    result = reconcile_table(spark, target_df(spark, tmp_path, schema, rows), settings_of, schema)
    assert not result.ok
    assert_counts(result, 1, 1, 1)
    assert result.sample_missing == ["(17)"]
    assert result.sample_extra == ["(500)"]
    assert result.sample_different == ["(42)"]
    assert (result.source_rows, result.target_rows) == (100, 100)
    assert (result.ranges, result.mismatched_ranges) == (1, 1)
    assert result.to_metadata()["ok"] is False


def test_differences_in_several_ranges(
    mariadb: MariaDBServer, spark: SparkSession, tmp_path: Path, settings_of: dict[str, Any]
) -> None:
    """Even ids 2..200 in ranges of 10: range k holds ids 20k+2 .. 20k+20."""
    schema = create_table(mariadb, "ranged", SIMPLE_DDL, simple_rows(list(range(2, 201, 2))))
    rows = source_rows(mariadb, schema)
    rows = [r for r in rows if r["id"] != 10]  # missing, range 0
    rows.append({"id": 0, "name": "below the first key", "amount": None})  # extra, range 0
    rows.append({"id": 47, "name": "between keys", "amount": None})  # extra, range 2
    by_key(rows, id=120)["name"] = "changed"  # different, range 5
    rows.append({"id": 999, "name": "beyond the last key", "amount": None})  # extra, range 9
    result = reconcile_table(
        spark, target_df(spark, tmp_path, schema, rows), settings_of, schema, range_rows=10
    )
    assert (result.ranges, result.mismatched_ranges) == (10, 4)
    assert_counts(result, 1, 3, 1)
    assert result.sample_missing == ["(10)"]
    assert result.sample_extra == ["(0)", "(47)", "(999)"]
    assert result.sample_different == ["(120)"]


def test_samples_are_capped_and_in_key_order(
    mariadb: MariaDBServer, spark: SparkSession, tmp_path: Path, settings_of: dict[str, Any]
) -> None:
    schema = create_table(mariadb, "capped", SIMPLE_DDL, simple_rows(list(range(1, 201))))
    rows = [r for r in source_rows(mariadb, schema) if r["id"] % 10 != 3]  # 20 missing
    random.Random(1).shuffle(rows)
    result = reconcile_table(
        spark, target_df(spark, tmp_path, schema, rows), settings_of, schema,
        range_rows=7, sample_keys=5,
    )
    assert_counts(result, 20, 0, 0)
    assert result.sample_missing == ["(3)", "(13)", "(23)", "(33)", "(43)"]
    assert result.ranges == 29


def test_composite_primary_key_in_index_order(
    mariadb: MariaDBServer, spark: SparkSession, tmp_path: Path, settings_of: dict[str, Any]
) -> None:
    """The key is (seq, tenant, day) although the columns come in another order."""
    ddl = (
        "tenant VARCHAR(20), day DATE, seq INT, payload VARCHAR(20), "
        "PRIMARY KEY (seq, tenant, day)"
    )
    tenants = ["acme", "Beta", "\U0001f600co", "zeta"]
    data = [
        (tenant, dt.date(2024, 1, 1) + dt.timedelta(days=d), seq, f"p{seq}{d}")
        for tenant in tenants for d in range(3) for seq in range(5)
    ]
    schema = create_table(mariadb, "composite", ddl, data)
    assert schema.primary_key == ("seq", "tenant", "day")
    rows = source_rows(mariadb, schema)
    assert len(rows) == 60
    identical = reconcile_table(
        spark, target_df(spark, tmp_path, schema, rows), settings_of, schema, range_rows=7
    )
    assert identical.ok and identical.ranges == 9, identical

    rows = [r for r in rows if (r["seq"], r["tenant"], r["day"]) != (2, "Beta", dt.date(2024, 1, 3))]
    rows.append({"tenant": "\U0001f600co", "day": dt.date(2030, 1, 1), "seq": 4, "payload": "x"})
    by_key(rows, seq=0, tenant="acme", day=dt.date(2024, 1, 2))["payload"] = "changed"
    result = reconcile_table(
        spark, target_df(spark, tmp_path, schema, rows), settings_of, schema, range_rows=7
    )
    assert_counts(result, 1, 1, 1)
    assert result.sample_missing == ["(2, Beta, 2024-01-03)"]
    assert result.sample_extra == ["(4, \U0001f600co, 2030-01-01)"]
    assert result.sample_different == ["(0, acme, 2024-01-02)"]
    assert result.primary_key == ("seq", "tenant", "day")


def test_keys_of_timestamp_unsigned_and_binary_types(
    mariadb: MariaDBServer, spark: SparkSession, tmp_path: Path, settings_of: dict[str, Any]
) -> None:
    """Keys arrive as different Python forms on each side (aware vs naive datetimes)."""
    ddl = (
        "ts TIMESTAMP(3) NOT NULL, u BIGINT UNSIGNED NOT NULL, vb VARBINARY(8) NOT NULL, "
        "v INT, PRIMARY KEY (ts, u, vb)"
    )
    base = dt.datetime(2024, 3, 10, 12, 0, 0)
    data = [
        (base + dt.timedelta(milliseconds=250 * i), 2**64 - 1 - i % 3, bytes([i % 4, 255]), i)
        for i in range(40)
    ]
    schema = create_table(mariadb, "odd_keys", ddl, data)
    rows = source_rows(mariadb, schema)
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "Asia/Kolkata")
    try:
        identical = reconcile_table(
            spark, target_df(spark, tmp_path, schema, rows), settings_of, schema, range_rows=6
        )
        assert identical.ok, identical
        by_key(rows, v=7)["v"] = -7
        result = reconcile_table(
            spark, target_df(spark, tmp_path, schema, rows), settings_of, schema, range_rows=6
        )
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    assert_counts(result, 0, 0, 1)
    assert result.sample_different == [
        f"({base + dt.timedelta(milliseconds=1750):%Y-%m-%dT%H:%M:%S.%f}, "
        f"{2**64 - 1 - 7 % 3}, 0x03ff)"
    ]


# ---- empty tables -----------------------------------------------------------------------------


def test_empty_source_and_empty_target(
    mariadb: MariaDBServer, spark: SparkSession, tmp_path: Path, settings_of: dict[str, Any]
) -> None:
    schema = create_table(mariadb, "empty", SIMPLE_DDL)
    result = reconcile_table(spark, target_df(spark, tmp_path, schema, []), settings_of, schema)
    assert result.ok
    assert (result.source_rows, result.target_rows, result.ranges) == (0, 0, 1)
    assert result.mismatched_ranges == 0


def test_empty_source_and_non_empty_target_is_all_extra(
    mariadb: MariaDBServer, spark: SparkSession, tmp_path: Path, settings_of: dict[str, Any]
) -> None:
    schema = create_table(mariadb, "empty_src", SIMPLE_DDL)
    rows = [{"id": i, "name": None, "amount": None} for i in range(25, 0, -1)]
    result = reconcile_table(
        spark, target_df(spark, tmp_path, schema, rows), settings_of, schema, range_rows=5
    )
    assert_counts(result, 0, 25, 0)
    assert (result.source_rows, result.target_rows) == (0, 25)
    assert (result.ranges, result.mismatched_ranges) == (1, 1)
    assert result.sample_extra == [f"({i})" for i in range(1, 11)]


# ---- schema drift and refusals ----------------------------------------------------------------


def test_column_missing_from_target_makes_every_row_different(
    mariadb: MariaDBServer, spark: SparkSession, tmp_path: Path, settings_of: dict[str, Any]
) -> None:
    schema = create_table(mariadb, "drift", SIMPLE_DDL, simple_rows(list(range(1, 31))))
    with_name = target_df(spark, tmp_path, schema, source_rows(mariadb, schema))
    # Extra target columns are ignored.
    widened = with_name.withColumn("added_in_the_lake", F.lit(1))
    assert reconcile_table(spark, widened, settings_of, schema).ok
    # A column the source has and the target lacks: no row can be right, even NULL ones.
    mariadb.query(f"UPDATE {DB}.drift SET name = NULL WHERE id <= 5")
    result = reconcile_table(spark, widened.drop("name"), settings_of, schema, range_rows=10)
    assert result.missing_columns == ("name",)
    assert_counts(result, 0, 0, 30)
    assert result.mismatched_ranges == 3
    assert result.to_metadata()["missing_columns"] == ["name"]


def test_table_without_primary_key_is_refused(
    mariadb: MariaDBServer, spark: SparkSession, settings_of: dict[str, Any]
) -> None:
    schema = create_table(mariadb, "no_pk", "a INT, b VARCHAR(5)", [(1, "x")])
    with pytest.raises(ReconcileError, match=rf"{DB}\.no_pk has no primary key"):
        reconcile_table(spark, spark.range(1), settings_of, schema)


def test_target_key_of_another_type_is_refused(
    mariadb: MariaDBServer, spark: SparkSession, tmp_path: Path, settings_of: dict[str, Any]
) -> None:
    schema = create_table(mariadb, "key_type", SIMPLE_DDL, simple_rows([1, 2]))
    target = target_df(spark, tmp_path, schema, source_rows(mariadb, schema))
    stringly = target.withColumn("id", F.col("id").cast("string"))
    with pytest.raises(ReconcileError, match=rf"{DB}\.key_type: primary-key column 'id'"):
        reconcile_table(spark, stringly, settings_of, schema)
    with pytest.raises(ReconcileError, match=rf"{DB}\.key_type: the target lacks primary-key"):
        reconcile_table(spark, target.drop("id"), settings_of, schema)


def test_unreadable_source_table_names_the_table(
    mariadb: MariaDBServer, spark: SparkSession, tmp_path: Path, settings_of: dict[str, Any]
) -> None:
    schema = create_table(mariadb, "dropped", SIMPLE_DDL, simple_rows([1]))
    target = target_df(spark, tmp_path, schema, source_rows(mariadb, schema))
    mariadb.query(f"DROP TABLE {DB}.dropped")
    with pytest.raises(ReconcileError, match=rf"{DB}\.dropped: reading the source failed"):
        reconcile_table(spark, target, settings_of, schema)


# ---- the snapshot -----------------------------------------------------------------------------


def test_snapshot_rows_match_its_gtid_under_concurrent_inserts(
    mariadb: MariaDBServer, spark: SparkSession, tmp_path: Path, settings_of: dict[str, Any]
) -> None:
    """One INSERT per transaction while reconciling: rows seen = rows before + GTIDs since.

    Any gap between the snapshot's read view and its reported GTID position breaks the equality.
    """
    schema = create_table(
        mariadb, "live", "id INT AUTO_INCREMENT PRIMARY KEY, v INT",
        [(i, i) for i in range(1, 1001)],
    )
    start_seq = int(mariadb.query("SELECT @@gtid_binlog_pos")[0][0].split("-")[-1])
    stop = threading.Event()
    inserted = [0]

    def write() -> None:
        with mariadb.root_connect() as conn, conn.cursor() as cur:
            while not stop.is_set():
                cur.execute(f"INSERT INTO {DB}.live (v) VALUES (0)")
                inserted[0] += 1

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        deadline = time.monotonic() + 30
        while inserted[0] < 200 and time.monotonic() < deadline:
            time.sleep(0.01)
        result = reconcile_table(
            spark, target_df(spark, tmp_path, schema, []), settings_of, schema, range_rows=100
        )
    finally:
        stop.set()
        writer.join(timeout=30)
    assert inserted[0] >= 200
    assert result.source_gtid is not None
    domain, server_id, seq = result.source_gtid.split("-")
    assert domain == "0" and int(server_id) > 0
    assert result.source_rows == 1000 + int(seq) - start_seq
    assert result.missing == result.source_rows and result.extra == 0


# ---- scale ------------------------------------------------------------------------------------


def test_50k_rows_reconcile_in_reasonable_time(
    mariadb: MariaDBServer,
    spark: SparkSession,
    tmp_path: Path,
    settings_of: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    ddl = (
        "id BIGINT PRIMARY KEY, name VARCHAR(64), amount DECIMAL(12,2), created DATETIME(6), "
        "ts TIMESTAMP(6) NULL DEFAULT NULL, flag TINYINT, score DOUBLE, note TEXT"
    )
    rng = random.Random(42)
    base = dt.datetime(2020, 1, 1)
    data = [
        (i * 3, f"customer {i} \u00e9", Decimal(rng.randrange(-10**9, 10**9)) / 100,
         base + dt.timedelta(microseconds=rng.randrange(10**14)),
         base + dt.timedelta(seconds=rng.randrange(10**8)), rng.randrange(2), rng.random(),
         None if i % 7 else "note " * rng.randrange(10))
        for i in range(50_000)
    ]
    schema = create_table(mariadb, "big", ddl, data)
    rows = source_rows(mariadb, schema)
    target = target_df(spark, tmp_path, schema, rows)
    timings: dict[str, float] = {}

    def timed(label: str, run: Callable[[], ReconcileResult]) -> ReconcileResult:
        started = time.perf_counter()
        result = run()
        timings[label] = time.perf_counter() - started
        return result

    identical = timed("identical", lambda: reconcile_table(spark, target, settings_of, schema))
    assert identical.ok and identical.ranges == 5 and identical.target_rows == 50_000

    rows = [r for r in rows if r["id"] != 3 * 12_345]
    rows.append({**rows[0], "id": 3 * 40_000 + 1})
    by_key(rows, id=3 * 33_333)["score"] = -1.0
    changed = target_df(spark, tmp_path, schema, rows)
    result = timed("3 differences", lambda: reconcile_table(spark, changed, settings_of, schema))
    assert_counts(result, 1, 1, 1)
    assert result.mismatched_ranges == 3
    with capsys.disabled():
        print(
            "\nreconcile 50k rows: "
            + ", ".join(f"{label} {seconds:.2f} s" for label, seconds in timings.items())
        )


# ---- range assignment and checksums without services ------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    keys=st.lists(st.integers(-1000, 1000), unique=True, max_size=60),
    probes=st.lists(st.integers(-2000, 2000), max_size=30),
    range_rows=st.integers(1, 12),
)
def test_ranges_partition_the_key_space(keys: list[int], probes: list[int], range_rows: int) -> None:
    """Source keys fall into their own chunk; any key falls into exactly one range, in order."""
    ordered = sorted((k,) for k in keys)
    starts = [key_order(ordered[i]) for i in range(0, len(ordered), range_rows)]
    n_ranges = max(len(starts), 1)
    for index, key in enumerate(ordered):
        assert _range_of(key_order(key), starts) == index // range_rows
    assigned = [(p, _range_of(key_order((p,)), starts)) for p in sorted(probes)]
    assert all(0 <= r < n_ranges for _, r in assigned)
    assert [r for _, r in assigned] == sorted(r for _, r in assigned)


@settings(max_examples=100, deadline=None)
@given(
    ids=st.lists(st.integers(0, 10**6), unique=True, max_size=80),
    split=st.integers(1, 20),
    range_rows=st.integers(1, 15),
)
def test_executor_partial_checksums_recombine_to_the_source_checksums(
    ids: list[int], split: int, range_rows: int
) -> None:
    """Partials from arbitrary batches, summed as 32-bit halves, equal the one-pass checksums."""
    hasher = _Hasher(("int", "string"), (0,))
    values = [(i, f"v{i}") for i in ids]
    pairs = sorted((hasher.pair(v) for v in values), key=lambda p: key_order(p[0]))
    starts = [key_order(pairs[i][0]) for i in range(0, len(pairs), range_rows)]
    expected, _ = _source_checksums(pairs, starts)
    assert all(row_hash(("int", "string"), v) == hasher.pair(v)[1] for v in values)

    batches = [
        pa.RecordBatch.from_pydict({"c0": [v[0] for v in chunk], "c1": [v[1] for v in chunk]})
        for chunk in (values[i : i + split] for i in range(0, len(values), split))
    ]
    mapper = _checksum_mapper(hasher, (0, 1), SimpleNamespace(value=starts))  # type: ignore[arg-type]
    totals: dict[int, list[int]] = {}
    for part in (batches[::2], batches[1::2]):  # two "partitions"
        for out in mapper(iter(part)):
            for row in out.to_pylist():
                total = totals.setdefault(row["range_id"], [0, 0, 0, 0])
                total[0] += row["rows"]
                total[1] ^= row["hash_xor"]
                total[2] += row["sum_hi"]
                total[3] += row["sum_lo"]
    mask = (1 << 64) - 1
    got = {r: (t[0], t[1] & mask, ((t[2] << 32) + t[3]) & mask) for r, t in totals.items()}
    assert got == expected
