"""``make demo`` and ``make ui``: zero configuration, everything under ``.cdc/``.

The demo captures two sources, each a private MariaDB: ``demo`` with the ``inventory``
database and ``billing`` with its invoices of the inventory customers (``demo.billing``); and a
private Kafka-compatible broker (Tansu) carries the signals. It works exactly as a user would,
through Dagster: the Dagster daemon runs the signal sensors; each source's ``stream_changes``
job runs (``dagster job execute``; ``<server>_stream_changes``, as the config has two sources)
while write workloads run on both; an ``execute-snapshot`` signal for ``inventory.orders`` goes
to the signal topic (``python -m cdc_platform signal --source demo``), and the sensor launches
the table's snapshot run, which finishes while the workload still writes; then each source's
``materialise_targets`` folds its changes into the lake tables and reconciles each against its
source, and ``demo_build_dbt_models`` builds the dbt models on them, ``customer_billing``
joining the two sources. Runs land in ``.cdc/dagster_home``, so ``make ui`` shows them
afterwards.

``make demo-s3`` (``--s3``) runs the same demo with the landing zone and the lake on a private
SeaweedFS and its Iceberg REST catalog (``demo.object_storage``); ``make demo-cluster``
(``--spark-cluster``, which implies ``--s3``) runs it with the lake's Spark work on a private
Spark standalone cluster of two workers (``demo.cluster``).
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from cdc_platform.capture.landing.records import TS_MS
from cdc_platform.capture.landing.zone import LandingReader, changelog_parts
from cdc_platform.config import CONFIG_ENV, METRICS_PORTS_PER_SOURCE, Settings
from cdc_platform.devservices.demo_sources import DEMO_SOURCES
from cdc_platform.devservices.kafka import TansuBroker
from cdc_platform.devservices.mariadb import MariaDBServer
from cdc_platform.devservices.ports import free_port_range
from cdc_platform.devservices.seaweedfs import SeaweedFS
from cdc_platform.devservices.spark_cluster import SparkCluster
from cdc_platform.devservices.supervisor import Interrupted, ProcessSupervisor
from cdc_platform.metrics import Role, metrics_url

CDC_HOME = Path(os.environ.get("CDC_HOME", ".cdc")).absolute()
DEMO_DIR = CDC_HOME / "demo"
DAGSTER_HOME = CDC_HOME / "dagster_home"
DEMO_PASSWORD = "cdc"
DEMO_CONFIG_PATH = Path(__file__).parent / "demo.yaml"
#: The demo config's two sources (``demo.yaml``) and what each captures.
INVENTORY_SOURCE, BILLING_SOURCE = (source.server_name for source in DEMO_SOURCES)
INVENTORY_TABLES = ("inventory", ("customers", "products", "orders"))
BILLING_TABLES = ("billing", ("invoices", "payments"))
#: The dbt model the two sources feed.
JOINED_MODEL = (INVENTORY_SOURCE, "analytics", "customer_billing")

_DAGSTER_YAML = """\
# Written by `make demo` / `make ui`. At most one streaming run, one applier and one change-topic
# publisher per source.
run_coordinator:
  module: dagster.core.run_coordinator
  class: QueuedRunCoordinator
  config:
    tag_concurrency_limits:
      - key: cdc_platform/stream
        value:
          applyLimitPerUniqueValue: true
        limit: 1
      - key: cdc_platform/applier
        value:
          applyLimitPerUniqueValue: true
        limit: 1
      - key: cdc_platform/topics
        value:
          applyLimitPerUniqueValue: true
        limit: 1
telemetry:
  enabled: false
# The targets' freshness policies (lake.freshness_seconds) in the UI's asset health.
freshness:
  enabled: true
"""


def _say(message: str) -> None:
    print(f"==> {message}", flush=True)


SNAPSHOT_TABLE = "inventory.orders"
SNAPSHOT_RUN_TIMEOUT_SECONDS = 600.0
# How long the demo waits for the change-topic publisher to publish everything landed.
TOPICS_TIMEOUT_SECONDS = 180.0


def _servers() -> tuple[MariaDBServer, ...]:
    """The demo's MariaDB servers, one per source of ``DEMO_SOURCES``: the inventory source's,
    then the billing source's."""
    return tuple(MariaDBServer(base_dir=DEMO_DIR / source.folder, server_id=index + 1,
                               cdc_password=DEMO_PASSWORD)
                 for index, source in enumerate(DEMO_SOURCES))


