"""``make demo`` and ``make ui``: zero configuration, everything under ``.cdc/``.

The demo starts a private MariaDB, creates and loads the ``inventory`` database, and then works
exactly as a user would, through Dagster: the ``stream_changes`` job runs (``dagster job
execute``) while a write workload runs, then ``materialise_targets`` folds the changes into the
lake tables and reconciles each against the source, and ``build_dbt_models`` builds the dbt
models on them. Runs land in ``.cdc/dagster_home``, so
``make ui`` shows them afterwards.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from cdc_platform.devservices._process import pdeathsig_preexec
from cdc_platform.devservices.mariadb import MariaDBServer

CDC_HOME = Path(os.environ.get("CDC_HOME", ".cdc")).absolute()
DEMO_DIR = CDC_HOME / "demo"
DAGSTER_HOME = CDC_HOME / "dagster_home"
DEMO_PASSWORD = "cdc"

_DAGSTER_YAML = """\
# Written by `make demo` / `make ui`. At most one streaming run per source server.
run_coordinator:
  module: dagster.core.run_coordinator
  class: QueuedRunCoordinator
  config:
    tag_concurrency_limits:
      - key: cdc_platform/stream
        value:
          applyLimitPerUniqueValue: true
        limit: 1
telemetry:
  enabled: false
