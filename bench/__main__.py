"""``make bench``: ratios against bare and native baselines, measured side by side in one run.

Every figure is printed beside its baselines from the same run, with the ratio, and with the
capture engine's peak RSS (the engine runs in a process of its own, as in production):

* streaming: the capture engine's end-to-end rows/s (binlog -> Parquet segments + checkpoint)
  divided by a bare mysql-replication loop's rows/s over the same binlog (goal >= 0.8), and by
  the C client ``mariadb-binlog --read-from-remote-server --verbose`` decoding the same binlog
  to /dev/null (goals: >= 60k rows/s, >= 0.5 of it);
* freshness: commit-to-landing lag percentiles under a steady write rate (``--freshness-rate``,
  default 5,000 single-row commits/s; goal: p99 <= flush interval + 0.1 s);
* lake: the time to merge a fixed 10k-change batch into target tables of two sizes (goal: grows
  sub-linearly with the table);
* snapshot: an incremental snapshot's rows/s (reader + capture engine, default chunk size)
  beside the C client reading the same table (``mariadb --quick --batch -e "SELECT ..."`` to
  /dev/null; goals: >= 200k rows/s, >= 0.5 of it) and a bare pymysql keyset SELECT loop; and
  again under a concurrent write load of ~500 changes/s (goal: >= 0.7 of the idle figure).
  ``--snapshot-rows`` (or BENCH_SNAPSHOT_ROWS) sets the table size, default 1,000,000.
* large transaction: the engine's peak RSS while it captures one 1M-row INSERT ... SELECT
  (4 columns, ~70 bytes a row), with the default ``capture.transaction_memory_bytes``: memory
  must stay bounded by that setting, not grow with the transaction.
* e2e (the living lake, ``bench/lake_e2e.py``): source commit -> row readable in the target's
  Iceberg table, with the engine (``python -m cdc_platform stream``) and the applier
  (``... apply``) as processes of their own on one config file (``lake.poll_seconds``,
  ``capture.flush_interval_seconds`` at their defaults, ``landing_zone.retention_hours`` 0 unless
  ``--e2e-retention-hours``). Writer processes commit single-row inserts and updates carrying
  their commit time at each rate of ``--e2e-rates`` (default 1,000 and 5,000 commits/s) for
  ``--e2e-seconds`` (default 300); a poller reads the table's new snapshots with pyiceberg every
  0.5 s. Printed: lag p50/p95/p99/max (goal: p99 <= 15 s at 5,000 commits/s; peers' Iceberg
  sinks commit every 1-5 min), its engine share (commit -> landed), the achieved rate, the
  merges and their durations, the applier's and the engine's CPU and peak RSS, the landing
  zone's size and file count after the soak and after the applier's next sweep.
* initial-load (``bench/initial_load.py``): a ``--initial-load-rows`` (default 1,000,000) table
  whose rows predate the binlog; engine, applier and ``python -m cdc_platform snapshot db.table``
  started together at t0; the clock stops at the Iceberg commit in which pyiceberg reads every
  row (count, keys and a digest of every row equal to the source's). Printed: rows/s (goal >=
  250k rows/s here; OLake 338k, filament 1.27M on bigger machines), when the snapshot was done,
  each merge, CPU and peak RSS of the three processes; then the same for a second table
  captured while engine and applier already run (no process start in the figure).
* lake-many (``bench/lake_many.py``): the lake's lag when the changes are spread over many
  tables (``--lake-many``, default 100 tables at 200 commits/s and 1,000 at 500; goals p99 <=
  15 s and <= 60 s, ``lake.freshness_seconds``), engine and applier as processes at their
  defaults; printed beside it: the merges, their duration, the applier's CPU per merge and peak
  RSS; each case again with the Dagster daemon and one ``stream_changes`` launch (the applier
  is then the ``apply_changes`` run), and the first with ``--s3`` on SeaweedFS (REST catalog).
* initial-load-many (``bench/initial_load_many.py``): ``--many-tables`` (default 100x2000 and
  1000x1000) tables of that many rows whose rows predate the binlog, with the platform started
  as in production (the Dagster daemon and one ``stream_changes`` launch); the time until
  pyiceberg reads every target equal to its source (goals: 100 x 2,000 <= 60 s, 1,000 x 1,000
  <= 5 min), the snapshot runs, the applier's merges and the machine's load.
* cluster (``bench/cluster.py``; ``make bench-cluster`` alone): the lake's Spark work on
  ``local[2]`` and on a standalone cluster of 2 workers x 1 core on this machine: a 1M-row
  initial load, a merge of 100k changes, a reconcile, by Spark and (load, merge) without Spark
  in the driver, with the tasks each worker's executors ran.
* code-location (``bench/code_location.py``): the code location's load time with 1 source and 20
  sources of 50 tables each, and 1 source of 1,000 tables (schemas are discovered from the
  sources at load; goal with 1,000 tables: <= 5 s), with the machine's load.

* on S3 (``--s3``, the default; ``--no-s3`` to skip): the bench starts a SeaweedFS
  (``bench/_s3.py``) and prints, beside the local figures, the streaming engine's rows/s into an
  s3:// landing zone (and its ratio to the local engine), the snapshot's rows/s into one (idle
  and under the write load), the lake-many soak's first case, and the e2e soak at the highest
  ``--e2e-rates`` with the landing
  zone and the lake on it (the target in its Iceberg REST catalog, read by pyiceberg through
  the catalog). Same machine: the S3 server's CPU is part of each figure.

``--only`` takes a comma-separated list of sections (``--only e2e,initial-load``); try the
living-lake sections briefly with ``--only e2e --e2e-seconds 30 --e2e-rates 1000``.

Numbers drift between machines; the ratios are what to compare. Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import queue
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench._engine import engine_peak_rss, run_engine
from bench._s3 import BenchS3
from bench._tables import SNAPSHOT_COLUMNS, SNAPSHOT_DB, SNAPSHOT_TABLE, fill_snapshot_table
from cdc_platform.capture.engine import EngineOptions
from cdc_platform.capture.landing.records import segment_schema
from cdc_platform.capture.landing.zone import Checkpoint, LandingZone
from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.capture.source import TableSelector
from cdc_platform.config import S3Settings
from cdc_platform.devservices.mariadb import MariaDBServer, gtid_position_covers


def _write_binlog(server: MariaDBServer, rows: int) -> str:
    """Inserts in 1000-row transactions, then updates of a third: a realistic row mix."""
    with server.root_connect() as conn, conn.cursor() as cur:
        cur.execute("CREATE DATABASE bench")
        cur.execute("CREATE TABLE bench.orders (id BIGINT PRIMARY KEY, customer INT, "
                    "amount DECIMAL(10,2), status VARCHAR(16), note VARCHAR(64), "
                    "created DATETIME(6))")
        rng = random.Random(1)
        for start in range(0, rows, 1000):
            values = [(i, rng.randint(1, 5000), rng.randint(100, 99999) / 100, "new",
                       f"note {i}", "2025-01-01 10:00:00.123456")
                      for i in range(start + 1, min(rows, start + 1000) + 1)]
            cur.executemany("INSERT INTO bench.orders VALUES (%s,%s,%s,%s,%s,%s)", values)
            conn.commit()
        for start in range(0, rows, 3000):
            cur.execute("UPDATE bench.orders SET status = 'paid' WHERE id BETWEEN %s AND %s",
                        (start + 1, start + 1000))
            conn.commit()
        cur.execute("SELECT @@GLOBAL.gtid_binlog_pos")
        return cur.fetchone()[0]


def _bare_loop(server: MariaDBServer, final_gtid: str) -> tuple[int, float]:
    """The baseline: mysql-replication alone, decoding every row, nothing else."""
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.event import MariadbGtidEvent, XidEvent
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    settings = server.connection_settings()
    settings["passwd"] = settings.pop("password")
    stream = BinLogStreamReader(
        connection_settings=settings, server_id=7001, blocking=True, is_mariadb=True,
        auto_position="", slave_heartbeat=1, enable_logging=False,
        only_events=[MariadbGtidEvent, XidEvent, WriteRowsEvent, UpdateRowsEvent,
                     DeleteRowsEvent])
    rows, current, started = 0, "", time.perf_counter()
    try:
        for event in stream:
            if isinstance(event, MariadbGtidEvent):
                current = event.gtid
            elif isinstance(event, XidEvent):
                if current == final_gtid:
                    break
            else:
                rows += len(event.rows)
    finally:
        stream.close()
    return rows, time.perf_counter() - started


def _native_binlog_decoder(server: MariaDBServer) -> float:
    """The native baseline: seconds the C client ``mariadb-binlog`` takes to read every binlog
    file from the server and decode its rows (``--verbose``) to /dev/null."""
    with server.root_connect() as conn, conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        files = [row[0] for row in cur.fetchall()]
    settings = server.connection_settings()
    command = [_client_binary("mariadb-binlog"), "--no-defaults", "--read-from-remote-server",
               "--verbose", f"--host={settings['host']}", f"--port={settings['port']}",
               f"--user={settings['user']}", f"--password={settings['password']}", *files]
    return _timed(command)


def _client_binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"the native baseline needs {name!r} (Debian's mariadb-client, "
                           "installed by scripts/bootstrap.sh)")
    return found


def _timed(command: list[str]) -> float:
    """Run a native client with its output to /dev/null; its wall-clock seconds."""
    started = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True)
    return time.perf_counter() - started


def _engine(server: MariaDBServer, landing: Path | str, s3: S3Settings | None = None
            ) -> tuple[int, float, int]:
    """The capture engine in a fresh process until caught up: (records, seconds, peak RSS).
    ``landing``: a directory, or an s3:// URL with its ``s3`` options."""
    options = EngineOptions(
        server_name="bench", flavour="mariadb", server_id=7002,
        connection_settings=server.connection_settings(),
        # (the end of the binlog is told by the heartbeat that follows it: a short one, so
        # that the figure is the engine's throughput, not up to a second of waiting for it)
        selector=TableSelector(include=(r"bench\..*",)), heartbeat_seconds=0.1)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=engine_peak_rss, args=(options, str(landing), "bench", results,
                                                          s3))
    child.start()
    records, seconds, _, peak = results.get()
    child.join()
    return records, seconds, peak


