"""The streaming spine against a real MariaDB and a real Spark session."""

from __future__ import annotations

import datetime as dt
import threading
import time
from decimal import Decimal

import pyarrow.parquet as pq
import pytest

from cdc_platform_tests.conftest import CdcEnv


def changelog_records(env: CdcEnv, table: str) -> list[dict]:
    rows: list[dict] = []
    for _, _, path in env.landing.segments(env.db, table):
        rows += pq.read_table(path).to_pylist()
    return rows


def test_inserts_updates_deletes_and_multi_row_transactions_reach_the_target(cdc_env, spark):
    env = cdc_env
    env.execute("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(20), qty INT)")
    env.execute("INSERT INTO items VALUES (1,'a',1),(2,'b',2),(3,'c',3)")
    env.execute("UPDATE items SET qty = qty * 10 WHERE id >= 2",
                "DELETE FROM items WHERE id = 1",
                "INSERT INTO items VALUES (4,'d',4)")
    env.execute("UPDATE items SET id = 5 WHERE id = 4")  # key change: old key must disappear
    stats = env.catch_up()
    assert stats.records_by_table == {f"{env.db}.items": 9}

    result = env.materialise(spark, "items")
    # Keys 1 and 4 were inserted and deleted within the batch: no effect on the target.
    assert (result.inserts, result.updates, result.deletes) == (3, 0, 0)
    assert env.target_rows(spark, "items") == [
        {"id": 2, "name": "b", "qty": 20},
        {"id": 3, "name": "c", "qty": 30},
        {"id": 5, "name": "d", "qty": 4},
    ]
    assert env.reconcile(spark, "items").ok

    # A second round folds only the new records into the existing table.
    env.execute("DELETE FROM items WHERE id = 2", "INSERT INTO items VALUES (6,'f',6)")
    env.catch_up()
    result = env.materialise(spark, "items")
    assert result.records_read == 2
    assert [r["id"] for r in env.target_rows(spark, "items")] == [3, 5, 6]
    assert env.reconcile(spark, "items").ok


def test_rolled_back_transaction_leaves_no_trace(cdc_env, spark):
    env = cdc_env
    env.execute("CREATE TABLE accounts (id INT PRIMARY KEY, balance INT)")
    env.execute("INSERT INTO accounts VALUES (1, 100)")
    with env.mariadb.root_connect(database=env.db, autocommit=False) as conn:
        with conn.cursor() as cur:
            cur.execute("INSERT INTO accounts VALUES (2, 999)")
            cur.execute("UPDATE accounts SET balance = 0 WHERE id = 1")
        conn.rollback()
    # A savepoint rolled back inside a committed transaction.
    with env.mariadb.root_connect(database=env.db, autocommit=False) as conn:
        with conn.cursor() as cur:
            cur.execute("INSERT INTO accounts VALUES (3, 3)")
            cur.execute("SAVEPOINT s1")
            cur.execute("INSERT INTO accounts VALUES (4, 4)")
            cur.execute("ROLLBACK TO SAVEPOINT s1")
        conn.commit()
    env.catch_up()
    records = changelog_records(env, "accounts")
    assert sorted(r["id"] for r in records) == [1, 3]
    assert all(r["balance"] != 999 and r["balance"] != 0 for r in records)
    env.materialise(spark, "accounts")
    assert env.target_rows(spark, "accounts") == [{"id": 1, "balance": 100},
                                                  {"id": 3, "balance": 3}]


@pytest.mark.cdc_config(capture={"excluded_columns": [r".*\.secret"]})
def test_excluded_tables_and_columns_never_appear(cdc_env, spark):
    env = cdc_env
    env.overrides.setdefault("capture", {})["tables"] = {
        "include": [rf"{env.db}\..*"], "exclude": [rf"{env.db}\.private_.*"]}
    env.execute("CREATE TABLE users (id INT PRIMARY KEY, name VARCHAR(20), secret VARCHAR(20))")
    env.execute("CREATE TABLE private_notes (id INT PRIMARY KEY, body TEXT)")
    env.execute("INSERT INTO users VALUES (1, 'ann', 'hunter2')",
                "INSERT INTO private_notes VALUES (1, 'do not copy')")
    env.execute("UPDATE users SET secret = 'changed', name = 'anne'")
    env.catch_up()
    assert not env.landing.table_dir(env.db, "private_notes").exists()
    assert f"{env.db}.private_notes" not in env.landing.read_tables()
    records = changelog_records(env, "users")
    assert records and all("secret" not in r for r in records)
    assert not any("hunter2" in path.read_bytes().decode(errors="ignore")
                   for path in env.landing.root.rglob("*") if path.is_file())
    env.materialise(spark, "users")
    assert env.target_rows(spark, "users") == [{"id": 1, "name": "anne"}]
    assert env.reconcile(spark, "users").ok


