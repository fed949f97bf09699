"""Binlog headroom: the pure forecast (both flavours, property-tested), and the reading of a
real private MariaDB with rotated binlog files and ``binlog_expire_logs_seconds`` set, through
the engine's own account (SELECT, REPLICATION SLAVE, REPLICATION CLIENT = BINLOG MONITOR)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pymysql
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pymysqlreplication import BinLogStreamReader

from cdc_platform.capture.binlog.headroom import (
    WARN_SECONDS,
    BinlogFile,
    BinlogHeadroom,
    FileStart,
    HeadroomStatus,
    LagClock,
    Retention,
    checkpoint_lag_seconds,
    duration_text,
    file_started_at,
    forecast,
    is_low,
    needed_file_index,
    read_headroom,
    retention_from_variables,
    starts_within,
)
from cdc_platform.capture.gtid import MariadbPosition, MysqlGtid, MysqlGtidSet
from cdc_platform.devservices import MariaDBServer
from cdc_platform_tests.devservices.test_devservices import needs_mariadb

U1 = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
U2 = "4b11fa47-71ca-11e1-9e33-c80aa9429563"
HOUR = 3600.0


# ---- retention ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("variables", "seconds", "size", "why"), [
    # MariaDB 10.11 / MySQL 8 defaults and settings
    ({"binlog_expire_logs_seconds": "0", "expire_logs_days": "0.000000"}, 0, 0,
     "binlog_expire_logs_seconds=0, expire_logs_days=0"),
    ({"binlog_expire_logs_seconds": "3600", "expire_logs_days": "0.041667"}, 3600, 0,
     "binlog_expire_logs_seconds=3600"),
    ({"binlog_expire_logs_seconds": "2592000", "binlog_expire_logs_auto_purge": "ON"},
     2592000, 0, "binlog_expire_logs_seconds=2.592e+06"),
    # MySQL 8.0: the seconds win over the days; days when the seconds are 0
    ({"binlog_expire_logs_seconds": "0", "expire_logs_days": "2"}, 2 * 86400, 0,
     "expire_logs_days=2"),
    # MariaDB < 10.6: days only, fractional
    ({"expire_logs_days": "0.5"}, 43200, 0, "expire_logs_days=0.5"),
    # MySQL >= 8.0.29 with automatic purge off
    ({"binlog_expire_logs_seconds": "86400", "binlog_expire_logs_auto_purge": "OFF"}, 0, 0,
     "binlog_expire_logs_seconds=86400, binlog_expire_logs_auto_purge=OFF"),
    # MariaDB 11.4's size limit (and Percona's name of it)
    ({"binlog_expire_logs_seconds": "0", "max_binlog_total_size": "1073741824"}, 0,
     1073741824, "binlog_expire_logs_seconds=0, max_binlog_total_size=1073741824"),
    ({"binlog_space_limit": "5000"}, 0, 5000, "no expiry variable, binlog_space_limit=5000"),
    ({"binlog_expire_logs_seconds": "junk"}, 0, 0, "binlog_expire_logs_seconds=0"),
])
def test_retention_from_the_servers_variables(variables: dict[str, str], seconds: float,
                                              size: int, why: str) -> None:
    retention = retention_from_variables(variables)
    assert (retention.expire_seconds, retention.size_limit_bytes) == (seconds, size)
    assert retention.why == why
    assert retention.purges == bool(seconds or size)


# ---- which file the checkpoint needs -----------------------------------------------------------

@pytest.mark.parametrize(("info", "checkpoint", "within"), [
    ("[]", "", True),
    ("[]", "0-1-5", True),
    ("[0-1-100]", "0-1-100", True),
    ("[0-1-100]", "0-1-99", False),
    ("[0-1-100]", "0-2-150", True),  # strict mode: a domain's seqnos grow across server ids
    ("[0-1-100]", "", False),
    ("[0-1-100,1-2-7]", "0-1-100", False),  # domain 1 not in the checkpoint
    ("[0-1-100,1-2-7]", "0-1-120,1-2-7", True),
    ("[0-1-100,0-2-120]", "0-2-120", True),  # one domain, two server ids
    ("[0-1-100,0-2-120]", "0-1-110", False),
])
def test_mariadb_gtid_list_within_the_checkpoint(info: str, checkpoint: str,
                                                 within: bool) -> None:
    assert starts_within("mariadb", info, MariadbPosition.parse(checkpoint)) is within


@pytest.mark.parametrize(("info", "checkpoint", "within"), [
    ("", "", True),
    (f"{U1}:1-10", f"{U1}:1-12", True),
    (f"{U1}:1-10", f"{U1}:1-5", False),
    (f"{U1}:1-10", f"{U1}:1-5:7-12", False),  # a hole: 6 is not processed
    (f"{U1}:1-10,\n{U2}:1-3", f"{U2}:1-3,{U1}:1-10", True),  # the server's line breaks
    (f"{U1}:1-10,\n{U2}:1-3", f"{U1}:1-10", False),
    (f"{U1}:1-4:audit:1-2", f"{U1}:1-4:audit:1-3", True),  # tagged GTIDs (8.3+)
])
def test_mysql_previous_gtids_within_the_checkpoint(info: str, checkpoint: str,
                                                    within: bool) -> None:
    assert starts_within("mysql", info, MysqlGtidSet.parse(checkpoint)) is within


@st.composite
def mysql_binlogs(draw: st.DrawFn) -> tuple[list[list[MysqlGtid]], MysqlGtidSet]:
    """Transactions of two server UUIDs (a failover) cut into files, and a checkpoint: a prefix
    of the binlog plus some transactions after it (processed out of order by a replica's
    parallel applier)."""
    count = draw(st.integers(1, 40))
    gnos = {U1: 0, U2: 0}
    transactions = []
    for _ in range(count):
        uuid = draw(st.sampled_from([U1, U2]))
        gnos[uuid] += 1
        transactions.append(MysqlGtid(uuid, gnos[uuid]))
    cuts = sorted(draw(st.sets(st.integers(1, count), max_size=6)) | {count})
    files, start = [], 0
    for cut in cuts:
        files.append(transactions[start:cut])
        start = cut
    files.append([])  # the active file, just rotated
    prefix = draw(st.integers(0, count))
    extra = draw(st.sets(st.integers(prefix, count - 1), max_size=5)) if prefix < count else set()
    checkpoint = MysqlGtidSet.from_gtids(
        [*transactions[:prefix], *(transactions[i] for i in extra)])
    return files, checkpoint


@given(mysql_binlogs())
def test_a_resume_from_the_needed_file_misses_nothing_and_reads_least(
        case: tuple[list[list[MysqlGtid]], MysqlGtidSet]) -> None:
    """Every transaction the checkpoint lacks is in the needed file or after it, and the file
    after the needed one would miss one: it is the newest file a resume may start in (the
    server's own choice). Files are read newest first, back to the needed one only."""
    files, checkpoint = case
    previous = [MysqlGtidSet.from_gtids(g for f in files[:i] for g in f)
                for i in range(len(files))]
    names = [f"binlog.{i + 1:06d}" for i in range(len(files))]
    asked: list[str] = []

    def within(name: str) -> bool:
        asked.append(name)
        return starts_within("mysql", str(previous[names.index(name)]), checkpoint)

    needed = needed_file_index(names, within)
    assert needed is not None  # the first file starts with nothing before it
    assert all(checkpoint.contains_gtid(g) for f in files[:needed] for g in f)
    if needed + 1 < len(files):
        assert not checkpoint.issuperset(previous[needed + 1])
    assert asked == names[needed:][::-1]


@given(st.lists(st.integers(1, 50), min_size=1, max_size=8, unique=True).map(sorted),
       st.integers(0, 60))
def test_mariadb_needed_file_is_the_last_that_starts_at_or_before_the_checkpoint(
        starts: list[int], seq: int) -> None:
    """Files start after seqnos ``starts`` of domain 0 (the first file after none when the
    binlog was never purged); the checkpoint is at ``seq``."""
    names = [f"binlog.{i + 1:06d}" for i in range(len(starts))]
    infos = dict(zip(names, [f"[0-1-{s}]" for s in starts], strict=True))
    checkpoint = MariadbPosition.parse(f"0-1-{seq}" if seq else "")
    needed = needed_file_index(names, lambda n: starts_within("mariadb", infos[n], checkpoint))
    expected = [i for i, s in enumerate(starts) if s <= seq and seq]
    assert needed == (expected[-1] if expected else None)


# ---- the forecast -----------------------------------------------------------------------------

FILES = [BinlogFile("binlog.000001", 1000), BinlogFile("binlog.000002", 2000),
         BinlogFile("binlog.000003", 500)]
DAY = Retention(expire_seconds=86400, why="binlog_expire_logs_seconds=86400")


def test_the_active_file_has_at_least_the_expiry() -> None:
    headroom = forecast(FILES, 2, DAY, last_written_at=None, now=1000.0, caught_up=True)
    assert headroom.status is HeadroomStatus.OK
    assert (headroom.needed_file, headroom.seconds, headroom.at_least) == (
        "binlog.000003", 86400, True)
    assert headroom.describe() == ("at least 1 d (the checkpoint needs the active binlog file "
                                   "binlog.000003) (binlog_expire_logs_seconds=86400)")


def test_an_older_file_goes_one_expiry_after_the_next_file_began() -> None:
    started = 1_000_000.0
    headroom = forecast(FILES, 0, DAY, last_written_at=started, now=started + 7200)
    assert headroom.status is HeadroomStatus.OK
    assert (headroom.seconds, headroom.at_least, headroom.files_after) == (86400 - 7200, False, 2)
    assert headroom.describe().startswith("22 h until binlog.000001, which the checkpoint "
                                          "needs, may be purged (2 newer file(s)")
    low = forecast(FILES, 0, DAY, last_written_at=started, now=started + 86400 - 600)
    assert low.status is HeadroomStatus.LOW and low.low and low.seconds == 600
    assert low.describe().startswith("LOW: 10 min until binlog.000001")
    due = forecast(FILES, 0, DAY, last_written_at=started, now=started + 90000)
    assert due.status is HeadroomStatus.LOW and due.seconds == 0
    assert "past its expiry; the source purges it at its next binlog rotation" in due.describe()


def test_no_purge_by_age_or_size_is_unbounded() -> None:
    none = Retention(why="binlog_expire_logs_seconds=0, expire_logs_days=0")
    headroom = forecast(FILES, 0, none, last_written_at=None, now=0.0)
    assert headroom.status is HeadroomStatus.UNBOUNDED and not headroom.low
    assert headroom.seconds is None and headroom.bytes_left is None
    assert headroom.describe() == (
        "unbounded: the source purges no binlog by itself (binlog_expire_logs_seconds=0, "
        "expire_logs_days=0); the checkpoint needs binlog.000001")


def test_a_size_limit_counts_the_needed_file_and_every_later_one() -> None:
    sized = Retention(size_limit_bytes=10_000, why="max_binlog_total_size=10000")
    headroom = forecast(FILES, 1, sized, last_written_at=None, now=0.0)
    assert headroom.status is HeadroomStatus.OK and headroom.seconds is None
    assert headroom.bytes_left == 10_000 - 2000 - 500
    tight = forecast(FILES, 0, Retention(size_limit_bytes=4000), last_written_at=None,
                     now=0.0)
    assert tight.status is HeadroomStatus.LOW and tight.bytes_left == 500


def test_after_a_restart_the_file_counts_from_its_own_start() -> None:
    started = 1_000_000.0
    headroom = forecast(FILES, 0, DAY, last_written_at=started, now=started + 3600,
                        restarted=True)
    assert headroom.seconds == 86400 - 3600 and headroom.restarted
    assert headroom.describe().startswith(
        "23 h until binlog.000001, which the checkpoint needs, may be purged (2 newer file(s) "
        "on the source) (the source restarted after it: counted from the file's start, the "
        "earliest it can go)")
    active = forecast(FILES, 2, DAY, last_written_at=None, now=0.0, restarted=True)
    assert not active.restarted


def test_a_purged_file_is_said_with_what_to_do() -> None:
    headroom = forecast(FILES, None, DAY, last_written_at=None, now=0.0)
    assert headroom.status is HeadroomStatus.PURGED and headroom.low
    assert headroom.needed_file is None and headroom.seconds == 0
    assert headroom.describe().startswith(
        "purged: no binlog file on the source starts within the checkpoint's GTIDs (oldest "
        "file: binlog.000001). The engine cannot resume exactly: re-snapshot")


def test_unknown_and_no_checkpoint_say_so() -> None:
    assert BinlogHeadroom(HeadroomStatus.UNKNOWN, reason="source error x").describe() == (
        "unknown: source error x")
    assert BinlogHeadroom(HeadroomStatus.NO_CHECKPOINT).describe().startswith("no checkpoint")
    assert not BinlogHeadroom(HeadroomStatus.UNKNOWN).low


@given(st.floats(60, 90 * 86400), st.floats(0, 10**9), st.floats(0, 200 * 86400),
       st.floats(0, 200 * 86400))
def test_headroom_shrinks_with_time_and_is_low_under_a_quarter_or_an_hour(
        expiry: float, started: float, waited: float, later: float) -> None:
    retention = Retention(expire_seconds=expiry)
    now = started + waited
    first = forecast(FILES, 1, retention, last_written_at=started, now=now)
    second = forecast(FILES, 1, retention, last_written_at=started, now=now + later)
    assert first.seconds is not None and second.seconds is not None
    assert 0 <= second.seconds <= first.seconds <= expiry
    assert (first.status is HeadroomStatus.LOW) == (
        first.seconds < max(0.25 * expiry, WARN_SECONDS))
    active = forecast(FILES, 2, retention, last_written_at=None, now=now)
    assert active.seconds == expiry and active.at_least
    assert (active.status is HeadroomStatus.LOW) == (expiry < WARN_SECONDS)


def test_is_low_edges() -> None:
    week = Retention(expire_seconds=7 * 86400)
    assert is_low(7 * 86400 * 0.25 - 1, None, week)
    assert not is_low(7 * 86400 * 0.25, None, week)
    assert is_low(HOUR - 1, None, Retention(expire_seconds=2 * HOUR))
    assert not is_low(None, None, Retention())


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0 s"), (45.9, "45 s"), (60, "1 min"), (720, "12 min"), (3600, "1 h"),
    (6720, "1 h 52 min"), (86400, "1 d"), (273600, "3 d 4 h"), (-5, "0 s"),
])
def test_duration_text(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text


# ---- the engine's lag -------------------------------------------------------------------------

def test_checkpoint_lag_is_zero_when_caught_up_else_its_age_plus_its_lag() -> None:
    written = "2026-11-26T10:00:00+00:00"
    at = 1795687200.0  # (2026-11-26T10:00:00Z)
    assert checkpoint_lag_seconds(written, 3.0, caught_up=True, now=at + 500) == 0.0
    assert checkpoint_lag_seconds(written, 3.0, caught_up=False, now=at + 500) == 503.0
    assert checkpoint_lag_seconds(written, None, caught_up=None, now=at + 10) == 10.0
    assert checkpoint_lag_seconds("", 3.0, caught_up=False, now=at) is None


def test_lag_clock_grows_while_the_engine_makes_no_progress() -> None:
    clock = LagClock()
    assert clock.lag(100.0, None, 0, 0) is None  # nothing measured yet
    assert clock.lag(101.0, 0.0, 0, 3) == 0.0  # a heartbeat: at the end of the binlog
    assert clock.lag(131.0, 0.0, 0, 9) == 0.0  # heartbeats keep coming
    assert clock.lag(161.0, 0.0, 0, 9) == 30.0  # ... and stopped (a dropped connection)
    assert clock.lag(170.0, 2.0, 5, 40) == 2.0  # transactions: the engine's own figure
    assert clock.lag(200.0, 2.0, 5, 900) == 32.0  # one long transaction: no commit since
    assert clock.lag(210.0, 2.0, 5, 900, caught_up=True) == 0.0  # the source had no more
    assert clock.lag(230.0, 2.0, 5, 900) == 20.0  # (from then on)


# ---- a real MariaDB -----------------------------------------------------------------------------

EXPIRE = 7200


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDBServer]:
    """A private server whose binlogs expire after two hours, with a table to write to."""
    server = MariaDBServer(tmp_path_factory.mktemp("headroom"), server_id=31,
                           extra_args=[f"--binlog-expire-logs-seconds={EXPIRE}"])
    with server:
        server.query("CREATE DATABASE IF NOT EXISTS h")
        server.query("CREATE TABLE IF NOT EXISTS h.t (id INT AUTO_INCREMENT PRIMARY KEY, v INT)")
        yield server


