"""Source features real replicas have, against the real MariaDB: XA transactions, compressed
binlog events, CREATE TABLE ... SELECT, large transactions (spilled), and a replica without
log_slave_updates (refused)."""

from __future__ import annotations

import threading
from contextlib import contextmanager, suppress
from typing import Any

import pyarrow.parquet as pq
import pymysql
import pytest

from cdc_platform.capture.binlog import stream as binlog
from cdc_platform.capture.changes.transactions import Statement
from cdc_platform.capture.engine import CaptureEngine, EngineOptions
from cdc_platform.capture.events import EngineError
from cdc_platform.capture.source import PrerequisiteError
from cdc_platform.devservices.mariadb import MariaDBServer
from cdc_platform_tests.conftest import CdcEnv


@pytest.fixture(autouse=True, params=["by size", "columns"])
def rows_form(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every feature (XA, savepoints, spills, budgets, ...) also with every rows event
    decoded column-wise, however small: the engine then holds Arrow blocks, not records."""
    if request.param == "columns":
        monkeypatch.setattr(binlog, "COLUMNAR_MIN_EVENT_BYTES", 0)
    return request.param


def records(env: CdcEnv, table: str) -> list[dict]:
    rows: list[dict] = []
    for _, _, path in env.landing.segments(env.db, table):
        rows += pq.read_table(path).to_pylist()
    return sorted(rows, key=lambda r: r["__cdc_pos"])


def spill_files(env: CdcEnv) -> list:
    directory = env.landing.root / "spill"
    return sorted(directory.iterdir()) if directory.is_dir() else []


def binlog_events(env: CdcEnv, since: tuple[str, int]) -> list[tuple]:
    """SHOW BINLOG EVENTS from ``since`` (file, position): (event type, info) pairs. (Only
    from there: other tests' statements in the same file may hold bytes that are not UTF-8.)"""
    file, position = since
    return [(r[2], r[5]) for r in
            env.mariadb.query(f"SHOW BINLOG EVENTS IN '{file}' FROM {position}")]


def master_pos(env: CdcEnv) -> tuple[str, int]:
    file, position = env.mariadb.query("SHOW MASTER STATUS")[0][:2]
    return str(file), int(position)


def xa(env: CdcEnv, xid: str, *statements: str, finish: str | None = None) -> None:
    with env.mariadb.root_connect(database=env.db) as conn, conn.cursor() as cur:
        cur.execute(f"XA START '{xid}'")
        for statement in statements:
            cur.execute(statement)
        cur.execute(f"XA END '{xid}'")
        if finish == "ONE PHASE":
            cur.execute(f"XA COMMIT '{xid}' ONE PHASE")
            return
        cur.execute(f"XA PREPARE '{xid}'")
        if finish:
            cur.execute(f"XA {finish} '{xid}'")


def test_xa_transactions_land_at_xa_commit_and_vanish_at_xa_rollback(cdc_env):
    env = cdc_env
    env.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20))")
    since = master_pos(env)
    xa(env, "committed", "INSERT INTO t VALUES (1, 'a')", "UPDATE t SET v = 'b' WHERE id = 1",
       finish="COMMIT")
    xa(env, "rolled back", "INSERT INTO t VALUES (2, 'x')", finish="ROLLBACK")
    xa(env, "one phase", "INSERT INTO t VALUES (3, 'c')", finish="ONE PHASE")
    kinds = [kind for kind, _ in binlog_events(env, since)]
    assert kinds.count("XA_prepare") == 2  # the shapes this test is about are in the binlog
    env.catch_up()
    landed = records(env, "t")
    assert [(r["__cdc_op"], r["id"], r["v"]) for r in landed] == [
        ("c", 1, "a"), ("u", 1, "b"), ("c", 3, "c")]
    # Rows of an XA transaction take its XA COMMIT's GTID (when they became visible).
    gtids = [info for kind, info in binlog_events(env, since) if kind == "Gtid"]
    commit_gtid = gtids[1].split()[-1]  # the group after the first prepare: XA COMMIT
    assert landed[0]["__cdc_gtid"] == landed[1]["__cdc_gtid"] == commit_gtid
    checkpoint = env.landing.read_checkpoint()
    assert "xa_prepared" not in checkpoint.extra
    assert spill_files(env) == []