def _environment(servers: tuple[MariaDBServer, ...], broker: TansuBroker,
                 s3: SeaweedFS | None = None,
                 cluster: SparkCluster | None = None) -> dict[str, str]:
    """The environment of the demo's processes: its services (each source's server under the
    variables the demo config reads, ``DEMO_SOURCES``), its Dagster home, and the embedded
    demo config, or with ``s3`` the object-storage config written beside it and the S3
    server's credentials (in the AWS variables, never in a file); with ``cluster`` that config
    runs Spark on the cluster."""
    env = dict(os.environ)
    for source, server in zip(DEMO_SOURCES, servers, strict=True):
        env.update(source.variables(server))
    env.update({
        "CDC_HOME": str(CDC_HOME),
        "CDC_KAFKA_BOOTSTRAP": broker.bootstrap_servers,
        # metrics.port: a free range, METRICS_PORTS_PER_SOURCE ports for each source
        "CDC_METRICS_PORT": str(free_port_range(METRICS_PORTS_PER_SOURCE * len(DEMO_SOURCES))),
        "DAGSTER_HOME": str(DAGSTER_HOME),
        "PYSPARK_PYTHON": sys.executable,
    })
    env.pop(CONFIG_ENV, None)  # the embedded demo config
    if s3 is not None:
        from cdc_platform.demo import object_storage

        env = {key: value for key, value in env.items() if not key.startswith("AWS_")}
        env.update(object_storage.environment(s3))
        spark = None
        if cluster is not None:
            from cdc_platform.demo.cluster import spark_section

            spark = functools.partial(spark_section, cluster=cluster)
        env[CONFIG_ENV] = str(object_storage.write_config(DEMO_DIR / "config.yaml",
                                                          DEMO_CONFIG_PATH, s3, spark))
    return env


def _demo_settings(env: dict[str, str]) -> Settings:
    """The config the demo's runs load, read as they read it: their environment becomes the
    demo process's own (its clients reach the same services with the same credentials)."""
    from cdc_platform.config import load_settings

    for key in [key for key in os.environ if key not in env]:
        del os.environ[key]
    os.environ.update(env)
    return load_settings()


def _broker() -> TansuBroker:
    return TansuBroker(base_dir=DEMO_DIR / "kafka")


def use_demo_broker() -> None:
    """For commands on the embedded demo config (``python -m cdc_platform signal``): when
    ``CDC_KAFKA_BOOTSTRAP`` is not set, use the broker ``make demo`` / ``make ui`` is running."""
    if os.environ.get("CDC_KAFKA_BOOTSTRAP"):
        return
    broker = _broker()
    if broker.attach():
        os.environ["CDC_KAFKA_BOOTSTRAP"] = broker.bootstrap_servers


#: How long a ``dagster job execute`` gets after SIGTERM (the stream flushes and checkpoints).
JOB_STOP_GRACE_SECONDS = 20.0
#: How long ``dagster dev`` and the daemon get after SIGINT to stop what they started.
DAGSTER_STOP_GRACE_SECONDS = 10.0


def _background(supervisor: ProcessSupervisor, env: dict[str, str], command: list[str],
                log_name: str, stop_signal: int = signal.SIGTERM,
                grace: float = JOB_STOP_GRACE_SECONDS) -> subprocess.Popen[bytes]:
    """A child process logging to ``DEMO_DIR/log_name``, stopped with the demo (SIGTERM: a run
    checkpoints and exits instead of lingering), even if the demo is killed."""
    with open(DEMO_DIR / log_name, "ab") as log:
        return supervisor.spawn(log_name.removesuffix(".log"), command, env=env, output=log,
                                stop_signal=stop_signal, grace=grace)


def create_dagster_storage(home: Path) -> None:
    """Create the SQLite storage of the Dagster home ``home`` now: processes started at the
    same moment (the daemon, its code server, runs) would otherwise race to create the same
    tables ("alembic_version has more than one head")."""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.get_runs(limit=1)
        instance.get_latest_materialization_event(dg.AssetKey(["demo"]))
        instance.all_instigator_state()


