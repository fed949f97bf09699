"""Initial load: a table whose rows predate the binlog, from nothing to an equal Iceberg target.

The rows are inserted with ``sql_log_bin = 0`` and the binlog is then reset, so only a snapshot
can bring them (the engine's first start writes the table's INITIAL history marker). At t0 the
bench starts, together, the capture engine (``python -m cdc_platform stream``), the applier
(``... apply``) and the table's snapshot (``... snapshot db.table``, the run the snapshot sensor
launches under Dagster), each a process of its own, every setting at its default. The clock
stops at the Iceberg commit of the first snapshot in which a third-party reader (pyiceberg)
finds every row: the live-row count equal to the source's, then a full compare (keys and a
digest of every row's values) equal to the source's.

Then, warm: a second table of the same size becomes captured while engine and applier run (a
table created with its rows kept out of the binlog), and its snapshot is launched at t1: the
same clock without the processes' start (the Spark session above all), as for a table that
joins a running platform.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench._lake import IcebergTail, TargetSnapshot, command_env, write_config
from bench._processes import CliProcess, system_busy_seconds
from bench._tables import SNAPSHOT_COLUMNS, SNAPSHOT_DB, SNAPSHOT_TABLE, fill_snapshot_table
from bench.lake_e2e import APPLIED_LINE
from cdc_platform.devservices.mariadb import MariaDBServer

SERVER_NAME = "load"
WARM_TABLE = "items_warm"
POLL_SECONDS = 0.5
GOAL_ROWS_PER_SECOND = 250_000
SNAPSHOT_LINE = re.compile(r"snapshot of \S+: (\w+), (\d+) rows in (\d+) chunks .* ([\d,]+) rows/s")


def _logged(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _canonical(value: Any) -> Any:
    """Instants as naive UTC (a reader may return them aware); everything else as it is."""
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    return value


def digest(rows: Any) -> tuple[int, int, int]:
    """(rows, sum of keys, sum of the rows' hashes mod 2**64): equal for equal multisets of
    rows (Python's hashes of ints, strings, Decimals and datetimes, in this process)."""
    count = keys = total = 0
    for row in rows:
        count += 1
        keys += row[0]
        total = (total + hash(tuple(_canonical(v) for v in row))) % 2**64
    return count, keys, total


def source_digest(server: MariaDBServer, table: str) -> tuple[int, int, int]:
    import MySQLdb
    import MySQLdb.cursors

    settings = server.connection_settings(user="root")
    conn = MySQLdb.connect(host=settings["host"], port=settings["port"], user=settings["user"],
                           passwd=settings["password"], cursorclass=MySQLdb.cursors.SSCursor)
    try:
        cur = conn.cursor()
        cur.execute(f"SELECT {SNAPSHOT_COLUMNS} FROM {SNAPSHOT_DB}.{table}")
        return digest(cur)
    finally:
        conn.close()


def target_digest(tail: IcebergTail) -> tuple[int, int, int]:
    table = tail.scan(tuple(c.strip() for c in SNAPSHOT_COLUMNS.split(",")))
    return digest(zip(*(column.to_pylist() for column in table.columns), strict=True))


@dataclass
class _Load:
    """One table's load, timed from ``t0``."""

    table: str
    rows: int
    t0: float
    snapshot: CliProcess
    complete: TargetSnapshot | None = None
    seen_at: float = 0.0
    first_rows_at: float | None = None
    verify_seconds: float = 0.0

    @property
    def seconds(self) -> float:
        assert self.complete is not None
        return self.complete.committed_at - self.t0

    def describe(self) -> list[str]:
        lines = []
        done = self.snapshot.ended_at
        found = [m for m in map(SNAPSHOT_LINE.search, self.snapshot.log_lines()) if m]
        if done is not None:
            lines.append(f"snapshot done at {done - self.t0:.1f} s" + (
                f" (the reader: {found[-1].group(1)}, {int(found[-1].group(2)):,} rows in "
                f"{found[-1].group(3)} chunks, {found[-1].group(4)} rows/s)" if found else ""))
        else:
            lines.append("snapshot: still running when the target was complete")
        if self.first_rows_at is not None:
            lines.append(f"first rows readable at {self.first_rows_at - self.t0:.1f} s")
        lines.append(
            f"target complete at {self.seconds:.1f} s (Iceberg commit of the snapshot in which "
            f"every row is readable: count, keys and row digest equal to the source's; seen by "
            f"the poller at {self.seen_at - self.t0:.1f} s, the compare took "
            f"{self.verify_seconds:.1f} s, outside the clock)")
        return lines


def _until_complete(load: _Load, expected: tuple[int, int, int], tail: IcebergTail,
                    running: list[CliProcess], timeout: float) -> None:
    verified: set[int] = set()
    while load.complete is None:
        if time.time() - load.t0 > timeout:
            raise TimeoutError(f"the target of {load.table} was not complete within "
                               f"{timeout:.0f} s")
        for process in running:
            if not process.alive():
                raise process.fail("exited")
        if load.snapshot.ended_at is not None and load.snapshot.process.returncode != 0:
            raise load.snapshot.fail("failed")
        for found in tail.poll():
            if load.first_rows_at is None and found.rows > 0:
                load.first_rows_at = found.committed_at
        current = tail.current()
        if current is not None and current.rows == load.rows and \
                current.snapshot_id not in verified:
            verified.add(current.snapshot_id)
            started = time.monotonic()
            if target_digest(tail) == expected:
                load.complete, load.seen_at = current, time.time()
            load.verify_seconds += time.monotonic() - started
        time.sleep(POLL_SECONDS)


def _merges(applier: CliProcess, table: str, since: float, until: float) -> list[Any]:
    found = []
    for match in map(APPLIED_LINE.match, applier.log_lines()):
        if match and match.group(2) == f"{SNAPSHOT_DB}.{table}" and \
                since <= _logged(match.group(1)) <= until + 1:
            found.append(match)
    return found


def _describe_merges(merges: list[Any], t0: float) -> str:
    return "; ".join(f"{int(m.group(3)):,} {m.group(4)} in {float(m.group(5)):.1f} s (logged at "
                     f"{_logged(m.group(1)) - t0:.0f} s)" for m in merges[:30])


def bench_initial_load(rows: int, work: Path, timeout: float = 3600.0) -> None:
    print(f"\n## initial load: a {rows:,}-row table whose rows predate the binlog -> an equal "
          "Iceberg target; engine (stream), applier (apply) and the table's snapshot (as the "
          "snapshot sensor launches it) started together at t0 as processes of their own, "
          "every setting at its default")
    root = work / "initial-load"
    root.mkdir(parents=True)
    server = MariaDBServer(base_dir=root / "mariadb", server_id=1, innodb_buffer_pool_size="1G")
    server.start()
    processes: list[CliProcess] = []
    try:
        fill_snapshot_table(server, rows)
        server.query("RESET MASTER")  # the table's history is gone from the binlog
        expected = source_digest(server, SNAPSHOT_TABLE)
        config = write_config(root / "config.yaml", server, SERVER_NAME, 7201,
                              rf"{SNAPSHOT_DB}\..*", root)
        env = command_env(server)

        def command(label: str, *args: str) -> CliProcess:
            process = CliProcess(label, [*args, "--config", str(config)],
                                 root / f"{label}.log", env, root)
            processes.append(process)
            return process

        busy_before = system_busy_seconds()
        t0 = time.time()
        engine, applier = command("engine", "stream"), command("applier", "apply")
        cold = _Load(SNAPSHOT_TABLE, rows, t0,
                     command("snapshot", "snapshot", f"{SNAPSHOT_DB}.{SNAPSHOT_TABLE}"))
        _until_complete(cold, expected, IcebergTail(root / "warehouse", SERVER_NAME,
                                                    SNAPSHOT_DB, SNAPSHOT_TABLE),
                        [engine, applier], timeout)
        busy = system_busy_seconds() - busy_before
        cold_done = time.time()
        usage = {p.label: p.usage() for p in processes}
        cold_merges = _merges(applier, SNAPSHOT_TABLE, t0, cold.complete.committed_at)

        # Warm: a table that becomes captured while engine and applier run (its rows, again,
        # never in the binlog); t0 is its snapshot's launch.
        fill_snapshot_table(server, rows, WARM_TABLE)
        expected_warm = source_digest(server, WARM_TABLE)
        for process in (engine, applier):
            process.mark()
        t1 = time.time()
        warm = _Load(WARM_TABLE, rows, t1, command("snapshot-warm", "snapshot",
                                                   f"{SNAPSHOT_DB}.{WARM_TABLE}"))
        _until_complete(warm, expected_warm, IcebergTail(root / "warehouse", SERVER_NAME,
                                                         SNAPSHOT_DB, WARM_TABLE),
                        [engine, applier], timeout)
        warm_usage = {p.label: p.usage() for p in (engine, applier, warm.snapshot)}
        warm_merges = _merges(applier, WARM_TABLE, t1, warm.complete.committed_at)
    finally:
        for process in reversed(processes):
            process.stop()
        server.stop()

    assert cold.complete is not None and warm.complete is not None
    print(f"source: {rows:,} rows, binlog reset after the load (history predates it)")
    for line in cold.describe():
        print(line)
    print(f"initial load: {rows:,} rows in {cold.seconds:.1f} s = {rows / cold.seconds:,.0f} "
          f"rows/s  (goal >= {GOAL_ROWS_PER_SECOND:,} rows/s on this 2-core machine; OLake "
          "reports 338k rows/s for a full MySQL->Iceberg load and filament 1.27M rows/s, on "
          "bigger machines; before the applier: ~16k rows/s, 35k without reconcile, with "
          "`dagster job execute -j materialise_targets`)")
    print(f"applier: {len(cold_merges)} merges into the target: "
          f"{_describe_merges(cold_merges, t0)}; the target holds "
          f"{cold.complete.summary.get('total-data-files')} data + "
          f"{cold.complete.summary.get('total-delete-files')} delete files")
    for label in ("applier", "engine", "snapshot"):
        print(f"  {label:<8} {usage[label].describe(cold_done - t0)}")
    print(f"machine: {busy / (cold_done - t0):.2f} of 2 cores busy from t0 to the end of the "
          "compare")
    print(f"\nwarm: another {rows:,}-row table captured while engine and applier run (t0: its "
          "snapshot's launch; no Spark start in the figure)")
    for line in warm.describe():
        print(line)
    print(f"initial load, warm applier: {rows:,} rows in {warm.seconds:.1f} s = "
          f"{rows / warm.seconds:,.0f} rows/s; merges: {_describe_merges(warm_merges, t1)}")
    for label, used in warm_usage.items():
        print(f"  {label:<13} {used.describe(warm.seconds)}")
