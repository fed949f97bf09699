"""The change-topic publisher's Prometheus metrics (docs/metrics.md, "Change topics"): how far
the topics stand behind the landing zone, what was published, and whether the broker takes it.
Read from the publisher's own counters when Prometheus scrapes (nothing on the publish path).

``cdc_topics_lag_seconds`` is the alert's figure: now minus the source commit time of the
oldest landed change not published yet, 0 when everything landed is on the topics. A broker
that is down makes it grow (the publisher retries with backoff) while capture and the lake go
on: ``CdcTopicsLagging`` fires on it.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from cdc_platform.config import Settings
from cdc_platform.metrics import (
    FRESHNESS_HELP,
    FRESHNESS_METRIC,
    MetricsEndpoint,
    Role,
    counter,
    gauge,
    serve,
)
from cdc_platform.topics.publisher import Publisher


class PublisherMetrics(Collector):
    """One publisher's metrics, labelled ``source`` (and ``table`` per topic)."""

    def __init__(self, server_name: str, freshness_seconds: float, publisher: Publisher
                 ) -> None:
        self.server_name = server_name
        self.freshness_seconds = freshness_seconds
        self.publisher = publisher

    def collect(self) -> Iterator[Metric]:
        source, stats = self.server_name, self.publisher.stats
        yield gauge(FRESHNESS_METRIC, FRESHNESS_HELP, ["source"],
                    [([source], self.freshness_seconds)])
        yield gauge("cdc_topics_lag_seconds",
                    "How far the change topics stand behind the landing zone: now minus the "
                    "source commit time of the oldest landed change not published yet; 0 when "
                    "every landed change is published.", ["source"],
                    [([source], stats.lag_seconds())])
        yield gauge("cdc_topics_broker_up", "1 while the broker takes the publisher's batches, "
                    "0 after a batch it did not take (the publisher retries with backoff).",
                    ["source"], [([source], 1.0 if stats.broker_up else 0.0)])
        yield counter("cdc_topics_messages", "Messages published to a table's change topic "
                      "(events and tombstones).", ["source", "table"],
                      [([source, t], n) for t, n in sorted(stats.messages.items())])
        yield counter("cdc_topics_batches", "Batches the broker took (one transaction each "
                      "with change_topics.transactions).", ["source"], [([source], stats.batches)])
        yield counter("cdc_topics_failures", "Batches the broker did not take (each sent again "
                      "from the saved position).", ["source"], [([source], stats.failures)])
        if stats.last_commit is not None:
            yield gauge("cdc_topics_last_batch_timestamp_seconds",
                        "When the broker took the publisher's newest batch (Unix time).",
                        ["source"], [([source], stats.last_commit)])
        yield gauge("cdc_topics_published_position", "The changelog position through which "
                    "a table's changes are published (saved; retention waits for it).",
                    ["source", "table"],
                    [([source, t], float(p)) for t, p in sorted(stats.through.items())])


def serve_publisher_metrics(settings: Settings, publisher: Publisher) -> MetricsEndpoint | None:
    """Serve ``publisher``'s metrics on the source's publisher port, or None when metrics are
    off."""
    port = settings.metrics_port(Role.PUBLISHER)
    if port is None:
        return None
    registry = CollectorRegistry(auto_describe=True)
    registry.register(PublisherMetrics(settings.source.server_name,
                                       settings.lake.freshness_seconds, publisher))
    return serve(registry, settings.metrics.host, port,
                 f"the change-topic publisher of {settings.source.server_name!r}")