def rotated(server: MariaDBServer, files: int) -> list[tuple[str, str]]:
    """Write, rotate, wait a second, ``files`` times; returns ``(gtid_binlog_pos, active
    file)`` right after each rotation: a checkpoint there needs that file."""
    points = []
    for _ in range(files):
        server.query("INSERT INTO h.t (v) VALUES (1)")
        server.query("FLUSH BINARY LOGS")
        points.append((server.gtid_position(), active_file(server)))
        time.sleep(1.1)
    return points


def active_file(server: MariaDBServer) -> str:
    return str(server.query("SHOW MASTER STATUS")[0][0])


@pytest.mark.integration
@needs_mariadb
def test_the_needed_file_and_its_headroom_on_a_real_server(source: MariaDBServer) -> None:
    grants = " ".join(str(r[0]) for r in source.query(
        f"SHOW GRANTS FOR {source.cdc_user}@'%'"))
    assert "GRANT SELECT, REPLICATION SLAVE, BINLOG MONITOR ON *.*" in grants  # nothing more
    points = rotated(source, 3)
    account = source.connection_settings()
    for gtid, file in points[:-1]:
        headroom = read_headroom(account, "mariadb", gtid)
        assert headroom.status is HeadroomStatus.OK, headroom.describe()
        assert headroom.needed_file == file and not headroom.at_least
        assert headroom.caught_up is False
        # The server purges the file once its last write (its mtime) is EXPIRE seconds old.
        mtime = (source.binlog_dir / file).stat().st_mtime
        assert headroom.seconds == pytest.approx(mtime + EXPIRE - time.time(), abs=2.5)
        assert headroom.retention == Retention(EXPIRE, 0, f"binlog_expire_logs_seconds={EXPIRE}")
    current = read_headroom(account, "mariadb", points[-1][0])
    assert (current.needed_file, current.seconds, current.at_least, current.caught_up) == (
        points[-1][1], EXPIRE, True, True)


