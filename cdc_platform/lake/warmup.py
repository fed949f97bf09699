"""Warm a new Spark session up with the work it will do: two small materialisations of a
scratch table, in a scratch landing zone and warehouse that are deleted afterwards.

A session's first MERGE pays for the JVM loading and compiling Iceberg's, Parquet's and
Spark's code: measured with a 40k-record batch into a 1M-row target, the first MERGE took
9.5-13.6 s, the following ones 2.3-3.9 s. A target loaded through Spark paid that in its
load; since initial loads are appended without Spark (``lake.arrow_load``), the applier's
first MERGE after an initial load paid it, and set the end-to-end p99 (22 s at 1,000
commits/s, 50 s at 5,000/s). The applier warms its session up while it is idle, right after
starting it (``Applier``), so the first real MERGE runs warm.

The scratch work goes through ``lake.merge.materialise`` itself (an INSERT of the first
batch, then a MERGE of updates, deletes and inserts, the statistics, the branch and its
fast-forward): the code paths the real merges take, nothing else.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession

from cdc_platform.capture.landing.records import (
    CREATE,
    DELETE,
    GTID,
    OP,
    POS,
    TS_MS,
    UPDATE,
    segment_schema,
)
from cdc_platform.capture.landing.zone import Checkpoint, LandingZone
from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.config import CatalogSettings
from cdc_platform.lake.merge import materialise

log = logging.getLogger(__name__)

# Its own Spark catalog (a Hadoop catalog on the scratch warehouse): the lake's catalog and
# its tables are never touched.
WARMUP_CATALOG = "cdc_warmup"
WARMUP_SERVER = "warmup"
_ROWS = 2000
SCRATCH_PREFIX = "cdc-spark-warmup-"
# A scratch directory this old is a leftover of a warm-up that was killed (one takes seconds;
# another applier on the machine may be warming up in its own meanwhile).
LEFTOVER_SECONDS = 3600.0

_SCHEMA = TableSchema(
    "warmup", "t",
    (ColumnSpec("id", "int", 64), ColumnSpec("name", "string"),
     ColumnSpec("amount", "decimal", 10, 2)),
    ("id",))


def _segment(landing: LandingZone, first_pos: int, ops: list[tuple[str, int]]) -> int:
    """One segment of ``ops`` (op, key), one transaction each; the next free position."""
    positions = list(range(first_pos, first_pos + len(ops)))
    schema = segment_schema(_SCHEMA)
    columns = {
        POS: positions,
        GTID: [f"0-1-{p}" for p in positions],
        OP: [op for op, _ in ops],
        TS_MS: [1_700_000_000_000 + p for p in positions],
        "id": [key for _, key in ops],
        "name": [f"name {key} {p}" for (_, key), p in zip(ops, positions, strict=True)],
        "amount": [None] * len(ops),
    }
    table = pa.Table.from_pydict({name: columns[name] for name in schema.names}, schema=schema)
    landing.write_segment(_SCHEMA, table, positions[0], positions[-1])
    next_pos = positions[-1] + 1
    landing.write_checkpoint(Checkpoint(WARMUP_SERVER, "mariadb", f"0-1-{next_pos - 1}",
                                        next_pos))
    return next_pos


def warm_up(spark: SparkSession) -> float:
    """Run the scratch materialisations in ``spark``; the seconds they took."""
    started = time.monotonic()
    remove_leftovers(Path(tempfile.gettempdir()), time.time())
    with tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIX) as scratch:
        landing_url = str(Path(scratch) / "landing")
        landing = LandingZone(landing_url, WARMUP_SERVER)
        warehouse = str(Path(scratch) / "warehouse")
        catalog = CatalogSettings(name=WARMUP_CATALOG)
        next_pos = _segment(landing, 1, [(CREATE, key) for key in range(_ROWS)])
        materialise(spark, landing_url, warehouse, WARMUP_SERVER, _SCHEMA, _SCHEMA.database,
                    _SCHEMA.table, catalog=catalog, spark_free=False)  # an INSERT
        _segment(landing, next_pos, [(UPDATE, key) for key in range(0, _ROWS, 3)]
                 + [(DELETE, key) for key in range(1, _ROWS, 7)]
                 + [(CREATE, key) for key in range(_ROWS, _ROWS + 100)])
        materialise(spark, landing_url, warehouse, WARMUP_SERVER, _SCHEMA, _SCHEMA.database,
                    _SCHEMA.table, catalog=catalog, spark_free=False)  # a MERGE
    seconds = time.monotonic() - started
    log.info("Spark session warmed up in %.1f s (two materialisations of a scratch table)",
             seconds)
    return seconds


def remove_leftovers(directory: Path, now: float) -> list[Path]:
    """Delete the scratch directories in ``directory`` that warm-ups killed before their end
    left behind (older than ``LEFTOVER_SECONDS``); the ones deleted."""
    removed = []
    for path in directory.glob(f"{SCRATCH_PREFIX}*"):
        try:
            if path.is_dir() and now - path.stat().st_mtime > LEFTOVER_SECONDS:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        except OSError:  # (another applier removed it first)
            continue
    return removed