def test_prepared_xa_survives_an_engine_restart_until_its_commit(cdc_env):
    env = cdc_env
    env.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20))")
    xa(env, "long", "INSERT INTO t VALUES (1, 'a')", "INSERT INTO t VALUES (2, 'b')")
    xa(env, "doomed", "INSERT INTO t VALUES (9, 'z')")
    env.execute("INSERT INTO t VALUES (3, 'c')")
    env.catch_up()  # the prepares' GTIDs are in this checkpoint, their rows are not landed
    assert [r["id"] for r in records(env, "t")] == [3]
    prepared = env.landing.read_checkpoint().extra["xa_prepared"]
    assert len(prepared) == 2 and len(spill_files(env)) == 2  # (one file per transaction)
    # The engine object is gone; a new one must still know the prepared rows.
    env.mariadb.query("XA COMMIT 'long'")
    env.mariadb.query("XA ROLLBACK 'doomed'")
    env.catch_up()
    assert [(r["id"], r["v"]) for r in records(env, "t")] == [(3, "c"), (1, "a"), (2, "b")]
    assert "xa_prepared" not in env.landing.read_checkpoint().extra
    assert spill_files(env) == []
    # A restart after the commit replays nothing twice.
    env.catch_up()
    assert len(records(env, "t")) == 3


@contextmanager
def binlog_compression(env: CdcEnv):
    env.mariadb.query("SET GLOBAL log_bin_compress = ON")
    env.mariadb.query("SET GLOBAL log_bin_compress_min_len = 10")
    try:
        yield
    finally:
        env.mariadb.query("SET GLOBAL log_bin_compress = OFF")


def test_compressed_binlog_events_land_like_plain_ones(cdc_env):
    env = cdc_env
    env.execute("CREATE TABLE t (id INT PRIMARY KEY, v TEXT, n INT)")
    since = master_pos(env)
    with binlog_compression(env):
        env.execute("INSERT INTO t VALUES (1, REPEAT('abc', 500), 1), (2, 'short', 2)")
        env.execute("UPDATE t SET v = REPEAT('x', 300), n = 10 WHERE id = 1")
        env.execute("DELETE FROM t WHERE id = 2")
        # A compressed DDL (QUERY_COMPRESSED_EVENT) must still be tracked.
        env.execute("ALTER TABLE t ADD COLUMN w VARCHAR(100) DEFAULT 'a long enough default'")
        env.execute("INSERT INTO t (id, v, n, w) VALUES (3, REPEAT('y', 2000), 3, 'w')")
    kinds = {kind for kind, _ in binlog_events(env, since)}
    assert {"Write_rows_compressed_v1", "Update_rows_compressed_v1",
            "Delete_rows_compressed_v1", "Query_compressed"} <= kinds
    env.catch_up()
    landed = [(r["__cdc_op"], r["id"], r["v"], r["n"], r.get("w")) for r in records(env, "t")]
    assert landed == [
        ("c", 1, "abc" * 500, 1, None), ("c", 2, "short", 2, None),
        ("u", 1, "x" * 300, 10, None), ("d", 2, None, None, None),
        ("c", 3, "y" * 2000, 3, "w"),
    ]


def test_create_table_select_lands_every_row_even_when_stopped_mid_statement(cdc_env):
    env = cdc_env
    env.execute("CREATE TABLE src (id INT PRIMARY KEY, v VARCHAR(10))")
    env.execute("INSERT INTO src SELECT seq, CONCAT('v', seq) FROM seq_1_to_300")
    env.catch_up()
    env.execute("CREATE TABLE copied (PRIMARY KEY (id)) AS SELECT * FROM src")

    engine = env.engine()
    stop = threading.Event()
    apply = engine._apply

    def stop_after_the_create(outcome):
        apply(outcome)
        if isinstance(outcome, Statement) and "copied" in outcome.text:
            stop.set()

    engine._apply = stop_after_the_create
    engine.run(stop=stop)
    assert stop.is_set() and records(env, "copied") == []
    env.catch_up()
    landed = records(env, "copied")
    assert sorted(r["id"] for r in landed) == list(range(1, 301))


