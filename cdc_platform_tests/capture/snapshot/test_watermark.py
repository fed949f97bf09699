"""Read-only watermarks: the MySQL statement sequence (fake cursor, pure logic), prerequisites,
and the exact MariaDB watermark against a real server under concurrent commits."""

from __future__ import annotations

import bisect
import dataclasses
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pymysql
import pytest

from cdc_platform.capture.gtid import MariadbGtid, MariadbPosition, MysqlGtidSet
from cdc_platform.capture.snapshot import watermark
from cdc_platform.capture.snapshot.watermark import (
    WatermarkError,
    check_snapshot_prerequisites,
    read_with_watermarks,
    require_snapshot_prerequisites,
)
from cdc_platform.capture.source import PrerequisiteError, connect
from cdc_platform.devservices.mariadb import MariaDBServer

U1 = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
U2 = "4b11fa47-71ca-11e1-9e33-c80aa9429563"

class ChunkRead(NamedTuple):
    """Rows of one SELECT and its watermarks; unpacks as ``rows, lw, after``."""

    rows: list[tuple[Any, ...]]
    low_watermark: Any
    after: Any


def read_chunk_with_watermarks(conn: Any, flavour: str, select_sql: str,
                               args: tuple[Any, ...] = ()) -> ChunkRead:
    """One SELECT between watermarks (``read_with_watermarks``), rows as tuples."""

    def select(cur: Any) -> list[tuple[Any, ...]]:
        cur.execute(select_sql, args)
        return list(cur.fetchall())

    rows, marks = read_with_watermarks(conn, flavour, select)
    return ChunkRead(rows, marks.low_watermark, marks.after)


# ---- a fake MySQL connection that records statements ------------------------------------------

STATUS_COLUMNS = ("File", "Position", "Binlog_Do_DB", "Binlog_Ignore_DB", "Executed_Gtid_Set")


def _status(executed: str) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    return STATUS_COLUMNS, [("binlog.000003", 4711, "", "", executed)]


@dataclass(eq=False)  # hashable by identity, like a real connection
class FakeMysql:
    """Answers statements from ``answers`` (a list is consumed one answer per call)."""

    answers: dict[str, Any]
    server_info: str = "8.0.36"
    log: list[str] = field(default_factory=list)
    use_unicode: bool = True

    def get_server_info(self) -> str:
        return self.server_info

    def cursor(self, cursor_class: Any = None) -> FakeCursor:
        return FakeCursor(self)

    def commit(self) -> None:
        self.log.append("COMMIT")

    def rollback(self) -> None:
        self.log.append("ROLLBACK")


class FakeCursor:
    def __init__(self, conn: FakeMysql) -> None:
        self.conn = conn
        self.description: tuple[tuple[str], ...] | None = None
        self._rows: list[tuple[Any, ...]] = []

    def __enter__(self) -> FakeCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def execute(self, sql: str, args: Any = None) -> None:
        self.conn.log.append(sql)
        if sql == "SHOW GLOBAL VARIABLES LIKE %s":  # one of SHOW GLOBAL VARIABLES' rows
            columns, rows = self.conn.answers.get("SHOW GLOBAL VARIABLES", ((), []))
            self.description = tuple((c,) for c in columns) or None
            self._rows = [r for r in rows if r[0] == args[0]]
            return
        answer = self.conn.answers.get(sql, ((), []))
        if isinstance(answer, list):
            answer = answer.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        columns, rows = answer
        self.description = tuple((c,) for c in columns) or None
        self._rows = list(rows)

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._rows.pop(0) if self._rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows, self._rows = self._rows, []
        return rows


PARSE_ERROR = pymysql.err.ProgrammingError(1064, "You have an error in your SQL syntax")
SELECT = "SELECT `id` FROM `shop`.`orders` WHERE `id` > %s ORDER BY `id` LIMIT %s"


