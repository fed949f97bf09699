"""Change topics in Dagster (``change_topics.enabled``): the long-running ``publish_changes``
job, the sensor that keeps one run of it going, and the ``change_topics`` asset with its
``published`` check (docs/change-topics.md).

- ``publish_changes`` runs ``topics.publisher.Publisher`` in a thread of its one step; every
  progress tick it records a materialisation of ``<server>/change_topics`` (messages by table,
  lag, broker state), and a publisher that cannot go on fails the run with its one line.
- ``<server>_keep_topics_published`` launches ``publish_changes`` when no run of it is active
  (the reason as a run tag), fails a run whose process is gone, and records the asset's
  ``published`` check when it changes: it fails when a landed change has waited longer than
  ``lake.freshness_seconds`` to be published (the publisher stopped, or the broker down),
  judged from the landing zone alone (the publisher's saved position and segment footers).
"""

import json
import time
from typing import Any

import dagster as dg

from cdc_platform.capture.landing.pending import oldest_pending_by_table
from cdc_platform.capture.landing.published import CHANGE_TOPICS
from cdc_platform.capture.landing.zone import LandingReader, table_of_parts
from cdc_platform.capture.names import table_id
from cdc_platform.config import Settings
from cdc_platform.defs.long_running import RunTags, keep_running
from cdc_platform.defs.monitoring import k8s_config_tag
from cdc_platform.defs.names import scoped_name
from cdc_platform.defs.streaming.runner import changelog_key
from cdc_platform.defs.threaded import QueueLog, run_in_thread
from cdc_platform.metrics import Role
from cdc_platform.topics.metrics import serve_publisher_metrics
from cdc_platform.topics.producer import PublishError
from cdc_platform.topics.publisher import PublisherOptions, describe, open_publisher

JOB_NAME = "publish_changes"
TOPICS_TAG = "cdc_platform/topics"
RUN_TAGS = RunTags(TOPICS_TAG, "cdc_platform/topics_pid", "cdc_platform/topics_host")
STOP_GRACE_SECONDS = 60.0
# The check's result is recorded when it changes, and at least this often.
REPORT_EVERY_SECONDS = 300.0


def topics_key(settings: Settings) -> dg.AssetKey:
    return dg.AssetKey([settings.source.server_name, "change_topics"])


def sensor_name(settings: Settings) -> str:
    return f"{settings.source.server_name}_keep_topics_published"


class PublishConfig(dg.Config):
    """Run config of ``publish_changes``."""

    progress_seconds: float = 30.0
    stop_when_caught_up: bool = False


def _materialisation(settings: Settings, stats: Any) -> dg.AssetMaterialization:
    return dg.AssetMaterialization(
        asset_key=topics_key(settings), description=describe(stats),
        metadata={"messages_by_table": dg.MetadataValue.json(dict(sorted(
                      stats.messages.items()))),
                  "messages": sum(stats.messages.values()), "batches": stats.batches,
                  "lag_seconds": round(stats.lag_seconds(), 1),
                  "broker_up": stats.broker_up, "failures": stats.failures,
                  "last_error": stats.last_error})


def build_job(settings: Settings) -> dg.JobDefinition:
    server = settings.source.server_name

    @dg.op(
        name=scoped_name(settings, "publish_landed_changes"),
        description="Publishes every landed row change to its table's Kafka topic in "
        "Debezium's envelope until cancelled, from the position it saved in the landing zone "
        "(docs/change-topics.md).",
    )
    def publish_landed_changes(context: dg.OpExecutionContext, config: PublishConfig) -> None:
        context.instance.add_run_tags(context.run_id, RUN_TAGS.where())
        publisher = open_publisher(settings)
        endpoint = serve_publisher_metrics(settings, publisher)
        if endpoint is not None:
            context.log.info(f"change-topic publisher metrics: {endpoint.url}")
        try:
            run_in_thread(
                context, "change-topics",
                lambda stop: publisher.run(stop, config.stop_when_caught_up), QueueLog(),
                every=config.progress_seconds,
                on_tick=lambda: context.log_event(_materialisation(settings, publisher.stats)),
                stopping="change topics: stop requested; finishing the batch in progress",
                grace_seconds=STOP_GRACE_SECONDS,
                not_stopped=f"publisher did not stop within {STOP_GRACE_SECONDS:.0f}s; the "
                "next run sends the unsaved batch again")
        except PublishError as error:
            raise dg.Failure(description=str(error)) from None
        finally:
            if endpoint is not None:
                endpoint.close()
        context.log_event(_materialisation(settings, publisher.stats))

    config = k8s_config_tag(settings, Role.PUBLISHER)
    return dg.JobDefinition(
        name=scoped_name(settings, JOB_NAME),
        graph_def=dg.GraphDefinition(name=scoped_name(settings, JOB_NAME),
                                     node_defs=[publish_landed_changes]),
        description=f"Long-running change-topic publisher of {server!r}: landing zone -> one "
        f"Kafka topic per table (Debezium's envelope). The sensor {sensor_name(settings)} "
        "keeps one run of it going.",
        tags={TOPICS_TAG: server, "dagster/max_runtime": "0",
              **({"dagster-k8s/config": config} if config else {})},
        executor_def=dg.in_process_executor,
    )