@pytest.mark.cdc_config(capture={"transaction_memory_bytes": 64 * 1024, "flush_max_rows": 1000})
def test_large_transaction_spills_to_disk_and_lands_exactly(cdc_env):
    env = cdc_env
    env.execute("CREATE TABLE big (id INT PRIMARY KEY, v VARCHAR(40))")
    env.execute("INSERT INTO big VALUES (0, 'first')")
    env.catch_up()
    env.execute(
        "INSERT INTO big SELECT seq, CONCAT('row ', seq) FROM seq_1_to_6000",
        "SAVEPOINT s",
        "INSERT INTO big SELECT seq, 'gone' FROM seq_6001_to_9000",
        "ROLLBACK TO SAVEPOINT s",
        "UPDATE big SET v = 'updated' WHERE id BETWEEN 1 AND 10",
    )
    # Stopped after the first spill (before the commit): nothing of it lands, no file stays.
    engine = env.engine()
    stop = threading.Event()
    spill = engine._spill_records
    spills = []

    def spill_then_stop(records_):  # (a list of records, or a block of them)
        spills.append(len(records_) if isinstance(records_, list) else records_.count)
        stop.set()
        return spill(records_)

    engine._spill_records = spill_then_stop
    engine.run(stop=stop)
    assert spills and [r["id"] for r in records(env, "big")] == [0]
    assert spill_files(env) == []
    # A file a killed engine left behind is removed at the next start.
    (env.landing.root / "spill" / "stale.arrow").write_bytes(b"left by a kill -9")

    stats = env.catch_up()
    landed = records(env, "big")[1:]
    assert [r["id"] for r in landed] == list(range(1, 6001)) + list(range(1, 11))
    assert {r["v"] for r in landed if r["id"] > 10} == {f"row {i}" for i in range(11, 6001)}
    assert [r["__cdc_pos"] for r in landed] == list(range(2, 2 + 6010))
    assert stats.segments_written > 1
    assert spill_files(env) == []


def test_replica_without_log_slave_updates_is_refused_at_start(cdc_env, tmp_path):
    env = cdc_env
    replica = MariaDBServer(base_dir=tmp_path / "replica", server_id=2,
                            extra_args=["--log-slave-updates=OFF"])
    replica.start()
    try:
        primary = env.mariadb
        replica.query(
            f"CHANGE MASTER TO MASTER_HOST='{primary.host}', MASTER_PORT={primary.port}, "
            "MASTER_USER='root', MASTER_PASSWORD='', MASTER_USE_GTID=slave_pos")
        replica.query("START SLAVE")
        settings = env.settings
        options = EngineOptions.from_settings(settings)
        options = EngineOptions(**{**options.__dict__,
                                   "connection_settings": replica.connection_settings()})
        engine = CaptureEngine(options, env.landing)
        with pytest.raises(PrerequisiteError, match=r"log_slave_updates is 'OFF'.*Set "
                                                    r"log_slave_updates=ON"):
            engine.run(stop_when_caught_up=True)
    finally:
        with suppress(pymysql.MySQLError):
            replica.query("STOP SLAVE")
        replica.stop()


@pytest.mark.cdc_config(capture={"transaction_memory_bytes": 64 * 1024, "flush_max_rows": 500})
def test_a_crash_while_a_large_transaction_lands_in_batches_replays_it_once(cdc_env):
    env = cdc_env
    env.execute("CREATE TABLE big (id INT PRIMARY KEY, v VARCHAR(40))")
    env.execute("INSERT INTO big SELECT seq, CONCAT('row ', seq) FROM seq_1_to_3000")
    engine = env.engine()
    land = engine._lander._land_queued
    calls = []

    def crash_on_the_third_batch():
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("simulated crash while the transaction lands")
        land()

    engine._lander._land_queued = crash_on_the_third_batch
    with pytest.raises(RuntimeError, match="simulated crash"):
        engine.run(stop_when_caught_up=True)
    assert env.landing.segments(env.db, "big")  # batches landed past the checkpoint...
    checkpoint = env.landing.read_checkpoint()
    assert checkpoint is None or checkpoint.next_pos == 1  # ...which did not move
    env.catch_up()
    landed = records(env, "big")
    assert [r["id"] for r in landed] == list(range(1, 3001))
    assert [r["__cdc_pos"] for r in landed] == list(range(1, 3001))
    assert spill_files(env) == []


def test_a_partial_row_image_set_in_a_session_stops_loudly_and_lands_nothing(cdc_env):
    """binlog_row_image is FULL globally (checked at start) but MINIMAL in one session: its
    update's after-image lacks the unchanged columns, which must not land as NULLs."""
    env = cdc_env
    env.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10), w INT)")
    env.execute("INSERT INTO t VALUES (1, 'a', 7)")
    env.catch_up()
    position = env.landing.read_checkpoint().gtid
    with env.mariadb.root_connect(database=env.db) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION binlog_row_image = 'MINIMAL'")
        cur.execute("UPDATE t SET v = 'b' WHERE id = 1")
        conn.commit()
    with pytest.raises(EngineError, match=rf"table {env.db}\.t: binlog row lacks column 'v' at "
                                          r"GTID .*; is binlog_row_image FULL\?"):
        env.catch_up()
    assert [(r["id"], r["v"], r["w"]) for r in records(env, "t")] == [(1, "a", 7)]
    assert env.landing.read_checkpoint().gtid == position


