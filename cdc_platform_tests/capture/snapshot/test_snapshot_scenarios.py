"""Incremental snapshots through the real engine in the harder situations of issue 3: large
chunks under whole-table updates, DDL mid-snapshot, conditions across restarts, kill -9 of the
engine and of the reader, idle sources and excluded-table traffic; and the review findings:
DDL on a quiet table, tables created after the engine started, FLOAT/DOUBLE and wide DECIMAL
keys, chunks that cannot be landed, RENAME/DROP naming several tables, and partition
exchanges. Each ends by reconciling the target against the source."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdc_platform.capture import source as source_sql
from cdc_platform.capture.landing.session_records import SnapshotRequest
from cdc_platform.capture.snapshot.chunks import schema_fingerprint
from cdc_platform.capture.snapshot.protocol import chunk_parts, write_request
from cdc_platform.capture.snapshot.reading.progress import (
    SnapshotProgress,
    SnapshotResult,
)
from cdc_platform_tests.capture.snapshot.reading.live_engine import (
    EngineThread,
    _engine_session,
    _engine_state,
    _items,
    _wait_until,
    finish_and_reconcile,
    invisible,
    snapshot_reader,
    snapshot_while_writing,
    streaming,
)
from cdc_platform_tests.conftest import CdcEnv


def test_whole_table_updates_during_one_large_chunk(cdc_env: CdcEnv, spark: Any) -> None:
    env = cdc_env
    _items(env)
    invisible(env, "INSERT INTO items SELECT seq, 'x', seq, 'a' FROM seq_1_to_6000")
    done = threading.Event()
    updates = [0]

    def update_everything() -> None:
        while not done.is_set():
            env.execute("UPDATE items SET price = price + 1, name = CONCAT('u', price)")
            updates[0] += 1

    with streaming(env):
        writer = threading.Thread(target=update_everything, daemon=True)
        writer.start()
        try:
            result = snapshot_reader(env, "items", chunk_size=10_000).run()
        finally:
            done.set()
            writer.join(60)
    assert result.status == "done" and result.chunks == 1 and updates[0] >= 1
    # Rows the updates touched after the chunk's read view came from the stream, not the chunk.
    assert result.rows_emitted is not None and result.rows_emitted <= 6000
    finish_and_reconcile(env, spark, "items")


def test_add_modify_and_drop_column_during_the_snapshot(cdc_env: CdcEnv, spark: Any) -> None:
    env = cdc_env
    _items(env)
    invisible(env, "INSERT INTO items SELECT seq, 'x', seq, 'a' FROM seq_1_to_1500")
    ddl = {3: "ALTER TABLE items ADD COLUMN note VARCHAR(10) DEFAULT 'new'",
           8: "ALTER TABLE items MODIFY name VARCHAR(80)",
           13: "ALTER TABLE items DROP COLUMN status"}
    ran: list[int] = []

    def on_progress(progress: SnapshotProgress) -> None:
        for at, statement in ddl.items():
            if progress.chunks >= at and at not in ran:
                ran.append(at)
                env.execute(statement)
                env.execute(f"UPDATE items SET name = 'after ddl {at}' WHERE id % 50 = {at}")

    with streaming(env):
        result = snapshot_reader(env, "items", chunk_size=50, max_pending=3).run(
            on_progress=on_progress)
    assert ran == [3, 8, 13]
    assert result.status == "done"
    finish_and_reconcile(env, spark, "items")
    row = env.target_rows(spark, "items")[0]
    assert "status" not in row and row["note"] == "new"


def test_condition_across_an_engine_restart(cdc_env: CdcEnv, spark: Any) -> None:
    env = cdc_env
    _items(env)
    invisible(env, "INSERT INTO items SELECT seq, 'x', seq, IF(seq % 4 = 0, 'open', 'closed') "
                   "FROM seq_1_to_800")
    engine = EngineThread(env)
    engine.start()
    reader = snapshot_reader(env, "items", chunk_size=10, max_pending=2,
                             condition="status = 'open'")
    restarted = threading.Event()

    def on_progress(progress: SnapshotProgress) -> None:
        if progress.chunks >= 3 and not restarted.is_set():
            restarted.set()
            engine.stop()
            env.execute("UPDATE items SET name = 'while down' WHERE id % 8 = 0")
            engine.start()

    try:
        result = reader.run(on_progress=on_progress)
    finally:
        engine.stop()
    assert restarted.is_set()
    assert result.status == "done" and result.rows == 200
    env.catch_up()
    env.materialise(spark, "items")
    target = {r["id"]: (r["name"], r["status"]) for r in env.target_rows(spark, "items")}
    # Exactly the matching rows (the invisible closed ones were never seen), as they are now.
    assert target == {i: (name, status) for i, name, status in env.query(
        "SELECT id, name, status FROM items WHERE status = 'open'")}


def test_idle_source_commits_the_last_chunk_on_heartbeats(cdc_env: CdcEnv, spark: Any) -> None:
    env = cdc_env
    _items(env)
    invisible(env, "INSERT INTO items SELECT seq, 'x', seq, 'a' FROM seq_1_to_300")
    before = env.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0]
    with streaming(env):
        result = snapshot_reader(env, "items", chunk_size=100).run()
    # Nothing was written: only heartbeats moved the engine to its chunk decisions.
    assert env.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0] == before
    assert (result.status, result.rows, result.chunks) == ("done", 300, 3)
    finish_and_reconcile(env, spark, "items")


def test_traffic_only_on_an_excluded_table(cdc_env: CdcEnv, spark: Any) -> None:
    env = cdc_env
    env.overrides["capture"] = {"tables": {"include": [rf"{env.db}\..*"],
                                           "exclude": [rf"{env.db}\.noise"]}}
    _items(env)
    env.execute("CREATE TABLE noise (id INT PRIMARY KEY AUTO_INCREMENT, v INT)")
    invisible(env, "INSERT INTO items SELECT seq, 'x', seq, 'a' FROM seq_1_to_500")
    def noise(done: threading.Event) -> None:
        while not done.is_set():
            env.execute("INSERT INTO noise (v) VALUES (1)")
            time.sleep(0.01)

    result = snapshot_while_writing(env, "items", noise, chunk_size=50)
    assert (result.status, result.rows) == ("done", 500)
    assert not (env.landing.root / "changelog" / env.db / "noise").exists()
    finish_and_reconcile(env, spark, "items")


def _process(env: CdcEnv, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "cdc_platform", *args,
                             "--config", str(env.write_config())],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_kill_9_of_engine_and_reader_mid_snapshot_then_resume(cdc_env: CdcEnv,
                                                              spark: Any) -> None:
    """Both processes die without a word; a new reader adopts the open session, a new engine
    rejects chunks its lost touched-key log cannot vouch for, and the snapshot ends exact."""
    env = cdc_env
    _items(env)
    invisible(env, "INSERT INTO items SELECT seq, 'x', seq, 'a' FROM seq_1_to_3000")
    table = f"{env.db}.items"
    engine = _process(env, "stream")
    reader = _process(env, "snapshot", table, "--chunk-size", "20")
    try:
        _wait_until(lambda: len((_session(env) or {}).get("committed", ())) >= 5, 60)
        reader.send_signal(signal.SIGKILL)
        env.execute("UPDATE items SET name = 'between kills' WHERE id % 7 = 0")
        time.sleep(0.5)
        engine.send_signal(signal.SIGKILL)
        reader.wait()
        engine.wait()
        first = _session(env)
        assert first is not None and first["state"] == "open"
        env.execute("DELETE FROM items WHERE id % 11 = 0",
                    "UPDATE items SET name = 'while down' WHERE id % 13 = 0")
        engine = _process(env, "stream")
        reader = _process(env, "snapshot", table, "--chunk-size", "20")
        _, errors = reader.communicate(timeout=240)
        assert reader.returncode == 0, errors.decode()[-2000:]
        assert b"resuming the session" in errors
    finally:
        for process in (reader, engine):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(60)
    session = _session(env)
    assert session is not None and session["state"] == "done"
    assert session["session_id"] == first["session_id"]  # resumed, not started over
    assert len(session["committed"]) > len(first["committed"])
    finish_and_reconcile(env, spark, "items")


def _session(env: CdcEnv) -> dict[str, Any] | None:
    try:
        return _engine_session(env, "items")
    except (AssertionError, KeyError, json.JSONDecodeError):
        return None


def test_a_run_that_ends_by_stop_is_not_resumed(cdc_env: CdcEnv, spark: Any) -> None:
    env = cdc_env
    _items(env)
    invisible(env, "INSERT INTO items SELECT seq, 'x', seq, 'a' FROM seq_1_to_200")
    with streaming(env):
        stop = threading.Event()
        first = snapshot_reader(env, "items", chunk_size=10).run(
            stop, lambda p: stop.set() if p.chunks >= 2 else None)
        again: SnapshotResult = snapshot_reader(env, "items", chunk_size=10).run()
    assert first.status == "stopped" and again.status == "done"
    assert again.session_id != first.session_id and again.rows == 200
    finish_and_reconcile(env, spark, "items")


# ---- review findings -----------------------------------------------------------------------------


@contextmanager
def deadline(seconds: float) -> Iterator[threading.Event]:
    """A stop event for a reader that set itself after ``seconds``: a snapshot that never
    finishes ends as 'stopped' and fails its test instead of hanging it."""
    stop = threading.Event()
    timer = threading.Timer(seconds, stop.set)
    timer.start()
    try:
        yield stop
    finally:
        timer.cancel()


@pytest.mark.parametrize("restart_engine", [False, True], ids=["same-engine", "engine-restarted"])
def test_ddl_on_a_quiet_table_restarts_the_snapshot_which_then_finishes(
        cdc_env: CdcEnv, spark: Any, restart_engine: bool) -> None:
    """No row event follows the ALTER, so no table map tells the engine the new columns: it
    reads them from the source. (It used to compare the new session's chunks with the old
    schema and reject them forever; after a restart the schemas of tables.json were as old.)"""
    env = cdc_env
    _items(env)
    invisible(env, "INSERT INTO items SELECT seq, 'x', seq, 'a' FROM seq_1_to_300")
    # The engine first passes the table's CREATE TABLE: a session it opened before it would
    # end for a restart at it (a wasted round trip, not the ALTER's restart).
    env.catch_up()
    engine = EngineThread(env)
    engine.start()
    altered = threading.Event()

    def on_progress(progress: SnapshotProgress) -> None:
        if progress.chunks >= 2 and not altered.is_set():
            altered.set()
            env.execute("ALTER TABLE items ADD COLUMN note VARCHAR(10) DEFAULT 'new'")
            if restart_engine:
                _wait_until(lambda: _engine_state(env, "items") == "restart")
                engine.stop()  # the next engine starts from tables.json
                engine.start()

    try:
        with deadline(120) as stop:
            result = snapshot_reader(env, "items", chunk_size=20, max_pending=2).run(
                stop, on_progress)
    finally:
        engine.stop()
    assert altered.is_set()
    assert (result.status, result.restarts, result.rows, result.rejected) == ("done", 1, 300, 0)
    assert _engine_session(env, "items")["rejected"] == {}
    finish_and_reconcile(env, spark, "items")
    assert {row["note"] for row in env.target_rows(spark, "items")} == {"new"}


@pytest.mark.parametrize("create_logged", [True, False],
                         ids=["create-in-binlog-no-rows", "create-not-in-binlog-with-rows"])
def test_table_created_after_the_engine_started(cdc_env: CdcEnv, spark: Any,
                                                create_logged: bool) -> None:
    """No row event of the table ever reached the engine: it learns the schema from the CREATE
    it processed, or else from the source when the session needs it."""
    env = cdc_env
    _items(env)
    create = "CREATE TABLE fresh (id INT PRIMARY KEY, v VARCHAR(10))"
    with streaming(env):
        _wait_until(lambda: f"{env.db}.items" in env.landing.read_tables())  # engine started
        if create_logged:
            env.execute(create)
        else:
            invisible(env, create, "INSERT INTO fresh VALUES (1, 'a'), (2, 'b'), (3, 'c')")
        with deadline(90) as stop:
            result = snapshot_reader(env, "fresh", chunk_size=2,
                                     stall_timeout_seconds=30).run(stop)
    assert (result.status, result.rows) == ("done", 0 if create_logged else 3)
    finish_and_reconcile(env, spark, "fresh")


@pytest.mark.parametrize(("kind", "keys"), [
    ("FLOAT", ["0.1", "0.2", "0.3"]),
    ("DOUBLE", ["0.1", "0.2", "0.1e0 + 0.2e0", "0.3", "-1e-300", "1.7976931348623157e308"]),
])
def test_float_and_double_keys_one_row_per_chunk(cdc_env: CdcEnv, spark: Any, kind: str,
                                                 keys: list[str]) -> None:
    """The largest FLOAT key used to be read as the server prints it (6 digits: 0.3 for the
    stored 0.30000001), so the last chunk's ``k <= 0.3`` left its row out, and the sweep then
    deleted it from the target."""
    env = cdc_env
    env.execute(f"CREATE TABLE measures (k {kind} PRIMARY KEY, v INT)")
    env.execute("INSERT INTO measures VALUES " + ", ".join(
        f"({key}, {i})" for i, key in enumerate(keys)))
    env.catch_up()
    env.materialise(spark, "measures")  # the target has every row
    invisible(env, "UPDATE measures SET v = v + 100")
    with streaming(env):
        result = snapshot_reader(env, "measures", chunk_size=1).run()
    assert (result.status, result.rows, result.chunks) == ("done", len(keys), len(keys))
    finish_and_reconcile(env, spark, "measures")
    assert sorted(r["v"] for r in env.target_rows(spark, "measures", order_by="k")) == [
        100 + i for i in range(len(keys))]


def test_decimal_key_wider_than_38_digits(cdc_env: CdcEnv, spark: Any) -> None:
    """Such keys land as text, which the lake does not order like the source: no range
    assertions, the sweep removes orphans. (Assertions used to be emitted with Decimal bounds
    in text columns, and building them failed the engine on every run.)"""
    env = cdc_env
    env.execute("CREATE TABLE wide (k DECIMAL(50,5) PRIMARY KEY, v INT)")
    env.execute("INSERT INTO wide SELECT seq * 1000000000000000000000000000000000000000001.5, "
                "seq FROM seq_1_to_40")
    env.catch_up()
    env.materialise(spark, "wide")
    invisible(env, "DELETE FROM wide WHERE v % 5 = 0", "UPDATE wide SET v = -v WHERE v % 3 = 0",
              "INSERT INTO wide SELECT -seq * 1000000000000000000000000000000000000000007, seq "
              "FROM seq_1_to_20")
    with streaming(env):
        result = snapshot_reader(env, "wide", chunk_size=7, stall_timeout_seconds=30).run()
    assert (result.status, result.rows) == ("done", 52)
    finish_and_reconcile(env, spark, "wide")


def test_a_chunk_that_cannot_be_landed_is_rejected_and_the_engine_keeps_running(
        cdc_env: CdcEnv, spark: Any) -> None:
    """A chunk whose rows do not fit the table (here a hand-written one) is rejected with the
    reason; it used to fail the engine's flush, and every run after it while it was pending."""
    env = cdc_env
    _items(env)
    invisible(env, "INSERT INTO items SELECT seq, 'x', seq, 'a' FROM seq_1_to_100")
    with source_sql.source_connection(env.settings.source.connection_settings()) as conn:
        schema = source_sql.read_table_schema(conn, env.db, "items")
    with streaming(env):
        write_request(env.landing, env.db, "items",
                      SnapshotRequest("hand-made", "open", ("id",), None, 10))
        _wait_until(lambda: _engine_state(env, "items") == "open")
        position = env.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0]
        directory = env.landing.root.joinpath(*chunk_parts(env.db, "items", "hand-made"))
        directory.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"id": [1], "name": ["x"], "price": ["not a number"],
                                 "status": ["a"]}), directory / "00000000.parquet")
        # (published as the reader publishes a manifest, in one rename: the engine polls
        # meanwhile, and one it lists half-written is rejected for that reason instead)
        (directory / "00000000.json.tmp").write_text(json.dumps({
            "session_id": "hand-made", "seq": 0, "rows": 1, "complete": False,
            "range_low": None, "range_high": [1], "low_open": True, "high_open": False,
            "low_watermark": position, "after": position,
            "fingerprint": schema_fingerprint(schema), "read_at": "now"}))
        (directory / "00000000.json.tmp").rename(directory / "00000000.json")
        _wait_until(lambda: "0" in _engine_session(env, "items")["rejected"])
        reason = _engine_session(env, "items")["rejected"]["0"]
        assert "could not be decided or landed" in reason and "price" in reason
        env.execute("UPDATE items SET name = 'after the bad chunk' WHERE id = 7")
        result = snapshot_reader(env, "items", chunk_size=30).run()  # replaces the session
    assert (result.status, result.rows) == ("done", 100)
    finish_and_reconcile(env, spark, "items")


