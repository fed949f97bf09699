"""Two Spark processes materialising different tables at the same time (as Dagster's
multiprocess executor runs steps): no Derby metastore, so no lock between them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

from cdc_platform_tests.lake.helpers import Landing, schema

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys, time
from pathlib import Path
from cdc_platform.lake.merge import materialise
from cdc_platform.lake.spark import build_spark_session
from cdc_platform.lake.table_format import TargetTable

landing, warehouse, table, other, barrier = sys.argv[1:]
barrier = Path(barrier)
spark = build_spark_session(app_name=table)

def wait_for(name):
    deadline = time.monotonic() + 120
    while not (barrier / name).exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {name}")
        time.sleep(0.05)

(barrier / f"{table}.started").touch()
wait_for(f"{other}.started")  # both sessions are up before either works
result = materialise(spark, landing, warehouse, "demo", None, "shop", table)
rows = TargetTable(warehouse, "demo", "shop", table).read(spark).count()
(barrier / f"{table}.done").touch()
wait_for(f"{other}.done")  # and both stay up until both are done
print(json.dumps({"version": result.version, "rows": result.rows, "count": rows}))
spark.stop()
"""


def test_two_spark_processes_overlap_on_different_tables(tmp_path: Path):
    landing = Landing(tmp_path / "landing")
    for table, n in (("left", 5), ("right", 7)):
        rows = [("c", {"id": i, "name": table, "amount": Decimal("1.00")}) for i in range(n)]
        landing.segment(schema(table), rows)
    warehouse = str(tmp_path / "warehouse")
    workdir = tmp_path / "cwd"
    (workdir / "barrier").mkdir(parents=True)
    pythonpath = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": pythonpath}
    procs = {
        table: subprocess.Popen(
            [sys.executable, "-c", SCRIPT, landing.url, warehouse, table, other,
             str(workdir / "barrier")],
            cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for table, other in (("left", "right"), ("right", "left"))
    }
    results = {}
    for table, proc in procs.items():
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, f"{table} failed:\n{err[-3000:]}"
        results[table] = json.loads(out.strip().splitlines()[-1])
    assert results == {
        "left": {"version": 1, "rows": 5, "count": 5},
        "right": {"version": 1, "rows": 7, "count": 7},
    }
    # nothing of Spark's landed in the working directory (no metastore_db, derby.log, warehouse)
    assert sorted(p.name for p in workdir.iterdir()) == ["barrier"]