def _prepare_dagster_home() -> None:
    """The demo's Dagster home, with its storage."""
    DAGSTER_HOME.mkdir(parents=True, exist_ok=True)
    (DAGSTER_HOME / "dagster.yaml").write_text(_DAGSTER_YAML)
    create_dagster_storage(DAGSTER_HOME)


def _dagster_job(supervisor: ProcessSupervisor, env: dict[str, str], job: str,
                 run_config: dict[str, Any] | None = None,
                 background: bool = False) -> subprocess.Popen[bytes] | int:
    command = [str(Path(sys.executable).with_name("dagster")), "job", "execute",
               "-m", "cdc_platform.definitions", "-j", job]
    if run_config:
        path = DEMO_DIR / f"{job}.run_config.yaml"
        path.write_text(yaml.safe_dump(run_config))
        command += ["-c", str(path)]
    process = _background(supervisor, env, command, f"{job}.log")
    if background:
        return process
    return supervisor.wait(process)


def _dagster_daemon(supervisor: ProcessSupervisor, env: dict[str, str]
                    ) -> subprocess.Popen[bytes]:
    """The Dagster daemon (sensors, run queue) on the repository's workspace.yaml, as in
    production; it runs the signal sensor and launches the runs the sensor requests."""
    workspace = Path(__file__).resolve().parents[2] / "workspace.yaml"
    command = [str(Path(sys.executable).with_name("dagster-daemon")), "run", "-w",
               str(workspace)]
    return _background(supervisor, env, command, "dagster-daemon.log", signal.SIGINT,
                       DAGSTER_STOP_GRACE_SECONDS)


def _send_signal(env: dict[str, str], *args: str) -> bool:
    """What an operator types: ``python -m cdc_platform signal ...``."""
    command = [sys.executable, "-m", "cdc_platform", "signal", *args]
    _say(f"$ python -m cdc_platform signal {' '.join(args)}")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    for line in (done.stdout + done.stderr).strip().splitlines():
        print(f"    {line}", flush=True)
    return done.returncode == 0


def _snapshot_run(instance: Any, sensor: str, table_id: str, since: dt.datetime) -> Any:
    """The newest run the signal sensor launched for the table since ``since``, or None."""
    import dagster as dg

    from cdc_platform.defs.signals.sensors import SNAPSHOT_TABLE_TAG

    runs = instance.get_runs(filters=dg.RunsFilter(
        tags={"dagster/sensor_name": sensor, SNAPSHOT_TABLE_TAG: table_id},
        created_after=since), limit=1)
    return runs[0] if runs else None


def _wait_for_snapshot_run(sensor: str, started: float, min_seconds: float,
                           processes: dict[str, subprocess.Popen[bytes]]) -> Any:
    """Wait until the sensor's snapshot run of the table has ended and ``min_seconds`` have
    passed since ``started``; the finished run (None on timeout or if a process died)."""
    import dagster as dg

    instance = dg.DagsterInstance.from_config(str(DAGSTER_HOME))
    since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=time.monotonic() - started)
    run, announced = None, False
    deadline = time.monotonic() + SNAPSHOT_RUN_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        for name, process in processes.items():
            if process.poll() is not None:
                _say(f"{name} exited early (code {process.returncode}): see "
                     f"{DEMO_DIR / (name + '.log')}")
                return None
        run = _snapshot_run(instance, sensor, SNAPSHOT_TABLE, since)
        if run is not None and not announced:
            announced = True
            _say(f"sensor {sensor} launched run {run.run_id} (snapshot of {SNAPSHOT_TABLE}, "
                 f"signal {run.tags.get('cdc_platform/signal_id')})")
        if run is not None and run.is_finished and time.monotonic() - started >= min_seconds:
            return run
        time.sleep(1.0)
    _say(f"no finished snapshot run of {SNAPSHOT_TABLE} within "
         f"{SNAPSHOT_RUN_TIMEOUT_SECONDS:.0f}s: see {DEMO_DIR / 'dagster-daemon.log'}")
    return None if run is None or not run.is_finished else run


