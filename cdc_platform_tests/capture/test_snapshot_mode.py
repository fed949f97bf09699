"""capture.snapshot_mode on the real server: which tables the engine marks as holding rows the
changelog lacks (history markers), which it does not (a table it sees created, an empty or
keyless one), and, end to end on a private server whose binlogs are purged, the history loaded
by the snapshot the re-snapshot sensor launches: under ``initial`` on a first start, under
``when_needed`` after the engine lost its position (deletes of the gap included)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from cdc_platform.capture.ddl import stale_markers
from cdc_platform.capture.ddl.stale import arrived_tables
from cdc_platform.capture.ddl.stale_markers import (
    launched_by_platform,
    read_markers,
    resolve_markers,
    target_staleness,
)
from cdc_platform.capture.events import EngineError
from cdc_platform.capture.landing.records import StaleMarker
from cdc_platform.devservices.mariadb import MariaDBServer
from cdc_platform_tests.capture.snapshot.reading.live_engine import invisible, streaming
from cdc_platform_tests.conftest import CdcEnv

_ITEMS = "(id INT PRIMARY KEY, name VARCHAR(40), price DECIMAL(10,2))"


def _table(env: CdcEnv, name: str, rows: int = 0, columns: str = _ITEMS) -> None:
    env.execute(f"CREATE TABLE {name} {columns}")
    if rows:
        env.execute(f"INSERT INTO {name} SELECT seq, CONCAT('n', seq), seq / 4 "
                    f"FROM seq_1_to_{rows}")


def _open(env: CdcEnv) -> dict[str, StaleMarker]:
    return {m.table: m for m in read_markers(env.landing) if not m.resolved}


def _staleness(env: CdcEnv, table: str) -> str | None:
    return target_staleness(resolve_markers(env.landing), f"{env.db}.{table}", None)


def _start_here(env: CdcEnv) -> None:
    """The engine's first start reads from now on: tables created so far are not in it."""
    env.start_position = env.mariadb.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0] or ""


def test_a_first_start_marks_tables_found_with_rows_but_not_those_it_sees_created(
        cdc_env: CdcEnv) -> None:
    env = cdc_env
    _table(env, "old", rows=30)
    _table(env, "old_empty")
    _table(env, "keyless", rows=3, columns="(a INT, b VARCHAR(40), c DECIMAL(10,2))")
    _start_here(env)
    _table(env, "seen", rows=5)  # created after the start position: its CREATE is streamed
    env.execute(f"CREATE TABLE IF NOT EXISTS seen_too {_ITEMS}",  # (MariaDB logs it: created)
                "INSERT INTO seen_too VALUES (1, 'a', 1)")
    env.execute(f"CREATE TABLE IF NOT EXISTS old {_ITEMS}")  # (there: MariaDB logs nothing)
    env.catch_up()

    markers = _open(env)
    assert set(markers) == {"old"}, markers
    old = markers["old"]
    assert (old.verb, old.gone, old.position, old.gtid) == ("INITIAL", False, 1, "")
    assert "found with rows at the engine's first start" in old.reason
    assert stale_markers.armed(old, env.landing.read_checkpoint())
    reason = _staleness(env, "old") or ""
    assert reason.startswith("history not loaded yet: initial snapshot pending"), reason
    assert _staleness(env, "seen") is None

    # A table created while the engine watches needs no snapshot, rows or not.
    with streaming(env):
        _table(env, "later", rows=7)
        time.sleep(1)
    env.catch_up()
    assert set(_open(env)) == {"old"}


def test_which_statements_bring_a_table_whose_rows_are_all_in_the_binlog() -> None:
    assert arrived_tables("CREATE TABLE t (id INT)", "db") == [("db", "t")]
    assert arrived_tables("CREATE OR REPLACE TABLE d.t LIKE u", "db") == [("d", "t")]
    assert arrived_tables("CREATE TEMPORARY TABLE t (id INT)", "db") == []
    # MySQL logs CREATE TABLE IF NOT EXISTS also when the table was there; MariaDB does not.
    assert arrived_tables("CREATE TABLE IF NOT EXISTS t (id INT)", "db") == []
    assert arrived_tables("CREATE TABLE IF NOT EXISTS t (id INT)", "db",
                          logged_when_present=False) == [("db", "t")]
    assert arrived_tables("RENAME TABLE a TO b, c TO d", "db") == [("db", "b"), ("db", "d")]
    assert arrived_tables("ALTER TABLE a RENAME TO z", "db") == [("db", "z")]
    assert arrived_tables("ALTER TABLE a ADD COLUMN x INT", "db") == []


