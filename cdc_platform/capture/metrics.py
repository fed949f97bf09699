"""The capture engine's Prometheus metrics (docs/metrics.md), read when Prometheus scrapes.

A collector over what the engine counts anyway (``EngineStats``, the snapshot coordinator's
sessions, the spill directory) and over the newest binlog headroom reading: the stream thread
does no extra work per event for them, and a scrape sees one consistent moment of each.
Counters count from the process's start, as Prometheus counters do (``rate()`` and
``increase()`` handle the reset at a restart).

The engine's lag is the one the Dagster run reports (``LagClock``): the engine's own figure at
its last commit or heartbeat, plus the time since it last moved, so a stuck or disconnected
engine shows a growing lag instead of a frozen one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.core import InfoMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from cdc_platform.capture.binlog.headroom import BinlogHeadroom, HeadroomStatus, LagClock
from cdc_platform.capture.engine_options import EngineState, EngineStats
from cdc_platform.capture.landing.session_records import SessionState, SnapshotSession
from cdc_platform.metrics import (
    FRESHNESS_HELP,
    FRESHNESS_METRIC,
    MetricsEndpoint,
    Role,
    counter,
    gauge,
    serve,
)

if TYPE_CHECKING:
    from cdc_platform.capture.engine import CaptureEngine
    from cdc_platform.config import Settings

#: Row-event ops as the binlog names them, and as metrics label them (Debezium's letters).
OP_LABELS = {"insert": "c", "update": "u", "delete": "d"}


@dataclass(frozen=True)
class EngineReadings:
    """Where the collector reads a running engine (callables, read at each scrape)."""

    stats: Callable[[], EngineStats]
    sessions: Callable[[], list[SnapshotSession]]
    spill_bytes: Callable[[], int]
    headroom: Callable[[], BinlogHeadroom | None]


class EngineCollector(Collector):
    """``cdc_capture_*``, ``cdc_landing_*``, ``cdc_binlog_*`` and the engine-side
    ``cdc_snapshot_*`` metrics of one source's engine, labelled ``source``."""

    def __init__(self, server_name: str, readings: EngineReadings,
                 freshness_seconds: float) -> None:
        self.server_name = server_name
        self.readings = readings
        self.freshness_seconds = freshness_seconds
        self._clock = LagClock()

    def collect(self) -> Iterator[Metric]:
        source = self.server_name
        stats = self.readings.stats()
        labels = ["source"]

        yield gauge(FRESHNESS_METRIC, FRESHNESS_HELP, labels,
                    [([source], self.freshness_seconds)])
        lag = self._clock.lag(time.time(), stats.lag_seconds, stats.transactions, stats.events,
                              stats.caught_up)
        yield gauge("cdc_capture_lag_seconds",
                     "How far the engine is behind the source: now minus the commit time of the "
                     "newest change it has read, 0 at the end of the binlog (heartbeats); it "
                     "keeps growing while the engine is stuck or disconnected.",
                     labels, [([source], math.nan if lag is None else lag)])
        connected = stats.state == EngineState.STREAMING.value
        yield gauge("cdc_capture_connected",
                     "1 while the engine streams the source's binlog, 0 while it starts, "
                     "reconnects, stops or has failed.", labels, [([source], float(connected))])
        yield counter("cdc_capture_events",
                       "Binlog events the engine has read.", labels, [([source], stats.events)])
        yield counter("cdc_capture_row_changes",
                       "Row changes read from row events, by op (c: insert, u: update, d: "
                       "delete), rolled-back transactions' included.", ["source", "op"],
                       [([source, OP_LABELS[op]], count)
                        for op, count in sorted(dict(stats.row_changes).items())])
        yield counter("cdc_capture_transactions",
                       "Committed transactions the engine has landed.", labels,
                       [([source], stats.transactions)])
        yield counter("cdc_capture_rolled_back_transactions",
                       "Transactions the engine read and discarded: rolled back, or XA "
                       "transactions rolled back after their prepare.", labels,
                       [([source], stats.rolled_back)])
        yield counter("cdc_capture_reconnects",
                       "Times the engine reconnected to the source after losing it.", labels,
                       [([source], stats.reconnects)])
        yield counter("cdc_capture_ddl_statements",
                       "DDL statements the engine has applied to its schemas.", labels,
                       [([source], stats.ddl_statements)])
        info = InfoMetricFamily("cdc_capture_position",
                                "The GTID set of the engine's newest durable checkpoint.",
                                labels=labels)
        info.add_metric([source], {"gtid_set": stats.position})
        yield info
        yield counter("cdc_landing_records",
                       "Records landed in the changelog (changes and snapshot records).",
                       labels, [([source], stats.records)])
        yield counter("cdc_landing_files",
                       "Segment files the engine has written to the landing zone.", labels,
                       [([source], stats.segments_written)])
        yield counter("cdc_landing_bytes",
                       "Bytes of the segment files the engine has written.", labels,
                       [([source], stats.landed_bytes)])
        yield gauge("cdc_capture_spill_bytes",
                     "Bytes of open transactions spilled to disk because they outgrew "
                     "capture.transaction_memory_bytes.", labels,
                     [([source], float(self.readings.spill_bytes()))])
        yield from _headroom(source, self.readings.headroom())
        yield from _snapshots(source, self.readings.sessions())


