"""Many tables written at once, on the real server, engine and applier: the applier merges
them without Spark, several at once, and every target ends equal to its source table, also
when the applier's process is killed -9 in the middle of its passes."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.lake.applier import loop as applier_module
from cdc_platform.lake.applier.events import Applied, Failed
from cdc_platform.lake.iceberg.catalog import namespace_name, table_name
from cdc_platform.lake.iceberg.hadoop import local_hadoop_catalog
from cdc_platform_tests.capture.snapshot.reading.live_engine import streaming
from cdc_platform_tests.conftest import CdcEnv
from cdc_platform_tests.lake.applier.test_loop import Running, _options, _wait

REPO = Path(__file__).resolve().parents[3]
TABLES = 60


def _create(env: CdcEnv, tables: int, rows: int) -> list[str]:
    names = [f"m{i:02d}" for i in range(tables)]
    with env.connect() as conn, conn.cursor() as cur:
        for name in names:
            cur.execute(f"CREATE TABLE {name} (id INT PRIMARY KEY, v VARCHAR(20), "
                        "amount DECIMAL(10,2))")
            cur.execute(f"INSERT INTO {name} SELECT seq, CONCAT('v', seq), seq / 100 "
                        f"FROM seq_1_to_{rows}")
        conn.commit()
    return names


def _write(env: CdcEnv, names: list[str], seconds: float, seed: int,
           stop: threading.Event | None = None) -> int:
    """Single-row inserts, updates and deletes spread over every table, autocommit."""
    rng = random.Random(seed)
    done = 0
    deadline = time.monotonic() + seconds
    with env.connect() as conn, conn.cursor() as cur:
        conn.autocommit(True)
        while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
            name = names[done % len(names)]
            key = rng.randint(1, 60)
            choice = rng.random()
            if choice < 0.2:
                cur.execute(f"DELETE FROM {name} WHERE id = %s", (key,))
            elif choice < 0.5:
                cur.execute(f"INSERT INTO {name} VALUES (%s, 'new', 1.00) ON DUPLICATE KEY "
                            "UPDATE v = 'again'", (key,))
            else:
                cur.execute(f"UPDATE {name} SET v = %s, amount = amount + 1 WHERE id = %s",
                            (f"u{done}", key))
            done += 1
    return done


def _source(env: CdcEnv, name: str) -> dict[int, tuple[str, Decimal]]:
    return {row[0]: (row[1], row[2]) for row in env.query(f"SELECT id, v, amount FROM {name}")}


def _target(env: CdcEnv, name: str) -> dict[int, tuple[str, Decimal]] | None:
    """The target as a third party reads it (pyiceberg, the newest metadata); None before
    its creation. A key twice would be a duplicate effect: refused."""
    catalog = local_hadoop_catalog(env.settings.warehouse.url)
    assert catalog is not None
    try:
        table = catalog.load_table((namespace_name(env.server_name, env.db),
                                    table_name(name)))
    except Exception:  # noqa: BLE001 - not created yet
        return None
    rows = table.scan(selected_fields=("id", "v", "amount")).to_arrow().to_pylist()
    found = {row["id"]: (row["v"], row["amount"]) for row in rows}
    assert len(found) == len(rows), f"{name}: a key twice in the target"
    return found


def _all_equal(env: CdcEnv, names: list[str]) -> bool:
    return all(_target(env, name) == _source(env, name) for name in names)


def test_sixty_tables_written_at_once_are_merged_side_by_side_without_spark(
        cdc_env: CdcEnv, spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    env = cdc_env
    names = _create(env, TABLES, 40)
    in_flight = {"now": 0, "most": 0}
    lock = threading.Lock()
    real_materialise = applier_module.materialise

    def materialise(*args: Any, **kwargs: Any) -> Any:  # (how many merges run at once)
        with lock:
            in_flight["now"] += 1
            in_flight["most"] = max(in_flight["most"], in_flight["now"])
        try:
            return real_materialise(*args, **kwargs)
        finally:
            with lock:
                in_flight["now"] -= 1

    monkeypatch.setattr(applier_module, "materialise", materialise)
    options = _options(env, merge_parallelism=4)
    with streaming(env), Running(spark, options) as running:
        _wait("every target created with its rows", lambda: _all_equal(env, names), 300)
        writers = [threading.Thread(target=_write, args=(env, names, 20.0, seed))
                   for seed in range(3)]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join()
        _wait("every target equal to its table after the writes", lambda: _all_equal(
            env, names), 300)
        merged = running.of(Applied)
        assert not running.of(Failed), running.of(Failed)[:3]
    # every table was merged more than its initial append, all without Spark
    assert {e.schema.table for e in merged if not e.result.appended} == set(names)
    assert not [e for e in merged if e.result.spark], "a merge went to Spark"
    assert in_flight["most"] > 1, "merges of different tables never ran at once"


def test_an_applier_killed_9_in_its_passes_leaves_every_target_exact(cdc_env: CdcEnv) -> None:
    """The applier in a process of its own, killed -9 at random moments of its passes while
    forty tables change (merges, compactions and commits of several tables under way), and
    started again: no change lost, none applied twice."""
    env = cdc_env
    env.overrides["lake"] = {"applier": True, "poll_seconds": 0.2,
                             "merge_interval_seconds": 0.0, "compact_min_files": 8}
    config = env.write_config()
    names = _create(env, 40, 30)
    environment = {**os.environ, "PYTHONPATH": str(REPO), "PYSPARK_PYTHON": sys.executable}
    log = (env.root / "applier.log").open("ab")

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "cdc_platform", "apply", "--config",
                                 str(config)], cwd=REPO, env=environment, stdout=log,
                                stderr=subprocess.STDOUT)

    rng = random.Random(11)
    stop = threading.Event()
    with streaming(env):
        process = start()
        try:
            _wait("every target created", lambda: _all_equal(env, names), 300)
            writer = threading.Thread(target=_write, args=(env, names, 600.0, 1, stop))
            writer.start()
            try:
                for _ in range(5):
                    time.sleep(rng.uniform(1.5, 4.0))
                    os.kill(process.pid, signal.SIGKILL)
                    process.wait(30)
                    process = start()
            finally:
                stop.set()
                writer.join(60)
            _wait("every target equal to its table after the kills", lambda: _all_equal(
                env, names), 300)
        finally:
            process.kill()
            process.wait(30)
            log.close()
    text = (env.root / "applier.log").read_text(errors="replace")
    assert "without Spark" in text  # (the merges the kills interrupted were Spark-free)
