"""Start errors are one line naming the setting or grant and the fix: on the CLI (stderr, a
non-zero exit, no traceback) and in Dagster (the run's failure), against the real server with
accounts that lack each documented grant, a wrong password, an unreachable port, a flavour that
does not match and a bad config file."""

from __future__ import annotations

import itertools
import subprocess
import sys
from typing import Any

import dagster as dg
import pymysql
import pytest

from cdc_platform.capture.engine import EngineError
from cdc_platform.capture.landing.fencing import EngineLockedError
from cdc_platform.capture.source import PrerequisiteError, purged_binlog_stop
from cdc_platform.capture.start_errors import (
    SourceAccount,
    StartError,
    describe_start_error,
    missing_grants,
)
from cdc_platform.capture.store.s3store import ObjectStoreError
from cdc_platform.config import ConfigError
from cdc_platform_tests.conftest import CdcEnv

_users = itertools.count(1)
ACCOUNT = SourceAccount("acc", "db.example", 3307, "cdc", "CDC_SOURCE_PASSWORD", True)


# ---- pure: the grants of SHOW GRANTS, the line of each error ----------------------------------

@pytest.mark.parametrize(("lines", "missing"), [
    (["GRANT SELECT, REPLICATION SLAVE, BINLOG MONITOR ON *.* TO `cdc`@`%` IDENTIFIED BY "
      "PASSWORD '*11'"], []),
    (["GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `cdc`@`%`",
      "GRANT SELECT ON `shop`.* TO `cdc`@`%`"], []),
    (["GRANT ALL PRIVILEGES ON *.* TO `root`@`%` WITH GRANT OPTION"], []),
    (["GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO `cdc`@`%`"], ["SELECT"]),
    (["GRANT SELECT, BINLOG MONITOR ON *.* TO `cdc`@`%`"], ["REPLICATION SLAVE"]),
    (["GRANT SELECT, REPLICATION SLAVE ON *.* TO `cdc`@`%`"],
     ["REPLICATION CLIENT (BINLOG MONITOR)"]),
    (["GRANT USAGE ON *.* TO `cdc`@`%`"],
     ["SELECT", "REPLICATION SLAVE", "REPLICATION CLIENT (BINLOG MONITOR)"]),
    # Replication grants on one database do not count; SELECT on one column does.
    (["GRANT USAGE ON *.* TO `cdc`@`%`", "GRANT SELECT (a, b), INSERT ON `s`.`t` TO `cdc`@`%`",
      "GRANT ALL PRIVILEGES ON `x`.* TO `cdc`@`%`"],
     ["REPLICATION SLAVE", "REPLICATION CLIENT (BINLOG MONITOR)"]),
    # Roles: their privileges are not listed, so nothing is judged missing.
    (["GRANT USAGE ON *.* TO `cdc`@`%`", "GRANT `cdc_role` TO `cdc`@`%`"], []),
])
def test_missing_grants_from_show_grants(lines: list[str], missing: list[str]) -> None:
    assert missing_grants(lines, "mariadb") == missing


def test_missing_grants_names_mysql_privileges_as_mysql_does() -> None:
    assert missing_grants(["GRANT SELECT ON *.* TO `cdc`@`%`"], "mysql") == [
        "REPLICATION SLAVE", "REPLICATION CLIENT"]


