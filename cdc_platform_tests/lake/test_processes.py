"""Spark processes materialising at the same time (as Dagster's multiprocess executor runs
steps): different tables need no lock (no Derby metastore; the Iceberg catalog is registered in
each session), and one table is compare-and-swap between processes too."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

from cdc_platform_tests.lake.helpers import (
    Changelog,
    Landing,
    assert_every_published_snapshot_is_a_fold,
    materialise_table,
    random_changes,
    rows_of,
    schema,
    target_table,
)
from cdc_platform_tests.lake.third_party import assert_third_party_reads_same

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys, time
from pathlib import Path
from cdc_platform.lake.iceberg.lake import Lake
from cdc_platform.lake.iceberg.table import LakeTable
from cdc_platform.lake.merge import materialise
from cdc_platform.lake.spark import build_spark_session

landing, warehouse, table, other, barrier = sys.argv[1:]
barrier = Path(barrier)
spark = build_spark_session(app_name=table)

def wait_for(name):
    deadline = time.monotonic() + 180
    while not (barrier / name).exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {name}")
        time.sleep(0.05)

(barrier / f"{table}.started").touch()
wait_for(f"{other}.started")  # both sessions are up before either works
result = materialise(spark, landing, warehouse, "demo", None, "shop", table)
rows = LakeTable(Lake(spark, warehouse), "demo", "shop", table).read().count()
(barrier / f"{table}.done").touch()
wait_for(f"{other}.done")  # and both stay up until both are done
print(json.dumps({"committed": result.committed, "rows": result.rows, "count": rows}))
spark.stop()
"""

# One process of two materialising the same table in a loop until the test says stop.
RACER = r"""
import json, sys, time
from pathlib import Path
from cdc_platform.lake.iceberg.commit import ConcurrentCommitError
from cdc_platform.lake.merge import materialise
from cdc_platform.lake.spark import build_spark_session

landing, warehouse, name, barrier = sys.argv[1:]
barrier = Path(barrier)
spark = build_spark_session(app_name=name)
(barrier / f"{name}.started").touch()
outcomes = []
while not (barrier / "stop").exists():
    try:
        result = materialise(spark, landing, warehouse, "demo", None, "shop", "orders")
        outcomes.append({"committed": result.committed, "attempts": result.attempts,
                         "consumed_pos": result.consumed_pos})
    except ConcurrentCommitError as error:
        outcomes.append({"error": "ConcurrentCommitError"})
    (barrier / f"{name}.run{len(outcomes)}").touch()
print(json.dumps(outcomes))
spark.stop()
"""


def python_env() -> dict[str, str]:
    pythonpath = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": pythonpath}


def errors(stderr: str) -> str:
    """A process's stderr without JVM stack frames and log noise: the Python traceback and
    the Java exception messages."""
    lines = [line for line in stderr.splitlines()
             if not line.lstrip().startswith(("at ", "...")) and " WARN " not in line]
    return "\n".join(lines)[-4000:]


def wait_for(path: Path, procs: list[subprocess.Popen], timeout: float = 240) -> None:
    wait_until(path.exists, procs, timeout)


def wait_until(condition: Callable[[], bool], procs: list[subprocess.Popen],
               timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(f"a process ended early:\n{errors(proc.stderr.read())}")
        assert time.monotonic() < deadline, f"timed out waiting for {condition}"
        time.sleep(0.1)


def test_two_spark_processes_overlap_on_different_tables(tmp_path: Path):
    landing = Landing(tmp_path / "landing")
    for table, n in (("left", 5), ("right", 7)):
        rows = [("c", {"id": i, "name": table, "amount": Decimal("1.00")}) for i in range(n)]
        landing.segment(schema(table), rows)
    warehouse = str(tmp_path / "warehouse")
    workdir = tmp_path / "cwd"
    (workdir / "barrier").mkdir(parents=True)
    procs = {
        table: subprocess.Popen(
            [sys.executable, "-c", SCRIPT, landing.url, warehouse, table, other,
             str(workdir / "barrier")],
            cwd=workdir, env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )
        for table, other in (("left", "right"), ("right", "left"))
    }
    results = {}
    for table, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{table} failed:\n{errors(err)}"
        results[table] = json.loads(out.strip().splitlines()[-1])
    assert results == {
        "left": {"committed": True, "rows": 5, "count": 5},
        "right": {"committed": True, "rows": 7, "count": 7},
    }
    # nothing of Spark's landed in the working directory (no metastore_db, derby.log, warehouse)
    assert sorted(p.name for p in workdir.iterdir()) == ["barrier"]


def test_two_spark_processes_materialising_one_table_lose_no_update(spark, tmp_path: Path):
    """Both processes loop over the same table while batches arrive; each run either commits,
    finds nothing new, or gives up with ConcurrentCommitError after its retries. Every snapshot
    published on main is the exact fold up to its mark, and the end state is the whole fold."""
    rng = random.Random(2)
    landing = Landing(tmp_path / "landing")
    changelog = Changelog(landing)
    live: set[int] = set()
    orders = changelog.schema
    changelog.write(random_changes(rng, live, 0))
    warehouse = str(tmp_path / "warehouse")
    materialise_table(spark, landing, warehouse, orders)  # the table exists before the race
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, landing.url, warehouse, name, str(barrier)],
            cwd=tmp_path, env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("one", "two")
    ]
    try:
        for name in ("one", "two"):
            wait_for(barrier / f"{name}.started", procs)
        for batch in range(1, 11):
            runs = len(list(barrier.glob("*.run*")))
            changelog.write(random_changes(rng, live, batch))
            # let the processes run about twice per batch, so batches land mid-run
            wait_until(lambda runs=runs: len(list(barrier.glob("*.run*"))) >= runs + 2, procs)
        (barrier / "stop").touch()
        outcomes = []
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, errors(err)
            outcomes.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert all(outcomes), outcomes  # each process ran at least once
    final = materialise_table(spark, landing, warehouse, orders)
    table = target_table(spark, warehouse, orders)
    assert rows_of(table.read()) == changelog.fold()
    assert final.rows == len(changelog.fold())
    assert_every_published_snapshot_is_a_fold(table, changelog)
    assert_third_party_reads_same(spark, table)
    committed = sum(1 for o in outcomes for run in o if run.get("committed"))
    retried = sum(1 for o in outcomes for run in o if run.get("attempts", 1) > 1)
    print(f"processes: {committed} commits, {retried} retried, "
          f"{sum(1 for o in outcomes for run in o if 'error' in run)} gave up")