def test_added_column_reaches_the_target_schema(cdc_env, spark):
    env = cdc_env
    env.execute("CREATE TABLE products (id INT PRIMARY KEY, name VARCHAR(20))")
    env.execute("INSERT INTO products VALUES (1, 'old'), (2, 'older')")
    env.catch_up()
    env.materialise(spark, "products")
    env.execute("ALTER TABLE products ADD COLUMN price DECIMAL(8,2) NULL")
    env.execute("INSERT INTO products VALUES (3, 'new', 9.99)")
    env.execute("UPDATE products SET price = 1.50 WHERE id = 1")
    env.catch_up()
    env.materialise(spark, "products")
    assert env.target_rows(spark, "products") == [
        {"id": 1, "name": "old", "price": Decimal("1.50")},
        {"id": 2, "name": "older", "price": None},
        {"id": 3, "name": "new", "price": Decimal("9.99")},
    ]
    assert env.reconcile(spark, "products").ok


TYPES_TABLE = """
CREATE TABLE types (
  id BIGINT UNSIGNED PRIMARY KEY, d DECIMAL(20,6), dt6 DATETIME(6), ts TIMESTAMP(3) NULL,
  da DATE, tm TIME(2), j JSON, bl BLOB, bi BINARY(4), vb VARBINARY(8), e ENUM('x','y','z'),
  s SET('a','b','c'), b10 BIT(10), b64 BIT(64), f FLOAT, db DOUBLE, txt TEXT, ub BIGINT UNSIGNED,
  y YEAR, i8 TINYINT, i32 INT UNSIGNED, c CHAR(3)
) CHARACTER SET utf8mb4
"""


def test_every_common_column_type_round_trips_to_the_target(cdc_env, spark):
    env = cdc_env
    env.execute(TYPES_TABLE)
    env.execute(
        "INSERT INTO types VALUES (18446744073709551615, -12345678901234.123456, "
        "'1000-01-01 00:00:00.000001', '2038-01-19 03:14:07.999', '9999-12-31', "
        "'-838:59:59.99', '{\"k\": [1, 2.5, \"😀\"]}', x'00ff7f80', x'01020304', x'', 'z', "
        "'a,c', b'1010101010', b'1111111111111111111111111111111111111111111111111111111111111111', "
        "3.4028e38, -2.2250738585072014e-308, 'héllo 😀 𝄞', 0, 2155, -128, 4294967295, 'abc')")
    env.execute("INSERT INTO types (id) VALUES (1)")  # every other column NULL
    env.execute("INSERT INTO types (id, tm, f, db, s, bi) VALUES (2, '00:00:00.5', 0.1, 0.1, '', "
                "x'0100')")
    env.execute("UPDATE types SET txt = '𝄞 updated', d = 0.000001 WHERE id = 2")
    env.catch_up()
    env.materialise(spark, "types")

    result = env.reconcile(spark, "types")
    assert result.ok, result.to_metadata()
    rows = {r["id"]: r for r in env.target_rows(spark, "types")}
    big = rows[Decimal(18446744073709551615)]
    assert big["d"] == Decimal("-12345678901234.123456")
    assert big["dt6"] == dt.datetime(1000, 1, 1, 0, 0, 0, 1)
    assert big["ts"].replace(tzinfo=None) == dt.datetime(2038, 1, 19, 3, 14, 7, 999000)
    assert big["da"] == dt.date(9999, 12, 31)
    assert big["tm"] == "-838:59:59.99"
    assert big["bl"] == bytes.fromhex("00ff7f80") and big["vb"] == b""
    assert (big["e"], big["s"], big["b10"], big["b64"]) == ("z", "a,c", 0b1010101010,
                                                           Decimal(2**64 - 1))
    assert big["txt"] == "héllo 😀 𝄞" and big["c"] == "abc"
    assert (big["ub"], big["y"], big["i8"], big["i32"]) == (Decimal(0), 2155, -128, 4294967295)
    assert big["db"] == -2.2250738585072014e-308
    assert all(v is None for k, v in rows[Decimal(1)].items() if k != "id")
    assert rows[Decimal(2)]["tm"] == "00:00:00.50" and rows[Decimal(2)]["txt"] == "𝄞 updated"
    assert rows[Decimal(2)]["bi"] == b"\x01\x00\x00\x00"  # BINARY(n) keeps its zero padding


