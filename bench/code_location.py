"""The code location's load time with 1 and with 20 sources of 50 tables each.

Loading lists each source's tables and reads their schemas from the source (schema discovery
happens at load time), so the time grows with sources x tables. One private MariaDB holds every
source's database (``src<i>``, 50 tables of 6 columns each); each source is a config entry of
its own (its own server_id, server_name and table filter), as separate servers would be. The
figure is ``build_definitions`` and the repository Dagster builds from it (every job resolved),
in this process, after a first load has paid the imports.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from cdc_platform.devservices.mariadb import MariaDBServer

TABLES_PER_SOURCE = 50


def _create_sources(server: MariaDBServer, sources: int) -> None:
    with server.root_connect(autocommit=True) as conn, conn.cursor() as cur:
        for i in range(sources):
            cur.execute(f"CREATE DATABASE IF NOT EXISTS src{i}")
            for j in range(TABLES_PER_SOURCE):
                cur.execute(f"CREATE TABLE IF NOT EXISTS src{i}.t{j} (id BIGINT PRIMARY KEY, "
                            "name VARCHAR(40), qty INT, price DECIMAL(10,2), "
                            "created DATETIME(6), note TEXT)")


def _config(server: MariaDBServer, sources: int, work: Path) -> dict[str, Any]:
    conn = server.connection_settings()
    return {
        "sources": [{
            "flavour": "mariadb", "host": conn["host"], "port": conn["port"],
            "user": conn["user"], "password_env": "CDC_BENCH_SOURCE_PASSWORD",
            "server_id": 7000 + i, "server_name": f"src{i}",
            "capture": {"tables": {"include": [rf"src{i}\..*"]}},
        } for i in range(sources)],
        "landing_zone": {"url": str(work / "landing")},
        "warehouse": {"url": str(work / "warehouse")},
        "lake": {"applier": False},
    }


def _load_seconds(data: dict[str, Any]) -> tuple[float, int]:
    from cdc_platform.config import parse_settings
    from cdc_platform.definitions import build_definitions

    settings = parse_settings(data, "bench config")
    started = time.perf_counter()
    defs = build_definitions(settings)
    # (and the repository Dagster builds from them, with every job resolved, as a load does)
    defs.get_repository_def().validate_loadable()
    elapsed = time.perf_counter() - started
    return elapsed, len(list(defs.resolve_asset_graph().get_all_asset_keys()))


def bench_code_location(work: Path, source_counts: tuple[int, ...] = (1, 20)) -> None:
    import os

    work = work / "code_location"
    server = MariaDBServer(base_dir=work / "mariadb", server_id=1)
    server.start()
    try:
        os.environ["CDC_BENCH_SOURCE_PASSWORD"] = server.cdc_password
        _create_sources(server, max(source_counts))
        _load_seconds(_config(server, 1, work))  # (imports, Dagster's first-use costs)
        print(f"\ncode location load ({TABLES_PER_SOURCE} tables per source, schemas read "
              "from the source at load):")
        for count in source_counts:
            seconds, assets = _load_seconds(_config(server, count, work))
            print(f"  {count:>3} source(s): {seconds:6.2f} s, {assets} assets, "
                  f"{seconds / count:.2f} s per source")
    finally:
        server.stop()