@pytest.mark.parametrize(("error", "expected"), [
    (pymysql.err.OperationalError(1045, "Access denied for user 'cdc'@'10.0.0.1' (using "
                                        "password: YES)"),
     ["access denied for user 'cdc' at db.example:3307", "source.user", "CDC_SOURCE_PASSWORD"]),
    (pymysql.err.OperationalError(1227, "Access denied; you need (at least one of) the SUPER, "
                                        "BINLOG MONITOR privilege(s) for this operation"),
     ["lacks the REPLICATION CLIENT (BINLOG MONITOR) privilege", "GRANT SELECT, REPLICATION "
      "SLAVE, REPLICATION CLIENT ON *.* TO 'cdc'@'%'"]),
    (pymysql.err.OperationalError(1227, "Access denied; you need (at least one of) the "
                                        "REPLICATION SLAVE privilege(s) for this operation"),
     ["lacks the REPLICATION SLAVE privilege"]),
    (pymysql.err.ProgrammingError(1142, "SELECT command denied to user 'cdc'@'h' for table "
                                        "`shop`.`orders`"),
     ["lacks the SELECT privilege on shop", "GRANT SELECT"]),
    (pymysql.err.OperationalError(1044, "Access denied for user 'cdc'@'%' to database 'shop'"),
     ["lacks SELECT on the captured databases"]),
    (pymysql.err.OperationalError(2003, "Can't connect to MySQL server on 'db.example' "
                                        "([Errno 111] Connection refused)"),
     ["cannot connect to db.example:3307", "source.host", "source.port"]),
    (pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query"),
     ["cannot connect to db.example:3307"]),
    (pymysql.err.OperationalError(1049, "Unknown database 'shop'"), ["Unknown database 'shop'"]),
    (pymysql.err.OperationalError(1236, "Could not find GTID state requested by slave in any "
                                        "binlog files"),
     ["no longer holds the requested GTID position", "re-snapshot",
      "capture.snapshot_mode: when_needed"]),
    (PrerequisiteError("source 'acc' cannot be captured exactly: server variable "
                       "binlog_format is 'MIXED', needs 'ROW'. Set these"),
     ["binlog_format is 'MIXED'"]),
    (EngineError("table s.t: binlog row lacks column 'x' at GTID 0-1-5;\nis binlog_row_image "
                 "FULL?"), ["binlog row lacks column 'x' at GTID 0-1-5; is binlog_row_image"]),
    (ConfigError("cfg.yaml: invalid configuration\n  source.port: too big\n  source.host: "
                 "missing"), ["cfg.yaml: invalid configuration; source.port: too big; "
                              "source.host: missing"]),
    (StartError("source 'acc': the account 'cdc' lacks SELECT"), ["lacks SELECT"]),
    (EngineLockedError("another capture engine is already streaming 'acc' into /lz/acc (pid "
                       "7); stop it first: one engine per source server"),
     ["already streaming 'acc'", "stop it first"]),
    (ObjectStoreError("landing_zone.url s3://b/p: bucket 'b' does not exist; create it or fix "
                      "the URL"), ["landing_zone.url s3://b/p", "create it or fix the URL"]),
])
def test_each_known_start_error_is_one_line_naming_the_fix(error: BaseException,
                                                          expected: list[str]) -> None:
    line = describe_start_error(error, ACCOUNT)
    assert line is not None and "\n" not in line
    for text in expected:
        assert text in line


def test_a_wrapped_error_is_described_by_its_cause_and_others_are_not_start_errors() -> None:
    cause = pymysql.err.OperationalError(1045, "Access denied for user 'cdc'@'h'")
    try:
        try:
            raise cause
        except pymysql.MySQLError as error:
            raise ConnectionError("stream closed") from error
    except ConnectionError as wrapped:
        assert "access denied" in (describe_start_error(wrapped, ACCOUNT) or "")
    assert describe_start_error(ValueError("a defect"), ACCOUNT) is None
    unset = SourceAccount("acc", "h", 1, "cdc", "MY_PW", False)
    assert "MY_PW is not set" in (describe_start_error(cause, unset) or "")


# ---- the real server: accounts lacking each grant, a wrong password, ... ---------------------

def _account(env: CdcEnv, grants: str) -> str:
    user = f"u{next(_users)}_{env.db[:20]}"
    with env.mariadb.root_connect() as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_log_bin = 0")
        cur.execute("CREATE USER %s@'%%' IDENTIFIED BY 'pw'", (user,))
        cur.execute(f"GRANT {grants} ON *.* TO %s@'%%'", (user,))
    return user


_CASES: dict[str, tuple[str, str]] = {
    # case: (grants of the account, text the line must hold)
    "no-select": ("REPLICATION SLAVE, REPLICATION CLIENT", "lacks SELECT"),
    "no-replication-slave": ("SELECT, REPLICATION CLIENT", "lacks REPLICATION SLAVE"),
    "no-binlog-monitor": ("SELECT, REPLICATION SLAVE", "lacks REPLICATION CLIENT (BINLOG MONITOR)"),
    "wrong-password": ("SELECT, REPLICATION SLAVE, REPLICATION CLIENT", "CDC_TEST_SOURCE_PASSWORD"),
    "unreachable": ("", "cannot connect to 127.0.0.1:1"),
    "wrong-flavour": ("", "source.flavour is 'mysql' but the server is mariadb"),
}