def _mb(size: int) -> str:
    return f"{size / 2**20:,.0f} MB"


def bench_streaming(rows: int, work: Path, s3: BenchS3 | None = None) -> None:
    print(f"\n## streaming: {rows:,} inserted rows + updates, one binlog, same machine"
          + ("; the engine again to an S3 landing zone (SeaweedFS, same machine)" if s3 else ""))
    server = MariaDBServer(base_dir=work / "mariadb", server_id=1)
    server.start()
    try:
        final = _write_binlog(server, rows)
        native_s = _native_binlog_decoder(server)
        bare_rows, bare_s = _bare_loop(server, final)
        engine_rows, engine_s, engine_rss = _engine(server, work / "landing")
        on_s3 = (_engine(server, s3.landing_url("bench-streaming"), s3.options())
                 if s3 is not None else None)
    finally:
        server.stop()
    bare_rate, engine_rate = bare_rows / bare_s, engine_rows / engine_s
    native_rate = bare_rows / native_s  # the same binlog: the same rows
    print(f"native mariadb-binlog -v:    {bare_rows:>9,} rows in {native_s:6.2f}s = "
          f"{native_rate:>9,.0f} rows/s")
    print(f"bare mysql-replication loop: {bare_rows:>9,} rows in {bare_s:6.2f}s = "
          f"{bare_rate:>9,.0f} rows/s")
    print(f"capture engine (to Parquet): {engine_rows:>9,} rows in {engine_s:6.2f}s = "
          f"{engine_rate:>9,.0f} rows/s; engine peak RSS {_mb(engine_rss)}")
    print(f"ratio engine/native: {engine_rate / native_rate:.2f}  (goal >= 0.50; and >= 60,000 "
          f"rows/s: {engine_rate:,.0f})")
    print(f"ratio engine/bare: {engine_rate / bare_rate:.2f}  (goal >= 0.80)")
    if on_s3 is not None:
        s3_rows, s3_s, s3_rss = on_s3
        s3_rate = s3_rows / s3_s
        print(f"capture engine (to S3):      {s3_rows:>9,} rows in {s3_s:6.2f}s = "
              f"{s3_rate:>9,.0f} rows/s; engine peak RSS {_mb(s3_rss)}")
        print(f"ratio engine on S3/local: {s3_rate / engine_rate:.2f}; on S3/bare: "
              f"{s3_rate / bare_rate:.2f}")


