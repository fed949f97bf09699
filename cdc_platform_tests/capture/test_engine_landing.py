"""Landing on the writer thread (``capture/landing/writer.py``) against a real MariaDB: segments
are written while the stream goes on, yet every checkpoint covers only durable segments, a
failed write stops the engine loudly with the checkpoint where it was, the stop waits for the
last write, and a kill while a flush is being written loses and duplicates nothing."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pyarrow.parquet as pq
import pytest

from cdc_platform.capture.engine import CaptureEngine
from cdc_platform.capture.events import EngineError
from cdc_platform.capture.landing.writer import LandingFailed
from cdc_platform_tests.conftest import CdcEnv

# A flush after every event (with ``_slow_stream``): one flush (segment and checkpoint) per
# 100-row transaction, so flushes are counted by transactions. (By rows, a transaction reaching
# flush_max_rows would land mid-commit, without its checkpoint.)
pytestmark = pytest.mark.cdc_config(capture={"flush_interval_seconds": 0.001,
                                               "flush_max_segments_per_second": 0})


def _slow_stream(engine: CaptureEngine) -> None:
    """Each event takes longer than the flush interval, waiting as on a socket read (the
    writer thread gets the GIL meanwhile): every transaction is flushed on its own."""
    handle = engine._handle

    def handle_waiting(event):
        time.sleep(0.002)
        return handle(event)

    engine._handle = handle_waiting


def _insert_batches(env: CdcEnv, batches: int) -> None:
    env.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20))")
    for batch in range(batches):
        env.execute(f"INSERT INTO t SELECT seq, 'v' FROM seq_{batch * 100 + 1}_to_"
                    f"{batch * 100 + 100}")


def _records(env: CdcEnv) -> list[dict]:
    rows: list[dict] = []
    for _, _, path in env.landing.segments(env.db, "t"):
        rows += pq.read_table(path).to_pylist()
    return sorted(rows, key=lambda r: r["__cdc_pos"])


def _assert_landed_once(env: CdcEnv, count: int) -> None:
    landed = _records(env)
    assert [r["id"] for r in landed] == list(range(1, count + 1))
    assert [r["__cdc_pos"] for r in landed] == list(range(1, count + 1))
    assert env.landing.read_checkpoint().next_pos == count + 1


def test_each_checkpoint_covers_only_durable_segments_while_landing_overlaps_decoding(cdc_env):
    env = cdc_env
    _insert_batches(env, 8)
    engine = env.engine()
    landing = engine.landing
    write_segment, write_checkpoint = landing.write_segment, landing.write_checkpoint
    events_while_writing = []
    uncovered = []
    writer_threads = set()

    def slow_segment(*args):
        before = engine.stats.events
        time.sleep(0.05)
        path = write_segment(*args)
        events_while_writing.append(engine.stats.events - before)
        writer_threads.add(threading.current_thread().name)
        return path

    def covered_checkpoint(checkpoint):
        # Every position the checkpoint covers is in a segment already on disk.
        on_disk = {p for first, last, _ in landing.segments(env.db, "t")
                   for p in range(first, last + 1)}
        uncovered.extend(p for p in range(1, checkpoint.next_pos) if p not in on_disk)
        write_checkpoint(checkpoint)

    _slow_stream(engine)
    landing.write_segment, landing.write_checkpoint = slow_segment, covered_checkpoint
    stats = engine.run(stop_when_caught_up=True)
    assert uncovered == []
    assert sum(events_while_writing) > 0  # the stream went on while segments were written
    assert threading.current_thread().name not in writer_threads
    assert stats.segments_written == 8 and stats.records_by_table == {f"{env.db}.t": 800}
    _assert_landed_once(env, 800)


def test_a_failed_segment_write_stops_the_engine_loudly_and_the_checkpoint_stays(cdc_env):
    env = cdc_env
    _insert_batches(env, 6)
    engine = env.engine()
    write_segment = engine.landing.write_segment
    calls = []

    def third_write_fails(*args):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(28, "simulated: no space left on device")
        return write_segment(*args)

    _slow_stream(engine)
    engine.landing.write_segment = third_write_fails
    with pytest.raises(LandingFailed, match=r"landing a flush failed: OSError.*simulated: no "
                                            r"space left") as raised:
        engine.run(stop_when_caught_up=True)
    assert isinstance(raised.value, EngineError)
    assert engine.state.value == "failed"
    # The checkpoint is the one of the flush before the failed one, and nothing was written
    # after the failure.
    assert env.landing.read_checkpoint().next_pos == 201
    assert [first for first, _, _ in env.landing.segments(env.db, "t")] == [1, 101]
    env.catch_up()
    _assert_landed_once(env, 600)


def test_the_stop_waits_for_the_last_flush_to_land(cdc_env):
    env = cdc_env
    _insert_batches(env, 1)
    env.execute("INSERT INTO t VALUES (101, 'last')")
    engine = env.engine()
    write_checkpoint = engine.landing.write_checkpoint

    def slow_checkpoint(checkpoint):
        time.sleep(0.3)
        write_checkpoint(checkpoint)

    engine.landing.write_checkpoint = slow_checkpoint
    stats = engine.run(stop_when_caught_up=True)
    # Returned means landed: the last checkpoint is on disk, the writer thread is gone.
    _assert_landed_once(env, 101)
    assert stats.position == env.landing.read_checkpoint().gtid and stats.next_pos == 102
    assert not [t for t in threading.enumerate() if t.name.startswith(f"landing-{env.server_name}")]


def test_a_failure_of_the_last_flush_fails_the_run(cdc_env):
    env = cdc_env
    _insert_batches(env, 1)
    engine = env.engine()
    write_checkpoint = engine.landing.write_checkpoint

    def failing_checkpoint(checkpoint):
        if checkpoint.next_pos > 1:
            raise OSError(5, "simulated: input/output error")
        write_checkpoint(checkpoint)

    engine.landing.write_checkpoint = failing_checkpoint
    with pytest.raises(LandingFailed, match="simulated: input/output error"):
        engine.run(stop_when_caught_up=True)
    checkpoint = env.landing.read_checkpoint()
    assert checkpoint is None or checkpoint.next_pos == 1
    env.catch_up()
    _assert_landed_once(env, 100)


_KILLED_MID_FLUSH = """
import pathlib, sys, time
from cdc_platform.capture.engine import CaptureEngine, EngineOptions
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.config import load_settings

