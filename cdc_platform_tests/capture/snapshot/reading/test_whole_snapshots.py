"""Whole snapshots through the real capture engine, ending with target == source: rows the
binlog never saw, writes during the snapshot, chunk size one, empty tables, composite and
surrogate keys, an additional condition.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from cdc_platform.capture.snapshot.reading.progress import SnapshotStatus
from cdc_platform_tests.capture.snapshot.reading.live_engine import (
    _items,
    finish_and_reconcile,
    invisible,
    snapshot_reader,
    snapshot_while_writing,
    streaming,
)
from cdc_platform_tests.conftest import CdcEnv


def test_snapshot_only_brings_rows_the_binlog_never_saw_and_removes_orphans(cdc_env: CdcEnv,
                                                                            spark: Any) -> None:
    env = cdc_env
    _items(env)
    env.execute("INSERT INTO items SELECT seq, CONCAT('seen ', seq), seq, 'open' "
                "FROM seq_1_to_50")
    env.catch_up()
    env.materialise(spark, "items")  # the target has rows 1..50 as the binlog had them
    invisible(env, "INSERT INTO items SELECT seq, CONCAT('hidden ', seq), seq / 3, 'new' "
                   "FROM seq_51_to_700",
              "UPDATE items SET name = 'changed' WHERE id <= 10",
              "DELETE FROM items WHERE id BETWEEN 20 AND 25")
    with streaming(env):
        result = snapshot_reader(env, "items", chunk_size=64).run()
    assert (result.status, result.rows, result.rejected) == ("done", 694, 0)
    assert result.chunks == 11 and result.start_gtid and result.end_gtid
    finish_and_reconcile(env, spark, "items")
    rows = env.target_rows(spark, "items")
    assert len(rows) == 694 and rows[0]["name"] == "changed"
    assert not (env.landing.root / "snapshots" / env.db / "items" / "chunks" /
                result.session_id).exists()


def test_inserts_updates_and_deletes_during_the_snapshot(cdc_env: CdcEnv, spark: Any) -> None:
    env = cdc_env
    _items(env)
    invisible(env, "INSERT INTO items SELECT seq * 2, CONCAT('n', seq), seq, 'open' "
                   "FROM seq_1_to_3000")
    writes: list[int] = []

    def write(done: threading.Event) -> None:
        rng = random.Random(7)
        with env.mariadb.root_connect(database=env.db, autocommit=True) as conn, \
                conn.cursor() as cur:
            while not done.is_set():
                key = rng.randint(1, 6100)  # inside every chunk's range, and past the end
                op = rng.random()
                if op < 0.4:
                    cur.execute("INSERT INTO items VALUES (%s, 'ins', 1, 'w') ON DUPLICATE KEY "
                                "UPDATE name = 'upsert', price = price + 1", (key,))
                elif op < 0.8:
                    cur.execute("UPDATE items SET name = CONCAT(name, '+'), price = price + 1 "
                                "WHERE id BETWEEN %s AND %s", (key, key + 3))
                else:
                    cur.execute("DELETE FROM items WHERE id = %s", (key,))
                writes.append(key)
                time.sleep(0.002)

    result = snapshot_while_writing(env, "items", write, chunk_size=100)
    assert result.status == "done" and result.chunks >= 25
    assert len(writes) > 50
    finish_and_reconcile(env, spark, "items")


def test_chunk_size_one(cdc_env: CdcEnv, spark: Any) -> None:
    env = cdc_env
    _items(env)
    invisible(env, "INSERT INTO items SELECT seq, 'x', seq, 'a' FROM seq_1_to_25")
    with streaming(env):
        result = snapshot_reader(env, "items", chunk_size=1).run()
    assert (result.status, result.rows, result.chunks) == ("done", 25, 25)
    finish_and_reconcile(env, spark, "items")


def test_empty_table_removes_the_rows_the_target_still_has(cdc_env: CdcEnv, spark: Any) -> None:
    env = cdc_env
    _items(env)
    env.execute("INSERT INTO items SELECT seq, 'x', seq, 'a' FROM seq_1_to_5")
    env.catch_up()
    env.materialise(spark, "items")
    invisible(env, "DELETE FROM items")
    with streaming(env):
        result = snapshot_reader(env, "items").run()
    assert (result.status, result.rows, result.chunks) == ("done", 0, 1)
    finish_and_reconcile(env, spark, "items")
    assert env.target_rows(spark, "items") == []


def test_composite_primary_key(cdc_env: CdcEnv, spark: Any) -> None:
    env = cdc_env
    env.execute("CREATE TABLE order_lines (tenant INT, day DATE, code VARCHAR(8), qty INT, "
                "PRIMARY KEY (tenant, day, code))")
    env.execute("INSERT INTO order_lines SELECT seq % 3, '2025-01-01' + INTERVAL seq % 5 DAY, "
                "CONCAT('c', seq), seq FROM seq_1_to_40")
    env.catch_up()
    env.materialise(spark, "order_lines")
    invisible(env, "INSERT INTO order_lines SELECT seq % 4, '2025-02-01' + INTERVAL seq % 7 DAY, "
                   "CONCAT('h', seq), seq FROM seq_1_to_200",
              "DELETE FROM order_lines WHERE code IN ('c1', 'c2', 'c3')",
              "UPDATE order_lines SET qty = -1 WHERE tenant = 0")
    with streaming(env):
        result = snapshot_reader(env, "order_lines", chunk_size=7).run()
    assert result.status == "done" and result.rows == 237
    finish_and_reconcile(env, spark, "order_lines")


@pytest.mark.cdc_config(capture={"surrogate_keys": {"{db}.events": ["a", "b"]}})
def test_surrogate_key_for_a_table_without_primary_key_and_skip_without_one(
        cdc_env: CdcEnv, spark: Any) -> None:
    env = cdc_env
    env.execute("CREATE TABLE events (a INT NULL, b INT NULL, v VARCHAR(10), UNIQUE KEY (a, b))",
                "CREATE TABLE loose (a INT, v VARCHAR(10))")
    env.execute("INSERT INTO events VALUES (NULL, NULL, 'seen'), (5, 5, 'orphan')")
    env.catch_up()
    env.materialise(spark, "events")
    invisible(env, "DELETE FROM events WHERE a = 5",
              "UPDATE events SET v = 'nn' WHERE a IS NULL AND b IS NULL",
              "INSERT INTO events VALUES (NULL, 1, 'n1'), (1, NULL, '1n'), (1, 1, '11'), "
              "(1, 2, '12'), (2, 1, '21'), (3, NULL, '3n')",
              "INSERT INTO loose VALUES (1, 'x')")
    with streaming(env):
        skipped = snapshot_reader(env, "loose").run()
        result = snapshot_reader(env, "events", chunk_size=2).run()
        writes = ["UPDATE events SET v = 'w' WHERE a IS NULL AND b = 1",
                  "DELETE FROM events WHERE a = 3 AND b IS NULL"]
        env.execute(*writes)
    assert (skipped.status, skipped.status_text) == (
        SnapshotStatus.SKIPPED,
        "skipped: no primary key and no surrogate key (set capture.surrogate_keys)")
    assert (result.status, result.rows, result.chunks) == ("done", 7, 4)
    # The target merges by (a, b), NULL parts matching NULL: one row per key, orphan (5, 5) gone.
    finish_and_reconcile(env, spark, "events")
    assert sorted((r["a"] is None, r["a"], r["b"] is None, r["b"], r["v"])
                  for r in env.target_rows(spark, "events", order_by="a")) == sorted(
        (a is None, a, b is None, b, v) for a, b, v in env.query("SELECT a, b, v FROM events"))


def test_additional_condition_only_touches_matching_rows(cdc_env: CdcEnv, spark: Any) -> None:
    env = cdc_env
    _items(env)
    env.execute("INSERT INTO items SELECT seq, 'seen', seq, IF(seq % 2, 'open', 'closed') "
                "FROM seq_1_to_20")
    env.catch_up()
    env.materialise(spark, "items")
    invisible(env, "DELETE FROM items WHERE id IN (1, 2)",  # 1 open, 2 closed: orphans
              "UPDATE items SET name = 'changed' WHERE id IN (3, 4)",
              "INSERT INTO items SELECT seq, 'hidden', seq, IF(seq % 2, 'open', 'closed') "
              "FROM seq_21_to_40")
    with streaming(env):
        result = snapshot_reader(env, "items", chunk_size=4, condition="status = 'open'").run()
    assert result.status == "done" and result.rows == 19  # 3..39 odd
    env.catch_up()
    env.materialise(spark, "items")
    target = {r["id"]: r["name"] for r in env.target_rows(spark, "items")}
    # A filtered snapshot says nothing about rows outside its condition, nor deletes anything:
    # orphans 1 and 2 stay, closed rows keep their binlog state, hidden closed rows stay out.
    assert set(target) == set(range(1, 21)) | set(range(21, 40, 2))
    assert target[3] == "changed" and target[4] == "seen"
    assert all(target[i] == "hidden" for i in range(21, 40, 2))
    # ...and the source's rows that match it are in the target as they are, every column.
    matching = [dict(zip(("id", "name", "price", "status"), row, strict=True)) for row in
                env.query("SELECT id, name, price, status FROM items WHERE status = 'open' "
                          "ORDER BY id")]
    keys = {row["id"] for row in matching}
    assert len(matching) == 19
    assert [r for r in env.target_rows(spark, "items") if r["id"] in keys] == matching