"""


def _say(message: str) -> None:
    print(f"==> {message}", flush=True)


def _environment(server: MariaDBServer) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "CDC_HOME": str(CDC_HOME),
        "CDC_SOURCE_HOST": server.host,
        "CDC_SOURCE_PORT": str(server.port),
        "CDC_SOURCE_PASSWORD": DEMO_PASSWORD,
        "DAGSTER_HOME": str(DAGSTER_HOME),
        "PYSPARK_PYTHON": sys.executable,
    })
    env.pop("CDC_PLATFORM_CONFIG", None)  # the embedded demo config
    return env


def _prepare_dagster_home() -> None:
    DAGSTER_HOME.mkdir(parents=True, exist_ok=True)
    (DAGSTER_HOME / "dagster.yaml").write_text(_DAGSTER_YAML)


def _dagster_job(env: dict[str, str], job: str, run_config: dict[str, Any] | None = None,
                 background: bool = False) -> subprocess.Popen[bytes] | int:
    command = [str(Path(sys.executable).with_name("dagster")), "job", "execute",
               "-m", "cdc_platform.definitions", "-j", job]
    if run_config:
        path = DEMO_DIR / f"{job}.run_config.yaml"
        path.write_text(yaml.safe_dump(run_config))
        command += ["-c", str(path)]
    log = open(DEMO_DIR / f"{job}.log", "ab")  # noqa: SIM115 - handed to the child
    # If the demo dies, the run gets SIGTERM: it checkpoints and exits instead of lingering.
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                               preexec_fn=pdeathsig_preexec(signal.SIGTERM))
    if background:
        return process
    return process.wait()


def run_demo(orders: int = 100_000, workload_seconds: float = 20.0) -> int:
    from cdc_platform.demo.inventory import Workload, create_schema, load_initial_data

    if DEMO_DIR.exists():
        shutil.rmtree(DEMO_DIR)  # every demo starts from an empty source and lake
    DEMO_DIR.mkdir(parents=True)
    _prepare_dagster_home()
    server = MariaDBServer(base_dir=DEMO_DIR / "mariadb", server_id=1,
                           cdc_password=DEMO_PASSWORD)
    _say(f"starting a private MariaDB in {DEMO_DIR / 'mariadb'}")
    server.start()
    stream: subprocess.Popen[bytes] | None = None
    try:
        env = _environment(server)
        started = time.monotonic()
        _say(f"creating the inventory database with {orders:,} orders")
        with server.root_connect() as conn:
            create_schema(conn)
            load_initial_data(conn, orders=orders)
        _say(f"loaded in {time.monotonic() - started:.1f}s")

        workload = Workload(server.connection_settings(user="root"), rate=150.0)
        _say(f"streaming (job stream_changes) while a write workload runs for "
             f"{workload_seconds:.0f}s")
        launched = _dagster_job(env, "stream_changes", {"ops": {"capture_changes": {"config": {
            "stop_when_caught_up": True, "caught_up_idle_seconds": 4.0,
            "progress_seconds": 5.0}}}}, background=True)
        assert isinstance(launched, subprocess.Popen)
        stream = launched
        workload.run_for(workload_seconds)
        _say(f"workload done: {workload.stats.transactions} transactions committed, "
             f"{workload.stats.rolled_back} rolled back; waiting for the stream to catch up")
        if stream.wait() != 0:
            _say(f"stream_changes failed: see {DEMO_DIR / 'stream_changes.log'}")
            return 1

        _say("materialising the lake tables and reconciling them (job materialise_targets)")
        code = _dagster_job(env, "materialise_targets")
        if code == 0:
            _say("building the dbt models on the lake tables (job build_dbt_models)")
            code = _dagster_job(env, "build_dbt_models")
        ok = _print_summary(server, env) and code == 0
        _say("all tables reconcile: zero differences" if ok else
             f"differences found or a run failed: see {DEMO_DIR}/*.log")
        print()
        print("See the runs, materialisations and reconcile checks in the Dagster UI:")
        print("    make ui        # then open http://127.0.0.1:3000")
        return 0 if ok else 1
    finally:
        if stream is not None and stream.poll() is None:
            stream.terminate()  # Ctrl-C: the streaming run checkpoints and stops
            stream.wait(timeout=90)
        server.stop()


def _print_summary(server: MariaDBServer, env: dict[str, str]) -> bool:
    """Per table: source rows, target rows, differences, events streamed, lag."""
    os.environ["DAGSTER_HOME"] = env["DAGSTER_HOME"]
    import dagster as dg

    from cdc_platform.capture.landing import LandingZone

    instance = dg.DagsterInstance.get()
    landing = LandingZone(str(DEMO_DIR / "landing"), "demo")
    checkpoint = landing.read_checkpoint()
    events = _events_by_table(landing)
    print()
    print(f"{'table':<24}{'source rows':>12}{'target rows':>12}{'differences':>12}"
          f"{'events':>10}{'lag':>8}")
    all_ok = True
    with server.root_connect() as conn, conn.cursor() as cur:
        for table in ("customers", "products", "orders"):
            cur.execute(f"SELECT COUNT(*) FROM inventory.{table}")
            source_rows = cur.fetchone()[0]
            key = dg.AssetKey(["demo", "inventory", table])
            event = instance.get_latest_materialization_event(key)
            target_rows = "-"
            if event and event.asset_materialization:
                target_rows = event.asset_materialization.metadata["rows"].value
            differences: Any = "?"
            check = _latest_check(instance, key)
            if check is not None:
                differences = sum(int(check.get(k, 0)) for k in ("missing", "extra", "different"))
            all_ok &= differences == 0 and target_rows == source_rows
            count, lag = events.get(table, (0, None))
            lag_text = f"{lag:.1f}s" if lag is not None else "-"
            print(f"{'inventory.' + table:<24}{source_rows:>12,}{target_rows:>12,}"
                  f"{differences!s:>12}{count:>10,}{lag_text:>8}")
    print(f"\nevents: change records landed; lag: from the newest change's commit on the source "
          f"to its landing (1 s clock resolution)\nstreamed up to GTID "
          f"{checkpoint.gtid if checkpoint else '-'}; inventory.audit_log is excluded by the demo "
          "config, and inventory.customers.password_hash never leaves the engine")
    return all_ok


def _events_by_table(landing: Any) -> dict[str, tuple[int, float | None]]:
    """Records landed per table, and the lag of its newest change (landed - committed)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    found: dict[str, tuple[int, float | None]] = {}
    for table in ("customers", "products", "orders"):
        segments = landing.segments("inventory", table)
        count = sum(pq.ParquetFile(path).metadata.num_rows for _, _, path in segments)
        lag = None
        if segments:
            newest = segments[-1][2]
            committed_ms = pc.max(pq.read_table(newest, columns=["__cdc_ts_ms"])[0]).as_py()
            lag = max(0.0, newest.stat().st_mtime - committed_ms / 1000)
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
    """Start the demo's MariaDB (its data survives from ``make demo``) and ``dagster dev``."""
    _prepare_dagster_home()
    server = MariaDBServer(base_dir=DEMO_DIR / "mariadb", server_id=1,
                           cdc_password=DEMO_PASSWORD)
    server.start()
    try:
        env = _environment(server)
        _say(f"MariaDB on {server.host}:{server.port}; Dagster UI on http://127.0.0.1:{port} "
             "(Ctrl-C stops both)")
        command = [str(Path(sys.executable).with_name("dagster")), "dev", "-w",
                   "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)]
        return subprocess.call(command, env=env)
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()