def _snapshot_summary(run: Any) -> str:
    """The snapshot run's materialisation metadata, in one line."""
    import dagster as dg

    instance = dg.DagsterInstance.from_config(str(DAGSTER_HOME))
    key = dg.AssetKey(["demo", "snapshot", *SNAPSHOT_TABLE.split(".")])
    event = instance.get_latest_materialization_event(key)
    if event is None or event.asset_materialization is None or event.run_id != run.run_id:
        return f"snapshot of {SNAPSHOT_TABLE}: run {run.run_id} recorded no materialisation"
    meta = {k: getattr(v, "value", v) for k, v in event.asset_materialization.metadata.items()}
    return (f"snapshot of {SNAPSHOT_TABLE} {meta.get('status')}: {meta.get('rows'):,} rows in "
            f"{meta.get('chunks')} chunks ({meta.get('rejected_chunks')} rejected and read "
            f"again) in {meta.get('duration_seconds')}s, {meta.get('rows_per_second'):,} rows/s, "
            f"GTID {meta.get('start_gtid')} .. {meta.get('end_gtid')}")


def run_demo(orders: int = 100_000, workload_seconds: float = 20.0, s3: bool = False,
             spark_cluster: bool = False) -> int:
    """The demo (``s3``: on a private SeaweedFS, see ``demo.object_storage``;
    ``spark_cluster``: on S3 and a private Spark cluster, see ``demo.cluster``); Ctrl-C or
    SIGTERM stops it and everything it started (exit code 128 + the signal's number)."""
    try:
        with ProcessSupervisor() as supervisor:
            return _run_demo(supervisor, orders, workload_seconds, s3 or spark_cluster,
                             spark_cluster)
    except Interrupted as stop:
        return stop.exit_code


