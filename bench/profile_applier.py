"""Where the applier's time goes under a steady write load: the applier loop in this process
(under cProfile), the capture engine and the writers in processes of their own.

``python -m bench.profile_applier [--rate 2000] [--seconds 60] [--top 30]``: the e2e bench's
table and writers (``bench.lake_e2e``), the engine as ``python -m cdc_platform stream``, and
``cdc_platform.lake.applier.loop.Applier`` with the same config as ``python -m cdc_platform apply``
would build it. After a warm-up merge (not profiled), prints each merge's records and seconds,
the Spark SQL statements the applier ran by kind (count, total and mean seconds: a statement
that writes runs when ``spark.sql`` is called), the Spark actions (``collect``, ``first``,
``count``), and the profile's top entries of ``cdc_platform.lake`` by cumulative time (wall
time: the Python driver waits on the JVM inside them).

``--initial-load-rows N`` profiles an initial load instead: a table of N rows that predate the
binlog (``bench._tables``), snapshotted by ``python -m cdc_platform snapshot`` while the engine
streams; the applier (its Spark session warmed up first on another table) then merges it in one
profiled pass.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import multiprocessing
import os
import pstats
import re
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench._lake import IcebergTail, command_env, wait_until, write_config
from bench._processes import CliProcess
from bench._tables import SNAPSHOT_DB, SNAPSHOT_TABLE, fill_snapshot_table
from bench.lake_e2e import CREATE_TABLE, DATABASE, SERVER_NAME, TABLE, write_changes
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.devservices.mariadb import MariaDBServer

_KINDS = [
    ("create branch", re.compile(r"ALTER TABLE .* CREATE BRANCH", re.S)),
    ("drop branch", re.compile(r"ALTER TABLE .* DROP BRANCH", re.S)),
    ("merge", re.compile(r"^\s*MERGE INTO", re.S)),
    ("append (insert)", re.compile(r"^\s*INSERT INTO", re.S)),
    ("fast_forward", re.compile(r"fast_forward", re.S)),
    ("rewrite_data_files", re.compile(r"rewrite_data_files", re.S)),
    ("rewrite_position_delete_files", re.compile(r"rewrite_position_delete_files", re.S)),
    ("expire_snapshots", re.compile(r"expire_snapshots", re.S)),
    ("metadata table read", re.compile(r"FROM \S+\.(refs|snapshots|history|files)\b", re.S)),
    ("table properties", re.compile(r"SHOW TBLPROPERTIES|ALTER TABLE .* SET TBLPROPERTIES", re.S)),
]


def _kind(statement: str) -> str:
    for name, pattern in _KINDS:
        if pattern.search(statement):
            return name
    return " ".join(statement.split()[:4])[:60]


class _Timings:
    """Seconds per kind of Spark SQL statement and per DataFrame action, as they happen."""

    def __init__(self) -> None:
        self.seconds: dict[str, list[float]] = defaultdict(list)
        self._patched: list[tuple[Any, str, Any]] = []

    def _wrap(self, owner: Any, name: str, label: Any) -> None:
        original = getattr(owner, name)

        def timed(this: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(this, *args, **kwargs)
            finally:
                self.seconds[label(args)].append(time.perf_counter() - started)

        setattr(owner, name, timed)
        self._patched.append((owner, name, original))

    def __enter__(self) -> _Timings:
        from pyspark.sql import DataFrame, SparkSession

        self._wrap(SparkSession, "sql", lambda args: f"sql: {_kind(str(args[0]))}")
        for action in ("collect", "first", "count", "toPandas", "toArrow"):
            if hasattr(DataFrame, action):
                self._wrap(DataFrame, action, lambda args, a=action: f"action: {a}()")
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self._patched):
            setattr(owner, name, original)

    def report(self) -> str:
        lines = [f"{'what':<45} {'count':>6} {'total s':>9} {'mean s':>8} {'max s':>7}"]
        for label, values in sorted(self.seconds.items(), key=lambda kv: -sum(kv[1])):
            lines.append(f"{label:<45} {len(values):>6} {sum(values):>9.2f} "
                         f"{sum(values) / len(values):>8.3f} {max(values):>7.2f}")
        return "\n".join(lines)


def _cumulative(profile: cProfile.Profile, pattern: str, count: int) -> str:
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(pattern, count)
    lines = out.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
    return "\n".join(lines[start:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--initial-load-rows", type=int, default=0,
                        help="profile an initial load of a table this large instead")
    args = parser.parse_args()
    if args.initial_load_rows:
        profile_initial_load(args.initial_load_rows, args.top)
        return 0
    from cdc_platform.config import load_settings
    from cdc_platform.lake.applier.loop import Applier
    from cdc_platform.lake.applier.options import ApplierOptions
    from cdc_platform.lake.spark import build_spark_session

    with tempfile.TemporaryDirectory(prefix="cdc-prof-") as tmp:
        work = Path(tmp)
        server = MariaDBServer(base_dir=work / "mariadb", server_id=1)
        server.start()
        engine = None
        try:
            server.query(f"CREATE DATABASE {DATABASE}")
            server.query(CREATE_TABLE)
            config = write_config(work / "config.yaml", server, SERVER_NAME, 7301,
                                  rf"{DATABASE}\..*", work, landing={"retention_hours": 0})
            env = command_env(server)
            engine = CliProcess("engine", ["stream", "--config", str(config)],
                                work / "engine.log", env, work)
            landing = LandingZone(str(work / "landing"), SERVER_NAME)
            wait_until("the engine's first checkpoint",
                       lambda: landing.read_checkpoint() is not None, 120)
            os.environ.update(env)
            settings = load_settings(config)
            spark = build_spark_session(settings.spark.master, settings.spark.app_name,
                                        dict(settings.spark.conf))
            events: list[Any] = []
            applier = Applier(spark, ApplierOptions.from_settings(settings), events.append)
            server.query(f"INSERT INTO {DATABASE}.{TABLE} VALUES (-1, -1, 0, %s, 'warm-up')",
                         (time.time(),))
            tail = IcebergTail(work / "warehouse", SERVER_NAME, DATABASE, TABLE)

            def warmed() -> bool:
                applier.cycle()
                current = tail.current()
                return current is not None and current.rows > 0

            wait_until("the warm-up merge", warmed, 300, every=1.0)
            events.clear()

            context = multiprocessing.get_context("spawn")
            results = context.Queue()
            start_at = time.time() + 2.0
            children = [context.Process(target=write_changes, args=(
                server.connection_settings(user="root"), i, args.writers,
                args.rate / args.writers, start_at, args.seconds, results), daemon=True)
                for i in range(args.writers)]
            for child in children:
                child.start()
            stop = threading.Event()
            threading.Timer(args.seconds + 2.0, stop.set).start()
            profile = cProfile.Profile()
            started = time.time()
            with _Timings() as timings:
                profile.enable()
                try:
                    applier.run(stop)
                finally:
                    profile.disable()
            elapsed = time.time() - started
            done = [results.get(timeout=60) for _ in children]
            commits = sum(d[1] + d[2] for d in done)
        finally:
            if engine is not None:
                engine.stop()
            server.stop()

    print(f"{commits:,} commits in {args.seconds:.0f} s ({commits / args.seconds:,.0f}/s)")
    _report(events, elapsed, timings, profile, args.top)
    return 0


def _report(events: list[Any], elapsed: float, timings: _Timings, profile: cProfile.Profile,
            top: int) -> None:
    from cdc_platform.lake.applier.events import Applied

    merges = [e.result for e in events if isinstance(e, Applied)]
    others = [type(e).__name__ for e in events if not isinstance(e, Applied)]
    print(f"the applier ran {elapsed:.1f} s: {len(merges)} merges, "
          f"{sum(m.duration_seconds for m in merges):.1f} s merging; other events: "
          + (", ".join(f"{others.count(n)} {n}" for n in sorted(set(others))) or "none"))
    for m in merges:
        print(f"  {m.table_id}: {m.records_read:>7,} records -> {m.inserts:,} inserts, "
              f"{m.updates:,} updates in {m.duration_seconds:5.2f} s "
              f"({'append' if m.appended else 'merge'}; "
              f"{m.snapshot.metadata().get('data_files') if m.snapshot else '?'} data files)")
    for event in events:
        if type(event).__name__ == "Maintained":
            print(f"  {event.schema.table_id}: maintained ({event.reason}): "
                  + ", ".join(f"{k} {v}" for k, v in event.report.items()
                              if k.endswith(("_seconds", "_count", "snapshots"))))
    print(f"\nSpark SQL statements and actions, by kind:\n{timings.report()}")
    print(f"\ncProfile, cdc_platform.lake by cumulative (wall) time:\n"
          f"{_cumulative(profile, 'cdc_platform/lake', top)}")


def profile_initial_load(rows: int, top: int) -> None:
    from cdc_platform.config import load_settings
    from cdc_platform.lake.applier.loop import Applier
    from cdc_platform.lake.applier.options import ApplierOptions
    from cdc_platform.lake.spark import build_spark_session

    with tempfile.TemporaryDirectory(prefix="cdc-prof-") as tmp:
        work = Path(tmp)
        server = MariaDBServer(base_dir=work / "mariadb", server_id=1,
                               innodb_buffer_pool_size="1G")
        server.start()
        processes: list[CliProcess] = []
        try:
            fill_snapshot_table(server, rows)
            server.query("RESET MASTER")
            server.query(f"CREATE TABLE {SNAPSHOT_DB}.warm (id INT PRIMARY KEY)")
            server.query(f"INSERT INTO {SNAPSHOT_DB}.warm VALUES (1)")
            config = write_config(work / "config.yaml", server, "load", 7302,
                                  rf"{SNAPSHOT_DB}\..*", work)
            env = command_env(server)
            processes.append(CliProcess("engine", ["stream", "--config", str(config)],
                                        work / "engine.log", env, work))
            landing = LandingZone(str(work / "landing"), "load")
            wait_until("the engine's first checkpoint",
                       lambda: landing.read_checkpoint() is not None, 120)
            os.environ.update(env)
            settings = load_settings(config)
            spark = build_spark_session(settings.spark.master, settings.spark.app_name,
                                        dict(settings.spark.conf))
            events: list[Any] = []
            applier = Applier(spark, ApplierOptions.from_settings(settings), events.append)
            warm = IcebergTail(work / "warehouse", "load", SNAPSHOT_DB, "warm")

            def warmed() -> bool:
                applier.cycle()
                current = warm.current()
                return current is not None and current.rows > 0

            started = time.monotonic()
            wait_until("the warm-up merge", warmed, 300, every=0.5)
            print(f"warm-up (Spark session, a one-row table): {time.monotonic() - started:.1f} s")
            events.clear()
            started = time.monotonic()
            snapshot = CliProcess("snapshot", ["snapshot", f"{SNAPSHOT_DB}.{SNAPSHOT_TABLE}",
                                               "--config", str(config)],
                                  work / "snapshot.log", env, work)
            processes.append(snapshot)
            snapshot.wait(600)
            print(f"snapshot of {rows:,} rows: exit {snapshot.process.returncode} after "
                  f"{time.monotonic() - started:.1f} s")
            time.sleep(2.0)  # (the engine's next flush and checkpoint)
            profile = cProfile.Profile()
            started = time.monotonic()
            with _Timings() as timings:
                profile.enable()
                try:
                    applier.cycle()
                finally:
                    profile.disable()
            elapsed = time.monotonic() - started
        finally:
            for process in reversed(processes):
                process.stop()
            server.stop()
    _report(events, elapsed, timings, profile, top)


if __name__ == "__main__":
    raise SystemExit(main())