@pytest.mark.parametrize("statement", [
    "RENAME TABLE other TO other_old, items TO items_old, items_new TO items",
    "RENAME TABLE `other` TO `other_old`, {db}.`items` TO `items_old`, items_new TO {db}.items",
], ids=["bare-names", "quoted-and-qualified"])
def test_a_rename_of_several_tables_restarts_the_snapshot_of_each(
        cdc_env: CdcEnv, spark: Any, statement: str) -> None:
    """The classic table swap of online schema-change tools: the snapshot restarts and reads
    the table now named ``items`` (the first name of the RENAME used to be the only one seen,
    and the snapshot mixed the rows of both tables)."""
    env = cdc_env
    _items(env)
    _items(env, "items_new")
    env.execute("CREATE TABLE other (id INT PRIMARY KEY)")
    invisible(env, "INSERT INTO items SELECT seq, 'old', seq, 'a' FROM seq_1_to_300",
              "INSERT INTO items_new SELECT seq * 2, 'new', seq, 'b' FROM seq_1_to_200")
    _snapshot_items_swapped_by(env, spark, lambda: env.execute(statement.format(db=env.db)))


@pytest.mark.parametrize("statement", [
    "ALTER TABLE parted EXCHANGE PARTITION p_low WITH TABLE items",
    "ALTER TABLE `parted` EXCHANGE PARTITION `p_low` WITH TABLE /* swap */ {db}.`items`",
], ids=["bare-names", "quoted-and-qualified"])
def test_a_partition_exchange_restarts_the_snapshot_of_the_other_table(
        cdc_env: CdcEnv, spark: Any, statement: str) -> None:
    """EXCHANGE PARTITION swaps the rows of a partition and of a table without row events:
    the snapshot of that table restarts and reads the rows it holds now (the table named after
    WITH TABLE used to be missed, and the snapshot mixed the rows from before and after)."""
    env = cdc_env
    _items(env)
    env.execute("CREATE TABLE parted (id INT PRIMARY KEY, name VARCHAR(40), "
                "price DECIMAL(10,2), status VARCHAR(8)) PARTITION BY RANGE (id) "
                "(PARTITION p_low VALUES LESS THAN (1000), "
                "PARTITION p_high VALUES LESS THAN MAXVALUE)")
    invisible(env, "INSERT INTO items SELECT seq, 'old', seq, 'a' FROM seq_1_to_300",
              "INSERT INTO parted SELECT seq * 2, 'new', seq, 'b' FROM seq_1_to_200")
    # (with autocommit: in a transaction, the exchange's validation read locks the table the
    # exchange then waits for, until innodb_lock_wait_timeout)
    _snapshot_items_swapped_by(env, spark, lambda: env.query(statement.format(db=env.db)))