def test_mysql_sequence_reads_executed_set_around_the_read_view() -> None:
    conn = FakeMysql({
        "SHOW BINARY LOG STATUS": [_status(f"{U1}:1-10,\n{U2}:1-3"),
                                   _status(f"{U1}:1-12,\n{U2}:1-3")],
        SELECT: (("id",), [(7,), (8,)]),
    })
    rows, lw, after = read_chunk_with_watermarks(conn, "mysql", SELECT, (6, 2))
    assert rows == [(7,), (8,)]
    assert lw == MysqlGtidSet.parse(f"{U1}:1-10,{U2}:1-3")
    assert after == MysqlGtidSet.parse(f"{U1}:1-12,{U2}:1-3")
    assert conn.log == [
        "SHOW BINARY LOG STATUS", "COMMIT",  # lw, then no metadata lock held
        "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        "START TRANSACTION WITH CONSISTENT SNAPSHOT",
        SELECT, "COMMIT",
        "SHOW BINARY LOG STATUS", "COMMIT",  # after
    ]


def test_mysql_falls_back_to_show_master_status_once_per_connection() -> None:
    conn = FakeMysql({
        "SHOW BINARY LOG STATUS": [PARSE_ERROR],
        "SHOW MASTER STATUS": [_status(f"{U1}:1-5"), _status(f"{U1}:1-6"),
                               _status(f"{U1}:1-6"), _status(f"{U1}:1-9")],
        SELECT: (("id",), []),
    })
    first = read_chunk_with_watermarks(conn, "mysql", SELECT, (0, 5))
    second = read_chunk_with_watermarks(conn, "mysql", SELECT, (0, 5))
    assert first == ChunkRead([], MysqlGtidSet.parse(f"{U1}:1-5"), MysqlGtidSet.parse(f"{U1}:1-6"))
    assert second.after == MysqlGtidSet.parse(f"{U1}:1-9")
    assert conn.log.count("SHOW BINARY LOG STATUS") == 1
    assert conn.log.count("SHOW MASTER STATUS") == 4


def test_mysql_other_errors_are_not_swallowed_and_the_read_view_is_rolled_back() -> None:
    denied = pymysql.err.OperationalError(1227, "Access denied; you need REPLICATION CLIENT")
    with pytest.raises(pymysql.err.OperationalError):
        read_chunk_with_watermarks(FakeMysql({"SHOW BINARY LOG STATUS": [denied]}), "mysql",
                                   SELECT, (0, 5))
    gone = pymysql.err.ProgrammingError(1146, "Table 'shop.orders' doesn't exist")
    conn = FakeMysql({"SHOW BINARY LOG STATUS": [_status(f"{U1}:1")], SELECT: [gone]})
    with pytest.raises(pymysql.err.ProgrammingError):
        read_chunk_with_watermarks(conn, "mysql", SELECT, (0, 5))
    assert conn.log[-2:] == [SELECT, "ROLLBACK"]


def test_mysql_without_binlog_or_gtids_is_a_clear_error() -> None:
    conn = FakeMysql({"SHOW BINARY LOG STATUS": (STATUS_COLUMNS[:4], [])})
    with pytest.raises(WatermarkError, match="binary logging or GTIDs are off"):
        read_chunk_with_watermarks(conn, "mysql", SELECT, (0, 5))


def _mysql_server(variables: dict[str, str], replica: bool) -> FakeMysql:
    base = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL",
            "binlog_row_metadata": "FULL", "gtid_mode": "ON", "enforce_gtid_consistency": "ON"}
    replica_rows = [("Waiting for source to send event", "primary.example", 3306)] if replica else []
    return FakeMysql({
        "SHOW GLOBAL VARIABLES": (("Variable_name", "Value"), list({**base, **variables}.items())),
        "SHOW REPLICA STATUS": (("Replica_IO_State", "Source_Host", "Source_Port"), replica_rows),
    })


