"""The code location's load time: 1 source of 50 tables, 20 sources of 50 tables each, and
1 source of 1,000 tables.

Loading lists each source's tables and reads their schemas from the source (schema discovery
happens at load time), so the time grows with sources x tables. One private MariaDB holds every
source's database (``src<i>``, 50 tables of 6 columns each, and ``wide``, 1,000 such tables);
each source is a config entry of its own (its own server_id, server_name and table filter), as
separate servers would be. The figure is ``build_definitions`` and the repository Dagster builds
from it (every job resolved), in this process, after a first load has paid the imports; the
median of ``REPEATS`` loads, with the machine's load over them (other work shares this 2-core
machine).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._processes import system_busy_seconds
from cdc_platform.devservices.mariadb import MariaDBServer

TABLES_PER_SOURCE = 50
WIDE_TABLES = 1000
REPEATS = 3
_COLUMNS = ("(id BIGINT PRIMARY KEY, name VARCHAR(40), qty INT, price DECIMAL(10,2), "
            "created DATETIME(6), note TEXT)")


@dataclass(frozen=True)
class Case:
    """``sources`` sources of ``tables`` tables each (databases ``src<i>``, or ``wide``)."""

    sources: int
    tables: int

    @property
    def label(self) -> str:
        return f"{self.sources} source(s) x {self.tables} tables"

    def databases(self) -> list[str]:
        if self.tables == WIDE_TABLES:
            return ["wide"]
        return [f"src{i}" for i in range(self.sources)]


CASES = (Case(1, TABLES_PER_SOURCE), Case(20, TABLES_PER_SOURCE), Case(1, WIDE_TABLES))


def _create_databases(server: MariaDBServer, cases: tuple[Case, ...]) -> None:
    with server.root_connect(autocommit=True) as conn, conn.cursor() as cur:
        for case in cases:
            for database in case.databases():
                cur.execute(f"CREATE DATABASE IF NOT EXISTS {database}")
                for j in range(case.tables):
                    cur.execute(f"CREATE TABLE IF NOT EXISTS {database}.t{j} {_COLUMNS}")


def _config(server: MariaDBServer, case: Case, work: Path) -> dict[str, Any]:
    conn = server.connection_settings()
    return {
        "sources": [{
            "flavour": "mariadb", "host": conn["host"], "port": conn["port"],
            "user": conn["user"], "password_env": "CDC_BENCH_SOURCE_PASSWORD",
            "server_id": 7000 + i, "server_name": database,
            "capture": {"tables": {"include": [rf"{database}\..*"]}},
        } for i, database in enumerate(case.databases())],
        "landing_zone": {"url": str(work / "landing")},
        "warehouse": {"url": str(work / "warehouse")},
        "lake": {"applier": False},
    }


def _load_seconds(data: dict[str, Any]) -> tuple[float, int]:
    """(seconds of the load, assets)."""
    from cdc_platform.config import parse_settings
    from cdc_platform.definitions import build_definitions

    settings = parse_settings(data, "bench config")
    started = time.perf_counter()
    defs = build_definitions(settings)
    # (and the repository Dagster builds from them, with every job resolved, as a load does)
    defs.get_repository_def().validate_loadable()
    elapsed = time.perf_counter() - started
    return elapsed, len(list(defs.resolve_asset_graph().get_all_asset_keys()))


def bench_code_location(work: Path, cases: tuple[Case, ...] = CASES) -> None:
    import os

    work = work / "code_location"
    server = MariaDBServer(base_dir=work / "mariadb", server_id=1)
    server.start()
    try:
        os.environ["CDC_BENCH_SOURCE_PASSWORD"] = server.cdc_password
        _create_databases(server, cases)
        _load_seconds(_config(server, cases[0], work))  # (imports, Dagster's first-use costs)
        print(f"\ncode location load (schemas read from the source at load; median of "
              f"{REPEATS} loads each; goal with 1,000 tables: <= 5 s):")
        for case in cases:
            busy_before, wall_before = system_busy_seconds(), time.monotonic()
            loads = [_load_seconds(_config(server, case, work)) for _ in range(REPEATS)]
            if loads[0][1] < case.sources * case.tables:  # (a source that failed to load)
                raise RuntimeError(f"{case.label}: only {loads[0][1]} assets loaded: see the "
                                   "log lines above")
            busy = (system_busy_seconds() - busy_before) / (time.monotonic() - wall_before)
            seconds = statistics.median(load[0] for load in loads)
            print(f"  {case.label:>26}: {seconds:6.2f} s (loads of "
                  f"{', '.join(f'{load[0]:.2f}' for load in loads)} s), {loads[0][1]} assets, "
                  f"{seconds / case.sources:.2f} s per source; machine {busy:.2f} of "
                  f"{os.cpu_count()} cores busy")
    finally:
        server.stop()
