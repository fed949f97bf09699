"""Profile one snapshot (reader in this process, capture engine in its own) with cProfile.

``python -m bench.profile_snapshot --rows 300000 [--top 25]``: fills the bench's snapshot table,
runs the reader and the engine each under cProfile, prints the rate and each side's top entries
by own time (``tottime``) and the stats files' paths (``python -m pstats FILE`` for more).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import multiprocessing
import pstats
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import __main__ as bench
from bench._engine import run_engine
from cdc_platform.capture.engine import EngineOptions
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.source import TableSelector
from cdc_platform.devservices.mariadb import MariaDBServer


def _profiled_engine(options: EngineOptions, landing_url: str, server_name: str, stop: Any,
                     stats_path: str) -> None:
    profile = cProfile.Profile()
    profile.enable()
    try:
        run_engine(options, landing_url, server_name, stop)
    finally:
        profile.disable()
        profile.dump_stats(stats_path)


def top_entries(source: str | cProfile.Profile, count: int) -> str:
    """A profile's (a stats file's) ``count`` top entries by own time, with their header."""
    out = io.StringIO()
    pstats.Stats(source, stream=out).sort_stats("tottime").print_stats(count)
    lines = out.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if "ncalls" in line)
    return "\n".join(lines[start - 2:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--chunk-size", type=int, default=None,
                        help="rows per chunk (default: the reader's default)")
    parser.add_argument("--out", default=None, help="directory for the .prof files")
    args = parser.parse_args()
    from cdc_platform.capture import source as source_sql
    from cdc_platform.capture.snapshot.reading.reader import SnapshotReader

    with tempfile.TemporaryDirectory(prefix="cdc-prof-") as tmp:
        work = Path(tmp)
        out = Path(args.out) if args.out else work
        out.mkdir(parents=True, exist_ok=True)
        server = MariaDBServer(base_dir=work / "mariadb", server_id=1,
                               innodb_buffer_pool_size="1G")
        server.start()
        try:
            bench._fill_snapshot_table(server, args.rows)
            landing = LandingZone(str(work / "landing"), "snap")
            selector = TableSelector(include=(rf"{bench.SNAPSHOT_DB}\..*",))
            settings = server.connection_settings()
            with source_sql.source_connection(settings) as conn:
                schema = selector.shape(source_sql.read_table_schema(
                    conn, bench.SNAPSHOT_DB, bench.SNAPSHOT_TABLE))
            options = EngineOptions(server_name="snap", flavour="mariadb", server_id=7010,
                                    connection_settings=settings, selector=selector)
            context = multiprocessing.get_context("spawn")
            stop = context.Event()
            engine_stats = str(out / "engine.prof")
            process = context.Process(target=_profiled_engine, args=(
                options, str(landing.root.parent), "snap", stop, engine_stats))
            process.start()
            while landing.read_checkpoint() is None:
                time.sleep(0.1)
            sizing = {} if args.chunk_size is None else {"chunk_size": args.chunk_size}
            reader = SnapshotReader(landing, settings, "mariadb", schema, selector=selector,
                                    **sizing)
            profile = cProfile.Profile()
            profile.enable()
            result = reader.run()
            profile.disable()
            reader_stats = str(out / "reader.prof")
            profile.dump_stats(reader_stats)
            stop.set()
            process.join(60)
        finally:
            server.stop()
        print(f"{result.rows:,} rows in {result.duration_seconds:.2f}s = "
              f"{result.rows_per_second:,.0f} rows/s (under cProfile), {result.chunks} chunks")
        print(f"\n# reader ({reader_stats})\n{top_entries(reader_stats, args.top)}")
        print(f"\n# engine ({engine_stats})\n{top_entries(engine_stats, args.top)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
