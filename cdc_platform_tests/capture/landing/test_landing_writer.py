"""The landing writer's contract (``capture/landing/writer.py``), without a database: jobs in
order, one in flight, a failure raised on the submitting thread and never followed by a job."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from cdc_platform.capture.events import EngineError
from cdc_platform.capture.landing.writer import LandingFailed, LandingWriter


def test_jobs_run_in_order_one_at_a_time_off_the_submitting_thread():
    writer = LandingWriter("test")
    done: list[int] = []
    running = []
    threads = set()
    overlapped = []

    def job(n: int):
        def run():
            running.append(n)
            overlapped.append(len(running) > 1)
            threads.add(threading.current_thread().name)
            time.sleep(0.02)
            done.append(n)
            running.remove(n)
        return run

    submitted_while_running = []
    for n in range(5):
        writer.submit(job(n))
        # submit returned at once: the job is still running (written while the stream goes on)
        submitted_while_running.append(len(done) == n)
    writer.wait()
    assert done == [0, 1, 2, 3, 4]
    assert not any(overlapped)
    assert all(submitted_while_running)
    assert threading.current_thread().name not in threads
    writer.close()
    assert not any(t.name.startswith("test") for t in threading.enumerate())


def test_submit_waits_for_the_previous_job():
    writer = LandingWriter("test")
    release = threading.Event()
    writer.submit(release.wait)
    started = time.monotonic()
    threading.Timer(0.3, release.set).start()
    writer.submit(lambda: None)  # at most one job in flight: waits for the first
    assert time.monotonic() - started >= 0.25
    writer.close()


def test_a_failure_is_raised_at_the_next_submit_and_every_later_one_and_stops_the_jobs():
    writer = LandingWriter("test")
    ran = []

    def failing():
        raise OSError(28, "No space left on device")

    writer.submit(failing)
    with pytest.raises(LandingFailed, match=r"OSError.*No space left on device.*checkpoint "
                                            r"stays at the last flush") as raised:
        writer.submit(lambda: ran.append("checkpoint"))
    assert isinstance(raised.value, EngineError)  # a loud stop, not a retriable error
    assert isinstance(raised.value.__cause__, OSError)
    assert writer.failed
    with pytest.raises(LandingFailed):
        writer.wait()
    with pytest.raises(LandingFailed):
        writer.submit(lambda: ran.append("later"))
    writer.close()
    assert ran == []  # nothing after the failed job, above all no checkpoint


def test_close_waits_for_the_job_in_flight_and_logs_a_failure_nobody_was_told_of(caplog):
    writer = LandingWriter("test", logging.getLogger("test-writer"))
    done = []

    def slow_then_fail():
        time.sleep(0.2)
        done.append(1)
        raise RuntimeError("disk gone")

    writer.submit(slow_then_fail)
    with caplog.at_level(logging.ERROR, "test-writer"):
        writer.close()
    assert done == [1]
    assert "landing a flush failed too (disk gone)" in caplog.text


def test_close_does_not_log_a_failure_already_raised(caplog):
    writer = LandingWriter("test", logging.getLogger("test-writer"))
    writer.submit(lambda: 1 / 0)
    with pytest.raises(LandingFailed, match="ZeroDivisionError"):
        writer.wait()
    with caplog.at_level(logging.ERROR, "test-writer"):
        writer.close()
    assert caplog.text == ""
