"""The lake's lag when the changes are spread over many tables: does the applier's cost follow
the changes, not the number of tables that have some?

``tables`` tables ``mt.t000`` ... of ``rows`` rows each are created and filled through the
binlog; the capture engine (``python -m cdc_platform stream``) and the applier (``... apply``)
start, as processes of their own on one config file, every setting at its default, and the
soak begins once every target holds its rows. Writer processes then commit ``rate`` single-row
updates per second spread evenly over the tables (each row carrying its commit time,
``t_commit``), for ``seconds``. A sampler reads ``SAMPLED`` random targets every
``SAMPLE_SECONDS`` with pyiceberg, as a third-party reader, and takes ``now - max(t_commit)``:
how far behind the source the table a reader opens is (the issue's measure: a table written
twice a second is at most half a second behind by construction).

Printed beside the lag: the merges (how many, their duration: what a merge of a few records
costs), how many Spark merged, the passes' rhythm, the applier's CPU and peak RSS and the
machine's load. With ``s3`` the landing zone and the lake are on SeaweedFS (the REST catalog):
the per-table requests are what would hurt there. With ``dagster`` the platform runs as in
production instead (``initial_load_many.Platform``: the Dagster daemon with the run queue of
``helm/values.yaml`` and one ``dagster job launch -j stream_changes``; the applier is the
``apply_changes`` run its sensor launches); the merges are then counted from the targets'
materialisations, and the machine's load stands for the processes' own.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import re
import threading
import time
from pathlib import Path
from typing import Any

from bench._engine import rss_bytes
from bench._lake import (
    IcebergTail,
    RestIcebergTail,
    command_env,
    describe_percentiles,
    wait_until,
    write_config,
)
from bench._processes import CliProcess, cpu_seconds, system_busy_seconds
from bench._s3 import BenchS3
from bench.initial_load_many import Platform
from bench.lake_e2e import _client_connect, _logged_matches
from cdc_platform.devservices.mariadb import MariaDBServer

DATABASE = "mt"
SERVER_NAME = "many"
SAMPLED, SAMPLE_SECONDS = 4, 3.0
APPLIED_LINE = re.compile(r"^(\S+ \S+) INFO (.+): (\d+) records (merged|appended) in "
                          r"([\d.]+) s.*?(\(without Spark\))?$")
GOALS = {100: 15.0, 1000: 60.0}  # lake lag p99 goals (s) by table count (issue 37)


def table_name(index: int, tables: int) -> str:
    return f"t{index:0{max(3, len(str(tables - 1)))}d}"


def _fill(server: MariaDBServer, tables: int, rows: int) -> None:
    """The tables and their rows, through the binlog (the engine lands them as changes)."""
    server.query(f"CREATE DATABASE {DATABASE}")
    values = ", ".join(f"({k}, 0, 0, 'row {k}')" for k in range(rows))
    with server.root_connect(autocommit=True) as conn, conn.cursor() as cur:
        for i in range(tables):
            name = table_name(i, tables)
            cur.execute(f"CREATE TABLE {DATABASE}.{name} (id BIGINT PRIMARY KEY, "
                        "t_commit DOUBLE NOT NULL, seq BIGINT NOT NULL, note VARCHAR(32))")
            cur.execute(f"INSERT INTO {DATABASE}.{name} VALUES {values}")


def write_spread(settings: dict[str, Any], index: int, writers: int, tables: int, rows: int,
                 rate: float, start_at: float, seconds: float, results: Any) -> None:
    """One writer: ``rate`` single-row updates/s over the tables it owns (``index`` modulo
    ``writers``), round robin, each setting ``t_commit`` to its commit time."""
    conn = _client_connect(settings)
    cur = conn.cursor()
    rng = random.Random(index)
    owned = [table_name(i, tables) for i in range(index, tables, writers)]
    interval = 1.0 / rate
    commits = 0
    time.sleep(max(0.0, start_at - time.time()))
    next_at, end_at = start_at, start_at + seconds
    while (now := time.time()) < end_at:
        name = owned[commits % len(owned)]
        cur.execute(f"UPDATE {DATABASE}.{name} SET t_commit = %s, seq = seq + 1 WHERE id = %s",
                    (time.time(), rng.randrange(rows)))
        commits += 1
        next_at += interval
        delay = next_at - time.time()
        if delay > 0:
            time.sleep(delay)
        elif delay < -1.0:
            next_at = now
    conn.close()
    results.put((index, commits, time.time() - start_at))


class _Sampler:
    """Every SAMPLE_SECONDS: SAMPLED random targets read with pyiceberg, ``now - max(t_commit)``
    of each (the soak's commits only: a table not written yet in the soak is skipped)."""

    def __init__(self, tails: list[IcebergTail], since: float) -> None:
        self.tails, self.since = tails, since
        self.lags: list[float] = []
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self.rng = random.Random(7)

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                started = time.monotonic()
                for tail in self.rng.sample(self.tails, min(SAMPLED, len(self.tails))):
                    newest = max(tail.scan(("t_commit",)).column("t_commit").to_pylist(),
                                 default=0.0)
                    if newest >= self.since:
                        self.lags.append(time.time() - newest)
                self.stop.wait(max(0.0, SAMPLE_SECONDS - (time.monotonic() - started)))
        except BaseException as error:  # noqa: BLE001 - reported by the bench
            self.errors.append(error)

    def __enter__(self) -> _Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)