def test_dropped_source_connection_resumes_without_loss_or_replay(cdc_env, spark):
    env = cdc_env
    env.execute("CREATE TABLE events (id INT AUTO_INCREMENT PRIMARY KEY, v INT)")
    engine = env.engine()
    stop = threading.Event()
    thread = threading.Thread(target=engine.run, args=(stop,), daemon=True)
    thread.start()
    for round_ in range(3):
        for i in range(50):
            env.execute("INSERT INTO events (v) VALUES (%s)", args=(round_ * 100 + i,))
        deadline = time.monotonic() + 20
        while engine.stats.records < (round_ + 1) * 50 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert env.mariadb.kill_connections(env.mariadb.cdc_user), "no engine connection"
    env.execute("UPDATE events SET v = -v WHERE id % 7 = 0")
    deadline = time.monotonic() + 30
    while engine.stats.records < 150 + 21 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    thread.join(30)
    assert not thread.is_alive()
    assert engine.stats.reconnects >= 3
    records = changelog_records(env, "events")
    # Resumed from the engine's own position: nothing replayed, nothing lost.
    assert len(records) == 150 + 21
    assert len({(r["__cdc_gtid"], r["id"], r["__cdc_op"]) for r in records}) == len(records)
    env.materialise(spark, "events")
    assert env.reconcile(spark, "events").ok


def test_idle_stream_stays_alive_on_heartbeats_and_reports_zero_lag(cdc_env):
    env = cdc_env
    env.execute("CREATE TABLE pings (id INT PRIMARY KEY)")
    env.execute("INSERT INTO pings VALUES (1)")
    engine = env.engine()
    stop = threading.Event()
    thread = threading.Thread(target=engine.run, args=(stop,), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while engine.stats.records < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(3.5)  # idle: only heartbeats (every second) arrive
        assert engine.stats.lag_seconds == 0.0
        assert engine.stats.reconnects == 0
        assert engine.landing.read_checkpoint().next_pos == 2
        env.execute("INSERT INTO pings VALUES (2)")
        deadline = time.monotonic() + 10
        while engine.landing.read_checkpoint().next_pos < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.landing.read_checkpoint().next_pos == 3
    finally:
        stop.set()
        thread.join(30)
    assert engine.state.value == "stopped"


def test_first_start_after_purged_binlogs_still_catches_up(tmp_path):
    """'earliest' is the oldest binlog still on the source, even after older ones were purged.

    Its GTID state covers the purged domain, so 'caught up' can hold.
    """
    from cdc_platform.capture.engine import CaptureEngine, EngineOptions
    from cdc_platform.capture.landing.zone import LandingZone
    from cdc_platform.capture.source import TableSelector
    from cdc_platform.devservices.mariadb import MariaDBServer

    server = MariaDBServer(base_dir=tmp_path / "mariadb", server_id=3)
    server.start()
    try:
        server.query("CREATE DATABASE shop")
        server.query("CREATE TABLE shop.t (id INT PRIMARY KEY)")
        with server.root_connect() as conn, conn.cursor() as cur:
            cur.execute("SET SESSION gtid_domain_id = 1")
            cur.execute("INSERT INTO shop.t VALUES (1)")
            # MariaDB purges a file only once a binlog checkpoint has moved past it.
            for _ in range(2):
                cur.execute("FLUSH BINARY LOGS")
                time.sleep(1)
            cur.execute("SHOW BINARY LOGS")
            newest = cur.fetchall()[-1][0]
            cur.execute(f"PURGE BINARY LOGS TO '{newest}'")
            cur.execute("SHOW BINARY LOGS")
            assert [row[0] for row in cur.fetchall()] == [newest], "the purge did not happen"
        server.query("INSERT INTO shop.t VALUES (2)")  # domain 0, in the remaining binlog
        options = EngineOptions(server_name="p", flavour="mariadb", server_id=77,
                                connection_settings=server.connection_settings(),
                                selector=TableSelector(include=(r"shop\..*",)),
                                heartbeat_seconds=1)
        engine = CaptureEngine(options, LandingZone(str(tmp_path / "landing"), "p"))
        done = threading.Event()
        thread = threading.Thread(target=lambda: (engine.run(stop_when_caught_up=True),
                                                  done.set()), daemon=True)
        thread.start()
        assert done.wait(30), f"never caught up; processed {engine.stats.position}"
        assert engine.stats.records == 1  # only what the binlog still holds
        assert engine.stats.position.startswith("0-3-") and "1-3-" in engine.stats.position
    finally:
        server.stop()