def _snapshot_items_swapped_by(env: CdcEnv, spark: Any, swap: Callable[[], object]) -> None:
    """Snapshot ``items`` (300 'old' rows) and run ``swap`` after its third committed chunk,
    which puts another table's 200 'new' rows under the name ``items`` without row events:
    the snapshot restarts once and the target ends with exactly the new rows."""
    swapped = threading.Event()

    def on_progress(progress: SnapshotProgress) -> None:
        if progress.chunks >= 3 and not swapped.is_set():
            swapped.set()
            swap()

    # The engine first passes the tables' CREATE TABLEs: a session it opened before one of
    # them would end for a restart at it (a wasted round trip, not the swap's restart).
    env.catch_up()
    with streaming(env), deadline(120) as stop:
        result = snapshot_reader(env, "items", chunk_size=20, max_pending=2).run(
            stop, on_progress)
    assert swapped.is_set()
    assert (result.status, result.restarts, result.rows) == ("done", 1, 200)
    finish_and_reconcile(env, spark, "items")
    assert {row["name"] for row in env.target_rows(spark, "items")} == {"new"}


def test_wide_rows_are_chunked_by_bytes(cdc_env: CdcEnv, spark: Any) -> None:
    """Rows of 200-400 KB under a 500 KB chunk budget: one or two rows per chunk whatever the
    row count allows, and the target equals the source byte for byte."""
    env = cdc_env
    env.execute("CREATE TABLE blobs (id INT PRIMARY KEY, b LONGBLOB, note TEXT)")
    env.catch_up()
    invisible(env, "INSERT INTO blobs SELECT seq, REPEAT(UNHEX(MD5(seq)), 12500 * (1 + seq % 2)), "
                   "IF(seq % 5 = 0, REPEAT('ü', 1000), 'n') FROM seq_1_to_24",
              "INSERT INTO blobs SELECT seq, UNHEX(MD5(seq)), 'small' FROM seq_25_to_60")
    with streaming(env):
        result = snapshot_reader(env, "blobs", chunk_size=10, chunk_max_bytes=500_000).run()
    assert (result.status, result.rows) == ("done", 60)
    assert result.chunks >= 12 + 60 // 10, result  # the 24 wide rows alone take >= 12 chunks
    finish_and_reconcile(env, spark, "blobs")
    target = [(r["id"], bytes(r["b"]), r["note"]) for r in env.target_rows(spark, "blobs")]
    assert target == [(i, bytes(b), note) for i, b, note in
                      env.query("SELECT id, b, note FROM blobs ORDER BY id")]


