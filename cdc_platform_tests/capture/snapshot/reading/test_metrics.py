"""A snapshot run's metrics (``capture/snapshot/reading/metrics.py``): what its readers read
per table and the tables it has left; a second run of the same source on one host warns that
the port is taken and reads on."""

from __future__ import annotations

import logging
import socket

import pytest

from cdc_platform.capture.snapshot.reading.metrics import (
    ReadingTable,
    SnapshotRunCollector,
    serve_snapshot_metrics,
)
from cdc_platform.capture.snapshot.reading.progress import ReaderState, SnapshotProgress
from cdc_platform_tests.capture.test_metrics import _samples, _settings


def test_a_snapshot_run_serves_what_its_readers_read_and_the_tables_left() -> None:
    progress = SnapshotProgress(table_id="db.a", session_id="s1", state=ReaderState.OPEN,
                                rows=64, chunks=2, pending=1, rejected=1, reselected=0,
                                last_key=[64], elapsed_seconds=3.0)
    collector = SnapshotRunCollector("shop", lambda: [
        ReadingTable("db.a", progress, False), ReadingTable("db.b", None, False),
        ReadingTable("db.c", None, True)], freshness_seconds=60.0)
    got = _samples(collector)
    table = (("source", "shop"), ("table", "db.a"))
    assert got[("cdc_snapshot_run_remaining_tables", (("source", "shop"),))] == 2
    assert got[("cdc_snapshot_read_rows_total", table)] == 64
    assert got[("cdc_snapshot_read_chunks_total", table)] == 2
    assert got[("cdc_snapshot_rejected_chunks_total", table)] == 1
    assert got[("cdc_snapshot_pending_chunks", table)] == 1
    for state, value in (("open", 1), ("done", 0)):
        labels = tuple(sorted((*table, ("state", state))))
        assert got[("cdc_snapshot_reader_state", labels)] == value


def test_a_second_snapshot_run_on_the_port_warns_and_reads_on(
        caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = _settings(port, sources=1).for_source("s0")
    settings = settings.model_copy(update={"metrics": settings.metrics.model_copy(
        update={"host": "127.0.0.1", "port": port - 2})})
    log = logging.getLogger("test.snapshot")
    first = serve_snapshot_metrics(settings, lambda: [], log)
    assert first is not None and first.port == port
    try:
        with caplog.at_level(logging.WARNING, logger="test.snapshot"):
            assert serve_snapshot_metrics(settings, lambda: [], log) is None
        assert "is taken" in caplog.text and "not served" in caplog.text
    finally:
        first.close()