def _dagster_merges(platform: Platform, names: list[str], since: float, until: float
                    ) -> list[tuple[float, int, float, bool]]:
    """The merges the ``apply_changes`` run recorded between ``since`` and ``until``, as
    (time, records, seconds, without Spark) from the targets' materialisations."""
    import dagster as dg

    merges = []
    with platform.instance() as instance:
        for name in names:
            for record in instance.fetch_materializations(
                    dg.AssetKey([SERVER_NAME, DATABASE, name]), limit=10_000).records:
                if not since <= record.timestamp <= until:
                    continue
                meta = record.asset_materialization.metadata
                if "current" in meta:  # (the applier saying a quiet target is current)
                    continue
                merges.append((record.timestamp, int(meta["records_read"].value),
                               float(meta["duration_seconds"].value),
                               meta["written_by"].value != "spark"))
    return merges


def _applier_processes(platform: Platform) -> dict[str, int]:
    """The running ``apply_changes`` run's process and the child it merges in, by label."""
    import dagster as dg

    from cdc_platform.defs.lake.applier import APPLIER_TAG, CHILD_PID_TAG, PID_TAG

    with platform.instance() as instance:
        runs = instance.get_runs(filters=dg.RunsFilter(
            tags={APPLIER_TAG: SERVER_NAME}, statuses=[dg.DagsterRunStatus.STARTED]), limit=1)
    tags = runs[0].tags if runs else {}
    return {label: int(tags[tag]) for label, tag in
            (("run", PID_TAG), ("merges", CHILD_PID_TAG)) if tags.get(tag)}


