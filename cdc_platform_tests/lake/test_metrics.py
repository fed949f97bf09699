"""The applier's metrics (``lake/metrics.py``) from its events: merges, records merged and
merge durations per target, failures, upkeep by kind, reconcile differences and pass
durations (the per-target lag is proven against a real applier in
cdc_platform_tests/deploy/test_prometheus.py)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cdc_platform_tests.monitoring.exported_metrics import applier_metrics_with_samples


def _samples() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(applier_metrics_with_samples())
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_each_event_counts_where_an_operator_looks_for_it() -> None:
    got = _samples()
    table = (("source", "s"), ("table", "db.t"))
    assert got[("cdc_merges_total", table)] == 1
    assert got[("cdc_merged_records_total", table)] == 1
    assert got[("cdc_merge_failures_total", table)] == 1
    assert got[("cdc_maintenance_runs_total",
                (("kind", "orphans"), ("source", "s"), ("table", "db.t")))] == 1
    assert got[("cdc_reconcile_differences", table)] == 0
    assert got[("cdc_lake_freshness_seconds", (("source", "s"),))] == 60
    assert got[("cdc_merge_duration_seconds_count", (("source", "s"),))] == 1
    assert got[("cdc_merge_duration_seconds_sum", (("source", "s"),))] == 0.1
    assert got[("cdc_merge_duration_seconds_bucket", (("le", "0.1"), ("source", "s")))] == 1
    assert got[("cdc_merge_duration_seconds_bucket", (("le", "0.05"), ("source", "s")))] == 0
    assert got[("cdc_applier_pass_duration_seconds_count", (("source", "s"),))] == 1
