"""Every metric name the platform's processes export, as Prometheus stores them (counters
with ``_total``, histograms with ``_bucket``/``_sum``/``_count``, info with ``_info``): read
from the collectors themselves, fed with readings that make every family yield samples, so
that the alert rules and the dashboard are checked against the code, not against a list."""

from __future__ import annotations

import re
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cdc_platform.capture.binlog.headroom import BinlogHeadroom, HeadroomStatus
from cdc_platform.capture.engine_options import EngineStats
from cdc_platform.capture.landing.session_records import SessionState, SnapshotSession
from cdc_platform.capture.metrics import EngineCollector, EngineReadings
from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.capture.snapshot.reading.metrics import ReadingTable, SnapshotRunCollector
from cdc_platform.capture.snapshot.reading.progress import ReaderState, SnapshotProgress
from cdc_platform.lake.applier.events import Applied, Failed, Maintained, Reconciled
from cdc_platform.lake.merge import MergeResult
from cdc_platform.lake.metrics import ApplierMetrics
from cdc_platform.lake.reconcile import ReconcileResult
from cdc_platform.topics.metrics import PublisherMetrics
from cdc_platform.topics.publisher import PublisherStats


def sample_names(registry: CollectorRegistry) -> set[str]:
    text = generate_latest(registry).decode()
    return {sample.name for family in text_string_to_metric_families(text)
            for sample in family.samples}


def _engine() -> EngineCollector:
    stats = EngineStats(row_changes={"insert": 1})
    session = SnapshotSession(table_id="db.t", session_id="s", state=SessionState.OPEN,
                              opening="0-1-1", opening_pos=1, horizon="0-1-1",
                              chunk_key=["id"], committed=[1], rows=1)
    return EngineCollector("s", EngineReadings(
        stats=lambda: stats, sessions=lambda: [session], spill_bytes=lambda: 0,
        headroom=lambda: BinlogHeadroom(HeadroomStatus.OK, seconds=1.0, bytes_left=1)),
        freshness_seconds=60.0)


def _snapshot_run() -> SnapshotRunCollector:
    progress = SnapshotProgress("db.t", "s", ReaderState.OPEN, 1, 1, 0, 0, 0, None, 1.0)
    return SnapshotRunCollector("s", lambda: [ReadingTable("db.t", progress, False)], 60.0)


def applier_metrics_with_samples() -> ApplierMetrics:
    """An ``ApplierMetrics`` that has seen one event of each kind (no applier attached: the
    per-target gauges are added by ``exported_metric_names``)."""
    schema = TableSchema("db", "t", (ColumnSpec("id", "int"),), ("id",))
    metrics = ApplierMetrics("s", 60.0)
    result = MergeResult(table_id="db.t", identifier="x", snapshot=None, committed=True, rows=1,
                         inserts=1, updates=0, deletes=0, records_read=1, consumed_pos=1,
                         consumed_gtid=None, duration_seconds=0.1, schema_changed=False)
    metrics.observe(Applied(schema, result))
    metrics.observe(Failed(schema, "x", 1))
    metrics.observe(Maintained(schema, "x", {}, "orphans"))
    metrics.observe(Reconciled(schema, ReconcileResult("db.t", 1, 1, 1, 0, 0, 0, 0), None,
                               True))
    metrics.pass_done(1.0)
    return metrics


#: The per-target gauges, read from an attached applier's state.
TARGET_GAUGES = {"cdc_target_lag_seconds", "cdc_target_seconds_since_commit"}


def _publisher() -> PublisherMetrics:
    """A change-topic publisher's metrics, with a sample of each (the collector reads only
    the publisher's stats)."""
    stats = PublisherStats(messages={"db.t": 3}, batches=1, through={"db.t": 9},
                           last_commit=1.0, pending_since_ms={"db.t": 1_000})
    return PublisherMetrics("s", 60.0, SimpleNamespace(stats=stats))  # type: ignore[arg-type]


def exported_metric_names() -> set[str]:
    registry = CollectorRegistry()
    for collector in (_engine(), _snapshot_run(), applier_metrics_with_samples(),
                      _publisher()):
        registry.register(collector)
    return sample_names(registry) | TARGET_GAUGES


# A metric name in an expression: not a function call, not a label matcher (``cdc_role="x"``).
_METRIC = re.compile(r"\b(cdc_[a-z0-9_]+|up)\b(?!\s*(?:\(|=|!=|=~|!~))")

def metric_names(expression: str) -> set[str]:
    """The metric names an expression reads (labels in ``by``/``on`` lists are not)."""
    without_groupings = re.sub(r"\b(?:by|on|without|ignoring|group_left|group_right)\s*\([^)]*\)",
                               " ", expression)
    return set(_METRIC.findall(without_groupings))
