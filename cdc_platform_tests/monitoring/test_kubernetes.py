"""Scraping on Kubernetes: with ``metrics.port`` set, the run pods of the jobs that serve
metrics carry the prometheus.io annotations of their own port and the labels the shipped
PodMonitor selects and turns into ``cdc_role``; without it, no annotation at all."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from cdc_platform.config import parse_settings
from cdc_platform.defs.monitoring import ROLE_LABEL, SOURCE_LABEL, run_request_tags
from cdc_platform.defs.streaming.definitions import stream_run_tags
from cdc_platform.metrics import Role

PODMONITOR = Path(__file__).parents[2] / "helm" / "monitoring" / "podmonitor.yaml"


def _settings(port: int):
    return parse_settings({
        "sources": [{"flavour": "mysql", "host": "db", "user": "u", "server_id": i + 1,
                     "server_name": name} for i, name in enumerate(("shop", "billing"))],
        "landing_zone": {"url": "s3://b/l"}, "warehouse": {"url": "s3://b/w"},
        "metrics": {"port": port}})


def test_each_role_of_each_source_annotates_its_pod_with_its_own_port() -> None:
    billing = _settings(9400).for_source("billing")
    engine = stream_run_tags(billing)["dagster-k8s/config"]
    assert engine["pod_spec_config"]["termination_grace_period_seconds"] > 60  # (kept)
    metadata = engine["pod_template_spec_metadata"]
    assert metadata["annotations"] == {"prometheus.io/scrape": "true",
                                       "prometheus.io/port": "9404",
                                       "prometheus.io/path": "/metrics"}
    assert metadata["labels"] == {ROLE_LABEL: "engine", SOURCE_LABEL: "billing"}
    snapshot = json.loads(run_request_tags(billing, Role.SNAPSHOT)["dagster-k8s/config"])
    assert snapshot["pod_template_spec_metadata"]["annotations"]["prometheus.io/port"] == "9406"


def test_without_metrics_no_pod_is_annotated() -> None:
    shop = _settings(0).for_source("shop")
    assert "pod_template_spec_metadata" not in stream_run_tags(shop)["dagster-k8s/config"]
    assert run_request_tags(shop, Role.SNAPSHOT) == {}


def _meta(label: str) -> str:
    """Prometheus's name for a pod label in kubernetes_sd (non-alphanumerics become _)."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)


def test_the_podmonitor_selects_the_pods_and_labels_their_role() -> None:
    monitor = yaml.safe_load(PODMONITOR.read_text())
    assert monitor["kind"] == "PodMonitor"
    [selected] = monitor["spec"]["selector"]["matchExpressions"]
    assert selected == {"key": ROLE_LABEL, "operator": "Exists"}
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    relabel = {r["targetLabel"]: r for r in endpoint["relabelings"]}
    assert relabel["cdc_role"]["sourceLabels"] == [_meta(ROLE_LABEL)]
    address = relabel["__address__"]
    assert re.sub(address["regex"], address["replacement"].replace("$", "\\"),
                  "10.1.2.3;9404") == "10.1.2.3:9404"
    assert re.sub(address["regex"], address["replacement"].replace("$", "\\"),
                  "10.1.2.3:8080;9404") == "10.1.2.3:9404"
