"""How Prometheus finds a run's metrics on Kubernetes: the run pod of a job whose process
serves ``/metrics`` (``metrics.port``) carries the ``prometheus.io/*`` annotations of its port
(the convention of Prometheus's ``kubernetes_sd`` pod examples and most charts) and labels
naming its source and role, for a PodMonitor (helm/monitoring/podmonitor.yaml, docs/metrics.md)."""

from __future__ import annotations

import json
from typing import Any

from cdc_platform.config import Settings
from cdc_platform.metrics import Role

#: Pod labels of a run that serves metrics (a PodMonitor selects on the first).
ROLE_LABEL = "cdc-platform/metrics-role"
SOURCE_LABEL = "cdc-platform/source"


def k8s_config_tag(settings: Settings, role: Role,
                   base: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``dagster-k8s/config`` tag of a job whose run serves ``role``'s metrics: ``base``
    (the job's own pod settings) with the scrape annotations and labels when metrics are on."""
    config = dict(base or {})
    port = settings.metrics_port(role)
    if port is None:
        return config
    metadata = dict(config.get("pod_template_spec_metadata") or {})
    metadata["annotations"] = {**metadata.get("annotations", {}),
                               "prometheus.io/scrape": "true",
                               "prometheus.io/port": str(port),
                               "prometheus.io/path": "/metrics"}
    metadata["labels"] = {**metadata.get("labels", {}),
                          ROLE_LABEL: role.name.lower(),
                          SOURCE_LABEL: settings.source.server_name}
    config["pod_template_spec_metadata"] = metadata
    return config


def run_request_tags(settings: Settings, role: Role) -> dict[str, str]:
    """The same for a sensor's ``RunRequest`` (whose tags are strings): empty when metrics
    are off."""
    config = k8s_config_tag(settings, role)
    return {"dagster-k8s/config": json.dumps(config)} if config else {}