def _run_demo(supervisor: ProcessSupervisor, orders: int, workload_seconds: float,
              s3: bool = False, spark_cluster: bool = False) -> int:
    from cdc_platform.defs.names import scoped_name
    from cdc_platform.demo import billing as billing_db
    from cdc_platform.demo.inventory import Workload, create_schema, load_initial_data

    if DEMO_DIR.exists():
        shutil.rmtree(DEMO_DIR)  # every demo starts from an empty source and lake
    DEMO_DIR.mkdir(parents=True)
    _prepare_dagster_home()
    server, billing = _servers()
    broker = _broker()
    _say(f"starting two private MariaDB servers in {DEMO_DIR / 'mariadb'} (source "
         f"{INVENTORY_SOURCE!r}: inventory) and {DEMO_DIR / 'mariadb-billing'} (source "
         f"{BILLING_SOURCE!r}: billing), and a Kafka-compatible broker (Tansu) for the signal "
         "topic")
    supervisor.start_service(server)
    supervisor.start_service(billing)
    workload: Workload | None = None
    try:
        supervisor.start_service(broker)
        seaweedfs = _start_seaweedfs(supervisor) if s3 else None
        cluster = (_start_spark_cluster(supervisor, seaweedfs)
                   if spark_cluster and seaweedfs is not None else None)  # (it implies s3)
        env = _environment((server, billing), broker, seaweedfs, cluster)
        from cdc_platform.defs.signals.sensors import sensor_name

        deployment = _demo_settings(env)
        sources = [deployment.for_source(name) for name in (INVENTORY_SOURCE, BILLING_SOURCE)]
        inventory_settings = sources[0]
        sensor = sensor_name(inventory_settings)
        _say("starting the Dagster daemon (runs the signal sensors and launches their runs)")
        daemon = _dagster_daemon(supervisor, env)
        started = time.monotonic()
        _say(f"creating the inventory database with {orders:,} orders, and the billing "
             "database with invoices of the inventory customers")
        with server.root_connect() as conn:
            create_schema(conn)
            load_initial_data(conn, orders=orders)
        with billing.root_connect() as conn:
            billing_db.create_schema(conn)
            billing_db.load_initial_data(conn)
        _say(f"loaded in {time.monotonic() - started:.1f}s")

        workload = Workload(server.connection_settings(user="root"), rate=150.0)
        streams: dict[str, subprocess.Popen[bytes]] = {}
        for source in sources:
            job = scoped_name(source, "stream_changes")
            _say(f"streaming source {source.source.server_name!r} (job {job})")
            launched = _dagster_job(supervisor, env, job, {"ops": {
                scoped_name(source, "capture_changes"): {"config": {
                    "stop_when_caught_up": True, "caught_up_idle_seconds": 4.0,
                    "progress_seconds": 5.0}}}}, background=True)
            assert isinstance(launched, subprocess.Popen)
            streams[job] = launched
        _say("metrics (Prometheus text, while the streams run): " + ", ".join(
            f"{source.source.server_name} {url}" for source in sources
            if (url := _engine_metrics_url(source)) is not None))
        _say("write workloads on both sources while they stream")
        workload.start(seconds=24 * 3600)  # until the snapshot has finished, stopped below
        workload_started = time.monotonic()
        with billing.root_connect() as conn:
            billing_db.write_some(conn)
        _say(f"asking for a snapshot of {SNAPSHOT_TABLE} through the signal topic "
             f"{deployment.signals.topic!r}; the sensor {sensor} launches its run")
        if not _send_signal(env, "execute-snapshot", SNAPSHOT_TABLE, "--source",
                            INVENTORY_SOURCE):
            _say("the signal could not be sent")
            return 1
        # billing's stream may end before (caught up after its few writes): it is waited for
        inventory_job = scoped_name(inventory_settings, "stream_changes")
        run = _wait_for_snapshot_run(sensor, workload_started, workload_seconds,
                                     {"dagster-daemon": daemon,
                                      inventory_job: streams[inventory_job]})
        stats = workload.stop()
        workload = None
        _say(f"workload done: {stats.transactions} transactions committed, "
             f"{stats.rolled_back} rolled back (it wrote all through the snapshot); waiting for "
             "the streams to catch up")
        url = _engine_metrics_url(inventory_settings)
        if url is not None:
            _say(f"scraped {url}: {_scraped_line(url)}")
        if run is None:
            return 1
        if run.status.value != "SUCCESS":
            _say(f"the snapshot run {run.run_id} ended {run.status.value}: see it in the UI "
                 f"(make ui) or {DEMO_DIR / 'dagster-daemon.log'}")
            return 1
        _say(_snapshot_summary(run))
        for job, stream in streams.items():
            if supervisor.wait(stream) != 0:
                _say(f"{job} failed: see {DEMO_DIR / (job + '.log')}")
                return 1

        code = 0
        for source in sources:
            job = scoped_name(source, "materialise_targets")
            _say(f"materialising and reconciling the lake tables of source "
                 f"{source.source.server_name!r} (job {job})")
            code = code or _dagster_job(supervisor, env, job)
        if code == 0:
            job = scoped_name(inventory_settings, "build_dbt_models")
            _say(f"building the dbt models on the lake tables, {JOINED_MODEL[-1]} joining both "
                 f"sources (job {job})")
            code = _dagster_job(supervisor, env, job)
        ok = _print_summary({INVENTORY_SOURCE: server, BILLING_SOURCE: billing}, env,
                            deployment, seaweedfs, cluster) and code == 0
        ok = _print_topics(server, inventory_settings) and ok
        _say("all tables of both sources reconcile: zero differences, the joined model is "
             "built, and every inventory table rebuilt from its topic equals the source"
             if ok else f"differences found or a run failed: see {DEMO_DIR}/*.log")
        print()
        print("See the runs (the snapshot run launched by the signal sensor among them), "
              "materialisations, reconcile checks and the lineage of both sources into "
              f"{JOINED_MODEL[-1]} in the Dagster UI:")
        print("    make ui        # then open http://127.0.0.1:3000")
        return 0 if ok else 1
    finally:
        if workload is not None:
            workload.stop()
        # the supervisor then stops the streams first (they checkpoint), the daemon, the
        # broker and the servers


