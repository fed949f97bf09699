"""The torture suite's servers (a primary and two GTID replicas) and its report.

Run it with ``make torture``. Knobs (environment): ``TORTURE_KILLS`` (SIGKILLs of the engine,
default 10), ``TORTURE_SEED`` (kill points and workload, default 13),
``TORTURE_WORKLOAD_SECONDS`` (default 45), ``TORTURE_CELLS`` (a regular expression: only the
cells whose id matches, e.g. ``types/.*latin1``), ``TORTURE_REPORT`` (also write the JSON report
there).

``test_torture_sources`` (issue 24's acceptance run: two topologies, one deployment) has knobs of
its own: ``TORTURE_SOURCES_KILLS`` (default 5), ``TORTURE_SOURCES_SECONDS`` (default 40).

``make torture-s3`` (``test_torture_s3``) runs the fault run again with the landing zone and the
warehouse on a SeaweedFS it starts (``harness.STORAGE``), targets read back with pyiceberg
through its Iceberg REST catalog, and snapshot rounds beside the engine
(``TORTURE_SNAPSHOT_ROUNDS``, default 3), the first ``TORTURE_READER_KILLS`` (default 2) of
whose readers are SIGKILLed mid-snapshot; ``TORTURE_KILLS`` defaults to 3 there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.devservices.mariadb import MariaDBServer
from cdc_platform_tests.torture.cells import SETUP
from cdc_platform_tests.torture.harness import PASSWORD_ENV, REPORT, Cluster, run_statements


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A primary and two read replicas (parallel applier, log_slave_updates, read-only)."""
    base = tmp_path_factory.mktemp("torture-servers")
    primary = MariaDBServer(base / "primary", server_id=1)
    replicas = [MariaDBServer(base / f"replica{n}", server_id=1 + n, replica=True,
                              slave_parallel_threads=4, slave_parallel_mode="optimistic")
                for n in (1, 2)]
    os.environ[PASSWORD_ENV] = primary.cdc_password
    with primary, replicas[0], replicas[1]:
        for replica in replicas:
            replica.replicate_from(primary)
        run_statements(primary, SETUP)
        cluster = Cluster(primary, *replicas, base)
        cluster.wait_replicated()
        try:
            yield cluster
        finally:
            cluster.stop()


def report_path(config: pytest.Config) -> Path | None:
    factory = getattr(config, "_tmp_path_factory", None)
    if factory is None:
        return None
    return factory.getbasetemp() / "torture-report.json"


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config
                            ) -> None:
    if not REPORT["cells"] and REPORT["faults"] is None and REPORT["sources"] is None:
        return
    write = terminalreporter.write_line
    terminalreporter.section("torture report")
    by_matrix: dict[str, list[dict[str, Any]]] = {}
    for cell_id, result in REPORT["cells"].items():
        by_matrix.setdefault(cell_id.split("/", 1)[0], []).append(result)
    for matrix, results in by_matrix.items():
        good = sum(r["status"] in ("pass", "loud-stop") for r in results)
        write(f"{matrix}: {good}/{len(results)} cells pass or stop loudly")
        for r in results:
            line = f"  {r['status']:<11} {r['cell']}"
            if r["status"] != "pass":
                line += f"  {r['detail'][:300]}"
            write(line)
    faults = REPORT["faults"]
    if faults is not None:
        bad = [t["summary"] for t in faults["tables"] if not t["ok"]]
        write(f"faults: {faults['kills_survived']}/{faults['kills']} kills survived, failover "
              f"{faults['failover']}, {faults['transactions']} transactions "
              f"({faults['rollbacks']} rolled back), {len(faults['tables'])} targets compared, "
              f"{len(bad)} differ, {len(faults['cells_included'])} cells included")
        if faults["snapshot_rounds"]:
            write(f"snapshots: {faults['snapshots_done']}/{faults['snapshot_rounds']} rounds "
                  f"done, {faults['reader_kills']} readers killed mid-snapshot")
        for line in faults["engine_exits"] + faults["snapshot_problems"] + bad:
            write(f"  {line[:400]}")
    sources = REPORT["sources"]
    if sources is not None:
        a, bad = sources["a"], [t["summary"] for t in sources["b_tables"] if not t["ok"]]
        bad = [t["summary"] for t in sources["a"]["tables"] if not t["ok"]] + bad
        write(f"sources: A {a['kills_survived']}/{a['kills']} kills survived, failover "
              f"{a['failover']}, {a['transactions']} transactions; B engine "
              f"{'never exited' if not sources['b_engine_exits'] else 'exited'}, catch-up "
              f"{sources['b_catch_up']}, {sources['b_transactions']} transactions; "
              f"{len(a['tables']) + len(sources['b_tables'])} targets compared, {len(bad)} "
              f"differ; {len(sources['signals'])} signals, snapshot run "
              f"{sources['snapshot_run']}, requests {sources['requested']}")
        for line in a["engine_exits"] + sources["b_engine_exits"] + bad:
            write(f"  {line[:400]}")
    text = json.dumps(REPORT, indent=2, default=str, ensure_ascii=False)
    for path in filter(None, (report_path(config), os.environ.get("TORTURE_REPORT"))):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
        write(f"report written to {path}")
