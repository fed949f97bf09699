"""Where a running engine stands, watched from outside (``capture/standing.py``): the
headroom probe never makes its watcher wait for the source, a tick gives the lag and the
newest reading, and the watcher warns when the headroom becomes low and while it stays low."""

from __future__ import annotations

import threading
import time

import pytest

from cdc_platform.capture import standing
from cdc_platform.capture.binlog.headroom import BinlogHeadroom, HeadroomStatus
from cdc_platform.capture.engine_options import EngineStats
from cdc_platform.capture.standing import HeadroomProbe, StandingReport


def test_the_probe_never_waits_for_the_source() -> None:
    release = threading.Event()
    reads = []

    def read() -> BinlogHeadroom:
        reads.append(time.monotonic())
        release.wait(5)
        return BinlogHeadroom(HeadroomStatus.OK, needed_file="binlog.000001")

    probe = HeadroomProbe(read, every=3600)
    started = time.monotonic()
    assert probe.poll() == (None, False)  # the reading started, on its own thread
    assert probe.poll() == (None, False)
    assert time.monotonic() - started < 0.5
    release.set()
    deadline = time.monotonic() + 5
    while (found := probe.poll())[0] is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert found == (BinlogHeadroom(HeadroomStatus.OK, needed_file="binlog.000001"), True)
    assert probe.poll()[1] is False  # not new any more
    assert len(reads) == 1  # the next one is due an hour later


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def warning(self, message: str) -> None:
        self.lines.append(("warning", message))

    def info(self, message: str) -> None:
        self.lines.append(("info", message))


def test_the_run_warns_when_the_headroom_becomes_low_and_again_while_it_stays_low(
        monkeypatch: pytest.MonkeyPatch) -> None:
    low = BinlogHeadroom(HeadroomStatus.LOW, needed_file="binlog.000007", seconds=600)
    ok = BinlogHeadroom(HeadroomStatus.OK, needed_file="binlog.000009", seconds=7200,
                        at_least=True, caught_up=True)
    log = Log()
    report = StandingReport(lambda: ok, log, every=3600)
    report.tell(low)
    report.tell(low)  # still low: once a quarter hour is enough
    assert log.lines == [("warning", f"binlog headroom {low.describe()}")]
    monkeypatch.setattr(standing, "HEADROOM_WARN_EVERY_SECONDS", 0.0)
    report.tell(low)
    assert log.lines[-1][0] == "warning" and len(log.lines) == 2
    report.tell(ok)
    report.tell(ok)
    assert log.lines[2:] == [("info", f"binlog headroom: {ok.describe()}")]
    report.tell(low)
    assert log.lines[-1] == ("warning", f"binlog headroom {low.describe()}")


def test_a_tick_gives_the_lag_and_the_newest_reading() -> None:
    ok = BinlogHeadroom(HeadroomStatus.OK, needed_file="binlog.000009", seconds=7200,
                        at_least=True, caught_up=False)
    log = Log()
    report = StandingReport(lambda: ok, log, every=3600)
    stats = EngineStats(lag_seconds=4.0, transactions=3, events=10)
    deadline = time.monotonic() + 5
    while (found := report.tick(stats))[1] is None and time.monotonic() < deadline:
        time.sleep(0.01)
    lag, headroom = found
    assert headroom == ok and lag == pytest.approx(4.0, abs=1.0)
    assert log.lines == [("info", f"binlog headroom: {ok.describe()}")]
