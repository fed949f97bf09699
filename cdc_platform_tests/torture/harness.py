"""Running the torture: a primary and two replicas, cells captured one by one, then faults.

Phase 1 (cells): each cell's SQL runs on the primary; once replica 1 has applied it, a capture
engine of the cell's own (own server name and landing zone, filtered to the cell's tables)
streams it from replica 1 with the restricted account, until caught up; the targets are
materialised and compared with the primary (``compare.py``). An engine exception is a loud stop
when it is an ``EngineError`` whose message names the GTID, the table and the cell's column: the
rule "never silent" allows that outcome and no other. Snapshot cells start their engine after
the cell's SQL, so their rows arrive only through an incremental snapshot (the SELECT path).
Every cell also checks the landing layout, and names cells the Dagster definitions.

Phase 2 (faults): one engine, ``python -m cdc_platform stream`` as a subprocess, captures every
cell that passed phase 1 (from the start of the binlog) plus a workload that keeps writing to the
primary; it is SIGKILLed at seeded random points and restarted, then fails over to replica 2 (same
server name, same landing zone), catches up, and every target is compared with the primary.
With ``snapshot_rounds`` (the S3 torture's), snapshot readers (``python -m cdc_platform snapshot``
as subprocesses, as the snapshot asset's runs) snapshot fault tables while the workload writes
and the engine is killed, the first ``reader_kills`` of them SIGKILLed mid-snapshot and started
again (the next reader resumes the session); each must end with exit code 0 before the failover.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pymysql
import yaml

from cdc_platform.devservices.mariadb import MariaDBServer
from cdc_platform_tests.torture.cells import Cell, CellResult, quote
from cdc_platform_tests.torture.compare import TableVerdict, compare_table

PASSWORD_ENV = "CDC_TORTURE_SOURCE_PASSWORD"
FAULTS_DB = "torture_faults"
#: What the suite found, cell by cell and for the fault run (printed and written as JSON).
REPORT: dict[str, Any] = {"cells": {}, "faults": None, "sources": None}
_server_ids = iter(range(7000, 8000))


@dataclass
class Cluster:
    primary: MariaDBServer
    replica1: MariaDBServer
    replica2: MariaDBServer
    base_dir: Path
    _plain_replica: MariaDBServer | None = None

    def plain_replica(self) -> MariaDBServer:
        """A third replica with MariaDB's default ``log_slave_updates=OFF`` (started lazily)."""
        if self._plain_replica is None:
            replica = MariaDBServer(self.base_dir / "replica-plain", server_id=9, replica=True,
                                    extra_args=("--log-slave-updates=OFF",))
            replica.start()
            replica.replicate_from(self.primary)
            self._plain_replica = replica
        return self._plain_replica

    def stop(self) -> None:
        if self._plain_replica is not None:
            self._plain_replica.stop()

    @property
    def replicas(self) -> tuple[MariaDBServer, MariaDBServer]:
        return (self.replica1, self.replica2)

    def wait_replicated(self, timeout: float = 120.0) -> str:
        position = ""
        for replica in self.replicas:
            position = replica.wait_caught_up(self.primary, timeout)
        return position

    def compressed_events(self, server: MariaDBServer) -> int:
        """Compressed row events in ``server``'s binlogs (SHOW BINLOG EVENTS, as root)."""
        count = 0
        for row in server.query("SHOW BINARY LOGS"):
            for event in server.query(f"SHOW BINLOG EVENTS IN '{row[0]}'"):
                count += "compressed" in str(event[2]).lower()
        return count

    def set_compression(self, on: bool) -> None:
        """``log_bin_compress`` on the primary and on both replicas: a replica writes the
        events it applies into its own binlog compressed only when it is set there too."""
        for server in (self.primary, *self.replicas):
            server.query(f"SET GLOBAL log_bin_compress = {'ON' if on else 'OFF'}")


@dataclass
class ObjectStorage:
    """Where a run's landing zone and warehouse live when the torture runs on S3: a SeaweedFS
    (its ``s3`` section, the landing bucket, and its Iceberg REST catalog as the warehouse).
    Unset (``STORAGE.s3 is None``), every run keeps both under its local folder."""

    s3: Any = None  # the SeaweedFS the run started
    landing_bucket: str = "landing"
    table_bucket: str = "lake"

    def sections(self, root: Path) -> dict[str, Any]:
        """The config's storage sections for a run whose local folder is ``root``: each run's
        landing zone under a prefix of its own (the folder's name), one warehouse (the table
        bucket; a run's tables are apart by their server name's namespace)."""
        if self.s3 is None:
            return {"landing_zone": {"url": str(root / "landing")},
                    "warehouse": {"url": str(root / "warehouse")}}
        return {
            "landing_zone": {"url": f"s3://{self.landing_bucket}/{root.name}"},
            "warehouse": {"url": f"s3://{self.table_bucket}", "catalog": {
                "type": "rest", "uri": self.s3.catalog_uri,
                "properties": {"rest.auth.type": "sigv4", "rest.signing-name": "s3tables",
                               "rest.signing-region": self.s3.region}}},
            "s3": {"endpoint_url": self.s3.endpoint_url, "region": self.s3.region,
                   "path_style": True},
        }

    def catalog_rows(self, namespace: str, name: str) -> list[dict[str, Any]] | None:
        """A target's rows read with pyiceberg through the REST catalog (not through the Spark
        session that wrote them), as the acceptance run reads them; None if it has no table."""
        from pyiceberg.catalog.rest import RestCatalog
        from pyiceberg.exceptions import NoSuchTableError

        catalog = RestCatalog("torture", **self.s3.catalog_properties())
        try:
            table = catalog.load_table((namespace, name))
        except NoSuchTableError:
            return None
        return [{k: v for k, v in row.items() if not k.startswith("__cdc_")}
                for row in table.scan().to_arrow().to_pylist()]


