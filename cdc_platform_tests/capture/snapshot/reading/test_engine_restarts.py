"""Snapshots with the real capture engine paused, stopped and restarted underneath, and several
tables at once: chunks waiting for the engine lose the keys the stream changed, chunks older
than a restarted engine's touched-key log are rejected and read again, and the target still
equals the source.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from cdc_platform.capture.snapshot.reading.progress import (
    SnapshotProgress,
    SnapshotResult,
)
from cdc_platform_tests.capture.snapshot.reading.live_engine import (
    EngineThread,
    _engine_session,
    _engine_state,
    _items,
    _requested,
    _wait_caught_up,
    _wait_paused_and_caught_up,
    _wait_until,
    finish_and_reconcile,
    invisible,
    snapshot_reader,
    streaming,
)
from cdc_platform_tests.capture.snapshot.reading.scripted_engine import chunk_dir
from cdc_platform_tests.conftest import CdcEnv


def test_pause_resume_and_stop_with_the_engine(cdc_env: CdcEnv, spark: Any) -> None:
    env = cdc_env
    _items(env)
    invisible(env, "INSERT INTO items SELECT seq, 'x', seq, 'a' FROM seq_1_to_300")
    with streaming(env):
        reader = snapshot_reader(env, "items", chunk_size=10, max_pending=2)
        progress: list[SnapshotProgress] = []
        outcome: list[SnapshotResult] = []
        thread = threading.Thread(target=lambda: outcome.append(
            reader.run(on_progress=progress.append)), daemon=True)
        thread.start()
        _wait_until(lambda: bool(progress) and progress[-1].chunks >= 3)
        reader.pause()
        _wait_until(lambda: _engine_state(env, "items") == "paused")
        time.sleep(0.5)  # let an in-flight chunk land
        committed = len(_engine_session(env, "items")["committed"])
        time.sleep(1.0)
        assert len(_engine_session(env, "items")["committed"]) == committed
        assert progress[-1].state == "paused"
        reader.resume()
        thread.join(120)
        assert outcome[0].status == "done" and outcome[0].rows == 300

        stop_event = threading.Event()
        stopped = snapshot_reader(env, "items", chunk_size=10).run(
            stop_event, lambda p: stop_event.set() if p.chunks >= 2 else None)
        assert stopped.status == "stopped"
        _wait_until(lambda: _engine_state(env, "items") == "stopped")
        again = snapshot_reader(env, "items", chunk_size=50).run()
        assert again.status == "done" and again.rows == 300
    finish_and_reconcile(env, spark, "items")


def test_several_tables_at_once(cdc_env: CdcEnv, spark: Any) -> None:
    env = cdc_env
    tables = ("t_a", "t_b", "t_c")
    for index, table in enumerate(tables):
        _items(env, table)
        invisible(env, f"INSERT INTO {table} SELECT seq, 'x', seq, 'a' "
                       f"FROM seq_1_to_{300 * (index + 1)}")
    results: dict[str, SnapshotResult] = {}
    errors: list[BaseException] = []

    def snapshot(table: str) -> None:
        try:
            results[table] = snapshot_reader(env, table, chunk_size=50).run()
        except BaseException as error:  # noqa: BLE001 - asserted below
            errors.append(error)

    with streaming(env):
        threads = [threading.Thread(target=snapshot, args=(t,), daemon=True) for t in tables]
        for thread in threads:
            thread.start()
        for i in range(100):  # concurrent traffic on every table
            env.execute(*[f"UPDATE {t} SET name = 'w{i}' WHERE id = {i * 3 + 1}" for t in tables])
        for thread in threads:
            thread.join(180)
    assert not errors, errors
    assert {t: (r.status, r.rows) for t, r in results.items()} == {
        "t_a": ("done", 300), "t_b": ("done", 600), "t_c": ("done", 900)}
    finish_and_reconcile(env, spark, *tables)


def test_changes_to_keys_of_chunks_waiting_for_the_engine_are_dropped_from_them(
        cdc_env: CdcEnv, spark: Any) -> None:
    """Updates, deletes and re-inserts of keys inside chunks already read but not committed:
    the engine drops those keys from the chunks (the stream carries their newer state), and
    the target still equals the source."""
    env = cdc_env
    _items(env)
    invisible(env, "INSERT INTO items SELECT seq, 'x', seq, 'a' FROM seq_1_to_200")
    engine = EngineThread(env)
    engine.start()
    _wait_caught_up(env)
    reader = snapshot_reader(env, "items", chunk_size=50, max_pending=8)
    stopped: list[bool] = []

    def on_progress(progress: SnapshotProgress) -> None:
        if progress.state == "open" and not stopped:
            stopped.append(True)
            engine.stop()  # acknowledged: the chunks are read while no engine decides them

    outcome: list[SnapshotResult] = []
    thread = threading.Thread(target=lambda: outcome.append(reader.run(on_progress=on_progress)),
                              daemon=True)
    thread.start()
    # Chunks 0-2 are published; the complete chunk 3 waits in the reader for them.
    _wait_until(lambda: len(list(chunk_dir(env.landing, env.db, "items", reader.session_id)
                                 .glob("*.json"))) == 3)
    env.execute("UPDATE items SET name = 'updated' WHERE id IN (10, 60, 110)",
                "DELETE FROM items WHERE id IN (20, 70)",
                "DELETE FROM items WHERE id = 30",
                "INSERT INTO items VALUES (30, 'inserted again', 1, 'b')")
    # Paused, the engine records the touches without deciding a chunk, so it processes all
    # of them before it commits one (else it may commit at the chunks' watermark first).
    reader.pause()
    engine.start()
    _wait_paused_and_caught_up(env, "items")
    reader.resume()
    thread.join(60)
    engine.stop()
    [result] = outcome
    assert (result.status, result.rows, result.chunks) == ("done", 200, 4)
    assert result.rows_emitted == 200 - 6  # keys 10, 20, 30, 60, 70, 110 came from the stream
    finish_and_reconcile(env, spark, "items")
    assert {r["id"]: r["name"] for r in env.target_rows(spark, "items")
            if r["id"] in (10, 20, 30)} == {10: "updated", 30: "inserted again"}


def test_engine_restarts_mid_snapshot_reject_stale_chunks_which_are_read_again(
        cdc_env: CdcEnv, spark: Any) -> None:
    """After a restart the touched-key log starts empty at the resumed position: chunks whose
    low watermark predates it are rejected, read again, and the snapshot still ends exact."""
    env = cdc_env
    _items(env)
    invisible(env, "INSERT INTO items SELECT seq, 'x', seq, 'a' FROM seq_1_to_400")
    engine = EngineThread(env)
    engine.start()
    _wait_caught_up(env)
    reader = snapshot_reader(env, "items", chunk_size=20, max_pending=4)

    done: set[str] = set()  # each step once: progress repeats after the rejections

    def on_progress(progress: SnapshotProgress) -> None:
        if progress.state == "open" and progress.pending == 0 and "stop" not in done:
            done.add("stop")
            engine.stop()  # acknowledged, nothing read yet: the engine goes down
        elif progress.pending == 4 and progress.state == "open" and "pause" not in done:
            done.add("pause")
            reader.pause()  # four chunks wait for an engine

    outcome: list[SnapshotResult | BaseException] = []

    def run() -> None:
        try:
            outcome.append(reader.run(on_progress=on_progress))
        except BaseException as error:  # noqa: BLE001 - asserted below
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    _wait_until(lambda: _requested(env, "items") == "pause" or bool(outcome))
    # The stream moves on past the chunks' low watermark; the engine processes it while the
    # session is paused (no decisions), checkpoints, and restarts.
    env.execute("UPDATE items SET name = 'moved on' WHERE id % 9 = 0")
    engine.start()
    _wait_paused_and_caught_up(env, "items")
    engine.stop()
    engine.start()
    reader.resume()
    thread.join(120)
    engine.stop()
    [result] = outcome
    assert isinstance(result, SnapshotResult), result
    assert (result.status, result.rows, result.rejected, result.reselected) == (
        "done", 400, 4, 4)
    finish_and_reconcile(env, spark, "items")
