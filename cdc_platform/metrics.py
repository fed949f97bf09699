"""The Prometheus endpoint of a long-running process: one ``/metrics`` per process, on the port
``metrics.port`` gives its source and role (``Settings.metrics_port``).

What is measured belongs to the layer that knows it (``capture/metrics.py`` for the engine and
snapshot reads, ``lake/metrics.py`` for the applier); this module only serves a registry, so a
process serves exactly the metrics of what it runs, and two processes on one host never share
a port. Metrics are read when Prometheus scrapes (collectors over the running objects' own
counters), so serving them costs the hot paths nothing.
"""

from __future__ import annotations

import enum
import errno
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

#: The promise (``lake.freshness_seconds``), exported by every process so that alert rules
#: compare each lag with its own source's promise.
FRESHNESS_METRIC = "cdc_lake_freshness_seconds"
FRESHNESS_HELP = ("The freshness promise, lake.freshness_seconds: every target reflects the "
                  "source up to at most this many seconds ago.")


_F = TypeVar("_F", GaugeMetricFamily, CounterMetricFamily)


class Role(enum.IntEnum):
    """A process's place among its source's ports (``config.METRICS_PORTS_PER_SOURCE``)."""

    ENGINE = 0
    APPLIER = 1
    SNAPSHOT = 2
    PUBLISHER = 3


def metrics_url(host: str, port: int) -> str:
    """The URL a process on this host scrapes an endpoint listening on ``host:port`` at."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://{shown}:{port}/metrics"


class MetricsPortTakenError(RuntimeError):
    """The process's metrics port is taken (one line naming it and the setting)."""


@dataclass(eq=False)
class MetricsEndpoint:
    """A registry served over HTTP on a thread of its own until ``close()``."""

    registry: CollectorRegistry
    host: str
    port: int
    _server: Any = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return metrics_url(self.host, self.port)

    def close(self) -> None:
        """Stop serving and free the port (a later run of the same role takes it again)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def __enter__(self) -> MetricsEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve(registry: CollectorRegistry, host: str, port: int, what: str) -> MetricsEndpoint:
    """Serve ``registry`` on ``host:port``. ``what`` names the process in the error when the
    port is taken (another process of the same source and role on this host, or a service
    that is not ours): a start failure of one line, because a process whose metrics cannot be
    scraped looks, to the alerts, like a process that is down."""
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as error:
        if error.errno != errno.EADDRINUSE:
            raise
        raise MetricsPortTakenError(
            f"metrics port {host}:{port} of {what} is taken: another process listens there "
            "(is this source's process already running on this host?); set metrics.port to "
            "a free range, or 0 for no metrics") from None
    return MetricsEndpoint(registry, host, port, server)


def gauge(name: str, documentation: str, labels: list[str],
          samples: list[tuple[list[str], float]]) -> GaugeMetricFamily:
    """A gauge family with its samples (``(label values, value)``), for collectors."""
    return _family(GaugeMetricFamily(name, documentation, labels=labels), samples)


def counter(name: str, documentation: str, labels: list[str],
            samples: list[tuple[list[str], float]]) -> CounterMetricFamily:
    """A counter family (``name`` without ``_total``: the exposition adds it)."""
    return _family(CounterMetricFamily(name, documentation, labels=labels), samples)


def _family(family: _F, samples: list[tuple[list[str], float]]) -> _F:
    for values, value in samples:
        family.add_metric(values, value)
    return family