#: The storage of every run of this process (``test_torture_s3`` points it at its SeaweedFS).
STORAGE = ObjectStorage()


def config_dict(source: Any, server_name: str, root: Path, include: list[str],
                initial_position: str, server_id: int | None = None,
                surrogate_keys: dict[str, list[str]] | None = None) -> dict[str, Any]:
    conn = source.connection_settings()
    data = {
        "source": {"flavour": "mariadb", "host": conn["host"], "port": conn["port"],
                   "user": conn["user"], "password_env": PASSWORD_ENV,
                   "server_id": server_id or next(_server_ids), "server_name": server_name},
        "capture": {"tables": {"include": include}, "heartbeat_interval_seconds": 1,
                    "flush_interval_seconds": 0.2, "initial_position": initial_position,
                    "reconnect": {"initial_backoff_seconds": 0.2, "max_backoff_seconds": 2}},
        "spark": {"master": "local[2]"},
        **STORAGE.sections(root),
    }
    if surrogate_keys:
        data["capture"]["surrogate_keys"] = surrogate_keys
    return data


@dataclass
class _Source:
    """A config's source section, shaped like the MariaDBServer that ``config_dict`` takes."""

    section: Any

    def connection_settings(self) -> dict[str, Any]:
        return {"host": self.section.host, "port": self.section.port, "user": self.section.user}


def run_statements(server: MariaDBServer, statements: tuple[Any, ...] | list[Any],
                   pause: float = 0.0) -> None:
    """Run statements (or ``(statement, args)`` pairs) in order, autocommit on."""
    with server.root_connect() as conn, conn.cursor() as cur:
        for statement in statements:
            if isinstance(statement, tuple):
                cur.execute(*statement)
            else:
                cur.execute(statement)
            if pause:
                time.sleep(pause)


# ---- materialising and comparing -----------------------------------------------------------


def target_rows(spark: Any, settings: Any, database: str, table: str
                ) -> list[dict[str, Any]] | None:
    from cdc_platform.lake.iceberg.lake import Lake
    from cdc_platform.lake.iceberg.table import LakeTable

    target = LakeTable(Lake.from_settings(spark, settings), settings.source.server_name, database,
                       table)
    if STORAGE.s3 is not None:
        return STORAGE.catalog_rows(target.namespace, target.name)
    if target.current() is None:
        return None
    return [row.asDict() for row in target.read().collect()]


def materialise_and_compare(spark: Any, settings: Any, primary: MariaDBServer,
                            tables: list[tuple[str, str]],
                            keys: dict[str, tuple[str, ...]] | None = None
                            ) -> list[TableVerdict]:
    from cdc_platform.capture import names
    from cdc_platform.capture.ddl import stale_markers
    from cdc_platform.capture.landing.zone import LandingZone
    from cdc_platform.lake.merge import materialise

    landing = LandingZone.from_settings(settings)
    gone = {m.table_id for m in stale_markers.read_markers(landing) if m.gone}
    verdicts = []
    with primary.root_connect() as conn:
        for database, table in tables:
            try:
                materialise(spark, settings.landing_zone.url, settings.warehouse.url,
                            settings.source.server_name, None, database, table,
                            catalog=settings.warehouse.catalog, s3=settings.s3)
                rows = target_rows(spark, settings, database, table)
            except Exception as error:  # noqa: BLE001 - reported as the table's verdict
                verdict = TableVerdict(f"{database}.{table}")
                verdict.problems.append(f"materialise failed: {_one_line(error)}")
                verdicts.append(verdict)
                continue
            verdicts.append(compare_table(conn, database, table, rows,
                                          (keys or {}).get(table),
                                          marked_gone=names.table_id(database, table) in gone))
    return verdicts


def landed_tables(settings: Any) -> list[tuple[str, str]]:
    from cdc_platform.capture.landing.zone import LandingZone

    landing = LandingZone.from_settings(settings)
    return sorted((s.database, s.table) for s in landing.read_tables().values())


def _one_line(error: BaseException, limit: int = 400) -> str:
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= limit else text[:limit] + "..."


_GTID = re.compile(r"\b\d+-\d+-\d+\b")