def _headroom(source: str, headroom: BinlogHeadroom | None) -> Iterator[Metric]:
    """The newest headroom reading; nothing while none is known (absent, not 0: an alert on
    a low headroom must not fire because the source could not be asked)."""
    if headroom is None or headroom.status in (HeadroomStatus.UNKNOWN,
                                               HeadroomStatus.NO_CHECKPOINT):
        return
    if headroom.status is HeadroomStatus.PURGED:
        seconds = 0.0
    else:
        seconds = math.inf if headroom.seconds is None else headroom.seconds
    yield gauge("cdc_binlog_headroom_seconds",
                 "Seconds until the source may purge the binlog file a resume from the "
                 "checkpoint needs (+Inf: no purge by age; 0: purged already).",
                 ["source"], [([source], seconds)])
    yield gauge("cdc_binlog_headroom_low",
                 "1 when the headroom is low or the needed file is purged (the "
                 "binlog_headroom check's verdict).", ["source"], [([source], float(headroom.low))])
    if headroom.bytes_left is not None:
        yield gauge("cdc_binlog_headroom_bytes",
                     "Bytes the binlog may grow before a purge by size removes the needed file.",
                     ["source"], [([source], float(headroom.bytes_left))])


def _snapshots(source: str, sessions: list[SnapshotSession]) -> Iterator[Metric]:
    """Snapshot sessions as the engine commits their chunks: rows and chunks per table, the
    tables still being snapshotted, and sessions by state."""
    tracked = [s for s in sessions if s.state.tracked]
    yield gauge("cdc_snapshot_remaining_tables",
                 "Tables whose snapshot session is open or paused (not yet done).", ["source"],
                 [([source], float(len(tracked)))])
    by_state = {state.value: 0 for state in SessionState}
    for session in sessions:
        by_state[session.state.value] += 1
    yield gauge("cdc_snapshot_sessions",
                 "Snapshot sessions the engine's checkpoint holds, by state.",
                 ["source", "state"], [([source, state], float(n))
                                       for state, n in by_state.items()])
    yield counter("cdc_snapshot_rows",
                   "Rows of snapshot chunks the engine has committed, per table (the table's "
                   "current session).", ["source", "table"],
                   [([source, s.table_id], s.rows) for s in sessions])
    yield counter("cdc_snapshot_chunks",
                   "Snapshot chunks the engine has committed, per table (the table's current "
                   "session).", ["source", "table"],
                   [([source, s.table_id], len(s.committed)) for s in sessions])


def serve_engine_metrics(engine: CaptureEngine, settings: Settings,
                         headroom: Callable[[], BinlogHeadroom | None]) -> MetricsEndpoint | None:
    """Serve the engine's metrics on its source's engine port (``metrics.port``), or None
    when metrics are off. ``headroom``: the newest reading, never a read of the source."""
    port = settings.metrics_port(Role.ENGINE)
    if port is None:
        return None
    registry = CollectorRegistry(auto_describe=True)
    registry.register(EngineCollector(settings.source.server_name, EngineReadings(
        stats=lambda: engine.stats, sessions=engine.snapshot_sessions,
        spill_bytes=engine.spill_bytes, headroom=headroom), settings.lake.freshness_seconds))
    return serve(registry, settings.metrics.host, port,
                 f"the capture engine of {settings.source.server_name!r}")