def _segment(schema: TableSchema, ids: list[int], ops: list[str], first_pos: int) -> pa.Table:
    n = len(ids)
    rng = random.Random(first_pos)
    columns = {
        "__cdc_pos": list(range(first_pos, first_pos + n)),
        "__cdc_gtid": [f"0-1-{first_pos + i}" for i in range(n)],
        "__cdc_op": ops,
        "__cdc_ts_ms": [0] * n,
        "id": ids,
        "customer": [rng.randint(1, 5000) for _ in range(n)],
        "status": ["paid" if op == "u" else "new" for op in ops],
    }
    return pa.Table.from_pydict(columns, schema=segment_schema(schema))


def _change_batch(rng: random.Random, size: int, batch: int, next_id: int
                  ) -> tuple[list[int], list[str]]:
    """60% updates and 20% deletes of random existing keys, 20% inserts of new keys."""
    ops = [("u" if r < 0.6 else "d" if r < 0.8 else "c") for r in
           (rng.random() for _ in range(batch))]
    ids = [next_id + k if op == "c" else rng.randint(1, size) for k, op in enumerate(ops)]
    return ids, ops


def bench_lake_merge(sizes: list[int], batch: int, work: Path, repeats: int = 3) -> None:
    """One materialisation (one Iceberg MERGE, merge-on-read) of a fixed batch into tables of
    each size; then the table's maintenance (compaction and snapshot expiry), timed apart."""
    from datetime import datetime

    from cdc_platform.lake.iceberg.lake import Lake
    from cdc_platform.lake.iceberg.maintenance import maintain
    from cdc_platform.lake.iceberg.table import LakeTable
    from cdc_platform.lake.merge import materialise
    from cdc_platform.lake.spark import build_spark_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = build_spark_session(conf={"spark.driver.memory": "3g"})
    schema = TableSchema("bench", "orders", (ColumnSpec("id", "int"),
                                             ColumnSpec("customer", "int"),
                                             ColumnSpec("status", "string")), ("id",))
    print(f"\n## lake merge (Iceberg MERGE, merge-on-read): a fixed {batch:,}-change batch (60% "
          f"updates, 20% deletes, 20% inserts) into targets of two sizes; median of {repeats} "
          "materialisations")
    timings: dict[int, float] = {}
    warm_up = min(sizes) // 10
    for size in [warm_up, *sizes]:  # the first, small table only warms the JVM up
        root = work / f"lake-{size}"
        landing_url, warehouse = str(root / "landing"), str(root / "warehouse")
        landing = LandingZone(landing_url, "bench")
        rng = random.Random(size)
        pos = 1
        for start in range(0, size, 100_000):
            ids = list(range(start + 1, min(size, start + 100_000) + 1))
            landing.write_segment(schema, _segment(schema, ids, ["c"] * len(ids), pos), pos,
                                  pos + len(ids) - 1)
            pos += len(ids)
        landing.write_checkpoint(Checkpoint("bench", "mariadb", "0-1-1", pos))
        materialise(spark, landing_url, warehouse, "bench", schema, "bench", "orders")
        merges = []
        for repeat in range(repeats):
            ids, ops = _change_batch(rng, size, batch, size + 1 + repeat * batch)
            landing.write_segment(schema, _segment(schema, ids, ops, pos), pos, pos + batch - 1)
            pos += batch
            landing.write_checkpoint(Checkpoint("bench", "mariadb", f"0-1-{repeat + 2}", pos))
            started = time.perf_counter()
            result = materialise(spark, landing_url, warehouse, "bench", schema, "bench",
                                 "orders")
            merges.append(time.perf_counter() - started)
        timings[size] = sorted(merges)[len(merges) // 2]
        table = LakeTable(Lake(spark, warehouse), "bench", "bench", "orders")
        started = time.perf_counter()
        report = maintain(table, older_than=datetime.now(), retain_last=1)
        maintenance = time.perf_counter() - started
        if size == warm_up:
            continue
        files = result.snapshot.metadata() if result.snapshot is not None else {}
        print(f"target {size:>10,} rows: merge {timings[size]:6.2f}s (median; rows after "
              f"{result.rows:,}, {files.get('data_files', 0)} data + "
              f"{files.get('delete_files', 0)} delete files); maintenance {maintenance:6.2f}s "
              f"({report.get('rewritten_data_files_count', 0)} data files rewritten, "
              f"{report.get('expired_snapshots', 0)} snapshots expired)")
    small, large = sizes[0], sizes[-1]
    print(f"merge time ratio {timings[large] / timings[small]:.2f} for a {large // small}x "
          "larger table (sub-linear: well below the size ratio)")


def bench_freshness(work: Path, rate: float = 5000.0, seconds: float = 10.0) -> None:
    """Commit-to-landing lag under a steady write rate: client commit time -> segment on disk."""
    import pyarrow.parquet as pq

    flush = EngineOptions.__dataclass_fields__["flush_interval_seconds"].default
    print(f"\n## freshness: {rate:,.0f} single-row commits/s for {seconds:.0f}s, default "
          f"flush interval ({flush:g}s)")
    server = MariaDBServer(base_dir=work / "mariadb-fresh", server_id=1)
    server.start()
    try:
        server.query("CREATE DATABASE fresh")
        server.query("CREATE TABLE fresh.ticks (id INT PRIMARY KEY, v INT)")
        options = EngineOptions(
            server_name="fresh", flavour="mariadb", server_id=7003,
            connection_settings=server.connection_settings(),
            selector=TableSelector(include=(r"fresh\..*",)))
        landing = LandingZone(str(work / "landing-fresh"), "fresh")
        committed: dict[int, float] = {}
        with _EngineProcess(server, landing, options) as engine, \
                server.root_connect() as conn, conn.cursor() as cur:
            interval, started = 1.0 / rate, time.monotonic()
            next_at = started
            for i in range(int(rate * seconds)):
                cur.execute("INSERT INTO fresh.ticks VALUES (%s, 0)", (i,))
                committed[i] = time.time()
                next_at += interval
                delay = next_at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            achieved = len(committed) / (time.monotonic() - started)
            cur.execute("SELECT @@GLOBAL.gtid_binlog_pos")
            final = cur.fetchone()[0]
            engine.wait_for(final)
        engine_rss = engine.peak_rss
    finally:
        server.stop()
    lags = []
    for _, _, path in landing.segments("fresh", "ticks"):
        landed = path.stat().st_mtime
        lags += [landed - committed[i] for i in pq.read_table(path, columns=["id"])[0].to_pylist()]
    lags.sort()

    def pct(p: float) -> float:
        return lags[min(len(lags) - 1, int(p * len(lags)))]

    print(f"{len(lags):,} rows landed ({achieved:,.0f} commits/s achieved); lag p50 "
          f"{pct(0.5):.2f}s, p95 {pct(0.95):.2f}s, p99 {pct(0.99):.2f}s, max {lags[-1]:.2f}s "
          f"(goal p99 <= {flush + 0.1:.1f}s); engine peak RSS {_mb(engine_rss)}")


# ---- snapshot ----------------------------------------------------------------------------------

def _bare_keyset_loop(server: MariaDBServer, chunk_size: int) -> tuple[int, float]:
    """The baseline: a plain pymysql keyset loop over the whole table, every row fetched."""
    import pymysql

    sql = (f"SELECT {SNAPSHOT_COLUMNS} FROM {SNAPSHOT_DB}.{SNAPSHOT_TABLE} WHERE id > %s "
           f"ORDER BY id LIMIT {chunk_size}")
    rows, last, started = 0, 0, time.perf_counter()
    with pymysql.connect(**server.connection_settings(), autocommit=True) as conn, \
            conn.cursor() as cur:
        while True:
            cur.execute(sql, (last,))
            batch = cur.fetchall()
            if not batch:
                break
            rows += len(batch)
            last = batch[-1][0]
    return rows, time.perf_counter() - started


class _EngineProcess:
    """The capture engine in a process of its own, as the stream_changes run is in production
    (the snapshot run is another process); stopped on exit, when it reports its peak RSS."""

    def __init__(self, server: MariaDBServer, landing: LandingZone,
                 options: EngineOptions | int, landing_url: str | None = None,
                 s3: S3Settings | None = None) -> None:
        if isinstance(options, int):  # a server id: the snapshot benchmark's engine
            options = EngineOptions(
                server_name=landing.server_name, flavour="mariadb", server_id=options,
                connection_settings=server.connection_settings(),
                selector=TableSelector(include=(rf"{SNAPSHOT_DB}\..*",)))
        context = multiprocessing.get_context("spawn")
        self.landing = landing
        self.stop = context.Event()
        self.results = context.Queue()
        self.peak_rss = 0
        self.process = context.Process(
            target=run_engine, args=(options, landing_url or str(landing.root.parent),
                                     landing.server_name, self.stop, self.results, s3),
            name="bench-engine", daemon=True)

    def __enter__(self) -> _EngineProcess:
        self.process.start()
        # Streaming before the snapshot starts, as a long-running engine is: its first
        # checkpoint says so.
        deadline = time.monotonic() + 120
        while self.landing.read_checkpoint() is None:
            if not self.process.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the capture engine process did not start streaming")
            time.sleep(0.1)
        return self

    def wait_for(self, gtid_position: str, timeout: float = 120.0) -> None:
        """Until the engine's checkpoint covers ``gtid_position`` (everything landed)."""
        deadline = time.monotonic() + timeout
        while True:
            checkpoint = self.landing.read_checkpoint()
            if checkpoint is not None and gtid_position_covers(checkpoint.gtid, gtid_position):
                return
            if not self.process.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the capture engine did not reach {gtid_position}")
            time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        with contextlib.suppress(queue.Empty):
            _, self.peak_rss = self.results.get(timeout=60)
        self.process.join(60)
        if self.process.exitcode not in (0, None) and exc[0] is None:
            raise RuntimeError(f"the capture engine process failed (exit code "
                               f"{self.process.exitcode})")


class _WriteLoad:
    """Paced single-row autocommit changes on the snapshotted table, on its own connection:
    60% updates and 20% deletes of random keys, 20% inserts (deleted keys back, else new ones)."""

    def __init__(self, server: MariaDBServer, rows: int, rate: float) -> None:
        self.server, self.rows, self.rate = server, rows, rate
        self.stop = threading.Event()
        self.changes = 0
        self.seconds = 0.0
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, name="bench-writes", daemon=True)

    def _run(self) -> None:
        table = f"{SNAPSHOT_DB}.{SNAPSHOT_TABLE}"
        rng = random.Random(5)
        deleted: list[int] = []
        next_id = self.rows + 1
        try:
            with self.server.root_connect() as conn, conn.cursor() as cur:
                interval = 1.0 / self.rate
                started = next_at = time.monotonic()
                while not self.stop.is_set():
                    r = rng.random()
                    if r < 0.6:
                        cur.execute(f"UPDATE {table} SET status = %s, price = price + 1 "
                                    "WHERE id = %s", (rng.choice(("paid", "shipped", "late")),
                                                      rng.randint(1, self.rows)))
                    elif r < 0.8:
                        key = rng.randint(1, self.rows)
                        if cur.execute(f"DELETE FROM {table} WHERE id = %s", (key,)):
                            deleted.append(key)
                    else:
                        if deleted:
                            key = deleted.pop(rng.randrange(len(deleted)))
                        else:
                            key, next_id = next_id, next_id + 1
                        cur.execute(f"INSERT INTO {table} VALUES (%s, %s, 1.00, 'new', "
                                    "NOW(6))", (key, f"added {key}"))
                    self.changes += 1
                    next_at += interval
                    self.stop.wait(max(0.0, next_at - time.monotonic()))
                self.seconds = time.monotonic() - started
        except BaseException as error:  # noqa: BLE001 - reported by the bench
            self.errors.append(error)

    def __enter__(self) -> _WriteLoad:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)

    @property
    def achieved_rate(self) -> float:
        return self.changes / self.seconds if self.seconds > 0 else 0.0