def _print_topics(server: MariaDBServer, settings: Settings) -> bool:
    """Each inventory table rebuilt from its change topic by a plain consumer
    (``demo.topic_tables``) and compared with the source, once the publisher (launched by
    its sensor under the daemon) has published everything landed."""
    from cdc_platform.capture.landing.published import CHANGE_TOPICS
    from cdc_platform.capture.names import table_id
    from cdc_platform.demo.topic_tables import compare_with_source
    from cdc_platform.topics.naming import topic_name
    from cdc_platform.topics.publisher import PublisherOptions

    options = PublisherOptions.from_settings(settings)
    landing = LandingReader.open(settings.landing_zone.url, settings.source.server_name,
                                 s3=settings.s3)
    database, tables = INVENTORY_TABLES
    _say(f"waiting for the change-topic publisher (publish_changes, launched by its sensor) "
         f"to publish every landed change of {database}")
    deadline = time.monotonic() + TOPICS_TIMEOUT_SECONDS
    while True:
        checkpoint = landing.read_checkpoint()
        marks = landing.read_published(CHANGE_TOPICS)
        if checkpoint is not None and marks is not None and all(
                marks.through.get(table_id(database, t), 0) >= checkpoint.next_pos - 1
                for t in tables):
            break
        if time.monotonic() > deadline:
            _say(f"the change topics were not published within {TOPICS_TIMEOUT_SECONDS:.0f}s: "
                 f"see the publish_changes run in {DEMO_DIR / 'dagster-daemon.log'} or the UI")
            return False
        time.sleep(1.0)
    _say("each inventory table rebuilt from its Kafka topic by a plain confluent-kafka consumer "
         "(creates, updates, snapshot reads and deletes applied by key), against the source:")
    ok = True
    for table in tables:
        topic = topic_name(options.envelope.prefix, database, table)
        with server.root_connect() as conn:
            rebuilt, found = compare_with_source(options.bootstrap_servers, topic, conn,
                                                 database, table, _key_columns(conn, database,
                                                                               table))
        ops = ", ".join(f"{op} {n:,}" for op, n in sorted(rebuilt.ops.items()))
        print(f"    {topic}: {rebuilt.events + rebuilt.tombstones:,} messages ({ops}, "
              f"{rebuilt.tombstones:,} tombstones); rebuilt {len(rebuilt.rows):,} rows: "
              f"{len(found)} differences" + (f" (first: {found[0]})" if found else ""),
              flush=True)
        ok = ok and not found
    return ok


def _key_columns(conn: Any, database: str, table: str) -> list[str]:
    with conn.cursor() as cursor:
        cursor.execute("SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE WHERE "
                       "TABLE_SCHEMA = %s AND TABLE_NAME = %s AND CONSTRAINT_NAME = 'PRIMARY' "
                       "ORDER BY ORDINAL_POSITION", (database, table))
        return [row[0] for row in cursor.fetchall()]


def _start_seaweedfs(supervisor: ProcessSupervisor) -> SeaweedFS:
    """The S3 server of ``--s3``, with its buckets, stopped with the demo."""
    from cdc_platform.demo import object_storage

    server = object_storage.demo_seaweedfs(DEMO_DIR / "seaweedfs")
    _say(f"starting a private SeaweedFS in {server.base_dir} (S3 and an Iceberg REST catalog) "
         "for the landing zone and the lake")
    supervisor.start_service(server)
    object_storage.create_buckets(server)
    _say(f"landing zone {object_storage.LANDING_URL}, warehouse {object_storage.WAREHOUSE_URL} "
         f"(REST catalog {server.catalog_uri}) on S3 at {server.endpoint_url}; config "
         f"{DEMO_DIR / 'config.yaml'}")
    return server


def _start_spark_cluster(supervisor: ProcessSupervisor, s3: SeaweedFS) -> SparkCluster:
    """The Spark cluster of ``--spark-cluster``, stopped with the demo. Its workers (and so
    their executors) get the demo's environment, S3 credentials included, as a real cluster's
    nodes have theirs."""
    from cdc_platform.demo import object_storage
    from cdc_platform.demo.cluster import demo_cluster

    cluster = demo_cluster(DEMO_DIR / "spark", object_storage.environment(s3))
    _say(f"starting a private Spark standalone cluster in {cluster.base_dir}: a master and "
         f"{cluster.worker_count} workers of {cluster.worker_cores} core each (pyspark's own "
         "launcher); every Spark session of the runs is a driver using its executors")
    supervisor.start_service(cluster)
    _say(f"Spark master {cluster.master_url} (web UI {cluster.master_webui_url})")
    return cluster


