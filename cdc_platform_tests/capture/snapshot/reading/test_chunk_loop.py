"""The reader's loop against a scripted engine: the table read in tiled chunks, at most
``max_pending`` of them waiting, the complete chunk held back until every other one is
decided, conditions, surrogate keys with NULL parts, and a repeated key found while the
chunk's files are written.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.snapshot.protocol import read_request
from cdc_platform.capture.snapshot.reading.keyset import ChunkKeyError
from cdc_platform.capture.snapshot.reading.progress import (
    SnapshotProgress,
    SnapshotResult,
)
from cdc_platform_tests.capture.snapshot.reading.scripted_engine import (
    ScriptedEngine,
    _committed_chunks,
    _ids,
    _reader,
    chunk_dir,
)


def test_reads_the_table_in_tiled_chunks_and_finishes_when_the_complete_chunk_commits(
        shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    progress: list[SnapshotProgress] = []
    with ScriptedEngine(landing, f"{db}.items") as engine:
        result = _reader(mariadb, db, landing, chunk_size=30).run(on_progress=progress.append)
    assert isinstance(result, SnapshotResult)
    assert (result.status, result.rows, result.chunks, result.rejected) == ("done", 100, 4, 0)
    chunks = _committed_chunks(engine)
    assert [(c["range_low"], c["range_high"], c["rows"], c["complete"]) for c in chunks] == [
        (None, [30], 30, False), ([30], [60], 30, False), ([60], [90], 30, False),
        ([90], [100], 10, True)]
    assert _ids(landing, db, chunks) == list(range(1, 101))
    assert result.start_gtid == chunks[0]["low_watermark"]
    assert result.end_gtid == chunks[-1]["after"]
    assert result.rows_per_second > 0 and result.duration_seconds > 0
    assert progress[-1].state == "done" and progress[-1].chunks == 4
    assert progress[-1].last_key == [100]


def test_at_most_max_pending_chunks_wait_and_the_complete_one_waits_for_all_others(
        shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    release = threading.Event()

    def slow(seq: int, manifest: dict[str, Any]) -> str:
        return "commit" if release.is_set() else "wait"

    with ScriptedEngine(landing, f"{db}.items", slow) as engine:
        reader = _reader(mariadb, db, landing, chunk_size=10, max_pending=3)
        outcome: list[SnapshotResult] = []
        thread = threading.Thread(target=lambda: outcome.append(reader.run()), daemon=True)
        thread.start()
        time.sleep(0.5)
        assert len(engine.manifests) == 0 or max(engine.manifests) <= 2
        directory = chunk_dir(landing, db, "items", reader.session_id)
        assert len(list(directory.glob("*.json"))) == 3  # and then it waits
        release.set()
        thread.join(30)
    assert outcome[0].status == "done" and outcome[0].chunks == 10
    assert engine.max_undecided <= 3
    assert engine.undecided_at_complete == [0]  # nothing else was pending


def test_empty_table_publishes_one_empty_complete_chunk(shop: tuple[Any, str, LandingZone]
                                                        ) -> None:
    mariadb, db, landing = shop
    mariadb.query(f"DELETE FROM `{db}`.items")
    with ScriptedEngine(landing, f"{db}.items") as engine:
        result = _reader(mariadb, db, landing).run()
    assert (result.status, result.rows, result.chunks) == ("done", 0, 1)
    [chunk] = _committed_chunks(engine)
    assert (chunk["range_low"], chunk["range_high"], chunk["complete"]) == (None, None, True)


def test_condition_selects_only_matching_rows(shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    with ScriptedEngine(landing, f"{db}.items") as engine:
        result = _reader(mariadb, db, landing, chunk_size=7, condition="status = 'open'").run()
    assert result.status == "done" and result.rows == 33
    assert _ids(landing, db, _committed_chunks(engine)) == list(range(3, 101, 3))
    request = read_request(landing, db, "items")
    assert request is not None and request.condition == "status = 'open'"


def test_composite_surrogate_key_with_null_parts(shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    mariadb.query(f"CREATE TABLE `{db}`.pairs (a INT NULL, b DATE NULL, v INT, "
                  "UNIQUE KEY (a, b))")
    mariadb.query(f"INSERT INTO `{db}`.pairs VALUES (NULL, NULL, 1), (NULL, '2025-01-01', 2), "
                  "(1, NULL, 3), (1, '2025-01-01', 4), (1, '2025-01-02', 5), (2, NULL, 6)")
    with ScriptedEngine(landing, f"{db}.pairs") as engine:
        result = _reader(mariadb, db, landing, "pairs", chunk_size=2,
                         surrogate_key=["a", "b"]).run()
    assert (result.status, result.rows, result.chunks) == ("done", 6, 3)
    request = read_request(landing, db, "pairs")
    assert request is not None and request.chunk_key == ("a", "b")
    assert [(c["range_low"], c["range_high"]) for c in _committed_chunks(engine)] == [
        (None, [None, "2025-01-01"]), ([None, "2025-01-01"], [1, "2025-01-01"]),
        ([1, "2025-01-01"], [2, None])]


def test_a_repeated_key_found_in_the_writer_thread_stops_the_run_before_its_files(
        shop: tuple[Any, str, LandingZone]) -> None:
    """The reader casts chunks read column-wise, and checks their keys, in its writer thread
    while it reads the next one: a repeated surrogate key there still ends the run loudly,
    naming the key, and the chunk's files are never written."""
    mariadb, db, landing = shop
    mariadb.query(f"CREATE TABLE `{db}`.dups (a INT NOT NULL, v VARCHAR(4))")
    mariadb.query(f"INSERT INTO `{db}`.dups VALUES (1, 'a'), (1, 'b'), (9, 'c')")
    with ScriptedEngine(landing, f"{db}.dups"), pytest.raises(
            ChunkKeyError, match=r"chunk key \(a\) = \(1,\) appears twice"):
        _reader(mariadb, db, landing, "dups", chunk_size=10, surrogate_key=["a"]).run()
    request = read_request(landing, db, "dups")
    assert request is not None
    directory = chunk_dir(landing, db, "dups", request.session_id)
    assert not list(directory.glob("00000000.*"))