settings = load_settings(sys.argv[1])
landing = LandingZone(settings.landing_zone.url, settings.source.server_name)
write_checkpoint = landing.write_checkpoint
with_rows = []

def second_checkpoint_hangs(checkpoint):
    if checkpoint.next_pos > 1:
        with_rows.append(checkpoint)
        if len(with_rows) == 2:  # its segments are durable, the checkpoint is not
            pathlib.Path(sys.argv[2]).touch()
            time.sleep(600)
    write_checkpoint(checkpoint)

landing.write_checkpoint = second_checkpoint_hangs
engine = CaptureEngine(EngineOptions.from_settings(settings), landing)
handle = engine._handle
engine._handle = lambda event: (time.sleep(0.002), handle(event))[1]  # (as _slow_stream)
engine.run()
"""


def test_a_kill_while_a_flush_is_written_loses_and_duplicates_nothing(cdc_env, tmp_path):
    env = cdc_env
    _insert_batches(env, 5)
    marker = tmp_path / "hanging"
    engine = subprocess.Popen([sys.executable, "-c", _KILLED_MID_FLUSH, str(env.write_config()),
                               str(marker)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert engine.poll() is None, engine.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the engine never reached its second flush"
            time.sleep(0.05)
        time.sleep(0.3)  # the stream thread decodes on, and waits at its next flush
    finally:
        engine.kill()
        engine.wait()
    assert env.landing.read_checkpoint().next_pos == 101
    assert [first for first, _, _ in env.landing.segments(env.db, "t")][:2] == [1, 101]
    env.catch_up()
    _assert_landed_once(env, 500)


def test_segments_dictionary_encode_the_change_metadata_only(cdc_env):
    """docs/landing-zone.md: zstd, dictionaries for ``__cdc_gtid``/``__cdc_op``/``__cdc_ts_ms``
    (a few values a segment), the plain encoding elsewhere; standard Parquet either way."""
    env = cdc_env
    _insert_batches(env, 2)
    env.catch_up()
    for _, _, path in env.landing.segments(env.db, "t"):
        metadata = pq.ParquetFile(path).metadata
        for group in range(metadata.num_row_groups):
            for index in range(metadata.num_columns):
                column = metadata.row_group(group).column(index)
                dictionary = any("DICTIONARY" in e for e in column.encodings)
                assert column.compression == "ZSTD"
                assert dictionary == (column.path_in_schema in (
                    "__cdc_gtid", "__cdc_op", "__cdc_ts_ms")), column.path_in_schema
    _assert_landed_once(env, 200)
    assert {r["v"] for r in _records(env)} == {"v"}