@pytest.mark.cdc_config(capture={"snapshot_mode": "never"})
def test_never_marks_nothing(cdc_env: CdcEnv) -> None:
    env = cdc_env
    _table(env, "old", rows=30)
    _start_here(env)
    env.catch_up()
    assert read_markers(env.landing) == []


def test_a_widened_filter_marks_the_tables_it_adds(cdc_env: CdcEnv) -> None:
    env = cdc_env
    env.overrides["capture"] = {"tables": {"include": [rf"{env.db}\.a"]}}
    _table(env, "a", rows=3)
    _table(env, "b", rows=4)
    _table(env, "c")  # empty: nothing to load
    env.catch_up()
    assert _open(env) == {}  # a: seen created; b, c: not captured

    env.overrides["capture"] = {"tables": {"include": [rf"{env.db}\..*"]}}
    env.execute("INSERT INTO a VALUES (100, 'x', 1)")
    env.catch_up()
    markers = _open(env)
    assert set(markers) == {"b"}
    assert markers["b"].verb == "CAPTURED" and "newly captured" in markers["b"].reason
    assert "history not loaded yet: initial snapshot" in (_staleness(env, "b") or "")


def test_a_table_captured_again_after_a_narrowed_filter_is_marked(cdc_env: CdcEnv) -> None:
    """Writes while a table was outside the filters never landed: captured again, it must be
    snapshotted, though the engine recorded it once (the record follows the filters)."""
    env = cdc_env
    _table(env, "a", rows=2)
    _table(env, "b", rows=3)
    env.catch_up()
    assert _open(env) == {}  # both seen created
    assert f"{env.db}.b" in env.landing.read_tables()

    env.overrides["capture"] = {"tables": {"include": [rf"{env.db}\.a"]}}
    env.execute("UPDATE b SET name = 'changed while not captured' WHERE id = 1")
    env.catch_up()
    assert f"{env.db}.b" not in env.landing.read_tables()  # forgotten with the filter
    assert _open(env) == {}

    env.overrides["capture"] = {"tables": {"include": [rf"{env.db}\..*"]}}
    env.catch_up()
    markers = _open(env)
    assert set(markers) == {"b"}
    assert markers["b"].verb == "CAPTURED" and "newly captured" in markers["b"].reason
    assert f"{env.db}.b" in env.landing.read_tables()


def test_a_table_first_seen_by_its_row_events_is_marked(cdc_env: CdcEnv) -> None:
    env = cdc_env
    _table(env, "known", rows=2)
    with streaming(env) as engine:
        deadline = time.monotonic() + 20
        while engine.landing.read_checkpoint() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        # Created and filled without binlog (as a restored table would be), then written.
        invisible(env, f"CREATE TABLE ghost {_ITEMS}",
                  "INSERT INTO ghost SELECT seq, 'old', 1 FROM seq_1_to_10")
        env.execute("INSERT INTO ghost VALUES (11, 'new', 2)")
        [gtid] = [g for g in env.mariadb.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0]
                  .split(",") if g.startswith("0-")]
        while engine.stats.records < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    markers = _open(env)
    assert set(markers) == {"ghost"}, markers
    ghost = markers["ghost"]
    assert (ghost.verb, ghost.gtid) == ("CAPTURED", gtid)
    assert f"first seen by its row events at GTID {gtid}" in ghost.reason
    assert stale_markers.armed(ghost, env.landing.read_checkpoint())