def stop_kind(error: BaseException, cell: Cell) -> str:
    """``loud-stop``: an EngineError naming the GTID, a table of the cell and its column (or,
    for a refused setting, an EngineError or start refusal naming the setting);
    ``unclear-stop``: one that does not;
    ``crash``: anything else (a crash loop once the engine is restarted)."""
    stops = {"EngineError", "SnapshotError"}
    if cell.loud_words:  # a refused setting is a start refusal (one line on the CLI)
        stops |= {"PrerequisiteError", "StartError"}
    if not any(k.__name__ in stops for k in type(error).__mro__):
        return "crash"
    text = str(error)
    if cell.loud_words:
        return "loud-stop" if all(w in text for w in cell.loud_words) else "unclear-stop"
    names_table = any(table in text for _, table in cell.tables)
    names_column = cell.column is None or cell.column in text
    return "loud-stop" if names_table and names_column and _GTID.search(text) else (
        "unclear-stop")


# ---- phase 1: cells ------------------------------------------------------------------------


def run_startup_cell(cluster: Cluster, cell: Cell, root: Path, index: int) -> CellResult:
    """``python -m cdc_platform stream`` as a new user runs it (default ``initial_position``) with a
    broken account on replica 1: it either works all the same, or exits non-zero with one line
    (no traceback) that names the setting or grant (any of ``loud_words``)."""
    started = time.monotonic()
    replica = cluster.replica1
    user, password, given = "torture_start", "right", "right"
    grants = "SELECT, REPLICATION SLAVE, REPLICATION CLIENT"
    if cell.account == "wrong_password":
        given = "wrong"
    elif cell.account == "no_binlog_monitor":
        grants = "SELECT, REPLICATION SLAVE"
    with replica.root_connect() as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_log_bin = 0")  # a replica-local GTID would break failover
        cur.execute("DROP USER IF EXISTS %s@'%%'", (user,))
        cur.execute("CREATE USER %s@'%%' IDENTIFIED BY %s", (user, password))
        cur.execute(f"GRANT {grants} ON *.* TO %s@'%%'", (user,))
    server_name = f"cell{index:03d}"
    data = config_dict(replica, server_name, root / server_name, [r"torture_types\..*"],
                       "earliest")
    data["source"]["user"] = user
    data["source"]["password_env"] = "CDC_TORTURE_START_PASSWORD"
    config = root / server_name / "config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump(data))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "cdc_platform", "stream", "--config", str(config),
             "--until-caught-up"], capture_output=True, text=True, timeout=120,
            env={**os.environ, "CDC_TORTURE_START_PASSWORD": given})
    except subprocess.TimeoutExpired:
        return CellResult(cell.id, "fail", "the engine neither started nor stopped in 120 s",
                          seconds=time.monotonic() - started)
    output = (done.stdout + done.stderr).strip()
    lines = [line for line in output.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    problems = []
    if done.returncode == 0:
        if cell.account == "wrong_password":
            problems.append("exit code 0")
        return CellResult(cell.id, "fail" if problems else "pass",
                          f"exit 0 (works without the grant): {last}"[:600],
                          seconds=time.monotonic() - started)
    if "Traceback" in output:
        problems.append("a traceback")
    if not any(word.lower() in last.lower() for word in cell.loud_words):
        problems.append(f"a last line naming none of {list(cell.loud_words)}")
    status = "fail" if problems else "loud-stop"
    detail = (f"{', '.join(problems)}: " if problems else "") + f"exit {done.returncode}: {last}"
    return CellResult(cell.id, status, detail[:600], seconds=time.monotonic() - started)


def run_cell(cluster: Cluster, spark: Any, cell: Cell, root: Path, index: int) -> CellResult:
    """Write the cell on the primary, capture it alone from replica 1, compare its targets."""
    from cdc_platform.capture.engine import CaptureEngine, EngineOptions
    from cdc_platform.capture.landing.zone import LandingZone
    from cdc_platform.config import parse_settings

    started = time.monotonic()
    start = cluster.primary.gtid_position()
    source = cluster.plain_replica() if cell.source == "no_log_slave_updates" else (
        cluster.replica1)
    compressed_before = cluster.compressed_events(cluster.replica1) if cell.compressed else 0
    try:
        if cell.compressed:
            cluster.set_compression(True)
        for database in cell.databases:
            run_statements(cluster.primary, [f"CREATE DATABASE IF NOT EXISTS {quote(database)}"])
        run_statements(cluster.primary, cell.statements)
        if cell.snapshot:  # the engine starts here: the rows can only come by the snapshot
            start = cluster.primary.gtid_position()
        # (applied, and logged compressed, before the replicas' compression is turned off)
        cluster.wait_replicated()
    except pymysql.MySQLError as error:
        return CellResult(cell.id, "setup-error", _one_line(error),
                          seconds=time.monotonic() - started)
    finally:
        if cell.compressed:
            cluster.set_compression(False)
    if cell.compressed and cluster.compressed_events(cluster.replica1) <= compressed_before:
        return CellResult(cell.id, "setup-error", "replica 1 logged no compressed row event",
                          seconds=time.monotonic() - started)
    if source is not cluster.replica1:
        source.wait_caught_up(cluster.primary, logged=False)
    server_name = f"cell{index:03d}"
    keys = dict(cell.surrogate_keys)
    data = config_dict(source, server_name, root / server_name, cell.include_patterns(), start,
                       surrogate_keys={f"{db}.{t}": list(keys[t]) for db, t in cell.tables
                                       if t in keys})
    settings = parse_settings(data, f"torture cell {cell.id}")
    (root / server_name).mkdir(parents=True, exist_ok=True)
    (root / server_name / "config.yaml").write_text(yaml.safe_dump(data, allow_unicode=True))
    landing = LandingZone.from_settings(settings)
    try:
        if cell.snapshot:
            _snapshot(cluster, settings, landing, cell)
            cluster.wait_replicated()  # (the writes during the snapshot)
        CaptureEngine(EngineOptions.from_settings(settings), landing).run(
            stop_when_caught_up=True)
        _run_requested_snapshots(settings, landing)
    except Exception as error:  # noqa: BLE001 - the cell's verdict
        status = stop_kind(error, cell)
        detail = _one_line(error)
        if status != "loud-stop":
            frames = traceback.extract_tb(error.__traceback__)[-1:]
            detail += "".join(f" [at {f.filename.rsplit('/', 1)[-1]}:{f.lineno}]" for f in frames)
        return CellResult(cell.id, status, detail, seconds=time.monotonic() - started)
    verdicts = materialise_and_compare(spark, settings, cluster.primary, list(cell.tables),
                                       keys)
    problems = [v.summary() for v in verdicts if not v.ok]
    if cell.loud_words:
        problems.insert(0, f"the engine did not stop naming {', '.join(cell.loud_words)}")
    problems += landing_layout_problems(settings)
    if cell.dagster:
        problems += dagster_problems(settings)
    detail = " | ".join(problems) or "all rows equal"
    return CellResult(cell.id, "fail" if problems else "pass", detail,
                      [v.to_dict() for v in verdicts], time.monotonic() - started)


def landing_layout_problems(settings: Any) -> list[str]:
    """Every changelog segment must sit at ``changelog/<db>/<table>/`` (docs/landing-zone.md),
    one directory per table: a name must never escape or share its table's directory.

    The table a segment belongs to is read from its documented Parquet metadata (``cdc.table``).
    The zone is walked through its store (a local folder or an ``s3://`` prefix alike).
    """
    import pyarrow.parquet as pq

    from cdc_platform.capture.store import open_store

    store = open_store(settings.landing_zone.url, s3=settings.s3,
                       setting="landing_zone.url")
    problems: list[str] = []
    tables_by_dir: dict[tuple[str, ...], set[str]] = {}
    for parts in _parquet_files(store):
        filesystem, path = store.arrow(*parts)
        with filesystem.open_input_file(path) as source:
            metadata = pq.read_metadata(source).metadata or {}
        table = metadata.get(b"cdc.table", b"?").decode(errors="replace")
        if not metadata.get(b"cdc.table"):
            continue  # not a changelog segment (snapshot chunks live elsewhere)
        relative = parts[1:] if parts[0] == settings.source.server_name else ("..", *parts)
        if relative[0] != "changelog" or len(relative) != 4:
            problems.append(f"a segment of {table} lies at {'/'.join(relative)}, not at "
                            "changelog/<db>/<table>/")
        tables_by_dir.setdefault(parts[:-1], set()).add(table)
    for directory, tables in tables_by_dir.items():
        if len(tables) > 1:
            problems.append(f"segments of {sorted(tables)} share {directory[-1]}/")
    return problems


def _parquet_files(store: Any, *parts: str) -> Iterator[tuple[str, ...]]:
    """The parts of every ``.parquet`` file below ``parts`` of ``store``, depth first."""
    files = {f.name for f in store.list_files(*parts)}
    for name in store.list_names(*parts):
        if name not in files:
            yield from _parquet_files(store, *parts, name)
        elif name.endswith(".parquet"):
            yield (*parts, name)


def dagster_problems(settings: Any) -> list[str]:
    """The cell's tables must not break the Dagster code location (every table's assets)."""
    try:
        build_definitions(settings).get_repository_def()
    except Exception as error:  # noqa: BLE001 - the cell's verdict
        return [f"Dagster definitions do not load: {_one_line(error)}"]
    return []


def build_definitions(settings: Any) -> Any:
    """The code location of ``settings`` (``cdc_platform.definitions.build_definitions``)."""
    if "cdc_platform.definitions" not in sys.modules:
        # Its import builds the definitions of $CDC_PLATFORM_CONFIG (else the demo's, whose
        # sources are not running): give it the first source with no table, then build these.
        # (a local folder of its own: the landing zone may be an s3:// prefix)
        quiet = Path(tempfile.mkdtemp(prefix="torture-import-")) / "import-config.yaml"
        data = config_dict(_Source(settings.sources[0]), "import", quiet.parent / "import",
                           ["^$"], "")
        quiet.write_text(yaml.safe_dump(data))
        saved = os.environ.get("CDC_PLATFORM_CONFIG")
        os.environ["CDC_PLATFORM_CONFIG"] = str(quiet)
        try:
            import cdc_platform.definitions  # noqa: F401
        finally:
            from cdc_platform.config import settings as process_settings

            process_settings.cache_clear()  # later readers load their own config again
            if saved is None:
                os.environ.pop("CDC_PLATFORM_CONFIG", None)
            else:
                os.environ["CDC_PLATFORM_CONFIG"] = saved
    from cdc_platform.definitions import build_definitions as build

    return build(settings)


def _snapshot(cluster: Cluster, settings: Any, landing: Any, cell: Cell) -> None:
    """Snapshot the cell's tables (small chunks) beside a streaming engine, while the cell's
    ``during`` statements run on the primary, as the snapshot asset and a live source would."""
    from cdc_platform.capture.snapshot.reading import reader as snapshot_reader

    writer = threading.Thread(target=run_statements, args=(cluster.primary, cell.during, 0.05),
                              daemon=True)
    keys = dict(cell.surrogate_keys)
    with _engine_beside(settings, landing) as engine_died:
        writer.start()
        try:
            for database, table in cell.tables:
                result = snapshot_reader.reader_from_settings(
                    settings, f"{database}.{table}", chunk_size=2, poll_seconds=0.05,
                    ack_timeout_seconds=60, stall_timeout_seconds=60,
                    surrogate_key=list(keys[table]) if table in keys else None,
                ).run(engine_died)
                if result.status != "done" and not engine_died.is_set():
                    raise AssertionError(f"snapshot of {database}.{table}: {result.status}")
        finally:
            writer.join(60)


@contextlib.contextmanager
def _engine_beside(settings: Any, landing: Any) -> Iterator[threading.Event]:
    """A capture engine streaming in a thread while the block reads snapshots, as the
    stream_changes job runs beside snapshot runs. Yields an event set when the engine dies
    (a reader given it stops instead of waiting for acknowledgements); the engine's error is
    raised when the block ends."""
    from cdc_platform.capture.engine import CaptureEngine, EngineOptions

    stop = threading.Event()
    died = threading.Event()
    failure: list[BaseException] = []

    def stream() -> None:
        try:
            CaptureEngine(EngineOptions.from_settings(settings), landing).run(stop)
        except BaseException as error:  # noqa: BLE001 - re-raised below
            failure.append(error)
            died.set()

    engine = threading.Thread(target=stream, daemon=True)
    engine.start()
    try:
        yield died
    finally:
        stop.set()
        engine.join(60)
    if failure:
        raise failure[0]


def _run_requested_snapshots(settings: Any, landing: Any) -> None:
    """Serve the snapshots the platform asks for on its own: the re-snapshot sensor's rule
    (``stale_markers.snapshots_wanted``: a DDL left a target stale) and snapshot requests the
    platform wrote and did not finish. Each table's reader runs beside a streaming engine, as
    the snapshot asset would. The harness never decides to snapshot a table itself."""
    from cdc_platform.capture import names
    from cdc_platform.capture.ddl import stale_markers
    from cdc_platform.capture.engine import CaptureEngine, EngineOptions
    from cdc_platform.capture.landing.session_records import Action, SessionState
    from cdc_platform.capture.snapshot import protocol
    from cdc_platform.capture.snapshot.reading import reader as snapshot_reader

    checkpoint = landing.read_checkpoint()
    requested: list[str] = []
    for database, table in protocol.requested_tables(landing):
        request = protocol.read_request(landing, database, table)
        if request is None:
            continue
        table_id = names.table_id(database, table)
        session = protocol.latest_session(landing, checkpoint, table_id)
        ended = (session is not None and session.session_id == request.session_id
                 and session.state in (SessionState.DONE, SessionState.STOPPED))
        if request.action != Action.STOP and not ended:
            requested.append(table_id)
    if settings.capture.resnapshot_on_ddl:
        wanted = stale_markers.snapshots_wanted(stale_markers.resolve_markers(landing))
        requested += [t for t in sorted(wanted) if t not in requested]
    if not requested:
        return
    with _engine_beside(settings, landing) as engine_died:
        for table_id in requested:
            snapshot_reader.reader_from_settings(settings, table_id).run(engine_died)
    CaptureEngine(EngineOptions.from_settings(settings), landing).run(stop_when_caught_up=True)


# ---- phase 2: faults -----------------------------------------------------------------------


FAULT_TABLES = {
    "orders": "(id INT PRIMARY KEY, customer VARCHAR(40), amount DECIMAL(12,2), "
              "note TEXT CHARACTER SET utf8mb4, updated DATETIME(6))",
    "ci_key": "(code VARCHAR(20) COLLATE utf8mb4_unicode_ci PRIMARY KEY, n BIGINT)",
    "composite": "(a INT, b VARCHAR(10), c DOUBLE, PRIMARY KEY (a, b))",
    "unsigned_key": "(id BIGINT UNSIGNED PRIMARY KEY, v VARBINARY(16))",
    "decimal_key": "(id DECIMAL(20,4) PRIMARY KEY, v CHAR(8))",
}


class Workload:
    """Seeded random transactions on the fault tables of ``database`` on the primary, in a
    thread."""

    def __init__(self, primary: MariaDBServer, seed: int, rate: float = 150.0,
                 database: str = FAULTS_DB) -> None:
        self.primary, self.rate, self.database = primary, rate, database
        self.random = random.Random(seed)
        self.stop = threading.Event()
        self.transactions = 0
        self.rollbacks = 0
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name="torture-workload", daemon=True)

    def create(self) -> None:
        run_statements(self.primary, [f"CREATE DATABASE IF NOT EXISTS {self.database}"] + [
            f"CREATE TABLE {self.database}.{name} {columns}"
            for name, columns in FAULT_TABLES.items()])

    @property
    def tables(self) -> list[tuple[str, str]]:
        return [(self.database, table) for table in FAULT_TABLES]

    def start(self) -> None:
        self._thread.start()

    def finish(self) -> None:
        self.stop.set()
        self._thread.join(60)

    def _statement(self) -> tuple[str, tuple[Any, ...]]:
        r = self.random
        table = r.choice(list(FAULT_TABLES))
        kind = r.choices(("insert", "update", "delete"), (5, 4, 1))[0]
        db = self.database
        if table == "orders":
            key = r.randrange(1, 3000)
            if kind == "delete":
                return f"DELETE FROM {db}.orders WHERE id = %s", (key,)
            return (f"INSERT INTO {db}.orders VALUES (%s, %s, %s, %s, NOW(6)) ON DUPLICATE KEY "
                    "UPDATE amount = VALUES(amount), note = VALUES(note), updated = NOW(6)",
                    (key, f"customer {key % 97}", f"{r.randrange(0, 10**8) / 100:.2f}",
                     r.choice(["", "é", "😀 note", None, "x" * r.randrange(0, 400)])))
        if table == "ci_key":
            code = r.choice(["a@x", "A@X", "b", "B ", "ß", "ss", "é", "e"]) + str(r.randrange(50))
            if kind == "delete":
                return f"DELETE FROM {db}.ci_key WHERE code = %s", (code,)
            return (f"INSERT INTO {db}.ci_key VALUES (%s, %s) ON DUPLICATE KEY UPDATE "
                    "n = n + 1", (code, r.randrange(-(2**63), 2**63)))
        if table == "composite":
            a, b = r.randrange(100), r.choice("abcdefgh")
            if kind == "delete":
                return f"DELETE FROM {db}.composite WHERE a = %s AND b = %s", (a, b)
            return (f"INSERT INTO {db}.composite VALUES (%s, %s, %s) ON DUPLICATE KEY UPDATE "
                    "c = VALUES(c)", (a, b, r.choice([0.1, -2.5e300, 1e-300, 3.0])))
        if table == "unsigned_key":
            key = 2**64 - 1 - r.randrange(200)
            if kind == "delete":
                return f"DELETE FROM {db}.unsigned_key WHERE id = %s", (key,)
            return (f"INSERT INTO {db}.unsigned_key VALUES (%s, %s) ON DUPLICATE KEY UPDATE "
                    "v = VALUES(v)", (key, r.randbytes(r.randrange(1, 16))))
        key = f"{r.randrange(-500, 500)}.{r.randrange(10000):04d}"
        if kind == "delete":
            return f"DELETE FROM {db}.decimal_key WHERE id = %s", (key,)
        return (f"INSERT INTO {db}.decimal_key VALUES (%s, %s) ON DUPLICATE KEY UPDATE "
                "v = VALUES(v)", (key, r.choice(["", "a", "abcdefgh", "é"])))

    def _run(self) -> None:
        try:
            conn = self.primary.root_connect(autocommit=False)
        except pymysql.MySQLError as error:
            self.errors.append(_one_line(error))
            return
        interval = 1.0 / self.rate
        try:
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    began = time.monotonic()
                    for _ in range(self.random.randrange(1, 6)):
                        cur.execute(*self._statement())
                    if self.random.random() < 0.05:
                        conn.rollback()
                        self.rollbacks += 1
                    else:
                        conn.commit()
                        self.transactions += 1
                    self.stop.wait(max(0.0, interval - (time.monotonic() - began)))
        except pymysql.MySQLError as error:
            self.errors.append(_one_line(error))
        finally:
            conn.close()


