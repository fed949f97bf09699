"""Every value, name, server feature and fault on a real primary with two GTID replicas.

Each cell either round-trips exactly (the target equals the primary, compared independently of
the platform's own code) or stops the engine loudly, naming the table and column. The fault
run then replays every passing cell and a live workload under SIGKILLs and a failover.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from cdc_platform_tests.torture.cells import CELLS, Cell, CellResult
from cdc_platform_tests.torture.harness import (
    REPORT,
    Cluster,
    FaultResult,
    run_cell,
    run_faults,
    run_startup_cell,
)

pytestmark = [pytest.mark.torture, pytest.mark.integration, pytest.mark.timeout(3600)]

SELECTED = [c for c in CELLS if re.search(os.environ.get("TORTURE_CELLS", ""), c.id)]


@pytest.fixture(scope="module")
def cell_results(cluster: Cluster, spark: Any, tmp_path_factory: pytest.TempPathFactory
                 ) -> dict[str, CellResult]:
    root = tmp_path_factory.mktemp("torture-cells")
    results: dict[str, CellResult] = {}
    for index, cell in enumerate(SELECTED):
        if cell.account:
            result = run_startup_cell(cluster, cell, root, index)
        else:
            result = run_cell(cluster, spark, cell, root, index)
        results[cell.id] = result
        REPORT["cells"][cell.id] = result.to_dict()
    return results


@pytest.fixture(scope="module")
def fault_result(cluster: Cluster, spark: Any, cell_results: dict[str, CellResult],
                 tmp_path_factory: pytest.TempPathFactory) -> FaultResult:
    # Every cell whose rows round-tripped alone through the binlog is replayed under the faults
    # (snapshot cells came by SELECT: their binlog path is their type cell's).
    passed = [c for c in SELECTED if cell_results[c.id].rows_equal and c.source == "replica1"
              and not c.loud_words and not c.snapshot and not c.account]
    result = run_faults(
        cluster, spark, passed, tmp_path_factory.mktemp("torture-faults"),
        kills=int(os.environ.get("TORTURE_KILLS", "10")),
        seed=int(os.environ.get("TORTURE_SEED", "13")),
        workload_seconds=float(os.environ.get("TORTURE_WORKLOAD_SECONDS", "45")))
    REPORT["faults"] = result.to_dict()
    return result


def _param(cell: Cell) -> Any:
    marks = [pytest.mark.xfail(strict=False, reason=cell.xfail)] if cell.xfail else []
    return pytest.param(cell, id=cell.id, marks=marks)


@pytest.mark.parametrize("cell", [_param(c) for c in SELECTED])
def test_cell_round_trips_or_stops_loudly(cell: Cell, cell_results: dict[str, CellResult]
                                          ) -> None:
    result = cell_results[cell.id]
    assert result.ok, f"{cell.id}: {result.status}: {result.detail}"


def test_every_target_equals_the_primary_after_kills_and_failover(fault_result: FaultResult
                                                                   ) -> None:
    bad = [v.summary() for v in fault_result.tables if not v.ok]
    assert not bad, "targets differ from the primary after the faults:\n" + "\n".join(bad)
    assert len(fault_result.tables) >= 5


def test_engine_survives_every_kill_and_the_failover(fault_result: FaultResult) -> None:
    assert fault_result.kills > 0
    assert fault_result.kills_survived == fault_result.kills, fault_result.engine_exits
    assert not fault_result.engine_exits, fault_result.engine_exits
    assert fault_result.failover == "ok", fault_result.failover
    assert fault_result.transactions > 100


def test_report_lists_every_cell(cell_results: dict[str, CellResult], tmp_path: Path) -> None:
    assert set(REPORT["cells"]) == {c.id for c in SELECTED}
    assert all(r["status"] for r in REPORT["cells"].values())