def test_a_rename_into_the_captured_set_is_marked_newly_captured(cdc_env: CdcEnv) -> None:
    env = cdc_env
    env.overrides["capture"] = {"tables": {"include": [rf"{env.db}\.items"]}}
    _table(env, "staging", rows=12)
    env.catch_up()
    with streaming(env) as engine:
        deadline = time.monotonic() + 20
        while engine.state.value != "streaming" and time.monotonic() < deadline:
            time.sleep(0.05)  # (started: the rename comes while the engine watches)
        env.query("RENAME TABLE staging TO items")
        while engine.stats.ddl_statements < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
    [marker] = read_markers(env.landing)
    assert (marker.table, marker.verb, marker.newly_captured) == ("items", "RENAME", True)
    assert f"{env.db}.staging is not captured: its rows are new to capture" in marker.reason
    # Launched by the platform under snapshot_mode, even without resnapshot_on_ddl.
    assert launched_by_platform(marker, "initial", resnapshot_on_ddl=False)
    assert not launched_by_platform(marker, "never", resnapshot_on_ddl=False)


# -- end to end on a private server whose binlogs are purged ---------------------------------


def _purge_binlogs(server: MariaDBServer) -> None:
    """Every binlog file but a new one removed (MariaDB purges a file only once a binlog
    checkpoint has moved past it: flush, wait, try again)."""
    deadline = time.monotonic() + 30
    with server.root_connect() as conn, conn.cursor() as cur:
        while True:
            cur.execute("FLUSH BINARY LOGS")
            time.sleep(0.5)
            cur.execute("SHOW BINARY LOGS")
            newest = cur.fetchall()[-1][0]
            cur.execute(f"PURGE BINARY LOGS TO '{newest}'")
            cur.execute("SHOW BINARY LOGS")
            if [row[0] for row in cur.fetchall()] == [newest]:
                return
            assert time.monotonic() < deadline, "the purge did not happen"


@pytest.fixture
def purged_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A CdcEnv on a private server of its own (binlogs are purged here)."""
    server = MariaDBServer(base_dir=tmp_path / "mariadb", server_id=7)
    server.start()
    monkeypatch.setenv("CDC_TEST_SOURCE_PASSWORD", server.cdc_password)
    server.query("CREATE DATABASE shop")
    try:
        yield CdcEnv(server, "shop", "purged", tmp_path, {}, start_position="earliest")
    finally:
        server.stop()


def _source_rows(env: CdcEnv, table: str) -> list[dict[str, Any]]:
    with env.connect() as conn, conn.cursor() as cur:
        cur.execute(f"SELECT id, name, price FROM {table} ORDER BY id")
        return [{"id": i, "name": n, "price": p} for i, n, p in cur.fetchall()]


def _target_rows(env: CdcEnv, spark: Any, table: str) -> list[dict[str, Any]]:
    return [{k: row[k] for k in ("id", "name", "price")}
            for row in env.target_rows(spark, table)]


def _snapshot_as_the_sensor_asks(env: CdcEnv, instance: dg.DagsterInstance,
                                 table: str) -> dict[str, str]:
    """One tick of the re-snapshot sensor, then its run of the snapshot asset (in process)
    beside a streaming engine; returns the run's tags."""
    from cdc_platform.definitions import build_definitions
    from cdc_platform.defs.snapshots.sensors import REASON_TAG, sensor_name

    defs = build_definitions(env.settings)
    sensor = defs.resolve_sensor_def(sensor_name(env.settings))
    with dg.build_sensor_context(instance=instance, definitions=defs) as context:
        requests = sensor.evaluate_tick(context).run_requests
    snapshot = dg.AssetKey([env.server_name, "snapshot", env.db, table])
    [request] = [r for r in requests if snapshot in r.asset_selection]  # (with others)
    assert request.tags[REASON_TAG]
    with streaming(env):
        job = defs.resolve_implicit_global_asset_job_def()
        run = job.execute_in_process(instance=instance, asset_selection=[snapshot],
                                     tags=request.tags)
        assert run.success
    return dict(request.tags)


