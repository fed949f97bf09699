"""Time (and profile) the capture engine over the streaming benchmark's binlog.

``python -m bench.profile_streaming --rows 800000 [--repeat 3] [--profile] [--top 25]``:
writes the bench's binlog once (``bench._write_binlog``), then lands it ``--repeat`` times
with a fresh landing zone each time, the engine in this process with the bench's options,
and prints each run's rate and the median. With ``--profile`` one more run goes under
cProfile and its top entries by own time (``tottime``) are printed. The rates are those of
``make bench``'s streaming figure without the other baselines, for comparing changes.

``--single-row-commits N`` lands a binlog of N single-row autocommit changes instead (the e2e
bench's table and writers, half inserts and half updates, written as fast as they go): the
engine's cost per transaction rather than per row.
"""

from __future__ import annotations

import argparse
import cProfile
import multiprocessing
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench import __main__ as bench
from bench import lake_e2e
from bench.profile_snapshot import top_entries
from cdc_platform.capture.engine import CaptureEngine, EngineOptions
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.source import TableSelector
from cdc_platform.devservices.mariadb import MariaDBServer


def _land(options: EngineOptions, landing: Path, profile: cProfile.Profile | None = None
          ) -> tuple[int, float]:
    """One engine run until caught up into a fresh ``landing``: (records, seconds)."""
    shutil.rmtree(landing, ignore_errors=True)
    engine = CaptureEngine(options, LandingZone(str(landing), "bench"))
    started = time.perf_counter()
    if profile is not None:
        profile.enable()
    try:
        stats = engine.run(stop_when_caught_up=True)
    finally:
        if profile is not None:
            profile.disable()
    return stats.records, time.perf_counter() - started


def _write_single_row_commits(server: MariaDBServer, commits: int, writers: int = 4) -> None:
    """The e2e bench's writers, unpaced (a rate far above what they reach), until ``commits``."""
    server.query(f"CREATE DATABASE {lake_e2e.DATABASE}")
    server.query(lake_e2e.CREATE_TABLE)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    # (each writer: its share of the commits at an unreachable rate, for as long as it takes)
    rate, seconds = 1e6, commits / writers / 2500
    children = [context.Process(target=lake_e2e.write_changes, args=(
        server.connection_settings(user="root"), i, writers, rate, time.time() + 1.0, seconds,
        results), daemon=True) for i in range(writers)]
    for child in children:
        child.start()
    done = [results.get() for _ in children]
    written = sum(d[1] + d[2] for d in done)
    print(f"{written:,} single-row commits written in {max(d[3] for d in done):.1f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=800_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--single-row-commits", type=int, default=0,
                        help="land this many single-row commits instead of --rows")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cdc-prof-") as tmp:
        work = Path(tmp)
        server = MariaDBServer(base_dir=work / "mariadb", server_id=1)
        server.start()
        try:
            if args.single_row_commits:
                _write_single_row_commits(server, args.single_row_commits)
                include = rf"{lake_e2e.DATABASE}\..*"
            else:
                bench._write_binlog(server, args.rows)
                include = r"bench\..*"
            # The bench's options (bench.__main__._engine), in this process.
            options = EngineOptions(
                server_name="bench", flavour="mariadb", server_id=7002,
                connection_settings=server.connection_settings(),
                selector=TableSelector(include=(include,)), heartbeat_seconds=0.1)
            rates = []
            for run in range(args.repeat):
                records, seconds = _land(options, work / "landing")
                rates.append(records / seconds)
                print(f"run {run + 1}: {records:,} records in {seconds:.2f}s = "
                      f"{records / seconds:,.0f} rows/s", flush=True)
            if rates:
                print(f"median: {statistics.median(rates):,.0f} rows/s")
            if args.profile:
                profile = cProfile.Profile()
                records, seconds = _land(options, work / "landing", profile)
                print(f"\nunder cProfile: {records:,} records in {seconds:.2f}s\n"
                      f"{top_entries(profile, args.top)}")
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