def _engine_metrics_url(settings: Settings) -> str | None:
    port = settings.metrics_port(Role.ENGINE)
    return None if port is None else metrics_url(settings.metrics.host, port)


def _scraped_line(url: str) -> str:
    """A few of the engine's metrics, as a Prometheus server would read them now."""
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            text = answer.read().decode()
    except OSError as error:
        return f"not reachable ({error})"
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name + (f"{{op={sample.labels['op']}}}" if "op" in sample.labels
                                  else "")
            values[name] = sample.value
    ops = ", ".join(f"{op} {values.get(f'cdc_capture_row_changes_total{{op={op}}}', 0):,.0f}"
                    for op in ("c", "u", "d"))
    return (f"cdc_capture_lag_seconds {values.get('cdc_capture_lag_seconds', float('nan')):.1f}, "
            f"cdc_capture_transactions_total {values.get('cdc_capture_transactions_total', 0):,.0f}, "
            f"cdc_capture_row_changes_total by op: {ops}")


def _print_summary(servers: dict[str, MariaDBServer], env: dict[str, str],
                   deployment: Settings, s3: SeaweedFS | None = None,
                   cluster: SparkCluster | None = None) -> bool:
    """Per table of both sources: source rows, target rows, differences, events streamed,
    lag; then whether the model joining them was built. With ``s3``, target rows are read with
    pyiceberg through the REST catalog; with ``cluster``, the Spark tasks per worker (none on
    a worker: not ok, the work did not leave the drivers)."""
    os.environ["DAGSTER_HOME"] = env["DAGSTER_HOME"]
    import dagster as dg

    instance = dg.DagsterInstance.get()
    print()
    print(f"{'table':<28}{'source rows':>12}{'target rows':>12}{'differences':>12}"
          f"{'events':>10}{'lag':>8}")
    all_ok = True
    positions = []
    for server_name, (database, tables) in ((INVENTORY_SOURCE, INVENTORY_TABLES),
                                            (BILLING_SOURCE, BILLING_TABLES)):
        landing = LandingReader.open(deployment.landing_zone.url, server_name,
                                     s3=deployment.s3)
        checkpoint = landing.read_checkpoint()
        positions.append(f"{server_name} {checkpoint.gtid if checkpoint else '-'}")
        catalog_rows = (_catalog_rows(s3, server_name, database, tables) if s3 is not None
                        else None)
        events = _events_by_table(landing, database, tables)
        with servers[server_name].root_connect() as conn, conn.cursor() as cur:
            for table in tables:
                cur.execute(f"SELECT COUNT(*) FROM {database}.{table}")
                source_rows = cur.fetchone()[0]
                key = dg.AssetKey([server_name, database, table])
                event = instance.get_latest_materialization_event(key)
                target_rows: Any = "-"
                if catalog_rows is not None:
                    target_rows = catalog_rows.get(table)
                    target_rows = "-" if target_rows is None else target_rows
                elif event and event.asset_materialization:
                    rows = event.asset_materialization.metadata.get("rows")
                    target_rows = "-" if rows is None else rows.value
                differences: Any = "?"
                check = _latest_check(instance, key)
                if check is not None:
                    differences = sum(int(check.get(k, 0))
                                      for k in ("missing", "extra", "different"))
                all_ok &= differences == 0 and target_rows == source_rows
                count, lag = events.get(table, (0, None))
                lag_text = f"{lag:.1f}s" if lag is not None else "-"
                name = f"{server_name}/{database}.{table}"
                print(f"{name:<28}{source_rows:>12,}{target_rows:>12,}"
                      f"{differences!s:>12}{count:>10,}{lag_text:>8}")
    model = instance.get_latest_materialization_event(dg.AssetKey(list(JOINED_MODEL)))
    built = model is not None
    all_ok &= built
    print(f"\nevents: records landed (row changes, and the snapshot's chunk rows and range "
          "assertions); lag: from the newest change's commit on the source "
          f"to its landing (1 s clock resolution)\nstreamed up to GTID "
          f"{'; '.join(positions)}; inventory.audit_log is excluded by the demo config, and "
          "inventory.customers.password_hash never leaves the engine")
    print(f"dbt model {'/'.join(JOINED_MODEL)} (billing's invoices and payments joined to "
          f"inventory's customers): {'built in run ' + model.run_id if built else 'NOT built'}")
    if s3 is not None:
        print(f"landing zone {deployment.landing_zone.url} and warehouse "
              f"{deployment.warehouse.url} on S3 ({s3.endpoint_url}); target rows read with "
              f"pyiceberg through the Iceberg REST catalog {s3.catalog_uri}")
    if cluster is not None:
        from cdc_platform.demo.cluster import tasks_line

        line, tasks = tasks_line(cluster)
        print(line)
        all_ok &= len(tasks) == len(cluster.worker_daemons) and all(tasks.values())
    return all_ok