@dataclass
class FaultResult:
    kills: int = 0
    kills_survived: int = 0
    failover: str = "not reached"
    transactions: int = 0
    rollbacks: int = 0
    engine_exits: list[str] = field(default_factory=list)  # exits nobody asked for
    snapshot_rounds: int = 0
    snapshots_done: int = 0
    reader_kills: int = 0
    snapshot_problems: list[str] = field(default_factory=list)  # readers that did not end done
    tables: list[TableVerdict] = field(default_factory=list)
    cells: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (not self.engine_exits and self.failover == "ok"
                and self.kills_survived == self.kills and not self.snapshot_problems
                and self.snapshots_done == self.snapshot_rounds
                and all(v.ok for v in self.tables))

    def to_dict(self) -> dict[str, Any]:
        return {"kills": self.kills, "kills_survived": self.kills_survived,
                "failover": self.failover, "transactions": self.transactions,
                "rollbacks": self.rollbacks, "engine_exits": self.engine_exits,
                "snapshot_rounds": self.snapshot_rounds, "snapshots_done": self.snapshots_done,
                "reader_kills": self.reader_kills,
                "snapshot_problems": self.snapshot_problems,
                "cells_included": self.cells, "seconds": round(self.seconds, 1),
                "tables": [v.to_dict() for v in self.tables], "ok": self.ok}