def _snapshot_once(server: MariaDBServer, landing_dir: Path | str, server_id: int,
                   load_rate: float | None, s3: S3Settings | None = None
                   ) -> tuple[Any, _WriteLoad | None, int]:
    """One snapshot of the table by the real reader and engine, with the default chunk size;
    under a concurrent write load when ``load_rate`` is given. Also the engine's peak RSS.
    ``landing_dir``: a directory, or an s3:// URL with its ``s3`` options."""
    from cdc_platform.capture import source as source_sql
    from cdc_platform.capture.snapshot.reading.reader import SnapshotReader

    landing = LandingZone(str(landing_dir), "snap", s3=s3)
    selector = TableSelector(include=(rf"{SNAPSHOT_DB}\..*",))
    settings = server.connection_settings()
    with source_sql.source_connection(settings) as conn:
        schema = selector.shape(source_sql.read_table_schema(conn, SNAPSHOT_DB, SNAPSHOT_TABLE))
    reader = SnapshotReader(landing, settings, "mariadb", schema, selector=selector)
    load = _WriteLoad(server, _max_id(server), load_rate) if load_rate else None
    engine = _EngineProcess(server, landing, server_id, str(landing_dir), s3)
    with engine:
        if load is None:
            result = reader.run()
        else:
            with load:
                result = reader.run()
            if load.errors:
                raise load.errors[0]
    return result, load, engine.peak_rss