@pytest.mark.integration
@needs_mariadb
def test_low_and_unbounded_follow_the_servers_retention(source: MariaDBServer) -> None:
    [(gtid, file), _] = rotated(source, 2)
    account = source.connection_settings()
    try:
        source.query("SET GLOBAL binlog_expire_logs_seconds = 3000")
        low = read_headroom(account, "mariadb", gtid)
        assert low.status is HeadroomStatus.LOW and low.needed_file == file
        assert low.seconds is not None and 2990 < low.seconds < 3000
        assert low.describe().startswith(f"LOW: 49 min until {file}, which the checkpoint needs")
        source.query("SET GLOBAL binlog_expire_logs_seconds = 0")
        unbounded = read_headroom(account, "mariadb", gtid)
        assert unbounded.status is HeadroomStatus.UNBOUNDED and unbounded.needed_file == file
    finally:
        source.query(f"SET GLOBAL binlog_expire_logs_seconds = {EXPIRE}")


@pytest.mark.integration
@needs_mariadb
def test_a_file_starts_when_the_file_before_it_was_last_written(source: MariaDBServer) -> None:
    rotated(source, 2)
    names = [str(r[0]) for r in source.query("SHOW BINARY LOGS")]
    for before, after in zip(names[-3:-1], names[-2:], strict=True):
        started = file_started_at(source.connection_settings(), after)
        assert not started.at_server_start  # (a rotation)
        # The event's time is whole seconds (truncated); the file before was last written
        # just before it, later by up to a second plus the server's delays on a busy machine
        # (1.006 s seen in CI).
        last_written = (source.binlog_dir / before).stat().st_mtime
        assert last_written - 3.0 <= started.at <= last_written + 1.0
    with pytest.raises(pymysql.MySQLError, match="1236"):
        file_started_at(source.connection_settings(), "binlog.999999")