@pytest.mark.parametrize(
    ("variables", "replica", "problems"),
    [
        ({"replica_parallel_workers": "4", "replica_preserve_commit_order": "OFF"}, False, []),
        ({"replica_parallel_workers": "4", "replica_preserve_commit_order": "ON",
          "log_replica_updates": "ON"}, True, []),
        ({"replica_parallel_workers": "4", "replica_preserve_commit_order": "OFF",
          "log_replica_updates": "ON"}, True,
         ["replica_parallel_workers is 4 but replica_preserve_commit_order is 'OFF'"]),
        # Once, from the streaming prerequisites (the snapshot check does not repeat it).
        ({"slave_parallel_workers": "0", "log_slave_updates": "OFF"}, True,
         ["the server is a replica (SHOW REPLICA STATUS) but log_slave_updates is 'OFF'"]),
        ({"gtid_mode": "OFF_PERMISSIVE", "replica_parallel_workers": "0",
          "log_replica_updates": "ON"}, True, ["gtid_mode is 'OFF_PERMISSIVE', needs 'ON'"]),
    ],
)
def test_mysql_replica_prerequisites(variables: dict[str, str], replica: bool,
                                     problems: list[str]) -> None:
    found = check_snapshot_prerequisites(_mysql_server(variables, replica), "mysql")
    assert len(found) == len(problems)
    for problem, expected in zip(found, problems, strict=True):
        assert expected in problem


def test_mysql_replica_detection_falls_back_to_show_slave_status() -> None:
    conn = _mysql_server({"log_slave_updates": "OFF"}, replica=False)
    conn.answers["SHOW REPLICA STATUS"] = [PARSE_ERROR] * 2  # (the streaming check asks too)
    conn.answers["SHOW SLAVE STATUS"] = (("Slave_IO_State",), [("Waiting for master",)])
    with pytest.raises(PrerequisiteError, match="log_slave_updates is 'OFF'.*restart it"):
        require_snapshot_prerequisites(conn, "mysql", "shop")


# ---- MariaDB, for real -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stress_db(mariadb: Any) -> Iterator[str]:
    db = "snapshot_watermark"
    mariadb.query(f"DROP DATABASE IF EXISTS `{db}`")
    mariadb.query(f"CREATE DATABASE `{db}`")
    yield db
    mariadb.query(f"DROP DATABASE IF EXISTS `{db}`")


@pytest.fixture
def durable_commits(mariadb: Any) -> Iterator[None]:
    """Durable commits (fsync of binlog and redo log, as in production) widen the gap between
    a transaction's binlog write and its storage-engine commit: the race we want to expose."""
    saved = mariadb.query("SELECT @@GLOBAL.sync_binlog, @@GLOBAL.innodb_flush_log_at_trx_commit")
    mariadb.query("SET GLOBAL sync_binlog = 1")
    mariadb.query("SET GLOBAL innodb_flush_log_at_trx_commit = 1")
    try:
        yield
    finally:
        mariadb.query(f"SET GLOBAL sync_binlog = {int(saved[0][0])}")
        mariadb.query(f"SET GLOBAL innodb_flush_log_at_trx_commit = {int(saved[0][1])}")


def test_mariadb_prerequisites_hold_on_the_dev_server(mariadb: Any) -> None:
    """The CDC account lacks SLAVE MONITOR: replica detection falls back to status variables."""
    with connect(mariadb.connection_settings()) as conn:
        assert check_snapshot_prerequisites(conn, "mariadb") == []
        assert "source.flavour is 'mysql'" in check_snapshot_prerequisites(conn, "mysql")[0]