def _max_id(server: MariaDBServer) -> int:
    return int(server.query(f"SELECT MAX(id) FROM {SNAPSHOT_DB}.{SNAPSHOT_TABLE}")[0][0])


def _native_select(server: MariaDBServer) -> float:
    """The native baseline: seconds the C client takes to stream the whole table to
    /dev/null (``--quick``: row by row, as a snapshot reads)."""
    settings = server.connection_settings()
    return _timed([
        _client_binary("mariadb"), "--no-defaults", "--quick", "--batch",
        f"--host={settings['host']}", f"--port={settings['port']}", f"--user={settings['user']}",
        f"--password={settings['password']}",
        "-e", f"SELECT {SNAPSHOT_COLUMNS} FROM {SNAPSHOT_DB}.{SNAPSHOT_TABLE}"])


def bench_snapshot(rows: int, write_rate: float, work: Path, s3: BenchS3 | None = None
                   ) -> None:
    from cdc_platform.capture.landing.session_records import DEFAULT_CHUNK_SIZE

    print(f"\n## snapshot: {rows:,}-row table, chunk size {DEFAULT_CHUNK_SIZE}, reader + capture "
          "engine (chunks -> Parquet changelog + checkpoint), same machine")
    server = MariaDBServer(base_dir=work / "mariadb-snap", server_id=1,
                           innodb_buffer_pool_size="1G")
    server.start()
    try:
        started = time.perf_counter()
        fill_snapshot_table(server, rows)
        print(f"table filled in {time.perf_counter() - started:.1f}s")
        native_s = _native_select(server)
        bare_rows, bare_s = _bare_keyset_loop(server, DEFAULT_CHUNK_SIZE)
        idle, _, idle_rss = _snapshot_once(server, work / "landing-snap-idle", 7004, None)
        loaded, load, loaded_rss = _snapshot_once(server, work / "landing-snap-load", 7005,
                                                  write_rate)
        on_s3 = []
        if s3 is not None:
            on_s3.append(_snapshot_once(server, s3.landing_url("bench-snap-idle"), 7006, None,
                                        s3.options()))
            on_s3.append(_snapshot_once(server, s3.landing_url("bench-snap-load"), 7007,
                                        write_rate, s3.options()))
        again_s = _native_select(server)
    finally:
        server.stop()
    assert load is not None
    native_rate = (rows / native_s + rows / again_s) / 2
    print(f"native mariadb --quick:     {rows:>9,} rows in {native_s:6.2f}s = "
          f"{rows / native_s:>9,.0f} rows/s (again after the snapshots: "
          f"{rows / again_s:,.0f} rows/s; ratios use the mean, {native_rate:,.0f})")
    print(f"bare pymysql keyset loop:   {bare_rows:>9,} rows in {bare_s:6.2f}s = "
          f"{bare_rows / bare_s:>9,.0f} rows/s")
    runs = [("snapshot, no writes:", idle, idle_rss),
            (f"snapshot, {write_rate:.0f} writes/s:", loaded, loaded_rss)]
    if on_s3:
        runs += [("snapshot to S3, no writes:", on_s3[0][0], on_s3[0][2]),
                 (f"snapshot to S3, {write_rate:.0f} w/s:", on_s3[1][0], on_s3[1][2])]
    for label, result, rss in runs:
        rate = result.rows / result.duration_seconds
        print(f"{label:<27} {result.rows:>9,} rows in {result.duration_seconds:6.2f}s = "
              f"{rate:>9,.0f} rows/s; {result.chunks} chunks, {result.rejected} rejected, "
              f"{result.rows_emitted:,} rows landed ({result.status}); engine peak RSS "
              f"{_mb(rss)}")
    print(f"write load: {load.changes:,} changes in {load.seconds:.1f}s = "
          f"{load.achieved_rate:,.0f} changes/s achieved (target {write_rate:.0f})")
    print(f"ratio snapshot/native: {idle.rows_per_second / native_rate:.2f}  (goal >= 0.50; "
          f"and >= 200,000 rows/s: {idle.rows_per_second:,.0f})")
    print(f"ratio snapshot/bare keyset loop: {idle.rows_per_second / (bare_rows / bare_s):.2f}")
    print(f"ratio snapshot under writes/idle: "
          f"{loaded.rows_per_second / idle.rows_per_second:.2f}  (goal >= 0.70)")
    if on_s3:
        s3_idle, s3_loaded = on_s3[0][0], on_s3[1][0]
        print(f"ratio snapshot on S3/local: {s3_idle.rows_per_second / idle.rows_per_second:.2f}"
              f" (no writes), {s3_loaded.rows_per_second / loaded.rows_per_second:.2f} (under "
              f"writes); on S3 under writes/idle: "
              f"{s3_loaded.rows_per_second / s3_idle.rows_per_second:.2f}")


