"""The Spark warm-up's scratch directories do not pile up when warm-ups are killed."""

from __future__ import annotations

import os
import time

from cdc_platform.lake.warmup import LEFTOVER_SECONDS, SCRATCH_PREFIX, remove_leftovers


def test_a_killed_warm_ups_scratch_directory_is_removed_by_a_later_one(tmp_path):
    now = time.time()
    killed = tmp_path / f"{SCRATCH_PREFIX}killed"
    (killed / "warehouse").mkdir(parents=True)
    (killed / "warehouse" / "data.parquet").write_bytes(b"x")
    os.utime(killed, (now - LEFTOVER_SECONDS - 60, now - LEFTOVER_SECONDS - 60))
    running = tmp_path / f"{SCRATCH_PREFIX}running"  # another applier's, warming up now
    running.mkdir()
    other = tmp_path / "cdc-something-else"
    other.mkdir()
    os.utime(other, (now - 10 * LEFTOVER_SECONDS, now - 10 * LEFTOVER_SECONDS))

    assert remove_leftovers(tmp_path, now) == [killed]

    assert not killed.exists() and running.exists() and other.exists()
