"""The applier's Prometheus metrics (docs/metrics.md): how stale each target really is, its
merges, upkeep and reconciles, and the applier's passes.

Two sources, both off the merge path:

* the applier's events (``Applied``, ``Failed``, ``Maintained``, ``Reconciled``), observed as
  they are emitted (``observing``) into counters and histograms;
* the applier's state, read when Prometheus scrapes: each target's consumed mark and newest
  commit, and the newest survey of the landing zone.

``cdc_target_lag_seconds`` is the real staleness of a target: now minus the source commit time
of the oldest landed change it has not merged, 0 when it has merged everything landed. A
merge's own lag (newest change to commit) says nothing of a table that waits its turn in a long
pass, so it is measured from the landing zone: the first segment past the target's mark, its
``__cdc_ts_ms`` minimum from the footer statistics (``capture.landing.pending.oldest_pending_seconds``,
as the ``fresh`` check reads it), read once per segment and kept.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import Histogram
from prometheus_client.core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from cdc_platform.capture.landing.pending import oldest_pending_seconds, unmerged_segments
from cdc_platform.capture.names import split_table_id
from cdc_platform.config import Settings
from cdc_platform.lake.applier.events import Applied, Event, Failed, Maintained, Reconciled
from cdc_platform.lake.applier.loop import Applier
from cdc_platform.metrics import (
    FRESHNESS_HELP,
    FRESHNESS_METRIC,
    MetricsEndpoint,
    Role,
    counter,
    gauge,
    serve,
)

#: Merges take milliseconds without Spark and seconds with it; a pass over many busy tables
#: takes minutes.
MERGE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                 300.0)
PASS_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
#: Footer readings kept (segment -> oldest commit time): a few per table at a time.
FOOTER_CACHE_ENTRIES = 50_000


class ApplierMetrics(Collector):
    """One applier's metrics, labelled ``source`` (and ``table`` per target)."""

    def __init__(self, server_name: str, freshness_seconds: float) -> None:
        self.server_name = server_name
        self.freshness_seconds = freshness_seconds
        self._applier: Applier | None = None
        self._lock = threading.Lock()
        self._merge_seconds = Histogram(
            "cdc_merge_duration_seconds", "One target's merge: from reading its landed "
            "changes to its Iceberg commit.", ["source"], registry=None, buckets=MERGE_BUCKETS)
        self._pass_seconds = Histogram(
            "cdc_applier_pass_duration_seconds", "One applier pass: merging every table with "
            "new changes, then the upkeep that is due.", ["source"], registry=None,
            buckets=PASS_BUCKETS)
        self._merges: dict[str, int] = defaultdict(int)
        self._records: dict[str, int] = defaultdict(int)
        self._failures: dict[str, int] = defaultdict(int)
        self._maintenance: dict[tuple[str, str], int] = defaultdict(int)
        self._differences: dict[str, int] = {}
        self._footers: dict[tuple[str, str, str], float | None] = {}

    # -- what the applier tells ------------------------------------------------------------

    def observing(self, emit: Callable[[Event], None]) -> Callable[[Event], None]:
        """``emit``, observing each event first (the applier's ``emit``)."""

        def observe_then_emit(event: Event) -> None:
            self.observe(event)
            emit(event)
        return observe_then_emit

    def observe(self, event: Any) -> None:
        with self._lock:
            if isinstance(event, Applied):
                table = event.schema.table_id
                self._merges[table] += 1
                self._records[table] += event.result.records_read
                self._merge_seconds.labels(self.server_name).observe(
                    event.result.duration_seconds)
            elif isinstance(event, Failed):
                self._failures[event.schema.table_id] += 1
            elif isinstance(event, Maintained):
                self._maintenance[(event.schema.table_id, event.kind)] += 1
            elif isinstance(event, Reconciled):
                result = event.result
                self._differences[event.schema.table_id] = (
                    result.missing + result.extra + result.different)

    def pass_done(self, seconds: float) -> None:
        self._pass_seconds.labels(self.server_name).observe(seconds)

    def attach(self, applier: Applier) -> None:
        """Read ``applier``'s state at each scrape, and time its passes."""
        self._applier = applier
        applier.on_pass = self.pass_done

    # -- what a scrape reads ---------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        source = self.server_name
        yield gauge(FRESHNESS_METRIC, FRESHNESS_HELP, ["source"],
                    [([source], self.freshness_seconds)])
        yield from self._merge_seconds.collect()
        yield from self._pass_seconds.collect()
        with self._lock:
            merges, records = dict(self._merges), dict(self._records)
            failures, maintenance = dict(self._failures), dict(self._maintenance)
            differences = dict(self._differences)
        by_table = ["source", "table"]
        yield counter("cdc_merges", "Merges that committed to a target.", by_table,
                      [([source, t], n) for t, n in sorted(merges.items())])
        yield counter("cdc_merged_records", "Landed records merged into a target.", by_table,
                      [([source, t], n) for t, n in sorted(records.items())])
        yield counter("cdc_merge_failures", "Merges of a target that failed (each is retried "
                      "with backoff).", by_table,
                      [([source, t], n) for t, n in sorted(failures.items())])
        yield counter("cdc_maintenance_runs", "Upkeep of a target: compaction (files "
                      "rewritten), expiry (old snapshots) or orphans (unreferenced files "
                      "removed).", ["source", "table", "kind"],
                      [([source, t, kind], n) for (t, kind), n in sorted(maintenance.items())])
        yield gauge("cdc_reconcile_differences", "Rows the target's last reconcile found "
                    "missing, extra or different against the source.", by_table,
                    [([source, t], float(n)) for t, n in sorted(differences.items())])
        if self._applier is not None:
            yield from self._targets(self._applier)

    def _targets(self, applier: Applier) -> Iterator[Metric]:
        source, now = self.server_name, time.time()
        survey = applier.survey
        checkpoint = survey.checkpoint if survey is not None else None
        lags, commits = [], []
        for table_id, state in list(applier.states.items()):
            if state.committed_at is not None:
                commits.append(([source, table_id], max(0.0, now - state.committed_at)))
            if checkpoint is None or survey is None or not state.known:
                continue  # (not known yet: no sample rather than a wrong one)
            database, table = split_table_id(table_id)
            oldest = self._oldest_pending(applier, database, table, state.consumed_pos,
                                          checkpoint.next_pos,
                                          survey.segment_names(database, table))
            lags.append(([source, table_id], 0.0 if oldest is None else max(0.0, now - oldest)))
        yield gauge("cdc_target_lag_seconds",
                    "How stale the target is: now minus the source commit time of the oldest "
                    "landed change it has not merged; 0 when it has merged every landed change.",
                    ["source", "table"], lags)
        yield gauge("cdc_target_seconds_since_commit",
                    "Seconds since the target's newest Iceberg commit.", ["source", "table"],
                    commits)

    def _oldest_pending(self, applier: Applier, database: str, table: str,
                        consumed_pos: int | None, next_pos: int,
                        names: list[tuple[int, int, str]]) -> float | None:
        """``oldest_pending_seconds`` with each segment's footer read once."""
        for first, last, name in unmerged_segments(names, consumed_pos, next_pos):
            key = (database, table, name)
            if key not in self._footers:
                if len(self._footers) >= FOOTER_CACHE_ENTRIES:
                    self._footers.clear()
                self._footers[key] = oldest_pending_seconds(
                    applier.landing, database, table, consumed_pos, next_pos,
                    names=[(first, last, name)])
            return self._footers[key]
        return None


def serve_applier_metrics(settings: Settings, metrics: ApplierMetrics, applier: Applier
                          ) -> MetricsEndpoint | None:
    """Serve ``metrics`` (attached to ``applier``) on the source's applier port, or None when
    metrics are off."""
    port = settings.metrics_port(Role.APPLIER)
    if port is None:
        return None
    metrics.attach(applier)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(metrics)
    return serve(registry, settings.metrics.host, port,
                 f"the applier of {settings.source.server_name!r}")


def applier_metrics(settings: Settings) -> ApplierMetrics:
    """The metrics of ``settings``' source's applier (observe its events before it starts)."""
    return ApplierMetrics(settings.source.server_name, settings.lake.freshness_seconds)
