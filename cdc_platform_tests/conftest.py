"""Session-wide real services: one private MariaDB, one local Spark session.

Each test gets its own database on the shared server, its own logical server name, landing zone
and warehouse, and an engine that starts at the binlog position current when the test began,
so tests neither see nor depend on each other's history.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pymysql
import pytest
import yaml

from cdc_platform.capture.engine import CaptureEngine, EngineOptions, EngineStats
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.source import selector_from_settings
from cdc_platform.config import Settings, parse_settings
from cdc_platform.devservices.kafka import TansuBroker
from cdc_platform.devservices.mariadb import MariaDBServer

if TYPE_CHECKING:
    from cdc_platform_tests.lake.helpers import Landing

_counter = itertools.count(1)


@pytest.fixture(scope="session")
def mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDBServer]:
    server = MariaDBServer(base_dir=tmp_path_factory.mktemp("mariadb"), server_id=1)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def kafka() -> Iterator[TansuBroker]:
    """One private Tansu broker (in-memory storage); tests use topics of their own."""
    broker = TansuBroker()
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def spark() -> Any:
    from cdc_platform.lake.spark import build_spark_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return build_spark_session(master="local[2]", app_name="cdc_platform_tests")


@dataclass
class CdcEnv:
    """One test's slice of the world: a database, a config, a landing zone, a warehouse."""

    mariadb: MariaDBServer
    db: str
    server_name: str
    root: Path
    overrides: dict[str, Any]
    start_position: str = ""
    kafka_bootstrap: str = ""

    def settings_dict(self) -> dict[str, Any]:
        conn = self.mariadb.connection_settings()
        data: dict[str, Any] = {
            "source": {
                "flavour": "mariadb", "host": conn["host"], "port": conn["port"],
                "user": conn["user"], "password_env": "CDC_TEST_SOURCE_PASSWORD",
                "server_id": 9000 + next(_counter), "server_name": self.server_name,
            },
            "capture": {
                "tables": {"include": [rf"{self.db}\..*"]},
                "heartbeat_interval_seconds": 1,
                "flush_interval_seconds": 0.2,
                "initial_position": self.start_position,
                "reconnect": {"initial_backoff_seconds": 0.2, "max_backoff_seconds": 2},
            },
            "landing_zone": {"url": str(self.root / "landing")},
            "warehouse": {"url": str(self.root / "warehouse")},
            "spark": {"master": "local[2]"},
            "reconcile": {"range_rows": 500},
            # The applier's sensor launches a Spark job under a daemon: on only where a test
            # asks for it (``@pytest.mark.cdc_config(lake={"applier": True})``).
            "lake": {"applier": False},
        }
        if self.kafka_bootstrap:  # a topic pair of this test's own on the shared broker
            data["signals"] = {
                "kafka": {"bootstrap_servers": self.kafka_bootstrap},
                "topic": f"signals-{self.db}", "notification_topic": f"notes-{self.db}",
                "sensor_interval_seconds": 1, "read_budget_seconds": 5,
            }
        for section, values in self.overrides.items():
            data.setdefault(section, {}).update(values)
        capture = data["capture"]
        if "surrogate_keys" in capture:  # keyed by "{db}.table" in markers
            capture["surrogate_keys"] = {k.replace("{db}", self.db): v
                                         for k, v in capture["surrogate_keys"].items()}
        return data

    @property
    def settings(self) -> Settings:
        return parse_settings(self.settings_dict(), f"test config for {self.db}")

    def write_config(self) -> Path:
        path = self.root / "config.yaml"
        path.write_text(yaml.safe_dump(self.settings_dict()))
        return path

    def connect(self) -> pymysql.Connection:
        return self.mariadb.root_connect(database=self.db)

    def execute(self, *statements: str, args: Any = None) -> None:
        """Run statements in ONE transaction as root."""
        with self.mariadb.root_connect(database=self.db, autocommit=False) as conn:
            with conn.cursor() as cur:
                for statement in statements:
                    cur.execute(statement, args)
            conn.commit()

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())

    @property
    def landing(self) -> LandingZone:
        return LandingZone(str(self.root / "landing"), self.server_name)

    def engine(self) -> CaptureEngine:
        return CaptureEngine(EngineOptions.from_settings(self.settings), self.landing)

    def catch_up(self) -> EngineStats:
        """Run an engine until it has landed everything the source executed so far."""
        return self.engine().run(stop_when_caught_up=True)

    def materialise(self, spark: Any, table: str) -> Any:
        from cdc_platform.lake.merge import materialise

        s = self.settings
        return materialise(spark, s.landing_zone.url, s.warehouse.url, self.server_name, None,
                           self.db, table)

    def target_rows(self, spark: Any, table: str, order_by: str = "id") -> list[dict[str, Any]]:
        df = self.target(spark, table).read()
        return [r.asDict() for r in df.orderBy(order_by).collect()]

    def target(self, spark: Any, table: str) -> Any:
        """The table's ``lake.iceberg.table.LakeTable``."""
        from cdc_platform.lake.iceberg.lake import Lake
        from cdc_platform.lake.iceberg.table import LakeTable

        return LakeTable(Lake.from_settings(spark, self.settings), self.server_name, self.db, table)

    def reconcile(self, spark: Any, table: str) -> Any:
        from cdc_platform.capture.source import SourceSession
        from cdc_platform.lake.reconcile import reconcile_table

        s = self.settings
        connection = s.source.connection_settings()
        with SourceSession(connection, selector_from_settings(s)) as source:
            schema = source.read_schema(self.db, table)
        assert schema is not None, f"{self.db}.{table} is not on the source"
        return reconcile_table(spark, self.target(spark, table).read(), connection, schema,
                               range_rows=500)


@pytest.fixture
def cdc_env(mariadb: MariaDBServer, tmp_path: Path, request: pytest.FixtureRequest,
            monkeypatch: pytest.MonkeyPatch) -> CdcEnv:
    n = next(_counter)
    db = f"t{n}_{request.node.name[:40]}".lower()
    db = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in db)
    monkeypatch.setenv("CDC_TEST_SOURCE_PASSWORD", mariadb.cdc_password)
    position = mariadb.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0] or ""
    mariadb.query(f"CREATE DATABASE `{db}`")
    marker = getattr(request.node.get_closest_marker("cdc_config"), "kwargs", {})
    env = CdcEnv(mariadb, db, f"s{n}", tmp_path, dict(marker))
    env.start_position = position
    return env


@pytest.fixture
def signal_env(cdc_env: CdcEnv, kafka: TansuBroker) -> CdcEnv:
    """``cdc_env`` with signals on: the shared broker, topics named after the test's database.
    """
    cdc_env.kafka_bootstrap = kafka.bootstrap_servers
    return cdc_env


@pytest.fixture
def landing(tmp_path: Path) -> Landing:
    """A hand-written landing zone (lake and maintenance tests)."""
    from cdc_platform_tests.lake.helpers import Landing  # (Spark-side helpers: lake tests only)

    return Landing(tmp_path / "landing")


@pytest.fixture
def warehouse(tmp_path: Path) -> str:
    """The test's own lake warehouse directory."""
    return str(tmp_path / "warehouse")
