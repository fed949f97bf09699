"""A private primary and a GTID read replica, as the torture suite and failover tests use them."""

from __future__ import annotations

from collections.abc import Iterator

import pymysql
import pytest
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import MariadbGtidEvent
from pymysqlreplication.row_event import WriteRowsEvent

from cdc_platform.devservices import DevServiceError, MariaDBServer
from cdc_platform.devservices.mariadb import gtid_position_covers
from cdc_platform_tests.devservices.test_devservices import needs_mariadb


@pytest.mark.parametrize(("position", "target", "covers"), [
    ("", "", True),
    ("0-1-5", "", True),
    ("", "0-1-1", False),
    ("0-1-5", "0-1-5", True),
    ("0-1-4", "0-1-5", False),
    ("0-2-9", "0-1-5", True),  # a domain's seqnos grow across server ids
    ("0-1-9,1-1-2", "0-1-9,1-1-3", False),
    ("0-1-9,1-1-3", "1-1-3", True),
])
def test_gtid_position_covers(position: str, target: str, covers: bool) -> None:
    assert gtid_position_covers(position, target) is covers


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MariaDBServer, MariaDBServer]]:
    base = tmp_path_factory.mktemp("replication")
    primary = MariaDBServer(base / "primary", server_id=21)
    replica = MariaDBServer(base / "replica", server_id=22, replica=True,
                            slave_parallel_threads=4, slave_parallel_mode="optimistic")
    with primary, replica:
        replica.replicate_from(primary)
        yield primary, replica


pytestmark = [pytest.mark.integration, needs_mariadb]


def test_replica_runs_parallel_applier_read_only_with_log_slave_updates(pair) -> None:
    _, replica = pair
    settings = dict(replica.query(
        "SELECT variable_name, variable_value FROM information_schema.global_variables "
        "WHERE variable_name IN ('READ_ONLY', 'LOG_SLAVE_UPDATES', 'SLAVE_PARALLEL_THREADS', "
        "'SLAVE_PARALLEL_MODE', 'GTID_STRICT_MODE')"))
    assert settings == {"READ_ONLY": "ON", "LOG_SLAVE_UPDATES": "ON",
                        "SLAVE_PARALLEL_THREADS": "4", "SLAVE_PARALLEL_MODE": "optimistic",
                        "GTID_STRICT_MODE": "ON"}
    status = replica.replica_status()
    assert status["Using_Gtid"] == "Slave_Pos"
    assert status["Slave_IO_Running"] == status["Slave_SQL_Running"] == "Yes"


def test_writes_on_the_primary_reach_the_replica_and_its_binlog(pair) -> None:
    primary, replica = pair
    primary.query("CREATE DATABASE IF NOT EXISTS rep")
    primary.query("CREATE TABLE IF NOT EXISTS rep.t (id INT PRIMARY KEY, v VARCHAR(10))")
    start = replica.gtid_position()
    with primary.root_connect(autocommit=False) as conn, conn.cursor() as cur:
        for i in range(1, 201):
            cur.execute("INSERT INTO rep.t VALUES (%s, %s)", (i, f"v{i}"))
            conn.commit()
    position = replica.wait_caught_up(primary)
    assert position == primary.gtid_position()
    assert gtid_position_covers(replica.gtid_position("gtid_slave_pos"), position)
    assert replica.query("SELECT COUNT(*), MAX(id) FROM rep.t") == [(200, 200)]

    # log_slave_updates: the replica's own binlog holds the primary's GTIDs and rows, readable
    # with the restricted CDC account of the replica.
    conn = replica.connection_settings()
    conn["passwd"] = conn.pop("password")
    reader = BinLogStreamReader(connection_settings=conn, server_id=99, is_mariadb=True,
                                auto_position=start, blocking=False,
                                only_events=[MariadbGtidEvent, WriteRowsEvent])
    gtids, rows = set(), 0
    try:
        for event in reader:
            if isinstance(event, MariadbGtidEvent):
                gtids.add(event.gtid)
            elif event.table == "t":
                rows += len(event.rows)
    finally:
        reader.close()
    assert rows == 200
    assert all(g.split("-")[1] == "21" for g in gtids), gtids  # the primary's server id


def test_replica_refuses_writes_of_the_cdc_account(pair) -> None:
    _, replica = pair
    replica.query("CREATE DATABASE IF NOT EXISTS ro")  # root may (as on any replica); not cdc
    with pytest.raises(pymysql.MySQLError), pymysql.connect(
            **replica.connection_settings()) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE ro.t (id INT)")


def test_replication_needs_a_replica_server(pair, tmp_path) -> None:
    primary, _ = pair
    with pytest.raises(DevServiceError, match="not started as a replica"):
        MariaDBServer(tmp_path / "x").replicate_from(primary)