def test_mariadb_watermark_is_exact_and_the_session_read_only(mariadb: Any,
                                                               stress_db: str) -> None:
    mariadb.query(f"CREATE TABLE `{stress_db}`.basic (id INT PRIMARY KEY)")
    with mariadb.root_connect(database=stress_db) as writer, writer.cursor() as cur:
        cur.execute("INSERT INTO basic VALUES (1)")
        cur.execute("SELECT @@last_gtid")
        first = MariadbGtid.parse(cur.fetchone()[0])
    with connect(mariadb.connection_settings()) as conn:
        rows, lw, after = read_chunk_with_watermarks(
            conn, "mariadb", f"SELECT id FROM `{stress_db}`.basic ORDER BY id", ())
        assert rows == [(1,)] and lw == after and first in lw
    # Even an account that may write cannot inside the watermarked read view.
    with connect(mariadb.connection_settings(user="root")) as conn:
        with pytest.raises(pymysql.err.MySQLError, match="READ ONLY"):
            read_chunk_with_watermarks(conn, "mariadb",
                                       f"INSERT INTO `{stress_db}`.basic VALUES (2)", ())
        assert read_chunk_with_watermarks(
            conn, "mariadb", f"SELECT COUNT(*) FROM `{stress_db}`.basic", ()).rows == [(1,)]


# ---- the stress test ---------------------------------------------------------------------------

WRITERS = 6
STRESS_SECONDS = 4.0


@dataclass
class Commits:
    """Rows committed by the writers: id -> GTID (read with @@last_gtid after COMMIT)."""

    gtid_of: dict[int, MariadbGtid] = field(default_factory=dict)
    errors: list[BaseException] = field(default_factory=list)

    def index(self) -> dict[int, tuple[list[int], list[int]]]:
        """Per domain: seqs sorted, and the ids in that order."""
        by_domain: dict[int, list[tuple[int, int]]] = {}
        for row_id, gtid in self.gtid_of.items():
            by_domain.setdefault(gtid.domain, []).append((gtid.seq, row_id))
        return {d: ([s for s, _ in sorted(v)], [i for _, i in sorted(v)])
                for d, v in by_domain.items()}


def _write_as_fast_as_possible(mariadb: Any, db: str, writer: int, stop: threading.Event,
                               commits: Commits) -> None:
    try:
        with mariadb.root_connect(database=db, autocommit=False) as conn, conn.cursor() as cur:
            n = 0
            while not stop.is_set():
                row_id = writer * 10_000_000 + n
                cur.execute("INSERT INTO stress (id) VALUES (%s)", (row_id,))
                conn.commit()
                cur.execute("SELECT @@last_gtid")
                commits.gtid_of[row_id] = MariadbGtid.parse(cur.fetchone()[0])
                n += 1
    except BaseException as error:  # noqa: BLE001 - reported by the test
        commits.errors.append(error)


def _under_write_load(mariadb: Any, db: str, read: Any) -> tuple[Commits, list[Any]]:
    """Run ``read(conn)`` repeatedly while WRITERS threads commit single-row INSERTs."""
    mariadb.query(f"DROP TABLE IF EXISTS `{db}`.stress")
    mariadb.query(f"CREATE TABLE `{db}`.stress (id BIGINT PRIMARY KEY)")
    commits, stop, reads = Commits(), threading.Event(), []
    threads = [threading.Thread(target=_write_as_fast_as_possible,
                                args=(mariadb, db, w, stop, commits), daemon=True)
               for w in range(WRITERS)]
    for thread in threads:
        thread.start()
    try:
        with connect(mariadb.connection_settings()) as conn:
            deadline = time.monotonic() + STRESS_SECONDS
            while time.monotonic() < deadline:
                reads.append(read(conn))
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    assert not commits.errors, commits.errors[:1]
    return commits, reads


def _violations(commits: Commits, index: dict, visible: frozenset[int],
                lw: MariadbPosition, after: MariadbPosition) -> tuple[set[int], set[int]]:
    """(rows in lw the SELECT missed, rows the SELECT saw that are outside after)."""
    missing, allowed = set(), set()
    for domain, (seqs, ids) in index.items():
        in_lw = lw.get(domain)
        in_after = after.get(domain)
        k_lw = bisect.bisect_right(seqs, in_lw.seq) if in_lw else 0
        k_after = bisect.bisect_right(seqs, in_after.seq) if in_after else 0
        missing |= set(ids[:k_lw]) - visible
        allowed |= set(ids[:k_after])
    unknown = visible - commits.gtid_of.keys()
    return missing, (visible - allowed) | unknown


