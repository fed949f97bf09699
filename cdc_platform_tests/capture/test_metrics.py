"""The engine's metrics as Prometheus reads them (``capture/metrics.py``): names, labels and
values from what the engine counts, the headroom absent while unknown, and the endpoint
serving them on the source's port (``metrics.port``) with a one-line error when it is taken."""

from __future__ import annotations

import math
import socket
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from cdc_platform.capture.binlog.headroom import BinlogHeadroom, HeadroomStatus
from cdc_platform.capture.engine_options import EngineState, EngineStats
from cdc_platform.capture.landing.session_records import SessionState, SnapshotSession
from cdc_platform.capture.metrics import EngineCollector, EngineReadings
from cdc_platform.capture.start_errors import describe_start_error
from cdc_platform.config import parse_settings
from cdc_platform.metrics import MetricsPortTakenError, Role, serve


def _samples(collector: Collector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _session(table_id: str, state: SessionState, rows: int, chunks: int) -> SnapshotSession:
    return SnapshotSession(table_id=table_id, session_id="s1", state=state, opening="0-1-1",
                           opening_pos=1, horizon="0-1-1", chunk_key=["id"],
                           committed=list(range(chunks)), rows=rows)


def _collector(stats: EngineStats, headroom: BinlogHeadroom | None = None,
               sessions: list[SnapshotSession] | None = None) -> EngineCollector:
    return EngineCollector("shop", EngineReadings(
        stats=lambda: stats, sessions=lambda: list(sessions or []), spill_bytes=lambda: 4096,
        headroom=lambda: headroom), freshness_seconds=60.0)


def test_the_engine_counts_become_prometheus_counters_and_gauges() -> None:
    stats = EngineStats(state=EngineState.STREAMING.value, events=120, transactions=7,
                        records=30, rolled_back=2, reconnects=1, segments_written=3,
                        landed_bytes=9000, position="0-1-42", lag_seconds=0.0, caught_up=True)
    stats.row_changes.update({"insert": 20, "update": 8, "delete": 2})
    got = _samples(_collector(stats))
    src = (("source", "shop"),)
    assert got[("cdc_capture_events_total", src)] == 120
    assert got[("cdc_capture_transactions_total", src)] == 7
    assert got[("cdc_capture_rolled_back_transactions_total", src)] == 2
    assert got[("cdc_capture_reconnects_total", src)] == 1
    assert got[("cdc_capture_connected", src)] == 1
    assert got[("cdc_capture_lag_seconds", src)] == 0
    assert got[("cdc_lake_freshness_seconds", src)] == 60
    assert got[("cdc_landing_files_total", src)] == 3
    assert got[("cdc_landing_bytes_total", src)] == 9000
    assert got[("cdc_capture_spill_bytes", src)] == 4096
    assert got[("cdc_capture_position_info", (("gtid_set", "0-1-42"), ("source", "shop")))] == 1
    for op, n in (("c", 20), ("u", 8), ("d", 2)):
        assert got[("cdc_capture_row_changes_total", (("op", op), ("source", "shop")))] == n


def test_a_reconnecting_engine_is_not_connected_and_its_lag_is_unknown_until_it_moves(
) -> None:
    got = _samples(_collector(EngineStats(state=EngineState.RECONNECTING.value)))
    assert got[("cdc_capture_connected", (("source", "shop"),))] == 0
    assert math.isnan(got[("cdc_capture_lag_seconds", (("source", "shop"),))])


def test_the_headroom_is_absent_while_unknown_and_zero_once_purged() -> None:
    stats = EngineStats()
    unknown = _samples(_collector(stats, BinlogHeadroom(HeadroomStatus.UNKNOWN, reason="x")))
    assert not any(name.startswith("cdc_binlog_headroom") for name, _ in unknown)
    purged = _samples(_collector(stats, BinlogHeadroom(HeadroomStatus.PURGED, reason="gone")))
    assert purged[("cdc_binlog_headroom_seconds", (("source", "shop"),))] == 0
    assert purged[("cdc_binlog_headroom_low", (("source", "shop"),))] == 1
    unbounded = _samples(_collector(stats, BinlogHeadroom(HeadroomStatus.UNBOUNDED)))
    assert unbounded[("cdc_binlog_headroom_seconds", (("source", "shop"),))] == math.inf
    ok = _samples(_collector(stats, BinlogHeadroom(HeadroomStatus.OK, seconds=3600.0)))
    assert ok[("cdc_binlog_headroom_seconds", (("source", "shop"),))] == 3600
    assert ok[("cdc_binlog_headroom_low", (("source", "shop"),))] == 0


def test_snapshot_progress_per_table_and_the_tables_still_snapshotting() -> None:
    sessions = [_session("db.a", SessionState.OPEN, 500, 2),
                _session("db.b", SessionState.DONE, 900, 3),
                _session("db.c", SessionState.PAUSED, 0, 0)]
    got = _samples(_collector(EngineStats(), sessions=sessions))
    assert got[("cdc_snapshot_remaining_tables", (("source", "shop"),))] == 2
    assert got[("cdc_snapshot_rows_total", (("source", "shop"), ("table", "db.a")))] == 500
    assert got[("cdc_snapshot_chunks_total", (("source", "shop"), ("table", "db.b")))] == 3
    assert got[("cdc_snapshot_sessions", (("source", "shop"), ("state", "open")))] == 1
    assert got[("cdc_snapshot_sessions", (("source", "shop"), ("state", "done")))] == 1
    assert got[("cdc_snapshot_sessions", (("source", "shop"), ("state", "stopped")))] == 0


def _settings(port: int, sources: int = 2):
    return parse_settings({
        "sources": [{"flavour": "mariadb", "host": "db", "user": "u", "server_id": i + 1,
                     "server_name": f"s{i}"} for i in range(sources)],
        "landing_zone": {"url": "/l"}, "warehouse": {"url": "/w"},
        "metrics": {"port": port}})


def test_each_source_and_role_has_its_own_port_and_zero_turns_metrics_off() -> None:
    settings = _settings(9400, sources=3)
    ports = [settings.for_source(f"s{i}").metrics_port(role)
             for i in range(3) for role in Role]
    assert ports == list(range(9400, 9412))  # engine, applier, snapshot runs, publisher
    assert _settings(0).for_source("s1").metrics_port(Role.ENGINE) is None


def test_a_metrics_port_range_past_65535_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="metrics.port 65530"):
        _settings(65530, sources=2)


def test_the_endpoint_serves_the_registry_and_a_taken_port_is_one_line() -> None:
    stats = EngineStats(events=5)
    registry = CollectorRegistry()
    registry.register(_collector(stats))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with serve(registry, "127.0.0.1", port, "the capture engine of 'shop'") as endpoint:
        body = urllib.request.urlopen(endpoint.url, timeout=5).read().decode()
        assert 'cdc_capture_events_total{source="shop"} 5.0' in body
        with pytest.raises(MetricsPortTakenError) as taken:
            serve(CollectorRegistry(), "127.0.0.1", port, "the capture engine of 'shop'")
    line = describe_start_error(taken.value)
    assert line is not None and "\n" not in line
    assert f"127.0.0.1:{port}" in line and "metrics.port" in line
    # closed: the port is free again for the next run
    serve(CollectorRegistry(), "127.0.0.1", port, "again").close()
