"""Initial load of many tables: N tables of R rows each whose rows predate the binlog, from
nothing to equal Iceberg targets, with the platform started as in production.

The rows are inserted with ``sql_log_bin = 0`` and the binlog is then reset, so only snapshots
can bring them (the engine's first start writes each table's INITIAL history marker). At t0 the
bench starts the Dagster daemon on a Dagster home whose run queue has the limits of
``helm/values.yaml`` (one engine and one applier per source), and launches ``stream_changes``
once (``dagster job launch``), every platform setting at its default; nothing else. From there
the platform runs itself: the re-snapshot sensor launches the snapshot runs, the applier's
sensor launches ``apply_changes``. The clock stops at the last Iceberg commit after which a
third-party reader (pyiceberg) finds every target equal to its source: the live-row count, then
a digest of every row's values (the digests are compared once every count matched, at the
snapshot whose count first matched; a table whose digest differs is followed on).

Printed beside the figure: when the engine's run started, each snapshot run (tables, start,
end), when the last snapshot was materialised, the applier's merges, and the machine's load.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench._lake import IcebergTail, TargetSnapshot, command_env, write_config
from bench._processes import process_tree, system_busy_seconds
from bench._tables import SNAPSHOT_COLUMNS, SNAPSHOT_DB
from bench.initial_load import digest, source_digest
from cdc_platform.devservices.mariadb import MariaDBServer

SERVER_NAME = "many"
POLL_SECONDS = 1.0
# The goals: 100 x 2,000 rows <= 60 s, 1,000 x 1,000 rows <= 5 min, all equal.
GOALS = {(100, 2000): 60.0, (1000, 1000): 300.0}
# The daemon's settings of helm/values.yaml: its run queue (as the demo's Dagster home), its
# sensors evaluated on threads (a slow sensor does not hold the others back), run monitoring.
DAGSTER_YAML = """\
run_coordinator:
  module: dagster.core.run_coordinator
  class: QueuedRunCoordinator
  config:
    max_concurrent_runs: 8
    tag_concurrency_limits:
      - key: cdc_platform/stream
        value:
          applyLimitPerUniqueValue: true
        limit: 1
      - key: cdc_platform/applier
        value:
          applyLimitPerUniqueValue: true
        limit: 1
sensors:
  use_threads: true
  num_workers: 4
run_monitoring:
  enabled: true
  start_timeout_seconds: 300
  poll_interval_seconds: 60
telemetry:
  enabled: false
"""


def _fill(server: MariaDBServer, tables: list[str], rows: int) -> None:
    """The tables exist (DDL binlogged, then the binlog is reset), their rows never reached
    the binlog."""
    with server.root_connect() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {SNAPSHOT_DB}")
        cur.execute("SET SESSION sql_log_bin = 0")
        for table in tables:
            cur.execute(f"CREATE TABLE {SNAPSHOT_DB}.{table} (id BIGINT PRIMARY KEY, "
                        "name VARCHAR(40), price DECIMAL(10,2), status VARCHAR(8), "
                        "created DATETIME(6))")
            cur.execute(
                f"INSERT INTO {SNAPSHOT_DB}.{table} SELECT seq, CONCAT('{table} ', seq), "
                "(seq * 7919 % 1000000) / 100, ELT(1 + seq % 3, 'new', 'paid', 'shipped'), "
                "TIMESTAMP('2025-01-01') + INTERVAL seq SECOND + INTERVAL seq % 1000000 "
                f"MICROSECOND FROM {SNAPSHOT_DB}.seq_1_to_{rows}")
        conn.commit()


@dataclass
class _Target:
    """One table's target, followed from outside."""

    table: str
    tail: IcebergTail
    counted: TargetSnapshot | None = None  # the first snapshot whose count matched
    equal: TargetSnapshot | None = None  # ... whose rows' digest matched too


def _digest_at(tail: IcebergTail, snapshot: TargetSnapshot) -> tuple[int, int, int]:
    columns = tuple(c.strip() for c in SNAPSHOT_COLUMNS.split(","))
    table = tail.table.scan(selected_fields=columns, snapshot_id=snapshot.snapshot_id).to_arrow()
    return digest(zip(*(column.to_pylist() for column in table.columns), strict=True))