def _catalog_rows(s3: SeaweedFS, server_name: str, database: str,
                  tables: tuple[str, ...]) -> dict[str, int | None]:
    """The targets' rows as the REST catalog serves them (``object_storage.target_rows``)."""
    from cdc_platform.demo.object_storage import target_rows
    from cdc_platform.lake.iceberg.catalog import namespace_name

    return target_rows(s3, namespace_name(server_name, database), list(tables))


def _events_by_table(landing: LandingReader, database: str, tables: tuple[str, ...]
                     ) -> dict[str, tuple[int, float | None]]:
    """Records landed per table, and the lag of its newest change (landed - committed: the
    segment's modification or upload time), read through the file layer on either store."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    found: dict[str, tuple[int, float | None]] = {}
    store = landing.store
    for table in tables:
        parts = changelog_parts(database, table)
        names = [name for _, _, name in landing.segment_names(database, table)]
        count = 0
        for name in names:
            fs, path = store.arrow(*parts, name)
            with fs.open_input_file(path) as file:
                count += pq.ParquetFile(file).metadata.num_rows
        lag = None
        if names:
            fs, path = store.arrow(*parts, names[-1])
            committed_ms = pc.max(pq.read_table(path, filesystem=fs, columns=[TS_MS])[0]).as_py()
            landed = next(f.mtime for f in store.list_files(*parts) if f.name == names[-1])
            lag = max(0.0, landed - committed_ms / 1000)
        found[table] = (count, lag)
    return found


def _latest_check(instance: Any, key: Any) -> dict[str, Any] | None:
    import dagster as dg

    records = instance.event_log_storage.get_asset_check_execution_history(
        dg.AssetCheckKey(key, "reconcile"), limit=1)
    if not records or records[0].event is None:
        return None
    evaluation = records[0].event.dagster_event.event_specific_data
    return {k: v.value for k, v in evaluation.metadata.items()}


def run_ui(port: int = 3000) -> int:
    """Start the demo's two MariaDB servers (their data survives from ``make demo``), its
    broker and ``dagster dev``. Ctrl-C or SIGTERM stops all of them (and whatever ``dagster
    dev`` started: webserver, daemon, code servers, runs) and exits 0."""
    try:
        with ProcessSupervisor() as supervisor:
            _prepare_dagster_home()
            server, billing = _servers()
            supervisor.start_service(server)
            supervisor.start_service(billing)
            broker = _broker()
            supervisor.start_service(broker)
            env = _environment((server, billing), broker)
            _say(f"MariaDB on {server.host}:{server.port} (source {INVENTORY_SOURCE!r}) and "
                 f"{billing.host}:{billing.port} (source {BILLING_SOURCE!r}), Kafka (Tansu) on "
                 f"{broker.bootstrap_servers}; Dagster UI on http://127.0.0.1:{port} (Ctrl-C "
                 "stops them all)")
            _say("with the demo_stream_changes job running, snapshot a table from another "
                 "shell: .venv/bin/python -m cdc_platform signal execute-snapshot "
                 f"inventory.customers --source {INVENTORY_SOURCE}")
            command = [str(Path(sys.executable).with_name("dagster")), "dev", "-w",
                       "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)]
            dagster_dev = supervisor.spawn("dagster dev", command, env=env,
                                           stop_signal=signal.SIGINT,
                                           grace=DAGSTER_STOP_GRACE_SECONDS)
            return supervisor.wait(dagster_dev, services=(server, billing, broker))
    except Interrupted:
        return 0