def bench_large_transaction(rows: int, work: Path) -> None:
    memory = EngineOptions.__dataclass_fields__["transaction_memory_bytes"].default
    print(f"\n## large transaction: one {rows:,}-row INSERT ... SELECT (4 columns), "
          f"capture.transaction_memory_bytes {memory / 2**20:.0f} MiB")
    server = MariaDBServer(base_dir=work / "mariadb-large", server_id=1)
    server.start()
    try:
        server.query("CREATE DATABASE bench_large")
        server.query("CREATE TABLE bench_large.t (id INT PRIMARY KEY, a INT, b VARCHAR(32), "
                     "c DATETIME)")
        start = server.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0] or ""
        with server.root_connect(database="bench_large") as conn, conn.cursor() as cur:
            cur.execute(f"INSERT INTO t SELECT seq, seq * 7, CONCAT('row number ', seq), "
                        f"'2025-01-01 00:00:00' + INTERVAL seq SECOND FROM seq_1_to_{rows}")
        options = EngineOptions(
            server_name="large", flavour="mariadb", server_id=7003,
            connection_settings=server.connection_settings(),
            selector=TableSelector(include=(r"bench_large\..*",)), heartbeat_seconds=1.0,
            initial_position=start)
        context = multiprocessing.get_context("spawn")
        results = context.Queue()
        child = context.Process(target=engine_peak_rss,
                                args=(options, str(work / "landing-large"), "large", results))
        child.start()
        records, seconds, before, peak = results.get()
        child.join()
    finally:
        server.stop()
    print(f"engine: {records:,} records in {seconds:.1f}s; RSS {before / 2**20:.0f} MB before, "
          f"peak {peak / 2**20:.0f} MB (engine peak RSS during a {rows:,}-row single-statement "
          "transaction)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    # (600k inserts + 200k updates: at the engine's rate, its fixed start costs, such as
    # connecting and reading schemas, stay a small part of the figure)
    parser.add_argument("--stream-rows", type=int, default=600_000)
    parser.add_argument("--lake-sizes", default="100000,1000000")
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--topics-rows", type=int, default=200_000,
                        help="landed records the change-topic publisher sends (default 200,000)")
    parser.add_argument("--snapshot-rows", type=int,
                        default=int(os.environ.get("BENCH_SNAPSHOT_ROWS", "1000000")),
                        help="rows of the snapshotted table (env BENCH_SNAPSHOT_ROWS; "
                        "default 1,000,000)")
    parser.add_argument("--snapshot-write-rate", type=float, default=500.0,
                        help="changes/s of the concurrent write load (default 500)")
    parser.add_argument("--freshness-rate", type=float, default=5000.0,
                        help="single-row commits/s of the freshness write load (default 5000)")
    parser.add_argument("--large-transaction-rows", type=int, default=1_000_000)
    parser.add_argument("--e2e-rates", default="1000,5000",
                        help="e2e: single-row commits/s of each soak (default 1000,5000)")
    parser.add_argument("--e2e-seconds", type=float, default=300.0,
                        help="e2e: how long each soak writes (default 300)")
    parser.add_argument("--e2e-writers", type=int, default=4,
                        help="e2e: writer processes sharing the rate (default 4)")
    parser.add_argument("--e2e-retention-hours", type=float, default=0.0,
                        help="e2e: landing_zone.retention_hours (default 0: consumed segments "
                        "go at the next sweep; -1: the platform's default)")
    parser.add_argument("--lake-many", default="100x2000x200,1000x500x500",
                        help="lake-many cases: TABLESxROWSxCOMMITS_PER_SECOND, comma-separated "
                        "(the first also on S3 with --s3)")
    parser.add_argument("--lake-many-seconds", type=float, default=180.0,
                        help="lake-many: the write load's duration")
    parser.add_argument("--initial-load-rows", type=int, default=1_000_000)
    parser.add_argument("--many-tables", default="100x2000,1000x1000",
                        help="initial-load-many: TABLESxROWS cases (default 100x2000,1000x1000)")
    parser.add_argument("--cluster-rows", type=int, default=1_000_000,
                        help="cluster: the initial load's rows (default 1,000,000)")
    parser.add_argument("--cluster-changes", type=int, default=100_000,
                        help="cluster: the merged changes (default 100,000)")
    parser.add_argument("--only", type=_sections,
                        help=f"comma-separated sections to run: {', '.join(SECTIONS)}")
    parser.add_argument("--s3", action=argparse.BooleanOptionalAction, default=True,
                        help="also run streaming, snapshot and e2e with the landing zone (and "
                        "e2e's lake) on a SeaweedFS the bench starts; --no-s3: local only "
                        "(default: on)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (servers' data, logs, landing zones)")
    args = parser.parse_args()
    only = args.only or SECTIONS
    if args.keep:
        work = Path(tempfile.mkdtemp(prefix="cdc-bench-"))
        print(f"(work directory kept: {work})")
        _run(args, only, work)
    else:
        with tempfile.TemporaryDirectory(prefix="cdc-bench-") as tmp:
            _run(args, only, Path(tmp))
    return 0