@pytest.mark.integration
@needs_mariadb
def test_reading_the_headroom_leaves_the_engines_binlog_connection_alone(
        source: MariaDBServer) -> None:
    """The start time is read over a binlog dump of server id 0: the server neither registers
    it nor disconnects a replica connection (the engine's) with another id."""
    [(old, _)] = rotated(source, 1)
    rotated(source, 1)
    settings = source.connection_settings()
    settings["passwd"] = settings.pop("password")
    stream = BinLogStreamReader(connection_settings=settings,
                                server_id=4242, blocking=True, is_mariadb=True,
                                auto_position=source.gtid_position(), slave_heartbeat=0.5)
    try:
        stream.fetchone()
        before = dumps(source)
        assert len(before) == 1
        for _ in range(3):
            assert read_headroom(source.connection_settings(), "mariadb", old).seconds
        assert dumps(source) == before
        source.query("INSERT INTO h.t (v) VALUES (2)")
        assert dumps(source) == before
    finally:
        stream.close()


def dumps(server: MariaDBServer) -> list[int]:
    return [int(r[0]) for r in server.query("SHOW PROCESSLIST")
            if r[4] in ("Binlog Dump", "Binlog Dump GTID")]


@pytest.mark.integration
@needs_mariadb
def test_what_cannot_be_read_is_unknown_with_the_reason(source: MariaDBServer,
                                                        tmp_path: Path) -> None:
    settings = source.connection_settings()
    refused = read_headroom({**settings, "port": 1}, "mariadb", "0-31-1")
    assert refused.status is HeadroomStatus.UNKNOWN
    assert refused.describe().startswith("unknown: source error (2003")
    source.query("CREATE USER IF NOT EXISTS reader@'%' IDENTIFIED BY 'r'")
    source.query("GRANT SELECT ON *.* TO reader@'%'")
    blind = read_headroom({**settings, "user": "reader", "password": "r"}, "mariadb", "0-31-1")
    assert blind.status is HeadroomStatus.UNKNOWN
    assert "the account needs REPLICATION SLAVE and REPLICATION CLIENT (BINLOG MONITOR)" in (
        blind.reason)
    assert read_headroom(settings, "mariadb", None).status is HeadroomStatus.NO_CHECKPOINT
    assert read_headroom(settings, "mariadb", "garbage").status is HeadroomStatus.UNKNOWN