@pytest.mark.parametrize("resolve", ["server", "events"])
def test_exact_watermark_under_concurrent_commits(mariadb: Any, stress_db: str,
                                                  durable_commits: None, resolve: str,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """Every row whose GTID is in lw is in the chunk; no row whose GTID is outside after is.
    With the offset's GTID position from BINLOG_GTID_POS, and from the events since the
    previous read (checked against the server every 8th read)."""
    if resolve == "events":
        monkeypatch.setattr(watermark, "INCREMENTAL_MAX_GAP_FRACTION", 1.0)
        monkeypatch.setattr(watermark, "VERIFY_EVERY", 8)
    else:
        monkeypatch.setattr(watermark, "INCREMENTAL_MAX_GAP_FRACTION", 0.0)

    def read(conn: Any) -> ChunkRead:
        return read_chunk_with_watermarks(conn, "mariadb", f"SELECT id FROM `{stress_db}`.stress",
                                          ())

    commits, reads = _under_write_load(mariadb, stress_db, read)
    index = commits.index()
    assert len(commits.gtid_of) > 500 and len(reads) > 20, "too little load to mean anything"
    advanced = 0
    for number, (rows, lw, after) in enumerate(reads):
        missing, extra = _violations(commits, index, frozenset(r[0] for r in rows), lw, after)
        assert not missing, f"read {number}: lw {lw} holds rows the SELECT missed: {missing}"
        assert not extra, f"read {number}: the SELECT saw rows outside after {after}: {extra}"
        advanced += number > 0 and lw != reads[number - 1].low_watermark
    assert "BINLOG_GTID_POS is used from now on" not in caplog.text
    # The check can fail: a read claiming the next read's (newer) watermark names commits its
    # SELECT could not see, and is caught.
    caught = 0
    for before, later in zip(reads, reads[1:], strict=False):
        if later.low_watermark != before.low_watermark:
            missing, _ = _violations(commits, index, frozenset(r[0] for r in before.rows),
                                     later.low_watermark, later.after)
            assert missing, f"a watermark newer than read's ({later.low_watermark}) went unseen"
            caught += 1
    assert caught >= 10, "too few changing watermarks to show the check can fail"
    print(f"\nexact watermark ({resolve}): {len(reads)} reads, {advanced} with a new watermark, "
          f"{len(commits.gtid_of)} concurrent commits, 0 violations")


def test_gtid_binlog_pos_before_the_snapshot_is_unsafe(mariadb: Any, stress_db: str,
                                                       durable_commits: None,
                                                       record_property: Any) -> None:
    """Reports how often ``@@gtid_binlog_pos`` read just before a consistent snapshot names
    transactions the snapshot cannot see. The race need not happen in every run, so this
    does not assert that it does; it asserts that the exact watermark taken in the same
    snapshot never does."""

    def read(conn: Any) -> tuple[frozenset[int], MariadbPosition, MariadbPosition]:
        with conn.cursor() as cur:
            cur.execute("SELECT @@GLOBAL.gtid_binlog_pos")
            unsafe = MariadbPosition.parse(cur.fetchone()[0])
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            cur.execute("SHOW SESSION STATUS LIKE 'binlog_snapshot_%'")
            status = dict(cur.fetchall())
            cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (
                status["Binlog_snapshot_file"], int(status["Binlog_snapshot_position"])))
            exact = MariadbPosition.parse(cur.fetchone()[0])
            cur.execute(f"SELECT id FROM `{stress_db}`.stress")
            rows = frozenset(r[0] for r in cur.fetchall())
            conn.commit()
        return rows, unsafe, exact

    commits, reads = _under_write_load(mariadb, stress_db, read)
    index = commits.index()
    wrong = invisible = 0
    for rows, unsafe, exact in reads:
        missing, _ = _violations(commits, index, rows, unsafe, unsafe)
        wrong += bool(missing)
        invisible += len(missing)
        assert not _violations(commits, index, rows, exact, exact)[0]
    rate = wrong / len(reads)
    record_property("unsafe_watermark_wrong_reads", f"{wrong}/{len(reads)}")
    print(f"\n@@gtid_binlog_pos as low watermark: wrong in {wrong} of {len(reads)} reads "
          f"({rate:.1%}), naming {invisible} transactions the snapshot could not see; "
          f"{len(commits.gtid_of)} concurrent commits")