def test_a_row_change_logged_as_a_statement_stops_loudly_unless_the_table_is_excluded(cdc_env):
    env = cdc_env
    env.overrides["capture"] = {"tables": {"include": [rf"{env.db}\..*"],
                                           "exclude": [rf"{env.db}\.skipped"]}}
    env.execute("CREATE TABLE t (id INT PRIMARY KEY)")
    env.execute("CREATE TABLE skipped (id INT PRIMARY KEY)")
    env.execute("INSERT INTO t VALUES (1)")
    env.catch_up()

    def statement_logged(sql: str) -> None:
        with env.mariadb.root_connect(database=env.db) as conn, conn.cursor() as cur:
            cur.execute("SET SESSION binlog_format = 'STATEMENT'")
            cur.execute(sql)
            conn.commit()

    since = master_pos(env)
    statement_logged("INSERT INTO skipped VALUES (1)")  # not captured: ignored
    env.catch_up()
    assert any(kind == "Query" and info.endswith("INSERT INTO skipped VALUES (1)")
               for kind, info in binlog_events(env, since))
    position = env.landing.read_checkpoint().gtid

    statement_logged("/* app */ INSERT INTO t VALUES (2)")
    gtid = env.mariadb.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0]
    with pytest.raises(EngineError, match=rf"GTID {gtid}: {env.db}\.t changed by a statement "
                                          r"logged as SQL.*binlog_format=ROW.*re-snapshot"):
        env.catch_up()
    # Nothing of it landed, and its GTID is not processed: a restart stops again.
    assert [r["id"] for r in records(env, "t")] == [1]
    assert env.landing.read_checkpoint().gtid == position
    with pytest.raises(EngineError, match="logged as SQL"):
        env.catch_up()


def fail_on_call(engine: Any, method: str, n: int,
                 error: type[Exception] = OSError) -> None:
    """Make ``engine.<method>`` (of the engine, or a part of it) raise on its ``n``-th call
    (an I/O error mid-commit)."""
    original = getattr(engine, method)
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            raise error(f"simulated failure in {method}")
        return original(*args, **kwargs)

    setattr(engine, method, failing)


@pytest.mark.cdc_config(capture={"flush_max_rows": 2})
def test_a_failure_inside_an_xa_commit_keeps_the_prepared_transaction(cdc_env):
    env = cdc_env
    env.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20))")
    xa(env, "x", *(f"INSERT INTO t VALUES ({i}, 'v')" for i in range(1, 6)))
    env.catch_up()  # prepared and persisted (spilled, in parts of flush_max_rows records)
    assert len(spill_files(env)) > 1
    env.mariadb.query("XA COMMIT 'x'")
    env.execute("INSERT INTO t VALUES (6, 'after')")
    engine = env.engine()
    fail_on_call(engine._lander, "_log_block_touches", 2)  # the second part of the commit
    with pytest.raises(OSError, match="simulated"):
        engine.run(stop_when_caught_up=True)
    assert "xa_prepared" in env.landing.read_checkpoint().extra
    env.catch_up()
    landed = records(env, "t")
    assert [r["id"] for r in landed] == [1, 2, 3, 4, 5, 6]
    assert len({r["__cdc_pos"] for r in landed}) == 6
    assert "xa_prepared" not in env.landing.read_checkpoint().extra
    assert spill_files(env) == []


@pytest.mark.cdc_config(capture={"flush_max_rows": 4, "flush_interval_seconds": 60})
@pytest.mark.parametrize("error", [OSError, ConnectionError])  # (the second is retriable)
def test_a_failure_inside_a_commit_writes_no_checkpoint_of_half_of_it(cdc_env, error,
                                                                      rows_form):
    env = cdc_env
    env.execute("CREATE TABLE t (id INT PRIMARY KEY)")
    env.catch_up()
    env.execute("INSERT INTO t VALUES (0)")
    env.execute("INSERT INTO t SELECT seq FROM seq_1_to_5", "INSERT INTO t SELECT seq FROM "
                "seq_6_to_10")
    engine = env.engine()
    if rows_form == "columns":
        # Blocks: call 1 is the first transaction's, call 2 the big one's first (landed with
        # it, past flush_max_rows), call 3 fails.
        fail_on_call(engine._lander, "_log_block_touches", 3, error)
    else:
        # Call 1 queues the first transaction, call 2 the big one's first piece (landed with
        # it in one segment), call 3 fails.
        fail_on_call(engine._lander._segments, "queue", 3, error)
    with pytest.raises(error, match="simulated"):
        engine.run(stop_when_caught_up=True)
    env.catch_up()
    landed = records(env, "t")
    assert sorted(r["id"] for r in landed) == list(range(11))
    assert sorted(r["__cdc_pos"] for r in landed) == list(range(1, 12))