def test_history_is_loaded_on_a_first_start_and_after_a_purged_binlog_under_when_needed(
        purged_env: CdcEnv, spark: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The issue's repro (10,000 rows whose binlogs were purged, then 100 inserts and 50
    updates: the target held 150 rows), then a gap the engine cannot read (inserts, updates,
    deletes, a dropped table; binlogs purged) recovered under when_needed."""
    from cdc_platform.defs.snapshots.sensors import REASON_TAG

    env = purged_env
    _table(env, "items", rows=10_000)
    _table(env, "doomed", rows=5)
    _purge_binlogs(env.mariadb)
    env.execute("INSERT INTO items SELECT seq, 'later', 9 FROM seq_10001_to_10100",
                "UPDATE items SET name = 'updated' WHERE id <= 50")
    env.catch_up()  # a first start under the default snapshot_mode, initial
    assert {(m.table, m.verb) for m in read_markers(env.landing)} == {
        ("items", "INITIAL"), ("doomed", "INITIAL")}
    env.materialise(spark, "items")
    assert len(_target_rows(env, spark, "items")) == 150  # what the binlog still holds

    with dg.instance_for_test() as instance:
        tags = _snapshot_as_the_sensor_asks(env, instance, "items")
        assert tags[REASON_TAG].startswith("initial snapshot (INITIAL)")
        env.catch_up()
        result = env.materialise(spark, "items")
        assert _target_rows(env, spark, "items") == _source_rows(env, "items")
        assert len(_source_rows(env, "items")) == 10_100
        assert target_staleness(resolve_markers(env.landing), "shop.items",
                                result.consumed_pos) is None

        # The engine stops; the source goes on, and the binlog of it is purged.
        env.execute("INSERT INTO items SELECT seq, 'gap', 3 FROM seq_20001_to_20050",
                    "UPDATE items SET price = price + 100 WHERE id BETWEEN 100 AND 199",
                    "DELETE FROM items WHERE id BETWEEN 500 AND 999",
                    "DELETE FROM items WHERE id > 10050 AND id <= 10100")
        env.query("DROP TABLE doomed")
        _purge_binlogs(env.mariadb)
        env.execute("INSERT INTO items VALUES (30000, 'after', 1)")

        with pytest.raises(EngineError, match="capture.snapshot_mode: when_needed"):
            env.catch_up()  # initial: a purged binlog still stops loudly

        env.overrides["capture"] = {"snapshot_mode": "when_needed"}
        old = env.landing.read_checkpoint().gtid
        current = env.mariadb.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0]
        with caplog.at_level(logging.WARNING, logger="cdc_platform.capture.engine"):
            env.catch_up()
        [warning] = [r.getMessage() for r in caplog.records
                     if "no longer holds GTID position" in r.getMessage()]
        assert old in warning and current in warning and "when_needed" in warning
        purged = {m.table: m for m in read_markers(env.landing) if m.verb == "PURGED"}
        assert set(purged) == {"items", "doomed"}
        assert purged["doomed"].gone and not purged["items"].gone
        assert old in purged["items"].reason and current in purged["items"].reason
        assert purged["items"].since == current
        reason = _staleness(env, "items") or ""
        assert "recovery snapshot pending" in reason and old in reason, reason

        tags = _snapshot_as_the_sensor_asks(env, instance, "items")
        assert tags[REASON_TAG].startswith("recovery snapshot (PURGED)")
        env.catch_up()
        result = env.materialise(spark, "items")
        source = _source_rows(env, "items")
        assert _target_rows(env, spark, "items") == source
        assert not any(500 <= r["id"] <= 999 for r in source)
        assert env.reconcile(spark, "items").ok
        assert target_staleness(resolve_markers(env.landing), "shop.items",
                                result.consumed_pos) is None
        assert "the source table is gone" in (_staleness(env, "doomed") or "")


def test_when_needed_stops_if_the_source_position_is_purged_again(
        cdc_env: CdcEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recovery goes on from the source's own position; if even that is refused, the
    engine stops instead of trying again and again."""
    from cdc_platform.capture import engine as engine_module
    from cdc_platform.capture.source import SourceDisconnected

    env = cdc_env
    env.overrides["capture"] = {"snapshot_mode": "when_needed"}
    _table(env, "items", rows=3)
    engine = env.engine()
    refused = SourceDisconnected("purged")
    refused.__cause__ = Exception(1236, "Could not find GTID state requested by slave")
    calls = []

    class RefusingStream:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            calls.append(args[3])
            raise refused

    monkeypatch.setattr(engine_module, "BinlogStream", RefusingStream)
    with pytest.raises(EngineError, match="no longer holds GTID position"):
        engine.run(threading.Event())
    assert len(calls) == 2  # the first refusal recovered; the second, at the source's, stops
