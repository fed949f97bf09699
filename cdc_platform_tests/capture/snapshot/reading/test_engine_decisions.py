"""The reader following the engine's decisions (``reading/engine_view.py``, the reader's loop)
against a scripted engine: no acknowledgement, rejected chunks read again, a session the
engine gave up on, an ended session read from ended_sessions.json, a stalled engine.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.snapshot.errors import (
    NoEngineError,
    SnapshotError,
)
from cdc_platform.capture.snapshot.protocol import read_request
from cdc_platform_tests.capture.snapshot.reading.scripted_engine import (
    ScriptedEngine,
    _committed_chunks,
    _ids,
    _reader,
    _tick_until_open,
)


def test_without_an_engine_the_session_times_out_naming_the_server(
        shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    reader = _reader(mariadb, db, landing, ack_timeout_seconds=0.3, session_id="run-x")
    with pytest.raises(NoEngineError, match="^no capture engine is streaming shop: start the "
                                            r"stream_changes job \(snapshot session run-x of "
                                            rf"{db}\.items was not acknowledged"):
        reader.run()
    request = read_request(landing, db, "items")
    assert request is not None and (request.session_id, request.action) == ("run-x", "stop")


def test_a_reader_whose_session_left_the_checkpoint_learns_how_it_ended(
        shop: tuple[Any, str, LandingZone]) -> None:
    """An ended session leaves the checkpoint (for ended_sessions.json) some seconds after it
    ended: a reader that did not look at the checkpoint meanwhile (a stalled thread) still
    ends done, or fails with the engine's reason."""
    mariadb, db, landing = shop
    with ScriptedEngine(landing, f"{db}.items", leave_at_once=True):
        result = _reader(mariadb, db, landing, chunk_size=30).run()
    assert (result.status, result.rows, result.chunks) == ("done", 100, 4)

    def give_up(seq: int, manifest: dict[str, Any]) -> str:
        return "give-up" if seq == 1 else "commit"

    with ScriptedEngine(landing, f"{db}.items", give_up, leave_at_once=True), \
            pytest.raises(SnapshotError, match="scripted: chunk 1 unusable"):
        _reader(mariadb, db, landing, chunk_size=30).run()


def test_rejected_chunks_are_read_again_under_new_seqs(shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    rejected_once: set[tuple[Any, Any]] = set()

    def reject_some(seq: int, manifest: dict[str, Any]) -> str:
        # By range, not seq: which seq a re-read range gets depends on the engine's timing.
        span = (json.dumps(manifest["range_low"]), json.dumps(manifest["range_high"]))
        if span in (("[10]", "[20]"), ("[30]", "[40]")) and span not in rejected_once:
            rejected_once.add(span)
            return "reject"
        return "commit"

    mariadb.query(f"DELETE FROM `{db}`.items WHERE id > 50")
    with ScriptedEngine(landing, f"{db}.items", reject_some) as engine:
        result = _reader(mariadb, db, landing, chunk_size=10).run()
    assert (result.status, result.rejected, result.reselected) == ("done", 2, 2)
    assert result.rows == 50 and result.chunks == 5
    chunks = _committed_chunks(engine)
    assert len(engine.session["rejected"]) == 2
    # The re-read chunks cover exactly the rejected ranges; together the committed ones tile all.
    spans = sorted((c["range_low"] or [0], c["range_high"]) for c in chunks)
    assert spans == [([0], [10]), ([10], [20]), ([20], [30]), ([30], [40]), ([40], [50])]
    assert sorted(_ids(landing, db, chunks)) == list(range(1, 51))
    assert chunks[-1]["complete"] and chunks[-1]["seq"] == max(engine.manifests)


def test_rejected_complete_chunk_is_read_again_and_still_ends_the_session(
        shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    seen: list[int] = []

    def reject_first_complete(seq: int, manifest: dict[str, Any]) -> str:
        if manifest["complete"] and not seen:
            seen.append(seq)
            return "reject"
        return "commit"

    with ScriptedEngine(landing, f"{db}.items", reject_first_complete) as engine:
        result = _reader(mariadb, db, landing, chunk_size=60).run()
    assert (result.status, result.chunks, result.rejected, result.rows) == ("done", 2, 1, 100)
    assert [c["complete"] for c in _committed_chunks(engine)] == [False, True]


def test_a_session_the_engine_gave_up_on_fails_the_run_with_the_reason(
        shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    expected = (rf"snapshot of {db}\.items \(session .*\): the capture engine stopped the "
                r"session: scripted: chunk 2 unusable; fix the cause")
    with ScriptedEngine(landing, f"{db}.items", lambda seq, _: "give-up" if seq == 2
                        else "commit"), pytest.raises(SnapshotError, match=expected):
        _reader(mariadb, db, landing, chunk_size=10).run()


def test_stalled_engine_is_reported_naming_server_table_and_chunks(
        shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    engine = ScriptedEngine(landing, f"{db}.items")
    reader = _reader(mariadb, db, landing, chunk_size=30, stall_timeout_seconds=0.5,
                     session_id="run-s")
    thread = threading.Thread(target=lambda: _tick_until_open(engine), daemon=True)
    thread.start()
    with pytest.raises(NoEngineError, match=rf"no capture engine is streaming shop: start the "
                                            rf"stream_changes job \(chunks 0, 1, 2 of {db}\.items, "
                                            "session run-s"):
        reader.run()
    thread.join()
