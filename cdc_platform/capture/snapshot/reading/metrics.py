"""A snapshot run's Prometheus metrics (docs/metrics.md): what its readers read, per table,
and the tables it has still to end, served while it reads on its source's snapshot port. The
engine's ``cdc_snapshot_*`` metrics (``capture/metrics.py``) say what it committed; this is the
reader side's view, so it lives with the readers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from cdc_platform.capture.snapshot.reading.progress import ReaderState, SnapshotProgress
from cdc_platform.metrics import (
    FRESHNESS_HELP,
    FRESHNESS_METRIC,
    MetricsEndpoint,
    MetricsPortTakenError,
    Role,
    counter,
    gauge,
    serve,
)

if TYPE_CHECKING:
    from cdc_platform.config import Settings


@dataclass(frozen=True)
class ReadingTable:
    """One table of a snapshot run as its metrics see it: its newest progress (None before
    the first) and whether its snapshot ended (done, stopped, skipped or failed)."""

    table_id: str
    progress: SnapshotProgress | None
    ended: bool


class SnapshotRunCollector(Collector):
    """A snapshot run's ``cdc_snapshot_read_*`` metrics: what its readers read, per table, and
    the tables it has still to end. The engine's ``cdc_snapshot_*`` say what it committed."""

    def __init__(self, server_name: str, tables: Callable[[], list[ReadingTable]],
                 freshness_seconds: float) -> None:
        self.server_name = server_name
        self.tables = tables
        self.freshness_seconds = freshness_seconds

    def collect(self) -> Iterator[Metric]:
        source = self.server_name
        tables = self.tables()
        yield gauge(FRESHNESS_METRIC, FRESHNESS_HELP, ["source"],
                    [([source], self.freshness_seconds)])
        yield gauge("cdc_snapshot_run_remaining_tables",
                    "Tables of this snapshot run whose snapshot has not ended.", ["source"],
                    [([source], float(sum(not t.ended for t in tables)))])
        read = [(t.table_id, t.progress) for t in tables if t.progress is not None]
        yield counter("cdc_snapshot_read_rows",
                      "Rows of the chunks this run's readers read and the engine committed.",
                      ["source", "table"], [([source, table], p.rows) for table, p in read])
        yield counter("cdc_snapshot_read_chunks",
                      "Chunks this run's readers read and the engine committed.",
                      ["source", "table"], [([source, table], p.chunks) for table, p in read])
        yield counter("cdc_snapshot_rejected_chunks",
                      "Chunks the engine rejected (a change to their rows raced the read); "
                      "their ranges are read again.",
                      ["source", "table"], [([source, table], p.rejected) for table, p in read])
        yield gauge("cdc_snapshot_pending_chunks",
                    "Chunks written and not yet decided by the engine.", ["source", "table"],
                    [([source, table], float(p.pending)) for table, p in read])
        yield gauge("cdc_snapshot_reader_state",
                    "1 for each reading table's state (waiting, open, paused, done).",
                    ["source", "table", "state"],
                    [([source, table, str(state)], float(p.state == state))
                     for table, p in read for state in ReaderState])


def serve_snapshot_metrics(settings: Settings, tables: Callable[[], list[ReadingTable]],
                           log: Any) -> MetricsEndpoint | None:
    """Serve a snapshot run's metrics on its source's snapshot port, or None when metrics
    are off or the port is taken: several snapshot runs of a source may read at once on one
    host, and only one can have the port (on Kubernetes each run is a pod of its own). A
    taken port is a warning in the run's log, never a failed snapshot; the engine's metrics
    still show what it commits."""
    port = settings.metrics_port(Role.SNAPSHOT)
    if port is None:
        return None
    registry = CollectorRegistry(auto_describe=True)
    registry.register(SnapshotRunCollector(settings.source.server_name, tables,
                                           settings.lake.freshness_seconds))
    try:
        endpoint = serve(registry, settings.metrics.host, port,
                         f"snapshot runs of {settings.source.server_name!r}")
    except MetricsPortTakenError as taken:
        log.warning(f"{taken}; this run's reading progress is not served (the capture "
                    "engine's cdc_snapshot_* metrics still show the committed chunks)")
        return None
    log.info(f"snapshot run metrics: {endpoint.url}")
    return endpoint
