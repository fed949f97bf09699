"""The streaming domain: the long-running capture job, the batch catch-up asset, and the
binlog headroom of the changelog (its check and the sensor that records it while the engine is
stopped too)."""

from typing import Any

import dagster as dg
from pydantic import Field

from cdc_platform.config import Settings
from cdc_platform.defs.monitoring import k8s_config_tag
from cdc_platform.defs.names import scoped_name
from cdc_platform.defs.streaming.checks import headroom_check
from cdc_platform.defs.streaming.runner import (
    STOP_GRACE_SECONDS,
    STREAM_TAG,
    changelog_key,
    changelog_metadata,
    run_engine,
)
from cdc_platform.defs.streaming.sensors import build_headroom_sensor
from cdc_platform.metrics import Role

# How the long-running streaming run behaves on a Dagster deployment (helm/values.yaml): no
# max-runtime limit; retried as a new run, which resumes from the checkpoint, when it fails (pod
# lost, non-retriable error) up to RUN_RETRIES times in a row; and on Kubernetes, time to flush
# and checkpoint after SIGTERM before the kubelet kills the pod.
RUN_RETRIES = 10
STREAM_RUN_TAGS = {
    "dagster/max_runtime": "0",
    "dagster/max_retries": str(RUN_RETRIES),
    "dagster-k8s/config": {
        "pod_spec_config": {"termination_grace_period_seconds": int(STOP_GRACE_SECONDS) + 60},
    },
}


def stream_run_tags(settings: Settings) -> dict[str, Any]:
    """``STREAM_RUN_TAGS`` with the pod's scrape annotations when metrics are on."""
    return {**STREAM_RUN_TAGS, "dagster-k8s/config": k8s_config_tag(
        settings, Role.ENGINE, STREAM_RUN_TAGS["dagster-k8s/config"])}


class StreamConfig(dg.Config):
    """Run config of ``stream_changes``."""

    stop_when_caught_up: bool = Field(
        default=False,
        description="Stop once every transaction the source has executed is landed "
        "(batch and CI use). By default the job streams until cancelled.",
    )
    caught_up_idle_seconds: float = Field(
        default=0.0,
        description="With stop_when_caught_up: also wait until no transaction arrived for this "
        "long, so a running write workload is followed to its end.",
    )
    progress_seconds: float = Field(
        default=30.0, description="Interval of progress lines and changelog materialisations."
    )


def build(settings: Settings) -> dg.Definitions:
    server = settings.source.server_name

    @dg.op(
        name=scoped_name(settings, "capture_changes"),
        description="Stream the source's binlog into the landing zone until cancelled "
        "(or until caught up, with stop_when_caught_up). Cancelling the run flushes and "
        "checkpoints; a new run resumes from the checkpoint.",
    )
    def capture_changes(context: dg.OpExecutionContext, config: StreamConfig) -> None:
        stats = run_engine(
            context, settings, config.stop_when_caught_up, config.caught_up_idle_seconds,
            config.progress_seconds, report_materializations=True,
        )
        context.log_event(dg.AssetMaterialization(
            asset_key=changelog_key(settings), metadata=changelog_metadata(settings, stats)))

    @dg.job(
        name=scoped_name(settings, "stream_changes"),
        description=f"Long-running capture of source {server!r}: binlog -> landing zone.",
        tags={STREAM_TAG: server, **stream_run_tags(settings)},
        executor_def=dg.in_process_executor,
    )
    def stream_changes() -> None:
        capture_changes()

    @dg.asset(
        key=changelog_key(settings),
        group_name=f"{server}_capture",
        kinds={"mariadb" if settings.source.flavour == "mariadb" else "mysql", "parquet"},
        description=f"Committed row changes of {server!r}, landed up to the source's current "
        "position. Materialising it catches the changelog up once (batch mode); the "
        "stream_changes job keeps it current continuously.",
    )
    def changelog(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        stats = run_engine(context, settings, stop_when_caught_up=True)
        return dg.MaterializeResult(metadata=changelog_metadata(settings, stats))

    return dg.Definitions(assets=[changelog], jobs=[stream_changes],
                          asset_checks=[headroom_check(settings)],
                          sensors=[build_headroom_sensor(settings)])