@pytest.mark.integration
@needs_mariadb
def test_a_checkpoint_before_the_oldest_file_is_purged(source: MariaDBServer) -> None:
    [(old, _), (_, keep)] = rotated(source, 2)
    source.query(f"PURGE BINARY LOGS TO '{keep}'")
    account = source.connection_settings()
    for checkpoint in (old, ""):
        headroom = read_headroom(account, "mariadb", checkpoint)
        assert headroom.status is HeadroomStatus.PURGED and headroom.low
        assert f"(oldest file: {keep})" in headroom.describe()


@pytest.mark.integration
@needs_mariadb
def test_after_a_restart_the_headroom_counts_from_the_files_own_start(
        source: MariaDBServer) -> None:
    """The file before a restart was closed at the shutdown, not when the next file began:
    the forecast may not be later than the server's own purge."""
    [(gtid, needed)] = rotated(source, 1)
    began = file_started_at(source.connection_settings(), needed)
    source.query("INSERT INTO h.t (v) VALUES (3)")
    time.sleep(1.1)
    source.stop()
    time.sleep(2.1)  # the downtime
    source.start()
    after = active_file(source)
    assert file_started_at(source.connection_settings(), after) == FileStart(
        pytest.approx(time.time(), abs=3), at_server_start=True)
    headroom = read_headroom(source.connection_settings(), "mariadb", gtid)
    assert headroom.needed_file == needed and headroom.restarted
    assert headroom.seconds == pytest.approx(began.at + EXPIRE - time.time(), abs=2.5)
    closed = (source.binlog_dir / needed).stat().st_mtime  # (the shutdown)
    assert headroom.seconds <= closed + EXPIRE - time.time()