def _run(args: argparse.Namespace, only: tuple[str, ...], work: Path) -> None:
    if args.s3 and set(only) & set(S3_SECTIONS):
        from bench._s3 import seaweedfs

        with seaweedfs(work) as s3:
            _run_sections(args, only, work, s3)
    else:
        _run_sections(args, only, work, None)


def _run_sections(args: argparse.Namespace, only: tuple[str, ...], work: Path,
                  s3: BenchS3 | None) -> None:
    if "streaming" in only:
        bench_streaming(args.stream_rows, work, s3)
    if "freshness" in only:
        bench_freshness(work, args.freshness_rate)
    if "lake" in only:
        bench_lake_merge([int(s) for s in args.lake_sizes.split(",")], args.batch, work)
    if "snapshot" in only:
        bench_snapshot(args.snapshot_rows, args.snapshot_write_rate, work, s3)
    if "large_transaction" in only:
        bench_large_transaction(args.large_transaction_rows, work)
    if "e2e" in only:
        from bench.lake_e2e import bench_e2e

        retention = None if args.e2e_retention_hours < 0 else args.e2e_retention_hours
        rates = [float(r) for r in args.e2e_rates.split(",")]
        for rate in rates:
            bench_e2e(rate, args.e2e_seconds, args.e2e_writers, retention, work)
        if s3 is not None:  # (at the highest rate only: a soak costs minutes)
            bench_e2e(max(rates), args.e2e_seconds, args.e2e_writers, retention, work, s3)
    if "lake-many" in only:
        from bench.lake_many import bench_many

        cases = [tuple(float(n) for n in case.lower().split("x"))
                 for case in args.lake_many.split(",")]
        for tables, rows, rate in cases:
            bench_many(int(tables), int(rows), rate, args.lake_many_seconds, 2, work)
            # (again as in production: the Dagster daemon, one stream_changes launch)
            bench_many(int(tables), int(rows), rate, args.lake_many_seconds, 2, work,
                       dagster=True)
        if s3 is not None:  # (the first case: a soak costs minutes)
            tables, rows, rate = cases[0]
            bench_many(int(tables), int(rows), rate, args.lake_many_seconds, 2, work, s3)
    if "initial-load" in only:
        from bench.initial_load import bench_initial_load

        bench_initial_load(args.initial_load_rows, work)
    if "initial-load-many" in only:
        from bench.initial_load_many import bench_initial_load_many

        for case in args.many_tables.split(","):
            tables, rows = (int(n) for n in case.lower().split("x"))
            bench_initial_load_many(tables, rows, work)
    if "code-location" in only:
        from bench.code_location import bench_code_location

        bench_code_location(work)
    if "topics" in only:
        from bench.topics import bench_topics

        bench_topics(args.topics_rows, work)
    if "cluster" in only:
        from bench.cluster import bench_cluster

        bench_cluster(args.cluster_rows, args.cluster_changes, work)


SECTIONS = ("streaming", "freshness", "lake", "snapshot", "large_transaction", "e2e",
            "lake-many", "initial-load", "initial-load-many", "code-location", "topics",
            "cluster")
# (with --s3: their rows on SeaweedFS too)
S3_SECTIONS = ("streaming", "snapshot", "e2e", "lake-many")


def _sections(text: str) -> tuple[str, ...]:
    names = tuple(n.strip().replace("initial_load", "initial-load").replace("_many", "-many")
                  .replace("lake_many", "lake-many")
                  .replace("code_location", "code-location") for n in text.split(","))
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown section(s) {', '.join(unknown)}; choose "
                                         f"from {', '.join(SECTIONS)}")
    return names


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    sys.exit(main())