class EngineProcess:
    """``python -m cdc_platform stream --config <file>``: the engine as an operator runs it;
    with ``command``, another of the CLI's commands run the same way (a snapshot reader:
    ``("snapshot", "db.table")``), its logs named ``name``."""

    def __init__(self, config: Path, log_dir: Path, command: tuple[str, ...] = ("stream",),
                 name: str = "engine") -> None:
        self.config, self.log_dir = config, log_dir
        self.command, self.name = command, name
        self.lives = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: Path | None = None

    def start(self, *extra: str) -> None:
        self.lives += 1
        self.log = self.log_dir / f"{self.name}-{self.lives:02d}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cdc_platform", *self.command, "--config",
                 str(self.config), *extra], stdout=out, stderr=subprocess.STDOUT, env=env)

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def terminate(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def catch_up(self, timeout: float = 300.0) -> tuple[str | None, int]:
        """Stop the streaming engine (SIGTERM) and run it again with ``--until-caught-up``;
        (its exit nobody asked for, if it had exited already, else None; the catch-up's exit
        code, -9 when it did not end within ``timeout``)."""
        unasked = None
        code = self.exited()
        if code is not None:
            unasked = f"life {self.lives} exited {code}: {self.tail()}"
        else:
            self.terminate()
        self.start("--until-caught-up")
        try:
            code = self.proc.wait(timeout) if self.proc else -1
        except subprocess.TimeoutExpired:
            self.kill()
            code = -9
        return unasked, code

    def tail(self, lines: int = 3) -> str:
        if self.log is None or not self.log.exists():
            return ""
        text = self.log.read_text(errors="replace").strip().splitlines()
        return " / ".join(line.strip()[:300] for line in text[-lines:])


# The fault tables snapshot rounds take in turn (keys of every kind: integer, collated
# string, composite, unsigned, decimal), and the chunk size of their readers.
# (the largest first: the first rounds' readers are the ones killed mid-snapshot)
SNAPSHOT_TABLES = ("orders", "decimal_key", "composite", "ci_key", "unsigned_key")
SNAPSHOT_CHUNK_SIZE = 20


#: The config of the fault run's engine streaming from ``replica`` (the data written to its
#: config file).
ConfigFor = Callable[[MariaDBServer], dict[str, Any]]


def run_faults(cluster: Cluster, spark: Any, cells: list[Cell], root: Path, *, kills: int,
               seed: int, workload_seconds: float, snapshot_rounds: int = 0,
               reader_kills: int = 0, config_for: ConfigFor | None = None,
               source: str | None = None, database: str = FAULTS_DB,
               while_streaming: Callable[[], None] | None = None) -> FaultResult:
    """The fault run (phase 2) of ``cluster``'s fault tables and ``cells``. By default the
    engine's config has one source of its own (``torture``); ``config_for`` gives it instead
    (e.g. a ``sources:`` config), ``source`` naming the source under faults (its engine's
    ``--source``; ``cells`` must then be captured by that config); ``database`` is where the
    workload writes. ``while_streaming`` is run once halfway through the kills, while the
    engine streams between two of them."""
    from cdc_platform.capture.landing.fencing import (
        ENGINE_LEASE_TTL_SECONDS,
        ENGINE_LEASE_WAIT_SLACK_SECONDS,
    )
    from cdc_platform.capture.landing.zone import LandingZone
    from cdc_platform.config import parse_settings

    started = time.monotonic()
    result = FaultResult(cells=[c.id for c in cells])
    rng = random.Random(seed)
    workload = Workload(cluster.primary, seed, database=database)
    workload.create()
    include = [rf"{re.escape(database)}\..*"] + [p for c in cells for p in c.include_patterns()]
    server_name = "torture"
    server_id = next(_server_ids)
    config = root / "config.yaml"
    select = ("--source", source) if source else ()

    def write_config(replica: MariaDBServer) -> Any:
        # "" = from the start of the binlog: every cell's history is replayed under the faults.
        data = (config_for(replica) if config_for is not None
                else config_dict(replica, server_name, root, include, "", server_id))
        config.write_text(yaml.safe_dump(data, allow_unicode=True))
        return parse_settings(data, "torture faults").for_source(source)

    settings = write_config(cluster.replica1)
    landing = LandingZone.from_settings(settings)
    # On object storage a killed engine leaves its lease behind: the next engine waits it out.
    progress_timeout = 30.0 + (0.0 if STORAGE.s3 is None
                               else ENGINE_LEASE_TTL_SECONDS + ENGINE_LEASE_WAIT_SLACK_SECONDS)
    engine = EngineProcess(config, root, ("stream", *select))
    readers: list[EngineProcess] = []
    workload.start()
    deadline = time.monotonic() + workload_seconds
    engine.start()
    for round_ in range(max(kills, snapshot_rounds)):
        if while_streaming is not None and round_ == kills // 2:
            while_streaming()
        lifetime = rng.uniform(0.5, max(1.0, 0.8 * workload_seconds / (kills + 1)))
        if round_ < snapshot_rounds:  # a snapshot beside the engine, as a signal would ask
            table = SNAPSHOT_TABLES[round_ % len(SNAPSHOT_TABLES)]
            reader = EngineProcess(config, root, ("snapshot", *select, f"{database}.{table}",
                                                  "--chunk-size", str(SNAPSHOT_CHUNK_SIZE)),
                                   name=f"reader-{round_}-{table}")
            reader.start()
            readers.append(reader)
            result.snapshot_rounds += 1
            if round_ < reader_kills:  # kill -9 mid-snapshot; the next reader resumes it
                _wait_chunks_committed(landing, f"{database}.{table}", rng.randint(1, 4),
                                       reader, timeout=progress_timeout)
                code = reader.exited()
                if code is None:
                    reader.kill()
                    result.reader_kills += 1
                    reader.start()
                elif code != 0:  # (ended before the kill: judged with the others below)
                    result.snapshot_problems.append(f"{reader.name} life 1 exited {code} "
                                                    f"before its kill: {reader.tail()}")
        if round_ >= kills:
            continue
        time.sleep(lifetime)
        code = engine.exited()
        if code is not None:
            result.engine_exits.append(f"life {engine.lives} exited {code}: {engine.tail()}")
        else:
            engine.kill()
            result.kills += 1
        before = landing.read_checkpoint()
        engine.start()
        if _progresses(engine, landing, before, timeout=progress_timeout):
            result.kills_survived += 1
        else:
            result.engine_exits.append(f"life {engine.lives} made no progress after a kill: "
                                       f"{engine.tail()}")
    # Every snapshot ends (done: exit 0) while the engine still streams from replica 1.
    for reader in readers:
        try:
            code = reader.proc.wait(progress_timeout + 300) if reader.proc else -1
        except subprocess.TimeoutExpired:
            reader.kill()
            code = -9
        if code == 0:
            result.snapshots_done += 1
        else:
            result.snapshot_problems.append(f"{reader.name} life {reader.lives} exited {code}: "
                                            f"{reader.tail()}")
    # Failover: the engine moves to replica 2 while writes continue, from its checkpoint.
    time.sleep(max(0.0, min(3.0, deadline - time.monotonic())))
    engine.kill()
    settings = write_config(cluster.replica2)
    before = landing.read_checkpoint()
    engine.start()
    if _progresses(engine, landing, before, timeout=progress_timeout):
        result.failover = "progressing"
    time.sleep(max(0.0, deadline - time.monotonic()))
    workload.finish()
    result.transactions, result.rollbacks = workload.transactions, workload.rollbacks
    if workload.errors:
        result.engine_exits.append(f"workload errors: {workload.errors[:3]}")
    cluster.wait_replicated()
    unasked, code = engine.catch_up()
    if unasked is not None:
        result.engine_exits.append(unasked)
    if code == 0 and result.failover == "progressing":
        result.failover = "ok"
    elif code != 0:
        result.failover = f"catch-up on replica 2 exited {code}: {engine.tail()}"
    # The platform re-snapshots tables a DDL left stale (the sensor's rule) after failover too.
    _run_requested_snapshots(settings, LandingZone.from_settings(settings))
    tables = sorted(set(landed_tables(settings)) | set(workload.tables)
                    | {t for c in cells for t in c.tables})
    result.tables = materialise_and_compare(spark, settings, cluster.primary, tables)
    result.seconds = time.monotonic() - started
    return result


def _wait_chunks_committed(landing: Any, table_id: str, chunks: int, reader: EngineProcess,
                           timeout: float) -> None:
    """Until the engine committed ``chunks`` chunks of the table's snapshot session (the
    checkpoint's session record), the reader exited, or ``timeout``: a reader killed then is
    killed mid-snapshot."""
    from cdc_platform.capture.snapshot import protocol

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and reader.exited() is None:
        session = protocol.read_session_state(landing.read_checkpoint(), table_id)
        if session is not None and len(session.committed) >= chunks:
            return
        time.sleep(0.1)


def _progresses(engine: EngineProcess, landing: Any, before: Any, timeout: float) -> bool:
    """True once the restarted engine wrote a newer checkpoint (it resumed and moved on)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if engine.exited() is not None:
            return False
        now = landing.read_checkpoint()
        if now is not None and (before is None or now.next_pos > before.next_pos
                                or now.written_at != before.written_at):
            return True
        time.sleep(0.1)
    return False
