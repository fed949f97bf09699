"""A private Prometheus server (Debian's ``prometheus`` package) for the monitoring tests and
the demo: it scrapes given ``/metrics`` endpoints, evaluates the shipped alert rules
(helm/monitoring/cdc-platform.rules.yml) and answers PromQL over its HTTP API.

Its scrape and rule-evaluation intervals are short (``scrape_seconds``) so that a test sees a
lag move within seconds; everything else is Prometheus's default. Each target carries a
``cdc_role`` label (engine, applier, snapshot), as the scrape configs in docs/metrics.md do.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cdc_platform.devservices._process import DevServiceError, ManagedService
from cdc_platform.devservices.ports import port_accepts

__all__ = ["PrometheusServer", "RULES_FILE"]

#: The alert rules the platform ships.
RULES_FILE = Path(__file__).resolve().parents[2] / "helm" / "monitoring" / \
    "cdc-platform.rules.yml"


@dataclass(eq=False)
class PrometheusServer(ManagedService):
    """Prometheus on ``host:port`` scraping ``targets`` (``{role: ["host:port", ...]}``)."""

    executable_name = "prometheus"
    display_name = "Prometheus"

    base_dir: Path | None = None  # type: ignore[assignment]
    targets: dict[str, list[str]] = field(default_factory=dict)
    rule_files: list[Path] = field(default_factory=lambda: [RULES_FILE])
    scrape_seconds: float = 1.0
    port: int | None = None
    host: str = "127.0.0.1"
    start_timeout: float = 60.0
    _temp_dir: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.base_dir is None:
            self.base_dir = Path(tempfile.gettempdir()) / f"cdc-prometheus-{uuid.uuid4().hex[:12]}"
            self._temp_dir = True
        self.base_dir = Path(self.base_dir).expanduser().resolve()
        self._auto_port = self.port is None

    @property
    def url(self) -> str:
        if self.port is None:
            raise DevServiceError("Prometheus is not running: call start() first")
        return f"http://{self.host}:{self.port}"

    # ---- hooks ---------------------------------------------------------------------------

    def _config(self) -> dict[str, Any]:
        interval = f"{self.scrape_seconds:g}s"
        return {
            "global": {"scrape_interval": interval, "evaluation_interval": interval,
                       "scrape_timeout": interval},
            "rule_files": [str(path) for path in self.rule_files],
            "scrape_configs": [{
                "job_name": "cdc_platform",
                "static_configs": [{"targets": list(addresses), "labels": {"cdc_role": role}}
                                   for role, addresses in sorted(self.targets.items())],
            }],
        }

    def _prepare(self) -> None:
        assert self.base_dir is not None
        (self.base_dir / "data").mkdir(parents=True, exist_ok=True)
        (self.base_dir / "prometheus.yml").write_text(yaml.safe_dump(self._config()))

    def _marker(self, port: int) -> str:
        return f"--web.listen-address={self.host}:{port}"

    def _argv(self, port: int) -> list[str]:
        assert self.base_dir is not None
        binary = shutil.which("prometheus") or "/usr/bin/prometheus"
        return [binary, f"--config.file={self.base_dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.base_dir / 'data'}", self._marker(port),
                "--web.enable-lifecycle", "--log.level=warn"]

    def _is_ready(self) -> bool:
        assert self.port is not None
        if not port_accepts(self.host, self.port):
            return False
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def _failure_hint(self) -> str:
        return "is Debian's prometheus package installed? (make bootstrap installs it)"

    def stop(self, timeout: float = 30.0) -> None:
        super().stop(timeout)
        if self._temp_dir and self.base_dir is not None:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    # ---- the HTTP API --------------------------------------------------------------------

    def _get(self, path: str, **params: str) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as answer:
            body = json.load(answer)
        if body.get("status") != "success":
            raise DevServiceError(f"Prometheus answered {body} to {url}")
        return body["data"]

    def query(self, promql: str) -> list[tuple[dict[str, str], float]]:
        """An instant query's samples: ``(labels, value)``."""
        data = self._get("/api/v1/query", query=promql)
        return [(sample["metric"], float(sample["value"][1])) for sample in data["result"]]

    def targets_up(self) -> dict[str, bool]:
        """Each scraped target's health (``instance -> up``)."""
        data = self._get("/api/v1/targets")
        return {target["labels"]["instance"]: target["health"] == "up"
                for target in data["activeTargets"]}

    def firing(self) -> list[dict[str, str]]:
        """The labels of every alert firing now (``pending`` ones are not)."""
        data = self._get("/api/v1/alerts")
        return [alert["labels"] for alert in data["alerts"] if alert["state"] == "firing"]