def bench_many(tables: int, rows: int, rate: float, seconds: float, writers: int, work: Path,
               s3: BenchS3 | None = None, dagster: bool = False) -> dict[str, Any]:
    where = "ON S3 (SeaweedFS, REST catalog)" if s3 is not None else \
        "local landing zone and Hadoop-catalog warehouse"
    how = ("the Dagster daemon and one stream_changes launch (as in production)" if dagster
           else "engine and applier as processes")
    print(f"\n## lake lag over {tables:,} tables {where}: {rate:,.0f} single-row commits/s "
          f"spread evenly ({rate / tables:.2f} per table per second) for {seconds:.0f} s; "
          f"{how}, every setting at its default; {SAMPLED} random "
          f"targets read with pyiceberg every {SAMPLE_SECONDS:.0f} s, lag = now - max(t_commit)")
    root = work / f"many-{tables}{'-s3' if s3 is not None else ''}{'-dagster' if dagster else ''}"
    root.mkdir(parents=True)
    server = MariaDBServer(base_dir=root / "mariadb", server_id=1)
    server.start()
    processes: list[CliProcess] = []
    platform: Platform | None = None
    try:
        filled = time.time()
        _fill(server, tables, rows)
        print(f"source: {tables:,} tables of {rows:,} rows created and filled in "
              f"{time.time() - filled:.1f} s (through the binlog)")
        sections = s3.config_sections(f"many-{tables}") if s3 is not None else None
        extra = os.environ.get("BENCH_MANY_CAPTURE")  # (experiments: capture settings JSON)
        if extra:
            import json
            sections = {**(sections or {}), "capture": json.loads(extra)}
        config = write_config(root / "config.yaml", server, SERVER_NAME, 7301,
                              rf"{DATABASE}\..*", root, sections=sections)
        env = command_env(server)
        started = time.time()
        if dagster:
            platform = Platform(root, config, env)
            platform.start()
        else:
            processes.append(CliProcess("engine", ["stream", "--config", str(config)],
                                        root / "engine.log", env, root))
            processes.append(CliProcess("applier", ["apply", "--config", str(config)],
                                        root / "applier.log", env, root))
        names = [table_name(i, tables) for i in range(tables)]
        tails: list[IcebergTail] = [
            RestIcebergTail(s3.catalog(), SERVER_NAME, DATABASE, name) if s3 is not None
            else IcebergTail(root / "warehouse", SERVER_NAME, DATABASE, name) for name in names]

        def loaded() -> bool:
            for process in processes:
                if not process.alive():
                    raise process.fail("exited")
            if platform is not None:
                platform.check_alive()
            return all((current := tail.current()) is not None and current.rows == rows
                       for tail in tails)

        wait_until(f"every one of the {tables} targets holding its {rows} rows", loaded,
                   max(600.0, tables * 2.0), every=2.0)
        print(f"initial: every target equal to its {rows:,} rows {time.time() - started:.1f} s "
              f"after {'the daemon' if dagster else 'engine and applier'} started (merges of "
              "the binlog's inserts)")
        context = multiprocessing.get_context("spawn")
        results = context.Queue()
        settings = server.connection_settings(user="root")
        start_at = time.time() + 3.0
        children = [context.Process(target=write_spread, args=(
            settings, i, writers, tables, rows, rate / writers, start_at, seconds, results),
            name=f"bench-writer-{i}", daemon=True) for i in range(writers)]
        for child in children:
            child.start()
        time.sleep(max(0.0, start_at - time.time()))
        for process in processes:
            process.mark()
        applier_pids = _applier_processes(platform) if platform is not None else {}
        applier_cpu = {label: cpu_seconds(pid) for label, pid in applier_pids.items()}
        busy_before, soak_started = system_busy_seconds(), time.time()
        with _Sampler(tails, soak_started) as sampler:
            done = [results.get(timeout=seconds + 120) for _ in children]
            soak_ended = time.time()
        for child in children:
            child.join(30)
        busy = system_busy_seconds() - busy_before
        usage = {p.label: p.usage() for p in processes}
        applier_usage = {label: (cpu_seconds(pid) - applier_cpu[label], rss_bytes("VmHWM", pid))
                         for label, pid in applier_pids.items()}
        if sampler.errors:
            raise sampler.errors[0]
        if platform is not None:
            merges = _dagster_merges(platform, names, soak_started, soak_ended)
        else:
            merges = [(logged, int(m.group(3)), float(m.group(5)), m.group(6) is not None)
                      for logged, m in _logged_matches(processes[1].log_lines(), APPLIED_LINE,
                                                       soak_started, soak_ended)]
    finally:
        for process in reversed(processes):
            process.stop()
        if platform is not None:
            platform.stop()
        server.stop()

    soak = soak_ended - soak_started
    commits = sum(d[1] for d in done)
    durations = sorted(d for _, _, d, _ in merges)
    small = sorted(d for _, r, d, _ in merges if r <= 1000)
    spark = sum(1 for *_, free in merges if not free)
    goal = GOALS.get(tables)
    print(f"writers: {writers} processes, {commits:,} commits in {soak:.0f} s = "
          f"{commits / soak:,.0f}/s achieved (target {rate:,.0f})")
    print(f"  lake lag (now - max(t_commit) of a sampled target): "
          f"{describe_percentiles(sampler.lags)} over {len(sampler.lags)} samples"
          + (f" (goal p99 <= {goal:.0f} s)" if goal else ""))
    if merges:
        print(f"  merges: {len(merges):,} in {soak:.0f} s ({len(merges) / soak * 60:,.0f} a "
              f"minute, {len(merges) / tables:.1f} per table), {spark} by Spark; records per "
              f"merge mean {sum(r for _, r, _, _ in merges) / len(merges):.0f}")
        print(f"  merge duration: median {durations[len(durations) // 2] * 1000:.0f} ms, p99 "
              f"{durations[int(0.99 * (len(durations) - 1))] * 1000:.0f} ms; of merges of "
              f"<= 1,000 records: median "
              f"{small[len(small) // 2] * 1000 if small else float('nan'):.0f} ms "
              "(goal <= 100 ms)")
    if merges and usage:
        print(f"  applier CPU per merge (everything it did, retention and compaction "
              f"included): {usage['applier'].cpu_seconds / len(merges) * 1000:.0f} ms")
    for label, process_usage in usage.items():
        print(f"  {label:7} {process_usage.describe(soak)}")
    for label, (cpu, peak) in applier_usage.items():
        print(f"  apply_changes {label} process: CPU {cpu:,.1f} s ({cpu / soak:.2f} cores), "
              f"peak RSS {(peak or 0) / 2**20:,.0f} MB")
    if merges and "merges" in applier_usage:
        print(f"  applier CPU per merge (its merging process): "
              f"{applier_usage['merges'][0] / len(merges) * 1000:.0f} ms")
    print(f"machine: {busy / soak:.2f} of 2 cores busy during the soak")
    return {"lags": sampler.lags, "merges": merges,
            "applier_rss": usage["applier"].peak_rss if usage else None}