# ---- the GTID position of an offset, from the events since the previous one ---------------------


def _server_position(conn: Any, file: str, offset: int) -> MariadbPosition:
    with conn.cursor() as cur:
        cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (file, offset))
        return MariadbPosition.parse(cur.fetchone()[0])


def _binlog_offset(conn: Any) -> tuple[str, int]:
    with conn.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        file, offset = cur.fetchone()[:2]
    return str(file), int(offset)


@pytest.fixture(scope="module")
def domains_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDBServer]:
    """A server of its own: writes in other GTID domains and binlog rotations would change
    what other tests see of the shared server's GTID position."""
    server = MariaDBServer(base_dir=tmp_path_factory.mktemp("mariadb-domains"), server_id=1)
    server.start()
    try:
        server.query("CREATE DATABASE domains")
        yield server
    finally:
        server.stop()


def test_positions_from_events_match_binlog_gtid_pos(domains_server: MariaDBServer,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Random histories of commits in several domains, DDL, rollbacks, multi-statement
    transactions, idle steps and binlog rotations: the position computed from the events since
    the connection's previous offset is BINLOG_GTID_POS's, at every step."""
    monkeypatch.setattr(watermark, "INCREMENTAL_MAX_GAP_FRACTION", 1.0)  # always from events
    monkeypatch.setattr(watermark, "VERIFY_EVERY", 10**9)
    mariadb, stress_db = domains_server, "domains"
    mariadb.query(f"CREATE TABLE `{stress_db}`.history (id INT PRIMARY KEY, v INT)")
    rng = random.Random(20261123)
    from_events = 0
    with mariadb.root_connect(database=stress_db) as writer, writer.cursor() as w, \
            connect(mariadb.connection_settings()) as reader, reader.cursor() as cur:
        for step in range(150):
            action = rng.choice(["insert", "insert", "update", "txn", "rollback", "ddl", "idle",
                                 "rotate"])
            w.execute("SET SESSION gtid_domain_id = %s", (rng.choice([0, 0, 1, 7]),))
            if action == "insert":
                w.execute("INSERT INTO history VALUES (%s, 0)", (step,))
            elif action == "update":
                w.execute("UPDATE history SET v = v + 1 WHERE id %% 3 = %s", (step % 3,))
            elif action in ("txn", "rollback"):
                w.execute("BEGIN")
                w.execute("INSERT INTO history VALUES (%s, 1)", (1000 + step,))
                w.execute("UPDATE history SET v = v + 1 WHERE id = %s", (1000 + step,))
                w.execute("ROLLBACK" if action == "rollback" else "COMMIT")
            elif action == "ddl":
                w.execute(f"CREATE TABLE IF NOT EXISTS t_{step} (id INT PRIMARY KEY)")
            elif action == "rotate":
                w.execute("FLUSH BINARY LOGS")
            file, offset = _binlog_offset(reader)
            before = watermark._resolved.get(reader)
            position = watermark._mariadb_gtid_position(reader, cur, file, offset)
            assert position == _server_position(reader, file, offset), (
                f"step {step} ({action}) at {file}:{offset}")
            from_events += before is not None and before.file == file
        assert from_events > 100, "the events path was hardly taken"


def test_a_wrong_position_from_events_is_caught_by_the_server_check(
        mariadb: Any, stress_db: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(watermark, "INCREMENTAL_MAX_GAP_FRACTION", 1.0)
    monkeypatch.setattr(watermark, "VERIFY_EVERY", 3)
    mariadb.query(f"CREATE TABLE `{stress_db}`.checked (id INT PRIMARY KEY)")
    with mariadb.root_connect(database=stress_db) as writer, writer.cursor() as w, \
            connect(mariadb.connection_settings()) as reader, reader.cursor() as cur:
        def step(n: int) -> tuple[MariadbPosition, MariadbPosition]:
            w.execute("INSERT INTO checked VALUES (%s)", (n,))
            file, offset = _binlog_offset(reader)
            return (watermark._mariadb_gtid_position(reader, cur, file, offset),
                    _server_position(reader, file, offset))

        got, want = step(1)
        assert got == want
        # Corrupt what the connection remembers: the next two steps (from events) carry it
        # on, the third (the server's check) finds the difference and stops using events.
        last = watermark._resolved[reader]
        wrong = MariadbPosition([*last.position, MariadbGtid(99, 1, 1)])  # (no such domain)
        watermark._resolved[reader] = dataclasses.replace(last, position=wrong)
        for n in (2, 3):
            got, want = step(n)
            assert got != want
        assert "please report" not in caplog.text
        got, want = step(4)
        assert got == want
        assert "BINLOG_GTID_POS is used from now on" in caplog.text
        assert watermark._resolved[reader].events_disabled
        for n in range(5, 9):
            got, want = step(n)
            assert got == want


def test_positions_from_events_over_statements_holding_arbitrary_bytes(
        mariadb: Any, stress_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """SHOW BINLOG EVENTS' Info column quotes each statement (MariaDB's annotate-rows events):
    binary literals put bytes there that are not UTF-8. The events path reads past them."""
    monkeypatch.setattr(watermark, "INCREMENTAL_MAX_GAP_FRACTION", 1.0)  # always from events
    monkeypatch.setattr(watermark, "VERIFY_EVERY", 10**9)
    mariadb.query(f"CREATE TABLE `{stress_db}`.blobs (id INT PRIMARY KEY, b VARBINARY(16), "
                  "u BINARY(16))")
    with mariadb.root_connect(database=stress_db) as writer, writer.cursor() as w, \
            connect(mariadb.connection_settings()) as reader:
        def read() -> tuple[MariadbPosition, MariadbPosition]:
            chunk = read_chunk_with_watermarks(
                reader, "mariadb", f"SELECT COUNT(*) FROM `{stress_db}`.blobs", ())
            resolved = watermark._resolved[reader]
            return chunk.low_watermark, _server_position(reader, resolved.file,
                                                         resolved.offset)

        read()  # the server's position: the next ones come from the events since
        w.execute("INSERT INTO blobs VALUES (1, UNHEX('FF00C3'), X'80818283')")
        w.execute("INSERT INTO blobs VALUES (%s, %s, %s)",
                  (2, b"\xff\x00\xc3\x28", bytes(range(0x80, 0x90))))
        w.execute(b"INSERT INTO blobs VALUES (3, '\xff\xfe\xc3', '\xed\xa0\x80')")
        w.execute(b"UPDATE blobs SET b = '\x80' WHERE u = '\xed\xa0\x80' /* \xff */")
        got, want = read()
        assert got == want
        assert watermark._resolved[reader].since_verified == 1, "the events path was not taken"
        w.execute(b"DELETE FROM blobs WHERE b = '\xff\xfe\xc3' OR id = 1 /* \xc0\xaf */")
        got, want = read()
        assert got == want and watermark._resolved[reader].since_verified == 2