class Platform:
    """The Dagster daemon on its own home and workspace, and what it launched."""

    def __init__(self, root: Path, config: Path, env: dict[str, str]) -> None:
        from cdc_platform.demo.run import create_dagster_storage

        self.home = root / "dagster_home"
        self.home.mkdir()
        (self.home / "dagster.yaml").write_text(DAGSTER_YAML)
        create_dagster_storage(self.home)
        self.workspace = root / "workspace.yaml"
        self.workspace.write_text(yaml.safe_dump({"load_from": [{"python_module": {
            "module_name": "cdc_platform.definitions", "location_name": "cdc_platform"}}]}))
        self.environ = {**os.environ, **env, "CDC_PLATFORM_CONFIG": str(config),
                        "DAGSTER_HOME": str(self.home)}
        self.root = root
        self.daemon: subprocess.Popen[bytes] | None = None

    def _dagster(self, name: str) -> str:
        return str(Path(sys.executable).with_name(name))

    def start(self) -> None:
        with open(self.root / "dagster-daemon.log", "ab") as log:
            self.daemon = subprocess.Popen(
                [self._dagster("dagster-daemon"), "run", "-w", str(self.workspace)],
                env=self.environ, stdout=log, stderr=subprocess.STDOUT, cwd=self.root,
                start_new_session=True)
        done = subprocess.run(
            [self._dagster("dagster"), "job", "launch", "-w", str(self.workspace), "-j",
             "stream_changes"], env=self.environ, capture_output=True, text=True, timeout=300,
            cwd=self.root)
        if done.returncode != 0:
            raise RuntimeError(f"dagster job launch -j stream_changes failed:\n"
                               f"{(done.stdout + done.stderr)[-3000:]}")

    def instance(self) -> Any:
        import dagster as dg

        return dg.DagsterInstance.from_config(str(self.home))

    def check_alive(self) -> None:
        if self.daemon is not None and self.daemon.poll() is not None:
            tail = (self.root / "dagster-daemon.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the Dagster daemon exited ({self.daemon.returncode}):\n{tail}")

    def stop(self) -> None:
        """SIGTERM to the daemon's process group (its code server, the runs it launched: the
        engine checkpoints and exits), then SIGKILL to whatever is left of it."""
        if self.daemon is None:
            return
        tree = process_tree(self.daemon.pid)
        with suppress(ProcessLookupError):
            os.killpg(self.daemon.pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(_alive(pid) for pid in tree):
            time.sleep(0.5)
        with suppress(ProcessLookupError):
            os.killpg(self.daemon.pid, signal.SIGKILL)
        for pid in tree:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.daemon.wait(30)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with suppress(OSError), open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"
    return False


def _runs_report(instance: Any, t0: float) -> list[str]:
    import dagster as dg

    from cdc_platform.defs.lake.applier import APPLIER_TAG
    from cdc_platform.defs.snapshots.sensors import AUTOMATIC_TAG, TABLE_COUNT_TAG

    lines = []
    records = instance.get_run_records(filters=dg.RunsFilter(tags={AUTOMATIC_TAG: SERVER_NAME}),
                                       ascending=True)
    for record in records:
        run = record.dagster_run
        tables = run.tags.get(TABLE_COUNT_TAG) or "1"
        start = record.start_time - t0 if record.start_time else float("nan")
        end = record.end_time - t0 if record.end_time else float("nan")
        lines.append(f"  snapshot run {run.run_id[:8]}: {tables} tables, created at "
                     f"{record.create_timestamp.timestamp() - t0:.1f} s, started at {start:.1f} s, "
                     f"ended at {end:.1f} s, {run.status.value}")
    for label, found in (("stream_changes", dg.RunsFilter(job_name="stream_changes")),
                         ("apply_changes", dg.RunsFilter(tags={APPLIER_TAG: SERVER_NAME}))):
        for record in instance.get_run_records(filters=found):
            start = record.start_time - t0 if record.start_time else float("nan")
            lines.append(f"  {label} run {record.dagster_run.run_id[:8]}: started at "
                         f"{start:.1f} s, {record.dagster_run.status.value}")
    return lines


def _materialised_at(instance: Any, keys: list[Any]) -> tuple[float | None, int]:
    """When the last of ``keys`` was materialised, and how many were."""
    latest, count = None, 0
    for key in keys:
        event = instance.get_latest_materialization_event(key)
        if event is not None:
            count += 1
            latest = max(latest or 0.0, event.timestamp)
    return latest, count


def bench_initial_load_many(tables: int, rows: int, work: Path,
                            timeout: float = 3600.0) -> None:
    import dagster as dg

    goal = GOALS.get((tables, rows))
    print(f"\n## initial load, {tables:,} tables x {rows:,} rows older than the binlog -> equal "
          "Iceberg targets; the Dagster daemon and one stream_changes launch, nothing else, "
          "every setting at its default" + (f" (goal: <= {goal:.0f} s, all equal)" if goal
                                            else ""))
    root = work / f"initial-load-many-{tables}x{rows}"
    root.mkdir(parents=True)
    server = MariaDBServer(base_dir=root / "mariadb", server_id=1, innodb_buffer_pool_size="1G")
    server.start()
    names = [f"m{i:04d}" for i in range(tables)]
    platform: Platform | None = None
    try:
        _fill(server, names, rows)
        server.query("RESET MASTER")  # the tables' history is gone from the binlog
        expected = {t: source_digest(server, t) for t in names}
        config = write_config(root / "config.yaml", server, SERVER_NAME, 7301,
                              rf"{SNAPSHOT_DB}\..*", root)
        platform = Platform(root, config, command_env(server))
        targets = [_Target(t, IcebergTail(root / "warehouse", SERVER_NAME, SNAPSHOT_DB, t))
                   for t in names]
        busy_before, t0 = system_busy_seconds(), time.time()
        platform.start()
        pending = list(targets)
        counted_all_at = None
        while pending:
            if time.time() - t0 > timeout:
                raise TimeoutError(f"{len(pending)} of {tables} targets not equal within "
                                   f"{timeout:.0f} s: {', '.join(t.table for t in pending[:10])}")
            platform.check_alive()
            for target in pending:
                if target.counted is None:
                    current = target.tail.current()
                    if current is not None and current.rows == rows:
                        target.counted = current
            if all(t.counted is not None for t in pending):
                counted_all_at = counted_all_at or time.time()
                for target in pending:  # (the digests, once every count matched)
                    assert target.counted is not None
                    if _digest_at(target.tail, target.counted) == expected[target.table]:
                        target.equal = target.counted
                    else:
                        target.counted = None  # (followed on)
                pending = [t for t in pending if t.equal is None]
            if pending:
                time.sleep(POLL_SECONDS)
        seen_at = time.time()
        busy = system_busy_seconds() - busy_before
        with platform.instance() as instance:
            runs = _runs_report(instance, t0)
            snapshots_at, snapshots = _materialised_at(instance, [
                dg.AssetKey([SERVER_NAME, "snapshot", SNAPSHOT_DB, t]) for t in names])
            merges = sum(1 for t in names for record in instance.fetch_materializations(
                dg.AssetKey([SERVER_NAME, SNAPSHOT_DB, t]), limit=1000).records
                if "current" not in record.asset_materialization.metadata)
    finally:
        if platform is not None:
            platform.stop()
        server.stop()

    done_at = max(t.equal.committed_at for t in targets if t.equal is not None)
    seconds = done_at - t0
    verdict = "" if goal is None else (" (goal met)" if seconds <= goal else
                                       f" (goal {goal:.0f} s: not met)")
    print(f"all {tables:,} targets equal to their sources at {seconds:.1f} s{verdict}: "
          f"{tables * rows:,} rows, {tables * rows / seconds:,.0f} rows/s (the last Iceberg "
          f"commit of a target; every count seen at {(counted_all_at or seen_at) - t0:.1f} s, "
          f"the digests compared by {seen_at - t0:.1f} s, outside the clock)")
    if snapshots_at is not None:
        print(f"snapshots: {snapshots} of {tables} materialised, the last at "
              f"{snapshots_at - t0:.1f} s; the platform's runs:")
    for line in runs:
        print(line)
    print(f"applier: {merges} merges recorded into the {tables} targets")
    print(f"machine: {busy / (seen_at - t0):.2f} of {os.cpu_count()} cores busy from t0 to the "
          "last count seen")