@pytest.mark.cdc_config(capture={"surrogate_keys": {"{db}.people": ["email", "n"]}})
@pytest.mark.parametrize(("collation", "chunk_size"), [
    ("utf8mb4_general_ci", 1), ("utf8mb4_unicode_ci", 2)])
def test_text_surrogate_keys_in_insensitive_collations(cdc_env: CdcEnv, spark: Any,
                                                       collation: str, chunk_size: int) -> None:
    """'a@x' and 'A@X', 'b' and 'b ', 'e' and 'é' are equal in the collation and distinct rows
    of the target: the keyset scan used to read ``key > ('a@x', 1)`` after a chunk ending at
    ('a@x', 1), skipping ('A@X', 1), and the end-of-snapshot sweep then deleted it."""
    env = cdc_env
    env.execute(f"CREATE TABLE people (email VARCHAR(20) CHARACTER SET utf8mb4 COLLATE "
                f"{collation} NULL, n INT NOT NULL, v INT, KEY (email, n))")
    env.execute("INSERT INTO people VALUES ('a@x', 1, 1), ('A@X', 1, 2), ('b', 1, 3), "
                "('b ', 1, 4), ('é', 1, 5), ('e', 1, 6), (NULL, 1, 7), ('z', 1, 8)")
    env.catch_up()
    env.materialise(spark, "people")  # every row in the target, by the stream
    invisible(env, "INSERT INTO people VALUES ('Á@x', 1, 9), ('B  ', 1, 10), ('E', 1, 11), "
                   "('a@X', 2, 12)",
              "UPDATE people SET v = v + 100",
              "DELETE FROM people WHERE email = 'z'")
    with streaming(env):
        result = snapshot_reader(env, "people", chunk_size=chunk_size).run()
    assert (result.status, result.rows) == ("done", 11)
    env.catch_up()
    env.materialise(spark, "people")
    target = sorted(((r["email"], r["n"], r["v"]) for r in env.target_rows(
        spark, "people", order_by="v")), key=repr)
    assert target == sorted(env.query("SELECT email, n, v FROM people"), key=repr)
    finish_and_reconcile(env, spark, "people")
