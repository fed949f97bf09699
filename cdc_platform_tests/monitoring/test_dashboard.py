"""The shipped Grafana dashboard (helm/monitoring/cdc-platform.dashboard.json): valid JSON
whose every query reads metrics the platform exports, with the panels operators look for."""

from __future__ import annotations

import json
from pathlib import Path

from cdc_platform_tests.monitoring.exported_metrics import exported_metric_names, metric_names

DASHBOARD = Path(__file__).parents[2] / "helm" / "monitoring" / "cdc-platform.dashboard.json"


def _queries(dashboard: dict) -> list[str]:
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    queries += [variable["query"]["query"] for variable in dashboard["templating"]["list"]
                if isinstance(variable.get("query"), dict)]
    return queries


def test_every_query_reads_an_exported_metric() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = _queries(dashboard)
    named = {name for query in queries for name in metric_names(query)}
    assert len(queries) >= 10 and named
    assert named - exported_metric_names() == set()
    assert all(metric_names(query) for query in queries), "a query reads no metric"


def test_the_panels_operators_look_for_are_there() -> None:
    titles = {panel["title"] for panel in json.loads(DASHBOARD.read_text())["panels"]}
    assert {"Capture lag", "Target lag, top 20 tables", "Merge duration", "Binlog headroom",
            "Snapshot progress"} <= titles
