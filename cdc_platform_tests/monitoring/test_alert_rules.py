"""The shipped alert rules (helm/monitoring/cdc-platform.rules.yml): valid for Prometheus,
their unit tests pass (``promtool test rules``), and every metric they name is one the
platform exports."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from cdc_platform_tests.monitoring.exported_metrics import exported_metric_names, metric_names

MONITORING = Path(__file__).parents[2] / "helm" / "monitoring"
RULES = MONITORING / "cdc-platform.rules.yml"
RULE_TESTS = MONITORING / "cdc-platform.rules.test.yml"

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="promtool is not installed (make bootstrap)")


@needs_promtool
def test_the_rules_are_valid_and_their_unit_tests_pass() -> None:
    check = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run(["promtool", "test", "rules", RULE_TESTS.name], cwd=MONITORING,
                          capture_output=True, text=True)
    assert test.returncode == 0, test.stdout + test.stderr
    assert "SUCCESS" in test.stdout


def _rule_expressions() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def test_every_metric_the_rules_name_is_exported() -> None:
    exported = exported_metric_names() | {"up"}
    named = {name for expr in _rule_expressions() for name in metric_names(expr)}
    assert named, "no metric found in the rules: the pattern is wrong"
    assert named - exported == set()


def test_the_rules_cover_what_the_issue_of_record_asks_for() -> None:
    alerts = {rule.get("alert") for group in yaml.safe_load(RULES.read_text())["groups"]
              for rule in group["rules"]}
    assert {"CdcTargetStale", "CdcCaptureDown", "CdcCaptureDisconnected", "CdcCaptureLagging",
            "CdcBinlogHeadroomLow", "CdcApplierDown", "CdcApplierNotCommitting",
            "CdcReconcileDifferences"} <= alerts