def judge_topics(settings: Settings) -> tuple[bool, float, str]:
    """Whether every landed change was published within ``lake.freshness_seconds``: (passed,
    the oldest unpublished change's age in seconds, what is behind), from the landing zone."""
    landing = LandingReader.open(settings.landing_zone.url, settings.source.server_name,
                                 s3=settings.s3)
    survey = landing.survey()
    if survey.checkpoint is None:
        return True, 0.0, "nothing landed yet"
    marks = landing.read_published(CHANGE_TOPICS)
    options = PublisherOptions.from_settings(settings)
    published = [table_of_parts(*parts) for parts in survey.segments]
    oldest = oldest_pending_by_table(landing, survey, {
        (database, table): 0 if marks is None else marks.through.get(
            table_id(database, table), 0)
        for database, table in published if options.publishes(database, table)})
    now, worst, behind = time.time(), 0.0, ""
    for (database, table), seconds in oldest.items():
        if seconds is not None and now - seconds > worst:
            worst, behind = now - seconds, table_id(database, table)
    limit = settings.lake.freshness_seconds
    return worst <= limit, worst, behind


def build_sensor(settings: Settings, job: dg.JobDefinition) -> dg.SensorDefinition:
    server = settings.source.server_name

    @dg.sensor(
        name=sensor_name(settings), job=job, minimum_interval_seconds=10,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Keeps {server!r}'s change topics published by itself: launches "
        f"{JOB_NAME} when no run of it is active (the run's tags say why), fails a run whose "
        "process is gone, and records the change_topics asset's `published` check.",
    )
    def keep_topics_published(context: dg.SensorEvaluationContext
                              ) -> dg.SensorResult | dg.SkipReason:
        if not PublisherOptions.from_settings(settings).bootstrap_servers:
            return dg.SkipReason(
                "no Kafka bootstrap servers for the change topics: set "
                "change_topics.kafka.bootstrap_servers or signals.kafka.bootstrap_servers")
        kept = keep_running(context, JOB_NAME, RUN_TAGS, server)
        passed, lag, behind = judge_topics(settings)
        if passed:
            description = f"every landed change is published (oldest waiting {lag:.0f} s)"
        else:
            cause = "the publisher is not running" if not kept.running else \
                "the broker is down or slow (the publisher retries with backoff)"
            description = (f"{behind}: a landed change has waited {lag:.0f} s to be published "
                           f"(more than lake.freshness_seconds, "
                           f"{settings.lake.freshness_seconds:g} s): {cause}")
            context.log.warning(f"change topics not published: {description}")
        try:
            previous = json.loads(context.cursor) if context.cursor else {}
        except ValueError:
            previous = {}
        now, events = time.time(), []
        if not isinstance(previous, dict) or previous.get("passed") != passed or \
                now - previous.get("at", 0) >= REPORT_EVERY_SECONDS:
            events.append(dg.AssetCheckEvaluation(
                asset_key=topics_key(settings), check_name="published", passed=passed,
                severity=dg.AssetCheckSeverity.WARN, description=description,
                metadata={"lag_seconds": round(lag, 1), "table": behind}))
            previous = {"passed": passed, "at": now}
        return dg.SensorResult(run_requests=kept.requests, asset_events=events,
                               cursor=json.dumps(previous))

    return keep_topics_published


def build(settings: Settings) -> dg.Definitions:
    """Nothing unless ``change_topics.enabled``; else the asset, its check, the job and the
    sensor."""
    if not settings.source.change_topics.enabled:
        return dg.Definitions()
    server = settings.source.server_name
    topics = settings.source.change_topics
    asset = dg.AssetSpec(
        key=topics_key(settings), deps=[changelog_key(settings)],
        group_name=f"{server}_capture", kinds={"kafka"},
        description=f"{server!r}'s row changes on Kafka, one topic per table "
        f"(`{topics.prefix or server}.<database>.<table>`, Debezium's MySQL envelope), "
        f"published by {JOB_NAME}.")
    check = dg.AssetCheckSpec(
        "published", asset=topics_key(settings),
        description="Passes while every landed change reaches its topic within "
        f"lake.freshness_seconds ({settings.lake.freshness_seconds:g} s); recorded by "
        f"{sensor_name(settings)}.")

    @dg.multi_asset_check(specs=[check], name=f"published__{server}")
    def published() -> dg.AssetCheckResult:
        passed, lag, behind = judge_topics(settings)
        return dg.AssetCheckResult(asset_key=topics_key(settings), check_name="published",
                                   passed=passed, metadata={"lag_seconds": round(lag, 1),
                                                            "table": behind})

    job = build_job(settings)
    return dg.Definitions(assets=[asset], asset_checks=[published], jobs=[job],
                          sensors=[build_sensor(settings, job)])
