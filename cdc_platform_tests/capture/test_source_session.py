"""The one source session (lazy connect, one retry on a broken connection, close), the
engine's schema tracker and where a first start reads from, against a real server; what a
purged binlog makes capture say, without one."""

from __future__ import annotations

import socket

import pymysql
import pytest

from cdc_platform.capture.changes.schemas import SchemaTracker
from cdc_platform.capture.events import EngineError
from cdc_platform.capture.source import (
    SourceDisconnected,
    SourceSession,
    TableSelector,
    initial_position,
    purged_binlog_recovery,
    purged_binlog_stop,
)
from cdc_platform_tests.conftest import CdcEnv


def _session(env: CdcEnv, selector: TableSelector | None = None) -> SourceSession:
    return SourceSession(env.settings.source.connection_settings(), selector)


def test_the_session_opens_on_first_use_and_is_read_only(cdc_env: CdcEnv) -> None:
    session = _session(cdc_env)
    assert session._conn is None  # noqa: SLF001 - nothing opened before it is needed
    with pytest.raises(pymysql.err.OperationalError, match="READ ONLY"):
        session.run(lambda conn: conn.cursor().execute(
            f"CREATE TABLE `{cdc_env.db}`.never (id INT PRIMARY KEY)"))
    session.close()


def test_a_killed_connection_costs_one_retry_not_the_action(cdc_env: CdcEnv) -> None:
    session = _session(cdc_env)
    first_id = session.run(lambda conn: conn.thread_id())
    cdc_env.mariadb.query(f"KILL CONNECTION {first_id}")
    calls = []

    def ask(conn: pymysql.Connection) -> int:
        calls.append(conn.thread_id())
        with conn.cursor() as cur:
            cur.execute("SELECT CONNECTION_ID()")
            return cur.fetchone()[0]

    second_id = session.run(ask)
    assert second_id != first_id and len(calls) == 2  # the first attempt met the dead one
    session.close()


def test_an_error_of_the_action_itself_is_not_retried(cdc_env: CdcEnv) -> None:
    session = _session(cdc_env)
    calls = []

    def bad(conn: pymysql.Connection) -> None:
        calls.append(1)
        conn.cursor().execute("SELECT * FROM no_such_database.no_such_table")

    with pytest.raises(pymysql.err.ProgrammingError):
        session.run(bad)
    assert calls == [1]
    session.close()


def test_the_tracker_learns_shaped_schemas_and_says_what_changed(cdc_env: CdcEnv) -> None:
    cdc_env.execute("CREATE TABLE items (id INT PRIMARY KEY, name TEXT, secret TEXT)")
    selector = TableSelector(include=(f"{cdc_env.db}\\..*",),
                             excluded_columns=(f"{cdc_env.db}\\.items\\.secret",))
    tracker = SchemaTracker(_session(cdc_env, selector), {})
    assert tracker.learn_captured() == [(cdc_env.db, "items")]
    changed = tracker.take_changed()
    assert changed is not None
    assert changed[f"{cdc_env.db}.items"].column_names == ("id", "name")
    assert tracker.take_changed() is None  # taken once
    assert tracker.learn(cdc_env.db, "items") is not None
    assert tracker.take_changed() is None  # the same schema again is no change
    cdc_env.execute("ALTER TABLE items ADD COLUMN price INT")
    assert tracker.learn_table(f"{cdc_env.db}.items").column_names == ("id", "name", "price")
    assert tracker.take_changed() is not None
    assert tracker.learn(cdc_env.db, "gone") is None
    tracker.source.close()


def test_a_code_location_loads_its_recorded_tables_when_the_source_is_unreachable(
        cdc_env: CdcEnv) -> None:
    from cdc_platform.definitions import discover_tables

    env = cdc_env
    env.execute("CREATE TABLE recorded (id INT PRIMARY KEY)")
    env.catch_up()
    env.execute("CREATE TABLE later (id INT PRIMARY KEY)")
    assert [s.table for s in discover_tables(env.settings)[0]] == ["later", "recorded"]
    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    env.overrides["source"] = {"port": port}
    assert [s.table for s in discover_tables(env.settings)[0]] == ["recorded"]


def test_a_first_start_reads_from_the_configured_initial_position(cdc_env: CdcEnv) -> None:
    """capture.initial_position: earliest, current (surrounding blanks ignored) or a GTID
    position of the source's flavour; anything else stops the start naming the setting."""
    flavour = cdc_env.settings.source.flavour
    with _session(cdc_env) as session:
        cdc_env.mariadb.query(f"CREATE TABLE `{cdc_env.db}`.moved (id INT PRIMARY KEY)")
        earliest = initial_position(session, flavour, "earliest")
        current = initial_position(session, flavour, " current ")
        assert current.issuperset(earliest) and current != earliest
        assert str(initial_position(session, flavour, str(current))) == str(current)
        with pytest.raises(EngineError, match=rf"capture.initial_position 'latest' is not a "
                                              rf"valid {flavour} GTID position"):
            initial_position(session, flavour, "latest")


def _purged() -> SourceDisconnected:
    lost = SourceDisconnected("binlog stream lost")
    lost.__cause__ = pymysql.err.OperationalError(
        1236, "Could not find GTID state requested by slave in any binlog files")
    return lost


def test_a_purged_binlog_stop_names_the_position_the_server_and_the_ways_on() -> None:
    text = purged_binlog_stop("shop", "0-1-40", _purged())
    assert text.startswith("source shop: the binlog no longer holds GTID position 0-1-40 "
                           "(purged: Could not find GTID state")
    for way in ("keep binlogs longer", "capture.snapshot_mode: when_needed", "re-snapshot",
                "capture.initial_position"):
        assert way in text
    assert "GTID position (start)" in purged_binlog_stop("shop", "", _purged())


def test_a_purged_binlog_recovery_names_the_gap_its_targets_miss() -> None:
    text = purged_binlog_recovery("shop", "0-1-40", "0-1-90", _purged())
    assert "capture goes on from the source's current GTID position 0-1-90" in text
    assert text.endswith("misses the changes between 0-1-40 and 0-1-90")
    assert "between 0-1-40 and (empty)" in purged_binlog_recovery("shop", "0-1-40", "", _purged())
