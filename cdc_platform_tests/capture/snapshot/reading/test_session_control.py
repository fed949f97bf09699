"""A reader's session under control against a scripted engine (``reading/opening.py``, the
reader's loop): pause, resume and stop, pause and stop signals that race with the session's
opening, a stop event, and a new session replacing a running or a stopped one.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from cdc_platform.capture.landing.session_records import SignalRef
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.snapshot.errors import SnapshotError
from cdc_platform.capture.snapshot.protocol import read_request
from cdc_platform.capture.snapshot.reading import actions
from cdc_platform.capture.snapshot.reading.actions import signal_action
from cdc_platform.capture.snapshot.reading.progress import (
    SnapshotProgress,
    SnapshotResult,
)
from cdc_platform_tests.capture.snapshot.reading.live_engine import _wait_until
from cdc_platform_tests.capture.snapshot.reading.scripted_engine import (
    ScriptedEngine,
    _reader,
    chunk_dir,
)


def test_pause_holds_reading_resume_continues_and_stop_ends_the_run(
        shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    limit = [2]  # the scripted engine commits chunks below this seq, then waits

    def commit_below_limit(seq: int, manifest: dict[str, Any]) -> str:
        return "commit" if seq < limit[0] else "wait"

    with ScriptedEngine(landing, f"{db}.items", commit_below_limit) as engine:
        reader = _reader(mariadb, db, landing, chunk_size=5, max_pending=2)
        progress: list[SnapshotProgress] = []
        outcome: list[SnapshotResult] = []
        thread = threading.Thread(target=lambda: outcome.append(
            reader.run(on_progress=progress.append)), daemon=True)
        thread.start()
        _wait_until(lambda: engine.session is not None and len(engine.session["committed"]) == 2)
        reader.pause()
        _wait_until(lambda: engine.session["state"] == "paused")
        limit[0] = 100
        directory = chunk_dir(landing, db, "items", reader.session_id)
        time.sleep(0.2)
        files = len(list(directory.glob("*.json")))
        time.sleep(0.4)
        assert len(list(directory.glob("*.json"))) == files  # paused: no reading
        assert len(engine.session["committed"]) == 2  # paused: no commits
        assert progress[-1].state == "paused"
        limit[0] = 8
        reader.resume()
        _wait_until(lambda: len(engine.session["committed"]) == 8)
        reader.stop()
        thread.join(30)
        _wait_until(lambda: engine.session["state"] == "stopped")
    assert (outcome[0].status, outcome[0].chunks) == ("stopped", 8)


def test_a_pause_signal_before_the_run_opened_its_session_opens_it_paused(
        shop: tuple[Any, str, LandingZone]) -> None:
    """execute-snapshot, then pause-snapshot while the run is still queued: the run opens its
    session paused; a replayed pause does nothing; resume-snapshot lets it finish."""
    mariadb, db, landing = shop
    launched_by = SignalRef("snap", "topic-1", 3)
    hold, go = SignalRef("hold", "topic-1", 4), SignalRef("go", "topic-1", 5)
    assert signal_action(landing, db, "items", "pause", hold) == \
        f"{db}.items: no running snapshot session to pause"
    assert signal_action(landing, db, "items", "pause", hold, run_pending=True) == \
        f"{db}.items: no session open yet; the snapshot run of an earlier signal opens it paused"
    assert "already recorded" in signal_action(landing, db, "items", "pause", hold,
                                               run_pending=True)
    with ScriptedEngine(landing, f"{db}.items") as engine:
        reader = _reader(mariadb, db, landing, chunk_size=10, signal=launched_by)
        outcome: list[SnapshotResult] = []
        thread = threading.Thread(target=lambda: outcome.append(reader.run()), daemon=True)
        thread.start()
        _wait_until(lambda: engine.session is not None and engine.session["state"] == "paused")
        time.sleep(0.3)
        assert not list(chunk_dir(landing, db, "items", reader.session_id).glob("*.json"))
        assert signal_action(landing, db, "items", "pause", hold, run_pending=True) == \
            f"{db}.items: pause already applied by this signal"
        assert signal_action(landing, db, "items", "resume", go, run_pending=True) == \
            f"{db}.items: session {reader.session_id}: resume requested"
        thread.join(30)
    assert (outcome[0].status, outcome[0].rows, outcome[0].chunks) == ("done", 100, 10)


def test_a_run_of_a_later_signal_ignores_an_earlier_pause(
        shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    signal_action(landing, db, "items", "pause", SignalRef("hold", "topic-1", 4),
                  run_pending=True)
    with ScriptedEngine(landing, f"{db}.items"):
        result = _reader(mariadb, db, landing, chunk_size=50,
                         signal=SignalRef("snap", "topic-1", 6)).run()
    assert (result.status, result.rows) == ("done", 100)


def test_stop_event_writes_stop_and_returns(shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    stop_event = threading.Event()

    def on_progress(progress: SnapshotProgress) -> None:
        if progress.chunks >= 3:
            stop_event.set()

    with ScriptedEngine(landing, f"{db}.items") as engine:
        result = _reader(mariadb, db, landing, chunk_size=5).run(stop_event, on_progress)
        _wait_until(lambda: engine.session["state"] == "stopped")
    assert result.status == "stopped" and 3 <= result.chunks < 20
    request = read_request(landing, db, "items")
    assert request is not None and request.action == "stop"


def test_a_new_session_replaces_the_old_one_and_removes_its_chunks(
        shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    # (the first session's chunks wait for good: it can only end by being replaced)
    with ScriptedEngine(landing, f"{db}.items",
                        lambda s, m: "commit" if m["session_id"] == "run-b" else "wait"):
        first = _reader(mariadb, db, landing, chunk_size=50, session_id="run-a")
        errors: list[BaseException] = []

        def run_first() -> None:
            try:
                first.run()
            except BaseException as error:  # noqa: BLE001 - checked below
                errors.append(error)

        thread = threading.Thread(target=run_first, daemon=True)
        thread.start()
        _wait_until(lambda: any(chunk_dir(landing, db, "items", "run-a").glob("*.json")))
        second = _reader(mariadb, db, landing, chunk_size=50, session_id="run-b",
                         keep_chunks=False)
        result = second.run()
        thread.join(30)
    assert result.status == "done"
    assert errors and isinstance(errors[0], SnapshotError)
    assert "replaced by session run-b" in str(errors[0])
    assert not (landing.root / "snapshots" / db / "items" / "chunks").exists() or not any(
        (landing.root / "snapshots" / db / "items" / "chunks").iterdir())


def test_a_stopped_session_replaced_before_its_reader_saw_the_stop_still_ends_stopped(
        shop: tuple[Any, str, LandingZone]) -> None:
    """A stop, then at once a new snapshot of the table (a signal after a stop-snapshot, or the
    platform's own snapshot of a table the stop freed): the stopped run ends as stopped, not
    failed as replaced, and the new one reads the table."""
    mariadb, db, landing = shop
    with ScriptedEngine(landing, f"{db}.items",
                        lambda s, m: "commit" if m["session_id"] == "run-b" else "wait"
                        ) as engine:
        # (polls its request every 2 s while paused: the new run starts in between)
        first = _reader(mariadb, db, landing, chunk_size=50, session_id="run-a",
                        poll_seconds=2.0)
        outcome: list[SnapshotResult | BaseException] = []

        def run_first() -> None:
            try:
                outcome.append(first.run())
            except BaseException as error:  # noqa: BLE001 - checked below
                outcome.append(error)

        thread = threading.Thread(target=run_first, daemon=True)
        thread.start()
        _wait_until(lambda: engine.session is not None and engine.session["state"] == "open")
        first.pause()
        _wait_until(lambda: engine.session["state"] == "paused")
        time.sleep(0.3)  # (the first reader has seen the pause and sleeps)
        actions.request_action(landing, db, "items", "stop")
        second = _reader(mariadb, db, landing, chunk_size=50, session_id="run-b")
        result = second.run()
        thread.join(30)
    assert isinstance(outcome[0], SnapshotResult), outcome[0]
    assert outcome[0].status == "stopped"
    assert (result.status, result.rows) == ("done", 100)