def _configure(env: CdcEnv, case: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point ``env``'s config at the case's account (or port, or flavour); the expected text."""
    grants, expected = _CASES[case]
    if case == "unreachable":
        env.overrides["source"] = {"port": 1, "connect_timeout_seconds": 2}
    elif case == "wrong-flavour":
        env.overrides["source"] = {"flavour": "mysql"}
    else:
        env.overrides["source"] = {"user": _account(env, grants)}
        monkeypatch.setenv("CDC_TEST_SOURCE_PASSWORD", "not-the-password"
                           if case == "wrong-password" else "pw")
    return expected


def _cli(env: CdcEnv, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cdc_platform", *args, "--config",
                           str(env.write_config())], capture_output=True, text=True, timeout=120)


def _assert_one_line(done: subprocess.CompletedProcess[str], expected: str) -> None:
    assert done.returncode != 0
    assert "Traceback" not in done.stderr + done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert expected in lines[0], lines[0]
    assert "'pw'" not in lines[0] and "not-the-password" not in lines[0]


@pytest.mark.parametrize("case", list(_CASES))
def test_stream_start_failure_is_one_line_on_stderr(cdc_env: CdcEnv, case: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    expected = _configure(cdc_env, case, monkeypatch)
    _assert_one_line(_cli(cdc_env, "stream", "--until-caught-up"), expected)


def test_snapshot_start_failure_is_one_line_on_stderr(cdc_env: CdcEnv,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    cdc_env.execute("CREATE TABLE items (id INT PRIMARY KEY)")
    expected = _configure(cdc_env, "no-select", monkeypatch)
    _assert_one_line(_cli(cdc_env, "snapshot", f"{cdc_env.db}.items"), expected)


def test_a_bad_config_file_is_one_line(cdc_env: CdcEnv, tmp_path: Any) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("source: {host: x}\nlanding_zone: {url: /tmp/x}\n")
    for command in (["stream"], ["signal", "log", "hello"]):
        done = subprocess.run([sys.executable, "-m", "cdc_platform", *command, "--config",
                               str(config)], capture_output=True, text=True, timeout=120)
        _assert_one_line(done, "source.flavour")


@pytest.mark.parametrize("case", ["no-binlog-monitor", "wrong-password"])
def test_streaming_job_fails_with_the_line(cdc_env: CdcEnv, case: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from cdc_platform.defs.streaming.definitions import build

    expected = _configure(cdc_env, case, monkeypatch)
    job = build(cdc_env.settings).resolve_job_def("stream_changes")
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(instance=instance, raise_on_error=False, run_config={
            "ops": {"capture_changes": {"config": {"stop_when_caught_up": True}}}})
    assert not result.success
    failures = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert len(failures) == 1
    error = failures[0].step_failure_data.error
    assert expected in error.message, error.message
    assert failures[0].step_failure_data.user_failure_data.description.count("\n") == 0


def test_snapshot_asset_fails_with_the_line(cdc_env: CdcEnv,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from cdc_platform.definitions import build_definitions

    cdc_env.execute("CREATE TABLE items (id INT PRIMARY KEY)")
    expected = _configure(cdc_env, "no-binlog-monitor", monkeypatch)
    defs = build_definitions(cdc_env.settings)
    asset = defs.resolve_assets_def(
        dg.AssetKey([cdc_env.server_name, "snapshot", cdc_env.db, "items"]))
    with dg.instance_for_test() as instance:
        result = dg.materialize([asset], instance=instance, raise_on_error=False)
    assert not result.success
    [failure] = result.get_step_failure_events()
    description = failure.step_failure_data.user_failure_data.description
    assert expected in description and "\n" not in description


# ---- MySQL settings, on a server made of a binlog file (no MySQL server runs here) ----------

def test_mysql_partial_json_updates_are_refused_at_start_in_one_line(tmp_path: Any,
                                                                    monkeypatch: Any) -> None:
    """binlog_row_value_options=PARTIAL_JSON logs only the changed part of JSON values: it is
    refused before streaming, like binlog_row_image, by the engine's own start."""
    from cdc_platform.capture.source import check_prerequisites
    from cdc_platform_tests.capture.mysql_binlog_files import BinlogFileServer, read_binlog
    from cdc_platform_tests.capture.test_mysql_binlog_files import _engine

    binlog = read_binlog("vector.binlog")
    assert check_prerequisites(BinlogFileServer(binlog).connect(), "mysql") == []
    partial = BinlogFileServer(binlog, binlog_row_value_options="PARTIAL_JSON")
    [problem] = check_prerequisites(partial.connect(), "mysql")
    assert "binlog_row_value_options is 'PARTIAL_JSON', needs '' (empty)" in problem

    engine, _ = _engine(tmp_path, monkeypatch, binlog, binlog_row_value_options="PARTIAL_JSON")
    with pytest.raises(PrerequisiteError) as raised:
        engine.run(stop_when_caught_up=True)
    line = describe_start_error(raised.value)
    assert line is not None and "\n" not in line
    assert "binlog_row_value_options is 'PARTIAL_JSON'" in line
    assert "Set binlog_row_value_options=''" in line
    checkpoint = engine.landing.read_checkpoint()  # (refused before streaming anything)
    assert checkpoint is None or (checkpoint.gtid, checkpoint.next_pos) == ("", 1)


def test_a_purged_binlog_reads_the_same_at_start_and_when_the_engine_stops() -> None:
    """Error 1236 met by the start checks or by the running engine: the same ways on, both
    naming capture.snapshot_mode: when_needed."""
    error = pymysql.err.OperationalError(1236, "Could not find GTID state requested by slave "
                                               "in any binlog files")
    line = describe_start_error(error, ACCOUNT)
    stop = purged_binlog_stop("acc", "0-1-40", error)
    assert line is not None
    ways_on = stop.split("(purged: Could not find GTID state requested by slave in any binlog "
                         "files).", 1)[1]
    assert "capture.snapshot_mode: when_needed" in ways_on and line.endswith(ways_on)