def run(cases: list[tuple[int, int, float]], seconds: float, writers: int, work: Path,
        s3: BenchS3 | None = None, dagster: bool = False) -> None:
    """``cases``: (tables, rows per table, commits/s)."""
    for tables, rows, rate in cases:
        bench_many(tables, rows, rate, seconds, writers, work, s3, dagster)


if __name__ == "__main__":  # (python -m bench.lake_many TABLES ROWS RATE SECONDS [--s3] [--dagster])
    import argparse
    import shutil
    import tempfile

    parser = argparse.ArgumentParser()
    parser.add_argument("tables", type=int)
    parser.add_argument("rows", type=int)
    parser.add_argument("rate", type=float)
    parser.add_argument("seconds", type=float)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--s3", action="store_true")
    parser.add_argument("--dagster", action="store_true",
                        help="the platform as in production: the daemon, one stream_changes")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parsed = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-many-")
    print(f"(work directory {tmp})")
    try:
        if parsed.s3:
            from bench._s3 import seaweedfs

            with seaweedfs(Path(tmp)) as bench_s3:
                bench_many(parsed.tables, parsed.rows, parsed.rate, parsed.seconds,
                           parsed.writers, Path(tmp), bench_s3, parsed.dagster)
        else:
            bench_many(parsed.tables, parsed.rows, parsed.rate, parsed.seconds,
                       parsed.writers, Path(tmp), dagster=parsed.dagster)
    finally:
        if not parsed.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    os._exit(0)