@pytest.mark.cdc_config(capture={"transaction_memory_bytes": 64 * 1024,
                                 "flush_max_rows": 1_000_000, "flush_interval_seconds": 60})
def test_committed_records_waiting_to_land_are_bounded_by_bytes(cdc_env):
    env = cdc_env
    env.execute("CREATE TABLE t (id INT PRIMARY KEY, v TEXT)")
    for i in range(30):  # small transactions of big rows: none spills, together 300 KB
        env.execute(f"INSERT INTO t VALUES ({i}, REPEAT('x', 10000))")
    engine = env.engine()
    land = engine._lander._land_queued
    waiting = []

    def measured_land():
        waiting.append(engine._lander._segments.bytes)
        land()

    engine._lander._land_queued = measured_land
    stats = engine.run(stop_when_caught_up=True)
    assert stats.segments_written >= 4  # landed in batches, not all at the end
    assert max(waiting) < 64 * 1024 + 12_000  # the budget, and at most one record past it
    assert [r["id"] for r in records(env, "t")] == list(range(30))
    assert spill_files(env) == []


def test_a_prepared_xa_spill_file_is_durable_before_the_checkpoint_and_missing_is_loud(cdc_env):
    env = cdc_env
    env.execute("CREATE TABLE t (id INT PRIMARY KEY)")
    xa(env, "kept", "INSERT INTO t VALUES (1)")
    engine = env.engine()
    calls = []
    sync, write = engine._spill.sync_directory, engine.landing.write_checkpoint
    engine._spill.sync_directory = lambda: (calls.append("sync"), sync())[1]
    engine.landing.write_checkpoint = lambda c: (calls.append(
        "checkpoint" + (" naming the XA" if "xa_prepared" in c.extra else "")), write(c))[1]
    engine.run(stop_when_caught_up=True)
    first_named = calls.index("checkpoint naming the XA")
    assert "sync" in calls[:first_named]
    prepared = env.landing.read_checkpoint().extra["xa_prepared"]
    [(xid, entry)] = prepared.items()
    for path in spill_files(env):
        path.unlink()
    with pytest.raises(EngineError, match=rf"XA transaction {xid} \(prepared at GTID "
                                          rf"{entry['gtid']}\).*missing.*Re-snapshot"):
        env.catch_up()
    env.mariadb.query("XA ROLLBACK 'kept'")


def test_rollback_to_a_savepoint_named_in_another_case_drops_the_rows(cdc_env):
    env = cdc_env
    env.execute("CREATE TABLE t (id INT PRIMARY KEY)")
    env.execute("CREATE TABLE log_t (id INT) ENGINE=MyISAM")
    since = master_pos(env)
    # The non-transactional write makes the server log the ROLLBACK TO (with InnoDB alone it
    # cuts the rolled-back rows from the binlog cache instead).
    env.execute("INSERT INTO t VALUES (1)", "SAVEPOINT Sp", "INSERT INTO t VALUES (2)",
                "INSERT INTO log_t VALUES (2)", "ROLLBACK TO sp", "INSERT INTO t VALUES (3)")
    infos = [info for _, info in binlog_events(env, since)]
    assert any("ROLLBACK TO" in i and "sp" in i for i in infos), infos
    env.catch_up()
    assert [r["id"] for r in records(env, "t")] == [1, 3]


@pytest.mark.cdc_config(capture={"transaction_memory_bytes": 1024})
def test_a_spilled_file_that_does_not_read_back_is_a_loud_stop(cdc_env):
    env = cdc_env
    env.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(40))")
    env.execute("INSERT INTO t SELECT seq, 'v' FROM seq_1_to_200")
    engine = env.engine()
    spill = engine._spill_records

    def damaged_spill(records_):
        parts = spill(records_)
        for part in parts:
            part.path.write_bytes(b"not an arrow file")
        return parts

    engine._spill_records = damaged_spill
    with pytest.raises(EngineError, match=rf"table {env.db}\.t at GTID 0-1-\d+: the spilled "
                                          r"records of .* do not read back.*re-snapshot"):
        engine.run(stop_when_caught_up=True)
    env.catch_up()  # read again from the binlog
    assert [r["id"] for r in records(env, "t")] == list(range(1, 201))
